import Foundation
import PinGateTLS
import Testing
@testable import PinList

/// Depth pins in the policy, without sockets: positions count in the verified chain the
/// TLS layer hands over (empty when validation failed), never in what a server sent.
@Suite("Depth pins: positions in the validated chain")
struct DepthPinPolicyTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let later = now.addingTimeInterval(86_400)

    static func hashes(_ name: String) -> CertificateHashes {
        CertificateHashes(certificateSHA256: SHA256Digest.base64(Array("cert \(name)".utf8)),
                          spkiSHA256: SHA256Digest.base64(Array("key \(name)".utf8)))
    }

    static let leaf = hashes("leaf")
    static let rekeyedLeaf = hashes("leaf-2")
    static let intermediate = hashes("intermediate")
    static let otherIntermediate = hashes("other-intermediate")
    static let root = hashes("root")

    static func list(_ pins: [PinEntry], domainRules: DomainRules? = nil) -> PinList {
        PinList(source: "test", entries: pins, metadata: .init(format: .pingateV2), domainRules: domainRules)
    }

    static func pin(_ hash: String, host: String = "api.example.test", kind: PinEntry.Kind = .spki, depth: PinEntry.Depth,
                    mode: PinEntry.Mode = .enforce) throws -> PinEntry {
        PinEntry(host: try HostPattern(parsing: host), fingerprint: hash, kind: kind, expires: later, mode: mode, depth: depth)
    }

    static func valid(_ chain: [CertificateHashes]) -> PinPolicy.ChainCheck {
        .init(valid: true, reason: "ok", verifiedChain: chain)
    }

    static let broken = PinPolicy.ChainCheck(valid: false, reason: "unable to get local issuer certificate")

    @Test("a depth-1 SPKI pin trusts any leaf under the pinned intermediate and names the pin that carried it")
    func depthOneSPKI() throws {
        let list = Self.list([try Self.pin(Self.intermediate.spkiSHA256!, depth: .position(1))])
        let policy = PinPolicy()
        for leaf in [Self.leaf, Self.rekeyedLeaf] {
            let verdict = policy.evaluate(host: "api.example.test", leaf: leaf, chain: Self.valid([leaf, Self.intermediate, Self.root]),
                                          list: list, now: Self.now)
            #expect(verdict.isTrusted)
            #expect(verdict.matchedPin?.position == 1)
            #expect(verdict.summary == "trusted by depth-1 spki \(Self.intermediate.spkiSHA256!)")
        }
        let other = policy.evaluate(host: "api.example.test", leaf: Self.leaf,
                                    chain: Self.valid([Self.leaf, Self.otherIntermediate, Self.root]), list: list, now: Self.now)
        #expect(other == .untrusted(observed: Self.leaf.certificateSHA256, expected: [Self.intermediate.spkiSHA256!],
                                    observedChain: [Self.leaf, Self.otherIntermediate, Self.root]))
    }

    @Test("a depth pin names one position: the intermediate's hash at depth 2 or 0 does not match a depth-1 pin")
    func positionIsExact() throws {
        let list = Self.list([try Self.pin(Self.intermediate.certificateSHA256, kind: .certificate, depth: .position(1))])
        let policy = PinPolicy()
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.leaf, chain: Self.valid([Self.leaf, Self.intermediate]),
                                list: list, now: Self.now).summary == "trusted by depth-1 sha256 \(Self.intermediate.certificateSHA256)")
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.leaf, chain: Self.valid([Self.leaf, Self.root, Self.intermediate]),
                                list: list, now: Self.now).reasonToken == "pin-mismatch")
        // A chain shorter than the pinned depth is skipped, not an error (Wultra does the same).
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.leaf, chain: Self.valid([Self.leaf]),
                                list: list, now: Self.now).reasonToken == "pin-mismatch")
    }

    @Test("depth any matches the trust anchor; a depth-2 pin names the root of a three-certificate chain")
    func anyAndRoot() throws {
        let policy = PinPolicy()
        let chain = Self.valid([Self.leaf, Self.intermediate, Self.root])
        let any = Self.list([try Self.pin(Self.root.spkiSHA256!, depth: .any)])
        let verdict = policy.evaluate(host: "api.example.test", leaf: Self.leaf, chain: chain, list: any, now: Self.now)
        #expect(verdict.summary == "trusted by depth-2 spki \(Self.root.spkiSHA256!) (pin depth any)")
        let two = Self.list([try Self.pin(Self.root.certificateSHA256, kind: .certificate, depth: .position(2))])
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.leaf, chain: chain, list: two, now: Self.now).matchedPin?.position == 2)
    }

    @Test("depth pins need a validated chain: a failed chain is chain-invalid, pins-only does not help, the chain the TLS layer passed is ignored")
    func depthNeedsValidation() throws {
        let list = Self.list([try Self.pin(Self.intermediate.spkiSHA256!, depth: .position(1))])
        // Even if a caller passed a chain alongside a failed validation, it is not used.
        let failedWithChain = PinPolicy.ChainCheck(valid: false, reason: "self-signed certificate in certificate chain",
                                                   verifiedChain: [Self.leaf, Self.intermediate, Self.root])
        for policy in [PinPolicy(), PinPolicy(pinsOnlyHosts: ["api.example.test"])] {
            let verdict = policy.evaluate(host: "api.example.test", leaf: Self.leaf, chain: failedWithChain, list: list, now: Self.now)
            #expect(verdict.reasonToken == "chain-invalid")
            #expect(!verdict.isTrusted)
        }
        // pins-only still applies to leaf pins alone.
        let leafPin = Self.list([try Self.pin(Self.leaf.certificateSHA256, kind: .certificate, depth: .leaf)])
        #expect(PinPolicy(pinsOnlyHosts: ["api.example.test"]).evaluate(host: "api.example.test", leaf: Self.leaf, chain: Self.broken,
                                                                        list: leafPin, now: Self.now).isTrusted)
    }

    @Test("a leaf pin and a depth pin together: either carries the verdict; revocation still wins")
    func mixed() throws {
        let list = PinList(source: "t", entries: [
            try Self.pin(Self.leaf.certificateSHA256, kind: .certificate, depth: .leaf),
            try Self.pin(Self.intermediate.spkiSHA256!, depth: .position(1)),
        ], revoked: [Self.rekeyedLeaf.spkiSHA256!], metadata: .init(format: .pingateV2))
        let policy = PinPolicy()
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.leaf, chain: Self.valid([Self.leaf, Self.intermediate]),
                                list: list, now: Self.now).matchedPin?.position == 0)
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.rekeyedLeaf, chain: Self.valid([Self.rekeyedLeaf, Self.intermediate]),
                                list: list, now: Self.now).reasonToken == "revoked")
    }

    @Test("report-only depth pins: a mismatch passes as a violation that carries every position's hashes")
    func reportOnly() throws {
        let list = Self.list([try Self.pin(Self.intermediate.spkiSHA256!, depth: .position(1), mode: .reportOnly)])
        let verdict = PinPolicy().evaluate(host: "api.example.test", leaf: Self.leaf,
                                           chain: Self.valid([Self.leaf, Self.otherIntermediate, Self.root]), list: list, now: Self.now)
        #expect(verdict.reasonToken == "report-only-violation")
        #expect(verdict.observedChain == [Self.leaf, Self.otherIntermediate, Self.root])
    }

    @Test("domain rules: sslPinningRequired false lets a host through unpinned with a valid chain only; unlisted follow the flag")
    func domainRules() throws {
        let rules = DomainRules(pinningRequiredForUnlisted: true, domains: ["Bypass.Example.test": false, "api.example.test": true])
        let list = Self.list([try Self.pin(Self.leaf.certificateSHA256, kind: .certificate, depth: .leaf)], domainRules: rules)
        let policy = PinPolicy(pinsOnlyHosts: ["bypass.example.test"])
        #expect(policy.isPinned(host: "bypass.example.test", list: list, now: Self.now))
        #expect(policy.evaluate(host: "bypass.example.test", leaf: Self.rekeyedLeaf, chain: Self.valid([Self.rekeyedLeaf]),
                                list: list, now: Self.now) == .unpinnedAllowed(observed: Self.rekeyedLeaf.certificateSHA256))
        // Never without validation, pins-only or not.
        #expect(policy.evaluate(host: "bypass.example.test", leaf: Self.rekeyedLeaf, chain: Self.broken,
                                list: list, now: Self.now).reasonToken == "chain-invalid")
        #expect(!policy.isPinned(host: "unlisted.example.test", list: list, now: Self.now))
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.rekeyedLeaf, chain: Self.valid([Self.rekeyedLeaf]),
                                list: list, now: Self.now).reasonToken == "pin-mismatch")
        let open = Self.list([], domainRules: DomainRules(pinningRequiredForUnlisted: false, domains: [:]))
        #expect(policy.evaluate(host: "unlisted.example.test", leaf: Self.leaf, chain: Self.valid([Self.leaf]),
                                list: open, now: Self.now).reasonToken == "unpinned-allowed")
        #expect(open.withoutDomainRules().domainRules == nil)
        #expect(policy.evaluate(host: "unlisted.example.test", leaf: Self.leaf, chain: Self.valid([Self.leaf]),
                                list: open.withoutDomainRules(), now: Self.now) == .empty)
    }

    @Test("depth text: 0, N and any parse; negative and words do not")
    func depthParsing() {
        #expect(PinEntry.Depth(parsing: "0") == .leaf)
        #expect(PinEntry.Depth(parsing: "2") == .position(2))
        #expect(PinEntry.Depth(parsing: "any") == .any)
        #expect(PinEntry.Depth(parsing: "-1") == nil)
        #expect(PinEntry.Depth(parsing: "root") == nil)
    }
}

/// The v2 `depth` member: leaf pins keep the bytes they always had; depth pins round-trip.
@Suite("Signed list v2: the depth member")
struct SignedListDepthTests {
    static let hash = SHA256Digest.base64(Array("intermediate key".utf8))

    @Test("a leaf pin is encoded without depth (the bytes older lists had); 1 and any round-trip")
    func encoding() throws {
        let key = try PrivateKey.generateP256()
        let pins = [
            PinGateSignedList.Pin(host: "leaf.example.test", sha256: Self.hash, expires: 4_102_444_800),
            PinGateSignedList.Pin(host: "api.example.test", spki: Self.hash, expires: 4_102_444_800, depth: .position(1)),
            PinGateSignedList.Pin(host: "root.example.test", spki: Self.hash, expires: 4_102_444_800, depth: .any),
        ]
        let payload = PinGateSignedList.Payload(sequence: 3, issuedAt: 1_700_000_000, expiresAt: 4_102_444_800, pins: pins)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let leafOnly = String(decoding: try encoder.encode(PinGateSignedList.Payload(
            sequence: 3, issuedAt: 1_700_000_000, expiresAt: 4_102_444_800, pins: [pins[0]])), as: UTF8.self)
        #expect(leafOnly == #"{"expiresAt":4102444800,"issuedAt":1700000000,"pins":[{"expires":4102444800,"host":"leaf.example.test","sha256":"\#(Self.hash)"}],"sequence":3}"#)
        let withDepth = String(decoding: try encoder.encode(payload), as: UTF8.self)
        #expect(withDepth.contains(#""depth":1,"#))
        #expect(withDepth.contains(#""depth":"any","#))
        let list = try PinGateSignedList.verify(try PinGateSignedList.sign(payload, key: key), keys: [try key.publicKey()], source: "t")
        #expect(list.entries.map(\.depth) == [.leaf, .position(1), .any])
    }

    @Test("a list signed before depth existed (fixed bytes, signed by openssl) still verifies, as leaf pins")
    func olderListVerifies() throws {
        // Made with the openssl-only recipe of docs/signed-list-v2.md before this change.
        let key = try PrivateKey.generateP256()
        let bytes = Array(#"{"sequence":1,"issuedAt":1763790000,"expiresAt":4102444800,"pins":[{"host":"api.example.com","sha256":"NqWBi99vB1leaGi8Jr5RixqVZ+O/SlPckBhva3bVV7c=","expires":4102444800}]}"#.utf8)
        let envelope = PinGateSignedList.Envelope(format: PinGateSignedList.formatName, keyId: try key.publicKey().keyID,
                                                  payload: Data(bytes).base64EncodedString(),
                                                  signature: Data(try key.signSHA256(bytes)).base64EncodedString())
        let list = try PinGateSignedList.verify(try JSONEncoder().encode(envelope), keys: [try key.publicKey()], source: "t")
        #expect(list.entries.count == 1)
        #expect(list.entries[0].depth == .leaf)
    }

    @Test("a negative or unknown depth rejects the list")
    func badDepth() throws {
        let key = try PrivateKey.generateP256()
        for depth in ["-1", "\"root\"", "1.5"] {
            let bytes = Array(#"{"sequence":1,"issuedAt":1763790000,"expiresAt":4102444800,"pins":[{"host":"a.test","spki":"\#(Self.hash)","expires":4102444800,"depth":\#(depth)}]}"#.utf8)
            let envelope = PinGateSignedList.Envelope(format: PinGateSignedList.formatName, keyId: try key.publicKey().keyID,
                                                      payload: Data(bytes).base64EncodedString(),
                                                      signature: Data(try key.signSHA256(bytes)).base64EncodedString())
            #expect(throws: PinListError.self, "depth \(depth)") {
                try PinGateSignedList.verify(try JSONEncoder().encode(envelope), keys: [try key.publicKey()], source: "t")
            }
        }
    }
}

extension DepthPinPolicyTests {
    @Test("report-only leaf pins on a pins-only host still pass a mismatch on a failed chain (as before depth pins); with a depth pin they cannot")
    func reportOnlyPinsOnly() throws {
        let leafOnly = Self.list([try Self.pin(Self.leaf.certificateSHA256, kind: .certificate, depth: .leaf, mode: .reportOnly)])
        let policy = PinPolicy(pinsOnlyHosts: ["api.example.test"])
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.rekeyedLeaf, chain: Self.broken, list: leafOnly, now: Self.now)
                .reasonToken == "report-only-violation")
        let withDepth = Self.list([try Self.pin(Self.intermediate.spkiSHA256!, depth: .position(1), mode: .reportOnly)])
        #expect(policy.evaluate(host: "api.example.test", leaf: Self.rekeyedLeaf, chain: Self.broken, list: withDepth, now: Self.now)
                .reasonToken == "chain-invalid")
    }
}
