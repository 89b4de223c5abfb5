import NIOHTTP1
import PropertyBased
import Testing
@testable import PinGateHTTP

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
        #expect(Array(fields.hosts) == ["pay.example.test"])
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
        #expect(Array(HTTP1HeadFields(HTTPHeaders([("Host", "a.test, b.test")])).hosts) == ["a.test", "b.test"])
        #expect(HTTP1HeadFields(HTTPHeaders([("Host", "a.test"), ("host", "b.test")])).hosts.count == 2)
        #expect(HTTP1HeadFields(HTTPHeaders([("Accept", "*/*")])).hosts.isEmpty)
        #expect(HTTP1ClientSide.target(method: .GET, uri: "/x", hosts: ["a.test", "b.test"]) == .noAuthority)
        #expect(HTTP1ClientSide.target(method: .GET, uri: "HTTPS://b.test:8443?q=1", hosts: ["a.test"])
            == .route(authority: "b.test:8443", path: "/?q=1"))
    }

    @Test("request targets: origin form, http(s) absolute form in any case, * for OPTIONS; every other scheme and form is refused")
    func targets() {
        let host = ["pay.test"]
        #expect(HTTP1ClientSide.target(method: .GET, uri: "/a?b", hosts: host) == .route(authority: "pay.test", path: "/a?b"))
        #expect(HTTP1ClientSide.target(method: .GET, uri: "hTTp://other.test/x", hosts: host) == .route(authority: "other.test", path: "/x"))
        #expect(HTTP1ClientSide.target(method: .OPTIONS, uri: "*", hosts: host) == .route(authority: "pay.test", path: "*"))
        for uri in ["ftp://other.test/", "ws://other.test/", "wss://other.test/chat", "WSS://other.test", "gopher://x/",
                    "file:///etc/passwd", "://other.test/", "https:///x", "https://#frag"] {
            guard case .refused = HTTP1ClientSide.target(method: .GET, uri: uri, hosts: host) else {
                Issue.record("\(uri) was not refused")
                continue
            }
        }
        for (method, uri) in [(HTTPMethod.GET, "*"), (.GET, "other.test:443"), (.POST, "x"), (.GET, "")] {
            guard case .refused = HTTP1ClientSide.target(method: method, uri: uri, hosts: host) else {
                Issue.record("\(method) \(uri) was not refused")
                continue
            }
        }
    }

    @Test("h2c and every upgrade token but WebSocket is connection-specific with its settings: HTTP2-Settings never crosses")
    func http2SettingsDropped() {
        let fields = HTTP1HeadFields(HTTPHeaders([("Connection", "Upgrade"), ("Upgrade", "h2c"),
                                                  ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"), ("Accept", "*/*")]))
        #expect(fields.endToEnd == HTTPHeaders([("Accept", "*/*")]))
        #expect(fields.upgrade == "h2c")
    }

    @Test("a head with nothing connection-specific is carried as it is")
    func untouched() {
        let headers = HTTPHeaders([("Content-Type", "text/plain"), ("Content-Length", "6"), ("ETag", "\"1\"")])
        #expect(HTTP1HeadFields(headers).endToEnd == headers)
    }

    /// The connection-specific names, as RFC 9110 §7.6.1 and RFC 9113 §8.2.2 list them,
    /// with `Host` and h2c's `HTTP2-Settings`: the reference the classifier is held to.
    static let connectionSpecific: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host", "te",
        "proxy-authorization", "proxy-authenticate", "http2-settings",
    ]

    @Test("property: a name is connection-specific exactly when the listed names hold it lower-cased, whatever its case (names near and far from the list)")
    func connectionSpecificAgreesWithTheList() async {
        for name in Self.connectionSpecific {
            #expect(HTTP1HeadFields.isConnectionSpecific(name) && HTTP1HeadFields.isConnectionSpecific(name.uppercased()), "\(name)")
        }
        #expect(!HTTP1HeadFields.isConnectionSpecific("content-length"))
        // Letters of the listed names, so that lengths and near misses both come up.
        let character = Gen.element(of: Array("tehosupgradcniklv-2TEHOSPXé")).compactMap { $0 }
        let listed = Gen.element(of: Self.connectionSpecific.sorted()).compactMap { $0 }
        await propertyCheck(count: 2000, input: character.string(of: 0...20), listed, Gen.int(in: 0...3)) { random, name, shape in
            // Half the cases start from a listed name, one letter changed or its case flipped.
            let candidate = switch shape {
            case 0: random
            case 1: name.uppercased()
            case 2: String(name.dropLast()) + random.prefix(1)
            default: name + random.prefix(1)
            }
            #expect(HTTP1HeadFields.isConnectionSpecific(candidate) == Self.connectionSpecific.contains(candidate.lowercased()),
                    "\(candidate.debugDescription)")
        }
    }

    @Test("property: the in-place case-insensitive comparison agrees with comparing lower-cased copies, on slices of longer text too")
    func equalsLowercasedAgreesWithLowercasing() async {
        let character = Gen.element(of: Array("contel-gHTPSsCONTEé ")).compactMap { $0 }
        let targets: [StaticString] = ["content-length", "https", "http", "te"]
        // A case: random text, or a target with each letter's case flipped by a bit of `flips`.
        await propertyCheck(count: 2000, input: character.string(of: 0...18), Gen.int(in: 0...3), Gen.int(in: 0...1),
                            Gen.int(in: 0...Int(UInt16.max))) { text, which, fromTarget, flips in
            let lowercased = targets[which]
            let target = String(describing: lowercased)
            let base = fromTarget == 0 ? text : String(target.enumerated().map { index, letter in
                flips >> (index % 16) & 1 == 1 ? Character(letter.uppercased()) : letter
            })
            let whole = "x" + base + "y"
            let slice = whole.dropFirst().dropLast()
            #expect(HTTP1HeadFields.equalsLowercased(slice, lowercased) == (slice.lowercased() == target), "\(slice.debugDescription)")
        }
        #expect(HTTP1HeadFields.equalsLowercased("Content-Length", "content-length"))
        #expect(!HTTP1HeadFields.equalsLowercased("Content-Lengths", "content-length"))
        #expect(!HTTP1HeadFields.equalsLowercased("Content_Length", "content-length"))
    }
}
