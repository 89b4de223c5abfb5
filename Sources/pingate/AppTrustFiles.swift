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
