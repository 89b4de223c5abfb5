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

    /// Parses `http://host:port` (or `host:port`, or `[v6]:port`).
    public init(parsing text: String) throws {
        var rest = Substring(text)
        if rest.lowercased().hasPrefix("http://") { rest = rest.dropFirst(7) }
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        do {
            let authority = try Authority(parsing: rest)
            self.init(host: authority.host, port: authority.port)
        } catch {
            throw ConfigurationError("--upstream-proxy expects http://HOST:PORT, got \"\(text)\"")
        }
    }
}

/// A configuration mistake, with a message for the operator.
public struct ConfigurationError: Error, CustomStringConvertible, Sendable {
    /// What is wrong and how to fix it.
    public let description: String

    /// Creates an error with `message`.
    public init(_ message: String) { description = message }
}
