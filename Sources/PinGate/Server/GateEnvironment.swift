import Foundation
import Logging
import PinGateCA
import PinGateNIO
import PinList
import PinListService

/// What every connection of one gate shares: settings, the list in force, the policy,
/// the leaf minter, the upstream connector, the counters, the logger and the clock.
struct GateEnvironment: Sendable {
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
    /// The last refusals, for the admin endpoint.
    let refusals: RefusalLog
    /// Where the one-line-per-CONNECT decision log goes.
    let decisionLogger: Logger
    /// Where the one-line-per-HTTP-request log goes (off unless configured).
    let requestLog: RequestLog
    let logger: Logger
    /// The clock: injectable so expiry behaviour is testable at fixed times.
    let now: @Sendable () -> Date
}
