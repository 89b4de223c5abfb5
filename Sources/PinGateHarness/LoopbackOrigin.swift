import Foundation
import NIOCore
import NIOPosix
import PinGateNIO
import PinGateTLS
import Synchronization

/// A minimal HTTPS origin on loopback for `pingate demo`: answers every HTTP/1.1 request
/// with a fixed body and counts the application bytes it receives.
public final class LoopbackOrigin: Sendable {
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let received: ByteCount

    final class ByteCount: Sendable {
        let value = Atomic<Int>(0)
    }

    /// The bound port.
    public var port: Int { channel.localAddress?.port ?? 0 }
    /// Application bytes received so far.
    public var applicationBytesReceived: Int { received.value.load(ordering: .relaxed) }

    private init(group: MultiThreadedEventLoopGroup, channel: Channel, received: ByteCount) {
        self.group = group
        self.channel = channel
        self.received = received
    }

    /// Serves `body` over TLS with `certificate`/`key` on 127.0.0.1, port 0.
    public static func start(certificate: Certificate, key: PrivateKey, body: String) async throws -> LoopbackOrigin {
        let context = try TLSContext.server(certificate: certificate, key: key)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let received = ByteCount()
        do {
            let channel = try await ServerBootstrap(group: group)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let connection = try TLSConnection(serverOf: context, options: .init(preferredALPN: "http/1.1", pauseWhenPreferredALPNMissing: false))
                        try channel.pipeline.syncOperations.addHandlers([
                            TLSHandler(connection: connection, handshakePromise: nil),
                            DemoResponder(body: body, received: received),
                        ])
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
            return LoopbackOrigin(group: group, channel: channel, received: received)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// Stops serving.
    public func stop() async {
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

private final class DemoResponder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let body: String
    private let received: LoopbackOrigin.ByteCount
    private var head: [UInt8] = []
    private var answered = false

    init(body: String, received: LoopbackOrigin.ByteCount) {
        self.body = body
        self.received = received
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        received.value.add(buffer.readableBytes, ordering: .relaxed)
        guard !answered else { return }
        head.append(contentsOf: buffer.readableBytesView)
        // Answer once the head is complete; a body that follows is read and ignored.
        let complete = head.count >= 4 && head.indices.dropFirst(3).contains { head[$0 - 3...$0].elementsEqual("\r\n\r\n".utf8) }
        guard complete || head.count > 16 * 1024 else { return }
        answered = true
        var response = context.channel.allocator.buffer(capacity: 160 + body.utf8.count)
        response.writeString("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
        context.writeAndFlush(wrapOutboundOut(response)).assumeIsolated().whenComplete { _ in
            context.close(mode: .output, promise: nil)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { context.close(promise: nil) }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.close(promise: nil)
    }
}
