import NIOCore
import NIOHTTP1
import PinGateHTTP2

/// An `h2` upstream connection of request-aware tunnels: one nghttp2 client session that
/// the streams of one or more tunnels share.
///
/// Pipeline (upstream channel, behind the TLS handler): this handler alone. Each tunnel on
/// the connection has a lane (`HTTP2UpstreamLane`, its router's upstream side); every
/// exchange a router starts is a stream, and what comes back for a stream goes to the lane
/// that opened it. An HTTP/1.1 client's requests are bridged onto it one after another,
/// an HTTP/2 client's run side by side up to the upstream's SETTINGS_MAX_CONCURRENT_STREAMS
/// (nghttp2 holds the rest until a stream closes). Through the gate's pool, tunnels admitted
/// later on the same event loop add lanes to it while it has streams to spare.
///
/// Backpressure: response bodies are acknowledged to the upstream (WINDOW_UPDATE) only as
/// the client side passes them on; request bodies leave as the upstream's windows allow,
/// and the client side is credited only once they were written while this channel was
/// writable.
final class HTTP2UpstreamSide: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = Never
    typealias OutboundOut = ByteBuffer

    private enum ErrorCode {
        static let cancel: UInt32 = 0x8
        /// RFC 9113 §8.7: the stream was not processed.
        static let refusedStream: UInt32 = 0x7
    }

    // Runtime exclusivity checks: the state below marked `@exclusivity(unchecked)` is read
    // and written in accesses that call nothing out (collection, flag and `StreamWindowTuner`
    // updates); the routers this class calls, which may call back into it, are called only
    // between them. The checks were about 700 instructions per keep-alive request (issue
    // 32, callgrind).

    /// One stream of this connection, from the request's submission to the stream's close.
    private struct UpstreamStream {
        /// The lane of the tunnel that opened it; nil once that tunnel left.
        var lane: HTTP2UpstreamLane?
        /// True once the final response head arrived (a later header block is trailers).
        var answered = false
        /// True while the request body is still to come.
        var sending: Bool
        /// An extended CONNECT awaiting its answer: the protocol asked for, and whether the
        /// client's own request had already ended (an HTTP/1.1 upgrade GET has no body).
        var tunnel: (protocol: String, requestEnded: Bool)?
    }

    /// The tunnels on this connection, by identity: a lane leaves in one step however many
    /// share the connection. (In an array, each removal searched and retained every other
    /// lane: 9,868 idle tunnels ending on one pooled connection held its event loop for 8 s.)
    @exclusivity(unchecked) private var lanes: [ObjectIdentifier: HTTP2UpstreamLane] = [:]
    /// The streams open on it, from the request's submission to the stream's close (or the
    /// connection's end: a request nghttp2 dropped unopened after the upstream's GOAWAY gets
    /// no close), one record each. Emptied when the connection ends: a call that comes
    /// after it (a router's, from inside `upstreamClosed`) finds no stream, so a body is
    /// given back as discarded and an end does nothing.
    @exclusivity(unchecked) private var streams: [Int32: UpstreamStream] = [:]
    /// The lanes whose routers heard something in this read burst, each once: only their
    /// clients are flushed at its end. (Every lane's were: with 5,000 idle tunnels on a pooled
    /// connection, each request to a busy one cost the gate 6.2 ms of CPU in empty flushes.)
    @exclusivity(unchecked) private var lanesHeardThisBurst: [HTTP2UpstreamLane] = []
    /// The lanes whose routers hold request-body credit because this channel was not
    /// writable after their bytes were written, each once: only they are told when it drains.
    @exclusivity(unchecked) private var lanesAwaitingDrain: [HTTP2UpstreamLane] = []
    /// Set by the gate when the connection is shared through its pool, which keeps its idle
    /// timer (the pool's timers are all its own, per loop): `unused` runs when the last lane
    /// left a connection still good for more, `used` when a lane joins again.
    var sharing: (unused: () -> Void, used: () -> Void)?
    private let wire: HTTP2Wire
    /// Set when the upstream sent GOAWAY: the connection takes no new streams.
    private var goAwayReceived = false
    /// Set when a request on it carried connection-bound authentication (NTLM, Negotiate):
    /// no other tunnel joins it, and it closes after its last.
    private(set) var carriedConnectionAuthentication = false
    private var context: ChannelHandlerContext?
    /// Ids for exchanges that could not become streams (the session refused them); they
    /// are negative so they never meet a stream id.
    private var nextRefusedID = -1
    @exclusivity(unchecked) private var inReadBurst = false
    @exclusivity(unchecked) private var closing = false
    /// Called once: with true when the upstream's first SETTINGS arrived, with false when
    /// the connection ended before they did (set only while they are awaited).
    var onPeerSettings: ((_ arrived: Bool) -> Void)?

    /// True once the upstream's SETTINGS arrived (what it offers is then known).
    var peerSettingsReceived: Bool { wire.session.peerSettingsReceived }

    /// Sizes each stream's receive window by what its client takes (`StreamWindowTuner`).
    @exclusivity(unchecked) private var windows = StreamWindowTuner()
    /// When the SETTINGS or PING now awaiting its acknowledgement went out, and the
    /// acknowledgement count that will mark its return.
    @exclusivity(unchecked) private var roundTripProbe: (sentAt: NIODeadline, settings: Bool, acknowledgedBefore: Int)?
    @exclusivity(unchecked) private var lastRoundTripSample: NIODeadline?
    private let roundTripSource: UpstreamRoundTripSource

    /// A connection on a fresh nghttp2 client session with `limits` (the preface is queued).
    /// Its streams start at `StreamWindowTuner.minimumWindow` whatever `limits` says (they
    /// grow from there); the connection's window is large enough for many grown streams,
    /// which the streams' own windows bound.
    init(limits: HTTP2Session.Limits, roundTrip: UpstreamRoundTripSource) throws(HTTP2Error) {
        self.roundTripSource = roundTrip
        var upstreamLimits = limits
        upstreamLimits.initialWindowSize = UInt32(StreamWindowTuner.minimumWindow)
        upstreamLimits.connectionWindowSize = max(limits.connectionWindowSize, Int32(Self.connectionWindow))
        self.wire = HTTP2Wire(session: try HTTP2Session(role: .client, limits: upstreamLimits))
    }

    /// The connection's receive window: four streams at the largest window.
    static let connectionWindow = 4 * StreamWindowTuner.maximumWindow

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        // The connection preface and SETTINGS go out at once (RFC 9113 §3.4); through a
        // parent proxy, their acknowledgement times the first round trip.
        switch roundTripSource {
        case .tcp: sampleTCPRoundTrip(context)
        case .http2Ping: roundTripProbe = (context.eventLoop.now, true, wire.session.settingsAcknowledged)
        }
        writeOutput(flush: true)
    }

    /// Reads the kernel's smoothed round trip for the connection (a system call, answered
    /// on this loop).
    private func sampleTCPRoundTrip(_ context: ChannelHandlerContext) {
        #if os(Linux)
        guard let provider = context.channel as? any SocketOptionProvider else { return }
        provider.getTCPInfo().assumeIsolated().whenSuccess { [weak self] info in
            // tcpi_rtt is in microseconds; 0 before any sample.
            self?.windows.roundTripMeasured(Int64(info.tcpi_rtt) * 1_000)
        }
        #endif
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: lanes

    /// A lane for `router`'s tunnel on this connection.
    func addLane(router: TunnelRouter) -> HTTP2UpstreamLane {
        let lane = HTTP2UpstreamLane(connection: self, router: router)
        lanes[ObjectIdentifier(lane)] = lane
        if lanes.count == 1 { sharing?.used() }
        return lane
    }

    /// `lane`'s tunnel is done with the connection (its streams closed or reset). With no
    /// lane left, a shared connection waits for the next tunnel; one that is not shared closes.
    func removeLane(_ lane: HTTP2UpstreamLane) {
        lanes.removeValue(forKey: ObjectIdentifier(lane))
        // Its streams' frames still to come are acknowledged and dropped (`handle`).
        for (streamID, stream) in streams where stream.lane === lane { streams[streamID]?.lane = nil }
        guard lanes.isEmpty else { return }
        // Not shared, or good for nothing more (no SETTINGS yet, GOAWAY, bound to one user's
        // authentication): it closes with its last tunnel.
        guard let sharing, connectionBlocker == nil else {
            close()
            return
        }
        // The pool's idle timer starts; it closes the connection if no lane joins first.
        sharing.unused()
    }

    /// Stops sharing (the gate is shutting down): the tunnels on the connection finish,
    /// and it closes after the last (at once when none is left).
    func stopSharing() {
        sharing = nil
        if lanes.isEmpty { close() }
    }

    /// A request on the connection carried connection-bound authentication.
    func markConnectionAuthentication() {
        carriedConnectionAuthentication = true
        sharing = nil
    }

    /// Why the connection can carry no more tunnels, or nil when it can.
    var connectionBlocker: UpstreamNotPooledReason? {
        if carriedConnectionAuthentication { return .connectionAuthentication }
        if closing || context == nil || !wire.session.peerSettingsReceived { return .closing }
        if goAwayReceived || wire.goAwaySent || !wire.session.isAlive { return .goAway }
        return nil
    }

    /// True while another tunnel may share the connection: it is healthy, and the upstream's
    /// SETTINGS_MAX_CONCURRENT_STREAMS leaves a stream to spare.
    var canTakeAnotherTunnel: Bool {
        connectionBlocker == nil && UInt32(wire.session.openStreamCount) < wire.session.peerMaxConcurrentStreams
    }

    /// How many tunnels use the connection now.
    var laneCount: Int { lanes.count }

    /// Whether any of `lane`'s streams is open.
    func hasOpenStreams(_ lane: HTTP2UpstreamLane) -> Bool {
        streams.values.contains { $0.lane === lane }
    }

    /// Resets `lane`'s open streams (its tunnel is ending mid-exchange): the other lanes'
    /// streams go on.
    func resetStreams(of lane: HTTP2UpstreamLane) {
        // The ids first: `cancel` updates the records, which would copy the table under a loop.
        let ids = streams.compactMap { $0.value.lane === lane ? $0.key : nil }
        for streamID in ids { cancel(Int(streamID)) }
    }

    /// The router of `streamID`'s tunnel, if it is still on the connection (`routerHeard`).
    private func router(_ streamID: Int32) -> TunnelRouter? { routerHeard(streams[streamID]?.lane) }

    /// `lane`'s router, about to hear from the upstream: inside a read burst, the lane is
    /// listed to have its client flushed at the burst's end (what the router passes on to
    /// its client side is written there without a flush).
    private func routerHeard(_ lane: HTTP2UpstreamLane?) -> TunnelRouter? {
        guard let lane else { return nil }
        if inReadBurst && !lane.listedForFlush {
            lane.listedForFlush = true
            lanesHeardThisBurst.append(lane)
        }
        return lane.router
    }

    // MARK: from the router

    /// HTTP/2 has no `Upgrade` (RFC 9113 §8.6): a protocol switch rides an extended CONNECT
    /// (RFC 8441), which this upstream must have offered (SETTINGS_ENABLE_CONNECT_PROTOCOL).
    /// An extended CONNECT from an HTTP/2 client passes as it is, whatever its `:protocol`;
    /// an HTTP/1.1 client's `Upgrade` is translated, which only WebSocket defines.
    ///
    /// The upstream's SETTINGS are in by now: the client's requests are held back at the
    /// tunnel's start until they arrive (`RequestAwareTunnel.install`).
    /// True when the upstream advertised SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441).
    var enablesConnectProtocol: Bool { wire.session.peerEnablesConnectProtocol }

    func upgradeRefusal(for head: ExchangeRequestHead) -> String? {
        let upgrade = head.upgrade ?? ""
        guard wire.session.peerEnablesConnectProtocol else {
            return "the upstream speaks HTTP/2 and did not advertise SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441), so it cannot carry \(upgrade)"
        }
        if head.isExtendedConnect { return nil }
        guard WebSocketHandshake.isWebSocket(upgrade), head.method == "GET" else {
            return "the upstream speaks HTTP/2, where only a WebSocket GET has an extended CONNECT form (RFC 8441 §5), not \(head.method) with Upgrade: \(upgrade)"
        }
        guard head.headers.first(name: "sec-websocket-key") != nil else {
            return "a WebSocket upgrade without Sec-WebSocket-Key cannot be answered"
        }
        return nil
    }

    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool, lane: HTTP2UpstreamLane) -> Int {
        // The authority sent is the checked one, never the client's own text.
        var fields: [HTTP2HeaderField]
        var headers = head.headers
        let tunnel = head.upgrade != nil
        if let upgrade = head.upgrade {
            // An extended CONNECT (RFC 8441 §4): `:protocol` names what the stream carries.
            // An HTTP/1.1 WebSocket GET becomes one (§5); its key/accept fields mean nothing
            // here: the client side computes the accept from the client's own key.
            fields = [
                HTTP2HeaderField(":method", "CONNECT"), HTTP2HeaderField(":protocol", upgrade),
                HTTP2HeaderField(":scheme", "https"), HTTP2HeaderField(":authority", authority.headerValue),
                HTTP2HeaderField(":path", head.path),
            ]
            headers = WebSocketHandshake.withoutHandshakeFields(headers)
        } else {
            fields = [
                HTTP2HeaderField(":method", head.method), HTTP2HeaderField(":scheme", "https"),
                HTTP2HeaderField(":authority", authority.headerValue), HTTP2HeaderField(":path", head.path),
            ]
        }
        head.framing.applyHTTP2(to: &headers)
        fields.append(contentsOf: HTTP2Wire.fields(headers))
        // A tunnel stream stays open for the protocol's bytes even when the client's request
        // had no body (an HTTP/1.1 upgrade GET ends with its head).
        let endsNow = endStream && !tunnel
        do {
            let streamID = try wire.session.submitRequest(fields, endStream: endsNow)
            streams[streamID] = UpstreamStream(lane: lane, sending: !endsNow,
                                               tunnel: tunnel ? (protocol: head.upgrade ?? "", requestEnded: endStream) : nil)
            return Int(streamID)
        } catch {
            // No stream: the upstream sent GOAWAY or the stream ids ran out (nothing was
            // sent, so the request was not processed), or nghttp2 refused the request. The
            // router hears it once it has recorded the id.
            let id = nextRefusedID
            nextRefusedID -= 1
            let notStarted = error.isStreamNotStarted
            context?.eventLoop.assumeIsolated().execute { [weak router = lane.router] in
                if notStarted { router?.responseNotProcessed(id) } else { router?.responseCancelled(id) }
            }
            return id
        }
    }

    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer, lane: HTTP2UpstreamLane) {
        let streamID = Int32(id)
        let sending = streams[streamID]?.sending ?? false
        guard sending, wire.sendBody(streamID, bytes) else {
            // The stream takes no more (reset, ended, or never opened): the bytes go nowhere,
            // and their credit back to the client.
            lane.router?.requestBodyDiscarded(id, bytes: bytes.readableBytes)
            // Read again: giving the credit back may have cancelled the stream already.
            if streams[streamID]?.sending == true { cancel(id) }
            return
        }
    }

    func endRequest(_ id: Int, trailers: HTTPHeaders?, lane: HTTP2UpstreamLane) {
        let streamID = Int32(id)
        guard stopSending(streamID) else { return }
        if !wire.endBody(streamID, trailers: trailers) { cancel(id) }
    }

    func cancel(_ id: Int) {
        guard id > 0 else { return }
        _ = stopSending(Int32(id))
        try? wire.session.resetStream(Int32(id), errorCode: ErrorCode.cancel)
        if !inReadBurst { writeOutput(flush: true) }
    }

    /// Marks `streamID`'s request body as done; true when it was still being sent.
    private func stopSending(_ streamID: Int32) -> Bool {
        guard let index = streams.index(forKey: streamID), streams.values[index].sending else { return false }
        streams.values[index].sending = false
        return true
    }

    func responseBodyPassedOn(_ id: Int, bytes: Int, lane: HTTP2UpstreamLane) {
        guard id > 0 else {
            // A refused exchange's id: no stream ever carried bytes for it.
            lane.router?.creditNotApplied(bytes: bytes, detail: "response credit for exchange \(id), which never had a stream")
            return
        }
        // For a stream that closed meanwhile nghttp2 reopens the connection window alone,
        // which is what the upstream is waiting for.
        let streamID = Int32(id)
        // Read before the credit reopens it: whether the upstream had (nearly) run out.
        let upstreamWaiting = windows.window(of: streamID).map { window in
            (wire.session.streamReceiveWindowRemaining(streamID) ?? window) < window / 4
        } ?? false
        do {
            try wire.session.consumed(streamID: streamID, bytes: bytes)
        } catch {
            lane.router?.creditNotApplied(bytes: bytes, detail: "\(error)")
        }
        if let context, let window = windows.credited(streamID, bytes: bytes, now: Int64(clamping: context.eventLoop.now.uptimeNanoseconds),
                                                      upstreamWaiting: upstreamWaiting) {
            // The client takes the bytes faster than one window per round trip: the window
            // is what holds the stream back, so it grows (a WINDOW_UPDATE for the difference).
            try? wire.session.setStreamReceiveWindow(streamID, bytes: window)
            lane.router?.upstreamStreamWindowGrew(to: window)
        }
        if !inReadBurst { writeOutput(flush: true) }
    }

    /// Keeps the round trip measured while streams are open, at most every `pingInterval`:
    /// the kernel's again, or (through a parent proxy) a PING, timed when the acknowledgement
    /// awaited has come. The smallest round trip seen is the one used.
    private func timeRoundTrip(now: NIODeadline) {
        if let probe = roundTripProbe {
            let count = probe.settings ? wire.session.settingsAcknowledged : wire.session.pingsAcknowledged
            guard count > probe.acknowledgedBefore else { return }
            windows.roundTripMeasured((now - probe.sentAt).nanoseconds)
            roundTripProbe = nil
        }
        guard windows.meteredStreams > 0, lastRoundTripSample.map({ now - $0 >= Self.pingInterval }) ?? true, let context else { return }
        lastRoundTripSample = now
        switch roundTripSource {
        case .tcp:
            sampleTCPRoundTrip(context)
        case .http2Ping:
            let before = wire.session.pingsAcknowledged
            guard (try? wire.session.ping()) != nil else { return }
            roundTripProbe = (now, false, before)
        }
    }

    /// How often a PING (or a TCP_INFO read) re-measures the round trip while streams are
    /// open.
    static let pingInterval = TimeAmount.seconds(2)

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
            reportDiscardedBodies()
            timeRoundTrip(now: context.eventLoop.now)
            for event in events { handle(event, input: buffer) }
            if wire.session.peerSettingsReceived, let waiting = onPeerSettings {
                onPeerSettings = nil
                waiting(true)
            }
        case .failure:
            // The upstream broke HTTP/2: nothing more of this connection can be trusted.
            close()
        }
    }

    private func handle(_ event: HTTP2Event, input: ByteBuffer? = nil) {
        switch event {
        case .headers(let streamID, let fields, let endStream):
            let id = Int(streamID)
            // nghttp2 delivers no HEADERS on a stream this client did not open (push is off);
            // a stream may be missing only once the connection ended in this read burst.
            let index = streams.index(forKey: streamID)
            let router = index.flatMap { routerHeard(streams.values[$0].lane) }
            if let index, streams.values[index].answered {
                router?.responseEnd(id, trailers: HTTP2Wire.headers(fields))
                return
            }
            let status = Int(HTTP2Wire.pseudo(":status", in: fields) ?? "") ?? 502
            var head = ExchangeResponseHead(status: status, headers: HTTP2Wire.headers(fields))
            if status >= 200, let index {
                streams.values[index].answered = true
                // The stream exists on both ends now: its window is measured from here.
                windows.streamOpened(streamID)
                let tunnel = streams.values[index].tunnel
                streams.values[index].tunnel = nil
                if let tunnel {
                    if (200..<300).contains(status) {
                        // RFC 8441 §4: a 2xx opens the tunnel; the stream's DATA is the protocol.
                        head.upgrade = tunnel.protocol
                    } else if tunnel.requestEnded {
                        // Refused: the answer passes as an ordinary response. The client's
                        // request had ended (an upgrade GET), so the stream ends our way too.
                        if stopSending(streamID), !wire.endBody(streamID, trailers: nil) {
                            try? wire.session.resetStream(streamID, errorCode: ErrorCode.cancel)
                        }
                    }
                }
            }
            router?.responseHead(id, head, endStream: endStream)
        case .data(let streamID, let bytes, let endStream):
            let id = Int(streamID)
            let router = router(streamID)
            if bytes.count > 0 {
                if let router {
                    router.responseBody(id, HTTP2Wire.buffer(bytes, from: input))
                } else {
                    // A stream whose tunnel left: its bytes are acknowledged at once, or they
                    // would hold the connection window every other tunnel shares.
                    try? wire.session.consumed(streamID: streamID, bytes: bytes.count)
                }
            }
            // Found again: passing the body on may have ended the tunnel (`removeLane`).
            if endStream { self.router(streamID)?.responseEnd(id, trailers: nil) }
        case .streamClosed(let streamID, let errorCode):
            windows.streamClosed(streamID)
            let router = routerHeard(streams.removeValue(forKey: streamID)?.lane)
            // Refused unprocessed (REFUSED_STREAM: by the upstream, or by nghttp2 for a stream
            // above its GOAWAY's last stream id), or reset: the exchange is abandoned.
            if errorCode == ErrorCode.refusedStream {
                router?.responseNotProcessed(Int(streamID))
            } else if errorCode != 0 {
                router?.responseCancelled(Int(streamID))
            }
        case .goAway:
            // Streams above its last id are closed by nghttp2 (REFUSED_STREAM); those below
            // finish, and the session is done once they have. A parked connection has none:
            // it closes now, and the pool lets it go.
            goAwayReceived = true
            if lanes.isEmpty { close() }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // By index: a flush may reach back here and list another lane (still in the burst,
        // so credit given back waits for the one write below), which is flushed in turn.
        var index = 0
        while index < lanesHeardThisBurst.count {
            let lane = lanesHeardThisBurst[index]
            lane.listedForFlush = false
            lane.router?.upstreamReadComplete()
            index += 1
        }
        lanesHeardThisBurst.removeAll(keepingCapacity: true)
        inReadBurst = false
        writeOutput(flush: true)
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let waiting = onPeerSettings {
            onPeerSettings = nil
            waiting(false)
        }
        // The pool's hooks go with the connection: nothing of the pool is kept past it.
        sharing = nil
        let gone = lanes.values
        lanes = [:]
        streams = [:]
        // Each lane holds the connection: the lists would keep both alive.
        lanesHeardThisBurst = []
        lanesAwaitingDrain = []
        for lane in gone { lane.router?.upstreamClosed() }
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
            // Taken whole first: a router told may write again, and what it writes while
            // the channel is full again waits for the next drain.
            var waiting: [HTTP2UpstreamLane] = []
            swap(&waiting, &lanesAwaitingDrain)
            for lane in waiting { lane.awaitingDrain = false }
            for lane in waiting { lane.router?.upstreamDrained() }
        }
        context.fireChannelWritabilityChanged()
    }

    /// Request bytes the session dropped unsent (their stream was reset while they waited
    /// for the upstream's window): their credit goes back to the client.
    private func reportDiscardedBodies() {
        for (streamID, bytes) in wire.session.takeDiscardedBodyBytes() {
            router(streamID)?.requestBodyDiscarded(Int(streamID), bytes: bytes)
        }
    }

    private func writeOutput(flush: Bool) {
        guard let context else { return }
        let written = wire.write(context, flush: flush)
        let writable = context.channel.isWritable
        for (streamID, bytes) in written {
            let lane = streams[streamID]?.lane
            if !writable, let lane, !lane.awaitingDrain {
                // Its router holds this credit until the channel drains (`CreditLedger`).
                lane.awaitingDrain = true
                lanesAwaitingDrain.append(lane)
            }
            routerHeard(lane)?.requestBodyWritten(Int(streamID), bytes: bytes, writable: writable)
        }
        reportDiscardedBodies()
        // Streams that closed as their last frame went out (only closes arise here).
        for event in wire.session.takeEvents() { handle(event) }
        // Once GOAWAY went out both ways and no stream is left, the connection is done.
        if flush && !wire.session.isAlive { close() }
    }
}

/// One tunnel's use of a shared `h2` upstream connection: its router's upstream side. The
/// streams it opens are its own; everything of the connection (its window, its SETTINGS,
/// its end) is shared with the other lanes.
final class HTTP2UpstreamLane: TunnelUpstreamSide {
    /// Held strongly: the connection's pipeline may let go of its handler first, and a lane
    /// must still answer its router.
    let connection: HTTP2UpstreamSide
    /// The tunnel; nil once the lane left the connection.
    private(set) weak var router: TunnelRouter?
    // Both flags are the connection's bookkeeping, read and written in plain accesses
    // (no runtime exclusivity checks, as the connection's own lists).
    /// Set while the connection has it listed to flush its client at the end of a read burst.
    @exclusivity(unchecked) fileprivate var listedForFlush = false
    /// Set while the connection has it listed to hear the connection's drain.
    @exclusivity(unchecked) fileprivate var awaitingDrain = false

    init(connection: HTTP2UpstreamSide, router: TunnelRouter) {
        self.connection = connection
        self.router = router
    }

    func upgradeRefusal(for head: ExchangeRequestHead) -> String? { connection.upgradeRefusal(for: head) }

    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int {
        connection.startRequest(head, authority: authority, endStream: endStream, lane: self)
    }

    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer) { connection.sendRequestBody(id, bytes, lane: self) }

    func endRequest(_ id: Int, trailers: HTTPHeaders?) { connection.endRequest(id, trailers: trailers, lane: self) }

    func cancel(_ id: Int) { connection.cancel(id) }

    func responseBodyPassedOn(_ id: Int, bytes: Int) { connection.responseBodyPassedOn(id, bytes: bytes, lane: self) }

    func flush() { connection.flush() }

    /// The tunnel is done with the connection: its open streams are reset, and the other
    /// tunnels' go on (the connection itself closes only when no tunnel uses it and it is
    /// not shared through the pool).
    func close() {
        connection.resetStreams(of: self)
        leave()
    }

    /// Never: an extended CONNECT is one stream of the connection, which goes on with HTTP/2.
    var switchedProtocols: Bool { false }

    /// When the upstream advertised SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441).
    var carriesExtendedConnect: Bool { connection.enablesConnectProtocol }

    var reuseBlocker: UpstreamNotPooledReason? {
        if let blocker = connection.connectionBlocker { return blocker }
        return connection.hasOpenStreams(self) ? .inFlight : nil
    }

    func park() { leave() }

    func detach() { leave() }

    /// A lane belongs to one tunnel: a later tunnel gets a lane of its own.
    func attach(to router: TunnelRouter) { self.router = router }

    private func leave() {
        guard router != nil else { return }
        router = nil
        connection.removeLane(self)
    }
}
