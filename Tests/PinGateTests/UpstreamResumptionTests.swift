import Foundation
import PinGateTestSupport
import Testing
import PinGateTLS
import PinList
import PinListService
@testable import PinGate

/// Upstream TLS session resumption, bound to the verdict (issue 10). nginx answers
/// `/reused` with its `$ssl_session_reused` ("r" resumed, "." full handshake), so each
/// assertion reads what the origin itself saw, beside the gate's own counter.
@Suite("Upstream TLS session resumption")
struct UpstreamResumptionTests {
    static let hostA = "a.resume.test"
    static let hostB = "b.resume.test"
    static let reusedLocation = #"location = /reused { default_type text/plain; return 200 "$ssl_session_reused\n"; }"#

    /// An nginx origin whose one certificate names both hosts, and a gate whose v2 list
    /// (sequence 1) pins it for both and resolves both to nginx.
    static func withTwoNamedOrigin(
        isolation: isolated (any Actor)? = #isolation,
        _ body: (GateFixture, NginxOrigin, TestPKI, TestPKI.Identity) async throws -> Void
    ) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(hostA), .dns(hostB)], issuer: pki.originCA, file: "origin")
        let list = try directory.write("pins.json", String(decoding: try pki.signedV2(
            sequence: 1, pins: [TestPKI.pin(hostA, leaf), TestPKI.pin(hostB, leaf)]), as: UTF8.self))
        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: [:], http2: false,
                                   serverDirectives: reusedLocation) { nginx in
            // Without the pool: each tunnel then opens its own connection, which is what
            // resumption is for (pooled tunnels make no handshake at all).
            try await GateFixture.with(pki: pki, listPath: list,
                                       resolve: ["\(hostA):\(nginx.port)", "\(hostB):\(nginx.port)"],
                                       configure: { $0.upstreamPoolEnabled = false }) { gate in
                try await body(gate, nginx, pki, leaf)
            }
        }
    }

    /// What nginx saw for one fresh tunnel to `host`: "r" resumed, "." full.
    static func originSaw(_ gate: GateFixture, _ host: String, _ nginx: NginxOrigin) async throws -> String {
        let result = try await curlThroughGate(gate, "https://\(host):\(nginx.port)/reused")
        #expect(result.exitStatus == 0, "\(result.stderr)")
        #expect(result.httpCode == "200")
        return String(decoding: result.body, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Expects nginx to have seen `expected` for one fresh tunnel to `host`.
    static func expectOrigin(_ gate: GateFixture, _ host: String, _ nginx: NginxOrigin, saw expected: String,
                             sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let saw = try await originSaw(gate, host, nginx)
        #expect(saw == expected, sourceLocation: sourceLocation)
    }

    /// Installs a v2 list in the running gate, as an update would.
    static func install(_ envelope: Data, in gate: GateFixture, pki: TestPKI) throws {
        let document = SignedListDocument(format: .pingateV2, source: "test", body: envelope)
        _ = try gate.server.store.install(document, keys: [pki.signer.publicKey()], persistence: nil, now: Date(),
                                          provenance: ListProvenance(.fetched, "test")).get()
    }

    @Test("a second tunnel resumes its upstream session; a session made for one name is never offered for another name at the same address")
    func resumesPerName() async throws {
        try await Self.withTwoNamedOrigin { gate, nginx, _, _ in
            try await Self.expectOrigin(gate, Self.hostA, nginx, saw: ".")
            try await Self.expectOrigin(gate, Self.hostA, nginx, saw: "r")
            #expect(gate.statistics.upstreamSessionsResumed == 1)
            // Same address, same port, same certificate, and both names pinned to it:
            // still a full handshake, because a.'s session is a.'s alone.
            try await Self.expectOrigin(gate, Self.hostB, nginx, saw: ".")
            #expect(gate.statistics.upstreamSessionsResumed == 1)
            try await Self.expectOrigin(gate, Self.hostB, nginx, saw: "r")
            try await Self.expectOrigin(gate, Self.hostA, nginx, saw: "r")
            let stats = gate.statistics
            #expect(stats.upstreamSessionsResumed == 3)
            #expect(stats.count(.trusted) == 5)
            #expect(stats.upstreamConnections == 5)
        }
    }

    @Test("a pin revoked between two tunnels: the second is refused after a full handshake, never resumed; a new list that still trusts starts over with a full handshake")
    func revocationEndsResumption() async throws {
        try await Self.withTwoNamedOrigin { gate, nginx, pki, leaf in
            try await Self.expectOrigin(gate, Self.hostA, nginx, saw: ".")
            try await Self.expectOrigin(gate, Self.hostA, nginx, saw: "r")
            #expect(gate.statistics.upstreamSessionsResumed == 1)

            // A newer list that still pins both names: every kept session goes.
            try Self.install(try pki.signedV2(sequence: 2, pins: [TestPKI.pin(Self.hostA, leaf), TestPKI.pin(Self.hostB, leaf)]),
                             in: gate, pki: pki)
            try await Self.expectOrigin(gate, Self.hostA, nginx, saw: ".")
            try await Self.expectOrigin(gate, Self.hostA, nginx, saw: "r")
            #expect(gate.statistics.upstreamSessionsResumed == 2)

            // Now the leaf is revoked: the next tunnel is refused, and it was decided on a
            // full handshake (the kept session went with the old list).
            try Self.install(try pki.signedV2(sequence: 3, pins: [TestPKI.pin(Self.hostA, leaf), TestPKI.pin(Self.hostB, leaf)],
                                              revoked: [leaf.fingerprint]), in: gate, pki: pki)
            let refused = try await curlThroughGate(gate, "https://\(Self.hostA):\(nginx.port)/reused")
            #expect(refused.exitStatus != 0)
            #expect(refused.proxyHeaders["pingate-refusal"] == "revoked")
            let stats = gate.statistics
            #expect(stats.upstreamSessionsResumed == 2)
            #expect(stats.count(.revoked) == 1)
            // nginx served exactly the four allowed requests.
            #expect(nginx.accessLogProtocols().count == 4)
        }
    }

    @Test("a depth-1 pin holds on a resumed tunnel: the verified chain kept with the session is what it matches (OpenSSL builds none on resumption)")
    func depthPinOnResumedTunnel() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.hostA)], issuer: pki.originCA, file: "origin")
        // The issuing CA's key, one position above the leaf.
        let caPin = PinGateSignedList.Pin(host: Self.hostA, spki: pki.originCA.certificate.spkiSHA256,
                                          expires: Int64(Date().timeIntervalSince1970) + 86400, depth: .position(1))
        let list = try directory.write("pins.json", String(decoding: try pki.signedV2(sequence: 1, pins: [caPin]), as: UTF8.self))
        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: [:], http2: false,
                                   serverDirectives: Self.reusedLocation) { nginx in
            try await GateFixture.with(pki: pki, listPath: list, resolve: ["\(Self.hostA):\(nginx.port)"],
                                       configure: { $0.upstreamPoolEnabled = false }) { gate in
                try await Self.expectOrigin(gate, Self.hostA, nginx, saw: ".")
                try await Self.expectOrigin(gate, Self.hostA, nginx, saw: "r")
                try await Self.expectOrigin(gate, Self.hostA, nginx, saw: "r")
                let stats = gate.statistics
                #expect(stats.upstreamSessionsResumed == 2)
                #expect(stats.count(.trusted) == 3)
            }
        }
    }

    @Test("with resumption off, every upstream handshake is a full one")
    func resumptionOff() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.hostA)], issuer: pki.originCA, file: "origin")
        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: [:], http2: false,
                                   serverDirectives: Self.reusedLocation) { nginx in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.hostA, leaf.fingerprint)]),
                                       resolve: ["\(Self.hostA):\(nginx.port)"],
                                       configure: { $0.upstreamSessionResumption = false; $0.upstreamPoolEnabled = false }) { gate in
                try await Self.expectOrigin(gate, Self.hostA, nginx, saw: ".")
                try await Self.expectOrigin(gate, Self.hostA, nginx, saw: ".")
                #expect(gate.statistics.upstreamSessionsResumed == 0)
            }
        }
    }
}
