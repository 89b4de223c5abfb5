import Foundation
import PinGateTLS

/// pingate's own signed list (v2): one signature over the whole payload, so the list is
/// accepted or refused as a unit, with a sequence number against rollback, an expiry
/// against replay, a key id for signing-key rotation, SPKI pins, wildcard hosts,
/// report-only pins and revocations. `docs/signed-list-v2.md` defines the bytes.
public enum PinGateSignedList {
    /// The `format` value of a v2 envelope.
    public static let formatName = "pingate-signed-list/2"

    /// The outer document: the payload bytes (base64) and a detached signature over them.
    public struct Envelope: Codable, Sendable, Equatable {
        /// Always `pingate-signed-list/2`.
        public var format: String
        /// `PublicKey.keyID` of the signing key.
        public var keyId: String
        /// base64 of the payload bytes; the signature covers exactly these decoded bytes.
        public var payload: String
        /// base64 DER ECDSA-P256-SHA256 over the decoded payload bytes.
        public var signature: String
    }

    /// The signed content.
    public struct Payload: Codable, Sendable, Equatable {
        /// Monotonic: a list with a lower sequence than the one in force is a rollback.
        public var sequence: Int64
        /// Unix seconds when the list was made.
        public var issuedAt: Int64
        /// Unix seconds after which the list is no longer fresh.
        public var expiresAt: Int64
        /// The pins.
        public var pins: [Pin]
        /// base64 SHA-256 certificate or SPKI hashes refused whatever the pins say.
        public var revoked: [String]?

        /// Creates a payload.
        public init(sequence: Int64, issuedAt: Int64, expiresAt: Int64, pins: [Pin], revoked: [String]? = nil) {
            self.sequence = sequence
            self.issuedAt = issuedAt
            self.expiresAt = expiresAt
            self.pins = pins
            self.revoked = revoked
        }
    }

    /// One pin in the payload: exactly one of `sha256` and `spki`.
    public struct Pin: Codable, Sendable, Equatable {
        /// `name`, `*.suffix` or `**.suffix`.
        public var host: String
        /// base64 SHA-256 of the leaf certificate DER.
        public var sha256: String?
        /// base64 SHA-256 of the leaf SubjectPublicKeyInfo DER.
        public var spki: String?
        /// Unix seconds.
        public var expires: Int64
        /// `enforce` (default) or `report-only`.
        public var mode: String?
        /// The position in the validated chain the hash names: absent or `0` is the leaf,
        /// `1` its issuer, …, `"any"` any certificate of the chain. Absent is never
        /// written for a leaf pin, so leaf-only lists keep the bytes they always had.
        public var depth: PinEntry.Depth?

        /// Creates a pin.
        public init(host: String, sha256: String? = nil, spki: String? = nil, expires: Int64, mode: String? = nil,
                    depth: PinEntry.Depth? = nil) {
            self.host = host
            self.sha256 = sha256
            self.spki = spki
            self.expires = expires
            self.mode = mode
            self.depth = depth
        }
    }

    /// True when `data` looks like a v2 envelope (for format detection).
    public static func looksLikeEnvelope(_ data: Data) -> Bool {
        (try? JSONDecoder().decode(Envelope.self, from: data))?.format == formatName
    }

    /// Verifies an envelope with the key named by its `keyId` among `keys`, then parses the payload.
    public static func verify(_ data: Data, keys: [PublicKey], source: String) throws -> PinList {
        guard !keys.isEmpty else { throw PinListError.noVerificationKey }
        let envelope: Envelope
        do {
            envelope = try JSONDecoder().decode(Envelope.self, from: data)
        } catch {
            throw PinListError.malformed("not a pingate v2 envelope: \(error)")
        }
        guard envelope.format == formatName else { throw PinListError.malformed("unknown format \"\(envelope.format)\"") }
        guard let payloadBytes = Data(base64Encoded: envelope.payload) else { throw PinListError.malformed("payload is not base64") }
        guard let key = keys.first(where: { $0.keyID == envelope.keyId }) else {
            throw PinListError.unknownKey(envelope.keyId)
        }
        guard let signature = Data(base64Encoded: envelope.signature),
              key.verifySHA256(signature: Array(signature), message: Array(payloadBytes))
        else { throw PinListError.badSignature("v2 payload") }

        let payload: Payload
        do {
            payload = try JSONDecoder().decode(Payload.self, from: payloadBytes)
        } catch {
            throw PinListError.malformed("payload: \(error)")
        }
        guard payload.expiresAt > payload.issuedAt else { throw PinListError.malformed("expiresAt is not after issuedAt") }
        guard payload.sequence >= 0 else { throw PinListError.malformed("negative sequence") }
        var entries: [PinEntry] = []
        for (index, pin) in payload.pins.enumerated() {
            let host = try HostPattern(parsing: pin.host)
            let (kind, hash) = try PinEntry.Kind.of(sha256: pin.sha256, spki: pin.spki, what: "pin \(index) (\(pin.host))")
            let mode: PinEntry.Mode
            switch pin.mode ?? "enforce" {
            case "enforce": mode = .enforce
            case "report-only": mode = .reportOnly
            default: throw PinListError.malformed("pin \(index) (\(pin.host)): unknown mode \"\(pin.mode ?? "")\"")
            }
            entries.append(PinEntry(host: host, fingerprint: hash, kind: kind, expires: Date(timeIntervalSince1970: TimeInterval(pin.expires)), mode: mode,
                                    depth: pin.depth ?? .leaf))
        }
        let revoked = try (payload.revoked ?? []).enumerated().map { try PinEntry.Kind.canonicalHash($1, what: "revoked[\($0)]") }
        return PinList(source: source, entries: entries, revoked: Set(revoked), metadata: .init(
            format: .pingateV2, sequence: payload.sequence,
            issuedAt: Date(timeIntervalSince1970: TimeInterval(payload.issuedAt)),
            expiresAt: Date(timeIntervalSince1970: TimeInterval(payload.expiresAt)),
            keyID: envelope.keyId))
    }

    /// Signs `payload` with `key` into an envelope (JSON bytes, newline-terminated).
    public static func sign(_ payload: Payload, key: PrivateKey) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let payloadBytes = try encoder.encode(payload)
        let signature = try key.signSHA256(Array(payloadBytes))
        let envelope = Envelope(format: formatName, keyId: try key.publicKey().keyID,
                                payload: payloadBytes.base64EncodedString(), signature: Data(signature).base64EncodedString())
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes, .prettyPrinted]
        return try encoder.encode(envelope) + Data("\n".utf8)
    }
}

/// A depth as lists write it: a JSON integer ≥ 0, or the string `"any"`.
extension PinEntry.Depth: Codable {
    /// Reads an integer ≥ 0 or `"any"`; anything else is malformed.
    public init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let position = try? container.decode(Int.self) {
            guard position >= 0 else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "depth \(position) is negative")
            }
            self = .position(position)
            return
        }
        let text = try container.decode(String.self)
        guard text == "any" else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "depth \"\(text)\" is neither an integer nor \"any\"")
        }
        self = .any
    }

    /// Writes an integer, or `"any"`.
    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .position(let position): try container.encode(position)
        case .any: try container.encode("any")
        }
    }
}
