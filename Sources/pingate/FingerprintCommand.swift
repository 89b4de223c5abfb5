import ArgumentParser
import Foundation
import PinGate
import PinGateTLS
import PinGateNIO

/// `pingate fingerprint`: the pin value of a certificate file or a live server's leaf,
/// or, with `--chain`, both hashes at every position of the chain pingate validates.
struct FingerprintCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fingerprint",
        abstract: "Print base64(SHA-256(leaf DER)) of a certificate file or of a live server's leaf.",
        discussion: """
        With --connect and --chain, prints one line per position of the chain pingate builds \
        and validates (0 is the leaf, the last the trust anchor), each with the certificate's \
        SHA-256, its SPKI SHA-256 and its subject: the values a depth pin names (sign --depth). \
        A chain that does not validate has no positions to pin, and the command fails.
        """)

    @Option(name: .long, help: "A PEM certificate file.")
    var cert: String?

    @Option(name: .long, help: "HOST:PORT of a live TLS server; only the handshake is sent.")
    var connect: String?

    @Flag(name: .long, help: "With --connect: every position of the validated chain, with both hashes.")
    var chain = false

    @OptionGroup var probe: ProbeOptions

    func validate() throws {
        guard (cert == nil) != (connect == nil) else { throw ValidationError("give exactly one of --cert or --connect") }
        if chain && connect == nil { throw ValidationError("--chain needs --connect: positions exist only in a validated chain") }
    }

    func run() async throws {
        if let cert {
            let certificate = try InputFile.certificate(cert, flag: "--cert")
            print(certificate.sha256Fingerprint)
            return
        }
        guard let connect else { return }
        let (_, peer) = try await probe.inspect(connect)
        guard let leaf = peer.leaf else { throw ConfigurationError("\(connect) presented no certificate") }
        guard chain else {
            print(leaf.sha256Fingerprint)
            return
        }
        guard !peer.verifiedChain.isEmpty else {
            throw ConfigurationError("\(connect): the chain did not validate (\(peer.verifyReason)); give its roots with --upstream-ca")
        }
        for line in Self.chainLines(peer.verifiedChain) { print(line) }
    }

    /// `depth=N sha256=… spki=… subject=…`, one per position, leaf first.
    static func chainLines(_ chain: [Certificate]) -> [String] {
        chain.enumerated().map { position, certificate in
            "depth=\(position) sha256=\(certificate.sha256Fingerprint) spki=\(certificate.spkiSHA256) subject=\(certificate.subjectDescription)"
        }
    }
}
