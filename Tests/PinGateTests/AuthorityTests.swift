import Testing
@testable import PinGateNIO

/// The one `host:port` parser/formatter and the one end-of-head scanner, with no sockets.
@Suite("Authority")
struct AuthorityTests {
    @Test("host:port, IPv4 and bracketed IPv6 parse; formatting brackets IPv6 again", arguments: [
        ("127.0.0.1:8080", "127.0.0.1", 8080, "127.0.0.1:8080"),
        ("gate.example.test:443", "gate.example.test", 443, "gate.example.test:443"),
        ("[::1]:9090", "::1", 9090, "[::1]:9090"),
        ("[2001:db8::7]:1", "2001:db8::7", 1, "[2001:db8::7]:1"),
    ])
    func parsesAndFormats(text: String, host: String, port: Int, formatted: String) throws {
        let authority = try Authority(parsing: text)
        #expect(authority.host == host)
        #expect(authority.port == port)
        #expect(authority.description == formatted)
    }

    @Test("malformed authorities are refused with the text named", arguments: [
        "", "host", "host:", ":443", "::1:443", "[::1]443", "[nothex]:443", "[::1:443", "host:+443", "host:44 3",
        "host:65536", "host:0", "host:000443",
    ])
    func refusesMalformed(text: String) {
        let error = #expect(throws: Authority.ParseError.self) { try Authority(parsing: text) }
        #expect(error?.description.contains("\"\(text)\"") == true, "\(String(describing: error))")
    }

    @Test("port 0 is accepted only where a range allows it (a listen address)")
    func portZero() throws {
        #expect(try Authority(parsing: "127.0.0.1:0", ports: 0...65535).port == 0)
        #expect(throws: Authority.ParseError.self) { try Authority(parsing: "127.0.0.1:0") }
    }
}
