import NIOHTTP1
import PinList

/// The life of one client connection, from its first byte to a joined tunnel or a
/// refusal, as a plain value: events go in, `Action`s come out, and nothing here touches
/// a socket, a clock or a promise. `ConnectHandler` is the driver that turns real
/// events into calls and actions into I/O; the tests drive the machine directly.
///
/// ```
/// readingHead ─(head)→ checkingList ─(usable)→ connectingUpstream ─(trusted)→ handshakingClient ─(done)→ relaying
///                           └─(updating)→ waitingForList ─(usable)┘                 │    ↑
///                                                                    (ALPN missing)↓    │(trusted)
///                                                                        reconnectingUpstream
/// any state ─(refusal, failure, deadline, close)→ closed
/// ```
///
/// The order is the gate's promise: the upstream's handshake and the pin verdict come
/// first, and only a trusted upstream gets a `200` and a minted leaf. Every state that
/// holds an upstream carries it, so whatever ends the connection early also says which
/// upstream to close. `Upstream` is generic so that tests need no channel.
struct ConnectStateMachine<Upstream: Equatable> {
    /// Where the connection is.
    enum State {
        /// Reading the CONNECT head (NIOHTTP1's decoder reads it, `ConnectHeadHandler`).
        case readingHead
        /// The head is complete; the driver is asked whether a usable list is in force.
        case checkingList(ConnectRequest, early: [UInt8])
        /// No usable list yet and an update is fetching one: wait for it (bounded).
        case waitingForList(ConnectRequest, early: [UInt8])
        /// The upstream's TCP connect and TLS handshake are under way.
        case connectingUpstream(ConnectRequest, early: [UInt8])
        /// The upstream is trusted, the `200` is sent, and the client's TLS handshake with
        /// the minted leaf is under way (under a deadline).
        case handshakingClient(ConnectRequest, upstream: Upstream, verdict: Verdict)
        /// The client's ClientHello offered no protocol the upstream chose: a new upstream
        /// is being opened with the client's offer, and must be trusted again.
        case reconnectingUpstream(ConnectRequest, verdict: Verdict)
        /// The tunnel is joined; the relay owns the connection from here.
        case relaying(ConnectRequest, upstream: Upstream)
        /// Refused, failed or closed; later events change nothing.
        case closed
    }

    /// What the driver knows about the list when the head is complete.
    enum ListReadiness: Equatable {
        /// A usable list is in force; `refusal` is the policy's answer before any
        /// connection (nil: go on and connect).
        case usable(refusal: Verdict?)
        /// Nothing usable is in force and an update is fetching one.
        case updating
        /// The list in force verified but has expired as a whole; `detail` says when.
        case expired(String)
    }

    /// How a bounded wait for a list ended.
    enum ListWaitOutcome: Equatable {
        /// A usable list arrived; `refusal` as in `ListReadiness.usable`.
        case usable(refusal: Verdict?)
        /// None arrived in time; `detail` says what the last update did.
        case unavailable(String)
        /// What is in force after the wait is a list that has expired as a whole.
        case expired(String)
    }

    /// Why an admitted connection is being closed before its tunnel was joined.
    enum EarlyClose: Equatable {
        /// The client's TLS handshake with the minted leaf failed.
        case clientHandshakeFailed(String)
        /// The client did not finish its TLS handshake within the deadline.
        case clientHandshakeTimedOut
        /// The upstream closed before the tunnel was joined.
        case upstreamClosed
        /// The upstream reopened for the client's ALPN offer was refused or failed.
        case reconnectRefused(DecisionReason)
        /// The client sent more than `Limits.earlyBytes` before the tunnel was up.
        case tooManyEarlyBytes
    }

    /// What the driver must do now.
    enum Action: Equatable {
        /// Nothing.
        case none
        /// Tell `checkedList(_:)` whether a usable list is in force for `request`.
        case checkList(ConnectRequest)
        /// Ask the updater for a list and wait (bounded); then call `listWaitEnded(_:)`.
        case waitForList
        /// Open the upstream leg for `request`; then call `upstreamConnected` or `upstreamFailed`.
        case connectUpstream(ConnectRequest)
        /// Answer the CONNECT with `refusal` and close the client; close `upstream` too.
        case refuse(Refusal, request: ConnectRequest?, upstream: Upstream?)
        /// Answer `200`, put the client's TLS in the pipeline with a leaf for the request's
        /// host, hand it `early` bytes, and start the client-handshake deadline.
        case admit(ConnectRequest, upstream: Upstream, verdict: Verdict, early: [UInt8])
        /// Pass these client bytes on to the client's TLS (the handshake is running).
        case forward
        /// Close `previous` and open a new upstream with the client's `offer`; then call
        /// `upstreamConnected` (or `upstreamFailed`) again.
        case reconnectUpstream(ConnectRequest, offer: [String]?, previous: Upstream)
        /// Let the paused client handshake go on with the new upstream.
        case resumeClientHandshake(upstream: Upstream)
        /// Join the client's relay with `upstream`'s, register the tunnel, leave the pipeline.
        case join(ConnectRequest, upstream: Upstream, verdict: Verdict)
        /// Close the client and `upstream` (when there is one), counting `reason`.
        case closeEarly(EarlyClose, upstream: Upstream?)
        /// Close an upstream that arrived for a connection that is gone.
        case closeUpstream(Upstream)
    }

    /// The bounds the machine enforces itself.
    struct Limits {
        /// Bytes a client may send after its head before the tunnel is up (an eager ClientHello).
        var earlyBytes = 64 * 1024
        /// The head timeout, for the 408's explanation.
        var headTimeoutSeconds: Int64 = 10
    }

    private(set) var state: State
    private let limits: Limits

    /// The upstream's connect is under way (or, for a CONNECT waiting for another tunnel's
    /// dial to share, about to be): only then is an upstream connection expected.
    var isConnectingUpstream: Bool {
        if case .connectingUpstream = state { return true }
        return false
    }

    /// A machine for a new connection.
    init(limits: Limits = Limits()) {
        state = .readingHead
        self.limits = limits
    }

    /// True while the CONNECT head is still being read: nothing was decided or dialled for
    /// the connection yet.
    var isReadingHead: Bool {
        if case .readingHead = state { return true }
        return false
    }

    /// True while a new upstream is being opened for the client's ALPN offer (the client's
    /// handshake is paused at its ClientHello for exactly that long).
    var isReconnectingUpstream: Bool {
        if case .reconnectingUpstream = state { return true }
        return false
    }

    /// The request, once its head is parsed.
    var request: ConnectRequest? {
        switch state {
        case .readingHead, .closed: return nil
        case .checkingList(let request, _), .waitingForList(let request, _), .connectingUpstream(let request, _),
             .handshakingClient(let request, _, _), .reconnectingUpstream(let request, _), .relaying(let request, _):
            return request
        }
    }

    // MARK: client bytes

    /// The decoder read the request head: a CONNECT goes on to the list, anything else is
    /// refused (`ConnectHeadCheck`).
    mutating func headReceived(_ head: HTTPRequestHead) -> Action {
        // One head per connection: the decoder leaves after it.
        guard case .readingHead = state else { return .none }
        switch ConnectHeadCheck.check(head) {
        case .success(let request):
            state = .checkingList(request, early: [])
            return .checkList(request)
        case .failure(let rejection):
            state = .closed
            return .refuse(.head(rejection), request: nil, upstream: nil)
        }
    }

    /// The decoder could not read the request head: it is refused with `rejection`.
    mutating func headUnreadable(_ rejection: HeadRejection) -> Action {
        guard case .readingHead = state else { return .none }
        state = .closed
        return .refuse(.head(rejection), request: nil, upstream: nil)
    }

    /// Bytes arrived from the client after its head (before it, the decoder has them).
    mutating func bytesReceived(_ bytes: some Collection<UInt8>) -> Action {
        switch state {
        case .readingHead:
            // Never: the decoder reads until the head is complete, and hands on the bytes
            // after it only then. Refused rather than taken for a head.
            state = .closed
            return .refuse(.head(HeadRejection(status: 400, reason: .badRequest,
                                               detail: "bytes arrived before the request head was read")),
                           request: nil, upstream: nil)
        case .checkingList(let request, var early):
            guard appendEarly(bytes, to: &early) else { return closeForEarlyBytes() }
            state = .checkingList(request, early: early)
            return .none
        case .waitingForList(let request, var early):
            guard appendEarly(bytes, to: &early) else { return closeForEarlyBytes() }
            state = .waitingForList(request, early: early)
            return .none
        case .connectingUpstream(let request, var early):
            guard appendEarly(bytes, to: &early) else { return closeForEarlyBytes() }
            state = .connectingUpstream(request, early: early)
            return .none
        case .handshakingClient, .reconnectingUpstream, .relaying:
            // The client's TLS handler is in the pipeline behind the driver: let it have them.
            return .forward
        case .closed:
            return .none
        }
    }

    private func appendEarly(_ bytes: some Collection<UInt8>, to early: inout [UInt8]) -> Bool {
        guard early.count + bytes.count <= limits.earlyBytes else { return false }
        early.append(contentsOf: bytes)
        return true
    }

    private mutating func closeForEarlyBytes() -> Action {
        // Nothing upstream exists in these states (connectingUpstream's arrives later and
        // is closed by `upstreamConnected` in `.closed`).
        state = .closed
        return .closeEarly(.tooManyEarlyBytes, upstream: nil)
    }

    /// The head did not arrive in time.
    mutating func headTimedOut() -> Action {
        guard case .readingHead = state else { return .none }
        state = .closed
        return .refuse(.head(HeadRejection(
            status: 408, reason: .requestTimeout,
            detail: "the CONNECT request head did not arrive within \(limits.headTimeoutSeconds) s")), request: nil, upstream: nil)
    }

    // MARK: list

    /// The driver's answer to `.checkList`.
    mutating func checkedList(_ readiness: ListReadiness) -> Action {
        guard case .checkingList(let request, let early) = state else { return .none }
        switch readiness {
        case .updating:
            state = .waitingForList(request, early: early)
            return .waitForList
        case .expired(let detail):
            state = .closed
            return .refuse(.listExpired(detail), request: request, upstream: nil)
        case .usable(let refusal):
            return decide(request, early: early, refusal: refusal)
        }
    }

    /// The bounded wait for a list ended.
    mutating func listWaitEnded(_ outcome: ListWaitOutcome) -> Action {
        guard case .waitingForList(let request, let early) = state else { return .none }
        switch outcome {
        case .unavailable(let detail):
            state = .closed
            return .refuse(.listUnavailable(detail), request: request, upstream: nil)
        case .expired(let detail):
            state = .closed
            return .refuse(.listExpired(detail), request: request, upstream: nil)
        case .usable(let refusal):
            return decide(request, early: early, refusal: refusal)
        }
    }

    private mutating func decide(_ request: ConnectRequest, early: [UInt8], refusal: Verdict?) -> Action {
        if let refusal {
            // Deny by default, and without touching the network.
            state = .closed
            return .refuse(.verdict(refusal), request: request, upstream: nil)
        }
        state = .connectingUpstream(request, early: early)
        return .connectUpstream(request)
    }

    // MARK: upstream

    /// The upstream's handshake completed and the policy gave `verdict` on it.
    mutating func upstreamConnected(_ upstream: Upstream, verdict: Verdict) -> Action {
        switch state {
        case .connectingUpstream(let request, let early):
            guard verdict.isTrusted else {
                state = .closed
                return .refuse(.verdict(verdict), request: request, upstream: upstream)
            }
            state = .handshakingClient(request, upstream: upstream, verdict: verdict)
            return .admit(request, upstream: upstream, verdict: verdict, early: early)
        case .reconnectingUpstream(let request, let admittedVerdict):
            guard verdict.isTrusted else {
                // The 200 is long sent: all that is left is to end the client's handshake.
                state = .closed
                return .closeEarly(.reconnectRefused(DecisionReason(verdict)), upstream: upstream)
            }
            // The tunnel stays logged under the verdict it was admitted on; the new leg
            // passed the same policy.
            state = .handshakingClient(request, upstream: upstream, verdict: admittedVerdict)
            return .resumeClientHandshake(upstream: upstream)
        case .readingHead, .checkingList, .waitingForList, .handshakingClient, .relaying, .closed:
            // The client left meanwhile (or a stale connect finished): nobody wants it.
            return .closeUpstream(upstream)
        }
    }

    /// The upstream leg did not come up.
    mutating func upstreamFailed(_ refusal: Refusal) -> Action {
        switch state {
        case .connectingUpstream(let request, _):
            state = .closed
            return .refuse(refusal, request: request, upstream: nil)
        case .reconnectingUpstream:
            state = .closed
            return .closeEarly(.reconnectRefused(refusal.reason), upstream: nil)
        default:
            return .none
        }
    }

    /// `upstream` closed. Before the join that ends the client too; after it, the relay
    /// handles it.
    mutating func upstreamClosed(_ upstream: Upstream) -> Action {
        guard case .handshakingClient(_, let current, _) = state, current == upstream else { return .none }
        state = .closed
        return .closeEarly(.upstreamClosed, upstream: nil)
    }

    /// The driver could not set up the client's side of an admitted tunnel (minting the
    /// leaf or adding the TLS handler failed). Nothing was answered yet, so the CONNECT is
    /// refused like any other.
    mutating func admissionFailed(_ refusal: Refusal) -> Action {
        guard case .handshakingClient(let request, let upstream, _) = state else { return .none }
        state = .closed
        return .refuse(refusal, request: request, upstream: upstream)
    }

    // MARK: client handshake

    /// The client's ClientHello offered `offer`, which lacks the protocol the upstream
    /// chose: reopen the upstream with the client's offer.
    mutating func clientOfferNeedsNewUpstream(_ offer: [String]?) -> Action {
        guard case .handshakingClient(let request, let upstream, let verdict) = state else { return .none }
        state = .reconnectingUpstream(request, verdict: verdict)
        return .reconnectUpstream(request, offer: offer, previous: upstream)
    }

    /// The client's TLS handshake completed.
    mutating func clientHandshakeSucceeded() -> Action {
        guard case .handshakingClient(let request, let upstream, let verdict) = state else { return .none }
        state = .relaying(request, upstream: upstream)
        return .join(request, upstream: upstream, verdict: verdict)
    }

    /// The client's TLS handshake failed.
    mutating func clientHandshakeFailed(_ reason: String) -> Action {
        closeBeforeJoin(.clientHandshakeFailed(reason))
    }

    /// The client-handshake deadline passed.
    mutating func clientHandshakeDeadlinePassed() -> Action {
        closeBeforeJoin(.clientHandshakeTimedOut)
    }

    private mutating func closeBeforeJoin(_ reason: EarlyClose) -> Action {
        switch state {
        case .handshakingClient(_, let upstream, _):
            state = .closed
            return .closeEarly(reason, upstream: upstream)
        case .reconnectingUpstream:
            // The new upstream, if it comes, is closed on arrival.
            state = .closed
            return .closeEarly(reason, upstream: nil)
        default:
            return .none
        }
    }

    // MARK: close

    /// The client's connection closed.
    mutating func clientClosed() -> Action {
        switch state {
        case .handshakingClient(_, let upstream, _):
            state = .closed
            return .closeUpstream(upstream)
        case .relaying:
            // The relay closes its partner itself.
            return .none
        default:
            state = .closed
            return .none
        }
    }
}
