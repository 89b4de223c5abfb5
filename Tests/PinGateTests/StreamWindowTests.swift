import Foundation
import PinGate
import PinGateNIO
import PinGateTestSupport
import Testing

/// An `h2` upstream's stream windows start at 64 KiB and grow only while the client takes
/// the bytes faster than one window per round trip (`StreamWindowTuner`): a long path gets
/// the window it needs.
@Suite("An h2 upstream's stream windows follow what the client takes")
struct StreamWindowTests {
    @Test("through a parent proxy (tinyproxy) and a 40 ms round trip (scripts/delay-relay.py), a 16 MiB download from an h2 origin arrives whole, and its stream's window grew past 64 KiB, timed by PING")
    func growsOnALongPath() async throws {
        let big = seededRandomBytes(16 << 20, seed: 40)
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        // tinyproxy resolves names itself, so the origin is `localhost`.
        let leaf = try pki.leaf([.dns("localhost")], issuer: pki.originCA, file: "origin")
        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: ["big.bin": big], http2: true) { nginx in
            try await DelayRelay.with(target: nginx.port, roundTripMilliseconds: 40) { relay in
                try await Tinyproxy.with { tinyproxy in
                    try await GateFixture.with(pki: pki, listPath: try pki.signedList([("localhost", leaf.fingerprint)]), configure: {
                        $0.upstreamProxy = ParentProxy(host: "127.0.0.1", port: tinyproxy.port)
                    }) { gate in
                        let result = try await curlThroughGate(gate, "https://localhost:\(relay.port)/big.bin")
                        #expect(result.exitStatus == 0 && result.httpCode == "200", "\(result.httpCode) \(result.stderr.suffix(400))")
                        #expect(result.body == big, "\(result.body.count) bytes")
                        let stats = gate.statistics
                        #expect(stats.upstreamStreamWindowGrowths >= 2, "\(stats.upstreamStreamWindowGrowths) growths")
                        #expect(stats.upstreamStreamWindowLargestBytes >= 256 << 10 && stats.upstreamStreamWindowLargestBytes <= 4 << 20,
                                "largest window \(stats.upstreamStreamWindowLargestBytes)")
                    }
                }
            }
        }
    }
}

/// `scripts/delay-relay.py` as a child process on a free loopback port: every exchange
/// through it costs `roundTripMilliseconds` more, as over a long path.
enum DelayRelay {
    static func with<Value>(
        target port: Int, roundTripMilliseconds: Int,
        isolation: isolated (any Actor)? = #isolation,
        _ body: (H2EchoOrigin) async throws -> Value
    ) async throws -> Value {
        // The peers' launcher runs scripts from Tests/Peers; the relay is one of the scripts.
        try await H2EchoOrigin.with(script: "../../scripts/delay-relay.py",
                                    ["127.0.0.1:0", "127.0.0.1:\(port)", "\(roundTripMilliseconds)"], body)
    }
}
