import NIOCore
import PinGateTLS

/// A `host:port` pair, the one parser and formatter for it: `name:port`, `1.2.3.4:port`
/// and `[v6]:port` in text; the host is kept without brackets.
public struct Authority: Sendable, Hashable, CustomStringConvertible {
    /// The host name or IP literal, IPv6 without brackets.
    public var host: String
    /// The port.
    public var port: Int

    /// Why a text is not an authority.
    public struct ParseError: Error, Sendable, Equatable, CustomStringConvertible {
        /// What was wrong, naming the text.
        public let description: String
    }

    /// An authority from its parts.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `HOST:PORT` or `[IPv6]:PORT`; the port must be in `ports`. A bracketed host
    /// must be an IPv6 literal, and an unbracketed one must not contain a colon.
    public init(parsing text: some StringProtocol, ports: ClosedRange<Int> = 1...65535) throws(ParseError) {
        let invalid = ParseError(description: "expected HOST:PORT or [IPv6]:PORT, got \"\(text)\"")
        guard let colon = text.lastIndex(of: ":") else { throw invalid }
        let portText = text[text.index(after: colon)...]
        // The one port rule (`PortText`): one to five ASCII digits.
        guard let port = PortText.value(portText.utf8) else { throw invalid }
        guard ports.contains(port) else {
            throw ParseError(description: "port \(port) in \"\(text)\" is out of range \(ports.lowerBound)-\(ports.upperBound)")
        }
        var host = text[..<colon]
        if host.hasPrefix("[") {
            guard host.hasSuffix("]") else { throw invalid }
            host = host.dropFirst().dropLast()
            guard IPAddressText.isIPLiteral(String(host)), host.utf8.contains(UInt8(ascii: ":")) else { throw invalid }
        } else if host.utf8.contains(UInt8(ascii: ":")) {
            throw invalid
        }
        guard !host.isEmpty else { throw invalid }
        self.host = String(host)
        self.port = port
    }

    /// The address of a connected peer, or nil for one that has no IP (a Unix socket).
    public init?(_ address: SocketAddress) {
        guard let ip = address.ipAddress, let port = address.port else { return nil }
        self.init(host: ip, port: port)
    }

    /// `host:port`, with IPv6 hosts bracketed.
    public var description: String {
        host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]:\(port)" : "\(host):\(port)"
    }
}
