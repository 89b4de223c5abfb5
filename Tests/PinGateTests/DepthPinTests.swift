import Foundation
import PinGateTestSupport
import Testing
import PinGateTLS
import PinList
import PinListService
@testable import PinGate
@testable import PinGateAdmin
import PinGateHarness

/// Depth pins end to end: chains root → intermediate → leaf made with the openssl CLI,
/// origins presenting them on loopback, curl through the gate.
@Suite("Depth pins end to end")
struct DepthPinTests {
    static let host = "api.depth.test"

    /// The admin endpoint's JSON answer for `path` from `snapshot`, parsed.
    static func adminJSON(_ path: String, _ snapshot: AdminSnapshot) throws -> Any {
        guard case .respond(let response) = AdminRoute.route(method: "GET", path: path, authorization: nil, token: nil,
                                                             snapshot: { snapshot }, metrics: { "" }) else {
            throw TestFailure("\(path) did not answer at once")
        }
        return try JSONSerialization.jsonObject(with: response.body)
    }

    /// The PKIs of one test: the gate's usual one (signer, attacker CA) and a real chain.
    struct Chains {
        let pki: TestPKI
        let chain: TestChainPKI
        let intermediate: TestPKI.Identity
        let leaf: TestPKI.Identity
        /// Where the gate finds its upstream roots: the chain's root and the attacker CA.
        let trustPath: String

        static func make(_ directory: TemporaryDirectory) async throws -> Chains {
            let pki = try TestPKI(directory: directory)
            let chain = try await TestChainPKI.make(in: directory)
            let intermediate = try await chain.intermediate("intermediate-a")
            let leaf = try await chain.leaf("leaf-a1", host: DepthPinTests.host, issuer: intermediate)
            let trustPath = try directory.write("depth-trust.pem", try chain.root.certificate.pemString() + pki.attackerCA.certificate.pemString())
            return Chains(pki: pki, chain: chain, intermediate: intermediate, leaf: leaf, trustPath: trustPath)
        }

        /// A v2 list file with one pin on `identity` for the host at `depth`.
        func list(spkiOf identity: TestPKI.Identity, depth: PinEntry.Depth, file: String) throws -> String {
            let pin = PinGateSignedList.Pin(host: DepthPinTests.host, spki: identity.certificate.spkiSHA256,
                                            expires: Int64(Date().timeIntervalSince1970) + 86_400, depth: depth)
            return try pki.directory.write(file, String(decoding: try pki.signedV2(sequence: 1, pins: [pin]), as: UTF8.self))
        }
    }

    @Test("depth-1 SPKI pin: the leaf and a re-keyed leaf pass (no list change); a leaf under another intermediate is pin-mismatch with every position reported")
    func rotationUnderPinnedIntermediate() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let chains = try await Chains.make(directory)
        let rekeyed = try await chains.chain.leaf("leaf-a2", host: Self.host, issuer: chains.intermediate)
        let otherIntermediate = try await chains.chain.intermediate("intermediate-b")
        let underOther = try await chains.chain.leaf("leaf-b1", host: Self.host, issuer: otherIntermediate)
        #expect(rekeyed.certificate.spkiSHA256 != chains.leaf.certificate.spkiSHA256)
        let list = try chains.list(spkiOf: chains.intermediate, depth: .position(1), file: "depth1.json")
        let url = "https://\(Self.host):%d/"

        try await LoopbackOrigin.with(identity: chains.leaf, chain: [chains.intermediate], behaviour: .http(body: "depth ok")) { origin in
            try await GateFixture.with(pki: chains.pki, listPath: list, resolve: ["\(Self.host):\(origin.port)"],
                                       configure: { $0.upstreamTrust = .pemFiles([chains.trustPath]) }) { gate in
                let target = String(format: url, origin.port)
                let first = try await curlThroughGate(gate, target)
                #expect(first.httpCode == "200", "\(first.stderr)")
                #expect(String(decoding: first.body, as: UTF8.self).contains("depth ok"))

                try origin.present(rekeyed, chain: [chains.intermediate])
                let second = try await curlThroughGate(gate, target)
                #expect(second.httpCode == "200", "\(second.stderr)")

                try origin.present(underOther, chain: [otherIntermediate])
                let refused = try await curlThroughGate(gate, target)
                #expect(refused.exitStatus != 0)
                #expect(refused.proxyHeaders["pingate-refusal"] == "pin-mismatch")
                #expect(refused.proxyHeaders["pingate-observed-fingerprint"] == underOther.fingerprint)

                let stats = gate.statistics
                #expect(stats.count(.trusted) == 2)
                #expect(stats.count(.pinMismatch) == 1)
                let pinKey = "\(Self.host) depth-1 spki \(chains.intermediate.certificate.spkiSHA256)"
                #expect(stats.trustedByPin[pinKey] == 2)
                #expect(stats.lastMatchByPin[pinKey]?.description == "depth-1 spki \(chains.intermediate.certificate.spkiSHA256)")
                let refusal = try #require(gate.server.refusals.entries.last)
                #expect(refusal.reason == .pinMismatch)
                #expect(refusal.observedChain.map(\.depth) == [0, 1, 2])
                #expect(refusal.observedChain.map(\.spki) == [underOther, otherIntermediate, chains.chain.root].map { $0.certificate.spkiSHA256 })

                // What an operator reads: /pins names the pin doing the work, /refusals every position.
                let snapshot = AdminSnapshot.gather(gate: gate.server, adminAddress: "127.0.0.1:0", nextUpdate: nil, now: Date())
                let pins = try #require(try Self.adminJSON("/pins", snapshot) as? [[String: Any]])
                #expect(pins.count == 1)
                #expect(pins.first?["depth"] as? String == "1")
                #expect(pins.first?["trusted_verdicts"] as? Int == 2)
                #expect(pins.first?["last_match"] as? String == "trusted by depth-1 spki \(chains.intermediate.certificate.spkiSHA256)")
                let refusals = try #require(try Self.adminJSON("/refusals", snapshot) as? [[String: Any]])
                let observed = try #require(refusals.first?["observed_chain"] as? [[String: Any]])
                #expect(observed.map { $0["depth"] as? Int } == [0, 1, 2])
                #expect(observed[1]["spki"] as? String == otherIntermediate.certificate.spkiSHA256)
            }
        }
    }

    @Test("the rotation drill (issue 34): a host pinned by its leaf key with its issuer as the depth-1 backup re-keys its leaf under the same issuer; traffic still passes, on the backup, and /status and /metrics say backup-only after one request; the observations say which pin carried each leaf; the next list proposed from them, signed and put in force, makes the host ok again; no request is refused")
    func rotationShowsBackupOnly() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let chains = try await Chains.make(directory)
        let rekeyed = try await chains.chain.leaf("leaf-a2", host: Self.host, issuer: chains.intermediate)
        let expires = Int64(Date().timeIntervalSince1970) + 200 * 86_400
        let list = try chains.pki.directory.write("rotation.json", String(decoding: try chains.pki.signedV2(sequence: 1, pins: [
            .init(host: Self.host, spki: chains.leaf.certificate.spkiSHA256, expires: expires),
            .init(host: Self.host, spki: chains.intermediate.certificate.spkiSHA256, expires: expires, depth: .position(1)),
        ], expiresAt: Date().addingTimeInterval(200 * 86_400)), as: UTF8.self))
        try await LoopbackOrigin.with(identity: chains.leaf, chain: [chains.intermediate], behaviour: .http(body: "rotation")) { origin in
            try await GateFixture.with(pki: chains.pki, listPath: list, resolve: ["\(Self.host):\(origin.port)"],
                                       configure: {
                                           $0.upstreamTrust = .pemFiles([chains.trustPath])
                                           // Each CONNECT dials: a pooled connection would carry the old leaf's chain.
                                           $0.upstreamPoolEnabled = false
                                       }) { gate in
                func health() throws -> [String: Any] {
                    let snapshot = AdminSnapshot.gather(gate: gate.server, adminAddress: "127.0.0.1:0", nextUpdate: nil, now: Date())
                    let status = try #require(try Self.adminJSON("/status", snapshot) as? [String: Any])
                    let hosts = try #require(status["pin_health"] as? [[String: Any]])
                    return try #require(hosts.first { $0["host"] as? String == Self.host })
                }
                #expect(try health()["state"] as? String == "unseen")
                let target = "https://\(Self.host):\(origin.port)/"
                let first = try await curlThroughGate(gate, target)
                #expect(first.httpCode == "200", "\(first.stderr)")
                let afterFirst = try health()
                #expect(afterFirst["state"] as? String == "ok", "\(afterFirst)")

                try origin.present(rekeyed, chain: [chains.intermediate])
                let second = try await curlThroughGate(gate, target)
                #expect(second.httpCode == "200", "\(second.stderr)")
                let rotated = try health()
                #expect(rotated["state"] as? String == "backup-only", "\(rotated)")
                #expect((rotated["why"] as? String)?.contains("depth-1") == true, "\(rotated)")
                #expect(gate.statistics.count(.pinMismatch) == 0)

                let now = Date()
                let book = gate.server.statistics.pinHealth.health(list: gate.server.store.list, generation: gate.server.store.generation, now: now)
                let metrics = PinHealthMetrics.text(health: book, list: gate.server.store.list)
                #expect(metrics.contains("pingate_pin_health{host=\"\(Self.host)\",state=\"backup-only\"} 1"), "\(metrics)")
                #expect(metrics.contains("pingate_pin_health{host=\"\(Self.host)\",state=\"ok\"} 0"), "\(metrics)")
                #expect(metrics.contains("pingate_pin_expiry_timestamp_seconds{host=\"\(Self.host)\",pin=\"depth-1 spki \(chains.intermediate.certificate.spkiSHA256)\"} \(expires)"),
                        "\(metrics)")
                // The packaged alerting rules ask for these very series (promtool tests the
                // rules themselves on synthetic ones, in scripts/check-package): every metric
                // they name is exported, every state they name is one, and the backup-only
                // alert's selector matches this host's series at 1.
                let rules = try String(contentsOf: TestProcess.repositoryRoot.appendingPathComponent("packaging/pingate-rules.yml"), encoding: .utf8)
                let metricNames = Set(rules.matches(of: /pingate_[a-z_]+/).map { String($0.output) })
                #expect(metricNames == ["pingate_pin_health", "pingate_pin_expiry_timestamp_seconds"], "\(metricNames)")
                for name in metricNames { #expect(metrics.contains("\n\(name){"), "\(name) is not exported") }
                let states = rules.matches(of: /state="([^"]+)"/).map { String($0.output.1) }
                #expect(Set(states) == ["backup-only", "expiring", "refusing"], "\(states)")
                for state in states { #expect(PinHealthBook.State(rawValue: state) != nil, "\(state)") }
                #expect(rules.contains("expr: pingate_pin_health{state=\"backup-only\"} == 1"))

                // What the enforcing gate observed: each leaf, and the pin that carried it.
                let observed = try #require(gate.server.observations?.book)
                let chainsSeen = try #require(observed.hosts.first { $0.host == Self.host }?.chains)
                #expect(chainsSeen.count == 2)
                let latest = try #require(chainsSeen.first { $0.chain.first?.sha256 == rekeyed.certificate.sha256Fingerprint })
                #expect(latest.matched?.position == 1 && latest.matched?.backup == true, "\(String(describing: latest.matched))")
                #expect(chainsSeen.first { $0 != latest }?.matched?.position == 0)

                // The next list, from the list in force and those observations: the new leaf's
                // key added, signed with the sequence the draft carries, put in force as a
                // reload would; the host is ok again on its next request, and nothing was refused.
                let (draft, _) = NextListProposal.propose(list: try #require(gate.server.store.list), book: observed,
                                                          options: NextListProposal.Options(), source: "observations.json")
                #expect(draft.pins.contains { $0.spki == rekeyed.certificate.spkiSHA256 && $0.depth == nil }, "\(draft)")
                #expect(draft.sequence == 2)
                let issued = Int64(Date().timeIntervalSince1970)
                let next = try chains.pki.directory.write("next.json", String(decoding: try PinGateSignedList.sign(.init(
                    sequence: try #require(draft.sequence), issuedAt: issued - 60, expiresAt: issued + 200 * 86_400,
                    pins: draft.pins.map { PinGateSignedList.Pin(host: $0.host, spki: $0.spki, expires: $0.expires, depth: $0.depth) }),
                    key: chains.pki.signer), as: UTF8.self))
                let installed = gate.server.store.install(try SignedListDocument.read(file: next), keys: [try chains.pki.signer.publicKey()],
                                                          persistence: nil, now: Date(), provenance: .init(.pinsFile, "the next list (test)"))
                #expect((try? installed.get()) != nil, "\(installed)")
                let third = try await curlThroughGate(gate, target)
                #expect(third.httpCode == "200", "\(third.stderr)")
                let healed = try health()
                #expect(healed["state"] as? String == "ok", "\(healed)")
                #expect(gate.statistics.count(.pinMismatch) == 0 && gate.statistics.count(.empty) == 0)
            }
        }
    }

    @Test("an attacker whose own CA the gate trusts, sending the pinned intermediate as an extra chain certificate, is refused")
    func appendedIntermediateDoesNotCount() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let chains = try await Chains.make(directory)
        let forged = try chains.pki.leaf([.dns(Self.host)], issuer: chains.pki.attackerCA, file: "forged")
        let list = try chains.list(spkiOf: chains.intermediate, depth: .position(1), file: "depth1.json")
        let anyList = try chains.list(spkiOf: chains.intermediate, depth: .any, file: "any.json")
        // The attacker's leaf first, then the stolen (public) intermediate: what OpenSSL
        // verifies is forged → attacker CA, which does not contain it.
        try await LoopbackOrigin.with(identity: forged, chain: [chains.intermediate], behaviour: .http(body: "intercepted")) { attacker in
            for path in [list, anyList] {
                try await GateFixture.with(pki: chains.pki, listPath: path, resolve: ["\(Self.host):\(attacker.port)"],
                                           configure: { $0.upstreamTrust = .pemFiles([chains.trustPath]) }) { gate in
                    let result = try await curlThroughGate(gate, "https://\(Self.host):\(attacker.port)/")
                    #expect(result.proxyHeaders["pingate-refusal"] == "pin-mismatch", "\(path): \(result.stderr)")
                    let refusal = try #require(gate.server.refusals.entries.last)
                    // The verified chain the refusal reports is the attacker's own.
                    #expect(refusal.observedChain.map(\.sha256) == [forged, chains.pki.attackerCA].map(\.fingerprint))
                }
            }
            #expect(attacker.observed.applicationBytes == 0)
        }
    }

    @Test("depth any matches the trust anchor; a root the gate does not trust never counts, pins-only or not")
    func anyMatchesTrustedRootOnly() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let chains = try await Chains.make(directory)
        let rootList = try chains.list(spkiOf: chains.chain.root, depth: .any, file: "root-any.json")
        try await LoopbackOrigin.with(identity: chains.leaf, chain: [chains.intermediate], behaviour: .http(body: "root ok")) { origin in
            try await GateFixture.with(pki: chains.pki, listPath: rootList, resolve: ["\(Self.host):\(origin.port)"],
                                       configure: { $0.upstreamTrust = .pemFiles([chains.trustPath]) }) { gate in
                let result = try await curlThroughGate(gate, "https://\(Self.host):\(origin.port)/")
                #expect(result.httpCode == "200", "\(result.stderr)")
                #expect(gate.statistics.lastMatchByPin.values.first?.description == "depth-2 spki \(chains.chain.root.certificate.spkiSHA256) (pin depth any)")
            }
        }

        // Another root, not configured as a trust anchor, sent by the server itself.
        let untrusted = try await TestChainPKI.make(in: directory, rootName: "untrusted-root")
        let untrustedIntermediate = try await untrusted.intermediate("untrusted-intermediate")
        let untrustedLeaf = try await untrusted.leaf("untrusted-leaf", host: Self.host, issuer: untrustedIntermediate)
        let untrustedRootList = try chains.list(spkiOf: untrusted.root, depth: .any, file: "untrusted-any.json")
        try await LoopbackOrigin.with(identity: untrustedLeaf, chain: [untrustedIntermediate, untrusted.root],
                                      behaviour: .http(body: "must not pass")) { origin in
            for pinsOnly in [false, true] {
                try await GateFixture.with(pki: chains.pki, listPath: untrustedRootList, resolve: ["\(Self.host):\(origin.port)"],
                                           configure: {
                                               $0.upstreamTrust = .pemFiles([chains.trustPath])
                                               if pinsOnly { $0.pinsOnlyHosts = [Self.host] }
                                           }) { gate in
                    let result = try await curlThroughGate(gate, "https://\(Self.host):\(origin.port)/")
                    #expect(result.proxyHeaders["pingate-refusal"] == "chain-invalid", "pins-only \(pinsOnly): \(result.stderr)")
                    #expect(gate.statistics.count(.trusted) == 0)
                }
            }
            #expect(origin.observed.applicationBytes == 0)
        }
    }
}
