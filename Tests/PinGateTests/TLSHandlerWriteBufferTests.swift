import Foundation
import NIOCore
import NIOPosix
import PinGateNIO
import PinGateTestSupport
import PinGateTLS
import Testing

/// The TLS handler's half of the write-buffer policy (the engine's half is in
/// `TLSEngineTests`): a large flight's drained buffer is kept while the connection may
/// still be busy, and the handler gives it back once writing has paused for 200 ms, so an
/// idle connection does not hold its largest burst for as long as it stays open.
@Suite("TLS handler write buffer")
struct TLSHandlerWriteBufferTests {
    static let payloadSize = 256 * 1024

    @Test("over real TLS on loopback: a 256 KiB burst's drained write buffer is held just after it, and released once writing pauses")
    func releasedAfterWritingPauses() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("burst.test")], issuer: pki.originCA, file: "burst")
        let serverContext = try TLSContext.server(certificate: leaf.certificate, key: leaf.key)
        let clientContext = try TLSContext.client(trustRoots: .pemFiles([pki.originCA.certificatePath]))
        try await withResource(start: { MultiThreadedEventLoopGroup(numberOfThreads: 1) },
                               stop: { try? await $0.shutdownGracefully() }) { group in
            try await Self.burstThenPause(loop: group.next(), serverContext: serverContext, clientContext: clientContext)
        }
    }

    private static func burstThenPause(loop: any EventLoop, serverContext: TLSContext, clientContext: TLSContext) async throws {

        // The server writes the burst in one write as soon as its handshake completes, and
        // notes whether its connection holds a drained write buffer right after it (the
        // flush encrypted and took all of it in the same call). The client sends nothing
        // after its handshake, so no read on the server releases the buffer: only the
        // handler's timer can.
        let served = loop.makePromise(of: (held: Bool, connection: NIOLoopBound<TLSConnection>).self)
        let server = try await ServerBootstrap(group: loop)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let connection = try TLSConnection(serverOf: serverContext,
                                                       options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
                    let handshake = channel.eventLoop.makePromise(of: TLSPeerSummary.self)
                    try channel.pipeline.syncOperations.addHandler(TLSHandler(connection: connection, handshakePromise: handshake))
                    let bound = NIOLoopBound(connection, eventLoop: channel.eventLoop)
                    handshake.futureResult.whenSuccess { _ in
                        // On a later turn of the loop, not inside the read that completed the
                        // handshake: that read goes on to wait for input, which releases the
                        // buffer itself, and the timer would not be what this test sees.
                        channel.eventLoop.execute {
                            let burst = channel.allocator.buffer(repeating: 0x5A, count: Self.payloadSize)
                            channel.pipeline.syncOperations.writeAndFlush(NIOAny(burst), promise: nil)
                            served.succeed((bound.value.holdsIdleWriteBuffer, bound))
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

        let (heldJustAfter, serverConnection) = try await served.futureResult.get()
        try await received.futureResult.get()
        // A flight this size is kept at first: regrowing it for every flight of a busy
        // connection costs CPU (the engine releases only small ones at once).
        #expect(heldJustAfter, "the burst's drained write buffer was released at once, not kept")
        // Nothing more is written: 200 ms later the handler gives the buffer back.
        try await Task.sleep(for: .milliseconds(600))
        let heldLater = try await loop.submit { serverConnection.value.holdsIdleWriteBuffer }.get()
        #expect(!heldLater, "the drained write buffer was still held 600 ms after writing paused")
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
