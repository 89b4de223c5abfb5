import Foundation
import PinGateTestSupport
import Testing
import PinGateTLS
import PinGateHarness

/// The rotation helpers on the command line: `fingerprint --connect --chain` and
/// `sign --format v2 --depth`, against an origin presenting an openssl-made chain, and the
/// openssl-only recipe for a depth pin from docs/signed-list-v2.md.
@Suite("Depth pins on the command line")
struct DepthPinCommandLineTests {
    static let host = "cli.depth.test"

    @Test("fingerprint --chain prints both hashes at every validated position; sign --depth pins that position (by --connect and by --cert)")
    func fingerprintChainAndSignDepth() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let chain = try await TestChainPKI.make(in: directory)
        let intermediate = try await chain.intermediate("intermediate")
        let leaf = try await chain.leaf("leaf", host: Self.host, issuer: intermediate)
        let signer = try PrivateKey.generateP256()
        let keyPath = try directory.write("signer.key", try signer.pkcs8PEM())
        let publicKeyPath = try directory.write("signer.pub.pem", try signer.publicKey().pemString())
        let pingate = TestProcess.pingateExecutable

        try await LoopbackOrigin.with(identity: leaf, chain: [intermediate], behaviour: .http(body: "cli")) { origin in
            let target = "\(Self.host):\(origin.port)"
            let probe = ["--connect", target, "--resolve", "\(target):127.0.0.1", "--upstream-ca", chain.root.certificatePath]
            let printed = try await TestProcess.run(pingate, ["fingerprint", "--chain"] + probe)
            #expect(printed.status == 0, "\(printed.stderr)")
            let lines = printed.stdout.split(separator: "\n").map(String.init)
            #expect(lines.count == 3)
            for (position, identity) in [leaf, intermediate, chain.root].enumerated() where position < lines.count {
                #expect(lines[position].hasPrefix("depth=\(position) sha256=\(identity.fingerprint) spki=\(identity.certificate.spkiSHA256) subject="))
            }
            // Without the chain's root the positions do not exist: an error, not a guess.
            let unvalidated = try await TestProcess.run(pingate, ["fingerprint", "--chain", "--connect", target, "--resolve", "\(target):127.0.0.1"])
            #expect(unvalidated.status != 0)
            #expect(unvalidated.stderr.contains("did not validate"))

            let byConnect = try await TestProcess.run(pingate, ["sign", "--format", "v2", "--sequence", "1", "--key", keyPath, "--spki",
                                                                "--depth", "1"] + probe)
            #expect(byConnect.status == 0, "\(byConnect.stderr)")
            let byCert = try await TestProcess.run(pingate, ["sign", "--format", "v2", "--sequence", "1", "--key", keyPath, "--spki",
                                                             "--cert", intermediate.certificatePath, "--name", Self.host, "--depth", "1"])
            #expect(byCert.status == 0, "\(byCert.stderr)")
            for (label, list) in [("connect", byConnect.stdout), ("cert", byCert.stdout)] {
                let path = try directory.write("\(label).json", list)
                let verified = try await TestProcess.run(pingate, ["list", "verify", path, "--key", publicKeyPath])
                #expect(verified.status == 0, "\(label): \(verified.stderr)")
                #expect(verified.stdout.contains("\(Self.host)  spki/\(intermediate.certificate.spkiSHA256)  enforce  depth 1"), "\(label): \(verified.stdout)")
            }
        }
        // An intermediate's common name is not the host: --depth on a --cert needs --name.
        let nameless = try await TestProcess.run(pingate, ["sign", "--format", "v2", "--sequence", "1", "--key", keyPath,
                                                           "--cert", intermediate.certificatePath, "--depth", "1"])
        #expect(nameless.status != 0)
        #expect(nameless.stderr.contains("give its host with --name"))
        let staticDepth = try await TestProcess.run(pingate, ["sign", "--key", keyPath, "--cert", leaf.certificatePath, "--depth", "1"])
        #expect(staticDepth.status != 0)
    }

    @Test("the openssl-only recipe for a depth-1 SPKI pin (docs/signed-list-v2.md) verifies with depth 1")
    func opensslRecipe() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let chain = try await TestChainPKI.make(in: directory)
        let intermediate = try await chain.intermediate("intermediate")
        let script = """
        set -euo pipefail
        cd "$1"
        openssl ecparam -name prime256v1 -genkey -noout -out signer.key
        openssl pkey -in signer.key -pubout -out signer.pub.pem
        spki=$(openssl x509 -in intermediate.pem -pubkey -noout | openssl pkey -pubin -outform DER | openssl dgst -sha256 -binary | base64 -w0)
        printf '{"sequence":2,"issuedAt":1763790000,"expiresAt":4102444800,"pins":[{"host":"api.example.com","spki":"%s","expires":4102444800,"depth":1}]}' "$spki" > payload.json
        openssl dgst -sha256 -sign signer.key -out payload.sig payload.json
        key_id=$(openssl pkey -pubin -in signer.pub.pem -outform DER | openssl dgst -sha256 -binary | head -c 8 | od -An -tx1 | tr -d ' \\n')
        printf '{"format":"pingate-signed-list/2","keyId":"%s","payload":"%s","signature":"%s"}\\n' "$key_id" "$(base64 -w0 payload.json)" "$(base64 -w0 payload.sig)" > pins-v2.json
        """
        let made = try await TestProcess.run("bash", ["-c", script, "make", directory.path])
        #expect(made.status == 0, "\(made.stderr)")
        let verified = try await TestProcess.run(TestProcess.pingateExecutable, ["list", "verify", directory.file("pins-v2.json"),
                                                                                 "--key", directory.file("signer.pub.pem")])
        #expect(verified.status == 0, "\(verified.stderr)")
        #expect(verified.stdout.contains("api.example.com  spki/\(intermediate.certificate.spkiSHA256)  enforce  depth 1"), "\(verified.stdout)")
    }
}
