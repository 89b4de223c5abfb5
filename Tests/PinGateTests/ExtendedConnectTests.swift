import Foundation
import NIOHTTP1
import PinGateTestSupport
import Testing
@testable import PinGate
@testable import PinGateHTTP

/// RFC 8441 extended CONNECT inside a tunnel (issue #9, item 6): a WebSocket passes after
/// the same authority check as any request, in whichever form each leg speaks. Real peers
/// only: Python `h2` on both HTTP/2 ends (`h2_client.py`, `h2_echo_server.py`), Python
/// `websockets` on both HTTP/1.1 ends (`ws_peer.py`), every leaf minted here, loopback.
@Suite("WebSocket over HTTP/2 extended CONNECT (RFC 8441)", .serialized)
struct ExtendedConnectTests {
    static let host = "ws.pingate.test"
    static let other = "other.pingate.test"
    static let payloadSize = 1_000_000
    /// `h2_client.py --timeout`: the limit of each of its waits, in seconds.
    static let peerWait = 20
    static let h2Client = (H2EchoOrigin.peers as NSString).appendingPathComponent("h2_client.py")
    static let wsPeer = (H2EchoOrigin.peers as NSString).appendingPathComponent("ws_peer.py")

    // MARK: helpers

    /// A fresh PKI, peer `script` started with `arguments(leaf)` as the origin for `host`,
    /// and a gate pinning its leaf with `--resolve` to it; all stopped whatever `body` does.
    static func withOrigin<Value>(
        _ script: String, _ arguments: (TestPKI.Identity) -> [String],
        _ body: (GateFixture, H2EchoOrigin) async throws -> Value
    ) async throws -> Value {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        return try await H2EchoOrigin.with(script: script, arguments(leaf)) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]),
                                       resolve: ["\(host):\(origin.port)"]) { gate in
                try await body(gate, origin)
            }
        }
    }

    /// The HTTP/2 echo origin; with `connectProtocol` it offers RFC 8441 and serves WebSocket.
    /// With `settingsAfterPreface`, its SETTINGS go out only once the gate's preface came.
    static func withH2Origin<Value>(connectProtocol: Bool, settingsAfterPreface: Bool = false,
                                    _ body: (GateFixture, H2EchoOrigin) async throws -> Value) async throws -> Value {
        try await withOrigin("h2_echo_server.py", {
            ["--cert", $0.certificatePath, "--key", $0.keyPath] + (connectProtocol ? ["--enable-connect-protocol"] : [])
                + (settingsAfterPreface ? ["--settings-after-preface"] : [])
        }, body)
    }

    /// The `websockets` wss:// echo origin (HTTP/1.1 only).
    /// With `badAccept`, its 101s carry a Sec-WebSocket-Accept that answers no key.
    static func withWebSocketOrigin<Value>(badAccept: Bool = false, _ body: (GateFixture, H2EchoOrigin) async throws -> Value)
        async throws -> Value {
        try await withOrigin("ws_peer.py", {
            ["server", "--cert", $0.certificatePath, "--key", $0.keyPath] + (badAccept ? ["--bad-accept"] : [])
        }, body)
    }

    /// `h2_client.py --scenario NAME` through `gate` to the origin; its JSON report.
    static func h2Client(_ scenario: String, gate: GateFixture, port: Int, authority: String? = nil, path: String? = nil)
        async throws -> [String: Any] {
        var arguments = [h2Client, "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(host):\(port)", "--cacert", gate.caPath,
                         "--scenario", scenario, "--payload-size", "\(payloadSize)", "--timeout", "\(peerWait)"]
        if let authority { arguments += ["--authority", authority] }
        if let path { arguments += ["--path", path] }
        let run = try await TestProcess.run("python3", arguments, timeout: 60)
        #expect(run.status == 0, "\(scenario): \(run.stderr) \(run.stdout)")
        let report = (try? JSONSerialization.jsonObject(with: run.stdoutData)) as? [String: Any] ?? [:]
        // No step waited out its timeout (each wait would alone take `peerWait`): every
        // stream ended when it should, not when the peer gave up on it.
        #expect((report["elapsed_s"] as? Double ?? 99) < Double(peerWait), "\(scenario) took \(report["elapsed_s"] ?? "?") s: \(report)")
        return report
    }

    /// `ws_peer.py client` through `gate` (HTTP/1.1 inside the tunnel); its JSON report.
    static func wsClient(gate: GateFixture, port: Int, hostHeader: String? = nil) async throws -> [String: Any] {
        var arguments = [wsPeer, "client", "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(host):\(port)",
                         "--cacert", gate.caPath, "--payload-size", "\(payloadSize)"]
        if let hostHeader { arguments += ["--host-header", hostHeader] }
        let run = try await TestProcess.run("python3", arguments, timeout: 60)
        #expect(run.status == 0, "ws client: \(run.stderr) \(run.stdout)")
        return (try? JSONSerialization.jsonObject(with: run.stdoutData)) as? [String: Any] ?? [:]
    }

    static func stream(_ report: [String: Any], _ id: Int) -> [String: Any] {
        (report["streams"] as? [String: Any])?["\(id)"] as? [String: Any] ?? [:]
    }

    static func headers(_ stream: [String: Any]) -> [String: String] {
        stream["headers"] as? [String: String] ?? [:]
    }

    static func events(_ origin: H2EchoOrigin, _ kind: String) -> [[String: Any]] {
        origin.events.filter { $0["event"] as? String == kind }
    }

    // MARK: 1. HTTP/2 client, HTTP/2 upstream

    @Test("an h2 origin's answer with a CR, LF, NUL or control byte in a field value, an upper-case or spaced field name, or a CR in a trailer never reaches an HTTP/1.1 client: the field is dropped or the answer refused (502), and the next request gets its own answer",
          arguments: ["cr", "lf", "nul", "ctl", "upper-name", "space-in-name", "cr-trailer"])
    func badFieldFromH2Origin(kind: String) async throws {
        try await Self.withH2Origin(connectProtocol: false) { gate, origin in
            let result = try await curlThroughGate(gate, urls: ["https://\(Self.host):\(origin.port)/bad-field/\(kind)",
                                                                "https://\(Self.host):\(origin.port)/bad-field/ctl-unknown"],
                                                   ["--http1.1", "--raw"])
            let first = result.transfers.first ?? ""
            #expect(first.hasPrefix("200 ") || first.hasPrefix("502 "), "\(result.transfers) \(result.stderr)")
            // curl -v prints every field it received, one per line prefixed "< ".
            let received = result.stderr.split(whereSeparator: \.isNewline).filter { $0.hasPrefix("< ") }
            #expect(!received.contains { $0.lowercased().contains("x-injected") || $0.lowercased().contains("x-bad") }, "\(received)")
            #expect(!String(decoding: result.body, as: UTF8.self).lowercased().contains("x-injected"), "\(String(decoding: result.body, as: UTF8.self))")
            // The next request on the same client connection is answered as usual (404 from the echo origin).
            #expect(result.transfers.last?.hasPrefix("404 ") == true, "\(result.transfers)")
        }
    }

    @Test("h2 ↔ h2: the gate offers ENABLE_CONNECT_PROTOCOL, a WebSocket extended CONNECT is forwarded as one and 1 MB of random bytes (past every window) echo back exactly; another :authority gets 421 and a plain CONNECT 405, neither reaching the origin")
    func http2BothLegs() async throws {
        try await Self.withH2Origin(connectProtocol: true) { gate, origin in
            let authority = "\(Self.host):\(origin.port)"
            let report = try await Self.h2Client("extended-connect", gate: gate, port: origin.port)
            #expect((report["settings"] as? [String: Any])?["ENABLE_CONNECT_PROTOCOL"] as? Int == 1, "\(report)")
            let stream = Self.stream(report, 1)
            #expect(stream["status"] as? Int == 200, "\(report) \(origin.errors)")
            #expect(report["echo_equal"] as? Bool == true, "\(report)")
            #expect(report["echo_sha256"] as? String == report["payload_sha256"] as? String)
            #expect(report["masked_from_server"] as? Bool == false)
            #expect(report["close_code"] as? Int == 1000)
            #expect(stream["ended"] as? Bool == true)
            #expect(stream["reset"] is NSNull)

            // The origin saw an extended CONNECT for the checked authority, and the one
            // message, byte for byte.
            _ = await eventually(timeout: .seconds(10)) { !origin.streams.isEmpty }
            #expect(origin.streams.count == 1, "\(origin.streams)")
            let seen = origin.streams.first ?? [:]
            let seenHeaders = seen["headers"] as? [String: String] ?? [:]
            #expect(seen["method"] as? String == "CONNECT")
            #expect(seen["protocol"] as? String == "websocket")
            #expect(seenHeaders[":authority"] == authority)
            #expect(seenHeaders[":scheme"] == "https")
            #expect(seenHeaders["sec-websocket-version"] == "13")
            #expect(seen["ws_payloads_sha256"] as? [String] == [report["payload_sha256"] as? String ?? "?"])
            #expect(seen["ws_close_code"] as? Int == 1000)
            var stats = gate.statistics
            #expect(stats.requestsForwarded == 1)
            #expect(stats.requestsRefusedByReason.isEmpty, "\(stats.requestsRefusedByReason)")
            #expect(stats.bytesUp > Self.payloadSize)
            #expect(stats.bytesDown > Self.payloadSize)

            // Another authority: 421 on the stream, nothing reaches the origin.
            let fronted = try await Self.h2Client("extended-connect", gate: gate, port: origin.port,
                                                  authority: "\(Self.other):\(origin.port)")
            let refused = Self.stream(fronted, 1)
            #expect(refused["status"] as? Int == 421, "\(fronted)")
            #expect(Self.headers(refused)["pingate-refusal"] == "authority-mismatch")

            // A classic CONNECT stays refused (405); the connection still serves a GET.
            let plain = try await Self.h2Client("plain-connect", gate: gate, port: origin.port)
            let plainStream = Self.stream(plain, 1)
            #expect(plainStream["status"] as? Int == 405, "\(plain)")
            #expect(Self.headers(plainStream)["pingate-refusal"] == "method-not-allowed")
            #expect(Self.stream(plain, 3)["status"] as? Int == 404, "\(plain)")  // the origin's answer to GET /

            _ = await eventually(timeout: .seconds(5)) { origin.streams.count >= 2 }
            // Only the probe GET joined the first stream at the origin.
            #expect(origin.streams.count == 2, "\(origin.streams)")
            #expect(origin.streams.last?["method"] as? String == "GET")
            stats = gate.statistics
            #expect(stats.requestsForwarded == 2)
            #expect(stats.requestsRefused(.authorityMismatch) == 1)
            #expect(stats.requestsRefused(.methodNotAllowed) == 1)
        }
    }

    @Test("h2 ↔ h2 without the upstream's ENABLE_CONNECT_PROTOCOL: the gate does not advertise it to the client either (a browser then opens its WebSocket another way), an extended CONNECT sent anyway is reset, and nothing reaches the origin")
    func http2UpstreamWithoutSetting() async throws {
        try await Self.withH2Origin(connectProtocol: false) { gate, origin in
            let report = try await Self.h2Client("extended-connect", gate: gate, port: origin.port)
            #expect(report["server_enables_connect_protocol"] is NSNull, "\(report)")
            let stream = Self.stream(report, 1)
            // Without the setting, :protocol is malformed (RFC 8441 §3): nghttp2 resets the stream.
            #expect(stream["status"] is NSNull, "\(report)")
            #expect(stream["reset"] as? Int == 1, "\(report)")
            try await Task.sleep(for: .milliseconds(200))
            #expect(origin.streams.isEmpty, "\(origin.streams)")
            let stats = gate.statistics
            #expect(stats.requestsForwarded == 0)
        }
    }

    @Test("an h2 upstream that sends its SETTINGS only after the gate's preface: the client's extended CONNECT and Upgrade wait for them and pass (not a 501 decided on RFC 9113's defaults)")
    func upstreamSettingsArriveLate() async throws {
        try await Self.withH2Origin(connectProtocol: true, settingsAfterPreface: true) { gate, origin in
            let report = try await Self.h2Client("extended-connect", gate: gate, port: origin.port)
            #expect(Self.stream(report, 1)["status"] as? Int == 200, "\(report) \(origin.errors)")
            #expect(report["echo_equal"] as? Bool == true, "\(report)")
            let h1 = try await Self.wsClient(gate: gate, port: origin.port)
            #expect(h1["status"] as? Int == 101, "\(h1)")
            #expect(h1["echo_equal"] as? Bool == true, "\(h1)")
            let stats = gate.statistics
            #expect(stats.requestsForwarded == 2)
            #expect(stats.requestsRefused(.upgradeUnsupported) == 0)
        }
    }

    // MARK: 2. HTTP/2 client, HTTP/1.1 upstream

    @Test("h2 client → HTTP/1.1 WebSocket origin: the extended CONNECT becomes a GET Upgrade with a fresh key, the 101's accept is checked, the stream gets 200 and 1 MB echo back exactly; another :authority gets 421 and the origin sees no handshake")
    func http2ClientToHTTP1Upstream() async throws {
        try await Self.withWebSocketOrigin { gate, origin in
            let authority = "\(Self.host):\(origin.port)"
            let report = try await Self.h2Client("extended-connect", gate: gate, port: origin.port)
            let stream = Self.stream(report, 1)
            #expect(stream["status"] as? Int == 200, "\(report) \(origin.errors)")
            #expect(Self.headers(stream)["sec-websocket-accept"] == nil)
            #expect(report["echo_equal"] as? Bool == true, "\(report)")
            #expect(report["masked_from_server"] as? Bool == false)
            #expect(report["close_code"] as? Int == 1000)
            #expect(stream["ended"] as? Bool == true, "\(report)")

            _ = await eventually(timeout: .seconds(10)) { !Self.events(origin, "closed").isEmpty }
            let handshakes = Self.events(origin, "connection")
            #expect(handshakes.count == 1, "\(origin.events) \(origin.errors)")
            let seen = handshakes.first?["headers"] as? [String: String] ?? [:]
            #expect(seen["host"] == authority)
            #expect(seen["upgrade"]?.lowercased() == "websocket")
            #expect(seen["connection"]?.lowercased() == "upgrade")
            #expect(seen["sec-websocket-version"] == "13")
            #expect(Data(base64Encoded: seen["sec-websocket-key"] ?? "")?.count == 16, "\(seen)")
            #expect(handshakes.first?["path"] as? String == "/")
            let closed = Self.events(origin, "closed").first ?? [:]
            #expect(closed["sha256"] as? [String] == [report["payload_sha256"] as? String ?? "?"])
            #expect(gate.statistics.requestsForwarded == 1)

            let fronted = try await Self.h2Client("extended-connect", gate: gate, port: origin.port,
                                                  authority: "\(Self.other):\(origin.port)")
            #expect(Self.stream(fronted, 1)["status"] as? Int == 421, "\(fronted)")
            #expect(Self.headers(Self.stream(fronted, 1))["pingate-refusal"] == "authority-mismatch")
            try await Task.sleep(for: .milliseconds(200))
            #expect(Self.events(origin, "connection").count == 1)
            let stats = gate.statistics
            #expect(stats.requestsRefused(.authorityMismatch) == 1)
            #expect(stats.requestsForwarded == 1)
            #expect(stats.upstreamConnections == 2)
        }
    }

    @Test("h2 client → HTTP/1.1 origin that does not switch: its 404 is the stream's response; a 101 whose Sec-WebSocket-Accept answers no key is a 502, never a 200")
    func http2ClientToHTTP1UpstreamWithoutSwitch() async throws {
        try await Self.withWebSocketOrigin { gate, origin in
            let report = try await Self.h2Client("extended-connect", gate: gate, port: origin.port, path: "/refuse")
            let stream = Self.stream(report, 1)
            #expect(stream["status"] as? Int == 404, "\(report) \(origin.errors)")
            #expect(stream["body_text"] as? String == "no such socket\n")
            #expect(Self.headers(stream)["pingate-refusal"] == nil)
            #expect(stream["ended"] as? Bool == true)
            #expect(Self.events(origin, "request").map { $0["path"] as? String } == ["/refuse"])
            #expect(Self.events(origin, "connection").isEmpty)
            #expect(gate.statistics.requestsForwarded == 1)
        }
        try await Self.withWebSocketOrigin(badAccept: true) { gate, origin in
            let report = try await Self.h2Client("extended-connect", gate: gate, port: origin.port)
            let stream = Self.stream(report, 1)
            #expect(stream["status"] as? Int == 502, "\(report) \(origin.errors)")
            // The upstream was reached and answered, wrongly: a protocol error, not unreachable.
            #expect(Self.headers(stream)["pingate-refusal"] == "upstream-protocol-error")
            #expect((stream["body_text"] as? String)?.contains("Sec-WebSocket-Accept") == true, "\(stream)")
            #expect(report["echoes"] == nil)  // nothing was relayed: the client never got a 200
            #expect(Self.events(origin, "request").count == 1)
            // Counted and listed like every refusal inside a tunnel.
            #expect(gate.statistics.requestsRefusedByReason["upstream-protocol-error"] == 1, "\(gate.statistics.requestsRefusedByReason)")
            #expect(gate.statistics.requestsRefusedByReason.count == 1, "\(gate.statistics.requestsRefusedByReason)")
            #expect(gate.server.refusals.entries.last?.reason.rawValue == "upstream-protocol-error")
            #expect(gate.statistics.bytesUp == 0 && gate.statistics.bytesDown == 0, "\(gate.statistics)")
        }
    }

    @Test("HTTP/1.1 WebSocket client → HTTP/1.1 origin whose 101 carries a Sec-WebSocket-Accept that answers no key: 502 upstream-protocol-error, the 101 never reaches the client, nothing relayed")
    func http1BothLegsWrongAccept() async throws {
        try await Self.withWebSocketOrigin(badAccept: true) { gate, origin in
            let report = try await Self.wsClient(gate: gate, port: origin.port)
            #expect(report["status"] as? Int == 502, "\(report) \(origin.errors)")
            #expect(report["refusal"] as? String == "upstream-protocol-error", "\(report)")
            #expect((report["body"] as? String)?.contains("Sec-WebSocket-Accept") == true, "\(report)")
            #expect(report["echo_equal"] == nil, "\(report)")  // no frame went either way
            #expect(Self.events(origin, "request").count == 1)
            _ = await eventually(timeout: .seconds(5)) { !Self.events(origin, "closed").isEmpty }
            #expect(Self.events(origin, "closed").first?["messages"] as? Int == 0, "\(origin.events)")
            let stats = gate.statistics
            #expect(stats.requestsForwarded == 1)
            #expect(stats.requestsRefusedByReason["upstream-protocol-error"] == 1, "\(stats.requestsRefusedByReason)")
            #expect(stats.bytesUp == 0 && stats.bytesDown == 0, "\(stats)")
            #expect(gate.server.refusals.entries.last?.reason.rawValue == "upstream-protocol-error")
        }
    }

    // MARK: 3. HTTP/1.1 client, HTTP/2 upstream

    @Test("HTTP/1.1 WebSocket client → h2 origin with ENABLE_CONNECT_PROTOCOL: the Upgrade becomes an extended CONNECT, the client gets 101 with the accept for its key and 1 MB echo back exactly; another Host gets 421")
    func http1ClientToHTTP2Upstream() async throws {
        try await Self.withH2Origin(connectProtocol: true) { gate, origin in
            let report = try await Self.wsClient(gate: gate, port: origin.port)
            #expect(report["alpn"] as? String == "http/1.1")
            #expect(report["status"] as? Int == 101, "\(report) \(origin.errors)")
            #expect(report["echo_equal"] as? Bool == true, "\(report)")
            #expect(report["close_code"] as? Int == 1000, "\(report)")

            _ = await eventually(timeout: .seconds(10)) { !origin.streams.isEmpty }
            #expect(origin.streams.count == 1, "\(report) \(origin.events) \(origin.errors)")
            let seen = origin.streams.first ?? [:]
            let seenHeaders = seen["headers"] as? [String: String] ?? [:]
            #expect(seen["method"] as? String == "CONNECT")
            #expect(seen["protocol"] as? String == "websocket")
            #expect(seen["path"] as? String == "/chat")
            #expect(seenHeaders[":authority"] == "\(Self.host):\(origin.port)")
            #expect(seenHeaders["sec-websocket-key"] == nil)
            #expect(seenHeaders["sec-websocket-version"] == "13")
            #expect(seen["ws_payloads_sha256"] as? [String] == [report["payload_sha256"] as? String ?? "?"])
            #expect(gate.statistics.requestsForwarded == 1)

            // An HTTP/1.1 CONNECT that names an Upgrade is still a classic CONNECT: 405, and
            // not taken for an extended one.
            let target = "\(Self.host):\(origin.port)"
            let connect = "CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            let steps = try await DomainFrontingTests.run([connect], gate: gate, target: target)
            #expect(steps.first?.status == 405, "\(steps)")
            #expect(steps.first?.refusal == "method-not-allowed")
            #expect(gate.statistics.requestsRefused(.methodNotAllowed) == 1)

            let fronted = try await Self.wsClient(gate: gate, port: origin.port, hostHeader: "\(Self.other):\(origin.port)")
            #expect(fronted["status"] as? Int == 421, "\(fronted)")
            #expect(fronted["refusal"] as? String == "authority-mismatch")
            try await Task.sleep(for: .milliseconds(200))
            #expect(origin.streams.count == 1)
            let stats = gate.statistics
            #expect(stats.requestsRefused(.authorityMismatch) == 1)
            #expect(stats.requestsForwarded == 1)
        }
    }

    // MARK: the handshake arithmetic

    @Test("Sec-WebSocket-Accept is RFC 6455's own example, computed with the TLS engine's SHA-1; fresh keys are 16 random bytes")
    func acceptValue() {
        #expect(WebSocketHandshake.accept(forKey: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        let keys = Set((0..<8).map { _ in WebSocketHandshake.freshKey() })
        #expect(keys.count == 8)
        #expect(keys.allSatisfy { Data(base64Encoded: $0)?.count == 16 })
        var response = HTTPHeaders([("upgrade", "websocket"), ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")])
        #expect(WebSocketHandshake.problem(with: response, key: "dGhlIHNhbXBsZSBub25jZQ==") == nil)
        response.replaceOrAdd(name: "sec-websocket-accept", value: "AAAAAAAAAAAAAAAAAAAAAAAAAAA=")
        #expect(WebSocketHandshake.problem(with: response, key: "dGhlIHNhbXBsZSBub25jZQ==") != nil)
    }

    // MARK: 5. An Upgrade the h2 upstream cannot carry

    @Test("an HTTP/1.1 client's WebSocket to an nginx h2 origin (no RFC 8441) goes on a connection of the tunnel's own, dialled with ALPN http/1.1 and pinned like any: 101 and the echo whole, cold and with a warm shared h2 connection in the pool, which stays for others",
          arguments: [false, true])
    func upgradeOnPrivateHTTP1Connection(warm: Bool) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "origin")
        try await H2EchoOrigin.with(script: "ws_peer.py", ["server", "--plain"]) { backend in
            let proxy = """
                location /chat {
                    proxy_pass http://127.0.0.1:\(backend.port);
                    proxy_http_version 1.1;
                    proxy_set_header Upgrade $http_upgrade;
                    proxy_set_header Connection "upgrade";
                }
                """
            try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: ["a.txt": Data("a\n".utf8)],
                                       http2: true, serverDirectives: proxy) { nginx in
                try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                           resolve: ["\(Self.host):\(nginx.port)"], configure: { $0.eventLoopThreads = 1 }) { gate in
                    if warm {
                        let fetched = try await curlThroughGate(gate, "https://\(Self.host):\(nginx.port)/a.txt")
                        #expect(fetched.httpVersion == "2" && fetched.body == Data("a\n".utf8), "\(fetched.stderr)")
                        #expect(await eventually(timeout: .seconds(5)) { gate.server.upstreamPool?.idle == 1 })
                    }
                    let report = try await Self.wsClient(gate: gate, port: nginx.port)
                    #expect(report["status"] as? Int == 101, "\(report)")
                    #expect(report["echo_equal"] as? Bool == true, "\(report)")
                    #expect(report["close_code"] as? Int == 1000, "\(report)")
                    #expect(Self.events(backend, "connection").count == 1, "\(backend.events)")
                    #expect(gate.statistics.requestsRefused(.upgradeUnsupported) == 0)
                    #expect(gate.statistics.upstreamReconnects["connected"] == 1, "\(gate.statistics.upstreamReconnects)")
                    let pool = try #require(gate.server.upstreamPool)
                    // The private connection never went to the pool; the shared h2 one stayed.
                    #expect(pool.idle == 1, "\(pool)")
                    if warm { #expect(pool.hits == 1, "\(pool)") }
                }
            }
        }
    }
}
