import Foundation
import PinGateTestSupport
import Testing
import NIOCore
import PinGateNIO
@testable import PinGateTLS

/// Sessions in memory: what the engine hands out and resumes, and the rules of the cache
/// the gate keeps them in. Real handshakes between two in-memory connections; no sockets.
@Suite("TLS sessions")
struct TLSSessionTests {
    /// A full handshake from a context that collects sessions; returns the client (its
    /// tickets read) and the sessions it received once asked for them.
    static func fullHandshake(_ peers: TLSEngineTests.Peers, host: String, offering session: TLSSession? = nil)
        throws -> (client: TLSConnection, sessions: [TLSSession]) {
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: host, alpnOffer: nil))
        if let session { try client.offer(session) }
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        let (clientState, serverState) = TLSEngineTests.pump(client, server)
        #expect(clientState == .complete)
        #expect(serverState == .complete)
        // TLS 1.3 tickets follow the handshake; a read processes them.
        TLSEngineTests.move(server, client)
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(buffer.withUnsafeMutableBytes { client.readPlaintext(into: $0) } == .needsMoreInput)
        var sessions: [TLSSession] = []
        client.deliverSessions { sessions.append($0) }
        return (client, sessions)
    }

    static func collectingPeers(_ directory: TemporaryDirectory) throws -> TLSEngineTests.Peers {
        let peers = try TLSEngineTests.makePeers(names: [.dns("engine.test")], directory: directory)
        return TLSEngineTests.Peers(ca: peers.ca, caPath: peers.caPath, serverContext: peers.serverContext,
                                    clientContext: try TLSContext.client(trustRoots: .pemFiles([peers.caPath]), collectsSessions: true))
    }

    @Test("a collecting context holds the server's tickets until asked, and an offered one resumes with the same leaf")
    func offerAndResume() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.collectingPeers(directory)
        let first = try Self.fullHandshake(peers, host: "engine.test")
        #expect(!first.client.sessionWasReused)
        // OpenSSL's server sends two TLS 1.3 tickets by default; both were held.
        #expect(first.sessions.count == 2)
        let session = try #require(first.sessions.first)
        #expect(session.isResumable && session.isTLS13)
        #expect(session.lifetimeSeconds > 0)
        let leaf = try #require(first.client.peerSummary().leaf)
        #expect(session.peerLeaf?.derBytes == leaf.derBytes)

        let second = try Self.fullHandshake(peers, host: "engine.test", offering: session)
        #expect(second.client.sessionWasReused)
        // The resumed handshake proved nothing itself: the leaf is the session's copy,
        // and a fresh ticket came with it.
        #expect(second.client.peerSummary().leaf?.derBytes == leaf.derBytes)
        #expect(!second.sessions.isEmpty)

        // Without collecting, nothing is held and nothing offered.
        let plain = try TLSEngineTests.makePeers(names: [.dns("engine.test")], directory: directory)
        let none = try Self.fullHandshake(plain, host: "engine.test")
        #expect(none.sessions.isEmpty)
    }

    @Test("the cache: per name, port and address; TLS 1.3 sessions offered once; stores from before a flush refused; unverified handshakes never kept")
    func cacheRules() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.collectingPeers(directory)
        let made = try Self.fullHandshake(peers, host: "engine.test")
        let summary = made.client.peerSummary()
        #expect(summary.chainAndHostnameValid)
        let cache = TLSSessionCache(capacity: 3, perKey: 2)
        let key = TLSSessionCache.Key(host: "Engine.Test", port: 443, address: "127.0.0.1")
        let generation = cache.generation
        for session in made.sessions { cache.store(session, peer: summary, key: key, generation: generation) }
        #expect(cache.count == 2)
        // Another name, port or address at all finds nothing.
        #expect(cache.take(.init(host: "other.test", port: 443, address: "127.0.0.1")) == nil)
        #expect(cache.take(.init(host: "engine.test", port: 8443, address: "127.0.0.1")) == nil)
        #expect(cache.take(.init(host: "engine.test", port: 443, address: "127.0.0.2")) == nil)
        // The name is compared lower-cased; each TLS 1.3 session is handed out once.
        #expect(cache.take(.init(host: "engine.test", port: 443, address: "127.0.0.1")) != nil)
        #expect(cache.take(key) != nil)
        #expect(cache.take(key) == nil)
        #expect(cache.count == 0)

        // A store stamped before a flush is refused: it was decided under the old list.
        let stale = cache.generation
        cache.removeAll()
        cache.store(made.sessions[0], peer: summary, key: key, generation: stale)
        #expect(cache.count == 0)
        cache.store(made.sessions[0], peer: summary, key: key, generation: cache.generation)
        #expect(cache.count == 1)
        cache.removeAll()
        #expect(cache.take(key) == nil)

        // A handshake whose chain or host name failed is never kept, whatever the caller says.
        let wrongName = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "other.test", alpnOffer: nil))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        _ = TLSEngineTests.pump(wrongName, server)
        let unverified = wrongName.peerSummary()
        #expect(!unverified.chainAndHostnameValid)
        cache.store(made.sessions[1], peer: unverified, key: key, generation: cache.generation)
        // Nor is a summary that is itself a resumption's.
        cache.store(made.sessions[1], peer: summary.resumed(alpn: nil, protocolVersion: "TLSv1.3"), key: key, generation: cache.generation)
        #expect(cache.count == 0)

        // Capacity: the least recently stored name goes first.
        for name in ["one.test", "two.test", "three.test", "four.test"] {
            cache.store(made.sessions[0], peer: summary, key: .init(host: name, port: 443, address: "127.0.0.1"), generation: cache.generation)
        }
        #expect(cache.count == 3)
        #expect(cache.take(.init(host: "one.test", port: 443, address: "127.0.0.1")) == nil)
        #expect(cache.take(.init(host: "four.test", port: 443, address: "127.0.0.1")) != nil)
    }

    @Test("a connection told to discard its sessions holds none, neither those received before nor those after")
    func discardedSessionsAreNotHeld() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.collectingPeers(directory)
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: nil))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        let (clientState, serverState) = TLSEngineTests.pump(client, server)
        #expect(clientState == .complete && serverState == .complete)
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(buffer.withUnsafeMutableBytes { client.readPlaintext(into: $0) } == .needsMoreInput)
        #expect(client.heldSessionCount == 2)
        client.discardSessions()
        #expect(client.heldSessionCount == 0)
        var delivered = 0
        client.deliverSessions { _ in delivered += 1 }
        #expect(delivered == 0)
    }

    @Test("an idle client that has read its server's tickets keeps no record buffer (issue 12: 16.7 KiB per idle upstream)")
    func idleClientKeepsNoRecordBuffer() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.collectingPeers(directory)
        // What one client holds once idle: the heap in use with it, minus without it.
        // The median of several keeps an allocation on another thread out of it.
        var footprints: [Int] = []
        for _ in 0..<15 {
            var client: TLSConnection? = try Self.fullHandshake(peers, host: "engine.test").client
            let holding = TLSEngineTests.heapInUse
            client = nil
            footprints.append(holding - TLSEngineTests.heapInUse)
            _ = client
        }
        let median = footprints.sorted()[footprints.count / 2]
        // OpenSSL's read buffer alone is 16.7 KiB; the rest of an idle client (its SSL,
        // cipher contexts, session and the server's certificate) is well under 16.
        #expect(median < 20 * 1024, "an idle client holds \(median) bytes")
    }
}
