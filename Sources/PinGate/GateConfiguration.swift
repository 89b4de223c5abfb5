import Foundation
import NIOCore
import PinGateTLS

/// A curl-style `--resolve host:port:address` override: connect to `address` whenever
/// the target is `host:port`, keeping `host` for SNI, hostname checks and pins.
public struct ResolveOverride: Sendable, Hashable {
    /// The normalized host name.
    public let host: String
    /// The port the override applies to.
    public let port: Int
    /// The IP address to connect to instead of resolving.
    public let address: String

    /// Parses `host:port:address` (IPv6 addresses may be bracketed).
    public init(parsing text: String) throws {
        let parts = text.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, let port = Int(parts[1]), (1...65535).contains(port) else {
            throw ConfigurationError("--resolve expects HOST:PORT:ADDRESS, got \"\(text)\"")
        }
        var address = String(parts[2])
        if address.hasPrefix("[") && address.hasSuffix("]") { address = String(address.dropFirst().dropLast()) }
        guard IPAddressText.isIPLiteral(address) else {
            throw ConfigurationError("--resolve address must be an IP address, got \"\(address)\"")
        }
        self.host = String(parts[0]).lowercased()
        self.port = port
        self.address = address
    }
}

/// A parent HTTP proxy: `http://host:port`.
public struct ParentProxy: Sendable, Equatable {
    /// Its host name or IP.
    public let host: String
    /// Its port.
    public let port: Int

    /// Creates a parent proxy address.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `http://host:port` (or `host:port`).
    public init(parsing text: String) throws {
        var rest = Substring(text)
        if rest.lowercased().hasPrefix("http://") { rest = rest.dropFirst(7) }
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        guard let colon = rest.lastIndex(of: ":"), let port = Int(rest[rest.index(after: colon)...]), (1...65535).contains(port) else {
            throw ConfigurationError("--upstream-proxy expects http://HOST:PORT, got \"\(text)\"")
        }
        var host = String(rest[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { throw ConfigurationError("--upstream-proxy expects http://HOST:PORT, got \"\(text)\"") }
        self.host = host
        self.port = port
    }
}

/// A configuration mistake, with a message for the operator.
public struct ConfigurationError: Error, CustomStringConvertible, Sendable {
    /// What is wrong and how to fix it.
    public let description: String

    /// Creates an error with `message`.
    public init(_ message: String) { description = message }
}

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
    /// A tunnel with no traffic either way for this long is closed.
    public var idleTimeout: TimeAmount = .minutes(5)
    /// A parent HTTP proxy that upstream connections go through (CONNECT), as in
    /// corporate networks. The pin check still applies end to end.
    public var upstreamProxy: ParentProxy?
    /// Where pin-failure reports are POSTed (TrustKit-style JSON); empty: no reports.
    public var reportURIs: [URL] = []
    /// Roots the report collectors' chains must reach.
    public var reportTrust: TrustRoots = .system
    /// The event-loop thread count (default: one per core).
    public var eventLoopThreads: Int = System.coreCount

    /// The default configuration.
    public init() {}

    /// The override for `host:port`, if any.
    func resolveOverride(host: String, port: Int) -> String? {
        resolveOverrides.first { $0.host == host && $0.port == port }?.address
    }
}
