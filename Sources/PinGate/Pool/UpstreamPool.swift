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
/// One pool per event loop (`LoopPool`), each touched only on its loop: its state, its
/// idle timers and its close watches need no lock. Pooled per loop, as nginx keeps one
/// keep-alive cache per worker: a tunnel's legs and router share one loop, and a channel
/// cannot move. What crosses loops is rare and goes to each loop as a task: a new list's
/// re-check, the shutdown; readers of the counts read what each loop published.
final class UpstreamPool: Sendable {
    typealias Departure = UpstreamPoolState<UpstreamConnection>.Departure

    /// How long a connection may wait, and how many may wait per key.
    struct Settings: Sendable, Equatable {
        /// Idle connections close after this long (default 30 s: below the keep-alive
        /// timeouts of common servers, nginx's 75 s among them, so the gate lets go first).
        var idleTimeout: TimeAmount = .seconds(30)
        /// The most idle connections per key (host, port, SNI, address, parent proxy),
        /// split between the event loops: each keeps this over the number of loops, rounded
        /// up (so up to that many more than this in all, one loop short of a whole share each).
        var maximumIdlePerKey = 16
    }

    /// What one loop's pool has done and holds, published by that loop for readers on
    /// other threads (`/status`, the metrics, tests).
    struct Snapshot: Sendable {
        var counters = UpstreamPoolState<UpstreamConnection>.Counters()
        var idleByKey: [UpstreamPoolKey: Int] = [:]
        var idleTimers = IdleTimerCounts()
    }

    /// How many idle timers one loop has pending, and ever scheduled, cancelled and fired.
    struct IdleTimerCounts: Sendable {
        var pending = 0
        var scheduled = 0
        var cancelled = 0
        var fired = 0
    }

    /// One loop's latest `Snapshot`, written only by that loop (after each change) and read
    /// by the rare reader on another thread: never contended between loops.
    final class PublishedSnapshot: Sendable {
        let snapshot = Mutex(Snapshot())
    }

    /// A list put in force: its generation, and whether it trusts a pooled connection.
    struct ListInstall: Sendable {
        let generation: UInt64
        let trusts: @Sendable (UpstreamPoolKey, UpstreamConnection) -> Bool
    }

    /// What every loop's pool shares: counts, as atomics, and the last list put in force.
    final class SharedCounts: Sendable {
        /// The generation of the last list put in force (0: none since start-up), read by
        /// every checkout; `latestInstall` is read only when a loop has not applied it yet.
        let installedGeneration = Atomic<UInt64>(0)
        let latestInstall = Mutex<ListInstall?>(nil)
        /// Connections in the pool over all loops, for the gauge.
        let idle = Atomic<Int>(0)
        /// Calls made from a loop the pool was not built for (none in the gate: every
        /// tunnel runs on the group's loops). Such a call is treated as a miss or a refused
        /// park, and counted here; tests hold it at 0.
        let foreignLoopCalls = Atomic<Int>(0)

        /// Moves the idle count by `delta` and sets the gauge to it. Two loops may set it out
        /// of order, so each checks after its set that the count is still what it set, and
        /// sets again if not: the last to finish leaves the gauge at the count.
        func reportIdle(after delta: Int, to metrics: GateMetrics) {
            var value = idle.add(delta, ordering: .sequentiallyConsistent).newValue
            while true {
                metrics.upstreamPoolIdle(value)
                let now = idle.load(ordering: .sequentiallyConsistent)
                if now == value { return }
                value = now
            }
        }
    }

    let settings: Settings
    /// Each event loop's own pool: its state, its idle timers and its close watches,
    /// touched only on that loop, so no loop ever waits for another's lock (issue 31, item
    /// 6). A connection never leaves its loop.
    private let loops: [EventLoopID: NIOLoopBoundBox<LoopPool>]
    private let published: [EventLoopID: PublishedSnapshot]
    private let shared = SharedCounts()
    private let metrics: GateMetrics
    /// What the pool's connections taught about each origin's keep-alive timeout, shared
    /// with every tunnel (`GateEnvironment.keepAlive`).
    let keepAlive = OriginKeepAlive()

    /// A pool for connections on `eventLoops` (the gate's group). The per-key cap is split
    /// between the loops, rounded up.
    init(settings: Settings, eventLoops: [any EventLoop], metrics: GateMetrics, logger: Logger,
         now: @escaping @Sendable () -> Date = { Date() }) {
        self.settings = settings
        self.metrics = metrics
        let count = max(1, eventLoops.count)
        let share = max(1, (settings.maximumIdlePerKey + count - 1) / count)
        var loops: [EventLoopID: NIOLoopBoundBox<LoopPool>] = [:]
        var published: [EventLoopID: PublishedSnapshot] = [:]
        for eventLoop in eventLoops {
            let outlet = PublishedSnapshot()
            let shared = shared
            let publish: LoopPool.Publish = { state, timers, delta in
                outlet.snapshot.withLock { $0 = Snapshot(counters: state.counters, idleByKey: state.idleByKey, idleTimers: timers) }
                if delta != 0 { shared.reportIdle(after: delta, to: metrics) }
            }
            // Made here, before any tunnel runs, and from then on touched only on its loop.
            loops[EventLoopID(eventLoop)] = NIOLoopBoundBox.makeBoxSendingValue(
                LoopPool(eventLoop: eventLoop, maximumIdlePerKey: share, idleTimeout: settings.idleTimeout, keepAlive: keepAlive,
                         metrics: metrics, logger: logger, now: now, publish: publish),
                eventLoop: eventLoop)
            published[EventLoopID(eventLoop)] = outlet
        }
        self.loops = loops
        self.published = published
    }

    /// The pool of `eventLoop` (the caller runs on it), or nil for a loop it was not built for.
    private func local(_ eventLoop: any EventLoop) -> LoopPool? {
        guard let box = loops[EventLoopID(eventLoop)] else {
            shared.foreignLoopCalls.add(1, ordering: .relaxed)
            return nil
        }
        return box.value
    }

    /// Calls from a loop the pool was not built for (tests: 0).
    var callsFromForeignLoops: Int { shared.foreignLoopCalls.load(ordering: .relaxed) }

    private var snapshots: [Snapshot] { published.values.map { $0.snapshot.withLock { $0 } } }

    /// What the pool has done so far, over all loops.
    var counters: UpstreamPoolState<UpstreamConnection>.Counters {
        snapshots.reduce(into: UpstreamPoolState<UpstreamConnection>.Counters()) { sum, snapshot in
            let counters = snapshot.counters
            sum.hits += counters.hits
            sum.misses += counters.misses
            sum.waitedForDial += counters.waitedForDial
            sum.parked += counters.parked
            sum.notPooled.merge(counters.notPooled, uniquingKeysWith: +)
            sum.departed.merge(counters.departed, uniquingKeysWith: +)
        }
    }

    /// How many connections wait now.
    var idleCount: Int { snapshots.reduce(0) { $0 + $1.idleByKey.values.reduce(0, +) } }

    /// Idle connections per `host:port`, for `/status`.
    var idleByHost: [String: Int] {
        var byHost: [String: Int] = [:]
        for snapshot in snapshots {
            for (key, count) in snapshot.idleByKey { byHost[key.description, default: 0] += count }
        }
        return byHost
    }

    /// How many idle timers are pending, scheduled, cancelled and fired so far, over all loops.
    var idleTimerCounts: (pending: Int, scheduled: Int, cancelled: Int, fired: Int) {
        snapshots.reduce(into: (0, 0, 0, 0)) { sum, snapshot in
            let timers = snapshot.idleTimers
            sum = (sum.0 + timers.pending, sum.1 + timers.scheduled, sum.2 + timers.cancelled, sum.3 + timers.fired)
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
        guard let pool = local(eventLoop) else {
            metrics.upstreamPoolCheckout(hit: false)
            return .dial(registered: false)
        }
        // A list put in force whose task has not reached this loop yet: applied here first,
        // so the connections it still trusts are re-stamped, not dropped as another
        // generation's (the store moves its generation before it tells the pool).
        if shared.installedGeneration.load(ordering: .acquiring) > pool.appliedGeneration,
           let install = shared.latestInstall.withLock({ $0 }) {
            pool.apply(install)
        }
        return pool.checkout(key, generation: generation, shareableDial: shareableDial, resume: resume)
    }

    /// A dial for `key` on `eventLoop` completed, negotiating `h2` or not: whether later
    /// CONNECTs to it on that loop wait for a dial in flight (see `UpstreamPoolState.dialed`).
    func dialed(_ key: UpstreamPoolKey, on eventLoop: any EventLoop, negotiatedHTTP2: Bool) {
        local(eventLoop)?.dialed(key, negotiatedHTTP2: negotiatedHTTP2)
    }

    /// The registered dial for `key` on `eventLoop` is settled: the CONNECTs that waited for
    /// it check out again, now (called on that loop).
    func dialSettled(_ key: UpstreamPoolKey, on eventLoop: any EventLoop) {
        local(eventLoop)?.dialSettled(key)
    }

    /// Offers `connection` (its side parked, or, `shared`, an `h2` connection that tunnels
    /// share while it has streams to spare) for `key`; true when the pool kept it, false
    /// when the caller must close it (or, shared, keep it to its own tunnel). Runs on the
    /// connection's event loop.
    func park(_ connection: UpstreamConnection, key: UpstreamPoolKey, generation: UInt64, currentGeneration: UInt64,
              shared: Bool = false, stillTrusted: () -> Bool) -> Bool {
        guard let pool = local(connection.channel.eventLoop) else {
            notPooledOnForeignLoop()
            return false
        }
        return pool.park(connection, key: key, generation: generation, currentGeneration: currentGeneration,
                         shared: shared, stillTrusted: stillTrusted)
    }

    /// Counts a connection not kept when its tunnel ended (on the tunnel's loop).
    func notPooled(_ reason: UpstreamNotPooledReason, on eventLoop: any EventLoop) {
        guard let pool = local(eventLoop) else {
            notPooledOnForeignLoop()
            return
        }
        pool.notPooled(reason)
    }

    private func notPooledOnForeignLoop() {
        metrics.upstreamPoolNotPooled(reason: UpstreamNotPooledReason.full.rawValue)
    }

    /// A new list is in force (`generation`): the idle connections it no longer trusts
    /// (`trusts`, on the key's host and the connection's verified chain) are closed, each
    /// loop's on its loop.
    func listInstalled(generation: UInt64, trusts: @escaping @Sendable (UpstreamPoolKey, UpstreamConnection) -> Bool) {
        let install = ListInstall(generation: generation, trusts: trusts)
        shared.latestInstall.withLock { latest in
            if (latest?.generation ?? 0) < generation { latest = install }
        }
        shared.installedGeneration.store(max(shared.installedGeneration.load(ordering: .acquiring), generation), ordering: .releasing)
        for box in loops.values {
            box.eventLoop.execute { box.value.apply(install) }
        }
    }

    /// Empties the pool (the gate is shutting down): idle connections close now; shared
    /// ones close once the tunnels on them have finished. Each loop empties its own.
    func closeAll() {
        for box in loops.values {
            box.eventLoop.execute { box.value.closeAll() }
        }
    }
}

/// One event loop's pool: the state (`UpstreamPoolState`), the idle timers and the close
/// watches of the connections on that loop. Only ever touched on its loop, so it has no
/// lock; what it counts it publishes after each change (`publish`).
private final class LoopPool {
    typealias Departure = UpstreamPoolState<UpstreamConnection>.Departure

    let eventLoop: any EventLoop
    private var state: UpstreamPoolState<UpstreamConnection>
    private let idleTimeout: TimeAmount
    /// The idle timer of each connection parked idle (not shared), by channel, with its
    /// stay: cancelled when the stay ends another way (taken, closed, dropped). Left to
    /// fire, a busy pool kept one pending 30 s timer per tunnel it served: 600 sequential
    /// tunnels a second held about 18,000 scheduled tasks, 3.8 MB of the gate's RSS.
    private var idleTimers: [ObjectIdentifier: (stay: PooledConnectionID, timer: Scheduled<Void>)] = [:]
    private var timerCounts = UpstreamPool.IdleTimerCounts()
    /// Channels whose close the pool already watches (one watch per connection, however
    /// often it is parked).
    private var watched: Set<ObjectIdentifier> = []
    private let metrics: GateMetrics
    private let logger: Logger
    /// The gate's clock (the one its verdicts use), for the chains' expiry.
    private let now: @Sendable () -> Date
    /// What the pool's connections teach about each origin's keep-alive timeout.
    private let keepAlive: OriginKeepAlive
    /// Publishes the state's counts, the timers' and the change in idle connections.
    typealias Publish = @Sendable (UpstreamPoolState<UpstreamConnection>, UpstreamPool.IdleTimerCounts, Int) -> Void
    private let publish: Publish

    init(eventLoop: any EventLoop, maximumIdlePerKey: Int, idleTimeout: TimeAmount, keepAlive: OriginKeepAlive,
         metrics: GateMetrics, logger: Logger, now: @escaping @Sendable () -> Date, publish: @escaping Publish) {
        self.eventLoop = eventLoop
        self.state = UpstreamPoolState(maximumIdlePerKey: maximumIdlePerKey)
        self.idleTimeout = idleTimeout
        self.keepAlive = keepAlive
        self.metrics = metrics
        self.logger = logger
        self.now = now
        self.publish = publish
    }

    /// Publishes after a change that moved the idle count from `before`.
    private func changed(idleBefore before: Int) {
        timerCounts.pending = idleTimers.count
        publish(state, timerCounts, state.idleCount - before)
    }

    func checkout(_ key: UpstreamPoolKey, generation: UInt64, shareableDial: Bool,
                  resume: (() -> Void)?) -> UpstreamPoolState<UpstreamConnection>.Checkout {
        // Run on this loop, by this loop: the waiter needs no hop.
        let waiter: (@Sendable () -> Void)? = resume.map { resume in
            let bound = NIOLoopBound(resume, eventLoop: eventLoop)
            return { bound.value() }
        }
        let before = state.idleCount
        let departedBefore = state.counters.departed
        let now = self.now()
        let (checkout, stale) = state.checkout(key, on: EventLoopID(eventLoop), generation: generation,
                                               unusable: { Self.unusable($0, at: now) }, canShare: Self.canShare,
                                               shareableDial: shareableDial, waiter: waiter)
        for (departure, count) in state.counters.departed.merging(departedBefore, uniquingKeysWith: -) where count > 0 {
            metrics.upstreamPoolClosed(reason: departure.rawValue, count: count)
        }
        for entry in stale {
            // An expired chain's tunnels finish first, and so do a shared connection's when
            // another list is in force (the tunnels it no longer trusts are closed by its
            // own check of each tunnel); anything else found unusable is dead.
            if entry.departure == .certificateExpired || (entry.departure == .listChanged && Self.isShared(entry.connection)) {
                retire(entry.connection)
            } else {
                close(entry.connection)
            }
        }
        switch checkout {
        case .hit(let connection):
            // A shared connection's timer stops when a tunnel joins it (`used`): a hit whose
            // join then fails leaves it running, so the connection still times out.
            if !Self.isShared(connection) { cancelIdleTimer(of: connection.channel) }
            metrics.upstreamPoolCheckout(hit: true)
        case .dial: metrics.upstreamPoolCheckout(hit: false)
        case .wait: metrics.upstreamPoolWaited()
        }
        changed(idleBefore: before)
        return checkout
    }

    func dialed(_ key: UpstreamPoolKey, negotiatedHTTP2: Bool) {
        state.dialed(key, negotiatedHTTP2: negotiatedHTTP2)
    }

    func dialSettled(_ key: UpstreamPoolKey) {
        state.dialSettled(key, on: EventLoopID(eventLoop)).forEach { $0() }
    }

    func park(_ connection: UpstreamConnection, key: UpstreamPoolKey, generation: UInt64, currentGeneration: UInt64,
              shared: Bool, stillTrusted: () -> Bool) -> Bool {
        let trusted = generation == currentGeneration || stillTrusted()
        let before = state.idleCount
        let outcome = state.park(connection, key: key, on: EventLoopID(eventLoop), generation: generation,
                                 currentGeneration: currentGeneration, trustedByCurrentList: trusted, shared: shared)
        guard case .parked(let id) = outcome else {
            if case .refused(let reason) = outcome { metrics.upstreamPoolNotPooled(reason: reason.rawValue) }
            changed(idleBefore: before)
            return false
        }
        let channelID = ObjectIdentifier(connection.channel)
        if shared, case .pooled(let side) = connection.leg.value {
            // Idle only once its last tunnel left: the timer runs while no tunnel is on it.
            // The closures name the connection by its channel's identity only: the side
            // keeps them, and the connection (which holds the side) must not be kept by them.
            side.share(unused: { [self] in armIdleTimer(for: channelID, stay: id) },
                       used: { [self] in
                           cancelIdleTimer(of: channelID)
                           changed(idleBefore: state.idleCount)
                       })
        } else {
            armIdleTimer(for: channelID, stay: id)
        }
        if watched.insert(channelID).inserted {
            connection.channel.closeFuture.assumeIsolated().whenComplete { [self] _ in
                watched.remove(channelID)
                cancelIdleTimer(of: connection.channel)
                // Whichever stay it is in now (a connection is parked again after each tunnel).
                if let closed = state.stayID(of: { $0.channel === connection.channel }) {
                    let departure = Self.departureOnClose(connection)
                    _ = remove(closed, departure: departure)
                    if departure == .peerClosed, case .pooled(let side) = connection.leg.value, let idle = side.idleCloseAfter {
                        // The origin closed it as it waited: its keep-alive timeout, learned.
                        keepAlive.closedWhileIdle(key, after: idle)
                    }
                } else {
                    changed(idleBefore: state.idleCount)
                }
            }
        }
        changed(idleBefore: before)
        return true
    }

    /// Starts the idle timer of stay `stay` of the connection on channel `channelID`: when it fires with the stay
    /// still on, the stay ends (`idle-timeout`) and the connection closes.
    private func armIdleTimer(for channelID: ObjectIdentifier, stay id: PooledConnectionID) {
        let timer = eventLoop.assumeIsolated().scheduleTask(in: idleTimeout) { [self] in
            guard idleTimers[channelID]?.stay == id else { return }
            idleTimers[channelID] = nil
            timerCounts.fired += 1
            if let expired = remove(id, departure: .idleTimeout) { close(expired) } else { changed(idleBefore: state.idleCount) }
        }
        timerCounts.scheduled += 1
        // A connection has one idle stay at a time; an earlier stay's timer is moot.
        if let replaced = idleTimers.updateValue((id, timer), forKey: channelID) { cancel(replaced.timer) }
        changed(idleBefore: state.idleCount)
    }

    func notPooled(_ reason: UpstreamNotPooledReason) {
        state.notPooled(reason)
        metrics.upstreamPoolNotPooled(reason: reason.rawValue)
        changed(idleBefore: state.idleCount)
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
    private static func unusable(_ connection: UpstreamConnection, at now: Date) -> Departure? {
        if case .pooled(let side) = connection.leg.value, side.sentUnsolicitedBytes { return .unsolicitedBytes }
        if !connection.channel.isActive { return .peerClosed }
        if let validUntil = connection.chainValidUntil, validUntil <= now { return .certificateExpired }
        return nil
    }

    /// True for an `h2` connection, which stays in the pool while tunnels share it.
    private static func isShared(_ connection: UpstreamConnection) -> Bool {
        if case .pooled(let side) = connection.leg.value { return side.isHTTP2 }
        return false
    }

    /// A shared connection may carry one more tunnel (checked on its loop).
    private static func canShare(_ connection: UpstreamConnection) -> Bool {
        guard case .pooled(let side) = connection.leg.value else { return false }
        return side.reuseBlocker == nil
    }

    /// Ends stay `id` for `departure`, counted; the connection to close, if it was still idle.
    private func remove(_ id: PooledConnectionID, departure: Departure) -> UpstreamConnection? {
        let before = state.idleCount
        let removed = state.remove(id, departure: departure)
        if removed != nil { metrics.upstreamPoolClosed(reason: departure.rawValue, count: 1) }
        changed(idleBefore: before)
        return removed
    }

    /// The generation of the last list this loop's connections were checked against.
    private(set) var appliedGeneration: UInt64 = 0

    /// Checks the idle connections against a list put in force, once per list (by its
    /// task, or by the first checkout that comes before the task).
    func apply(_ install: UpstreamPool.ListInstall) {
        guard install.generation > appliedGeneration else { return }
        appliedGeneration = install.generation
        let before = state.idleCount
        let dropped = state.listInstalled(generation: install.generation, trusts: install.trusts)
        if !dropped.isEmpty {
            metrics.upstreamPoolClosed(reason: Departure.listChanged.rawValue, count: dropped.count)
            logger.notice("closing pooled upstream connections after a list update", metadata: ["connections": "\(dropped.count)"])
        }
        dropped.forEach(close)
        changed(idleBefore: before)
    }

    func closeAll() {
        let before = state.idleCount
        let all = state.removeAll()
        if !all.isEmpty { metrics.upstreamPoolClosed(reason: Departure.shutdown.rawValue, count: all.count) }
        all.forEach(retire)
        changed(idleBefore: before)
    }

    /// Closes `connection` once the tunnels on it (a shared one's) have finished; at once
    /// when none is on it.
    private func retire(_ connection: UpstreamConnection) {
        cancelIdleTimer(of: connection.channel)
        if case .pooled(let side) = connection.leg.value { side.stopSharing() } else { connection.channel.close(promise: nil) }
    }

    /// Cancels the idle timer of `channel`'s stay, if one is pending: the stay ended.
    private func cancelIdleTimer(of channel: Channel) {
        cancelIdleTimer(of: ObjectIdentifier(channel))
    }

    private func cancelIdleTimer(of channelID: ObjectIdentifier) {
        if let pending = idleTimers.removeValue(forKey: channelID) { cancel(pending.timer) }
    }

    private func cancel(_ timer: Scheduled<Void>) {
        timer.cancel()
        timerCounts.cancelled += 1
    }

    private func close(_ connection: UpstreamConnection) {
        cancelIdleTimer(of: connection.channel)
        if case .pooled(let side) = connection.leg.value { side.close() } else { connection.channel.close(promise: nil) }
    }
}
