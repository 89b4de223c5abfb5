import NIOHTTP1

/// How the body of a request the gate forwards is delimited. Decided once per request, by
/// the gate, from what the client's parser (llhttp for HTTP/1.1, nghttp2 for HTTP/2) has
/// already checked; each upstream side then writes the framing for its own version from
/// this value alone, never from the client's framing fields as they came.
///
/// Why it matters: a `GET` with `Transfer-Encoding: chunked` used to reach an HTTP/1.1
/// upstream with its head stripped of the chunking (connection-specific) and nothing in its
/// place, so NIO's encoder, which frames a `GET` only when told to, wrote the decoded body
/// raw after the head. The origin read that body as a second request, which named a host
/// no pin covers: request smuggling past the authority binding.
enum RequestBodyFraming: Equatable, Sendable {
    /// No body: the request ended with its head.
    case none
    /// Exactly this many bytes: a `Content-Length` the client's parser checked against the
    /// framing (HTTP/1.1) or the DATA frames (HTTP/2). The router holds the body to it.
    case length(Int)
    /// A body whose length is known only at its end (HTTP/1.1 chunked; HTTP/2 DATA without
    /// `content-length`): chunked toward HTTP/1.1, DATA with END_STREAM toward HTTP/2.
    case open

    /// The framing for a request head that arrived with `headers` (its end-to-end fields,
    /// `content-length` among them), ended at once when `endStream`; or why the gate refuses
    /// to forward it (a 400: nothing of it goes upstream).
    ///
    /// - A request that ended with its head has no body, whatever it declared (HTTP/1.1
    ///   `Content-Length: 0`; an HTTP/2 head with END_STREAM).
    /// - `content-length` must be one decimal number (repeated fields must agree, RFC 9110
    ///   §8.6); anything else is refused.
    /// - `TRACE` must not carry content (RFC 9110 §9.3.8), and NIO's encoder would strip the
    ///   framing of one that did: refused rather than forwarded.
    static func decide(method: String, headers: HTTPHeaders, endStream: Bool) -> Result<RequestBodyFraming, RequestFramingRefusal> {
        // The gate frames the body itself (chunked toward HTTP/1.1, DATA toward h2): any
        // transfer coding but `chunked` alone would be dropped on the way, and the origin
        // would read the coded bytes as the content (RFC 9112 §6.1).
        let codings = headers["transfer-encoding"].flatMap { $0.split(separator: ",") }.map { $0.trimmingASCIISpaces().lowercased() }
        if !codings.isEmpty && codings != ["chunked"] {
            let text = headers["transfer-encoding"].joined(separator: ", ")
            return .failure(RequestFramingRefusal(detail: "transfer-encoding \"\(text)\" is not exactly chunked; the gate carries no other transfer coding (RFC 9112 §6.1)"))
        }
        let declared: Int?
        switch Self.declaredLength(headers) {
        case .success(let length): declared = length
        case .failure(let field):
            return .failure(RequestFramingRefusal(detail: "content-length \"\(field.value)\" is not one decimal length (RFC 9110 §8.6)"))
        }
        if endStream {
            guard declared == nil || declared == 0 else {
                return .failure(RequestFramingRefusal(detail: "the request declared content-length \(declared ?? 0) and ended with its head"))
            }
            return .success(.none)
        }
        if method == "TRACE" {
            return .failure(RequestFramingRefusal(detail: "a TRACE request carries no content (RFC 9110 §9.3.8); this one has a body"))
        }
        return .success(declared.map(RequestBodyFraming.length) ?? .open)
    }

    /// The length the `content-length` fields of `headers` state (nil when there are none),
    /// or the first field that does not state one: a list of one length repeated is that
    /// length (RFC 9110 §8.6), anything else is not. One reading for requests and answers.
    static func declaredLength(_ headers: HTTPHeaders) -> Result<Int?, UnreadableContentLength> {
        var declared: Int?
        // One pass over the fields, no arrays (`headers[name]` and `split` built one each,
        // three allocations per keep-alive request).
        for (name, field) in headers where name.utf8.count == 14 && HTTP1HeadFields.equalsLowercased(name[...], "content-length") {
            for value in CommaSeparatedElements(field) {
                guard let length = decimalLength(value), declared == nil || declared == length else {
                    return .failure(UnreadableContentLength(value: field))
                }
                declared = length
            }
        }
        return .success(declared)
    }

    /// The length a `Content-Length` value states: ASCII digits only (no sign, no spaces
    /// inside, no list), at most 18 of them so it cannot overflow.
    static func decimalLength(_ value: Substring) -> Int? {
        let digits = value.trimmingASCIISpaces()
        guard !digits.isEmpty, digits.utf8.count <= 18,
              digits.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return Int(digits)
    }

    /// The framing fields an HTTP/1.1 upstream gets for a request with `method`: the
    /// client's `content-length` is taken out of `headers` and the gate's own put in.
    /// A body-less `POST`, `PUT` or `PATCH` gets `Content-Length: 0` (RFC 9110 §8.6: a user
    /// agent sends it, so the server does not wait for content).
    func applyHTTP1(to headers: inout HTTPHeaders, method: String) {
        headers.removeIfPresent(name: "content-length")
        headers.removeIfPresent(name: "transfer-encoding")
        switch self {
        case .none:
            if Self.expectsContent(method) { headers.add(name: "content-length", value: "0") }
        case .length(let count):
            headers.add(name: "content-length", value: String(count))
        case .open:
            headers.add(name: "transfer-encoding", value: "chunked")
        }
    }

    /// The framing field an HTTP/2 upstream gets: `content-length` for a known length (so a
    /// server may check it, RFC 9113 §8.1.1), none otherwise: DATA frames and END_STREAM
    /// delimit the body.
    func applyHTTP2(to headers: inout HTTPHeaders) {
        headers.removeIfPresent(name: "content-length")
        if case .length(let count) = self { headers.add(name: "content-length", value: String(count)) }
    }

    /// Methods whose requests are expected to carry content.
    private static func expectsContent(_ method: String) -> Bool {
        switch method {
        case "POST", "PUT", "PATCH": return true
        default: return false
        }
    }
}

/// A `content-length` field that states no one length, as it came.
struct UnreadableContentLength: Error, Equatable, Sendable {
    var value: String
}

/// Why a request's framing was refused: the text of its 400.
struct RequestFramingRefusal: Error, Equatable, Sendable {
    /// What is wrong, for the client and the log.
    var detail: String
}

/// Keeps a forwarded body, request or response, to the length the gate framed it with:
/// counts the bytes as they pass and says when they break it (more than a stated length,
/// or an end short of it, or any byte for a message that has none). Sans-IO; the router
/// owns one per direction of an exchange.
struct BodyLengthMeter: Equatable, Sendable {
    /// What the framing says of the body's length.
    enum Expected: Equatable, Sendable {
        /// No body at all.
        case none
        /// Exactly this many bytes.
        case length(Int)
        /// Any length, known at its end.
        case open
    }

    /// The length being kept.
    let expected: Expected
    /// Body bytes passed so far.
    private(set) var passed = 0

    /// A meter for a body expected as `expected`.
    init(_ expected: Expected) {
        self.expected = expected
    }

    /// A meter for a request body framed as `framing`.
    init(_ framing: RequestBodyFraming) {
        switch framing {
        case .none: self.init(Expected.none)
        case .length(let count): self.init(Expected.length(count))
        case .open: self.init(Expected.open)
        }
    }

    /// `count` more bytes arrived: nil when they fit, else why they do not.
    mutating func add(_ count: Int) -> String? {
        passed += count
        switch expected {
        case .none:
            return "body bytes arrived for a message that has no body"
        case .length(let length) where passed > length:
            return "the body ran past its content-length \(length)"
        default:
            return nil
        }
    }

    /// The body ended: nil when that fits its framing, else why not.
    func end() -> String? {
        if case .length(let length) = expected, passed != length {
            return "the body ended after \(passed) of its content-length \(length) bytes"
        }
        return nil
    }
}

extension HTTPHeaders {
    /// `remove(name:)`, only when a field of that name is there: NIO's removal copies the
    /// fields whenever they are shared, even to remove nothing (an allocation per request
    /// for fields the gate built without them).
    mutating func removeIfPresent(name: String) {
        if contains(name: name) { remove(name: name) }
    }
}
