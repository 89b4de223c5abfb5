import NIOCore
import NIOHTTP1

/// The upstream side of a request-aware tunnel when the upstream speaks HTTP/1.1.
///
/// Pipeline (upstream channel, behind the TLS handler): NIO's `HTTPRequestEncoder`, its
/// `HTTPResponseDecoder` (which watches the requests going out, so a response to `HEAD`
/// is read without a body; informational responses are passed on; bytes after a `101`
/// are kept for the byte relay), then this handler.
///
/// One connection, one request at a time: the tunnel's single upstream connection is the
/// one the verdict was made on, so an HTTP/2 client's concurrent streams are sent one
/// after another (each waits, head and body, until the response before it has ended).
final class HTTP1UpstreamSide: ChannelDuplexHandler, TunnelUpstreamSide {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = Never
    typealias OutboundOut = HTTPClientRequestPart

    private enum Part {
        case head(HTTPRequestHead)
        case body(ByteBuffer)
        case end(HTTPHeaders?)
    }

    private let router: TunnelRouter
    private var context: ChannelHandlerContext?
    private var nextID = 1
    /// The exchange on the wire (its request sent or being sent, its response awaited).
    private var active: Int?
    private var activeResponseHeadSeen = false
    private var activeRequestEnded = false
    private var activeKeepAlive = true
    /// Exchanges waiting for the connection, with their parts so far, in order.
    private var waiting: [(id: Int, parts: [Part], ended: Bool)] = []
    private var flow = BodyFlowControl()
    private var closing = false
    private(set) var upgraded = false
    private var switchingProtocols = false
    /// Called when a `101` switched the connection to another protocol.
    var onUpgrade: (() -> Void)?

    init(router: TunnelRouter) {
        self.router = router
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: from the router

    /// An HTTP/1.1 upstream can switch protocols (`101`, WebSocket).
    var carriesUpgrades: Bool { true }

    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int {
        let id = nextID
        nextID += 1
        var headers = HTTPHeaders()
        // Host first (RFC 9112 §3.2), from the checked authority, never the client's text.
        headers.add(name: "host", value: authority.headerValue)
        headers.add(contentsOf: head.headers)
        if let upgrade = head.upgrade {
            headers.add(name: "connection", value: "upgrade")
            headers.add(name: "upgrade", value: upgrade)
        }
        if endStream, Self.expectsContent(head.method), !headers.contains(name: "content-length") {
            headers.add(name: "content-length", value: "0")
        }
        let requestHead = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: head.method), uri: head.path, headers: headers)
        let parts: [Part] = endStream ? [.head(requestHead), .end(nil)] : [.head(requestHead)]
        if active == nil {
            activate(id)
            for part in parts { write(part, id: id) }
        } else {
            waiting.append((id, parts, endStream))
        }
        return id
    }

    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer) {
        if active == id {
            write(.body(bytes), id: id)
        } else if let index = waiting.firstIndex(where: { $0.id == id }) {
            waiting[index].parts.append(.body(bytes))
        }
    }

    func endRequest(_ id: Int, trailers: HTTPHeaders?) {
        if active == id {
            write(.end(trailers), id: id)
        } else if let index = waiting.firstIndex(where: { $0.id == id }) {
            waiting[index].parts.append(.end(trailers))
            waiting[index].ended = true
        }
    }

    func cancel(_ id: Int) {
        if active == id {
            // HTTP/1.1 cannot abandon a request in flight but by closing the connection.
            close()
        } else {
            waiting.removeAll { $0.id == id }
        }
    }

    func responseBodyPassedOn(_ id: Int, bytes: Int) {
        resumeReading(afterPassingOn: bytes)
    }

    func flush() {
        context?.flush()
    }

    func close() {
        guard let context, !closing else { return }
        closing = true
        context.flush()
        context.close(promise: nil)
    }

    /// Methods whose requests are expected to carry content (RFC 9110 §8.6: a user agent
    /// sends `Content-Length: 0` for them when there is none, so the server does not wait).
    private static func expectsContent(_ method: String) -> Bool {
        switch method {
        case "POST", "PUT", "PATCH": return true
        default: return false
        }
    }

    private func activate(_ id: Int) {
        active = id
        activeResponseHeadSeen = false
        activeRequestEnded = false
        activeKeepAlive = true
    }

    private func write(_ part: Part, id: Int) {
        guard let context else { return }
        switch part {
        case .head(let head):
            context.write(wrapOutboundOut(.head(head)), promise: nil)
        case .body(let bytes):
            let count = bytes.readableBytes
            context.write(wrapOutboundOut(.body(.byteBuffer(bytes))), promise: nil)
            if let credit = flow.wrote(id, bytes: count, writable: context.channel.isWritable) {
                router.requestBodyTransmitted(id, bytes: credit)
            }
        case .end(let trailers):
            activeRequestEnded = true
            context.writeAndFlush(wrapOutboundOut(.end(trailers)), promise: nil)
        }
    }

    // MARK: from the upstream

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !upgraded else {
            if switchingProtocols {
                // The decoder's `.end` of the 101 itself; the switch happens now, when the
                // decoder is done with the response (its removal hands on later bytes).
                switchingProtocols = false
                onUpgrade?()
                return
            }
            // Raw bytes of the new protocol, handed on by the removed decoder.
            context.fireChannelRead(data)
            return
        }
        guard let id = active else {
            // A response nobody asked for: the upstream is out of step; end the tunnel.
            close()
            return
        }
        switch unwrapInboundIn(data) {
        case .head(let head):
            if head.status.code == 101 {
                let upgrade = head.headers.first(name: "upgrade")
                router.responseHead(id, ExchangeResponseHead(status: 101, headers: HTTP1HeadFields(head.headers).endToEnd,
                                                             upgrade: upgrade), endStream: false)
                upgraded = true
                switchingProtocols = true
                return
            }
            if head.status.code >= 200 {
                activeResponseHeadSeen = true
                activeKeepAlive = head.isKeepAlive
            }
            router.responseHead(id, ExchangeResponseHead(status: Int(head.status.code),
                                                         headers: HTTP1HeadFields(head.headers).endToEnd), endStream: false)
        case .body(let bytes):
            flow.handedOver(bytes.readableBytes)
            router.responseBody(id, bytes)
        case .end(let trailers):
            guard activeResponseHeadSeen else { return }  // the end of an informational response
            active = nil
            router.responseEnd(id, trailers: trailers)
            if !activeKeepAlive || !activeRequestEnded {
                // The upstream will close, or our request is still being sent after its
                // answer: the connection cannot carry another exchange in step.
                close()
                return
            }
            startNextWaiting()
            resumeReading(afterPassingOn: nil)
        }
    }

    private func startNextWaiting() {
        guard active == nil, !waiting.isEmpty else { return }
        let next = waiting.removeFirst()
        activate(next.id)
        for part in next.parts { write(part, id: next.id) }
        if !next.ended { context?.flush() }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        router.upstreamReadComplete()
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let id = active { router.responseCancelled(id) }
        for entry in waiting { router.responseCancelled(entry.id) }
        waiting = []
        router.upstreamClosed()
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed, !upgraded {
            // The upstream is done sending. The decoder has already delivered the end of
            // a response delimited by the close; anything still awaited is cancelled as
            // the channel goes (channelInactive), and the client leg goes with it.
            close()
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // A malformed response: nothing more of this connection can be trusted.
        close()
    }

    func read(context: ChannelHandlerContext) {
        if flow.mayRead() { context.read() }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            for (id, bytes) in flow.takeOwed() { router.requestBodyTransmitted(id, bytes: bytes) }
        }
        context.fireChannelWritabilityChanged()
    }

    private func resumeReading(afterPassingOn count: Int?) {
        if flow.passedOn(count) { context?.read() }
    }
}
