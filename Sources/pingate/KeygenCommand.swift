import ArgumentParser
import PinGateTLS
import PinGateStateFiles

/// `pingate keygen`: a P-256 key pair for signing fingerprint lists.
struct KeygenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Make a list-signing ECDSA P-256 key pair: PREFIX.key (0600) and PREFIX.pub.pem.")

    @Option(name: .long, help: "Output prefix.")
    var out: String

    func run() throws {
        let key = try PrivateKey.generateP256()
        let keyPath = PathText.resolve(out + ".key")
        let publicPath = PathText.resolve(out + ".pub.pem")
        try StateFiles.writeAtomically(Array(try key.pkcs8PEM().utf8), to: keyPath, mode: 0o600)
        try StateFiles.writeAtomically(Array(try key.publicKey().pemString().utf8), to: publicPath, mode: 0o644)
        print("wrote \(keyPath) (private, 0600) and \(publicPath) (public), key id \(try key.publicKey().keyID)")
    }
}
