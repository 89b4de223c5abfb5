import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
@testable import PinGateHTTP
import PinGateHTTP2

/// Drives one tunnel's client side, as the gate installs it after the client's TLS, with
/// fuzz bytes: an `EmbeddedChannel` holding the real codecs and side handler, the real
/// `TunnelRouter` and `AuthorityBinding`, and a stub upstream that answers what reaches
/// it. What the harness checks is what the gate promises: nothing traps, and a request
/// the binding refused never reaches the upstream.
public enum TunnelHarness {
    /// Which client side to put on the channel.
    public enum ClientProtocol: Sendable {
        /// HTTP/1.1: NIO's strict request decoder and `HTTP1ClientSide`.
        case http1
        /// HTTP/2: `HTTP2ClientSide` on an nghttp2 server session; the harness sends the
        /// client preface itself, so the fuzz bytes are frames.
        case http2
    }

    /// The tunnel's CONNECT target, and a second name its pins are taken to cover.
    static let connectHost = "pay.example.test"
    static let otherTrustedHost = "api.example.test"

    /// Runs one input. Byte 0 picks the chunk size the rest is delivered in, byte 1 how
    /// the stub upstream answers (see `StubUpstream.Answer`); the rest is the client's bytes.
    public static func run(_ client: ClientProtocol, _ input: UnsafeBufferPointer<UInt8>) {
        guard input.count >= 2 else { return }
        let chunk = Int(input[0] % 128) + 1
        let upstream = StubUpstream(answer: StubUpstream.Answer(input[1]))
        let binding = AuthorityBinding(connectHost: connectHost, connectPort: 443) { $0 == otherTrustedHost }
        let observer = TunnelRouter.Observer(refused: { _, _, _ in }, forwarded: {}, relayed: { _, _ in }, finished: { _ in })
        let router = TunnelRouter(binding: binding, clientUsesStreamIDs: client == .http2, observer: observer,
                                  now: { Date(timeIntervalSince1970: 1_800_000_000) })
        upstream.router = router
        router.upstream = upstream

        let channel = EmbeddedChannel()
        // The router holds its sides weakly (the pipeline owns them in the gate); these
        // locals keep them alive for the whole input.
        var http1Side: HTTP1ClientSide?
        var http2Side: HTTP2ClientSide?
        do {
            switch client {
            case .http1:
                let side = HTTP1ClientSide(router: router)
                try HTTP1ClientSide.addCodecs(to: channel.pipeline.syncOperations, position: .last)
                try channel.pipeline.syncOperations.addHandler(side)
                router.client = side
                http1Side = side
            case .http2:
                let side = try HTTP2ClientSide(router: router, limits: HTTP2Session.Limits(), advertisesExtendedConnect: true)
                try channel.pipeline.syncOperations.addHandler(side)
                router.client = side
                http2Side = side
            }
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 40000)).wait()
        } catch {
            preconditionFailure("harness set-up failed: \(error)")
        }

        var bytes = Array(input[2...])
        if client == .http2 { bytes = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + bytes }
        var offset = 0
        while offset < bytes.count, channel.isActive {
            let end = min(offset + chunk, bytes.count)
            var buffer = channel.allocator.buffer(capacity: end - offset)
            buffer.writeBytes(bytes[offset..<end])
            offset = end
            do {
                try channel.writeInbound(buffer)
            } catch {
                // A decoder error closes the connection in the gate; here it ends the input.
                break
            }
            channel.pipeline.fireChannelReadComplete()
            upstream.answerPending()
            channel.embeddedEventLoop.run()
            drainOutbound(channel)
        }
        upstream.answerPending()
        drainOutbound(channel)
        _ = try? channel.finish(acceptAlreadyClosed: true)
        withExtendedLifetime((http1Side, http2Side)) {}
    }

    private static func drainOutbound(_ channel: EmbeddedChannel) {
        while (try? channel.readOutbound(as: ByteBuffer.self)) ?? nil != nil {}
        while (try? channel.readOutbound(as: IOData.self)) ?? nil != nil {}
    }
}

/// The tunnel's upstream side, answering from the fuzz input's second byte.
final class StubUpstream: TunnelUpstreamSide {
    /// How requests that reach the upstream are answered.
    struct Answer {
        /// Answer at all (else requests stay pending, as with a slow origin).
        var responds: Bool
        /// Abandon instead of answering (an upstream reset).
        var cancels: Bool
        /// Agree to an upgrade when one is asked for (`101`).
        var agreesToUpgrade: Bool
        /// Send a body with the answer.
        var sendsBody: Bool

        init(_ byte: UInt8) {
            responds = byte & 1 == 0
            cancels = byte & 2 != 0
            agreesToUpgrade = byte & 4 != 0
            sendsBody = byte & 8 == 0
        }
    }

    weak var router: TunnelRouter?
    private let answer: Answer
    private var nextID = 1
    private var started: [Int: ExchangeRequestHead] = [:]
    private var ended: Set<Int> = []
    private var credits: [(Int, Int)] = []

    init(answer: Answer) { self.answer = answer }

    func upgradeRefusal(for head: ExchangeRequestHead) -> String? {
        head.upgrade?.lowercased() == "websocket" ? nil : "the fuzz upstream carries only websocket"
    }

    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int {
        // The promise under test: nothing the binding refused is ever started.
        precondition(authority.host == TunnelHarness.connectHost || authority.host == TunnelHarness.otherTrustedHost,
                     "a request for \(authority) reached the upstream")
        let id = nextID
        nextID += 1
        started[id] = head
        if endStream { ended.insert(id) }
        return id
    }

    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer) { credits.append((id, bytes.readableBytes)) }
    func endRequest(_ id: Int, trailers: HTTPHeaders?) { ended.insert(id) }
    func cancel(_ id: Int) { started[id] = nil; ended.remove(id) }
    func responseBodyPassedOn(_ id: Int, bytes: Int) {}
    func flush() {}
    func close() { started = [:]; ended = [] }
    var switchedProtocols: Bool { false }
    var carriesExtendedConnect: Bool { true }
    var reuseBlocker: UpstreamNotPooledReason? { started.isEmpty ? nil : .inFlight }
    func park() { router = nil }
    func attach(to router: TunnelRouter) { self.router = router }
    func detach() { router = nil }

    /// Passes on the body credits and answers every request whose body has ended.
    func answerPending() {
        guard let router else { return }
        let owed = credits
        credits = []
        for (id, count) in owed { router.requestBodyWritten(id, bytes: count, writable: true) }
        guard answer.responds else { return }
        for id in ended.sorted() {
            guard let head = started.removeValue(forKey: id) else { continue }
            ended.remove(id)
            if answer.cancels {
                router.responseCancelled(id)
                continue
            }
            if let upgrade = head.upgrade, answer.agreesToUpgrade {
                router.responseHead(id, ExchangeResponseHead(status: 101, headers: HTTPHeaders(), upgrade: upgrade),
                                    endStream: false)
                continue
            }
            var body = ByteBuffer()
            if answer.sendsBody { body.writeString("fuzz body\n") }
            router.responseHead(id, ExchangeResponseHead(status: 200, headers: ["content-length": "\(body.readableBytes)"]),
                                endStream: false)
            if body.readableBytes > 0 { router.responseBody(id, body) }
            router.responseEnd(id, trailers: nil)
        }
        router.upstreamReadComplete()
    }
}
