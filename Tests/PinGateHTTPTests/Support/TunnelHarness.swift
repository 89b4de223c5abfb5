import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
@testable import PinGateHTTP
import PinGateHTTP2

/// One tunnel's client side, as the gate installs it after the client's TLS, in an
/// `EmbeddedChannel`: the real codecs and side handler, the real `TunnelRouter` and
/// `AuthorityBinding`, and a stub upstream that answers what reaches it. The fuzz targets
/// (Fuzz/) drive it with fuzz bytes (`run`); the HTTP layer's unit tests drive it with
/// chosen bytes and read what the side wrote back. What it checks on every input is what
/// the gate promises: nothing traps, and a request the binding refused never reaches the
/// upstream.
public final class TunnelHarness {
    /// Which client side to put on the channel.
    public enum ClientProtocol: Sendable {
        /// HTTP/1.1: NIO's strict request decoder and `HTTP1ClientSide`.
        case http1
        /// HTTP/2: `HTTP2ClientSide` on an nghttp2 server session; the harness sends the
        /// client preface itself, so the bytes given are frames.
        case http2
    }

    /// The tunnel's CONNECT target, and a second name its pins are taken to cover.
    public static let connectHost = "pay.example.test"
    public static let otherTrustedHost = "api.example.test"

    /// The client's connection.
    public let channel = EmbeddedChannel()
    /// The upstream the router forwards to.
    let upstream: StubUpstream
    let router: TunnelRouter
    // The router holds its sides weakly (the pipeline owns them in the gate); these keep
    // them alive for the harness's life.
    private var http1Side: HTTP1ClientSide?
    private var http2Side: HTTP2ClientSide?

    /// A tunnel whose client speaks `client`, its upstream answering as `answer` says.
    public init(_ client: ClientProtocol, answer: StubAnswer) throws {
        upstream = StubUpstream(answer: answer)
        let binding = AuthorityBinding(connectHost: Self.connectHost, connectPort: 443) { $0 == Self.otherTrustedHost }
        let observer = TunnelRouter.Observer(refused: { _, _, _ in }, forwarded: {}, relayed: { _, _ in }, finished: { _ in })
        router = TunnelRouter(binding: binding, clientUsesStreamIDs: client == .http2, observer: observer,
                              now: { Date(timeIntervalSince1970: 1_800_000_000) })
        upstream.router = router
        router.upstream = upstream
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
        if client == .http2 { _ = deliver(Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)) }
    }

    /// The client sends `bytes`, `chunk` at a time (each a read burst), while the
    /// connection is open; the upstream answers what is due after each. False when the
    /// side's decoder refused them (the gate then closes the connection).
    @discardableResult
    public func deliver(_ bytes: [UInt8], chunk: Int = .max) -> Bool {
        var offset = 0
        while offset < bytes.count, channel.isActive {
            let end = min(offset + max(1, chunk), bytes.count)
            var buffer = channel.allocator.buffer(capacity: end - offset)
            buffer.writeBytes(bytes[offset..<end])
            offset = end
            do {
                try channel.writeInbound(buffer)
            } catch {
                return false
            }
            channel.pipeline.fireChannelReadComplete()
            settle()
        }
        return true
    }

    /// The upstream answers what is due, and what that hands on (a pipelined request
    /// released by the answer before it) is answered too, until nothing more moves.
    private func settle() {
        repeat {
            channel.embeddedEventLoop.run()
        } while upstream.answerPending()
        channel.embeddedEventLoop.run()
    }

    /// Everything the side wrote to the client since the last call.
    public func written() -> [UInt8] {
        var bytes: [UInt8] = []
        while let data = try? channel.readOutbound(as: IOData.self) {
            switch data {
            case .byteBuffer(let buffer): bytes += buffer.readableBytesView
            case .fileRegion: break
            }
        }
        while let buffer = try? channel.readOutbound(as: ByteBuffer.self) { bytes += buffer.readableBytesView }
        return bytes
    }

    /// How many requests reached the upstream.
    public var requestsStarted: Int { upstream.requestsStarted }

    /// How many request body bytes reached the upstream.
    public var requestBodyBytesForwarded: Int { upstream.bodyBytesForwarded }

    /// True while the client's connection is open.
    public var isOpen: Bool { channel.isActive }

    /// Ends the tunnel: the upstream answers what is still due, and the channel closes.
    public func finish() {
        upstream.answerPending()
        _ = written()
        _ = try? channel.finish(acceptAlreadyClosed: true)
        withExtendedLifetime((http1Side, http2Side)) {}
    }

    /// Runs one fuzz input. Byte 0 picks the chunk size the rest is delivered in, byte 1
    /// how the stub upstream answers (see `StubAnswer`); the rest is the client's
    /// bytes.
    public static func run(_ client: ClientProtocol, _ input: UnsafeBufferPointer<UInt8>) {
        guard input.count >= 2 else { return }
        let harness: TunnelHarness
        do {
            harness = try TunnelHarness(client, answer: StubAnswer(input[1]))
        } catch {
            preconditionFailure("harness set-up failed: \(error)")
        }
        let chunk = Int(input[0] % 128) + 1
        var offset = 2
        // Delivered a chunk at a time, what was written drained after each (a fuzz run's
        // memory stays flat), until the decoder refuses or the connection closes.
        while offset < input.count, harness.isOpen {
            let end = min(offset + chunk, input.count)
            guard harness.deliver(Array(input[offset..<end])) else { break }
            _ = harness.written()
            offset = end
        }
        harness.finish()
    }
}

/// How requests that reach the upstream are answered.
public struct StubAnswer: Sendable {
    /// Answer at all (else requests stay pending, as with a slow origin).
    var responds: Bool
    /// Abandon instead of answering (an upstream reset).
    var cancels: Bool
    /// Agree to an upgrade when one is asked for (`101`).
    var agreesToUpgrade: Bool
    /// Send a body with the answer.
    var sendsBody: Bool
    /// State the body's length (`content-length`), as an HTTP/1.1 origin's fixed-length
    /// answer does; else it is open, known only at its end (an h2 origin's DATA).
    var statesLength: Bool

    /// An answer as a fuzz input's byte picks it, bit by bit.
    public init(_ byte: UInt8) {
        responds = byte & 1 == 0
        cancels = byte & 2 != 0
        agreesToUpgrade = byte & 4 != 0
        sendsBody = byte & 8 == 0
        statesLength = byte & 16 == 0
    }

    /// An upstream that answers each request at once with a body, stating its length
    /// or not.
    public static func answering(statesLength: Bool) -> StubAnswer {
        StubAnswer(statesLength ? 0 : 16)
    }
}

/// The tunnel's upstream side, answering as its `StubAnswer` says.
final class StubUpstream: TunnelUpstreamSide {
    /// How many requests reached it.
    private(set) var requestsStarted = 0
    /// How many request body bytes reached it.
    private(set) var bodyBytesForwarded = 0

    weak var router: TunnelRouter?
    private let answer: StubAnswer
    private var nextID = 1
    private var started: [Int: ExchangeRequestHead] = [:]
    private var ended: Set<Int> = []
    private var credits: [(Int, Int)] = []

    init(answer: StubAnswer) { self.answer = answer }

    func upgradeRefusal(for head: ExchangeRequestHead) -> String? {
        head.upgrade?.lowercased() == "websocket" ? nil : "the fuzz upstream carries only websocket"
    }

    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int {
        // The promise under test: nothing the binding refused is ever started.
        precondition(authority.host == TunnelHarness.connectHost || authority.host == TunnelHarness.otherTrustedHost,
                     "a request for \(authority) reached the upstream")
        let id = nextID
        nextID += 1
        requestsStarted += 1
        started[id] = head
        if endStream { ended.insert(id) }
        return id
    }

    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer) {
        bodyBytesForwarded += bytes.readableBytes
        credits.append((id, bytes.readableBytes))
    }
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

    /// Passes on the body credits and answers every request whose body has ended; true
    /// when it answered any.
    @discardableResult
    func answerPending() -> Bool {
        guard let router else { return false }
        var answered = false
        let owed = credits
        credits = []
        for (id, count) in owed { router.requestBodyWritten(id, bytes: count, writable: true) }
        guard answer.responds else { return false }
        for id in ended.sorted() {
            guard let head = started.removeValue(forKey: id) else { continue }
            ended.remove(id)
            answered = true
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
            let fields: HTTPHeaders = answer.statesLength ? ["content-length": "\(body.readableBytes)"] : [:]
            router.responseHead(id, ExchangeResponseHead(status: 200, headers: fields), endStream: false)
            if body.readableBytes > 0 { router.responseBody(id, body) }
            router.responseEnd(id, trailers: nil)
        }
        router.upstreamReadComplete()
        return answered
    }
}
