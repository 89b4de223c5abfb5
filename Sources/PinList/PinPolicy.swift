import Foundation

/// Turns what an upstream handshake proved into a `Verdict`.
///
/// Wultra's model, extended: a pin matches when its host pattern covers the host and its
/// hash equals the leaf's (certificate or SPKI); expired pins and stale lists do not
/// count; no unexpired pin means `empty`; a revoked leaf is refused whatever else matches.
public struct PinPolicy: Sendable {
    /// What the TLS layer concluded about the chain and hostname.
    public struct ChainCheck: Sendable, Equatable {
        /// True when the chain reached a trusted root and the certificate names the host.
        public var valid: Bool
        /// OpenSSL's reason when it did not.
        public var reason: String

        /// Creates a chain-check result.
        public init(valid: Bool, reason: String) {
            self.valid = valid
            self.reason = reason
        }
    }

    /// Hosts whose pin alone decides (e.g. a pinned self-signed origin); chain errors are ignored for them.
    public let pinsOnlyHosts: Set<String>

    /// Creates a policy; `pinsOnlyHosts` are normalized.
    public init(pinsOnlyHosts: Set<String> = []) {
        self.pinsOnlyHosts = Set(pinsOnlyHosts.map(HostName.normalize))
    }

    /// True when `host` has at least one unexpired pin in a fresh list, i.e. when an
    /// upstream connection is worth making at all. The gate makes no outbound connection otherwise.
    public func isPinned(host: String, list: PinList?, now: Date) -> Bool {
        guard let list, list.isFresh(at: now) else { return false }
        return !list.unexpiredEntries(for: HostName.normalize(host), at: now).isEmpty
    }

    /// The verdict for `host` presenting `leaf`.
    ///
    /// For enforced pins the pin is checked before the chain: a mismatch is the stronger
    /// statement (someone else's certificate), so it is what the refusal reports. For
    /// report-only hosts the chain still has to pass; only the pin check is softened.
    public func evaluate(host: String, leaf: LeafIdentity?, chain: ChainCheck, list: PinList?, now: Date) -> Verdict {
        let name = HostName.normalize(host)
        guard let list, list.isFresh(at: now) else { return .empty }
        let pins = list.unexpiredEntries(for: name, at: now)
        guard !pins.isEmpty else { return .empty }
        guard let leaf else { return .chainInvalid(reason: "the upstream presented no certificate", observed: "") }
        let observed = leaf.certificateSHA256
        if list.revoked.contains(leaf.certificateSHA256) || (leaf.spkiSHA256.map(list.revoked.contains) ?? false) {
            return .revoked(observed: observed)
        }
        let chainAccepted = chain.valid || pinsOnlyHosts.contains(name)
        let matched = pins.contains { $0.matches(leaf) }
        let enforced = pins.contains { $0.mode == .enforce }
        if !matched {
            if enforced { return .untrusted(observed: observed, expected: pins.map(\.fingerprint)) }
            guard chainAccepted else { return .chainInvalid(reason: chain.reason, observed: observed) }
            return .reportOnlyViolation(observed: observed, expected: pins.map(\.fingerprint))
        }
        guard chainAccepted else { return .chainInvalid(reason: chain.reason, observed: observed) }
        return .trusted(fingerprint: observed)
    }
}
