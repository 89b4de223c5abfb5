import Foundation

/// One pinned certificate: a host name, the base64 SHA-256 of the leaf's DER, and when
/// the pin stops counting.
public struct PinEntry: Sendable, Equatable, Codable {
    /// The normalized host name the pin applies to.
    public let name: String
    /// base64(SHA-256(leaf certificate DER)).
    public let fingerprint: String
    /// When the pin expires; expired pins are ignored.
    public let expires: Date

    /// Creates an entry; `name` is normalized.
    public init(name: String, fingerprint: String, expires: Date) {
        self.name = HostName.normalize(name)
        self.fingerprint = fingerprint
        self.expires = expires
    }

    /// True while the pin still counts at `now`.
    public func isUnexpired(at now: Date) -> Bool { expires > now }
}
