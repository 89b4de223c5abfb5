internal import COpenSSL
import Foundation

/// SHA-256 through OpenSSL's EVP interface.
public enum SHA256Digest {
    /// The 32-byte SHA-256 digest of `bytes`.
    public static func hash<Bytes: Collection>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        EVPDigest.sha256.hash(bytes)
    }

    /// base64(SHA-256(bytes)): the fingerprint text used by Wultra lists, TrustKit and HPKP.
    public static func base64<Bytes: Collection>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        Data(hash(bytes)).base64EncodedString()
    }
}

/// One-shot digests through `EVP_Digest`: the one OpenSSL call behind `SHA256Digest` and
/// `SHA1Digest`, which differ only in the algorithm and the digest's length.
enum EVPDigest {
    case sha1, sha256

    private var length: Int {
        switch self {
        case .sha1: return 20
        case .sha256: return 32
        }
    }

    private var name: String {
        switch self {
        case .sha1: return "SHA-1"
        case .sha256: return "SHA-256"
        }
    }

    private var algorithm: OpaquePointer? {
        switch self {
        case .sha1: return EVP_sha1()
        case .sha256: return EVP_sha256()
        }
    }

    func hash<Bytes: Collection>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        var digest = [UInt8](repeating: 0, count: length)
        var written: UInt32 = 0
        let contiguous = Array(bytes)
        let ok = contiguous.withUnsafeBytes { input in
            digest.withUnsafeMutableBufferPointer { output in
                EVP_Digest(input.baseAddress, input.count, output.baseAddress, &written, algorithm, nil)
            }
        }
        // EVP_Digest with these fixed algorithms fails only on allocation failure. A zero
        // digest would silently match nothing (a pin) or fail every handshake check in a way
        // that looks like the peer's fault, so fail loudly instead of returning it.
        precondition(ok == 1 && Int(written) == length, "EVP_Digest(\(name)) failed")
        return digest
    }
}
