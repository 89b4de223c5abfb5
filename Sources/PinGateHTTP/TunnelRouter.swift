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
    }

    /// A class: the router updates an exchange in place on every body chunk, and a struct
    /// this size in a dictionary was copied out and back each time (a heap-allocated
    /// accessor frame per update, six per keep-alive request).
    private final class Exchange {
        let started: Date
        let startedTick: NIODeadline
        let method: String
        let path: String
        /// As sent; for a refusal, as normalized (what the refusal names).
        var authority: String
        var upstreamID: Int?
        var refusal: RequestRefusal?
        var status: Int?
        var bytesUp = 0
        var bytesDown = 0
        var responseEnded = false
        /// Holds the request body to the framing the gate chose (set once it went upstream).
        var meter: RequestBodyMeter?
        /// The request as sent upstream, kept while it may be retried on a new connection:
        /// an idempotent method, no body, sent on a reused connection (RFC 9110 §9.2.2,
        /// RFC 9112 §9.3.1).
        var retry: PendingRequest?
        /// The request as sent upstream, kept until it is on the wire: a bodyless request
        /// that its connection never wrote (queued behind an answer that closed it) goes to
        /// the tunnel's next connection, whatever its method, since it was never sent.
        var unsent: PendingRequest?

        init(started: Date, startedTick: NIODeadline, method: String, path: String, authority: String) {
            self.started = started
            self.startedTick = startedTick
            self.method = method
            self.path = path
            self.authority = authority
        }
    }

    /// A request waiting for the tunnel's new upstream connection, with what the client
    /// sent of it meanwhile (its credit withheld, so the client's own flow control bounds it).
    struct PendingRequest {
        let id: Int
        let head: ExchangeRequestHead
        let authority: RequestAuthority
        let endStream: Bool
        var body: [ByteBuffer] = []
        var ended = false
        var trailers: HTTPHeaders?
    }

    /// Which connection a reconnect asks for.
    package enum UpstreamDial: Sendable, Equatable {
        /// One like the tunnel's first: from the pool, or dialled with the gate's ALPN offer.
        case asBefore
        /// A connection of the tunnel's own, dialled with ALPN `http/1.1` only and never
        /// pooled or shared: for an HTTP/1.1 client's WebSocket `Upgrade` that the tunnel's
        /// `h2` upstream cannot carry (it did not advertise RFC 8441).
        case privateHTTP1
    }

    /// What came of opening a new upstream connection for the tunnel.
    package enum UpstreamReconnect {
        /// It is up, verified and trusted, and its side is this router's upstream now.
        case connected
        /// It was refused (its verdict, or it could not be reached): each waiting request is
        /// answered `status` with `Pingate-Refusal: reason`.
        case refused(status: Int, reason: RequestRefusal, detail: String)
    }

    private var binding: AuthorityBinding
    /// Every body byte's credit, from the leg that read it back to that leg once the other
    /// leg has written it (or never will).
    private(set) var ledger = CreditLedger()
    private let observer: Observer
    private let clientUsesStreamIDs: Bool
    private let now: () -> Date
    /// Set by the tunnel's set-up once both sides exist; cleared when the tunnel ends,
    /// which is what breaks the sides' references back to the router.
    weak var client: (any TunnelClientSide)?
    weak var upstream: (any TunnelUpstreamSide)? {
        // A new upstream connection is a new sink for request bodies: its reports count
        // again, after the old one's were settled by `sinkGone`.
        didSet { if let upstream, upstream !== oldValue { ledger.sinkAttached(.request) } }
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
    /// back on the tunnel's loop: set for a tunnel admitted on a pooled connection, whose
    /// connection may go (the origin's keep-alive timeout) while the client's stays. Nil: the
    /// tunnel ends with its upstream connection, as before the pool.
    package var reconnectUpstream: ((_ dial: UpstreamDial, _ done: @escaping (UpstreamReconnect) -> Void) -> Void)?
    /// Set once the tunnel's upstream is a private connection (`UpstreamDial.privateHTTP1`):
    /// it goes to no other tunnel.
    private var upstreamIsPrivate = false
    /// Requests waiting, in arrival order, for the new upstream connection being opened.
    private var pending: [PendingRequest] = []
    private var reconnecting = false
    /// Whether the upstream connection now in use carried exchanges before the one now on
    /// it (it came from the pool, or finished one in this tunnel): only such a connection's
    /// failure before any response byte makes an idempotent request worth retrying.
    var upstreamReused = false
    /// Set once a request carried connection-bound authentication (NTLM, Negotiate): the
    /// server may take every later request on the connection for that user's, so it is
    /// never handed to another tunnel.
    private(set) var carriedConnectionAuthentication = false
    private var exchanges: [Int: Exchange] = [:]
    private var clientIDByUpstreamID: [Int: Int] = [:]
    private var ended = false
    /// `ledger.unplaced` as last reported to the observer.
    private var reportedUnplaced = 0
    /// Set when the upstream connection failed before it could carry any request (an `h2`
    /// upstream that never sent its SETTINGS): every request that arrives is answered with
    /// it, and `closeClient` ends the client's connection once the answers are out.
    /// `reported` turns true once a refusal counted it, so a tunnel whose client never
    /// sent a request is still counted (once) when it ends.
    private var upstreamFailure: (status: Int, reason: RequestRefusal, detail: String, closeClient: () -> Void, reported: Bool)?

    /// A router for one tunnel: `binding` decides each request; `clientUsesStreamIDs` is
    /// true for an HTTP/2 client (its exchange ids are stream ids, logged as such).
    package init(binding: AuthorityBinding, clientUsesStreamIDs: Bool, observer: Observer, now: @escaping () -> Date) {
        self.binding = binding
        self.clientUsesStreamIDs = clientUsesStreamIDs
        self.observer = observer
        self.now = now
    }

    // MARK: from the client side

    /// A request head arrived. It is checked here, before anything of it goes upstream.
    func requestHead(_ id: Int, _ head: ExchangeRequestHead, endStream: Bool) {
        guard !ended else { return }
        let exchange = Exchange(started: now(), startedTick: .now(), method: head.method, path: head.path,
                                authority: head.authority ?? "-")
        if let failure = upstreamFailure {
            // No upstream can carry it: the gate answers with why, whatever was asked (the
            // authority check would only choose between two refusals), then lets the client go.
            upstreamFailure?.reported = true
            refuse(id, exchange, status: failure.status, reason: failure.reason, detail: failure.detail)
            failure.closeClient()
            return
        }
        let decision = binding.decide(authority: head.authority)
        switch decision {
        case .refuse(let refusal):
            switch refusal {
            case .mismatch(let authority, let text):
                exchange.authority = authority
                refuse(id, exchange, status: 421, reason: .authorityMismatch, detail: text)
            case .malformed(let text):
                refuse(id, exchange, status: 400, reason: .malformedRequest, detail: text)
            }
        case .pass(let authority):
            guard upstream != nil || reconnectUpstream == nil else {
                // The tunnel's upstream connection went between requests: this request waits
                // for a new one, verified like the first.
                exchanges[id] = exchange
                pending.append(PendingRequest(id: id, head: head, authority: authority, endStream: endStream, ended: endStream))
                startReconnect()
                return
            }
            forward(id, exchange, head, authority: authority, endStream: endStream)
        }
    }

    /// Passes request `id`, whose authority passed, on to the upstream side (or refuses it
    /// for what the upstream cannot carry).
    private func forward(_ id: Int, _ started: Exchange, _ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) {
        let exchange = started
        guard let upstream else {
            // No upstream and none to be had (the tunnel is ending): answered, not dropped.
            refuse(id, exchange, status: 502, reason: .upstreamUnreachable, detail: "the tunnel's upstream connection is gone")
            return
        }
        if head.method == "CONNECT" && head.upgrade == nil {
            // A classic CONNECT inside the tunnel would open a tunnel to any host:port,
            // carrying bytes no check ever reads. Only RFC 8441's extended CONNECT (with
            // `:protocol`) passes: its authority was checked above like any request's,
            // and it reaches the same pinned upstream.
            refuse(id, exchange, status: 405, reason: .methodNotAllowed,
                   detail: "CONNECT inside a tunnel is not relayed (only an RFC 8441 extended CONNECT with :protocol is)")
            return
        }
        if let field = Self.oversizedField(head.headers) {
            // One client must not be able to cut another (issue 31): nginx answers a field
            // over its 8 KiB buffers by dropping the connection, and on a shared h2 connection
            // that reset every other app's streams. Refused on every connection, pooled or
            // not, so that pooling changes no outcome; an origin with default limits would
            // refuse the field anyway (nginx drops, Apache answers 400).
            refuse(id, exchange, status: 431, reason: .headerTooLarge,
                   detail: "the header field \(field.name) is \(field.size) bytes; the gate forwards fields of up to \(Self.maximumFieldBytes) bytes (the default limits of nginx and Apache), since a larger one can make the origin drop a connection other clients share")
            return
        }
        if let upgrade = head.upgrade, !WebSocketHandshake.isWebSocket(upgrade) {
            // Only WebSocket is relayed as a switched protocol: its frames carry no
            // requests. Another protocol's bytes would pass unread (an HTTP/1.1 client's
            // other upgrade tokens are dropped before they get here).
            refuse(id, exchange, status: 501, reason: .upgradeUnsupported,
                   detail: "only the WebSocket protocol is relayed through a tunnel, not \(upgrade)")
            return
        }
        if head.upgrade != nil, let detail = upstream.upgradeRefusal(for: head) {
            if carryUpgradeOnPrivateConnection(id, exchange, head, authority: authority, endStream: endStream) { return }
            refuse(id, exchange, status: 501, reason: .upgradeUnsupported, detail: detail)
            return
        }
        var head = head
        if head.upgrade == nil {
            switch RequestBodyFraming.decide(method: head.method, headers: head.headers, endStream: endStream) {
            case .success(let framing):
                head.framing = framing
                exchange.meter = RequestBodyMeter(framing)
            case .failure(let refusal):
                refuse(id, exchange, status: 400, reason: .malformedRequest, detail: refusal.detail)
                return
            }
        } else if !head.isExtendedConnect && !endStream {
            // RFC 6455's opening GET has no body; what follows a granted switch is the new
            // protocol's, carried as the exchange's bytes (an extended CONNECT's stream
            // DATA is that from the start), never as framed content.
            refuse(id, exchange, status: 400, reason: .malformedRequest,
                   detail: "a request asking for an upgrade carries no body through the gate")
            return
        }
        if endStream && head.upgrade == nil {
            let request = PendingRequest(id: id, head: head, authority: authority, endStream: true, ended: true)
            exchange.unsent = request
            if upstreamReused && Self.idempotentMethods.contains(head.method) { exchange.retry = request }
        }
        exchanges[id] = exchange
        observer.forwarded()
        if !carriedConnectionAuthentication && Self.bindsConnection(head.headers) {
            carriedConnectionAuthentication = true
            // A shared h2 connection: no other tunnel joins it from now on.
            (upstream as? HTTP2UpstreamLane)?.connection.markConnectionAuthentication()
        }
        let upstreamID = upstream.startRequest(head, authority: authority, endStream: endStream)
        exchanges[id]?.upstreamID = upstreamID
        clientIDByUpstreamID[upstreamID] = id
    }

    /// An HTTP/1.1 client's WebSocket `Upgrade` that the tunnel's `h2` upstream cannot carry
    /// (no RFC 8441 there): the tunnel leaves its lane of the shared connection and opens one
    /// of its own with ALPN `http/1.1`, verified and pinned like any, where the `Upgrade`
    /// goes as it came (issue 31: a browser that found no extended CONNECT setting uses an
    /// HTTP/1.1 WebSocket, which nginx h2 origins take only on an HTTP/1.1 connection). Only
    /// with nothing else open on the tunnel (the client's connection becomes the WebSocket).
    /// False when it cannot be done: the request is then refused 501.
    private func carryUpgradeOnPrivateConnection(_ id: Int, _ exchange: Exchange, _ head: ExchangeRequestHead,
                                                 authority: RequestAuthority, endStream: Bool) -> Bool {
        guard !clientUsesStreamIDs, let lane = upstream as? HTTP2UpstreamLane, reconnectUpstream != nil, !reconnecting,
              !ended, pending.isEmpty, exchanges.values.allSatisfy({ $0.responseEnded }), ledger.openAccounts == 0,
              head.upgrade.map(WebSocketHandshake.isWebSocket) == true else { return false }
        // The lane leaves the shared connection, which stays with the other tunnels.
        if lane.reuseBlocker == nil { lane.park() } else { lane.close() }
        upstream = nil
        exchanges[id] = exchange
        pending.append(PendingRequest(id: id, head: head, authority: authority, endStream: endStream, ended: endStream))
        startReconnect(.privateHTTP1)
        return true
    }

    /// The client side refused request `id` itself before asking for a decision (a request
    /// target the gate does not relay): answered 400 `malformed-request` with `detail`,
    /// counted and logged like any refusal; nothing of it goes upstream.
    func requestRefused(_ id: Int, method: String, path: String, detail: String) {
        guard !ended else { return }
        let exchange = Exchange(started: now(), startedTick: .now(), method: method, path: path, authority: "-")
        refuse(id, exchange, status: 400, reason: .malformedRequest, detail: detail)
    }

    /// Answers exchange `id` itself: nothing of it goes upstream.
    private func refuse(_ id: Int, _ refused: Exchange, status: Int, reason: RequestRefusal, detail: String) {
        let exchange = refused
        exchange.refusal = reason
        exchange.status = status
        exchange.responseEnded = true
        exchanges[id] = exchange
        observer.refused(reason, exchange.authority, detail)
        client?.answer(id, status: status, refusal: reason.rawValue, detail: detail)
        finishIfDone(id)
    }

    /// Request body bytes arrived for exchange `id`.
    func requestBody(_ id: Int, _ bytes: ByteBuffer) {
        let count = bytes.readableBytes
        if !pending.isEmpty, let index = pending.firstIndex(where: { $0.id == id }) {
            // Held with its request; its credit is given when it is written to the new upstream.
            pending[index].body.append(bytes)
            return
        }
        guard let upstreamID = exchanges[id]?.upstreamID else {
            // A refused request's body, or one whose exchange already ended: dropped, and
            // credited at once so the client's window does not shrink.
            deliver(ledger.returnedUnforwarded(.request, sourceID: id, bytes: count))
            return
        }
        if let problem = exchanges[id]?.meter?.add(count) {
            deliver(ledger.returnedUnforwarded(.request, sourceID: id, bytes: count))
            abandonRequest(id, detail: problem)
            return
        }
        exchanges[id]?.bytesUp += count
        observer.relayed(count, 0)
        ledger.forwarded(.request, sourceID: id, sinkID: upstreamID, bytes: count)
        upstream?.sendRequestBody(upstreamID, bytes)
    }

    /// The request of exchange `id` ended.
    func requestEnd(_ id: Int, trailers: HTTPHeaders?) {
        if !pending.isEmpty, let index = pending.firstIndex(where: { $0.id == id }) {
            pending[index].ended = true
            pending[index].trailers = trailers
            return
        }
        guard let upstreamID = exchanges[id]?.upstreamID else { return }
        if let problem = exchanges[id]?.meter?.end() {
            abandonRequest(id, detail: problem)
            return
        }
        upstream?.endRequest(upstreamID, trailers: trailers)
    }

    /// The request of exchange `id` broke its framing after its head went upstream (`detail`
    /// says how): the upstream's half of it cannot be completed, so the upstream exchange is
    /// abandoned (an HTTP/1.1 upstream's connection closes, an HTTP/2 stream is reset) and
    /// the client gets a 400 `malformed-request` if nothing of the response was sent, else
    /// its exchange is cut (RST_STREAM, or the HTTP/1.1 connection closes). Returns false
    /// when no such exchange is open (a refused request's body, or one already answered).
    @discardableResult
    func abandonRequest(_ id: Int, detail: String) -> Bool {
        guard let exchange = exchanges[id] else { return false }
        dropPending(id)
        // Detached first: cancelling an HTTP/1.1 upstream closes its connection, whose
        // going (reported at once) must not answer this exchange with a 502 of its own.
        let upstreamID = detachFromUpstream(exchange)
        if exchange.status == nil {
            refuse(id, exchange, status: 400, reason: .malformedRequest, detail: detail)
        } else {
            observer.refused(.malformedRequest, exchange.authority, detail)
            exchanges[id]?.refusal = .malformedRequest
            client?.cancel(id)
            finish(id)
        }
        // Then the upstream's half goes; the client's answer is written by now.
        if let upstreamID { upstream?.cancel(upstreamID) }
        return true
    }

    /// The client abandoned exchange `id` (HTTP/2 RST_STREAM).
    func requestCancelled(_ id: Int) {
        guard let exchange = exchanges[id] else { return }
        dropPending(id)
        // Counted as what it is, the client's own choice: not a refusal, not the upstream's
        // failure.
        if !exchange.responseEnded { observer.cancelledByClient() }
        // Detached before the upstream hears of it: cancelling an HTTP/1.1 upstream closes its
        // connection, whose going would otherwise be taken for the upstream failing this
        // exchange (a 502 counted as `upstream-unreachable`).
        let upstreamID = detachFromUpstream(exchange)
        finish(id)
        if let upstreamID { upstream?.cancel(upstreamID) }
    }

    /// The client's connection is about to close for its idle timeout (nothing moved either
    /// way for that long: an origin stalled mid-body, say): every exchange still open is cut,
    /// so an HTTP/2 client hears RST_STREAM INTERNAL_ERROR for each before the GOAWAY,
    /// which would otherwise claim the streams below its last id as processed (issue 31).
    /// The upstream's half of each is abandoned too.
    func cutOpenExchangesForIdleTimeout() {
        for id in exchanges.keys.sorted() {
            guard let exchange = exchanges[id], !exchange.responseEnded else { continue }
            dropPending(id)
            let upstreamID = detachFromUpstream(exchange)
            client?.cancel(id)
            finish(id)
            if let upstreamID { upstream?.cancel(upstreamID) }
        }
    }

    /// Unpairs `exchange` from its upstream exchange (no more of that reaches it, and its
    /// request account closes once settled); returns the upstream id when the response had
    /// not ended, so the caller can abandon it upstream after its own answer is written.
    @discardableResult
    private func detachFromUpstream(_ exchange: Exchange) -> Int? {
        let upstreamID = exchange.responseEnded ? nil : exchange.upstreamID
        if let upstreamID {
            clientIDByUpstreamID[upstreamID] = nil
            ledger.sinkFinishing(.request, sinkID: upstreamID)
        }
        exchange.upstreamID = nil
        return upstreamID
    }

    /// The client sent bytes that are not valid HTTP: counted and logged as a refusal
    /// (the side itself answers and closes).
    func protocolError(detail: String) {
        observer.refused(.malformedRequest, "-", detail)
    }

    /// `count` requests refused by the client's protocol layer in one read burst (HTTP/2
    /// heads nghttp2 rejected), the last with `detail`: each is counted, the log says it once.
    func protocolErrors(_ count: Int, detail: String) {
        observer.refused(.malformedRequest, "-", count == 1 ? detail : "\(detail) (and \(count - 1) more in the same read)")
        for _ in 1..<max(1, count) { observer.refusedQuietly(.malformedRequest) }
    }

    /// The client's bytes are not HTTP at all (nor the protocol its ALPN named): the tunnel
    /// is refused as a whole, counted and logged; the caller closes the client, and the
    /// upstream goes with it.
    func refuseConnection(detail: String) {
        observer.refused(.notHTTP, "-", detail)
        end()
        upstream?.close()
    }

    /// True while exchange `id` was forwarded and its response has not ended.
    func isAwaitingResponse(_ id: Int) -> Bool {
        guard let exchange = exchanges[id] else { return false }
        return exchange.upstreamID != nil && !exchange.responseEnded
    }

    /// The client side finished a read burst: what went to the upstream side goes out.
    func clientReadComplete() { upstream?.flush() }

    /// The upstream side finished a read burst: what went to the client side goes out.
    func upstreamReadComplete() { client?.flush() }

    /// The client side wrote `bytes` of exchange `id`'s response body to its channel, which
    /// was `writable` right after: the upstream may send that much more now, or once the
    /// channel drains.
    func responseBodyWritten(_ id: Int, bytes: Int, writable: Bool) {
        deliver(ledger.wrote(.response, sinkID: id, bytes: bytes, writable: writable))
    }

    /// The client side dropped `bytes` of exchange `id`'s response body it had been handed
    /// (its stream was reset with them queued, or it could no longer take them).
    func responseBodyDiscarded(_ id: Int, bytes: Int) {
        deliver(ledger.discarded(.response, sinkID: id, bytes: bytes))
    }

    /// The client's channel is writable again: response bytes written while it was not are
    /// credited to the upstream now.
    func clientDrained() {
        for credit in ledger.drained(.response) { deliver(credit) }
    }

    /// The client's connection is gone: every exchange ends, and the upstream connection
    /// is either kept for another tunnel (`releaseUpstream`) or closed.
    func clientClosed() {
        for request in pending { dropPending(request.id) }
        end()
        // Nothing handed to the client side will be written: its credit goes back (the
        // upstream connection may outlive this tunnel).
        for credit in ledger.sinkGone(.response) { deliver(credit) }
        guard let upstream else { return }
        if upstream is HTTP2UpstreamLane {
            // A lane of a shared h2 connection: the tunnel leaves it (resetting what it still
            // had open); the connection stays with the other tunnels, or in the pool.
            if reuseBlocker(upstream) == nil { upstream.park() } else { upstream.close() }
            return
        }
        if let release = releaseUpstream {
            releaseUpstream = nil
            if let reason = reuseBlocker(upstream) {
                _ = release(.notReusable(reason))
            } else {
                upstream.park()
                self.upstream = nil
                if release(.reusable(PooledUpstreamSide(upstream))) { return }
            }
        }
        upstream.close()
    }

    /// Why the upstream connection cannot go on to another tunnel now, or nil when it can.
    private func reuseBlocker(_ upstream: any TunnelUpstreamSide) -> UpstreamNotPooledReason? {
        if carriedConnectionAuthentication { return .connectionAuthentication }
        if upstreamIsPrivate { return .privateConnection }
        if upstreamFailure != nil { return .closing }
        // Body bytes whose credit is still out: the connection is not at a boundary.
        if ledger.openAccounts > 0 { return .inFlight }
        return upstream.reuseBlocker
    }

    /// Whether `headers` carry authentication that binds the connection rather than the
    /// request (RFC 4559 `Negotiate`, Microsoft's `NTLM`): the server authenticates the
    /// connection once and may not ask again.
    /// The longest header field (name and value) forwarded: Apache's `LimitRequestFieldSize`
    /// default, just under nginx's 8 KiB `large_client_header_buffers`.
    static let maximumFieldBytes = 8_190

    /// The first header field longer than `maximumFieldBytes`, with its size, or nil.
    static func oversizedField(_ headers: HTTPHeaders) -> (name: String, size: Int)? {
        for field in headers {
            let size = field.name.utf8.count + field.value.utf8.count
            if size > maximumFieldBytes { return (field.name, size) }
        }
        return nil
    }

    static func bindsConnection(_ headers: HTTPHeaders) -> Bool {
        headers[canonicalForm: "authorization"].contains { value in
            // The scheme ends at any whitespace (RFC 9110 §11.6.2 allows tabs too): `NTLM<TAB>…`
            // binds the connection as `NTLM …` does.
            let scheme = value.drop { $0 == " " || $0 == "\t" }.prefix { $0 != " " && $0 != "\t" }.lowercased()
            return scheme == "ntlm" || scheme == "negotiate"
        }
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

    /// Methods a client may repeat without a different effect (RFC 9110 §9.2.2).
    static let idempotentMethods: Set<String> = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]

    /// Drops request `id` from the requests waiting for a new upstream: what its client sent
    /// of the body goes back as credit, never having been forwarded.
    private func dropPending(_ id: Int) {
        guard let index = pending.firstIndex(where: { $0.id == id }) else { return }
        returnCredit(of: pending.remove(at: index))
    }

    /// What the client sent of `request`'s body while it waited: never forwarded, its
    /// credit goes back.
    private func returnCredit(of request: PendingRequest) {
        for bytes in request.body {
            deliver(ledger.returnedUnforwarded(.request, sourceID: request.id, bytes: bytes.readableBytes))
        }
    }

    /// Opens a new upstream connection for the waiting requests, unless one is being opened.
    private func startReconnect(_ dial: UpstreamDial = .asBefore) {
        guard !reconnecting, !ended, let reconnect = reconnectUpstream else { return }
        reconnecting = true
        upstreamIsPrivate = dial == .privateHTTP1
        reconnect(dial) { [weak self] result in self?.reconnected(result) }
    }

    /// The new upstream connection is up (its side is `upstream`), or was refused: the
    /// waiting requests go to it in order, or are each answered with the refusal.
    private func reconnected(_ result: UpstreamReconnect) {
        reconnecting = false
        let waiting = pending
        pending = []
        switch result {
        case .connected:
            for request in waiting {
                guard let exchange = exchanges[request.id] else { continue }
                forward(request.id, exchange, request.head, authority: request.authority, endStream: request.endStream)
                for bytes in request.body { requestBody(request.id, bytes) }
                if request.ended && !request.endStream { requestEnd(request.id, trailers: request.trailers) }
            }
            upstream?.flush()
        case .refused(let status, let reason, let detail):
            // A private connection for an Upgrade says what it was for: the refusal's own
            // reason stands (a pin mismatch is one), the text names both steps.
            let said = upstreamIsPrivate
                ? "the upstream's h2 connection cannot carry a WebSocket (it did not advertise RFC 8441), and a connection of the tunnel's own with ALPN http/1.1 was refused: \(detail)"
                : detail
            for request in waiting {
                guard let exchange = exchanges[request.id] else { continue }
                returnCredit(of: request)
                refuse(request.id, exchange, status: status, reason: reason, detail: said)
            }
            client?.flush()
        }
    }


    // MARK: from the upstream side

    /// A response head arrived for upstream exchange `upstreamID`.
    func responseHead(_ upstreamID: Int, _ head: ExchangeResponseHead, endStream: Bool) {
        guard let id = clientIDByUpstreamID[upstreamID], let exchange = exchanges[id] else { return }
        // Informational heads (1xx, bar 101) are passed on; the final status is the one logged.
        if head.status >= 200 || head.status == 101 { exchange.status = head.status }
        if endStream { exchange.responseEnded = true }
        client?.sendResponseHead(id, head, endStream: endStream)
        if endStream { finishIfDone(id) }
    }

    /// Response body bytes arrived for upstream exchange `upstreamID`.
    func responseBody(_ upstreamID: Int, _ bytes: ByteBuffer) {
        let count = bytes.readableBytes
        guard let id = clientIDByUpstreamID[upstreamID], exchanges[id] != nil else {
            deliver(ledger.returnedUnforwarded(.response, sourceID: upstreamID, bytes: count))
            return
        }
        exchanges[id]?.bytesDown += count
        observer.relayed(0, count)
        ledger.forwarded(.response, sourceID: upstreamID, sinkID: id, bytes: count)
        client?.sendResponseBody(id, bytes)
    }

    /// The response of upstream exchange `upstreamID` ended.
    func responseEnd(_ upstreamID: Int, trailers: HTTPHeaders?) {
        guard let id = clientIDByUpstreamID[upstreamID], exchanges[id] != nil else { return }
        exchanges[id]?.responseEnded = true
        client?.endResponse(id, trailers: trailers)
        finishIfDone(id)
    }

    /// The upstream abandoned exchange `upstreamID` (HTTP/2 RST_STREAM, or its HTTP/1.1
    /// connection ended mid-response).
    func responseCancelled(_ upstreamID: Int) {
        responseFailed(upstreamID, detail: "the upstream abandoned the request")
    }

    /// The upstream never processed exchange `upstreamID`, and says so: an HTTP/2 stream it
    /// refused (REFUSED_STREAM, or above the last stream id of its GOAWAY), a request it
    /// could no longer be sent after GOAWAY, or one still queued when its HTTP/1.1
    /// connection closed. Straight to the origin the client would have heard the same (a
    /// GOAWAY, a refused stream) and retried on a new connection, as RFC 9113 §8.7 allows;
    /// an HTTP/2 client hears it here as REFUSED_STREAM, so it does just that, and its new
    /// connection gets a tunnel and a verdict of its own. An HTTP/1.1 client has no such
    /// signal but an unanswered close, which it retries only on a reused connection, so it
    /// gets the 502 of `responseFailed`. Counted and logged as `upstream-unreachable` either way.
    func responseNotProcessed(_ upstreamID: Int) {
        let detail = "the upstream did not process the request"
        guard let id = clientIDByUpstreamID[upstreamID], let exchange = exchanges[id], exchange.status == nil,
              client?.refuseUnprocessed(id) == true else {
            responseFailed(upstreamID, detail: detail)
            return
        }
        exchanges[id]?.refusal = .upstreamUnreachable
        exchanges[id]?.responseEnded = true
        observer.refused(.upstreamUnreachable, exchange.authority, "\(detail) (refused as not processed: the client may retry it)")
        finishIfDone(id)
    }

    /// Exchange `upstreamID` was never written to its connection, which is closing (it was
    /// queued behind an answer that closed it): a bodyless request waits for the tunnel's
    /// next connection, opened as the close is reported (`upstreamClosed`); sending it
    /// there is sending it once. Any other (a body was queued with it, or the tunnel
    /// cannot reconnect) is answered as not processed.
    func requestNotSent(_ upstreamID: Int) {
        guard reconnectsWhenUpstreamCloses, let id = clientIDByUpstreamID[upstreamID], let exchange = exchanges[id],
              exchange.status == nil, let request = exchange.unsent else {
            responseNotProcessed(upstreamID)
            return
        }
        detachFromUpstream(exchange)
        exchange.unsent = nil
        exchange.retry = nil
        pending.append(request)
    }

    /// The upstream's answer to exchange `upstreamID` cannot be passed on (`detail` says
    /// why): as `responseCancelled`, with that text in the client's 502 under `reason`.
    /// `reason` is what went wrong upstream: `upstream-protocol-error` when the upstream
    /// answered but broke its protocol (a WebSocket `101` whose `Sec-WebSocket-Accept` does
    /// not answer the key sent), `upstream-unreachable` when it went away or cannot take
    /// the exchange. The answer is the gate's own, so it is counted, listed in `/refusals`
    /// and logged like any refusal inside a tunnel.
    func responseFailed(_ upstreamID: Int, reason: RequestRefusal = .upstreamUnreachable, detail: String) {
        guard let id = clientIDByUpstreamID[upstreamID], let exchange = exchanges[id] else { return }
        if exchange.status == nil {
            // Nothing was answered yet: the client hears why, as it would from a proxy.
            exchanges[id]?.status = 502
            exchanges[id]?.refusal = reason
            exchanges[id]?.responseEnded = true
            observer.refused(reason, exchange.authority, detail)
            client?.answer(id, status: 502, refusal: reason.rawValue, detail: detail)
            finishIfDone(id)
        } else {
            client?.cancel(id)
            finish(id)
        }
    }

    /// The upstream side wrote `bytes` of exchange `upstreamID`'s request body to its
    /// channel, which was `writable` right after.
    func requestBodyWritten(_ upstreamID: Int, bytes: Int, writable: Bool) {
        deliver(ledger.wrote(.request, sinkID: upstreamID, bytes: bytes, writable: writable))
    }

    /// The upstream side dropped `bytes` of exchange `upstreamID`'s request body it had
    /// been handed (the stream was reset, the exchange cancelled before it was sent).
    func requestBodyDiscarded(_ upstreamID: Int, bytes: Int) {
        deliver(ledger.discarded(.request, sinkID: upstreamID, bytes: bytes))
    }

    /// `bytes` of exchange `upstreamID`'s request body wait at the upstream side behind
    /// another exchange: the client may use that much of its connection window elsewhere.
    func requestBodyQueued(_ upstreamID: Int, bytes: Int) {
        guard let id = clientIDByUpstreamID[upstreamID] else {
            observer.creditUnplaced(bytes)
            return
        }
        client?.requestBodyQueued(id, bytes: bytes)
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

    /// The upstream's channel is writable again.
    func upstreamDrained() {
        for credit in ledger.drained(.request) { deliver(credit) }
    }

    /// A side could not apply credit the ledger gave it (`detail` says why): counted with
    /// what the ledger could not place, so it is seen, never swallowed.
    func creditNotApplied(bytes: Int, detail: String) {
        observer.creditUnplaced(bytes)
    }

    /// Gives `credit` back to the leg that spent it; counts what the ledger could not place.
    private func deliver(_ credit: CreditLedger.Credit?) {
        if ledger.unplaced != reportedUnplaced {
            observer.creditUnplaced(ledger.unplaced - reportedUnplaced)
            reportedUnplaced = ledger.unplaced
        }
        guard let credit else { return }
        switch credit.direction {
        case .request: client?.requestBodyPassedOn(credit.sourceID, bytes: credit.bytes)
        case .response: upstream?.responseBodyPassedOn(credit.sourceID, bytes: credit.bytes)
        }
    }

    /// The upstream's connection is gone: the client's goes too, once every response already
    /// passed on has reached it (over HTTP/2 that waits for the client's windows: a body that
    /// ended upstream may still be waiting for them). After `upstreamFailed` the client stays
    /// until it was answered (`closeClient`).
    func upstreamClosed() {
        // Request bytes handed to the upstream side will never be written: the client gets
        // their credit (its connection may be draining responses still). Response bytes
        // still on their way to the client keep their accounts until written: the credit
        // then goes to a side that is gone, which is harmless, and nothing is unplaced.
        for credit in ledger.sinkGone(.request) { deliver(credit) }
        guard upstreamFailure == nil else { return }
        if reconnectsWhenUpstreamCloses {
            upstreamClosedReconnecting()
            return
        }
        // Every response the upstream had not finished is cut: the client must hear it as a
        // cut (a 502 when nothing was answered yet; else RST_STREAM, or the HTTP/1.1
        // connection closing short of its length), never as an end. Without this an h2
        // client waited, its stream open, for the idle timeout, and a client that does not
        // check lengths took a cut body for a whole one.
        let unfinished = exchanges.values.compactMap { $0.responseEnded ? nil : $0.upstreamID }.sorted()
        for upstreamID in unfinished {
            responseFailed(upstreamID, detail: "the upstream's connection closed before the response ended")
        }
        // Requests that waited for a connection get an answer too, never silence.
        for request in pending {
            guard let exchange = exchanges[request.id] else { continue }
            dropPending(request.id)
            refuse(request.id, exchange, status: 502, reason: .upstreamUnreachable,
                   detail: "the tunnel's upstream connection closed before the request could be sent")
        }
        end()
        closeClient(whenAnswered: true)
    }

    /// Whether the tunnel opens a new upstream connection when its connection closes: it
    /// can (`reconnectUpstream`), it has not ended, and the connection did not switch
    /// protocols (it carried the tunnel as a byte relay: there is no HTTP to go on with).
    private var reconnectsWhenUpstreamCloses: Bool {
        reconnectUpstream != nil && !ended && upstream?.switchedProtocols != true
    }

    /// The tunnel's upstream connection was found closed as the tunnel was set up (a pooled
    /// one that went before the join): as if it closed now.
    package func upstreamWentAway() {
        upstreamClosed()
    }

    /// The upstream connection of a tunnel that reconnects went: what it had not started
    /// answering and may be repeated waits for a new connection (a retry, once: only a
    /// reused connection's failure is retried); every other unfinished response is cut as
    /// in `upstreamClosed`. The client's connection stays; the next request, or the retry,
    /// opens the new upstream connection.
    private func upstreamClosedReconnecting() {
        upstream = nil
        // Response bytes of the old connection still on their way to the client: their
        // credit has no connection to go back to (the next one's exchange ids start again).
        ledger.sourceGone(.response)
        observer.upstreamLost()
        let unfinished = exchanges.values.compactMap { $0.responseEnded ? nil : $0.upstreamID }.sorted()
        for upstreamID in unfinished {
            guard let id = clientIDByUpstreamID[upstreamID], let exchange = exchanges[id] else { continue }
            if let retry = exchange.retry, exchange.status == nil, exchange.bytesDown == 0 {
                detachFromUpstream(exchange)
                exchange.retry = nil
                exchange.unsent = nil
                pending.append(retry)
            } else {
                responseFailed(upstreamID, detail: "the upstream's connection closed before the response ended")
            }
        }
        pending.sort { $0.id < $1.id }
        if !pending.isEmpty { startReconnect() }
        // What the connection answered before it went, and the cuts above, go out now: the
        // close came inside its read, whose read-complete (the usual flush) never arrives
        // (issue 31: an h2 client's 400 waited for the client's next frame, up to 60 s).
        client?.flush()
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
        guard !ended, upstreamFailure == nil else { return }
        upstreamFailure = (status, reason, detail, closeClient, false)
        upstream?.close()
    }

    // MARK: bookkeeping

    /// An exchange is finished (and logged) once its response has ended. A request body
    /// still arriving then (a refused request's, or one the upstream answered early) is
    /// dropped as it comes, and credited back at once.
    private func finishIfDone(_ id: Int) {
        guard let exchange = exchanges[id], exchange.responseEnded else { return }
        // A response that ended on the upstream connection: it has carried an exchange.
        if exchange.upstreamID != nil && exchange.refusal == nil { upstreamReused = true }
        finish(id)
    }

    private func finish(_ id: Int) {
        guard let exchange = exchanges.removeValue(forKey: id) else { return }
        // No more is forwarded either way; each account closes once its sink has written
        // or dropped what it took.
        ledger.sinkFinishing(.response, sinkID: id)
        if let upstreamID = exchange.upstreamID {
            clientIDByUpstreamID[upstreamID] = nil
            ledger.sinkFinishing(.request, sinkID: upstreamID)
        }
        observer.finished(ExchangeSummary(
            started: exchange.started, durationNanoseconds: (NIODeadline.now() - exchange.startedTick).nanoseconds,
            method: exchange.method, path: exchange.path, authority: exchange.authority, status: exchange.status,
            bytesUp: exchange.bytesUp, bytesDown: exchange.bytesDown,
            clientStreamID: clientUsesStreamIDs ? id : nil, refusal: exchange.refusal))
    }

    /// Ends every exchange still open (each is logged as it stood). An upstream failure no
    /// request was refused with (the client sent none, or not a whole one) is counted here,
    /// once, for the tunnel as a whole.
    private func end() {
        guard !ended else { return }
        ended = true
        for id in exchanges.keys.sorted() { finish(id) }
        defer { observer.ended() }
        if let failure = upstreamFailure, !failure.reported {
            upstreamFailure?.reported = true
            observer.refused(failure.reason, "-", failure.detail)
        }
    }
}
