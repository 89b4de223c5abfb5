import NIOCore
import NIOHTTP1

/// The upstream side of a request-aware tunnel when the upstream speaks HTTP/1.1.
///
/// Pipeline (upstream channel, behind the TLS handler): the gate's request encoder
/// (`HTTP1RequestEncoderHandler`), NIO's `HTTPResponseDecoder` (which watches the requests
/// going out, so a response to `HEAD`
/// is read without a body; informational responses are passed on; bytes after a `101`
/// are kept for the byte relay), then this handler. The codecs go in with the first
/// request (`addCodecsIfNeeded`): until then the upstream has nothing to answer, and a
/// tunnel whose client sends nothing (an idle one) does not carry them (issue 12: the
/// decoder and its parser were 1.7 KiB per idle tunnel). Bytes the upstream sends before
/// that are a response nobody asked for, which ends the tunnel, as it would after them.
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

    /// The tunnel this connection serves; nil while it is parked in the pool between tunnels.
    private var router: TunnelRouter?
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
    /// Called when a `101` switched the connection to another protocol for an HTTP/1.1
    /// client (whose own leg then becomes a byte relay too).
    var onUpgrade: (() -> Void)?
    /// An HTTP/2 client's extended CONNECT sent here as a WebSocket GET (RFC 8441 §5): the
    /// exchange, the key the gate made for it, and what the client sent on its stream
    /// before the upstream answered (held, uncredited, so the client's stream window
    /// bounds it), with whether the stream already ended.
    private var translated: (id: Int, key: String, held: [ByteBuffer], ended: Bool)?
    /// The exchange whose stream is now relayed as raw bytes (after a checked `101` for a
    /// translated extended CONNECT): its stream DATA in, the connection's bytes out.
    private var relaying: Int?
    /// An HTTP/1.1 client's WebSocket upgrades, by exchange: the `Sec-WebSocket-Key` it sent
    /// (passed on as it came). The upstream's `101` must answer it before the legs become a
    /// byte relay: the client would refuse a wrong accept itself, but by then the gate would
    /// have switched to relaying bytes the request was never checked for, and counted nothing.
    private var webSocketKeys: [Int: String] = [:]
    /// Exchanges whose request asked for an upgrade (the router lets only WebSocket ask):
    /// the only ones a `101` may answer.
    private var upgradesAsked: Set<Int> = []
    /// Whether the HTTP codecs are in front of this handler (from the first request on).
    private var codecsAdded = false
    /// In front of the decoder (with the codecs): where the inbound bytes stand between
    /// responses, byte-exactly (`HTTP1ResponseBoundary`).
    private var boundaryGuard: HTTP1ResponseBoundaryHandler?
    /// A response ended inside a read burst still being delivered: the next request waits
    /// until the burst is known to have ended with it (`boundaryReached`).
    private var awaitingBoundary: Bool { boundaryGuard?.boundary.phase == .endedInRead }
    /// The upstream's last response said it closes (or the gate's request was still being
    /// sent after its answer): no new request goes on this connection.
    private var carriesNoMoreRequests = false
    /// Set when the upstream sent bytes no request asked for: the connection closed out of
    /// step (counted by the pool as `unsolicited-bytes` when it was parked).
    package private(set) var sentUnsolicitedBytes = false
    /// The router that let go of this side (`detach`): told only of what the connection did.
    private weak var formerRouter: TunnelRouter?

    /// When the connection last finished an answer: where its idle time starts when
    /// nothing is open on it.
    private var lastAnswerEnded = NIODeadline.now()
    /// Answers the connection carried to their end: an idle close after at least one tells
    /// the origin's keep-alive timeout (before the first, other timeouts apply).
    private var answersEnded = 0
    /// The origin ended its side of the connection (its FIN), before the gate closed it.
    private var originEndedInput = false
    /// Set as the connection goes, when the origin closed it while it idled: for how long.
    package private(set) var idleCloseAfter: TimeAmount?

    init(router: TunnelRouter) {
        self.router = router
    }

    /// Since when the connection has carried nothing after an answer (no exchange open or
    /// waiting), or nil while it carries one, is closing, or never answered (an origin's
    /// keep-alive timeout starts after a response; before the first request other, longer
    /// ones apply): a request that cannot be repeated goes on it only while this is recent
    /// (`KeepAliveEstimate`).
    var idleSince: NIODeadline? {
        answersEnded > 0 && active == nil && waiting.isEmpty && !closing && !carriesNoMoreRequests ? lastAnswerEnded : nil
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: reuse

    /// True once the connection switched protocols (a `101` was taken): it carries the
    /// tunnel as a byte relay and no HTTP exchange can follow on it or on a replacement.
    var switchedProtocols: Bool { upgraded || relaying != nil }

    /// Always: a WebSocket extended CONNECT is translated to an HTTP/1.1 `Upgrade` here.
    var carriesExtendedConnect: Bool { true }

    var reuseBlocker: UpstreamNotPooledReason? {
        // Upgraded first: a switched connection is never HTTP again, closing or not.
        if upgraded || relaying != nil || translated != nil { return .upgraded }
        if sentUnsolicitedBytes { return .unsolicitedBytes }
        if closing || carriesNoMoreRequests || context == nil { return .closing }
        if active != nil || !waiting.isEmpty || flow.bytesInFlight > 0 { return .inFlight }
        // Codecs in: the last response must have been confirmed to end at a boundary.
        if let boundaryGuard, !boundaryGuard.boundary.isAtBoundary { return .inFlight }
        return nil
    }

    func park() {
        router = nil
        onUpgrade = nil
        // What a parked connection may still need to hear is its close; a read keeps the
        // socket watched (a response nobody asked for closes it, as for a tunnel).
        context?.read()
    }

    func attach(to router: TunnelRouter) {
        self.router = router
    }

    func detach() {
        // What the connection did still counts for the tunnel that used it (a stray seen as
        // the connection closed, at its last read's end); no exchange of it reaches the router.
        formerRouter = router
        router = nil
        onUpgrade = nil
    }

    // MARK: from the router

    /// An HTTP/1.1 upstream can switch protocols (`101`): an HTTP/1.1 client's `Upgrade`
    /// passes as it is; an HTTP/2 client's extended CONNECT is translated, which only
    /// WebSocket defines (RFC 8441 §5).
    func upgradeRefusal(for head: ExchangeRequestHead) -> String? {
        guard head.isExtendedConnect, let upgrade = head.upgrade, !WebSocketHandshake.isWebSocket(upgrade) else { return nil }
        return "the upstream speaks HTTP/1.1, where only a WebSocket extended CONNECT has an Upgrade form (RFC 8441 §5), not :protocol \(upgrade)"
    }

    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int {
        let id = nextID
        nextID += 1
        if upgraded {
            // The connection now carries another protocol: no HTTP exchange fits on it
            // (an HTTP/2 client's other streams, after one of them became a WebSocket).
            // Reported a turn later, to the router the side has then: a side the router let go
            // of meanwhile (`detach`) reaches no one.
            context?.eventLoop.assumeIsolated().execute { [weak self] in
                self?.router?.responseFailed(id, detail: "the upstream's one HTTP/1.1 connection now carries a WebSocket")
            }
            return id
        }
        if head.isExtendedConnect {
            return startTranslated(id, head, authority: authority)
        }
        var headers = HTTPHeaders()
        // Room for all at once: Host, the fields, and up to three the gate adds (upgrade,
        // framing), so the array is allocated once, not grown.
        headers.reserveCapacity(head.headers.count + 4)
        // Host first (RFC 9112 §3.2), from the checked authority, never the client's text.
        headers.add(name: "host", value: authority.headerValue)
        headers.add(contentsOf: head.headers)
        if let upgrade = head.upgrade {
            upgradesAsked.insert(id)
            headers.add(name: "connection", value: "upgrade")
            headers.add(name: "upgrade", value: upgrade)
            // One key, or none to check against (a second would make the accept ambiguous;
            // a server that switches anyway is the client's to judge, as before).
            let keys = head.headers[canonicalForm: "sec-websocket-key"]
            if WebSocketHandshake.isWebSocket(upgrade), keys.count == 1, let key = keys.first {
                webSocketKeys[id] = String(key)
            }
        }
        // The gate's framing, never the client's (`RequestBodyFraming`): NIO's encoder
        // frames what these fields say, and writes a body raw when they say nothing.
        head.framing.applyHTTP1(to: &headers, method: head.method)
        let requestHead = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: head.method), uri: head.path, headers: headers)
        if mayStartNow {
            activate(id)
            write(.head(requestHead), id: id)
            if endStream { write(.end(nil), id: id) }
            if !endStream, router?.clientHasRequestWindows == true {
                // Heard a turn later, once the router has paired the id this returns.
                context?.eventLoop.assumeIsolated().execute { [weak self] in self?.router?.requestOnWire(id) }
            }
        } else {
            waiting.append((id, endStream ? [.head(requestHead), .end(nil)] : [.head(requestHead)], endStream))
        }
        return id
    }

    /// An HTTP/2 client's WebSocket extended CONNECT as RFC 6455's opening GET (RFC 8441 §5,
    /// what Envoy does): `Connection: Upgrade`, `Upgrade: websocket`, a fresh key (the
    /// client sent none; one it sent anyway is not used), the version passed on (13 when
    /// missing), and the other fields (`sec-websocket-protocol`, `-extensions`, `origin`…)
    /// as they came. The GET ends with its head; the stream's DATA waits for the 101.
    private func startTranslated(_ id: Int, _ head: ExchangeRequestHead, authority: RequestAuthority) -> Int {
        guard translated == nil else {
            // One connection can become one WebSocket: a second must not overwrite the first's key.
            context?.eventLoop.assumeIsolated().execute { [weak self] in
                self?.router?.responseFailed(id, detail: "the upstream's one HTTP/1.1 connection is already being switched to a WebSocket")
            }
            return id
        }
        let key = WebSocketHandshake.freshKey()
        var headers = HTTPHeaders()
        headers.add(name: "host", value: authority.headerValue)
        var passed = WebSocketHandshake.withoutHandshakeFields(head.headers)
        passed.remove(name: "content-length")
        headers.add(contentsOf: passed)
        headers.add(name: "connection", value: "upgrade")
        headers.add(name: "upgrade", value: WebSocketHandshake.token)
        headers.add(name: "sec-websocket-key", value: key)
        if !headers.contains(name: "sec-websocket-version") {
            headers.add(name: "sec-websocket-version", value: WebSocketHandshake.version)
        }
        translated = (id, key, [], false)
        let requestHead = HTTPRequestHead(version: .http1_1, method: .GET, uri: head.path, headers: headers)
        let parts: [Part] = [.head(requestHead), .end(nil)]
        if mayStartNow {
            activate(id)
            for part in parts { write(part, id: id) }
        } else {
            waiting.append((id, parts, true))
        }
        return id
    }

    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer) {
        if relaying == id {
            writeRelayed(bytes, id: id)
            return
        }
        if translated?.id == id {
            // Sent before the upstream's answer: held until the 101 (or dropped without one).
            translated?.held.append(bytes)
            return
        }
        if active == id {
            write(.body(bytes), id: id)
        } else if let index = waiting.firstIndex(where: { $0.id == id }) {
            waiting[index].parts.append(.body(bytes))
            router?.requestBodyQueued(id, bytes: bytes.readableBytes)
        } else {
            // An exchange this connection will not carry (refused at its start, cancelled):
            // the bytes go nowhere, and their credit back.
            router?.requestBodyDiscarded(id, bytes: bytes.readableBytes)
        }
    }

    func endRequest(_ id: Int, trailers: HTTPHeaders?) {
        if relaying == id {
            // The client's stream ended its half: so does this connection's (TLS
            // close_notify, then a TCP half-close); the upstream's bytes still come back.
            flush()
            context?.close(mode: .output, promise: nil)
            return
        }
        if translated?.id == id {
            translated?.ended = true
            return
        }
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
        } else if let index = waiting.firstIndex(where: { $0.id == id }) {
            // Never sent: the body it had queued goes back to the client's credit.
            router?.requestBodyDiscarded(id, bytes: Self.bodyBytes(in: waiting.remove(at: index).parts))
        }
    }

    func responseBodyPassedOn(_ id: Int, bytes: Int) {
        resumeReading(afterPassingOn: bytes)
    }

    func flush() {
        guard let context else { return }
        context.flush()
        creditIfWritable(context)
    }

    /// The request bytes written since the last flush are out of the gate's hands once the
    /// channel takes more: their credit goes back now, or when it drains.
    private func creditIfWritable(_ context: ChannelHandlerContext) {
        if context.channel.isWritable { router?.upstreamDrained() }
    }

    func close() {
        guard let context, !closing else { return }
        closing = true
        context.flush()
        context.close(promise: nil)
    }

    /// The body among queued `parts`, and its end if it came.
    private static func queuedBody(in parts: [Part]) -> TunnelRouterState.HeldRequestBody {
        var body = TunnelRouterState.HeldRequestBody()
        for part in parts {
            switch part {
            case .head: break
            case .body(let bytes): body.body.append(bytes)
            case .end(let trailers):
                body.ended = true
                body.trailers = trailers
            }
        }
        return body
    }

    /// The body bytes among queued `parts`.
    private static func bodyBytes(in parts: [Part]) -> Int {
        parts.reduce(0) { total, part in
            if case .body(let bytes) = part { return total + bytes.readableBytes }
            return total
        }
    }

    /// Whether a new request may go on the wire now: nothing else is, the last response
    /// was confirmed to end at a boundary, and the connection still takes requests. Else it
    /// waits in `waiting` (and is reported not processed if the connection closes first).
    private var mayStartNow: Bool {
        active == nil && !awaitingBoundary && !carriesNoMoreRequests && !closing
    }

    private func activate(_ id: Int) {
        active = id
        activeResponseHeadSeen = false
        activeRequestEnded = false
        activeKeepAlive = true
    }

    private func write(_ part: Part, id: Int) {
        guard let context, addCodecsIfNeeded(context: context) else {
            if case .body(let bytes) = part { router?.requestBodyDiscarded(id, bytes: bytes.readableBytes) }
            return
        }
        switch part {
        case .head(let head):
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            boundaryGuard?.requestSent()
        case .body(let bytes):
            let count = bytes.readableBytes
            context.write(wrapOutboundOut(.body(.byteBuffer(bytes))), promise: nil)
            // Held until flushed: writability means something only once the bytes have gone
            // through the TLS handler to the socket's queue.
            router?.requestBodyWritten(id, bytes: count, writable: false)
        case .end(let trailers):
            activeRequestEnded = true
            context.writeAndFlush(wrapOutboundOut(.end(trailers)), promise: nil)
            creditIfWritable(context)
        }
    }

    /// Puts the encoder and the response decoder between the TLS handler and this one,
    /// before the first request goes out; false (and the connection closing) if that failed.
    /// A `101` that does not answer the WebSocket key it was sent: it does not reach the
    /// client, which gets a 502 `upstream-protocol-error` (the upstream answered, wrongly;
    /// it is not unreachable), and this connection, now in an unknown protocol, closes.
    private func refuseSwitch(_ id: Int, problem: String) {
        router?.responseFailed(id, reason: .upstreamProtocolError,
                              detail: "the upstream did not complete the WebSocket handshake: \(problem)")
        close()
    }

    private func addCodecsIfNeeded(context: ChannelHandlerContext) -> Bool {
        guard !codecsAdded else { return true }
        do {
            let decoder = ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes,
                                                                   informationalResponseStrategy: .forward))
            let boundaryGuard = HTTP1ResponseBoundaryHandler(events: .init(
                unsolicited: { [weak self] in self?.unsolicitedBytes() },
                boundaryReached: { [weak self] in self?.boundaryReached() }))
            // The gate frames every request itself (`RequestBodyFraming.applyHTTP1`) and
            // encodes it (`HTTP1RequestEncoderHandler`).
            try context.pipeline.syncOperations.addHandlers([HTTP1RequestEncoderHandler(), boundaryGuard, decoder],
                                                            position: .before(self))
            self.boundaryGuard = boundaryGuard
        } catch {
            close()
            return false
        }
        codecsAdded = true
        return true
    }

    // MARK: from the upstream

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !upgraded else {
            if switchingProtocols {
                // The decoder's `.end` of the 101 itself; the switch happens now, when the
                // decoder is done with the response (its removal hands on later bytes).
                switchingProtocols = false
                if relaying != nil { becomeStreamRelay() } else { onUpgrade?() }
                return
            }
            // Raw bytes of the new protocol, handed on by the removed decoder.
            context.fireChannelRead(data)
            return
        }
        guard let id = active else {
            // A response nobody asked for (or, before the codecs, any byte): the upstream is
            // out of step, and its connection closes.
            unsolicitedBytes()
            return
        }
        switch unwrapInboundIn(data) {
        case .head(let head):
            if head.status.code == 101, let started = translated, started.id == id {
                // The answer to a translated extended CONNECT: a switch only if it answers
                // the gate's key (RFC 6455 §4.1). Otherwise the client's stream gets a 502
                // and this connection, now in an unknown protocol, closes.
                translated = nil
                if let problem = WebSocketHandshake.problem(with: head.headers, key: started.key) {
                    refuseSwitch(id, problem: problem)
                    return
                }
                router?.responseHead(id, ExchangeResponseHead(
                    status: 101, headers: WebSocketHandshake.withoutHandshakeFields(HTTP1HeadFields(head.headers).endToEnd),
                    upgrade: WebSocketHandshake.token), endStream: false)
                boundaryGuard?.switchedProtocols()
                upgraded = true
                switchingProtocols = true
                relaying = id
                pendingRelay = (started.held, started.ended)
                return
            }
            if head.status.code == 101, !upgradesAsked.contains(id) {
                // A switch nobody asked for: the bytes after it would be relayed unread.
                refuseSwitch(id, problem: "it answered 101 Switching Protocols to a request that asked for no upgrade")
                return
            }
            if head.status.code == 101, let key = webSocketKeys.removeValue(forKey: id),
               let problem = WebSocketHandshake.problem(with: head.headers, key: key) {
                // An HTTP/1.1 client's WebSocket upgrade answered with a 101 that does not
                // answer its key (RFC 6455 §4.1).
                refuseSwitch(id, problem: problem)
                return
            }
            if head.status.code == 101 {
                let upgrade = head.headers.first(name: "upgrade")
                router?.responseHead(id, ExchangeResponseHead(status: 101, headers: HTTP1HeadFields(head.headers).endToEnd,
                                                             upgrade: upgrade), endStream: false)
                boundaryGuard?.switchedProtocols()
                upgraded = true
                switchingProtocols = true
                return
            }
            if head.status.code >= 200 {
                webSocketKeys[id] = nil  // answered without a switch: nothing to check
                upgradesAsked.remove(id)
                if let started = translated, started.id == id {
                    // Answered without a switch: the answer passes as the stream's response,
                    // and what the client sent meanwhile is dropped (and credited back).
                    translated = nil
                    let count = started.held.reduce(0) { $0 + $1.readableBytes }
                    router?.requestBodyDiscarded(id, bytes: count)
                }
                activeResponseHeadSeen = true
                activeKeepAlive = head.isKeepAlive
            }
            router?.responseHead(id, ExchangeResponseHead(status: Int(head.status.code),
                                                         headers: HTTP1HeadFields(head.headers).endToEnd), endStream: false)
        case .body(let bytes):
            flow.handedOver(bytes.readableBytes)
            router?.responseBody(id, bytes)
        case .end(let trailers):
            guard activeResponseHeadSeen else { return }  // the end of an informational response
            // This exchange's own state decides what the connection does next, read before
            // the router hears of the end: the router may hand over a pipelined request at
            // once, and its state must not judge this one's (issue 31: a pipelined POST's
            // head, sent before its body, closed the connection as if its answer had come).
            let keepsConnection = activeKeepAlive && activeRequestEnded
            let atBoundary = boundaryGuard?.responseEnded() ?? true
            active = nil
            lastAnswerEnded = .now()
            answersEnded += 1
            if !keepsConnection {
                // The upstream will close, or our request is still being sent after its
                // answer: the connection cannot carry another exchange in step.
                carriesNoMoreRequests = true
            }
            router?.responseEnd(id, trailers: trailers)
            if !keepsConnection {
                close()
                return
            }
            if atBoundary { startNextWaiting() }
        }
    }

    /// The read burst that carried the last response's end ended with it: the next request goes.
    private func boundaryReached() {
        startNextWaiting()
    }

    /// The upstream sent bytes that no request asked for: while parked, between responses,
    /// or after a response's end in the same read. The connection is out of step; it
    /// closes, and what waited on it is reported not processed as it goes.
    private func unsolicitedBytes() {
        guard !sentUnsolicitedBytes else { return }
        sentUnsolicitedBytes = true
        (router ?? formerRouter)?.upstreamSentUnsolicitedBytes()
        close()
    }

    private func startNextWaiting() {
        guard mayStartNow, !waiting.isEmpty else { return }
        let next = waiting.removeFirst()
        activate(next.id)
        for part in next.parts { write(part, id: next.id) }
        if !next.ended {
            flush()
            router?.requestOnWire(next.id)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        router?.upstreamReadComplete()
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let id = relaying {
            // The relayed protocol's connection ended: so does the client's stream.
            relaying = nil
            router?.responseEnd(id, trailers: nil)
        } else if let id = active, activeResponseHeadSeen {
            router?.responseCancelled(id)
        }
        // An active exchange with no answer yet is the router's to fail or, on a reused
        // connection, to retry (`upstreamClosed`).
        // Queued behind the active one: not one byte of them was sent. Each goes back with
        // what it queued of its body, for the tunnel's next connection.
        for entry in waiting { router?.requestNotSent(entry.id, queued: Self.queuedBody(in: entry.parts)) }
        if !closing || originEndedInput, active == nil, waiting.isEmpty, answersEnded > 0 {
            // The origin closed a connection that idled: its keep-alive timeout, learned (by
            // the tunnel, or by the pool when the connection was parked).
            let idle = NIODeadline.now() - lastAnswerEnded
            idleCloseAfter = idle
            router?.upstreamClosedWhileIdle(after: idle)
        }
        waiting = []
        router?.upstreamClosed()
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed, let id = relaying {
            // The upstream ended its half of the relayed protocol: the stream ends (END_STREAM)
            // and, the connection being good for nothing else, the tunnel with it.
            relaying = nil
            router?.responseEnd(id, trailers: nil)
            close()
            return
        }
        if let event = event as? ChannelEvent, event == .inputClosed, !upgraded {
            originEndedInput = true
            // The upstream is done sending. The decoder has already delivered the end of
            // a response delimited by the close; anything still awaited is cancelled as
            // the channel goes (channelInactive), and the client leg goes with it.
            close()
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // A malformed response: nothing more of this connection can be trusted. The exchange
        // waiting for it hears what was wrong (a 502 `upstream-protocol-error` naming the
        // parser's finding), not that the connection closed before the response ended.
        if let id = active, !activeResponseHeadSeen {
            router?.responseFailed(id, reason: .upstreamProtocolError,
                                   detail: "the upstream's answer is not valid HTTP/1.1 (\(error)); its connection is closed")
        }
        close()
    }

    func read(context: ChannelHandlerContext) {
        if flow.mayRead() { context.read() }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { router?.upstreamDrained() }
        context.fireChannelWritabilityChanged()
    }

    // MARK: a translated WebSocket, relayed

    /// What an HTTP/2 client sent on its stream before the 101, for the relay to send first.
    private var pendingRelay: (held: [ByteBuffer], ended: Bool)?

    /// After a checked `101` for a translated extended CONNECT: the HTTP codecs leave, and
    /// the connection's raw bytes become the client stream's DATA (through a tap behind
    /// this handler: they arrive as `ByteBuffer`s, not response parts) and the stream's
    /// DATA the connection's bytes, with the same credits as any body in both directions.
    private func becomeStreamRelay() {
        guard let context, let id = relaying else { return }
        let pipeline = context.pipeline.syncOperations
        do {
            try pipeline.addHandler(RawBytesTap { [weak self] bytes in self?.relayed(bytes) }, position: .after(self))
            // The decoder's removal hands on what it holds past the 101 (`.forwardBytes`).
            pipeline.removeHandler(try pipeline.handler(type: ByteToMessageHandler<HTTPResponseDecoder>.self), promise: nil)
            pipeline.removeHandler(try pipeline.handler(type: HTTP1RequestEncoderHandler.self), promise: nil)
        } catch {
            close()
            return
        }
        // Exchanges queued behind the upgrade can never be sent on this connection.
        let stranded = waiting
        waiting = []
        for entry in stranded {
            router?.requestBodyDiscarded(entry.id, bytes: Self.bodyBytes(in: entry.parts))
            router?.responseFailed(entry.id, detail: "the upstream's one HTTP/1.1 connection now carries a WebSocket")
        }
        let pending = pendingRelay
        pendingRelay = nil
        for bytes in pending?.held ?? [] { writeRelayed(bytes, id: id) }
        if pending?.ended == true {
            endRequest(id, trailers: nil)
        } else {
            flush()
        }
    }

    /// Raw bytes of the relayed protocol from the upstream, for the client's stream.
    private func relayed(_ bytes: ByteBuffer) {
        guard let id = relaying else { return }
        flow.handedOver(bytes.readableBytes)
        router?.responseBody(id, bytes)
    }

    /// Stream DATA from the client, as raw bytes on this connection (no codec is left).
    private func writeRelayed(_ bytes: ByteBuffer, id: Int) {
        let count = bytes.readableBytes
        guard let context else {
            router?.requestBodyDiscarded(id, bytes: count)
            return
        }
        context.write(NIOAny(bytes), promise: nil)
        router?.requestBodyWritten(id, bytes: count, writable: false)
    }

    private func resumeReading(afterPassingOn count: Int) {
        let overCredited = flow.overCredited
        if flow.passedOn(count) { context?.read() }
        if flow.overCredited > overCredited {
            router?.creditNotApplied(bytes: flow.overCredited - overCredited, detail: "response credit beyond what the upstream sent")
        }
    }
}
