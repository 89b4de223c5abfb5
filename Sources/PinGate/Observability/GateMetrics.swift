import CoreMetrics
import Foundation
import Synchronization

/// The gate's metrics, emitted through swift-metrics with an explicit factory, so each
/// gate (and each test) has its own registry instead of one process-wide bootstrap.
public final class GateMetrics: Sendable {
    private let factory: any MetricsFactory
    private let openTunnels: Meter
    private let bytesUp: Counter
    private let bytesDown: Counter
    private let listEntries: Gauge
    private let listEarliestExpiry: Gauge
    private let upstreamHandshakeTimer: CoreMetrics.Timer
    private let clientHandshakeFailures: Counter
    private let clientHandshakeTimeouts: Counter
    private let tunnels = Mutex<[String: Counter]>([:])
    private let updates = Mutex<[String: Counter]>([:])
    private let requests = Mutex<[String: Counter]>([:])
    /// `pingate_requests_total{outcome="forwarded",reason="trusted"}`, made once: it counts
    /// every request a tunnel passes on, so it is not looked up by name per request.
    private let requestsForwarded: Counter
    private let upstreamResumptions: Counter
    private let creditUnplacedBytes: Counter
    private let poolHits: Counter
    private let poolMisses: Counter
    private let poolWaits: Counter
    private let poolIdle: Gauge
    private let streamWindowGrowths: Counter
    /// Counters with labels made as they are first needed, by label and dimension values.
    private let labelled = Mutex<[String: Counter]>([:])

    /// Metrics created in `factory` (e.g. a `PrometheusMetricsFactory` over a registry).
    public init(factory: any MetricsFactory) {
        self.factory = factory
        openTunnels = Meter(label: "pingate_open_tunnels", factory: factory)
        bytesUp = Counter(label: "pingate_relayed_bytes_total", dimensions: [("direction", "up")], factory: factory)
        bytesDown = Counter(label: "pingate_relayed_bytes_total", dimensions: [("direction", "down")], factory: factory)
        listEntries = Gauge(label: "pingate_pin_list_entries", factory: factory)
        listEarliestExpiry = Gauge(label: "pingate_pin_list_earliest_expiry_seconds", factory: factory)
        upstreamHandshakeTimer = CoreMetrics.Timer(label: "pingate_upstream_handshake_seconds", factory: factory)
        clientHandshakeFailures = Counter(label: "pingate_client_handshakes_failed_total", dimensions: [("cause", "error")], factory: factory)
        clientHandshakeTimeouts = Counter(label: "pingate_client_handshakes_failed_total", dimensions: [("cause", "timeout")], factory: factory)
        upstreamResumptions = Counter(label: "pingate_upstream_tls_resumed_total", factory: factory)
        // Made at start so it is exported (as 0) from the first scrape: the soak and any
        // alert read it as "never moved".
        creditUnplacedBytes = Counter(label: "pingate_http_credit_unplaced_total", factory: factory)
        poolHits = Counter(label: "pingate_upstream_pool_checkouts_total", dimensions: [("result", "hit")], factory: factory)
        poolMisses = Counter(label: "pingate_upstream_pool_checkouts_total", dimensions: [("result", "miss")], factory: factory)
        poolWaits = Counter(label: "pingate_upstream_pool_checkouts_total", dimensions: [("result", "waited")], factory: factory)
        poolIdle = Gauge(label: "pingate_upstream_pool_idle_connections", factory: factory)
        streamWindowGrowths = Counter(label: "pingate_upstream_stream_window_growths_total", factory: factory)
        requestsForwarded = Counter(label: "pingate_requests_total", dimensions: [("outcome", "forwarded"), ("reason", "trusted")],
                                    factory: factory)
    }

    /// Metrics that go nowhere.
    public static var discarding: GateMetrics { GateMetrics(factory: NOOPMetricsHandler.instance) }

    func decision(allowed: Bool, reason: String) {
        let key = "\(allowed)|\(reason)"
        let counter = tunnels.withLock { counters in
            if let existing = counters[key] { return existing }
            let made = Counter(label: "pingate_tunnels_total",
                               dimensions: [("verdict", allowed ? "allowed" : "refused"), ("reason", reason)], factory: factory)
            counters[key] = made
            return made
        }
        counter.increment()
    }

    /// One request inside a tunnel passed on to the upstream.
    func requestForwarded() { requestsForwarded.increment() }

    /// One request inside a tunnel: `pingate_requests_total{outcome,reason}`.
    func request(outcome: String, reason: String) {
        let key = outcome + "|" + reason
        let counter = requests.withLock { counters in
            if let known = counters[key] { return known }
            let made = Counter(label: "pingate_requests_total", dimensions: [("outcome", outcome), ("reason", reason)], factory: factory)
            counters[key] = made
            return made
        }
        counter.increment()
    }

    func tunnelOpened() { openTunnels.increment() }
    func tunnelClosed() { openTunnels.decrement() }
    func relayed(up: Int, down: Int) {
        if up > 0 { bytesUp.increment(by: up) }
        if down > 0 { bytesDown.increment(by: down) }
    }
    func upstreamHandshake(nanoseconds: Int64) { upstreamHandshakeTimer.recordNanoseconds(nanoseconds) }
    func upstreamSessionResumed() { upstreamResumptions.increment() }
    /// Flow-control credit (bytes) the HTTP layer could not place.
    func creditUnplaced(_ bytes: Int) { creditUnplacedBytes.increment(by: bytes) }
    /// `pingate_upstream_stream_window_growths_total`: an `h2` upstream stream's window grew.
    func upstreamStreamWindowGrew() { streamWindowGrowths.increment() }
    func clientHandshakeFailed() { clientHandshakeFailures.increment() }
    func clientHandshakeTimedOut() { clientHandshakeTimeouts.increment() }

    /// A request-aware CONNECT looked in the upstream pool: found a connection (`hit`) or not.
    func upstreamPoolCheckout(hit: Bool) { (hit ? poolHits : poolMisses).increment() }
    /// A CONNECT waited for another tunnel's dial (it checks out again afterwards).
    func upstreamPoolWaited() { poolWaits.increment() }
    /// How many connections wait in the upstream pool now.
    func upstreamPoolIdle(_ count: Int) { poolIdle.record(count) }
    /// A connection not put in the pool when its tunnel ended: `pingate_upstream_pool_not_pooled_total{reason}`.
    func upstreamPoolNotPooled(reason: String) {
        counter("pingate_upstream_pool_not_pooled_total", ("reason", reason)).increment()
    }
    /// Connections that left the pool unused: `pingate_upstream_pool_closed_total{reason}`.
    func upstreamPoolClosed(reason: String, count: Int) {
        counter("pingate_upstream_pool_closed_total", ("reason", reason)).increment(by: count)
    }

    /// A new upstream connection opened inside a tunnel whose pooled one went:
    /// `pingate_upstream_reconnects_total{outcome}` ("connected" or the refusal's reason).
    func upstreamReconnect(outcome: String) {
        counter("pingate_upstream_reconnects_total", ("outcome", outcome)).increment()
    }

    private func counter(_ label: String, _ dimension: (String, String)) -> Counter {
        let key = label + "|" + dimension.1
        return labelled.withLock { counters in
            if let known = counters[key] { return known }
            let made = Counter(label: label, dimensions: [dimension], factory: factory)
            counters[key] = made
            return made
        }
    }

    func listUpdate(result: String, count: Int = 1) {
        let counter = updates.withLock { counters in
            if let existing = counters[result] { return existing }
            let made = Counter(label: "pingate_pin_list_updates_total", dimensions: [("result", result)], factory: factory)
            counters[result] = made
            return made
        }
        counter.increment(by: count)
    }

    func listInForce(entries: Int, earliestExpiry: Date?) {
        listEntries.record(entries)
        listEarliestExpiry.record(earliestExpiry?.timeIntervalSince1970 ?? 0)
    }
}
