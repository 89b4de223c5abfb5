import Foundation
import Logging
import NIOCore
import NIOEmbedded
import Testing
@testable import PinGate

/// The pool is one per event loop, each touched only on its loop (issue 31, item 6):
/// driven here on two embedded loops with virtual clocks, and connections from the
/// CONNECT handler's embedded harness. No sockets.
@Suite("The upstream pool, one per event loop")
struct UpstreamPoolLoopTests {
    static let key = UpstreamPoolKey(host: "pay.example.test", port: 443, configuration: GateConfiguration(), alpnOffer: ["http/1.1"])

    static func pool(_ loops: [EmbeddedEventLoop], idleTimeout: TimeAmount = .seconds(30), maximumIdlePerKey: Int = 16) -> UpstreamPool {
        UpstreamPool(settings: .init(idleTimeout: idleTimeout, maximumIdlePerKey: maximumIdlePerKey), eventLoops: loops,
                     metrics: .discarding, logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() })
    }

    /// A connection on `loop`, made as the CONNECT handler's harness makes one.
    static func connection(on loop: EmbeddedEventLoop) throws -> (UpstreamConnection, EmbeddedChannel) {
        try ConnectHandlerTests.Harness.makeUpstream(on: loop)
    }

    @Test("a connection parked on one loop is handed out only on that loop; another loop misses and dials; the counts add up over the loops")
    func ownLoopOnly() throws {
        let a = EmbeddedEventLoop(), b = EmbeddedEventLoop()
        let pool = Self.pool([a, b])
        let (connection, _) = try Self.connection(on: a)
        #expect(pool.park(connection, key: Self.key, generation: 1, currentGeneration: 1) { true })
        #expect(pool.take(Self.key, on: b, generation: 1) == nil)
        #expect(pool.idleCount == 1)
        #expect(pool.take(Self.key, on: a, generation: 1) === connection)
        #expect(pool.idleCount == 0)
        let counters = pool.counters
        #expect(counters.hits == 1 && counters.misses == 1 && counters.parked == 1, "\(counters)")
        #expect(pool.callsFromForeignLoops == 0)
        let stray = EmbeddedEventLoop()
        #expect(pool.take(Self.key, on: stray, generation: 1) == nil)
        #expect(pool.callsFromForeignLoops == 1, "a loop the pool was not built for is counted, never served")
    }

    @Test("the idle timer is the loop's own: it closes the connection when that loop's clock passes the idle timeout, and is counted scheduled and fired; a connection taken first has its timer cancelled")
    func idleTimerOnItsLoop() throws {
        let a = EmbeddedEventLoop(), b = EmbeddedEventLoop()
        let pool = Self.pool([a, b], idleTimeout: .seconds(5))
        let (first, firstChannel) = try Self.connection(on: a)
        #expect(pool.park(first, key: Self.key, generation: 1, currentGeneration: 1) { true })
        b.advanceTime(by: .seconds(10))
        #expect(firstChannel.isActive, "another loop's clock does not touch it")
        a.advanceTime(by: .seconds(5))
        #expect(!firstChannel.isActive)
        #expect(pool.counters.departed[.idleTimeout] == 1)
        #expect(pool.idleCount == 0)

        let (second, secondChannel) = try Self.connection(on: a)
        #expect(pool.park(second, key: Self.key, generation: 1, currentGeneration: 1) { true })
        #expect(pool.take(Self.key, on: a, generation: 1) === second)
        a.advanceTime(by: .seconds(10))
        #expect(secondChannel.isActive, "taken: its timer was cancelled")
        let timers = pool.idleTimerCounts
        #expect(timers.pending == 0 && timers.scheduled == 2 && timers.fired == 1 && timers.cancelled == 1, "\(timers)")
    }

    @Test("a new list and the shutdown reach each loop's pool as a task on that loop: idle connections the list no longer trusts close, the rest stay; at shutdown all close")
    func crossLoopWorkRunsOnEachLoop() throws {
        let a = EmbeddedEventLoop(), b = EmbeddedEventLoop()
        let pool = Self.pool([a, b])
        let (onA, channelA) = try Self.connection(on: a)
        let (onB, channelB) = try Self.connection(on: b)
        #expect(pool.park(onA, key: Self.key, generation: 1, currentGeneration: 1) { true })
        #expect(pool.park(onB, key: Self.key, generation: 1, currentGeneration: 1) { true })
        #expect(pool.idleCount == 2)
        pool.listInstalled(generation: 2) { _, connection in connection.channel !== channelA }
        a.run()
        b.run()
        #expect(!channelA.isActive && channelB.isActive)
        #expect(pool.counters.departed[.listChanged] == 1)
        #expect(pool.take(Self.key, on: b, generation: 2) === onB)
        #expect(pool.park(onB, key: Self.key, generation: 2, currentGeneration: 2) { true })
        pool.closeAll()
        b.run()
        #expect(!channelB.isActive)
        #expect(pool.idleCount == 0)
        #expect(pool.counters.departed[.shutdown] == 1)
        #expect(pool.callsFromForeignLoops == 0)
    }

    @Test("a checkout that comes before a new list's task reached its loop applies that list first: a connection the list still trusts is handed out, not dropped as another generation's")
    func checkoutBeforeTheListTask() throws {
        let a = EmbeddedEventLoop()
        let pool = Self.pool([a])
        let (connection, channel) = try Self.connection(on: a)
        #expect(pool.park(connection, key: Self.key, generation: 1, currentGeneration: 1) { true })
        // The store moved to generation 2 and told the pool; loop a has not run the task yet.
        pool.listInstalled(generation: 2) { _, _ in true }
        #expect(pool.take(Self.key, on: a, generation: 2) === connection)
        #expect(channel.isActive)
        a.run()
        #expect(pool.counters.departed[.listChanged] == nil, "\(pool.counters)")
        #expect(pool.counters.hits == 1)
    }

    @Test("the per-key cap is split between the loops, rounded up: with 3 per key over 2 loops, each loop keeps 2")
    func capSplitBetweenLoops() throws {
        let a = EmbeddedEventLoop(), b = EmbeddedEventLoop()
        let pool = Self.pool([a, b], maximumIdlePerKey: 3)
        var kept = 0
        for _ in 0..<3 {
            let (connection, _) = try Self.connection(on: a)
            if pool.park(connection, key: Self.key, generation: 1, currentGeneration: 1, stillTrusted: { true }) { kept += 1 }
        }
        #expect(kept == 2)
        #expect(pool.counters.notPooled[.full] == 1)
    }
}
