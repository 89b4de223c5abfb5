import Foundation
import NIOCore
import NIOPosix
import PinGateNIO
import PinGateTestSupport
import PinGateTLS
import Synchronization
import Testing
@testable import PinGate

/// An HTTP/1.1 upstream that sends a response before any request was sent to it is out
/// of step with the tunnel: nothing it says can be paired with a request, so its
/// connection closes at once, counted (`upstreamUnsolicitedBytes`), with nothing sent to
/// it. The upstream side's HTTP codecs go in only with the first request (an idle tunnel
/// does not carry them), so these bytes meet the side with no decoder in front. The
/// client's connection outlives it (issue 31): its first request would get a new upstream
/// connection, verified like the first.
@Suite("An HTTP/1.1 upstream that speaks first", .serialized)
struct UnsolicitedUpstreamTests {
    static let host = "early.pingate.test"

    @Test("a response before any request closes the upstream connection at once, counted, with nothing sent to it; the client's connection stays for its next request")
    func responseBeforeAnyRequest() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "early")
        let unasked = "HTTP/1.1 408 Request Timeout\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n"
        try await H2EchoOrigin.with(script: "silent_peer.py", ["--cert", leaf.certificatePath, "--key", leaf.keyPath,
                                                               "--alpn", "http/1.1", "--say", unasked]) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(origin.port)"], configure: { $0.idleTimeout = .seconds(120) }) { gate in
                try await withResource(start: { MultiThreadedEventLoopGroup(numberOfThreads: 1) },
                                       stop: { (group: MultiThreadedEventLoopGroup) in try? await group.shutdownGracefully() }) { (group: MultiThreadedEventLoopGroup) in
                    var settings = TLSClientSettings()
                    settings.parentProxy = ParentProxy(host: "127.0.0.1", port: gate.port)
                    let connector = TLSClientConnector(settings: settings, context: try TLSContext.client(trustRoots: .pemFiles([gate.caPath])))
                    let loop = group.next()
                    let ended = loop.makePromise(of: Void.self)
                    let sawEnd = EndSeen()
                    // CONNECT and the client's TLS, and then the client says nothing. (The
                    // connector allows half-closure: the gate's end shows as end of input.)
                    let tunnel = try await connector.connect(host: Self.host, port: origin.port, alpnOffer: ["http/1.1"],
                                                             on: loop, makeHandlers: { [EndWatcher(ended: ended, seen: sawEnd)] }).get()
                    let originClosed = await eventually(timeout: .seconds(10)) {
                        origin.events.contains { $0["event"] as? String == "closed" }
                    }
                    #expect(originClosed, "\(origin.events) \(origin.errors)")
                    #expect(origin.events.filter { $0["event"] as? String == "closed" }.allSatisfy { $0["received"] as? Int == 0 },
                            "the upstream was sent bytes: \(origin.events)")
                    #expect(await eventually(timeout: .seconds(5)) { gate.statistics.upstreamUnsolicitedBytes == 1 })
                    // The client's leg stays: the gate did not end it with its upstream's.
                    try await Task.sleep(for: .milliseconds(300))
                    #expect(!sawEnd.value.withLock { $0 }, "the gate ended the client's leg with its upstream's")
                    #expect(gate.statistics.openTunnels == 1)
                    tunnel.channel.close(promise: nil)
                    try? await ended.futureResult.get()
                }
                #expect(await eventually(timeout: .seconds(10)) { gate.statistics.openTunnels == 0 }, "\(gate.statistics)")
                #expect(gate.statistics.requestsForwarded == 0)
                #expect(gate.statistics.count(.trusted) == 1)
            }
        }
    }

    /// Whether the gate ended the client's connection, readable from the test's task.
    private final class EndSeen: Sendable {
        let value = Mutex(false)
    }

    /// Completes `ended` when the gate ends the connection (end of input, or the close).
    private final class EndWatcher: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer

        private let ended: EventLoopPromise<Void>
        private let seen: EndSeen

        init(ended: EventLoopPromise<Void>, seen: EndSeen) {
            self.ended = ended
            self.seen = seen
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if let event = event as? ChannelEvent, event == .inputClosed {
                seen.value.withLock { $0 = true }
                ended.succeed(())
            }
            context.fireUserInboundEventTriggered(event)
        }

        func channelInactive(context: ChannelHandlerContext) {
            seen.value.withLock { $0 = true }
            ended.succeed(())
            context.fireChannelInactive()
        }
    }
}
