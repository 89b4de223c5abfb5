import NIOCore
import NIOHTTP1
import PinGateHTTP2

/// The client side of a request-aware tunnel when the client negotiated `h2`.
///
/// Pipeline (client channel, behind the TLS handler): this handler alone. It owns an
/// nghttp2 server session; every byte the client sends goes through nghttp2, which
/// enforces RFC 9113's framing and message rules before anything reaches the router:
/// - an invalid frame, a bad preface, an HPACK failure or a flow-control violation is a
///   connection error: GOAWAY with its code, then the connection closes;
/// - a malformed request (missing or repeated pseudo-headers, a pseudo-header after a
///   regular one, upper-case names, connection-specific fields, a `content-length` that
///   the DATA frames contradict) is a stream error: RST_STREAM PROTOCOL_ERROR, and the
///   request never surfaces;
/// - a header block over `maxHeaderListSize` (an HPACK bomb included) is dropped and its
///   stream reset, the connection stays up.
/// What surfaces is a well-formed request head, which the router checks (authority
/// binding) before any of it goes upstream.
///
/// Backpressure: the client may send a stream's body only as far as its windows allow,
/// and the windows reopen (WINDOW_UPDATE) only as the upstream side passes bytes on.
/// Response bodies leave the session as the client's windows allow; the upstream side is
/// credited with them only once they were written while this channel was writable.
final class HTTP2ClientSide: ChannelDuplexHandler, TunnelClientSide {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = Never
    typealias OutboundOut = ByteBuffer

    /// RFC 9113 §7 error codes the gate sends.
    private enum ErrorCode {
        static let internalError: UInt32 = 0x2
        /// The stream was not processed and may be retried on another connection (§8.7).
        static let refusedStream: UInt32 = 0x7
        /// The peer is generating excessive load (§7): the end of an abusive connection.
        static let enhanceYourCalm: UInt32 = 0xb
    }

    private let router: TunnelRouter
    private let wire: HTTP2Wire
    private var context: ChannelHandlerContext?
    /// Streams whose request head reached the router (a later HEADERS frame on one of
    /// them is its trailers).
    private var requestStreams: Set<Int32> = []
    /// Streams opened and reset in one read: never handed to the router.
    private var skippedStreams: Set<Int32> = []
    /// Whether a connection error this session sent was already counted.
    private var connectionErrorCounted = false
    /// Streams whose response head went out with a body still to follow.
    private var respondingStreams: Set<Int32> = []
    /// Streams the gate answered itself (a refusal's text body): their body bytes were never
    /// the upstream's, so they are not reported to the router's ledger.
    private var ownAnswers: Set<Int32> = []
    /// Between `channelRead` and `channelReadComplete`: output waits for the burst's end.
    private var inReadBurst = false
    /// The stream window a request gets once its upstream connection sends it, or nil when
    /// every stream has its full window from the start (`init`).
    private let activeRequestWindow: Int?
    private var closing = false
    /// Connection-window credit given back early, by stream, for request bytes that waited
    /// upstream (`requestBodyQueued`): taken off the connection's share when their stream
    /// credit comes. Kept until used up, however long after the stream closed.
    private var connectionCreditGiven: [Int32: Int] = [:]
    /// Streams the gate itself reset: their close is not the client's doing.
    private var resetByGate: Set<Int32> = []
    /// When resets and rejected requests stop being a stream's business and end the connection.
    private var abuse = HTTP2AbuseGuard()
    /// `controlFramesReceived` as last charged to `abuse`.
    private var controlFramesCharged = 0
    /// The connection is being ended for abuse: nothing more is read or handed on.
    private var endedForAbuse = false
    /// The client sent something since the last check of the abuse linger.
    private var abuseInputSinceCheck = false
    /// Rejections (requests nghttp2 refused before they surfaced) not yet counted, and the
    /// last text: reported once per read burst, not once per stream.
    private var rejectedInBurst: (count: Int, detail: String) = (0, "")
    /// The upstream is gone: the streams still open finish sending what they hold (reading
    /// goes on, for the client's WINDOW_UPDATEs), new ones are refused, then GOAWAY and the close.
    private var draining = false

    /// The largest frame the client may send, advertised on this leg only.
    ///
    /// Clients that build frames as large as the peer allows (Python's `h2`, Go's) upload
    /// in four times fewer frames than at the protocol's 16 KiB, which is what brings an
    /// h2 client's upload to an HTTP/1.1 origin near an HTTP/1.1 client's speed (issue 32,
    /// `LongBodiesTests`). Kept at 64 KiB, not more: nghttp2 holds a GOAWAY's debug data
    /// whole (up to a frame) and decodes every HPACK byte of a header block it refuses (up
    /// to nine frames), so the frame size bounds what one connection can make the gate
    /// hold or decode. The upstream leg keeps 16 KiB: a large frame on a pooled connection
    /// holds back every other tunnel's stream behind it.
    static let clientFrameSize: UInt32 = 1 << 16

    /// A side on a fresh nghttp2 server session with `limits`.
    /// - Parameters:
    ///   - advertisesExtendedConnect: whether the client is told it may open extended
    ///     CONNECT streams (RFC 8441): only when the tunnel's upstream can carry them.
    /// - Parameter activeRequestWindow: the stream window a request gets once its upstream
    ///   connection sends it (`openRequestWindow`), when that is more than `limits` give
    ///   every stream; nil when every stream has its full window from the start.
    init(router: TunnelRouter, limits: HTTP2Session.Limits, advertisesExtendedConnect: Bool,
         activeRequestWindow: Int? = nil) throws(HTTP2Error) {
        self.router = router
        self.activeRequestWindow = activeRequestWindow
        // RFC 8441: the client may open extended CONNECT streams (WebSocket over HTTP/2).
        // Each is checked like any request and reaches only the pinned upstream, in its
        // own form there (an extended CONNECT, or an HTTP/1.1 Upgrade). Advertised only when
        // the upstream can carry one: a browser that sees the setting opens its WebSocket as
        // an extended CONNECT, and an h2 origin without it (nginx) would leave it a 501,
        // where the browser, not seeing it, uses an HTTP/1.1 Upgrade that works (issue 31).
        var limits = limits
        limits.enableConnectProtocol = advertisesExtendedConnect
        limits.maxFrameSize = max(limits.maxFrameSize, Self.clientFrameSize)
        self.wire = HTTP2Wire(session: try HTTP2Session(role: .server, limits: limits))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        // The server's SETTINGS go out at once (RFC 9113 §3.4: the server preface).
        writeOutput(flush: true)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: from the client

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if endedForAbuse {
            // Read and dropped while the close lingers: the client is not quiet yet.
            abuseInputSinceCheck = true
            return
        }
        guard !closing else { return }
        inReadBurst = true
        let buffer = unwrapInboundIn(data)
        switch wire.receive(buffer) {
        case .success(let events):
            reportDiscardedBodies()
            chargeControlFrames()
            // A stream opened and reset in the same read (the "rapid reset" pattern, CVE-
            // 2023-44487) never reaches the router: the upstream is not asked for work the
            // client has already abandoned.
            var abandoned = Set<Int32>()
            for case .streamClosed(let streamID, let errorCode) in events where errorCode != 0 { abandoned.insert(streamID) }
            for event in events {
                if endedForAbuse { break }
                if case .headers(let streamID, _, _) = event, abandoned.contains(streamID), !requestStreams.contains(streamID) {
                    skippedStreams.insert(streamID)
                    continue
                }
                handle(event, input: buffer)
            }
            reportRejected()
        case .failure(let error) where error.isFlood:
            // nghttp2's own guard: the client made it queue more acknowledgements (SETTINGS,
            // PING) than it reads. A flood like any other: GOAWAY ENHANCE_YOUR_CALM.
            chargeControlFrames()
            endForAbuse(detail: "the client sent SETTINGS and PING frames without reading their acknowledgements (\(error.reason))")
        case .failure(let error):
            // Not HTTP/2, or a connection error: nghttp2 queued a GOAWAY with the code when
            // the peer is owed one (a missing preface gets none). Counted and logged as a
            // refusal; nothing of it went upstream.
            router.protocolError(detail: "HTTP/2: \(error.reason)")
            close()
        }
    }

    private func handle(_ event: HTTP2Event, input: ByteBuffer? = nil) {
        switch event {
        case .headers(let streamID, let fields, let endStream):
            let id = Int(streamID)
            if requestStreams.contains(streamID) {
                // A second block on a stream is its trailers (nghttp2 checked that it ends it).
                router.requestEnd(id, trailers: HTTP2Wire.headers(fields))
                return
            }
            if draining {
                // No upstream is left to carry it: not processed, so the client may retry it
                // on a new connection (RFC 9113 §8.7), which gets a tunnel and verdict of its own.
                reset(streamID, errorCode: ErrorCode.refusedStream)
                return
            }
            requestStreams.insert(streamID)
            if let scheme = HTTP2Wire.pseudo(":scheme", in: fields),
               !HTTP1HeadFields.equalsLowercased(Substring(scheme), "https") && !HTTP1HeadFields.equalsLowercased(Substring(scheme), "http") {
                // As an HTTP/1.1 request target's `ftp://` is: an origin may act on the scheme
                // it is told, and the gate relays only what it pinned, over https.
                router.requestRefused(id, method: HTTP2Wire.pseudo(":method", in: fields) ?? "-",
                                      path: HTTP2Wire.pseudo(":path", in: fields) ?? "-",
                                      detail: "the request's :scheme \"\(scheme)\" is not http or https; only those are relayed inside a tunnel")
                return
            }
            let authority = HTTP2Wire.pseudo(":authority", in: fields)
                ?? fields.first { $0.name == "host" }?.value
            // `:protocol` makes a CONNECT an extended CONNECT (RFC 8441 §4); nghttp2 accepts
            // it only because this session advertised SETTINGS_ENABLE_CONNECT_PROTOCOL, and
            // has checked that it comes with `:scheme` and `:path` on a CONNECT.
            let head = ExchangeRequestHead(
                method: HTTP2Wire.pseudo(":method", in: fields) ?? "", path: HTTP2Wire.pseudo(":path", in: fields) ?? "",
                authority: authority, headers: HTTP2Wire.headers(fields), upgrade: HTTP2Wire.pseudo(":protocol", in: fields))
            router.requestHead(id, head, endStream: endStream)
        case .data(let streamID, let bytes, let endStream):
            let id = Int(streamID)
            if bytes.count > 0 { router.requestBody(id, HTTP2Wire.buffer(bytes, from: input)) }
            if endStream { router.requestEnd(id, trailers: nil) }
        case .streamClosed(let streamID, let errorCode):
            respondingStreams.remove(streamID)
            ownAnswers.remove(streamID)
            let surfaced = requestStreams.remove(streamID) != nil
            let gateReset = resetByGate.remove(streamID) != nil
            if errorCode != 0 && !gateReset, let context,
               abuse.record(surfaced || skippedStreams.contains(streamID) ? .clientReset : .rejectedRequest, now: context.eventLoop.now) {
                endForAbuse(detail: surfaced || skippedStreams.contains(streamID)
                            ? "the client reset streams faster than \(Int(HTTP2AbuseGuard.resets.perSecond)) a second"
                            : "the client sent requests the gate had to reject (oversized or malformed heads) faster than \(Int(HTTP2AbuseGuard.rejections.perSecond)) a second")
            }
            if skippedStreams.remove(streamID) != nil { return }
            if errorCode != 0 && surfaced {
                // A reset after the head reached the router (by the client, or by nghttp2
                // for a body that broke the rules): abandoned upstream too. A clean close
                // comes after the response ended, when the router is done with it.
                router.requestCancelled(Int(streamID))
            } else if errorCode != 0 {
                // Reset before its head surfaced: nghttp2 refused the request itself
                // (pseudo-header misuse, a connection-specific field, a header list over the
                // limit). Nothing of it went anywhere; it is counted as a refusal, each one,
                // and reported (logged) once per read burst.
                rejectedInBurst = (rejectedInBurst.count + 1, "HTTP/2 stream \(streamID) reset with error \(errorCode) before its request was accepted")
            }
        case .goAway:
            // The client opens no more streams; those open finish, then the session is done.
            break
        }
    }

    /// Counts the requests rejected in the read just handled, and logs them once.
    private func reportRejected() {
        guard rejectedInBurst.count > 0 else { return }
        router.protocolErrors(rejectedInBurst.count, detail: rejectedInBurst.detail)
        rejectedInBurst = (0, "")
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        router.clientReadComplete()
        inReadBurst = false
        writeOutput(flush: true)
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            // The client will send nothing more: nothing in flight can be completed in a
            // way it could act on (no more WINDOW_UPDATEs), so the tunnel ends.
            close()
            return
        }
        if event is IdleStateHandler.IdleStateEvent {
            // Each stream still open is cut first (RST_STREAM), then the GOAWAY and close.
            router.cutOpenExchangesForIdleTimeout()
            close()
            return
        }
        if event is TunnelDrainEvent {
            // The gate is shutting down: GOAWAY with the last stream processed goes first
            // (RFC 9113 §6.8), so the client opens no more; the streams in flight finish,
            // and the connection closes once each has sent its last frame.
            wire.goAway(errorCode: 0)
            closeWhenAnswered()
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        router.clientClosed()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        close()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { router.clientDrained() }
        context.fireChannelWritabilityChanged()
    }

    // MARK: from the router

    func sendResponseHead(_ id: Int, _ head: ExchangeResponseHead, endStream: Bool) {
        let streamID = Int32(id)
        if head.upgrade != nil {
            // The upstream agreed to the extended CONNECT's protocol: in its own form (a 2xx
            // on HTTP/2; over HTTP/1.1 a checked `101`). Here it is the stream's 200 (RFC 8441
            // §5), without the HTTP/1.1 key/accept fields; the stream stays open both ways
            // and its DATA is the protocol's bytes.
            var headers = WebSocketHandshake.withoutHandshakeFields(head.headers)
            head.framing.applyHTTP2(to: &headers)
            let fields = [HTTP2HeaderField(":status", "200")] + HTTP2Wire.fields(headers)
            do {
                try wire.session.submitResponse(streamID: streamID, fields, endStream: endStream)
                if !endStream { respondingStreams.insert(streamID) }
            } catch {
                reset(streamID)
            }
            return
        }
        // The gate's framing (`ResponseBodyFraming`), not the upstream's `content-length`
        // as it came.
        var headers = head.headers
        head.framing.applyHTTP2(to: &headers)
        let fields = [HTTP2HeaderField(":status", "\(head.status)")] + HTTP2Wire.fields(headers)
        do {
            if head.status < 200 {
                // 101 has no meaning in HTTP/2 (§8.6); an HTTP/2 client never asks for it.
                guard head.status != 101 else {
                    cancel(id)
                    return
                }
                try wire.session.submitInformational(streamID: streamID, fields)
                return
            }
            try wire.session.submitResponse(streamID: streamID, fields, endStream: endStream)
            if !endStream { respondingStreams.insert(streamID) }
        } catch {
            reset(streamID)
        }
    }

    func sendResponseBody(_ id: Int, _ bytes: ByteBuffer) {
        let streamID = Int32(id)
        guard respondingStreams.contains(streamID), wire.sendBody(streamID, bytes) else {
            // The stream takes no more (reset, or its response already ended): the bytes go
            // nowhere, and their credit back to the upstream.
            router.responseBodyDiscarded(id, bytes: bytes.readableBytes)
            if respondingStreams.contains(streamID) { reset(streamID) }
            return
        }
    }

    func endResponse(_ id: Int, trailers: HTTPHeaders?) {
        let streamID = Int32(id)
        guard respondingStreams.remove(streamID) != nil else { return }
        if !wire.endBody(streamID, trailers: trailers) { reset(streamID) }
    }

    func answer(_ id: Int, status: Int, refusal: String, detail: String) {
        let streamID = Int32(id)
        let body = Array("pingate: \(detail)\n".utf8)
        let fields = [
            HTTP2HeaderField(":status", "\(status)"), HTTP2HeaderField("content-type", "text/plain; charset=utf-8"),
            HTTP2HeaderField("content-length", "\(body.count)"), HTTP2HeaderField("pingate-refusal", refusal),
        ]
        do {
            try wire.session.submitResponse(streamID: streamID, fields, endStream: false)
            ownAnswers.insert(streamID)
            try wire.session.sendBody(streamID: streamID, body, endStream: true)
        } catch {
            reset(streamID)
        }
        // A refusal is the gate's own answer: out now, whatever burst is going on.
        if !inReadBurst { writeOutput(flush: true) }
    }

    func cancel(_ id: Int) {
        reset(Int32(id))
    }

    var refusesUnprocessedStreams: Bool { true }

    /// RST_STREAM REFUSED_STREAM (RFC 9113 §8.7), which HTTP/2 clients retry.
    func refuseUnprocessed(_ id: Int) {
        reset(Int32(id), errorCode: ErrorCode.refusedStream)
    }

    func requestBodyPassedOn(_ id: Int, bytes: Int) {
        // The window reopens by what the upstream side took: the client may send that much
        // more. Within a read burst the WINDOW_UPDATE waits for the burst's end. The
        // connection's share of bytes that waited upstream went back already.
        let streamID = Int32(id)
        let early = min(bytes, connectionCreditGiven[streamID] ?? 0)
        do {
            if early == 0 {
                try wire.session.consumed(streamID: streamID, bytes: bytes)
            } else {
                let left = (connectionCreditGiven[streamID] ?? 0) - early
                connectionCreditGiven[streamID] = left > 0 ? left : nil
                try wire.session.consumedStream(streamID, bytes: bytes)
                try wire.session.consumedConnection(bytes: bytes - early)
            }
        } catch {
            router.creditNotApplied(bytes: bytes, detail: "\(error)")
        }
        if !inReadBurst { writeOutput(flush: true) }
    }

    func requestBodyQueued(_ id: Int, bytes: Int) {
        do {
            try wire.session.consumedConnection(bytes: bytes)
            connectionCreditGiven[Int32(id), default: 0] += bytes
        } catch {
            router.creditNotApplied(bytes: bytes, detail: "\(error)")
        }
        if !inReadBurst { writeOutput(flush: true) }
    }

    func openRequestWindow(_ id: Int) {
        guard let activeRequestWindow else { return }
        do {
            try wire.session.setStreamReceiveWindow(Int32(id), bytes: activeRequestWindow)
        } catch {
            // nghttp2 fails this only when out of memory: the stream goes, as on any
            // failure of the session for it.
            reset(Int32(id))
        }
        if !inReadBurst { writeOutput(flush: true) }
    }

    func flush() {
        writeOutput(flush: true)
    }

    func close() {
        guard let context, !closing else { return }
        closing = true
        wire.close(context)
    }

    /// Responses whose body ended upstream may still sit in the session, waiting for the
    /// client's flow-control windows: a body larger than the client's window from an
    /// upstream that closed right after it (an HTTP/1.1 response delimited by the close, a
    /// `Connection: close`, an `h2` origin's GOAWAY) lost everything past the window when
    /// the connection closed at once. So the connection stays up and keeps reading, the
    /// client's WINDOW_UPDATEs let the rest out, and once every stream has sent its last
    /// frame `writeOutput` closes it (GOAWAY, then the close). The router has already answered or reset every
    /// stream the upstream can no longer serve; a stream the client opens meanwhile is
    /// refused (REFUSED_STREAM, safe to retry). GOAWAY waits for the end, not the start:
    /// RFC 9113 lets streams below its last-stream-id finish after it, but some clients
    /// (Python `h2`) stop reading DATA once it has come. A client that stops reading is
    /// cut off by the idle timeout.
    func closeWhenAnswered() {
        guard context != nil, !closing, !draining else { return }
        draining = true
        writeOutput(flush: true)
    }

    /// Charges the SETTINGS and PING frames of the read just handled to the abuse budget:
    /// past it, GOAWAY ENHANCE_YOUR_CALM, as for other floods.
    private func chargeControlFrames() {
        let received = wire.session.controlFramesReceived
        guard received > controlFramesCharged, let context else { return }
        let now = context.eventLoop.now
        while controlFramesCharged < received {
            controlFramesCharged += 1
            if abuse.record(.controlFrame, now: now) {
                endForAbuse(detail: "the client sent SETTINGS and PING frames faster than \(Int(HTTP2AbuseGuard.controlFrames.perSecond)) a second")
                return
            }
        }
    }

    /// Response bytes the session dropped unsent (their stream was reset while they waited for
    /// the client's window): their credit goes back to the upstream. Called before the
    /// closes are handled, while a gate answer's stream is still known as one.
    private func reportDiscardedBodies() {
        for (streamID, bytes) in wire.session.takeDiscardedBodyBytes() where !ownAnswers.contains(streamID) {
            router.responseBodyDiscarded(Int(streamID), bytes: bytes)
        }
    }

    /// The client's resets or rejected requests went past `HTTP2AbuseGuard`'s budget: GOAWAY
    /// ENHANCE_YOUR_CALM (RFC 9113 §7) with the last stream processed, counted and logged
    /// once, and the connection closes; the router cancels what was in flight upstream.
    private func endForAbuse(detail: String) {
        guard !endedForAbuse, let context else { return }
        endedForAbuse = true
        router.protocolError(detail: "HTTP/2 abuse, connection ended with GOAWAY ENHANCE_YOUR_CALM: \(detail)")
        // Counted here, once: the GOAWAY below is not another connection error to count.
        connectionErrorCounted = true
        guard !closing else { return }
        // The GOAWAY goes out now, then close_notify and our FIN, so the client can read all
        // three. The full close waits until the client has been quiet for `abuseQuiet` (or
        // closes), reading and dropping what it still sends, for at most `abuseLingerLimit`:
        // closing a socket with unread bytes makes the kernel send a reset, which destroys
        // the GOAWAY if the client has not read it yet. A fixed 500 ms was too short for a
        // client on a busy machine (issue 33, item 11: the flood test's client saw a reset).
        wire.goAway(errorCode: ErrorCode.enhanceYourCalm)
        _ = wire.write(context, flush: true)
        context.close(mode: .output, promise: nil)
        abuseInputSinceCheck = false
        let limit = NIODeadline.now() + Self.abuseLingerLimit
        scheduleAbuseCheck(context.eventLoop, limit: limit)
    }

    private func scheduleAbuseCheck(_ eventLoop: any EventLoop, limit: NIODeadline) {
        eventLoop.assumeIsolated().scheduleTask(in: Self.abuseQuiet) { [weak self] in
            guard let self, !self.closing else { return }
            if self.abuseInputSinceCheck && NIODeadline.now() < limit {
                self.abuseInputSinceCheck = false
                self.scheduleAbuseCheck(eventLoop, limit: limit)
            } else {
                self.close()
            }
        }
    }

    /// After the GOAWAY for abuse, the connection closes once the client has sent nothing
    /// for this long...
    static let abuseQuiet = TimeAmount.milliseconds(500)
    /// ...or this long after the GOAWAY, whatever it sends.
    static let abuseLingerLimit = TimeAmount.seconds(5)

    private func reset(_ streamID: Int32, errorCode: UInt32 = ErrorCode.internalError) {
        resetByGate.insert(streamID)
        respondingStreams.remove(streamID)
        try? wire.session.resetStream(streamID, errorCode: errorCode)
        if !inReadBurst { writeOutput(flush: true) }
    }

    private func writeOutput(flush: Bool) {
        guard let context else { return }
        let written = wire.write(context, flush: flush)
        // Sampled once the bytes are in the channel: credit for them goes back now only if it
        // can take more, else when it drains (`clientDrained`).
        let writable = context.channel.isWritable
        for (streamID, bytes) in written where !ownAnswers.contains(streamID) {
            router.responseBodyWritten(Int(streamID), bytes: bytes, writable: writable)
        }
        reportDiscardedBodies()
        // Streams that closed as their last frame went out (only closes arise here).
        for event in wire.session.takeEvents() { handle(event) }
        reportRejected()
        if let code = wire.session.connectionErrorSent, !connectionErrorCounted {
            // nghttp2 answered a connection error (an invalid frame, a window overflow, an
            // HPACK failure) with GOAWAY: counted and logged as a refusal.
            connectionErrorCounted = true
            router.protocolError(detail: "HTTP/2 connection error \(code): GOAWAY sent")
        }
        // Once GOAWAY went out both ways and no stream is left, the connection is done; so
        // it is, with the upstream gone, once the last stream has sent its last frame.
        // A stream whose answer is all out but whose request is still coming (an upload the
        // upstream answered early) is not waited for: no upstream is left to take it.
        // A connection ended for abuse is closed by its linger (`endForAbuse`) only: its
        // session is dead at once, and closing here, at the end of the read burst that
        // found the abuse, left the flooding client's next writes unread, so the kernel's
        // reset destroyed the GOAWAY (issue 33, item 11: the flood test's SSLEOFError).
        if flush && !endedForAbuse && (!wire.session.isAlive || (draining && wire.session.allStreamsClosedLocally)) { close() }
    }
}
