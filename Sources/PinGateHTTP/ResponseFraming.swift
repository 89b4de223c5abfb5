import NIOHTTP1

/// How the body of a response the gate passes to a client is delimited: the mirror of
/// `RequestBodyFraming`. Decided once per response, by the router, from the request's
/// method, the status and what the upstream's parser (llhttp, nghttp2) has already checked;
/// each client side then writes its own version's framing from this value alone. The
/// origin's `Content-Length` is never passed through as it came, and NIO's automatic
/// framing is off, so what a client reads as the end of a body is what the gate measured.
///
/// Why it matters: with framing left to whatever fields arrived, an answer without a length
/// reached an HTTP/1.0 client that asked for keep-alive with nothing to end it (neither a
/// length nor a close), and a `Content-Length` on a `204` went through; an HTTP/2 client got
/// the origin's `content-length` on the word of the origin alone.
enum ResponseBodyFraming: Equatable, Sendable {
    /// No body follows: an informational, `204` or `304` answer, or one to `HEAD`. A `HEAD`
    /// answer may still advertise the length a `GET` would have had (RFC 9110 §9.3.2).
    case none(advertisedLength: Int?)
    /// Exactly this many bytes, checked by the upstream's parser; the router holds the body
    /// to it all the same.
    case length(Int)
    /// A body whose length is known only at its end: chunked toward an HTTP/1.1 client,
    /// delimited by the connection's close toward an HTTP/1.0 one, DATA with END_STREAM
    /// toward HTTP/2.
    case open
    /// The upstream agreed to switch protocols: what follows is the new protocol's bytes,
    /// framed by nothing of HTTP's.
    case switched

    /// The framing for response `head` to a request with `requestMethod`, ended at once when
    /// `endStream`; or why the gate will not pass it on (a 502 naming it).
    static func decide(requestMethod: String, head: ExchangeResponseHead, endStream: Bool) -> Result<ResponseBodyFraming, ResponseFramingFault> {
        if head.upgrade != nil { return .success(.switched) }
        let declared: Int?
        switch RequestBodyFraming.declaredLength(head.headers) {
        case .success(let length): declared = length
        case .failure(let field):
            return .failure(ResponseFramingFault(detail: "the upstream's content-length \"\(field.value)\" is not one decimal length (RFC 9110 §8.6)"))
        }
        // RFC 9110 §8.6 and §15: 1xx and 204 carry no length; a 304's would only repeat
        // what a 200 would have said, which a client has no use for here.
        if head.status < 200 || head.status == 204 || head.status == 304 { return .success(.none(advertisedLength: nil)) }
        if requestMethod == "HEAD" { return .success(.none(advertisedLength: declared)) }
        if endStream {
            guard declared == nil || declared == 0 else {
                return .failure(ResponseFramingFault(detail: "the upstream's answer declared content-length \(declared ?? 0) and ended with its head"))
            }
            return .success(.length(0))
        }
        return .success(declared.map(ResponseBodyFraming.length) ?? .open)
    }

    /// What a meter holds the body to.
    var expected: BodyLengthMeter.Expected {
        switch self {
        case .none: .none
        case .length(let count): .length(count)
        case .open, .switched: .open
        }
    }

    /// Writes the framing fields of an HTTP/1.1 (or 1.0) answer into `headers`, after
    /// taking out whatever framing fields they held.
    /// - Returns: true when the body can only be ended by closing the connection (an open
    ///   body to an HTTP/1.0 client, which knows no chunking): the answer must say
    ///   `Connection: close`, and the connection must close after it.
    func applyHTTP1(to headers: inout HTTPHeaders, version: HTTPVersion) -> Bool {
        let length: Int?
        switch self {
        case .none(let advertised):
            length = advertised
        case .length(let count):
            length = count
        case .open:
            Self.frame(&headers, length: nil, transferEncodingToo: true)
            guard version.major == 1 && version.minor >= 1 else { return true }
            headers.add(name: "transfer-encoding", value: "chunked")
            return false
        case .switched:
            length = nil
        }
        Self.frame(&headers, length: length, transferEncodingToo: true)
        return false
    }

    /// Writes the framing field of an HTTP/2 answer into `headers`: `content-length` for a
    /// known length (RFC 9113 §8.1.1), none otherwise, DATA and END_STREAM delimit the body.
    func applyHTTP2(to headers: inout HTTPHeaders) {
        switch self {
        case .none(advertisedLength: let advertised?), .length(let advertised):
            Self.frame(&headers, length: advertised, transferEncodingToo: false)
        default:
            Self.frame(&headers, length: nil, transferEncodingToo: false)
        }
    }

    /// Leaves `headers` with `content-length: length` as their one length field (none when
    /// nil) and, with `transferEncodingToo`, no `transfer-encoding`.
    ///
    /// When they already say exactly that (an origin's one `Content-Length`, which its
    /// parser checked and the router measured the body against, the usual case) they are
    /// left as they are: the head's fields are shared with the router's step that carried
    /// them, and taking a field out and putting its twin back copied the whole list, twice
    /// per keep-alive response (issue 32's malloc profile).
    private static func frame(_ headers: inout HTTPHeaders, length: Int?, transferEncodingToo: Bool) {
        let wanted = length.map { String($0) }
        var lengthFields = 0
        var lengthMatches = false
        var codingFields = 0
        for (name, value) in headers {
            switch name.utf8.count {
            case 14 where HTTP1HeadFields.equalsLowercased(name[...], "content-length"):
                lengthFields += 1
                lengthMatches = value == wanted
            case 17 where transferEncodingToo && HTTP1HeadFields.equalsLowercased(name[...], "transfer-encoding"):
                codingFields += 1
            default:
                break
            }
        }
        let alreadySo = codingFields == 0 && (wanted == nil ? lengthFields == 0 : lengthFields == 1 && lengthMatches)
        guard !alreadySo else { return }
        if lengthFields > 0 { headers.remove(name: "content-length") }
        if codingFields > 0 { headers.remove(name: "transfer-encoding") }
        if let wanted { headers.add(name: "content-length", value: wanted) }
    }
}

/// Why an upstream's answer cannot be framed for the client: the text of its 502.
struct ResponseFramingFault: Error, Equatable, Sendable {
    /// What is wrong, for the client and the log.
    var detail: String
}
