import Foundation
import NIOCore
import NIOPosix
import PinGateNIO
import PinGateTestSupport
import PinGateTLS
import Testing

/// The TLS handler's write path: plaintext is sealed straight into the buffer that goes to
/// the socket, so a burst costs no copy after encryption and leaves nothing held in the
/// engine (before, a memory BIO took every record and the handler copied it out again,
/// and a burst's buffer stayed allocated until a timer gave it back).
@Suite("TLS handler write buffer")
struct TLSHandlerWriteBufferTests {
    static let payloadSize = 256 * 1024

    @Test("over real TLS on loopback: a 256 KiB write, and 256 writes of 1 KiB in one flush, go out with no ciphertext copied and none left in the engine",
          arguments: [1, 256])
    func burstSealedInPlace(writes: Int) async throws {
        try await Self.withLoopbackTLS { loop, serverContext, clientContext in
            try await Self.burst(writes: writes, loop: loop, serverContext: serverContext, clientContext: clientContext)
        }
    }

    /// A server and a client TLS context for `burst.test`, minted for the test, and one event
    /// loop for both ends.
    private static func withLoopbackTLS(_ body: (any EventLoop, TLSContext, TLSContext) async throws -> Void) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("burst.test")], issuer: pki.originCA, file: "burst")
        let serverContext = try TLSContext.server(certificate: leaf.certificate, key: leaf.key)
        let clientContext = try TLSContext.client(trustRoots: .pemFiles([pki.originCA.certificatePath]))
        try await withResource(start: { MultiThreadedEventLoopGroup(numberOfThreads: 1) },
                               stop: { try? await $0.shutdownGracefully() }) { group in
            try await body(group.next(), serverContext, clientContext)
        }
    }

    private static func burst(writes: Int, loop: any EventLoop, serverContext: TLSContext, clientContext: TLSContext) async throws {
        // The server writes the burst as soon as its handshake completes and notes, right
        // after the flush, how many ciphertext bytes the engine copied for it and how many
        // still wait there.
        let served = loop.makePromise(of: (copied: Int, waiting: Int).self)
        let server = try await ServerBootstrap(group: loop)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let connection = try TLSConnection(serverOf: serverContext,
                                                       options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
                    let handshake = channel.eventLoop.makePromise(of: TLSPeerSummary.self)
                    try channel.pipeline.syncOperations.addHandler(TLSHandler(connection: connection, handshakePromise: handshake))
                    let bound = NIOLoopBound(connection, eventLoop: channel.eventLoop)
                    handshake.futureResult.whenSuccess { _ in
                        // On a later turn of the loop: the handshake's own flights (session
                        // tickets) have gone by then.
                        channel.eventLoop.execute {
                            let before = bound.value.ciphertextCopiedCount
                            let each = Self.payloadSize / writes
                            for _ in 0..<writes {
                                let part = channel.allocator.buffer(repeating: 0x5A, count: each)
                                channel.pipeline.syncOperations.write(NIOAny(part), promise: nil)
                            }
                            channel.pipeline.syncOperations.flush()
                            served.succeed((bound.value.ciphertextCopiedCount - before, bound.value.pendingCiphertextCount))
                        }
                    }
                    handshake.futureResult.whenFailure { served.fail($0) }
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        let port = try #require(server.localAddress?.port)

        let received = loop.makePromise(of: Void.self)
        let client = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let connection = try TLSConnection(clientOf: clientContext, options: .init(expectedHost: "burst.test", alpnOffer: nil))
                    try channel.pipeline.syncOperations.addHandlers([
                        TLSHandler(connection: connection, handshakePromise: nil),
                        ByteCounter(expected: Self.payloadSize, done: received),
                    ])
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        defer { client.close(promise: nil) }

        let (copied, waiting) = try await served.futureResult.get()
        try await received.futureResult.get()
        #expect(copied == 0, "\(copied) ciphertext bytes of the burst were copied after encryption")
        #expect(waiting == 0, "\(waiting) ciphertext bytes stayed in the engine after the flush")
    }

    @Test("over real TLS on loopback: 300 exchanges one after another (as keep-alive requests go) come back byte-exact, and the loop's TLS handlers read and seal them into buffers taken again from its recycler, not new ones")
    func exchangesReuseBuffers() async throws {
        try await Self.withLoopbackTLS { loop, serverContext, clientContext in
            let server = try await ServerBootstrap(group: loop)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let connection = try TLSConnection(serverOf: serverContext,
                                                           options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
                        try channel.pipeline.syncOperations.addHandlers([TLSHandler(connection: connection, handshakePromise: nil), Echo()])
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
            defer { server.close(promise: nil) }
            let port = try #require(server.localAddress?.port)

            let exchanges = 300
            let done = loop.makePromise(of: Int.self)
            let handshake = loop.makePromise(of: TLSPeerSummary.self)
            let client = try await ClientBootstrap(group: loop)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let connection = try TLSConnection(clientOf: clientContext, options: .init(expectedHost: "burst.test", alpnOffer: nil))
                        try channel.pipeline.syncOperations.addHandlers([
                            TLSHandler(connection: connection, handshakePromise: handshake),
                            PingPong(exchanges: exchanges, done: done),
                        ])
                    }
                }
                .connect(host: "127.0.0.1", port: port).get()
            defer { client.close(promise: nil) }
            _ = try await handshake.futureResult.get()
            // Past the handshakes and their session tickets, then the count starts.
            try await Task.sleep(for: .milliseconds(200))
            let before = try await loop.submit { ByteBufferRecycler.forCurrentThread().counts }.get()
            client.pipeline.fireUserInboundEventTriggered(PingPong.Start())
            let exact = try await done.futureResult.get()
            let after = try await loop.submit { ByteBufferRecycler.forCurrentThread().counts }.get()
            #expect(exact == exchanges)
            let taken = (after.reused + after.allocated) - (before.reused + before.allocated)
            let allocated = after.allocated - before.allocated
            // Each exchange: two reads and two seals (one on each end), at least.
            #expect(taken >= 4 * exchanges, "taken \(taken)")
            #expect(allocated <= 8, "\(allocated) of \(taken) buffers were allocated, not taken again")
        }
    }

    /// Sends each plaintext read straight back.
    private final class Echo: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.writeAndFlush(data, promise: nil)
        }
    }

    /// Sends one numbered message of 300 bytes, waits for all of it to come back, checks it,
    /// and sends the next; completes `done` with the count that came back exact.
    private final class PingPong: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        struct Start {}

        private let exchanges: Int
        private let done: EventLoopPromise<Int>
        private var sent = 0
        private var exact = 0
        private var received = ByteBuffer()
        private static let size = 300

        init(exchanges: Int, done: EventLoopPromise<Int>) {
            self.exchanges = exchanges
            self.done = done
        }

        private func message(_ index: Int) -> [UInt8] {
            (0..<Self.size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ index) }
        }

        private func sendNext(context: ChannelHandlerContext) {
            guard sent < exchanges else {
                done.succeed(exact)
                return
            }
            context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: message(sent))), promise: nil)
            sent += 1
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if event is Start { sendNext(context: context) } else { context.fireUserInboundEventTriggered(event) }
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var bytes = unwrapInboundIn(data)
            received.writeBuffer(&bytes)
            guard received.readableBytes >= Self.size else { return }
            if received.readBytes(length: Self.size) == message(sent - 1) { exact += 1 }
            received.discardReadBytes()
            sendNext(context: context)
        }

        func errorCaught(context: ChannelHandlerContext, error: Error) {
            done.fail(error)
            context.close(promise: nil)
        }
    }

    /// Counts plaintext bytes and completes `done` once `expected` have arrived.
    private final class ByteCounter: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer

        private let expected: Int
        private let done: EventLoopPromise<Void>
        private var count = 0

        init(expected: Int, done: EventLoopPromise<Void>) {
            self.expected = expected
            self.done = done
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            count += unwrapInboundIn(data).readableBytes
            if count >= expected { done.succeed(()) }
        }

        func errorCaught(context: ChannelHandlerContext, error: Error) {
            done.fail(error)
            context.close(promise: nil)
        }
    }
}
