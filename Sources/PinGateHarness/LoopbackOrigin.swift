import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import PinGateNIO
import PinGateTLS
import Synchronization

/// A real TLS origin on 127.0.0.1, port 0, built on the gate's own TLS engine: the
/// pinned server of `pingate demo` and of the tests. It counts what reaches it (TCP
/// connections, finished handshakes, application bytes, closes), which is how the demo
/// and the tests prove that a refused CONNECT forwarded nothing.
public final class LoopbackOrigin: Sendable {
    /// What the origin does with a decrypted connection.
    public enum Behaviour: Sendable {
        /// Answers the first HTTP/1.1 request head with 200 and this body, then closes.
        case http(body: String)
        /// Echoes every plaintext byte back; closes its output when the client closes its.
        case echo
        /// On the first bytes from the client, sends `bytes` bytes (as fast as TCP takes
        /// them), then closes its output.
        case stream(bytes: Int)
    }

    /// What has reached the origin.
    public struct Counters: Sendable, Equatable {
        /// TCP connections accepted.
        public var tcpConnections = 0
        /// TLS handshakes that completed.
        public var handshakes = 0
        /// Decrypted application bytes received.
        public var applicationBytes = 0
        /// TCP connections that have closed again (from either end).
        public var closedConnections = 0
    }

    /// The shared counters and the server context presented, for the per-connection handlers.
    fileprivate final class State: Sendable {
        let counters = Mutex(Counters())
        let context: Mutex<TLSContext>

        init(context: TLSContext) {
            self.context = Mutex(context)
        }
    }

    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let state: State

    /// The bound port.
    public var port: Int { channel.localAddress?.port ?? 0 }
    /// What has reached the origin so far.
    public var observed: Counters { state.counters.withLock { $0 } }

    private init(group: MultiThreadedEventLoopGroup, channel: Channel, state: State) {
        self.group = group
        self.channel = channel
        self.state = state
    }

    /// Serves `behaviour` over TLS with `certificate`/`key` on 127.0.0.1, port 0, sending
    /// `chain` (intermediates, leaf's issuer first) after the leaf, and selecting `alpn`
    /// when the client offers it.
    public static func start(certificate: Certificate, chain: [Certificate] = [], key: PrivateKey, behaviour: Behaviour,
                             alpn: String? = "http/1.1") async throws -> LoopbackOrigin {
        let state = State(context: try TLSContext.server(certificate: certificate, chain: chain, key: key))
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let channel = try await ServerBootstrap(group: group)
                .childChannelOption(.allowRemoteHalfClosure, value: true)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        state.counters.withLock { $0.tcpConnections += 1 }
                        channel.closeFuture.whenComplete { _ in state.counters.withLock { $0.closedConnections += 1 } }
                        let context = state.context.withLock { $0 }
                        let connection = try TLSConnection(serverOf: context, options: .init(preferredALPN: alpn, pauseWhenPreferredALPNMissing: false))
                        let handshake = channel.eventLoop.makePromise(of: TLSPeerSummary.self)
                        handshake.futureResult.whenSuccess { _ in state.counters.withLock { $0.handshakes += 1 } }
                        try channel.pipeline.syncOperations.addHandlers([
                            TLSHandler(connection: connection, handshakePromise: handshake),
                            OriginHandler(behaviour: behaviour, state: state),
                        ])
                        if case .http(let body) = behaviour {
                            // The request is read by NIOHTTP1 (llhttp), behind the counting.
                            try channel.pipeline.syncOperations.addHandlers([
                                ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes, limitConfiguration: HTTPHeadLimits.decoder(maximumHeadBytes: OriginAnswerHandler.maximumHead))),
                                OriginAnswerHandler(body: body),
                            ])
                        }
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
            return LoopbackOrigin(group: group, channel: channel, state: state)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// From now on, new connections are served with `certificate`/`key` and `chain` (a rotation).
    public func present(certificate: Certificate, chain: [Certificate] = [], key: PrivateKey) throws {
        let context = try TLSContext.server(certificate: certificate, chain: chain, key: key)
        state.context.withLock { $0 = context }
    }

    /// Stops serving.
    public func stop() async {
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

/// Serves the origin's behaviour over the decrypted stream.
private final class OriginHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let behaviour: LoopbackOrigin.Behaviour
    private let state: LoopbackOrigin.State
    private var streaming = false

    init(behaviour: LoopbackOrigin.Behaviour, state: LoopbackOrigin.State) {
        self.behaviour = behaviour
        self.state = state
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        state.counters.withLock { $0.applicationBytes += buffer.readableBytes }
        switch behaviour {
        case .echo:
            context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        case .stream(let total):
            guard !streaming else { return }
            streaming = true
            let chunk = ByteBuffer(repeating: 0x5A, count: 1 << 20)
            var sent = 0
            while sent < total {
                let size = min(chunk.readableBytes, total - sent)
                context.write(wrapOutboundOut(chunk.getSlice(at: 0, length: size) ?? chunk), promise: nil)
                sent += size
            }
            context.flush()
            context.close(mode: .output, promise: nil)
        case .http:
            // The request goes on to NIOHTTP1's decoder and `OriginAnswerHandler`.
            context.fireChannelRead(data)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            switch behaviour {
            case .echo: context.close(mode: .output, promise: nil)
            case .http: context.close(promise: nil)
            case .stream: break // keeps writing until done, then closes its output
            }
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.close(promise: nil)
    }
}

/// Answers the first HTTP/1.1 request head, as NIOHTTP1 read it, with 200 and the body,
/// then closes; a body that follows is read and ignored.
private final class OriginAnswerHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = ByteBuffer

    /// A head is read up to this size (its target and fields).
    static let maximumHead = 16 * 1024

    private let body: String
    private var answered = false

    init(body: String) {
        self.body = body
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head = unwrapInboundIn(data) { answer(context: context) }
    }

    /// Bytes that are not HTTP/1.1, or a head over the limit: answered anyway, as the demo's
    /// origin always was (what it proves is that bytes reached it).
    func errorCaught(context: ChannelHandlerContext, error: Error) {
        answer(context: context)
    }

    private func answer(context: ChannelHandlerContext) {
        guard !answered else { return }
        answered = true
        var response = context.channel.allocator.buffer(capacity: 160 + body.utf8.count)
        response.writeString("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
        context.writeAndFlush(wrapOutboundOut(response)).assumeIsolated().whenComplete { _ in
            context.close(mode: .output, promise: nil)
        }
    }
}
