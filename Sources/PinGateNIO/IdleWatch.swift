import NIOCore

/// Tells when a connection has been silent for a timeout, from a count of its reads and
/// writes instead of a clock read per message: the TLS handler that owns it bumps the count
/// on every ciphertext read and every write (one addition), and a timer checks it a few
/// times per timeout.
///
/// Why a count: the idle timeout used to be a handler of its own in front of the TLS
/// handler, which stamped `NIODeadline.now()` on every message and added a pipeline hop to
/// each of them, both ways; on a keep-alive request that was four hops and four clock
/// reads for a timer that fires once in minutes.
///
/// The cost is precision: silence is seen after `checksPerTimeout` checks in a row found
/// the count unchanged, so a connection is reported idle between `timeout` and
/// `timeout + checkInterval` after its last activity, and again after each further
/// `timeout` of silence.
struct IdleWatch: Equatable {
    /// Checks per timeout: the error of the report is a quarter of the timeout at most.
    static let checksPerTimeout = 4

    /// How long a connection may stay silent.
    let timeout: TimeAmount
    /// Reads and writes so far (wrapping: only a change matters).
    private(set) var activity: UInt32 = 0
    private var activityAtLastCheck: UInt32 = 0
    private var quietChecks = 0

    /// A watch for `timeout` of silence.
    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    /// How often `check()` must run: a fraction of the timeout, at least a millisecond.
    var checkInterval: TimeAmount {
        .nanoseconds(max(timeout.nanoseconds / Int64(Self.checksPerTimeout), 1_000_000))
    }

    /// Something was read or written.
    mutating func noteActivity() {
        activity &+= 1
    }

    /// One check: true when the connection was silent for a whole timeout (the checks since
    /// the last activity cover it), after which the count of quiet checks starts again.
    mutating func check() -> Bool {
        guard activity == activityAtLastCheck else {
            activityAtLastCheck = activity
            quietChecks = 0
            return false
        }
        quietChecks += 1
        guard quietChecks >= Self.checksPerTimeout else { return false }
        quietChecks = 0
        return true
    }
}
