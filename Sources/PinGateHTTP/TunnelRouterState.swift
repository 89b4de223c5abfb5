import Foundation
import NIOCore
import NIOHTTP1

/// A client's exchange in a tunnel: an HTTP/2 stream id, or an HTTP/1.1 request's number.
/// Its own type, so that it is never taken for an upstream one: pairing the two is what
/// keeps one client's answer from reaching another's request (issue 31).
struct ClientExchangeID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The side's own number for it.
    let rawValue: Int
    /// The client side's exchange `rawValue`.
    init(_ rawValue: Int) { self.rawValue = rawValue }
    static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
    var description: String { "client exchange \(rawValue)" }
}

/// An exchange on the tunnel's upstream connection: an HTTP/2 stream id, or an HTTP/1.1
/// request's number on that connection (they start again at 1 on each new connection).
struct UpstreamExchangeID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The side's own number for it.
    let rawValue: Int
    /// The upstream side's exchange `rawValue`.
    init(_ rawValue: Int) { self.rawValue = rawValue }
    static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
    var description: String { "upstream exchange \(rawValue)" }
}

/// What the router asks of the upstream side in use when it decides (pure queries).
protocol UpstreamConnectionFacts: AnyObject {
    /// Why `head`'s upgrade cannot be carried on this connection, or nil when it can.
    func upgradeRefusal(for head: ExchangeRequestHead) -> String?
    /// What the connection's own state says against handing it to another tunnel now.
    var reuseBlocker: UpstreamNotPooledReason? { get }
    /// Since when the connection has carried nothing, or nil while it carries something
    /// (or cannot say: an `h2` connection, whose origin's GOAWAY says what it processed).
    var idleSince: NIODeadline? { get }
}

extension UpstreamConnectionFacts {
    /// By default a connection does not say (an `h2` lane).
    var idleSince: NIODeadline? { nil }
}

/// Whether the tunnel's upstream connection may go on to another tunnel, decided in one
/// place (`TunnelRouterState.reuseVerdict`).
enum UpstreamReuseVerdict: Equatable, Sendable {
    /// At a message boundary, healthy, and bound to no one: it may be pooled or shared.
    case reusable
    /// It may not, for this reason: it is closed (or, a lane of a shared `h2` connection,
    /// the tunnel's streams on it are reset and the connection closes).
    case notReusable(UpstreamNotPooledReason)
}

/// The decisions of a request-aware tunnel, without its channels: which request goes
/// where, which answer belongs to which request, whose credit goes back where, and when
/// the upstream connection is dropped, reopened, pooled or closed. Every input updates the
/// state first and returns the actions that carry it out, in order; `TunnelRouter` runs
/// them against the sides. An action may make a side call back in (a cancelled HTTP/1.1
/// exchange closes its connection, which reports its close): that call sees the state
/// already updated, which is why nothing here calls out (issue 31, after AHC's
/// `HTTP1ConnectionStateMachine`).
struct TunnelRouterState {
    /// What the router's observer hears; the gate turns it into counters, the refusal log,
    /// log lines and the per-request audit log.
    enum Event {
        /// A request was refused inside the tunnel (before any of it went upstream).
        case refused(RequestRefusal, authority: String, detail: String)
        /// A refusal counted like `refused` but not logged (one of a burst already logged).
        case refusedQuietly(RequestRefusal)
        /// A request was passed on to the upstream.
        case forwarded
        /// Body bytes passed on: `up` from the client to the upstream, `down` the other way.
        case relayed(up: Int, down: Int)
        /// An exchange ended (answered, refused or cancelled), with what it amounted to.
        case finished(TunnelRouter.ExchangeSummary)
        /// Flow-control credit the ledger could not place (never expected).
        case creditUnplaced(Int)
        /// The client abandoned a request before its response ended (HTTP/2 RST_STREAM).
        case cancelledByClient
        /// The tunnel ended.
        case ended
        /// The upstream connection of a tunnel that reconnects went while the client's stayed.
        case upstreamLost
        /// A connection that had idled this long carried a request to its answer.
        case servedAfterIdle(TimeAmount)
        /// A request that cannot be repeated found the connection idle this long, past what
        /// its origin is trusted to keep: it goes on a new connection instead.
        case leftIdleConnection(TimeAmount)
    }

    /// The steps one input asks for, in order (up to three without an allocation).
    typealias Actions = ShortList<Action>

    /// One step for `TunnelRouter` to carry out.
    enum Action {
        /// The client side answers the exchange itself: `status` with `Pingate-Refusal: refusal`.
        case answer(ClientExchangeID, status: Int, refusal: RequestRefusal, detail: String)
        /// The client side passes on a response head.
        case sendResponseHead(ClientExchangeID, ExchangeResponseHead, endStream: Bool)
        /// The client side passes on response body bytes.
        case sendResponseBody(ClientExchangeID, ByteBuffer)
        /// The client side ends the response.
        case endResponse(ClientExchangeID, trailers: HTTPHeaders?)
        /// The client side cuts the exchange (RST_STREAM, or an HTTP/1.1 connection's close).
        case cancelClientExchange(ClientExchangeID)
        /// The client side refuses the stream as not processed (REFUSED_STREAM).
        case refuseUnprocessed(ClientExchangeID)
        /// The client may send `bytes` more of the exchange's request body.
        case creditRequestBody(ClientExchangeID, bytes: Int)
        /// `bytes` of the exchange's request body wait upstream behind another exchange.
        case requestBodyQueued(ClientExchangeID, bytes: Int)
        /// The exchange's request is the one its upstream connection sends now.
        case openRequestWindow(ClientExchangeID)
        /// What went to the client side goes out.
        case flushClient
        /// The client's connection ends (`whenAnswered`: once every response passed on is out).
        case closeClient(whenAnswered: Bool)
        /// The client's connection ends the way the upstream failure said (`upstreamFailed`).
        case closeClientForUpstreamFailure
        /// The upstream side starts the request; the router then reports the upstream id it
        /// got (`requestStarted`), which pairs the two.
        case startRequest(ClientExchangeID, ExchangeRequestHead, authority: RequestAuthority, endStream: Bool)
        /// The upstream side passes on request body bytes.
        case sendRequestBody(UpstreamExchangeID, ByteBuffer)
        /// The upstream side ends the request.
        case endRequest(UpstreamExchangeID, trailers: HTTPHeaders?)
        /// The upstream side abandons the exchange.
        case cancelUpstreamExchange(UpstreamExchangeID)
        /// The upstream may send `bytes` more of the exchange's response body.
        case creditResponseBody(UpstreamExchangeID, bytes: Int)
        /// The shared `h2` connection carried connection-bound authentication: no other
        /// tunnel joins it from now on.
        case markConnectionAuthentication
        /// What went to the upstream side goes out.
        case flushUpstream
        /// The upstream connection closes.
        case closeUpstream
        /// The tunnel is done with its upstream connection: pooled or left in its share
        /// when `reusable`, else closed.
        case leaveUpstream(UpstreamReuseVerdict)
        /// The upstream side is no longer the tunnel's (it went, or was left).
        case dropUpstream
        /// A new upstream connection is opened; its result comes back as `reconnected`.
        case reconnect(TunnelRouter.UpstreamDial)
        /// The observer hears of it.
        case observe(Event)
    }

    /// What the tunnel's upstream is now.
    enum UpstreamPresence: Equatable, Sendable {
        /// None: it went, or was left (a reconnect may be on its way).
        case none
        /// An HTTP/1.1 connection of the tunnel's (dialled, or taken from the pool).
        case http1
        /// A lane of an `h2` connection other tunnels may share.
        case http2Lane
    }

    /// A class: the router updates an exchange in place on every body chunk, and a struct
    /// this size in a dictionary was copied out and back each time (a heap-allocated
    /// accessor frame per update, six per keep-alive request).
    private final class ExchangeRecord {
        let started: Date
        let startedTick: NIODeadline
        let method: String
        let path: String
        /// As sent; for a refusal, as normalized (what the refusal names).
        var authority: String
        var upstreamID: UpstreamExchangeID?
        /// Started upstream, its upstream id not reported yet (`requestStarted`).
        var starting = false
        var refusal: RequestRefusal?
        var status: Int?
        var bytesUp = 0
        var bytesDown = 0
        var responseEnded = false
        /// Why its response was cut after it began, if it was.
        var cut: TunnelRouter.ExchangeCut?
        /// Holds the request body to the framing the gate chose (set once it went upstream).
        var meter: BodyLengthMeter?
        /// Holds the response body to the framing the gate gave it (set with the final head).
        var responseMeter: BodyLengthMeter?
        /// The request as sent upstream, kept while it may be retried on a new connection:
        /// an idempotent method, no body, sent on a reused connection (RFC 9110 §9.2.2,
        /// RFC 9112 §9.3.1).
        var retry: PendingRequest?
        /// It was retried once already: a second lost connection answers it.
        var retried = false
        /// Counted as forwarded: a request carried on to a new connection (never written, or
        /// retried) is one request passed on, counted once.
        var countedForwarded = false
        /// The request's head as sent upstream, kept until it is on the wire: a request that
        /// its connection never wrote (queued behind an answer that closed it) goes to the
        /// tunnel's next connection, whatever its method, with what was queued of its body,
        /// since none of it was sent.
        var unsent: PendingRequest?
        /// What the client sent of the body while the request waited for a connection (or
        /// while its start was carried out): passed on once its upstream id is known.
        var held = HeldRequestBody()
        /// How long its connection had idled when it was sent there, until its answer comes.
        var sentAfterIdle: TimeAmount?

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
        let id: ClientExchangeID
        let head: ExchangeRequestHead
        let authority: RequestAuthority
        let endStream: Bool
        var body: [ByteBuffer] = []
        var ended = false
        var trailers: HTTPHeaders?
    }

    /// A request body as far as the client sent it, held apart from any upstream exchange:
    /// before its exchange was paired with one, or queued on an HTTP/1.1 connection that
    /// closed before writing it (`requestNotSent`).
    struct HeldRequestBody {
        var body: [ByteBuffer] = []
        /// The body ended (its end not yet passed on: a request whose head ended it has none).
        var ended = false
        var trailers: HTTPHeaders?
        var isEmpty: Bool { body.isEmpty && !ended }
    }

    /// Why no upstream can carry a request (set by `upstreamFailed`).
    private struct UpstreamFailure {
        let status: Int
        let reason: RequestRefusal
        let detail: String
        /// A refusal counted it, so the tunnel's end does not count it again.
        var reported = false
    }

    private var binding: AuthorityBinding
    /// Every body byte's credit, from the leg that read it back to that leg once the other
    /// leg has written it (or never will).
    private(set) var ledger = CreditLedger()
    /// True for an HTTP/2 client (its exchange ids are stream ids, logged as such).
    let clientUsesStreamIDs: Bool
    private let now: () -> Date
    /// Whether the client side can refuse a stream as not processed (an HTTP/2 client);
    /// set as the client side attaches.
    var clientRefusesUnprocessedStreams = false
    /// Whether the tunnel may open a new upstream connection when its own goes.
    var canReconnect = false
    /// How long a connection may have idled and still carry a request that cannot be
    /// repeated (its origin's `KeepAliveEstimate`).
    var keepAliveLimit: () -> TimeAmount = { KeepAliveEstimate.defaultSafeIdle }
    /// Whether a pool takes connections the tunnel leaves (else an HTTP/1.1 one closes).
    private(set) var upstream: UpstreamPresence = .none
    /// Whether the upstream connection now in use carried exchanges before the one now on
    /// it (it came from the pool, or finished one in this tunnel): only such a connection's
    /// failure before any response byte makes an idempotent request worth retrying.
    var upstreamReused = false
    /// Set once a request carried connection-bound authentication (NTLM, Negotiate): the
    /// server may take every later request on the connection for that user's, so it is
    /// never handed to another tunnel.
    private(set) var carriedConnectionAuthentication = false
    /// Set once the tunnel's upstream is a private connection (`UpstreamDial.privateHTTP1`):
    /// it goes to no other tunnel.
    private var upstreamIsPrivate = false
    /// Open exchanges, and which one each upstream exchange belongs to: searched in order
    /// (`SmallTable`), as there are few, and they are looked up on every response part.
    private var exchanges = SmallTable<ClientExchangeID, ExchangeRecord>()
    private var clientIDByUpstreamID = SmallTable<UpstreamExchangeID, ClientExchangeID>()
    /// Requests waiting, in arrival order, for the new upstream connection being opened.
    private var pending: [PendingRequest] = []
    private var reconnecting = false
    private(set) var ended = false
    /// `ledger.unplaced` as last reported to the observer.
    private var reportedUnplaced = 0
    private var upstreamFailure: UpstreamFailure?
    /// Inputs that named an upstream exchange no request is paired with, other than the
    /// ones a cut or a refusal leaves behind by design (see `strayUpstreamInputs`).
    private(set) var impossible = 0

    /// A router's state for one tunnel: `binding` decides each request.
    init(binding: AuthorityBinding, clientUsesStreamIDs: Bool, now: @escaping () -> Date) {
        self.binding = binding
        self.clientUsesStreamIDs = clientUsesStreamIDs
        self.now = now
    }

    /// Exchanges open (not yet finished), for tests and for the reuse verdict.
    var openExchanges: Int { exchanges.count }

    // MARK: the upstream connection

    /// An upstream side became the tunnel's: a new sink for request bodies, whose reports
    /// count again after the old one's were settled by `sinkGone`.
    mutating func upstreamAttached(_ presence: UpstreamPresence) {
        if presence != .none { ledger.sinkAttached(.request) }
        upstream = presence
    }

    /// The upstream side is no longer the tunnel's.
    mutating func upstreamDetached() {
        upstream = .none
    }

    /// The one rule for whether the upstream connection may go on to another tunnel now;
    /// `connectionBlocker` is what the connection's own side says (mid-response, closing,
    /// switched protocols, out of step).
    func reuseVerdict(connectionBlocker: UpstreamNotPooledReason?) -> UpstreamReuseVerdict {
        if carriedConnectionAuthentication { return .notReusable(.connectionAuthentication) }
        if upstreamIsPrivate { return .notReusable(.privateConnection) }
        if upstreamFailure != nil { return .notReusable(.closing) }
        // Body bytes whose credit is still out: the connection is not at a boundary.
        if ledger.openAccounts > 0 { return .notReusable(.inFlight) }
        if let connectionBlocker { return .notReusable(connectionBlocker) }
        return .reusable
    }

    // MARK: from the client side

    /// A request head arrived. It is checked here, before anything of it goes upstream.
    /// - Parameter upstream: the upstream side in use, asked what it can carry.
    mutating func requestHead(_ id: ClientExchangeID, _ head: ExchangeRequestHead, endStream: Bool,
                                      upstream facts: (any UpstreamConnectionFacts)?) -> Actions {
        guard !ended else { return Actions() }
        var actions = Actions()
        let exchange = ExchangeRecord(started: now(), startedTick: .now(), method: head.method, path: head.path,
                                      authority: head.authority ?? "-")
        if let failure = upstreamFailure {
            // No upstream can carry it: the gate answers with why, whatever was asked (the
            // authority check would only choose between two refusals), then lets the client go.
            upstreamFailure?.reported = true
            refuse(id, exchange, status: failure.status, reason: failure.reason, detail: failure.detail, into: &actions)
            actions.append(.closeClientForUpstreamFailure)
            return actions
        }
        switch binding.decide(authority: head.authority) {
        case .refuse(.mismatch(let authority, let text)):
            exchange.authority = authority
            refuse(id, exchange, status: 421, reason: .authorityMismatch, detail: text, into: &actions)
        case .refuse(.malformed(let text)):
            refuse(id, exchange, status: 400, reason: .malformedRequest, detail: text, into: &actions)
        case .pass(let authority):
            if upstream == .none && canReconnect {
                // The tunnel's upstream connection went between requests: this request waits
                // for a new one, verified like the first.
                exchanges[id] = exchange
                pending.append(PendingRequest(id: id, head: head, authority: authority, endStream: endStream, ended: endStream))
                startReconnect(.asBefore, into: &actions)
                return actions
            }
            forward(id, exchange, head, authority: authority, endStream: endStream, facts: facts, into: &actions)
        }
        return actions
    }

    /// Passes request `id`, whose authority passed, on to the upstream side (or refuses it
    /// for what the upstream cannot carry).
    private mutating func forward(_ id: ClientExchangeID, _ exchange: ExchangeRecord, _ head: ExchangeRequestHead,
                                  authority: RequestAuthority, endStream: Bool,
                                  facts: (any UpstreamConnectionFacts)?, into actions: inout Actions) {
        guard upstream != .none else {
            // No upstream and none to be had (the tunnel is ending): answered, not dropped.
            refuse(id, exchange, status: 502, reason: .upstreamUnreachable, detail: "the tunnel's upstream connection is gone", into: &actions)
            return
        }
        if head.method == "CONNECT" && head.upgrade == nil {
            // A classic CONNECT inside the tunnel would open a tunnel to any host:port,
            // carrying bytes no check ever reads. Only RFC 8441's extended CONNECT (with
            // `:protocol`) passes: its authority was checked above like any request's,
            // and it reaches the same pinned upstream.
            refuse(id, exchange, status: 405, reason: .methodNotAllowed,
                   detail: "CONNECT inside a tunnel is not relayed (only an RFC 8441 extended CONNECT with :protocol is)",
                   into: &actions)
            return
        }
        if let field = Self.oversizedField(head.headers) {
            // One client must not be able to cut another (issue 31): nginx answers a field
            // over its 8 KiB buffers by dropping the connection, and on a shared h2 connection
            // that reset every other app's streams. Refused on every connection, pooled or
            // not, so that pooling changes no outcome; an origin with default limits would
            // refuse the field anyway (nginx drops, Apache answers 400).
            refuse(id, exchange, status: 431, reason: .headerTooLarge,
                   detail: "the header field \(field.name) is \(field.size) bytes; the gate forwards fields of up to \(Self.maximumFieldBytes) bytes (the default limits of nginx and Apache), since a larger one can make the origin drop a connection other clients share",
                   into: &actions)
            return
        }
        if let upgrade = head.upgrade, !WebSocketHandshake.isWebSocket(upgrade) {
            // Only WebSocket is relayed as a switched protocol: its frames carry no
            // requests. Another protocol's bytes would pass unread (an HTTP/1.1 client's
            // other upgrade tokens are dropped before they get here).
            refuse(id, exchange, status: 501, reason: .upgradeUnsupported,
                   detail: "only the WebSocket protocol is relayed through a tunnel, not \(upgrade)", into: &actions)
            return
        }
        if head.upgrade != nil, let detail = facts?.upgradeRefusal(for: head) {
            if carryUpgradeOnPrivateConnection(id, exchange, head, authority: authority, endStream: endStream,
                                               connectionBlocker: facts?.reuseBlocker, into: &actions) {
                return
            }
            refuse(id, exchange, status: 501, reason: .upgradeUnsupported, detail: detail, into: &actions)
            return
        }
        var head = head
        if head.upgrade == nil {
            switch RequestBodyFraming.decide(method: head.method, headers: head.headers, endStream: endStream) {
            case .success(let framing):
                head.framing = framing
                exchange.meter = BodyLengthMeter(framing)
            case .failure(let refusal):
                refuse(id, exchange, status: 400, reason: .malformedRequest, detail: refusal.detail, into: &actions)
                return
            }
        } else if !head.isExtendedConnect && !endStream {
            // RFC 6455's opening GET has no body; what follows a granted switch is the new
            // protocol's, carried as the exchange's bytes (an extended CONNECT's stream
            // DATA is that from the start), never as framed content.
            refuse(id, exchange, status: 400, reason: .malformedRequest,
                   detail: "a request asking for an upgrade carries no body through the gate", into: &actions)
            return
        }
        var sentAfterIdle: TimeAmount?
        if let idleSince = facts?.idleSince {
            let idle = NIODeadline.now() - idleSince
            if !Self.mayBeRepeated(head, endStream: endStream) && idle >= keepAliveLimit() && canReconnect && !reconnecting && pending.isEmpty {
                // Its origin may be closing this connection as the request arrives, and such
                // a request is not re-sent (issue 31, defect 5): it goes on a new connection.
                // The idle one stays good for requests that may be repeated (the pool's).
                actions.append(.observe(.leftIdleConnection(idle)))
                leaveForNewConnection(connectionBlocker: facts?.reuseBlocker, into: &actions)
                exchanges[id] = exchange
                // With what the client sent of it while it waited for the connection it leaves
                // (held by `reconnected`), so no byte of its body is lost on the way.
                let held = exchange.held
                exchange.held = HeldRequestBody()
                pending.append(PendingRequest(id: id, head: head, authority: authority, endStream: endStream,
                                              body: held.body, ended: endStream || held.ended, trailers: held.trailers))
                startReconnect(.freshConnection, into: &actions)
                return
            }
            // Only an idle longer than twice the default can raise the estimate (it trusts half
            // the longest seen): shorter ones are not reported, which keeps the shared
            // estimate's lock off the path of every keep-alive request.
            if idle > .nanoseconds(2 * KeepAliveEstimate.defaultSafeIdle.nanoseconds) { sentAfterIdle = idle }
        }
        exchange.sentAfterIdle = sentAfterIdle
        if head.upgrade == nil {
            let request = PendingRequest(id: id, head: head, authority: authority, endStream: endStream, ended: endStream)
            exchange.unsent = request
            // Retried once when its connection is lost before any answer byte: a reused
            // connection's failure says nothing of the request (RFC 9112 §9.3.1), and neither
            // does a shared h2 connection's, which another tunnel's exchange may have ended
            // (issue 31: only the streams that were mid-body are cut).
            if endStream && !exchange.retried && (upstreamReused || upstream == .http2Lane)
                && Self.idempotentMethods.contains(head.method) {
                exchange.retry = request
            }
        }
        exchanges[id] = exchange
        exchange.starting = true
        if !exchange.countedForwarded {
            exchange.countedForwarded = true
            actions.append(.observe(.forwarded))
        }
        if !carriedConnectionAuthentication && Self.bindsConnection(head.headers) {
            carriedConnectionAuthentication = true
            // A shared h2 connection: no other tunnel joins it from now on.
            if upstream == .http2Lane { actions.append(.markConnectionAuthentication) }
        }
        actions.append(.startRequest(id, head, authority: authority, endStream: endStream))
    }

    /// The upstream side started request `id` (`Action.startRequest`) as `upstreamID`: the
    /// two are paired, and what the client sent of the body while it waited goes on.
    mutating func requestStarted(_ id: ClientExchangeID, as upstreamID: UpstreamExchangeID) -> Actions {
        guard let exchange = exchanges[id], exchange.starting else {
            // The exchange ended while its start was being carried out (a side that called
            // back inside `startRequest`): nothing pairs with it, and its upstream half goes.
            impossible += 1
            return Actions(.cancelUpstreamExchange(upstreamID))
        }
        exchange.starting = false
        exchange.upstreamID = upstreamID
        clientIDByUpstreamID[upstreamID] = id
        guard !exchange.held.isEmpty else { return Actions() }
        let held = exchange.held
        exchange.held = HeldRequestBody()
        var actions = Actions()
        for bytes in held.body { actions += requestBody(id, bytes) }
        if held.ended { actions += requestEnd(id, trailers: held.trailers) }
        return actions
    }

    /// The upstream side that `Action.startRequest` was for had gone: the request is
    /// answered 502, as one that finds no upstream is.
    mutating func startFailed(_ id: ClientExchangeID) -> Actions {
        guard let exchange = exchanges[id], exchange.starting else {
            impossible += 1
            return Actions()
        }
        exchange.starting = false
        var actions = Actions()
        returnCredit(of: exchange.held, of: id, into: &actions)
        exchange.held = HeldRequestBody()
        refuse(id, exchange, status: 502, reason: .upstreamUnreachable, detail: "the tunnel's upstream connection is gone",
               into: &actions)
        return actions
    }

    /// An HTTP/1.1 client's WebSocket `Upgrade` that the tunnel's `h2` upstream cannot carry
    /// (no RFC 8441 there): the tunnel leaves its lane of the shared connection and opens one
    /// of its own with ALPN `http/1.1`, verified and pinned like any, where the `Upgrade`
    /// goes as it came (issue 31: a browser that found no extended CONNECT setting uses an
    /// HTTP/1.1 WebSocket, which nginx h2 origins take only on an HTTP/1.1 connection). Only
    /// with nothing else open on the tunnel (the client's connection becomes the WebSocket).
    /// False when it cannot be done: the request is then refused 501.
    private mutating func carryUpgradeOnPrivateConnection(_ id: ClientExchangeID, _ exchange: ExchangeRecord,
                                                          _ head: ExchangeRequestHead, authority: RequestAuthority,
                                                          endStream: Bool, connectionBlocker: UpstreamNotPooledReason?,
                                                          into actions: inout Actions) -> Bool {
        guard !clientUsesStreamIDs, upstream == .http2Lane, canReconnect, !reconnecting, !ended, pending.isEmpty,
              exchanges.allValues(satisfy: { $0.responseEnded }), ledger.openAccounts == 0,
              head.upgrade.map(WebSocketHandshake.isWebSocket) == true else { return false }
        // The lane leaves the shared connection, which stays with the other tunnels.
        leaveForNewConnection(connectionBlocker: connectionBlocker, into: &actions)
        exchanges[id] = exchange
        pending.append(PendingRequest(id: id, head: head, authority: authority, endStream: endStream, ended: endStream))
        startReconnect(.privateHTTP1, into: &actions)
        return true
    }

    /// The client side refused request `id` itself before asking for a decision (a request
    /// target the gate does not relay): answered 400 `malformed-request` with `detail`.
    mutating func requestRefused(_ id: ClientExchangeID, method: String, path: String, detail: String) -> Actions {
        guard !ended else { return Actions() }
        var actions = Actions()
        let exchange = ExchangeRecord(started: now(), startedTick: .now(), method: method, path: path, authority: "-")
        refuse(id, exchange, status: 400, reason: .malformedRequest, detail: detail, into: &actions)
        return actions
    }

    /// Answers exchange `id` itself: nothing of it goes upstream.
    private mutating func refuse(_ id: ClientExchangeID, _ exchange: ExchangeRecord, status: Int, reason: RequestRefusal,
                                 detail: String, into actions: inout Actions) {
        exchange.refusal = reason
        exchange.status = status
        exchange.responseEnded = true
        exchanges[id] = exchange
        actions.append(.observe(.refused(reason, authority: exchange.authority, detail: detail)))
        actions.append(.answer(id, status: status, refusal: reason, detail: detail))
        finishIfDone(id, into: &actions)
    }

    /// Request body bytes arrived for exchange `id`.
    mutating func requestBody(_ id: ClientExchangeID, _ bytes: ByteBuffer) -> Actions {
        let count = bytes.readableBytes
        if !pending.isEmpty, let index = pending.firstIndex(where: { $0.id == id }) {
            // Held with its request; its credit is given when it is written to the new upstream.
            pending[index].body.append(bytes)
            return Actions()
        }
        guard let exchange = exchanges[id] else {
            // A refused request's body, or one whose exchange already ended: dropped, and
            // credited at once so the client's window does not shrink.
            return deliver(ledger.returnedUnforwarded(.request, sourceID: id.rawValue, bytes: count))
        }
        if exchange.starting {
            // Its start is being carried out: the body follows once it is paired.
            exchange.held.body.append(bytes)
            return Actions()
        }
        guard let upstreamID = exchange.upstreamID else {
            return deliver(ledger.returnedUnforwarded(.request, sourceID: id.rawValue, bytes: count))
        }
        if let problem = exchange.meter?.add(count) {
            var actions = deliver(ledger.returnedUnforwarded(.request, sourceID: id.rawValue, bytes: count))
            actions += abandonRequest(id, detail: problem)
            return actions
        }
        exchange.bytesUp += count
        ledger.forwarded(.request, sourceID: id.rawValue, sinkID: upstreamID.rawValue, bytes: count)
        return Actions(.observe(.relayed(up: count, down: 0)), .sendRequestBody(upstreamID, bytes))
    }

    /// The request of exchange `id` ended.
    mutating func requestEnd(_ id: ClientExchangeID, trailers: HTTPHeaders?) -> Actions {
        if !pending.isEmpty, let index = pending.firstIndex(where: { $0.id == id }) {
            pending[index].ended = true
            pending[index].trailers = trailers
            return Actions()
        }
        guard let exchange = exchanges[id] else { return Actions() }
        if exchange.starting {
            exchange.held.ended = true
            exchange.held.trailers = trailers
            return Actions()
        }
        guard let upstreamID = exchange.upstreamID else { return Actions() }
        if let problem = exchange.meter?.end() {
            return abandonRequest(id, detail: problem)
        }
        return Actions(.endRequest(upstreamID, trailers: trailers))
    }

    /// The request of exchange `id` broke its framing after its head went upstream (`detail`
    /// says how): the upstream's half is abandoned, and the client gets a 400
    /// `malformed-request` if nothing of the response was sent, else its exchange is cut.
    /// Empty when no such exchange is open (a refused request's body, or one already answered).
    mutating func abandonRequest(_ id: ClientExchangeID, detail: String) -> Actions {
        guard let exchange = exchanges[id] else { return Actions() }
        return abandon(id, exchange, status: 400, reason: .malformedRequest, cut: nil, detail: detail)
    }

    /// Ends exchange `id` for a broken message (`detail`): answered `status` under `reason`
    /// when nothing of the response was sent, else its client exchange is cut, counted as
    /// `cut` (or as refused under `reason`, when nil). The upstream's half is abandoned last.
    private mutating func abandon(_ id: ClientExchangeID, _ exchange: ExchangeRecord, status: Int, reason: RequestRefusal,
                                  cut: TunnelRouter.ExchangeCut?, detail: String) -> Actions {
        var actions = Actions()
        dropPending(id, into: &actions)
        // Detached first: cancelling an HTTP/1.1 upstream closes its connection, whose
        // going (reported at once) must not answer this exchange with a 502 of its own.
        let upstreamID = detachFromUpstream(exchange)
        if exchange.status == nil {
            refuse(id, exchange, status: status, reason: reason, detail: detail, into: &actions)
        } else {
            // One outcome per exchange: a response cut is counted as cut (its log line says
            // why), a request broken under way as refused.
            if let cut {
                exchange.cut = cut
            } else {
                actions.append(.observe(.refused(reason, authority: exchange.authority, detail: detail)))
                exchange.refusal = reason
            }
            actions.append(.cancelClientExchange(id))
            finish(id, into: &actions)
        }
        // Then the upstream's half goes; the client's answer is written by now.
        if let upstreamID { actions.append(.cancelUpstreamExchange(upstreamID)) }
        return actions
    }

    /// The client abandoned exchange `id` (HTTP/2 RST_STREAM).
    mutating func requestCancelled(_ id: ClientExchangeID) -> Actions {
        guard let exchange = exchanges[id] else { return Actions() }
        var actions = Actions()
        dropPending(id, into: &actions)
        // Counted as what it is, the client's own choice: not a refusal, not the upstream's
        // failure.
        if !exchange.responseEnded { actions.append(.observe(.cancelledByClient)) }
        let upstreamID = detachFromUpstream(exchange)
        finish(id, into: &actions)
        if let upstreamID { actions.append(.cancelUpstreamExchange(upstreamID)) }
        return actions
    }

    /// The client's connection is about to close for its idle timeout: every exchange still
    /// open is cut, so an HTTP/2 client hears RST_STREAM INTERNAL_ERROR for each before the
    /// GOAWAY, which would otherwise claim the streams below its last id as processed
    /// (issue 31). The upstream's half of each is abandoned too.
    mutating func cutOpenExchangesForIdleTimeout() -> Actions {
        var actions = Actions()
        for id in exchanges.keys.sorted() {
            guard let exchange = exchanges[id], !exchange.responseEnded else { continue }
            dropPending(id, into: &actions)
            let upstreamID = detachFromUpstream(exchange)
            if exchange.status != nil { exchange.cut = .idleTimeout }
            actions.append(.cancelClientExchange(id))
            finish(id, into: &actions)
            if let upstreamID { actions.append(.cancelUpstreamExchange(upstreamID)) }
        }
        return actions
    }

    /// Unpairs `exchange` from its upstream exchange (no more of that reaches it, and its
    /// request account closes once settled); returns the upstream id when the response had
    /// not ended, so the caller can abandon it upstream after its own answer is written.
    @discardableResult
    private mutating func detachFromUpstream(_ exchange: ExchangeRecord) -> UpstreamExchangeID? {
        let upstreamID = exchange.responseEnded ? nil : exchange.upstreamID
        if let upstreamID {
            clientIDByUpstreamID[upstreamID] = nil
            ledger.sinkFinishing(.request, sinkID: upstreamID.rawValue)
        }
        exchange.upstreamID = nil
        return upstreamID
    }

    /// `count` requests refused by the client's protocol layer in one read burst, the last
    /// with `detail`: each is counted, the log says it once.
    func protocolErrors(_ count: Int, detail: String) -> Actions {
        var actions = Actions(.observe(.refused(.malformedRequest, authority: "-",
                                                  detail: count == 1 ? detail : "\(detail) (and \(count - 1) more in the same read)")))
        for _ in 1..<max(1, count) { actions.append(.observe(.refusedQuietly(.malformedRequest))) }
        return actions
    }

    /// The client's bytes are not HTTP at all: the tunnel is refused as a whole; the caller
    /// closes the client, and the upstream goes with it.
    mutating func refuseConnection(detail: String) -> Actions {
        var actions = Actions(.observe(.refused(.notHTTP, authority: "-", detail: detail)))
        end(into: &actions)
        actions.append(.closeUpstream)
        return actions
    }

    /// True while exchange `id` was forwarded and its response has not ended.
    func isAwaitingResponse(_ id: ClientExchangeID) -> Bool {
        guard let exchange = exchanges[id] else { return false }
        return (exchange.upstreamID != nil || exchange.starting) && !exchange.responseEnded
    }

    /// The client side wrote `bytes` of exchange `id`'s response body, its channel
    /// `writable` right after.
    mutating func responseBodyWritten(_ id: ClientExchangeID, bytes: Int, writable: Bool) -> Actions {
        deliver(ledger.wrote(.response, sinkID: id.rawValue, bytes: bytes, writable: writable))
    }

    /// The client side dropped `bytes` of exchange `id`'s response body it had been handed.
    mutating func responseBodyDiscarded(_ id: ClientExchangeID, bytes: Int) -> Actions {
        deliver(ledger.discarded(.response, sinkID: id.rawValue, bytes: bytes))
    }

    /// The client's channel is writable again.
    mutating func clientDrained() -> Actions {
        var actions = Actions()
        for credit in ledger.drained(.response) { actions += deliver(credit) }
        return actions
    }

    /// The client's connection is gone: every exchange ends, and the upstream connection
    /// is left (pooled, or its lane given up) or closed, as `reuseVerdict` says.
    /// - Parameter upstream: the upstream side in use, asked what it says against reuse.
    mutating func clientClosed(upstream facts: (any UpstreamConnectionFacts)?) -> Actions {
        var actions = Actions()
        for request in pending { dropPending(request.id, into: &actions) }
        end(into: &actions)
        // Nothing handed to the client side will be written: its credit goes back (the
        // upstream connection may outlive this tunnel).
        for credit in ledger.sinkGone(.response) { actions += deliver(credit) }
        guard upstream != .none else { return actions }
        actions.append(.leaveUpstream(reuseVerdict(connectionBlocker: facts?.reuseBlocker)))
        // Left once: a second report of the close (the hold's and the side's) leaves nothing.
        upstream = .none
        return actions
    }

    /// Drops request `id` from the requests waiting for a new upstream: what its client sent
    /// of the body goes back as credit, never having been forwarded.
    private mutating func dropPending(_ id: ClientExchangeID, into actions: inout Actions) {
        guard let index = pending.firstIndex(where: { $0.id == id }) else { return }
        returnCredit(of: pending.remove(at: index), into: &actions)
    }

    /// What the client sent of `request`'s body while it waited: never forwarded, its
    /// credit goes back.
    private mutating func returnCredit(of request: PendingRequest, into actions: inout Actions) {
        returnCredit(of: HeldRequestBody(body: request.body), of: request.id, into: &actions)
    }

    /// What the client sent of a body held for its exchange's start: never forwarded.
    private mutating func returnCredit(of held: HeldRequestBody, of id: ClientExchangeID, into actions: inout Actions) {
        for bytes in held.body {
            actions += deliver(ledger.returnedUnforwarded(.request, sourceID: id.rawValue, bytes: bytes.readableBytes))
        }
    }

    /// The tunnel leaves its upstream connection for a new one (pooled or closed, as
    /// `reuseVerdict` says), and detaches its side, whose reports reach the tunnel no more.
    /// So what that side still held is settled here: request bytes it took and did not
    /// write are credited back to the client (the verdict pools no connection with any
    /// outstanding), and credit for response bytes still on their way to the client has no
    /// connection to go back to (the next one's exchange ids start again).
    private mutating func leaveForNewConnection(connectionBlocker: UpstreamNotPooledReason?, into actions: inout Actions) {
        actions.append(.leaveUpstream(reuseVerdict(connectionBlocker: connectionBlocker)))
        actions.append(.dropUpstream)
        upstream = .none
        for credit in ledger.sinkGone(.request) { actions += deliver(credit) }
        ledger.sourceGone(.response)
    }

    /// Opens a new upstream connection for the waiting requests, unless one is being opened.
    private mutating func startReconnect(_ dial: TunnelRouter.UpstreamDial, into actions: inout Actions) {
        guard !reconnecting, !ended, canReconnect else { return }
        reconnecting = true
        upstreamIsPrivate = dial == .privateHTTP1
        actions.append(.reconnect(dial))
    }

    /// The new upstream connection is up (attached already), or was refused: the waiting
    /// requests go to it in order, or are each answered with the refusal.
    mutating func reconnected(_ result: TunnelRouter.UpstreamReconnect,
                                      upstream facts: (any UpstreamConnectionFacts)?) -> Actions {
        reconnecting = false
        let waiting = pending
        pending = []
        var actions = Actions()
        switch result {
        case .connected:
            if let idleSince = facts?.idleSince, canReconnect, !ended,
               waiting.contains(where: { !Self.mayBeRepeated($0.head, endStream: $0.endStream) }) {
                let idle = NIODeadline.now() - idleSince
                if idle >= keepAliveLimit() {
                    // A pooled connection idle past its origin's estimate, and a request among
                    // these that cannot be repeated: all of them wait for a new connection
                    // together. One by one, a GET would go on this connection and the POST
                    // behind it would leave it, with the GET on it (`forward`'s own check).
                    actions.append(.observe(.leftIdleConnection(idle)))
                    leaveForNewConnection(connectionBlocker: facts?.reuseBlocker, into: &actions)
                    pending = waiting
                    startReconnect(.freshConnection, into: &actions)
                    return actions
                }
            }
            for request in waiting {
                guard let exchange = exchanges[request.id] else { continue }
                // What the client sent while the request waited goes with it: passed on once it
                // is paired, or carried on if it waits again (`forward` leaves a stale connection).
                exchange.held = HeldRequestBody(body: request.body, ended: request.ended && !request.endStream,
                                                trailers: request.trailers)
                forward(request.id, exchange, request.head, authority: request.authority, endStream: request.endStream,
                        facts: facts, into: &actions)
                if !exchange.starting && !pending.contains(where: { $0.id == request.id }) {
                    // Refused on the new connection: what it sent never went anywhere.
                    returnCredit(of: exchange.held, of: request.id, into: &actions)
                    exchange.held = HeldRequestBody()
                }
            }
            actions.append(.flushUpstream)
        case .refused(let status, let reason, let detail):
            // A private connection for an Upgrade says what it was for: the refusal's own
            // reason stands (a pin mismatch is one), the text names both steps.
            let said = upstreamIsPrivate
                ? "the upstream's h2 connection cannot carry a WebSocket (it did not advertise RFC 8441), and a connection of the tunnel's own with ALPN http/1.1 was refused: \(detail)"
                : detail
            for request in waiting {
                guard let exchange = exchanges[request.id] else { continue }
                returnCredit(of: request, into: &actions)
                refuse(request.id, exchange, status: status, reason: reason, detail: said, into: &actions)
            }
            actions.append(.flushClient)
        }
        return actions
    }

    // MARK: from the upstream side

    /// The client exchange `upstreamID` answers, or nil when none is paired with it any
    /// more: its client exchange was cut, refused or cancelled, and what the upstream still
    /// sends for it goes nowhere.
    private func clientExchange(for upstreamID: UpstreamExchangeID) -> (ClientExchangeID, ExchangeRecord)? {
        guard let id = clientIDByUpstreamID[upstreamID], let exchange = exchanges[id] else { return nil }
        return (id, exchange)
    }

    /// A response head arrived for upstream exchange `upstreamID`. Its framing toward the
    /// client is decided here, once (`ResponseBodyFraming`), and its body held to it.
    mutating func responseHead(_ upstreamID: UpstreamExchangeID, _ head: ExchangeResponseHead, endStream: Bool) -> Actions {
        guard let (id, exchange) = clientExchange(for: upstreamID) else { return Actions() }
        var head = head
        switch ResponseBodyFraming.decide(requestMethod: exchange.method, head: head, endStream: endStream) {
        case .success(let framing):
            head.framing = framing
        case .failure(let fault):
            return abandonResponse(id, exchange, detail: fault.detail)
        }
        let final = head.status >= 200 || head.status == 101
        // Informational heads (1xx, bar a granted switch) are passed on; the final status is
        // the one logged, and the body that follows is held to its framing.
        if final {
            exchange.status = head.status
            exchange.responseMeter = BodyLengthMeter(head.framing.expected)
        }
        var actions = Actions(.sendResponseHead(id, head, endStream: endStream))
        if let idle = exchange.sentAfterIdle {
            // The connection was still good after that long: its origin keeps at least this.
            exchange.sentAfterIdle = nil
            actions.append(.observe(.servedAfterIdle(idle)))
        }
        if endStream {
            exchange.responseEnded = true
            finishIfDone(id, into: &actions)
        }
        return actions
    }

    /// Response body bytes arrived for upstream exchange `upstreamID`.
    mutating func responseBody(_ upstreamID: UpstreamExchangeID, _ bytes: ByteBuffer) -> Actions {
        let count = bytes.readableBytes
        guard let (id, exchange) = clientExchange(for: upstreamID) else {
            return deliver(ledger.returnedUnforwarded(.response, sourceID: upstreamID.rawValue, bytes: count))
        }
        if let problem = exchange.responseMeter == nil ? Self.bodyBeforeFinalHead : exchange.responseMeter?.add(count) {
            var actions = deliver(ledger.returnedUnforwarded(.response, sourceID: upstreamID.rawValue, bytes: count))
            actions += abandonResponse(id, exchange, detail: problem)
            return actions
        }
        exchange.bytesDown += count
        ledger.forwarded(.response, sourceID: upstreamID.rawValue, sinkID: id.rawValue, bytes: count)
        return Actions(.observe(.relayed(up: 0, down: count)), .sendResponseBody(id, bytes))
    }

    /// What is wrong with body bytes that came before any final head: both parsers make
    /// that impossible, so the exchange is abandoned rather than framed by guesswork.
    private static let bodyBeforeFinalHead = "body bytes arrived before the answer's final head"

    /// The response of upstream exchange `upstreamID` ended.
    mutating func responseEnd(_ upstreamID: UpstreamExchangeID, trailers: HTTPHeaders?) -> Actions {
        guard let (id, exchange) = clientExchange(for: upstreamID) else { return Actions() }
        if let problem = exchange.responseMeter == nil ? Self.bodyBeforeFinalHead : exchange.responseMeter?.end() {
            return abandonResponse(id, exchange, detail: problem)
        }
        exchange.responseEnded = true
        var actions = Actions(.endResponse(id, trailers: trailers))
        finishIfDone(id, into: &actions)
        return actions
    }

    /// The upstream's answer to exchange `id` broke the framing the gate gave it (`detail`
    /// says how): what the client got of it is all it gets. Nothing answered yet is a 502
    /// `upstream-protocol-error`; an answer under way is cut. The upstream's half is
    /// abandoned, which closes an HTTP/1.1 connection: its next bytes cannot be trusted to
    /// start the next answer.
    private mutating func abandonResponse(_ id: ClientExchangeID, _ exchange: ExchangeRecord, detail: String) -> Actions {
        abandon(id, exchange, status: 502, reason: .upstreamProtocolError, cut: .upstreamProtocolError, detail: detail)
    }

    /// The upstream never processed exchange `upstreamID`, and says so (REFUSED_STREAM, a
    /// stream above a GOAWAY's last id, a request still queued when its HTTP/1.1 connection
    /// closed): an HTTP/2 client hears it as REFUSED_STREAM and retries on a new connection
    /// (RFC 9113 §8.7), with a tunnel and a verdict of its own. An HTTP/1.1 client has no
    /// such signal: the gate sends the request once more itself, on a new connection
    /// (`carryUnprocessed`), or answers the 502 of `responseFailed`.
    /// - Parameter facts: the upstream side in use, asked what it says against reuse.
    mutating func responseNotProcessed(_ upstreamID: UpstreamExchangeID,
                                       upstream facts: (any UpstreamConnectionFacts)?) -> Actions {
        let detail = "the upstream did not process the request"
        guard let (id, exchange) = clientExchange(for: upstreamID), exchange.status == nil else {
            return responseFailed(upstreamID, detail: detail)
        }
        guard clientRefusesUnprocessedStreams else {
            var actions = Actions()
            if carryUnprocessed(exchange, facts: facts, into: &actions) { return actions }
            return responseFailed(upstreamID, detail: detail)
        }
        exchange.refusal = .upstreamUnreachable
        exchange.responseEnded = true
        var actions = Actions(
            .refuseUnprocessed(id),
            .observe(.refused(.upstreamUnreachable, authority: exchange.authority,
                              detail: "\(detail) (refused as not processed: the client may retry it)")))
        finishIfDone(id, into: &actions)
        return actions
    }

    /// An HTTP/1.1 client's request that the upstream did not process (an `h2` origin's
    /// REFUSED_STREAM, or its GOAWAY, which nginx sends after `keepalive_requests` streams
    /// and which leaves the connection unable to take the tunnel's next request): it waits
    /// for a new connection, which the tunnel opens after leaving this one, and is sent there
    /// once. Only when it can be sent whole (no body byte of it went upstream yet; what the
    /// client sends from now on waits with it), when it was not carried before, and when no
    /// other exchange of the tunnel is on this connection (an HTTP/1.1 client has one at a
    /// time). False when it cannot be carried.
    private mutating func carryUnprocessed(_ exchange: ExchangeRecord, facts: (any UpstreamConnectionFacts)?,
                                           into actions: inout Actions) -> Bool {
        guard reconnectsWhenUpstreamCloses(switchedProtocols: false), !reconnecting, upstream != .none,
              !exchange.retried, let request = exchange.unsent, request.endStream || exchange.bytesUp == 0,
              !exchanges.containsValue(where: { $0 !== exchange && !$0.responseEnded && ($0.upstreamID != nil || $0.starting) })
        else { return false }
        detachFromUpstream(exchange)
        exchange.unsent = nil
        exchange.retry = nil
        exchange.retried = true
        pending.append(request)
        leaveForNewConnection(connectionBlocker: facts?.reuseBlocker, into: &actions)
        actions.append(.observe(.upstreamLost))
        startReconnect(.asBefore, into: &actions)
        return true
    }

    /// Exchange `upstreamID` was never written to its connection, which is closing (queued
    /// behind an answer that closed it), with `queued` of its body: the request waits for
    /// the tunnel's next connection, opened as the close is reported (`upstreamClosed`), and
    /// takes its queued body with it, its credit still out (the new connection's writes give
    /// it back, once). Sending it there is sending it once, whatever its method. An HTTP/2
    /// client's request with a body is answered as not processed instead: the client retries
    /// it itself (RFC 9113 §8.7). So is any request of a tunnel that cannot reconnect.
    mutating func requestNotSent(_ upstreamID: UpstreamExchangeID, queued: HeldRequestBody,
                                 switchedProtocols: Bool) -> Actions {
        guard reconnectsWhenUpstreamCloses(switchedProtocols: switchedProtocols),
              let (_, exchange) = clientExchange(for: upstreamID), exchange.status == nil, var request = exchange.unsent,
              request.endStream || !clientRefusesUnprocessedStreams else {
            // Its connection is closing: nothing can be carried from it but by the close.
            return responseNotProcessed(upstreamID, upstream: nil)
        }
        var actions = Actions()
        let bytes = queued.body.reduce(0) { $0 + $1.readableBytes }
        if bytes > 0 {
            ledger.takenBack(.request, sinkID: upstreamID.rawValue, bytes: bytes)
            exchange.bytesUp -= bytes
            // A take-back the ledger could not place is counted, as any miscount is.
            actions += deliver(nil)
        }
        detachFromUpstream(exchange)
        exchange.unsent = nil
        exchange.retry = nil
        if !request.endStream {
            request.body = queued.body
            request.ended = queued.ended
            request.trailers = queued.trailers
        }
        pending.append(request)
        return actions
    }

    /// The upstream's answer to exchange `upstreamID` cannot be passed on (`detail` says
    /// why): a 502 under `reason` when nothing was answered yet, else a cut.
    mutating func responseFailed(_ upstreamID: UpstreamExchangeID, reason: RequestRefusal = .upstreamUnreachable,
                                         detail: String) -> Actions {
        guard let (id, exchange) = clientExchange(for: upstreamID) else { return Actions() }
        var actions = Actions()
        if exchange.status == nil {
            // Nothing was answered yet: the client hears why, as it would from a proxy.
            exchange.status = 502
            exchange.refusal = reason
            exchange.responseEnded = true
            actions.append(.observe(.refused(reason, authority: exchange.authority, detail: detail)))
            actions.append(.answer(id, status: 502, refusal: reason, detail: detail))
            finishIfDone(id, into: &actions)
        } else {
            exchange.cut = .upstreamClosed
            actions.append(.cancelClientExchange(id))
            finish(id, into: &actions)
        }
        return actions
    }

    /// The upstream side wrote `bytes` of exchange `upstreamID`'s request body.
    mutating func requestBodyWritten(_ upstreamID: UpstreamExchangeID, bytes: Int, writable: Bool) -> Actions {
        deliver(ledger.wrote(.request, sinkID: upstreamID.rawValue, bytes: bytes, writable: writable))
    }

    /// The upstream side dropped `bytes` of exchange `upstreamID`'s request body.
    mutating func requestBodyDiscarded(_ upstreamID: UpstreamExchangeID, bytes: Int) -> Actions {
        deliver(ledger.discarded(.request, sinkID: upstreamID.rawValue, bytes: bytes))
    }

    /// `bytes` of exchange `upstreamID`'s request body wait at the upstream side behind
    /// another exchange: the client may use that much of its connection window elsewhere.
    mutating func requestBodyQueued(_ upstreamID: UpstreamExchangeID, bytes: Int) -> Actions {
        guard let id = clientIDByUpstreamID[upstreamID] else { return Actions(.observe(.creditUnplaced(bytes))) }
        return Actions(.requestBodyQueued(id, bytes: bytes))
    }

    /// Exchange `upstreamID`'s request, its body still coming, is the one its connection
    /// sends now. One that ended meanwhile needs nothing (the side's report may come a turn
    /// late), so it is not an impossible input.
    func requestOnWire(_ upstreamID: UpstreamExchangeID) -> Actions {
        guard let id = clientIDByUpstreamID[upstreamID] else { return Actions() }
        return Actions(.openRequestWindow(id))
    }

    /// The upstream's channel is writable again.
    mutating func upstreamDrained() -> Actions {
        var actions = Actions()
        for credit in ledger.drained(.request) { actions += deliver(credit) }
        return actions
    }

    /// Gives `credit` back to the leg that spent it; counts what the ledger could not place.
    private mutating func deliver(_ credit: CreditLedger.Credit?) -> Actions {
        var actions = Actions()
        if ledger.unplaced != reportedUnplaced {
            actions.append(.observe(.creditUnplaced(ledger.unplaced - reportedUnplaced)))
            reportedUnplaced = ledger.unplaced
        }
        guard let credit else { return actions }
        switch credit.direction {
        case .request: actions.append(.creditRequestBody(ClientExchangeID(credit.sourceID), bytes: credit.bytes))
        case .response: actions.append(.creditResponseBody(UpstreamExchangeID(credit.sourceID), bytes: credit.bytes))
        }
        return actions
    }

    /// The upstream's connection is gone. A tunnel that reconnects keeps its client: what
    /// was not started may be repeated, the rest is cut. Otherwise the client's connection
    /// goes too, once every response already passed on has reached it. After
    /// `upstreamFailed` the client stays until it was answered.
    /// - Parameter switchedProtocols: the connection carried the tunnel as a byte relay.
    mutating func upstreamClosed(switchedProtocols: Bool) -> Actions {
        var actions = Actions()
        // Request bytes handed to the upstream side will never be written: the client gets
        // their credit (its connection may be draining responses still).
        for credit in ledger.sinkGone(.request) { actions += deliver(credit) }
        guard upstreamFailure == nil else { return actions }
        if reconnectsWhenUpstreamCloses(switchedProtocols: switchedProtocols) {
            upstreamClosedReconnecting(into: &actions)
            return actions
        }
        // Every response the upstream had not finished is cut: the client must hear it as a
        // cut (a 502 when nothing was answered yet; else RST_STREAM, or the HTTP/1.1
        // connection closing short of its length), never as an end.
        for upstreamID in unfinishedUpstreamIDs() {
            actions += responseFailed(upstreamID, detail: "the upstream's connection closed before the response ended")
        }
        // Requests that waited for a connection get an answer too, never silence.
        for request in pending {
            guard let exchange = exchanges[request.id] else { continue }
            dropPending(request.id, into: &actions)
            refuse(request.id, exchange, status: 502, reason: .upstreamUnreachable,
                   detail: "the tunnel's upstream connection closed before the request could be sent", into: &actions)
        }
        end(into: &actions)
        actions.append(.closeClient(whenAnswered: true))
        return actions
    }

    /// Upstream ids of the responses not finished, in order.
    private func unfinishedUpstreamIDs() -> [UpstreamExchangeID] {
        exchanges.values.compactMap { $0.responseEnded ? nil : $0.upstreamID }.sorted()
    }

    /// Whether the tunnel opens a new upstream connection when its connection closes: it
    /// can, it has not ended, and the connection did not switch protocols (it carried the
    /// tunnel as a byte relay: there is no HTTP to go on with).
    private func reconnectsWhenUpstreamCloses(switchedProtocols: Bool) -> Bool {
        canReconnect && !ended && !switchedProtocols
    }

    /// The upstream connection of a tunnel that reconnects went: what it had not started
    /// answering and may be repeated waits for a new connection (a retry, once); every other
    /// unfinished response is cut. The client's connection stays.
    private mutating func upstreamClosedReconnecting(into actions: inout Actions) {
        upstream = .none
        actions.append(.dropUpstream)
        // Response bytes of the old connection still on their way to the client: their
        // credit has no connection to go back to (the next one's exchange ids start again).
        ledger.sourceGone(.response)
        actions.append(.observe(.upstreamLost))
        for upstreamID in unfinishedUpstreamIDs() {
            guard let (_, exchange) = clientExchange(for: upstreamID) else { continue }
            if let retry = exchange.retry, exchange.status == nil, exchange.bytesDown == 0 {
                detachFromUpstream(exchange)
                exchange.retry = nil
                exchange.retried = true
                exchange.unsent = nil
                pending.append(retry)
            } else {
                actions += responseFailed(upstreamID, detail: "the upstream's connection closed before the response ended")
            }
        }
        pending.sort { $0.id < $1.id }
        if !pending.isEmpty { startReconnect(.asBefore, into: &actions) }
        // What the connection answered before it went, and the cuts above, go out now: the
        // close came inside its read, whose read-complete (the usual flush) never arrives.
        actions.append(.flushClient)
    }

    /// The upstream connection failed before it could carry a request: each request the
    /// client sends from here on is answered `status` with `reason` and `detail`, then the
    /// client's connection ends (`Action.closeClientForUpstreamFailure`).
    mutating func upstreamFailed(status: Int, reason: RequestRefusal, detail: String) -> Actions {
        guard !ended, upstreamFailure == nil else { return Actions() }
        upstreamFailure = UpstreamFailure(status: status, reason: reason, detail: detail)
        return Actions(.closeUpstream)
    }

    // MARK: bookkeeping

    /// An exchange is finished (and logged) once its response has ended.
    private mutating func finishIfDone(_ id: ClientExchangeID, into actions: inout Actions) {
        guard let exchange = exchanges[id], exchange.responseEnded else { return }
        // A response that ended on the upstream connection: it has carried an exchange.
        if exchange.upstreamID != nil && exchange.refusal == nil { upstreamReused = true }
        finish(id, into: &actions)
    }

    private mutating func finish(_ id: ClientExchangeID, into actions: inout Actions) {
        guard let exchange = exchanges.removeValue(forKey: id) else { return }
        // No more is forwarded either way; each account closes once its sink has written
        // or dropped what it took.
        ledger.sinkFinishing(.response, sinkID: id.rawValue)
        if let upstreamID = exchange.upstreamID {
            clientIDByUpstreamID[upstreamID] = nil
            ledger.sinkFinishing(.request, sinkID: upstreamID.rawValue)
        }
        actions.append(.observe(.finished(TunnelRouter.ExchangeSummary(
            started: exchange.started, durationNanoseconds: (NIODeadline.now() - exchange.startedTick).nanoseconds,
            method: exchange.method, path: exchange.path, authority: exchange.authority, status: exchange.status,
            bytesUp: exchange.bytesUp, bytesDown: exchange.bytesDown,
            clientStreamID: clientUsesStreamIDs ? id.rawValue : nil, refusal: exchange.refusal, cut: exchange.cut))))
    }

    /// Ends every exchange still open (each is logged as it stood). An upstream failure no
    /// request was refused with is counted here, once, for the tunnel as a whole.
    private mutating func end(into actions: inout Actions) {
        guard !ended else { return }
        ended = true
        for id in exchanges.keys.sorted() { finish(id, into: &actions) }
        if let failure = upstreamFailure, !failure.reported {
            upstreamFailure?.reported = true
            actions.append(.observe(.refused(failure.reason, authority: "-", detail: failure.detail)))
        }
        actions.append(.observe(.ended))
    }

    // MARK: rules

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

    /// Whether `headers` carry authentication that binds the connection rather than the
    /// request (RFC 4559 `Negotiate`, Microsoft's `NTLM`): the server authenticates the
    /// connection once and may not ask again.
    static func bindsConnection(_ headers: HTTPHeaders) -> Bool {
        headers[canonicalForm: "authorization"].contains { value in
            // The scheme ends at any whitespace (RFC 9110 §11.6.2 allows tabs too): `NTLM<TAB>…`
            // binds the connection as `NTLM …` does.
            let scheme = value.drop { $0 == " " || $0 == "\t" }.prefix { $0 != " " && $0 != "\t" }.lowercased()
            return scheme == "ntlm" || scheme == "negotiate"
        }
    }

    /// Whether a request may be sent again if its connection is lost before an answer: an
    /// idempotent method, no body, no upgrade (RFC 9110 §9.2.2, RFC 9112 §9.3.1).
    static func mayBeRepeated(_ head: ExchangeRequestHead, endStream: Bool) -> Bool {
        endStream && head.upgrade == nil && idempotentMethods.contains(head.method)
    }

    /// Methods a client may repeat without a different effect (RFC 9110 §9.2.2).
    static let idempotentMethods: Set<String> = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]
}
