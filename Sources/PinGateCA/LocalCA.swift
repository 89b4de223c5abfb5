import Foundation
import PinGateTLS
import PinGateStateFiles

/// The gate's own certificate authority: the root that clients trust (via `pingate ca
/// export`) and that signs the leaves minted for each pinned host.
public final class LocalCA: Sendable {
    /// The CA certificate.
    public let certificate: Certificate
    /// The CA signing key. Stays in this process and in `ca.key` (mode 0600).
    let key: PrivateKey

    /// Why the CA could not be loaded or created.
    public enum CAError: Error, CustomStringConvertible, Sendable {
        /// `ca.pem` or `ca.key` is missing.
        case missing(String)
        /// `ca init` found an existing CA and refuses to overwrite it.
        case alreadyExists(String)
        /// The files exist but could not be used.
        case unusable(String)

        /// The error in words, for logs and the operator.
        public var description: String {
            switch self {
            case .missing(let detail): return "no local CA: \(detail) (run `pingate ca init`)"
            case .alreadyExists(let path): return "a local CA already exists at \(path); refusing to overwrite it"
            case .unusable(let detail): return "the local CA cannot be used: \(detail)"
            }
        }
    }

    /// The two files of a CA in a state directory.
    public struct Paths: Sendable {
        /// The CA certificate, PEM (`ca.pem`).
        public let certificate: String
        /// The CA private key, PKCS#8 PEM, mode 0600 (`ca.key`).
        public let key: String

        /// The paths inside `stateDirectory`.
        public init(stateDirectory: String) {
            certificate = (stateDirectory as NSString).appendingPathComponent("ca.pem")
            key = (stateDirectory as NSString).appendingPathComponent("ca.key")
        }
    }

    /// How long a newly created CA is valid.
    public static let validity: TimeInterval = 10 * 365 * 24 * 3600

    init(certificate: Certificate, key: PrivateKey) {
        self.certificate = certificate
        self.key = key
    }

    /// Loads the CA in `stateDirectory`.
    public static func load(stateDirectory: String) throws -> LocalCA {
        let paths = Paths(stateDirectory: stateDirectory)
        let fileManager = FileManager.default
        guard fileManager.fileExists(atPath: paths.certificate), fileManager.fileExists(atPath: paths.key) else {
            throw CAError.missing("\(paths.certificate) and \(paths.key) not both present")
        }
        do {
            let certificate = try Certificate(pem: String(contentsOfFile: paths.certificate, encoding: .utf8))
            let key = try PrivateKey(pem: String(contentsOfFile: paths.key, encoding: .utf8))
            guard try key.publicKey().spkiDER == certificate.subjectPublicKeyInfoDER else {
                throw CAError.unusable("ca.key does not belong to ca.pem")
            }
            return LocalCA(certificate: certificate, key: key)
        } catch let error as CAError {
            throw error
        } catch {
            throw CAError.unusable("\(error)")
        }
    }

    /// Creates a new CA in `stateDirectory`; fails if one is already there.
    public static func create(stateDirectory: String, commonName: String = "pingate local CA", now: Date = Date()) throws -> LocalCA {
        let paths = Paths(stateDirectory: stateDirectory)
        if FileManager.default.fileExists(atPath: paths.certificate) || FileManager.default.fileExists(atPath: paths.key) {
            throw CAError.alreadyExists(stateDirectory)
        }
        try StateFiles.ensureDirectory(stateDirectory)
        let key = try PrivateKey.generateP256()
        let certificate = try CertificateBuilder.selfSignedCA(commonName: commonName, key: key, validity: validity, now: now)
        // Key first: a certificate without its key is useless, the reverse is harmless.
        try StateFiles.writeAtomically(Array(try key.pkcs8PEM().utf8), to: paths.key, mode: 0o600)
        try StateFiles.writeAtomically(Array(try certificate.pemString().utf8), to: paths.certificate, mode: 0o644)
        return LocalCA(certificate: certificate, key: key)
    }

    /// Loads the CA in `stateDirectory`, creating it first if there is none.
    public static func loadOrCreate(stateDirectory: String) throws -> (ca: LocalCA, created: Bool) {
        let paths = Paths(stateDirectory: stateDirectory)
        if !FileManager.default.fileExists(atPath: paths.certificate) && !FileManager.default.fileExists(atPath: paths.key) {
            return (try create(stateDirectory: stateDirectory), true)
        }
        return (try load(stateDirectory: stateDirectory), false)
    }
}
