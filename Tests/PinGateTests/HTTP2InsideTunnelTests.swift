import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// A hostile HTTP/2 client (Python `h2`, `Tests/Peers/h2_client.py`) inside a tunnel
/// pinned for one name of a front end that serves two: every scenario's answer comes from
/// the gate's nghttp2 session as RFC 9113 says, the gate survives, and nothing the gate
/// refused reaches the front end.
@Suite("HTTP/2 clients inside a tunnel")
struct HTTP2InsideTunnelTests {
    static let peer = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Peers/h2_client.py").path

    static func scenario(_ name: String, gate: GateFixture, nginx: NginxOrigin, authority: String? = nil,
                         extra: [String] = []) async throws -> [String: Any] {
        var arguments = [peer, "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(DomainFrontingTests.pinned):\(nginx.port)",
                         "--cacert", gate.caPath, "--scenario", name] + extra
        if let authority { arguments += ["--authority", authority] }
        let result = try await TestProcess.run("python3", arguments, timeout: 60)
        #expect(result.status == 0, "\(name): \(result.stderr) \(result.stdout)")
        let object = try JSONSerialization.jsonObject(with: result.stdoutData) as? [String: Any]
        return object ?? [:]
    }

    typealias Fronting = DomainFrontingTests

    static func withFrontEnd<Value>(_ body: (GateFixture, NginxOrigin) async throws -> Value) async throws -> Value {
        try await Fronting.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Fronting.pinned, leaf.fingerprint)]) },
                                        http2: true, body)
    }

    /// The report of stream `id` in a scenario's output.
    static func stream(_ output: [String: Any], _ id: String) -> [String: Any] {
        (output["streams"] as? [String: Any])?[id] as? [String: Any] ?? [:]
    }

    @Test("streams for another authority get a 421 stream response, one at a time or concurrent; the pinned host's streams pass on the same connection")
    func frontingStreams() async throws {
        try await Self.withFrontEnd { gate, nginx in
            let sequential = try await Self.scenario("get-two", gate: gate, nginx: nginx, authority: Fronting.other)
            #expect(Self.stream(sequential, "1")["status"] as? Int == 200)
            #expect(Self.stream(sequential, "1")["body_text"] as? String == "pay\n")
            #expect(Self.stream(sequential, "3")["status"] as? Int == 421)
            #expect((Self.stream(sequential, "3")["headers"] as? [String: String])?["pingate-refusal"] == "authority-mismatch")
            #expect(Self.stream(sequential, "5")["status"] as? Int == 200)
            #expect(sequential["goaway"] is NSNull)
            #expect(sequential["closed"] as? Bool == false)

            let concurrent = try await Self.scenario("concurrent-mixed", gate: gate, nginx: nginx, authority: Fronting.other)
            #expect(Self.stream(concurrent, "1")["status"] as? Int == 200)
            #expect(Self.stream(concurrent, "3")["status"] as? Int == 421)

            #expect(Fronting.logLines(nginx, "other.log").isEmpty)
            #expect(Fronting.logLines(nginx, "pay.log").count == 3)
            #expect(Fronting.logLines(nginx, "pay.log").allSatisfy { $0.hasPrefix("HTTP/2.0 200") })
            let stats = gate.statistics
            #expect(stats.requestsRefused(.authorityMismatch) == 2)
            #expect(stats.requestsForwarded == 3)
            #expect(stats.upstreamConnections == 2)
        }
    }

    @Test("pseudo-header misuse, connection-specific fields, an oversized header list and an HPACK bomb: stream errors, nothing forwarded, the connection stays usable")
    func malformedStreams() async throws {
        try await Self.withFrontEnd { gate, nginx in
            let pseudo = try await Self.scenario("bad-pseudo", gate: gate, nginx: nginx, authority: Fronting.other)
            let cases = pseudo["cases"] as? [String: [String: Any]] ?? [:]
            #expect(Set(cases.keys) == ["missing-path", "duplicate-authority", "pseudo-after-regular", "uppercase-name",
                                        "connection-header", "connect-with-path"])
            for (name, report) in cases {
                // RFC 9113 §8.1.1: a malformed request is a stream error of type PROTOCOL_ERROR.
                #expect(report["reset"] as? Int == 1, "\(name): \(report)")
                #expect(report["status"] is NSNull, "\(name)")
            }
            #expect(pseudo["connections"] as? Int == 1, "stream errors do not end the connection")

            let oversized = try await Self.scenario("oversized-headers", gate: gate, nginx: nginx, authority: Fronting.other)
            #expect(Self.stream(oversized, "1")["reset"] as? Int != nil, "\(oversized)")
            #expect(Self.stream(oversized, "1")["status"] is NSNull)
            #expect(Self.stream(oversized, "3")["status"] as? Int == 200, "the probe after it passes")

            let bomb = try await Self.scenario("hpack-bomb", gate: gate, nginx: nginx, authority: Fronting.other)
            #expect(bomb["decoded_bytes"] as? Int ?? 0 > 4_000_000, "the bomb really decodes to megabytes")
            #expect(Self.stream(bomb, "1")["reset"] as? Int != nil, "\(bomb)")
            #expect(Self.stream(bomb, "3")["status"] as? Int == 200, "the probe after it passes")

            #expect(Fronting.logLines(nginx, "other.log").isEmpty)
            #expect(Fronting.logLines(nginx, "pay.log").count == 2, "only the two probes reached the front end")
            let stats = gate.statistics
            #expect(stats.requestsForwarded == 2)
            #expect(stats.requestsRefused(.malformedRequest) == 8)
        }
    }

    @Test("a :scheme other than http or https is refused 400 malformed-request, as an HTTP/1.1 ftp:// target is; nothing is forwarded and the connection goes on")
    func schemeOtherThanHTTPS() async throws {
        try await Self.withFrontEnd { gate, nginx in
            let output = try await Self.scenario("bad-scheme", gate: gate, nginx: nginx)
            #expect(Self.stream(output, "1")["status"] as? Int == 400, "\(output)")
            #expect((Self.stream(output, "1")["headers"] as? [String: String])?["pingate-refusal"] == "malformed-request")
            #expect((Self.stream(output, "1")["body_text"] as? String)?.contains(":scheme \"ftp\"") == true, "\(output)")
            #expect(Self.stream(output, "3")["status"] as? Int == 200, "the probe after it passes")
            #expect(Fronting.logLines(nginx, "pay.log").count == 1, "only the probe reached the front end")
            #expect(gate.statistics.requestsRefused(.malformedRequest) == 1)
        }
    }

    @Test("a PING flood and a SETTINGS flood, read or not, end with GOAWAY ENHANCE_YOUR_CALM as other floods do, counted as a refusal, and a client that floods for 1.5 s before reading still reads the GOAWAY; the gate goes on")
    func controlFrameFloods() async throws {
        try await Self.withFrontEnd { gate, nginx in
            for name in ["ping-flood", "settings-flood"] {
                let output = try await Self.scenario(name, gate: gate, nginx: nginx)
                #expect((output["goaway"] as? [String: Int])?["error_code"] == 11, "\(name): ENHANCE_YOUR_CALM: \(output)")
                #expect(output["closed"] as? Bool == true, "\(name): \(output)")
                #expect((output["sent"] as? Int ?? 0) > 1_000, "\(name): \(output)")
            }
            // A client that floods for 1.5 s before it reads a byte: the gate reads and drops
            // until it is quiet, so closing sends no reset that would destroy the GOAWAY.
            let deaf = try await Self.scenario("ping-flood-deaf", gate: gate, nginx: nginx)
            #expect((deaf["goaway"] as? [String: Int])?["error_code"] == 11, "ping-flood-deaf: ENHANCE_YOUR_CALM: \(deaf)")
            #expect(deaf["closed"] as? Bool == true, "\(deaf)")
            #expect(deaf["write_failed"] is NSNull, "the gate closed while the client was still writing: \(deaf)")
            // Each flood once: the GOAWAY that ends it is not counted again as a connection error.
            #expect(gate.statistics.requestsRefused(.malformedRequest) == 3)
            let after = try await Self.scenario("get", gate: gate, nginx: nginx)
            #expect(Self.stream(after, "1")["status"] as? Int == 200, "\(after)")
        }
    }

    @Test("invalid frames and a window overflow are connection errors (GOAWAY with the RFC 9113 code, then the close); a rapid reset burst costs the upstream nothing; the gate goes on")
    func connectionErrorsAndRapidReset() async throws {
        try await Self.withFrontEnd { gate, nginx in
            let invalid = try await Self.scenario("invalid-frame", gate: gate, nginx: nginx)
            #expect((invalid["goaway"] as? [String: Int])?["error_code"] == 1, "PROTOCOL_ERROR: \(invalid)")
            #expect(invalid["closed"] as? Bool == true)

            let overflow = try await Self.scenario("window-overflow", gate: gate, nginx: nginx)
            #expect((overflow["goaway"] as? [String: Int])?["error_code"] == 3, "FLOW_CONTROL_ERROR: \(overflow)")
            #expect(overflow["closed"] as? Bool == true)

            let rapid = try await Self.scenario("rapid-reset", gate: gate, nginx: nginx)
            #expect(rapid["reset_sent"] as? Int == 200)
            #expect(rapid["probe_ok"] as? Bool == true, "\(rapid)")
            #expect(Fronting.logLines(nginx, "pay.log").count == 1, "only the probe reached the front end")
            #expect(gate.statistics.requestsForwarded == 1, "the 200 abandoned streams were never started upstream")
            #expect(gate.statistics.requestsRefused(.malformedRequest) == 2)

            // Still serving: a fresh tunnel works.
            let after = try await Self.scenario("get", gate: gate, nginx: nginx)
            #expect(Self.stream(after, "1")["status"] as? Int == 200)
        }
    }

    @Test("abuse ends the connection, not just a stream: a reset flood (2,000 HEADERS + RST_STREAM) and HPACK bombs sent over and over each get GOAWAY ENHANCE_YOUR_CALM; nothing reaches the front end; the log says it a few times, not once per stream")
    func abuseEndsTheConnection() async throws {
        try await Self.withFrontEnd { gate, nginx in
            let flood = try await Self.scenario("rapid-reset", gate: gate, nginx: nginx, extra: ["--repeat", "2000"])
            #expect((flood["goaway"] as? [String: Int])?["error_code"] == 0xb, "ENHANCE_YOUR_CALM: \(flood)")
            #expect(flood["probe_ok"] as? Bool != true)

            let bombs = try await Self.scenario("hpack-bomb", gate: gate, nginx: nginx, authority: Fronting.other,
                                                extra: ["--repeat", "100"])
            #expect((bombs["goaway"] as? [String: Int])?["error_code"] == 0xb, "ENHANCE_YOUR_CALM: \(bombs)")
            #expect(bombs["closed"] as? Bool == true)

            #expect(Fronting.logLines(nginx, "pay.log").isEmpty)
            #expect(Fronting.logLines(nginx, "other.log").isEmpty)
            #expect(gate.statistics.requestsForwarded == 0)
            // Both connections' ends are counted as refusals; the bombs each count too.
            #expect(gate.statistics.requestsRefused(.malformedRequest) >= 2)
            // Still serving.
            let after = try await Self.scenario("get", gate: gate, nginx: nginx)
            #expect(Self.stream(after, "1")["status"] as? Int == 200)
        }
    }

    @Test("a client's own RST_STREAM is counted as the client's, never as the upstream failing, over an h2 and an HTTP/1.1 origin",
          arguments: [false, true])
    func clientResetCountedAsItsOwn(originH2: Bool) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Fronting.pinned)], issuer: pki.originCA, file: "origin")
        // This origin answers only once the request's body has ended, so the reset comes first.
        try await H2EchoOrigin.with(script: "upload_origin.py", [
            "--cert", leaf.certificatePath, "--key", leaf.keyPath, "--alpn", originH2 ? "h2" : "http/1.1",
        ]) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Fronting.pinned, leaf.fingerprint)]),
                                       resolve: ["\(Fronting.pinned):\(origin.port)"]) { gate in
                let run = try await TestProcess.run("python3", ["-c", Self.resetAfterHead, "\(gate.port)",
                                                                "\(Fronting.pinned):\(origin.port)", gate.caPath], timeout: 30)
                #expect(run.status == 0, "\(run.stderr)")
                _ = await eventually(timeout: .seconds(3)) { gate.statistics.requestsCancelledByClient == 1 }
                #expect(gate.statistics.requestsCancelledByClient == 1, "\(run.stdout)")
                #expect(gate.statistics.requestsRefusedByReason.isEmpty, "\(gate.statistics.requestsRefusedByReason)")
                #expect(gate.statistics.requestsForwarded == 1)
            }
        }
    }

    /// An h2 client that sends a POST head (body to follow), waits for it to reach the
    /// upstream, then resets the stream with CANCEL.
    static let resetAfterHead = #"""
    import socket, ssl, sys, time
    import h2.connection, h2.config, h2.errors
    port, target, ca = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head: head += raw.recv(1)
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    tls = context.wrap_socket(raw, server_hostname=target.split(":")[0])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "https"), (":authority", target.split(":")[0]), (":path", "/")])
    tls.sendall(conn.data_to_send())
    time.sleep(0.5)
    conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
    tls.sendall(conn.data_to_send())
    time.sleep(0.5)
    print("reset sent")
    """#
}
