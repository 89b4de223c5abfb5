import NIOCore
@testable import PinGateNIO
import PropertyBased
import Testing

/// The idle timeout told from a count of reads and writes, checked a few times per timeout:
/// no clock read and no pipeline hop per message.
@Suite("Idle watch")
struct IdleWatchTests {
    /// What `count` checks in a row answer.
    private static func checks(_ watch: inout IdleWatch, _ count: Int) -> [Bool] {
        (0..<count).map { _ in watch.check() }
    }

    @Test("silence is reported at the fourth quiet check, and again after each further four")
    func reportsAfterAWholeTimeout() {
        var watch = IdleWatch(timeout: .seconds(300))
        #expect(watch.checkInterval == .seconds(75))
        let first = Self.checks(&watch, 4)
        let second = Self.checks(&watch, 4)
        #expect(first == [false, false, false, true])
        #expect(second == [false, false, false, true])
    }

    @Test("activity between two checks starts the count of quiet checks again")
    func activityResets() {
        var watch = IdleWatch(timeout: .milliseconds(400))
        let beforeActivity = Self.checks(&watch, 3)
        watch.noteActivity()
        let afterActivity = Self.checks(&watch, 5)
        #expect(beforeActivity == [false, false, false])
        #expect(afterActivity == [false, false, false, false, true])
    }

    @Test("the check interval is a quarter of the timeout, never under a millisecond")
    func checkInterval() {
        #expect(IdleWatch(timeout: .milliseconds(400)).checkInterval == .milliseconds(100))
        #expect(IdleWatch(timeout: .microseconds(10)).checkInterval == .milliseconds(1))
    }

    @Test("the activity count wraps instead of trapping")
    func countWraps() {
        var watch = IdleWatch(timeout: .seconds(1))
        for _ in 0..<70_000 { watch.noteActivity() }
        #expect(watch.activity == 70_000)
        let reported = watch.check()
        #expect(!reported)
    }

    /// Over random interleavings of activity and checks (each check one interval after the
    /// one before), silence is reported exactly when the last activity came before the
    /// fourth check back, counted from the last report: never while the connection talked
    /// within the timeout, never later than a quarter past it.
    @Test("property: silence is reported exactly when a whole timeout of checks saw no activity since the last activity or report")
    func reportsExactlyAfterAQuietTimeout() async {
        // A step: 0 is a check, any other value that many reads or writes before the next check.
        await propertyCheck(count: 300, input: Gen.int(in: 0...3).array(of: 1...120)) { steps in
            var watch = IdleWatch(timeout: .seconds(60))
            var quietChecks = 0  // checks since the last one that saw activity, or the last report
            var activitySinceCheck = false
            for step in steps {
                if step > 0 {
                    for _ in 0..<step { watch.noteActivity() }
                    activitySinceCheck = true
                    continue
                }
                let reported = watch.check()
                if activitySinceCheck {
                    quietChecks = 0
                    activitySinceCheck = false
                    #expect(!reported, "a check after activity never reports silence")
                } else {
                    quietChecks += 1
                    #expect(reported == (quietChecks == IdleWatch.checksPerTimeout))
                    if reported { quietChecks = 0 }
                }
            }
        }
    }
}
