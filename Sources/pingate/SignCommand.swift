import ArgumentParser
import Foundation
import PinGate
import PinGateTLS
import PinList
import PinGateNIO

/// `pingate sign`: certificates (files or live servers) → a signed list on stdout.
struct SignCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sign",
        abstract: "Sign pins for certificate files or live servers into a list (JSON on stdout).",
        discussion: """
        Each --cert or --connect gives one pin, in order: --cert ones first, then --connect ones.
        The i-th --name and --expires apply to the i-th pin; without them the name is the
        certificate's common name (or the --connect host) and the expiry its notAfter.

        --format static (default) writes Wultra's static list: one signature per entry.
        --format v2 writes pingate's signed list: one signature over the whole payload, with
        --sequence (must grow with every list you publish), --list-expires, --spki pins,
        --report-only pins, wildcard names (*.example.com, **.example.com) and --revoke.
        """)

    @Option(name: .long, help: "The list-signing private key (PEM).")
    var key: String

    @Option(name: .long, help: "A PEM certificate to pin. Repeatable.")
    var cert: [String] = []

    @Option(name: .long, help: "HOST:PORT of a live TLS server whose leaf to pin. Repeatable.")
    var connect: [String] = []

    @Option(name: .long, help: "Connect to ADDR for HOST:PORT (with --connect), like curl's --resolve. Repeatable.")
    var resolve: [String] = []

    @Option(name: .long, help: "The host name (v2: or pattern) for the matching pin. Repeatable.")
    var name: [String] = []

    @Option(name: .long, help: "Unix time the matching pin expires. Repeatable.")
    var expires: [Int64] = []

    @Option(name: .long, help: "static (Wultra) or v2 (pingate signed list).")
    var format: String = "static"

    @Option(name: .long, help: "v2: the list's sequence number.")
    var sequence: Int64?

    @Option(name: .long, help: "v2: Unix time the list itself stops being fresh (default: 30 days from now).")
    var listExpires: Int64?

    @Flag(name: .long, help: "v2: pin the SubjectPublicKeyInfo (survives re-issuing with the same key) instead of the certificate.")
    var spki = false

    @Flag(name: .long, help: "v2: mark the pins report-only (mismatches pass but are reported).")
    var reportOnly = false

    @Option(name: .long, help: "v2: a base64 SHA-256 certificate or SPKI hash to revoke. Repeatable.")
    var revoke: [String] = []

    func validate() throws {
        guard !cert.isEmpty || !connect.isEmpty else { throw ValidationError("give at least one --cert or --connect") }
        guard name.count <= cert.count + connect.count, expires.count <= cert.count + connect.count else {
            throw ValidationError("more --name or --expires values than pins")
        }
        guard format == "static" || format == "v2" else { throw ValidationError("--format is static or v2") }
        if format == "v2" { guard sequence != nil else { throw ValidationError("--format v2 needs --sequence") } }
        if format == "static" && (spki || reportOnly || !revoke.isEmpty || sequence != nil) {
            throw ValidationError("--spki, --report-only, --revoke and --sequence need --format v2")
        }
    }

    func run() async throws {
        let signer = try PrivateKey(pem: String(contentsOfFile: PathText.resolve(key), encoding: .utf8))
        var certificates: [(Certificate, String?)] = try cert.map {
            (try Certificate(pem: String(contentsOfFile: PathText.resolve($0), encoding: .utf8)), nil)
        }
        var configuration = GateConfiguration()
        configuration.resolveOverrides = try resolve.map(ResolveOverride.init(parsing:))
        for target in connect {
            let (host, port) = try RunCommand.parseHostPort(target)
            let peer = try await UpstreamProbe.inspect(host: host.lowercased(), port: port, configuration: configuration)
            guard let leaf = peer.leaf else { throw ValidationError("\(target) presented no certificate") }
            certificates.append((leaf, host.lowercased()))
        }
        var pins: [(name: String, certificate: Certificate, expires: Int64)] = []
        for (index, (certificate, connectedHost)) in certificates.enumerated() {
            guard let host = index < name.count ? name[index] : (connectedHost ?? certificate.commonName) else {
                throw ValidationError("pin \(index) has no common name; give --name")
            }
            guard let expiry = index < expires.count ? expires[index] : certificate.notAfter.map({ Int64($0.timeIntervalSince1970) }) else {
                throw ValidationError("pin \(index) has no readable notAfter; give --expires")
            }
            pins.append((HostName.normalize(host), certificate, expiry))
        }

        if format == "static" {
            let entries = try pins.map {
                try WultraStaticList.sign(name: $0.name, fingerprint: $0.certificate.sha256Fingerprint, expires: $0.expires, key: signer)
            }
            print(try WultraStaticList.encode(entries), terminator: "")
            return
        }
        let now = Int64(Date().timeIntervalSince1970)
        let payload = PinGateSignedList.Payload(
            sequence: sequence ?? 0, issuedAt: now, expiresAt: listExpires ?? now + 30 * 86400,
            pins: pins.map {
                PinGateSignedList.Pin(host: $0.name, sha256: spki ? nil : $0.certificate.sha256Fingerprint,
                                      spki: spki ? $0.certificate.spkiSHA256 : nil, expires: $0.expires,
                                      mode: reportOnly ? "report-only" : "enforce")
            },
            revoked: revoke.isEmpty ? nil : revoke)
        let document = try PinGateSignedList.sign(payload, key: signer)
        // Verify what we wrote with our own verifier before handing it out.
        _ = try PinGateSignedList.verify(document, keys: [try signer.publicKey()], source: "sign")
        print(String(decoding: document, as: UTF8.self), terminator: "")
    }
}
