import Foundation
import PinGateTestSupport
import PinGateTLS
import PinList
import Testing
@testable import PinGate
import PinGateHarness

/// Report-only pins: the traffic passes, and a TrustKit-style report reaches the collector.
@Suite("Report-only pins")
struct ReportOnlyTests {
    @Test("a report-only mismatch passes, is counted, and reaches the collector once per 24 h with the chain and the known pins")
    func reportOnly() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "soft.pingate.test"
        let expected = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "expected")
        let presented = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "presented")
        let collectorIdentity = try pki.leaf([.dns("reports.pingate.test")], issuer: pki.originCA, file: "reports")
        // The collector is handed out of the scopes: what it received is read after the stops, as before.
        let (stats, originPort, counters, collector) = try await TestListServer.with(identity: collectorIdentity, behaviour: .status(204)) { collector in
            try await LoopbackOrigin.with(identity: presented, behaviour: .http(body: "passed")) { origin in
                let expires = Int64(Date().timeIntervalSince1970) + 86400
                let list = try PinGateSignedList.verify(try pki.signedV2(sequence: 1, pins: [
                    .init(host: host, sha256: expected.fingerprint, expires: expires, mode: "report-only"),
                    // A depth pin on a CA that did not issue the presented leaf: no match either.
                    .init(host: host, spki: pki.rogueCA.certificate.spkiSHA256, expires: expires, mode: "report-only", depth: .position(1)),
                ]), keys: [try pki.signer.publicKey()], source: "test")
                return try await GateFixture.with(
                    pki: pki, listPath: nil,
                    resolve: ["\(host):\(origin.port)", "reports.pingate.test:\(collector.port)"],
                    configure: {
                        $0.reportURIs = [URL(string: "https://reports.pingate.test:\(collector.port)/pin-failures")!]
                        $0.reportTrust = .pemFiles([pki.originCA.certificatePath])
                    }
                ) { gate in
                    gate.server.store.replace(with: list)

                    for _ in 0..<2 {
                        let result = try await curlThroughGate(gate, "https://\(host):\(origin.port)/")
                        #expect(result.exitStatus == 0, "\(result.stderr)")
                        #expect(String(decoding: result.body, as: UTF8.self) == "passed")
                    }
                    _ = await eventually(timeout: .seconds(2)) { !collector.receivedBodies.isEmpty }
                    // Deliberately a fixed wait: it gives a second (wrongly unsuppressed) report
                    // time to arrive, which no condition can await.
                    try await Task.sleep(nanoseconds: 200_000_000)
                    let reporter = try #require(gate.server.reporter)
                    return (gate.statistics, origin.port, reporter.counters, collector)
                }
            }
        }

        #expect(stats.reportOnlyViolations == 2)
        #expect(counters.sent == 1)
        #expect(counters.suppressed == 1)
        let bodies = collector.receivedBodies
        #expect(bodies.count == 1)
        #expect(collector.receivedRequests.first?.uri == "/pin-failures")
        let firstBody = try #require(bodies.first)
        let report = try #require(try JSONSerialization.jsonObject(with: firstBody) as? [String: Any])
        #expect(report["hostname"] as? String == host)
        #expect(report["port"] as? Int == originPort)
        #expect(report["enforce-pinning"] as? Bool == false)
        #expect(report["known-pins"] as? [String] == ["cert-sha256=\"\(expected.fingerprint)\"",
                                                      "pin-sha256=\"\(pki.rogueCA.certificate.spkiSHA256)\"; depth=1"])
        // Both hashes at every position of the validated chain, for the depth pin's sake.
        #expect(report["pingate-observed-chain"] as? [String] == [
            "depth-0 sha256 \(presented.fingerprint) spki \(presented.certificate.spkiSHA256)",
            "depth-1 sha256 \(pki.originCA.fingerprint) spki \(pki.originCA.certificate.spkiSHA256)",
        ])
        #expect(report["pingate-observed-fingerprint"] as? String == presented.fingerprint)
        let chain = try #require(report["validated-certificate-chain"] as? [String])
        #expect(chain.count == 2)
        #expect(chain.first.map { try? Certificate(pem: $0).sha256Fingerprint } == presented.fingerprint)
        #expect(report["validation-result"] as? Int == 1)
    }
}
