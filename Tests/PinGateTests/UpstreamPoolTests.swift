import Foundation
import PinGateTestSupport
import PinList
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
        http2: Bool = true, serverDirectives: String = "",
        configure: (inout GateConfiguration) -> Void = { _ in },
        _ body: (GateFixture, NginxOrigin, TestPKI) async throws -> Value
    ) async throws -> Value {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        return try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: ["a.txt": Self.body],
                                          http2: http2, serverDirectives: serverDirectives) { nginx in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]),
                                       resolve: ["\(host):\(nginx.port)"], configure: configure) { gate in
                try await body(gate, nginx, pki)
            }
        }
    }

    static func url(_ nginx: NginxOrigin) -> String { "https://\(host):\(nginx.port)/a.txt" }

    /// The nginx connection serial number of every request logged so far, in order.
    static func originConnections(_ nginx: NginxOrigin) -> [String] {
        let text = (try? String(contentsOfFile: nginx.directory.file("access.log"), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) }
    }

    /// Waits until the pool holds `count` idle connections (a tunnel's connection goes to
    /// the pool as the gate sees its client leave, a moment after curl exits).
    @discardableResult
    static func waitForIdle(_ gate: GateFixture, _ count: Int, timeout: Duration = .seconds(5)) async -> Bool {
        await eventually(timeout: timeout) { gate.server.upstreamPool?.idle == count }
    }

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
            let connections = Self.originConnections(nginx)
            #expect(connections.count == 20)
            #expect(Set(connections).count == 1, "\(connections)")
            #expect(gate.statistics.upstreamConnections == 1)
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.hits == 19 && pool.misses == 1 && pool.parked == 20, "\(pool)")
            #expect(pool.notPooled.isEmpty, "\(pool)")
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
            let connections = Set(Self.originConnections(nginx))
            #expect(connections.count <= 2, "\(connections)")
            #expect(gate.statistics.upstreamConnections <= 2)
            #expect((gate.server.upstreamPool?.hits ?? 0) >= 18)
        }
    }

    /// Waits until every tunnel that ended has offered its connection.
    static func waitUntilParked(_ gate: GateFixture) async {
        _ = await eventually(timeout: .seconds(5)) {
            guard let pool = gate.server.upstreamPool else { return false }
            return pool.parked + pool.notPooled.values.reduce(0, +) == pool.hits + pool.misses
        }
    }

    @Test("--no-upstream-pool gives today's behaviour: one upstream connection per tunnel, and no pool in /status")
    func poolOff() async throws {
        try await Self.withOrigin(configure: { $0.upstreamPoolEnabled = false; $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            for _ in 0..<5 { try await Self.fetch(gate, nginx) }
            #expect(Set(Self.originConnections(nginx)).count == 5)
            #expect(gate.statistics.upstreamConnections == 5)
            #expect(gate.server.upstreamPool == nil)
        }
    }

    @Test("a connection that carried Authorization: NTLM (or Negotiate) is never reused by another tunnel",
          arguments: ["NTLM TlRMTVNTUAABAAAAB4IIogAAAAAAAAAAAAAAAAAAAAAKAGFKAAAADw==", "Negotiate YIIBhwYGKwYBBQUCoIIBezCCAXeg"])
    func connectionBoundAuthentication(authorization: String) async throws {
        try await Self.withOrigin(http2: false, configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx, ["-H", "Authorization: \(authorization)"])
            await Self.waitUntilParked(gate)
            try await Self.fetch(gate, nginx)
            await Self.waitUntilParked(gate)
            try await Self.fetch(gate, nginx)
            let connections = Self.originConnections(nginx)
            #expect(connections.count == 3 && Set(connections).count == 2, "\(connections)")
            // The second and third tunnels shared the one without the authentication.
            #expect(connections[1] == connections[2] && connections[0] != connections[1], "\(connections)")
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.notPooled == ["connection-auth": 1], "\(pool)")
        }
    }

    @Test("a list update that drops the pin closes the pooled connections, and the next CONNECT is refused (verified on a new connection)")
    func listUpdateDropsPooled() async throws {
        try await Self.withOrigin(configure: { $0.eventLoopThreads = 1 }) { gate, nginx, pki in
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
            let refused = try await curlThroughGate(gate, Self.url(nginx))
            #expect(refused.proxyHeaders["pingate-refusal"] == "pin-mismatch", "\(refused.stderr)")
            #expect(gate.statistics.upstreamConnections == 2)
            #expect(Self.originConnections(nginx).count == 1, "nothing of the refused tunnel reached the origin")
        }
    }

    @Test("a list update that still trusts the pin keeps the pooled connection, re-stamped: the next CONNECT is a hit")
    func listUpdateKeepsTrusted() async throws {
        try await Self.withOrigin(configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            #expect(await Self.waitForIdle(gate, 1))
            gate.server.store.replace(with: gate.server.store.list)
            try await Self.fetch(gate, nginx)
            #expect(Set(Self.originConnections(nginx)).count == 1)
            #expect(gate.server.upstreamPool?.hits == 1)
        }
    }

    @Test("an idle pooled connection closes after the pool's idle timeout; the next CONNECT opens a new one")
    func idleTimeout() async throws {
        try await Self.withOrigin(configure: { $0.eventLoopThreads = 1; $0.upstreamPoolIdleTimeout = .seconds(1) }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            // Parked (counted; it may already have timed out by the time anyone looks), then gone.
            #expect(await eventually(timeout: .seconds(5)) { gate.server.upstreamPool?.parked == 1 })
            #expect(await Self.waitForIdle(gate, 0, timeout: .seconds(5)))
            #expect(gate.server.upstreamPool?.closed["idle-timeout"] == 1)
            try await Self.fetch(gate, nginx)
            #expect(Set(Self.originConnections(nginx)).count == 2)
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
            #expect(Set(Self.originConnections(nginx)).count == 2)
            #expect(gate.statistics.upstreamConnections == 2)
        }
    }

    @Test("opaque hosts' tunnels (byte relays) never use the pool")
    func opaqueHostsNotPooled() async throws {
        try await Self.withOrigin(configure: { $0.eventLoopThreads = 1; $0.opaqueHosts = [Self.host] }) { gate, nginx, _ in
            for _ in 0..<3 { try await Self.fetch(gate, nginx) }
            #expect(Set(Self.originConnections(nginx)).count == 3)
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.parked == 0 && pool.hits == 0 && pool.misses == 0, "\(pool)")
        }
    }

    @Test("a response with Connection: close is not pooled: the tunnel's connection closes with it")
    func connectionCloseNotPooled() async throws {
        try await Self.withOrigin(http2: false, serverDirectives: "keepalive_requests 1;", configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await Self.fetch(gate, nginx)
            await Self.waitUntilParked(gate)
            try await Self.fetch(gate, nginx)
            #expect(Set(Self.originConnections(nginx)).count == 2)
            let pool = try #require(gate.server.upstreamPool)
            #expect(pool.parked == 0 && (pool.notPooled["closing"] ?? 0) >= 1, "\(pool)")
        }
    }
}
