/// Why the HTTP layer answered a request inside a tunnel itself, or ended it: the layer's
/// own vocabulary. Each raw value is the token the gate puts in `Pingate-Refusal` and counts
/// under (the core maps it onto its `DecisionReason` of the same token), so the HTTP layer
/// needs nothing of the CONNECT decision.
package enum RequestRefusal: String, Sendable, Hashable, CaseIterable {
    /// Another authority than the pins cover (421).
    case authorityMismatch = "authority-mismatch"
    /// Not a request the gate relays as it stands (400): no single authority, a target form
    /// or framing it refuses, bytes its parser rejected.
    case malformedRequest = "malformed-request"
    /// A classic CONNECT inside the tunnel (405).
    case methodNotAllowed = "method-not-allowed"
    /// A protocol switch the tunnel's upstream cannot carry, or one other than WebSocket (501).
    case upgradeUnsupported = "upgrade-unsupported"
    /// The upstream went away, or could not take the exchange (502).
    case upstreamUnreachable = "upstream-unreachable"
    /// The upstream answered, but broke its protocol (502).
    case upstreamProtocolError = "upstream-protocol-error"
    /// The upstream did not finish its set-up in time (504).
    case upstreamTimeout = "upstream-timeout"
    /// The client's bytes are not HTTP at all: the tunnel is refused as a whole.
    case notHTTP = "not-http"
}
