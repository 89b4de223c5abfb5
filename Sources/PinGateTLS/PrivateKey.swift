internal import COpenSSL
import Foundation

/// An ECDSA P-256 private key, owning one OpenSSL `EVP_PKEY`.
///
/// `@unchecked Sendable`: the key is immutable once made, and OpenSSL allows
/// concurrent signing with one `EVP_PKEY` (each sign uses its own `EVP_MD_CTX`).
public final class PrivateKey: @unchecked Sendable {
    let pointer: OpaquePointer

    init(owning pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { EVP_PKEY_free(pointer) }

    /// Generates a fresh P-256 key.
    public static func generateP256() throws -> PrivateKey {
        OpenSSLErrorQueue.clear()
        guard let key = pg_EVP_EC_gen_P256() else { throw OpenSSLError.drained("generate P-256 key") }
        return PrivateKey(owning: key)
    }

    /// Parses a PEM private key (PKCS#8 or traditional EC).
    public convenience init(pem: String) throws {
        let bio = try MemoryBIO(bytes: Array(pem.utf8))
        OpenSSLErrorQueue.clear()
        guard let key = PEM_read_bio_PrivateKey(bio.pointer, nil, nil, nil) else {
            throw OpenSSLError.drained("parse private key PEM")
        }
        self.init(owning: key)
    }

    /// The key as unencrypted PKCS#8 PEM. Callers writing it to disk must use mode 0600.
    public func pkcs8PEM() throws -> String {
        let bio = try MemoryBIO()
        OpenSSLErrorQueue.clear()
        guard PEM_write_bio_PrivateKey(bio.pointer, pointer, nil, nil, 0, nil, nil) == 1 else {
            throw OpenSSLError.drained("write private key PEM")
        }
        return String(decoding: bio.readAll(), as: UTF8.self)
    }

    /// The matching public key.
    public func publicKey() throws -> PublicKey {
        try PublicKey(spkiDER: PublicKey.spkiDER(of: pointer))
    }

    /// An ECDSA-SHA256 signature of `message`, DER-encoded.
    public func signSHA256(_ message: [UInt8]) throws -> [UInt8] {
        OpenSSLErrorQueue.clear()
        guard let context = EVP_MD_CTX_new() else { throw OpenSSLError.drained("allocate digest context") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pointer) == 1 else {
            throw OpenSSLError.drained("start ECDSA signature")
        }
        var length = 0
        let sized = message.withUnsafeBufferPointer { EVP_DigestSign(context, nil, &length, $0.baseAddress, $0.count) }
        guard sized == 1 else { throw OpenSSLError.drained("size ECDSA signature") }
        var signature = [UInt8](repeating: 0, count: length)
        let signed = message.withUnsafeBufferPointer { input in
            signature.withUnsafeMutableBufferPointer { output in
                EVP_DigestSign(context, output.baseAddress, &length, input.baseAddress, input.count)
            }
        }
        guard signed == 1 else { throw OpenSSLError.drained("ECDSA sign") }
        return Array(signature.prefix(length))
    }
}
