import NIOCore
import NIOHTTP1
import PinGateHTTP2

/// The upstream side of a request-aware tunnel when the upstream negotiated `h2`.
///
/// Pipeline (upstream channel, behind the TLS handler): this handler alone, owning an
/// nghttp2 client session on the one upstream connection the verdict was made on. Every
/// exchange the router starts is a stream; an HTTP/1.1 client's requests are bridged onto
/// it one after another (its pipelining keeps them in order), an HTTP/2 client's run side
/// by side up to the upstream's SETTINGS_MAX_CONCURRENT_STREAMS (nghttp2 holds the rest
/// until a stream closes).
///
/// Backpressure: response bodies are acknowledged to the upstream (WINDOW_UPDATE) only as
/// the client side passes them on; request bodies leave as the upstream's windows allow,
/// and the client side is credited only once they were written while this channel was
/// writable.
final class HTTP2UpstreamSide: ChannelDuplexHandler, TunnelUpstreamSide {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = Never
    typealias OutboundOut = ByteBuffer

    private enum ErrorCode {
        static let cancel: UInt32 = 0x8
    }

    private let router: TunnelRouter
    private let wire: HTTP2Wire
    private var context: ChannelHandlerContext?
    /// Streams whose final response head arrived (a later block is trailers).
    private var answeredStreams: Set<Int32> = []
    /// Streams opened with a request body still to come.
    private var sendingStreams: Set<Int32> = []
    /// Ids for exchanges that could not become streams (the session refused them); they
    /// are negative so they never meet a stream id.
    private var nextRefusedID = -1
    private var inReadBurst = false
    private var closing = false

    /// A side on a fresh nghttp2 client session with `limits` (the preface is queued).
    init(router: TunnelRouter, limits: HTTP2Session.Limits) throws(HTTP2Error) {
        self.router = router
        self.wire = HTTP2Wire(session: try HTTP2Session(role: .client, limits: limits))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        // The connection preface and SETTINGS go out at once (RFC 9113 §3.4).
        writeOutput(flush: true)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: from the router

    /// HTTP/2 has no `Upgrade` (RFC 9113 §8.6); the router answers such a request itself.
    var carriesUpgrades: Bool { false }

    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int {
        // The authority sent is the checked one, never the client's own text.
        var fields = [
            HTTP2HeaderField(":method", head.method), HTTP2HeaderField(":scheme", "https"),
            HTTP2HeaderField(":authority", authority.headerValue), HTTP2HeaderField(":path", head.path),
        ]
        fields.append(contentsOf: HTTP2Wire.fields(head.headers))
        do {
            let streamID = try wire.session.submitRequest(fields, endStream: endStream)
            if !endStream { sendingStreams.insert(streamID) }
            return Int(streamID)
        } catch {
            // No stream (the upstream sent GOAWAY, or ran out of stream ids): the router
            // hears it as an abandoned exchange once it has recorded the id.
            let id = nextRefusedID
            nextRefusedID -= 1
            context?.eventLoop.assumeIsolated().execute { [router] in router.responseCancelled(id) }
            return id
        }
    }

    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer) {
        let streamID = Int32(id)
        guard sendingStreams.contains(streamID) else { return }
        if !wire.sendBody(streamID, bytes) { cancel(id) }
    }

    func endRequest(_ id: Int, trailers: HTTPHeaders?) {
        let streamID = Int32(id)
        guard sendingStreams.remove(streamID) != nil else { return }
        if !wire.endBody(streamID, trailers: trailers) { cancel(id) }
    }

    func cancel(_ id: Int) {
        guard id > 0 else { return }
        sendingStreams.remove(Int32(id))
        try? wire.session.resetStream(Int32(id), errorCode: ErrorCode.cancel)
        if !inReadBurst { writeOutput(flush: true) }
    }

    func responseBodyPassedOn(_ id: Int, bytes: Int) {
        guard id > 0 else { return }
        try? wire.session.consumed(streamID: Int32(id), bytes: bytes)
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

    // MARK: from the upstream

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }
        inReadBurst = true
        let buffer = unwrapInboundIn(data)
        switch wire.receive(buffer) {
        case .success(let events):
            for event in events { handle(event, input: buffer) }
        case .failure:
            // The upstream broke HTTP/2: nothing more of this connection can be trusted.
            close()
        }
    }

    private func handle(_ event: HTTP2Event, input: ByteBuffer? = nil) {
        switch event {
        case .headers(let streamID, let fields, let endStream):
            let id = Int(streamID)
            if answeredStreams.contains(streamID) {
                router.responseEnd(id, trailers: HTTP2Wire.headers(fields))
                return
            }
            let status = Int(HTTP2Wire.pseudo(":status", in: fields) ?? "") ?? 502
            if status >= 200 { answeredStreams.insert(streamID) }
            router.responseHead(id, ExchangeResponseHead(status: status, headers: HTTP2Wire.headers(fields)), endStream: endStream)
        case .data(let streamID, let bytes, let endStream):
            let id = Int(streamID)
            if bytes.count > 0 { router.responseBody(id, HTTP2Wire.buffer(bytes, from: input)) }
            if endStream { router.responseEnd(id, trailers: nil) }
        case .streamClosed(let streamID, let errorCode):
            answeredStreams.remove(streamID)
            sendingStreams.remove(streamID)
            // Reset by the upstream (or refused past its GOAWAY): the exchange is abandoned.
            if errorCode != 0 { router.responseCancelled(Int(streamID)) }
        case .goAway:
            // Streams above its last id are closed by nghttp2 (REFUSED_STREAM); those below
            // finish, and the session is done once they have.
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        router.upstreamReadComplete()
        inReadBurst = false
        writeOutput(flush: true)
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        router.upstreamClosed()
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            close()
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        close()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            for (id, bytes) in wire.takeOwed() { router.requestBodyTransmitted(id, bytes: bytes) }
        }
        context.fireChannelWritabilityChanged()
    }

    private func writeOutput(flush: Bool) {
        guard let context else { return }
        for credit in wire.write(context, flush: flush) { router.requestBodyTransmitted(Int(credit.streamID), bytes: credit.bytes) }
        // Streams that closed as their last frame went out (only closes arise here).
        for event in wire.session.takeEvents() { handle(event) }
        // Once GOAWAY went out both ways and no stream is left, the connection is done.
        if flush && !wire.session.isAlive { close() }
    }
}
