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

    /// True in learn mode: CONNECTs are decided without waiting for a usable list, and an
    /// expired list refuses nothing (`LearningDecisionPolicy`).
    var learns: Bool { get }
}

extension DecisionPolicy {
    /// The gate's rule by default.
    public var refusesInternalDestinations: Bool { true }

    /// Enforcing, by default.
    public var learns: Bool { false }
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

/// Learn mode (`run --learn`): the pinning policy for every host the list names, and for
/// every host it never names a pass when, and only when, its chain validated against the
/// upstream trust and its certificate names the host (`learned`). A host the list names
/// is never learned around: with its pins expired, or the whole list stale, it is refused
/// as enforcing would refuse it. A certificate the list revokes is refused whatever the
/// host, even in a stale list.
public struct LearningDecisionPolicy: DecisionPolicy {
    /// The policy pinned hosts are held to.
    public let pinning: PinningDecisionPolicy

    /// A learning policy whose pinned hosts follow `pinsOnlyHosts` as when enforcing.
    public init(pinsOnlyHosts: Set<String>) {
        pinning = PinningDecisionPolicy(pinsOnlyHosts: pinsOnlyHosts)
    }

    /// For a host the list names but has no usable pin for (its pins expired, or the list
    /// is stale): `empty`, as enforcing. Every other host is dialled, and decided on what
    /// it presents.
    public func refusalBeforeConnecting(host: String, port: Int, list: PinList?, now: Date) -> Verdict? {
        guard let list, list.names(HostName.normalize(host)) else { return nil }
        return pinning.refusalBeforeConnecting(host: host, port: port, list: list, now: now)
    }

    /// The configured offer, unchanged.
    public func upstreamALPNOffer(configured: [String]) -> [String] { configured }

    /// The pin policy's verdict for a pinned host; for any other, `learned` on a validated
    /// chain and `chain-invalid` on anything else.
    public func verdict(host: String, leaf: CertificateHashes?, chain: PinPolicy.ChainCheck, list: PinList?, now: Date) -> Verdict {
        if let list, let leaf, list.revokes(leaf) { return .revoked(observed: leaf.certificateSHA256) }
        let pinned = pinning.verdict(host: host, leaf: leaf, chain: chain, list: list, now: now)
        guard case .empty = pinned else { return pinned }
        // Named by the list, with no usable pin: refused, never learned.
        if let list, list.names(HostName.normalize(host)) { return .empty }
        guard let leaf else { return .chainInvalid(reason: "the upstream presented no certificate", observed: "") }
        guard chain.valid else { return .chainInvalid(reason: chain.reason, observed: leaf.certificateSHA256) }
        return .learned(observed: leaf.certificateSHA256)
    }

    /// None, as when enforcing.
    public func makeTunnelInspectors(target: String) -> [ChannelHandler] { [] }

    /// True: requests inside a learned tunnel are bound to its host as in any other.
    public var inspectsRequests: Bool { true }

    /// True.
    public var learns: Bool { true }
}
