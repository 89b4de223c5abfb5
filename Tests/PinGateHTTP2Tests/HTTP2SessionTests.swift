import Testing
@testable import PinGateHTTP2

/// The nghttp2 wrapper with no sockets: a client session and a server session exchange
/// bytes in memory, and the tests assert on the events each one reports.
@Suite("HTTP/2 session on nghttp2")
struct HTTP2SessionTests {
    static let request = [
        HTTP2HeaderField(":method", "GET"), HTTP2HeaderField(":scheme", "https"),
        HTTP2HeaderField(":authority", "pay.example.test"), HTTP2HeaderField(":path", "/account"),
    ]

    /// Moves bytes both ways until neither side has anything to send; returns what each saw.
    static func exchange(_ client: HTTP2Session, _ server: HTTP2Session) throws -> (client: [HTTP2Event], server: [HTTP2Event]) {
        var clientEvents: [HTTP2Event] = []
        var serverEvents: [HTTP2Event] = []
        for _ in 0..<20 {
            let toServer = try client.takeOutput()
            if !toServer.isEmpty { serverEvents += try toServer.withUnsafeBytes { try server.receive($0) } }
            let toClient = try server.takeOutput()
            if !toClient.isEmpty { clientEvents += try toClient.withUnsafeBytes { try client.receive($0) } }
            if toServer.isEmpty && toClient.isEmpty { break }
        }
        return (clientEvents, serverEvents)
    }

    /// The body bytes of `streamID` in `events`, and whether the stream ended.
    static func body(_ events: [HTTP2Event], stream streamID: Int32) -> ([UInt8], Bool) {
        var bytes: [UInt8] = []
        var ended = false
        for case .data(let id, let chunk, let end) in events where id == streamID {
            bytes += chunk
            ended = ended || end
        }
        return (bytes, ended)
    }

    @Test("a request and a response with a body cross intact; the stream closes cleanly on both ends")
    func requestAndResponse() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        let stream = try client.submitRequest(Self.request, endStream: true)
        #expect(stream == 1)
        let first = try Self.exchange(client, server)
        #expect(first.server.contains(.headers(streamID: 1, fields: Self.request, endStream: true)))

        let payload = Array((0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        try server.submitResponse(streamID: 1, [HTTP2HeaderField(":status", "200"), HTTP2HeaderField("content-type", "application/octet-stream")],
                                  endStream: false)
        try server.sendBody(streamID: 1, payload, endStream: true)
        let second = try Self.exchange(client, server)
        #expect(second.client.contains(.headers(streamID: 1, fields: [HTTP2HeaderField(":status", "200"),
                                                                      HTTP2HeaderField("content-type", "application/octet-stream")], endStream: false)))
        let (received, ended) = Self.body(second.client, stream: 1)
        #expect(received == payload)
        #expect(ended)
        #expect(second.client.contains(.streamClosed(streamID: 1, errorCode: 0)))
    }

    @Test("flow control is the owner's: the peer sends no more than the window until bytes are consumed")
    func flowControlFollowsConsumption() throws {
        var limits = HTTP2Session.Limits()
        limits.initialWindowSize = 16 * 1024
        limits.connectionWindowSize = 1 << 20
        let client = try HTTP2Session(role: .client, limits: limits)
        let server = try HTTP2Session(role: .server)
        _ = try client.submitRequest(Self.request, endStream: true)
        _ = try Self.exchange(client, server)
        try server.submitResponse(streamID: 1, [HTTP2HeaderField(":status", "200")], endStream: false)
        try server.sendBody(streamID: 1, [UInt8](repeating: 0x41, count: 100_000), endStream: true)

        let held = try Self.exchange(client, server)
        let (first, firstEnded) = Self.body(held.client, stream: 1)
        #expect(first.count == 16 * 1024, "exactly one window's worth arrives while nothing is consumed")
        #expect(!firstEnded)

        var total = first.count
        var ended = false
        for _ in 0..<20 where !ended {
            try client.consumed(streamID: 1, bytes: 16 * 1024)
            let more = try Self.exchange(client, server)
            let (bytes, end) = Self.body(more.client, stream: 1)
            #expect(bytes.count <= 16 * 1024)
            total += bytes.count
            ended = end
        }
        #expect(total == 100_000)
        #expect(ended)
    }

    @Test("a body that is not there yet is deferred, then sent when it arrives")
    func deferredBody() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        let stream = try client.submitRequest(Self.request, endStream: false)
        let before = try Self.exchange(client, server)
        #expect(before.server.contains(.headers(streamID: stream, fields: Self.request, endStream: false)))
        #expect(Self.body(before.server, stream: stream).0.isEmpty)
        try client.sendBody(streamID: stream, Array("part one, ".utf8), endStream: false)
        try client.sendBody(streamID: stream, Array("part two".utf8), endStream: true)
        let after = try Self.exchange(client, server)
        let (bytes, ended) = Self.body(after.server, stream: stream)
        #expect(String(decoding: bytes, as: UTF8.self) == "part one, part two")
        #expect(ended)
    }

    @Test("bytes that are not the client preface are a fatal error with nghttp2's reason, and a GOAWAY is queued")
    func badPreface() throws {
        let server = try HTTP2Session(role: .server)
        let garbage = Array("GET / HTTP/1.1\r\nHost: pay.example.test\r\n\r\n".utf8)
        let error = #expect(throws: HTTP2Error.self) { try garbage.withUnsafeBytes { try server.receive($0) } }
        #expect(error?.isFatal == true)
        #expect(error?.reason.lowercased().contains("magic") == true, "\(String(describing: error))")
    }

    @Test("a header block over the advertised limit does not reach the owner; the stream is refused")
    func oversizedHeaderBlock() throws {
        var limits = HTTP2Session.Limits()
        limits.maxHeaderListSize = 1024
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server, limits: limits)
        _ = try Self.exchange(client, server) // settle SETTINGS first, as a real client would
        let stream = try client.submitRequest(Self.request + [HTTP2HeaderField("x-filler", String(repeating: "z", count: 4000))], endStream: true)
        let result = try Self.exchange(client, server)
        #expect(!result.server.contains { if case .headers = $0 { return true } else { return false } },
                "no header block may be delivered")
        let closed = result.client.contains { event in
            if case .streamClosed(stream, let code) = event { return code != 0 }
            if case .goAway(_, let code) = event { return code != 0 }
            return false
        }
        #expect(closed, "the client sees its stream refused: \(result.client)")
    }

    @Test("a reset stream closes with its code on the other side; the connection stays usable")
    func resetAndReuse() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        let first = try client.submitRequest(Self.request, endStream: true)
        _ = try Self.exchange(client, server)
        try server.resetStream(first, errorCode: 7) // REFUSED_STREAM
        let reset = try Self.exchange(client, server)
        #expect(reset.client.contains(.streamClosed(streamID: first, errorCode: 7)))

        let second = try client.submitRequest(Self.request, endStream: true)
        #expect(second == 3)
        let next = try Self.exchange(client, server)
        #expect(next.server.contains(.headers(streamID: 3, fields: Self.request, endStream: true)))
    }

    @Test("the linked library reports its version")
    func version() {
        #expect(HTTP2Session.libraryVersion.split(separator: ".").count == 3)
    }
}
