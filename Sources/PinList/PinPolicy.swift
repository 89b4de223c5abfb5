import Foundation

/// Turns what an upstream handshake proved into a `Verdict`.
///
/// Wultra's model, extended: a pin matches when its host pattern covers the host and its
/// hash (certificate or SPKI) equals that of the certificate at the position it names in
/// the validated chain (the leaf by default); expired pins and stale lists do not count;
/// no unexpired pin means `empty`; a revoked leaf is refused whatever else matches.
public struct PinPolicy: Sendable {
    /// What the TLS layer concluded about the chain and hostname.
    public struct ChainCheck: Sendable, Equatable {
        /// True when the chain reached a trusted root and the certificate names the host.
        public var valid: Bool
        /// OpenSSL's reason when it did not.
        public var reason: String
        /// The hashes of the chain OpenSSL built and verified (leaf first, trust anchor
        /// last); empty when validation failed. Depth pins are matched here only.
        public var verifiedChain: [CertificateHashes]

        /// Creates a chain-check result.
        public init(valid: Bool, reason: String, verifiedChain: [CertificateHashes] = []) {
            self.valid = valid
            self.reason = reason
            self.verifiedChain = verifiedChain
        }
    }

    /// Hosts whose leaf pins alone decide (e.g. a pinned self-signed origin); chain errors
    /// are ignored for their depth-0 pins. Depth pins always need a validated chain.
    public let pinsOnlyHosts: Set<String>

    /// Creates a policy; `pinsOnlyHosts` are normalized.
    public init(pinsOnlyHosts: Set<String> = []) {
        self.pinsOnlyHosts = Set(pinsOnlyHosts.map(HostName.normalize))
    }

    /// True when an upstream connection to `host` is worth making at all: it has an
    /// unexpired pin in a fresh list, or the list's signed domain rules let it through
    /// unpinned. The gate makes no outbound connection otherwise.
    public func isPinned(host: String, list: PinList?, now: Date) -> Bool {
        guard let list, list.isFresh(at: now) else { return false }
        let name = HostName.normalize(host)
        return list.allowsUnpinned(name) || !list.unexpiredEntries(for: name, at: now).isEmpty
    }

    /// The verdict for `host` presenting `leaf`, with `chain` the TLS layer's check.
    ///
    /// For enforced pins the pin is checked before the chain: a mismatch is the stronger
    /// statement (someone else's certificate), so it is what the refusal reports; except
    /// that depth pins cannot be checked at all without a validated chain, so a host with
    /// depth pins and a failed chain is refused as `chain-invalid`. For report-only hosts
    /// the chain still has to pass; only the pin check is softened.
    public func evaluate(host: String, leaf: CertificateHashes?, chain: ChainCheck, list: PinList?, now: Date) -> Verdict {
        let name = HostName.normalize(host)
        guard let list, list.isFresh(at: now) else { return .empty }
        let pins = list.unexpiredEntries(for: name, at: now)
        let unpinnedAllowed = list.allowsUnpinned(name)
        guard !pins.isEmpty || unpinnedAllowed else { return .empty }
        guard let leaf else { return .chainInvalid(reason: "the upstream presented no certificate", observed: "") }
        let observed = leaf.certificateSHA256
        if list.revokes(leaf) {
            return .revoked(observed: observed)
        }
        // Only a chain OpenSSL validated has positions worth pinning.
        let verifiedChain = chain.valid ? chain.verifiedChain : []
        if unpinnedAllowed {
            // No pin needed, but never no validation: pins-only does not apply here.
            guard chain.valid else { return .chainInvalid(reason: chain.reason, observed: observed) }
            return .unpinnedAllowed(observed: observed)
        }
        let leafChainAccepted = chain.valid || pinsOnlyHosts.contains(name)
        let observedChain = verifiedChain.isEmpty ? [leaf] : verifiedChain
        let matches = pins.compactMap { $0.match(leaf: leaf, verifiedChain: verifiedChain) }
        let enforced = pins.contains { $0.mode == .enforce }
        guard let match = matches.first else {
            if !chain.valid && pins.contains(where: { !$0.depth.isLeaf }) {
                return .chainInvalid(reason: chain.reason + " (depth pins are checked only on a validated chain)", observed: observed)
            }
            if enforced { return .untrusted(observed: observed, expected: pins.map(\.fingerprint), observedChain: observedChain) }
            // Report-only leaf pins: pins-only relaxes the chain for them as before.
            guard leafChainAccepted else { return .chainInvalid(reason: chain.reason, observed: observed) }
            return .reportOnlyViolation(observed: observed, expected: pins.map(\.fingerprint), observedChain: observedChain)
        }
        // A leaf match on a chain that failed validation stands only for pins-only hosts;
        // depth matches exist only on a validated chain.
        guard leafChainAccepted else { return .chainInvalid(reason: chain.reason, observed: observed) }
        return .trusted(fingerprint: observed, pin: match)
    }
}
