internal import COpenSSL
import Foundation

/// A subject alternative name for a minted certificate.
public enum SubjectAltName: Sendable, Equatable {
    /// A DNS name, e.g. `api.example.test`.
    case dns(String)
    /// An IPv4 or IPv6 address in text form.
    case ip(String)

    var configText: String {
        switch self {
        case .dns(let name): return "DNS:\(name)"
        case .ip(let address): return "IP:\(address)"
        }
    }
}

/// Builds and signs X.509 certificates: self-signed CAs and CA-issued server leaves.
public enum CertificateBuilder {
    /// A self-signed CA certificate for `key`, valid from an hour ago for `validity`.
    public static func selfSignedCA(commonName: String, key: PrivateKey, validity: TimeInterval, now: Date = Date()) throws -> Certificate {
        // Owned from the start so that a failure part-way frees it.
        let owned = Certificate(owning: try makeUnsigned(
            subjectCommonName: commonName,
            subjectKey: key.pointer,
            issuer: nil,
            notBefore: now.addingTimeInterval(-3600),
            notAfter: now.addingTimeInterval(validity)
        ))
        let certificate = owned.pointer
        try addExtension(certificate, issuer: certificate, nid: NID_basic_constraints, "critical,CA:TRUE,pathlen:0")
        try addExtension(certificate, issuer: certificate, nid: NID_key_usage, "critical,keyCertSign,cRLSign")
        try addExtension(certificate, issuer: certificate, nid: NID_subject_key_identifier, "hash")
        try addExtension(certificate, issuer: certificate, nid: NID_authority_key_identifier, "keyid:always")
        try sign(certificate, with: key)
        return owned
    }

    /// A TLS server leaf for `names`, certifying `subjectKey`, issued and signed by `issuer`/`issuerKey`.
    public static func serverLeaf(
        names: [SubjectAltName],
        subjectKey: PrivateKey,
        issuer: Certificate,
        issuerKey: PrivateKey,
        notBefore: Date,
        notAfter: Date
    ) throws -> Certificate {
        guard let first = names.first else {
            throw OpenSSLError(operation: "build leaf", reasons: ["a leaf needs at least one subject alternative name"])
        }
        let commonName: String
        switch first {
        case .dns(let name), .ip(let name): commonName = name
        }
        let owned = Certificate(owning: try makeUnsigned(
            // CN is limited to 64 characters; clients match on the SAN anyway.
            subjectCommonName: commonName.count <= 64 ? commonName : nil,
            subjectKey: subjectKey.pointer,
            issuer: issuer.pointer,
            notBefore: notBefore,
            notAfter: notAfter
        ))
        let certificate = owned.pointer
        try addExtension(certificate, issuer: issuer.pointer, nid: NID_basic_constraints, "critical,CA:FALSE")
        try addExtension(certificate, issuer: issuer.pointer, nid: NID_key_usage, "critical,digitalSignature")
        try addExtension(certificate, issuer: issuer.pointer, nid: NID_ext_key_usage, "serverAuth")
        try addExtension(certificate, issuer: issuer.pointer, nid: NID_subject_alt_name, names.map(\.configText).joined(separator: ","))
        try addExtension(certificate, issuer: issuer.pointer, nid: NID_subject_key_identifier, "hash")
        try addExtension(certificate, issuer: issuer.pointer, nid: NID_authority_key_identifier, "keyid:always")
        try sign(certificate, with: issuerKey)
        return owned
    }

    private static func makeUnsigned(
        subjectCommonName: String?,
        subjectKey: OpaquePointer,
        issuer: OpaquePointer?,
        notBefore: Date,
        notAfter: Date
    ) throws -> OpaquePointer {
        OpenSSLErrorQueue.clear()
        guard let certificate = X509_new() else { throw OpenSSLError.drained("allocate certificate") }
        var handedOver = false
        defer { if !handedOver { X509_free(certificate) } }

        guard X509_set_version(certificate, 2) == 1 else { throw OpenSSLError.drained("set certificate version") }
        try setRandomSerial(certificate)
        guard X509_time_adj_ex(X509_getm_notBefore(certificate), 0, Int(notBefore.timeIntervalSince1970) - Int(time(nil)), nil) != nil,
              X509_time_adj_ex(X509_getm_notAfter(certificate), 0, Int(notAfter.timeIntervalSince1970) - Int(time(nil)), nil) != nil
        else { throw OpenSSLError.drained("set certificate validity") }

        guard let name = X509_NAME_new() else { throw OpenSSLError.drained("allocate name") }
        defer { X509_NAME_free(name) }
        if let subjectCommonName {
            let added = X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, subjectCommonName, -1, -1, 0)
            guard added == 1 else { throw OpenSSLError.drained("set subject common name") }
        }
        guard X509_set_subject_name(certificate, name) == 1 else { throw OpenSSLError.drained("set subject") }
        let issuerName = issuer.map { X509_get_subject_name($0) } ?? name
        guard X509_set_issuer_name(certificate, issuerName) == 1 else { throw OpenSSLError.drained("set issuer") }
        guard X509_set_pubkey(certificate, subjectKey) == 1 else { throw OpenSSLError.drained("set public key") }
        handedOver = true
        return certificate
    }

    /// A 159-bit random serial: unique enough that two minted leaves never collide,
    /// and positive as RFC 5280 requires.
    private static func setRandomSerial(_ certificate: OpaquePointer) throws {
        guard let number = BN_new() else { throw OpenSSLError.drained("allocate serial") }
        defer { BN_free(number) }
        guard BN_rand(number, 159, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1,
              let serial = BN_to_ASN1_INTEGER(number, nil)
        else { throw OpenSSLError.drained("make serial") }
        defer { ASN1_INTEGER_free(serial) }
        guard X509_set_serialNumber(certificate, serial) == 1 else { throw OpenSSLError.drained("set serial") }
    }

    private static func addExtension(_ certificate: OpaquePointer, issuer: OpaquePointer, nid: Int32, _ value: String) throws {
        OpenSSLErrorQueue.clear()
        guard pg_X509_add_ext_conf(certificate, issuer, nid, value) == 1 else {
            throw OpenSSLError.drained("add extension \(value)")
        }
    }

    private static func sign(_ certificate: OpaquePointer, with key: PrivateKey) throws {
        OpenSSLErrorQueue.clear()
        guard X509_sign(certificate, key.pointer, EVP_sha256()) > 0 else {
            throw OpenSSLError.drained("sign certificate")
        }
    }
}
