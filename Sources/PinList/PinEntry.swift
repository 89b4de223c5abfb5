import Foundation

/// One pin: which hosts it covers, what it pins (a certificate or its public key, at a
/// position of the validated chain), until when, and whether a mismatch refuses the
/// connection or is only reported.
public struct PinEntry: Sendable, Equatable {
    /// Which certificate of the validated chain a pin names. Positions count in the chain
    /// OpenSSL built and verified to a trust anchor (leaf 0, its issuer 1, …), never in
    /// what the server sent.
    public enum Depth: Sendable, Equatable, Hashable, CustomStringConvertible {
        /// One position: 0 is the leaf (the default), 1 the leaf's issuer, and so on.
        case position(Int)
        /// Any certificate of the validated chain (TrustKit's rule), the anchor included.
        case any

        /// The leaf: what every pin named before depth pins existed.
        public static let leaf = Depth.position(0)

        /// Parses `0`, `1`, … or `any`; nil for anything else (negative numbers included).
        public init?(parsing text: String) {
            if text == "any" {
                self = .any
            } else if let position = Int(text), position >= 0 {
                self = .position(position)
            } else {
                return nil
            }
        }

        /// True for a pin on the leaf alone: the only kind `pins-only` hosts may rely on
        /// without chain validation.
        public var isLeaf: Bool { self == .leaf }

        /// `0`, `1`, … or `any`, as lists write it.
        public var description: String {
            switch self {
            case .position(let position): return String(position)
            case .any: return "any"
            }
        }
    }

    /// What the fingerprint is a hash of.
    public enum Kind: String, Sendable, Equatable {
        /// SHA-256 of the leaf certificate's DER (Wultra).
        case certificate = "sha256"
        /// SHA-256 of the leaf's SubjectPublicKeyInfo DER (TrustKit, HPKP, OkHttp).
        case spki

        /// The kind and the canonical base64 hash of a pin written with a `sha256` or an
        /// `spki` field, as pingate v2 lists and their drafts write pins: exactly one of
        /// the two, base64 of 32 bytes. `what` names the pin in the error.
        public static func of(sha256: String?, spki: String?, what: String) throws -> (kind: Kind, hash: String) {
            let kind: Kind
            let text: String
            switch (sha256, spki) {
            case (let hash?, nil): (kind, text) = (.certificate, hash)
            case (nil, let hash?): (kind, text) = (.spki, hash)
            default: throw PinListError.malformed("\(what) needs exactly one of sha256 and spki")
            }
            return (kind, try canonicalHash(text, what: what))
        }

        /// `text` as canonical base64, checked to be a 32-byte SHA-256.
        static func canonicalHash(_ text: String, what: String) throws -> String {
            guard let digest = Data(base64Encoded: text), digest.count == 32 else {
                throw PinListError.malformed("\(what): not base64 of a 32-byte SHA-256")
            }
            return digest.base64EncodedString()
        }
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
    /// Which certificate of the validated chain the fingerprint names.
    public let depth: Depth

    /// Creates a pin.
    public init(host: HostPattern, fingerprint: String, kind: Kind = .certificate, expires: Date, mode: Mode = .enforce,
                depth: Depth = .leaf) {
        self.host = host
        self.fingerprint = fingerprint
        self.kind = kind
        self.expires = expires
        self.mode = mode
        self.depth = depth
    }

    /// A Wultra-style entry: an exact name, a certificate hash, enforced, at `depth`.
    public init(name: String, fingerprint: String, expires: Date, depth: Depth = .leaf) {
        self.init(host: .exact(HostName.normalize(name)), fingerprint: fingerprint, expires: expires, depth: depth)
    }

    /// The pattern as text (the host name for exact pins).
    public var name: String { host.description }

    /// True while the pin still counts at `now`.
    public func isUnexpired(at now: Date) -> Bool { expires > now }

    /// True when the certificate's hash of the pinned kind equals the fingerprint
    /// (wherever that certificate sits: `match(leaf:verifiedChain:)` checks the position).
    public func matches(_ certificate: CertificateHashes) -> Bool {
        switch kind {
        case .certificate: return certificate.certificateSHA256 == fingerprint
        case .spki: return certificate.spkiSHA256 == fingerprint
        }
    }

    /// Where this pin matches: `leaf` for a leaf pin; for a depth pin, the position it
    /// names (or the first position, for `any`) in `verifiedChain`, which must be the chain
    /// OpenSSL validated (empty when validation failed, so depth pins then never match).
    public func match(leaf: CertificateHashes, verifiedChain: [CertificateHashes]) -> PinMatch? {
        switch depth {
        case .position(0):
            return matches(leaf) ? PinMatch(pin: self, position: 0) : nil
        case .position(let position):
            guard verifiedChain.indices.contains(position), matches(verifiedChain[position]) else { return nil }
            return PinMatch(pin: self, position: position)
        case .any:
            return verifiedChain.firstIndex(where: matches).map { PinMatch(pin: self, position: $0) }
        }
    }

    /// The key `PinMatch.statisticsKey` gives this pin's matches.
    public var statisticsKey: String { Self.statisticsKey(host: name, depth: depth, kind: kind, fingerprint: fingerprint) }

    static func statisticsKey(host: String, depth: Depth, kind: Kind, fingerprint: String) -> String {
        "\(host) depth-\(depth) \(kind.rawValue) \(fingerprint)"
    }

    /// The pin as TrustKit and reports write it, e.g. `pin-sha256="…"`, with the kind,
    /// and `; depth=1` (or `any`) for a pin on another position than the leaf.
    public var reportText: String {
        let depthText = depth.isLeaf ? "" : "; depth=\(depth)"
        switch kind {
        case .certificate: return "cert-sha256=\"\(fingerprint)\"" + depthText
        case .spki: return "pin-sha256=\"\(fingerprint)\"" + depthText
        }
    }
}

/// Which pin carried a verdict, and where in the validated chain it matched: what
/// `/pins`, `/refusals`, the decision log and violation reports show, e.g.
/// `depth-1 spki …`.
public struct PinMatch: Sendable, Equatable, Hashable, CustomStringConvertible {
    /// The position in the validated chain whose hash matched (0 is the leaf).
    public let position: Int
    /// The depth the pin named (`any` matches at `position`).
    public let depth: PinEntry.Depth
    /// What the matched fingerprint hashes.
    public let kind: PinEntry.Kind
    /// The matched fingerprint.
    public let fingerprint: String
    /// The pattern of the pin that matched.
    public let host: String

    /// The match of `pin` at `position`.
    public init(pin: PinEntry, position: Int) {
        self.position = position
        depth = pin.depth
        kind = pin.kind
        fingerprint = pin.fingerprint
        host = pin.name
    }

    /// The pin this match is for, as a key: host pattern, depth, kind and fingerprint
    /// (the same pin's matches at different positions, for `any`, share it).
    public var statisticsKey: String { PinEntry.statisticsKey(host: host, depth: depth, kind: kind, fingerprint: fingerprint) }

    /// E.g. `depth-1 spki 4Ks…=` (and `(pin depth any)` when the pin named any position).
    public var description: String {
        let any = depth == .any ? " (pin depth any)" : ""
        return "depth-\(position) \(kind.rawValue) \(fingerprint)\(any)"
    }
}

/// The two hashes of a certificate that pins can name (the leaf's, or any certificate
/// of a validated chain).
public struct CertificateHashes: Sendable, Equatable, Hashable {
    /// base64(SHA-256(certificate DER)).
    public let certificateSHA256: String
    /// base64(SHA-256(SubjectPublicKeyInfo DER)); nil when only the certificate's hash
    /// is known (then SPKI pins cannot match it).
    public let spkiSHA256: String?

    /// Creates the hashes from the certificate hash and, when known, the SPKI hash.
    public init(certificateSHA256: String, spkiSHA256: String?) {
        self.certificateSHA256 = certificateSHA256
        self.spkiSHA256 = spkiSHA256
    }
}
