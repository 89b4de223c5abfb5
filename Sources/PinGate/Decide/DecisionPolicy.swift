import Foundation
import NIOCore
import PinList

/// What a gate decides for each CONNECT. The core asks it three questions and acts on
/// the answers; it never asks what kind of gate it is. The pinning gate runs with
/// `PinningDecisionPolicy`; the MITM harness's attacker is the same core with a policy
/// that trusts everything and records what it reads.
public protocol DecisionPolicy: Sendable {
    /// Asked before any connection is made. A verdict here refuses the CONNECT without
    /// touching the network (deny by default); nil lets the gate connect upstream.
    func refusalBeforeConnecting(host: String, port: Int, list: PinList?, now: Date) -> Verdict?

    /// The ALPN protocols to offer upstream, given the configured offer.
    func upstreamALPNOffer(configured: [String]) -> [String]

    /// The verdict on an upstream whose handshake completed: its leaf's hashes (nil when
    /// it sent none) and whether OpenSSL validated its chain and host name.
    func verdict(host: String, leaf: CertificateHashes?, chain: PinPolicy.ChainCheck, list: PinList?, now: Date) -> Verdict

    /// Handlers to put between the client's TLS and the relay of an admitted tunnel to
    /// `target` (`host:port`). Called on the connection's event loop.
    func makeTunnelInspectors(target: String) -> [ChannelHandler]

    /// True when admitted tunnels carry HTTP that the gate reads and checks request by
    /// request (the pinning gate); false for a byte relay (the harness's attacker, which
    /// records what it reads instead).
    var inspectsRequests: Bool { get }

    /// True when DNS answers that are internal addresses (loopback, private, link-local,
    /// CGNAT, IPv4-mapped) are refused unless the configuration allows them. The gate
    /// protects the network it runs in; the harness's attacker dials what it is asked.
    var refusesInternalDestinations: Bool { get }
}

extension DecisionPolicy {
    /// The gate's rule by default.
    public var refusesInternalDestinations: Bool { true }
}

/// The gate's own policy: a host with no unexpired pin is refused before any connection
/// (403 `empty`); otherwise the pin policy decides on the upstream's leaf and chain.
public struct PinningDecisionPolicy: DecisionPolicy {
    /// The pin policy (pins-only hosts, wildcard and report-only rules).
    public let pins: PinPolicy

    /// A policy whose pins alone decide for `pinsOnlyHosts`.
    public init(pinsOnlyHosts: Set<String>) {
        pins = PinPolicy(pinsOnlyHosts: pinsOnlyHosts)
    }

    /// `.empty` when the list has no unexpired pin for `host` (and its signed domain rules
    /// do not let it through unpinned).
    public func refusalBeforeConnecting(host: String, port: Int, list: PinList?, now: Date) -> Verdict? {
        pins.isPinned(host: host, list: list, now: now) ? nil : .empty
    }

    /// The configured offer, unchanged.
    public func upstreamALPNOffer(configured: [String]) -> [String] { configured }

    /// The pin policy's verdict.
    public func verdict(host: String, leaf: CertificateHashes?, chain: PinPolicy.ChainCheck, list: PinList?, now: Date) -> Verdict {
        pins.evaluate(host: host, leaf: leaf, chain: chain, list: list, now: now)
    }

    /// None: the gate's own checks inside a tunnel are its HTTP layer, not inspectors.
    public func makeTunnelInspectors(target: String) -> [ChannelHandler] { [] }

    /// True: every request inside a tunnel is bound to the pinned host.
    public var inspectsRequests: Bool { true }
}
