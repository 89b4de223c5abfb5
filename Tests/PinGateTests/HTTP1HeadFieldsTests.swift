import NIOHTTP1
import Testing
@testable import PinGate

/// The one-pass reading of an HTTP/1.1 head's fields: what each leg carries on, and what
/// the framing and `Connection` fields say. Sans-IO.
@Suite("HTTP/1.1 head fields")
struct HTTP1HeadFieldsTests {
    @Test("connection-specific fields and those Connection names are dropped, in any case; the rest keep their order")
    func endToEnd() {
        let fields = HTTP1HeadFields(HTTPHeaders([
            ("Host", "pay.example.test"), ("Connection", "keep-alive, X-Hop"), ("x-hop", "1"), ("Accept", "*/*"),
            ("Keep-Alive", "timeout=5"), ("TE", "trailers, deflate"), ("Content-Length", "5"), ("Proxy-Authorization", "x"),
            ("PROXY-CONNECTION", "keep-alive"), ("X-Keep", "2"), ("Transfer-Encoding", "chunked"),
        ]))
        #expect(fields.endToEnd.map { "\($0.name): \($0.value)" } == ["Accept: */*", "Content-Length: 5", "X-Keep: 2"])
        #expect(fields.wantsTrailers)
        #expect(fields.transferEncoding)
        #expect(fields.hasBody)
        #expect(fields.hosts == ["pay.example.test"])
        #expect(fields.upgrade == nil)
    }

    @Test("Upgrade counts only when Connection names it")
    func upgrade() {
        #expect(HTTP1HeadFields(HTTPHeaders([("Connection", "Upgrade"), ("Upgrade", "websocket")])).upgrade == "websocket")
        #expect(HTTP1HeadFields(HTTPHeaders([("connection", "keep-alive,upgrade"), ("upgrade", "h2c")])).upgrade == "h2c")
        #expect(HTTP1HeadFields(HTTPHeaders([("Upgrade", "websocket")])).upgrade == nil)
    }

    @Test("framing: no body without a non-zero Content-Length or a Transfer-Encoding")
    func framing() {
        #expect(!HTTP1HeadFields(HTTPHeaders([("Content-Length", "0")])).hasBody)
        #expect(!HTTP1HeadFields(HTTPHeaders([("Accept", "*/*")])).hasBody)
        #expect(HTTP1HeadFields(HTTPHeaders([("content-length", "12")])).hasBody)
    }

    @Test("Host: every authority it names counts (two fields, or a list in one, is not one Host)")
    func hosts() {
        #expect(HTTP1HeadFields(HTTPHeaders([("Host", "a.test, b.test")])).hosts == ["a.test", "b.test"])
        #expect(HTTP1HeadFields(HTTPHeaders([("Host", "a.test"), ("host", "b.test")])).hosts.count == 2)
        #expect(HTTP1HeadFields(HTTPHeaders([("Accept", "*/*")])).hosts.isEmpty)
        #expect(HTTP1ClientSide.splitTarget(uri: "/x", hosts: ["a.test", "b.test"]) == nil)
        let absolute = HTTP1ClientSide.splitTarget(uri: "HTTPS://b.test:8443?q=1", hosts: ["a.test"])
        #expect(absolute?.authority == "b.test:8443")
        #expect(absolute?.path == "/?q=1")
    }

    @Test("a head with nothing connection-specific is carried as it is")
    func untouched() {
        let headers = HTTPHeaders([("Content-Type", "text/plain"), ("Content-Length", "6"), ("ETag", "\"1\"")])
        #expect(HTTP1HeadFields(headers).endToEnd == headers)
    }
}
