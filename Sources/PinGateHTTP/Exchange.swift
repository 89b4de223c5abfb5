import NIOCore
import NIOHTTP1

/// A request head as the two legs of a tunnel exchange it, whatever HTTP version either
/// leg speaks: HTTP/2's pseudo-headers and HTTP/1.1's request line and `Host` both map
/// onto it, so an HTTP/1.1 client can be served over an HTTP/2 upstream and the reverse.
struct ExchangeRequestHead: Equatable {
    /// `GET`, `POST`, … as sent.
    var method: String
    /// The origin-form target (`/path?query`); `*` for a server-wide OPTIONS.
    var path: String
    /// The authority as the client sent it (HTTP/1.1 `Host` or the absolute-form
    /// target's; HTTP/2 `:authority`, else `Host`); nil when it sent none.
    var authority: String?
    /// End-to-end header fields only: the connection-specific ones (RFC 9110 §7.6.1,
    /// RFC 9113 §8.2.2) and `Host` are not here; each leg adds what its version needs.
    var headers: HTTPHeaders
    /// The protocol the client asked this exchange to become, when it did, in either
    /// version's form: an HTTP/1.1 `Upgrade` (with `Connection: upgrade`; `method` as sent,
    /// `GET` for WebSocket), or an HTTP/2 extended CONNECT's `:protocol` (RFC 8441;
    /// `method` is then `CONNECT`). Once the upstream agrees, the exchange carries that
    /// protocol's bytes both ways. Each upstream side translates the form it cannot speak
    /// (for WebSocket, the only protocol with both forms) or says why it cannot.
    var upgrade: String?
    /// How the body is delimited on the way upstream: the router's decision
    /// (`RequestBodyFraming.decide`), set before the head reaches an upstream side, which
    /// writes its own version's framing from it and from nothing else.
    var framing: RequestBodyFraming = .none

    /// True for an RFC 8441 extended CONNECT (the HTTP/2 form of `upgrade`).
    var isExtendedConnect: Bool { method == "CONNECT" && upgrade != nil }
}

/// A response head, version-neutral as `ExchangeRequestHead` is.
struct ExchangeResponseHead: Equatable {
    /// The status code.
    var status: Int
    /// End-to-end header fields only.
    var headers: HTTPHeaders
    /// Set when the upstream agreed to the client's `upgrade`: the protocol switched to.
    /// The status is the upstream's own form of "yes" (`101` over HTTP/1.1, a `2xx` to an
    /// extended CONNECT over HTTP/2); the client side answers in its own form.
    var upgrade: String? = nil
    /// How the body is delimited on the way to the client: the router's decision
    /// (`ResponseBodyFraming.decide`), set before the head reaches a client side, which
    /// writes its own version's framing from it and from nothing else.
    var framing: ResponseBodyFraming = .none(advertisedLength: nil)
}

/// What one HTTP/1.1 head's fields say about framing and the connection, and its
/// end-to-end fields, read in one pass over the fields instead of one lookup per
/// question (each of NIO's `headers[canonicalForm:]` lookups scans every field and builds
/// an array): this runs for every request and every response a tunnel carries.
struct HTTP1HeadFields {
    /// The fields to carry to the other leg: without the connection-specific ones, and
    /// without those a `Connection` field names (RFC 9110 §7.6.1).
    var endToEnd: HTTPHeaders
    /// A `Transfer-Encoding` field is present.
    var transferEncoding = false
    /// A `Content-Length` other than `0` is present.
    var nonZeroContentLength = false
    /// The protocol an `Upgrade` field asks for, when `Connection` names `upgrade`.
    var upgrade: String?
    /// `te: trailers` was asked for (HTTP/2 carries it on).
    var wantsTrailers = false
    /// The `Host` fields, as sent (RFC 9112 §3.2: exactly one is valid).
    var hosts = ShortList<String>()

    /// True when the message has a body by its framing fields (a request without either
    /// has none, RFC 9112 §6.3).
    var hasBody: Bool { transferEncoding || nonZeroContentLength }

    /// Reads `headers` in one pass: each field is classified once, and carried on unless it
    /// is connection-specific. The fields a `Connection` field names are taken out after
    /// the pass (rare: the usual tokens, `keep-alive`, `close` and `upgrade`, name no
    /// field that is not dropped anyway).
    ///
    /// The carried fields go into an array that becomes `endToEnd` whole: `HTTPHeaders.add`
    /// scanned every name for non-ASCII bytes (about 7k instructions per keep-alive request
    /// on the HTTP/1.1 path), and these names were read by llhttp, which takes only tokens.
    init(_ headers: HTTPHeaders) {
        var carried: [(String, String)] = []
        carried.reserveCapacity(headers.count)
        var connectionNamesUpgrade = false
        var upgradeValue: String?
        var namedByConnection: [Substring] = []
        for (name, value) in headers {
            switch Self.known(name) {
            case .connection:
                for token in CommaSeparatedElements(value) where !token.isEmpty {
                    let token = token.trimmingASCIISpaces()
                    if Self.equalsLowercased(token, "upgrade") {
                        connectionNamesUpgrade = true
                    } else if !Self.equalsLowercased(token, "keep-alive") && !Self.equalsLowercased(token, "close") {
                        namedByConnection.append(token)
                    }
                }
            case .transferEncoding:
                transferEncoding = true
            case .contentLength:
                if value != "0" { nonZeroContentLength = true }
                carried.append((name, value))
            case .upgrade:
                if upgradeValue == nil { upgradeValue = value }
            case .te:
                if CommaSeparatedElements(value).contains(where: { Self.equalsLowercased($0.trimmingASCIISpaces(), "trailers") }) {
                    wantsTrailers = true
                }
            case .host:
                // `Host: a, b` is two authorities as much as two fields are. A value that
                // needs no trimming is kept as it is, not copied.
                for element in CommaSeparatedElements(value) {
                    let trimmed = element.trimmingASCIISpaces()
                    hosts.append(trimmed.startIndex == value.startIndex && trimmed.endIndex == value.endIndex ? value : String(trimmed))
                }
            case .otherConnectionSpecific:
                break
            case nil:
                carried.append((name, value))
            }
        }
        endToEnd = HTTPHeaders(carried)
        upgrade = connectionNamesUpgrade ? upgradeValue : nil
        for token in namedByConnection { endToEnd.remove(name: String(token)) }
    }

    private enum Known {
        case connection, transferEncoding, contentLength, upgrade, te, host, otherConnectionSpecific
    }

    /// The kind of a field name, compared byte by byte in place (no lowercased copy, no
    /// generic string comparison); nil for a field that is carried as it is.
    private static func known(_ name: String) -> Known? {
        if let kind = name.utf8.withContiguousStorageIfAvailable({ kind(of: $0) }) { return kind }
        return Array(name.utf8).withUnsafeBufferPointer { kind(of: $0) }
    }

    private static func kind(of name: UnsafeBufferPointer<UInt8>) -> Known? {
        switch name.count {
        case 2: return matches(name, "te") ? .te : nil
        case 4: return matches(name, "host") ? .host : nil
        case 7: return matches(name, "upgrade") ? .upgrade : nil
        case 10:
            if matches(name, "connection") { return .connection }
            return matches(name, "keep-alive") ? .otherConnectionSpecific : nil
        case 14:
            if matches(name, "content-length") { return .contentLength }
            return matches(name, "http2-settings") ? .otherConnectionSpecific : nil
        case 16: return matches(name, "proxy-connection") ? .otherConnectionSpecific : nil
        case 17: return matches(name, "transfer-encoding") ? .transferEncoding : nil
        case 18: return matches(name, "proxy-authenticate") ? .otherConnectionSpecific : nil
        case 19: return matches(name, "proxy-authorization") ? .otherConnectionSpecific : nil
        default: return nil
        }
    }

    /// `bytes` spell `lowercased` in any case (`lowercased` is lower-case ASCII).
    private static func matches(_ bytes: UnsafeBufferPointer<UInt8>, _ lowercased: StaticString) -> Bool {
        guard bytes.count == lowercased.utf8CodeUnitCount else { return false }
        let expected = UnsafeBufferPointer(start: lowercased.utf8Start, count: lowercased.utf8CodeUnitCount)
        for index in 0..<bytes.count {
            let byte = bytes[index]
            let lower = byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte
            if lower != expected[index] { return false }
        }
        return true
    }

    /// ASCII case-insensitive equality of `text` with `lowercased` (already lower case).
    ///
    /// Compared as bytes in place: `elementsEqual` over the two UTF-8 views stepped both
    /// through checked string indices, about 1,700 instructions for one `content-length`.
    static func equalsLowercased(_ text: Substring, _ lowercased: StaticString) -> Bool {
        if let equal = text.utf8.withContiguousStorageIfAvailable({ matches($0, lowercased) }) { return equal }
        return Array(text.utf8).withUnsafeBufferPointer { matches($0, lowercased) }
    }

    /// True for a field that describes one connection, not the message (RFC 9110 §7.6.1),
    /// and so is never carried from one leg to the other: `Connection`, `Keep-Alive`,
    /// `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, `TE` (HTTP/2 carries only
    /// `te: trailers`, which its caller handles apart), `Proxy-Authorization`,
    /// `Proxy-Authenticate`, h2c's `HTTP2-Settings` (RFC 7540 §3.2.1: meaningful only with an
    /// `Upgrade: h2c`, which the gate never passes on); plus `Host`, which each leg sets from
    /// the checked authority. In any case, found by length and bytes (`kind(of:)`, the one
    /// list of these names) without hashing: a `Set<String>` lookup hashed every field of
    /// every head.
    static func isConnectionSpecific(_ name: String) -> Bool {
        switch known(name) {
        case .te, .host, .upgrade, .connection, .transferEncoding, .otherConnectionSpecific: true
        case .contentLength, nil: false
        }
    }
}

/// The elements of a comma-separated field value (RFC 9110 §5.6.1), as they are between
/// the commas (untrimmed, empty ones included), read in place: `split` built an array for
/// each field it read, twice per keep-alive request (issue 32's malloc profile).
struct CommaSeparatedElements: Sequence, IteratorProtocol {
    private var rest: Substring
    private var done = false

    /// The elements of `value`.
    init(_ value: some StringProtocol) {
        rest = Substring(value)
    }

    mutating func next() -> Substring? {
        guard !done else { return nil }
        guard let comma = Self.firstComma(in: rest) else {
            done = true
            return rest
        }
        let element = rest[..<comma]
        // Past the comma's byte: `index(after:)` on the substring steps a whole
        // `Character`, which would take a combining mark after the comma with it.
        rest = rest[rest.utf8.index(after: comma)...]
        return element
    }

    /// Where the first comma of `text` is, searched in its bytes (the generic search over
    /// the UTF-8 view stepped a checked index per byte).
    private static func firstComma(in text: Substring) -> String.Index? {
        let offset = text.utf8.withContiguousStorageIfAvailable { $0.firstIndex(of: UInt8(ascii: ",")) }
            ?? Array(text.utf8).firstIndex(of: UInt8(ascii: ","))
        return offset.map { text.utf8.index(text.startIndex, offsetBy: $0) }
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (optional whitespace, RFC 9110 §5.6.3).
    ///
    /// A rule over bytes, on purpose: optional whitespace is octets (RFC 9110 §5.6.3), so a
    /// space before a combining mark is trimmed although the two make one `Character`
    /// (stepping through `Character`s, as before, also cost a grapheme breaking pass per
    /// step).
    func trimmingASCIISpaces() -> Substring {
        let bytes = utf8
        var start = bytes.startIndex
        var end = bytes.endIndex
        while start < end, bytes[start] == UInt8(ascii: " ") || bytes[start] == UInt8(ascii: "\t") {
            bytes.formIndex(after: &start)
        }
        while start < end {
            let last = bytes.index(before: end)
            guard bytes[last] == UInt8(ascii: " ") || bytes[last] == UInt8(ascii: "\t") else { break }
            end = last
        }
        return self[start..<end]
    }
}

/// One side of a request-aware tunnel, toward the client (the app behind the gate).
/// Implemented for HTTP/1.1 and HTTP/2; the router calls it on the tunnel's event loop.
protocol TunnelClientSide: AnyObject {
    /// Sends a response head for exchange `id` (informational heads may come first).
    func sendResponseHead(_ id: Int, _ head: ExchangeResponseHead, endStream: Bool)
    /// Sends response body bytes of exchange `id`.
    func sendResponseBody(_ id: Int, _ bytes: ByteBuffer)
    /// Ends the response of exchange `id`, with trailers if there are any.
    func endResponse(_ id: Int, trailers: HTTPHeaders?)
    /// Answers exchange `id` itself (a refusal), with `Pingate-Refusal: token` and a
    /// one-line text body; nothing of the request went upstream.
    func answer(_ id: Int, status: Int, refusal: String, detail: String)
    /// Abandons exchange `id` (HTTP/2: RST_STREAM; HTTP/1.1: the connection must close).
    func cancel(_ id: Int)
    /// Whether the protocol can refuse an exchange as not processed by anyone, in a form the
    /// client retries on a new connection (HTTP/2's REFUSED_STREAM); HTTP/1.1 has none, and
    /// the router answers with a 502 instead.
    var refusesUnprocessedStreams: Bool { get }
    /// Refuses exchange `id` as not processed (only asked when `refusesUnprocessedStreams`).
    func refuseUnprocessed(_ id: Int)
    /// Says `bytes` of exchange `id`'s request body have been passed on: the client may
    /// send that much more (HTTP/2 window, HTTP/1.1 reading resumes).
    func requestBodyPassedOn(_ id: Int, bytes: Int)
    /// Says `bytes` of exchange `id`'s request body wait at the upstream side behind another
    /// exchange (an HTTP/1.1 upstream carries one at a time): a multiplexing client may use
    /// that much of its connection window for its other streams meanwhile (their credit for
    /// the stream comes later, with `requestBodyPassedOn`). Without it, streams that wait hold
    /// the connection window the one being sent needs: a deadlock.
    func requestBodyQueued(_ id: Int, bytes: Int)
    /// Exchange `id`'s request, whose body has not ended, is the one its upstream connection
    /// sends now (an HTTP/1.1 upstream carries one at a time): an HTTP/2 client's stream gets
    /// its full window. It had a small one while it could be waiting behind another stream,
    /// where what it sent would wait in the gate; a small window on the stream being sent
    /// caps an upload at one window per round trip, or per delayed ACK of a client that
    /// leaves Nagle's algorithm on (issue 32: 8 MiB took 5.9 s, not 0.5 s).
    func openRequestWindow(_ id: Int)
    /// Writes out what was queued (called when the other side finished a read burst).
    func flush()
    /// Closes the client's connection once what was written is out.
    func close()
    /// The upstream connection is gone: closes the client's connection once every response
    /// the router has already passed on has reached the client, however long the client's
    /// own flow control makes that take (bounded by the idle timeout). Nothing new starts.
    func closeWhenAnswered()
}

/// One side of a request-aware tunnel, toward the upstream the verdict was made on.
/// Its `upgradeRefusal(for:)` says why a request asking for `head.upgrade` (HTTP/1.1
/// `Upgrade` or extended CONNECT) cannot be carried to this upstream, or nil when it can
/// (possibly translated to the upstream's own form); the router answers 501
/// `upgrade-unsupported` with the text. Its `reuseBlocker` says why this connection could not
/// carry another tunnel's exchanges from now on, or nil when it can: it is at a message
/// boundary (no exchange open either way), still speaks HTTP, and neither side has started
/// to close it.
protocol TunnelUpstreamSide: UpstreamConnectionFacts {
    /// Sends a request head; returns the id this side uses for the exchange.
    func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int
    /// Sends request body bytes of exchange `id`.
    func sendRequestBody(_ id: Int, _ bytes: ByteBuffer)
    /// Ends the request of exchange `id`, with trailers if there are any.
    func endRequest(_ id: Int, trailers: HTTPHeaders?)
    /// Abandons exchange `id`.
    func cancel(_ id: Int)
    /// Says `bytes` of exchange `id`'s response body have been passed on to the client.
    func responseBodyPassedOn(_ id: Int, bytes: Int)
    /// Writes out what was queued (called when the other side finished a read burst).
    func flush()
    /// Closes the upstream connection once what was written is out.
    func close()
    /// True when the connection can carry an HTTP/2 client's WebSocket extended CONNECT
    /// (RFC 8441): as one (an `h2` upstream that advertised SETTINGS_ENABLE_CONNECT_PROTOCOL),
    /// or translated to an HTTP/1.1 `Upgrade`.
    var carriesExtendedConnect: Bool { get }
    /// True once the connection switched protocols (HTTP/1.1 `101`): it carries the tunnel
    /// as a byte relay, and the tunnel ends with it rather than open another.
    var switchedProtocols: Bool { get }
    /// Detaches the side from its tunnel's router: the connection is parked. From here on
    /// anything the upstream sends but connection upkeep (HTTP/2 SETTINGS, PING) closes it.
    func park()
    /// Attaches a parked side to the router of the tunnel now admitted on its connection.
    func attach(to router: TunnelRouter)
    /// The router let go of this side (its connection went, or the tunnel left it for
    /// another): nothing the side reports from here on reaches the router, so an old
    /// connection's late report is never taken for the new one's, whose exchange numbers
    /// start again at 1 (issue 31).
    func detach()
}
