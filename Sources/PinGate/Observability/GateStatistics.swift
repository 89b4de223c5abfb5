import PinList
import Synchronization

/// Counters the gate keeps about its tunnels: what tests assert on and what the admin
/// endpoint will report.
public final class GateStatistics: Sendable {
    /// A point-in-time copy of every counter.
    public struct Snapshot: Sendable, Equatable {
        /// CONNECTs decided, by reason token ("trusted", "empty", "pin-mismatch", …).
        public var connectsByReason: [String: Int] = [:]
        /// Tunnels relaying now.
        public var openTunnels: Int = 0
        /// Plaintext bytes relayed from clients to upstreams.
        public var bytesUp: Int = 0
        /// Plaintext bytes relayed from upstreams to clients.
        public var bytesDown: Int = 0
        /// Upstream TCP connections opened.
        public var upstreamConnections: Int = 0
        /// Upstream TLS handshakes that resumed a kept session (each decided on again).
        public var upstreamSessionsResumed: Int = 0
        /// Upstream connections of tunnels admitted from the pool that went while the client's
        /// connection stayed (the origin's keep-alive timeout, a reload): the tunnel's next
        /// request opens a new, verified connection.
        public var upstreamConnectionsLostInTunnels: Int = 0
        /// New upstream connections opened inside such tunnels, by outcome ("connected", or
        /// the refusal's reason token).
        public var upstreamReconnects: [String: Int] = [:]
        /// Upstream connections closed because the upstream sent bytes no request asked for
        /// while a tunnel used them (a stray between responses, or after a response's end).
        public var upstreamUnsolicitedBytes: Int = 0
        /// Requests that cannot be repeated (a POST, an upload) sent on a new upstream
        /// connection because the tunnel's had idled past what its origin is trusted to keep
        /// (`KeepAliveEstimate`): it might have been closing as the request arrived.
        public var upstreamConnectionsLeftIdle: Int = 0
        /// Times an `h2` upstream stream's receive window grew past its starting 64 KiB
        /// because its client kept up (`StreamWindowTuner`), and the largest it reached.
        public var upstreamStreamWindowGrowths: Int = 0
        /// See `upstreamStreamWindowGrowths`; 0 while none grew.
        public var upstreamStreamWindowLargestBytes: Int = 0
        /// Times the heap's free memory was given back after a busy spell (`HeapTrimmer`),
        /// and the resident bytes those trims released.
        public var heapTrims: Int = 0
        /// See `heapTrims`.
        public var heapTrimReleasedBytes: Int = 0
        /// Client-side TLS handshakes that failed after a 200.
        public var clientHandshakeFailures: Int = 0
        /// Client-side TLS handshakes that did not finish within the deadline after a 200.
        public var clientHandshakeTimeouts: Int = 0
        /// Live tunnels closed because a list update no longer trusts them, by reason.
        public var tunnelsClosedByUpdate: [String: Int] = [:]
        /// Connections allowed under report-only pins although no pin matched.
        public var reportOnlyViolations: Int = 0
        /// Requests inside tunnels that were passed on to the upstream.
        public var requestsForwarded: Int = 0
        /// Requests (or whole tunnels, for `not-http`) refused inside admitted tunnels, by
        /// reason token ("authority-mismatch", "malformed-request", "not-http").
        public var requestsRefusedByReason: [String: Int] = [:]
        /// Requests inside tunnels that the client abandoned before their response ended
        /// (HTTP/2 RST_STREAM): counted apart from refusals and upstream failures.
        public var requestsCancelledByClient: Int = 0
        /// Responses cut after they began (the upstream's connection ended mid-response, or
        /// the idle timeout), by why: the client got a reset or a short close, not the end.
        public var requestsCutByReason: [String: Int] = [:]
        /// Body bytes of flow-control credit that the HTTP layer could not place (reported
        /// written or dropped with none outstanding, or refused by a session): 0 unless a
        /// side miscounts, which would stall a connection. Tests assert it stays 0.
        public var creditUnplacedBytes: Int = 0
        /// Trusted verdicts by the pin that carried them (`PinMatch.statisticsKey`), so
        /// `/pins` can say which pin is doing the work (e.g. a depth-1 pin after a leaf rotation).
        public var trustedByPin: [String: Int] = [:]
        /// The last pin match per pin key (its `description`, e.g. `depth-1 spki …`, is made
        /// when read, not on every CONNECT).
        public var lastMatchByPin: [String: PinMatch] = [:]

        /// The count for one reason.
        public func count(_ reason: DecisionReason) -> Int { connectsByReason[reason.rawValue, default: 0] }
        /// Requests refused inside tunnels for one reason.
        public func requestsRefused(_ reason: DecisionReason) -> Int { requestsRefusedByReason[reason.rawValue, default: 0] }
    }

    private let state = Mutex(Snapshot())
    /// The same events, exported through swift-metrics.
    public let metrics: GateMetrics
    /// Each host's pin health, from the verdicts (issue 34).
    public let pinHealth: PinHealthMonitor

    /// Creates zeroed counters, mirrored into `metrics`.
    /// - Parameters:
    ///   - metrics: where the counters are mirrored.
    ///   - pinWarningDays: how close an expiry makes a host's pin health `expiring`.
    public init(metrics: GateMetrics = .discarding, pinWarningDays: Int = PinHealthBook.defaultWarningDays) {
        self.metrics = metrics
        self.pinHealth = PinHealthMonitor(warningDays: pinWarningDays)
    }

    /// A copy of every counter now.
    public var snapshot: Snapshot { state.withLock { $0 } }

    func recordDecision(_ reason: DecisionReason, pin: PinMatch? = nil) {
        state.withLock { state in
            state.connectsByReason[reason.rawValue, default: 0] += 1
            if let pin {
                let key = pin.statisticsKey
                state.trustedByPin[key, default: 0] += 1
                state.lastMatchByPin[key] = pin
            }
        }
        metrics.decision(allowed: reason.isAllowed, reason: reason.rawValue)
    }

    func tunnelOpened() {
        state.withLock { $0.openTunnels += 1 }
        metrics.tunnelOpened()
    }

    func tunnelClosed() {
        state.withLock { $0.openTunnels -= 1 }
        metrics.tunnelClosed()
    }
    func upstreamConnectionOpened() { state.withLock { $0.upstreamConnections += 1 } }
    func upstreamSessionResumed() {
        state.withLock { $0.upstreamSessionsResumed += 1 }
        metrics.upstreamSessionResumed()
    }
    func clientHandshakeFailed() {
        state.withLock { $0.clientHandshakeFailures += 1 }
        metrics.clientHandshakeFailed()
    }
    func clientHandshakeTimedOut() {
        state.withLock { $0.clientHandshakeTimeouts += 1 }
        metrics.clientHandshakeTimedOut()
    }
    func tunnelClosedByUpdate(_ reason: DecisionReason) { state.withLock { $0.tunnelsClosedByUpdate[reason.rawValue, default: 0] += 1 } }
    func requestForwarded() {
        state.withLock { $0.requestsForwarded += 1 }
        metrics.requestForwarded()
    }
    func requestRefused(_ reason: DecisionReason) {
        state.withLock { $0.requestsRefusedByReason[reason.rawValue, default: 0] += 1 }
        metrics.request(outcome: "refused", reason: reason.rawValue)
    }
    func requestCancelledByClient() {
        state.withLock { $0.requestsCancelledByClient += 1 }
        metrics.request(outcome: "cancelled", reason: "client-reset")
    }
    func requestCut(_ reason: String) {
        state.withLock { $0.requestsCutByReason[reason, default: 0] += 1 }
        metrics.request(outcome: "cut", reason: reason)
    }
    func creditUnplaced(_ bytes: Int) {
        state.withLock { $0.creditUnplacedBytes += bytes }
        metrics.creditUnplaced(bytes)
    }
    func heapTrimmed(released: Int) {
        state.withLock {
            $0.heapTrims += 1
            $0.heapTrimReleasedBytes += released
        }
    }
    func upstreamLostInTunnel() { state.withLock { $0.upstreamConnectionsLostInTunnels += 1 } }
    func upstreamSentUnsolicitedBytes() { state.withLock { $0.upstreamUnsolicitedBytes += 1 } }
    func upstreamConnectionLeftIdle() { state.withLock { $0.upstreamConnectionsLeftIdle += 1 } }
    func upstreamStreamWindowGrew(to window: Int) {
        state.withLock {
            $0.upstreamStreamWindowGrowths += 1
            $0.upstreamStreamWindowLargestBytes = max($0.upstreamStreamWindowLargestBytes, window)
        }
        metrics.upstreamStreamWindowGrew()
    }
    func upstreamReconnected(_ outcome: String) {
        state.withLock { $0.upstreamReconnects[outcome, default: 0] += 1 }
        metrics.upstreamReconnect(outcome: outcome)
    }
    func reportOnlyViolation() { state.withLock { $0.reportOnlyViolations += 1 } }
    func relayed(up: Int, down: Int) {
        state.withLock {
            $0.bytesUp += up
            $0.bytesDown += down
        }
        metrics.relayed(up: up, down: down)
    }
}
