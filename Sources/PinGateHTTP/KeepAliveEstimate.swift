import NIOCore

/// How long an origin keeps an idle HTTP/1.1 connection open, as learned from what its
/// connections did, and from it how long a connection may have idled and still carry a
/// request that cannot be repeated (issue 31, defect 5: a POST sent on a pooled connection
/// as its origin's keep-alive timeout closed it failed with a 502, and cannot be re-sent).
///
/// An origin closes an idle connection after a fixed time (nginx `keepalive_timeout` 75 s,
/// Apache `KeepAliveTimeout` 5 s, Node 5 s, some 2 s). A request that reaches it just as it
/// closes is lost, and only a request that may be repeated is re-sent on a new connection.
/// So a request that may not be repeated goes only on a connection whose idle time is well
/// inside what the origin keeps: half the shortest idle close seen; before any close is
/// seen, half the longest idle a connection was seen to survive, and at least
/// `defaultSafeIdle`. HAProxy's `http-reuse safe` makes the same trade: such a request
/// pays a new connection rather than risk one that may be closing.
package struct KeepAliveEstimate: Sendable, Equatable {
    /// The idle time trusted before anything was learned: under every common origin's
    /// keep-alive timeout (the shortest common one is 2 s).
    package static let defaultSafeIdle = TimeAmount.seconds(1)

    /// The shortest idle time after which the origin was seen to close a connection.
    package private(set) var shortestIdleClose: TimeAmount?
    /// The longest idle time after which a connection was seen to carry a request to its answer.
    package private(set) var longestServedIdle: TimeAmount = .zero

    /// An estimate that knows nothing yet.
    package init() {}

    /// The origin closed a connection that had been idle for `idle`.
    package mutating func closedWhileIdle(after idle: TimeAmount) {
        guard idle > .zero else { return }
        shortestIdleClose = min(shortestIdleClose ?? idle, idle)
    }

    /// A connection that had been idle for `idle` carried a request and was answered.
    package mutating func served(afterIdle idle: TimeAmount) {
        longestServedIdle = max(longestServedIdle, idle)
    }

    /// How long a connection may have idled and still carry a request that cannot be repeated.
    package var safeIdle: TimeAmount {
        if let shortestIdleClose { return .nanoseconds(shortestIdleClose.nanoseconds / 2) }
        return max(Self.defaultSafeIdle, .nanoseconds(longestServedIdle.nanoseconds / 2))
    }
}
