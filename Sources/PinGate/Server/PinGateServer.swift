import Foundation
import Logging
import NIOCore
import PinGateHTTP
import NIOPosix
import PinGateCA
import PinGateHTTP2
import PinGateNIO
import PinGateTLS
import PinList
import PinListService
import ServiceLifecycle
import Synchronization

/// A running gate: the CONNECT listener and everything its connections share.
///
/// As a `Service` (in a `ServiceGroup`), `run()` lasts until a graceful shutdown, then
/// stops accepting, drains open connections for up to `GateConfiguration.drainTimeout`,
/// closes the rest and stops the event loops.
public final class PinGateServer: Service, Sendable {
    /// The settings it was started with.
    public let configuration: GateConfiguration
    /// The fingerprint list in force (replaceable while running).
    public let store: PinListStore
    /// Tunnel counters.
    public let statistics: GateStatistics
    /// The last refusals.
    public let refusals: RefusalLog
    /// The local CA that signs minted leaves.
    public let ca: LocalCA
    /// When the gate started.
    public let startedAt: Date
    /// The event loops, for servers that live beside the gate (the admin endpoint).
    public var eventLoopGroup: EventLoopGroup { group }
    /// The leaf minter (its counters show cache behaviour).
    public let minter: LeafMinter
    /// The list updater, when the list has a source to refresh from.
    public let updater: PinListUpdater?
    /// The pin-failure reporter, when report URIs are configured.
    let reporter: ViolationReporter?
    /// Where CONNECTs may lead; other listeners of the gate (the admin endpoint) register here.
    let destinationGuard: DestinationGuard
    /// The request log (off unless `configuration.requestLog` says where); flushed when
    /// the gate has shut down.
    public let requestLog: RequestLog
    /// What the connections share (the pool among it).
    private let environment: GateEnvironment
    private let group: MultiThreadedEventLoopGroup
    private let listener: Channel
    private let connections: ConnectionTracker
    private let logger: Logger
    private let shutdownState = Mutex(ShutdownState.running)
    private let drainingState = Mutex(false)
    private let stoppingHooks = Mutex<[@Sendable () async -> Void]>([])

    /// True from the start of a graceful shutdown: the gate accepts no new connections and
    /// lets the open ones finish (`/ready` says so with a 503).
    public var isDraining: Bool { drainingState.withLock { $0 } }

    /// Runs `hook` when the gate has drained, just before it stops its event loops: for
    /// whatever else runs on them (the admin endpoint), so it can stay up for the drain.
    public func onStopping(_ hook: @escaping @Sendable () async -> Void) {
        stoppingHooks.withLock { $0.append(hook) }
    }

    /// Where the one shutdown is; callers that come while it runs wait for its result.
    private enum ShutdownState {
        case running
        case stopping(waiters: [CheckedContinuation<Void, Error>])
        case stopped(Result<Void, Error>)
    }

    private init(configuration: GateConfiguration, store: PinListStore, statistics: GateStatistics, refusals: RefusalLog,
                 ca: LocalCA, minter: LeafMinter, updater: PinListUpdater?, reporter: ViolationReporter?,
                 destinationGuard: DestinationGuard, requestLog: RequestLog, environment: GateEnvironment, group: MultiThreadedEventLoopGroup, listener: Channel, connections: ConnectionTracker, logger: Logger,
                 startedAt: Date) {
        self.configuration = configuration
        self.store = store
        self.statistics = statistics
        self.refusals = refusals
        self.ca = ca
        self.startedAt = startedAt
        self.minter = minter
        self.updater = updater
        self.reporter = reporter
        self.destinationGuard = destinationGuard
        self.requestLog = requestLog
        self.environment = environment
        self.group = group
        self.listener = listener
        self.connections = connections
        self.logger = logger
    }

    /// Starts listening. The upstream trust roots are loaded now, so a bad `--upstream-ca`
    /// fails here rather than on the first CONNECT.
    ///
    /// With a `listSource`, an updater keeps the list fresh (persisting it in
    /// `stateDirectory` when given); a list update also re-checks the live tunnels and
    /// closes those the new list no longer trusts.
    public static func start(
        configuration: GateConfiguration,
        store: PinListStore,
        ca: LocalCA,
        logger: Logger,
        listSource: PinListSource? = nil,
        stateDirectory: String? = nil,
        metrics: GateMetrics = .discarding,
        refusalLogCapacity: Int = 100,
        decisionLogger: Logger? = nil,
        decisionPolicy: (any DecisionPolicy)? = nil,
        now: @escaping @Sendable () -> Date = { Date() }
    ) async throws -> PinGateServer {
        // A write to a peer that has gone away must be an error, not the end of the process.
        signal(SIGPIPE, SIG_IGN)
        // What admitted hosts present is recorded in every mode (learn mode proposes a
        // first list from it, an enforcing gate the next one: `list propose --next`). The
        // record is read (or refused) before anything that would need undoing.
        var observations: ObservationRecorder?
        if let stateDirectory {
            observations = try ObservationRecorder(stateDirectory: stateDirectory, logger: logger,
                                                   writeDelay: configuration.learning ? .milliseconds(500) : .seconds(10))
        } else if configuration.learning {
            throw ConfigurationError("learn mode needs a state directory to record what it sees in")
        }
        let upstreamContext = try TLSContext.client(trustRoots: configuration.upstreamTrust,
                                                    collectsSessions: configuration.upstreamSessionResumption)
        let upstreamSessions = configuration.upstreamSessionResumption ? TLSSessionCache() : nil
        // Opened before the event loops exist: a log file that cannot be opened stops
        // start-up with nothing to undo.
        let requestLog = try RequestLog(destination: configuration.requestLog, includeQuery: configuration.requestLogIncludesQuery)
        let statistics = GateStatistics(metrics: metrics, pinWarningDays: configuration.pinWarningDays)
        let refusals = RefusalLog(capacity: refusalLogCapacity)
        let minter = try LeafMinter(ca: ca)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: max(1, configuration.eventLoopThreads))
        let policy: any DecisionPolicy = decisionPolicy ?? (configuration.learning
            ? LearningDecisionPolicy(pinsOnlyHosts: configuration.pinsOnlyHosts)
            : PinningDecisionPolicy(pinsOnlyHosts: configuration.pinsOnlyHosts))
        // Only CONNECT destinations are guarded: the list server and report collectors are
        // the operator's own configuration.
        let destinationGuard = DestinationGuard(
            allowPrivate: configuration.allowPrivateDestinations || !policy.refusesInternalDestinations)
        var upstreamSettings = configuration.upstreamClientSettings
        upstreamSettings.destinationGuard = destinationGuard
        let connector = UpstreamConnector(client: TLSClientConnector(
            settings: upstreamSettings, context: upstreamContext, sessionCache: upstreamSessions,
            onConnected: { statistics.upstreamConnectionOpened() }))
        let tunnels = TunnelRegistry()
        let connections = ConnectionTracker()
        // Only request-aware tunnels pool: a byte relay (opaque hosts, the harness's
        // attacker) leaves its connection in an unknown state.
        let pool = configuration.upstreamPoolEnabled && policy.inspectsRequests
            ? UpstreamPool(settings: .init(idleTimeout: configuration.upstreamPoolIdleTimeout,
                                           maximumIdlePerKey: configuration.upstreamPoolMaximumIdlePerHost),
                           eventLoops: Array(group.makeIterator()), metrics: metrics, logger: logger, now: now)
            : nil
        var updater: PinListUpdater?
        do {
            if let listSource {
                let listConnector = TLSClientConnector(
                    settings: configuration.upstreamClientSettings, context: try TLSContext.client(trustRoots: listSource.serverTrust))
                updater = PinListUpdater(
                    source: listSource, store: store, persistence: stateDirectory.map { PinListPersistence(stateDirectory: $0) },
                    connector: listConnector, eventLoop: group.next(), logger: logger, now: now)
            }
            store.onInstall { list in
                // Any new list (an update, a revocation, a key rotation) ends every kept
                // session: each was decided under the list it replaces.
                upstreamSessions?.removeAll()
                metrics.listInForce(entries: list.entries.count, earliestExpiry: list.earliestExpiry(after: now()))
                for verdict in tunnels.enforce(list, policy: policy, now: now(), logger: logger) {
                    statistics.tunnelClosedByUpdate(DecisionReason(verdict))
                }
                // Idle pooled connections too: each is kept only if the new list trusts it.
                pool?.listInstalled(generation: store.generation) { key, connection in
                    policy.verdict(host: key.host, leaf: connection.leaf, chain: ConnectHandler.chainCheck(connection),
                                   list: list, now: now()).isTrusted
                }
            }
            store.onResult { metrics.listUpdate(result: $0) }
            // Updates that happened before the gate existed (a local list verified at start-up).
            for (result, count) in store.status.updatesByResult { metrics.listUpdate(result: result, count: count) }
            if let list = store.list {
                metrics.listInForce(entries: list.entries.count, earliestExpiry: list.earliestExpiry(after: now()))
            }
            var reporter: ViolationReporter?
            if !configuration.reportURIs.isEmpty {
                let reportConnector = TLSClientConnector(
                    settings: configuration.upstreamClientSettings, context: try TLSContext.client(trustRoots: configuration.reportTrust))
                reporter = ViolationReporter(
                    uris: configuration.reportURIs,
                    client: HTTPSClient(connector: reportConnector, serverPins: [], timeout: .seconds(10), maximumBodyBytes: 64 * 1024),
                    eventLoopGroup: group, logger: logger)
            }
            let environment = GateEnvironment(
                configuration: configuration, store: store, decisionPolicy: policy, minter: minter, connector: connector,
                statistics: statistics, tunnels: tunnels, reporter: reporter, updater: updater, pool: pool,
                refusals: refusals, observations: observations, decisionLogger: decisionLogger ?? logger, requestLog: requestLog,
                logger: logger, now: now)
            try await updater?.start().get()
            let listener = try await ServerBootstrap(group: group)
                .serverChannelOption(.backlog, value: 256)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                // Out of descriptors (EMFILE/ENFILE), accept fails while the listener stays
                // readable, and without a back-off the event loop retries at once. The
                // connection cap below keeps the gate off its limit; this covers a limit
                // reached some other way (NIO's own remedy, which this bootstrap path does
                // not add by itself): accepting pauses and connections wait in the backlog.
                .serverChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(AcceptBackoffHandler())
                    }
                }
                .childChannelInitializer { channel in
                    // The accepted channel's options are set here, synchronously, before it
                    // is registered (nothing is read before): as `childChannelOption`s NIO
                    // applies each through a chain of futures, 15 allocations per connection.
                    do {
                        // Every socket channel has synchronous options; one without them is
                        // refused rather than served without these.
                        guard let options = channel.syncOptions else { throw ChannelError.operationUnsupported }
                        try options.setOption(.allowRemoteHalfClosure, value: true)
                        try options.setOption(.tcpOption(.tcp_nodelay), value: 1)
                        try options.setOption(.recvAllocator, value: ReceiveBuffers.allocator)
                    } catch {
                        return channel.eventLoop.makeFailedFuture(error)
                    }
                    switch connections.add(channel, cap: DescriptorBudget.connectionCap()) {
                    case .added:
                        break
                    case .full:
                        environment.statistics.recordDecision(.overCapacity)
                        return channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandler(OverCapacityHandler())
                        }
                    case .closing:
                        // Accepted while the listener was closing for a shutdown.
                        return channel.close()
                    }
                    return channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(ConnectHandler(environment: environment))
                    }
                }
                .bind(host: configuration.listenHost, port: configuration.listenPort)
                .get()
            // Before the first CONNECT can arrive is too late (the listener is open), but
            // this runs before the gate is announced; a CONNECT in between to the gate
            // itself would fail on its own, by the head timeout, not loop.
            if let bound = listener.localAddress { destinationGuard.addOwnListener(bound) }
            if let expired = store.list?.expiryReason(at: now()) {
                // The list verified, so nothing stopped start-up (an expired list of either
                // format starts a refusing gate, not a restart loop with the admin endpoint
                // down); but a gate that will refuse everything says so, loudly.
                logger.error("the fingerprint list in force has expired: every CONNECT is refused with 503 list-expired until a renewed list is in force (sign a new one; SIGHUP re-reads a --pins file)", metadata: [
                    "detail": "\(expired)",
                ])
            }
            logger.info("pingate listening", metadata: [
                "address": "\(configuration.listenHost):\(listener.localAddress?.port ?? 0)",
                "openssl": "\(OpenSSLVersion.text)",
                "nghttp2": "\(Self.nghttp2Version)",
            ])
            return PinGateServer(configuration: configuration, store: store, statistics: statistics, refusals: refusals,
                                 ca: ca, minter: minter, updater: updater, reporter: reporter, destinationGuard: destinationGuard,
                                 requestLog: requestLog, environment: environment,
                                 group: group, listener: listener,
                                 connections: connections, logger: logger, startedAt: now())
        } catch {
            updater?.stop()
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// Records another listener of this gate (its admin endpoint): CONNECTs to it are
    /// refused as `destination-not-allowed` instead of looping.
    public func addOwnListener(_ address: SocketAddress) {
        destinationGuard.addOwnListener(address)
    }

    /// The bound address (its port is the real one when 0 was asked for).
    public var localAddress: SocketAddress? { listener.localAddress }

    /// The bound port.
    public var port: Int { listener.localAddress?.port ?? 0 }

    /// Whether the listener still accepts connections (false once it closed: after a
    /// shutdown, or `stopListening()`).
    public var isListening: Bool { listener.isActive }

    /// How many client connections are open (any state, not only relaying tunnels).
    public var openConnections: Int { connections.count }

    /// Waits until the listener closes.
    public func waitUntilClosed() async throws {
        try await listener.closeFuture.get()
    }

    /// Stops accepting connections; `waitUntilClosed()` returns after this. Safe from any
    /// thread and more than once.
    public func stopListening() {
        listener.close(promise: nil)
    }

    /// Serves until a graceful shutdown (or until the listener is closed otherwise), then
    /// drains for up to `configuration.drainTimeout` and shuts down. Cancellation skips
    /// the drain: connections are closed at once.
    public func run() async throws {
        try await withTaskCancellationOrGracefulShutdownHandler {
            try await self.waitUntilClosed()
        } onCancelOrGracefulShutdown: {
            // Stop accepting at once; the drain below waits for the open connections.
            self.stopListening()
        }
        try await shutdown(drainTimeout: Task.isCancelled ? .zero : configuration.drainTimeout)
    }

    /// Cuts a drain short (a second Ctrl-C): closes every open connection now. The drain then
    /// ends as it does at its timeout, and the shutdown goes on. Returns how many were closed.
    @discardableResult
    public func closeOpenConnectionsNow() -> Int {
        let closed = connections.closeAll()
        connections.endDrain()
        return closed
    }

    /// Stops listening, closes every connection and stops the event loops: `shutdown()`
    /// with no drain. Only the first call does the work; later calls wait for it.
    public func shutdown() async throws {
        try await shutdown(drainTimeout: .zero)
    }

    /// Stops listening at once, lets open connections finish for up to `drainTimeout`,
    /// closes those still open, then stops the updater's work and the event loops. Only
    /// the first call does the work; later calls wait for it to finish.
    public func shutdown(drainTimeout: TimeAmount) async throws {
        let first = shutdownState.withLock { state -> Bool in
            guard case .running = state else { return false }
            state = .stopping(waiters: [])
            return true
        }
        guard first else {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, Error>) in
                let finished = shutdownState.withLock { state -> Result<Void, Error>? in
                    switch state {
                    case .running: return .success(()) // cannot happen: only the first call starts it
                    case .stopping(let waiters):
                        state = .stopping(waiters: waiters + [continuation])
                        return nil
                    case .stopped(let result): return result
                    }
                }
                if let finished { continuation.resume(with: finished) }
            }
            return
        }
        let result: Result<Void, Error>
        do {
            try await drainAndStop(drainTimeout: drainTimeout)
            result = .success(())
        } catch {
            result = .failure(error)
        }
        let waiters = shutdownState.withLock { state -> [CheckedContinuation<Void, Error>] in
            defer { state = .stopped(result) }
            if case .stopping(let waiters) = state { return waiters }
            return []
        }
        waiters.forEach { $0.resume(with: result) }
        try result.get()
    }

    private func drainAndStop(drainTimeout: TimeAmount) async throws {
        drainingState.withLock { $0 = true }
        // Nothing is pooled from now on, and what waits idle goes at once.
        environment.beginShutdown()
        environment.pool?.closeAll()
        updater?.stop()
        try? await listener.close()
        // Every client hears it in its protocol's terms (HTTP/2 GOAWAY, HTTP/1.1
        // `Connection: close`), and what it has in flight finishes within the drain.
        if drainTimeout > .zero { connections.announce(TunnelDrainEvent()) }
        let open = connections.count
        if open > 0, drainTimeout > .zero {
            logger.info("draining open connections", metadata: [
                "connections": "\(open)", "timeout_seconds": "\(Double(drainTimeout.nanoseconds) / 1e9)",
            ])
        }
        let eventLoop = group.next()
        let drained = try await connections.drain(on: eventLoop, timeout: drainTimeout).get()
        if !drained {
            let closed = connections.closeAll()
            if drainTimeout > .zero {
                logger.notice("drain timeout: closing the connections still open", metadata: ["connections": "\(closed)"])
            }
            // Closing is quick; this bounds it anyway so a stuck close cannot hang the exit.
            _ = try await connections.drain(on: eventLoop, timeout: .seconds(2)).get()
        }
        // What runs on these event loops beside the gate (the admin endpoint, which answers
        // `/ready` with 503 while the drain lasts) stops now, before the loops do.
        for hook in stoppingHooks.withLock({ $0 }) { await hook() }
        // Learn mode: what was seen last is on disk before the process ends.
        environment.observations?.flush()
        // Once the event loops are stopped no request can be logged any more: what is
        // queued then is all there will be, and it is written before this returns.
        do {
            try await group.shutdownGracefully()
        } catch {
            await requestLog.waitUntilWritten()
            throw error
        }
        await requestLog.waitUntilWritten()
    }

    /// Learn mode's record of what each admitted host presented; nil when enforcing.
    public var observations: ObservationRecorder? { environment.observations }

    /// What the upstream pool holds and has done; nil when pooling is off.
    public var upstreamPool: UpstreamPoolStatus? {
        guard let pool = environment.pool else { return nil }
        let counters = pool.counters
        return UpstreamPoolStatus(
            idle: pool.idleCount, idleByHost: pool.idleByHost, hits: counters.hits, misses: counters.misses,
            waitedForDial: counters.waitedForDial, parked: counters.parked,
            notPooled: Dictionary(uniqueKeysWithValues: counters.notPooled.map { ($0.key.rawValue, $0.value) }),
            closed: Dictionary(uniqueKeysWithValues: counters.departed.map { ($0.key.rawValue, $0.value) }),
            idleTimeoutSeconds: Double(pool.settings.idleTimeout.nanoseconds) / 1e9, maximumIdlePerHost: pool.settings.maximumIdlePerKey)
    }

    /// What the gate learned of each origin's keep-alive timeout.
    var keepAlive: OriginKeepAlive { environment.keepAlive }

    /// The pool's idle timers (pending, and ever scheduled, cancelled, fired); nil when
    /// pooling is off. For tests: every timer is pending, cancelled or fired, and none is
    /// left pending for a stay that ended.
    var upstreamPoolIdleTimers: (pending: Int, scheduled: Int, cancelled: Int, fired: Int)? {
        environment.pool?.idleTimerCounts
    }

    /// The version of the linked libnghttp2.
    public static var nghttp2Version: String { HTTP2Session.libraryVersion }
}
