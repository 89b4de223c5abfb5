import NIOCore
import Testing
@testable import PinGateHTTP

/// The budget that turns a flood of resets or rejected heads into one GOAWAY: no sockets.
@Suite("HTTP/2 abuse budgets")
struct HTTP2AbuseGuardTests {
    @Test("a burst within the budget passes; one past it ends the connection; time refills the bucket; each kind has its own")
    func abuseGuard() {
        var guardian = HTTP2AbuseGuard(resets: .init(capacity: 10, perSecond: 5), rejections: .init(capacity: 2, perSecond: 1))
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        let burst = (0..<11).map { _ in guardian.record(.clientReset, now: start) }
        #expect(burst == Array(repeating: false, count: 10) + [true], "the 11th reset at once is one too many")
        // Two seconds later ten more tokens are back (capped at the capacity).
        let later = (0..<9).map { _ in guardian.record(.clientReset, now: start + .seconds(2)) }
        #expect(!later.contains(true))
        let rejections = (0..<3).map { _ in guardian.record(.rejectedRequest, now: start + .seconds(2)) }
        #expect(rejections == [false, false, true])
    }

    @Test("a steady rate under the refill never trips the guard, however long it lasts")
    func steadyRate() {
        var guardian = HTTP2AbuseGuard()
        var now = NIODeadline.uptimeNanoseconds(0)
        var tripped = 0
        for _ in 0..<10_000 {
            now = now + .milliseconds(25)  // 40 resets a second, under 50
            if guardian.record(.clientReset, now: now) { tripped += 1 }
        }
        #expect(tripped == 0)
    }


    @Test("SETTINGS and PING frames have their own budget: a client's preface SETTINGS and a keep-alive PING a second never trip it, nor does 150 a second for as long as it lasts; a thousand at once pass, the next one ends the connection, and resets are not charged for them")
    func controlFrames() {
        var guardian = HTTP2AbuseGuard()
        var now = NIODeadline.uptimeNanoseconds(0)
        var tripped = 0
        for _ in 0..<20_000 {
            now = now + .nanoseconds(6_666_667)  // 150 a second, under 200
            if guardian.record(.controlFrame, now: now) { tripped += 1 }
        }
        #expect(tripped == 0)
        var flood = HTTP2AbuseGuard()
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        let burst = (0..<1_001).map { _ in flood.record(.controlFrame, now: start) }
        #expect(burst.firstIndex(of: true) == 1_000)
        let resetTripped = flood.record(.clientReset, now: start)
        #expect(!resetTripped, "each kind has its own bucket")
    }
}
