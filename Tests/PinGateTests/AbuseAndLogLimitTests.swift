import Foundation
import NIOCore
import Testing
@testable import PinGate

/// The budgets that turn a flood into one GOAWAY and a few log lines: no sockets.
@Suite("Abuse budgets and repeated log lines")
struct AbuseAndLogLimitTests {
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

    @Test("repeated lines: the first few per window are logged, the rest counted and said when the window closes or the tunnel ends")
    func logLimiter() {
        var limiter = RepeatedLogLimiter(perWindow: 3, window: 10)
        let start = Date(timeIntervalSince1970: 1_000)
        let first = (0..<1000).map { _ in limiter.admit("malformed-request", now: start) }
        #expect(first.filter(\.log).count == 3)
        #expect(first.allSatisfy { $0.suppressedBefore == 0 })
        let other = limiter.admit("authority-mismatch", now: start)
        #expect(other.log, "another kind has its own window")
        let next = limiter.admit("malformed-request", now: start.addingTimeInterval(11))
        #expect(next.log && next.suppressedBefore == 997)
        _ = (0..<5).map { _ in limiter.admit("malformed-request", now: start.addingTimeInterval(12)) }
        let held = limiter.takeSuppressed()
        #expect(held == ["malformed-request": 3])
        let again = limiter.takeSuppressed()
        #expect(again.isEmpty)
    }
}
