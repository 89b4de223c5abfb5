import Foundation
import NIOCore
import NIOPosix
import PinGateNIO
import PinGateTestSupport
import PinGateTLS
import Synchronization
import Testing

/// `TLSHandler`'s full close waits for what was written before it to reach the socket, and
/// no longer than its linger: a peer that stops reading must not keep a closed connection
/// (and its queued bytes and descriptor) for ever. The other half, a slow reader getting
/// every byte, is `HTTP2StreamingTests.slowClientConnectionClose` through the whole gate.
@Suite("Closing after a large write")
struct CloseLingerTests {
    /// When the server asked to close and when the channel really closed.
    final class CloseTimes: Sendable {
        let asked = Mutex<ContinuousClock.Instant?>(nil)
        let closed = Mutex<ContinuousClock.Instant?>(nil)
    }

    /// On the first plaintext from the client: writes `bytes`, then closes at once.
    final class WriteThenClose: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let bytes: Int
        let times: CloseTimes
        var answered = false

        init(bytes: Int, times: CloseTimes) {
            self.bytes = bytes
            self.times = times
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard !answered else { return }
            answered = true
            var body = context.channel.allocator.buffer(capacity: bytes)
            body.writeRepeatingByte(0x61, count: bytes)
            context.writeAndFlush(wrapOutboundOut(body), promise: nil)
            times.asked.withLock { $0 = .now }
            context.close(promise: nil)
        }
    }

    @Test("a peer that stops reading: the close waits out its linger, then closes anyway")
    func lingerEndsForAPeerThatStopsReading() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("linger.pingate.test")], issuer: pki.originCA, file: "origin")
        let context = try TLSContext.server(certificate: leaf.certificate, key: leaf.key)
        let times = CloseTimes()
        let linger = TimeAmount.milliseconds(600)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        try await withResource(start: {
            try await ServerBootstrap(group: group)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        channel.closeFuture.whenComplete { _ in times.closed.withLock { $0 = .now } }
                        let connection = try TLSConnection(serverOf: context, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
                        try channel.pipeline.syncOperations.addHandlers([
                            TLSHandler(connection: connection, handshakePromise: nil, closeLinger: linger),
                            WriteThenClose(bytes: 32 << 20, times: times),
                        ])
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
        }, stop: { server in
            try? await server.close()
            try? await group.shutdownGracefully()
        }) { server in
            // The client says hello, then reads nothing for 4 s: 32 MiB cannot all fit
            // in the two sockets' buffers, so the close_notify write stays queued.
            let script = """
            import socket, ssl, sys, time
            raw = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            tls = ssl.create_default_context(cafile=sys.argv[2]).wrap_socket(raw, server_hostname="linger.pingate.test")
            tls.sendall(b"go")
            time.sleep(4)
            received = 0
            try:
                while True:
                    chunk = tls.recv(1 << 20)
                    if not chunk: break
                    received += len(chunk)
            except (OSError, ssl.SSLError):
                pass
            print(received)
            """
            let run = try await TestProcess.run("python3", ["-c", script, "\(server.localAddress?.port ?? 0)", pki.originCA.certificatePath],
                                                timeout: 30)
            #expect(run.status == 0, "\(run.stderr)")
            // The client got some of it, not all: the connection was closed under it.
            let received = Int(run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            #expect(received > 0 && received < 32 << 20, "received \(received)")
            let asked = try #require(times.asked.withLock { $0 })
            let closed = try #require(times.closed.withLock { $0 })
            let waited = closed - asked
            // It waited for the bytes (a close that drops them is immediate), and gave up
            // at its linger, well before the client looked again after 4 s.
            #expect(waited >= .milliseconds(500), "closed after \(waited)")
            #expect(waited < .milliseconds(3000), "closed after \(waited)")
        }
    }
}
