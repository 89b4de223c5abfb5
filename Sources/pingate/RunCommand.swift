import ArgumentParser
import Foundation
import Logging
import NIOCore
import PinGate
import PinGateAdmin
import PinGateCA
import PinGateTLS
import PinList
import PinListService
import PinGateNIO
import PinGateStateFiles
import ServiceLifecycle
import UnixSignals

/// `pingate run`: start the gate.
struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Run the gate: listen for CONNECT and relay only to pinned servers.",
        discussion: """
        A host with no unexpired pin (or every host, when no list is configured) is refused with \
        403 and Pingate-Refusal: empty. A list whose pins have all expired, or a v2 list past its \
        expiresAt, of either format: the gate starts anyway, logs an error, /ready answers 503 \
        with the reason, the admin endpoint is up, and every CONNECT is refused with 503 and \
        Pingate-Refusal: list-expired: the gate fails closed until a renewed list is re-read \
        (SIGHUP). A list that does not verify stops start-up with a non-zero exit. The local CA \
        is created in the state directory on first run.
        """
    )

    @OptionGroup var options: GateOptions

    func run() async throws {
        try await options.runGate()
    }

    /// See `GateOptions.parseHostPort`.
    static func parseHostPort(_ text: String, key: String? = nil) throws -> (String, Int) {
        try GateOptions.parseHostPort(text, key: key)
    }
}

/// The options `pingate run` and `pingate check-config` share, and what the gate does with
/// them: one definition, so the check and the run read the same flags the same way.
struct GateOptions: ParsableArguments {
    @Option(name: .long, help: "YAML config file (flags override it).")
    var config: String?

    @Option(name: .long, help: "Listen address HOST:PORT (default 127.0.0.1:8080).")
    var listen: String?

    @Option(name: .long, help: "State directory holding ca.pem, ca.key and the persisted list (default $XDG_STATE_HOME/pingate, or ~/.local/state/pingate).")
    var stateDir: String?

    @Option(name: .long, help: "A directory where the gate publishes, at start and world-readable, its CA certificate (ca.pem), a bundle of the system roots and it (ca-bundle.pem) and the Node preload, for apps of other users: pingate env --config reads them there (the packaged service: /run/pingate). The key never leaves the state directory.")
    var publicDir: String?

    @Option(name: .long, help: "Signed fingerprint list: a file, or an https:// URL to fetch and refresh it from.")
    var pins: String?

    @Option(name: .long, help: "List format: auto (Wultra static or pingate v2), wultra-static, wultra-dynamic, pingate-v2.")
    var pinsFormat: String?

    @Option(name: .long, help: ArgumentHelp(
        "Public key verifying the list: a file (PEM SubjectPublicKeyInfo or base64 X9.63), or Wultra's base64 X9.63 key inline. Repeatable.",
        discussion: "A value that is 88 base64 characters decoding to a 65-byte point starting 04 is the key itself; anything else is a file path."))
    var pinsKey: [String] = []

    @Option(name: .long, help: "PEM file of roots that upstream chains must reach (default: the system store). Repeatable.")
    var upstreamCa: [String] = []

    @Option(name: .long, help: "Connect to ADDR for HOST:PORT, like curl's --resolve. Repeatable.")
    var resolve: [String] = []

    @Option(name: .long, help: "Host whose pin alone decides (chain and hostname errors ignored). Repeatable.")
    var pinsOnly: [String] = []

    @Option(name: .long, help: ArgumentHelp(
        "Host whose tunnels are relayed as bytes instead of read as HTTP (for TLS protocols other than HTTP). Repeatable.",
        discussion: "Every other tunnel's requests are bound to the pinned host: another authority gets 421."))
    var opaqueHost: [String] = []

    @Flag(name: .long, inversion: .prefixedNo, help: ArgumentHelp(
        "Allow CONNECTs to names whose DNS answer is loopback, private, link-local, CGNAT or IPv4-mapped (default: refused).",
        discussion: "--resolve mappings may point anywhere but the gate itself and unspecified, multicast or broadcast addresses."))
    var allowPrivateDestinations: Bool?

    @Flag(name: .long, inversion: .prefixedNo, help: ArgumentHelp(
        "Resume upstream TLS sessions (default: on).",
        discussion: "Only sessions from verified, pin-trusted handshakes are kept, per name, port and address, until the list changes; each resumed connection is checked against the list again."))
    var upstreamSessionResumption: Bool?

    @Option(name: .long, help: "https:// URL that pin-failure reports (TrustKit JSON) are POSTed to. Repeatable.")
    var reportUri: [String] = []

    @Option(name: .long, help: "Reach upstreams through this parent HTTP proxy (CONNECT), e.g. http://proxy.corp:3128. Pins still apply end to end.")
    var upstreamProxy: String?

    @Option(name: .long, help: "Admin endpoint HOST:PORT (default 127.0.0.1:9090), or off.")
    var adminListen: String?

    @Option(name: .long, parsing: .upToNextOption, help: ArgumentHelp(
        "Host names the admin endpoint answers besides its listen host, localhost, 127.0.0.1 and [::1] (with its port); * for any.",
        discussion: "Any other Host header gets 421: a web page cannot read the endpoint through DNS rebinding."))
    var adminAllowedHosts: [String] = []

    @Option(name: .long, help: "File holding the bearer token for POST /pins/update (required for a non-loopback admin address).")
    var adminTokenFile: String?

    @Option(name: .long, help: "Decision log (one JSON line per CONNECT): stderr (default), a file path, or off.")
    var decisionLog: String?

    @Option(name: .long, help: "Request log (one JSON line per HTTP request through a tunnel): stderr, a file path, or off (default).")
    var requestLog: String?

    @Flag(name: .long, inversion: .prefixedNo, help: "Keep query strings in the request log's paths (default: cut off at the first ?).")
    var requestLogQuery: Bool?

    @Option(name: .long, help: "Seconds a client has, after the 200, to finish its TLS handshake with the gate (default 10); then both legs are closed.")
    var clientHandshakeTimeout: Int?

    @Flag(name: .long, inversion: .prefixedNo, help: ArgumentHelp(
        "Refuse to start when ca.key is open to group or others, or the state directory is not 0700 (default: on).",
        discussion: "--no-strict-permissions (config strict-permissions: false) starts anyway, with a warning."))
    var strictPermissions: Bool?

    @Option(name: .long, help: "Log level: trace, debug, info, notice, warning, error.")
    var logLevel: String?

    @Option(name: .long, help: "The operational log's format on stderr: text (default; swift-log's lines) or json (one JSON object per line, with ts, level, message, logger and the metadata as fields, as the decision log writes them).")
    var logFormat: String?

    @Flag(name: .long, help: ArgumentHelp(
        "Check the configuration and exit, as nginx -t does: every key and flag, the list file against its keys, the trust anchors, the local CA and its permissions, the admin token and the log destinations; nothing is written, no port is bound. Exit 0 when it would start.",
        discussion: "The same as pingate check-config, which the packaged service runs before it starts and before a reload (ExecStartPre, ExecReload), so a broken edit to /etc/pingate stops there with a message, and a running gate keeps its last good list."))
    var check = false

    @Option(name: .long, help: "On SIGTERM/SIGINT, how long open tunnels may take to finish before they are closed (default 30).")
    var drainTimeout: Int?

    @Option(name: .long, help: "How many days before an expiry a host's pin health turns expiring: the pin that carries its verdicts, the list, or a leaf certificate pinned by its hash (default 30). /status, /metrics and a warning in the log say so.")
    var pinWarningDays: Int?

    @Flag(name: .long, inversion: .prefixedNo, help: ArgumentHelp(
        "Keep verified upstream connections after their tunnel ends and admit later CONNECTs to the same host on them, without an upstream handshake (default: on).",
        discussion: "A pooled connection's verdict is its own handshake's verified chain, decided again under the list in force; a list update closes the pooled connections it no longer trusts. Connections that carried NTLM or Negotiate authentication, that switched protocols, or whose server asked for a client certificate are never pooled, nor are opaque hosts' tunnels. --no-upstream-pool opens and verifies a connection per tunnel."))
    var upstreamPool: Bool?

    @Option(name: .long, help: "Seconds a pooled upstream connection may stay idle before it is closed (default 30).")
    var upstreamPoolIdleTimeout: Int?

    @Option(name: .long, help: "The most idle upstream connections kept per host and port (default 16, as many as nginx keeps in the benchmark's keep-alive pool), shared between the gate's event loops: each keeps its share, rounded up.")
    var upstreamPoolMaxPerHost: Int?

    @Flag(name: .long, inversion: .prefixedNo, help: ArgumentHelp(
        "Learn mode: let hosts without a pin through when their chain and host name validate, and record what every host presents, for `pingate list propose`.",
        discussion: "Config: learn: true. Pinned hosts are enforced as usual; a chain that does not validate is still refused. What each host:port presented (leaf and key hashes, each issuer's key and subject, expiry dates, first and last seen, how often, ALPN) is written to observations.json in the state directory. The gate says it is learning, not enforcing, at start-up and every 10 minutes, in /ready, /status and the status page, and the decision log marks each such pass learned. Listening beyond loopback needs --learn-allow-remote as well."))
    var learn: Bool?

    @Flag(name: .long, help: "With --learn, allow a listen address other than loopback (every client that reaches it gets through to any host with a valid chain). Config: learn-allow-remote: true.")
    var learnAllowRemote = false

    /// `pingate run` (or, with `check`, `check-config`) with these options.
    func runGate() async throws {
        HeapTuning.applyForRelaying()
        let file = try config.map(ConfigFile.load)
        if check {
            print(try checkOnly(file: file), terminator: "")
            return
        }
        let configuration = try gateConfiguration(file: file)
        let (level, format) = try loggingSettings(file: file)
        // The trust anchors before anything is created: a wrong path stops here, naming the
        // key, not after the CA was made.
        try GateOptions.checkTrust(configuration)
        let operationalLog = try GateOptions.bootstrapLogging(format: format, level: level)
        // Its lines are written by a background thread: whatever it holds is written
        // before the process exits (bounded, as the decision log's).
        defer { operationalLog?.flush(timeout: .seconds(5)) }
        let logger = Logger(label: "pingate")

        let stateDirectory = PathText.stateDirectory(flag: stateDir, file: file)
        let leftovers = StateFiles.removeLeftovers(in: stateDirectory)
        if !leftovers.removed.isEmpty {
            // A write cut off between its temporary file and the rename (kill -9, power
            // cut): the file it replaced is intact, and the temporary copy is garbage.
            logger.notice("removed temporary files left by an interrupted write", metadata: [
                "directory": "\(stateDirectory)", "files": "\(leftovers.removed.joined(separator: ", "))",
            ])
        }
        if !leftovers.failed.isEmpty {
            logger.warning("cannot remove temporary files left by an interrupted write; remove them by hand", metadata: [
                "directory": "\(stateDirectory)", "files": "\(leftovers.failed.joined(separator: ", "))",
            ])
        }
        if !DestinationAddress.isLoopbackListenHost(configuration.listenHost) {
            // Not refused (a gate for a network of CI runners is a use), but said: the gate
            // has no client authentication, so whoever reaches the address may use it.
            logger.warning("listening beyond loopback: every client that can reach this address can use the gate, which has no client authentication; listen on 127.0.0.1 unless that is meant", metadata: [
                "listen": "\(Authority(host: configuration.listenHost, port: configuration.listenPort))",
            ])
        }
        let store = PinListStore(nil)
        let listSource = try makeListSource(file: file, store: store, stateDirectory: stateDirectory, logger: logger)
        if configuration.learning {
            logger.warning("LEARN MODE: learning, not enforcing. Hosts without a pin pass when their chain validates, and what they present is recorded", metadata: [
                "observations": "\(ObservationBook.path(stateDirectory: stateDirectory))", "then": "pingate list propose",
            ])
        } else if listSource == nil {
            logger.warning("no fingerprint list configured (--pins): every CONNECT will be refused")
        }

        // Strict by default: whoever reads ca.key can mint leaves every client of the gate
        // trusts, i.e. intercept exactly the traffic the gate protects. Checked before
        // anything is written: creating the CA first left a fresh ca.key in a world-writable
        // directory and only then refused to start. A CA created here is 0600 in a 0700
        // directory, so nothing is left to check after it in strict mode.
        let strict = strictPermissions ?? file?.strictPermissions ?? true
        let exposedBefore = LocalCA.permissionProblems(stateDirectory: stateDirectory)
        if !exposedBefore.isEmpty && strict {
            throw ConfigurationError("refusing to start: \(LocalCA.CAError.insecurePermissions(exposedBefore)) "
                                     + "(or run with --no-strict-permissions to start with a warning)")
        }
        let (ca, created) = try LocalCA.loadOrCreate(stateDirectory: stateDirectory, allowingExposedDirectory: !strict)
        if !strict {
            let exposed = LocalCA.permissionProblems(stateDirectory: stateDirectory)
            if !exposed.isEmpty {
                logger.warning("the local CA is exposed; starting anyway (--no-strict-permissions)", metadata: [
                    "problems": "\(exposed.joined(separator: "; "))",
                ])
            }
        }
        logger.info(created ? "created local CA" : "loaded local CA", metadata: [
            "certificate": "\(LocalCA.Paths(stateDirectory: stateDirectory).certificate)",
            "subject": "\(ca.certificate.subjectDescription)",
        ])
        if let published = publicDir.map({ PathText.resolve($0) }) ?? file?.publicDir {
            // For apps of other users (the packaged service's state directory is root's only).
            let (paths, _) = try AppTrustFiles.write(ca, to: published, directoryMode: 0o755, copyingCertificate: true)
            logger.info("published the CA for apps", metadata: ["directory": "\(published)", "bundle": "\(paths.bundle)"])
        }

        let admin = try adminConfiguration(file: file)
        let (decisionLogger, decisionLogHandler) = try GateOptions.makeDecisionLogger(decisionLog ?? file?.decisionLog ?? "stderr")
        // Decision lines are written by a background thread: whatever it still holds is
        // written before the process exits, however `run` ends. Bounded, so a stderr
        // that nobody reads any more cannot keep the process from exiting.
        defer { decisionLogHandler?.flush(timeout: .seconds(5)) }
        let (metrics, registry) = AdminServer.makeMetrics()

        // Trap the signals before starting: from here on SIGHUP (whose default action
        // ends the process) is a reload, and a SIGINT/SIGTERM that arrives before the
        // service group has set up its own handlers is still honoured (below).
        let hangups = await UnixSignalsSequence(trapping: .sighup)
        let earlyStops = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let server: PinGateServer
        do {
            server = try await PinGateServer.start(
                configuration: configuration, store: store, ca: ca, logger: logger,
                listSource: listSource, stateDirectory: stateDirectory, metrics: metrics,
                refusalLogCapacity: file?.refusalLogSize ?? 100, decisionLogger: decisionLogger)
        } catch {
            if let message = ListenError.describe(error, host: configuration.listenHost, port: configuration.listenPort,
                                                  flag: "--listen (config: listen)") {
                throw ConfigurationError(message)
            }
            throw error
        }
        var adminServer: AdminServer?
        if let admin {
            do {
                adminServer = try await AdminServer.start(configuration: admin, gate: server, registry: registry, logger: logger)
            } catch {
                try? await server.shutdown()
                throw ConfigurationError(ListenError.describe(error, host: admin.host, port: admin.port, flag: "--admin-listen (config: admin.listen)")
                    ?? "cannot start the admin endpoint on \(admin.host):\(admin.port): \(error)")
            }
        }
        // A group stops its services last-first: the SIGHUP watcher and the updater go
        // first, then the gate, which drains its connections; the admin endpoint stays up
        // through the drain (`/ready` answers 503 draining) and is closed by the gate just
        // before it stops the event loops the endpoint runs on.
        var services: [any Service] = []
        if let adminServer {
            services.append(adminServer)
            server.onStopping { await adminServer.close() }
        }
        services.append(server)
        services.append(HeapTrimmer(statistics: server.statistics))
        if configuration.learning { services.append(LearnModeReminder(logger: logger, recorder: server.observations)) }
        if let updater = server.updater { services.append(updater) }
        let requestLog = server.requestLog
        services.append(ListReloadOnHangup(signals: hangups, updater: server.updater, logger: logger, reopenLogs: {
            // Log rotation: logrotate moves the files, then sends SIGHUP.
            var failures: [String] = []
            do { try await decisionLogHandler?.reopen() } catch { failures.append("\(error)") }
            do { try await requestLog.reopen() } catch { failures.append("\(error)") }
            return failures
        }))
        let group = ServiceGroup(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        // One watcher for the whole run: the group traps SIGTERM and SIGINT too, but only
        // once it runs; this one stops a gate still starting. And Ctrl-C starts the drain,
        // which lets open tunnels finish for up to the drain timeout; a second Ctrl-C closes
        // them at once (a user pressing it again got nothing for 30 s). It is the one sequence
        // for these signals that lives until the end: ending one (libdispatch's signal
        // source cancelled) stopped later SIGINTs from reaching anyone.
        let drainSeconds = (drainTimeout ?? file?.drainTimeoutSeconds) ?? 30
        let signalWatcher = Task {
            var interrupts = 0
            for await signal in earlyStops {
                if signal == .sigint { interrupts += 1 }
                if interrupts >= 2 {
                    let closed = server.closeOpenConnectionsNow()
                    logger.notice("second Ctrl-C: closed the open connections without waiting for them", metadata: ["connections": "\(closed)"])
                    continue
                }
                logger.info("stopping", metadata: ["signal": "\(signal)"])
                if signal == .sigint {
                    logger.notice("stopping: open tunnels may finish for up to the drain timeout; press Ctrl-C again to close them now", metadata: [
                        "drain_timeout_seconds": "\(drainSeconds)",
                    ])
                }
                await group.triggerGracefulShutdown()
            }
        }
        defer { signalWatcher.cancel() }
        // The gate writes its request log out when it shuts down; this covers a group
        // that ends with an error before the gate's own shutdown has run.
        defer { server.requestLog.flush(timeout: .seconds(5)) }
        try await group.run()
    }

    /// Sets up the operational log: swift-log's text lines on stderr, or (`json`) one JSON
    /// object per line there, as the decision log writes them, for log collectors; the JSON
    /// handler is returned, to flush at exit.
    static func bootstrapLogging(format: String, level: Logger.Level) throws -> JSONLineLogHandler? {
        switch format {
        case "text":
            LoggingSystem.bootstrap { label in
                var handler = StreamLogHandler.standardError(label: label)
                handler.logLevel = level
                return handler
            }
            return nil
        case "json":
            var handler = try JSONLineLogHandler(destination: .standardError, purpose: "operational log")
            handler.logLevel = level
            let shared = handler
            LoggingSystem.bootstrap { label in
                var labelled = shared
                labelled.metadata["logger"] = .string(label)
                return labelled
            }
            return handler
        default:
            throw ConfigurationError("--log-format (config: log-format): unknown format \"\(format)\"; give text or json")
        }
    }

    /// The admin endpoint's settings (nil when `off`), its token read and the whole checked.
    func adminConfiguration(file: ConfigFile?) throws -> AdminConfiguration? {
        let adminText = adminListen ?? file?.admin?.listen ?? "127.0.0.1:9090"
        guard adminText != "off" else { return nil }
        var adminConfiguration = AdminConfiguration()
        (adminConfiguration.host, adminConfiguration.port) = try GateOptions.parseHostPort(adminText, key: "--admin-listen (config: admin.listen)")
        if let tokenFile = adminTokenFile.map({ PathText.resolve($0) }) ?? file?.admin?.tokenFile {
            adminConfiguration.token = try AdminConfiguration.readToken(file: tokenFile)
        } else if let token = file?.admin?.token, !token.isEmpty {
            adminConfiguration.token = token
        }
        adminConfiguration.allowedHosts = adminAllowedHosts.isEmpty ? (file?.admin?.allowedHosts ?? []) : adminAllowedHosts
        try adminConfiguration.validate()
        return adminConfiguration
    }

    /// Loads the upstream and report trust anchors as the gate will, so a wrong file is
    /// named with the key that gave it.
    static func checkTrust(_ configuration: GateConfiguration) throws {
        for (trust, key) in [(configuration.upstreamTrust, "--upstream-ca (config: upstream-ca)"), (configuration.reportTrust, "report-ca")] {
            guard case .pemFiles(let files) = trust else { continue }
            for path in files where !FileManager.default.isReadableFile(atPath: path) {
                throw ConfigurationError("\(key): cannot read \(path): \(FileManager.default.fileExists(atPath: path) ? "permission denied" : "no such file"); give a readable PEM file of trust anchors")
            }
            do {
                _ = try TLSContext.client(trustRoots: trust, collectsSessions: false)
            } catch {
                throw ConfigurationError("\(key): \(files.joined(separator: ", ")) is not usable as trust anchors: \(error); give PEM certificates")
            }
        }
    }

    /// `--check`: everything `run` would refuse to start on, without writing a file or
    /// binding a port; returns the summary to print, or throws what is wrong.
    func checkOnly(file: ConfigFile?) throws -> String {
        var lines: [String] = []
        var problems: [String] = []
        // Each check on its own: a failure is one line, and the others still run, so one
        // pass shows everything to fix.
        func attempt(_ check: () throws -> Void) {
            do { try check() } catch { problems.append("\(error)".replacingOccurrences(of: "\n", with: " ")) }
        }
        let checked = config.map { "config \($0)" } ?? "flags"
        var configuration: GateConfiguration?
        attempt { configuration = try gateConfiguration(file: file) }
        attempt { _ = try loggingSettings(file: file) }
        if let configuration {
            lines.append("listen:       \(Authority(host: configuration.listenHost, port: configuration.listenPort))")
        }
        // The trust anchors even when another setting failed: they are read on their own.
        var trust = configuration ?? GateConfiguration()
        if configuration == nil {
            let roots = upstreamCa.isEmpty ? (file?.upstreamCA ?? []) : upstreamCa.map { PathText.resolve($0) }
            trust.upstreamTrust = roots.isEmpty ? .system : .pemFiles(roots)
            if let roots = file?.reportCA, !roots.isEmpty { trust.reportTrust = .pemFiles(roots) }
        }
        attempt {
            try GateOptions.checkTrust(trust)
            lines.append("upstream-ca:  " + { if case .pemFiles(let files) = trust.upstreamTrust { files.joined(separator: ", ") } else { "the system trust store" } }())
        }

        let stateDirectory = PathText.stateDirectory(flag: stateDir, file: file)
        attempt {
            if FileManager.default.fileExists(atPath: LocalCA.Paths(stateDirectory: stateDirectory).certificate) {
                let ca = try LocalCA.load(stateDirectory: stateDirectory)
                let exposed = LocalCA.permissionProblems(stateDirectory: stateDirectory)
                if !exposed.isEmpty && (strictPermissions ?? file?.strictPermissions ?? true) {
                    throw ConfigurationError("it would refuse to start: \(LocalCA.CAError.insecurePermissions(exposed)) (or run with --no-strict-permissions)")
                }
                lines.append("state-dir:    \(stateDirectory) (local CA \(ca.certificate.subjectDescription)\(exposed.isEmpty ? "" : "; exposed, allowed by --no-strict-permissions"))")
            } else {
                var parent = stateDirectory
                while !FileManager.default.fileExists(atPath: parent) && parent != "/" { parent = (parent as NSString).deletingLastPathComponent }
                var isDirectory: ObjCBool = false
                guard FileManager.default.fileExists(atPath: parent, isDirectory: &isDirectory), isDirectory.boolValue else {
                    throw ConfigurationError("state-dir \(stateDirectory): \(parent) is a file, not a directory; choose a directory path")
                }
                guard FileManager.default.isWritableFile(atPath: parent) else {
                    throw ConfigurationError("state-dir \(stateDirectory): no local CA there yet, and \(parent) is not writable to create it")
                }
                // The directory exists but the CA does not: start would refuse it as run does.
                let exposed = LocalCA.permissionProblems(stateDirectory: stateDirectory)
                if !exposed.isEmpty && (strictPermissions ?? file?.strictPermissions ?? true) {
                    throw ConfigurationError("it would refuse to start: \(LocalCA.CAError.insecurePermissions(exposed)) (or run with --no-strict-permissions)")
                }
                lines.append("state-dir:    \(stateDirectory) (the local CA will be created at start)")
            }
        }

        attempt {
            let quiet = Logger(label: "pingate-check") { _ in SwiftLogNoOpLogHandler() }
            let store = PinListStore(nil)
            let source = try makeListSource(file: file, store: store, stateDirectory: stateDirectory, logger: quiet, persisting: false)
            switch source?.location {
            case .file(let path)?:
                let list = store.list
                let now = Date()
                lines.append("pins:         \(path): \(list.map { "\($0.metadata.format.rawValue), \($0.entries.count) pin\($0.entries.count == 1 ? "" : "s") (\($0.entries.filter { $0.isUnexpired(at: now) }.count) unexpired)" + ($0.metadata.sequence.map { ", sequence \($0)" } ?? "") + ($0.metadata.expiresAt.map { ", expires \(ListPrinter.iso($0))" } ?? "") } ?? "-"), verified with \(source?.keys.count ?? 0) key\(source?.keys.count == 1 ? "" : "s")")
                if let reason = list?.expiryReason(at: now) { lines.append("              warning: \(reason): every CONNECT would be refused until a newer list is in force") }
            case .url(let url)?:
                lines.append("pins:         \(url) (fetched at start; keys loaded: \(source?.keys.count ?? 0))")
            case nil:
                lines.append(configuration?.learning == true ? "pins:         none (learn mode)" : "pins:         none: every CONNECT would be refused")
            }
        }

        if let published = publicDir.map({ PathText.resolve($0) }) ?? file?.publicDir {
            attempt {
                var parent = published
                while !FileManager.default.fileExists(atPath: parent) && parent != "/" { parent = (parent as NSString).deletingLastPathComponent }
                guard FileManager.default.isWritableFile(atPath: parent) else {
                    throw ConfigurationError("public-dir \(published): \(parent) is not writable, so the CA cannot be published for apps there")
                }
                if let problem = AppTrustFiles.publicDirectoryProblem(published) { throw ConfigurationError(problem) }
                lines.append("public-dir:   \(published) (ca.pem, ca-bundle.pem and node-proxy.cjs, world-readable, at start)")
            }
        }
        attempt {
            if let admin = try adminConfiguration(file: file) {
                // Both on one address: run would fail to bind the second, blaming "another program".
                if let configuration, admin.port != 0, admin.port == configuration.listenPort,
                   admin.host == configuration.listenHost || [admin.host, configuration.listenHost].contains(where: { ["0.0.0.0", "::"].contains($0) }) {
                    throw ConfigurationError("admin.listen \(Authority(host: admin.host, port: admin.port)) is the gate's own listen address: give the admin endpoint another port (--admin-listen)")
                }
                lines.append("admin:        \(Authority(host: admin.host, port: admin.port))\(admin.token == nil ? "" : " (token set)")")
            } else {
                lines.append("admin:        off")
            }
        }
        for (name, destination) in [("decision-log", decisionLog ?? file?.decisionLog ?? "stderr"), ("request-log", requestLog ?? file?.requestLog ?? "off")]
        where destination != "stderr" && destination != "off" {
            attempt {
                let path = PathText.resolve(destination)
                let writable = FileManager.default.fileExists(atPath: path)
                    ? FileManager.default.isWritableFile(atPath: path)
                    : FileManager.default.isWritableFile(atPath: (path as NSString).deletingLastPathComponent)
                guard writable else { throw ConfigurationError("\(name) \(path) cannot be written (its directory must exist and be writable)") }
                lines.append("\(name):\(String(repeating: " ", count: max(1, 14 - name.count - 1)))\(path)")
            }
        }
        guard problems.isEmpty else {
            throw ConfigurationError("\(checked): \(problems.count) problem\(problems.count == 1 ? "" : "s"), one per line:\n" + problems.joined(separator: "\n"))
        }
        return "pingate: \(config == nil ? "the flags are" : "\(checked) is") valid; the gate would start with:\n" + lines.map { "  " + $0 }.joined(separator: "\n") + "\n"
    }

    /// The log level and format, checked.
    func loggingSettings(file: ConfigFile?) throws -> (Logger.Level, String) {
        let levelText = logLevel ?? file?.logLevel ?? "info"
        guard let level = Logger.Level(rawValue: levelText) else {
            throw ConfigurationError("--log-level (config: log-level): unknown level \"\(levelText)\"; give trace, debug, info, notice, warning or error")
        }
        let format = logFormat ?? file?.logFormat ?? "text"
        guard format == "text" || format == "json" else {
            throw ConfigurationError("--log-format (config: log-format): unknown format \"\(format)\"; give text or json")
        }
        return (level, format)
    }

    /// The gate's settings from the flags and the config file: a flag given overrides
    /// the file's key.
    func gateConfiguration(file: ConfigFile?) throws -> GateConfiguration {
        var configuration = GateConfiguration()

        let listenText = listen ?? file?.listen ?? PathText.defaultListen
        (configuration.listenHost, configuration.listenPort) = try GateOptions.parseHostPort(listenText, key: "--listen (config: listen)")

        let roots = upstreamCa.isEmpty ? (file?.upstreamCA ?? []) : upstreamCa.map { PathText.resolve($0) }
        configuration.upstreamTrust = roots.isEmpty ? .system : .pemFiles(roots)
        configuration.resolveOverrides = try (resolve.isEmpty ? (file?.resolve ?? []) : resolve).map(ResolveOverride.init(parsing:))
        configuration.pinsOnlyHosts = Set(pinsOnly.isEmpty ? (file?.pinsOnly ?? []) : pinsOnly)
        configuration.allowPrivateDestinations = allowPrivateDestinations ?? file?.allowPrivateDestinations ?? false
        configuration.upstreamSessionResumption = upstreamSessionResumption ?? file?.upstreamSessionResumption ?? true
        configuration.opaqueHosts = Set((opaqueHost.isEmpty ? (file?.opaqueHosts ?? []) : opaqueHost).map(HostName.normalize))
        configuration.reportURIs = try (reportUri.isEmpty ? (file?.reportURIs ?? []) : reportUri).map { text in
            guard text.lowercased().hasPrefix("https://"), let url = URL(string: text) else {
                throw ConfigurationError("report URIs must be https:// URLs, got \(text)")
            }
            return url
        }
        if let roots = file?.reportCA, !roots.isEmpty { configuration.reportTrust = .pemFiles(roots) }
        if let parent = upstreamProxy ?? file?.upstreamProxy {
            configuration.upstreamProxy = try ParentProxy(parsing: parent)
        }
        if let idle = file?.idleTimeoutSeconds { configuration.idleTimeout = .seconds(Int64(idle)) }
        if let seconds = clientHandshakeTimeout ?? file?.clientHandshakeTimeoutSeconds {
            try ConfigKeyTable.check(seconds, key: "client-handshake-timeout-seconds", flag: clientHandshakeTimeout != nil ? "--client-handshake-timeout" : nil)
            configuration.clientHandshakeTimeout = .seconds(Int64(seconds))
        }
        if let drain = drainTimeout ?? file?.drainTimeoutSeconds {
            try ConfigKeyTable.check(drain, key: "drain-timeout-seconds", flag: drainTimeout != nil ? "--drain-timeout" : nil)
            configuration.drainTimeout = .seconds(Int64(drain))
        }
        if let days = pinWarningDays ?? file?.pinWarningDays {
            try ConfigKeyTable.check(days, key: "pin-warning-days", flag: pinWarningDays != nil ? "--pin-warning-days" : nil)
            configuration.pinWarningDays = days
        }
        configuration.upstreamPoolEnabled = upstreamPool ?? file?.upstreamPool ?? true
        if let seconds = upstreamPoolIdleTimeout ?? file?.upstreamPoolIdleTimeoutSeconds {
            try ConfigKeyTable.check(seconds, key: "upstream-pool-idle-timeout-seconds", flag: upstreamPoolIdleTimeout != nil ? "--upstream-pool-idle-timeout" : nil)
            configuration.upstreamPoolIdleTimeout = .seconds(Int64(seconds))
        }
        if let count = upstreamPoolMaxPerHost ?? file?.upstreamPoolMaxPerHost {
            try ConfigKeyTable.check(count, key: "upstream-pool-max-per-host", flag: upstreamPoolMaxPerHost != nil ? "--upstream-pool-max-per-host" : nil)
            configuration.upstreamPoolMaximumIdlePerHost = count
        }
        configuration.requestLog = GateOptions.requestLogDestination(requestLog ?? file?.requestLog ?? "off")
        if learn ?? file?.learn ?? false {
            let host = configuration.listenHost
            guard DestinationAddress.isLoopbackListenHost(host) || (learnAllowRemote || file?.learnAllowRemote == true) else {
                throw ConfigurationError("refusing to start: --learn lets any host with a valid chain through, and --listen \(host):\(configuration.listenPort) is not a loopback address, so every client that can reach it would get through too. Listen on 127.0.0.1, or add --learn-allow-remote if that is what you want")
            }
            configuration.learning = true
        }
        configuration.requestLogIncludesQuery = requestLogQuery ?? file?.requestLogQuery ?? false
        if let upstream = file?.upstreamTimeoutSeconds {
            configuration.upstreamConnectTimeout = .seconds(Int64(upstream))
            configuration.upstreamHandshakeTimeout = .seconds(Int64(upstream))
        }
        return configuration
    }

    /// The list source from flags and config. A local file is verified now, and start-up
    /// fails if it does not verify; a URL is fetched by the updater (direct mode), with
    /// the persisted copy in the state directory as the fallback when it cannot be.
    private func makeListSource(file: ConfigFile?, store: PinListStore, stateDirectory: String, logger: Logger,
                                persisting: Bool = true) throws -> PinListSource? {
        let section = file?.pins
        if let flag = pins { try PathText.refuseNonHTTPSListURL(flag, key: "--pins") }
        guard let sourceText = pins.map({ $0.lowercased().hasPrefix("https://") ? $0 : PathText.resolve($0) }) ?? section?.source else {
            return nil
        }
        let keyPaths = pinsKey.isEmpty ? (section?.keys ?? []) : pinsKey.map { PathText.resolveKey($0) }
        let keys: [PublicKey]
        do {
            keys = try PinListFile.loadKeys(keyPaths)
        } catch {
            throw ConfigurationError("refusing to start: \(pinsKey.isEmpty ? "pins.keys" : "--pins-key"): \(error)")
        }
        guard !keys.isEmpty else { throw ConfigurationError("refusing to start: --pins needs at least one --pins-key") }
        let format = try PathText.listFormat(pinsFormat ?? section?.format ?? "auto")
        var source = PinListSource(location: PinListSource.location(parsing: sourceText), format: format, keys: keys)
        if let appName = section?.appName { source.appName = appName }
        if let roots = section?.serverCA, !roots.isEmpty { source.serverTrust = .pemFiles(roots) }
        if let serverPins = section?.serverPins { source.serverPins = Set(serverPins) }
        if let seconds = section?.updateIntervalSeconds { source.schedule.periodicInterval = TimeInterval(seconds) }
        if let seconds = section?.expirationThresholdSeconds { source.schedule.expirationThreshold = TimeInterval(seconds) }
        if let seconds = section?.minimumIntervalSeconds { source.schedule.minimumInterval = TimeInterval(seconds) }
        if let seconds = section?.waitSeconds { source.directWait = .seconds(Int64(seconds)) }
        source.fallbackFile = section?.fallback

        if case .file(let path) = source.location {
            try putPinsFileInForce(path: path, format: format, keys: keys, store: store, stateDirectory: stateDirectory, logger: logger,
                                   persisting: persisting)
        }
        return source
    }

    /// A local list must verify before the gate starts at all, and must not be older than
    /// the list an earlier run's reload persisted (`PinsFileStartup`): the log line says
    /// which list is in force and why.
    private func putPinsFileInForce(path: String, format: PinListFormat?, keys: [PublicKey], store: PinListStore,
                                    stateDirectory: String, logger: Logger, persisting: Bool) throws {
        let now = Date()
        let document: SignedListDocument
        let list: PinList
        do {
            document = try SignedListDocument.read(file: path, format: format)
        } catch {
            throw ConfigurationError("refusing to start: \(error)")
        }
        do {
            list = try document.verify(keys: keys)
        } catch {
            // A draft from `list propose` is a list nobody signed yet: say so, not what a
            // signed format it is not lacks.
            if (try? ListDraft.decode(document.body)) != nil {
                throw ConfigurationError("refusing to start: \(path) is an unsigned list draft (from pingate list propose); sign it first: pingate sign --draft \(path) --key signer.key --format v2 --sequence N > pins.json, and give that to --pins")
            }
            throw ConfigurationError("refusing to start: the fingerprint list \(path) was rejected: \(error)")
        }
        let persistence = PinListPersistence(stateDirectory: stateDirectory)
        let persisted: PinsFileStartup.Persisted
        do {
            persisted = try persistence.load(keys: keys).map { .verified(path: persistence.path, document: $0.0, list: $0.1) } ?? .none
        } catch {
            persisted = .unverifiable(path: persistence.path, error: "\(error)")
        }
        switch PinsFileStartup.decide(path: path, document: document, list: list, persisted: persisted,
                                      stateDirectory: stateDirectory, now: now) {
        case .refuse(let message):
            throw ConfigurationError("refusing to start: \(message)")
        case .useFile(let provenance, let persist):
            switch store.install(document, keys: keys, persistence: persist && persisting ? persistence : nil, now: now, provenance: provenance,
                                 allowingExpired: true) {
            case .success(let list):
                if store.status.lastResult == "persist-failed" {
                    logger.warning("the --pins file is in force but could not be persisted; `pingate list show` shows the older copy",
                                   metadata: ["path": "\(persistence.path)"])
                }
                logger.info("fingerprint list in force", metadata: [
                    "origin": "\(provenance.origin.rawValue)", "why": "\(provenance.reason)",
                    "format": "\(list.metadata.format.rawValue)", "entries": "\(list.entries.count)",
                    "unexpired": "\(list.entries.filter { $0.isUnexpired(at: now) }.count)",
                ])
            case .failure(let rejection):
                throw ConfigurationError("refusing to start: the fingerprint list \(path) was rejected: \(rejection)")
            }
        }
    }

    /// The decision log: JSON lines to stderr or a file, or (off) nowhere; with its
    /// handler, to flush at exit (nil when off).
    static func makeDecisionLogger(_ destination: String) throws -> (Logger, JSONLineLogHandler?) {
        let handler: JSONLineLogHandler
        switch destination {
        case "off":
            return (Logger(label: "pingate.decisions") { _ in SwiftLogNoOpLogHandler() }, nil)
        case "stderr":
            handler = try JSONLineLogHandler(destination: .standardError)
        default:
            handler = try JSONLineLogHandler(destination: .file(PathText.resolve(destination)))
        }
        return (Logger(label: "pingate.decisions") { _ in handler }, handler)
    }

    /// A `--request-log` / `request-log:` value: off, stderr, or a file path.
    static func requestLogDestination(_ text: String) -> RequestLog.Destination {
        switch text {
        case "off": .off
        case "stderr": .standardError
        default: .file(PathText.resolve(text))
        }
    }

    /// Parses `HOST:PORT` or `[IPv6]:PORT` for a listen address (port 0: any free port).
    /// - Parameters:
    ///   - key: the flag and config key the text came from, named in the error.
    static func parseHostPort(_ text: String, key: String? = nil) throws -> (String, Int) {
        do {
            let authority = try Authority(parsing: text, ports: 0...65535)
            return (authority.host, authority.port)
        } catch {
            guard let key else { throw ConfigurationError(error.description) }
            let hint = text.allSatisfy(\.isNumber) ? "; a port alone is not enough: write 127.0.0.1:\(text)" : ""
            throw ConfigurationError("\(key): \(error.description)\(hint)")
        }
    }
}

/// SIGHUP: reopen the log files (rotation), and fetch (or re-read) the list now instead of
/// waiting for the schedule. Ends with the service group.
struct ListReloadOnHangup: Service {
    let signals: UnixSignalsSequence
    let updater: PinListUpdater?
    let logger: Logger
    /// Reopens the decision and request logs' files; returns what could not be reopened.
    let reopenLogs: @Sendable () async -> [String]

    func run() async throws {
        for await _ in signals.cancelOnGracefulShutdown() {
            for failure in await reopenLogs() { logger.error("\(failure)") }
            guard let updater else {
                logger.notice("SIGHUP ignored: no fingerprint list source to re-read")
                continue
            }
            logger.info("list update requested (SIGHUP)")
            _ = updater.updateNow()
        }
    }
}

/// Learn mode is loud: every 10 minutes a warning that the gate is not enforcing, with how
/// many hosts it has seen. Ends with the service group.
struct LearnModeReminder: Service {
    let logger: Logger
    let recorder: ObservationRecorder?
    var interval: Duration = .seconds(600)

    func run() async throws {
        // Ends quietly on shutdown: a Service that throws then ends the whole group badly.
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await Task.sleep(for: interval)
                logger.warning("LEARN MODE: learning, not enforcing", metadata: [
                    "hosts_seen": "\(recorder?.book.hosts.count ?? 0)", "then": "pingate list propose",
                ])
            }
        }
    }
}
