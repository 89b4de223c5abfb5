import Foundation
import Testing
import PinGateTestSupport
import Logging
import NIOCore
import PinGateCA
import PinList
@testable import PinGate
@testable import PinListService
@testable import PinGateNIO

/// A gate running in this process on 127.0.0.1, port 0, with its own state directory.
struct GateFixture {
    let server: PinGateServer
    let caPath: String
    let directory: TemporaryDirectory
    /// The updater's silent schedule, run as `pingate run`'s service group would.
    let schedule: Task<Void, Never>?

    var port: Int { server.port }
    var statistics: GateStatistics.Snapshot { server.statistics.snapshot }

    static let quietLogger = Logger(label: "pingate-test") { _ in SwiftLogNoOpLogHandler() }

    static func start(
        pki: TestPKI,
        listPath: String?,
        resolve: [String] = [],
        listSource: PinListSource? = nil,
        stateDirectory: String? = nil,
        now: @escaping @Sendable () -> Date = { Date() },
        configure: (inout GateConfiguration) -> Void = { _ in }
    ) async throws -> GateFixture {
        let directory = try TemporaryDirectory()
        do {
            let state = stateDirectory ?? directory.file("state")
            let (ca, _) = try LocalCA.loadOrCreate(stateDirectory: state)
            var configuration = GateConfiguration()
            configuration.listenPort = 0
            configuration.eventLoopThreads = 2
            configuration.upstreamTrust = .pemFiles([pki.upstreamTrustPath])
            configuration.resolveOverrides = try resolve.map { try ResolveOverride(parsing: "\($0):127.0.0.1") }
            configure(&configuration)
            let list = try listPath.map { try SignedListDocument.read(file: $0).verify(keys: [pki.signer.publicKey()]) }
            let server = try await PinGateServer.start(
                configuration: configuration, store: PinListStore(list), ca: ca, logger: quietLogger,
                listSource: listSource, stateDirectory: state, now: now)
            let schedule = server.updater.map { updater in Task { _ = try? await updater.run() } }
            return GateFixture(server: server, caPath: LocalCA.Paths(stateDirectory: state).certificate, directory: directory,
                               schedule: schedule)
        } catch {
            // Nothing else was started (the server's own start cleans up after itself).
            directory.remove()
            throw error
        }
    }

    /// Starts a gate as `start` does, runs `body` with it, and stops the gate whether
    /// `body` returns or throws. `body` may stop the gate itself (a test that reads
    /// counters after the stop): the scope's own stop is then a no-op.
    static func with<Value>(
        pki: TestPKI,
        listPath: String?,
        resolve: [String] = [],
        listSource: PinListSource? = nil,
        stateDirectory: String? = nil,
        now: @escaping @Sendable () -> Date = { Date() },
        isolation: isolated (any Actor)? = #isolation,
        configure: (inout GateConfiguration) -> Void = { _ in },
        _ body: (GateFixture) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: {
                try await start(pki: pki, listPath: listPath, resolve: resolve, listSource: listSource,
                                stateDirectory: stateDirectory, now: now, configure: configure)
            },
            stop: { gate in
                await gate.stop()
                // Every tunnel's flow-control credit must have been placed: a miscount is
                // what stalls a connection (issue 22), so every test with a gate checks it.
                #expect(gate.statistics.creditUnplacedBytes == 0, "flow-control credit could not be placed")
            },
            body: body)
    }

    /// Stops the gate and removes its directory. Safe to call more than once: the
    /// server's shutdown runs once and later calls wait for it; removing is idempotent.
    func stop() async {
        schedule?.cancel()
        try? await server.shutdown()
        directory.remove()
    }
}

/// What curl reported for one request through the gate.
struct CurlResult {
    let exitStatus: Int32
    let httpCode: String
    let httpVersion: String
    let body: Data
    let stderr: String
    /// "status version" of each transfer, in the order curl finished them.
    var transfers: [String] = []

    /// Headers of the proxy's CONNECT answer, from curl's verbose output.
    var proxyHeaders: [String: String] {
        var headers: [String: String] = [:]
        for line in stderr.split(whereSeparator: \.isNewline) where line.hasPrefix("< ") {
            let text = line.dropFirst(2).trimmingCharacters(in: .whitespacesAndNewlines)
            guard let colon = text.firstIndex(of: ":") else { continue }
            headers[text[..<colon].lowercased()] = text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return headers
    }
}

/// Runs curl through the gate as an app would: `--proxy` plus `--cacert` of the gate's CA.
func curlThroughGate(_ gate: GateFixture, _ url: String, _ extra: [String] = []) async throws -> CurlResult {
    try await curlThroughGate(gate, urls: [url], extra)
}

/// Runs one curl for several `urls` (curl reuses its connection, or with `--parallel`
/// multiplexes them over HTTP/2). The result's body is the bodies in `urls` order; its
/// status and version are the first transfer's, and every transfer's are in `transfers`.
func curlThroughGate(_ gate: GateFixture, urls: [String], _ extra: [String] = []) async throws -> CurlResult {
    let output = try TemporaryDirectory()
    defer { output.remove() }
    var targets: [String] = []
    for (index, url) in urls.enumerated() { targets += ["-o", output.file("body.\(index)"), url] }
    let result = try await TestProcess.run("curl", [
        "-sS", "-v", "--max-time", "60",
        "--proxy", "http://127.0.0.1:\(gate.port)",
        "--cacert", gate.caPath,
        "-w", "%{http_code} %{http_version}\\n",
    ] + extra + targets)
    let transfers = result.stdout.split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
    var body = Data()
    for index in urls.indices { body += (try? Data(contentsOf: URL(fileURLWithPath: output.file("body.\(index)")))) ?? Data() }
    return CurlResult(exitStatus: result.status, httpCode: transfers.first?.first ?? "", httpVersion: transfers.first?.dropFirst().first ?? "",
                      body: body, stderr: result.stderr, transfers: transfers.map { $0.joined(separator: " ") })
}
