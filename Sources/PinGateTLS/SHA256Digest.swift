internal import COpenSSL
import Foundation

/// SHA-256 through OpenSSL's EVP interface.
public enum SHA256Digest {
    /// The 32-byte SHA-256 digest of `bytes`.
    public static func hash<Bytes: Collection>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let contiguous = Array(bytes)
        let ok = contiguous.withUnsafeBytes { input in
            digest.withUnsafeMutableBufferPointer { output in
                EVP_Digest(input.baseAddress, input.count, output.baseAddress, &length, EVP_sha256(), nil)
            }
        }
        // EVP_Digest with SHA-256 only fails on allocation failure; a zero digest would
        // silently match nothing, so fail loudly instead of returning it.
        precondition(ok == 1 && length == 32, "EVP_Digest(SHA-256) failed")
        return digest
    }

    /// base64(SHA-256(bytes)): the fingerprint text used by Wultra lists, TrustKit and HPKP.
    public static func base64<Bytes: Collection>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        Data(hash(bytes)).base64EncodedString()
    }
}
