import NIOCore
import NIOEmbedded
import PinGateHTTP
import PinGateNIO
import PropertyBased
import Synchronization
import Testing
@testable import PinGate
@testable import pingate
import PinGateTestSupport

/// The pool's logic on its own: no sockets, connections are numbers, loops are embedded.
@Suite("The upstream pool's bookkeeping")
struct UpstreamPoolStateTests {
    typealias State = UpstreamPoolState<Int>

    static let configuration = GateConfiguration()
    static let pay = UpstreamPoolKey(host: "pay.example.test", port: 443, configuration: configuration, alpnOffer: ["h2", "http/1.1"])
    static let shop = UpstreamPoolKey(host: "shop.example.test", port: 443, configuration: configuration, alpnOffer: ["h2", "http/1.1"])
    static let loopA = EmbeddedEventLoop()
    static let loopB = EmbeddedEventLoop()

    @Test("a parked connection is taken by the next CONNECT with the same key on the same loop, once; another key or loop misses")
    func takeMatchesKeyAndLoop() {
        var state = State(maximumIdlePerKey: 4)
        let a = EventLoopID(Self.loopA), b = EventLoopID(Self.loopB)
        guard case .parked = state.park(1, key: Self.pay, on: a, generation: 1, currentGeneration: 1, trustedByCurrentList: false) else {
            Issue.record("not parked")
            return
        }
        #expect(state.take(Self.shop, on: a, generation: 1).connection == nil)
        #expect(state.take(Self.pay, on: b, generation: 1).connection == nil)
        #expect(state.take(Self.pay, on: a, generation: 1).connection == 1)
        #expect(state.take(Self.pay, on: a, generation: 1).connection == nil)
        #expect(state.counters.hits == 1 && state.counters.misses == 3)
        #expect(state.idleCount == 0)
    }

    @Test("the key tells apart port, SNI, --resolve address, parent proxy and ALPN offer; host case and a trailing dot do not")
    func keyFields() throws {
        var configuration = GateConfiguration()
        let base = UpstreamPoolKey(host: "Pay.Example.Test.", port: 443, configuration: configuration, alpnOffer: ["h2"])
        #expect(base == UpstreamPoolKey(host: "pay.example.test", port: 443, configuration: configuration, alpnOffer: ["h2"]))
        #expect(base.serverName == "pay.example.test")
        #expect(UpstreamPoolKey(host: "192.0.2.7", port: 443, configuration: configuration, alpnOffer: ["h2"]).serverName == nil)
        #expect(base != UpstreamPoolKey(host: "pay.example.test", port: 8443, configuration: configuration, alpnOffer: ["h2"]))
        #expect(base != UpstreamPoolKey(host: "pay.example.test", port: 443, configuration: configuration, alpnOffer: ["http/1.1"]))
        configuration.resolveOverrides = [try ResolveOverride(parsing: "pay.example.test:443:127.0.0.1")]
        #expect(base != UpstreamPoolKey(host: "pay.example.test", port: 443, configuration: configuration, alpnOffer: ["h2"]))
        configuration = GateConfiguration()
        configuration.upstreamProxy = try ParentProxy(parsing: "http://proxy.corp:3128")
        #expect(base != UpstreamPoolKey(host: "pay.example.test", port: 443, configuration: configuration, alpnOffer: ["h2"]))
    }

    @Test("a connection verified under an older list is kept only if the list in force trusts it; the cap per key holds over loops")
    func parkRules() {
        var state = State(maximumIdlePerKey: 2)
        let a = EventLoopID(Self.loopA), b = EventLoopID(Self.loopB)
        if case .refused(let reason) = state.park(1, key: Self.pay, on: a, generation: 1, currentGeneration: 2, trustedByCurrentList: false) {
            #expect(reason == .listChanged)
        } else {
            Issue.record("a connection the new list does not trust was parked")
        }
        guard case .parked = state.park(2, key: Self.pay, on: a, generation: 1, currentGeneration: 2, trustedByCurrentList: true) else {
            Issue.record("a connection the new list trusts was refused")
            return
        }
        // Re-stamped with the generation in force.
        #expect(state.take(Self.pay, on: a, generation: 1).connection == nil)
        _ = state.park(2, key: Self.pay, on: a, generation: 2, currentGeneration: 2, trustedByCurrentList: false)
        _ = state.park(3, key: Self.pay, on: b, generation: 2, currentGeneration: 2, trustedByCurrentList: false)
        if case .refused(let reason) = state.park(4, key: Self.pay, on: b, generation: 2, currentGeneration: 2, trustedByCurrentList: false) {
            #expect(reason == .full)
        } else {
            Issue.record("the per-key cap did not hold")
        }
        guard case .parked = state.park(5, key: Self.shop, on: b, generation: 2, currentGeneration: 2, trustedByCurrentList: false) else {
            Issue.record("another key was refused")
            return
        }
        #expect(state.counters.notPooled == [.listChanged: 1, .full: 1])
        #expect(state.idleCount(for: Self.pay) == 2 && state.idleCount == 3)
    }

    @Test("the most recently parked connection is taken first; a timer or a close removes a stay once, and a stale id is no error")
    func lifoAndRemoval() {
        var state = State(maximumIdlePerKey: 8)
        let a = EventLoopID(Self.loopA)
        var ids: [PooledConnectionID] = []
        for connection in 1...3 {
            if case .parked(let id) = state.park(connection, key: Self.pay, on: a, generation: 1, currentGeneration: 1,
                                                 trustedByCurrentList: false) { ids.append(id) }
        }
        #expect(state.remove(ids[0], departure: .idleTimeout) == 1)
        #expect(state.remove(ids[0], departure: .idleTimeout) == nil)
        #expect(state.take(Self.pay, on: a, generation: 1).connection == 3)
        // Taken: its timer firing later finds nothing.
        #expect(state.remove(ids[2], departure: .idleTimeout) == nil)
        #expect(state.remove(ids[1], departure: .peerClosed) == 2)
        #expect(state.idleCount == 0)
        #expect(state.counters.departed == [.idleTimeout: 1, .peerClosed: 1])
    }

    @Test("a new list keeps (and re-stamps) what it trusts and hands back the rest; a take under the old generation finds stale entries and hands them back")
    func listChange() {
        var state = State(maximumIdlePerKey: 8)
        let a = EventLoopID(Self.loopA)
        _ = state.park(1, key: Self.pay, on: a, generation: 1, currentGeneration: 1, trustedByCurrentList: false)
        _ = state.park(2, key: Self.shop, on: a, generation: 1, currentGeneration: 1, trustedByCurrentList: false)
        let dropped = state.listInstalled(generation: 2) { key, _ in key == Self.pay }
        #expect(dropped == [2])
        #expect(state.idleCount == 1 && state.idleCount(for: Self.shop) == 0)
        let taken = state.take(Self.pay, on: a, generation: 3)
        #expect(taken.connection == nil && taken.stale.map(\.connection) == [1] && taken.stale.map(\.departure) == [.listChanged])
        #expect(state.counters.departed[.listChanged] == 2)
        #expect(state.idleCount == 0)
    }

    /// One random step over the pool.
    enum Step {
        case park(key: Int, loop: Int, verifiedBefore: Bool, trusted: Bool, shared: Bool)
        case take(key: Int, loop: Int)
        case expireOne(pick: Int)
        case closeOne(pick: Int)
        case listChange(keepKey: Int)
        case shutdown

        init(_ code: Int) {
            let pick = code / 8
            switch code % 8 {
            case 0, 1: self = .park(key: pick % 3, loop: (pick / 3) % 2, verifiedBefore: pick % 5 == 0, trusted: pick % 7 != 0,
                                    shared: pick % 11 < 4)
            case 2, 3: self = .take(key: pick % 3, loop: (pick / 3) % 2)
            case 4: self = .expireOne(pick: pick)
            case 5: self = .closeOne(pick: pick)
            case 6: self = .listChange(keepKey: pick % 4)
            default: self = pick % 10 == 0 ? .shutdown : .take(key: pick % 3, loop: 0)
            }
        }
    }

    @Test("over random sequences of parks (idle and shared), takes, timers, closes (reported or not yet), list changes and shutdowns: each connection ends exactly once (taken, refused, or handed back), a closed one is never handed out, shared ones stay while used and are handed out only with room, never above the cap, only on its own loop and key, no miss with a usable connection, and the counters add up")
    func randomSequences() async {
        await propertyCheck(count: 300, input: Gen.int(in: 0...1_000_000).array(of: 1...150)) { codes in
            let keys = [Self.pay, Self.shop, UpstreamPoolKey(host: "api.example.test", port: 443, configuration: Self.configuration, alpnOffer: nil)]
            let loops = [EventLoopID(Self.loopA), EventLoopID(Self.loopB)]
            var state = State(maximumIdlePerKey: 3)
            var generation: UInt64 = 1
            var nextConnection = 0
            // The model: where each parked connection is, and each one's end.
            var idle: [Int: (key: Int, loop: Int, id: PooledConnectionID, shared: Bool)] = [:]
            var idleTaken = 0
            // Whether a shared connection has room: fixed per connection.
            let hasRoom = { (connection: Int) in connection % 3 != 0 }
            // Closed, their close not yet reported to the pool: a take must not hand them out.
            var dead = Set<Int>()
            var ended: [Int: String] = [:]
            func end(_ connection: Int, _ how: String) {
                #expect(ended[connection] == nil, "connection \(connection) ended twice: \(ended[connection] ?? "") then \(how)")
                ended[connection] = how
                idle[connection] = nil
            }
            for step in codes.map(Step.init) {
                switch step {
                case .park(let key, let loop, let verifiedBefore, let trusted, let shared):
                    nextConnection += 1
                    let connection = nextConnection
                    let outcome = state.park(connection, key: keys[key], on: loops[loop],
                                             generation: verifiedBefore ? generation - 1 : generation,
                                             currentGeneration: generation, trustedByCurrentList: trusted, shared: shared)
                    switch outcome {
                    case .parked(let id): idle[connection] = (key, loop, id, shared)
                    case .refused: end(connection, "refused")
                    }
                case .take(let key, let loop):
                    let taken = state.take(keys[key], on: loops[loop], generation: generation,
                                           unusable: { dead.contains($0) ? .peerClosed : nil }, canShare: hasRoom)
                    for stale in taken.stale { end(stale.connection, "stale") }
                    if let connection = taken.connection {
                        #expect(!dead.contains(connection), "a closed connection was handed out")
                        #expect(idle[connection]?.key == key && idle[connection]?.loop == loop, "handed out on another key or loop")
                        if idle[connection]?.shared == true {
                            #expect(hasRoom(connection), "a shared connection without room was handed out")
                        } else {
                            idleTaken += 1
                            end(connection, "taken")
                        }
                    } else {
                        // A miss only when nothing on this key and loop could be handed out.
                        #expect(!idle.contains { $0.value.key == key && $0.value.loop == loop && !dead.contains($0.key)
                                                 && (!$0.value.shared || hasRoom($0.key)) },
                                "a miss with a usable connection in the pool")
                    }
                case .expireOne(let pick), .closeOne(let pick):
                    guard !idle.isEmpty else { continue }
                    let chosen = idle.keys.sorted()[pick % idle.count]
                    if case .closeOne = step, pick % 2 == 0 {
                        // Closed, but the pool has not heard yet.
                        dead.insert(chosen)
                        continue
                    }
                    let departure: State.Departure = if case .expireOne = step { .idleTimeout } else { .peerClosed }
                    #expect(state.remove(idle[chosen]!.id, departure: departure) == chosen)
                    end(chosen, departure.rawValue)
                case .listChange(let keepKey):
                    generation += 1
                    for connection in state.listInstalled(generation: generation, trusts: { key, _ in key == keys[keepKey % 3] || keepKey == 3 }) {
                        end(connection, "list")
                    }
                case .shutdown:
                    for connection in state.removeAll() { end(connection, "shutdown") }
                }
                #expect(state.idleCount == idle.count)
                for key in keys.indices {
                    #expect(state.idleCount(for: keys[key]) == idle.values.filter { $0.key == key }.count)
                    #expect(state.idleCount(for: keys[key]) <= 3)
                }
            }
            for connection in state.removeAll() { end(connection, "final") }
            // Every connection ever offered ended exactly once.
            #expect(ended.count == nextConnection)
            let counters = state.counters
            let departed = counters.departed.values.reduce(0, +)
            let refused = counters.notPooled.values.reduce(0, +)
            #expect(counters.parked + refused == nextConnection)
            #expect(counters.parked == idleTaken + departed)
        }
    }

    @Test("the first CONNECTs of a burst wait for the one h2 dial in flight on their key and loop, and take its connection once it is shared; without a waiter, or after waiting once, a CONNECT dials")
    func burstSharesOneDial() {
        var state = State(maximumIdlePerKey: 4)
        let a = EventLoopID(Self.loopA), b = EventLoopID(Self.loopB)
        let resumed = Recorded<String>()
        #expect(Self.isDial(state.checkout(Self.pay, on: a, generation: 1, shareableDial: true, waiter: { }).checkout, registered: true))
        // The same key and loop: they wait. Another loop or key: no dial to wait for.
        #expect(Self.isWait(state.checkout(Self.pay, on: a, generation: 1, shareableDial: true, waiter: { resumed.append("one") }).checkout))
        #expect(Self.isWait(state.checkout(Self.pay, on: a, generation: 1, shareableDial: true, waiter: { resumed.append("two") }).checkout))
        #expect(Self.isDial(state.checkout(Self.pay, on: b, generation: 1, shareableDial: true, waiter: { }).checkout, registered: true))
        #expect(Self.isDial(state.checkout(Self.shop, on: a, generation: 1, shareableDial: false, waiter: nil).checkout, registered: false))
        // Without a waiter (it waited already), a CONNECT dials, unregistered: one dial is waited for.
        #expect(Self.isDial(state.checkout(Self.pay, on: a, generation: 1, shareableDial: true, waiter: nil).checkout, registered: false))
        #expect(state.waitingCheckouts == 2)
        // The dial's connection goes to the pool, shared; then the dial is settled.
        _ = state.park(7, key: Self.pay, on: a, generation: 1, currentGeneration: 1, trustedByCurrentList: true, shared: true)
        for waiter in state.dialSettled(Self.pay, on: a) { waiter() }
        #expect(resumed.values == ["one", "two"])
        #expect(state.waitingCheckouts == 0)
        #expect(state.dialSettled(Self.pay, on: a).isEmpty, "settled once")
        // They check out again, without a waiter: both on the shared connection.
        for _ in 0..<2 {
            guard case .hit(let connection) = state.checkout(Self.pay, on: a, generation: 1, shareableDial: true, waiter: nil).checkout else {
                Issue.record("no hit after the dial was shared")
                continue
            }
            #expect(connection == 7)
        }
        #expect(state.counters.hits == 2 && state.counters.misses == 4 && state.counters.waitedForDial == 2)
        // An origin whose last dial negotiated HTTP/1.1: no one waits, and no dial is
        // registered to wait on (the wait would only bunch the others' dials together);
        // once it speaks h2 again, bursts share again.
        state.dialed(Self.shop, negotiatedHTTP2: false)
        #expect(Self.isDial(state.checkout(Self.shop, on: b, generation: 1, shareableDial: true, waiter: { }).checkout, registered: false))
        #expect(Self.isDial(state.checkout(Self.shop, on: b, generation: 1, shareableDial: true, waiter: { }).checkout, registered: false))
        state.dialed(Self.shop, negotiatedHTTP2: true)
        #expect(Self.isDial(state.checkout(Self.shop, on: b, generation: 1, shareableDial: true, waiter: { }).checkout, registered: true))
        #expect(Self.isWait(state.checkout(Self.shop, on: b, generation: 1, shareableDial: true, waiter: { }).checkout))
    }

    @Test("over random checkouts, settles and shared parks on two keys and two loops: one registered dial per key and loop at most, a CONNECT waits only for one, every waiter runs once and only when its own dial settles, and hits, misses and waits add up to the checkouts")
    func randomBursts() async {
        await propertyCheck(count: 300, input: Gen.int(in: 0...1_000_000).array(of: 1...120)) { codes in
            Self.checkBursts(codes)
        }
    }

    /// One random sequence of `randomBursts`: each code picks a key and loop, and a checkout
    /// (with or without a waiter, shareable or not), a settle, or a shared park.
    private static func checkBursts(_ codes: [Int]) {
        let keys = [Self.pay, Self.shop]
        let loops = [EventLoopID(Self.loopA), EventLoopID(Self.loopB)]
        var state = State(maximumIdlePerKey: 16)
        var registered = Set<[Int]>()
        // Waiters queued per slot in the model, and the slot each waiter ran for.
        var queued: [[Int]: [Int]] = [:]
        let runs = Recorded<WaiterRun>()
        var checkouts = 0
        var nextWaiter = 0
        var nextConnection = 0
        for code in codes {
            let slot = [code % 2, (code / 2) % 2]
            let key = keys[slot[0]], loop = loops[slot[1]]
            switch (code / 4) % 4 {
            case 0, 1:
                checkouts += 1
                let withWaiter = (code / 16) % 3 != 0
                let shareable = (code / 48) % 4 != 0
                nextWaiter += 1
                let id = nextWaiter
                let run = WaiterRun(id: id, slot: slot)
                let waiter: (@Sendable () -> Void)? = withWaiter ? { @Sendable in runs.append(run) } : nil
                let outcome = state.checkout(key, on: loop, generation: 1, canShare: { _ in true }, shareableDial: shareable, waiter: waiter)
                switch outcome.checkout {
                case .wait:
                    #expect(withWaiter && shareable && registered.contains(slot), "waited without a dial in flight, without a waiter, or unable to share")
                    queued[slot, default: []].append(id)
                case .dial(let isRegistered):
                    #expect(!(withWaiter && shareable && registered.contains(slot)), "dialled although a dial was in flight")
                    #expect(isRegistered == (shareable && !registered.contains(slot)))
                    if isRegistered { registered.insert(slot) }
                case .hit:
                    break
                }
            case 2:
                for waiter in state.dialSettled(key, on: loop) { waiter() }
                registered.remove(slot)
                for id in queued.removeValue(forKey: slot) ?? [] {
                    #expect(runs.values.filter { $0.id == id }.map(\.slot) == [slot], "waiter \(id) did not run once, for its own slot")
                }
            default:
                nextConnection += 1
                _ = state.park(nextConnection, key: key, on: loop, generation: 1, currentGeneration: 1,
                               trustedByCurrentList: true, shared: true)
            }
            // No waiter has run before its dial settled.
            let waiting = Set(queued.values.flatMap { $0 })
            #expect(runs.values.allSatisfy { !waiting.contains($0.id) })
            #expect(state.waitingCheckouts == waiting.count)
        }
        let counters = state.counters
        #expect(counters.hits + counters.misses + counters.waitedForDial == checkouts)
    }

    private struct WaiterRun: Sendable {
        let id: Int
        let slot: [Int]
    }

    /// What waiters did, in order (they must be `@Sendable`, as the pool's are).
    private final class Recorded<Element: Sendable>: Sendable {
        private let recorded = Mutex<[Element]>([])
        func append(_ element: Element) { recorded.withLock { $0.append(element) } }
        var values: [Element] { recorded.withLock { $0 } }
    }

    private static func isWait(_ checkout: State.Checkout) -> Bool {
        if case .wait = checkout { return true }
        return false
    }

    private static func isDial(_ checkout: State.Checkout, registered: Bool) -> Bool {
        if case .dial(let isRegistered) = checkout { return isRegistered == registered }
        return false
    }

    @Test("the pool's flags and config keys: on by default (30 s, 16 per host), the file's keys read, flags override them, nonsense refused with the fix named")
    func configuration() throws {
        let defaults = try RunCommand.parse([]).options.gateConfiguration(file: nil)
        #expect(defaults.upstreamPoolEnabled)
        #expect(defaults.upstreamPoolIdleTimeout == .seconds(30) && defaults.upstreamPoolMaximumIdlePerHost == 16)
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = try directory.write("pingate.yml", "upstream-pool: false\nupstream-pool-idle-timeout-seconds: 5\nupstream-pool-max-per-host: 2\n")
        let file = try ConfigFile.load(path)
        let fromFile = try RunCommand.parse(["--config", path]).options.gateConfiguration(file: file)
        #expect(!fromFile.upstreamPoolEnabled)
        #expect(fromFile.upstreamPoolIdleTimeout == .seconds(5) && fromFile.upstreamPoolMaximumIdlePerHost == 2)
        let flags = try RunCommand.parse(["--config", path, "--upstream-pool", "--upstream-pool-idle-timeout", "7",
                                          "--upstream-pool-max-per-host", "3"]).options.gateConfiguration(file: file)
        #expect(flags.upstreamPoolEnabled && flags.upstreamPoolIdleTimeout == .seconds(7) && flags.upstreamPoolMaximumIdlePerHost == 3)
        #expect(try !RunCommand.parse(["--no-upstream-pool"]).options.gateConfiguration(file: nil).upstreamPoolEnabled)
        #expect {
            try RunCommand.parse(["--upstream-pool-max-per-host", "0"]).options.gateConfiguration(file: nil)
        } throws: { "\($0)".contains("--no-upstream-pool") }
        #expect {
            try RunCommand.parse(["--upstream-pool-idle-timeout", "0"]).options.gateConfiguration(file: nil)
        } throws: { "\($0)".contains("takes a whole number of seconds from 1 to") && "\($0)".contains("--no-upstream-pool") }
    }
}

