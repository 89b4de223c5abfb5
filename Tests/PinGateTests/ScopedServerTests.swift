import Foundation
import PinGateTestSupport
import Testing

/// The scoped helpers every test uses to start servers: a body that throws must still
/// leave nothing running, or one failing test leaks servers and processes into the rest
/// of the suite.
@Suite("Scoped test servers")
struct ScopedServerTests {
    /// The error the bodies below throw on purpose.
    struct PlannedFailure: Error {}

    @Test("an in-process gate and a pingate process are stopped when the body of their scope throws, and the error reaches the caller")
    func stoppedWhenTheBodyThrows() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)

        var gate: GateFixture?
        do {
            try await GateFixture.with(pki: pki, listPath: nil) { started in
                gate = started
                #expect(LoopbackProbe.isListening(port: started.port))
                throw PlannedFailure()
            }
            Issue.record("the scope swallowed the body's error")
        } catch is PlannedFailure {
            // The scope rethrew the body's own error.
        }
        let stoppedGate = try #require(gate)
        #expect(!stoppedGate.server.isListening, "the gate still listens after its scope threw")
        #expect(!FileManager.default.fileExists(atPath: stoppedGate.directory.path), "the gate's files were left behind")

        var process: RunningGate?
        do {
            try await RunningGate.with([
                "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
                "--pins", WultraVectors.path("static-list.json"), "--pins-key", WultraVectors.path("test-signer.pub.x963.b64"),
            ]) { started in
                process = started
                #expect(started.process.isRunning)
                throw PlannedFailure()
            }
            Issue.record("the scope swallowed the body's error")
        } catch is PlannedFailure {
            // The scope rethrew the body's own error.
        }
        let stoppedProcess = try #require(process)
        #expect(!stoppedProcess.process.isRunning, "pingate still runs after its scope threw")
        #expect(LoopbackProbe.isRefused(port: stoppedProcess.port))
    }
}
