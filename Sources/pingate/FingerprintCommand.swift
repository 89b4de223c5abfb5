import ArgumentParser
import Foundation
import PinGate
import PinGateTLS
import PinGateNIO

/// `pingate fingerprint`: the pin value of a certificate file or a live server's leaf.
struct FingerprintCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fingerprint",
        abstract: "Print base64(SHA-256(leaf DER)) of a certificate file or of a live server's leaf.")

    @Option(name: .long, help: "A PEM certificate file.")
    var cert: String?

    @Option(name: .long, help: "HOST:PORT of a live TLS server; only the handshake is sent.")
    var connect: String?

    @Option(name: .long, help: "Connect to ADDR for HOST:PORT, like curl's --resolve. Repeatable.")
    var resolve: [String] = []

    func validate() throws {
        guard (cert == nil) != (connect == nil) else { throw ValidationError("give exactly one of --cert or --connect") }
    }

    func run() async throws {
        if let cert {
            let certificate = try Certificate(pem: String(contentsOfFile: PathText.resolve(cert), encoding: .utf8))
            print(certificate.sha256Fingerprint)
            return
        }
        guard let connect else { return }
        let (host, port) = try RunCommand.parseHostPort(connect)
        var configuration = GateConfiguration()
        configuration.resolveOverrides = try resolve.map(ResolveOverride.init(parsing:))
        let peer = try await UpstreamProbe.inspect(host: host.lowercased(), port: port, configuration: configuration)
        guard let leaf = peer.leaf else { throw ConfigurationError("\(connect) presented no certificate") }
        print(leaf.sha256Fingerprint)
    }
}
