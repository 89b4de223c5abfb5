/// Which host names a pin applies to, with OkHttp's semantics:
/// `api.example.com` exactly; `*.example.com` one label below (not the apex, not deeper);
/// `**.example.com` any depth below, and the apex itself.
public enum HostPattern: Sendable, Hashable, CustomStringConvertible {
    /// Exactly this normalized name.
    case exact(String)
    /// One label, then this suffix.
    case singleLabel(suffix: String)
    /// Any number of labels (including none), then this suffix.
    case anyDepth(suffix: String)

    /// Parses a pattern, normalizing it; throws on an empty name or a misplaced wildcard.
    public init(parsing text: String) throws {
        let name = HostName.normalize(text)
        if name.hasPrefix("**.") {
            let suffix = String(name.dropFirst(3))
            try Self.requirePlainName(suffix, in: text)
            self = .anyDepth(suffix: suffix)
        } else if name.hasPrefix("*.") {
            let suffix = String(name.dropFirst(2))
            try Self.requirePlainName(suffix, in: text)
            self = .singleLabel(suffix: suffix)
        } else {
            try Self.requirePlainName(name, in: text)
            self = .exact(name)
        }
    }

    /// True when `host` (already normalized) is covered.
    public func matches(_ host: String) -> Bool {
        switch self {
        case .exact(let name):
            return host == name
        case .singleLabel(let suffix):
            guard host.hasSuffix("." + suffix) else { return false }
            let label = host.dropLast(suffix.count + 1)
            return !label.isEmpty && !label.utf8.contains(UInt8(ascii: "."))
        case .anyDepth(let suffix):
            return host == suffix || host.hasSuffix("." + suffix)
        }
    }

    /// The pattern as written in lists.
    public var description: String {
        switch self {
        case .exact(let name): return name
        case .singleLabel(let suffix): return "*." + suffix
        case .anyDepth(let suffix): return "**." + suffix
        }
    }

    private static func requirePlainName(_ name: String, in text: String) throws {
        guard !name.isEmpty, !name.contains("*"), !name.hasPrefix("."), !name.contains("..") else {
            throw PinListError.malformed("invalid host pattern \"\(text)\"")
        }
    }
}
