import Foundation
import Logging
import PinGateCA
import PinGateNIO
import PinList
import PinListService
import Synchronization

/// What every connection of one gate shares: settings, the list in force, the policy,
/// the leaf minter, the upstream connector, the counters, the logger and the clock.
///
/// A class, so that it is shared: as a struct (the settings alone are several hundred
/// bytes) every connection handler and every closure that captured it held its own copy,
/// for as long as the tunnel stayed open (issue 12: about 1.5 KiB of every idle tunnel).
final class GateEnvironment: Sendable {
    let configuration: GateConfiguration
    let store: PinListStore
    /// What is decided for each CONNECT (the pinning gate, or the harness's attacker).
    let decisionPolicy: any DecisionPolicy
    let minter: LeafMinter
    let connector: any UpstreamDialer
    let statistics: GateStatistics
    let tunnels: TunnelRegistry
    /// Present when report URIs are configured.
    let reporter: ViolationReporter?
    /// Present when the list is refreshed from a source; CONNECTs then wait for it.
    let updater: PinListUpdater?
    /// Idle verified upstream connections for later tunnels; nil when pooling is off.
    let pool: UpstreamPool?
    /// What is learned of each origin's keep-alive timeout (the pool's when it pools).
    let keepAlive: OriginKeepAlive
    /// The last refusals, for the admin endpoint.
    let refusals: RefusalLog
    /// Learn mode's record of what each admitted host presented; nil when enforcing.
    let observations: ObservationRecorder?
    /// Where the one-line-per-CONNECT decision log goes.
    let decisionLogger: Logger
    /// Where the one-line-per-HTTP-request log goes (off unless configured).
    let requestLog: RequestLog
    let logger: Logger
    /// Set when a shutdown begins: nothing goes to the pool from then on.
    private let shuttingDown = Atomic<Bool>(false)
    /// The clock: injectable so expiry behaviour is testable at fixed times.
    let now: @Sendable () -> Date

    init(configuration: GateConfiguration, store: PinListStore, decisionPolicy: any DecisionPolicy, minter: LeafMinter,
         connector: any UpstreamDialer, statistics: GateStatistics, tunnels: TunnelRegistry, reporter: ViolationReporter?,
         updater: PinListUpdater?, pool: UpstreamPool? = nil, refusals: RefusalLog, observations: ObservationRecorder? = nil, decisionLogger: Logger, requestLog: RequestLog, logger: Logger,
         now: @escaping @Sendable () -> Date) {
        self.configuration = configuration
        self.store = store
        self.decisionPolicy = decisionPolicy
        self.minter = minter
        self.connector = connector
        self.statistics = statistics
        self.tunnels = tunnels
        self.reporter = reporter
        self.updater = updater
        self.pool = pool
        self.keepAlive = pool?.keepAlive ?? OriginKeepAlive()
        self.refusals = refusals
        self.observations = observations
        self.decisionLogger = decisionLogger
        self.requestLog = requestLog
        self.logger = logger
        self.now = now
    }

    /// True once a shutdown began.
    func isShuttingDown() -> Bool { shuttingDown.load(ordering: .acquiring) }

    /// Marks the start of a shutdown.
    func beginShutdown() { shuttingDown.store(true, ordering: .releasing) }
}
