import PinGateHTTP
import Foundation
import NIOCore
import PinGateHTTP2
import PinGateNIO
import PinGateTLS

/// Everything the gate's listener and connections need, settled before start.
public struct GateConfiguration: Sendable {
    /// The address to listen on for CONNECT requests.
    public var listenHost: String = "127.0.0.1"
    /// The port to listen on (0 picks a free port; tests use that).
    public var listenPort: Int = 8080
    /// Roots that upstream chains must reach.
    public var upstreamTrust: TrustRoots = .system
    /// `--resolve` overrides, looked up by host and port.
    public var resolveOverrides: [ResolveOverride] = []
    /// Hosts whose pin alone decides; their chain and hostname errors are ignored.
    public var pinsOnlyHosts: Set<String> = []
    /// Learn mode (`run --learn`): hosts with no pin pass when their chain and host name
    /// validate, and what every admitted host presented is recorded in the state directory
    /// (`observations.json`) for `pingate list propose`. Learning, not enforcing.
    public var learning = false
    /// Hosts whose tunnels are relayed as bytes, not read as HTTP: for TLS protocols other
    /// than HTTP, by explicit choice. Every other tunnel's requests are bound to its host.
    public var opaqueHosts: Set<String> = []
    /// ALPN protocols offered upstream on the first connection.
    public var upstreamALPNOffer: [String] = ["h2", "http/1.1"]
    /// How long the client may take to send its request head (408 after).
    public var headTimeout: TimeAmount = .seconds(10)
    /// The largest request head accepted (431 beyond).
    public var maximumHeadBytes: Int = 16 * 1024
    /// How long the TCP connect to an upstream may take (504 after).
    public var upstreamConnectTimeout: TimeAmount = .seconds(10)
    /// How long the upstream TLS handshake may take (504 after).
    public var upstreamHandshakeTimeout: TimeAmount = .seconds(10)
    /// How long a client may take, after the `200`, to finish its TLS handshake with the
    /// minted leaf; past it both legs are closed (a quiet client must not hold an
    /// upstream TLS connection until the idle timeout).
    public var clientHandshakeTimeout: TimeAmount = .seconds(10)
    /// A tunnel with no traffic either way for this long is closed.
    public var idleTimeout: TimeAmount = .minutes(5)
    /// On a graceful shutdown (SIGTERM, SIGINT), how long open connections may take to
    /// finish after the listener closed; whatever is still open then is closed.
    public var drainTimeout: TimeAmount = .seconds(30)
    /// Whether CONNECT destinations whose address came from DNS may be loopback, private,
    /// link-local, CGNAT or IPv4-mapped (off: refused as `destination-not-allowed`).
    /// `--resolve` mappings and IP literals are not affected; the gate's own addresses and
    /// unspecified, multicast and broadcast addresses are refused whatever this says.
    public var allowPrivateDestinations = false
    /// Whether upstream TLS sessions are resumed. A session is kept only from a handshake
    /// that was verified and whose verdict trusted the server, only for the same name,
    /// port and address, and only until the list changes; a resumed connection is decided
    /// on again with the leaf and chain kept beside its session (see `TLSSessionCache`).
    public var upstreamSessionResumption = true
    /// A parent HTTP proxy that upstream connections go through (CONNECT), as in
    /// corporate networks. The pin check still applies end to end.
    public var upstreamProxy: ParentProxy?

    /// Where an `h2` upstream's round trip is read from for sizing its streams' windows:
    /// the TCP connection's own, unless a parent proxy is its peer.
    var upstreamRoundTripSource: UpstreamRoundTripSource { upstreamProxy == nil ? .tcp : .http2Ping }
    /// Where pin-failure reports are POSTed (TrustKit-style JSON); empty: no reports.
    public var reportURIs: [URL] = []
    /// Roots the report collectors' chains must reach.
    public var reportTrust: TrustRoots = .system
    /// The request log: one JSON line per HTTP request through a tunnel (off by default).
    public var requestLog: RequestLog.Destination = .off
    /// Whether the request log keeps query strings (off by default: queries often carry
    /// tokens and personal data).
    public var requestLogIncludesQuery = false
    /// The HTTP/2 limits both legs of a request-aware tunnel advertise and enforce:
    /// concurrent streams, header-list size (the HPACK-bomb cut-off), HPACK table size,
    /// stream and connection windows (how far a body may run ahead of the other leg).
    public var http2Limits = HTTP2Session.Limits()
    /// Whether upstream connections outlive their tunnels: kept idle after a request-aware
    /// tunnel ends and reused, without a handshake, by the next CONNECT to the same host
    /// (see `UpstreamPool`). Off: every tunnel opens and verifies its own.
    public var upstreamPoolEnabled = true
    /// How long a pooled upstream connection may wait idle before it is closed.
    public var upstreamPoolIdleTimeout: TimeAmount = .seconds(30)
    /// The most idle upstream connections kept per host (and port, SNI, address, parent proxy).
    public var upstreamPoolMaximumIdlePerHost = 16
    /// How long a CONNECT waits for another tunnel's `h2` dial to the same host to be shared
    /// before it dials for itself: enough for a dial across a 100 ms round trip and the
    /// first tunnel's client handshake with the gate, short enough that a dial that hangs
    /// (a black-holed origin) delays the others by no more than this.
    public var upstreamDialShareWait: TimeAmount = .milliseconds(250)
    /// How many days before a pin, the list, or a hash-pinned leaf certificate expires its
    /// host's pin health turns `expiring` (`pin-warning-days`; see `PinHealthBook`).
    public var pinWarningDays: Int = PinHealthBook.defaultWarningDays
    /// The event-loop thread count (default: one per CPU the process may use, its affinity
    /// mask and cgroup considered; see `UsableProcessors`).
    public var eventLoopThreads: Int = UsableProcessors.count

    /// The default configuration.
    public init() {}

    /// How upstream legs are dialled: timeouts, parent proxy, `--resolve` overrides.
    public var upstreamClientSettings: TLSClientSettings {
        var settings = TLSClientSettings()
        settings.connectTimeout = upstreamConnectTimeout
        settings.handshakeTimeout = upstreamHandshakeTimeout
        settings.parentProxy = upstreamProxy
        settings.resolveOverrides = resolveOverrides
        return settings
    }
}
