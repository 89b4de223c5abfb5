import Foundation
import Logging
import NIOCore
import PinGateHTTP
import PinList
import Synchronization

/// The gate's pool of verified upstream connections (`UpstreamPoolState` is its logic):
/// when a request-aware tunnel ends with its upstream connection at a message boundary,
/// the connection waits here, its HTTP side parked in its pipeline, and a later CONNECT
/// with the same key on the same event loop is admitted on it: its verdict from the chain
/// that connection's handshake verified, under the list in force, and its `200` without
/// any upstream handshake.
///
/// One pool per gate, one lock; each connection stays on its own event loop, where its
/// idle timer runs and where it is closed. Pooled per loop, as nginx keeps one keep-alive
/// cache per worker: a tunnel's legs and router share one loop, and a channel cannot move.
final class UpstreamPool: Sendable {
    typealias Departure = UpstreamPoolState<UpstreamConnection>.Departure

    /// How long a connection may wait, and how many may wait per key.
    struct Settings: Sendable, Equatable {
        /// Idle connections close after this long (default 30 s: below the keep-alive
        /// timeouts of common servers, nginx's 75 s among them, so the gate lets go first).
        var idleTimeout: TimeAmount = .seconds(30)
        /// The most idle connections per key (host, port, SNI, address, parent proxy), over
        /// all event loops.
        var maximumIdlePerKey = 16
    }

    let settings: Settings
    private let state: Mutex<UpstreamPoolState<UpstreamConnection>>
    /// Channels whose close the pool already watches (one watch per connection, however
    /// often it is parked).
    private let watched = Mutex<Set<ObjectIdentifier>>([])
    /// The idle timer of each connection parked idle (not shared), by channel, with its
    /// stay: cancelled when the stay ends another way (taken, closed, dropped). Left to
    /// fire, a busy pool kept one pending 30 s timer per tunnel it served: 600 sequential
    /// tunnels a second held about 18,000 scheduled tasks, 3.8 MB of the gate's RSS.
    private let idleTimers = Mutex<IdleTimers>(IdleTimers())

    /// The pending idle timers, and how many were ever scheduled, cancelled and fired.
    struct IdleTimers {
        var pending: [ObjectIdentifier: (stay: PooledConnectionID, timer: Scheduled<Void>)] = [:]
        var scheduled = 0
        var cancelled = 0
        var fired = 0
    }

    /// How many idle timers are pending, scheduled, cancelled and fired so far.
    var idleTimerCounts: (pending: Int, scheduled: Int, cancelled: Int, fired: Int) {
        idleTimers.withLock { ($0.pending.count, $0.scheduled, $0.cancelled, $0.fired) }
    }
    private let metrics: GateMetrics
    /// What the pool's connections taught about each origin's keep-alive timeout, shared
    /// with every tunnel (`GateEnvironment.keepAlive`).
    let keepAlive = OriginKeepAlive()
    private let logger: Logger

    /// The gate's clock (the one its verdicts use), for the chains' expiry.
    private let now: @Sendable () -> Date

    init(settings: Settings, metrics: GateMetrics, logger: Logger, now: @escaping @Sendable () -> Date = { Date() }) {
        self.settings = settings
        self.metrics = metrics
        self.logger = logger
        self.now = now
        state = Mutex(UpstreamPoolState(maximumIdlePerKey: settings.maximumIdlePerKey))
    }

    /// What the pool has done so far.
    var counters: UpstreamPoolState<UpstreamConnection>.Counters { state.withLock { $0.counters } }

    /// How many connections wait now.
    var idleCount: Int { state.withLock { $0.idleCount } }

    /// Idle connections per `host:port`, for `/status`.
    var idleByHost: [String: Int] {
        state.withLock { state in
            var byHost: [String: Int] = [:]
            for (key, count) in state.idleByKey { byHost[key.description, default: 0] += count }
            return byHost
        }
    }

    /// A pooled connection for `key` on `eventLoop` (called there), verified under
    /// `generation`; nil when none is waiting. Connections found closed or stale on the
    /// way are dropped (and counted as such, not as hits).
    func take(_ key: UpstreamPoolKey, on eventLoop: any EventLoop, generation: UInt64) -> UpstreamConnection? {
        guard case .hit(let connection) = checkout(key, on: eventLoop, generation: generation, shareableDial: false, resume: nil) else {
            return nil
        }
        return connection
    }

    /// `take`, for a CONNECT that may share another tunnel's dial (see
    /// `UpstreamPoolState.checkout`): `.wait` means `resume` runs on `eventLoop` once that
    /// dial is settled; `.dial(registered: true)` means the caller's dial is the one others
    /// wait for, and it must call `dialSettled` once its connection is shared or will not be.
    func checkout(_ key: UpstreamPoolKey, on eventLoop: any EventLoop, generation: UInt64, shareableDial: Bool,
                  resume: (() -> Void)?) -> UpstreamPoolState<UpstreamConnection>.Checkout {
        let waiter: (@Sendable () -> Void)? = resume.map { resume in
            let bound = NIOLoopBound(resume, eventLoop: eventLoop)
            return { bound.value() }
        }
        let now = self.now()
        let (checkout, stale, idle, departed) = state.withLock { state in
            let before = state.counters.departed
            let result = state.checkout(key, on: EventLoopID(eventLoop), generation: generation,
                                        unusable: { Self.unusable($0, at: now) }, canShare: Self.canShare,
                                        shareableDial: shareableDial, waiter: waiter)
            return (result.checkout, result.stale, state.idleCount, state.counters.departed.merging(before) { $0 - $1 })
        }
        metrics.upstreamPoolIdle(idle)
        for (departure, count) in departed where count > 0 { metrics.upstreamPoolClosed(reason: departure.rawValue, count: count) }
        for entry in stale {
            // An expired chain's tunnels finish first; anything else found unusable is dead.
            if entry.departure == .certificateExpired { retire(entry.connection) } else { close(entry.connection) }
        }
        switch checkout {
        case .hit(let connection):
            cancelIdleTimer(of: connection.channel)
            metrics.upstreamPoolCheckout(hit: true)
        case .dial: metrics.upstreamPoolCheckout(hit: false)
        case .wait: metrics.upstreamPoolWaited()
        }
        return checkout
    }

    /// A dial for `key` completed, negotiating `h2` or not: whether later CONNECTs to it
    /// wait for a dial in flight (see `UpstreamPoolState.dialed`).
    func dialed(_ key: UpstreamPoolKey, negotiatedHTTP2: Bool) {
        state.withLock { $0.dialed(key, negotiatedHTTP2: negotiatedHTTP2) }
    }

    /// The registered dial for `key` on `eventLoop` is settled: the CONNECTs that waited for
    /// it check out again, now (called on that loop).
    func dialSettled(_ key: UpstreamPoolKey, on eventLoop: any EventLoop) {
        let waiters = state.withLock { $0.dialSettled(key, on: EventLoopID(eventLoop)) }
        waiters.forEach { $0() }
    }

    /// Offers `connection` (its side parked, or, `shared`, an `h2` connection that tunnels
    /// share while it has streams to spare) for `key`; true when the pool kept it, false
    /// when the caller must close it (or, shared, keep it to its own tunnel). Runs on the
    /// connection's event loop.
    func park(_ connection: UpstreamConnection, key: UpstreamPoolKey, generation: UInt64, currentGeneration: UInt64,
              shared: Bool = false, stillTrusted: () -> Bool) -> Bool {
        let eventLoop = connection.channel.eventLoop
        // Decided outside the lock: it runs the pin policy.
        let trusted = generation == currentGeneration || stillTrusted()
        let (outcome, idle) = state.withLock {
            ($0.park(connection, key: key, on: EventLoopID(eventLoop), generation: generation,
                     currentGeneration: currentGeneration, trustedByCurrentList: trusted, shared: shared), $0.idleCount)
        }
        guard case .parked(let id) = outcome else {
            if case .refused(let reason) = outcome { metrics.upstreamPoolNotPooled(reason: reason.rawValue) }
            return false
        }
        metrics.upstreamPoolIdle(idle)
        if shared, case .pooled(let side) = connection.leg.value {
            // Its own timer: it is idle only once its last tunnel left.
            side.share(timeout: settings.idleTimeout) { [self] in _ = remove(id, departure: .idleTimeout) }
        } else {
            let channelID = ObjectIdentifier(connection.channel)
            let timer = eventLoop.assumeIsolated().scheduleTask(in: settings.idleTimeout) { [self] in
                // Counted as fired only while still pending: a timer cancelled as it ran
                // (from another thread) was counted as cancelled.
                idleTimers.withLock { timers in
                    if timers.pending[channelID]?.stay == id {
                        timers.pending[channelID] = nil
                        timers.fired += 1
                    }
                }
                if let expired = remove(id, departure: .idleTimeout) { close(expired) }
            }
            let replaced = idleTimers.withLock { timers in
                timers.scheduled += 1
                return timers.pending.updateValue((id, timer), forKey: channelID)
            }
            // A connection has one idle stay at a time; an earlier stay's timer is moot.
            if let replaced { cancelRemoved(replaced.timer) }
        }
        let channelID = ObjectIdentifier(connection.channel)
        if watched.withLock({ $0.insert(channelID).inserted }) {
            connection.channel.closeFuture.whenComplete { [self] _ in
                _ = watched.withLock { $0.remove(channelID) }
                cancelIdleTimer(of: connection.channel)
                // Whichever stay it is in now (a connection is parked again after each tunnel).
                if let closed = state.withLock({ $0.stayID(of: { $0.channel === connection.channel }) }) {
                    let departure = Self.departureOnClose(connection)
                    _ = remove(closed, departure: departure)
                    if departure == .peerClosed, case .pooled(let side) = connection.leg.value, let idle = side.idleCloseAfter {
                        // The origin closed it as it waited: its keep-alive timeout, learned.
                        keepAlive.closedWhileIdle(key, after: idle)
                    }
                }
            }
        }
        return true
    }

    /// Why a pooled connection closed while it waited (on its loop, as its close completes):
    /// the upstream sent bytes nobody asked for, or it closed.
    private static func departureOnClose(_ connection: UpstreamConnection) -> Departure {
        if case .pooled(let side) = connection.leg.value, side.sentUnsolicitedBytes { return .unsolicitedBytes }
        return .peerClosed
    }

    /// Why a pooled connection cannot carry a new tunnel at `now`, or nil when it can: it
    /// closed, or sent bytes while it waited (its close on the way), or a certificate of its
    /// verified chain has expired since its handshake. Checked at checkout, on its loop.
    private static func unusable(_ connection: UpstreamConnection, at now: Date) -> UpstreamPoolState<UpstreamConnection>.Departure? {
        if case .pooled(let side) = connection.leg.value, side.sentUnsolicitedBytes { return .unsolicitedBytes }
        if !connection.channel.isActive { return .peerClosed }
        if let validUntil = connection.chainValidUntil, validUntil <= now { return .certificateExpired }
        return nil
    }

    /// A shared connection may carry one more tunnel (checked on its loop).
    private static func canShare(_ connection: UpstreamConnection) -> Bool {
        guard case .pooled(let side) = connection.leg.value else { return false }
        return side.reuseBlocker == nil
    }

    /// Counts a connection not kept when its tunnel ended.
    func notPooled(_ reason: UpstreamNotPooledReason) {
        _ = state.withLock { $0.notPooled(reason) }
        metrics.upstreamPoolNotPooled(reason: reason.rawValue)
    }

    /// Ends stay `id` for `departure`, counted; the connection to close, if it was still idle.
    private func remove(_ id: PooledConnectionID, departure: Departure) -> UpstreamConnection? {
        let (removed, idle) = state.withLock { ($0.remove(id, departure: departure), $0.idleCount) }
        guard let removed else { return nil }
        metrics.upstreamPoolIdle(idle)
        metrics.upstreamPoolClosed(reason: departure.rawValue, count: 1)
        return removed
    }

    /// A new list is in force (`generation`): the idle connections it no longer trusts
    /// (`trusts`, on the key's host and the connection's verified chain) are closed.
    func listInstalled(generation: UInt64, trusts: @Sendable (UpstreamPoolKey, UpstreamConnection) -> Bool) {
        let (dropped, idle) = state.withLock { ($0.listInstalled(generation: generation, trusts: trusts), $0.idleCount) }
        metrics.upstreamPoolIdle(idle)
        if !dropped.isEmpty {
            metrics.upstreamPoolClosed(reason: Departure.listChanged.rawValue, count: dropped.count)
            logger.notice("closing pooled upstream connections after a list update", metadata: ["connections": "\(dropped.count)"])
        }
        dropped.forEach(close)
    }

    /// Empties the pool (the gate is shutting down): idle connections close now; shared
    /// ones close once the tunnels on them have finished.
    func closeAll() {
        let all = state.withLock { $0.removeAll() }
        metrics.upstreamPoolIdle(0)
        if !all.isEmpty { metrics.upstreamPoolClosed(reason: Departure.shutdown.rawValue, count: all.count) }
        all.forEach(retire)
    }

    /// Closes `connection` once the tunnels on it (a shared one's) have finished; at once
    /// when none is on it.
    private func retire(_ connection: UpstreamConnection) {
        cancelIdleTimer(of: connection.channel)
        let leg = connection.leg
        connection.channel.eventLoop.execute {
            if case .pooled(let side) = leg.value { side.stopSharing() } else { connection.channel.close(promise: nil) }
        }
    }

    /// Cancels the idle timer of `channel`'s stay, if one is pending: the stay ended.
    private func cancelIdleTimer(of channel: Channel) {
        let pending = idleTimers.withLock { $0.pending.removeValue(forKey: ObjectIdentifier(channel)) }
        if let pending { cancelRemoved(pending.timer) }
    }

    /// Cancels a timer just taken out of `pending` (by whoever took it: only one can).
    private func cancelRemoved(_ timer: Scheduled<Void>) {
        timer.cancel()
        idleTimers.withLock { $0.cancelled += 1 }
    }

    private func close(_ connection: UpstreamConnection) {
        cancelIdleTimer(of: connection.channel)
        let leg = connection.leg
        connection.channel.eventLoop.execute {
            if case .pooled(let side) = leg.value { side.close() } else { connection.channel.close(promise: nil) }
        }
    }
}
