import Foundation

/// When to fetch the list next: Wultra's rule, with a floor.
///
/// t = the soonest expiry among each name's newest pin (and a v2 list's own expiry),
/// minus now; inside the expiration threshold t is multiplied by 0.125 so updates come
/// faster as expiry nears; t is never negative; the next update is at
/// now + min(t, periodic interval), but never sooner than the minimum interval.
public struct UpdateSchedule: Sendable, Equatable {
    /// The longest wait between updates (Wultra default: 7 days).
    public var periodicInterval: TimeInterval
    /// Inside this much time before expiry, waits shrink by 8× (Wultra default: 14 days).
    public var expirationThreshold: TimeInterval
    /// The shortest wait between successful updates, so a list that is about to expire
    /// does not make the gate hammer its server.
    public var minimumInterval: TimeInterval

    /// Creates a schedule.
    public init(periodicInterval: TimeInterval = 7 * 86400, expirationThreshold: TimeInterval = 14 * 86400, minimumInterval: TimeInterval = 60) {
        self.periodicInterval = periodicInterval
        self.expirationThreshold = expirationThreshold
        self.minimumInterval = minimumInterval
    }

    /// The wait after a successful update that left `list` in force.
    public func delay(after list: PinList?, now: Date) -> TimeInterval {
        guard let list else { return minimumInterval }
        var newestByName: [String: Date] = [:]
        for entry in list.entries {
            newestByName[entry.name] = max(newestByName[entry.name] ?? .distantPast, entry.expires)
        }
        var soonest = newestByName.values.min()
        if let expiresAt = list.metadata.expiresAt { soonest = min(soonest ?? expiresAt, expiresAt) }
        guard let soonest else { return max(minimumInterval, periodicInterval) }
        var remaining = soonest.timeIntervalSince(now)
        if remaining < expirationThreshold { remaining *= 0.125 }
        remaining = max(0, remaining)
        return max(minimumInterval, min(remaining, periodicInterval))
    }

    /// The wait after the `failures`-th failure in a row: exponential from `base`, capped
    /// at `maximum`, with jitter in [50 %, 100 %] so many gates do not retry in step.
    public static func retryDelay(failures: Int, base: TimeInterval, maximum: TimeInterval, jitter: Double = Double.random(in: 0.5...1.0)) -> TimeInterval {
        let exponent = Double(max(0, min(failures - 1, 30)))
        return min(base * pow(2, exponent), maximum) * jitter
    }
}
