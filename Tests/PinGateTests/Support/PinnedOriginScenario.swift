import Foundation
import PinGateTestSupport
@testable import PinGate
import PinGateHarness

/// The most common setup: a fresh test PKI, a leaf for `host` from the origin CA, a TLS
/// origin serving it on port 0, and an in-process gate whose signed list pins that leaf
/// and whose `--resolve` points the host at the origin.
struct PinnedOriginScenario {
    let directory: TemporaryDirectory
    let pki: TestPKI
    let host: String
    let leaf: TestPKI.Identity
    let origin: LoopbackOrigin
    let gate: GateFixture

    /// `host:port` as a client CONNECTs to it.
    var target: String { "\(host):\(origin.port)" }

    static func start(
        host: String = "origin.pingate.test",
        behaviour: LoopbackOrigin.Behaviour,
        alpn: String? = "http/1.1",
        configure: (inout GateConfiguration) -> Void = { _ in }
    ) async throws -> PinnedOriginScenario {
        // A gate that fails to start must not leave the origin running.
        try await startInParts { started in
            let directory = try TemporaryDirectory()
            started.onFailure { directory.remove() }
            let pki = try TestPKI(directory: directory)
            let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
            let origin = try await LoopbackOrigin.start(identity: leaf, behaviour: behaviour, alpn: alpn)
            started.onFailure { await origin.stop() }
            let gate = try await GateFixture.start(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]),
                                                   resolve: ["\(host):\(origin.port)"], configure: configure)
            return PinnedOriginScenario(directory: directory, pki: pki, host: host, leaf: leaf, origin: origin, gate: gate)
        }
    }

    /// Starts the scenario as `start` does, runs `body` with it, and stops the gate and
    /// the origin whether `body` returns or throws.
    static func with<Value>(
        host: String = "origin.pingate.test",
        behaviour: LoopbackOrigin.Behaviour,
        alpn: String? = "http/1.1",
        isolation: isolated (any Actor)? = #isolation,
        configure: (inout GateConfiguration) -> Void = { _ in },
        _ body: (PinnedOriginScenario) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: { try await start(host: host, behaviour: behaviour, alpn: alpn, configure: configure) },
            stop: { await $0.stop() },
            body: body)
    }

    /// Stops the gate, then the origin, and removes the PKI. Safe to call more than once.
    func stop() async {
        await gate.stop()
        await origin.stop()
        directory.remove()
    }
}
