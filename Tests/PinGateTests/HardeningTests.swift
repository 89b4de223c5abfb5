import Foundation
import PinGateTestSupport
import PinGateHarness
import PinGateTLS
import PinList
import Testing

/// Issue 12's "found" items: each one as a new user met it, against `pingate run` as a
/// child process on 127.0.0.1 with port 0 and material minted at test time.
@Suite("Hardening (issue 12)")
struct HardeningTests {
    static var pingate: String { TestProcess.pingateExecutable }

    /// What a CONNECT through a gate got: the proxy's status and refusal, curl's exit
    /// status and everything it said, and how long it took.
    struct ProxyAnswer {
        var status: String
        var refusal: String?
        var exitStatus: Int32
        var stderr: String
        var seconds: Double
        var body: String
    }

    /// `curl --proxy` to `url` through the gate on `port`; `caPath` for the gate's CA.
    static func connect(gatePort port: Int, _ url: String, caPath: String? = nil, extra: [String] = []) async throws -> ProxyAnswer {
        let started = Date()
        var arguments = ["-sS", "-v", "--max-time", "30", "--proxy", "http://127.0.0.1:\(port)", "-w", "%{http_connect}"]
        if let caPath { arguments += ["--cacert", caPath] }
        let result = try await TestProcess.run("curl", arguments + extra + [url])
        let refusal = result.stderr.split(whereSeparator: \.isNewline)
            .first { $0.lowercased().hasPrefix("< pingate-refusal:") }
            .map { $0.split(separator: ":", maxSplits: 1)[1].trimmingCharacters(in: .whitespaces) }
        let status = String(result.stdout.suffix(3))
        return ProxyAnswer(status: status, refusal: refusal, exitStatus: result.status, stderr: result.stderr,
                           seconds: Date().timeIntervalSince(started), body: String(result.stdout.dropLast(3)))
    }

    /// `curl` to the admin endpoint on `port` with `extra` arguments (e.g. `-H Host:…`).
    static func admin(port: Int, _ path: String, _ extra: [String] = []) async throws -> (status: Int, body: String) {
        let result = try await TestProcess.run("curl", ["-s", "--max-time", "10", "-w", "\n%{http_code}"] + extra
                                                   + ["http://127.0.0.1:\(port)\(path)"])
        let lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        return (Int(lines.last ?? "") ?? 0, lines.dropLast().joined(separator: "\n"))
    }

    /// The admin port of `gate`, once it has logged it.
    static func adminPort(_ gate: RunningGate) async throws -> Int {
        _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
        return try #require(gate.adminPort, "no admin endpoint line in: \(gate.logText)")
    }

    // MARK: item 3

    @Test("a list whose pins have all expired: a warning at start-up, 503 list-expired at once, /ready says why")
    func expiredList() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("expired.pingate.test")], issuer: pki.originCA, file: "origin")
        let list = try pki.signedList([("expired.pingate.test", leaf.fingerprint)], expires: Date().addingTimeInterval(-86400))
        try await RunningGate.with([
            "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
            "--pins", list, "--pins-key", pki.signerPublicKeyPath, "--decision-log", "off",
        ]) { gate in
            let answer = try await Self.connect(gatePort: gate.port, "https://expired.pingate.test:443/")
            #expect(answer.status == "503", "\(answer.stderr)")
            #expect(answer.refusal == "list-expired", "\(answer.stderr)")
            // At once: not after the direct-update wait (10 s) that a missing list gets.
            #expect(answer.seconds < 5)
            #expect(gate.logText.contains("the fingerprint list in force has expired"), "\(gate.logText)")
            let ready = try await Self.admin(port: try await Self.adminPort(gate), "/ready")
            #expect(ready.status == 503)
            #expect(ready.body.contains("list-expired"), "\(ready.body)")
            #expect(ready.body.contains("has expired"), "\(ready.body)")
        }
        let help = try await TestProcess.run(Self.pingate, ["run", "--help"])
        #expect(help.stdout.contains("list-expired"))
    }
}
