import NIOHTTP1
import PinGateHTTP2
import Testing
@testable import PinGateHTTP

/// The field mapping between an HTTP/2 header block and HTTP/1.1 headers, both ways.
/// Sans-IO: the router's bridging (h1 ↔ h2) carries every head through it.
@Suite("HTTP/2 wire: header mapping")
struct HTTP2WireHeaderMappingTests {
    @Test("h2 → h1: pseudo-fields and connection-specific fields are dropped, te only as trailers, split cookies joined, the rest in order")
    func toHTTP1() {
        let headers = HTTP2Wire.headers([
            HTTP2HeaderField(":status", "200"), HTTP2HeaderField("content-type", "text/plain"),
            HTTP2HeaderField("cookie", "a=1"), HTTP2HeaderField("connection", "close"), HTTP2HeaderField("keep-alive", "5"),
            HTTP2HeaderField("te", "trailers"), HTTP2HeaderField("cookie", "b=2"), HTTP2HeaderField("transfer-encoding", "chunked"),
            HTTP2HeaderField("upgrade", "h2c"), HTTP2HeaderField("host", "x.test"), HTTP2HeaderField("proxy-connection", "keep-alive"),
            HTTP2HeaderField("proxy-authorization", "Basic eA=="), HTTP2HeaderField("proxy-authenticate", "Basic"),
            HTTP2HeaderField("http2-settings", "AAMAAABk"), HTTP2HeaderField("content-length", "5"), HTTP2HeaderField("x-te", "1"),
        ])
        #expect(headers.map { "\($0.name): \($0.value)" } ==
                ["content-type: text/plain", "te: trailers", "content-length: 5", "x-te: 1", "cookie: a=1; b=2"])
        #expect(HTTP2Wire.headers([HTTP2HeaderField("te", "gzip")]).isEmpty)
        // Made whole from pairs, the headers are what NIO's `add`, field by field, made.
        var added = HTTPHeaders()
        added.add(name: "x", value: "1")
        added.add(name: "cookie", value: "a=1")
        #expect(HTTP2Wire.headers([HTTP2HeaderField("x", "1"), HTTP2HeaderField("cookie", "a=1")]) == added)
    }

    @Test("h1 → h2: names lower-cased, connection-specific fields dropped in any case, te only as trailers")
    func toHTTP2() {
        let fields = HTTP2Wire.fields(HTTPHeaders([
            ("Content-Type", "text/plain"), ("Connection", "close"), ("TE", "Trailers"), ("Keep-Alive", "5"),
            ("Transfer-Encoding", "chunked"), ("HOST", "x.test"), ("Proxy-Authorization", "x"), ("X-Keep", "1"),
        ]))
        #expect(fields == [HTTP2HeaderField("content-type", "text/plain"), HTTP2HeaderField("te", "Trailers"),
                           HTTP2HeaderField("x-keep", "1")])
        #expect(HTTP2Wire.fields(HTTPHeaders([("TE", "gzip")])).isEmpty)
    }
}
