/// The pin policy's decision about one upstream connection, as a value with its reason.
/// The proxy acts on it; the policy itself never touches a socket.
public enum Verdict: Sendable, Equatable {
    /// The leaf matches an unexpired pin for the host and the chain passed (or the host is pins-only).
    case trusted(fingerprint: String)
    /// The host's pins are report-only and none matched: the traffic passes, the violation is reported.
    case reportOnlyViolation(observed: String, expected: [String])
    /// The host has unexpired enforced pins and the leaf matches none of them.
    case untrusted(observed: String, expected: [String])
    /// The leaf's certificate or key is on the list's revoked set.
    case revoked(observed: String)
    /// The host has no unexpired pin at all (unknown host, or all its pins expired): deny by default.
    case empty
    /// The leaf is pinned, but the chain or hostname check failed.
    case chainInvalid(reason: String, observed: String)

    /// True when the traffic may pass (`trusted` and `reportOnlyViolation`).
    public var isTrusted: Bool {
        switch self {
        case .trusted, .reportOnlyViolation: return true
        default: return false
        }
    }

    /// The machine-readable reason token sent in `Pingate-Refusal` and written to logs.
    public var reasonToken: String {
        switch self {
        case .trusted: return "trusted"
        case .reportOnlyViolation: return "report-only-violation"
        case .untrusted: return "pin-mismatch"
        case .revoked: return "revoked"
        case .empty: return "empty"
        case .chainInvalid: return "chain-invalid"
        }
    }

    /// The certificate fingerprint the upstream presented, when one was seen.
    public var observedFingerprint: String? {
        switch self {
        case .trusted(let fingerprint): return fingerprint
        case .reportOnlyViolation(let observed, _), .untrusted(let observed, _), .revoked(let observed): return observed
        case .chainInvalid(_, let observed): return observed
        case .empty: return nil
        }
    }
}
