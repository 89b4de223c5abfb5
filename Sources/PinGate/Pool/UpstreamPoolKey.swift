import NIOCore
import PinGateHTTP
import PinGateTLS

/// What a pooled upstream connection must match to carry a new tunnel: everything that
/// went into making it and into the verdict on it, but the list (each entry carries the
/// list generation it was verified under, `UpstreamPoolState`).
struct UpstreamPoolKey: Hashable, Sendable, CustomStringConvertible {
    /// The CONNECT host, lowercased, without a trailing dot: the name the verdict is on.
    var host: String
    var port: Int
    /// The name sent as SNI and checked against the certificate (nil for an IP literal).
    var serverName: String?
    /// The address the connection was made to when it is fixed by configuration
    /// (`--resolve`); nil when DNS chose it (the connection keeps the address it was
    /// verified on, as nginx's keep-alive cache does, until it closes).
    var resolvedAddress: String?
    /// The parent proxy the connection goes through, if any.
    var parentProxy: String?
    /// The ALPN protocols offered in its handshake.
    var alpnOffer: [String]?

    var description: String { "\(host):\(port)" }

    /// The key for a CONNECT to `host:port` under `configuration`, offering `alpnOffer`.
    init(host: String, port: Int, configuration: GateConfiguration, alpnOffer: [String]?) {
        var name = host.lowercased()
        if name.hasSuffix(".") { name.removeLast() }
        self.host = name
        self.port = port
        // The connector sends no SNI for an IP literal; the name otherwise. (Told by
        // `inet_pton`, as `SocketAddress(ipAddress:)` does, without its two thrown errors
        // for every name.)
        self.serverName = IPAddressText.isIPLiteral(name) ? nil : name
        self.resolvedAddress = configuration.upstreamClientSettings.resolveOverride(host: host, port: port)
        self.parentProxy = configuration.upstreamProxy.map { "\($0)" }
        self.alpnOffer = alpnOffer
    }
}

/// Identifies one event loop: pooled connections are handed only to tunnels on their own
/// loop (a tunnel's two legs and its router share one loop, and a channel cannot move).
struct EventLoopID: Hashable, Sendable {
    private let id: ObjectIdentifier

    init(_ eventLoop: any EventLoop) {
        id = ObjectIdentifier(eventLoop)
    }
}

/// One stay of a connection in the pool, from park to take or close.
struct PooledConnectionID: Hashable, Sendable, Comparable {
    let rawValue: UInt64

    static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
}
