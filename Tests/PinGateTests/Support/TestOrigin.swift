import Foundation
import PinGateTestSupport
import NIOCore
import NIOPosix
import Synchronization
import PinGateTLS
@testable import PinGate
@testable import PinGateNIO

/// A real TLS origin on 127.0.0.1, port 0, built on the gate's own TLS engine. It counts
/// what reaches it (TCP connections, finished handshakes, application bytes), which is
/// how tests prove that a refused CONNECT forwarded nothing.
final class TestOrigin: Sendable {
    enum Behaviour: Sendable {
        /// Answers every HTTP/1.1 request head with 200 and this body, then closes.
        case http(body: String)
        /// Echoes every plaintext byte back; closes its output when the client closes its.
        case echo
        /// On the first bytes from the client, sends `bytes` bytes (as fast as TCP takes
        /// them), then closes its output.
        case stream(bytes: Int)
    }

    struct Counters: Sendable, Equatable {
        var tcpConnections = 0
        var handshakes = 0
        var applicationBytes = 0
        /// TCP connections that have closed again (from either end).
        var closedConnections = 0
    }

    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let box: CounterBox

    var port: Int { channel.localAddress?.port ?? 0 }
    /// What has reached the origin so far.
    var observed: Counters { box.counters.withLock { $0 } }

    private init(group: MultiThreadedEventLoopGroup, channel: Channel, box: CounterBox) {
        self.group = group
        self.channel = channel
        self.box = box
    }

    /// Holds the shared counters (and the certificate presented) for the per-connection handlers.
    final class CounterBox: Sendable {
        let counters = Mutex(Counters())
        let context: Mutex<TLSContext?> = Mutex(nil)
    }

    /// From now on, new connections are served with `identity` (a certificate rotation).
    func present(_ identity: TestPKI.Identity) throws {
        let context = try TLSContext.server(certificate: identity.certificate, key: identity.key)
        box.context.withLock { $0 = context }
    }

    static func start(identity: TestPKI.Identity, behaviour: Behaviour, alpn: String? = "http/1.1") async throws -> TestOrigin {
        let box = CounterBox()
        box.context.withLock { $0 = try? TLSContext.server(certificate: identity.certificate, key: identity.key) }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel = try await ServerBootstrap(group: group)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    box.counters.withLock { $0.tcpConnections += 1 }
                    channel.closeFuture.whenComplete { _ in box.counters.withLock { $0.closedConnections += 1 } }
                    guard let context = box.context.withLock({ $0 }) else { throw TestFailure("no certificate") }
                    let connection = try TLSConnection(serverOf: context, options: .init(preferredALPN: alpn, pauseWhenPreferredALPNMissing: false))
                    let handshake = channel.eventLoop.makePromise(of: TLSPeerSummary.self)
                    handshake.futureResult.whenSuccess { _ in box.counters.withLock { $0.handshakes += 1 } }
                    try channel.pipeline.syncOperations.addHandlers([
                        TLSHandler(connection: connection, handshakePromise: handshake),
                        OriginHandler(behaviour: behaviour, box: box),
                    ])
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return TestOrigin(group: group, channel: channel, box: box)
    }

    func stop() async {
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

/// Serves the origin's behaviour over the decrypted stream.
private final class OriginHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let behaviour: TestOrigin.Behaviour
    private let box: TestOrigin.CounterBox
    private var head: [UInt8] = []
    private var answered = false
    private var streaming = false

    init(behaviour: TestOrigin.Behaviour, box: TestOrigin.CounterBox) {
        self.behaviour = behaviour
        self.box = box
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        box.counters.withLock { $0.applicationBytes += buffer.readableBytes }
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
        case .http(let body):
            guard !answered else { return }
            head.append(contentsOf: buffer.readableBytesView)
            // Answer once the head is complete; a body that follows is read and ignored.
            guard head.count >= 4, head.indices.dropFirst(3).contains(where: { head[$0 - 3...$0].elementsEqual("\r\n\r\n".utf8) }) else { return }
            answered = true
            var response = context.channel.allocator.buffer(capacity: 128 + body.utf8.count)
            response.writeString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
            context.writeAndFlush(wrapOutboundOut(response)).assumeIsolated().whenComplete { _ in
                context.close(mode: .output, promise: nil)
            }
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

/// A TCP listener that accepts and never answers: upstream handshake timeouts.
final class SilentServer: Sendable {
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    var port: Int { channel.localAddress?.port ?? 0 }

    private init(group: MultiThreadedEventLoopGroup, channel: Channel) {
        self.group = group
        self.channel = channel
    }

    static func start() async throws -> SilentServer {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { $0.eventLoop.makeSucceededVoidFuture() }
            .bind(host: "127.0.0.1", port: 0).get()
        return SilentServer(group: group, channel: channel)
    }

    func stop() async {
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

/// A port on 127.0.0.1 that was free a moment ago and has nothing listening now.
func closedLoopbackPort() throws -> Int {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw TestFailure("socket() failed") }
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0 else { throw TestFailure("bind() failed") }
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let named = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
    }
    guard named == 0 else { throw TestFailure("getsockname() failed") }
    return Int(UInt16(bigEndian: address.sin_port))
}
