import Foundation
import PinGate
import PinGateNIO
import PinGateTLS
import PinList
import Testing

/// The learn-mode decision policy on its own: verdicts from hashes and chain checks.
@Suite("Learning decision policy")
struct LearningPolicyTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static func hashes(_ name: String) -> CertificateHashes {
        CertificateHashes(certificateSHA256: SHA256Digest.base64(Array("cert \(name)".utf8)), spkiSHA256: SHA256Digest.base64(Array("key \(name)".utf8)))
    }
    static let pinnedLeaf = hashes("pinned")
    static let otherLeaf = hashes("other")
    static let list = PinList(source: "test", entries: [
        PinEntry(host: .exact("pinned.example"), fingerprint: pinnedLeaf.certificateSHA256, kind: .certificate,
                 expires: now.addingTimeInterval(86400), mode: .enforce, depth: .leaf),
    ], metadata: .init(format: .pingateV2))
    static let valid = PinPolicy.ChainCheck(valid: true, reason: "ok", verifiedChain: [otherLeaf])
    static let broken = PinPolicy.ChainCheck(valid: false, reason: "unable to get local issuer certificate")

    @Test("an unpinned host passes as learned only on a valid chain, with or without a list; a pinned host is enforced as ever; nothing is refused before connecting")
    func verdicts() {
        let policy = LearningDecisionPolicy(pinsOnlyHosts: [])
        #expect(policy.learns)
        #expect(!PinningDecisionPolicy(pinsOnlyHosts: []).learns)
        for list in [Self.list, nil] as [PinList?] {
            #expect(policy.refusalBeforeConnecting(host: "new.example", port: 443, list: list, now: Self.now) == nil)
            #expect(policy.verdict(host: "new.example", leaf: Self.otherLeaf, chain: Self.valid, list: list, now: Self.now)
                == .learned(observed: Self.otherLeaf.certificateSHA256))
            #expect(policy.verdict(host: "new.example", leaf: Self.otherLeaf, chain: Self.broken, list: list, now: Self.now)
                == .chainInvalid(reason: Self.broken.reason, observed: Self.otherLeaf.certificateSHA256))
            #expect(policy.verdict(host: "new.example", leaf: nil, chain: Self.broken, list: list, now: Self.now).reasonToken == "chain-invalid")
        }
        let trusted = policy.verdict(host: "pinned.example", leaf: Self.pinnedLeaf, chain: .init(valid: true, reason: "ok", verifiedChain: [Self.pinnedLeaf]),
                                     list: Self.list, now: Self.now)
        #expect(trusted.reasonToken == "trusted")
        let mismatch = policy.verdict(host: "pinned.example", leaf: Self.otherLeaf, chain: Self.valid, list: Self.list, now: Self.now)
        #expect(mismatch.reasonToken == "pin-mismatch", "learn mode never softens a pin")
        #expect(Verdict.learned(observed: "x").isTrusted)
        #expect(DecisionReason(Verdict.learned(observed: "x")) == .learned && DecisionReason.learned.isAllowed)
    }

    @Test("a host the list names is never learned around: expired pins, a stale list, or a revoked leaf are refused as when enforcing, before or after connecting")
    func namedHostsStayEnforced() throws {
        let policy = LearningDecisionPolicy(pinsOnlyHosts: [])
        let expiredPins = PinList(source: "test", entries: [
            PinEntry(host: .exact("pinned.example"), fingerprint: Self.pinnedLeaf.certificateSHA256, kind: .certificate,
                     expires: Self.now.addingTimeInterval(-60), mode: .enforce, depth: .leaf),
        ], metadata: .init(format: .pingateV2))
        let stale = PinList(source: "test", entries: Self.list.entries,
                            metadata: .init(format: .pingateV2, sequence: 1, expiresAt: Self.now.addingTimeInterval(-60)))
        for list in [expiredPins, stale] {
            #expect(policy.refusalBeforeConnecting(host: "PINNED.example.", port: 443, list: list, now: Self.now) == .empty)
            #expect(policy.verdict(host: "pinned.example", leaf: Self.otherLeaf, chain: Self.valid, list: list, now: Self.now) == .empty)
            // Hosts it never names are still learned.
            #expect(policy.verdict(host: "new.example", leaf: Self.otherLeaf, chain: Self.valid, list: list, now: Self.now).reasonToken == "learned")
        }
        // A Wultra domain rule that requires a pin names the host too, fingerprints or not.
        let rules = PinList(source: "test", entries: [], metadata: .init(format: .wultraDynamic),
                            domainRules: DomainRules(pinningRequiredForUnlisted: false, domains: ["Required.example": true]))
        #expect(policy.refusalBeforeConnecting(host: "required.example", port: 443, list: rules, now: Self.now) == .empty)
        #expect(policy.verdict(host: "required.example", leaf: Self.otherLeaf, chain: Self.valid, list: rules, now: Self.now) == .empty)
        let revoking = PinList(source: "test", entries: Self.list.entries, revoked: [Self.otherLeaf.spkiSHA256 ?? ""],
                               metadata: .init(format: .pingateV2, sequence: 1, expiresAt: Self.now.addingTimeInterval(-60)))
        #expect(policy.verdict(host: "new.example", leaf: Self.otherLeaf, chain: Self.valid, list: revoking, now: Self.now)
            == .revoked(observed: Self.otherLeaf.certificateSHA256), "revoked, even by a stale list, even for a host it does not pin")
    }

    @Test("loopback listen hosts for learn mode and the admin endpoint: addresses in 127/8 and ::1, and localhost; never a name that only starts with 127.")
    func loopbackListenHosts() {
        for host in ["127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.1", "localhost"] {
            #expect(DestinationAddress.isLoopbackListenHost(host), "\(host)")
        }
        for host in ["127.example.com", "0.0.0.0", "::", "10.0.0.1", "example.com", ""] {
            #expect(!DestinationAddress.isLoopbackListenHost(host), "\(host)")
        }
    }
}
