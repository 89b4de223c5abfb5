import Foundation
import PinGateTestSupport
import PinGateTLS
import Testing
@testable import PinList
import PinListService

/// The v2 format, Wultra's dynamic mode, host patterns, the acceptance rules and persistence.
@Suite("Signed list v2, dynamic lists, acceptance and persistence")
struct SignedListV2Tests {
    static let hashA = SHA256Digest.base64(Array("certificate A".utf8))
    static let hashB = SHA256Digest.base64(Array("certificate B".utf8))
    static let keyA = SHA256Digest.base64(Array("public key A".utf8))
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let valid = PinPolicy.ChainCheck(valid: true, reason: "ok")

    static func payload(sequence: Int64 = 7, pins: [PinGateSignedList.Pin], revoked: [String]? = nil,
                        expiresAt: Int64 = 1_900_000_000) -> PinGateSignedList.Payload {
        .init(sequence: sequence, issuedAt: 1_700_000_000, expiresAt: expiresAt, pins: pins, revoked: revoked)
    }

    @Test("host patterns follow OkHttp: * is one label, ** any depth including the apex")
    func hostPatterns() throws {
        let one = try HostPattern(parsing: "*.Example.com")
        #expect(one.matches("api.example.com"))
        #expect(!one.matches("example.com"))
        #expect(!one.matches("a.b.example.com"))
        let any = try HostPattern(parsing: "**.example.com.")
        #expect(any.matches("example.com"))
        #expect(any.matches("a.b.example.com"))
        #expect(!any.matches("badexample.com"))
        #expect(try HostPattern(parsing: "API.example.com") == .exact("api.example.com"))
        for bad in ["", "*", "a.*.com", "***.x.com", "*.", "..x"] {
            #expect(throws: PinListError.self, "\(bad)") { try HostPattern(parsing: bad) }
        }
    }

    @Test("sign → verify: sequence, validity, key id, SPKI and wildcard pins, report-only and revoked")
    func roundTrip() throws {
        let key = try PrivateKey.generateP256()
        let data = try PinGateSignedList.sign(Self.payload(pins: [
            .init(host: "api.example.com", sha256: Self.hashA, expires: 1_850_000_000),
            .init(host: "**.cdn.example.com", spki: Self.keyA, expires: 1_850_000_000, mode: "report-only"),
        ], revoked: [Self.hashB]), key: key)
        let list = try PinGateSignedList.verify(data, keys: [try PrivateKey.generateP256().publicKey(), try key.publicKey()], source: "test")
        #expect(list.metadata.format == .pingateV2)
        #expect(list.metadata.sequence == 7)
        #expect(list.metadata.keyID == (try key.publicKey().keyID))
        #expect(list.metadata.expiresAt == Date(timeIntervalSince1970: 1_900_000_000))
        #expect(list.revoked == [Self.hashB])
        #expect(list.unexpiredEntries(for: "img.cdn.example.com", at: Self.now).map(\.kind) == [.spki])
        #expect(list.unexpiredEntries(for: "cdn.example.com", at: Self.now).first?.mode == .reportOnly)
        #expect(SignedListDocument.detectFormat(data) == .pingateV2)
    }

    @Test("a changed payload byte, a wrong key, an unknown key id and garbage are rejected")
    func rejections() throws {
        let key = try PrivateKey.generateP256()
        let data = try PinGateSignedList.sign(Self.payload(pins: [.init(host: "a.test", sha256: Self.hashA, expires: 1_850_000_000)]), key: key)
        var envelope = try JSONDecoder().decode(PinGateSignedList.Envelope.self, from: data)
        var payload = try #require(Data(base64Encoded: envelope.payload))
        payload[payload.count / 2] ^= 0x01
        envelope.payload = payload.base64EncodedString()
        let tampered = try JSONEncoder().encode(envelope)
        #expect(throws: PinListError.badSignature("v2 payload")) {
            try PinGateSignedList.verify(tampered, keys: [try key.publicKey()], source: "t")
        }
        #expect(throws: PinListError.self) { try PinGateSignedList.verify(data, keys: [try PrivateKey.generateP256().publicKey()], source: "t") }
        #expect(throws: PinListError.self) { try PinGateSignedList.verify(Data("{\"format\":\"x\"}".utf8), keys: [try key.publicKey()], source: "t") }
        #expect(throws: PinListError.self) { try PinGateSignedList.verify(data.prefix(data.count / 2), keys: [try key.publicKey()], source: "t") }
    }

    @Test("the policy: wildcard and SPKI pins, revoked wins over a pin, report-only passes but says so, a stale list is empty")
    func policyV2() throws {
        let key = try PrivateKey.generateP256()
        let list = try PinGateSignedList.verify(try PinGateSignedList.sign(Self.payload(pins: [
            .init(host: "*.example.com", sha256: Self.hashA, expires: 1_850_000_000),
            .init(host: "*.example.com", sha256: Self.hashB, expires: 1_850_000_000),
            .init(host: "key.example.net", spki: Self.keyA, expires: 1_850_000_000),
            .init(host: "soft.example.org", sha256: Self.hashA, expires: 1_850_000_000, mode: "report-only"),
        ], revoked: [Self.hashB]), key: key), keys: [try key.publicKey()], source: "t")
        let policy = PinPolicy()
        let leafA = CertificateHashes(certificateSHA256: Self.hashA, spkiSHA256: Self.keyA)
        let leafB = CertificateHashes(certificateSHA256: Self.hashB, spkiSHA256: "other")
        let rotated = CertificateHashes(certificateSHA256: SHA256Digest.base64(Array("renewed A".utf8)), spkiSHA256: Self.keyA)
        #expect(policy.evaluate(host: "api.example.com", leaf: leafA, chain: Self.valid, list: list, now: Self.now).summary == "trusted by depth-0 sha256 \(Self.hashA)")
        #expect(policy.evaluate(host: "api.example.com", leaf: leafB, chain: Self.valid, list: list, now: Self.now) == .revoked(observed: Self.hashB))
        #expect(policy.evaluate(host: "key.example.net", leaf: rotated, chain: Self.valid, list: list, now: Self.now).isTrusted)
        #expect(policy.evaluate(host: "soft.example.org", leaf: rotated, chain: Self.valid, list: list, now: Self.now)
                == .reportOnlyViolation(observed: rotated.certificateSHA256, expected: [Self.hashA], observedChain: [rotated]))
        #expect(policy.evaluate(host: "soft.example.org", leaf: rotated, chain: .init(valid: false, reason: "bad"), list: list, now: Self.now).reasonToken == "chain-invalid")
        #expect(policy.evaluate(host: "example.com", leaf: leafA, chain: Self.valid, list: list, now: Self.now) == .empty)
        let later = Date(timeIntervalSince1970: 1_900_000_001)
        #expect(policy.evaluate(host: "api.example.com", leaf: leafA, chain: Self.valid, list: list, now: later) == .empty)
        #expect(!policy.isPinned(host: "api.example.com", list: list, now: later))
    }

    @Test("acceptance: a lower sequence is a rollback, an equal or higher one passes, an expired list is refused")
    func acceptance() throws {
        let key = try PrivateKey.generateP256()
        func list(_ sequence: Int64, expiresAt: Int64 = 1_900_000_000) throws -> PinList {
            try PinGateSignedList.verify(try PinGateSignedList.sign(Self.payload(sequence: sequence, pins: [], expiresAt: expiresAt), key: key),
                                         keys: [try key.publicKey()], source: "t")
        }
        let inForce = try list(10)
        #expect(throws: PinListRejection.rollback(inForce: 10, offered: 9)) { try PinListAcceptance.check(try list(9), replacing: inForce, now: Self.now) }
        try PinListAcceptance.check(try list(10), replacing: inForce, now: Self.now)
        try PinListAcceptance.check(try list(11), replacing: inForce, now: Self.now)
        try PinListAcceptance.check(try list(1), replacing: nil, now: Self.now)
        #expect(throws: PinListRejection.self) { try PinListAcceptance.check(try list(12, expiresAt: 1_750_000_000), replacing: inForce, now: Self.now) }
        let unsequenced = PinList(source: "static", entries: [])
        #expect(throws: PinListRejection.rollback(inForce: 10, offered: nil)) { try PinListAcceptance.check(unsequenced, replacing: inForce, now: Self.now) }
    }

    @Test("the dynamic vector verifies with its challenge, and fails with another challenge or a changed body")
    func dynamicVector() throws {
        let keys = [try PublicKey(text: WultraVectors.text("test-signer.pub.x963.b64"))]
        let body = try WultraVectors.data("dynamic-body.json")
        let challenge = try WultraVectors.text("dynamic-challenge.txt")
        let signature = try WultraVectors.text("dynamic-signature.txt")
        let list = try WultraDynamicList.verify(body: body, challenge: challenge, signature: signature, keys: keys, source: "v")
        #expect(list.entries.map(\.name) == ["api.vector.test"])
        #expect(list.metadata.issuedAt == Date(timeIntervalSince1970: 1_763_790_000))
        #expect(throws: PinListError.self) {
            try WultraDynamicList.verify(body: body, challenge: WultraDynamicList.makeChallenge(), signature: signature, keys: keys, source: "v")
        }
        var changed = body
        changed[changed.count - 3] ^= 0x01
        #expect(throws: PinListError.self) { try WultraDynamicList.verify(body: changed, challenge: challenge, signature: signature, keys: keys, source: "v") }
        #expect(Data(base64Encoded: WultraDynamicList.makeChallenge())?.count == 16)
    }

    @Test("persistence: save, load and re-verify; an edited file is rejected at load")
    func persistence() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let key = try PrivateKey.generateP256()
        let body = try PinGateSignedList.sign(Self.payload(pins: [.init(host: "a.test", sha256: Self.hashA, expires: 1_850_000_000)]), key: key)
        let store = PinListPersistence(stateDirectory: directory.file("state"))
        #expect(try store.load(keys: [try key.publicKey()]) == nil)
        try store.save(SignedListDocument(format: .pingateV2, source: "https://lists.test/pins", body: body))
        let (document, list) = try #require(try store.load(keys: [try key.publicKey()]))
        #expect(document.body == body)
        #expect(list.metadata.sequence == 7)

        var text = try String(contentsOfFile: store.path, encoding: .utf8)
        let original = body.base64EncodedString()
        var tamperedBody = body
        tamperedBody[40] ^= 0x01
        text = text.replacingOccurrences(of: original, with: tamperedBody.base64EncodedString())
        try text.write(toFile: store.path, atomically: true, encoding: .utf8)
        #expect(throws: PinListError.self) { try store.load(keys: [try key.publicKey()]) }
    }
}
