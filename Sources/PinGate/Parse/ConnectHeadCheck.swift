import NIOHTTP1
import PinGateNIO
import PinGateTLS
import PinList

/// A parsed `CONNECT host:port HTTP/1.1` request.
public struct ConnectRequest: Sendable, Equatable {
    /// The normalized target host: lower case, no trailing dot, IPv6 without brackets.
    public let host: String
    /// The target port.
    public let port: Int
    /// True when `host` is an IPv4 or IPv6 literal.
    public let isIPLiteral: Bool

    /// `host:port`, with brackets around IPv6, as it would appear in a request line.
    public var authority: String {
        Authority(host: host, port: port).description
    }
}

/// Why a request head was turned away before any upstream work.
public struct HeadRejection: Error, Sendable, Equatable {
    /// The HTTP status to answer with.
    public let status: Int
    /// The machine-readable reason (`Pingate-Refusal`).
    public let reason: DecisionReason
    /// What went wrong, for the response body and the log.
    public let detail: String
    /// The refused head's method and target, when it had a request line (`GET
    /// http://example.com/`), printable ASCII and at most 160 characters: what was asked,
    /// for the refusal log of a head that named no CONNECT target.
    public var requestLine: String? = nil

    /// A rejection answered with `status`; `requestLine` as the head had it, if any.
    public init(status: Int, reason: DecisionReason, detail: String, requestLine: String? = nil) {
        self.status = status
        self.reason = reason
        self.detail = detail
        self.requestLine = requestLine
    }

    /// `method target` as the refusal log shows it: control and non-ASCII characters as
    /// `?`, cut at 160 characters (a client controls it; an operator reads it).
    static func shown(method: Substring, target: Substring) -> String {
        let text = String((method + " " + target).unicodeScalars.prefix(160).map { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?" })
        return method.count + 1 + target.count > 160 ? text + "…" : text
    }
}

/// The gate's checks on a proxy request head that NIOHTTP1's decoder (llhttp) has read
/// (`ConnectHeadHandler`): the parsing is llhttp's, strict as it is inside tunnels (lines
/// end in CRLF, names are tokens, one version, no obsolete line folding); what the gate
/// adds is what a CONNECT must be (RFC 9110 §9.3.6): the method CONNECT, HTTP/1.0 or
/// HTTP/1.1, and an authority-form target naming a host and a port.
enum ConnectHeadCheck {
    /// The CONNECT request `head` asks for, or why it is refused: 405 for any other method
    /// (plain HTTP cannot be pinned), 400 for another version or a target that is not
    /// `host:port`.
    static func check(_ head: HTTPRequestHead) -> Result<ConnectRequest, HeadRejection> {
        let method = Substring(head.method.rawValue)
        let target = Substring(head.uri)
        guard head.method == .CONNECT else {
            return .failure(HeadRejection(
                status: 405, reason: .methodNotAllowed,
                detail: "pingate forwards only HTTPS via CONNECT; plain HTTP (\(method)) cannot be pinned, so it is refused",
                requestLine: HeadRejection.shown(method: method, target: target)))
        }
        guard head.version == .http1_1 || head.version == .http1_0 else {
            return .failure(bad("unsupported protocol version \(head.version)"))
        }
        return parseAuthority(target).mapError {
            HeadRejection(status: $0.status, reason: $0.reason, detail: $0.detail, requestLine: HeadRejection.shown(method: method, target: target))
        }
    }

    /// Why a head the decoder could not read is refused: 431 when it was over
    /// `maximumHeadBytes`, else 400 naming llhttp's objection.
    static func rejection(for error: any Error, maximumHeadBytes: Int) -> HeadRejection {
        switch error as? HTTPParserError {
        case .headerOverflow?:
            let limit = maximumHeadBytes % 1024 == 0 ? "\(maximumHeadBytes / 1024) KiB" : "\(maximumHeadBytes) bytes"
            return HeadRejection(status: 431, reason: .headerTooLarge,
                                 detail: "the request head exceeds \(limit) (its target and header fields) or \(HTTPHeadLimits.maximumFields) fields")
        case .invalidVersion?:
            // NIO's own check: a request line's version must be HTTP/1.x (an HTTP/2 preface
            // sent in clear ends here).
            return bad("unsupported protocol version: the request line must end in HTTP/1.1 or HTTP/1.0")
        case let parserError?:
            return bad("the request head is not valid HTTP/1.1 (llhttp: \(parserError))")
        case nil:
            return bad("the request head could not be read (\(error))")
        }
    }

    /// Parses `host:port`, `[v6]:port`; validates names, IPv4 and IPv6 literals and the port
    /// (`HostAuthority`, the parser request authorities inside tunnels share).
    static func parseAuthority(_ authority: Substring) -> Result<ConnectRequest, HeadRejection> {
        switch HostAuthority.parse(authority) {
        case .success(let parsed):
            return .success(ConnectRequest(host: parsed.host, port: parsed.port, isIPLiteral: parsed.isIPLiteral))
        case .failure(let failure):
            return .failure(bad(failure.detail))
        }
    }

    private static func bad(_ detail: String) -> HeadRejection {
        HeadRejection(status: 400, reason: .badRequest, detail: detail)
    }
}
