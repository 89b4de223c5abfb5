import Foundation
import PinGateTestSupport
import PinGateTLS
import PinList

/// Certificates minted at test time: an origin CA with leaves, an attacker CA whose
/// leaves the gate's upstream trust also accepts, and a rogue CA nobody trusts.
struct TestPKI {
    struct Identity {
        let certificate: Certificate
        let key: PrivateKey
        let certificatePath: String
        let keyPath: String
        var fingerprint: String { certificate.sha256Fingerprint }
    }

    let directory: TemporaryDirectory
    let originCA: Identity
    let attackerCA: Identity
    let rogueCA: Identity
    let signer: PrivateKey
    let signerPublicKeyPath: String
    /// A bundle of the origin and attacker CAs: the gate's `--upstream-ca`.
    let upstreamTrustPath: String

    init(directory: TemporaryDirectory) throws {
        self.directory = directory
        originCA = try Self.makeCA("Test Origin CA", name: "origin-ca", in: directory)
        attackerCA = try Self.makeCA("Test Attacker CA", name: "attacker-ca", in: directory)
        rogueCA = try Self.makeCA("Test Rogue CA", name: "rogue-ca", in: directory)
        signer = try PrivateKey.generateP256()
        signerPublicKeyPath = try directory.write("signer.pub.pem", try signer.publicKey().pemString())
        upstreamTrustPath = try directory.write(
            "upstream-trust.pem", try originCA.certificate.pemString() + attackerCA.certificate.pemString())
    }

    /// A leaf for `names` issued by `issuer`.
    func leaf(_ names: [SubjectAltName], issuer: Identity, file: String,
              notAfter: Date = Date().addingTimeInterval(30 * 86400)) throws -> Identity {
        let key = try PrivateKey.generateP256()
        let certificate = try CertificateBuilder.serverLeaf(
            names: names, subjectKey: key, issuer: issuer.certificate, issuerKey: issuer.key,
            notBefore: Date().addingTimeInterval(-3600), notAfter: notAfter)
        return Identity(
            certificate: certificate, key: key,
            certificatePath: try directory.write("\(file).pem", try certificate.pemString()),
            keyPath: try directory.write("\(file).key", try key.pkcs8PEM()))
    }

    /// A signed Wultra static list pinning each (name, fingerprint), written to `file`.
    func signedList(_ pins: [(String, String)], expires: Date = Date().addingTimeInterval(365 * 86400), file: String = "pins.json") throws -> String {
        let entries = try pins.map { name, fingerprint in
            try WultraStaticList.sign(name: name, fingerprint: fingerprint, expires: Int64(expires.timeIntervalSince1970), key: signer)
        }
        return try directory.write(file, try WultraStaticList.encode(entries))
    }

    /// A signed v2 list (envelope bytes) from `pins`, signed by `key` (default: the signer).
    func signedV2(sequence: Int64, pins: [PinGateSignedList.Pin], revoked: [String] = [], key: PrivateKey? = nil,
                  expiresAt: Date = Date().addingTimeInterval(30 * 86400)) throws -> Data {
        try PinGateSignedList.sign(.init(sequence: sequence, issuedAt: Int64(Date().timeIntervalSince1970) - 60,
                                         expiresAt: Int64(expiresAt.timeIntervalSince1970), pins: pins, revoked: revoked),
                                   key: key ?? signer)
    }

    /// One v2 certificate pin for `host` valid for a year.
    static func pin(_ host: String, _ identity: Identity) -> PinGateSignedList.Pin {
        .init(host: host, sha256: identity.fingerprint, expires: Int64(Date().timeIntervalSince1970) + 365 * 86400)
    }

    private static func makeCA(_ commonName: String, name: String, in directory: TemporaryDirectory) throws -> Identity {
        let key = try PrivateKey.generateP256()
        let certificate = try CertificateBuilder.selfSignedCA(commonName: commonName, key: key, validity: 86400 * 30)
        return Identity(
            certificate: certificate, key: key,
            certificatePath: try directory.write("\(name).pem", try certificate.pemString()),
            keyPath: try directory.write("\(name).key", try key.pkcs8PEM()))
    }
}
