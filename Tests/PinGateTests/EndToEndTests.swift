import Foundation
import PinGateTestSupport
import Testing
import PinGateTLS
@testable import PinGate
@testable import PinGateHTTP
import PinGateHarness

/// The gate end to end: real curl, real TLS origins (nginx and the gate's own engine),
/// real certificates minted now, all on loopback.
@Suite("End to end through curl")
struct EndToEndTests {
    static let host = "origin.pingate.test"

    /// 10 MiB of random bytes, and their SHA-256 (base64). One read of the kernel's
    /// generator: drawing them a word at a time costs ~1.3 M getrandom calls in a debug
    /// build, seconds of a cooperative thread that the tests running beside it wait for.
    static func randomPayload() throws -> (bytes: Data, digest: String) {
        let source = try #require(FileHandle(forReadingAtPath: "/dev/urandom"))
        defer { try? source.close() }
        let payload = try #require(try source.read(upToCount: 10 * 1024 * 1024))
        #expect(payload.count == 10 * 1024 * 1024)
        return (payload, SHA256Digest.base64(payload))
    }

    @Test("h2 upstream: an HTTP/2 client and an HTTP/1.1-only client each get 10 MiB intact, bridged over exactly one upstream connection per tunnel")
    func bridgedToHTTP2Upstream() async throws {
        let payload = try Self.randomPayload()
        try await PinnedNginx.with(host: Self.host, files: ["big.bin": payload.bytes, "small.txt": Data("small\n".utf8)]) { gate, nginx in
            let base = "https://\(Self.host):\(nginx.port)"
            // h2 on both legs: each leg its own nghttp2 session, the router between.
            let h2 = try await curlThroughGate(gate, urls: ["\(base)/big.bin"], ["--http2"])
            #expect(h2.exitStatus == 0, "\(h2.stderr)")
            #expect(h2.httpCode == "200")
            #expect(h2.httpVersion == "2")
            #expect(h2.body.count == payload.bytes.count)
            #expect(SHA256Digest.base64(h2.body) == payload.digest)

            // An HTTP/1.1-only client, three requests on its one tunnel: bridged onto
            // HTTP/2 streams of the one upstream connection the verdict was made on.
            let h1 = try await curlThroughGate(gate, urls: ["\(base)/big.bin", "\(base)/small.txt", "\(base)/small.txt"], ["--http1.1"])
            #expect(h1.exitStatus == 0, "\(h1.stderr)")
            #expect(h1.httpCode == "200")
            #expect(h1.httpVersion == "1.1")
            #expect(h1.body.count == payload.bytes.count + 12)
            #expect(SHA256Digest.base64(h1.body.prefix(payload.bytes.count)) == payload.digest)
            #expect(h1.body.suffix(12) == Data("small\nsmall\n".utf8))

            // nginx saw every request over HTTP/2, on two connections: one per tunnel.
            #expect(nginx.accessLogProtocols() == Array(repeating: "HTTP/2.0", count: 4))
            #expect(Set(nginx.accessLogConnections()).count == 2)
            let stats = gate.statistics
            #expect(stats.count(.trusted) == 2)
            #expect(stats.upstreamConnections == 2)
            #expect(stats.requestsForwarded == 4)
            #expect(stats.bytesDown == 2 * payload.bytes.count + 12)
        }
    }

    @Test("HTTP/1.1-only upstream: a client that offers only h2 gets 10 MiB intact and concurrent streams, bridged over exactly one upstream connection")
    func bridgedToHTTP1Upstream() async throws {
        let payload = try Self.randomPayload()
        try await PinnedNginx.with(host: Self.host, files: ["big.bin": payload.bytes, "small.txt": Data("small\n".utf8)], http2: false) { gate, nginx in
            // Python `h2` offers ALPN `h2` alone (curl would offer `http/1.1` too, and the
            // gate gives such a client the upstream's own HTTP/1.1). Its three streams go
            // out in one write; the gate runs them one after another on the HTTP/1.1 upstream.
            let run = try await TestProcess.run("python3", [
                HTTP2InsideTunnelTests.peer, "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(Self.host):\(nginx.port)",
                "--cacert", gate.caPath, "--scenario", "get-paths", "--paths", "/big.bin,/small.txt,/small.txt", "--timeout", "30",
            ], timeout: 90)
            #expect(run.status == 0, "\(run.stderr)")
            let output = try #require(try JSONSerialization.jsonObject(with: run.stdoutData) as? [String: Any], "\(run.stdout)")
            #expect(output["alpn"] as? String == "h2")
            let big = HTTP2InsideTunnelTests.stream(output, "1")
            #expect(big["status"] as? Int == 200, "\(output)")
            #expect(big["body_len"] as? Int == payload.bytes.count)
            let hex = SHA256Digest.hash(payload.bytes).map { String(format: "%02x", $0) }.joined()
            #expect(big["body_sha256"] as? String == hex)
            for id in ["3", "5"] {
                #expect(HTTP2InsideTunnelTests.stream(output, id)["status"] as? Int == 200, "\(output)")
                #expect(HTTP2InsideTunnelTests.stream(output, id)["body_text"] as? String == "small\n")
            }
            #expect(nginx.accessLogProtocols() == Array(repeating: "HTTP/1.1", count: 3))
            #expect(Set(nginx.accessLogConnections()).count == 1)
            let stats = gate.statistics
            #expect(stats.count(.trusted) == 1)
            #expect(stats.upstreamConnections == 1)
            #expect(stats.requestsForwarded == 3)
        }
    }

    @Test("HTTP/1.1-only upstream: a client that offers h2 and HTTP/1.1 gets HTTP/1.1, so an answer that waits does not hold back its next request")
    func clientGetsTheUpstreamsProtocol() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "held")
        try await H2EchoOrigin.with(script: "held_answer_origin.py", ["--cert", leaf.certificatePath, "--key", leaf.keyPath,
                                                                      "--hold-seconds", "15"]) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(origin.port)"]) { gate in
                let base = "https://\(Self.host):\(origin.port)"
                // curl --http2 offers `h2,http/1.1`. /hold is answered only once /release
                // has been: had the gate chosen h2 for curl, both would be streams of one
                // tunnel, queued on its one HTTP/1.1 upstream connection, and /hold could
                // only time out. Given HTTP/1.1, curl opens a second tunnel for /release,
                // as it would straight to the origin.
                let result = try await curlThroughGate(gate, urls: ["\(base)/hold", "\(base)/release"], ["--http2", "--parallel"])
                #expect(result.exitStatus == 0, "\(result.stderr)")
                #expect(result.transfers == ["200 1.1", "200 1.1"], "\(result.stderr)")
                #expect(String(decoding: result.body, as: UTF8.self) == "released\n/release\n")
                let requests = origin.events.filter { $0["event"] as? String == "request" }
                #expect(Set(requests.compactMap { $0["connection"] as? Int }).count == 2, "\(requests)")
                let stats = gate.statistics
                #expect(stats.count(.trusted) == 2)
                #expect(stats.upstreamConnections == 2)
                #expect(stats.requestsForwarded == 2)
            }
        }
    }

    @Test("the client's ALPN choice follows the upstream's protocol, falling back to the other one")
    func clientALPNChoice() {
        for (upstream, preferred, fallback) in [("h2", "h2", "http/1.1"), ("http/1.1", "http/1.1", "h2"), (nil, "http/1.1", "h2")] {
            let choice = RequestAwareTunnel.clientALPN(upstreamProtocol: upstream)
            #expect(choice.preferred == preferred, "\(upstream ?? "none")")
            #expect(choice.fallback == fallback, "\(upstream ?? "none")")
        }
    }

    @Test("attacker origin with a certificate the upstream trust accepts: 502 pin-mismatch, zero bytes forwarded")
    func attackerIsRefused() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let genuine = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "origin")
        let forged = try pki.leaf([.dns(Self.host)], issuer: pki.attackerCA, file: "forged")
        // Both are handed out of their scopes: the counters are read after the stops, as before.
        let (result, gate, attacker) = try await LoopbackOrigin.with(identity: forged, behaviour: .http(body: "intercepted")) { attacker in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, genuine.fingerprint)]),
                                       resolve: ["\(Self.host):\(attacker.port)"]) { gate in
                (try await curlThroughGate(gate, "https://\(Self.host):\(attacker.port)/secret", ["-d", "password=hunter2"]), gate, attacker)
            }
        }

        #expect(result.exitStatus != 0)
        #expect(result.stderr.contains("CONNECT tunnel failed, response 502"))
        #expect(result.proxyHeaders["pingate-refusal"] == "pin-mismatch")
        #expect(result.proxyHeaders["pingate-observed-fingerprint"] == forged.fingerprint)
        let seen = attacker.observed
        #expect(seen.handshakes == 1, "the gate did reach the attacker and finish a handshake")
        #expect(seen.applicationBytes == 0, "not one application byte may reach the attacker")
        #expect(gate.statistics.count(.pinMismatch) == 1)
    }

    @Test("unknown host: 403 empty, and no upstream connection at all")
    func unknownHostIsRefusedWithoutConnecting() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "origin")
        let (result, stats, origin) = try await LoopbackOrigin.with(identity: leaf, behaviour: .http(body: "hello")) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["unknown.pingate.test:\(origin.port)"]) { gate in
                let result = try await curlThroughGate(gate, "https://unknown.pingate.test:\(origin.port)/")
                return (result, gate.statistics, origin)
            }
        }

        #expect(result.stderr.contains("CONNECT tunnel failed, response 403"))
        #expect(result.proxyHeaders["pingate-refusal"] == "empty")
        #expect(result.proxyHeaders["pingate-observed-fingerprint"] == nil)
        #expect(stats.upstreamConnections == 0)
        #expect(origin.observed.tcpConnections == 0)
    }

    @Test("no list at all: everything is refused as empty")
    func noListFailsClosed() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let result = try await GateFixture.with(pki: pki, listPath: nil) { gate in
            try await curlThroughGate(gate, "https://\(Self.host):443/")
        }
        #expect(result.stderr.contains("CONNECT tunnel failed, response 403"))
        #expect(result.proxyHeaders["pingate-refusal"] == "empty")
    }

    @Test("pinned leaf from a CA the gate does not trust: 502 chain-invalid; pins-only host: allowed")
    func chainFailure() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let rogue = try pki.leaf([.dns(Self.host)], issuer: pki.rogueCA, file: "rogue")
        let allowed = try await LoopbackOrigin.with(identity: rogue, behaviour: .http(body: "pins-only ok")) { origin in
            let list = try pki.signedList([(Self.host, rogue.fingerprint)])
            let resolve = ["\(Self.host):\(origin.port)"]

            let refused = try await GateFixture.with(pki: pki, listPath: list, resolve: resolve) { strict in
                try await curlThroughGate(strict, "https://\(Self.host):\(origin.port)/")
            }
            #expect(refused.stderr.contains("CONNECT tunnel failed, response 502"))
            #expect(refused.proxyHeaders["pingate-refusal"] == "chain-invalid")
            #expect(refused.proxyHeaders["pingate-observed-fingerprint"] == rogue.fingerprint)
            #expect(origin.observed.applicationBytes == 0)

            return try await GateFixture.with(pki: pki, listPath: list, resolve: resolve, configure: { $0.pinsOnlyHosts = [Self.host] }) { pinsOnly in
                try await curlThroughGate(pinsOnly, "https://\(Self.host):\(origin.port)/")
            }
        }
        #expect(allowed.exitStatus == 0, "\(allowed.stderr)")
        #expect(String(decoding: allowed.body, as: UTF8.self) == "pins-only ok")
    }

    @Test("closed upstream port: 502 upstream-unreachable; silent upstream: 504 upstream-timeout")
    func upstreamFailures() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "origin")
        let refusing = try RefusingLoopbackPort()
        let closedPort = refusing.port
        try await SilentServer.with { silent in
            try await GateFixture.with(
                pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                resolve: ["\(Self.host):\(closedPort)", "\(Self.host):\(silent.port)"],
                configure: { $0.upstreamHandshakeTimeout = .milliseconds(500) }
            ) { gate in
                let unreachable = try await curlThroughGate(gate, "https://\(Self.host):\(closedPort)/")
                #expect(unreachable.stderr.contains("CONNECT tunnel failed, response 502"))
                #expect(unreachable.proxyHeaders["pingate-refusal"] == "upstream-unreachable")

                let timedOut = try await curlThroughGate(gate, "https://\(Self.host):\(silent.port)/")
                #expect(timedOut.stderr.contains("CONNECT tunnel failed, response 504"))
                #expect(timedOut.proxyHeaders["pingate-refusal"] == "upstream-timeout")
            }
        }
        withExtendedLifetime(refusing) {}
    }

    /// The start of a Python client script: CONNECT through the gate (argv: gate port, host,
    /// port, CA file), then TLS inside the tunnel, verified against the gate's CA, as `tls`.
    static let pythonTunnel = """
    import hashlib, os, socket, ssl, sys
    gate_port, host, port, ca = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    raw = socket.create_connection(("127.0.0.1", gate_port), timeout=30)
    raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        chunk = raw.recv(1)
        if not chunk: sys.exit("proxy closed: " + head.decode())
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    tls = ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname=host)

    """

    @Test("Python ssl client: 1 MiB echoed byte for byte through the tunnel, then a clean close")
    func pythonEchoThroughTunnel() async throws {
        let script = Self.pythonTunnel + """
        payload = os.urandom(1 << 20)
        tls.sendall(payload)
        received = b""
        while len(received) < len(payload):
            chunk = tls.recv(65536)
            if not chunk: break
            received += chunk
        print(len(received), hashlib.sha256(received).hexdigest() == hashlib.sha256(payload).hexdigest())
        tls.unwrap()
        """
        // Not HTTP: relayed as bytes only because the host is listed in `opaque-hosts`.
        let (result, stats, origin) = try await PinnedOriginScenario.with(
            host: Self.host, behaviour: .echo, alpn: nil, configure: { $0.opaqueHosts = [Self.host] }
        ) { scenario in
            let (gate, origin) = (scenario.gate, scenario.origin)
            let result = try await TestProcess.run("python3", ["-c", script, "\(gate.port)", Self.host, "\(origin.port)", gate.caPath])
            return (result, gate.statistics, origin)
        }
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "\(1 << 20) True")
        #expect(origin.observed.applicationBytes == 1 << 20)
        #expect(stats.bytesUp == 1 << 20)
    }

    @Test("the same client to a host that is not opaque: its bytes are not HTTP, so the tunnel is refused as not-http and not one byte reaches the origin")
    func notHTTPIsRefused() async throws {
        let script = Self.pythonTunnel + """
        tls.sendall(b"\\x00\\x01binary protocol hello" + os.urandom(4096))
        received = b""
        try:
            while True:
                chunk = tls.recv(65536)
                if not chunk: break
                received += chunk
        except (ssl.SSLError, OSError):
            pass
        print(len(received), "closed")
        """
        let (result, stats, origin, refusals) = try await PinnedOriginScenario.with(host: Self.host, behaviour: .echo, alpn: nil) { scenario in
            let (gate, origin) = (scenario.gate, scenario.origin)
            let result = try await TestProcess.run("python3", ["-c", script, "\(gate.port)", Self.host, "\(origin.port)", gate.caPath])
            return (result, gate.statistics, origin, gate.server.refusals.entries)
        }
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0 closed")
        #expect(origin.observed.applicationBytes == 0)
        #expect(stats.bytesUp == 0)
        #expect(stats.requestsRefused(.notHTTP) == 1)
        #expect(refusals.last?.reason == .notHTTP)
    }
}
