import Foundation

/// One pin: which hosts it covers, what it pins (the leaf certificate or its public key),
/// until when, and whether a mismatch refuses the connection or is only reported.
public struct PinEntry: Sendable, Equatable {
    /// What the fingerprint is a hash of.
    public enum Kind: String, Sendable, Equatable {
        /// SHA-256 of the leaf certificate's DER (Wultra).
        case certificate = "sha256"
        /// SHA-256 of the leaf's SubjectPublicKeyInfo DER (TrustKit, HPKP, OkHttp).
        case spki
    }

    /// What a mismatch does.
    public enum Mode: String, Sendable, Equatable {
        /// Refuse the connection.
        case enforce
        /// Let it through, but log, count and report the violation.
        case reportOnly = "report-only"
    }

    /// The hosts the pin covers.
    public let host: HostPattern
    /// base64(SHA-256(…)) in canonical base64.
    public let fingerprint: String
    /// What `fingerprint` hashes.
    public let kind: Kind
    /// When the pin expires; expired pins are ignored.
    public let expires: Date
    /// What a mismatch does.
    public let mode: Mode

    /// Creates a pin.
    public init(host: HostPattern, fingerprint: String, kind: Kind = .certificate, expires: Date, mode: Mode = .enforce) {
        self.host = host
        self.fingerprint = fingerprint
        self.kind = kind
        self.expires = expires
        self.mode = mode
    }

    /// A Wultra-style entry: an exact name, a certificate hash, enforced.
    public init(name: String, fingerprint: String, expires: Date) {
        self.init(host: .exact(HostName.normalize(name)), fingerprint: fingerprint, expires: expires)
    }

    /// The pattern as text (the host name for exact pins).
    public var name: String { host.description }

    /// True while the pin still counts at `now`.
    public func isUnexpired(at now: Date) -> Bool { expires > now }

    /// True when the leaf's hash of the pinned kind equals the fingerprint.
    public func matches(_ leaf: LeafIdentity) -> Bool {
        switch kind {
        case .certificate: return leaf.certificateSHA256 == fingerprint
        case .spki: return leaf.spkiSHA256 == fingerprint
        }
    }

    /// The pin as TrustKit and reports write it, e.g. `pin-sha256="…"`, with the kind.
    public var reportText: String {
        switch kind {
        case .certificate: return "cert-sha256=\"\(fingerprint)\""
        case .spki: return "pin-sha256=\"\(fingerprint)\""
        }
    }
}

/// The two hashes of a leaf certificate that pins can name.
public struct LeafIdentity: Sendable, Equatable, Hashable {
    /// base64(SHA-256(certificate DER)).
    public let certificateSHA256: String
    /// base64(SHA-256(SubjectPublicKeyInfo DER)); nil when only the certificate's hash
    /// is known (then SPKI pins cannot match it).
    public let spkiSHA256: String?

    /// Creates an identity from the certificate hash and, when known, the SPKI hash.
    public init(certificateSHA256: String, spkiSHA256: String?) {
        self.certificateSHA256 = certificateSHA256
        self.spkiSHA256 = spkiSHA256
    }
}
