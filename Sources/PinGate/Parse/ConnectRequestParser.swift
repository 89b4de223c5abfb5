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

/// A sans-IO parser for the proxy's request head: feed it bytes as they arrive and it
/// says when it has a CONNECT request, or why the head is refused.
///
/// Limits: the head may be at most `maximumHeadBytes` (answer 431 beyond); lines end in
/// CRLF (a bare LF is tolerated, as RFC 9112 §2.2 allows).
public struct ConnectRequestParser: Sendable {
    /// What one `feed` produced.
    public enum Outcome: Sendable, Equatable {
        /// The head is not complete yet.
        case needMoreBytes
        /// A complete CONNECT request; `leftover` are bytes that followed the head.
        case request(ConnectRequest, leftover: [UInt8])
        /// The head is refused; answer with the rejection's status and close.
        case rejected(HeadRejection)
    }

    /// The largest accepted request head, blank line included.
    public let maximumHeadBytes: Int
    private var buffer: [UInt8] = []
    private var scanner = HTTPHeadScanner()
    private var finished = false

    /// A parser accepting heads of at most `maximumHeadBytes` (16 KiB by default).
    public init(maximumHeadBytes: Int = 16 * 1024) {
        self.maximumHeadBytes = maximumHeadBytes
    }

    /// Adds `bytes` and reports whether the head is complete.
    public mutating func feed<Bytes: Collection>(_ bytes: Bytes) -> Outcome where Bytes.Element == UInt8 {
        guard !finished else { return .needMoreBytes }
        buffer.append(contentsOf: bytes)
        guard let (headEnd, bodyStart) = scanner.end(in: buffer).map({ ($0.headEnd, $0.bodyStart) }) else {
            if buffer.count > maximumHeadBytes { return finish(.rejected(Self.tooLarge)) }
            return .needMoreBytes
        }
        // The limit covers the whole head, blank line included.
        if bodyStart > maximumHeadBytes { return finish(.rejected(Self.tooLarge)) }
        let leftover = Array(buffer[bodyStart...])
        switch Self.parseHead(buffer[..<headEnd]) {
        case .success(let request): return finish(.request(request, leftover: leftover))
        case .failure(let rejection): return finish(.rejected(rejection))
        }
    }

    private static let tooLarge = HeadRejection(status: 431, reason: .headerTooLarge, detail: "the request head exceeds 16 KiB")

    private mutating func finish(_ outcome: Outcome) -> Outcome {
        finished = true
        buffer = []
        return outcome
    }

    /// Checks the head line by line over its bytes, in this order: every line is UTF-8,
    /// the request line is `METHOD TARGET HTTP/1.x` with a token method, every header line
    /// has a token name before its colon, the method is CONNECT, the target an authority.
    /// Bytes, not `Character`s: Swift takes "\r\n" as one `Character`, and a grapheme pass
    /// per byte cost more than the rest of a CONNECT's admission in Swift (issue 32: 71k
    /// instructions per connection, now a few thousand).
    static func parseHead(_ head: ArraySlice<UInt8>) -> Result<ConnectRequest, HeadRejection> {
        let lines = head.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).map { line in
            line.last == UInt8(ascii: "\r") ? line.dropLast() : line
        }
        for line in lines where !isUTF8(line) {
            return .failure(bad("the request head is not valid UTF-8"))
        }
        guard let requestLine = lines.first else { return .failure(bad("empty request")) }
        let parts = requestLine.split(separator: UInt8(ascii: " "), maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, parts[0].allSatisfy(isToken) else {
            return .failure(bad("the request line must be `METHOD TARGET HTTP/1.1`"))
        }
        guard parts[2].elementsEqual("HTTP/1.1".utf8) || parts[2].elementsEqual("HTTP/1.0".utf8) else {
            return .failure(bad("unsupported protocol version \(String(decoding: parts[2], as: UTF8.self))"))
        }
        for line in lines.dropFirst() where !line.isEmpty {
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon != line.startIndex,
                  line[..<colon].allSatisfy(isToken)
            else { return .failure(bad("malformed header line")) }
        }
        let method = Substring(String(decoding: parts[0], as: UTF8.self))
        let target = Substring(String(decoding: parts[1], as: UTF8.self))
        guard parts[0].elementsEqual("CONNECT".utf8) else {
            return .failure(HeadRejection(
                status: 405, reason: .methodNotAllowed,
                detail: "pingate forwards only HTTPS via CONNECT; plain HTTP (\(method)) cannot be pinned, so it is refused",
                requestLine: HeadRejection.shown(method: method, target: target)))
        }
        return parseAuthority(target).mapError {
            HeadRejection(status: $0.status, reason: $0.reason, detail: $0.detail, requestLine: HeadRejection.shown(method: method, target: target))
        }
    }

    /// True when `bytes` are UTF-8; ASCII (every CONNECT head a client sends) without
    /// building a string.
    private static func isUTF8(_ bytes: ArraySlice<UInt8>) -> Bool {
        bytes.allSatisfy { $0 < 0x80 } || String(validating: bytes, as: UTF8.self) != nil
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

    /// RFC 9110 §5.6.2's `tchar`.
    private static func isToken(_ byte: UInt8) -> Bool {
        if (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) { return true }
        return "!#$%&'*+-.^_`|~".utf8.contains(byte)
    }

    private static func bad(_ detail: String) -> HeadRejection {
        HeadRejection(status: 400, reason: .badRequest, detail: detail)
    }
}
