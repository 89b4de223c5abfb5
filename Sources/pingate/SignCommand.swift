import ArgumentParser
import Foundation
import PinGate
import PinGateTLS
import PinList
import PinListService
import PinGateNIO

/// `pingate sign`: certificates (files or live servers) → a signed list on stdout.
struct SignCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sign",
        abstract: "Sign pins for certificate files or live servers into a list (JSON on stdout).",
        discussion: """
        Each --cert or --connect gives one pin, in order: --cert ones first, then --connect ones. \
        The i-th --name and --expires apply to the i-th pin; without them the name is the \
        certificate's common name (or the --connect host) and the expiry its notAfter.

        --format static (default) writes Wultra's static list: one signature per entry. \
        --format v2 writes pingate's signed list: one signature over the whole payload, with \
        --sequence (must grow with every list you publish), --list-expires, --spki pins, \
        --report-only pins, wildcard names (*.example.com, **.example.com) and --revoke.

        --depth (v2) names the position of the validated chain the i-th pin is for: 0 (the \
        leaf, default), 1 (the leaf's issuer), … or any. With --cert give the certificate of \
        that position (e.g. the intermediate) and --name; with --connect the certificate at \
        that position of the chain pingate validates is pinned (for any: the trust anchor).
        """)

    @Option(name: .long, help: "The list-signing private key (PEM).")
    var key: String

    @Option(name: .long, help: "A list draft to sign (from pingate list propose, reviewed), instead of --cert and --connect.")
    var draft: String?

    @Option(name: .long, help: "A PEM certificate to pin. Repeatable.")
    var cert: [String] = []

    @Option(name: .long, help: "HOST:PORT of a live TLS server whose leaf to pin. Repeatable.")
    var connect: [String] = []

    @OptionGroup var probe: ProbeOptions

    @Option(name: .long, help: "The host name (v2: or pattern) for the matching pin. Repeatable.")
    var name: [String] = []

    @Option(name: .long, help: "Unix time the matching pin expires. Repeatable.")
    var expires: [Int64] = []

    @Option(name: .long, help: "static (Wultra) or v2 (pingate signed list).")
    var format: String = "static"

    @Option(name: .long, help: "v2: the list's sequence number (must grow with every list; a draft from list propose --next carries the next one, used when this is not given).")
    var sequence: Int64?

    @Option(name: .long, help: "v2: Unix time the list itself stops being fresh (default: 30 days from now).")
    var listExpires: Int64?

    @Flag(name: .long, help: "v2: pin the SubjectPublicKeyInfo (survives re-issuing with the same key) instead of the certificate.")
    var spki = false

    @Flag(name: .long, help: "v2: mark the pins report-only (mismatches pass but are reported).")
    var reportOnly = false

    @Option(name: .long, help: "v2: a base64 SHA-256 certificate or SPKI hash to revoke. Repeatable.")
    var revoke: [String] = []

    @Option(name: .long, help: "v2: the matching pin's position in the validated chain: 0 (leaf), 1, … or any. Repeatable.")
    var depth: [String] = []

    /// The parsed `--depth` values (validated in `validate()`).
    private var depths: [PinEntry.Depth] { depth.compactMap(PinEntry.Depth.init(parsing:)) }

    func validate() throws {
        if draft != nil {
            guard cert.isEmpty, connect.isEmpty, name.isEmpty, expires.isEmpty, depth.isEmpty, !spki else {
                throw ValidationError("--draft names its pins itself: give no --cert, --connect, --name, --expires, --depth or --spki with it")
            }
        } else {
            guard !cert.isEmpty || !connect.isEmpty else { throw ValidationError("give at least one --cert, --connect or --draft") }
        }
        guard name.count <= cert.count + connect.count, expires.count <= cert.count + connect.count else {
            throw ValidationError("more --name or --expires values than pins")
        }
        guard format == "static" || format == "v2" else { throw ValidationError("--format is static or v2") }
        // A draft from `list propose --next` carries its sequence; any other needs one.
        if format == "v2" && draft == nil { guard sequence != nil else { throw ValidationError("--format v2 needs --sequence") } }
        if format == "static" && (spki || reportOnly || !revoke.isEmpty || sequence != nil || !depth.isEmpty) {
            throw ValidationError("--spki, --report-only, --revoke, --sequence and --depth need --format v2")
        }
        guard depth.count <= cert.count + connect.count else { throw ValidationError("more --depth values than pins") }
        for text in depth where PinEntry.Depth(parsing: text) == nil {
            throw ValidationError("--depth \(text): give 0, 1, … or any")
        }
        // A --cert for another position than the leaf is a CA certificate: its common name
        // is not the host it protects, so the host must be said.
        for (index, value) in depths.enumerated() where index < cert.count && !value.isLeaf && index >= name.count {
            throw ValidationError("pin \(index) (--cert \(cert[index])) has --depth \(value): give its host with --name")
        }
    }

    func run() async throws {
        let signer = try InputFile.privateKey(key, flag: "--key")
        if let draft {
            try signDraft(draft, signer: signer)
            return
        }
        var certificates: [(Certificate, String?)] = try cert.map { (try InputFile.certificate($0, flag: "--cert"), nil) }
        for (offset, target) in connect.enumerated() {
            let (host, peer) = try await probe.inspect(target)
            let index = cert.count + offset
            let certificate = try Self.certificate(at: index < depths.count ? depths[index] : .leaf, of: peer, target: target)
            certificates.append((certificate, host))
        }
        var pins: [(name: String, certificate: Certificate, expires: Int64, depth: PinEntry.Depth)] = []
        for (index, (certificate, connectedHost)) in certificates.enumerated() {
            guard let host = index < name.count ? name[index] : (connectedHost ?? certificate.commonName) else {
                throw ValidationError("pin \(index) has no common name; give --name")
            }
            guard let expiry = index < expires.count ? expires[index] : certificate.notAfter.map({ Int64($0.timeIntervalSince1970) }) else {
                throw ValidationError("pin \(index) has no readable notAfter; give --expires")
            }
            let depth = index < depths.count ? depths[index] : PinEntry.Depth.leaf
            if depth.isLeaf, index < name.count, !host.contains("*"), !certificate.names(host: HostName.normalize(host)) {
                // Not refused (a list may pin a leaf for a name served through another), but
                // the gate's hostname check would then refuse every connection to it.
                FileHandle.standardError.write(Data("pingate sign: warning: pin \(index)'s certificate does not name \(host) (its common name: \(certificate.commonName ?? "none")); the gate will refuse \(host) on its host name check unless it is a pins-only host\n".utf8))
            }
            pins.append((HostName.normalize(host), certificate, expiry, depth))
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
                                      mode: reportOnly ? "report-only" : "enforce",
                                      depth: $0.depth.isLeaf ? nil : $0.depth)
            },
            revoked: revoke.isEmpty ? nil : revoke)
        try printSigned(payload, signer: signer)
    }

    /// Signs the v2 `payload`, checks the result with the gate's own verifier, prints it.
    private func printSigned(_ payload: PinGateSignedList.Payload, signer: PrivateKey) throws {
        let document = try PinGateSignedList.sign(payload, key: signer)
        // Verify what we wrote with our own verifier before handing it out.
        _ = try PinGateSignedList.verify(document, keys: [try signer.publicKey()], source: "sign")
        print(String(decoding: document, as: UTF8.self), terminator: "")
    }

    /// `--draft FILE`: the draft's pins, signed in `--format` (the `why` fields stay behind).
    private func signDraft(_ path: String, signer: PrivateKey) throws {
        let resolved = PathText.resolve(path)
        let draft: ListDraft
        do {
            draft = try ListDraft.decode(Data(try InputFile.text(path, what: "a list draft from pingate list propose", flag: "--draft").utf8))
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError("--draft \(resolved) is not a list draft (pingate list propose writes one): \(error)")
        }
        guard !draft.pins.isEmpty else { throw ConfigurationError("--draft \(resolved) has no pins") }
        if format == "static" {
            let entries = try draft.pins.enumerated().map { index, pin in
                guard let sha256 = pin.sha256, pin.spki == nil, pin.depth?.isLeaf ?? true else {
                    throw ConfigurationError("--draft \(resolved): pin \(index) (\(pin.host)) is a key or depth pin, which Wultra's static format cannot hold; sign with --format v2, or propose with --format wultra-static")
                }
                return try WultraStaticList.sign(name: pin.host, fingerprint: sha256, expires: pin.expires, key: signer)
            }
            print(try WultraStaticList.encode(entries), terminator: "")
            return
        }
        guard let listSequence = sequence ?? draft.sequence else {
            throw ConfigurationError("--format v2 needs --sequence: the draft \(resolved) does not carry one (only list propose --next's drafts do)")
        }
        let now = Int64(Date().timeIntervalSince1970)
        try printSigned(PinGateSignedList.Payload(
            sequence: listSequence, issuedAt: now, expiresAt: listExpires ?? now + 30 * 86400,
            pins: draft.pins.map {
                PinGateSignedList.Pin(host: $0.host, sha256: $0.sha256, spki: $0.spki, expires: $0.expires,
                                      mode: reportOnly ? "report-only" : "enforce", depth: ($0.depth?.isLeaf ?? true) ? nil : $0.depth)
            },
            revoked: revoke.isEmpty ? nil : revoke), signer: signer)
    }

    /// The certificate a `--connect` pin at `depth` names: the leaf, or that position of
    /// the chain pingate validated (the trust anchor for `any`). A position needs a chain
    /// that validated, as the gate will only ever match it on one.
    private static func certificate(at depth: PinEntry.Depth, of peer: TLSPeerSummary, target: String) throws -> Certificate {
        if depth.isLeaf {
            guard let leaf = peer.leaf else { throw ValidationError("\(target) presented no certificate") }
            return leaf
        }
        guard !peer.verifiedChain.isEmpty else {
            throw ValidationError("\(target): its chain did not validate (\(peer.verifyReason)), so it has no position \(depth) to pin; give --upstream-ca or use --cert")
        }
        switch depth {
        case .any:
            return peer.verifiedChain[peer.verifiedChain.count - 1]
        case .position(let position):
            guard position < peer.verifiedChain.count else {
                throw ValidationError("\(target): its validated chain has \(peer.verifiedChain.count) certificates, no position \(position)")
            }
            return peer.verifiedChain[position]
        }
    }
}
