import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// An upstream that negotiates `h2` with ALPN and then never sends its connection preface
/// (SETTINGS, RFC 9113 §3.4). The gate holds the client's requests until the upstream's
/// SETTINGS arrive (they decide what the tunnel can carry), so without a bound the client
/// waited for the idle timeout and got no answer at all. It must fail closed within the
/// upstream handshake timeout: `504` with `Pingate-Refusal: upstream-timeout` on the
/// client's own protocol, counted and logged, both legs closed.
@Suite("An h2 upstream that never sends SETTINGS", .serialized)
struct SilentHTTP2UpstreamTests {
    static let host = "silent.pingate.test"
    /// Short, so the test is quick; the idle timeout is far longer, so only the new bound
    /// can end the wait in time.
    static let handshakeTimeout = 2

    struct Answer {
        var status: String
        var version: String
        var seconds: Double
        var headers: String
        var body: String
        var stderr: String
    }

    /// curl through the gate, `protocolFlag` choosing the client's HTTP version inside the tunnel.
    static func curl(_ gate: GateFixture, port: Int, _ protocolFlag: String) async throws -> Answer {
        let output = try TemporaryDirectory()
        defer { output.remove() }
        let run = try await TestProcess.run("curl", [
            "-sS", "-v", "--max-time", "25", protocolFlag,
            "--proxy", "http://127.0.0.1:\(gate.port)", "--cacert", gate.caPath,
            "-D", output.file("headers"), "-o", output.file("body"),
            "-w", "%{http_code} %{http_version} %{time_total}",
            "https://\(host):\(port)/",
        ], timeout: 40)
        let fields = run.stdout.split(separator: " ").map(String.init)
        return Answer(status: fields.first ?? "", version: fields.dropFirst().first ?? "",
                      seconds: Double(fields.dropFirst(2).first ?? "") ?? 99,
                      headers: ((try? String(contentsOfFile: output.file("headers"), encoding: .utf8)) ?? "").lowercased(),
                      body: (try? String(contentsOfFile: output.file("body"), encoding: .utf8)) ?? "",
                      stderr: run.stderr)
    }

    @Test("HTTP/1.1 and h2 clients get 504 upstream-timeout within the handshake timeout; counted, logged, both legs closed")
    func silentUpstream() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "silent")
        try await H2EchoOrigin.with(script: "silent_peer.py", ["--cert", leaf.certificatePath, "--key", leaf.keyPath]) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(origin.port)"], configure: {
                $0.upstreamHandshakeTimeout = .seconds(Int64(Self.handshakeTimeout))
                $0.idleTimeout = .seconds(120)
            }) { gate in
                for (index, (flag, version)) in [("--http1.1", "1.1"), ("--http2", "2")].enumerated() {
                    let answer = try await Self.curl(gate, port: origin.port, flag)
                    #expect(answer.status == "504", "\(flag): \(answer.stderr)")
                    #expect(answer.version == version, "\(flag): \(answer.stderr)")
                    #expect(answer.headers.contains("pingate-refusal: upstream-timeout"), "\(flag): \(answer.headers)")
                    #expect(answer.body.contains("SETTINGS"), "\(flag): \(answer.body)")
                    // Bounded by the handshake timeout (plus the machine's own slowness), not
                    // the idle timeout.
                    #expect(answer.seconds >= Double(Self.handshakeTimeout) - 0.2, "\(flag): \(answer.seconds) s")
                    #expect(answer.seconds < Double(Self.handshakeTimeout) + 8, "\(flag): \(answer.seconds) s")
                    #expect(gate.statistics.requestsRefused(.upstreamTimeout) == index + 1)
                    #expect(gate.statistics.requestsForwarded == 0)
                    let refusal = gate.server.refusals.entries.last
                    #expect(refusal?.reason == .upstreamTimeout)
                    #expect(refusal?.host == Self.host)
                }
                // The gate made two upstream connections, spoke its preface on each, and
                // closed each (the origin saw the end); no tunnel is left open.
                let closed = await eventually(timeout: .seconds(10)) {
                    origin.events.filter { $0["event"] as? String == "closed" }.count == 2
                }
                #expect(closed, "\(origin.events) \(origin.errors)")
                let ends = origin.events.filter { $0["event"] as? String == "closed" }
                #expect(ends.allSatisfy { $0["preface"] as? Bool == true }, "\(ends)")
                #expect(origin.events.filter { $0["event"] as? String == "accepted" }.allSatisfy { $0["alpn"] as? String == "h2" })
                #expect(await eventually(timeout: .seconds(10)) { gate.statistics.openTunnels == 0 }, "\(gate.statistics)")
                #expect(gate.statistics.count(.trusted) == 2)
            }
        }
    }
}
