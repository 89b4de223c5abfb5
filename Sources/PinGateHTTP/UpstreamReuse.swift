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

/// The HTTP side of an upstream connection that outlived its tunnel: kept in the
/// connection's pipeline (with its codecs, or its nghttp2 session and HPACK state) while
/// the connection is parked, and attached to the router of the next tunnel admitted on it.
///
/// While parked nothing is expected from the upstream: an HTTP/1.1 response nobody asked
/// for, an HTTP/2 GOAWAY or a protocol error closes the connection (the pool sees it go).
package final class PooledUpstreamSide {
    let side: any TunnelUpstreamSide
    /// True for an `h2` connection (an nghttp2 session), false for HTTP/1.1.
    package let isHTTP2: Bool

    init(_ side: any TunnelUpstreamSide) {
        self.side = side
        self.isHTTP2 = side is HTTP2UpstreamSide
    }

    /// Why it could not carry another tunnel now (it was closed or broken while parked),
    /// or nil when it can.
    package var reuseBlocker: UpstreamNotPooledReason? { side.reuseBlocker }

    /// Closes the connection (idle too long, dropped by a list change, shutdown).
    package func close() { side.close() }
}
