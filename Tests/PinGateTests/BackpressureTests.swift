import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// A client that stops reading must stop the gate reading from the upstream, instead of
/// the gate buffering everything the upstream sends.
@Suite("Backpressure")
struct BackpressureTests {
    @Test("a stalled client holds the upstream back; every byte still arrives once it reads again")
    func stalledClient() async throws {
        let total = 64 << 20
        let (result, whileStalled, after) = try await PinnedOriginScenario.with(
            host: "stream.pingate.test", behaviour: .stream(bytes: total), alpn: nil,
            configure: { $0.opaqueHosts = ["stream.pingate.test"] }  // a raw stream, relayed as bytes
        ) { scenario in
            let (gate, directory) = (scenario.gate, scenario.directory)
            let paused = directory.file("paused")
            let resume = directory.file("resume")
            let script = """
            import os, socket, ssl, sys, time
            gate_port, target, ca, paused, resume = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
            raw = socket.create_connection(("127.0.0.1", gate_port), timeout=30)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            raw.sendall(f"CONNECT {target} HTTP/1.1\\r\\n\\r\\n".encode())
            head = b""
            while b"\\r\\n\\r\\n" not in head: head += raw.recv(1)
            tls = ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname=target.split(":")[0])
            tls.sendall(b"go")
            received = 0
            while received < (1 << 20):
                received += len(tls.recv(65536))
            open(paused, "w").close()
            deadline = time.monotonic() + 30
            while not os.path.exists(resume) and time.monotonic() < deadline: time.sleep(0.02)
            while True:
                chunk = tls.recv(1 << 20)
                if not chunk: break
                received += len(chunk)
            print(received)
            """
            let client = Task {
                try await TestProcess.run("python3", ["-c", script, "\(gate.port)", scenario.target, gate.caPath, paused, resume], timeout: 60)
            }
            _ = await eventually(timeout: .seconds(30), interval: .milliseconds(50)) { FileManager.default.fileExists(atPath: paused) }
            // Give the pipeline time to fill up to whatever bound it has.
            try await Task.sleep(nanoseconds: 700_000_000)
            let whileStalled = gate.statistics.bytesDown
            _ = FileManager.default.createFile(atPath: resume, contents: nil)
            let result = try await client.value
            return (result, whileStalled, gate.statistics.bytesDown)
        }

        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "\(total)")
        #expect(whileStalled < 24 << 20, "the gate read \(whileStalled) bytes from the upstream while the client read 1 MiB")
        #expect(after == total)
    }
}
