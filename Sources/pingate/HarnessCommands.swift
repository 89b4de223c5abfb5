import ArgumentParser
import Foundation
import Logging
import PinGate
import PinGateCA
import PinGateHarness
import PinGateTLS
import PinList
import PinListService
import PinGateNIO
import ServiceLifecycle
import UnixSignals

/// `pingate attack`: a Charles-like intercepting proxy, for proving that clients fail closed.
struct AttackCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "attack",
        abstract: "Run an intercepting proxy (the attacker): forged leaves from its own CA, no pinning, logs what it reads.",
        discussion: "For tests only. Every intercepted request (method, path, host, first bytes of the body) is logged to stderr.")

    @Option(name: .long, help: "Listen address HOST:PORT.")
    var listen: String = "127.0.0.1:8081"

    @Option(name: .long, help: "Where the attacker CA lives (created if missing; default: pingate-attacker in the system's temporary directory, kept between runs).")
    var stateDir: String?

    @Option(name: .long, help: "Connect to ADDR for HOST:PORT, like curl's --resolve. Repeatable.")
    var resolve: [String] = []

    func run() async throws {
        LoggingSystem.bootstrap { StreamLogHandler.standardError(label: $0) }
        let logger = Logger(label: "pingate-attack")
        var configuration = GateConfiguration()
        (configuration.listenHost, configuration.listenPort) = try RunCommand.parseHostPort(listen)
        configuration.resolveOverrides = try resolve.map(ResolveOverride.init(parsing:))
        // A test tool: a short drain keeps the harness's teardown quick.
        configuration.drainTimeout = .seconds(2)
        let state = PathText.resolve(stateDir ?? FileManager.default.temporaryDirectory.appendingPathComponent("pingate-attacker").path)
        let (ca, _) = try LocalCA.loadOrCreate(stateDirectory: state)
        let log = InterceptionLog()
        // Trapped before starting, so a stop that arrives during start-up is not fatal and
        // is honoured once the group runs (as in `pingate run`).
        let earlyStops = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let server = try await PinGateServer.start(configuration: configuration, store: PinListStore(nil), ca: ca, logger: logger,
                                                   decisionPolicy: InterceptingDecisionPolicy(log: log))
        logger.notice("attacker CA (trust it only in a control client)", metadata: ["certificate": "\(LocalCA.Paths(stateDirectory: state).certificate)"])
        let reporter = Task {
            var shown = 0
            while !Task.isCancelled {
                let all = log.all
                for entry in all.dropFirst(shown) {
                    logger.warning("intercepted", metadata: [
                        "target": "\(entry.target)", "method": "\(entry.method)", "path": "\(entry.path)",
                        "host": "\(entry.host)", "body": "\(entry.bodyPrefix)",
                    ])
                }
                shown = all.count
                try? await Task.sleep(nanoseconds: 100_000_000)
            }
        }
        let group = ServiceGroup(services: [server], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        let startupStop = Task {
            for await _ in earlyStops {
                await group.triggerGracefulShutdown()
                return
            }
        }
        defer {
            startupStop.cancel()
            reporter.cancel()
        }
        try await group.run()
    }
}

/// `pingate harness`: the three legs against a real target.
struct HarnessCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "harness",
        abstract: "Prove that traffic to a target fails closed under interception: gate, attack and control legs.",
        discussion: """
        gate: client → gate → origin must succeed.

        attack: client → gate → attacker → origin must be refused by the gate, for whatever reason its checks gave (pin-mismatch; chain-invalid when a depth pin asks for a valid chain, as list propose lists do), and the attacker must read no application data.

        control: client → attacker → origin, with the client trusting the attacker CA, must be intercepted (proving the attack is real).

        With --app, your command runs once per leg with HTTPS_PROXY, https_proxy, SSL_CERT_FILE, \
        REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, CURL_CA_BUNDLE, GIT_SSL_CAINFO and PINGATE_TARGET set, \
        and NODE_OPTIONS loading the same Node preload as pingate env (Node before 24 reads no proxy \
        variable; its https module and fetch() go through the leg's proxy with it); it must exit 0 \
        in the gate and control legs and non-zero in the attack leg. Exit code 0 only if every leg did.

        The report gives the target host's pin health after the gate leg (ok, backup-only, expiring; see \
        pingate list health), and the JUnit report has it as properties. --fail-on backup-only,expiring \
        fails the run on those states although every leg passed, so a pipeline catches a rotation or an \
        expiry before it refuses traffic.
        """)

    @Option(name: .long, help: "https://host[:port]/path")
    var target: String

    @Option(name: .long, help: "Connect to ADDR for HOST:PORT, like curl's --resolve. Repeatable.")
    var resolve: [String] = []

    @Option(name: .long, help: "The signed fingerprint list (file).")
    var pins: String

    @Option(name: .long, help: "Public key verifying the list. Repeatable.")
    var pinsKey: [String]

    @Option(name: .long, help: "PEM roots for the origin's chain (default: the system store). Repeatable.")
    var upstreamCa: [String] = []

    @Option(name: .long, help: "Host whose pin alone decides. Repeatable.")
    var pinsOnly: [String] = []

    @Option(name: .long, help: "Your own client command, run by /bin/sh -c once per leg.")
    var app: String?

    @Option(name: .long, help: "Write a JUnit XML report here.")
    var junit: String?

    @Option(name: .long, help: "Comma-separated pin health states of the target's host that fail the run although every leg passed: backup-only, expiring, unseen, refusing.")
    var failOn: String?

    @Flag(name: .long, help: "Print the report as JSON instead of a table.")
    var json = false

    func validate() throws {
        _ = try PinHealthStates.parse(failOn)
    }

    func run() async throws {
        HarnessCommand.bootstrapQuietLogging()
        guard let url = URL(string: target) else { throw ValidationError("--target is not a URL") }
        let path = PathText.resolve(pins)
        let keys = try PinListFile.loadKeys(pinsKey.map { PathText.resolveKey($0) })
        let list = try SignedListDocument.read(file: path).verify(keys: keys)
        var configuration = HarnessConfiguration(target: url, list: list)
        configuration.resolve = try resolve.map(ResolveOverride.init(parsing:))
        configuration.upstreamTrust = upstreamCa.isEmpty ? .system : .pemFiles(upstreamCa.map { PathText.resolve($0) })
        configuration.pinsOnly = Set(pinsOnly)
        configuration.app = app
        configuration.failOn = try PinHealthStates.parse(failOn)
        let report = try await HarnessRunner.run(configuration, logger: Logger(label: "pingate-harness"))
        try Self.emit(report, json: json, junit: junit)
        if !report.passed { throw ExitCode(1) }
    }

    /// Harness output is the report; logs only say what went wrong.
    static func bootstrapQuietLogging() {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .warning
            return handler
        }
    }

    static func emit(_ report: HarnessReport, json: Bool, junit: String?) throws {
        print(json ? try report.json() : report.table(), terminator: "")
        if let junit {
            let path = PathText.resolve(junit)
            do {
                try report.junit().write(toFile: path, atomically: true, encoding: .utf8)
            } catch {
                let directory = (path as NSString).deletingLastPathComponent
                let reason = FileManager.default.fileExists(atPath: directory) ? "cannot be written there" : "its directory \(directory) does not exist"
                throw ConfigurationError("--junit \(path): \(reason); create the directory first or give another path")
            }
        }
    }
}

/// `pingate demo`: the harness against a loopback origin, no network, no set-up.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Show the whole story on loopback: a pinned origin, the gate, an attacker, and the three legs.")

    @Option(name: .long, help: "Write a JUnit XML report here.")
    var junit: String?

    @Flag(name: .long, help: "Print the report as JSON instead of a table.")
    var json = false

    func run() async throws {
        HarnessCommand.bootstrapQuietLogging()
        let report = try await HarnessDemo.run(logger: Logger(label: "pingate-demo"))
        try HarnessCommand.emit(report, json: json, junit: junit)
        if !report.passed { throw ExitCode(1) }
    }
}
