import Foundation

/// Turns what an upstream handshake proved into a `Verdict`, following the Wultra model:
/// an entry matches when its name equals the host and its fingerprint equals
/// base64(SHA-256(leaf DER)); expired entries do not count; no unexpired entry means `empty`.
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

    /// True when `host` has at least one unexpired pin, i.e. when an upstream connection
    /// is worth making at all. The gate makes no outbound connection otherwise.
    public func isPinned(host: String, list: PinList?, now: Date) -> Bool {
        guard let list else { return false }
        return !list.unexpiredEntries(for: HostName.normalize(host), at: now).isEmpty
    }

    /// The verdict for `host` presenting a leaf with `leafFingerprint`.
    ///
    /// The pin is checked before the chain: a mismatching pin is the stronger statement
    /// (someone else's certificate), so it is what the refusal reports.
    public func evaluate(host: String, leafFingerprint: String?, chain: ChainCheck, list: PinList?, now: Date) -> Verdict {
        let name = HostName.normalize(host)
        guard let list else { return .empty }
        let pins = list.unexpiredEntries(for: name, at: now)
        guard !pins.isEmpty else { return .empty }
        guard let observed = leafFingerprint else {
            return .chainInvalid(reason: "the upstream presented no certificate", observed: "")
        }
        guard pins.contains(where: { $0.fingerprint == observed }) else {
            return .untrusted(observed: observed, expected: pins.map(\.fingerprint))
        }
        if !chain.valid && !pinsOnlyHosts.contains(name) {
            return .chainInvalid(reason: chain.reason, observed: observed)
        }
        return .trusted(fingerprint: observed)
    }
}
