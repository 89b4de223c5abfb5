import NIOCore
import PinGateNIO
import PinList

/// How a tunnel gets an upstream connection it may use, in one place: what the list says
/// before anything is opened, the dial (TCP, TLS) and the verdict on its handshake, or the
/// verdict on a pooled connection's own handshake under the list in force now; and for
/// each, the same counting, TLS-session keeping and pin-failure report. The CONNECT, its
/// pooled hit, a byte relay's reopen for the client's offer and a tunnel's new connection
/// inside it all come through here (issue 31, item 6: the sequence existed three times in
/// `ConnectHandler`, and the copies had drifted: one skipped the pin-failure report, one
/// never asked for a fresh list when the one in force had expired).
///
/// What each caller does with the outcome stays its own: the CONNECT's state machine
/// answers the client, a reconnect answers the requests waiting inside the tunnel.
struct UpstreamAdmission {
    let environment: GateEnvironment
    /// The host and port of the CONNECT the connection is for.
    let host: String
    let port: Int

    /// What stands before any connection is opened or taken for the host.
    enum Preflight: Equatable {
        /// Go on: dial, or take one from the pool.
        case proceed
        /// The list has expired as a whole (its reason): a fresh one was asked for.
        case listExpired(String)
        /// A list source is configured and nothing usable is in force yet.
        case listNotYet
        /// The list refuses the host (or port) without a handshake.
        case refused(Verdict)
    }

    /// A connection decided on.
    struct Admitted {
        let upstream: UpstreamConnection
        let verdict: Verdict
    }

    /// What the list in force says before anything is dialled. A list that has expired as a
    /// whole is refused at once, saying so (waiting would only delay the same answer, and
    /// "unavailable" would send the operator looking at the network instead of at the
    /// list's dates); a re-read or re-fetch is still asked for, so that a list replaced
    /// meanwhile is in force for the next connection.
    func preflight() -> Preflight {
        switch environment.listState(for: host, now: environment.now()) {
        case .expired(let reason):
            environment.updater?.requestDirectUpdate()
            return .listExpired(reason)
        case .notYet:
            return .listNotYet
        case .ready:
            return refusalBeforeConnecting().map(Preflight.refused) ?? .proceed
        }
    }

    /// The list's refusal of the host or port before any handshake, if it has one.
    func refusalBeforeConnecting() -> Verdict? {
        environment.decisionPolicy.refusalBeforeConnecting(host: host, port: port, list: environment.store.list, now: environment.now())
    }

    /// The verdict on `upstream` for the host, under the list in force now: its own
    /// handshake's leaf and verified chain, whether it was just dialled or kept in the pool.
    /// A fresh handshake's TLS sessions are kept for resumption only when the verdict trusts
    /// a verified server (a report-only violation is admitted and may stay open for hours:
    /// it holds none). Pin failures, enforced or report-only, go to the report URIs.
    func decide(on upstream: UpstreamConnection) -> Verdict {
        let verdict = environment.verdict(host: host, on: upstream)
        if !upstream.fromPool {
            if upstream.peer.resumed { environment.statistics.upstreamSessionResumed() }
            if case .trusted = verdict, upstream.peer.chainAndHostnameValid {
                upstream.keepSessions?()
            } else {
                upstream.discardSessions?()
            }
        }
        environment.reportIfPinFailure(verdict, host: host, port: port, upstream: upstream)
        return verdict
    }

    /// Dials the host with ALPN `offer` on `eventLoop` and decides on the connection. Fails
    /// with the error of the dial (`refusal(for:)` says how to answer it).
    /// - Parameter countRelayed: counts the bytes the connection's glue relays.
    func dial(offer: [String]?, on eventLoop: EventLoop, countRelayed: @escaping GlueHandler.ByteCounter) -> EventLoopFuture<Admitted> {
        environment.connector.connect(host: host, port: port, alpnOffer: offer, on: eventLoop, countRelayed: countRelayed)
            .map { upstream in
                environment.statistics.metrics.upstreamHandshake(nanoseconds: upstream.handshakeDuration.nanoseconds)
                return Admitted(upstream: upstream, verdict: decide(on: upstream))
            }
    }

    /// The refusal a failed dial is answered with: the TLS client's own reason when it
    /// gave one, else the host could not be reached.
    static func refusal(for error: any Error) -> Refusal {
        (error as? TLSClientError).map(Refusal.init) ?? .upstreamUnreachable("\(error)")
    }
}
