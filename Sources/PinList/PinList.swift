import Foundation

/// The formats a fingerprint list can arrive in.
public enum PinListFormat: String, Sendable, Equatable, Codable {
    /// Wultra static: per-entry signatures.
    case wultraStatic = "wultra-static"
    /// Wultra dynamic: the Mobile Utility Server response, signed with the request's challenge.
    case wultraDynamic = "wultra-dynamic"
    /// pingate signed list v2: one signature over the whole payload, with sequence and expiry.
    case pingateV2 = "pingate-v2"
}

/// A verified fingerprint list, ready for the policy.
public struct PinList: Sendable {
    /// Facts about the list as a whole.
    public struct Metadata: Sendable, Equatable {
        /// The format it was verified in.
        public var format: PinListFormat
        /// v2: the monotonic sequence number (a lower one is a rollback).
        public var sequence: Int64?
        /// v2: when it was issued; Wultra dynamic: its `timestamp`.
        public var issuedAt: Date?
        /// v2: after this the list is no longer fresh and is not used.
        public var expiresAt: Date?
        /// v2: the id of the key that signed it.
        public var keyID: String?

        /// Creates metadata.
        public init(format: PinListFormat, sequence: Int64? = nil, issuedAt: Date? = nil, expiresAt: Date? = nil, keyID: String? = nil) {
            self.format = format
            self.sequence = sequence
            self.issuedAt = issuedAt
            self.expiresAt = expiresAt
            self.keyID = keyID
        }
    }

    /// Where the list came from (a file path or URL), for status and logs.
    public let source: String
    /// Every pin, expired ones included (the policy skips those at its own `now`).
    public let entries: [PinEntry]
    /// Fingerprints (certificate or SPKI hashes) refused whatever the pins say.
    public let revoked: Set<String>
    /// Format, sequence and validity.
    public let metadata: Metadata
    /// Wultra dynamic only: the challenge-signed `domainsConfig` (nil when the response had
    /// none, and always nil for lists read from a file, a fallback or the state directory).
    public let domainRules: DomainRules?
    private let exactEntries: [String: [PinEntry]]
    private let wildcardEntries: [PinEntry]

    /// Creates a list from verified entries.
    public init(source: String, entries: [PinEntry], revoked: Set<String> = [], metadata: Metadata = Metadata(format: .wultraStatic),
                domainRules: DomainRules? = nil) {
        self.source = source
        self.entries = entries
        self.revoked = revoked
        self.metadata = metadata
        self.domainRules = domainRules
        var exact: [String: [PinEntry]] = [:]
        var wildcards: [PinEntry] = []
        for entry in entries {
            if case .exact(let name) = entry.host {
                exact[name, default: []].append(entry)
            } else {
                wildcards.append(entry)
            }
        }
        exactEntries = exact
        wildcardEntries = wildcards
    }

    /// The same list without its domain rules: what a document that was not just answered
    /// over a fresh challenge (a persisted one, a fallback) may put in force.
    public func withoutDomainRules() -> PinList {
        guard domainRules != nil else { return self }
        return PinList(source: source, entries: entries, revoked: revoked, metadata: metadata)
    }

    /// True when the list's domain rules let `host` (normalized) through without a pin.
    public func allowsUnpinned(_ host: String) -> Bool {
        domainRules.map { !$0.pinningRequired(for: host) } ?? false
    }

    /// False once a v2 list is past its `expiresAt`: a stale list is not used.
    public func isFresh(at now: Date) -> Bool {
        guard let expiresAt = metadata.expiresAt else { return true }
        return now < expiresAt
    }

    /// The pins for `host` (normalized) that are unexpired at `now`.
    public func unexpiredEntries(for host: String, at now: Date) -> [PinEntry] {
        let exact = exactEntries[host] ?? []
        let wild = wildcardEntries.isEmpty ? [] : wildcardEntries.filter { $0.host.matches(host) }
        return (exact + wild).filter { $0.isUnexpired(at: now) }
    }

    /// True when the list has any pin for `host` (normalized), expired or not, or its domain
    /// rules say the host needs one: a host the list's author meant to pin, which learn mode
    /// must never learn around.
    public func names(_ host: String) -> Bool {
        !(exactEntries[host] ?? []).isEmpty || wildcardEntries.contains { $0.host.matches(host) }
            || domainRules?.domains[host] == true
    }

    /// True when `leaf`'s certificate or key hash is on the list's revoked set.
    public func revokes(_ leaf: CertificateHashes) -> Bool {
        revoked.contains(leaf.certificateSHA256) || (leaf.spkiSHA256.map(revoked.contains) ?? false)
    }

    /// The earliest expiry among unexpired pins.
    public func earliestExpiry(after now: Date) -> Date? {
        entries.filter { $0.isUnexpired(at: now) }.map(\.expires).min()
    }

    /// Why this list cannot be used at `now` although it verified: a v2 list past its
    /// `expiresAt`, or every pin past its own expiry. Nil while it is usable (and for a
    /// list with no entries at all, which never held a pin to expire). The gate
    /// refuses with `list-expired` and says this, rather than a vaguer "no list".
    public func expiryReason(at now: Date) -> String? {
        let stamp = ISO8601DateFormatter()
        if let expiresAt = metadata.expiresAt, now >= expiresAt {
            return "the fingerprint list from \(source) expired at \(stamp.string(from: expiresAt))"
        }
        guard !entries.contains(where: { $0.isUnexpired(at: now) }), let last = entries.map(\.expires).max() else { return nil }
        return "every pin in the fingerprint list from \(source) has expired (the last at \(stamp.string(from: last)))"
    }

    /// True when some pin is unexpired at `now` and the list itself is fresh.
    public func hasUnexpiredEntries(at now: Date) -> Bool {
        isFresh(at: now) && entries.contains { $0.isUnexpired(at: now) }
    }

    /// True when the list can decide for some host at `now`: an unexpired pin, or signed
    /// domain rules that let some host through unpinned.
    public func isUsable(at now: Date) -> Bool {
        hasUnexpiredEntries(at: now) || (isFresh(at: now) && (domainRules?.allowsSomeUnpinned ?? false))
    }
}
