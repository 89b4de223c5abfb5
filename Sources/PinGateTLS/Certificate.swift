internal import COpenSSL
import Foundation

/// An X.509 certificate, owning one OpenSSL `X509` object.
///
/// `@unchecked Sendable`: the wrapped object is never mutated after this type gets it
/// (builders finish signing before handing it over), and OpenSSL allows concurrent
/// read-only use of an `X509`.
public final class Certificate: @unchecked Sendable {
    let pointer: OpaquePointer

    /// Takes ownership of `pointer` (one reference); `deinit` releases it.
    init(owning pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { X509_free(pointer) }

    /// Each certificate of a borrowed `STACK_OF(X509)` (e.g. `SSL_get0_verified_chain`),
    /// in order, each taking its own reference: the stack stays the `SSL`'s, and the
    /// certificates outlive the connection.
    static func owningEach(of stack: OpaquePointer?) -> [Certificate] {
        guard let stack else { return [] }
        let count = OPENSSL_sk_num(stack)
        guard count > 0 else { return [] }
        return (0..<count).compactMap { index in
            guard let raw = OPENSSL_sk_value(stack, index) else { return nil }
            let certificate = OpaquePointer(raw)
            X509_up_ref(certificate)
            return Certificate(owning: certificate)
        }
    }

    /// Parses one DER-encoded certificate.
    public convenience init(der: [UInt8]) throws {
        OpenSSLErrorQueue.clear()
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_X509(nil, &cursor, buffer.count)
        }
        guard let parsed else { throw OpenSSLError.drained("parse certificate DER") }
        self.init(owning: parsed)
    }

    /// Parses the first certificate of a PEM text.
    public convenience init(pem: String) throws {
        guard let first = try Certificate.all(inPEM: pem).first else {
            throw OpenSSLError(operation: "parse certificate PEM", reasons: ["no certificate found"])
        }
        try self.init(der: first.derBytes)
    }

    /// True when both are the same certificate. `X509_cmp` compares the digests OpenSSL
    /// cached when it parsed them, so nothing is encoded again.
    public func isSameCertificate(as other: Certificate) -> Bool {
        pointer == other.pointer || X509_cmp(pointer, other.pointer) == 0
    }

    /// Every certificate in a PEM text (a bundle), in order.
    public static func all(inPEM pem: String) throws -> [Certificate] {
        let bio = try MemoryBIO(bytes: Array(pem.utf8))
        var certificates: [Certificate] = []
        OpenSSLErrorQueue.clear()
        while let next = PEM_read_bio_X509(bio.pointer, nil, nil, nil) {
            certificates.append(Certificate(owning: next))
        }
        // Reading stops with a "no start line" error at the end of the text; that is
        // the normal end, not a failure, unless nothing at all was read.
        let reasons = OpenSSLErrorQueue.drain()
        if certificates.isEmpty {
            throw OpenSSLError(operation: "parse certificate PEM", reasons: reasons.isEmpty ? ["no certificate found"] : reasons)
        }
        return certificates
    }


    /// The DER encoding.
    public var derBytes: [UInt8] {
        let length = i2d_X509(pointer, nil)
        guard length > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        bytes.withUnsafeMutableBufferPointer { buffer in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            _ = i2d_X509(pointer, &cursor)
        }
        return bytes
    }

    /// The PEM encoding ("-----BEGIN CERTIFICATE-----" …).
    public func pemString() throws -> String {
        let bio = try MemoryBIO()
        OpenSSLErrorQueue.clear()
        guard PEM_write_bio_X509(bio.pointer, pointer) == 1 else { throw OpenSSLError.drained("write certificate PEM") }
        return String(decoding: bio.readAll(), as: UTF8.self)
    }

    /// base64(SHA-256(DER)): the fingerprint a Wultra list pins.
    public var sha256Fingerprint: String { SHA256Digest.base64(derBytes) }

    /// The DER SubjectPublicKeyInfo of the certified key.
    public var subjectPublicKeyInfoDER: [UInt8] {
        // Re-encode the certificate's own X509_PUBKEY: a plain ASN.1 encode. Going through
        // the EVP_PKEY (i2d_PUBKEY) makes OpenSSL 3.0 look up an encoder provider on every
        // call, which showed up in the per-connection profile.
        guard let publicKey = X509_get_X509_PUBKEY(pointer) else { return [] }
        let length = i2d_X509_PUBKEY(publicKey, nil)
        guard length > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        bytes.withUnsafeMutableBufferPointer { buffer in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            _ = i2d_X509_PUBKEY(publicKey, &cursor)
        }
        return bytes
    }

    /// base64(SHA-256(SubjectPublicKeyInfo)): the TrustKit/HPKP style pin.
    public var spkiSHA256: String { SHA256Digest.base64(subjectPublicKeyInfoDER) }

    /// The subject as a one-line text, e.g. "/CN=api.example.test".
    public var subjectDescription: String { Certificate.oneLine(X509_get_subject_name(pointer)) }

    /// The subject's common name, if it has one.
    public var commonName: String? {
        guard let name = X509_get_subject_name(pointer) else { return nil }
        var buffer = [CChar](repeating: 0, count: 256)
        let length = X509_NAME_get_text_by_NID(name, NID_commonName, &buffer, Int32(buffer.count))
        guard length > 0 else { return nil }
        return String(decoding: buffer.prefix(Int(length)).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// True when this certificate names `host` (a DNS name, or an IP literal without
    /// brackets) the way OpenSSL's own hostname check does during a handshake: subject
    /// alternative names first, wildcards only as a whole left-most label, no partial
    /// wildcards. The gate uses it to ask whether a tunnel's upstream certificate also
    /// covers another name a request inside the tunnel asks for.
    public func names(host: String) -> Bool {
        // A failed check may leave entries on the thread's error queue; none of them is
        // an error here ("does not name it" is an answer), so the queue is left clean.
        OpenSSLErrorQueue.clear()
        defer { OpenSSLErrorQueue.clear() }
        if IPAddressText.isIPLiteral(host) {
            return X509_check_ip_asc(pointer, host, 0) == 1
        }
        let flags = UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS)
        return host.withCString { X509_check_host(pointer, $0, host.utf8.count, flags, nil) } == 1
    }

    /// The end of the validity period.
    public var notAfter: Date? { Certificate.date(X509_get0_notAfter(pointer)) }

    /// The start of the validity period.
    public var notBefore: Date? { Certificate.date(X509_get0_notBefore(pointer)) }

    private static func oneLine(_ name: OpaquePointer?) -> String {
        guard let name, let text = X509_NAME_oneline(name, nil, 0) else { return "" }
        defer { pg_OPENSSL_free(text) }
        return String(cString: text)
    }

    private static func date(_ time: UnsafePointer<ASN1_TIME>?) -> Date? {
        guard let time else { return nil }
        var parts = tm()
        guard ASN1_TIME_to_tm(time, &parts) == 1 else { return nil }
        return Date(timeIntervalSince1970: TimeInterval(timegm(&parts)))
    }
}
