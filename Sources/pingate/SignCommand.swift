import ArgumentParser
import Foundation
import PinGateTLS
import PinList

/// `pingate sign`: certificates → a signed Wultra static list on stdout.
struct SignCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sign",
        abstract: "Sign entries for certificate files into a Wultra static list (JSON on stdout).",
        discussion: """
        Each --cert gives one entry. The i-th --name and --expires apply to the i-th --cert; without
        them the name is the certificate's common name and the expiry its notAfter.
        """)

    @Option(name: .long, help: "The list-signing private key (PEM).")
    var key: String

    @Option(name: .long, help: "A PEM certificate to pin. Repeatable.")
    var cert: [String]

    @Option(name: .long, help: "The host name for the matching --cert. Repeatable.")
    var name: [String] = []

    @Option(name: .long, help: "Unix time the matching entry expires. Repeatable.")
    var expires: [Int64] = []

    func validate() throws {
        guard !cert.isEmpty else { throw ValidationError("give at least one --cert") }
        guard name.count <= cert.count, expires.count <= cert.count else {
            throw ValidationError("more --name or --expires values than --cert files")
        }
    }

    func run() throws {
        let signer = try PrivateKey(pem: String(contentsOfFile: PathText.resolve(key), encoding: .utf8))
        var entries: [WultraStaticList.SignedEntry] = []
        for (index, path) in cert.enumerated() {
            let certificate = try Certificate(pem: String(contentsOfFile: PathText.resolve(path), encoding: .utf8))
            guard let host = index < name.count ? name[index] : certificate.commonName else {
                throw ValidationError("\(path) has no common name; give --name")
            }
            guard let expiry = index < expires.count ? expires[index] : certificate.notAfter.map({ Int64($0.timeIntervalSince1970) }) else {
                throw ValidationError("\(path) has no readable notAfter; give --expires")
            }
            entries.append(try WultraStaticList.sign(
                name: HostName.normalize(host), fingerprint: certificate.sha256Fingerprint, expires: expiry, key: signer))
        }
        print(try WultraStaticList.encode(entries), terminator: "")
    }
}
