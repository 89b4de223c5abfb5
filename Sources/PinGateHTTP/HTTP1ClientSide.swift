import NIOCore
import NIOHTTP1
import PinGateNIO

/// The client side of a request-aware tunnel when the client speaks HTTP/1.x.
///
/// Pipeline (client channel, behind the TLS handler): NIO's `HTTPRequestDecoder` (llhttp,
/// strict: `Content-Length` with `Transfer-Encoding`, duplicate `Content-Length`, bare LF
/// and bad header bytes are parse errors), then this handler (`addCodecs`). It turns
/// request parts into router calls, and router calls into the answer's bytes, which it
/// encodes itself (`HTTP1ResponseWriter`) and writes to the TLS handler.
///
/// Pipelining: a request that arrives while the previous response is still going out waits
/// here, parts and all, and reading stops until it has been handed on, so responses leave in
/// order whether the gate or the upstream answers. This handler does it rather than NIO's
/// `HTTPServerPipelineHandler`, which stops reading after *every* request until its response
/// ends: on a keep-alive connection, where the client waits for each answer, that costs two
/// `epoll_ctl` calls per request and holds nothing back.
///
/// Backpressure: request body bytes handed to the router but not yet passed on by the
/// upstream side are counted; past `BodyFlowControl.bytesInFlightLimit` this handler stops reading
/// from the client until credits come back. Response body bytes are credited to the
/// upstream side only while this channel is writable.
final class HTTP1ClientSide: ChannelDuplexHandler, TunnelClientSide {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = Never
    typealias OutboundOut = ByteBuffer

    private let router: TunnelRouter
    private var context: ChannelHandlerContext?
    /// The request whose parts are arriving (head seen, end not yet): its body goes to the
    /// router under this id. It may outlive its answer (a refusal, an early response).
    private var reading: (id: Int, hasBody: Bool)?
    /// The request being answered: from its head until its response ended.
    private var answering: (id: Int, version: HTTPVersion, keepAlive: Bool, method: HTTPMethod)?
    /// Parts of pipelined requests, in order, waiting for the response before them to end.
    private var queued = CircularBuffer<HTTPServerRequestPart>()
    /// A read was asked for while requests were queued; it goes ahead once they are handed on.
    private var readHeldForQueue = false
    /// Set while queued parts are being handed on (an answer given meanwhile must not
    /// start handing them on a second time).
    private var handingOnQueued = false
    private var nextID = 1
    /// How the answer being written is framed on the wire.
    private var responseWriter = HTTP1ResponseWriter()
    /// Where head buffers come from: the loop's recycler, which hands a buffer out again
    /// only once the TLS handler has sealed it and let go. Reached on the loop's thread.
    private lazy var recycler = ByteBufferRecycler.forCurrentThread()
    private var flow = BodyFlowControl()
    private var closing = false
    /// The client half-closed: no request will follow the one in flight.
    private var inputEnded = false
    /// The decoder refused bytes after the requests already read (a bad pipelined request,
    /// an HTTP/2 preface): they are answered first, then a 400 with this text, then the close.
    private var pendingParseError: String?
    /// A request broke its framing: whatever answer it gets is the connection's last.
    private var failing = false
    /// The gate is shutting down: the answer in flight is the connection's last.
    private var drainRequested = false
    /// Set once an upgrade (WebSocket) made this a byte relay: parts no longer come.
    private(set) var upgraded = false
    /// A request that asks for an upgrade is in progress: whether it was read to its end,
    /// and whether it was answered without a switch. Both, and the codecs are renewed.
    private var upgradeAsked: (requestEnded: Bool, answered: Bool)?
    /// The current request's `Sec-WebSocket-Key`, kept for an upgrade the upstream grants
    /// in HTTP/2's form (a 2xx to an extended CONNECT, which carries no accept): the gate
    /// then answers the `101` with the accept for the client's own key.
    private var webSocketKey: String?
    /// The exchange whose WebSocket is relayed through this side (raw bytes in both
    /// directions, as the stream DATA of an HTTP/2 upstream's extended CONNECT).
    private var relaying: Int?

    init(router: TunnelRouter) {
        self.router = router
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: from the client

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !upgraded else {
            // After an upgrade the decoder forwards raw bytes to the byte relay behind.
            context.fireChannelRead(data)
            return
        }
        let part = unwrapInboundIn(data)
        guard queued.isEmpty else {
            // Behind a waiting request: in order, after it.
            queued.append(part)
            return
        }
        handle(part)
    }

    private func handle(_ part: HTTPServerRequestPart) {
        switch part {
        case .head(let head):
            guard answering == nil else {
                // Pipelined: the client sent this before the previous answer ended.
                queued.append(part)
                return
            }
            started(head)
        case .body(let bytes):
            guard let reading else { return }
            flow.handedOver(bytes.readableBytes)
            router.requestBody(reading.id, bytes)
        case .end(let trailers):
            let ended = reading
            reading = nil
            if upgradeAsked != nil {
                upgradeAsked?.requestEnded = true
                renewCodecsWhenDue()
            }
            guard let ended, ended.hasBody else { return }
            router.requestEnd(ended.id, trailers: trailers)
        }
    }

    /// Hands on the queued parts once the response before them ended, up to the next
    /// request that must wait again; then reading resumes if it was held for them.
    private func handOnQueued() {
        guard !handingOnQueued else { return }
        handingOnQueued = true
        defer { handingOnQueued = false }
        while let part = queued.first, !closing, !upgraded {
            if case .head = part, answering != nil { return }
            queued.removeFirst()
            handle(part)
        }
        if queued.isEmpty, readHeldForQueue {
            readHeldForQueue = false
            read(context: context)
        }
        if queued.isEmpty, let detail = pendingParseError, !closing {
            // Everything read before the bad bytes has been handed on: a request cut by them
            // is abandoned, else once the last answer is out the client hears why.
            if reading != nil {
                failRequestBeingRead(detail: detail)
            } else if answering == nil {
                refuseMalformed(detail: detail)
            }
            return
        }
        if queued.isEmpty, inputEnded, answering == nil { close() }
    }

    private func started(_ head: HTTPRequestHead) {
        let id = nextID
        nextID += 1
        let fields = HTTP1HeadFields(head.headers)
        let hasBody = fields.hasBody
        reading = (id, hasBody)
        answering = (id, head.version, head.isKeepAlive, head.method)
        // The protocol an `Upgrade` asks for, when `Connection` names it (read once: the
        // router forwards it, and the codecs must be renewed if no 101 follows).
        // A CONNECT has no Upgrade semantics in HTTP/1.1: one that names an Upgrade anyway is
        // still a classic CONNECT (refused 405), never mistaken for an RFC 8441 one.
        // Only WebSocket is carried: any other token (`h2c` above all, which would switch the
        // upstream connection to a protocol the gate then relays unread, streams for any
        // authority included) is dropped with the `Upgrade` field, as are `HTTP2-Settings`
        // (connection-specific), and the request goes on as an ordinary one.
        let asksUpgrade = head.method != .CONNECT && fields.upgrade != nil
        let upgrade = asksUpgrade ? fields.upgrade.flatMap { WebSocketHandshake.isWebSocket($0) ? $0 : nil } : nil
        // As llhttp decides it (any `Upgrade` token): once such a request ended, NIO's decoder
        // stops parsing, and must be renewed if the answer was not a switch.
        upgradeAsked = head.method == .CONNECT || asksUpgrade ? (requestEnded: false, answered: false) : nil
        webSocketKey = upgrade != nil ? head.headers.first(name: "sec-websocket-key") : nil
        let route: (authority: String, path: String)
        switch Self.target(method: head.method, uri: head.uri, hosts: fields.hosts) {
        case .route(let authority, let path):
            route = (authority, path)
        case .noAuthority:
            router.requestHead(id, ExchangeRequestHead(method: head.method.rawValue, path: head.uri, authority: nil,
                                                       headers: [:], upgrade: nil), endStream: !hasBody)
            return
        case .refused(let detail):
            router.requestRefused(id, method: head.method.rawValue, path: head.uri, detail: detail)
            return
        }
        var headers = fields.endToEnd
        if fields.wantsTrailers { headers.add(name: "te", value: "trailers") }
        let exchange = ExchangeRequestHead(method: head.method.rawValue, path: route.path, authority: route.authority,
                                           headers: headers, upgrade: upgrade)
        router.requestHead(id, exchange, endStream: !hasBody)
    }

    /// Where a request is going, read from its target and `Host` fields (RFC 9112 §3.2).
    enum Target: Equatable {
        /// The authority the request names and the origin-form path to send upstream.
        case route(authority: String, path: String)
        /// The request names no single authority (no `Host`, or two): the router answers 400.
        case noAuthority
        /// The target is in a form the gate does not relay; the text of the 400 says which.
        case refused(String)
    }

    /// The target of a request with `method`, `uri` and `hosts` (its `Host` values):
    /// - origin form (`/path`) takes its authority from the one `Host`;
    /// - absolute form wins over `Host` (RFC 9112 §3.2.2), for `http` and `https` only (any
    ///   case): another scheme (`ftp://`, `ws://`, `wss://`) is refused, since an origin may
    ///   route it by the name in it, which the authority binding never saw;
    /// - `*` only with `OPTIONS` (asterisk form), its authority from `Host`;
    /// - authority form only with `CONNECT` (the router refuses a classic CONNECT with 405).
    static func target(method: HTTPMethod, uri: String, hosts: some Collection<String>) -> Target {
        // Origin form (`/path`), the common case, is told by its first byte alone.
        let first = uri.utf8.first
        if first != UInt8(ascii: "/") {
            if let schemeEnd = uri.range(of: "://") {
                let scheme = uri[..<schemeEnd.lowerBound]
                guard HTTP1HeadFields.equalsLowercased(scheme, "https") || HTTP1HeadFields.equalsLowercased(scheme, "http") else {
                    return .refused("the request target's scheme \"\(scheme)\" is not http or https; only those are relayed inside a tunnel")
                }
                let rest = uri[schemeEnd.upperBound...]
                let end = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
                let path = rest[end...]
                guard !rest[..<end].isEmpty, !path.hasPrefix("#") else {
                    return .refused("the absolute-form request target \"\(uri)\" names no authority or path")
                }
                return .route(authority: String(rest[..<end]), path: path.isEmpty ? "/" : (path.hasPrefix("?") ? "/" + path : String(path)))
            }
            let asteriskForm = uri == "*" && method == .OPTIONS
            guard asteriskForm || method == .CONNECT else {
                return .refused("the request target \"\(uri)\" is not origin-form (/path), absolute-form (http or https) or * for OPTIONS")
            }
        }
        guard hosts.count == 1, let host = hosts.first else { return .noAuthority }
        return .route(authority: host, path: uri)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        router.clientReadComplete()
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // The decoder refused the bytes (a smuggling shape, a bad header or chunk, an
        // oversized head, an HTTP/2 preface). The connection cannot be trusted to be in step
        // any more: nothing after the error is read, and the connection closes once the
        // client has been told.
        guard !closing, pendingParseError == nil else { return }
        guard !upgraded else {
            // After a switch the connection carries the relayed protocol: an HTTP answer
            // written now would land in the middle of its bytes. The error is the relayed
            // protocol's or the transport's (a TLS alert, bytes that are not TLS): the tunnel
            // ends, as a byte relay's does.
            close()
            return
        }
        let detail = "\(error)"
        if reading != nil, queued.isEmpty {
            // The request being read broke its framing after its head was decided on.
            failRequestBeingRead(detail: detail)
            return
        }
        // The error is in a request after the ones already read: those are answered first,
        // in order (a client that pipelined a good request before bad bytes gets its
        // answer), then the 400 and the close (`handOnQueued`).
        pendingParseError = detail
        if answering == nil && queued.isEmpty { refuseMalformed(detail: detail) }
    }

    /// The request whose body was being read broke its framing (a bad chunk size, a bare LF,
    /// a bad extension). If its head went upstream, the router abandons the upstream's half
    /// of it and answers 400, or cuts the exchange once a response has begun; either way
    /// this connection closes after that.
    private func failRequestBeingRead(detail: String) {
        guard let current = reading else { return }
        reading = nil
        failing = true
        // Forwarded: the router abandons the upstream's half and answers 400 (or cuts the
        // exchange once its response began). Not forwarded (refused, or answered already):
        // only counted. Either way whatever answer was written goes out, then the close.
        if !router.abandonRequest(current.id, detail: detail) { router.protocolError(detail: detail) }
        close()
    }

    /// Answers a request the decoder refused: 400 `malformed-request`, counted and logged,
    /// then the close. Nothing of that request went upstream.
    private func refuseMalformed(detail: String) {
        guard let context, !closing else { return }
        closing = true
        router.protocolError(detail: detail)
        let body = "pingate: refused malformed HTTP/1.1 (\(detail))\n"
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: "text/plain; charset=utf-8")
        headers.add(name: "content-length", value: "\(body.utf8.count)")
        headers.add(name: "pingate-refusal", value: RequestRefusal.malformedRequest.rawValue)
        headers.add(name: "connection", value: "close")
        writeHead(version: .http1_1, status: 400, headers: headers, requestMethod: nil, context: context)
        writeBody(context.channel.allocator.buffer(string: body), context: context)
        writeEnd(trailers: nil, context: context)
        context.flush()
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed, let id = relaying {
            // The client ended its half of the relayed WebSocket: the upstream stream ends
            // too, at once (no read burst ends after this to flush it).
            router.requestEnd(id, trailers: nil)
            router.clientReadComplete()
            return
        }
        if event is IdleStateHandler.IdleStateEvent, relaying != nil {
            close()
            return
        }
        if let event = event as? ChannelEvent, event == .inputClosed, !upgraded {
            // The client sent its last request (or left). The connection is half-open:
            // answer what is in flight, then close; with nothing in flight, close now,
            // which also closes the upstream leg.
            inputEnded = true
            if answering == nil && queued.isEmpty { close() }
            return
        }
        if event is TunnelDrainEvent, !upgraded {
            // The gate is shutting down: the response in flight says `Connection: close` and
            // is the last; an idle connection closes now.
            drainRequested = true
            if answering == nil && queued.isEmpty { close() }
            return
        }
        if event is IdleStateHandler.IdleStateEvent, !upgraded {
            // No traffic either way for the idle timeout: the tunnel ends (the byte relay
            // does the same after an upgrade).
            close()
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        router.clientClosed()
        context.fireChannelInactive()
    }

    func read(context: ChannelHandlerContext) {
        guard queued.isEmpty else {
            readHeldForQueue = true
            return
        }
        if flow.mayRead() { context.read() }
    }

    private func read(context: ChannelHandlerContext?) {
        if let context { read(context: context) }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { router.clientDrained() }
        context.fireChannelWritabilityChanged()
    }

    // MARK: from the router

    func sendResponseHead(_ id: Int, _ head: ExchangeResponseHead, endStream: Bool) {
        guard let context, var current = answering, current.id == id else { return }
        if head.status != 101, head.upgrade != nil {
            switchToRelay(id, head, context: context)
            return
        }
        var headers = head.headers
        // The gate's framing, never the upstream's fields as they came (NIO's automatic
        // framing is off): a body only a close can end makes this the connection's last answer.
        if head.framing.applyHTTP1(to: &headers, version: current.version) {
            current.keepAlive = false
            answering = current
        }
        if head.status == 101, let upgrade = head.upgrade {
            headers.add(name: "connection", value: "upgrade")
            headers.add(name: "upgrade", value: upgrade)
        } else if (!current.keepAlive || drainRequested) && head.status >= 200 {
            headers.add(name: "connection", value: "close")
        }
        writeHead(version: current.version, status: head.status, headers: headers, requestMethod: current.method, context: context)
        if endStream && head.status >= 200 { endResponse(id, trailers: nil) }
    }

    func sendResponseBody(_ id: Int, _ bytes: ByteBuffer) {
        let count = bytes.readableBytes
        guard let context, answering?.id == id, !closing else {
            // Not this connection's current answer (it closed, or the exchange was cut):
            // the bytes go nowhere, and their credit back.
            router.responseBodyDiscarded(id, bytes: count)
            return
        }
        // Relayed: the decoder is gone, the bytes are the WebSocket's own.
        if relaying == id { context.write(wrapOutboundOut(bytes), promise: nil) } else { writeBody(bytes, context: context) }
        // Held until flushed (`flush`, `endResponse`): writability means something only once
        // the bytes have gone through the TLS handler to the socket's queue.
        router.responseBodyWritten(id, bytes: count, writable: false)
    }

    func endResponse(_ id: Int, trailers: HTTPHeaders?) {
        guard let context, let finished = answering, finished.id == id else { return }
        if relaying == id {
            // The upstream ended the relayed WebSocket's stream: nothing else can follow
            // on this connection, which closes once what was written is out.
            close()
            return
        }
        answering = nil
        writeEnd(trailers: trailers, context: context)
        context.flush()
        creditIfWritable(context)
        if !finished.keepAlive || failing || drainRequested || (inputEnded && queued.isEmpty && pendingParseError == nil) {
            close()
            return
        } else if upgradeAsked != nil {
            // Answered without switching protocols (a 101 makes this side a byte relay and
            // never ends the response here): the connection stays HTTP/1.1.
            upgradeAsked?.answered = true
            renewCodecsWhenDue()
        }
        handOnQueued()
    }

    func answer(_ id: Int, status: Int, refusal: String, detail: String) {
        guard let context, let answered = answering, answered.id == id else { return }
        let body = "pingate: \(detail)\n"
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: "text/plain; charset=utf-8")
        // No body goes with an answer to HEAD or CONNECT (`HTTP1ResponseWriter`): a HEAD
        // answer states the length a GET's would have, a CONNECT's refusal says 0, which is
        // what it carries (without a length, only the connection's close would end it,
        // RFC 9112 §6.3, and the connection stays).
        headers.add(name: "content-length", value: answered.method == .CONNECT ? "0" : "\(body.utf8.count)")
        headers.add(name: "pingate-refusal", value: refusal)
        if !answered.keepAlive || failing || drainRequested { headers.add(name: "connection", value: "close") }
        writeHead(version: answered.version, status: status, headers: headers, requestMethod: answered.method, context: context)
        writeBody(context.channel.allocator.buffer(string: body), context: context)
        // The refused request's body may still be arriving; it is read and dropped by the
        // router, and the next pipelined request is handed over once this answer ended.
        endResponse(id, trailers: nil)
    }

    /// False: HTTP/1.1 can say "not processed" only by closing the connection unanswered,
    /// which a client retries only on a connection it had used before, so a 502 that says
    /// why serves it better.
    var refusesUnprocessedStreams: Bool { false }

    func refuseUnprocessed(_ id: Int) {
        // Never asked (`refusesUnprocessedStreams`): HTTP/1.1 has no such refusal, and the
        // router answers 502 instead. Should it be, the connection closes: the client then
        // sees the request unanswered, which it retries only as it would any close.
        close()
    }

    func cancel(_ id: Int) {
        guard answering?.id == id else { return }
        // HTTP/1.1 has no way to abandon one response but to close the connection.
        close()
    }

    /// Nothing to do: an HTTP/1.1 client sends one request body at a time, and its bytes
    /// count against one read budget whatever waits where.
    func requestBodyQueued(_ id: Int, bytes: Int) {}

    /// One exchange at a time, read as fast as credit comes back: no window to open.
    func openRequestWindow(_ id: Int) {}

    func requestBodyPassedOn(_ id: Int, bytes: Int) {
        resumeReading(afterPassingOn: bytes)
    }

    func flush() {
        guard let context else { return }
        context.flush()
        creditIfWritable(context)
    }

    /// The response bytes written since the last flush are out of the gate's hands once the
    /// channel takes more: their credit goes back now, or when it drains.
    private func creditIfWritable(_ context: ChannelHandlerContext) {
        if context.channel.isWritable { router.clientDrained() }
    }

    /// HTTP/1.1 has no flow control of its own: every response part the router passed on
    /// was written to the channel as it came, and `close` lets those bytes leave first.
    func closeWhenAnswered() {
        close()
    }

    func close() {
        guard let context, !closing else { return }
        closing = true
        // Whatever was written goes out first: the TLS handler closes the socket only once
        // the bytes written before the close (ending with its close_notify) have left.
        context.flush()
        context.close(promise: nil)
    }

    /// NIO's request decoder stops parsing for good once a request that asks for an upgrade
    /// (`Connection: upgrade` with `Upgrade`, or `CONNECT`) has ended: it expects the
    /// connection to switch protocols (apple/swift-nio#2570). When the answer was not a
    /// `101` (the router refused the request, e.g. 501 `upgrade-unsupported` over an HTTP/2
    /// upstream, or the upstream answered it normally) the connection is still keep-alive
    /// HTTP/1.1, yet the client's next request would never be parsed: the tunnel hung until
    /// the idle timeout. So once such a request has been read to its end and answered, the
    /// decoder is replaced by a fresh one configured as at install.
    ///
    /// The swap runs as an event-loop task: by then the old decoder has returned from delivering the request's `.end` (a refusal answers while the head
    /// is being delivered). NIO runs that task, and the old decoder's own deferred removal,
    /// before it reads the socket again, so a client that waited for the answer (it must:
    /// RFC 9110 §7.8, it cannot know before which protocol follows) reaches the new decoder.
    /// Bytes a client pipelined behind the upgrade request, read before the swap, are held by
    /// the stopped decoder and handed to the fresh one as it leaves (`addCodecs`), so such a
    /// request is answered in its turn.
    private func renewCodecsWhenDue() {
        guard let asked = upgradeAsked, asked.requestEnded, asked.answered, let context else { return }
        upgradeAsked = nil
        context.eventLoop.assumeIsolated().execute { [self] in
            guard let context = self.context, !closing, !upgraded else { return }
            let pipeline = context.pipeline.syncOperations
            do {
                let old = try Self.codecs(in: pipeline)
                try Self.addCodecs(to: pipeline, position: .before(self))
                for handler in old { pipeline.removeHandler(handler, promise: nil) }
            } catch {
                // Without fresh codecs the connection cannot carry another request.
                close()
            }
        }
    }

    /// The upstream granted the client's WebSocket upgrade in HTTP/2's form (a 2xx to the
    /// extended CONNECT this request became, RFC 8441 §5). The client expects RFC 6455's
    /// answer: `101` with `Upgrade: websocket` and the accept for its own key, which the
    /// gate computes (the upstream never saw the key). Then the codecs leave and the
    /// connection's raw bytes are the stream's DATA both ways, through a tap behind this
    /// handler, with the same credits as any body.
    private func switchToRelay(_ id: Int, _ head: ExchangeResponseHead, context: ChannelHandlerContext) {
        guard let key = webSocketKey else {
            // Refused before it went upstream (`upgradeRefusal`); never here in practice.
            router.requestCancelled(id)
            close()
            return
        }
        var headers = WebSocketHandshake.withoutHandshakeFields(head.headers)
        headers.remove(name: "content-length")
        headers.add(name: "connection", value: "upgrade")
        headers.add(name: "upgrade", value: WebSocketHandshake.token)
        headers.add(name: "sec-websocket-accept", value: WebSocketHandshake.accept(forKey: key))
        let version = answering?.version ?? .http1_1
        writeHead(version: version, status: 101, headers: headers, requestMethod: answering?.method, context: context)
        writeEnd(trailers: nil, context: context)
        context.flush()
        upgraded = true
        upgradeAsked = nil
        relaying = id
        let pipeline = context.pipeline.syncOperations
        do {
            try pipeline.addHandler(RawBytesTap { [weak self] bytes in self?.relayedFromClient(bytes) }, position: .after(self))
            for handler in try Self.codecs(in: pipeline) { pipeline.removeHandler(handler, promise: nil) }
        } catch {
            close()
        }
    }

    /// Raw bytes of the relayed WebSocket from the client, for the upstream's stream.
    private func relayedFromClient(_ bytes: ByteBuffer) {
        guard let id = relaying else { return }
        flow.handedOver(bytes.readableBytes)
        router.requestBody(id, bytes)
    }

    /// Ends the `101` answer written last (it has no bytes of its own past its head) and
    /// sends it: the connection is about to become a byte relay.
    func endSwitchingAnswer() {
        guard let context else { return }
        writeEnd(trailers: nil, context: context)
        context.flush()
    }

    // MARK: the answer's bytes

    /// Writes an answer's head, encoded into a buffer from the loop's recycler.
    private func writeHead(version: HTTPVersion, status: Int, headers: HTTPHeaders, requestMethod: HTTPMethod?,
                           context: ChannelHandlerContext) {
        var buffer = recycler.take(minimumCapacity: Self.headBufferSize, allocator: context.channel.allocator)
        responseWriter.writeHead(version: version, status: status, headers: headers, requestMethod: requestMethod, into: &buffer)
        context.write(wrapOutboundOut(buffer), promise: nil)
        recycler.give(buffer)
    }

    /// Writes body bytes as the answer's framing says: as they are, between a chunk's size
    /// line and its CRLF, or not at all for an answer to HEAD or CONNECT (which carries none).
    private func writeBody(_ bytes: ByteBuffer, context: ChannelHandlerContext) {
        guard !responseWriter.bodySuppressed else { return }
        if let chunkHead = responseWriter.chunkHead(count: bytes.readableBytes, allocator: context.channel.allocator) {
            context.write(wrapOutboundOut(chunkHead), promise: nil)
            context.write(wrapOutboundOut(bytes), promise: nil)
            context.write(wrapOutboundOut(HTTP1ResponseWriter.chunkEnd), promise: nil)
        } else if bytes.readableBytes > 0 {
            context.write(wrapOutboundOut(bytes), promise: nil)
        }
    }

    /// Writes the answer's end (the last chunk and trailers, when chunked).
    private func writeEnd(trailers: HTTPHeaders?, context: ChannelHandlerContext) {
        guard responseWriter.endAnswer() else { return }
        var buffer = context.channel.allocator.buffer(capacity: 64)
        HTTP1ResponseWriter.writeLastChunk(trailers: trailers, into: &buffer)
        context.write(wrapOutboundOut(buffer), promise: nil)
    }

    /// A head buffer's first size: most answers' heads fit (a larger one grows).
    private static let headBufferSize = 512

    /// After a `101`, this handler only passes raw bytes on (to the byte relay behind it).
    func becomeByteRelay() {
        upgraded = true
        upgradeAsked = nil
        reading = nil
        answering = nil
    }

    private func resumeReading(afterPassingOn count: Int) {
        let overCredited = flow.overCredited
        if flow.passedOn(count) { read(context: context) }
        if flow.overCredited > overCredited {
            router.creditNotApplied(bytes: flow.overCredited - overCredited, detail: "request credit beyond what the client sent")
        }
    }

    /// The HTTP/1.1 server codec this side works behind, added at `position`: NIO's request
    /// decoder (llhttp). Answers are encoded by this side itself (`HTTP1ResponseWriter`),
    /// with no response header validator (NIO's `NIOHTTPResponseHeadersValidator` scanned
    /// every field byte again): every field an answer carries was read by a validating
    /// parser (llhttp strict from an HTTP/1.1 upstream, which refuses a CR, LF, NUL or
    /// control byte in a field and obs-fold; nghttp2 from an `h2` one, which refuses what
    /// RFC 9113 §8.2.1 does) or is the gate's own (constant names, numbers, and tokens those
    /// parsers read).
    ///
    /// Bytes the decoder holds when it stops, after an upgrade request, are handed on as it
    /// leaves (`.forwardBytes`; NIO's default drops them): to fresh codecs when no switch
    /// came, so a request pipelined behind an upgrade answered without one is not lost, and
    /// to the relay after a `101`. No pipelining handler: this side orders pipelined
    /// requests itself.
    static func addCodecs(to pipeline: ChannelPipeline.SynchronousOperations, position: ChannelPipeline.SynchronousOperations.Position) throws {
        try pipeline.addHandler(ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)), position: position)
    }

    /// The handlers `addCodecs` added, to take out.
    static func codecs(in pipeline: ChannelPipeline.SynchronousOperations) throws -> [RemovableChannelHandler] {
        [try pipeline.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)]
    }
}
