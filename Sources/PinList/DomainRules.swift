/// Wultra's `domainsConfig` (Mobile Utility Server 2.x): which domains need a pin, and
/// whether unlisted domains do. Field names and rules follow Wultra's clients
/// (`wultra/ssl-pinning-ios` and `wultra/ssl-pinning-android`, "Domain bypass
/// configuration": a listed domain with `sslPinningRequired: false` is trusted without
/// a fingerprint check, an unlisted one follows `sslPinningRequiredForUnlisted`).
///
/// A rule that lets a domain through unpinned is a bypass list, so pingate honours it only
/// from a response signed over a fresh challenge (see `PinListStore.install`), drops it
/// when a newer response omits it, and never takes it from a fallback or a file. The chain
/// and host name must still validate: "no pin" never means "no TLS validation".
public struct DomainRules: Sendable, Equatable {
    /// Whether domains not in `domains` need a pin. Absent in the response means true,
    /// which keeps pingate's deny by default.
    public let pinningRequiredForUnlisted: Bool
    /// Normalized domain name → `sslPinningRequired`.
    public let domains: [String: Bool]

    /// Rules from the response's values; names are normalized.
    public init(pinningRequiredForUnlisted: Bool, domains: [String: Bool]) {
        self.pinningRequiredForUnlisted = pinningRequiredForUnlisted
        // Names that normalize alike (or are listed twice): the stricter entry wins.
        self.domains = Dictionary(domains.map { (HostName.normalize($0.key), $0.value) }, uniquingKeysWith: { $0 || $1 })
    }

    /// True when some host may pass without a pin (a listed domain with
    /// `sslPinningRequired: false`, or unlisted ones under `false`).
    public var allowsSomeUnpinned: Bool { !pinningRequiredForUnlisted || domains.values.contains(false) }

    /// True when `host` (normalized) must match a pin.
    public func pinningRequired(for host: String) -> Bool {
        domains[host] ?? pinningRequiredForUnlisted
    }
}
