import Foundation

/// Checks a verified list for what makes pinning fragile or pointless before it is
/// published: `pingate list lint`. Each finding is a warning, except an expiry already past,
/// which is an error: the gate refuses every connection the list or pin was for.
public enum PinListLint {
    /// One warning about the list.
    public struct Finding: Sendable, Equatable, CustomStringConvertible {
        /// What kind of problem it is.
        public enum Rule: String, Sendable, Equatable {
            /// A host with one pin and no backup (TrustKit's two-pin rule).
            case singlePin = "single-pin"
            /// A pin (or the v2 list itself) expires within the warning window.
            case expiresSoon = "expires-soon"
            /// A pin (or the v2 list itself) has expired already: an error, not a warning.
            case expired
            /// A wildcard pattern covers a public suffix (e.g. `*.co.uk`).
            case publicSuffixWildcard = "public-suffix-wildcard"
            /// A depth pin names the only trust anchor configured, so it restricts nothing.
            case pinsOnlyTrustAnchor = "pins-only-trust-anchor"
        }

        /// The rule.
        public let rule: Rule
        /// The host pattern concerned (`-` for the list as a whole).
        public let host: String
        /// What is wrong and what to do.
        public let message: String

        /// True for a finding that makes the list unusable as it stands (`expired`).
        public var isError: Bool { rule == .expired }

        /// `warning: [rule] host: message`, or `error: …`.
        public var description: String { "\(isError ? "error" : "warning"): [\(rule.rawValue)] \(host): \(message)" }
    }

    /// Pins expiring closer than this are flagged: Wultra's expiration update threshold.
    public static let expiryWarning: TimeInterval = 14 * 86_400

    /// Common public suffixes of more than one label. A small built-in list, not the
    /// Public Suffix List: every single-label suffix (a TLD) also counts.
    public static let multiLabelPublicSuffixes: Set<String> = [
        "co.uk", "org.uk", "ac.uk", "gov.uk", "ltd.uk", "plc.uk", "me.uk", "net.uk",
        "com.au", "net.au", "org.au", "edu.au", "gov.au",
        "co.nz", "org.nz", "net.nz", "co.jp", "ne.jp", "or.jp", "ac.jp", "go.jp",
        "co.kr", "or.kr", "com.br", "net.br", "org.br", "com.cn", "net.cn", "org.cn",
        "co.in", "net.in", "org.in", "co.za", "org.za", "com.mx", "com.tr", "com.tw",
        "com.sg", "com.hk", "com.ar", "co.il", "co.id", "com.my", "com.ph", "com.vn",
        "github.io", "gitlab.io", "herokuapp.com", "appspot.com", "cloudfront.net",
        "azurewebsites.net", "blogspot.com", "netlify.app", "vercel.app", "pages.dev", "workers.dev",
    ]

    /// True when `suffix` (normalized) is a public suffix as far as this linter knows.
    public static func isPublicSuffix(_ suffix: String) -> Bool {
        !suffix.contains(".") || multiLabelPublicSuffixes.contains(suffix)
    }

    /// The findings for `list` at `now`. `trustAnchors` are the hashes of the roots the
    /// gate is configured with (nil when unknown: the anchor check is skipped).
    public static func findings(for list: PinList, now: Date, trustAnchors: [CertificateHashes]?) -> [Finding] {
        var findings: [Finding] = []
        let stamp = ISO8601DateFormatter()
        if let expiresAt = list.metadata.expiresAt, expiresAt <= now {
            findings.append(Finding(rule: .expired, host: "-",
                                    message: "the list itself expired at \(stamp.string(from: expiresAt)): a gate refuses every CONNECT under it (list-expired); sign and publish a new one"))
        } else if let expiresAt = list.metadata.expiresAt, expiresAt.timeIntervalSince(now) < expiryWarning {
            findings.append(Finding(rule: .expiresSoon, host: "-",
                                    message: "the list itself expires at \(stamp.string(from: expiresAt)); sign and publish a new one"))
        }
        let unexpired = list.entries.filter { $0.isUnexpired(at: now) }
        let byHost = Dictionary(grouping: unexpired, by: \.name)
        for host in byHost.keys.sorted() {
            let pins = byHost[host] ?? []
            if Set(pins.map(\.fingerprint)).count < 2 {
                // The backup to suggest depends on where the one pin sits: a CA's key pinned
                // at depth 1 or deeper has no "issuing CA at depth 1" to add.
                let backup = pins.allSatisfy(\.depth.isLeaf)
                    ? "a spare key, or the issuing CA's key at depth 1"
                    : "a second CA's key at the same depth, or the leaf's key at depth 0"
                findings.append(Finding(rule: .singlePin, host: host,
                                        message: "one pin and no backup: a certificate or key change refuses every connection until a new list is out; add a backup pin (\(backup))"))
            }
        }
        for pin in list.entries.sorted(by: { ($0.name, $0.expires) < ($1.name, $1.expires) }) {
            let left = pin.expires.timeIntervalSince(now)
            if left <= 0 {
                findings.append(Finding(rule: .expired, host: pin.name,
                                        message: "the \(pin.kind.rawValue) pin \(pin.fingerprint) expired at \(stamp.string(from: pin.expires)): it matches nothing any more; drop or renew it"))
            } else if left < expiryWarning {
                findings.append(Finding(rule: .expiresSoon, host: pin.name,
                                        message: "the \(pin.kind.rawValue) pin \(pin.fingerprint) expires at \(stamp.string(from: pin.expires))"))
            }
        }
        var flaggedPatterns = Set<String>()
        for pin in list.entries {
            switch pin.host {
            case .singleLabel(let suffix), .anyDepth(let suffix):
                guard isPublicSuffix(suffix), flaggedPatterns.insert(pin.name).inserted else { continue }
                findings.append(Finding(rule: .publicSuffixWildcard, host: pin.name,
                                        message: "\(suffix) is a public suffix: the pattern covers every site registered under it, not one organisation's hosts"))
            case .exact:
                continue
            }
        }
        if let trustAnchors, trustAnchors.count == 1, let anchor = trustAnchors.first {
            for pin in list.entries where !pin.depth.isLeaf && pin.matches(anchor) {
                findings.append(Finding(rule: .pinsOnlyTrustAnchor, host: pin.name,
                                        message: "the depth-\(pin.depth) \(pin.kind.rawValue) pin \(pin.fingerprint) names the only trust anchor configured: every chain the gate validates ends there, so the pin restricts nothing"))
            }
        }
        return findings
    }
}
