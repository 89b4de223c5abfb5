import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import PinGateTLS
import PinGateTestSupport
import PinList
import Synchronization
@testable import PinGate
@testable import PinGateNIO

/// A real HTTPS list server on 127.0.0.1, port 0, whose answer the test changes at will:
/// a list, a signed dynamic answer, an error status, a truncated body, or silence.
final class TestListServer: Sendable {
    enum Behaviour: Sendable {
        /// 200 with this body.
        case serve(Data)
        /// 200 with this body, signed over the request's challenge with `key`
        /// (`signatureHeader` nil: no signature header at all).
        case dynamic(Data, key: PrivateKey?, signatureHeaderName: String = "X-Cert-Pinning-Signature")
        /// This status, empty body.
        case status(Int)
        /// Headers promising more than is sent, then the connection closes.
        case truncated(Data)
        /// Never answers.
        case hang
    }

    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let shared: SharedState

    var port: Int { channel.localAddress?.port ?? 0 }
    /// Every request head received, oldest first.
    var receivedRequests: [HTTPRequestHead] { shared.requests.withLock { $0 } }
    /// The bodies of POST requests, oldest first (the report collector's view).
    var receivedBodies: [Data] { shared.bodies.withLock { $0 } }

    private init(group: MultiThreadedEventLoopGroup, channel: Channel, shared: SharedState) {
        self.group = group
        self.channel = channel
        self.shared = shared
    }

    func set(_ next: Behaviour) { shared.behaviour.withLock { $0 = next } }

    static func start(identity: TestPKI.Identity, behaviour initial: Behaviour) async throws -> TestListServer {
        let context = try TLSContext.server(certificate: identity.certificate, key: identity.key)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let shared = SharedState(behaviour: initial)
        do {
            let channel = try await ServerBootstrap(group: group)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let connection = try TLSConnection(serverOf: context, options: .init(preferredALPN: "http/1.1", pauseWhenPreferredALPNMissing: false))
                        try channel.pipeline.syncOperations.addHandlers([
                            TLSHandler(connection: connection, handshakePromise: nil),
                            HTTPResponseEncoder(),
                            ByteToMessageHandler(HTTPRequestDecoder()),
                            ListRequestHandler(shared: shared),
                        ])
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
            return TestListServer(group: group, channel: channel, shared: shared)
        } catch {
            // A failed bind must not leave the group's thread running.
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// Starts a list server as `start` does, runs `body` with it, and stops the server
    /// whether `body` returns or throws. `body` may stop it itself (a restart with the
    /// list server down): `stop()` is idempotent. What it received stays readable.
    static func with<Value>(
        identity: TestPKI.Identity,
        behaviour: Behaviour,
        isolation: isolated (any Actor)? = #isolation,
        _ body: (TestListServer) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: { try await start(identity: identity, behaviour: behaviour) },
            stop: { await $0.stop() },
            body: body)
    }

    /// Stops the server; later calls do nothing (an event-loop group shuts down once).
    func stop() async {
        guard shared.stopped.withLock({ stopped in defer { stopped = true }; return !stopped }) else { return }
        try? await channel.close()
        try? await group.shutdownGracefully()
    }

    final class SharedState: Sendable {
        let behaviour: Mutex<Behaviour>
        let requests = Mutex<[HTTPRequestHead]>([])
        let bodies = Mutex<[Data]>([])
        let stopped = Mutex(false)
        init(behaviour: Behaviour) { self.behaviour = Mutex(behaviour) }
    }
}

private final class ListRequestHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let shared: TestListServer.SharedState
    private var head: HTTPRequestHead?
    private var body = Data()

    init(shared: TestListServer.SharedState) { self.shared = shared }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let received):
            head = received
            shared.requests.withLock { $0.append(received) }
        case .body(let chunk):
            body.append(contentsOf: chunk.readableBytesView)
        case .end:
            guard let head else { return }
            if head.method == .POST {
                let received = body
                shared.bodies.withLock { $0.append(received) }
            }
            respond(context: context, to: head)
        }
    }

    private func respond(context: ChannelHandlerContext, to request: HTTPRequestHead) {
        var headers = HTTPHeaders([("Content-Type", "application/json"), ("Connection", "close")])
        let body: Data
        var status = HTTPResponseStatus.ok
        var declaredLength: Int?
        switch shared.behaviour.withLock({ $0 }) {
        case .hang:
            return
        case .serve(let data):
            body = data
        case .status(let code):
            status = HTTPResponseStatus(statusCode: code)
            body = Data()
        case .truncated(let data):
            body = data.prefix(data.count / 2)
            declaredLength = data.count
        case .dynamic(let data, let key, let name):
            body = data
            if let key, let challenge = request.headers.first(name: WultraDynamicList.challengeHeader),
               let signature = try? WultraDynamicList.sign(body: data, challenge: challenge, key: key) {
                headers.add(name: name, value: signature)
            }
        }
        headers.add(name: "Content-Length", value: "\(declaredLength ?? body.count)")
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        var buffer = context.channel.allocator.buffer(capacity: body.count)
        buffer.writeBytes(body)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        if declaredLength != nil {
            context.flush()
            context.close(promise: nil)
            return
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.close(promise: nil)
    }
}
