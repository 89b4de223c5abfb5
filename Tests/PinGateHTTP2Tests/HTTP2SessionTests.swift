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
            if !toServer.isEmpty { serverEvents += try toServer.withUnsafeBytes { try resolved(server.receive($0), in: $0) } }
            let toClient = try server.takeOutput()
            if !toClient.isEmpty { clientEvents += try toClient.withUnsafeBytes { try resolved(client.receive($0), in: $0) } }
            if toServer.isEmpty && toClient.isEmpty { break }
        }
        return (clientEvents, serverEvents)
    }

    /// `events` with DATA bytes copied out of the receive buffer `input` (it is gone after).
    static func resolved(_ events: [HTTP2Event], in input: UnsafeRawBufferPointer) -> [HTTP2Event] {
        events.map { event in
            guard case .data(let id, let bytes, let end) = event else { return event }
            return .data(streamID: id, bytes: .copied(bytes.bytes(in: input)), endStream: end)
        }
    }

    /// The frames in `bytes` as (type, stream id, the first 8 payload bytes), read from
    /// their 9-byte headers (RFC 9113 §4.1); a leading client preface is skipped.
    static func frames(_ bytes: [UInt8]) -> [(type: UInt8, streamID: UInt32, payload: [UInt8])] {
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
        var index = bytes.starts(with: preface) ? preface.count : 0
        var result: [(UInt8, UInt32, [UInt8])] = []
        while index + 9 <= bytes.count {
            let length = Int(bytes[index]) << 16 | Int(bytes[index + 1]) << 8 | Int(bytes[index + 2])
            let stream = UInt32(bytes[index + 5] & 0x7F) << 24 | UInt32(bytes[index + 6]) << 16
                | UInt32(bytes[index + 7]) << 8 | UInt32(bytes[index + 8])
            let payloadStart = index + 9
            result.append((bytes[index + 3], stream, Array(bytes[payloadStart..<min(bytes.count, payloadStart + min(length, 8))])))
            index = payloadStart + length
        }
        return result
    }

    /// The body bytes of `streamID` in `events`, and whether the stream ended.
    static func body(_ events: [HTTP2Event], stream streamID: Int32) -> ([UInt8], Bool) {
        var bytes: [UInt8] = []
        var ended = false
        for case .data(let id, .copied(let chunk), let end) in events where id == streamID {
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

    @Test("header blocks laid out in the session's kept scratch, one after another, small, growing, larger than it keeps, and empty-valued, each arrive exactly as submitted")
    func headerBlocksThroughScratch() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        var submitted: [(Int32, [HTTP2HeaderField])] = []
        // Fields from a few bytes to past NameValueScratch.keptBytes, and past keptPairs.
        for (index, size) in [10, 300, 40, 1_500, 5_000, 20, 0].enumerated() {
            var fields = Self.request + [HTTP2HeaderField("x-size", String(repeating: "v", count: size)), HTTP2HeaderField("x-index", "\(index)")]
            if index == 4 { fields += (0..<40).map { HTTP2HeaderField("x-many-\($0)", "\($0)") } }
            let stream = try client.submitRequest(fields, endStream: true)
            submitted.append((stream, fields))
            let events = try Self.exchange(client, server).server
            #expect(events.contains(.headers(streamID: stream, fields: fields, endStream: true)), "block \(index)")
        }
        #expect(submitted.map(\.0) == [1, 3, 5, 7, 9, 11, 13])
    }

    @Test("the scratch keeps what fits (growing in steps) and declines a block larger than it keeps")
    func scratchBounds() {
        var scratch = NameValueScratch()
        defer { scratch.release() }
        #expect(scratch.claim(bytes: 100, pairs: 5) != nil && scratch.inUse)
        scratch.inUse = false
        #expect(scratch.claim(bytes: NameValueScratch.keptBytes, pairs: NameValueScratch.keptPairs) != nil)
        scratch.inUse = false
        #expect(scratch.claim(bytes: NameValueScratch.keptBytes + 1, pairs: 1) == nil && !scratch.inUse)
        #expect(scratch.claim(bytes: 1, pairs: NameValueScratch.keptPairs + 1) == nil && !scratch.inUse)
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

    @Test("a 100 Continue, a body and trailers cross in order; the stream ends with the trailers")
    func informationalAndTrailers() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        _ = try client.submitRequest(Self.request + [HTTP2HeaderField("te", "trailers")], endStream: true)
        _ = try Self.exchange(client, server)
        try server.submitInformational(streamID: 1, [HTTP2HeaderField(":status", "100")])
        try server.submitResponse(streamID: 1, [HTTP2HeaderField(":status", "200")], endStream: false)
        try server.sendBody(streamID: 1, Array("body".utf8), endStream: true, trailers: [HTTP2HeaderField("grpc-status", "0")])
        let events = try Self.exchange(client, server).client
        let heads = events.compactMap { event -> [HTTP2HeaderField]? in
            if case .headers(1, let fields, _) = event { return fields }
            return nil
        }
        #expect(heads == [[HTTP2HeaderField(":status", "100")], [HTTP2HeaderField(":status", "200")],
                          [HTTP2HeaderField("grpc-status", "0")]])
        #expect(events.contains(.headers(streamID: 1, fields: [HTTP2HeaderField("grpc-status", "0")], endStream: true)))
        #expect(Self.body(events, stream: 1) == (Array("body".utf8), false), "the DATA frame does not end the stream")
        #expect(events.contains(.streamClosed(streamID: 1, errorCode: 0)))
    }

    @Test("sent body bytes are reported when they leave the session, as far as the peer's window lets them")
    func sentBodyAccounting() throws {
        var limits = HTTP2Session.Limits()
        limits.initialWindowSize = 10_000
        let client = try HTTP2Session(role: .client, limits: limits)
        let server = try HTTP2Session(role: .server)
        _ = try client.submitRequest(Self.request, endStream: true)
        _ = try Self.exchange(client, server)
        try server.submitResponse(streamID: 1, [HTTP2HeaderField(":status", "200")], endStream: false)
        try server.sendBody(streamID: 1, [UInt8](repeating: 7, count: 25_000), endStream: true)
        #expect(server.takeSentBodyBytes().isEmpty, "queued is not sent")
        _ = try Self.exchange(client, server)
        #expect(server.takeSentBodyBytes() == [1: 10_000], "one window's worth left")
        #expect(server.takeSentBodyBytes().isEmpty, "taking resets the count")
        try client.consumed(streamID: 1, bytes: 10_000)
        _ = try Self.exchange(client, server)
        #expect(server.takeSentBodyBytes() == [1: 10_000])
        try client.consumed(streamID: 1, bytes: 10_000)
        _ = try Self.exchange(client, server)
        #expect(server.takeSentBodyBytes() == [1: 5_000], "the last bytes count though the stream closed with them")
    }

    @Test("bytes that are not the client preface are a fatal error with nghttp2's reason; nothing more is sent")
    func badPreface() throws {
        let server = try HTTP2Session(role: .server)
        let garbage = Array("GET / HTTP/1.1\r\nHost: pay.example.test\r\n\r\n".utf8)
        let error = #expect(throws: HTTP2Error.self) { try garbage.withUnsafeBytes { try server.receive($0) } }
        #expect(error?.isFatal == true)
        #expect(error?.reason.lowercased().contains("magic") == true, "\(String(describing: error))")
        // An HTTP/1 peer would not understand a GOAWAY: nghttp2 queues none, the owner closes.
        #expect(!Self.frames(try server.takeOutput()).contains { $0.type == 7 })
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
        // nghttp2 resets a stream whose header callback refused a field with INTERNAL_ERROR (2).
        #expect(result.client.contains(.streamClosed(streamID: stream, errorCode: 2)), "\(result.client)")
    }

    /// What a hostile client sends, built byte by byte: the preface, an empty SETTINGS,
    /// then `frames` (type, flags, stream id, payload) as RFC 9113 §4.1 lays them out.
    static func rawClient(_ frames: [(type: UInt8, flags: UInt8, streamID: UInt32, payload: [UInt8])]) -> [UInt8] {
        var bytes = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0]
        for frame in frames {
            let length = frame.payload.count
            bytes += [UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF), frame.type, frame.flags]
            bytes += [UInt8(frame.streamID >> 24 & 0x7F), UInt8(frame.streamID >> 16 & 0xFF), UInt8(frame.streamID >> 8 & 0xFF),
                      UInt8(frame.streamID & 0xFF)]
            bytes += frame.payload
        }
        return bytes
    }

    @Test("an HPACK bomb (a small block of indexed references that decodes huge) is cut at the header-list limit")
    func hpackBomb() throws {
        let server = try HTTP2Session(role: .server)
        // HPACK (RFC 7541): :method GET, :scheme https, :path / from the static table;
        // :authority as a literal without indexing; then one 3,000-byte field entered into
        // the dynamic table (index 62), and 199 one-byte references to it: about 3 KB on
        // the wire that decode to about 600 KB.
        var block: [UInt8] = [0x82, 0x87, 0x84, 0x01, 16] + Array("pay.example.test".utf8)
        block += [0x40, 8] + Array("x-filler".utf8) + [0x7F, 0xB9, 0x16] + [UInt8](repeating: 0x7A, count: 3000)
        block += [UInt8](repeating: 0xBE, count: 199)
        let wire = Self.rawClient([(type: 1, flags: 0x05, streamID: 1, payload: block)]) // HEADERS, END_STREAM|END_HEADERS
        #expect(wire.count < 4 * 1024)
        let events = try wire.withUnsafeBytes { try server.receive($0) }
        #expect(!events.contains { if case .headers = $0 { return true } else { return false } }, "nothing of the block is delivered")
        let frames = Self.frames(try server.takeOutput())
        let reset = frames.first { $0.type == 3 } // RST_STREAM
        #expect(reset?.streamID == 1)
        #expect(reset?.payload == [0, 0, 0, 2], "RST_STREAM INTERNAL_ERROR: \(frames.map(\.type))")
        #expect(!frames.contains { $0.type == 7 }, "a stream error, not a connection error: the connection stays")
    }

    @Test("SETTINGS_MAX_FRAME_SIZE: a session advertises its limit, takes a DATA frame of exactly that size once the client acknowledged it, and answers one byte more with GOAWAY FRAME_SIZE_ERROR; the default is the protocol's 16 KiB",
          arguments: [16_384, 65_536])
    func maxFrameSize(limit: Int) throws {
        for extra in [0, 1] {
            var limits = HTTP2Session.Limits()
            limits.maxFrameSize = UInt32(limit)
            let server = limit == 16_384 ? try HTTP2Session(role: .server) : try HTTP2Session(role: .server, limits: limits)
            // The SETTINGS frame whole (`frames` keeps 8 bytes of each payload).
            let opening = try server.takeOutput()
            #expect(opening.count >= 9 && opening[3] == 4, "the session opens with its SETTINGS")
            let settings = Array(opening[9..<9 + (Int(opening[0]) << 16 | Int(opening[1]) << 8 | Int(opening[2]))])
            let advertised = stride(from: 0, to: settings.count - 5, by: 6).first { settings[$0] == 0 && settings[$0 + 1] == 5 }
                .map { settings[$0 + 2 ..< $0 + 6].reduce(0) { $0 << 8 | Int($1) } }
            #expect(advertised == (limit == 16_384 ? nil : limit), "16 KiB is the default, not sent")
            // POST https://pay.example.test/ (HPACK: static :method POST, :scheme https,
            // :path /, a literal :authority), then the body in one DATA frame.
            let head: [UInt8] = [0x83, 0x87, 0x84, 0x01, 16] + Array("pay.example.test".utf8)
            let wire = Self.rawClient([(type: 4, flags: 0x01, streamID: 0, payload: []), // SETTINGS ACK
                                       (type: 1, flags: 0x04, streamID: 1, payload: head),
                                       (type: 0, flags: 0x01, streamID: 1, payload: [UInt8](repeating: 0x61, count: limit + extra))])
            let events = try wire.withUnsafeBytes { try server.receive($0) }
            let received = events.reduce(0) { total, event in
                if case .data(_, let bytes, _) = event, case .copied(let copied) = bytes { return total + copied.count }
                if case .data(_, let bytes, _) = event, case .input(let range) = bytes { return total + range.count }
                return total
            }
            let goAway = Self.frames(try server.takeOutput()).first { $0.type == 7 }
            if extra == 0 {
                #expect(received == limit && goAway == nil, "\(received) bytes, GOAWAY \(goAway.map { $0.payload } ?? [])")
            } else {
                #expect(received == 0)
                #expect(goAway.map { Array($0.payload[4..<8]) } == [0, 0, 0, 6], "GOAWAY FRAME_SIZE_ERROR")
            }
        }
    }

    @Test("an invalid frame (DATA on stream 0) is a connection error: GOAWAY with PROTOCOL_ERROR, then the session is done")
    func invalidFrame() throws {
        let server = try HTTP2Session(role: .server)
        let wire = Self.rawClient([(type: 0, flags: 0, streamID: 0, payload: Array("smuggled".utf8))])
        let events = try wire.withUnsafeBytes { try server.receive($0) }
        #expect(!events.contains { if case .data = $0 { return true } else { return false } })
        let goAway = Self.frames(try server.takeOutput()).first { $0.type == 7 }
        #expect(goAway.map { Array($0.payload[4..<8]) } == [0, 0, 0, 1], "GOAWAY error code PROTOCOL_ERROR")
        #expect(!server.isAlive)
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

    /// Request with a 40 KB body, response with a 100 KB body, on a new stream; checks
    /// both bodies arrived intact and the stream closed on both ends.
    static func roundTrip(_ client: HTTP2Session, _ server: HTTP2Session, seed: Int) throws {
        let upload = Array((0..<40_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ seed) })
        let download = Array((0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ seed) })
        let stream = try client.submitRequest(Self.request, endStream: false)
        try client.sendBody(streamID: stream, upload, endStream: true)
        let sent = try Self.exchange(client, server)
        #expect(Self.body(sent.server, stream: stream) == (upload, true))
        try server.submitResponse(streamID: stream, [HTTP2HeaderField(":status", "200")], endStream: false)
        try server.sendBody(streamID: stream, download, endStream: true)
        let answered = try Self.exchange(client, server)
        #expect(Self.body(answered.client, stream: stream) == (download, true))
        #expect(answered.client.contains(.streamClosed(streamID: stream, errorCode: 0)))
        try server.consumed(streamID: stream, bytes: upload.count)
        try client.consumed(streamID: stream, bytes: download.count)
        _ = try Self.exchange(client, server)
    }

    @Test("nghttp2's frame buffer and stream table are recognised and get pages of their own")
    func idleMemoryRecognised() throws {
        for role in [HTTP2Session.Role.client, .server] {
            let session = try HTTP2Session(role: role)
            #expect(session.frameBufferResidentBytes != nil, "the frame buffer (nghttp2 1.52: 16,394 bytes at creation)")
            #expect(session.streamTableResidentBytes != nil, "the stream table (nghttp2 1.52: 256 buckets of 16 bytes)")
        }
    }

    @Test("large frames: once no stream is left, the frame buffer keeps at most its first page resident")
    func largeFramesReleasedWhenStreamsEnd() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        try Self.roundTrip(client, server, seed: 1)
        // The 16 KiB DATA frames went through every page of both buffers.
        #expect((client.frameBufferResidentBytes ?? .max) <= 4096)
        #expect((server.frameBufferResidentBytes ?? .max) <= 4096)
    }

    @Test("an idle session gives back its frame buffer and empty stream table; later exchanges are intact")
    func idleMemoryReleased() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        try Self.roundTrip(client, server, seed: 1)
        #expect(client.releaseIdleMemory() > 0)
        #expect(server.releaseIdleMemory() > 0)
        for session in [client, server] {
            #expect(session.frameBufferResidentBytes == 0)
            #expect(session.streamTableResidentBytes == 0)
        }
        // The pages come back zero-filled as they are written: nothing the sessions read
        // was in them (HPACK state, windows and stream ids live elsewhere).
        try Self.roundTrip(client, server, seed: 2)
        #expect(client.releaseIdleMemory() > 0)
        try Self.roundTrip(client, server, seed: 3)
    }

    @Test("a server session keeps no closed streams: after many requests its stream table is empty again")
    func serverKeepsNoClosedStreams() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        for _ in 0..<50 {
            let stream = try client.submitRequest(Self.request, endStream: true)
            _ = try Self.exchange(client, server)
            try server.submitResponse(streamID: stream, [HTTP2HeaderField(":status", "204")], endStream: true)
            _ = try Self.exchange(client, server)
        }
        // nghttp2 keeps up to SETTINGS_MAX_CONCURRENT_STREAMS closed streams for RFC 7540
        // priorities unless told not to: they would sit in the table, which would not be zero.
        server.releaseIdleMemory()
        #expect(server.streamTableResidentBytes == 0)
    }

    @Test("releasing with a stream open but nothing being sent keeps the stream's bytes intact")
    func releaseWithOpenStream() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        let stream = try client.submitRequest(Self.request, endStream: false)
        let first = Array((0..<30_000).map { UInt8(truncatingIfNeeded: $0 &* 3) })
        try client.sendBody(streamID: stream, first, endStream: false)
        var serverEvents = try Self.exchange(client, server).server
        client.releaseIdleMemory()
        server.releaseIdleMemory()
        // The stream table holds the open stream: not all zeros, so it stays.
        #expect((client.streamTableResidentBytes ?? 0) > 0)
        let second = Array((0..<30_000).map { UInt8(truncatingIfNeeded: $0 &* 5) })
        try client.sendBody(streamID: stream, second, endStream: true)
        serverEvents += try Self.exchange(client, server).server
        #expect(Self.body(serverEvents, stream: stream) == (first + second, true))
    }

    @Test("nothing is released before the first output is taken: the client preface is still in the buffer")
    func noReleaseBeforeFirstOutput() throws {
        let client = try HTTP2Session(role: .client)
        #expect(client.releaseIdleMemory() == 0)
        let output = try client.takeOutput()
        #expect(output.starts(with: Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)))
        let server = try HTTP2Session(role: .server)
        #expect(throws: Never.self) { try output.withUnsafeBytes { _ = try server.receive($0) } }
    }

    @Test("the linked library reports its version")
    func version() {
        #expect(HTTP2Session.libraryVersion.split(separator: ".").count == 3)
    }
}
