internal import COpenSSL
import Foundation

/// An ECDSA P-256 public key that verifies list signatures, owning one `EVP_PKEY`.
///
/// `@unchecked Sendable`: immutable after creation; verification uses a fresh
/// `EVP_MD_CTX` per call, which OpenSSL allows concurrently on one key.
public final class PublicKey: @unchecked Sendable {
    let pointer: OpaquePointer

    /// The fixed DER prefix of a P-256 SubjectPublicKeyInfo whose key is a 65-byte
    /// uncompressed point: SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING }.
    /// Prepending it turns Wultra's raw X9.63 point into a standard SPKI.
    private static let p256SPKIPrefix: [UInt8] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
        0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ]

    init(owning pointer: OpaquePointer) throws {
        self.pointer = pointer
        try requireP256()
    }

    deinit { EVP_PKEY_free(pointer) }

    /// Parses a DER SubjectPublicKeyInfo.
    public convenience init(spkiDER: [UInt8]) throws {
        OpenSSLErrorQueue.clear()
        let parsed: OpaquePointer? = spkiDER.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_PUBKEY(nil, &cursor, buffer.count)
        }
        guard let parsed else { throw OpenSSLError.drained("parse public key DER") }
        try self.init(owning: parsed)
    }

    /// Parses a PEM SubjectPublicKeyInfo ("-----BEGIN PUBLIC KEY-----").
    public convenience init(pem: String) throws {
        let bio = try MemoryBIO(bytes: Array(pem.utf8))
        OpenSSLErrorQueue.clear()
        guard let parsed = PEM_read_bio_PUBKEY(bio.pointer, nil, nil, nil) else {
            throw OpenSSLError.drained("parse public key PEM")
        }
        try self.init(owning: parsed)
    }

    /// Parses Wultra's configuration form: base64 of the 65-byte uncompressed point `04‖X‖Y`.
    public convenience init(x963Base64 text: String) throws {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let point = Data(base64Encoded: trimmed), point.count == 65, point.first == 0x04 else {
            throw OpenSSLError(operation: "parse X9.63 public key", reasons: ["expected base64 of a 65-byte uncompressed P-256 point"])
        }
        try self.init(spkiDER: PublicKey.p256SPKIPrefix + Array(point))
    }

    /// Parses either accepted text form: PEM SubjectPublicKeyInfo, or base64 X9.63.
    public convenience init(text: String) throws {
        if text.contains("-----BEGIN") {
            try self.init(pem: text)
        } else {
            try self.init(x963Base64: text)
        }
    }

    /// The DER SubjectPublicKeyInfo.
    public var spkiDER: [UInt8] { PublicKey.spkiDER(of: pointer) }

    /// A short, stable name for the key: the first 8 bytes of SHA-256(SPKI) in hex.
    /// Signed v2 lists carry it so a verifier with several keys knows which one to use.
    public var keyID: String {
        SHA256Digest.hash(spkiDER).prefix(8).map { String(format: "%02x", $0) }.joined()
    }

    /// The PEM SubjectPublicKeyInfo.
    public func pemString() throws -> String {
        let bio = try MemoryBIO()
        OpenSSLErrorQueue.clear()
        guard PEM_write_bio_PUBKEY(bio.pointer, pointer) == 1 else { throw OpenSSLError.drained("write public key PEM") }
        return String(decoding: bio.readAll(), as: UTF8.self)
    }

    /// True when `signature` (DER ECDSA) is a valid ECDSA-SHA256 signature of `message`.
    /// Malformed signatures are simply invalid: a verifier must never throw its way
    /// around a "no".
    public func verifySHA256(signature: [UInt8], message: [UInt8]) -> Bool {
        OpenSSLErrorQueue.clear()
        defer { OpenSSLErrorQueue.clear() }
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, pointer) == 1 else { return false }
        let result = signature.withUnsafeBufferPointer { sig in
            message.withUnsafeBufferPointer { msg in
                EVP_DigestVerify(context, sig.baseAddress, sig.count, msg.baseAddress, msg.count)
            }
        }
        return result == 1
    }

    static func spkiDER(of key: OpaquePointer) -> [UInt8] {
        let length = i2d_PUBKEY(key, nil)
        guard length > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        bytes.withUnsafeMutableBufferPointer { buffer in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            _ = i2d_PUBKEY(key, &cursor)
        }
        return bytes
    }

    /// List signatures are ECDSA P-256 only; any other key type is a configuration error.
    private func requireP256() throws {
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        guard EVP_PKEY_get_base_id(pointer) == EVP_PKEY_EC,
              EVP_PKEY_get_group_name(pointer, &name, name.count, &length) == 1
        else {
            throw OpenSSLError(operation: "check public key", reasons: ["not an EC key"])
        }
        let group = String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard group == "prime256v1" || group == "P-256" else {
            throw OpenSSLError(operation: "check public key", reasons: ["curve \(group) is not P-256"])
        }
    }
}
