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

    // MARK: item 6

    @Test("--pins-key errors name the key file and what is wrong with it, never the list")
    func keyFileErrors() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let missing = directory.file("no-such-signer.pub.pem")
        let garbage = try directory.write("garbage.pub.pem", "not a key\n")
        for (key, problem) in [(missing, "does not exist"), (garbage, "holds no P-256 public key"), (directory.path, "is a directory")] {
            let result = try await TestProcess.run(Self.pingate, [
                "run", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", directory.file("state"),
                "--pins", WultraVectors.path("static-list.json"), "--pins-key", key,
            ], timeout: 30)
            #expect(result.status != 0)
            #expect(result.stderr.contains("the list-verification key file \(key) \(problem)"), "\(result.stderr)")
            #expect(!result.stderr.contains("malformed"), "\(result.stderr)")
            let verify = try await TestProcess.run(Self.pingate, ["list", "verify", WultraVectors.path("static-list.json"), "--key", key])
            #expect(verify.status != 0)
            #expect(verify.stderr.contains("the list-verification key file \(key) \(problem)"), "\(verify.stderr)")
            #expect(!verify.stderr.contains("does not verify"), "\(verify.stderr)")
        }
    }

    @Test("--pins-key takes Wultra's base64 X9.63 key inline, for run and list verify")
    func inlineKey() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let inline = try String(contentsOfFile: WultraVectors.path("test-signer.pub.x963.b64"), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(inline.contains("/"))  // so it must not be taken for a path and resolved
        let verify = try await TestProcess.run(Self.pingate, ["list", "verify", WultraVectors.path("static-list.json"), "--key", inline])
        #expect(verify.status == 0, "\(verify.stderr)")
        try await RunningGate.withAttempt([
            "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
            "--pins", WultraVectors.path("static-list.json"), "--pins-key", inline,
        ]) { gate in
            #expect(gate != nil)
        }
        // The same key in a config file's `keys:`, next to a relative path that is resolved.
        let config = try directory.write("pingate.yml", """
            listen: 127.0.0.1:0
            admin:
              listen: "off"
            state-dir: state
            pins:
              source: \(WultraVectors.path("static-list.json"))
              keys: ["\(inline)"]
            """)
        let configured = try await RunningGate.withAttempt(["--config", config]) { gate in gate != nil }
        #expect(configured)
    }

    // MARK: item 2

    @Test("ca.key deleted: run names the missing file; ca init --force replaces the CA and keeps the old files as timestamped backups")
    func caDeadEnd() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let state = directory.file("state")
        let first = try await TestProcess.run(Self.pingate, ["ca", "init", "--state-dir", state])
        #expect(first.status == 0, "\(first.stderr)")
        let oldCertificate = try String(contentsOfFile: state + "/ca.pem", encoding: .utf8)
        try FileManager.default.removeItem(atPath: state + "/ca.key")

        let run = try await TestProcess.run(Self.pingate, ["run", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", state], timeout: 30)
        #expect(run.status != 0)
        #expect(run.stderr.contains("\(state)/ca.key is missing"), "\(run.stderr)")
        #expect(run.stderr.contains("pingate ca init --force"), "\(run.stderr)")

        let plain = try await TestProcess.run(Self.pingate, ["ca", "init", "--state-dir", state])
        #expect(plain.status != 0)
        #expect(plain.stderr.contains("--force"), "\(plain.stderr)")

        let forced = try await TestProcess.run(Self.pingate, ["ca", "init", "--force", "--state-dir", state])
        #expect(forced.status == 0, "\(forced.stderr)")
        var names = try FileManager.default.contentsOfDirectory(atPath: state)
        let certificateBackups = names.filter { $0.hasPrefix("ca.pem.bak-") }
        #expect(certificateBackups.count == 1, "\(names)")
        if let backup = certificateBackups.first {
            #expect(backup.range(of: #"^ca\.pem\.bak-\d{8}T\d{6}Z$"#, options: .regularExpression) != nil, "\(backup)")
            #expect(try String(contentsOfFile: state + "/" + backup, encoding: .utf8) == oldCertificate)
        }
        let keyMode = try FileManager.default.attributesOfItem(atPath: state + "/ca.key")[.posixPermissions] as? Int
        #expect(keyMode == 0o600)
        #expect(try String(contentsOfFile: state + "/ca.pem", encoding: .utf8) != oldCertificate)

        // Again, at once: both files are kept, under names that do not collide.
        let again = try await TestProcess.run(Self.pingate, ["ca", "init", "--force", "--state-dir", state])
        #expect(again.status == 0, "\(again.stderr)")
        names = try FileManager.default.contentsOfDirectory(atPath: state)
        #expect(names.filter { $0.hasPrefix("ca.pem.bak-") }.count == 2, "\(names)")
        #expect(names.filter { $0.hasPrefix("ca.key.bak-") }.count == 1, "\(names)")

        try await RunningGate.withAttempt(["--listen", "127.0.0.1:0", "--state-dir", state]) { gate in
            #expect(gate != nil)
        }
    }

    @Test("ca.key open to others or a state directory that is not 0700: run refuses by default, warns with --no-strict-permissions")
    func caPermissions() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let state = directory.file("state")
        let created = try await TestProcess.run(Self.pingate, ["ca", "init", "--state-dir", state])
        #expect(created.status == 0, "\(created.stderr)")
        #expect(try FileManager.default.attributesOfItem(atPath: state)[.posixPermissions] as? Int == 0o700)
        #expect(try FileManager.default.attributesOfItem(atPath: state + "/ca.key")[.posixPermissions] as? Int == 0o600)

        for (path, mode, says) in [(state + "/ca.key", 0o644, "\(state)/ca.key has mode 644"),
                                   (state, 0o755, "the state directory \(state) has mode 755, not 700")] {
            chmod(path, mode_t(mode))
            let refused = try await TestProcess.run(Self.pingate, [
                "run", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", state,
            ], timeout: 30)
            #expect(refused.status != 0)
            #expect(refused.stderr.contains(says), "\(refused.stderr)")
            #expect(refused.stderr.contains("--no-strict-permissions"), "\(refused.stderr)")
            try await RunningGate.with(["--listen", "127.0.0.1:0", "--state-dir", state, "--no-strict-permissions"]) { gate in
                #expect(gate.logText.contains("the local CA is exposed"), "\(gate.logText)")
                #expect(gate.logText.contains(says), "\(gate.logText)")
            }
            chmod(path, path == state ? 0o700 : 0o600)
        }
        try await RunningGate.withAttempt(["--listen", "127.0.0.1:0", "--state-dir", state]) { gate in
            #expect(gate != nil)
        }
    }

    // MARK: item 5

    @Test("admin endpoint: only its own names in Host are answered; anything else (DNS rebinding) gets 421 with a reason")
    func adminHostCheck() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try await RunningGate.with(["--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
                                    "--admin-allowed-hosts", "gate.internal"]) { gate in
            let port = try await Self.adminPort(gate)
            for path in ["/status", "/pins", "/refusals", "/ready", "/metrics", "/"] {
                let rebound = try await Self.admin(port: port, path, ["-i", "-H", "Host: attacker.example:\(port)"])
                #expect(rebound.status == 421, "\(path): \(rebound.body)")
                #expect(rebound.body.lowercased().contains("pingate-refusal: admin-host-not-allowed"), "\(rebound.body)")
                #expect(rebound.body.contains("DNS rebinding"), "\(rebound.body)")
                #expect(!rebound.body.contains("\"counters\""))
            }
            for host in ["127.0.0.1:\(port)", "localhost:\(port)", "LOCALHOST.:\(port)", "[::1]:\(port)", "gate.internal:\(port)"] {
                let own = try await Self.admin(port: port, "/status", ["-H", "Host: \(host)"])
                #expect(own.status == 200, "\(host): \(own.body)")
            }
            for host in ["localhost:\(port + 1)", "localhost", "127.0.0.1.attacker.example:\(port)", "gate.internal.evil:\(port)"] {
                let other = try await Self.admin(port: port, "/status", ["-H", "Host: \(host)"])
                #expect(other.status == 421, "\(host): \(other.body)")
            }
            // curl with no Host at all (HTTP/1.0 style).
            let none = try await Self.admin(port: port, "/status", ["-H", "Host:"])
            #expect(none.status == 421, "\(none.body)")
        }
        try await RunningGate.with(["--listen", "127.0.0.1:0", "--state-dir", directory.file("state2"),
                                    "--admin-allowed-hosts", "*"]) { gate in
            let port = try await Self.adminPort(gate)
            let any = try await Self.admin(port: port, "/ready", ["-H", "Host: anything.example"])
            #expect(any.status != 421, "\(any.body)")
        }
    }
}
