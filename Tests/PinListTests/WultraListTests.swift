import Foundation
import PinGateTestSupport
import PinGateTLS
import Testing
@testable import PinList

/// Every vector in shared/vectors/wultra, and the policy's verdicts at fixed times.
@Suite("Wultra static list and pin policy")
struct WultraListTests {
    static let entry0 = "NqWBi99vB1leaGi8Jr5RixqVZ+O/SlPckBhva3bVV7c="
    static let entry1 = "V4Uo6EKBrkD6hRrfXmFxJvrIsv3bM+wXAoJt4sdp0ww="
    static let beforeExpiry = Date(timeIntervalSince1970: 1_800_000_000) // 2027
    static let afterExpiry = Date(timeIntervalSince1970: 2_110_000_001)

    static func keys(_ file: String) throws -> [PublicKey] {
        [try PublicKey(text: WultraVectors.text(file))]
    }

    static func goodList() throws -> PinList {
        PinList(source: "static-list.json", entries: try WultraStaticList.verify(WultraVectors.data("static-list.json"), keys: keys("test-signer.pub.pem")))
    }

    @Test("the committed vectors are identical to shared/vectors/wultra",
          .enabled(if: WultraVectors.sharedIsPresent, "shared/vectors/wultra is not beside the checkout, so there is nothing to compare with"))
    func vectorsMatchShared() throws {
        let shared = WultraVectors.sharedDirectory
        let names = try FileManager.default.contentsOfDirectory(atPath: shared)
        #expect(!names.isEmpty, "the shared vector folder is empty")
        for name in names {
            let original = try Data(contentsOf: URL(fileURLWithPath: (shared as NSString).appendingPathComponent(name)))
            #expect(try WultraVectors.data(name) == original, "\(name) differs from the shared copy")
        }
    }

    @Test("static-list.json verifies with the PEM key and with the X9.63 key", arguments: ["test-signer.pub.pem", "test-signer.pub.x963.b64"])
    func goodVectorVerifies(keyFile: String) throws {
        let entries = try WultraStaticList.verify(WultraVectors.data("static-list.json"), keys: Self.keys(keyFile))
        #expect(entries.count == 3)
        #expect(entries.map(\.name) == ["api.vector.test", "api.vector.test", "old.vector.test"])
        #expect(entries[0].fingerprint == Self.entry0)
        #expect(entries[2].expires == Date(timeIntervalSince1970: 1_500_000_000))
    }

    @Test("tampered, swapped-signature and wrong-key lists are rejected whole",
          arguments: ["static-list.tampered.json", "static-list.swapped-signatures.json", "static-list.wrong-key.json"])
    func badVectorsAreRejected(file: String) throws {
        let data = try WultraVectors.data(file)
        let keys = try Self.keys("test-signer.pub.pem")
        let error = #expect(throws: PinListError.self) { try WultraStaticList.verify(data, keys: keys) }
        #expect(error?.token == "invalid-signature")
        guard case .badEntrySignature(let index, _)? = error else {
            Issue.record("expected a bad entry signature, got \(String(describing: error))")
            return
        }
        #expect(index == 0, "entry 0 is the first bad one in every bad vector")
    }

    @Test("malformed lists are rejected with a reason", arguments: [
        "not json",
        "{}",
        #"{"fingerprints":[{"name":"a","fingerprint":"AAAA","expires":1,"signature":"AAAA"}]}"#,
        #"{"fingerprints":[{"name":"a","expires":1,"signature":"AAAA"}]}"#,
        #"{"fingerprints":[{"name":"a","fingerprint":"NqWBi99vB1leaGi8Jr5RixqVZ+O/SlPckBhva3bVV7c=","expires":"soon","signature":"AAAA"}]}"#,
    ])
    func malformed(text: String) throws {
        do {
            _ = try WultraStaticList.verify(Data(text.utf8), keys: Self.keys("test-signer.pub.pem"))
            Issue.record("accepted \(text)")
        } catch let error as PinListError {
            #expect(error.token == "invalid-data")
        }
    }

    @Test("no key configured is an error, not an empty list")
    func noKey() throws {
        #expect(throws: PinListError.noVerificationKey) { try WultraStaticList.verify(WultraVectors.data("static-list.json"), keys: []) }
    }

    @Test("sign → encode → verify round trip, signed over name&fingerprint&expires")
    func signRoundTrip() throws {
        let key = try PrivateKey.generateP256()
        let entry = try WultraStaticList.sign(name: "api.example.test", fingerprint: Self.entry0, expires: 2_000_000_000, key: key)
        #expect(entry.signedBytes == Array("api.example.test&\(Self.entry0)&2000000000".utf8))
        let document = try WultraStaticList.encode([entry])
        let entries = try WultraStaticList.verify(Data(document.utf8), keys: [try key.publicKey()])
        #expect(entries == [PinEntry(name: "api.example.test", fingerprint: Self.entry0, expires: Date(timeIntervalSince1970: 2_000_000_000))])
    }

    // MARK: policy

    static let valid = PinPolicy.ChainCheck(valid: true, reason: "ok")

    @Test("the vectors' expected outcomes, at a fixed time before expiry")
    func vectorOutcomes() throws {
        let list = try Self.goodList()
        let policy = PinPolicy()
        let now = Self.beforeExpiry
        #expect(policy.evaluate(host: "api.vector.test", leaf: CertificateHashes(certificateSHA256: Self.entry0, spkiSHA256: nil), chain: Self.valid, list: list, now: now).summary == "trusted by depth-0 sha256 \(Self.entry0)")
        #expect(policy.evaluate(host: "API.Vector.Test.", leaf: CertificateHashes(certificateSHA256: Self.entry1, spkiSHA256: nil), chain: Self.valid, list: list, now: now).summary == "trusted by depth-0 sha256 \(Self.entry1)")
        let other = SHA256Digest.base64(Array("another certificate".utf8))
        #expect(policy.evaluate(host: "api.vector.test", leaf: CertificateHashes(certificateSHA256: other, spkiSHA256: nil), chain: Self.valid, list: list, now: now)
                == .untrusted(observed: other, expected: [Self.entry0, Self.entry1],
                              observedChain: [CertificateHashes(certificateSHA256: other, spkiSHA256: nil)]))
        #expect(policy.evaluate(host: "old.vector.test", leaf: CertificateHashes(certificateSHA256: "EsjPkAhVNOvX1W+GffQFkcmBS1maZ6dYTeD6XojcQ3I=", spkiSHA256: nil), chain: Self.valid, list: list, now: now) == .empty)
        #expect(policy.evaluate(host: "never.seen.test", leaf: CertificateHashes(certificateSHA256: Self.entry0, spkiSHA256: nil), chain: Self.valid, list: list, now: now) == .empty)
        #expect(policy.isPinned(host: "api.vector.test", list: list, now: now))
        #expect(!policy.isPinned(host: "old.vector.test", list: list, now: now))
    }

    @Test("after every entry expired the host is empty; no list at all is empty")
    func expiryAndNoList() throws {
        let list = try Self.goodList()
        let policy = PinPolicy()
        #expect(policy.evaluate(host: "api.vector.test", leaf: CertificateHashes(certificateSHA256: Self.entry0, spkiSHA256: nil), chain: Self.valid, list: list, now: Self.afterExpiry) == .empty)
        #expect(policy.evaluate(host: "api.vector.test", leaf: CertificateHashes(certificateSHA256: Self.entry0, spkiSHA256: nil), chain: Self.valid, list: nil, now: Self.beforeExpiry) == .empty)
        #expect(!policy.isPinned(host: "api.vector.test", list: nil, now: Self.beforeExpiry))
    }

    @Test("a matching pin with a failed chain is chain-invalid, unless the host is pins-only; a mismatch wins over a chain failure")
    func chainRules() throws {
        let list = try Self.goodList()
        let broken = PinPolicy.ChainCheck(valid: false, reason: "self-signed certificate")
        #expect(PinPolicy().evaluate(host: "api.vector.test", leaf: CertificateHashes(certificateSHA256: Self.entry0, spkiSHA256: nil), chain: broken, list: list, now: Self.beforeExpiry)
                == .chainInvalid(reason: "self-signed certificate", observed: Self.entry0))
        #expect(PinPolicy(pinsOnlyHosts: ["API.vector.test"]).evaluate(host: "api.vector.test", leaf: CertificateHashes(certificateSHA256: Self.entry0, spkiSHA256: nil), chain: broken, list: list, now: Self.beforeExpiry).summary == "trusted by depth-0 sha256 \(Self.entry0)")
        let other = SHA256Digest.base64(Array("x".utf8))
        #expect(PinPolicy().evaluate(host: "api.vector.test", leaf: CertificateHashes(certificateSHA256: other, spkiSHA256: nil), chain: broken, list: list, now: Self.beforeExpiry).reasonToken == "pin-mismatch")
    }

    @Test("reason tokens are the documented ones")
    func tokens() {
        #expect(Verdict.empty.reasonToken == "empty")
        #expect(Verdict.untrusted(observed: "a", expected: []).reasonToken == "pin-mismatch")
        #expect(Verdict.chainInvalid(reason: "r", observed: "a").reasonToken == "chain-invalid")
        #expect(Verdict.trusted(fingerprint: "a").reasonToken == "trusted")
    }
}
