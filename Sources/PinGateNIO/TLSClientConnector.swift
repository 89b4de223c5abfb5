import NIOCore
import NIOPosix
import PinGateTLS

/// A TLS client connection after its handshake, with whatever handlers the caller put
/// behind the TLS handler.
public struct TLSClientChannel: Sendable {
    /// The connected channel: TLS handler first, the caller's handlers behind it.
    public let channel: Channel
    /// What the server presented and what the handshake settled.
    public let peer: TLSPeerSummary
    /// How long TCP connect (and the parent proxy's CONNECT) plus the TLS handshake took.
    public let handshakeDuration: TimeAmount
    /// With a session cache: keeps the sessions this server hands out (those already
    /// received and those still to come), stamped with the cache's generation as it was
    /// when the handshake completed, before any verdict on it. Call it only when the
    /// verdict trusted a verified server; a connection never asked keeps nothing. Nil
    /// without a cache.
    public let keepSessions: (@Sendable () -> Void)?
    /// With a session cache: drops the sessions this server hands out, those already
    /// received and those still to come; call it when the verdict did not trust the server
    /// and the connection stays open (a report-only violation), so it holds none meanwhile.
    /// Nil without a cache.
    public var discardSessions: (@Sendable () -> Void)? = nil
}

/// Why a TLS client connection did not come up.
public enum TLSClientError: Error, Sendable, CustomStringConvertible {
    /// TCP connect or the TLS handshake took longer than allowed.
    case timedOut(String)
    /// The server could not be reached: refused, unresolvable, reset.
    case unreachable(String)
    /// The TLS handshake failed (the reason text is OpenSSL's).
    case handshakeFailed(String)
    /// The parent proxy did not open the tunnel.
    case parentProxy(ParentProxyError)
    /// The destination's address is one the `DestinationGuard` refuses; nothing was dialled.
    case destinationRefused(String)

    /// The failure in words.
    public var description: String {
        switch self {
        case .timedOut(let detail), .unreachable(let detail), .handshakeFailed(let detail), .destinationRefused(let detail): return detail
        case .parentProxy(let error): return error.description
        }
    }
}

/// How a `TLSClientConnector` reaches servers.
public struct TLSClientSettings: Sendable {
    /// How long the TCP connect may take.
    public var connectTimeout: TimeAmount = .seconds(10)
    /// How long the TLS handshake may take once TCP is up.
    public var handshakeTimeout: TimeAmount = .seconds(10)
    /// A parent HTTP proxy to tunnel through (CONNECT); TLS still runs end to end.
    public var parentProxy: ParentProxy?
    /// curl-style `--resolve` overrides (not applied through a parent, which resolves names itself).
    public var resolveOverrides: [ResolveOverride] = []
    /// How long to wait, after a TLS 1.3 handshake in which the server asked for a client
    /// certificate (none is sent), for the server to reject the empty answer; nil: not at
    /// all. See `TLSHandler.init`.
    public var certificateRequestWait: TimeAmount? = .seconds(1)
    /// Where connections may lead (the gate's CONNECT destinations); nil: anywhere, names
    /// resolved by NIO (the list fetcher, report URIs, the CLI).
    public var destinationGuard: DestinationGuard?

    /// The defaults: 10 s connect, 10 s handshake, direct, no overrides.
    public init() {}

    /// The override address for `host:port`, if any.
    public func resolveOverride(host: String, port: Int) -> String? {
        resolveOverrides.first { $0.host == host && $0.port == port }?.address
    }
}

/// Opens TCP to a server (honouring `--resolve` overrides, or through a parent proxy) on
/// a given event loop, then runs the TLS client handshake with the engine: SNI = host
/// (none for IP literals), the given ALPN offer, TLS 1.2 minimum, chain and hostname
/// checked against the context's roots. It sends nothing but the handshake; callers put
/// their own handlers behind the TLS handler (the gate a relay, the HTTPS client a codec).
public struct TLSClientConnector: Sendable {
    /// How servers are reached.
    public let settings: TLSClientSettings
    /// The client context: trust roots and protocol floor.
    public let context: TLSContext
    /// Called on the loop for every TCP connection that came up (the gate counts them).
    public let onConnected: @Sendable () -> Void
    /// Sessions to offer for resumption, and where `TLSClientChannel.keepSessions` puts
    /// new ones; nil: every handshake is a full one. Needs a context made with
    /// `collectsSessions`.
    public let sessionCache: TLSSessionCache?

    /// A connector with `settings` and `context`.
    public init(settings: TLSClientSettings, context: TLSContext, sessionCache: TLSSessionCache? = nil,
                onConnected: @escaping @Sendable () -> Void = {}) {
        self.settings = settings
        self.context = context
        self.sessionCache = sessionCache
        self.onConnected = onConnected
    }

    /// TLS to `host:port`, with `makeHandlers()` (called on the loop) behind the TLS
    /// handler. Fails with a `TLSClientError`.
    public func connect(host: String, port: Int, alpnOffer: [String]?, on eventLoop: EventLoop,
                        makeHandlers: @escaping @Sendable () -> [ChannelHandler]) -> EventLoopFuture<TLSClientChannel> {
        // Handlers and TLS state belong to one loop: do all of it there.
        guard eventLoop.inEventLoop else {
            return eventLoop.flatSubmit {
                self.connect(host: host, port: port, alpnOffer: alpnOffer, on: eventLoop, makeHandlers: makeHandlers)
            }
        }
        let started = NIODeadline.now()
        let handshakePromise = eventLoop.makePromise(of: TLSPeerSummary.self)
        let connection: TLSConnection
        do {
            connection = try TLSConnection(clientOf: context, options: .init(expectedHost: host, alpnOffer: alpnOffer))
        } catch {
            handshakePromise.fail(error)
            return eventLoop.makeFailedFuture(TLSClientError.handshakeFailed("\(error)"))
        }
        let resumption = sessionCache.map { SessionResumption(cache: $0, host: host, port: port) }
        let offerSession: ((SocketAddress?) -> Void)? = resumption.map { resumption in
            { address in resumption.offer(on: connection, connectedTo: address) }
        }
        // The TLS connection is made here, on the loop, and handed to the initializer
        // that runs on the same loop.
        let tls = NIOLoopBound(TLSHandler(connection: connection, handshakePromise: handshakePromise,
                                          certificateRequestWait: settings.certificateRequestWait,
                                          willStartClientHandshake: offerSession), eventLoop: eventLoop)
        let resumable = NIOLoopBound((connection, resumption), eventLoop: eventLoop)
        let parent = settings.parentProxy
        let target = Authority(host: host, port: port).description
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(settings.connectTimeout)
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelOption(.recvAllocator, value: ReceiveBuffers.allocator)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if parent != nil {
                        // Through a parent proxy: CONNECT first, TLS (and the rest) once it answers 200.
                        try ProxyTunnelHandler.add(ProxyTunnelHandler(
                            target: target,
                            onFailure: { handshakePromise.fail($0) },
                            makeHandlers: { [tls.value] + makeHandlers() }), to: channel.pipeline.syncOperations)
                    } else {
                        try channel.pipeline.syncOperations.addHandler(tls.value)
                        try channel.pipeline.syncOperations.addHandlers(makeHandlers())
                    }
                }
            }

        let connected: EventLoopFuture<Channel>
        let destinationGuard = settings.destinationGuard
        if let destinationGuard, parent != nil || settings.resolveOverride(host: host, port: port) == nil,
           let literal = DestinationAddress(text: host),
           let refusal = destinationGuard.refusal(address: literal, port: port, fromDNS: false) {
            // An IP literal is checked even when a parent proxy will dial it.
            handshakePromise.fail(TLSClientError.destinationRefused(refusal))
            return eventLoop.makeFailedFuture(TLSClientError.destinationRefused(refusal))
        }
        if let parent {
            // The parent resolves names; --resolve overrides do not reach it.
            if IPAddressText.isIPLiteral(parent.host), let address = try? SocketAddress(ipAddress: parent.host, port: parent.port) {
                connected = bootstrap.connect(to: address)
            } else {
                connected = bootstrap.connect(host: parent.host, port: parent.port)
            }
        } else if let address = settings.resolveOverride(host: host, port: port) ?? (IPAddressText.isIPLiteral(host) ? host : nil) {
            // A --resolve mapping is the operator's explicit choice: only the rules that
            // hold for every source apply to it.
            if let destinationGuard, let checked = DestinationAddress(text: address),
               let refusal = destinationGuard.refusal(address: checked, port: port, fromDNS: false) {
                handshakePromise.fail(TLSClientError.destinationRefused(refusal))
                return eventLoop.makeFailedFuture(TLSClientError.destinationRefused(refusal))
            }
            do {
                connected = bootstrap.connect(to: try SocketAddress(ipAddress: address, port: port))
            } catch {
                handshakePromise.fail(error)
                return eventLoop.makeFailedFuture(TLSClientError.unreachable("bad address \(address): \(error)"))
            }
        } else if let destinationGuard {
            // Resolve once, check every answer, and dial only the addresses checked: a
            // second lookup at connect time could answer differently (DNS rebinding).
            // The bootstrap is not Sendable: everything after the lookup stays on this loop
            // (the lookup's future completes on it).
            // The lookup shares the connect timeout, as NIO's own resolver does.
            let connectTimeout = settings.connectTimeout
            connected = DestinationGuard.resolve(host: host, port: port, on: eventLoop, timeout: connectTimeout).flatMapError { error in
                eventLoop.makeFailedFuture(TLSClientError.unreachable("\(error)"))
            }.assumeIsolated().flatMap { addresses in
                var refusals: [String] = []
                let allowed = addresses.filter { address in
                    guard let checked = DestinationAddress(address) else { return false }
                    if let refusal = destinationGuard.refusal(address: checked, port: port, fromDNS: true) {
                        refusals.append(refusal)
                        return false
                    }
                    return true
                }
                guard !allowed.isEmpty else {
                    return eventLoop.makeFailedFuture(TLSClientError.destinationRefused(
                        "\(host) resolves only to refused destinations: \(refusals.joined(separator: "; "))"))
                }
                return Self.connectInTurn(bootstrap, to: allowed[...], on: eventLoop)
            }.nonisolated()
        } else {
            connected = bootstrap.connect(host: host, port: port)
        }

        let handshakeTimeout = settings.handshakeTimeout
        let onConnected = self.onConnected
        return connected.flatMapError { error in
            handshakePromise.fail(error)
            return eventLoop.makeFailedFuture(Self.classifyConnectError(error))
        }.flatMap { channel in
            onConnected()
            let timeout = eventLoop.scheduleTask(in: handshakeTimeout) {
                handshakePromise.fail(TLSHandlerError.handshakeTimedOut)
            }
            return handshakePromise.futureResult.always { _ in timeout.cancel() }
                .flatMapError { error in
                    channel.close(promise: nil)
                    return eventLoop.makeFailedFuture(Self.classifyHandshakeError(error, timeout: handshakeTimeout))
                }
                .flatMapThrowing { peer in
                    let (connection, resumption) = resumable.value
                    guard let resumption else {
                        return TLSClientChannel(channel: channel, peer: peer, handshakeDuration: .now() - started, keepSessions: nil)
                    }
                    let settled: TLSPeerSummary
                    do {
                        settled = try resumption.summary(after: peer, connection: connection)
                    } catch {
                        channel.close(promise: nil)
                        throw error
                    }
                    // Read now, before the caller's verdict: a list change after this point
                    // moves the cache's generation on and keeps these sessions out.
                    let generation = resumption.cache.generation
                    return TLSClientChannel(channel: channel, peer: settled, handshakeDuration: .now() - started,
                                            keepSessions: {
                        eventLoop.execute {
                            let (connection, resumption) = resumable.value
                            resumption?.keep(from: connection, generation: generation)
                        }
                    }, discardSessions: {
                        eventLoop.execute { resumable.value.0.discardSessions() }
                    })
                }
        }
    }

    /// Connects to the first of `addresses` that accepts, one after the other (each under
    /// the bootstrap's connect timeout); fails with the last error.
    private static func connectInTurn(_ bootstrap: ClientBootstrap, to addresses: ArraySlice<SocketAddress>,
                                      on eventLoop: EventLoop) -> EventLoopFuture<Channel> {
        guard let first = addresses.first else {
            return eventLoop.makeFailedFuture(TLSClientError.unreachable("no address to connect to"))
        }
        let rest = addresses.dropFirst()
        return bootstrap.connect(to: first).assumeIsolated().flatMapError { error in
            rest.isEmpty ? eventLoop.makeFailedFuture(error) : connectInTurn(bootstrap, to: rest, on: eventLoop)
        }.nonisolated()
    }

    private static func classifyConnectError(_ error: Error) -> TLSClientError {
        if let failure = error as? TLSClientError { return failure }
        if let channelError = error as? ChannelError, case .connectTimeout(let amount) = channelError {
            return .timedOut("TCP connect took longer than \(amount.nanoseconds / 1_000_000) ms")
        }
        return .unreachable("\(error)")
    }

    private static func classifyHandshakeError(_ error: Error, timeout: TimeAmount) -> TLSClientError {
        switch error {
        case let failure as TLSClientError: return failure
        case let parent as ParentProxyError: return .parentProxy(parent)
        case TLSHandlerError.handshakeTimedOut: return .timedOut("TLS handshake took longer than \(timeout.nanoseconds / 1_000_000_000) s")
        case TLSHandlerError.refusedAfterHandshake(let detail):
            return .handshakeFailed("the server asked for a client certificate, which pingate does not send, and then refused the connection: \(detail)")
        default: return .handshakeFailed("\(error)")
        }
    }
}

/// One connection's part in session resumption, on its loop: which session was offered,
/// under which key, and what the handshake that resumed it may claim.
private final class SessionResumption {
    let cache: TLSSessionCache
    let host: String
    let port: Int
    private var key: TLSSessionCache.Key?
    private var offered: TLSSessionCache.Entry?
    /// The full handshake's summary that new sessions are kept beside: this connection's
    /// own, or, when it resumed, the one kept with the session it resumed.
    private var fullHandshake: TLSPeerSummary?

    init(cache: TLSSessionCache, host: String, port: Int) {
        self.cache = cache
        self.host = host
        self.port = port
    }

    /// Offers a kept session for this name, port and address, if there is one.
    func offer(on connection: TLSConnection, connectedTo address: SocketAddress?) {
        let key = TLSSessionCache.Key(host: host, port: port, address: address?.ipAddress ?? "\(address.map { "\($0)" } ?? "-")")
        self.key = key
        guard let entry = cache.take(key) else { return }
        do {
            try connection.offer(entry.session)
            offered = entry
        } catch {
            // A session OpenSSL will not take is no reason to fail: a full handshake follows.
        }
    }

    /// The summary the caller decides on. After a full handshake, OpenSSL's own. After a
    /// resumed one, the full handshake's kept summary (its verified chain and verify
    /// result), provided the session's certificate is the one kept with it.
    func summary(after live: TLSPeerSummary, connection: TLSConnection) throws -> TLSPeerSummary {
        guard connection.sessionWasReused else {
            fullHandshake = live
            return live
        }
        guard let offered, let kept = offered.peer.leaf, let presented = live.leaf,
              kept.isSameCertificate(as: presented) else {
            throw TLSClientError.handshakeFailed("the server resumed a TLS session whose certificate is not the one kept with it")
        }
        fullHandshake = offered.peer
        return offered.peer.resumed(alpn: live.alpn, protocolVersion: live.protocolVersion)
    }

    /// Keeps the sessions `connection` receives, under this connection's key, beside the
    /// summary of the full handshake they descend from.
    func keep(from connection: TLSConnection, generation: UInt64) {
        guard let key, let full = fullHandshake else { return }
        let cache = self.cache
        connection.deliverSessions { session in
            cache.store(session, peer: full, key: key, generation: generation)
        }
    }
}
