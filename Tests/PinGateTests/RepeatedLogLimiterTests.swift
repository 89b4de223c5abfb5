import Foundation
import Testing
@testable import PinGate

/// What turns a flood of refusals into a few log lines: no sockets.
@Suite("Repeated log lines")
struct RepeatedLogLimiterTests {
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
