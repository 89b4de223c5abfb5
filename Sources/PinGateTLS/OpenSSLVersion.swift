internal import COpenSSL

/// The linked OpenSSL's version, for `pingate --version` and start-up logs.
public enum OpenSSLVersion {
    /// E.g. "OpenSSL 3.0.19 27 Jan 2026".
    public static var text: String {
        OpenSSL_version(OPENSSL_VERSION).map { String(cString: $0) } ?? "unknown"
    }
}
