import NIOCore
import PinGateHTTP2
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

/// Frames on streams already used get their error (issue 31, item 7; h2spec 5.1/9,
/// 5.1/12, 5.1.1/2): written by hand, since no client library sends them.
@Suite("HTTP/2 frames on used streams")
struct UsedStreamFrameTests {
    static func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8] = []) -> [UInt8] {
        let length = UInt32(payload.count)
        return [UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF), type, flags,
                UInt8(stream >> 24 & 0x7F), UInt8(stream >> 16 & 0xFF), UInt8(stream >> 8 & 0xFF), UInt8(stream & 0xFF)] + payload
    }

    /// The client's SETTINGS, which must come first after the preface.
    static let settings = frame(type: 0x4, flags: 0, stream: 0)

    /// A GET for `/` on `stream`: static-table `:method GET`, `:scheme https`, `:path /`,
    /// and `:authority` as a literal without indexing (no dynamic-table state to share).
    static func get(stream: UInt32, endStream: Bool = true) -> [UInt8] {
        let block: [UInt8] = [0x82, 0x87, 0x84, 0x01, 0x10] + Array("pay.example.test".utf8)
        return frame(type: 0x1, flags: endStream ? 0x5 : 0x4, stream: stream, block)
    }

    /// The frames in `bytes`, as (type, stream, payload).
    static func frames(_ bytes: [UInt8]) -> [(type: UInt8, stream: UInt32, payload: [UInt8])] {
        var found: [(UInt8, UInt32, [UInt8])] = []
        var offset = 0
        while offset + 9 <= bytes.count {
            let length = Int(bytes[offset]) << 16 | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2])
            let stream = UInt32(bytes[offset + 5] & 0x7F) << 24 | UInt32(bytes[offset + 6]) << 16 | UInt32(bytes[offset + 7]) << 8 | UInt32(bytes[offset + 8])
            guard offset + 9 + length <= bytes.count else { break }
            found.append((bytes[offset + 3], stream, Array(bytes[offset + 9..<offset + 9 + length])))
            offset += 9 + length
        }
        return found
    }

    /// The error code of the GOAWAY in `bytes`, if one was sent.
    static func goAwayCode(_ bytes: [UInt8]) -> UInt32? {
        guard let goAway = frames(bytes).first(where: { $0.type == 0x7 }), goAway.payload.count >= 8 else { return nil }
        return goAway.payload[4..<8].reduce(0) { $0 << 8 | UInt32($1) }
    }

    /// True when a response HEADERS frame went out on `stream`.
    static func answered(_ bytes: [UInt8], stream: UInt32) -> Bool {
        frames(bytes).contains { $0.type == 0x1 && $0.stream == stream }
    }

    @Test("HEADERS on a stream that closed (answered, both ends ended) is a connection error STREAM_CLOSED, and nothing of it goes upstream")
    func headersAfterClose() throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        harness.deliver(Self.settings + Self.get(stream: 1))
        #expect(Self.answered(harness.written(), stream: 1))
        harness.deliver(Self.get(stream: 1))
        #expect(Self.goAwayCode(harness.written()) == 0x5)
        #expect(harness.requestsStarted == 1)
    }

    @Test("HEADERS on a stream the client reset itself is a connection error STREAM_CLOSED")
    func headersAfterClientReset() throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        harness.deliver(Self.settings + Self.get(stream: 1, endStream: false))
        harness.deliver(Self.frame(type: 0x3, flags: 0, stream: 1, [0, 0, 0, 0x8]))
        _ = harness.written()
        harness.deliver(Self.get(stream: 1))
        #expect(Self.goAwayCode(harness.written()) == 0x5)
    }

    @Test("DATA on a stream that closed (answered, both ends ended), or that the client reset itself, is a connection error STREAM_CLOSED (h2spec 5.1/11, 5.1/8), and nothing of it goes upstream",
          arguments: [false, true])
    func dataAfterClose(clientReset: Bool) throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        if clientReset {
            harness.deliver(Self.settings + Self.get(stream: 1, endStream: false))
            harness.deliver(Self.frame(type: 0x3, flags: 0, stream: 1, [0, 0, 0, 0x8]))
        } else {
            harness.deliver(Self.settings + Self.get(stream: 1))
            #expect(Self.answered(harness.written(), stream: 1))
        }
        _ = harness.written()
        harness.deliver(Self.frame(type: 0x0, flags: 0x1, stream: 1, Array("late".utf8)))
        #expect(Self.goAwayCode(harness.written()) == 0x5)
        #expect(harness.requestBodyBytesForwarded == 0)
    }

    @Test("DATA that crosses the gate's own RST_STREAM is let through: no GOAWAY, and the connection carries on")
    func dataAfterGateReset() throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        // A request whose content-length its body breaks: the gate resets the stream; the
        // client's next DATA for it was already on its way.
        let block: [UInt8] = [0x83, 0x87, 0x84, 0x01, 0x10] + Array("pay.example.test".utf8) + [0x0F, 0x0D, 0x01, 0x32]
        harness.deliver(Self.settings + Self.frame(type: 0x1, flags: 0x4, stream: 1, block)
                        + Self.frame(type: 0x0, flags: 0, stream: 1, Array("too long".utf8)))
        let written = harness.written()
        #expect(Self.frames(written).contains { $0.type == 0x3 && $0.stream == 1 }, "the gate reset stream 1")
        harness.deliver(Self.frame(type: 0x0, flags: 0x1, stream: 1, Array("more".utf8)) + Self.get(stream: 3))
        let after = harness.written()
        #expect(Self.goAwayCode(written + after) == nil)
        #expect(Self.answered(after, stream: 3))
        #expect(harness.isOpen)
    }

    @Test("HEADERS on a stream id lower than one already opened, never used itself, is a connection error PROTOCOL_ERROR")
    func lowerStreamID() throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        harness.deliver(Self.settings + Self.get(stream: 5))
        #expect(Self.answered(harness.written(), stream: 5))
        harness.deliver(Self.get(stream: 3))
        #expect(Self.goAwayCode(harness.written()) == 0x1)
        #expect(harness.requestsStarted == 1)
    }

    @Test("trailers that cross the gate's own RST_STREAM are let through: no GOAWAY, and the connection carries on")
    func trailersAfterGateReset() throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        // Stream 1's header list is over the gate's 16 KiB limit: nghttp2 resets it. Two
        // literal fields of 9,000 bytes, the block split over HEADERS and CONTINUATION.
        let field: [UInt8] = [0x00, 0x01, 0x61, 0x7F, 0xA9, 0x45] + [UInt8](repeating: 0x78, count: 9_000)
        let block: [UInt8] = [0x82, 0x87, 0x84, 0x01, 0x10] + Array("pay.example.test".utf8) + field + field
        let oversized = Self.frame(type: 0x1, flags: 0x1, stream: 1, Array(block[..<16_000]))
            + Self.frame(type: 0x9, flags: 0x4, stream: 1, Array(block[16_000...]))
        // In the same read, before the reset can have gone out: stream 3, then trailers the
        // client sent for stream 1 (it has not seen the reset), then stream 5.
        let trailers = Self.frame(type: 0x1, flags: 0x5, stream: 1, [0x00, 0x01, 0x78, 0x01, 0x79])
        harness.deliver(Self.settings + oversized + Self.get(stream: 3) + trailers + Self.get(stream: 5))
        let written = harness.written()
        #expect(Self.frames(written).contains { $0.type == 0x3 && $0.stream == 1 }, "the gate reset stream 1")
        #expect(Self.goAwayCode(written) == nil)
        #expect(Self.answered(written, stream: 3) && Self.answered(written, stream: 5))
        #expect(harness.isOpen)
    }

    @Test("a stream refused over the concurrent-streams limit, then a higher one opened in the same read after a slot freed: trailers for the refused one are let through, not taken for a skipped id")
    func trailersOnRefusedStream() throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        // 100 streams open (bodies to come), so stream 201 is refused; the client resets
        // stream 1, freeing a slot for 203; then the trailers it sent for 201.
        var bytes = Self.settings
        for stream in stride(from: UInt32(1), through: 199, by: 2) { bytes += Self.get(stream: stream, endStream: false) }
        bytes += Self.get(stream: 201, endStream: false)
        bytes += Self.frame(type: 0x3, flags: 0, stream: 1, [0, 0, 0, 0x8])
        bytes += Self.get(stream: 203)
        bytes += Self.frame(type: 0x1, flags: 0x5, stream: 201, [0x00, 0x01, 0x78, 0x01, 0x79])
        harness.deliver(bytes)
        let written = harness.written()
        #expect(Self.frames(written).contains { $0.type == 0x3 && $0.stream == 201 }, "stream 201 refused")
        #expect(Self.goAwayCode(written) == nil)
        #expect(Self.answered(written, stream: 203))
        #expect(harness.isOpen)
    }

    @Test("requests on rising stream ids, with trailers on an open stream, are all answered and end in no GOAWAY")
    func ordinaryStreamsPass() throws {
        let harness = try TunnelHarness(.http2, answer: .answering(statesLength: true))
        defer { harness.finish() }
        harness.deliver(Self.settings + Self.get(stream: 1) + Self.get(stream: 3, endStream: false))
        // Trailers: a second HEADERS on the open stream 3, ending it.
        harness.deliver(Self.frame(type: 0x1, flags: 0x5, stream: 3, [0x00, 0x01, 0x78, 0x01, 0x79]) + Self.get(stream: 7))
        let written = harness.written()
        #expect(Self.answered(written, stream: 1) && Self.answered(written, stream: 3) && Self.answered(written, stream: 7))
        #expect(Self.goAwayCode(written) == nil)
        #expect(harness.requestsStarted == 3)
    }
}
