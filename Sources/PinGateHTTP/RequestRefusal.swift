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
    /// A header field longer than origins take by default (431): nginx drops the whole
    /// connection for one, which on a shared upstream connection cut other apps' exchanges.
    case headerTooLarge = "header-too-large"
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

    // A new upstream connection opened inside a tunnel (its pooled connection went) is
    // verified like a CONNECT's, and refused for the same reasons, answered in the tunnel:
    /// Its certificate matches none of the host's pins (502).
    case pinMismatch = "pin-mismatch"
    /// Its certificate or key was revoked by the list (502).
    case revoked = "revoked"
    /// The host has no unexpired pin any more (403).
    case empty = "empty"
    /// Its chain or host name failed validation (502).
    case chainInvalid = "chain-invalid"
    /// Its TLS handshake failed (502).
    case upstreamTLSFailed = "upstream-tls-failed"
    /// Its address is one the gate does not connect to (403).
    case destinationNotAllowed = "destination-not-allowed"
    /// No usable list is in force (503).
    case listUnavailable = "list-unavailable"
    /// The list in force has expired (503).
    case listExpired = "list-expired"
    /// The gate failed internally (500).
    case internalError = "internal-error"
}
