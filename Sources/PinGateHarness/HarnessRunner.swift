import Foundation
import Logging
import NIOCore
import PinGate
import PinGateCA
import PinGateTLS
import PinGateNIO
import PinList
import PinListService

/// What the harness runs against.
public struct HarnessConfiguration: Sendable {
    /// `https://host[:port]/path`.
    public var target: URL
    /// curl-style overrides, for the gates and the attacker alike.
    public var resolve: [ResolveOverride] = []
    /// The verified pin list the gates enforce.
    public var list: PinList
    /// Roots the gates validate the origin's chain against.
    public var upstreamTrust: TrustRoots = .system
    /// Hosts whose pin alone decides.
    public var pinsOnly: Set<String> = []
    /// The user's own client, run once per leg by `/bin/sh -c`; nil: the built-in client.
    public var app: String?
    /// Where the attacker's CA lives (created if missing); nil: a fresh one for this run.
    public var attackerStateDirectory: String?
    /// How long one leg may take.
    public var timeout: TimeInterval = 60
    /// Pin health states of the target's host that fail the run although every leg passed
    /// (`--fail-on backup-only,expiring`): a pipeline catches a rotation before it is an outage.
    public var failOn: Set<PinHealthBook.State> = []

    /// Creates a configuration.
    public init(target: URL, list: PinList) {
        self.target = target
        self.list = list
    }
}

/// Runs the three legs that prove a client's traffic fails closed under interception:
///
/// - **gate**: client → gate → origin must work;
/// - **attack**: client → gate → attacker → origin must be refused by the gate, for
///   whatever reason its checks gave (`pin-mismatch`, or `chain-invalid` when a depth pin
///   asks for a valid chain, as `list propose` lists do), which the leg reports; and the
///   attacker must read no application data. It fails only when something went through;
/// - **control**: client → attacker → origin, the client trusting the attacker's CA, must
///   be intercepted, which proves the attack in the attack leg was real.
public enum HarnessRunner {
    /// Runs the legs and returns the report; the servers it starts are stopped before it returns.
    public static func run(_ configuration: HarnessConfiguration, logger: Logger) async throws -> HarnessReport {
        guard let host = configuration.target.host?.lowercased(), configuration.target.scheme?.lowercased() == "https" else {
            throw ConfigurationError("--target must be an https:// URL")
        }
        let quiet = Logger(label: "pingate-harness") { _ in SwiftLogNoOpLogHandler() }
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("pingate-harness-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: work) }
        let gateState = (work as NSString).appendingPathComponent("gate")
        let gateCA = try LocalCA.create(stateDirectory: gateState)
        let gateCAPath = LocalCA.Paths(stateDirectory: gateState).certificate
        let attackerState = configuration.attackerStateDirectory ?? (work as NSString).appendingPathComponent("attacker")
        let (attackerCA, _) = try LocalCA.loadOrCreate(stateDirectory: attackerState)
        let attackerCAPath = LocalCA.Paths(stateDirectory: attackerState).certificate

        var gateConfiguration = GateConfiguration()
        gateConfiguration.listenPort = 0
        gateConfiguration.eventLoopThreads = 1
        gateConfiguration.upstreamTrust = configuration.upstreamTrust
        gateConfiguration.resolveOverrides = configuration.resolve
        gateConfiguration.pinsOnlyHosts = configuration.pinsOnly
        var attackerConfiguration = gateConfiguration
        attackerConfiguration.upstreamTrust = .system // an attacker checks nothing

        let interceptions = InterceptionLog()
        let gate = try await PinGateServer.start(configuration: gateConfiguration, store: PinListStore(configuration.list), ca: gateCA, logger: quiet)
        let attacker = try await PinGateServer.start(configuration: attackerConfiguration, store: PinListStore(nil), ca: attackerCA,
                                                     logger: quiet, decisionPolicy: InterceptingDecisionPolicy(log: interceptions))
        var attackedConfiguration = gateConfiguration
        attackedConfiguration.upstreamProxy = ParentProxy(host: "127.0.0.1", port: attacker.port)
        let attackedGate = try await PinGateServer.start(configuration: attackedConfiguration, store: PinListStore(configuration.list),
                                                         ca: gateCA, logger: quiet)
        let pins = configuration.list.unexpiredEntries(for: host, at: Date()).map { "\($0.kind.rawValue)/\($0.fingerprint)" }
        logger.info("harness running", metadata: [
            "target": "\(configuration.target)", "gate": "127.0.0.1:\(gate.port)", "attacker": "127.0.0.1:\(attacker.port)",
            "gate_behind_attacker": "127.0.0.1:\(attackedGate.port)",
        ])

        var legs: [LegResult] = []
        legs.append(await gateLeg(configuration, gate: gate, caPath: gateCAPath))
        legs.append(await attackLeg(configuration, gate: attackedGate, attacker: attacker, interceptions: interceptions, caPath: gateCAPath))
        legs.append(await controlLeg(configuration, attacker: attacker, interceptions: interceptions, caPath: attackerCAPath))

        // What the gate leg's verdict says of the host's pins (issue 34).
        let health = gate.statistics.pinHealth.health(list: gate.store.list, generation: gate.store.generation, now: Date())
            .first { $0.host == host }

        try? await attackedGate.shutdown()
        try? await attacker.shutdown()
        try? await gate.shutdown()
        return HarnessReport(target: configuration.target.absoluteString, pins: pins, legs: legs, pinHealth: health,
                             failOn: configuration.failOn.map(\.rawValue).sorted())
    }

    // MARK: legs

    private static func gateLeg(_ configuration: HarnessConfiguration, gate: PinGateServer, caPath: String) async -> LegResult {
        let started = Date()
        let expectation = "client → gate → origin succeeds"
        if let app = configuration.app {
            let (status, output) = await runApp(app, proxyPort: gate.port, caPath: caPath, configuration: configuration)
            return LegResult(name: "gate", expectation: expectation, passed: status == 0,
                             detail: status == 0 ? "app exited 0" : "app exited \(status): \(output)",
                             interceptedRequests: 0, appExitStatus: status, durationMilliseconds: elapsed(since: started))
        }
        let result = await ProxiedFetch.get(configuration.target, via: ParentProxy(host: "127.0.0.1", port: gate.port),
                                            trust: .pemFiles([caPath]), on: gate.eventLoopGroup,
                                            timeout: .seconds(Int64(configuration.timeout)))
        let passed = result.status != nil
        let detail = result.status.map { "HTTP \($0), \(result.body.count) bytes through the gate" }
            ?? "no response: \(result.refusal.map { "refused (\($0))" } ?? result.error ?? "unknown")"
        return LegResult(name: "gate", expectation: expectation, passed: passed, detail: detail, refusal: result.refusal,
                         observedFingerprint: result.observedFingerprint, interceptedRequests: 0, durationMilliseconds: elapsed(since: started))
    }

    private static func attackLeg(_ configuration: HarnessConfiguration, gate: PinGateServer, attacker: PinGateServer,
                                  interceptions: InterceptionLog, caPath: String) async -> LegResult {
        let started = Date()
        let expectation = "client → gate → attacker is refused"
        let interceptedBefore = interceptions.all.count
        let bytesBefore = attacker.statistics.snapshot.bytesUp
        var appStatus: Int32?
        var refusal: String?
        var observed: String?
        var clientFailed: Bool
        var clientDetail: String
        if let app = configuration.app {
            let (status, output) = await runApp(app, proxyPort: gate.port, caPath: caPath, configuration: configuration)
            appStatus = status
            clientFailed = status != 0
            clientDetail = status == 0 ? "the app SUCCEEDED through an intercepting proxy" : "app exited \(status)"
            if status == 0 && !output.isEmpty { clientDetail += ": \(output)" }
            // The gate's own refusal during this leg, if it made one (its log is a ring: the
            // time says which entries are this leg's).
            let last = gate.refusals.entries.last { $0.time >= started }
            refusal = last?.reason.rawValue
            observed = last?.observedFingerprint
        } else {
            let result = await ProxiedFetch.get(configuration.target, via: ParentProxy(host: "127.0.0.1", port: gate.port),
                                                trust: .pemFiles([caPath]), on: gate.eventLoopGroup,
                                                timeout: .seconds(Int64(configuration.timeout)))
            clientFailed = result.status == nil
            refusal = result.refusal
            observed = result.observedFingerprint
            clientDetail = result.status.map { "HTTP \($0): the request went THROUGH an intercepting proxy" }
                ?? "refused: \(result.proxyStatus.map(String.init) ?? "-") \(result.refusal ?? result.error ?? "")"
        }
        let intercepted = interceptions.all.count - interceptedBefore
        let leaked = attacker.statistics.snapshot.bytesUp - bytesBefore
        // The outcome is what counts: the gate refused the intercepted connection, for
        // whichever of its checks failed first, and nothing reached the attacker. A client
        // that failed with no refusal from the gate proves nothing either way.
        let refusedByGate = refusal.flatMap(DecisionReason.init(rawValue:)) != nil
        let passed = clientFailed && refusedByGate && intercepted == 0 && leaked == 0
        var detail = clientDetail
        if let refusal, refusedByGate, configuration.app != nil { detail += "; the gate refused it: \(refusal)" }
        if let observed { detail += "; observed \(observed)" }
        detail += "; attacker read \(leaked) application bytes"
        if clientFailed && !refusedByGate { detail += "; the client failed, but the gate refused nothing (\(refusal ?? "no refusal"))" }
        return LegResult(name: "attack", expectation: expectation, passed: passed, detail: detail, refusal: refusal,
                         observedFingerprint: observed, interceptedRequests: intercepted, appExitStatus: appStatus,
                         durationMilliseconds: elapsed(since: started))
    }

    private static func controlLeg(_ configuration: HarnessConfiguration, attacker: PinGateServer,
                                   interceptions: InterceptionLog, caPath: String) async -> LegResult {
        let started = Date()
        let expectation = "client → attacker (trusted CA) is intercepted"
        let before = interceptions.all.count
        var succeeded: Bool
        var appStatus: Int32?
        var detail: String
        if let app = configuration.app {
            let (status, output) = await runApp(app, proxyPort: attacker.port, caPath: caPath, configuration: configuration)
            appStatus = status
            succeeded = status == 0
            detail = status == 0 ? "app exited 0" : "app exited \(status): \(output)"
        } else {
            let result = await ProxiedFetch.get(configuration.target, via: ParentProxy(host: "127.0.0.1", port: attacker.port),
                                                trust: .pemFiles([caPath]), on: attacker.eventLoopGroup,
                                                timeout: .seconds(Int64(configuration.timeout)))
            succeeded = result.status != nil
            detail = result.status.map { "HTTP \($0)" } ?? "no response: \(result.error ?? "unknown")"
        }
        // The recorder writes when the request is complete; give it a moment.
        for _ in 0..<50 where interceptions.all.count == before { try? await Task.sleep(nanoseconds: 20_000_000) }
        let read = Array(interceptions.all.dropFirst(before))
        if let first = read.first {
            detail += "; attacker read \(first.method) \(first.path) (Host: \(first.host))"
            if !first.bodyPrefix.isEmpty { detail += ", body \"\(first.bodyPrefix)\"" }
        } else {
            detail += "; the attacker read nothing, so the attack setup is not proven"
        }
        return LegResult(name: "control", expectation: expectation, passed: succeeded && !read.isEmpty, detail: detail,
                         interceptedRequests: read.count, appExitStatus: appStatus, durationMilliseconds: elapsed(since: started))
    }

    // MARK: the user's app

    /// Runs `/bin/sh -c app` with the leg's proxy and CA in every variable common clients read.
    static func runApp(_ app: String, proxyPort: Int, caPath: String, configuration: HarnessConfiguration) async -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", app]
        var environment = ProcessInfo.processInfo.environment
        let proxy = "http://127.0.0.1:\(proxyPort)"
        for name in ["HTTPS_PROXY", "https_proxy"] { environment[name] = proxy }
        for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"] {
            environment[name] = caPath
        }
        for name in ["NO_PROXY", "no_proxy"] { environment.removeValue(forKey: name) }
        // What `pingate env` gives a shell, Node's preload included: Node before 24 reads no
        // proxy variable, so without it a Node app's legs would go around the gates.
        environment["NODE_USE_ENV_PROXY"] = "1"
        let preload = ((caPath as NSString).deletingLastPathComponent as NSString).appendingPathComponent("node-proxy.cjs")
        // NODE_OPTIONS is split on spaces: a path with one could not be given there.
        if !preload.contains(" "), (try? NodeProxyPreload.source.write(toFile: preload, atomically: true, encoding: .utf8)) != nil {
            let existing = environment["NODE_OPTIONS"].map { " " + $0 } ?? ""
            environment["NODE_OPTIONS"] = "--require \(preload)" + existing
        }
        environment["PINGATE_TARGET"] = configuration.target.absoluteString
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        // Read while it runs, so a chatty app never blocks on a full pipe; on a thread of its
        // own: the read blocks until the app's last writer closes the pipe, and a task doing
        // that held one of Swift's few cooperative threads for the app's whole run (the
        // harness's legs in parallel starved every other task for tens of seconds).
        let reader = Task { await Self.readToEnd(output.fileHandleForReading) }
        let status: Int32 = await withCheckedContinuation { continuation in
            process.terminationHandler = { continuation.resume(returning: $0.terminationStatus) }
            do {
                try process.run()
            } catch {
                process.terminationHandler = nil
                // No child holds the pipe's write end: close ours, or the reader never ends.
                try? output.fileHandleForWriting.close()
                continuation.resume(returning: 127)
                return
            }
            let pid = process.processIdentifier
            DispatchQueue.global().asyncAfter(deadline: .now() + configuration.timeout) {
                if process.isRunning { kill(pid, SIGKILL) }
            }
        }
        let text = String(decoding: await reader.value, as: UTF8.self)
        let lastLine = text.split(whereSeparator: \.isNewline).last.map(String.init) ?? ""
        return (status, String(lastLine.prefix(300)))
    }

    /// Everything `handle` yields until its end, read on a thread of its own.
    private static func readToEnd(_ handle: FileHandle) async -> Data {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: handle.readDataToEndOfFile()) }.start()
        }
    }

    private static func elapsed(since start: Date) -> Int {
        Int(Date().timeIntervalSince(start) * 1000)
    }
}
