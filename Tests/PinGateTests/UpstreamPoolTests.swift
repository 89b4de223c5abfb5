import Foundation
import PinGateTestSupport
import PinList
import PinListService
import Synchronization
import Testing
@testable import PinGate

/// The pool of verified upstream connections, from outside: curl through the gate to a
/// real nginx origin, whose access log names the connection (`$connection`) each request
/// came on, so "one upstream connection" is counted where it lands.
@Suite("A CONNECT with no upstream handshake")
struct UpstreamPoolTests {
    static let host = "pay.example.test"
    static let body = Data("pooled\n".utf8)

    /// An nginx origin for `host` (a fresh PKI, its leaf pinned) and a gate in front.
    static func withOrigin<Value>(
        http2: Bool = true, serverDirectives: String = "", extraFiles: [String: Data] = [:],
        leafNotAfter: Date = Date().addingTimeInterval(30 * 86400), listExpires: Date = Date().addingTimeInterval(365 * 86400),
        now: @escaping @Sendable () -> Date = { Date() },
        configure: (inout GateConfiguration) -> Void = { _ in },
        _ body: (GateFixture, NginxOrigin, TestPKI) async throws -> Value
    ) async throws -> Value {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin", notAfter: leafNotAfter)
        return try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath,
                                          files: extraFiles.merging(["a.txt": Self.body]) { _, new in new },
                                          http2: http2, serverDirectives: serverDirectives) { nginx in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)], expires: listExpires),
                                       resolve: ["\(host):\(nginx.port)"], now: now, configure: configure) { gate in
                try await body(gate, nginx, pki)
            }
        }
    }

    static func url(_ nginx: NginxOrigin) -> String { "https://\(host):\(nginx.port)/a.txt" }

    /// Waits until the pool holds `count` idle connections (a tunnel's connection goes to
    /// the pool as the gate sees its client leave, a moment after curl exits).
    @discardableResult
    static func waitForIdle(_ gate: GateFixture, _ count: Int, timeout: Duration = .seconds(5)) async -> Bool {
        await eventually(timeout: timeout) { gate.server.upstreamPool?.idle == count }
    }

    @discardableResult
    static func fetch(_ gate: GateFixture, _ nginx: NginxOrigin, _ extra: [String] = []) async throws -> CurlResult {
        let result = try await curlThroughGate(gate, url(nginx), extra)
        #expect(result.exitStatus == 0 && result.httpCode == "200" && result.body == Self.body, "\(result.httpCode) \(result.stderr)")
        return result
    }

    @Test("20 sequential tunnels to one origin cost one upstream connection, over an h2 and an HTTP/1.1 origin (one event loop)",
          arguments: [true, false])
    func sequentialTunnelsShareOneConnection(http2: Bool) async throws {
        try await Self.withOrigin(http2: http2, configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            for round in 0..<20 {
                let result = try await Self.fetch(gate, nginx)
                #expect(result.httpVersion == (http2 ? "2" : "1.1"))
                #expect(await Self.waitForIdle(gate, 1), "round \(round): the connection did not go back to the pool")
            }
            let connections = nginx.accessLogConnections()
            #expect(connections.count == 20)
            #expect(Set(connections).count == 1, "\(connections)")
            #expect(gate.statistics.upstreamConnections == 1)
            let pool = try #require(gate.server.upstreamPool)
            // HTTP/1.1: parked after each tunnel; h2: shared once, from the first tunnel on.
            #expect(pool.hits == 19 && pool.misses == 1 && pool.parked == (http2 ? 1 : 20), "\(pool)")
            #expect(pool.notPooled.isEmpty, "\(pool)")
            // Each time the connection is left idle (HTTP/1.1: parked; h2: its last tunnel
            // left) the pool schedules its idle timer, and each next tunnel cancels it, so
            // one is pending (the idle connection's); a timer left to fire for every stay
            // that ended kept a busy pool's scheduled tasks, and the gate's RSS, growing.
            // The h2 connection's timer is the pool's too, not its side's own.
            // (The last timer is recorded just after the pool shows the connection idle.)
            _ = await eventually(timeout: .seconds(2)) { gate.server.upstreamPoolIdleTimers?.scheduled == 20 }
            let timers = try #require(gate.server.upstreamPoolIdleTimers)
            #expect(timers.scheduled == 20 && timers.cancelled == 19, "\(timers)")
            #expect(timers.fired == 0 && timers.pending == 1, "\(timers)")
        }
    }

    @Test("a HEAD answered on a connection leaves it in step for the next tunnel: that tunnel's GET, on the same pooled connection, gets its own body whole, over an HTTP/1.1 and an h2 origin",
          arguments: [false, true])
    func headLeavesThePooledConnectionInStep(http2: Bool) async throws {
        try await Self.withOrigin(http2: http2, configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            // A response to HEAD carries a Content-Length and no body: read as a GET's, the
            // next response on the connection would be taken for its body.
            let head = try await curlThroughGate(gate, Self.url(nginx), ["--head"])
            #expect(head.exitStatus == 0 && head.httpCode == "200", "\(head.httpCode) \(head.stderr)")
            // (curl --head writes the response's head where a body would go.)
            let headText = String(decoding: head.body, as: UTF8.self).lowercased()
            #expect(headText.contains("content-length: \(Self.body.count)"), "the HEAD answer named no length to mistake: \(headText)")
            #expect(await Self.waitForIdle(gate, 1))
            for _ in 0..<2 {
                try await Self.fetch(gate, nginx)
                #expect(await Self.waitForIdle(gate, 1))
            }
            let connections = nginx.accessLogConnections()
            #expect(connections.count == 3 && Set(connections).count == 1, "\(connections)")
        }
    }

    @Test("with two event loops the pool is per loop, as nginx's keep-alive cache is per worker: 20 sequential tunnels cost at most two connections")
    func perLoopPools() async throws {
        try await Self.withOrigin { gate, nginx, _ in
            for _ in 0..<20 {
                try await Self.fetch(gate, nginx)
                // Which loop the next tunnel lands on is the listener's choice: wait for this
                // one's connection to be back, wherever it is.
                await Self.waitUntilParked(gate)
            }
            let connections = Set(nginx.accessLogConnections())
            #expect(connections.count <= 2, "\(connections)")
            #expect(gate.statistics.upstreamConnections <= 2)
            #expect((gate.server.upstreamPool?.hits ?? 0) >= 18)
        }
    }

    /// Waits until every tunnel has ended in the gate (and offered its connection to the pool).
    static func waitUntilParked(_ gate: GateFixture) async {
        _ = await eventually(timeout: .seconds(5)) { gate.statistics.openTunnels == 0 }
    }

    @Test("--no-upstream-pool gives today's behaviour: one upstream connection per tunnel, and no pool in /status")
    func poolOff() async throws {
        try await Self.withOrigin(configure: { $0.upstreamPoolEnabled = false; $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            for _ in 0..<5 { try await Self.fetch(gate, nginx) }
            #expect(Set(nginx.accessLogConnections()).count == 5)
            #expect(gate.statistics.upstreamConnections == 5)
            #expect(gate.server.upstreamPool == nil)
        }
    }

    @Test("a connection that carried Authorization: NTLM (or Negotiate) is never reused by another tunnel, over an HTTP/1.1 and an h2 origin",
          arguments: ["NTLM TlRMTVNTUAABAAAAB4IIogAAAAAAAAAAAAAAAAAAAAAKAGFKAAAADw==", "Negotiate YIIBhwYGKwYBBQUCoIIBezCCAXeg"], [false, true])
    func connectionBoundAuthentication(authorization: String, http2: Bool) async throws {
        try await Self.withOrigin(http2: http2, configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx, ["-H", "Authorization: \(authorization)"])
            await Self.waitUntilParked(gate)
            try await Self.fetch(gate, nginx)
            await Self.waitUntilParked(gate)
            try await Self.fetch(gate, nginx)
            let connections = nginx.accessLogConnections()
            #expect(connections.count == 3 && Set(connections).count == 2, "\(connections)")
            // The second and third tunnels shared the one without the authentication.
            #expect(connections[1] == connections[2] && connections[0] != connections[1], "\(connections)")
            if !http2 {
                let pool = try #require(gate.server.upstreamPool)
                #expect(pool.notPooled == ["connection-auth": 1], "\(pool)")
            }
        }
    }

    @Test("a connection on which the origin asked for a client certificate (none is sent, and it let the client on) is never pooled, over an HTTP/1.1 and an h2 origin",
          arguments: [false, true])
    func clientCertificateRequestedNeverPooled(http2: Bool) async throws {
        // optional_no_ca: nginx sends a CertificateRequest and carries on without one.
        try await Self.withOrigin(http2: http2, serverDirectives: "ssl_verify_client optional_no_ca;",
                                  configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            for round in 1...3 {
                try await Self.fetch(gate, nginx)
                let settled = await eventually(timeout: .seconds(5)) { gate.server.upstreamPool?.notPooled["client-certificate"] == round }
                #expect(settled, "round \(round): \(String(describing: gate.server.upstreamPool))")
            }
            let connections = nginx.accessLogConnections()
            #expect(connections.count == 3 && Set(connections).count == 3, "\(connections)")
            // Rounds 2 and 3 resumed the first round's TLS session (no CertificateRequest in
            // their handshakes): the case that needs the full handshake's flag.
            #expect(gate.statistics.upstreamSessionsResumed == 2, "\(gate.statistics.upstreamSessionsResumed)")
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.hits == 0 && pool.idle == 0 && pool.parked == 0, "\(pool)")
            #expect(pool.notPooled == ["client-certificate": 3], "\(pool)")
        }
    }

    @Test("a list update that drops the pin closes the pooled connections, and the next CONNECT is refused (verified on a new connection), over an h2 and an HTTP/1.1 origin",
          arguments: [true, false])
    func listUpdateDropsPooled(http2: Bool) async throws {
        try await Self.withOrigin(http2: http2, configure: { $0.eventLoopThreads = 1 }) { gate, nginx, pki in
            try await Self.fetch(gate, nginx)
            #expect(await Self.waitForIdle(gate, 1))
            // The pin now names another key: the pooled connection's leaf matches nothing.
            let other = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "other")
            let list = try SignedListDocument.read(file: try pki.signedList([(Self.host, other.fingerprint)], file: "other.json"))
                .verify(keys: [pki.signer.publicKey()])
            gate.server.store.replace(with: list)
            #expect(await Self.waitForIdle(gate, 0))
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.closed["list-changed"] == 1, "\(pool)")
            if !http2 {
                // The dropped connection's idle timer went with it, not left to fire.
                let timers = try #require(gate.server.upstreamPoolIdleTimers)
                #expect(timers.pending == 0 && timers.cancelled == 1 && timers.fired == 0, "\(timers)")
            }
            let refused = try await curlThroughGate(gate, Self.url(nginx))
            #expect(refused.proxyHeaders["pingate-refusal"] == "pin-mismatch", "\(refused.stderr)")
            #expect(gate.statistics.upstreamConnections == 2)
            #expect(nginx.accessLogConnections().count == 1, "nothing of the refused tunnel reached the origin")
        }
    }

    /// A clock for the gate that a test moves forward: real time plus an offset.
    final class MovableClock: Sendable {
        private let offset = Mutex<TimeInterval>(0)
        var now: @Sendable () -> Date { { [self] in Date().addingTimeInterval(offset.withLock { $0 }) } }
        func advance(by seconds: TimeInterval) { offset.withLock { $0 += seconds } }
    }

    @Test("a list that expires while its connection waits in the pool: the next CONNECT is refused as when no connection waits, the pooled one carries nothing, and nothing of the refused tunnel reaches the origin")
    func listExpiresWhilePooled() async throws {
        let clock = MovableClock()
        try await Self.withOrigin(http2: false, listExpires: Date().addingTimeInterval(3600), now: clock.now,
                                  configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            #expect(await Self.waitForIdle(gate, 1))
            clock.advance(by: 2 * 3600)
            let refused = try await curlThroughGate(gate, Self.url(nginx))
            #expect(refused.stderr.contains("< HTTP/1.1 503"), "\(refused.stderr)")
            #expect(refused.proxyHeaders["pingate-refusal"] == "list-expired", "\(refused.proxyHeaders)")
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.hits == 0, "the expired list's pooled connection carried a tunnel: \(pool)")
            #expect(nginx.accessLogConnections().count == 1, "something of the refused tunnel reached the origin")
        }
    }

    @Test("a pooled connection whose certificate has expired (by the gate's clock) carries no further tunnel: the next CONNECT dials and verifies a new connection, and the old one closes, over an h2 and an HTTP/1.1 origin",
          arguments: [true, false])
    func certificateExpiresWhilePooled(http2: Bool) async throws {
        // The origin's leaf is valid for an hour more; the gate's clock moves two hours on.
        // (OpenSSL checks the new handshake against the real time, so the new connection is
        // trusted: what is tested is that the pool no longer hands out the old one. The leaf
        // the gate minted for the client stays valid across the two hours.)
        let clock = MovableClock()
        try await Self.withOrigin(http2: http2, leafNotAfter: Date().addingTimeInterval(3600), now: clock.now,
                                  configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            #expect(await Self.waitForIdle(gate, 1))
            clock.advance(by: 2 * 3600)
            try await Self.fetch(gate, nginx)
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.hits == 0 && pool.misses == 2, "\(pool)")
            #expect(pool.closed["certificate-expired"] == 1, "\(pool)")
            let connections = nginx.accessLogConnections()
            #expect(connections.count == 2 && Set(connections).count == 2, "\(connections)")
        }
    }

    @Test("a list update that still trusts the pin keeps the pooled connection, re-stamped: the next CONNECT is a hit")
    func listUpdateKeepsTrusted() async throws {
        try await Self.withOrigin(configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            #expect(await Self.waitForIdle(gate, 1))
            gate.server.store.replace(with: gate.server.store.list)
            try await Self.fetch(gate, nginx)
            #expect(Set(nginx.accessLogConnections()).count == 1)
            #expect(gate.server.upstreamPool?.hits == 1)
        }
    }

    @Test("an idle pooled connection closes after the pool's idle timeout, the pool's own timer for a shared h2 connection as for HTTP/1.1; the next CONNECT opens a new one",
          arguments: [false, true])
    func idleTimeout(http2: Bool) async throws {
        try await Self.withOrigin(http2: http2, configure: { $0.eventLoopThreads = 1; $0.upstreamPoolIdleTimeout = .seconds(1) }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            // Parked (counted; it may already have timed out by the time anyone looks), then gone.
            #expect(await eventually(timeout: .seconds(5)) { gate.server.upstreamPool?.parked == 1 })
            #expect(await Self.waitForIdle(gate, 0, timeout: .seconds(5)))
            #expect(gate.server.upstreamPool?.closed["idle-timeout"] == 1)
            #expect(gate.server.upstreamPoolIdleTimers?.fired == 1)
            try await Self.fetch(gate, nginx)
            #expect(Set(nginx.accessLogConnections()).count == 2)
        }
    }

    @Test("the origin closes a pooled connection (its keep-alive timeout): the pool lets it go, and the next CONNECT works on a new, verified connection",
          arguments: [true, false])
    func originClosesPooled(http2: Bool) async throws {
        try await Self.withOrigin(http2: http2, serverDirectives: "keepalive_timeout 1s;", configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            #expect(await eventually(timeout: .seconds(5)) { gate.server.upstreamPool?.parked == 1 })
            #expect(await Self.waitForIdle(gate, 0, timeout: .seconds(5)))
            #expect(gate.server.upstreamPool?.closed["peer-closed"] == 1, "\(String(describing: gate.server.upstreamPool))")
            try await Self.fetch(gate, nginx)
            #expect(Set(nginx.accessLogConnections()).count == 2)
            #expect(gate.statistics.upstreamConnections == 2)
        }
    }

    @Test("opaque hosts' tunnels (byte relays) never use the pool")
    func opaqueHostsNotPooled() async throws {
        try await Self.withOrigin(configure: { $0.eventLoopThreads = 1; $0.opaqueHosts = [Self.host] }) { gate, nginx, _ in
            for _ in 0..<3 { try await Self.fetch(gate, nginx) }
            #expect(Set(nginx.accessLogConnections()).count == 3)
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.parked == 0 && pool.hits == 0 && pool.misses == 0, "\(pool)")
        }
    }

    @Test("a response with Connection: close is not pooled: the tunnel's connection closes with it, and the client's connection stays for its next request, on a new one")
    func connectionCloseNotPooled() async throws {
        try await Self.withOrigin(http2: false, serverDirectives: "keepalive_requests 1;", configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            await Self.waitUntilParked(gate)
            try await Self.fetch(gate, nginx)
            #expect(Set(nginx.accessLogConnections()).count == 2)
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.parked == 0 && pool.hits == 0 && pool.idle == 0, "\(pool)")
            // Two requests on one client connection (one tunnel): each on its own upstream one.
            let both = try await curlThroughGate(gate, urls: [Self.url(nginx), Self.url(nginx)])
            #expect(both.exitStatus == 0 && both.body == Self.body + Self.body, "\(both.stderr)")
            #expect(both.stderr.components(separatedBy: "> CONNECT ").count == 2, "\(both.stderr)")
            #expect(Set(nginx.accessLogConnections()).count == 4)
            #expect(gate.server.upstreamPool?.parked == 0)
        }
    }

    // MARK: a pooled connection that goes

    /// The origin's records for `path`: answered requests, and unanswered closes ("died").
    static func originSaw(_ origin: H2EchoOrigin, _ path: String) -> (answered: Int, died: Int) {
        let events = origin.events.filter { $0["path"] as? String == path }
        return (events.filter { $0["event"] == nil }.count, events.filter { $0["event"] as? String == "died" }.count)
    }

    @Test("the origin closes a pooled connection as a request arrives: an idempotent request is retried once on a new, verified connection and succeeds; a POST is not retried (502), over an h2 and an HTTP/1.1 origin",
          arguments: [true, false])
    func retryOnlyIdempotent(http2: Bool) async throws {
        try await UpstreamCutTests.withOrigin(http2: http2, configure: { $0.eventLoopThreads = 1 }) { gate, origin in
            let url = "https://\(Self.host):\(origin.port)"
            #expect(try await curlThroughGate(gate, "\(url)/warm").httpCode == "200")
            #expect(await eventually { gate.server.upstreamPool?.parked == 1 })

            let get = try await curlThroughGate(gate, "\(url)/die-once/get")
            #expect(get.httpCode == "200" && String(decoding: get.body, as: UTF8.self).hasSuffix(" 0\n"), "\(get.stderr.suffix(400))")
            #expect(Self.originSaw(origin, "/die-once/get") == (answered: 1, died: 1))
            #expect(gate.statistics.upstreamConnections == 2)
            #expect(gate.server.upstreamPool?.hits == 1)
            #expect(await eventually { gate.server.upstreamPool?.parked == 2 })

            let post = try await curlThroughGate(gate, "\(url)/die-once/post", ["-i", "--data", "hello"])
            #expect(post.httpCode == "502", "\(post.stderr.suffix(400))")
            #expect(String(decoding: post.body, as: UTF8.self).lowercased().contains("pingate-refusal: upstream-unreachable"))
            #expect(Self.originSaw(origin, "/die-once/post") == (answered: 0, died: 1), "a POST was sent twice")
            #expect(gate.server.upstreamPool?.hits == 2)
        }
    }

    @Test("on one tunnel admitted from the pool, the origin closes between requests: the next request opens a new, verified connection on the same client connection")
    func reconnectBetweenRequests() async throws {
        try await UpstreamCutTests.withOrigin(http2: false, configure: { $0.eventLoopThreads = 1 }) { gate, origin in
            let url = "https://\(Self.host):\(origin.port)"
            #expect(try await curlThroughGate(gate, "\(url)/warm").httpCode == "200")
            #expect(await eventually { gate.server.upstreamPool?.parked == 1 })
            // One curl, one tunnel (a pool hit), three requests; the second's connection dies
            // unanswered (GET: retried), the third goes on the new connection.
            let result = try await curlThroughGate(gate, urls: ["\(url)/one", "\(url)/die-once/two", "\(url)/three"])
            #expect(result.transfers == ["200 1.1", "200 1.1", "200 1.1"], "\(result.transfers) \(result.stderr.suffix(400))")
            #expect(result.stderr.components(separatedBy: "CONNECT \(Self.host)").count - 1 == 1, "curl opened one tunnel")
            #expect(Self.originSaw(origin, "/three") == (answered: 1, died: 0))
            #expect(gate.statistics.upstreamConnections == 2)
        }
    }

    @Test("while a tunnel admitted from the pool is open, the origin changes to an unpinned certificate and closes the connection: the next request gets 502 Pingate-Refusal: pin-mismatch inside the tunnel, nothing reaches the origin, and the failure goes to the report URI as a CONNECT's would")
    func reconnectRefusedInsideTheTunnel() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let pinned = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "pinned")
        let unpinned = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "unpinned")
        // The origin's certificate files are swapped on disk; nginx reloads them on HUP.
        let certificate = directory.file("live.pem"), key = directory.file("live.key")
        try FileManager.default.copyItem(atPath: pinned.certificatePath, toPath: certificate)
        try FileManager.default.copyItem(atPath: pinned.keyPath, toPath: key)
        let collectorIdentity = try pki.leaf([.dns("reports.pingate.test")], issuer: pki.originCA, file: "reports")
        try await TestListServer.with(identity: collectorIdentity, behaviour: .status(204)) { collector in
            try await NginxOrigin.with(certificatePath: certificate, keyPath: key, files: ["a.txt": Self.body], http2: false) { nginx in
                try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, pinned.fingerprint)]),
                                           resolve: ["\(Self.host):\(nginx.port)", "reports.pingate.test:\(collector.port)"],
                                           configure: {
                                               $0.eventLoopThreads = 1
                                               $0.reportURIs = [URL(string: "https://reports.pingate.test:\(collector.port)/pin-failures")!]
                                               $0.reportTrust = .pemFiles([pki.originCA.certificatePath])
                                           }) { gate in
                    try await Self.fetch(gate, nginx)
                    #expect(await Self.waitForIdle(gate, 1))
                    // A tunnel from the pool, held open by a client that sends a request, waits,
                    // and sends another (tunnel.py), across the swap.
                    let script = """
                    import socket, ssl, sys, time
                    proxy, target, ca, flag = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
                    s = socket.create_connection(("127.0.0.1", int(proxy)))
                    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
                    head = b""
                    while b"\\r\\n\\r\\n" not in head:
                        head += s.recv(1)
                    ctx = ssl.create_default_context(cafile=ca)
                    t = ctx.wrap_socket(s, server_hostname=target.split(":")[0])
                    def ask():
                        t.sendall(f"GET /a.txt HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
                        data = b""
                        while b"\\r\\n\\r\\n" not in data:
                            data += t.recv(65536)
                        head, _, rest = data.partition(b"\\r\\n\\r\\n")
                        length = int([l.split(b":")[1] for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length")][0])
                        while len(rest) < length:
                            rest += t.recv(65536)
                        lines = head.decode().split("\\r\\n")
                        refusal = [l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("pingate-refusal")]
                        print(lines[0].split()[1], refusal[0] if refusal else "-", flush=True)
                    ask()
                    open(flag, "w").close()
                    while open(flag).read() != "go":
                        time.sleep(0.05)
                    ask()
                    """
                    let flag = directory.file("flag")
                    let (client, output) = try Self.python(script, ["\(gate.port)", "\(Self.host):\(nginx.port)", gate.caPath, flag])
                    defer { if client.isRunning { client.terminate() } }
                    #expect(await eventually { FileManager.default.fileExists(atPath: flag) })
                    let before = nginx.accessLogConnections().count
                    // The origin now presents the unpinned certificate, and its keep-alive
                    // connections close (a graceful reload ends idle ones).
                    try FileManager.default.removeItem(atPath: certificate)
                    try FileManager.default.removeItem(atPath: key)
                    try FileManager.default.copyItem(atPath: unpinned.certificatePath, toPath: certificate)
                    try FileManager.default.copyItem(atPath: unpinned.keyPath, toPath: key)
                    nginx.reload()
                    #expect(await eventually(timeout: .seconds(10)) { gate.statistics.upstreamConnectionsLostInTunnels == 1 })
                    try "go".write(toFile: flag, atomically: false, encoding: .utf8)
                    // Polled, not waited for: a blocking wait holds a cooperative thread.
                    #expect(await eventually(timeout: .seconds(30)) { !client.isRunning })
                    let lines = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n")
                    #expect(lines == ["200 -", "502 pin-mismatch"], "\(lines)")
                    #expect(nginx.accessLogConnections().count == before, "a request reached the origin on the unpinned connection")
                    #expect(gate.statistics.requestsRefused(.pinMismatch) == 1)
                    #expect(gate.statistics.upstreamReconnects == ["pin-mismatch": 1])
                    // Reported as a CONNECT's pin failure is: the host, and what it presented.
                    #expect(await eventually(timeout: .seconds(5)) { collector.receivedBodies.count == 1 })
                    // Once: a second report would have time to arrive in this (fixed) wait.
                    try await Task.sleep(for: .milliseconds(200))
                    #expect(collector.receivedBodies.count == 1)
                    let report = try #require(collector.receivedBodies.first.flatMap { try? JSONSerialization.jsonObject(with: $0) as? [String: Any] })
                    #expect(report["hostname"] as? String == Self.host)
                    #expect(report["port"] as? Int == nginx.port)
                    #expect(report["enforce-pinning"] as? Bool == true)
                    #expect(report["pingate-observed-fingerprint"] as? String == unpinned.fingerprint)
                    #expect(report["known-pins"] as? [String] == ["cert-sha256=\"\(pinned.fingerprint)\""])
                }
            }
        }
    }

    @Test("a revocation cuts live and pooled connections alike: the open tunnel closes, the pooled connection closes (over h2 the one both tunnels shared), and the next CONNECT is refused",
          arguments: [false, true])
    func revocationCutsLiveAndPooled(http2: Bool) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "origin")
        let first = try directory.write("pins.json", String(decoding: try pki.signedV2(sequence: 1, pins: [TestPKI.pin(Self.host, leaf)]),
                                                            as: UTF8.self))
        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: ["a.txt": Self.body],
                                   http2: http2) { nginx in
            try await GateFixture.with(pki: pki, listPath: first, resolve: ["\(Self.host):\(nginx.port)"],
                                       configure: { $0.eventLoopThreads = 1 }) { gate in
                // A live tunnel first (its own connection), then one whose connection is pooled.
                let (holder, output) = try Self.python(Self.holdingClient, ["\(gate.port)", "\(Self.host):\(nginx.port)", gate.caPath])
                defer { if holder.isRunning { holder.terminate() } }
                #expect(await eventually { gate.statistics.requestsForwarded == 1 })
                try await Self.fetch(gate, nginx)
                #expect(await Self.waitForIdle(gate, 1))
                // HTTP/1.1: the live tunnel's connection and the pooled one; h2: one, shared.
                #expect(gate.statistics.upstreamConnections == (http2 ? 1 : 2))

                let revoked = try pki.signedV2(sequence: 2, pins: [TestPKI.pin(Self.host, leaf)], revoked: [leaf.fingerprint])
                _ = try gate.server.store.install(SignedListDocument(format: .pingateV2, source: "test", body: revoked),
                                                  keys: [pki.signer.publicKey()], persistence: nil, now: Date(),
                                                  provenance: ListProvenance(.fetched, "test")).get()
                #expect(await Self.waitForIdle(gate, 0))
                #expect(gate.server.upstreamPool?.closed["list-changed"] == 1)
                #expect(await eventually { !holder.isRunning }, "the live tunnel was not cut")
                let lines = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                #expect(lines == "200\nclosed\n", "\(lines)")
                #expect(gate.statistics.tunnelsClosedByUpdate["revoked"] == 1)
                let refused = try await curlThroughGate(gate, Self.url(nginx))
                #expect(refused.proxyHeaders["pingate-refusal"] == "revoked")
            }
        }
    }

    /// Starts `python3 -c script arguments…`, its stdout on the returned pipe; the caller
    /// ends it (these clients run until the gate or the test ends their tunnel).
    static func python(_ script: String, _ arguments: [String]) throws -> (ChildProcess, Pipe) {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: try TestProcess.resolve("python3"))
        process.arguments = ["-c", script] + arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        return (process, output)
    }

    /// A client that opens a tunnel, makes one request, prints its status, then holds the
    /// tunnel until the gate closes it, and prints `closed`.
    static let holdingClient = """
    import socket, ssl, sys
    proxy, target, ca = sys.argv[1], sys.argv[2], sys.argv[3]
    s = socket.create_connection(("127.0.0.1", int(proxy)))
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        head += s.recv(1)
    t = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname=target.split(":")[0])
    t.sendall(f"GET /a.txt HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
    data = b""
    while b"pooled" not in data:
        data += t.recv(65536)
    print(data.split(b" ")[1].decode(), flush=True)
    try:
        while t.recv(65536):
            pass
    except (ConnectionError, ssl.SSLError):
        pass
    print("closed", flush=True)
    """

    /// A client that sends its ClientHello in the same write as the CONNECT (as eager
    /// clients do), then reads the 200 and finishes TLS with what follows, and GETs `path`.
    static let eagerClient = """
    import socket, ssl, sys
    port, target, host, ca, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["http/1.1"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode() + outgoing.read())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        head += raw.recv(1)
    print(head.split(b"\\r\\n")[0].decode(), flush=True)
    def pump():
        data = outgoing.read()
        if data: raw.sendall(data)
        chunk = raw.recv(65536)
        if not chunk: raise ConnectionError("closed")
        incoming.write(chunk)
    while True:
        try:
            tls.do_handshake(); break
        except ssl.SSLWantReadError:
            pump()
    tls.write(f"GET {path} HTTP/1.1\\r\\nHost: {target}\\r\\nConnection: close\\r\\n\\r\\n".encode())
    raw.sendall(outgoing.read())
    answer = b""
    while True:
        try:
            data = tls.read(65536)
            if not data: break
            answer += data
        except ssl.SSLWantReadError:
            chunk = raw.recv(65536)
            if not chunk: break
            incoming.write(chunk)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            break
    print(answer.split(b"\\r\\n")[0].decode(), flush=True)
    print(answer.split(b"\\r\\n\\r\\n", 1)[-1].decode(), end="", flush=True)
    """

    @Test("an eager client (its ClientHello in the same write as the CONNECT) on a warm pool, where the tunnel can be admitted before the head's decoder has left: the ClientHello reaches the client's TLS after the 200, and the GET is answered whole, over an h2 and an HTTP/1.1 origin",
          arguments: [true, false])
    func eagerClientOnAWarmPool(http2: Bool) async throws {
        try await Self.withOrigin(http2: http2, configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            #expect(await Self.waitForIdle(gate, 1))
            let result = try await TestProcess.run("python3", ["-c", Self.eagerClient, "\(gate.port)", "\(Self.host):\(nginx.port)", Self.host,
                                                               gate.caPath, "/a.txt"], timeout: 30)
            let lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false)
            #expect(result.status == 0, "\(result.stderr)")
            #expect(lines.first == "HTTP/1.1 200 Connection established", "\(result.stdout)")
            #expect(lines.dropFirst().first == "HTTP/1.1 200 OK", "\(result.stdout)")
            #expect(result.stdout.hasSuffix("pooled\n"), "\(result.stdout)")
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.hits == 1 && pool.misses == 1, "\(pool)")
        }
    }

    @Test("over h2, 8 concurrent tunnels share one upstream connection (one event loop): each opens its streams on the connection the first one verified")
    func concurrentTunnelsShareH2() async throws {
        try await Self.withOrigin(http2: true, configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            var holders: [ChildProcess] = []
            var outputs: [Pipe] = []
            defer { for holder in holders where holder.isRunning { holder.terminate() } }
            func hold() throws {
                let (holder, output) = try Self.python(Self.holdingClient, ["\(gate.port)", "\(Self.host):\(nginx.port)", gate.caPath])
                holders.append(holder)
                outputs.append(output)
            }
            try hold()
            #expect(await eventually { gate.statistics.requestsForwarded == 1 })
            for _ in 0..<7 { try hold() }
            #expect(await eventually { gate.statistics.requestsForwarded == 8 })
            // All eight are open at once, and every request came on one connection.
            #expect(gate.statistics.openTunnels == 8)
            #expect(nginx.accessLogConnections().count == 8)
            #expect(Set(nginx.accessLogConnections()).count == 1, "\(nginx.accessLogConnections())")
            #expect(gate.statistics.upstreamConnections == 1)
            #expect(gate.server.upstreamPool?.hits == 7)
            for holder in holders { holder.terminate() }
            #expect(await eventually { gate.statistics.openTunnels == 0 })
            // The connection outlived them, in the pool, for the next tunnel.
            try await Self.fetch(gate, nginx)
            #expect(gate.statistics.upstreamConnections == 1)
        }
    }

    @Test("over h2 with a cold pool, 8 CONNECTs at once share one upstream connection: those that arrive while the first dials wait for its connection instead of dialling their own (one event loop)")
    func coldBurstSharesOneDial() async throws {
        // The wait is as long as it takes here: eight curls starting at once on a loaded
        // machine may take longer than the default 250 ms to finish the first handshake.
        try await Self.withOrigin(http2: true, configure: {
            $0.eventLoopThreads = 1
            $0.upstreamDialShareWait = .seconds(10)
        }) { gate, nginx, _ in
            let url = Self.url(nginx)
            async let r1 = curlThroughGate(gate, url)
            async let r2 = curlThroughGate(gate, url)
            async let r3 = curlThroughGate(gate, url)
            async let r4 = curlThroughGate(gate, url)
            async let r5 = curlThroughGate(gate, url)
            async let r6 = curlThroughGate(gate, url)
            async let r7 = curlThroughGate(gate, url)
            async let r8 = curlThroughGate(gate, url)
            let results = try await [r1, r2, r3, r4, r5, r6, r7, r8]
            for result in results {
                #expect(result.exitStatus == 0 && result.httpCode == "200" && result.body == Self.body, "\(result.httpCode) \(result.stderr)")
            }
            #expect(nginx.accessLogConnections().count == 8)
            #expect(Set(nginx.accessLogConnections()).count == 1, "\(nginx.accessLogConnections())")
            #expect(gate.statistics.upstreamConnections == 1)
            let pool = try #require(gate.server.upstreamPool)
            // One dial; the other seven took its connection, after waiting for it or not.
            #expect(pool.misses == 1 && pool.hits == 7, "hits \(pool.hits), misses \(pool.misses), waited \(pool.waitedForDial)")
        }
    }

    @Test("on a shared h2 connection, a tunnel whose client leaves mid-download resets only its own stream: the other tunnel's download arrives whole, and the connection stays for the next tunnel")
    func laneLeavesMidDownload() async throws {
        let big = seededRandomBytes(4 << 20, seed: 23)
        try await Self.withOrigin(http2: true, serverDirectives: "location /big.bin { limit_rate 2m; }", extraFiles: ["big.bin": big],
                                  configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            let url = "https://\(Self.host):\(nginx.port)/big.bin"
            // The one that leaves: curl gives up after 0.5 s, mid-body.
            async let leaver = curlThroughGate(gate, url, ["--max-time", "0.5"])
            async let keeper = curlThroughGate(gate, url)
            let (left, kept) = try await (leaver, keeper)
            #expect(left.exitStatus == 28, "curl exit \(left.exitStatus): \(left.stderr.suffix(300))")
            #expect(left.body.count < big.count)
            #expect(kept.exitStatus == 0 && kept.httpCode == "200", "\(kept.stderr.suffix(300))")
            #expect(kept.body == big, "the other tunnel's download was disturbed: \(kept.body.count) bytes")
            #expect(Set(nginx.accessLogConnections()).count == 1, "\(nginx.accessLogConnections())")
            try await Self.fetch(gate, nginx)
            #expect(gate.statistics.upstreamConnections == 1)
        }
    }

    @Test("on an HTTP/1.1 connection, a tunnel whose client leaves mid-download does not give the connection to the pool (the rest of that body is still on it): the next tunnel opens a new one and gets its own body, whole")
    func clientLeavesMidDownloadHTTP1() async throws {
        let big = seededRandomBytes(4 << 20, seed: 29)
        try await Self.withOrigin(http2: false, serverDirectives: "location /big.bin { limit_rate 2m; }", extraFiles: ["big.bin": big],
                                  configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            // The client leaves once 256 KiB of the 4 MiB arrived (the pipe closes under
            // curl), not after a fixed time: on a busy machine a time limit could pass before
            // the request was even sent, and then nothing would be mid-download.
            let left = try await TestProcess.run("sh", ["-c", """
                curl -sS --proxy http://127.0.0.1:\(gate.port) --cacert \(gate.caPath) \
                  https://\(Self.host):\(nginx.port)/big.bin | head -c 262144 | wc -c
                """], timeout: 60)
            #expect(left.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "262144", "\(left.stdout) \(left.stderr.suffix(300))")
            let settled = await eventually(timeout: .seconds(10)) {
                gate.statistics.openTunnels == 0 && gate.server.upstreamPool?.notPooled == ["in-flight": 1]
            }
            #expect(settled)
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.idle == 0 && pool.parked == 0, "\(pool)")
            #expect(pool.notPooled == ["in-flight": 1], "\(pool)")
            try await Self.fetch(gate, nginx)
            let connections = nginx.accessLogConnections()
            #expect(connections.count == 2 && Set(connections).count == 2, "\(connections)")
        }
    }
}

