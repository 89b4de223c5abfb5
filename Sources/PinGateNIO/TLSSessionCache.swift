import Foundation
import Synchronization
import NIOCore
import PinGateTLS

/// Upstream TLS sessions kept for resumption, each beside the summary of the full
/// handshake that made it.
///
/// A resumed handshake proves nothing about the server's certificate and OpenSSL runs no
/// verification on it, so a session is only as good as the decision it came from. The
/// rules that keep it so:
/// - the owner stores a session only after its handshake was verified (chain and host
///   name) **and** its verdict trusted the server (see `TLSClientChannel.keepSessions`);
/// - a session is found only under the exact name, port and address it was made for, so
///   a session made for one host is never offered to another behind the same address
///   (the forward-proxy bug Envoy shipped in 2026);
/// - each store is stamped with the cache's `generation` read before the verdict; the
///   owner calls `removeAll()` whenever its list changes, which moves the generation on,
///   so a session decided under an old list is neither kept nor found;
/// - the owner re-runs its policy on every resumed connection with the summary kept
///   here (`TLSPeerSummary.resumed`), so a pin that expired meanwhile still refuses.
///
/// TLS 1.3 tickets are handed out once each (RFC 8446 §C.4 advises against reuse, which
/// would let the connections be linked); each resumed handshake brings fresh ones.
public final class TLSSessionCache: Sendable {
    /// Where a session may be offered again: the name verified (and sent as SNI), the
    /// port, and the address dialled (the parent's, through a parent proxy).
    public struct Key: Hashable, Sendable {
        /// The expected host, lower-cased.
        public let host: String
        /// The destination port.
        public let port: Int
        /// The remote address the TCP connection went to.
        public let address: String

        /// A key for `host:port` at `address`.
        public init(host: String, port: Int, address: String) {
            self.host = host.lowercased()
            self.port = port
            self.address = address
        }
    }

    /// A session and what its full handshake proved.
    public struct Entry: Sendable {
        /// The session to offer.
        public let session: TLSSession
        /// The full handshake's summary: leaf, verified chain, verify result.
        public let peer: TLSPeerSummary
        let expires: NIODeadline
    }

    private struct State {
        var entries: [Key: [Entry]] = [:]
        /// Keys from least to most recently stored, for eviction.
        var order: [Key] = []
        var count = 0
        var generation: UInt64 = 0
    }

    private let state = Mutex(State())
    /// The most sessions kept in all.
    public let capacity: Int
    /// The most sessions kept per key.
    public let perKey: Int
    /// The longest a session is kept, whatever the server allows.
    public let maximumLifetime: TimeAmount

    /// An empty cache.
    public init(capacity: Int = 2048, perKey: Int = 4, maximumLifetime: TimeAmount = .minutes(10)) {
        self.capacity = max(1, capacity)
        self.perKey = max(1, perKey)
        self.maximumLifetime = maximumLifetime
    }

    /// The current generation; read it before the verdict and pass it to `store`.
    public var generation: UInt64 { state.withLock { $0.generation } }

    /// How many sessions are kept.
    public var count: Int { state.withLock { $0.count } }

    /// A session to offer for `key`, if one is kept and unexpired. A TLS 1.3 session is
    /// taken out (offered once); a TLS 1.2 one stays, since resuming it issues no new one.
    public func take(_ key: Key, now: NIODeadline = .now()) -> Entry? {
        state.withLock { state in
            guard var sessions = state.entries[key] else { return nil }
            let before = sessions.count
            sessions.removeAll { $0.expires <= now }
            var found: Entry?
            if let last = sessions.last {
                found = last
                if last.session.isTLS13 { sessions.removeLast() }
            }
            state.count -= before - sessions.count
            if sessions.isEmpty {
                state.entries[key] = nil
                state.order.removeAll { $0 == key }
            } else {
                state.entries[key] = sessions
            }
            return found
        }
    }

    /// Keeps `session` for `key`, with `peer` the full handshake's summary, unless the
    /// cache has moved past `generation` (the list changed after the verdict was made),
    /// the server allows no resumption, the leaf has expired, or `peer` is not a full,
    /// verified handshake.
    public func store(_ session: TLSSession, peer: TLSPeerSummary, key: Key, generation: UInt64,
                      now: NIODeadline = .now(), wallClock: Date = Date()) {
        var lifetime = min(Int64(session.lifetimeSeconds) * 1_000_000_000, maximumLifetime.nanoseconds)
        if let notAfter = peer.leaf?.notAfter {
            lifetime = min(lifetime, Int64(notAfter.timeIntervalSince(wallClock) * 1_000_000_000))
        }
        // Only a verified handshake's session is kept, whatever the owner asks.
        guard lifetime > 0, peer.chainAndHostnameValid, !peer.resumed else { return }
        let entry = Entry(session: session, peer: peer, expires: now + .nanoseconds(lifetime))
        state.withLock { state in
            guard state.generation == generation else { return }
            var sessions = state.entries[key] ?? []
            if sessions.count == perKey {
                sessions.removeFirst()
                state.count -= 1
            }
            sessions.append(entry)
            state.count += 1
            state.entries[key] = sessions
            state.order.removeAll { $0 == key }
            state.order.append(key)
            while state.count > capacity, let oldest = state.order.first {
                state.order.removeFirst()
                state.count -= state.entries.removeValue(forKey: oldest)?.count ?? 0
            }
        }
    }

    /// Drops every session and moves the generation on: stores stamped with an older
    /// one are refused from now on.
    public func removeAll() {
        state.withLock { state in
            state.entries = [:]
            state.order = []
            state.count = 0
            state.generation &+= 1
        }
    }
}
