import Foundation
import PinList

/// A list not yet signed: what `pingate list propose` writes and `pingate sign --draft`
/// signs. Every pin carries `why`: the reason it was chosen and its expiry, for the person
/// who reviews the draft before signing it.
public struct ListDraft: Codable, Sendable, Equatable {
    /// One pin: exactly one of `sha256` and `spki`.
    public struct Pin: Codable, Sendable, Equatable {
        /// The host name, or a `*.` pattern.
        public var host: String
        /// base64 SHA-256 of the certificate DER.
        public var sha256: String?
        /// base64 SHA-256 of the SubjectPublicKeyInfo DER.
        public var spki: String?
        /// The position in the validated chain (absent: the leaf).
        public var depth: PinEntry.Depth?
        /// Unix seconds.
        public var expires: Int64
        /// Why this pin, and why this expiry.
        public var why: String
    }

    /// What the draft is and how to sign it.
    public var comment: String
    /// The pins, by host then position.
    public var pins: [Pin]
    /// The sequence the signed list should carry (`list propose --next`: the list in
    /// force's, plus one); `sign --draft` uses it unless `--sequence` is given.
    public var sequence: Int64?
    /// What changed against the list in force, each with why (`list propose --next`).
    public var changes: [String]?

    /// A draft of `pins`.
    public init(comment: String, pins: [Pin], sequence: Int64? = nil, changes: [String]? = nil) {
        self.comment = comment
        self.pins = pins
        self.sequence = sequence
        self.changes = changes
    }

    /// The draft as JSON: sorted keys, readable.
    public func encoded() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        return try encoder.encode(self)
    }

    /// A draft from a file's bytes.
    public static func decode(_ data: Data) throws -> ListDraft {
        try JSONDecoder().decode(ListDraft.self, from: data)
    }

    /// The pins as a list's entries (enforced), for `list diff`; throws on a bad host
    /// pattern, a pin with neither or both hashes, or a hash that is not a SHA-256 (the
    /// same checks a signed list's pins get, so a draft compares as it will sign).
    public func entries() throws -> [PinEntry] {
        try pins.enumerated().map { index, pin in
            let (kind, fingerprint) = try PinEntry.Kind.of(sha256: pin.sha256, spki: pin.spki, what: "draft pin \(index) (\(pin.host))")
            return PinEntry(host: try HostPattern(parsing: pin.host), fingerprint: fingerprint, kind: kind,
                            expires: Date(timeIntervalSince1970: TimeInterval(pin.expires)), mode: .enforce, depth: pin.depth ?? .leaf)
        }
    }
}

/// Turns what learn mode observed into a list draft. Plain values in and out: the choices
/// (which pins, which expiry, which hosts share a pattern) are testable without a gate.
public enum ListProposal {
    /// The list format the draft is for.
    public enum Format: String, Sendable, CaseIterable {
        /// pingate's v2: key (SPKI) pins at any depth.
        case v2
        /// Wultra's static format: certificate hashes of leaves only.
        case wultraStatic = "wultra-static"
    }

    /// What to propose.
    public struct Options: Sendable {
        /// 0: leaf pins only; 1: each leaf pin plus its issuer's key (depth 1) as the backup.
        public var depth = 1
        /// Only hosts matching one of these globs (`*.example.com`, `api?.x`); empty: all.
        public var hosts: [String] = []
        /// The list format.
        public var format = Format.v2
        /// Group hosts under one parent domain that share an issuer key into one `*.` pattern.
        public var group = false
        /// The time expiries are judged at.
        public var now = Date()

        /// Default options: depth 1, every host, v2, no grouping, now.
        public init() {}
    }

    /// The draft, and notes for stderr (hosts skipped, and why).
    public static func propose(_ book: ObservationBook, options: Options, source: String) -> (draft: ListDraft, notes: [String]) {
        var notes: [String] = []
        // One entry per host name: a host seen on several ports is one host to a list.
        var chainsByHost: [String: [(port: Int, chain: ObservedChain)]] = [:]
        for observed in book.hosts where matches(observed.host, options.hosts) {
            chainsByHost[observed.host, default: []] += observed.chains.map { (observed.port, $0) }
        }
        var pinsByHost: [String: [ListDraft.Pin]] = [:]
        var issuerByHost: [String: String] = [:]
        for host in chainsByHost.keys.sorted() {
            let seen = chainsByHost[host] ?? []
            let live = seen.filter { ($0.chain.chain.first?.notAfter ?? .distantFuture) > options.now }
            guard !live.isEmpty else {
                notes.append("\(host): skipped: every leaf it presented has expired (seen \(seen.count) chain\(seen.count == 1 ? "" : "s"))")
                continue
            }
            var pins: [ListDraft.Pin] = []
            var leafKeys = Set<String>()
            for (_, observed) in live.sorted(by: { $0.chain.lastSeen > $1.chain.lastSeen }) {
                guard let leaf = observed.chain.first else { continue }
                let ports = Set(live.filter { $0.chain.chain.first?.sha256 == leaf.sha256 }.map(\.port)).sorted()
                let seenText = "seen \(observed.count) time\(observed.count == 1 ? "" : "s") from \(iso(observed.firstSeen)) to \(iso(observed.lastSeen)) on port \(ports.map(String.init).joined(separator: ", "))"
                let expiry = leaf.notAfter.map { Int64($0.timeIntervalSince1970) } ?? Int64(options.now.timeIntervalSince1970) + 90 * 86400
                let expiryText = leaf.notAfter.map { "expires with the certificate (notAfter \(iso($0)))" }
                    ?? "the certificate's notAfter was unreadable: 90 days from now"
                switch options.format {
                case .v2:
                    guard leafKeys.insert(leaf.spki).inserted else { continue }
                    pins.append(.init(host: host, spki: leaf.spki, expires: expiry,
                                      why: "the leaf's key (\(leaf.subject)), \(seenText); a key pin survives a renewal that keeps the key; \(expiryText)"))
                case .wultraStatic:
                    guard leafKeys.insert(leaf.sha256).inserted else { continue }
                    pins.append(.init(host: host, sha256: leaf.sha256, expires: expiry,
                                      why: "the leaf certificate (\(leaf.subject)), \(seenText); Wultra's format pins certificates only; \(expiryText)"))
                }
            }
            if options.depth >= 1 && options.format == .v2 {
                let latest = live.max { $0.chain.lastSeen < $1.chain.lastSeen }?.chain
                if let chain = latest?.chain, chain.count > 1 {
                    let issuer = chain[1]
                    issuerByHost[host] = issuer.spki
                    let expiry = issuer.notAfter.map { Int64($0.timeIntervalSince1970) } ?? pins.map(\.expires).max() ?? 0
                    pins.append(.init(host: host, spki: issuer.spki, depth: .position(1), expires: expiry,
                                      why: "the backup: the key of \(issuer.subject), which issued the leaf (depth 1 of the validated chain), so a re-keyed leaf from the same CA passes without a new list; "
                                        + (issuer.notAfter.map { "expires with that CA certificate (notAfter \(iso($0)))" } ?? "that CA certificate's notAfter was unreadable")))
                } else {
                    notes.append("\(host): its leaf is its own trust anchor, so there is no issuer to pin as a backup: one pin only (list lint will say so)")
                }
            } else if options.depth >= 1 {
                notes.append("\(host): \(options.format.rawValue) has no depth pins: leaf certificates only")
            }
            pinsByHost[host] = pins
        }
        if options.group && options.format == .v2 {
            for (pattern, members) in groups(issuerByHost: issuerByHost, hosts: Array(pinsByHost.keys)) {
                var pins: [ListDraft.Pin] = []
                for member in members {
                    for var pin in pinsByHost[member] ?? [] where !pins.contains(where: { $0.spki == pin.spki && $0.depth == pin.depth }) {
                        pin.host = pattern
                        pin.why += " (grouped: \(members.joined(separator: ", ")) share this issuer)"
                        pins.append(pin)
                    }
                    pinsByHost[member] = nil
                }
                pinsByHost[pattern] = pins
                notes.append("\(pattern): grouped \(members.joined(separator: ", ")): every host seen under it, with the same issuer key; the pattern also covers names never seen")
            }
        }
        let pins = pinsByHost.keys.sorted().flatMap { host in
            (pinsByHost[host] ?? []).sorted { depthOrder($0.depth) < depthOrder($1.depth) }
        }
        let comment = "pingate list propose: \(pinsByHost.count) host\(pinsByHost.count == 1 ? "" : "s") from \(source), "
            + "made \(iso(options.now)). Review every pin, then sign it: pingate sign --draft FILE --key signer.key --format "
            + (options.format == .v2 ? "v2 --sequence N" : "static")
        return (ListDraft(comment: comment, pins: pins), notes)
    }

    /// Parents (at least two labels, no public suffix) whose every proposed host
    /// `label.parent` shares one issuer key, two hosts or more: pattern → members. A parent
    /// with one host of another issuer (or none) is not grouped: `*.parent` would let that
    /// host through on the others' pins.
    static func groups(issuerByHost: [String: String], hosts: [String]) -> [(String, [String])] {
        var byParent: [String: [String]] = [:]
        for host in hosts {
            let labels = host.split(separator: ".")
            guard labels.count >= 3 else { continue }
            byParent[labels.dropFirst().joined(separator: "."), default: []].append(host)
        }
        return byParent.compactMap { parent, members in
            guard members.count >= 2, !PinListLint.isPublicSuffix(parent) else { return nil }
            let issuers = Set(members.map { issuerByHost[$0] })
            guard issuers.count == 1, issuers.first.flatMap({ $0 }) != nil else { return nil }
            return ("*.\(parent)", members.sorted())
        }.sorted { $0.0 < $1.0 }
    }

    /// True when `host` matches one of `globs` (or there are none).
    static func matches(_ host: String, _ globs: [String]) -> Bool {
        globs.isEmpty || globs.contains { fnmatch($0.lowercased(), host, 0) == 0 }
    }

    /// Orders a host's pins leaf first, then by position, `any` last.
    static func depthOrder(_ depth: PinEntry.Depth?) -> Int {
        switch depth {
        case nil: return 0
        case .position(let position)?: return position
        case .any?: return Int.max
        }
    }

    private static func iso(_ date: Date) -> String { InternetTime.text(date) }
}
