import NIOCore
import PinGateHTTP
import Synchronization

/// What the gate has learned of each origin's keep-alive timeout (`KeepAliveEstimate`),
/// from every tunnel's connections and the pool's: shared by all loops, so that one
/// connection's idle close protects the next tunnel's POST to that origin.
final class OriginKeepAlive: Sendable {
    /// Origins remembered at most; past it the estimates start again from nothing (the
    /// default is the cautious one, so forgetting costs a new connection, never a request).
    static let maximumOrigins = 4_096

    private let estimates = Mutex<[UpstreamPoolKey: KeepAliveEstimate]>([:])

    /// The origin of `key` closed a connection that had idled for `idle`.
    func closedWhileIdle(_ key: UpstreamPoolKey, after idle: TimeAmount) {
        update(key) { $0.closedWhileIdle(after: idle) }
    }

    /// A connection to `key` that had idled for `idle` carried a request to its answer.
    func served(_ key: UpstreamPoolKey, afterIdle idle: TimeAmount) {
        update(key) { $0.served(afterIdle: idle) }
    }

    /// How long a connection to `key` may have idled and still carry a request that cannot
    /// be repeated.
    func safeIdle(_ key: UpstreamPoolKey) -> TimeAmount {
        estimates.withLock { $0[key]?.safeIdle ?? KeepAliveEstimate.defaultSafeIdle }
    }

    /// The first estimate whose key `matches` (for tests, which know the host, not the key).
    func estimate(matching matches: (UpstreamPoolKey) -> Bool) -> KeepAliveEstimate? {
        estimates.withLock { $0.first { matches($0.key) }?.value }
    }

    private func update(_ key: UpstreamPoolKey, _ change: (inout KeepAliveEstimate) -> Void) {
        estimates.withLock { estimates in
            if estimates[key] == nil && estimates.count >= Self.maximumOrigins { estimates.removeAll() }
            change(&estimates[key, default: KeepAliveEstimate()])
        }
    }
}
