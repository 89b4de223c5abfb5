internal import COpenSSL
import Foundation

/// SHA-1 through OpenSSL's EVP interface, for the one place a protocol still requires it:
/// the WebSocket handshake's `Sec-WebSocket-Accept` (RFC 6455 §4.2.2), which the gate
/// computes and checks when it translates between an HTTP/1.1 `Upgrade` and an HTTP/2
/// extended CONNECT (RFC 8441). Never used for anything security-bearing: the value only
/// proves the peer understood the handshake, the pins carry the trust.
public enum SHA1Digest {
    /// The 20-byte SHA-1 digest of `bytes`.
    public static func hash<Bytes: Collection>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        var digest = [UInt8](repeating: 0, count: 20)
        var length: UInt32 = 0
        let contiguous = Array(bytes)
        let ok = contiguous.withUnsafeBytes { input in
            digest.withUnsafeMutableBufferPointer { output in
                EVP_Digest(input.baseAddress, input.count, output.baseAddress, &length, EVP_sha1(), nil)
            }
        }
        // As for SHA-256: only an allocation failure makes this fail, and a zero digest
        // would make every handshake check fail in a way that looks like the peer's fault.
        precondition(ok == 1 && length == 20, "EVP_Digest(SHA-1) failed")
        return digest
    }
}
