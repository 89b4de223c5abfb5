import Foundation
import PinGateTestSupport
import PinGateTLS
import PinList
import Testing

/// `pingate list lint`: signed lists with a single pin, a near expiry, `*.co.uk`, and a
/// depth pin on the only trust anchor; warnings by default, non-zero under --strict.
@Suite("pingate list lint")
struct ListLintTests {
    static func hash(_ text: String) -> String { SHA256Digest.base64(Array(text.utf8)) }

    @Test("single pin, near expiry, *.co.uk and a depth pin on the only trust anchor are warned; --strict fails; a sound list passes --strict")
    func lintFiles() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let signer = try PrivateKey.generateP256()
        let publicKeyPath = try directory.write("signer.pub.pem", try signer.publicKey().pemString())
        let rootKey = try PrivateKey.generateP256()
        let root = try CertificateBuilder.selfSignedCA(commonName: "Only Root", key: rootKey, validity: 86_400 * 30)
        let rootPath = try directory.write("root.pem", try root.pemString())
        let now = Int64(Date().timeIntervalSince1970)
        let far = now + 200 * 86_400

        func write(_ name: String, _ pins: [PinGateSignedList.Pin], listExpires: Int64? = nil) throws -> String {
            // Issued a day before it expires at the latest (an expired list was issued earlier).
            let expires = listExpires ?? far
            let payload = PinGateSignedList.Payload(sequence: 1, issuedAt: min(now - 60, expires - 86_400), expiresAt: expires, pins: pins)
            return try directory.write(name, String(decoding: try PinGateSignedList.sign(payload, key: signer), as: UTF8.self))
        }
        let sound = try write("sound.json", [
            .init(host: "api.example.com", spki: Self.hash("current key"), expires: far),
            .init(host: "api.example.com", spki: Self.hash("backup key"), expires: far),
        ])
        let single = try write("single.json", [.init(host: "api.example.com", sha256: Self.hash("only"), expires: far)])
        let soon = try write("soon.json", [
            .init(host: "api.example.com", sha256: Self.hash("a"), expires: now + 5 * 86_400),
            .init(host: "api.example.com", sha256: Self.hash("b"), expires: far),
        ])
        let publicSuffix = try write("co-uk.json", [
            .init(host: "*.co.uk", spki: Self.hash("a"), expires: far),
            .init(host: "*.co.uk", spki: Self.hash("b"), expires: far),
        ])
        let rootDepth = try write("root-depth.json", [
            .init(host: "api.example.com", spki: root.spkiSHA256, expires: far, depth: .any),
            .init(host: "api.example.com", spki: Self.hash("b"), expires: far),
        ])
        let pingate = TestProcess.pingateExecutable
        func lint(_ path: String, _ extra: [String] = []) async throws -> TestProcess.Result {
            try await TestProcess.run(pingate, ["list", "lint", path, "--key", publicKeyPath] + extra)
        }

        let clean = try await lint(sound, ["--strict", "--upstream-ca", rootPath])
        #expect(clean.status == 0, "\(clean.stdout) \(clean.stderr)")
        #expect(clean.stdout.contains("2 pins, 0 warnings"))

        let cases: [(String, String)] = [
            (single, "warning: [single-pin] api.example.com: one pin and no backup"),
            (soon, "warning: [expires-soon] api.example.com: the sha256 pin \(Self.hash("a")) expires at"),
            (publicSuffix, "warning: [public-suffix-wildcard] *.co.uk: co.uk is a public suffix"),
        ]
        for (path, warning) in cases {
            let relaxed = try await lint(path)
            #expect(relaxed.status == 0, "\(path): \(relaxed.stderr)")
            #expect(relaxed.stdout.contains(warning), "\(path): \(relaxed.stdout)")
            let strict = try await lint(path, ["--strict"])
            #expect(strict.status != 0, "\(path) under --strict")
        }

        // Expired already: an error, non-zero without --strict (issue 33, item 4), for the
        // list itself and for a pin.
        let expiredList = try write("expired-list.json", [
            .init(host: "api.example.com", spki: Self.hash("current key"), expires: far),
            .init(host: "api.example.com", spki: Self.hash("backup key"), expires: far),
        ], listExpires: now - 3_600)
        let listRun = try await lint(expiredList)
        #expect(listRun.status == 4, "\(listRun.stdout) \(listRun.stderr)")
        #expect(listRun.stdout.contains("error: [expired] -: the list itself expired at"), "\(listRun.stdout)")
        #expect(!listRun.stdout.contains("expires-soon"), "\(listRun.stdout)")
        #expect(listRun.stdout.contains("2 pins, 0 warnings, 1 error"), "\(listRun.stdout)")
        let expiredPin = try write("expired-pin.json", [
            .init(host: "api.example.com", sha256: Self.hash("a"), expires: now - 60),
            .init(host: "api.example.com", sha256: Self.hash("b"), expires: far),
            .init(host: "api.example.com", sha256: Self.hash("c"), expires: far),
        ])
        let pinRun = try await lint(expiredPin)
        #expect(pinRun.status == 4, "\(pinRun.stdout) \(pinRun.stderr)")
        #expect(pinRun.stdout.contains("error: [expired] api.example.com: the sha256 pin \(Self.hash("a")) expired at"), "\(pinRun.stdout)")

        // The anchor check needs the anchors; with the only root configured it warns.
        #expect(!(try await lint(rootDepth)).stdout.contains("pins-only-trust-anchor"))
        let anchored = try await lint(rootDepth, ["--upstream-ca", rootPath])
        #expect(anchored.stdout.contains("warning: [pins-only-trust-anchor] api.example.com: the depth-any spki pin \(root.spkiSHA256)"), "\(anchored.stdout)")
        // With a second anchor configured, pinning one of them does restrict: no warning.
        let otherRoot = try CertificateBuilder.selfSignedCA(commonName: "Other Root", key: try PrivateKey.generateP256(), validity: 86_400)
        let twoRoots = try directory.write("two-roots.pem", try root.pemString() + otherRoot.pemString())
        #expect(!(try await lint(rootDepth, ["--upstream-ca", twoRoots])).stdout.contains("pins-only-trust-anchor"))

        // A list that does not verify is an error, not a warning.
        let wrongKey = try directory.write("wrong.pub.pem", try PrivateKey.generateP256().publicKey().pemString())
        let refused = try await TestProcess.run(pingate, ["list", "lint", sound, "--key", wrongKey])
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("does not verify"))
    }

    @Test("public suffixes: every TLD and the built-in multi-label ones; an organisation's own domain is not one")
    func publicSuffixes() {
        #expect(PinListLint.isPublicSuffix("com"))
        #expect(PinListLint.isPublicSuffix("co.uk"))
        #expect(PinListLint.isPublicSuffix("com.au"))
        #expect(!PinListLint.isPublicSuffix("example.co.uk"))
        #expect(!PinListLint.isPublicSuffix("example.com"))
    }
}
