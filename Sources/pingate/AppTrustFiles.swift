import Foundation
import PinGateCA
import PinGateHarness
import PinGateNIO
import PinGateStateFiles
import PinGateTLS

/// The files an app needs to go through the gate, beside its proxy variable: the gate's CA
/// certificate, a bundle of the system roots plus that CA (`SSL_CERT_FILE` replaces the
/// system store rather than adding to it), and Node's proxy preload. `pingate env` writes
/// them into the state directory; a gate with `public-dir` publishes them there at start,
/// world-readable, for apps of other users (the packaged service: `/run/pingate`).
enum AppTrustFiles {
    /// Where each file is.
    struct Paths {
        /// The gate's CA certificate (PEM), alone.
        var caCertificate: String
        /// The system roots and the gate's CA.
        var bundle: String
        /// The Node preload (`NODE_OPTIONS=--require …`).
        var nodePreload: String
    }

    /// The files' places in `directory` (the CA certificate: `ca.pem`, as in a state directory).
    static func paths(in directory: String) -> Paths {
        Paths(caCertificate: (directory as NSString).appendingPathComponent("ca.pem"),
              bundle: (directory as NSString).appendingPathComponent("ca-bundle.pem"),
              nodePreload: (directory as NSString).appendingPathComponent("node-proxy.cjs"))
    }

    /// Why `directory` (existing) cannot hold files apps of every user trust, or nil: it is
    /// writable by group or others, or owned by a user other than this one or root. Whoever
    /// can write there decides what every app that reads it trusts (`SSL_CERT_FILE`) and
    /// what code every Node process runs (the preload in `NODE_OPTIONS`).
    static func publicDirectoryProblem(_ directory: String) -> String? {
        var info = stat()
        guard stat(directory, &info) == 0 else { return nil }
        if info.st_mode & 0o022 != 0 {
            return "public-dir \(directory) is writable by group or others (mode \(String(info.st_mode & 0o777, radix: 8))): any local user could replace the CA bundle and the Node preload that apps of every user load from it; chmod 755 \(directory), or choose a directory only the gate can write"
        }
        if info.st_uid != geteuid() && info.st_uid != 0 {
            return "public-dir \(directory) belongs to user \(info.st_uid), not to the gate's user (\(geteuid())) or root: its owner could replace the CA bundle and the Node preload that apps of every user load from it; choose a directory the gate's user owns"
        }
        if let parent = replaceableParent(of: directory) {
            return "\(parent), above the public-dir \(directory), is writable by group or others without the sticky bit: the public-dir could be renamed away and replaced; choose a public-dir under a directory only root can write"
        }
        return nil
    }

    /// The first directory above `directory` that group or others can write without the
    /// sticky bit (as /tmp has), where `directory` could be renamed away and replaced; nil
    /// when there is none. The gate (publishing) and `env` (reading) ask the same.
    private static func replaceableParent(of directory: String) -> String? {
        var parent = (PathText.resolve(directory) as NSString).deletingLastPathComponent
        while true {
            var info = stat()
            if stat(parent, &info) == 0, info.st_mode & 0o022 != 0, info.st_mode & mode_t(S_ISVTX) == 0 { return parent }
            if parent == "/" || parent.isEmpty { return nil }
            parent = (parent as NSString).deletingLastPathComponent
        }
    }

    /// Why the published files in `directory` cannot be handed to apps, or nil: the
    /// directory or one of the files is writable by group or others (the check `env` makes
    /// as a reader, who cannot know the gate's user).
    ///
    /// Their owner must be root, this user, or a system account (uid below 1000, or in
    /// systemd's range for dynamic users, 61184–65519, which the packaged service runs
    /// as): an ordinary other user could have made the directory in a shared place (a
    /// /tmp path, before the gate started) and planted both files. Every directory above
    /// must not be writable by group or others unless it has the sticky bit (as /tmp has),
    /// or the directory could be renamed away and replaced.
    static func publishedFilesProblem(_ directory: String) -> String? {
        let paths = paths(in: directory)
        let me = geteuid()
        for path in [directory, paths.caCertificate, paths.bundle, paths.nodePreload] {
            var info = stat()
            guard stat(path, &info) == 0 else { continue }
            if info.st_mode & 0o022 != 0 {
                return "\(path) is writable by group or others (mode \(String(info.st_mode & 0o777, radix: 8))): whoever can write it decides what your apps trust and what code Node runs, so pingate env does not hand it to them; the gate's operator should make its public-dir 755 and the files 644"
            }
            let owner = info.st_uid
            if owner != 0 && owner != me && !(owner < 1000 || (61184...65519).contains(owner)) {
                return "\(path) belongs to user \(owner), neither root, you, nor a system account: whoever owns it decides what your apps trust and what code Node runs, so pingate env does not hand it to them; use the public-dir of a gate run by root or by a service account"
            }
        }
        if let parent = replaceableParent(of: directory) {
            return "\(parent), above the public-dir \(directory), is writable by group or others without the sticky bit: the public-dir could be replaced, so pingate env does not hand its files to apps; the gate's operator should choose a public-dir under a directory only root can write"
        }
        return nil
    }

    /// Writes the bundle and the preload into `directory` (created with `directoryMode` if
    /// missing), each 0644, and with `copyingCertificate` the CA certificate too (a state
    /// directory holds it already). Returns the paths, and whether a system bundle was found
    /// (without one, the bundle holds the gate's CA only).
    static func write(_ ca: LocalCA, to directory: String, directoryMode: mode_t = 0o700,
                      copyingCertificate: Bool) throws -> (paths: Paths, systemBundleFound: Bool) {
        var bundle = ""
        let systemBundle = TrustRoots.systemBundlePath
        if let systemBundle {
            do {
                bundle = try String(contentsOfFile: systemBundle, encoding: .utf8)
            } catch {
                throw ConfigurationError("cannot read the system's CA bundle \(systemBundle): \(error.localizedDescription)")
            }
            if !bundle.hasSuffix("\n") { bundle += "\n" }
        }
        let certificate = try ca.certificate.pemString()
        bundle += "# pingate local CA (\(ca.certificate.subjectDescription))\n" + certificate
        let paths = paths(in: directory)
        // A directory for apps of every user (the public-dir) must be the gate's alone.
        if copyingCertificate, let problem = publicDirectoryProblem(directory) { throw ConfigurationError(problem) }
        do {
            try StateFiles.ensureDirectory(directory, mode: directoryMode)
            if copyingCertificate { try StateFiles.writeAtomically(Array(certificate.utf8), to: paths.caCertificate, mode: 0o644) }
            try StateFiles.writeAtomically(Array(bundle.utf8), to: paths.bundle, mode: 0o644)
            try StateFiles.writeAtomically(Array(NodeProxyPreload.source.utf8), to: paths.nodePreload, mode: 0o644)
        } catch {
            throw ConfigurationError("cannot write the CA files for apps in \(directory): \(error)")
        }
        return (paths, systemBundle != nil)
    }
}
