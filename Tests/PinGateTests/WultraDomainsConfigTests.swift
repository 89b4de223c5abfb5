import Foundation
import PinGateTestSupport
import PinGateTLS
import PinList
import PinListService
import Testing
@testable import PinGate
import PinGateHarness
@testable import PinListService

/// Wultra Mobile Utility Server 2.x answers (`/app/init`) from a real HTTPS list server on
/// loopback: `fingerprints[].depth` and `domainsConfig`, honoured only from an answer
/// signed over the challenge the gate just sent.
@Suite("Wultra MUS 2.x: depth and domainsConfig")
struct WultraDomainsConfigTests {
    static let bypassHost = "bypass.pingate.test"
    static let unlistedHost = "unlisted.pingate.test"

    /// A MUS 2.x body: host A pinned by the certificate hash of its issuing CA at depth 1,
    /// and `domainsConfig` as given (nil: none).
    static func body(_ setup: ListLifecycleTests.Setup, domainsConfig: String?) -> Data {
        let fingerprint = #"{"name":"\#(ListLifecycleTests.Setup.hostA)","fingerprint":"\#(setup.pki.originCA.fingerprint)","expires":4102444800,"depth":1}"#
        let config = domainsConfig.map { #","domainsConfig":\#($0)"# } ?? ""
        return Data(#"{"timestamp":1763790000,"fingerprints":[\#(fingerprint)]\#(config)}"#.utf8)
    }

    @Test("depth honoured; sslPinningRequired false lets a domain through unpinned (chain still validated); unsigned or wrongly signed answers leave the config in force; an answer without domainsConfig removes it")
    func domainsConfigLifecycle() async throws {
        try await ListLifecycleTests.Setup.with(initialPins: { _, _, _ in Data() }) { setup in
            let bypassLeaf = try setup.pki.leaf([.dns(Self.bypassHost), .dns(Self.unlistedHost)], issuer: setup.pki.originCA, file: "bypass")
            let rogueLeaf = try setup.pki.leaf([.dns(Self.bypassHost)], issuer: setup.pki.rogueCA, file: "bypass-rogue")
            let withBypass = Self.body(setup, domainsConfig: #"{"sslPinningRequiredForUnlisted":true,"domains":[{"name":"\#(Self.bypassHost)","sslPinningRequired":false},{"name":"\#(ListLifecycleTests.Setup.hostA)","sslPinningRequired":true}]}"#)
            let openUnlisted = Self.body(setup, domainsConfig: #"{"sslPinningRequiredForUnlisted":false,"domains":[]}"#)
            setup.listServer.set(.dynamic(withBypass, key: setup.pki.signer))

            try await LoopbackOrigin.with(identity: bypassLeaf, behaviour: .http(body: "unpinned")) { bypass in
                let resolve = setup.resolve + ["\(Self.bypassHost):\(bypass.port)", "\(Self.unlistedHost):\(bypass.port)"]
                try await GateFixture.with(pki: setup.pki, listPath: nil, resolve: resolve,
                                           listSource: setup.source(format: .wultraDynamic, path: "/service")) { gate in
                    let updater = try #require(gate.server.updater)
                    let urlA = "https://\(ListLifecycleTests.Setup.hostA):\(setup.originA.port)/"
                    let urlBypass = "https://\(Self.bypassHost):\(bypass.port)/"
                    let urlUnlisted = "https://\(Self.unlistedHost):\(bypass.port)/"

                    // depth 1: A's leaf is not pinned, its issuer is.
                    let pinned = try await curlThroughGate(gate, urlA)
                    #expect(String(decoding: pinned.body, as: UTF8.self) == "A", "\(pinned.stderr)")
                    #expect(gate.statistics.lastMatchByPin.values.map(\.description).contains("depth-1 sha256 \(setup.pki.originCA.fingerprint)"))

                    let unpinned = try await curlThroughGate(gate, urlBypass)
                    #expect(unpinned.httpCode == "200", "\(unpinned.stderr)")
                    #expect(String(decoding: unpinned.body, as: UTF8.self) == "unpinned")
                    #expect(gate.statistics.count(.unpinnedAllowed) == 1)
                    #expect(try await curlThroughGate(gate, urlUnlisted).proxyHeaders["pingate-refusal"] == "empty")

                    // Unpinned never means unvalidated.
                    try bypass.present(rogueLeaf)
                    #expect(try await curlThroughGate(gate, urlBypass).proxyHeaders["pingate-refusal"] == "chain-invalid")
                    try bypass.present(bypassLeaf)

                    // An answer opening every unlisted domain, but not signed over the
                    // challenge by the configured key: refused, and the rules in force stay.
                    for key in [try PrivateKey.generateP256(), nil] {
                        setup.listServer.set(.dynamic(openUnlisted, key: key))
                        guard case .rejected(let rejection) = try await updater.updateNow().get() else {
                            Issue.record("a badly signed domainsConfig was accepted")
                            return
                        }
                        #expect(rejection.token == "invalid-signature")
                        #expect(try await curlThroughGate(gate, urlUnlisted).proxyHeaders["pingate-refusal"] == "empty")
                        #expect(try await curlThroughGate(gate, urlBypass).httpCode == "200")
                    }

                    // Signed properly, it applies.
                    setup.listServer.set(.dynamic(openUnlisted, key: setup.pki.signer))
                    #expect(try await updater.updateNow().get() == .installed(sequence: nil))
                    #expect(try await curlThroughGate(gate, urlUnlisted).httpCode == "200")

                    // A newer answer without domainsConfig clears it: nothing unpinned passes.
                    setup.listServer.set(.dynamic(Self.body(setup, domainsConfig: nil), key: setup.pki.signer))
                    #expect(try await updater.updateNow().get() == .installed(sequence: nil))
                    #expect(gate.server.store.list?.domainRules == nil)
                    #expect(try await curlThroughGate(gate, urlBypass).proxyHeaders["pingate-refusal"] == "empty")
                    #expect(try await curlThroughGate(gate, urlUnlisted).proxyHeaders["pingate-refusal"] == "empty")
                    #expect(String(decoding: try await curlThroughGate(gate, urlA).body, as: UTF8.self) == "A")
                    #expect(gate.statistics.count(.unpinnedAllowed) == 4)
                }
            }
        }
    }

    @Test("domain rules come only from a fresh challenge: a persisted answer, a file and a fallback never carry them; the first fresh answer with the same body restores them")
    func onlyFromFreshChallenge() throws {
        let key = try PrivateKey.generateP256()
        let body = Data(#"{"fingerprints":[],"domainsConfig":{"sslPinningRequiredForUnlisted":false}}"#.utf8)
        let challenge = WultraDynamicList.makeChallenge()
        let document = SignedListDocument(format: .wultraDynamic, source: "https://lists.test/app/init", body: body, challenge: challenge,
                                          signature: try WultraDynamicList.sign(body: body, challenge: challenge, key: key))
        let now = Date()
        // What a restart does with the persisted answer.
        let store = PinListStore(nil)
        guard case .success(let persisted) = store.install(document, keys: [try key.publicKey()], persistence: nil, now: now,
                                                           provenance: ListProvenance(.persisted, "test")) else {
            Issue.record("the persisted answer did not verify")
            return
        }
        #expect(persisted.domainRules == nil)
        #expect(!store.isUsable(at: now))
        // The same bytes answering a fresh challenge: not "unchanged", the rules apply.
        guard case .success(let fresh) = store.install(document, keys: [try key.publicKey()], persistence: nil, now: now,
                                                       provenance: ListProvenance(.fetched, "test"), answersFreshChallenge: true) else {
            Issue.record("the fresh answer did not verify")
            return
        }
        #expect(fresh.domainRules == DomainRules(pinningRequiredForUnlisted: false, domains: [:]))
        #expect(store.isUsable(at: now))
        #expect(store.status.lastResult == "ok")
        // A file or fallback in the dynamic format has no challenge at all: it does not verify.
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = try directory.write("fallback.json", String(decoding: body, as: UTF8.self))
        #expect(throws: PinListError.self) {
            try SignedListDocument.read(file: path, format: .wultraDynamic).verify(keys: [try key.publicKey()])
        }
        // And a v2 or static list has no domainsConfig member to honour.
        #expect(try SignedListDocument.read(file: path).verify(keys: [try key.publicKey()]).domainRules == nil)
    }
}
