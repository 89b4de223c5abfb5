import Foundation

/// What a new list adds, drops or changes, host by host: for reviewing a proposal (or a
/// published update) against the list in force before it is signed or shipped. A pin is
/// the same pin when its host, kind, hash and depth are; its expiry and mode may change.
public enum ListDiff {
    /// One host's (or pattern's) differences.
    public struct HostChanges: Sendable, Equatable {
        /// The host name or pattern.
        public var host: String
        /// Pins only the new list has.
        public var added: [PinEntry]
        /// Pins only the old list has.
        public var dropped: [PinEntry]
        /// Pins both have, whose expiry or mode differ: (old, new).
        public var changed: [Changed]

        /// True when the old list has no pin for the host at all.
        public var isNewHost: Bool { dropped.isEmpty && changed.isEmpty && !added.isEmpty && unchanged == 0 }
        /// True when the new list has no pin for the host at all.
        public var isGoneHost: Bool { added.isEmpty && changed.isEmpty && !dropped.isEmpty && unchanged == 0 }
        /// Pins the two lists share unchanged.
        public var unchanged: Int
    }

    /// A pin both lists have, with another expiry or mode.
    public struct Changed: Sendable, Equatable {
        /// The pin in the old list.
        public var old: PinEntry
        /// The pin in the new list.
        public var new: PinEntry
    }

    /// The differences between `old` and `new`, by host; hosts with none are left out.
    public static func compare(old: [PinEntry], new: [PinEntry]) -> [HostChanges] {
        let hosts = Set(old.map(\.name)).union(new.map(\.name)).sorted()
        return hosts.compactMap { host in
            let before = old.filter { $0.name == host }, after = new.filter { $0.name == host }
            var changes = HostChanges(host: host, added: [], dropped: [], changed: [], unchanged: 0)
            for pin in after {
                guard let match = before.first(where: { identity($0) == identity(pin) }) else {
                    changes.added.append(pin)
                    continue
                }
                if match.expires == pin.expires && match.mode == pin.mode {
                    changes.unchanged += 1
                } else {
                    changes.changed.append(Changed(old: match, new: pin))
                }
            }
            changes.dropped = before.filter { pin in !after.contains { identity($0) == identity(pin) } }
            return changes.added.isEmpty && changes.dropped.isEmpty && changes.changed.isEmpty ? nil : changes
        }
    }

    /// The report, one line per pin: `+` added, `-` dropped, `~` changed.
    public static func describe(_ changes: [HostChanges]) -> String {
        var text = ""
        for host in changes {
            let headline = host.isNewHost ? "new host" : host.isGoneHost ? "no longer pinned" : "changed"
            text += "\(host.host): \(headline)\n"
            for pin in host.added { text += "  + \(pinText(pin)), expires \(iso(pin.expires))\n" }
            for pin in host.dropped { text += "  - \(pinText(pin)), expires \(iso(pin.expires))\n" }
            for change in host.changed {
                var what: [String] = []
                if change.old.expires != change.new.expires { what.append("expires \(iso(change.old.expires)) → \(iso(change.new.expires))") }
                if change.old.mode != change.new.mode { what.append("\(change.old.mode.rawValue) → \(change.new.mode.rawValue)") }
                text += "  ~ \(pinText(change.new)): \(what.joined(separator: ", "))\n"
            }
        }
        return text
    }

    private static func identity(_ pin: PinEntry) -> String {
        "\(pin.kind.rawValue)/\(pin.fingerprint)/\(pin.depth)"
    }

    private static func pinText(_ pin: PinEntry) -> String {
        "\(pin.kind.rawValue)/\(pin.fingerprint)\(pin.depth.isLeaf ? "" : " depth \(pin.depth)")\(pin.mode == .enforce ? "" : " \(pin.mode.rawValue)")"
    }

    private static func iso(_ date: Date) -> String { InternetTime.text(date) }
}

/// Dates as lists, logs and reports write them: RFC 3339 in UTC, to the second.
public enum InternetTime {
    /// `date` as `2026-11-26T06:48:14Z`.
    public static func text(_ date: Date) -> String { ISO8601DateFormatter().string(from: date) }
}
