import Foundation
import Logging
import NIOCore
import PinGateNIO
import PinGateTLS
import PinList
import Synchronization

/// Drives one client connection from its first byte to an established tunnel or a
/// refusal:
///
/// readingHead → (refused) | connectingUpstream → (refused) | handshakingClient → relaying
///
/// The upstream handshake and the pin verdict come first; only a trusted upstream gets a
/// `200` and a minted leaf. A refused CONNECT is answered with the reason and closed;
/// the upstream (if one was opened) saw the TLS handshake and nothing else.
final class ConnectHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum State {
        case readingHead
        case connectingUpstream
        case handshakingClient
        case relaying
        case done
    }

    /// Bytes a client may send after its head before the tunnel is up (an eager ClientHello).
    private static let earlyBytesLimit = 64 * 1024

    private let environment: GateEnvironment
    private var parser: ConnectRequestParser
    private var state = State.readingHead
    private var request: ConnectRequest?
    private var earlyBytes: [UInt8] = []
    private var headTimeout: Scheduled<Void>?
    private var started = NIODeadline.now()
    private var clientAddress = "unknown"
    private var upstream: UpstreamConnection?
    private var clientChannel: Channel?
    private var clientALPN: String?
    private let tunnelBytes = TunnelBytes()

    init(environment: GateEnvironment) {
        self.environment = environment
        self.parser = ConnectRequestParser(maximumHeadBytes: environment.configuration.maximumHeadBytes)
    }

    // MARK: channel events

    func channelActive(context: ChannelHandlerContext) {
        started = .now()
        clientChannel = context.channel
        clientAddress = context.channel.remoteAddress.map(Self.describe) ?? "unknown"
        headTimeout = context.eventLoop.assumeIsolated().scheduleTask(in: environment.configuration.headTimeout) {
            guard self.state == .readingHead else { return }
            self.refuse(context: context, .head(HeadRejection(
                status: 408, reason: "request-timeout",
                detail: "the CONNECT request head did not arrive within \(self.environment.configuration.headTimeout.nanoseconds / 1_000_000_000) s")))
        }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = unwrapInboundIn(data)
        switch state {
        case .readingHead:
            let outcome = bytes.withUnsafeReadableBytes { parser.feed($0) }
            switch outcome {
            case .needMoreBytes:
                break
            case .rejected(let rejection):
                refuse(context: context, .head(rejection))
            case .request(let parsed, let leftover):
                headTimeout?.cancel()
                request = parsed
                earlyBytes = leftover
                startUpstream(context: context, request: parsed)
            }
        case .connectingUpstream:
            earlyBytes.append(contentsOf: bytes.readableBytesView)
            if earlyBytes.count > Self.earlyBytesLimit { context.close(promise: nil) }
        case .handshakingClient, .relaying, .done:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        headTimeout?.cancel()
        if state == .readingHead || state == .connectingUpstream { state = .done }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        environment.logger.debug("client connection error", metadata: ["client": "\(clientAddress)", "error": "\(error)"])
        context.close(promise: nil)
    }

    // MARK: upstream and verdict

    private func startUpstream(context: ChannelHandlerContext, request: ConnectRequest) {
        // Direct mode: with a list source configured and nothing usable in force, wait
        // (bounded) for the update that is fetching one, then decide.
        if let updater = environment.updater, !environment.store.isUsable(at: environment.now()) {
            state = .connectingUpstream
            updater.requestDirectUpdate()
            environment.store.waitForUsableList(on: context.eventLoop, timeout: updater.directWait, now: environment.now)
                .assumeIsolated().whenSuccess { _ in
                    guard self.state == .connectingUpstream else { return }
                    guard self.environment.store.isUsable(at: self.environment.now()) else {
                        self.refuse(context: context, .listUnavailable(self.environment.store.status.lastResult ?? "no list fetched yet"))
                        return
                    }
                    self.decide(context: context, request: request)
                }
            return
        }
        decide(context: context, request: request)
    }

    private func decide(context: ChannelHandlerContext, request: ConnectRequest) {
        let policy = environment.decisionPolicy
        if let verdict = policy.refusalBeforeConnecting(host: request.host, port: request.port, list: environment.store.list, now: environment.now()) {
            // Deny by default, and without touching the network.
            refuse(context: context, .verdict(verdict))
            return
        }
        state = .connectingUpstream
        connectUpstream(context: context, alpnOffer: policy.upstreamALPNOffer(configured: environment.configuration.upstreamALPNOffer))
            .assumeIsolated().whenComplete { result in
                switch result {
                case .success(let connection):
                    guard self.state == .connectingUpstream else {
                        connection.channel.close(promise: nil) // the client left meanwhile
                        return
                    }
                    self.environment.statistics.metrics.upstreamHandshake(nanoseconds: connection.handshakeDuration.nanoseconds)
                    let verdict = self.evaluate(connection)
                    self.reportIfPinFailure(verdict, connection: connection)
                    guard verdict.isTrusted else {
                        connection.channel.close(promise: nil)
                        self.refuse(context: context, .verdict(verdict), upstream: connection)
                        return
                    }
                    if case .reportOnlyViolation = verdict {
                        self.environment.statistics.reportOnlyViolation()
                        self.environment.logger.warning("report-only pin violation: allowed", metadata: [
                            "host": "\(self.request?.host ?? "-")", "observed_fingerprint": "\(verdict.observedFingerprint ?? "-")",
                        ])
                    }
                    self.admit(context: context, upstream: connection, verdict: verdict)
                case .failure(let error):
                    guard self.state == .connectingUpstream else { return }
                    let refusal = (error as? TLSClientError).map(Refusal.init) ?? .upstreamUnreachable("\(error)")
                    self.refuse(context: context, refusal)
                }
            }
    }

    private func connectUpstream(context: ChannelHandlerContext, alpnOffer: [String]?) -> EventLoopFuture<UpstreamConnection> {
        guard let request else { return context.eventLoop.makeFailedFuture(TLSClientError.unreachable("no request")) }
        let statistics = environment.statistics
        let bytes = tunnelBytes
        return environment.connector.connect(
            host: request.host, port: request.port, alpnOffer: alpnOffer, on: context.eventLoop,
            countRelayed: {
                statistics.relayed(up: 0, down: $0)
                bytes.down.add($0, ordering: .relaxed)
            })
    }

    private func evaluate(_ connection: UpstreamConnection) -> Verdict {
        return environment.decisionPolicy.verdict(
            host: request?.host ?? "",
            leaf: connection.leaf,
            chain: Self.chainCheck(connection),
            list: environment.store.list,
            now: environment.now())
    }

    /// Pin failures (enforced or report-only) go to the report URIs, TrustKit style.
    private func reportIfPinFailure(_ verdict: Verdict, connection: UpstreamConnection) {
        guard let reporter = environment.reporter, let request else { return }
        switch verdict {
        case .untrusted, .reportOnlyViolation:
            let now = environment.now()
            reporter.report(host: request.host, port: request.port, verdict: verdict,
                            pins: environment.store.list?.unexpiredEntries(for: request.host, at: now) ?? [],
                            chain: connection.peer.chain, now: now)
        default:
            break
        }
    }

    private static func chainCheck(_ connection: UpstreamConnection) -> PinPolicy.ChainCheck {
        .init(valid: connection.peer.chainAndHostnameValid, reason: connection.peer.verifyReason)
    }

    // MARK: refusal

    private func refuse(context: ChannelHandlerContext, _ refusal: Refusal, upstream: UpstreamConnection? = nil) {
        guard state != .done else { return }
        state = .done
        headTimeout?.cancel()
        environment.statistics.recordDecision(refusal.reason)
        logDecision(verdict: "refused", reason: refusal.reason, observed: refusal.observedFingerprint, upstream: upstream)
        let host = request?.host ?? "-"
        let port = request?.port ?? 0
        environment.refusals.record(.init(
            time: environment.now(), client: clientAddress, host: host, port: port, reason: refusal.reason,
            observedFingerprint: refusal.observedFingerprint, expectedFingerprints: expectedFingerprints(for: refusal)))
        var buffer = context.channel.allocator.buffer(capacity: 512)
        buffer.writeBytes(refusal.httpResponse(host: host, port: port))
        context.writeAndFlush(wrapOutboundOut(buffer)).assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }

    // MARK: tunnel

    /// The pins the refused host had, for the refusal log.
    private func expectedFingerprints(for refusal: Refusal) -> [String] {
        if case .verdict(.untrusted(_, let expected)) = refusal { return expected }
        guard let request else { return [] }
        return environment.store.list?.unexpiredEntries(for: request.host, at: environment.now()).map(\.fingerprint) ?? []
    }

    private func admit(context: ChannelHandlerContext, upstream connection: UpstreamConnection, verdict: Verdict) {
        guard let request else { return }
        let serverConnection: TLSConnection
        do {
            let leaf = try environment.minter.leaf(for: request.host, now: environment.now())
            serverConnection = try TLSConnection(
                serverOf: leaf.context,
                options: .init(preferredALPN: connection.peer.alpn, pauseWhenPreferredALPNMissing: true))
        } catch {
            connection.channel.close(promise: nil)
            refuse(context: context, .internalError("cannot mint a leaf for \(request.host): \(error)"))
            return
        }
        state = .handshakingClient
        upstream = connection
        watchUpstreamBeforeJoin(connection)
        environment.statistics.recordDecision(verdict.reasonToken, allowed: true)
        environment.statistics.tunnelOpened()
        let statistics = environment.statistics
        let bytes = tunnelBytes
        context.channel.closeFuture.assumeIsolated().whenComplete { _ in
            statistics.tunnelClosed()
            self.upstream?.channel.close(promise: nil)
            // One decision line per CONNECT: for a tunnel, written when it ends, with its bytes.
            self.logDecision(verdict: "allowed", reason: verdict.reasonToken, observed: verdict.observedFingerprint, upstream: self.upstream)
        }

        var established = context.channel.allocator.buffer(capacity: 64)
        established.writeString("HTTP/1.1 200 Connection established\r\n\r\n")
        context.writeAndFlush(wrapOutboundOut(established), promise: nil)

        let handshake = context.eventLoop.makePromise(of: TLSPeerSummary.self)
        let tls = TLSHandler(connection: serverConnection, handshakePromise: handshake) { offer in
            self.reconnectForClientOffer(context: context, offer: offer)
        }
        let clientGlue = GlueHandler(countRelayed: {
            statistics.relayed(up: $0, down: 0)
            bytes.up.add($0, ordering: .relaxed)
        })
        var handlers: [ChannelHandler] = [IdleStateHandler(allTimeout: environment.configuration.idleTimeout), tls]
        handlers.append(contentsOf: environment.decisionPolicy.makeTunnelInspectors(target: request.authority))
        handlers.append(clientGlue)
        do {
            try context.pipeline.syncOperations.addHandlers(handlers, position: .last)
        } catch {
            context.close(promise: nil)
            return
        }
        handshake.futureResult.assumeIsolated().whenComplete { result in
            switch result {
            case .success(let client):
                guard let upstream = self.upstream else { return }
                self.state = .relaying
                GlueHandler.join(clientGlue, upstream.glue.value)
                if let leaf = upstream.leaf {
                    self.environment.tunnels.add(.init(host: request.host, port: request.port, leaf: leaf,
                                                       chain: Self.chainCheck(upstream), channel: context.channel))
                }
                self.clientALPN = client.alpn
            case .failure(let error):
                self.environment.statistics.clientHandshakeFailed()
                self.environment.logger.notice("client TLS handshake failed", metadata: [
                    "client": "\(self.clientAddress)", "host": "\(request.host)", "error": "\(error)",
                ])
                self.upstream?.channel.close(promise: nil)
                context.close(promise: nil)
            }
        }
        // Hand any bytes the client sent early (a ClientHello that did not wait for the
        // 200) to the TLS handler, then step out of the pipeline: from here on the
        // channel is TLS and glue only.
        let early = earlyBytes
        earlyBytes = []
        if !early.isEmpty {
            var buffer = context.channel.allocator.buffer(capacity: early.count)
            buffer.writeBytes(early)
            context.fireChannelRead(wrapInboundOut(buffer))
            context.fireChannelReadComplete()
        }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    /// Until the tunnel is joined, an upstream that goes away takes the client with it.
    private func watchUpstreamBeforeJoin(_ connection: UpstreamConnection) {
        connection.channel.closeFuture.assumeIsolated().whenComplete { _ in
            guard self.state == .handshakingClient, self.upstream?.channel === connection.channel else { return }
            self.clientChannel?.close(promise: nil)
        }
    }

    /// The client cannot speak the protocol the upstream chose (e.g. it offered only
    /// `http/1.1` and the upstream picked `h2`): open a fresh upstream with the client's
    /// exact offer, pin-check that one too, and resume the client handshake with its choice.
    private func reconnectForClientOffer(context: ChannelHandlerContext, offer: [String]?) -> EventLoopFuture<String?> {
        let previous = upstream
        upstream = nil
        previous?.channel.close(promise: nil)
        return connectUpstream(context: context, alpnOffer: offer).assumeIsolated().flatMapThrowing { connection in
            let verdict = self.evaluate(connection)
            guard verdict.isTrusted, self.state == .handshakingClient else {
                connection.channel.close(promise: nil)
                self.environment.statistics.recordDecision(verdict.reasonToken)
                self.environment.logger.notice("refused the upstream re-opened for the client's ALPN offer", metadata: [
                    "host": "\(self.request?.host ?? "-")", "reason": "\(verdict.reasonToken)",
                    "observed_fingerprint": "\(verdict.observedFingerprint ?? "-")",
                ])
                throw TLSHandlerError.abandonedAtClientHello(verdict.reasonToken)
            }
            self.upstream = connection
            self.watchUpstreamBeforeJoin(connection)
            return connection.peer.alpn
        }.nonisolated()
    }

    // MARK: log

    /// The decision log: one structured line per CONNECT verdict.
    private func logDecision(verdict: String, reason: String, observed: String?, upstream: UpstreamConnection?) {
        var metadata: Logger.Metadata = [
            "client": "\(clientAddress)",
            "host": "\(request?.host ?? "-")",
            "port": "\(request?.port ?? 0)",
            "verdict": "\(verdict)",
            "reason": "\(reason)",
            "observed_fingerprint": "\(observed ?? "-")",
            "bytes_up": "\(tunnelBytes.up.load(ordering: .relaxed))",
            "bytes_down": "\(tunnelBytes.down.load(ordering: .relaxed))",
            "duration_ms": "\((NIODeadline.now() - started).nanoseconds / 1_000_000)",
        ]
        if let upstream {
            metadata["upstream_handshake_ms"] = "\(upstream.handshakeDuration.nanoseconds / 1_000_000)"
            metadata["alpn"] = "\(clientALPN ?? upstream.peer.alpn ?? "-")"
        }
        environment.decisionLogger.log(level: verdict == "allowed" ? .info : .notice, "connect decision", metadata: metadata)
    }

    private static func describe(_ address: SocketAddress) -> String {
        guard let ip = address.ipAddress, let port = address.port else { return "\(address)" }
        return ip.contains(":") ? "[\(ip)]:\(port)" : "\(ip):\(port)"
    }
}

/// Bytes relayed by one tunnel, counted from both glue handlers.
final class TunnelBytes: Sendable {
    let up = Atomic<Int>(0)
    let down = Atomic<Int>(0)
}
