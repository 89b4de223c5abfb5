import PinGateHTTP
import PinList

/// Why a CONNECT was allowed or refused: one case per reason, its raw value the token
/// that goes on the wire (`Pingate-Refusal`), into the decision log, the refusal log,
/// `/status` and `/metrics`. Code compares these cases, never the strings.
public enum DecisionReason: String, Sendable, Hashable, CaseIterable, Codable {
    /// A pin matched (and the chain and host name passed, unless pins-only).
    case trusted
    /// No pin matched, but the host's pins are report-only: allowed and reported.
    case reportOnlyViolation = "report-only-violation"
    /// A challenge-signed Wultra `domainsConfig` lets the host through without a pin; its
    /// chain and host name validated.
    case unpinnedAllowed = "unpinned-allowed"
    /// Learn mode: the host has no pin; its chain and host name validated, so it passes
    /// and what it presented is recorded.
    case learned
    /// The upstream's certificate matched none of the host's pins.
    case pinMismatch = "pin-mismatch"
    /// The upstream's certificate or key is on the list's revocation list.
    case revoked
    /// The host has no unexpired pin (deny by default; nothing was dialled).
    case empty
    /// The chain or host name failed validation.
    case chainInvalid = "chain-invalid"
    /// The request head was malformed (400).
    case badRequest = "bad-request"
    /// Not a CONNECT (405).
    case methodNotAllowed = "method-not-allowed"
    /// The head did not arrive in time (408).
    case requestTimeout = "request-timeout"
    /// The head was over the size limit (431).
    case headerTooLarge = "header-too-large"
    /// The upstream did not connect or finish its handshake in time (504).
    case upstreamTimeout = "upstream-timeout"
    /// The upstream could not be reached (502).
    case upstreamUnreachable = "upstream-unreachable"
    /// The upstream's TLS handshake failed (502).
    case upstreamTLSFailed = "upstream-tls-failed"
    /// Inside an admitted tunnel, the upstream was reached and answered, but broke the
    /// protocol it had agreed to: a WebSocket `101` whose `Sec-WebSocket-Accept` does not
    /// answer the key sent (RFC 6455 §4.1), so whatever follows it is not the WebSocket the
    /// request was checked for (502). Not `upstream-unreachable`: nothing failed to connect.
    case upstreamProtocolError = "upstream-protocol-error"
    /// The destination's address is never to be dialled (the gate itself; unspecified,
    /// multicast, broadcast) or is internal and came from DNS (403); nothing was dialled.
    case destinationNotAllowed = "destination-not-allowed"
    /// No usable list is in force (503).
    case listUnavailable = "list-unavailable"
    /// A verified list is in force but it has expired: every pin is past its expiry, or a
    /// v2 list is past its `expiresAt` (503). Fail closed, and say why.
    case listExpired = "list-expired"
    /// The gate itself failed (500).
    case internalError = "internal-error"
    /// A request inside an admitted tunnel named a host the tunnel's pins do not cover
    /// (421 Misdirected Request): domain fronting, refused.
    case authorityMismatch = "authority-mismatch"
    /// A request inside an admitted tunnel was malformed or ambiguous HTTP (a smuggling
    /// shape, a bad header, an HTTP/2 protocol error): refused, nothing forwarded.
    case malformedRequest = "malformed-request"
    /// A request inside an admitted tunnel asked to switch protocols (an HTTP/1.1 `Upgrade`,
    /// or an RFC 8441 extended CONNECT) in a way the tunnel's upstream connection cannot
    /// carry: an HTTP/2 upstream that did not advertise SETTINGS_ENABLE_CONNECT_PROTOCOL, or
    /// a protocol other than WebSocket that would have to change form. Refused (501),
    /// nothing forwarded.
    case upgradeUnsupported = "upgrade-unsupported"
    /// A client's first bytes inside an admitted tunnel were neither an HTTP/1.x request
    /// line nor the HTTP/2 preface (or not the protocol its ALPN named), and its host is not
    /// an opaque host: the tunnel was closed, nothing forwarded.
    case notHTTP = "not-http"
    /// The gate already holds as many connections as its descriptor limit leaves room for
    /// (two descriptors each, client and upstream, and a reserve kept free): the
    /// connection was answered 503 at once and closed, before its head was read.
    case overCapacity = "over-capacity"

    /// The reason a verdict stands for.
    public init(_ verdict: Verdict) {
        switch verdict {
        case .trusted: self = .trusted
        case .reportOnlyViolation: self = .reportOnlyViolation
        case .untrusted: self = .pinMismatch
        case .revoked: self = .revoked
        case .empty: self = .empty
        case .chainInvalid: self = .chainInvalid
        case .unpinnedAllowed: self = .unpinnedAllowed
        case .learned: self = .learned
        }
    }

    /// True for the reasons a tunnel is admitted on.
    public var isAllowed: Bool {
        self == .trusted || self == .reportOnlyViolation || self == .unpinnedAllowed || self == .learned
    }
}

extension DecisionReason {
    /// The reason the HTTP layer gave for a request it answered or ended itself: the same
    /// token, as the gate counts and reports it.
    init(_ refusal: RequestRefusal) {
        switch refusal {
        case .authorityMismatch: self = .authorityMismatch
        case .malformedRequest: self = .malformedRequest
        case .methodNotAllowed: self = .methodNotAllowed
        case .headerTooLarge: self = .headerTooLarge
        case .upgradeUnsupported: self = .upgradeUnsupported
        case .upstreamUnreachable: self = .upstreamUnreachable
        case .upstreamProtocolError: self = .upstreamProtocolError
        case .upstreamTimeout: self = .upstreamTimeout
        case .notHTTP: self = .notHTTP
        case .pinMismatch: self = .pinMismatch
        case .revoked: self = .revoked
        case .empty: self = .empty
        case .chainInvalid: self = .chainInvalid
        case .upstreamTLSFailed: self = .upstreamTLSFailed
        case .destinationNotAllowed: self = .destinationNotAllowed
        case .listUnavailable: self = .listUnavailable
        case .listExpired: self = .listExpired
        case .internalError: self = .internalError
        }
    }
}
