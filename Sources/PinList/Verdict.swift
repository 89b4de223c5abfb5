/// The pin policy's decision about one upstream connection, as a value with its reason.
/// The proxy acts on it; the policy itself never touches a socket.
public enum Verdict: Sendable, Equatable {
    /// An unexpired pin for the host matched and the chain passed (or the host is
    /// pins-only and the pin is a leaf pin). `pin` says which pin, at which position of
    /// the validated chain (nil only for policies that do not pin, like the harness's attacker).
    case trusted(fingerprint: String, pin: PinMatch? = nil)
    /// The host's pins are report-only and none matched: the traffic passes, the violation
    /// is reported with the hashes observed at every position of the validated chain.
    case reportOnlyViolation(observed: String, expected: [String], observedChain: [CertificateHashes] = [])
    /// The host has unexpired enforced pins and nothing matches them: `observed` is the
    /// leaf's certificate hash, `observedChain` the hashes at every position of the
    /// validated chain (just the leaf when validation failed).
    case untrusted(observed: String, expected: [String], observedChain: [CertificateHashes] = [])
    /// The leaf's certificate or key is on the list's revoked set.
    case revoked(observed: String)
    /// The host has no unexpired pin at all (unknown host, or all its pins expired): deny by default.
    case empty
    /// The leaf is pinned, but the chain or hostname check failed.
    case chainInvalid(reason: String, observed: String)
    /// A challenge-signed Wultra `domainsConfig` says this host needs no pin
    /// (`sslPinningRequired: false`, or unlisted under `sslPinningRequiredForUnlisted:
    /// false`); its chain and host name validated.
    case unpinnedAllowed(observed: String)
    /// Learn mode (`run --learn`): the host has no pin, its chain and host name validated
    /// against the upstream trust, and the traffic passes so that the gate can record what
    /// it saw. Never a verdict outside learn mode.
    case learned(observed: String)

    /// True when the traffic may pass (`trusted`, `reportOnlyViolation`, `unpinnedAllowed`,
    /// and in learn mode `learned`).
    public var isTrusted: Bool {
        switch self {
        case .trusted, .reportOnlyViolation, .unpinnedAllowed, .learned: return true
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
        case .unpinnedAllowed: return "unpinned-allowed"
        case .learned: return "learned"
        }
    }

    /// The certificate fingerprint the upstream presented, when one was seen.
    public var observedFingerprint: String? {
        switch self {
        case .trusted(let fingerprint, _): return fingerprint
        case .reportOnlyViolation(let observed, _, _), .untrusted(let observed, _, _), .revoked(let observed): return observed
        case .chainInvalid(_, let observed), .unpinnedAllowed(let observed), .learned(let observed): return observed
        case .empty: return nil
        }
    }

    /// The pin that carried a `trusted` verdict.
    public var matchedPin: PinMatch? {
        if case .trusted(_, let pin) = self { return pin }
        return nil
    }

    /// The hashes at every position of the validated chain, for a pin failure.
    public var observedChain: [CertificateHashes] {
        switch self {
        case .untrusted(_, _, let chain), .reportOnlyViolation(_, _, let chain): return chain
        default: return []
        }
    }

    /// One line for logs and reports: `trusted by depth-1 spki …`, or the reason token.
    public var summary: String {
        if let pin = matchedPin { return "trusted by \(pin)" }
        return reasonToken
    }
}
