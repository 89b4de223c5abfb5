import PinGateHTTP

/// The pool of idle, verified upstream connections, as a value (the gate keeps one per
/// event loop, `UpstreamPool`'s `LoopPool`; the value itself can hold several loops'): which connection waits
/// under which key on which event loop, under which list generation, and what became of
/// each one. It does no I/O and keeps no clock: the gate's `UpstreamPool` closes what it
/// says to close, and runs the idle timers. `Connection` is whatever the caller pools.
///
/// Two kinds of entry: an idle connection, which carries one tunnel at a time and leaves
/// the pool when taken (HTTP/1.1); and a shared one, which stays in the pool while tunnels
/// use it, handed out as long as `canShare` says it has room (`h2`: streams to spare).
///
/// Invariants (checked by `UpstreamPoolStateTests` over random sequences):
/// - every connection parked is, exactly once, taken (idle ones), refused at its park, or
///   given back to be closed (idle timeout, peer close, list change, shutdown);
/// - no key holds more than `maximumIdlePerKey` idle connections across the loops;
/// - a connection is handed out only on its own loop, and only under the generation it
///   was verified (or re-verified) under;
/// - at most one dial per key and loop is registered for others to wait on, and each
///   waiter is handed back exactly once, when that dial is settled.
struct UpstreamPoolState<Connection> {
    /// Why a connection left the pool without carrying another tunnel.
    enum Departure: String, CaseIterable, Sendable {
        /// Idle for longer than the pool's idle timeout.
        case idleTimeout = "idle-timeout"
        /// The upstream closed it (or it broke) while it waited.
        case peerClosed = "peer-closed"
        /// The upstream sent bytes while it waited, when no request was outstanding: out of
        /// step, it was closed (what it sent would have been taken for the next tunnel's answer).
        case unsolicitedBytes = "unsolicited-bytes"
        /// A new list no longer trusts it.
        case listChanged = "list-changed"
        /// A certificate of the chain its handshake verified has expired since: a CONNECT
        /// admitted on it would be admitted on a chain a new handshake would refuse.
        case certificateExpired = "certificate-expired"
        /// The gate shut down.
        case shutdown = "shutdown"
    }

    /// An entry that left the pool because it could not serve, and why: handed back for
    /// the caller to close (or, its chain expired, to retire once its tunnels finish).
    struct Stale {
        let connection: Connection
        let departure: Departure
    }

    /// What `park` did.
    enum ParkOutcome {
        /// Kept: it waits as `id` (the idle timer and the close watch name it).
        case parked(PooledConnectionID)
        /// Not kept, for `reason`: the caller closes it.
        case refused(UpstreamNotPooledReason)
    }

    /// Counts, for `/status` and the metrics.
    struct Counters: Equatable, Sendable {
        /// CONNECTs admitted on a pooled connection: no upstream handshake.
        var hits = 0
        /// CONNECTs that found none and opened a new connection.
        var misses = 0
        /// CONNECTs that found none but another tunnel's dial to the same key in flight, and
        /// waited for it instead of dialling. Each checks out again when the wait ends and
        /// counts then as a hit or a miss, unless its client left meanwhile.
        var waitedForDial = 0
        /// Connections put in the pool.
        var parked = 0
        /// Connections not kept when their tunnel ended, by reason.
        var notPooled: [UpstreamNotPooledReason: Int] = [:]
        /// Connections that left the pool without carrying another tunnel, by why.
        var departed: [Departure: Int] = [:]
    }

    private struct Slot: Hashable {
        let key: UpstreamPoolKey
        let loop: EventLoopID
    }

    private struct Entry {
        let id: PooledConnectionID
        let connection: Connection
        var generation: UInt64
        /// Stays in the pool when taken (tunnels share it).
        let shared: Bool
    }

    /// What `checkout` found.
    enum Checkout {
        /// A pooled connection: no handshake.
        case hit(Connection)
        /// None, but a dial to the same key on the same loop is in flight whose connection
        /// may be shared: the waiter runs once it is settled (`dialSettled`), to check out
        /// again, without waiting a second time.
        case wait
        /// None: the caller dials. `registered` when its dial is the one others may wait
        /// for; the caller must then report it settled (`dialSettled`), whatever happens.
        case dial(registered: Bool)
    }

    /// The most idle connections one key may hold, over all the loops this value holds.
    let maximumIdlePerKey: Int
    /// Idle connections by key and loop, the most recently parked last (taken first: the
    /// warmest, the least likely to have been closed by its server meanwhile).
    private var idle: [Slot: [Entry]] = [:]
    private var slotByID: [PooledConnectionID: Slot] = [:]
    private var idlePerKey: [UpstreamPoolKey: Int] = [:]
    private var nextID: UInt64 = 1
    private(set) var counters = Counters()
    /// Dials in flight whose connection may come to be shared (`h2` offered), one per
    /// key and loop, with the checkouts waiting for them.
    private var dials: [Slot: [@Sendable () -> Void]] = [:]
    /// Whether each key's last dial negotiated `h2`. A CONNECT waits for a dial in flight
    /// only while that may give a shared connection: for an origin known to answer with
    /// HTTP/1.1 the wait buys nothing, and releasing a burst of waiters at once (they all
    /// dial when the first connection turns out HTTP/1.1) would hit its listen backlog with
    /// them together instead of as they came.
    private var spokeHTTP2: [UpstreamPoolKey: Bool] = [:]
    /// The most keys `spokeHTTP2` remembers (it is emptied beyond: a hint, not state).
    static var rememberedProtocols: Int { 4096 }

    init(maximumIdlePerKey: Int) {
        self.maximumIdlePerKey = maximumIdlePerKey
    }

    /// How many connections are in the pool now (idle ones, and shared ones in use or not).
    var idleCount: Int { slotByID.count }

    /// How many wait for `key`, over all the loops this value holds.
    func idleCount(for key: UpstreamPoolKey) -> Int { idlePerKey[key] ?? 0 }

    /// The idle connections per key, for `/status`.
    var idleByKey: [UpstreamPoolKey: Int] { idlePerKey }

    /// A connection for `key` on `loop` verified under `generation`, counted as a hit; or
    /// nil, counted as a miss. The most recently parked entry that fits is chosen: an idle
    /// one leaves the pool, a shared one stays (if `canShare` says it has room). Entries met
    /// on the way that cannot serve leave the pool and are handed back in `stale`, to be
    /// closed: those of another generation (a list was put in force between the caller's
    /// read of the generation and now) and those `unusable` gives a reason for (closed,
    /// their close on its way to the loop; or their chain expired).
    mutating func take(_ key: UpstreamPoolKey, on loop: EventLoopID, generation: UInt64,
                       unusable: (Connection) -> Departure? = { _ in nil },
                       canShare: (Connection) -> Bool = { _ in true }) -> (connection: Connection?, stale: [Stale]) {
        let (checkout, stale) = checkout(key, on: loop, generation: generation, unusable: unusable, canShare: canShare,
                                         shareableDial: false, waiter: nil)
        guard case .hit(let connection) = checkout else { return (nil, stale) }
        return (connection, stale)
    }

    /// `take`, for a CONNECT that could share a connection another tunnel is dialling
    /// (`waiter` given: it offers `h2`, and has not waited already). With nothing pooled
    /// and such a dial in flight on this loop, `waiter` is kept and `.wait` returned: the
    /// first CONNECTs of a burst then share the first `h2` connection instead of each
    /// dialling its own. `shareableDial`: the caller's own dial, if it makes one, may be
    /// shared (it offers `h2`), so others may wait for it.
    mutating func checkout(_ key: UpstreamPoolKey, on loop: EventLoopID, generation: UInt64,
                           unusable: (Connection) -> Departure? = { _ in nil },
                           canShare: (Connection) -> Bool = { _ in true },
                           shareableDial: Bool, waiter: (@Sendable () -> Void)?) -> (checkout: Checkout, stale: [Stale]) {
        let found = find(key, on: loop, generation: generation, unusable: unusable, canShare: canShare)
        if let connection = found.connection { return (.hit(connection), found.stale) }
        let slot = Slot(key: key, loop: loop)
        let mayShare = shareableDial && spokeHTTP2[key] != false
        if let waiter, mayShare, dials[slot] != nil {
            dials[slot]?.append(waiter)
            counters.waitedForDial += 1
            return (.wait, found.stale)
        }
        counters.misses += 1
        guard mayShare, dials[slot] == nil else { return (.dial(registered: false), found.stale) }
        dials[slot] = []
        return (.dial(registered: true), found.stale)
    }

    /// The registered dial for `key` on `loop` is settled (its connection is in the pool to
    /// share, or will not be): the checkouts that waited for it, to run (outside any lock).
    mutating func dialSettled(_ key: UpstreamPoolKey, on loop: EventLoopID) -> [@Sendable () -> Void] {
        dials.removeValue(forKey: Slot(key: key, loop: loop)) ?? []
    }

    /// A dial for `key` completed, negotiating `h2` or not (any dial: registered or not).
    mutating func dialed(_ key: UpstreamPoolKey, negotiatedHTTP2: Bool) {
        if spokeHTTP2[key] == nil && spokeHTTP2.count >= Self.rememberedProtocols { spokeHTTP2.removeAll(keepingCapacity: true) }
        spokeHTTP2[key] = negotiatedHTTP2
    }

    /// Checkouts waiting for a dial now (tests).
    var waitingCheckouts: Int { dials.values.reduce(0) { $0 + $1.count } }

    private mutating func find(_ key: UpstreamPoolKey, on loop: EventLoopID, generation: UInt64,
                               unusable: (Connection) -> Departure?,
                               canShare: (Connection) -> Bool) -> (connection: Connection?, stale: [Stale]) {
        let slot = Slot(key: key, loop: loop)
        var stale: [Stale] = []
        var index = (idle[slot]?.count ?? 0) - 1
        while index >= 0, let entry = idle[slot]?[index] {
            let departure: Departure? = entry.generation != generation ? .listChanged : unusable(entry.connection)
            if let departure {
                idle[slot]?.remove(at: index)
                forget(entry.id, slot: slot)
                counters.departed[departure, default: 0] += 1
                stale.append(Stale(connection: entry.connection, departure: departure))
            } else if !entry.shared {
                idle[slot]?.remove(at: index)
                forget(entry.id, slot: slot)
                counters.hits += 1
                return (entry.connection, stale)
            } else if canShare(entry.connection) {
                counters.hits += 1
                return (entry.connection, stale)
            }
            index -= 1
        }
        return (nil, stale)
    }

    /// Offers `connection`, whose tunnel ended with it reusable, for `key` on `loop`. It was
    /// verified under `generation`; when another list is in force now (`currentGeneration`),
    /// it is kept only if `trustedByCurrentList` (the list in force trusts it too).
    mutating func park(_ connection: Connection, key: UpstreamPoolKey, on loop: EventLoopID, generation: UInt64,
                       currentGeneration: UInt64, trustedByCurrentList: Bool, shared: Bool = false) -> ParkOutcome {
        if generation != currentGeneration && !trustedByCurrentList { return notPooled(.listChanged) }
        if idleCount(for: key) >= maximumIdlePerKey { return notPooled(.full) }
        let id = PooledConnectionID(rawValue: nextID)
        nextID += 1
        let slot = Slot(key: key, loop: loop)
        idle[slot, default: []].append(Entry(id: id, connection: connection, generation: currentGeneration, shared: shared))
        slotByID[id] = slot
        idlePerKey[key, default: 0] += 1
        counters.parked += 1
        return .parked(id)
    }

    /// Counts a connection not kept when its tunnel ended, and says so.
    @discardableResult
    mutating func notPooled(_ reason: UpstreamNotPooledReason) -> ParkOutcome {
        counters.notPooled[reason, default: 0] += 1
        return .refused(reason)
    }

    /// Removes stay `id` for `departure` (its idle timer fired, its connection closed):
    /// the connection to close, or nil when it had already left (taken, or closed another
    /// way), which is not an error.
    mutating func remove(_ id: PooledConnectionID, departure: Departure) -> Connection? {
        guard let slot = slotByID[id], let index = idle[slot]?.firstIndex(where: { $0.id == id }),
              let entry = idle[slot]?.remove(at: index) else { return nil }
        forget(id, slot: slot)
        counters.departed[departure, default: 0] += 1
        return entry.connection
    }

    /// A new list is in force as `generation`: each idle connection it still trusts is
    /// stamped with it; the others are handed back, to be closed.
    mutating func listInstalled(generation: UInt64, trusts: (UpstreamPoolKey, Connection) -> Bool) -> [Connection] {
        var dropped: [Connection] = []
        for (slot, entries) in idle {
            var kept: [Entry] = []
            for var entry in entries {
                if trusts(slot.key, entry.connection) {
                    entry.generation = generation
                    kept.append(entry)
                } else {
                    dropped.append(entry.connection)
                    slotByID[entry.id] = nil
                    idlePerKey[slot.key, default: 1] -= 1
                    counters.departed[.listChanged, default: 0] += 1
                }
            }
            idle[slot] = kept.isEmpty ? nil : kept
        }
        idlePerKey = idlePerKey.filter { $0.value > 0 }
        return dropped
    }

    /// Empties the pool (shutdown): every idle connection, to be closed.
    mutating func removeAll() -> [Connection] {
        let all = idle.values.flatMap { $0.map(\.connection) }
        counters.departed[.shutdown, default: 0] += all.count
        idle = [:]
        slotByID = [:]
        idlePerKey = [:]
        return all
    }

    /// The stay of the idle connection `matches` picks, if one is idle.
    func stayID(of matches: (Connection) -> Bool) -> PooledConnectionID? {
        for entries in idle.values {
            if let entry = entries.first(where: { matches($0.connection) }) { return entry.id }
        }
        return nil
    }

    private mutating func forget(_ id: PooledConnectionID, slot: Slot) {
        slotByID[id] = nil
        if idle[slot]?.isEmpty == true { idle[slot] = nil }
        let left = (idlePerKey[slot.key] ?? 0) - 1
        idlePerKey[slot.key] = left > 0 ? left : nil
    }
}
