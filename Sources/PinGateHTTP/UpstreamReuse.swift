import NIOCore

/// Why an upstream connection was not kept for another tunnel when its tunnel ended. Each
/// raw value is the token `/status` and `pingate_upstream_pool_not_pooled_total` count it
/// under.
package enum UpstreamNotPooledReason: String, Sendable, Hashable, CaseIterable {
    /// An exchange was still open on it (a response or a request body not finished), so
    /// the connection is not at a message boundary.
    case inFlight = "in-flight"
    /// It switched protocols (WebSocket): it no longer speaks HTTP.
    case upgraded = "upgraded"
    /// It was already closing: the upstream said `Connection: close`, broke its protocol,
    /// went quiet past its set-up, or the tunnel cut it.
    case closing = "closing"
    /// The upstream sent bytes no request asked for (between responses, or after a
    /// response's end): it is out of step, and its next bytes could be taken for another
    /// exchange's answer.
    case unsolicitedBytes = "unsolicited-bytes"
    /// The tunnel opened it for itself (ALPN `http/1.1`, for a WebSocket its `h2`
    /// connection could not carry): it is the tunnel's own, never another's.
    case privateConnection = "private"
    /// The upstream sent HTTP/2 GOAWAY: it takes no new streams.
    case goAway = "goaway"
    /// A request on it carried connection-bound authentication (`Authorization: NTLM` or
    /// `Negotiate`): the server may treat every later request on it as that user's.
    case connectionAuthentication = "connection-auth"
    /// The upstream asked for a client certificate: what it grants may be bound to the
    /// connection, as with connection-bound authentication.
    case clientCertificate = "client-certificate"
    /// The list changed since it was verified, and the list now in force no longer trusts it.
    case listChanged = "list-changed"
    /// The pool already holds as many idle connections for its key as allowed.
    case full = "full"
    /// The gate is shutting down.
    case shuttingDown = "shutting-down"
}

/// What a tunnel's router hands the gate about its upstream connection when the client
/// leaves: the connection's HTTP side, parked and reusable by another tunnel, or why not.
package enum UpstreamRelease {
    /// The connection is at a message boundary and healthy; its side is detached from the
    /// router and waits, parked, for another tunnel (or to be closed).
    case reusable(PooledUpstreamSide)
    /// It cannot be reused, for `reason`; the router closes it.
    case notReusable(UpstreamNotPooledReason)
}

/// The HTTP side of an upstream connection kept for other tunnels: an HTTP/1.1 side that
/// outlived its tunnel, parked in the connection's pipeline with its codecs until the next
/// tunnel takes it over; or an `h2` connection (its nghttp2 session, HPACK state and the
/// upstream's SETTINGS), which tunnels share, each on a lane of its own, while it has
/// streams to spare.
///
/// While an HTTP/1.1 side is parked nothing is expected from the upstream: a response
/// nobody asked for, or a protocol error, closes the connection (the pool sees it go), as
/// does an HTTP/2 GOAWAY once no tunnel uses the connection.
package final class PooledUpstreamSide {
    enum Kind {
        case http1(any TunnelUpstreamSide)
        case http2(HTTP2UpstreamSide)
    }

    let kind: Kind

    init(_ side: any TunnelUpstreamSide) {
        if let lane = side as? HTTP2UpstreamLane {
            kind = .http2(lane.connection)
        } else {
            kind = .http1(side)
        }
    }

    init(http2 connection: HTTP2UpstreamSide) {
        kind = .http2(connection)
    }

    /// True for an `h2` connection (shared by tunnels), false for HTTP/1.1 (one at a time).
    package var isHTTP2: Bool {
        if case .http2 = kind { return true }
        return false
    }

    /// Why it could not carry another tunnel now (it was closed or broken meanwhile, or an
    /// `h2` one has no stream to spare), or nil when it can.
    package var reuseBlocker: UpstreamNotPooledReason? {
        switch kind {
        case .http1(let side): return side.reuseBlocker
        case .http2(let connection):
            if let blocker = connection.connectionBlocker { return blocker }
            return connection.canTakeAnotherTunnel ? nil : .full
        }
    }

    /// For an `h2` connection shared through the pool, whose idle timer the pool keeps:
    /// `unused` runs each time its last tunnel leaves it still good for more, `used` each
    /// time a tunnel joins it again.
    package func share(unused: @escaping () -> Void, used: @escaping () -> Void) {
        if case .http2(let connection) = kind { connection.sharing = (unused, used) }
    }

    /// Ends the sharing of an `h2` connection (the gate is shutting down): its tunnels
    /// finish, and it closes after the last. An HTTP/1.1 side closes now.
    package func stopSharing() {
        switch kind {
        case .http1(let side): side.close()
        case .http2(let connection): connection.stopSharing()
        }
    }

    /// Set when the origin closed it while it idled (an HTTP/1.1 connection): for how long
    /// it had idled, which is its keep-alive timeout (`KeepAliveEstimate`).
    package var idleCloseAfter: TimeAmount? {
        switch kind {
        case .http1(let side): return (side as? HTTP1UpstreamSide)?.idleCloseAfter
        // An h2 origin says GOAWAY with the streams it processed: nothing is lost to learn.
        case .http2: return nil
        }
    }

    /// True when it closed because the upstream sent bytes no request asked for (while
    /// parked, or between responses): the pool counts its departure as `unsolicited-bytes`.
    package var sentUnsolicitedBytes: Bool {
        switch kind {
        case .http1(let side): return side.reuseBlocker == .unsolicitedBytes
        // A frame an h2 connection did not ask for is nghttp2's to refuse, as a protocol
        // error that ends the connection: counted as a close, not here.
        case .http2: return false
        }
    }

    /// Closes the connection (idle too long, dropped by a list change).
    package func close() {
        switch kind {
        case .http1(let side): side.close()
        case .http2(let connection): connection.close()
        }
    }
}
