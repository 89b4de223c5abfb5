import NIOCore
import PinGateHTTP2
import PinGateTunnelHarness
import Testing

/// The client sides in an `EmbeddedChannel` (`TunnelHarness`, the one the fuzz targets
/// drive): the real codecs, side handler and router, a stub upstream, and the bytes the
/// side writes back read as a client would.
@Suite("The client sides in an embedded channel")
struct ClientSideTests {
    static func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

    @Test("HTTP/1.1: two GETs pipelined in one read are answered in order, each framed by the gate, and the connection stays")
    func pipelined() throws {
        let harness = try TunnelHarness(.http1, answer: .answering(statesLength: true))
        defer { harness.finish() }
        #expect(harness.deliver(Array("GET /a HTTP/1.1\r\nHost: pay.example.test\r\n\r\nGET /b HTTP/1.1\r\nHost: pay.example.test\r\n\r\n".utf8)))
        let answer = Self.text(harness.written())
        let one = "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nfuzz body\n"
        #expect(answer == one + one, "\(answer)")
        #expect(harness.requestsStarted == 2)
        #expect(harness.isOpen)
    }

    @Test("HTTP/1.1: an answer whose length the upstream did not state goes chunked to an HTTP/1.1 client, and to an HTTP/1.0 client that asked for keep-alive it says Connection: close and ends with the close")
    func openAnswer() throws {
        let current = try TunnelHarness(.http1, answer: .answering(statesLength: false))
        defer { current.finish() }
        current.deliver(Array("GET / HTTP/1.1\r\nHost: pay.example.test\r\n\r\n".utf8))
        #expect(Self.text(current.written()) == "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\nfuzz body\n\r\n0\r\n\r\n")
        #expect(current.isOpen)

        let old = try TunnelHarness(.http1, answer: .answering(statesLength: false))
        defer { old.finish() }
        old.deliver(Array("GET / HTTP/1.0\r\nHost: pay.example.test\r\nConnection: keep-alive\r\n\r\n".utf8))
        #expect(Self.text(old.written()) == "HTTP/1.0 200 OK\r\nconnection: close\r\n\r\nfuzz body\n")
        #expect(!old.isOpen, "only the close ends that body")
    }

    @Test("HTTP/1.1: a request for a host the tunnel's pins do not cover is answered 421 by the gate and never reaches the upstream; the connection carries on")
    func otherHost() throws {
        let harness = try TunnelHarness(.http1, answer: .answering(statesLength: true))
        defer { harness.finish() }
        harness.deliver(Array("GET / HTTP/1.1\r\nHost: evil.example.test\r\n\r\n".utf8))
        let answer = Self.text(harness.written())
        #expect(answer.hasPrefix("HTTP/1.1 421 Misdirected Request\r\n"), "\(answer)")
        #expect(answer.contains("pingate-refusal: authority-mismatch\r\n"), "\(answer)")
        #expect(harness.requestsStarted == 0)
        #expect(harness.isOpen)
    }

    @Test("HTTP/2: a request's answer carries the gate's framing, content-length only when the upstream stated one, and its body whole", arguments: [true, false])
    func http2Answer(statesLength: Bool) throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: statesLength))
        defer { harness.finish() }
        let client = try HTTP2Session(role: .client)
        let stream = try client.submitRequest([
            HTTP2HeaderField(":method", "GET"), HTTP2HeaderField(":scheme", "https"),
            HTTP2HeaderField(":authority", "pay.example.test"), HTTP2HeaderField(":path", "/"),
        ], endStream: true)
        // The harness sent the client preface already: the session's own goes first.
        #expect(harness.deliver(Array(try client.takeOutput().dropFirst(24))))
        var fields: [HTTP2HeaderField] = []
        var body: [UInt8] = []
        var ended = false
        try harness.written().withUnsafeBytes { raw in
            for event in try client.receive(raw) + client.takeEvents() {
                switch event {
                case .headers(stream, let received, let endStream):
                    fields += received
                    ended = ended || endStream
                case .data(stream, let bytes, let endStream):
                    // Ranges of `raw`, read while it is at hand.
                    body += bytes.bytes(in: raw)
                    ended = ended || endStream
                default:
                    break
                }
            }
        }
        #expect(fields.first == HTTP2HeaderField(":status", "200"), "\(fields)")
        #expect(fields.filter { $0.name == "content-length" }.map(\.value) == (statesLength ? ["10"] : []), "\(fields)")
        #expect(Self.text(body) == "fuzz body\n")
        #expect(ended)
        #expect(harness.requestsStarted == 1)
    }
}
