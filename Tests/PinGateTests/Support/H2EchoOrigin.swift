import Foundation
import PinGateTestSupport

/// The gRPC-style HTTP/2 echo origin (`Tests/Peers/h2_echo_server.py`, Python `h2`) as a
/// child process: TLS with a test identity, ALPN `h2` only, bound to 127.0.0.1 port 0 (it
/// prints the port it got). It logs one JSON line per finished stream on stdout.
final class H2EchoOrigin {
    /// The peers' folder, next to the test targets.
    static let peers = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Peers").path

    let port: Int
    private let process: ChildProcess
    private let output: OutputCollector
    private let drains: [PipeDrain]

    private init(port: Int, process: ChildProcess, output: OutputCollector, drains: [PipeDrain]) {
        self.port = port
        self.process = process
        self.output = output
        self.drains = drains
    }

    /// Starts the origin with `certificatePath`/`keyPath` and waits for its port.
    static func start(certificatePath: String, keyPath: String, extraArguments: [String] = []) async throws -> H2EchoOrigin {
        try await start(script: "h2_echo_server.py", ["--cert", certificatePath, "--key", keyPath] + extraArguments)
    }

    /// Starts peer `script` (in `Tests/Peers`) with `arguments`; like the echo origin it
    /// must print `{"event": "listening", "port": N}` first (`ws_peer.py server` does).
    static func start(script: String, _ arguments: [String]) async throws -> H2EchoOrigin {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: try TestProcess.resolve("python3"))
        process.arguments = ["-u", (peers as NSString).appendingPathComponent(script)] + arguments
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        let output = OutputCollector()
        try process.run()
        let drains = [PipeDrain(out.fileHandleForReading, into: output.appendOut),
                      PipeDrain(err.fileHandleForReading, into: output.appendErr)]
        _ = await eventually(timeout: .seconds(15), interval: .milliseconds(20)) {
            listeningPort(output) != nil || !process.isRunning
        }
        guard let port = listeningPort(output) else {
            await process.terminateAndWait()
            for drain in drains { _ = await drain.finished(within: .seconds(5)) }
            throw TestFailure("the h2 echo origin did not start: \(output.errText)")
        }
        return H2EchoOrigin(port: port, process: process, output: output, drains: drains)
    }

    /// Starts the origin as `start` does, runs `body` with it, and stops it (by its PID)
    /// whether `body` returns or throws.
    static func with<Value>(
        certificatePath: String, keyPath: String, extraArguments: [String] = [],
        isolation: isolated (any Actor)? = #isolation,
        _ body: (H2EchoOrigin) async throws -> Value
    ) async throws -> Value {
        try await with(script: "h2_echo_server.py", ["--cert", certificatePath, "--key", keyPath] + extraArguments, body)
    }

    /// Starts peer `script` as `start(script:_:)` does, runs `body`, and stops it (by PID).
    static func with<Value>(
        script: String, _ arguments: [String],
        isolation: isolated (any Actor)? = #isolation,
        _ body: (H2EchoOrigin) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: { try await start(script: script, arguments) },
            stop: { await $0.stop() },
            body: body)
    }

    /// Every JSON line printed so far, in order (the first is `{"event": "listening"}`).
    var events: [[String: Any]] { Self.events(output) }

    /// The `{"event": "stream"}` lines: one per stream the origin finished.
    var streams: [[String: Any]] { events.filter { $0["event"] as? String == "stream" } }

    /// What the origin wrote on standard error (a Python traceback, if it failed).
    var errors: String { output.errText }

    /// The JSON lines in `output`'s standard output so far (a line still being written is skipped).
    private static func events(_ output: OutputCollector) -> [[String: Any]] {
        String(decoding: output.contents.0, as: UTF8.self).split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
    }

    /// The port of the `listening` line, once it was printed.
    private static func listeningPort(_ output: OutputCollector) -> Int? {
        events(output).first { $0["event"] as? String == "listening" }?["port"] as? Int
    }

    /// Stops the origin (SIGTERM, then SIGKILL) and waits for its output to end. Safe to
    /// call more than once.
    func stop() async {
        await process.terminateAndWait()
        for drain in drains { _ = await drain.finished(within: .seconds(5)) }
    }
}
