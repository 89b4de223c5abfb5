/// SHA-1 through OpenSSL's EVP interface, for the one place a protocol still requires it:
/// the WebSocket handshake's `Sec-WebSocket-Accept` (RFC 6455 §4.2.2), which the gate
/// computes and checks when it translates between an HTTP/1.1 `Upgrade` and an HTTP/2
/// extended CONNECT (RFC 8441). Never used for anything security-bearing: the value only
/// proves the peer understood the handshake, the pins carry the trust.
public enum SHA1Digest {
    /// The 20-byte SHA-1 digest of `bytes`.
    public static func hash<Bytes: Collection>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        EVPDigest.sha1.hash(bytes)
    }
}
