import NIOCore
import PinGateNIO
import PinGateTLS
import PinList

/// An upstream connection whose TLS handshake has completed, not yet relaying: its
/// glue holds anything the server sent first until the tunnel is joined.
///
/// A class, not a struct: the state machine, the tunnel's close handlers and the HTTP
/// layer's authority check each keep it for the tunnel's whole life, and a struct this
/// size (the peer summary, the hashes) was copied into each of them: issue 12 counts
/// every byte an idle tunnel holds.
final class UpstreamConnection: Sendable {
    let channel: Channel
    /// Bound to the channel's loop, the only place the glue may be touched.
    let glue: NIOLoopBound<GlueHandler>
    let peer: TLSPeerSummary
    /// The leaf's two hashes, computed once: the verdict, the tunnel registry and the
    /// logs all use them.
    let leaf: CertificateHashes?
    /// The hashes of the chain OpenSSL validated (leaf first), computed once; empty when
    /// validation failed. Depth pins match here.
    let verifiedChain: [CertificateHashes]
    /// How long TCP connect plus TLS handshake took.
    let handshakeDuration: TimeAmount
    /// Keeps the TLS sessions this upstream hands out for resumption; call it only when
    /// the verdict trusted a verified server (nil: resumption is off).
    let keepSessions: (@Sendable () -> Void)?
    /// Drops them instead, when the verdict did not trust the server (nil: resumption is off).
    let discardSessions: (@Sendable () -> Void)?

    init(channel: Channel, glue: NIOLoopBound<GlueHandler>, peer: TLSPeerSummary, leaf: CertificateHashes?,
         verifiedChain: [CertificateHashes], handshakeDuration: TimeAmount, keepSessions: (@Sendable () -> Void)? = nil,
         discardSessions: (@Sendable () -> Void)? = nil) {
        self.channel = channel
        self.glue = glue
        self.peer = peer
        self.leaf = leaf
        self.verifiedChain = verifiedChain
        self.handshakeDuration = handshakeDuration
        self.keepSessions = keepSessions
        self.discardSessions = discardSessions
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
