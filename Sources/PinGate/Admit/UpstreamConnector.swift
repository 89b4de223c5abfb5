import Foundation
import NIOCore
import PinGateHTTP
import PinGateNIO
import PinGateTLS
import PinList

/// An upstream connection whose TLS handshake has completed, not yet relaying: its
/// glue holds anything the server sent first until the tunnel is joined. Or one kept from
/// an earlier tunnel (`fromPool`), its HTTP side parked in its pipeline.
///
/// A class, not a struct: the state machine, the tunnel's close handlers and the HTTP
/// layer's authority check each keep it for the tunnel's whole life, and a struct this
/// size (the peer summary, the hashes) was copied into each of them: issue 12 counts
/// every byte an idle tunnel holds.
final class UpstreamConnection: Sendable {
    let channel: Channel
    /// What the connection brings to the join: the unpaired glue of a fresh one, or the
    /// parked HTTP side of a pooled one. Bound to the channel's loop, the only place either
    /// may be touched.
    let leg: NIOLoopBound<RequestAwareTunnel.UpstreamLeg>
    /// True when it was taken from the pool: no handshake was made for this tunnel.
    let fromPool: Bool
    let peer: TLSPeerSummary
    /// The leaf's two hashes, computed once: the verdict, the tunnel registry and the
    /// logs all use them.
    let leaf: CertificateHashes?
    /// The hashes of the chain OpenSSL validated (leaf first), computed once; empty when
    /// validation failed. Depth pins match here.
    let verifiedChain: [CertificateHashes]
    /// How long TCP connect plus TLS handshake took.
    let handshakeDuration: TimeAmount
    /// When the first certificate of the verified chain (the leaf's, when OpenSSL built
    /// none) expires: the pool admits no CONNECT on the connection from then on. Read once,
    /// at the handshake.
    let chainValidUntil: Date?
    /// Keeps the TLS sessions this upstream hands out for resumption; call it only when
    /// the verdict trusted a verified server (nil: resumption is off).
    let keepSessions: (@Sendable () -> Void)?
    /// Drops them instead, when the verdict did not trust the server (nil: resumption is off).
    let discardSessions: (@Sendable () -> Void)?

    init(channel: Channel, glue: NIOLoopBound<GlueHandler>, peer: TLSPeerSummary, leaf: CertificateHashes?,
         verifiedChain: [CertificateHashes], handshakeDuration: TimeAmount, keepSessions: (@Sendable () -> Void)? = nil,
         discardSessions: (@Sendable () -> Void)? = nil) {
        self.channel = channel
        self.leg = NIOLoopBound(.fresh(glue.value), eventLoop: channel.eventLoop)
        self.fromPool = false
        self.peer = peer
        self.leaf = leaf
        self.verifiedChain = verifiedChain
        self.handshakeDuration = handshakeDuration
        self.keepSessions = keepSessions
        self.discardSessions = discardSessions
        let certificates = peer.verifiedChain.isEmpty ? (peer.leaf.map { [$0] } ?? []) : peer.verifiedChain
        self.chainValidUntil = certificates.compactMap(\.notAfter).min()
    }

    /// A connection with `leg` as it is (no sessions to keep: a pooled connection's were
    /// dealt with on its first verdict).
    init(channel: Channel, leg: NIOLoopBound<RequestAwareTunnel.UpstreamLeg>, fromPool: Bool, peer: TLSPeerSummary,
         leaf: CertificateHashes?, verifiedChain: [CertificateHashes], handshakeDuration: TimeAmount, chainValidUntil: Date?) {
        self.channel = channel
        self.leg = leg
        self.fromPool = fromPool
        self.peer = peer
        self.leaf = leaf
        self.verifiedChain = verifiedChain
        self.handshakeDuration = handshakeDuration
        self.chainValidUntil = chainValidUntil
        self.keepSessions = nil
        self.discardSessions = nil
    }
}

extension UpstreamConnection {
    /// `connection`'s facts (peer, leaf, verified chain) with its HTTP side parked: what the
    /// pool keeps and hands to the next tunnel. Called on the connection's event loop.
    convenience init(pooling connection: UpstreamConnection, side: PooledUpstreamSide) {
        self.init(channel: connection.channel, leg: NIOLoopBound(.pooled(side), eventLoop: connection.channel.eventLoop),
                  fromPool: true, peer: connection.peer, leaf: connection.leaf, verifiedChain: connection.verifiedChain,
                  handshakeDuration: .zero, chainValidUntil: connection.chainValidUntil)
    }

    /// The unpaired glue of a fresh connection (a byte relay joins it); nil for a pooled one.
    var glue: GlueHandler? {
        if case .fresh(let glue) = leg.value { return glue }
        return nil
    }
}

extension UpstreamConnection: Equatable {
    /// The same connection: the same channel (the rest is what its handshake produced).
    static func == (lhs: UpstreamConnection, rhs: UpstreamConnection) -> Bool {
        lhs.channel === rhs.channel
    }
}

/// Opens tunnels' upstream legs. The gate uses `UpstreamConnector`; the handler's
/// socket-free tests hand it upstreams that are embedded channels.
protocol UpstreamDialer: Sendable {
    /// TLS to `host:port` offering `alpnOffer`, with an unpaired glue counting into
    /// `countRelayed` behind it; fails with a `TLSClientError`.
    func connect(host: String, port: Int, alpnOffer: [String]?, on eventLoop: EventLoop,
                 countRelayed: @escaping GlueHandler.ByteCounter) -> EventLoopFuture<UpstreamConnection>
}

/// Opens a tunnel's upstream leg: TLS through the NIO binding's client connector, then
/// an unpaired glue behind it that buffers what the server sends first. Nothing but the
/// handshake is sent until the tunnel is joined.
struct UpstreamConnector: UpstreamDialer {
    let client: TLSClientConnector

    /// TLS to `host:port` offering `alpnOffer`; fails with a `TLSClientError`.
    func connect(host: String, port: Int, alpnOffer: [String]?, on eventLoop: EventLoop,
                 countRelayed: @escaping GlueHandler.ByteCounter) -> EventLoopFuture<UpstreamConnection> {
        client.connect(host: host, port: port, alpnOffer: alpnOffer, on: eventLoop) {
            [GlueHandler(countRelayed: countRelayed)]
        }.flatMapThrowing { client in
            let glue = try client.channel.pipeline.syncOperations.handler(type: GlueHandler.self)
            let leaf = client.peer.leaf.map(CertificateHashes.init)
            return UpstreamConnection(channel: client.channel, glue: NIOLoopBound(glue, eventLoop: eventLoop),
                                      peer: client.peer, leaf: leaf, verifiedChain: client.peer.verifiedChain.map(CertificateHashes.init),
                                      handshakeDuration: client.handshakeDuration, keepSessions: client.keepSessions,
                                      discardSessions: client.discardSessions)
        }
    }
}
