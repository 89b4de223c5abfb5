import Foundation

/// Keeps one tunnel's log from repeating itself without bound: at most `perWindow` lines of
/// one kind per `window`; the rest are counted, and the count is said once the window
/// closes (with the next line of that kind, or when asked). A client that makes the gate
/// refuse 40,000 requests in 10 s costs a few lines, not 73 MB of log.
///
/// Sans-IO: times are passed in.
struct RepeatedLogLimiter {
    /// Lines of one kind allowed per window.
    let perWindow: Int
    /// The window's length.
    let window: TimeInterval

    private var windows: [String: (start: Date, logged: Int, suppressed: Int)] = [:]

    /// A limiter allowing `perWindow` lines of a kind per `window` seconds.
    init(perWindow: Int = 5, window: TimeInterval = 10) {
        self.perWindow = perWindow
        self.window = window
    }

    /// What to do about one more line of `kind` at `now`: log it or not, and how many lines
    /// of that kind the window before it suppressed (say so first, when not 0).
    mutating func admit(_ kind: String, now: Date) -> (log: Bool, suppressedBefore: Int) {
        var state = windows[kind] ?? (now, 0, 0)
        var suppressedBefore = 0
        if now.timeIntervalSince(state.start) >= window {
            suppressedBefore = state.suppressed
            state = (now, 0, 0)
        }
        let log = state.logged < perWindow
        if log { state.logged += 1 } else { state.suppressed += 1 }
        windows[kind] = state
        return (log, suppressedBefore)
    }

    /// The lines suppressed and not yet said, per kind (for the tunnel's end); clears them.
    mutating func takeSuppressed() -> [String: Int] {
        var result: [String: Int] = [:]
        for (kind, state) in windows where state.suppressed > 0 { result[kind] = state.suppressed }
        windows = [:]
        return result
    }
}
