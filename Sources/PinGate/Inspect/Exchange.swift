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
}

/// Header fields that describe one connection, not the message (RFC 9110 §7.6.1), and so
/// are never carried from one leg to the other; plus `Host`, which each leg sets from
/// the checked authority. `te` is handled apart: HTTP/2 allows only `te: trailers`.
enum ConnectionSpecificHeaders {
    static let names: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host", "te",
        "proxy-authorization", "proxy-authenticate",
    ]

    /// `headers` without the connection-specific fields, and without the fields that a
    /// `Connection` header itself names. Names are compared without changing case (no
    /// string is built per field: this runs twice per exchange).
    static func endToEnd(_ headers: HTTPHeaders) -> HTTPHeaders {
        var result = headers
        for value in headers[canonicalForm: "connection"] { result.remove(name: String(value)) }
        for name in names where result.contains(name: name) { result.remove(name: name) }
        return result
    }

    /// True when `headers` ask for trailers (`te: trailers`), which HTTP/2 carries on.
    static func wantsTrailers(_ headers: HTTPHeaders) -> Bool {
        headers[canonicalForm: "te"].contains { $0.lowercased() == "trailers" }
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
    /// Says `bytes` of exchange `id`'s request body have been passed on: the client may
    /// send that much more (HTTP/2 window, HTTP/1.1 reading resumes).
    func requestBodyPassedOn(_ id: Int, bytes: Int)
    /// Writes out what was queued (called when the other side finished a read burst).
    func flush()
    /// Closes the client's connection once what was written is out.
    func close()
}

/// One side of a request-aware tunnel, toward the upstream the verdict was made on.
protocol TunnelUpstreamSide: AnyObject {
    /// Why a request asking for `head.upgrade` (HTTP/1.1 `Upgrade` or extended CONNECT)
    /// cannot be carried to this upstream, or nil when it can (possibly translated to the
    /// upstream's own form). The router answers 501 `upgrade-unsupported` with the text.
    func upgradeRefusal(for head: ExchangeRequestHead) -> String?
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
}
