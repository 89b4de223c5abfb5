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
        /// Neither `ca.pem` nor `ca.key` is in the state directory.
        case missing(String)
        /// One of the two files is there without the other: `present` is there,
        /// `absent` is not. `ca init` alone would refuse (a file exists); `--force` is the
        /// way forward, and it keeps what is there.
        case half(present: String, absent: String, stateDirectory: String)
        /// `ca init` found an existing CA and refuses to overwrite it.
        case alreadyExists(String)
        /// The files exist but could not be used.
        case unusable(String)
        /// The key or the state directory is open to other users (see `permissionProblems`).
        case insecurePermissions([String])

        /// The error in words, for logs and the operator.
        public var description: String {
            switch self {
            case .missing(let detail):
                return "no local CA: \(detail); the gate creates it on its first start: give the gate's --config or --state-dir, or create one with `pingate ca init`"
            case .half(let present, let absent, let directory):
                return "the local CA is incomplete: \(absent) is missing (\(present) is there without it). "
                    + "Restore it from a backup, or run `pingate ca init --force --state-dir \(directory)` to create a new CA "
                    + "(the old files are kept as timestamped backups; clients must then trust the new ca.pem)"
            case .alreadyExists(let path):
                return "a local CA already exists at \(path); refusing to overwrite it "
                    + "(`pingate ca init --force` replaces it and keeps the old files as timestamped backups)"
            case .unusable(let detail):
                return "the local CA cannot be used: \(detail)"
            case .insecurePermissions(let problems):
                return "the local CA is exposed: " + problems.joined(separator: "; ")
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
        switch (fileManager.fileExists(atPath: paths.certificate), fileManager.fileExists(atPath: paths.key)) {
        case (true, true):
            break
        case (false, false):
            throw CAError.missing("neither \(paths.certificate) nor \(paths.key) exists")
        case (true, false):
            throw CAError.half(present: paths.certificate, absent: paths.key, stateDirectory: stateDirectory)
        case (false, true):
            throw CAError.half(present: paths.key, absent: paths.certificate, stateDirectory: stateDirectory)
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

    /// Creates a new CA in `stateDirectory`; fails if one is already there (even half of one).
    public static func create(stateDirectory: String, commonName: String = "pingate local CA", now: Date = Date()) throws -> LocalCA {
        try create(stateDirectory: stateDirectory, replacing: false, commonName: commonName, now: now).ca
    }

    /// Creates a new CA in `stateDirectory`. With `replacing`, the files already there
    /// (a whole CA, or half of one) are first renamed to `NAME.bak-YYYYMMDDTHHMMSSZ`
    /// rather than deleted: a key that clients trusted is never destroyed by a command.
    /// Returns the CA and the backup paths.
    ///
    /// An existing directory open to group or others is refused before anything is written
    /// into it (`CAError.insecurePermissions`), unless `allowingExposedDirectory`: a key
    /// created there is readable, or replaceable, by other local users from its first moment.
    public static func create(stateDirectory: String, replacing: Bool, commonName: String = "pingate local CA",
                              now: Date = Date(), allowingExposedDirectory: Bool = false) throws -> (ca: LocalCA, backups: [String]) {
        try refuseExposedDirectory(stateDirectory, unless: allowingExposedDirectory)
        // Under the state directory's lock, like `loadOrCreate`: a `ca init` racing a first
        // `run` must not leave one's key beside the other's certificate.
        return try StateFiles.withExclusiveLock(in: stateDirectory) {
            try createLocked(stateDirectory: stateDirectory, replacing: replacing, commonName: commonName, now: now)
        }
    }

    private static func createLocked(stateDirectory: String, replacing: Bool, commonName: String,
                                     now: Date) throws -> (ca: LocalCA, backups: [String]) {
        let paths = Paths(stateDirectory: stateDirectory)
        let existing = [paths.certificate, paths.key].filter { FileManager.default.fileExists(atPath: $0) }
        if !existing.isEmpty && !replacing {
            throw CAError.alreadyExists(stateDirectory)
        }
        try StateFiles.ensureDirectory(stateDirectory)
        let stamp = backupStamp(now)
        var backups: [String] = []
        for path in existing {
            var backup = "\(path).bak-\(stamp)"
            var attempt = 1
            while FileManager.default.fileExists(atPath: backup) {
                attempt += 1
                backup = "\(path).bak-\(stamp)-\(attempt)"
            }
            guard rename(path, backup) == 0 else {
                throw CAError.unusable("cannot keep \(path) as \(backup): \(String(cString: strerror(errno)))")
            }
            backups.append(backup)
        }
        return (try writeNew(paths: paths, commonName: commonName, now: now), backups)
    }

    private static func writeNew(paths: Paths, commonName: String, now: Date) throws -> LocalCA {
        let key = try PrivateKey.generateP256()
        let certificate = try CertificateBuilder.selfSignedCA(commonName: commonName, key: key, validity: validity, now: now)
        // Key first: a certificate without its key is useless, the reverse is harmless.
        try StateFiles.writeAtomically(Array(try key.pkcs8PEM().utf8), to: paths.key, mode: 0o600)
        try StateFiles.writeAtomically(Array(try certificate.pemString().utf8), to: paths.certificate, mode: 0o644)
        return LocalCA(certificate: certificate, key: key)
    }

    /// A UTC timestamp for backup names, sortable and free of `:`.
    static func backupStamp(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyyMMdd'T'HHmmss'Z'"
        return formatter.string(from: date)
    }

    /// Throws `insecurePermissions` when `stateDirectory` exists and is not 0700 (the key
    /// is not there yet, so only the directory can be wrong), unless `allowed`.
    private static func refuseExposedDirectory(_ stateDirectory: String, unless allowed: Bool) throws {
        guard !allowed else { return }
        let problems = permissionProblems(stateDirectory: stateDirectory)
        if !problems.isEmpty { throw CAError.insecurePermissions(problems) }
    }

    /// What makes the CA in `stateDirectory` reachable by other local users: `ca.key`
    /// with any group or other permission bit, or a state directory that is not 0700.
    /// Whoever can read the key can mint certificates every client of the gate trusts,
    /// which is exactly the interception the gate exists to stop. Empty when all is well
    /// (or when the files are not there: loading reports that).
    public static func permissionProblems(stateDirectory: String) -> [String] {
        let paths = Paths(stateDirectory: stateDirectory)
        var problems: [String] = []
        // stat(2), which follows a symbolic link: a state directory or key mounted as a link
        // (a Kubernetes secret volume) is judged by what it points to, not the link's 0777.
        func mode(_ path: String) -> Int? {
            var info = stat()
            return stat(path, &info) == 0 ? Int(info.st_mode & 0o7777) : nil
        }
        if let keyMode = mode(paths.key), keyMode & 0o077 != 0 {
            problems.append("\(paths.key) has mode \(String(keyMode, radix: 8)), open to group or others (chmod 600 \(paths.key))")
        }
        if let directoryMode = mode(stateDirectory), directoryMode & 0o777 != 0o700 {
            problems.append("the state directory \(stateDirectory) has mode \(String(directoryMode, radix: 8)), not 700 (chmod 700 \(stateDirectory))")
        }
        return problems
    }

    /// Loads the CA in `stateDirectory`, creating it first if there is none.
    /// Another process may be doing the same at the same moment (a gate starting while
    /// `pingate env` runs): the check and the creation happen under the state directory's
    /// lock, so exactly one creates and the other loads what it created.
    /// A CA whose two files exist is loaded without the lock, so a read-only state
    /// directory (a CA mounted from a secret, a user reading the gate's directory) still
    /// works. Anything less is looked at under the lock: one file alone may be another
    /// process's creation half done (the key is written first), not a broken CA.
    /// A CA to be created is refused, as by `create`, in an existing directory open to
    /// group or others, unless `allowingExposedDirectory`.
    public static func loadOrCreate(stateDirectory: String, allowingExposedDirectory: Bool = false) throws -> (ca: LocalCA, created: Bool) {
        let paths = Paths(stateDirectory: stateDirectory)
        let exists = { (path: String) in FileManager.default.fileExists(atPath: path) }
        if exists(paths.certificate) && exists(paths.key) { return (try load(stateDirectory: stateDirectory), false) }
        try refuseExposedDirectory(stateDirectory, unless: allowingExposedDirectory)
        return try StateFiles.withExclusiveLock(in: stateDirectory) {
            // Another process may have created it while this one waited for the lock.
            if exists(paths.certificate) || exists(paths.key) { return (try load(stateDirectory: stateDirectory), false) }
            return (try createLocked(stateDirectory: stateDirectory, replacing: false, commonName: "pingate local CA", now: Date()).ca, true)
        }
    }
}
