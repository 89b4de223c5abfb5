import Foundation

/// A verified fingerprint list, ready for the policy: entries indexed by host name.
public struct PinList: Sendable {
    /// Where the list came from (a file path or URL), for status and logs.
    public let source: String
    /// Every entry, expired ones included (the policy skips those itself, at its own `now`).
    public let entries: [PinEntry]
    private let entriesByHost: [String: [PinEntry]]

    /// Creates a list from entries that have already been verified.
    public init(source: String, entries: [PinEntry]) {
        self.source = source
        self.entries = entries
        self.entriesByHost = Dictionary(grouping: entries, by: \.name)
    }

    /// The entries for `host` (normalized by the caller) that are unexpired at `now`.
    public func unexpiredEntries(for host: String, at now: Date) -> [PinEntry] {
        (entriesByHost[host] ?? []).filter { $0.isUnexpired(at: now) }
    }

    /// The earliest expiry among unexpired entries, for status reports.
    public func earliestExpiry(after now: Date) -> Date? {
        entries.filter { $0.isUnexpired(at: now) }.map(\.expires).min()
    }
}
