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
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("burst.test")], issuer: pki.originCA, file: "burst")
        let serverContext = try TLSContext.server(certificate: leaf.certificate, key: leaf.key)
        let clientContext = try TLSContext.client(trustRoots: .pemFiles([pki.originCA.certificatePath]))
        try await withResource(start: { MultiThreadedEventLoopGroup(numberOfThreads: 1) },
                               stop: { try? await $0.shutdownGracefully() }) { group in
            try await Self.burst(writes: writes, loop: group.next(), serverContext: serverContext, clientContext: clientContext)
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
