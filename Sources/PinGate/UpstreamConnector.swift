import NIOCore
import NIOPosix
import PinGateTLS
import PinList

/// An upstream connection whose TLS handshake has completed, not yet relaying: its
/// glue holds anything the server sent first until the tunnel is joined.
struct UpstreamConnection: Sendable {
    let channel: Channel
    /// Bound to the channel's loop, the only place the glue may be touched.
    let glue: NIOLoopBound<GlueHandler>
    let peer: TLSPeerSummary
    /// The leaf's two hashes, computed once: the verdict, the tunnel registry and the
    /// logs all use them.
    let leaf: LeafIdentity?
    /// How long TCP connect plus TLS handshake took.
    let handshakeDuration: TimeAmount
}

/// A TLS client connection after its handshake, with whatever handlers the caller put
/// behind the TLS handler.
struct TLSClientChannel: Sendable {
    let channel: Channel
    let peer: TLSPeerSummary
    let handshakeDuration: TimeAmount
}

/// Why an upstream connection did not come up; each maps to one refusal.
enum UpstreamFailure: Error {
    case timedOut(String)
    case unreachable(String)
    case handshakeFailed(String)
    case parentProxy(ParentProxyError)

    var refusal: Refusal {
        switch self {
        case .timedOut(let detail): return .upstreamTimeout(detail)
        case .unreachable(let detail): return .upstreamUnreachable(detail)
        case .handshakeFailed(let detail): return .upstreamHandshakeFailed(detail)
        case .parentProxy(let error): return .upstreamUnreachable(error.description)
        }
    }
}

/// Opens TCP to a server (honouring `--resolve` overrides) on a given event loop, then
/// runs the TLS client handshake: SNI = host (none for IP literals), the given ALPN
/// offer, TLS 1.2 minimum, chain and hostname checked against `tlsContext`'s roots.
/// For tunnels nothing but the handshake is sent here; the list fetcher puts its HTTP
/// handlers behind the TLS handler.
struct UpstreamConnector {
    let configuration: GateConfiguration
    let tlsContext: TLSContext
    let statistics: GateStatistics

    /// A tunnel upstream: TLS, then an unpaired glue that buffers what the server sends first.
    func connect(host: String, port: Int, alpnOffer: [String]?, on eventLoop: EventLoop, countRelayed: @escaping GlueHandler.ByteCounter) -> EventLoopFuture<UpstreamConnection> {
        connectTLS(host: host, port: port, alpnOffer: alpnOffer, on: eventLoop) {
            [GlueHandler(countRelayed: countRelayed)]
        }.flatMapThrowing { client in
            let glue = try client.channel.pipeline.syncOperations.handler(type: GlueHandler.self)
            let leaf = client.peer.leaf.map { LeafIdentity(certificateSHA256: $0.sha256Fingerprint, spkiSHA256: $0.spkiSHA256) }
            return UpstreamConnection(channel: client.channel, glue: NIOLoopBound(glue, eventLoop: eventLoop),
                                      peer: client.peer, leaf: leaf, handshakeDuration: client.handshakeDuration)
        }
    }

    /// TLS to `host:port`, with `makeHandlers()` (called on the loop) behind the TLS handler.
    func connectTLS(host: String, port: Int, alpnOffer: [String]?, on eventLoop: EventLoop,
                    makeHandlers: @escaping @Sendable () -> [ChannelHandler]) -> EventLoopFuture<TLSClientChannel> {
        // Handlers and TLS state belong to one loop: do all of it there.
        guard eventLoop.inEventLoop else {
            return eventLoop.flatSubmit {
                self.connectTLS(host: host, port: port, alpnOffer: alpnOffer, on: eventLoop, makeHandlers: makeHandlers)
            }
        }
        let started = NIODeadline.now()
        let handshakePromise = eventLoop.makePromise(of: TLSPeerSummary.self)
        let connection: TLSConnection
        do {
            connection = try TLSConnection(clientOf: tlsContext, options: .init(expectedHost: host, alpnOffer: alpnOffer))
        } catch {
            handshakePromise.fail(error)
            return eventLoop.makeFailedFuture(UpstreamFailure.handshakeFailed("\(error)"))
        }
        // The TLS connection is made here, on the loop, and handed to the initializer
        // that runs on the same loop.
        let tls = NIOLoopBound(TLSHandler(connection: connection, handshakePromise: handshakePromise), eventLoop: eventLoop)
        let parent = configuration.upstreamProxy
        let target = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(configuration.upstreamConnectTimeout)
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if parent != nil {
                        // Through a parent proxy: CONNECT first, TLS (and the rest) once it answers 200.
                        try channel.pipeline.syncOperations.addHandler(ProxyTunnelHandler(
                            target: target,
                            onFailure: { handshakePromise.fail($0) },
                            makeHandlers: { [tls.value] + makeHandlers() }))
                    } else {
                        try channel.pipeline.syncOperations.addHandler(tls.value)
                        try channel.pipeline.syncOperations.addHandlers(makeHandlers())
                    }
                }
            }

        let connected: EventLoopFuture<Channel>
        if let parent {
            // The parent resolves names; --resolve overrides do not reach it.
            if IPAddressText.isIPLiteral(parent.host), let address = try? SocketAddress(ipAddress: parent.host, port: parent.port) {
                connected = bootstrap.connect(to: address)
            } else {
                connected = bootstrap.connect(host: parent.host, port: parent.port)
            }
        } else if let address = configuration.resolveOverride(host: host, port: port) ?? (IPAddressText.isIPLiteral(host) ? host : nil) {
            do {
                connected = bootstrap.connect(to: try SocketAddress(ipAddress: address, port: port))
            } catch {
                handshakePromise.fail(error)
                return eventLoop.makeFailedFuture(UpstreamFailure.unreachable("bad address \(address): \(error)"))
            }
        } else {
            connected = bootstrap.connect(host: host, port: port)
        }

        let handshakeTimeout = configuration.upstreamHandshakeTimeout
        let statistics = self.statistics
        return connected.flatMapError { error in
            handshakePromise.fail(error)
            return eventLoop.makeFailedFuture(Self.classifyConnectError(error))
        }.flatMap { channel in
            statistics.upstreamConnectionOpened()
            let timeout = eventLoop.scheduleTask(in: handshakeTimeout) {
                handshakePromise.fail(TLSHandlerError.handshakeTimedOut)
            }
            return handshakePromise.futureResult.always { _ in timeout.cancel() }
                .flatMapError { error in
                    channel.close(promise: nil)
                    if let failure = error as? UpstreamFailure { return eventLoop.makeFailedFuture(failure) }
                    if let parent = error as? ParentProxyError { return eventLoop.makeFailedFuture(UpstreamFailure.parentProxy(parent)) }
                    if case TLSHandlerError.handshakeTimedOut = error {
                        return eventLoop.makeFailedFuture(UpstreamFailure.timedOut("TLS handshake took longer than \(handshakeTimeout.nanoseconds / 1_000_000_000) s"))
                    }
                    return eventLoop.makeFailedFuture(UpstreamFailure.handshakeFailed("\(error)"))
                }
                .map { peer in TLSClientChannel(channel: channel, peer: peer, handshakeDuration: .now() - started) }
        }
    }

    private static func classifyConnectError(_ error: Error) -> UpstreamFailure {
        if let channelError = error as? ChannelError, case .connectTimeout(let amount) = channelError {
            return .timedOut("TCP connect took longer than \(amount.nanoseconds / 1_000_000) ms")
        }
        return .unreachable("\(error)")
    }
}
