import Foundation

/// Deliberate crashes at named points, for the tests that prove a state write survives a
/// crash. Off unless the environment variable `PINGATE_FAULT_INJECTION` names a point
/// (documented in the README's "Testing" section); nothing else can turn it on, and the
/// variable is read once per process.
public enum FaultInjection {
    /// Where a crash can be injected.
    public enum Point: String, Sendable, CaseIterable {
        /// After a state file's new bytes are written and synced under a temporary name,
        /// before the rename that makes them current.
        case beforeRename = "crash-before-rename"
    }

    /// The exit status of an injected crash, so a test can tell it from a real one.
    public static let exitStatus: Int32 = 86

    /// The point named by `PINGATE_FAULT_INJECTION`, if any.
    public static let requested: Point? = ProcessInfo.processInfo.environment["PINGATE_FAULT_INJECTION"].flatMap(Point.init(rawValue:))

    /// Ends the process at once (no clean-up, like a power cut) when `point` was requested.
    static func crashIfRequested(at point: Point) {
        if requested == point { _exit(exitStatus) }
    }
}
