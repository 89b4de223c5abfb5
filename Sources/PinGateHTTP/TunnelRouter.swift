import Foundation
import NIOCore
import NIOHTTP1
import PinGateNIO

/// The middle of a request-aware tunnel: every request the client side reads comes here,
/// is checked against the tunnel's pinned authority, and is either refused on the spot
/// (421 `authority-mismatch`, 400 `malformed-request`) or started on the upstream side;
/// responses go back the other way. It owns the pairing of client exchange ids (HTTP/2
/// stream ids, or HTTP/1.1 request numbers) to upstream ones, and the flow-control
/// credits between the sides: a side is told it may read more of a body only once the
/// other side has passed those bytes on, so neither side buffers without bound.
///
/// Both sides and the router live on the tunnel's one event loop (the upstream is dialled
/// on the client's loop), so calls between them are plain calls.
package final class TunnelRouter {
    /// What the router reports about each request; the gate turns it into counters,
    /// the refusal log, log lines and the per-request audit log.
    package struct Observer {
        /// A request was refused inside the tunnel (before any of it went upstream).
        package var refused: (_ reason: RequestRefusal, _ authority: String, _ detail: String) -> Void
        /// A request was passed on to the upstream.
        package var forwarded: () -> Void
        /// Body bytes passed on: `up` from the client to the upstream, `down` the other way.
        package var relayed: (_ up: Int, _ down: Int) -> Void
        /// An exchange ended (answered, refused or cancelled), with what it amounted to.
        package var finished: (ExchangeSummary) -> Void
        /// Flow-control credit (bytes) that a side reported and no account had outstanding:
        /// never expected (`CreditLedger.unplaced`); counted so a miscount is seen.
        package var creditUnplaced: (_ bytes: Int) -> Void = { _ in }
        /// A refusal counted like `refused` but not logged (one of a burst already logged).
        package var refusedQuietly: (_ reason: RequestRefusal) -> Void = { _ in }
        /// The client abandoned a request before its response ended (HTTP/2 RST_STREAM).
        package var cancelledByClient: () -> Void = {}
        /// The tunnel ended (both sides are done with the router).
        package var ended: () -> Void = {}
        /// The upstream connection of a tunnel that reconnects went while the client's stayed.
        package var upstreamLost: () -> Void = {}
        /// The upstream connection sent bytes no request asked for (a stray between
        /// responses, or after one's end): it is closed as out of step.
        package var upstreamSentUnsolicitedBytes: () -> Void = {}
        /// A request that cannot be repeated found the upstream connection idle for this long,
        /// past what its origin is trusted to keep: it went on a new connection.
        package var upstreamLeftIdle: (_ idle: TimeAmount) -> Void = { _ in }
        /// A connection that had idled this long carried a request to its answer.
        package var upstreamServedAfterIdle: (_ idle: TimeAmount) -> Void = { _ in }
        /// The origin closed the tunnel's connection after it had idled this long.
        package var upstreamClosedWhileIdle: (_ idle: TimeAmount) -> Void = { _ in }
        /// An `h2` upstream stream's receive window grew to `window` bytes, because its
        /// client took the bytes faster than one window per round trip (`StreamWindowTuner`).
        package var upstreamStreamWindowGrew: (_ window: Int) -> Void = { _ in }

        /// An observer calling these; the ones left out do nothing.
        package init(refused: @escaping (_ reason: RequestRefusal, _ authority: String, _ detail: String) -> Void,
                     forwarded: @escaping () -> Void, relayed: @escaping (_ up: Int, _ down: Int) -> Void,
                     finished: @escaping (ExchangeSummary) -> Void, creditUnplaced: @escaping (_ bytes: Int) -> Void = { _ in },
                     refusedQuietly: @escaping (_ reason: RequestRefusal) -> Void = { _ in },
                     cancelledByClient: @escaping () -> Void = {}, ended: @escaping () -> Void = {}) {
            self.refused = refused
            self.forwarded = forwarded
            self.relayed = relayed
            self.finished = finished
            self.creditUnplaced = creditUnplaced
            self.refusedQuietly = refusedQuietly
            self.cancelledByClient = cancelledByClient
            self.ended = ended
        }
    }

    /// What one finished exchange amounted to: the audit log's line, before formatting.
    package struct ExchangeSummary: Equatable {
        package var started: Date
        package var durationNanoseconds: Int64
        package var method: String
        package var path: String
        package var authority: String
        package var status: Int?
        package var bytesUp: Int
        package var bytesDown: Int
        package var clientStreamID: Int?
        package var refusal: RequestRefusal?
        /// Why its response was cut after it began (the client got a reset or a short
        /// close, never the end), or nil when it ended, was refused, or was the client's own
        /// cancel: counted as cut, not as delivered (issue 31).
        package var cut: ExchangeCut? = nil
    }

    /// Why a response was cut after it began.
    package enum ExchangeCut: String, Sendable, Equatable {
        /// The upstream abandoned it, or its connection ended mid-response.
        case upstreamClosed = "upstream-closed"
        /// Nothing moved either way for the idle timeout.
        case idleTimeout = "idle-timeout"
        /// The upstream's body broke the framing its head gave it.
        case upstreamProtocolError = "upstream-protocol-error"
    }

    /// Which connection a reconnect asks for.
    package enum UpstreamDial: Sendable, Equatable {
        /// One like the tunnel's first: from the pool, or dialled with the gate's ALPN offer.
        case asBefore
        /// A connection of the tunnel's own, dialled with ALPN `http/1.1` only and never
        /// pooled or shared: for an HTTP/1.1 client's WebSocket `Upgrade` that the tunnel's
        /// `h2` upstream cannot carry (it did not advertise RFC 8441).
        case privateHTTP1
        /// A new connection, never one from the pool: for a request that cannot be repeated
        /// and found the tunnel's connection idle too long (`KeepAliveEstimate`).
        case freshConnection
    }

    /// What came of opening a new upstream connection for the tunnel.
    package enum UpstreamReconnect {
        /// It is up, verified and trusted, and its side is this router's upstream now.
        case connected
        /// It was refused (its verdict, or it could not be reached): each waiting request is
        /// answered `status` with `Pingate-Refusal: reason`.
        case refused(status: Int, reason: RequestRefusal, detail: String)
    }

    /// Every decision of the tunnel: the router carries out the actions it returns.
    private(set) var state: TunnelRouterState
    /// Every body byte's credit (the state's), for tests and the tunnel's checks.
    var ledger: CreditLedger { state.ledger }
    private let observer: Observer
    /// Set by the tunnel's set-up once both sides exist; cleared when the tunnel ends,
    /// which is what breaks the sides' references back to the router.
    weak var client: (any TunnelClientSide)? {
        didSet { state.clientRefusesUnprocessedStreams = client?.refusesUnprocessedStreams ?? false }
    }
    weak var upstream: (any TunnelUpstreamSide)? {
        didSet {
            guard upstream !== oldValue else { return }
            if let upstream {
                state.upstreamAttached(upstream is HTTP2UpstreamLane ? .http2Lane : .http1)
            } else {
                state.upstreamDetached()
            }
        }
    }
    /// The client's connection, for when the upstream goes before the client's first bytes
    /// chose a client side (an origin that closes a connection nobody used yet, or answers
    /// before being asked): no side exists then to end it, and the client's leg stayed
    /// open, holding its half of the tunnel and answering nothing, until the idle timeout.
    /// Held strongly: the channel's pipeline holds the router only until the channel closes.
    var clientChannel: Channel?
    /// Kept by `RequestAwareTunnel.install` for a new upstream connection's side (after a
    /// reconnect): the client side an upgrade switches, and the glue maker of byte relays.
    var upgradableClient: RequestAwareTunnel.UpgradableClient?
    var makeRelayGlue: ((_ clientSide: Bool) -> GlueHandler)?
    /// Asked, when the client leaves, whether the upstream connection is kept for another
    /// tunnel (the gate's pool): handed the parked side, it says true when it took it; handed
    /// a reason, it counts it. Nil (no pool, a byte relay's tunnel): the connection closes.
    package var releaseUpstream: ((UpstreamRelease) -> Bool)?
    /// Opens a new upstream connection for the tunnel, verified like the first, and calls
    /// back on the tunnel's loop. Nil: the tunnel ends with its upstream connection.
    package var reconnectUpstream: ((_ dial: UpstreamDial, _ done: @escaping (UpstreamReconnect) -> Void) -> Void)? {
        didSet { state.canReconnect = reconnectUpstream != nil }
    }
    /// Whether the upstream connection now in use carried exchanges before the one now on
    /// it: only such a connection's failure before any response byte makes an idempotent
    /// request worth retrying.
    var upstreamReused: Bool {
        get { state.upstreamReused }
        set { state.upstreamReused = newValue }
    }
    /// How long a connection may have idled and still carry a request that cannot be
    /// repeated: the origin's `KeepAliveEstimate` (the default one when nothing set it).
    package var keepAliveLimit: () -> TimeAmount {
        get { state.keepAliveLimit }
        set { state.keepAliveLimit = newValue }
    }
    /// Set once a request carried connection-bound authentication (NTLM, Negotiate).
    var carriedConnectionAuthentication: Bool { state.carriedConnectionAuthentication }
    /// Ends the client's connection after an upstream failure's answer (`upstreamFailed`).
    private var closeClientAfterUpstreamFailure: (() -> Void)?

    /// A router for one tunnel: `binding` decides each request; `clientUsesStreamIDs` is
    /// true for an HTTP/2 client (its exchange ids are stream ids, logged as such).
    package init(binding: AuthorityBinding, clientUsesStreamIDs: Bool, observer: Observer, now: @escaping () -> Date) {
        self.state = TunnelRouterState(binding: binding, clientUsesStreamIDs: clientUsesStreamIDs, now: now)
        self.observer = observer
    }

    // MARK: carrying out

    /// Carries out `actions` in order. An action may make a side call back in; that call
    /// sees the state already updated and carries out its own actions first.
    private func run(_ actions: TunnelRouterState.Actions) {
        // By index: an iterator would hold its own copy of the list, one more retain and
        // release of every step's payload.
        for index in actions.indices { perform(actions[index]) }
    }

    private func perform(_ action: TunnelRouterState.Action) {
        switch action {
        case .answer(let id, let status, let refusal, let detail):
            client?.answer(id.rawValue, status: status, refusal: refusal.rawValue, detail: detail)
        case .sendResponseHead(let id, let head, let endStream):
            client?.sendResponseHead(id.rawValue, head, endStream: endStream)
        case .sendResponseBody(let id, let bytes):
            client?.sendResponseBody(id.rawValue, bytes)
        case .endResponse(let id, let trailers):
            client?.endResponse(id.rawValue, trailers: trailers)
        case .cancelClientExchange(let id):
            client?.cancel(id.rawValue)
        case .refuseUnprocessed(let id):
            client?.refuseUnprocessed(id.rawValue)
        case .creditRequestBody(let id, let bytes):
            client?.requestBodyPassedOn(id.rawValue, bytes: bytes)
        case .requestBodyQueued(let id, let bytes):
            client?.requestBodyQueued(id.rawValue, bytes: bytes)
        case .openRequestWindow(let id):
            client?.openRequestWindow(id.rawValue)
        case .flushClient:
            client?.flush()
        case .closeClient(let whenAnswered):
            closeClient(whenAnswered: whenAnswered)
        case .closeClientForUpstreamFailure:
            closeClientAfterUpstreamFailure?()
        case .startRequest(let id, let head, let authority, let endStream):
            guard let upstream else {
                // The side went without telling (its channel let go of it): answered, not dropped.
                state.upstreamDetached()
                run(state.startFailed(id))
                return
            }
            let upstreamID = upstream.startRequest(head, authority: authority, endStream: endStream)
            run(state.requestStarted(id, as: UpstreamExchangeID(upstreamID)))
        case .sendRequestBody(let upstreamID, let bytes):
            upstream?.sendRequestBody(upstreamID.rawValue, bytes)
        case .endRequest(let upstreamID, let trailers):
            upstream?.endRequest(upstreamID.rawValue, trailers: trailers)
        case .cancelUpstreamExchange(let upstreamID):
            upstream?.cancel(upstreamID.rawValue)
        case .creditResponseBody(let upstreamID, let bytes):
            upstream?.responseBodyPassedOn(upstreamID.rawValue, bytes: bytes)
        case .markConnectionAuthentication:
            (upstream as? HTTP2UpstreamLane)?.connection.markConnectionAuthentication()
        case .flushUpstream:
            upstream?.flush()
        case .closeUpstream:
            upstream?.close()
        case .leaveUpstream(let verdict):
            leaveUpstream(verdict)
        case .dropUpstream:
            let dropped = upstream
            upstream = nil
            dropped?.detach()
        case .reconnect(let dial):
            reconnectUpstream?(dial) { [weak self] result in self?.reconnected(result) }
        case .observe(let event):
            observe(event)
        }
    }

    private func observe(_ event: TunnelRouterState.Event) {
        switch event {
        case .refused(let reason, let authority, let detail): observer.refused(reason, authority, detail)
        case .refusedQuietly(let reason): observer.refusedQuietly(reason)
        case .forwarded: observer.forwarded()
        case .relayed(let up, let down): observer.relayed(up, down)
        case .finished(let summary): observer.finished(summary)
        case .creditUnplaced(let bytes): observer.creditUnplaced(bytes)
        case .cancelledByClient: observer.cancelledByClient()
        case .ended: observer.ended()
        case .upstreamLost: observer.upstreamLost()
        case .servedAfterIdle(let idle): observer.upstreamServedAfterIdle(idle)
        case .leftIdleConnection(let idle): observer.upstreamLeftIdle(idle)
        }
    }

    /// The tunnel is done with its upstream connection: a lane of a shared `h2` connection
    /// is left (its streams reset) or the connection closed; an HTTP/1.1 connection goes to
    /// the pool when `verdict` allows and the pool takes it, else it closes.
    private func leaveUpstream(_ verdict: UpstreamReuseVerdict) {
        guard let upstream else { return }
        if upstream is HTTP2UpstreamLane {
            if verdict == .reusable { upstream.park() } else { upstream.close() }
            return
        }
        // Asked each time the tunnel leaves a connection: it may leave one mid-tunnel for a
        // new one (`UpstreamDial.freshConnection`), and then that one as its client goes.
        if let release = releaseUpstream {
            switch verdict {
            case .notReusable(let reason):
                _ = release(.notReusable(reason))
            case .reusable:
                upstream.park()
                self.upstream = nil
                if release(.reusable(PooledUpstreamSide(upstream))) { return }
            }
        }
        upstream.close()
    }

    /// The upstream side in use, as the state's queries see it; a side that went without
    /// telling is taken as gone.
    private var upstreamFacts: (any UpstreamConnectionFacts)? {
        if upstream == nil && state.upstream != .none { state.upstreamDetached() }
        return upstream
    }

    // MARK: from the client side

    /// A request head arrived. It is checked here, before anything of it goes upstream.
    func requestHead(_ id: Int, _ head: ExchangeRequestHead, endStream: Bool) {
        let facts = upstreamFacts
        run(state.requestHead(ClientExchangeID(id), head, endStream: endStream, upstream: facts))
    }

    /// The client side refused request `id` itself before asking for a decision (a request
    /// target the gate does not relay): answered 400 `malformed-request` with `detail`,
    /// counted and logged like any refusal; nothing of it goes upstream.
    func requestRefused(_ id: Int, method: String, path: String, detail: String) {
        run(state.requestRefused(ClientExchangeID(id), method: method, path: path, detail: detail))
    }

    /// Request body bytes arrived for exchange `id`.
    func requestBody(_ id: Int, _ bytes: ByteBuffer) {
        run(state.requestBody(ClientExchangeID(id), bytes))
    }

    /// The request of exchange `id` ended.
    func requestEnd(_ id: Int, trailers: HTTPHeaders?) {
        run(state.requestEnd(ClientExchangeID(id), trailers: trailers))
    }

    /// The request of exchange `id` broke its framing after its head went upstream (`detail`
    /// says how): the upstream's half of it cannot be completed, so the upstream exchange is
    /// abandoned (an HTTP/1.1 upstream's connection closes, an HTTP/2 stream is reset) and
    /// the client gets a 400 `malformed-request` if nothing of the response was sent, else
    /// its exchange is cut (RST_STREAM, or the HTTP/1.1 connection closes). Returns false
    /// when no such exchange is open (a refused request's body, or one already answered).
    @discardableResult
    func abandonRequest(_ id: Int, detail: String) -> Bool {
        let actions = state.abandonRequest(ClientExchangeID(id), detail: detail)
        run(actions)
        return !actions.isEmpty
    }

    /// The client abandoned exchange `id` (HTTP/2 RST_STREAM).
    func requestCancelled(_ id: Int) {
        run(state.requestCancelled(ClientExchangeID(id)))
    }

    /// The client's connection is about to close for its idle timeout (nothing moved either
    /// way for that long: an origin stalled mid-body, say): every exchange still open is cut,
    /// so an HTTP/2 client hears RST_STREAM INTERNAL_ERROR for each before the GOAWAY,
    /// which would otherwise claim the streams below its last id as processed (issue 31).
    func cutOpenExchangesForIdleTimeout() {
        run(state.cutOpenExchangesForIdleTimeout())
    }

    /// The client sent bytes that are not valid HTTP: counted and logged as a refusal
    /// (the side itself answers and closes).
    func protocolError(detail: String) {
        observer.refused(.malformedRequest, "-", detail)
    }

    /// `count` requests refused by the client's protocol layer in one read burst (HTTP/2
    /// heads nghttp2 rejected), the last with `detail`: each is counted, the log says it once.
    func protocolErrors(_ count: Int, detail: String) {
        run(state.protocolErrors(count, detail: detail))
    }

    /// The client's bytes are not HTTP at all (nor the protocol its ALPN named): the tunnel
    /// is refused as a whole, counted and logged; the caller closes the client, and the
    /// upstream goes with it.
    func refuseConnection(detail: String) {
        run(state.refuseConnection(detail: detail))
    }

    /// True while exchange `id` was forwarded and its response has not ended.
    func isAwaitingResponse(_ id: Int) -> Bool {
        state.isAwaitingResponse(ClientExchangeID(id))
    }

    /// The client side finished a read burst: what went to the upstream side goes out.
    func clientReadComplete() { upstream?.flush() }

    /// The upstream side finished a read burst: what went to the client side goes out.
    func upstreamReadComplete() { client?.flush() }

    /// The client side wrote `bytes` of exchange `id`'s response body to its channel, which
    /// was `writable` right after: the upstream may send that much more now, or once the
    /// channel drains.
    func responseBodyWritten(_ id: Int, bytes: Int, writable: Bool) {
        run(state.responseBodyWritten(ClientExchangeID(id), bytes: bytes, writable: writable))
    }

    /// The client side dropped `bytes` of exchange `id`'s response body it had been handed
    /// (its stream was reset with them queued, or it could no longer take them).
    func responseBodyDiscarded(_ id: Int, bytes: Int) {
        run(state.responseBodyDiscarded(ClientExchangeID(id), bytes: bytes))
    }

    /// The client's channel is writable again: response bytes written while it was not are
    /// credited to the upstream now.
    func clientDrained() {
        run(state.clientDrained())
    }

    /// The client's connection is gone: every exchange ends, and the upstream connection
    /// is either kept for another tunnel (`releaseUpstream`, or its share) or closed.
    func clientClosed() {
        let facts = upstreamFacts
        run(state.clientClosed(upstream: facts))
    }

    /// Puts a parked upstream side (a pooled connection) under this router, as the
    /// tunnel's upstream.
    package func attach(_ pooled: PooledUpstreamSide) {
        switch pooled.kind {
        case .http1(let side):
            side.attach(to: self)
            upstream = side
        case .http2(let connection):
            upstream = connection.addLane(router: self)
        }
        upstreamReused = true
    }

    /// The tunnel's `h2` upstream connection, which other tunnels may share; nil for HTTP/1.1.
    package var shareableUpstream: PooledUpstreamSide? {
        guard let lane = upstream as? HTTP2UpstreamLane else { return nil }
        return PooledUpstreamSide(http2: lane.connection)
    }

    /// The new upstream connection is up (its side is `upstream`), or was refused: the
    /// waiting requests go to it in order, or are each answered with the refusal.
    private func reconnected(_ result: UpstreamReconnect) {
        let facts = upstreamFacts
        run(state.reconnected(result, upstream: facts))
    }

    // MARK: from the upstream side

    /// A response head arrived for upstream exchange `upstreamID`.
    func responseHead(_ upstreamID: Int, _ head: ExchangeResponseHead, endStream: Bool) {
        run(state.responseHead(UpstreamExchangeID(upstreamID), head, endStream: endStream))
    }

    /// Response body bytes arrived for upstream exchange `upstreamID`.
    func responseBody(_ upstreamID: Int, _ bytes: ByteBuffer) {
        run(state.responseBody(UpstreamExchangeID(upstreamID), bytes))
    }

    /// The response of upstream exchange `upstreamID` ended.
    func responseEnd(_ upstreamID: Int, trailers: HTTPHeaders?) {
        run(state.responseEnd(UpstreamExchangeID(upstreamID), trailers: trailers))
    }

    /// The upstream abandoned exchange `upstreamID` (HTTP/2 RST_STREAM, or its HTTP/1.1
    /// connection ended mid-response).
    func responseCancelled(_ upstreamID: Int) {
        responseFailed(upstreamID, detail: "the upstream abandoned the request")
    }

    /// The upstream never processed exchange `upstreamID`, and says so: an HTTP/2 stream it
    /// refused (REFUSED_STREAM, or above the last stream id of its GOAWAY), a request it
    /// could no longer be sent after GOAWAY, or one still queued when its HTTP/1.1
    /// connection closed. An HTTP/2 client hears it as REFUSED_STREAM and retries on a new
    /// connection (RFC 9113 §8.7); an HTTP/1.1 client gets the 502 of `responseFailed`.
    /// Counted and logged as `upstream-unreachable` either way.
    func responseNotProcessed(_ upstreamID: Int) {
        run(state.responseNotProcessed(UpstreamExchangeID(upstreamID), upstream: upstreamFacts))
    }

    /// Exchange `upstreamID` was never written to its connection, which is closing (it was
    /// queued behind an answer that closed it): it waits for the tunnel's next connection
    /// with what was `queued` of its body (an HTTP/2 client's request with a body is
    /// answered as not processed, for the client to retry).
    func requestNotSent(_ upstreamID: Int, queued: TunnelRouterState.HeldRequestBody) {
        run(state.requestNotSent(UpstreamExchangeID(upstreamID), queued: queued,
                                 switchedProtocols: upstream?.switchedProtocols == true))
    }

    /// The upstream's answer to exchange `upstreamID` cannot be passed on (`detail` says
    /// why): a 502 under `reason` when nothing was answered yet (`upstream-protocol-error`
    /// when the upstream broke its protocol, `upstream-unreachable` when it went away),
    /// else the client's exchange is cut. Counted, listed in `/refusals` and logged like
    /// any refusal inside a tunnel.
    func responseFailed(_ upstreamID: Int, reason: RequestRefusal = .upstreamUnreachable, detail: String) {
        run(state.responseFailed(UpstreamExchangeID(upstreamID), reason: reason, detail: detail))
    }

    /// The upstream side wrote `bytes` of exchange `upstreamID`'s request body to its
    /// channel, which was `writable` right after.
    func requestBodyWritten(_ upstreamID: Int, bytes: Int, writable: Bool) {
        run(state.requestBodyWritten(UpstreamExchangeID(upstreamID), bytes: bytes, writable: writable))
    }

    /// The upstream side dropped `bytes` of exchange `upstreamID`'s request body it had
    /// been handed (the stream was reset, the exchange cancelled before it was sent).
    func requestBodyDiscarded(_ upstreamID: Int, bytes: Int) {
        run(state.requestBodyDiscarded(UpstreamExchangeID(upstreamID), bytes: bytes))
    }

    /// `bytes` of exchange `upstreamID`'s request body wait at the upstream side behind
    /// another exchange: the client may use that much of its connection window elsewhere.
    func requestBodyQueued(_ upstreamID: Int, bytes: Int) {
        run(state.requestBodyQueued(UpstreamExchangeID(upstreamID), bytes: bytes))
    }

    /// Whether the client's requests have windows an upstream side may open
    /// (`requestOnWire`): an HTTP/2 client's streams. An HTTP/1.1 client has none, and the
    /// side spares itself the report.
    var clientHasRequestWindows: Bool { state.clientUsesStreamIDs }

    /// Exchange `upstreamID`'s request, its body still coming, is the one its connection
    /// sends now: the client's stream may have its full window.
    func requestOnWire(_ upstreamID: Int) {
        run(state.requestOnWire(UpstreamExchangeID(upstreamID)))
    }

    /// One of this tunnel's `h2` upstream streams was given a larger receive window.
    func upstreamStreamWindowGrew(to window: Int) {
        observer.upstreamStreamWindowGrew(window)
    }

    /// The upstream connection sent bytes no request asked for; its side closes it (and
    /// then reports it closed, as any upstream close).
    func upstreamSentUnsolicitedBytes() {
        observer.upstreamSentUnsolicitedBytes()
    }

    /// The origin closed the upstream connection after it had idled for `idle`.
    func upstreamClosedWhileIdle(after idle: TimeAmount) {
        observer.upstreamClosedWhileIdle(idle)
    }

    /// The upstream's channel is writable again.
    func upstreamDrained() {
        run(state.upstreamDrained())
    }

    /// A side could not apply credit the ledger gave it (`detail` says why): counted with
    /// what the ledger could not place, so it is seen, never swallowed.
    func creditNotApplied(bytes: Int, detail: String) {
        observer.creditUnplaced(bytes)
    }

    /// The upstream's connection is gone: the client's goes too, once every response already
    /// passed on has reached it, unless the tunnel reconnects (then the client's connection
    /// stays, and what may be repeated waits for the new connection).
    func upstreamClosed() {
        run(state.upstreamClosed(switchedProtocols: upstream?.switchedProtocols == true))
    }

    /// The tunnel's upstream connection was found closed as the tunnel was set up (a pooled
    /// one that went before the join): as if it closed now.
    package func upstreamWentAway() {
        upstreamClosed()
    }

    /// Ends the client's connection: through its side when the client's first bytes chose
    /// one (an HTTP/2 side says GOAWAY first; `whenAnswered`, once every response already
    /// passed on is out), else the channel itself.
    func closeClient(whenAnswered: Bool = false) {
        if let client {
            if whenAnswered { client.closeWhenAnswered() } else { client.close() }
        } else {
            clientChannel?.close(promise: nil)
        }
    }

    /// The upstream connection failed before it could carry a request (an `h2` upstream
    /// that sent no SETTINGS in time): it is closed now; each request the client sends
    /// from here on is answered `status` with `reason` and `detail`, counted and logged,
    /// and then `closeClient` runs (it ends the client's connection once the answer is out).
    func upstreamFailed(status: Int, reason: RequestRefusal, detail: String, closeClient: @escaping () -> Void) {
        let actions = state.upstreamFailed(status: status, reason: reason, detail: detail)
        if !actions.isEmpty { closeClientAfterUpstreamFailure = closeClient }
        run(actions)
    }
}
