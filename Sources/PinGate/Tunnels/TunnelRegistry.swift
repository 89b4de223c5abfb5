import Foundation
import Logging
import NIOCore
import PinList
import Synchronization

/// The tunnels relaying now, with what they were admitted on, so that a list update can
/// reach live connections: a tunnel whose leaf is revoked, or no longer matches any pin,
/// is closed at once instead of living on until it ends by itself.
final class TunnelRegistry: Sendable {
    struct Tunnel: Sendable {
        let host: String
        let port: Int
        let leaf: CertificateHashes
        let chain: PinPolicy.ChainCheck
        let channel: Channel
    }

    private let tunnels = Mutex<[ObjectIdentifier: Tunnel]>([:])

    /// Tracks `tunnel` until its client channel closes.
    func add(_ tunnel: Tunnel) {
        let key = ObjectIdentifier(tunnel.channel)
        tunnels.withLock { $0[key] = tunnel }
        tunnel.channel.closeFuture.whenComplete { _ in
            _ = self.tunnels.withLock { $0.removeValue(forKey: key) }
        }
    }

    /// The tunnel of `channel` now relays on a new upstream connection (its pooled one
    /// went): list updates are checked against that connection's leaf and chain.
    func replaceUpstream(of channel: Channel, leaf: CertificateHashes, chain: PinPolicy.ChainCheck) {
        let key = ObjectIdentifier(channel)
        tunnels.withLock { tunnels in
            guard let old = tunnels[key] else { return }
            tunnels[key] = Tunnel(host: old.host, port: old.port, leaf: leaf, chain: chain, channel: channel)
        }
    }

    /// How many tunnels are tracked.
    var count: Int { tunnels.withLock { $0.count } }

    /// Re-evaluates every tunnel against `list` and closes those it no longer trusts.
    /// Returns the verdicts of the closed ones.
    @discardableResult
    func enforce(_ list: PinList, policy: any DecisionPolicy, now: Date, logger: Logger) -> [Verdict] {
        let snapshot = tunnels.withLock { Array($0.values) }
        var closed: [Verdict] = []
        for tunnel in snapshot {
            let verdict = policy.verdict(host: tunnel.host, leaf: tunnel.leaf, chain: tunnel.chain, list: list, now: now)
            guard !verdict.isTrusted else { continue }
            closed.append(verdict)
            logger.notice("closing a live tunnel after a list update", metadata: [
                "host": "\(tunnel.host)", "port": "\(tunnel.port)", "reason": "\(verdict.reasonToken)",
                "observed_fingerprint": "\(tunnel.leaf.certificateSHA256)",
            ])
            tunnel.channel.close(promise: nil)
        }
        return closed
    }
}
