import NIOCore

/// Decides when an HTTP/2 client's behaviour ends its connection rather than one stream.
///
/// Every stream the client resets, and every request the gate's HTTP/2 layer rejects before
/// it surfaces (a header block over the limit, an HPACK bomb among them; a malformed head),
/// costs the gate work and a stream, and costs the client nothing. One at a time they are a
/// stream's business; a flood of them is the connection's (RFC 9113 §10.5: "rapid reset",
/// CVE-2023-44487; an HPACK bomb resent on every stream). So each connection has a budget,
/// a token bucket per kind, and the offence that empties it ends the connection with GOAWAY
/// ENHANCE_YOUR_CALM instead of one more reset.
///
/// Sans-IO: the clock is passed in.
struct HTTP2AbuseGuard {
    /// What the client did.
    enum Offence: Sendable {
        /// It reset a stream it had opened (RST_STREAM from the client).
        case clientReset
        /// The gate's HTTP/2 layer rejected a request before it surfaced (a header block over
        /// the limit, a malformed head).
        case rejectedRequest
        /// It sent a SETTINGS or PING frame that asks for an acknowledgement (CVE-2019-9512
        /// and -9515: each costs the gate a frame back, and costs the client nothing).
        case controlFrame
    }

    /// A bucket: `capacity` offences at once, refilled at `perSecond`.
    struct Budget: Sendable {
        var capacity: Double
        var perSecond: Double
    }

    /// Client resets: a browser cancelling a page's requests may reset dozens at once, so
    /// the burst is generous; a sustained rate beyond it is a flood.
    static let resets = Budget(capacity: 200, perSecond: 50)
    /// Rejected requests: a client that keeps sending heads the gate must refuse is broken or
    /// hostile; a few are tolerated.
    static let rejections = Budget(capacity: 20, perSecond: 2)
    /// SETTINGS and PING frames: a client sends SETTINGS once or twice and PINGs now and
    /// then (a keep-alive, gRPC's bandwidth probe, one per round trip while data flows), so
    /// the budget is far above that; a flood is thousands a second.
    static let controlFrames = Budget(capacity: 1_000, perSecond: 200)

    private var tokens: [Double]
    private var last: NIODeadline?
    private let budgets: [Budget]

    /// A guard with full buckets.
    init(resets: Budget = Self.resets, rejections: Budget = Self.rejections, controlFrames: Budget = Self.controlFrames) {
        budgets = [resets, rejections, controlFrames]
        tokens = budgets.map(\.capacity)
    }

    /// Records `offence` at `now`: true when it is one too many and the connection must end.
    mutating func record(_ offence: Offence, now: NIODeadline) -> Bool {
        if let last {
            let seconds = Double((now - last).nanoseconds) / 1e9
            for index in budgets.indices {
                tokens[index] = min(budgets[index].capacity, tokens[index] + max(0, seconds) * budgets[index].perSecond)
            }
        }
        last = now
        let index: Int
        switch offence {
        case .clientReset: index = 0
        case .rejectedRequest: index = 1
        case .controlFrame: index = 2
        }
        tokens[index] -= 1
        return tokens[index] < 0
    }
}
