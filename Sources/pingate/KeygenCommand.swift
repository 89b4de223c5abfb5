import ArgumentParser
import Foundation
import PinGateNIO
import PinGateTLS
import PinGateStateFiles

/// `pingate keygen`: a P-256 key pair for signing fingerprint lists.
struct KeygenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Make a list-signing ECDSA P-256 key pair: PREFIX.key (0600) and PREFIX.pub.pem; refuses to overwrite unless --force.")

    @Option(name: .long, help: "Output prefix.")
    var out: String

    @Flag(name: .long, help: "Replace PREFIX.key and PREFIX.pub.pem if they exist. Every list signed with the old key then needs the old public key to verify, or a new signature.")
    var force = false

    func run() throws {
        // --out names files (PREFIX.key, PREFIX.pub.pem), not a directory: `--out ./` wrote
        // the hidden files ./.key and ./.pub.pem.
        let prefixName = (out as NSString).lastPathComponent
        guard !out.hasSuffix("/"), !prefixName.isEmpty, prefixName != ".", prefixName != ".." else {
            throw ConfigurationError("keygen: --out \(out) is a directory; --out is a prefix for two files: give e.g. --out \((out as NSString).appendingPathComponent("signer")) for signer.key and signer.pub.pem")
        }
        let directory = (PathText.resolve(out) as NSString).deletingLastPathComponent
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw ConfigurationError("keygen: --out \(out): the directory \(directory) does not exist; create it first (mkdir -p \(directory))")
        }
        let keyPath = PathText.resolve(out + ".key")
        let publicPath = PathText.resolve(out + ".pub.pem")
        if !force {
            // A signing key replaced by mistake orphans every list it signed: the gates that
            // trust its public key refuse the next list signed with the new one.
            for path in [keyPath, publicPath] where FileManager.default.fileExists(atPath: path) {
                throw ConfigurationError("keygen: \(path) already exists\(Self.keyIDNote(keyPath)); overwriting it would orphan every list signed with that key. Choose another --out, or pass --force to replace it.")
            }
        }
        let key = try PrivateKey.generateP256()
        try StateFiles.writeAtomically(Array(try key.pkcs8PEM().utf8), to: keyPath, mode: 0o600)
        try StateFiles.writeAtomically(Array(try key.publicKey().pemString().utf8), to: publicPath, mode: 0o644)
        print("wrote \(keyPath) (private, 0600) and \(publicPath) (public), key id \(try key.publicKey().keyID)")
    }

    /// " (key id …)" for an existing private key that can be read, else "".
    private static func keyIDNote(_ keyPath: String) -> String {
        guard let pem = try? String(contentsOfFile: keyPath, encoding: .utf8), let key = try? PrivateKey(pem: pem),
              let id = try? key.publicKey().keyID else { return "" }
        return " (key id \(id))"
    }
}
