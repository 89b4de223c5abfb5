import Foundation
import PinGateTLS

/// The Wultra static fingerprint list: `{"fingerprints": [{name, fingerprint, expires, signature}]}`,
/// with each entry signed on its own.
///
/// Signed bytes per entry are the UTF-8 of `name + "&" + fingerprint + "&" + expires`, with
/// `fingerprint` exactly as written in the JSON and `expires` in decimal: what Wultra's
/// code (iOS, Android and ssl-pinning-tool alike) signs, whatever its README says.
public enum WultraStaticList {
    /// One entry as it stands in the JSON.
    public struct SignedEntry: Codable, Sendable, Equatable {
        /// The host name (common name) the pin is for.
        public var name: String
        /// base64(SHA-256(leaf DER)), exactly as written (it is signed as text).
        public var fingerprint: String
        /// Expiry, Unix seconds.
        public var expires: Int64
        /// base64 DER ECDSA-P256-SHA256 over `name&fingerprint&expires`.
        public var signature: String

        /// Creates an entry from its JSON fields.
        public init(name: String, fingerprint: String, expires: Int64, signature: String) {
            self.name = name
            self.fingerprint = fingerprint
            self.expires = expires
            self.signature = signature
        }

        /// The exact bytes the signature covers.
        public var signedBytes: [UInt8] { WultraStaticList.signedBytes(name: name, fingerprint: fingerprint, expires: expires) }
    }

    private struct Document: Codable {
        var fingerprints: [SignedEntry]
    }

    /// The bytes a static-list signature covers.
    public static func signedBytes(name: String, fingerprint: String, expires: Int64) -> [UInt8] {
        Array("\(name)&\(fingerprint)&\(expires)".utf8)
    }

    /// Parses and verifies a whole list. Every entry must verify under one of `keys`;
    /// one bad entry rejects everything, so a list is either wholly trusted or not used.
    public static func verify(_ data: Data, keys: [PublicKey]) throws -> [PinEntry] {
        guard !keys.isEmpty else { throw PinListError.noVerificationKey }
        let document: Document
        do {
            document = try JSONDecoder().decode(Document.self, from: data)
        } catch {
            throw PinListError.malformed(describe(error))
        }
        var entries: [PinEntry] = []
        entries.reserveCapacity(document.fingerprints.count)
        for (index, entry) in document.fingerprints.enumerated() {
            guard let digest = Data(base64Encoded: entry.fingerprint), digest.count == 32 else {
                throw PinListError.malformed("entry \(index) (\(entry.name)): fingerprint is not base64 of 32 bytes")
            }
            guard !entry.name.isEmpty else { throw PinListError.malformed("entry \(index): empty name") }
            guard let signature = Data(base64Encoded: entry.signature),
                  keys.contains(where: { $0.verifySHA256(signature: Array(signature), message: entry.signedBytes) })
            else { throw PinListError.badEntrySignature(index: index, name: entry.name) }
            entries.append(PinEntry(
                name: entry.name,
                // Canonical base64, so the policy can compare text with text.
                fingerprint: digest.base64EncodedString(),
                expires: Date(timeIntervalSince1970: TimeInterval(entry.expires))
            ))
        }
        return entries
    }

    /// Signs one entry with `key`.
    public static func sign(name: String, fingerprint: String, expires: Int64, key: PrivateKey) throws -> SignedEntry {
        let signature = try key.signSHA256(signedBytes(name: name, fingerprint: fingerprint, expires: expires))
        return SignedEntry(name: name, fingerprint: fingerprint, expires: expires, signature: Data(signature).base64EncodedString())
    }

    /// The JSON document for `entries`, one entry per line for readable diffs.
    public static func encode(_ entries: [SignedEntry]) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let lines = try entries.map { String(decoding: try encoder.encode($0), as: UTF8.self) }
        return "{\"fingerprints\":[\n" + lines.map { " " + $0 }.joined(separator: ",\n") + "\n]}\n"
    }

    private static func describe(_ error: Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let context):
            return "missing field \"\(key.stringValue)\" at \(path(context.codingPath))"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            return "wrong type at \(path(context.codingPath)): \(context.debugDescription)"
        case DecodingError.dataCorrupted(let context):
            return "not valid JSON at \(path(context.codingPath)): \(context.debugDescription)"
        default:
            return "\(error)"
        }
    }

    private static func path(_ codingPath: [CodingKey]) -> String {
        codingPath.isEmpty ? "top level" : codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
    }
}
