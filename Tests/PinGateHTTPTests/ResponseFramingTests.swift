import NIOCore
import NIOEmbedded
import NIOHTTP1
import PropertyBased
import Testing
@testable import PinGateHTTP

/// The gate frames what it sends to clients (`ResponseBodyFraming`), with NIO's automatic
/// framing off: decided from the method and status, written by each version's rules, and
/// read back whole by a real HTTP/1.1 parser.
@Suite("Response framing")
struct ResponseFramingTests {
    private func head(_ status: Int, _ fields: [(String, String)] = [], upgrade: String? = nil) -> ExchangeResponseHead {
        ExchangeResponseHead(status: status, headers: HTTPHeaders(fields), upgrade: upgrade)
    }

    @Test("decided from the method and status: no body for 1xx, 204, 304 and HEAD (HEAD keeps its advertised length), a checked length, open without one, length 0 when the head ended it, nothing for a granted switch")
    func decisions() {
        func decide(_ method: String, _ head: ExchangeResponseHead, end: Bool = false) -> ResponseBodyFraming? {
            try? ResponseBodyFraming.decide(requestMethod: method, head: head, endStream: end).get()
        }
        #expect(decide("GET", head(200, [("content-length", "12")])) == .length(12))
        #expect(decide("GET", head(200, [("content-length", "12, 12")])) == .length(12))
        #expect(decide("GET", head(200)) == .open)
        #expect(decide("GET", head(200), end: true) == .length(0))
        #expect(decide("GET", head(204, [("content-length", "7")])) == .none(advertisedLength: nil))
        #expect(decide("GET", head(304, [("content-length", "7")])) == .none(advertisedLength: nil))
        #expect(decide("GET", head(103, [("link", "</a.css>")])) == .none(advertisedLength: nil))
        #expect(decide("HEAD", head(200, [("content-length", "7")])) == .none(advertisedLength: 7))
        #expect(decide("HEAD", head(200)) == .none(advertisedLength: nil))
        #expect(decide("GET", head(101, upgrade: "websocket")) == .switched)
        #expect(decide("CONNECT", head(200, [("content-length", "0")], upgrade: "websocket")) == .switched)
    }

    @Test("refused with what is wrong: a length that is not one decimal number, two that disagree, a stated length on an answer that ended with its head")
    func faults() {
        for fields in [[("content-length", "12x")], [("content-length", "-1")], [("content-length", "1"), ("content-length", "2")], [("content-length", "3, 4")]] {
            let result = ResponseBodyFraming.decide(requestMethod: "GET", head: head(200, fields), endStream: false)
            guard case .failure(let fault) = result else {
                Issue.record("\(fields) was framed: \(result)")
                continue
            }
            #expect(fault.detail.contains("content-length"))
        }
        let ended = ResponseBodyFraming.decide(requestMethod: "GET", head: head(200, [("content-length", "5")]), endStream: true)
        #expect((try? ended.get()) == nil)
    }

    @Test("toward HTTP/1.1 the gate's framing replaces the upstream's fields; an open body to an HTTP/1.0 client is ended by the close; toward HTTP/2 only a known length is stated")
    func fields() {
        var headers = HTTPHeaders([("x", "1"), ("content-length", "99"), ("transfer-encoding", "chunked")])
        #expect(!ResponseBodyFraming.open.applyHTTP1(to: &headers, version: .http1_1))
        #expect(headers == HTTPHeaders([("x", "1"), ("transfer-encoding", "chunked")]))
        #expect(ResponseBodyFraming.open.applyHTTP1(to: &headers, version: .http1_0))
        #expect(headers == HTTPHeaders([("x", "1")]))
        #expect(!ResponseBodyFraming.length(4).applyHTTP1(to: &headers, version: .http1_0))
        #expect(headers == HTTPHeaders([("x", "1"), ("content-length", "4")]))
        #expect(!ResponseBodyFraming.none(advertisedLength: nil).applyHTTP1(to: &headers, version: .http1_1))
        #expect(headers == HTTPHeaders([("x", "1")]))
        #expect(!ResponseBodyFraming.none(advertisedLength: 8).applyHTTP1(to: &headers, version: .http1_1))
        #expect(headers == HTTPHeaders([("x", "1"), ("content-length", "8")]))
        #expect(!ResponseBodyFraming.switched.applyHTTP1(to: &headers, version: .http1_1))
        #expect(headers == HTTPHeaders([("x", "1")]))
        var h2 = HTTPHeaders([("content-length", "99")])
        ResponseBodyFraming.open.applyHTTP2(to: &h2)
        #expect(h2.isEmpty)
        ResponseBodyFraming.length(3).applyHTTP2(to: &h2)
        #expect(h2 == HTTPHeaders([("content-length", "3")]))
        ResponseBodyFraming.switched.applyHTTP2(to: &h2)
        #expect(h2.isEmpty)
    }

    @Test("property: whatever framing fields an answer's head held (none, one matching, one other, repeated, any case, with transfer-encoding), the gate's framing leaves exactly its own, the other fields as they were and in order, and a head that already said exactly that unchanged")
    func framingFieldsProperty() async {
        // Each field: 0-3 another field, 4 content-length 5, 5 content-length 7, 6 Content-Length 5, 7 transfer-encoding.
        let fields = Gen.int(in: 0...7).array(of: 0...6)
        await propertyCheck(count: 400, input: fields, Gen.int(in: 0...6)) { codes, framingCode in
            let given = HTTPHeaders(codes.enumerated().map { index, code -> (String, String) in
                switch code {
                case 4: ("content-length", "5")
                case 5: ("content-length", "7")
                case 6: ("Content-Length", "5")
                case 7: ("transfer-encoding", "chunked")
                default: ("x-\(code)", "\(index)")
                }
            })
            let framing: ResponseBodyFraming = [.length(5), .length(7), .none(advertisedLength: nil), .none(advertisedLength: 5),
                                                 .open, .switched, .length(0)][framingCode]
            let others = given.filter { !["content-length", "transfer-encoding"].contains($0.name.lowercased()) }.map { "\($0.name)=\($0.value)" }
            for version in [HTTPVersion.http1_1, .http2] {
                var headers = given
                if version == .http2 { framing.applyHTTP2(to: &headers) } else { _ = framing.applyHTTP1(to: &headers, version: version) }
                let kept = headers.filter { !["content-length", "transfer-encoding"].contains($0.name.lowercased()) }.map { "\($0.name)=\($0.value)" }
                #expect(kept == others, "\(given) \(framing) \(version) → \(headers)")
                let lengths = headers[canonicalForm: "content-length"].map(String.init)
                let codings = headers[canonicalForm: "transfer-encoding"].map(String.init)
                let wanted: [String] = switch framing {
                case .length(let count), .none(advertisedLength: let count?): ["\(count)"]
                default: []
                }
                #expect(lengths == wanted, "\(given) \(framing) \(version) → \(headers)")
                if version == .http1_1 {
                    #expect(codings == (framing == .open ? ["chunked"] : []), "\(given) \(framing) → \(headers)")
                    let givenCodings = given[canonicalForm: "transfer-encoding"].count
                    let givenLengths = given[canonicalForm: "content-length"].map(String.init)
                    if givenCodings == 0 && givenLengths == wanted && framing != .open {
                        #expect(headers == given, "a head that already said \(framing) was rewritten: \(given) → \(headers)")
                    }
                }
            }
        }
    }

    /// One answer as an upstream gave it: the request's method, the status, what the
    /// upstream declared, and the body in the chunks it came in.
    struct Answer: CustomStringConvertible {
        var method: String
        var status: Int
        var declares: Bool
        var version: HTTPVersion
        var chunks: [Int]
        /// Stray framing fields the upstream's head carried (already checked by its parser,
        /// or connection-specific): the gate's own replace them.
        var strayLength: Bool

        init(_ codes: [Int]) {
            let first = codes.first ?? 0
            method = ["GET", "POST", "HEAD", "GET"][first % 4]
            status = [200, 201, 204, 206, 304, 404, 500, 200][(first / 4) % 8]
            declares = (first / 32) % 2 == 0
            version = (first / 64) % 3 == 0 ? .http1_0 : .http1_1
            strayLength = (first / 192) % 2 == 0
            chunks = codes.dropFirst().map { $0 % 3000 }
        }

        var bodyAllowed: Bool { method != "HEAD" && status != 204 && status != 304 }
        var bodyLength: Int { bodyAllowed ? chunks.reduce(0, +) : 0 }
        var description: String { "\(method) → \(status) declares=\(declares) \(version) chunks=\(chunks)" }
    }

    @Test("random answers, framed and written by the gate, are read back by NIO's HTTP/1.1 parser with exactly their body, ending where they end: at their length, their last chunk, or the close for an HTTP/1.0 client")
    func roundTrip() async throws {
        await propertyCheck(count: 300, input: Gen.int(in: 0...1_000_000).array(of: 1...12)) { codes in
            let answer = Answer(codes)
            do {
                try Self.check(answer)
            } catch {
                Issue.record("\(answer): \(error)")
            }
        }
    }

    private static func check(_ answer: Answer) throws {
        var fields = HTTPHeaders([("x-answer", "1")])
        if answer.declares { fields.add(name: "content-length", value: "\(answer.bodyLength)") }
        let upstreamHead = ExchangeResponseHead(status: answer.status, headers: fields)
        let framing = try ResponseBodyFraming.decide(requestMethod: answer.method, head: upstreamHead, endStream: false).get()
        var headers = upstreamHead.headers
        if answer.strayLength { headers.add(name: "transfer-encoding", value: "gzip, chunked") }
        let closes = framing.applyHTTP1(to: &headers, version: answer.version)

        // The gate's client leg: its own writer, as `HTTP1ClientSide` uses it.
        var meter = BodyLengthMeter(framing.expected)
        var body: [ByteBuffer] = []
        if answer.bodyAllowed {
            for count in answer.chunks where count > 0 {
                #expect(meter.add(count) == nil)
                body.append(ByteBuffer(repeating: 0x62, count: count))
            }
        }
        #expect(meter.end() == nil)
        let wire = HTTP1ResponseWriterTests.encode(version: answer.version, status: answer.status, headers: headers,
                                                   requestMethod: HTTPMethod(rawValue: answer.method), body: body, trailers: nil)

        // A client: NIO's HTTP/1.1 parser (llhttp), told the request's method as it sent it.
        let client = EmbeddedChannel()
        defer { _ = try? client.finish() }
        try client.pipeline.syncOperations.addHTTPClientHandlers()
        try client.writeOutbound(HTTPClientRequestPart.head(HTTPRequestHead(version: answer.version, method: HTTPMethod(rawValue: answer.method), uri: "/")))
        try client.writeOutbound(HTTPClientRequestPart.end(nil))
        try client.writeInbound(wire)
        var received = 0
        var ended = false
        var status: Int?
        func drain() throws {
            while let part = try client.readInbound(as: HTTPClientResponsePart.self) {
                switch part {
                case .head(let head): status = Int(head.status.code)
                case .body(let bytes): received += bytes.readableBytes
                case .end: ended = true
                }
            }
        }
        try drain()
        #expect(status == answer.status)
        if closes {
            // Only the close can end it, and only an HTTP/1.0 client with an open body.
            #expect(answer.version == .http1_0 && framing == .open)
            #expect(!ended)
            client.pipeline.fireChannelInactive()
            try drain()
        }
        #expect(ended, "the answer did not end for the client")
        #expect(received == answer.bodyLength, "the client read \(received) of \(answer.bodyLength) body bytes")
    }
}
