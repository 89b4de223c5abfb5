import NIOHTTP1
import Testing
@testable import PinGateHTTP

/// The gate decides how every forwarded request body is framed, from what the client's
/// parser checked, and holds the body to it: no socket, just the decisions.
@Suite("Request framing is the gate's")
struct RequestFramingTests {
    private func decide(_ method: String, _ headers: [(String, String)] = [], endStream: Bool) -> Result<RequestBodyFraming, RequestFramingRefusal> {
        RequestBodyFraming.decide(method: method, headers: HTTPHeaders(headers), endStream: endStream)
    }

    @Test("a body on any method is framed: a known length as such, anything else open (chunked toward HTTP/1.1)")
    func decisions() throws {
        for method in ["GET", "HEAD", "DELETE", "OPTIONS", "POST", "PUT", "PATCH", "PROPFIND", "FOO"] {
            #expect(try decide(method, endStream: false).get() == .open)
            #expect(try decide(method, [("content-length", "12")], endStream: false).get() == .length(12))
            #expect(try decide(method, endStream: true).get() == RequestBodyFraming.none)
            #expect(try decide(method, [("content-length", "0")], endStream: true).get() == RequestBodyFraming.none)
        }
        #expect(try decide("POST", [("content-length", "7"), ("Content-Length", "7")], endStream: false).get() == .length(7))
        #expect(try decide("POST", [("content-length", "7, 7")], endStream: false).get() == .length(7))
    }

    @Test("refused: a TRACE with a body, a content-length that is not one decimal number, a stated length with no body")
    func refusals() {
        #expect((try? decide("TRACE", endStream: false).get()) == nil)
        #expect((try? decide("TRACE", endStream: true).get()) == RequestBodyFraming.none)
        for value in ["-1", "1 2", "0x10", "", "+5", "99999999999999999999", "5,6", "5,"] {
            #expect((try? decide("POST", [("content-length", value)], endStream: false).get()) == nil, "\(value)")
        }
        #expect((try? decide("POST", [("content-length", "5"), ("content-length", "6")], endStream: false).get()) == nil)
        #expect((try? decide("POST", [("content-length", "5")], endStream: true).get()) == nil)
    }

    @Test("a transfer coding other than chunked alone is refused, since the gate would drop it; chunked in any case and spacing passes as an open body")
    func transferCodings() {
        for value in ["gzip, chunked", "chunked, chunked", "identity", "chunked;q=1", "gzip", "chunked, gzip", ", chunked, deflate"] {
            #expect((try? decide("POST", [("transfer-encoding", value)], endStream: false).get()) == nil, "\(value)")
        }
        #expect((try? decide("POST", [("transfer-encoding", "gzip"), ("transfer-encoding", "chunked")], endStream: false).get()) == nil)
        for value in ["chunked", "Chunked", " chunked\t"] {
            #expect((try? decide("POST", [("transfer-encoding", value)], endStream: false).get()) == .open, "\(value)")
        }
    }

    @Test("connection-bound authentication is seen whatever whitespace follows or leads its scheme")
    func connectionBoundAuthentication() {
        for value in ["NTLM TlRMTVNTUAAB", "NTLM\tTlRMTVNTUAAB", "Negotiate\tYIIB", " negotiate YIIB", "ntlm"] {
            #expect(TunnelRouterState.bindsConnection(HTTPHeaders([("authorization", value)])), "\(value)")
        }
        for value in ["Basic dXNlcjpwYXNz", "Bearer NTLM", "NTLMv2 x"] {
            #expect(!TunnelRouterState.bindsConnection(HTTPHeaders([("authorization", value)])), "\(value)")
        }
    }

    @Test("toward HTTP/1.1 the gate's framing replaces the client's; toward HTTP/2 only a known length is stated")
    func fields() {
        var headers = HTTPHeaders([("content-length", "99"), ("transfer-encoding", "chunked"), ("accept", "*/*")])
        RequestBodyFraming.open.applyHTTP1(to: &headers, method: "GET")
        #expect(headers == HTTPHeaders([("accept", "*/*"), ("transfer-encoding", "chunked")]))
        RequestBodyFraming.length(5).applyHTTP1(to: &headers, method: "GET")
        #expect(headers == HTTPHeaders([("accept", "*/*"), ("content-length", "5")]))
        RequestBodyFraming.none.applyHTTP1(to: &headers, method: "GET")
        #expect(headers == HTTPHeaders([("accept", "*/*")]))
        RequestBodyFraming.none.applyHTTP1(to: &headers, method: "POST")
        #expect(headers == HTTPHeaders([("accept", "*/*"), ("content-length", "0")]))
        var h2 = HTTPHeaders([("content-length", "99")])
        RequestBodyFraming.open.applyHTTP2(to: &h2)
        #expect(h2.isEmpty)
        RequestBodyFraming.length(3).applyHTTP2(to: &h2)
        #expect(h2 == HTTPHeaders([("content-length", "3")]))
    }

    @Test("the meter holds a body to its framing: past a stated length, short of it, or any byte for none")
    func meter() {
        var exact = BodyLengthMeter(RequestBodyFraming.length(10))
        #expect(exact.add(4) == nil)
        #expect(exact.add(6) == nil)
        #expect(exact.end() == nil)
        var over = BodyLengthMeter(RequestBodyFraming.length(10))
        #expect(over.add(11) != nil)
        var short = BodyLengthMeter(RequestBodyFraming.length(10))
        #expect(short.add(9) == nil)
        #expect(short.end() != nil)
        var none = BodyLengthMeter(RequestBodyFraming.none)
        #expect(none.add(1) != nil)
        var open = BodyLengthMeter(RequestBodyFraming.open)
        #expect(open.add(1 << 40) == nil)
        #expect(open.end() == nil)
    }
}
