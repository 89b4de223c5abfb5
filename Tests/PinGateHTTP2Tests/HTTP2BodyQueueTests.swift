import PropertyBased
import Testing
@testable import PinGateHTTP2

/// Body bytes sent without copies (issue 32, item 8): the per-stream queue alone, then
/// two real nghttp2 sessions, where every DATA frame's payload is written by the session
/// (`NGHTTP2_DATA_FLAG_NO_COPY`) from the pieces its owner gave it.
@Suite("HTTP/2 bodies sent from their owner's buffers")
struct HTTP2BodyQueueTests {
    /// `count` bytes that say where they are in a body: no two offsets of one body alike
    /// within 251 bytes, so a byte out of place or twice shows.
    static func bytes(from start: Int, count: Int) -> [UInt8] {
        (start..<start + count).map { UInt8(truncatingIfNeeded: $0 % 251) }
    }

    @Test("property: pieces appended and bytes sent in any interleaving come out in order, whole, each once; a send of more than is queued hands nothing")
    func queueKeepsOrder() async {
        // Each code: 0 mod 3, hold a piece of (code / 3) % 3000 bytes; 1, copy one; 2, send (code / 3) % 5000.
        await propertyCheck(count: 400, input: Gen.int(in: 0...1_000_000).array(of: 1...60)) { codes in
            var queue = HTTP2BodyQueue()
            var appended = 0
            var sent: [UInt8] = []
            for code in codes {
                if code % 3 == 0 {
                    let size = (code / 3) % 3000
                    queue.append(Self.bytes(from: appended, count: size))
                    appended += size
                } else if code % 3 == 1 {
                    let size = (code / 3) % 3000
                    queue.appendCopy(Self.bytes(from: appended, count: size))
                    appended += size
                } else {
                    let length = (code / 3) % 5000
                    let before = queue.count
                    var handed: [UInt8] = []
                    let ok = queue.send(length, to: { handed += $0 })
                    if length <= before {
                        #expect(ok)
                        #expect(handed.count == length)
                        #expect(queue.count == before - length)
                    } else {
                        #expect(!ok)
                        #expect(handed.isEmpty, "a refused send hands nothing")
                        #expect(queue.count == before)
                    }
                    sent += handed
                }
                #expect(queue.count == appended - sent.count)
                #expect(queue.isEmpty == (queue.count == 0))
            }
            var rest: [UInt8] = []
            let sentRest = queue.send(queue.count, to: { rest += $0 })
            #expect(sentRest)
            #expect(sent + rest == Self.bytes(from: 0, count: appended))
            #expect(queue.isEmpty)
            #expect(queue.heldPieceSlots <= 16, "sent pieces are dropped")
            #expect(queue.copiedBytes == 0, "sent copies are dropped")
        }
    }

    @Test("a long body that never drains fully: the queue keeps no more than what is unsent, plus a bounded tail of sent slots")
    func longBodyStaysBounded() {
        var queue = HTTP2BodyQueue()
        var held = 0
        var copied = 0
        for round in 0..<10_000 {
            queue.append([UInt8](repeating: 1, count: 5_000))
            queue.appendCopy([UInt8](repeating: 2, count: 300))
            // Send all but about one piece each time: the queue never empties.
            let sentEnough = queue.send(queue.count - 5_000 + (round % 7), to: { _ in })
            #expect(sentEnough)
            held = max(held, queue.heldPieceSlots)
            copied = max(copied, queue.copiedBytes)
        }
        #expect(held <= 40, "sent slots are dropped as the queue goes (at most \(held))")
        #expect(copied <= 128 * 1024, "sent copied bytes are dropped too (at most \(copied))")
    }

    @Test("a piece sent whole is let go at once, not when the queue is compacted")
    func sentPieceIsReleased() {
        var queue = HTTP2BodyQueue()
        weak var first: PieceStorage?
        do {
            let storage = PieceStorage()
            first = storage
            queue.append(TrackedPiece(storage: storage, bytes: [1, 2, 3]))
        }
        queue.append([4, 5, 6])
        #expect(first != nil, "queued, it is held")
        let sentPart = queue.send(2, to: { _ in })
        #expect(sentPart)
        #expect(first != nil, "partly sent, it is still held")
        let sentRest = queue.send(2, to: { _ in })
        #expect(sentRest)
        #expect(first == nil, "sent whole, it is let go while the next piece is still queued")
        #expect(queue.count == 2)
    }

    /// A client advertising `window` bytes per stream, and a server that has answered its
    /// GET on stream 1 with a 200 head, the body to follow.
    static func answering(window: Int) throws -> (client: HTTP2Session, server: HTTP2Session) {
        var limits = HTTP2Session.Limits()
        limits.initialWindowSize = UInt32(window)
        let client = try HTTP2Session(role: .client, limits: limits)
        let server = try HTTP2Session(role: .server)
        _ = try client.submitRequest(HTTP2SessionTests.request, endStream: true)
        _ = try HTTP2SessionTests.exchange(client, server)
        try server.submitResponse(streamID: 1, [HTTP2HeaderField(":status", "200")], endStream: false)
        return (client, server)
    }

    /// One response body given to the server in `pieces`, sent under windows of
    /// `window` bytes that the client reopens `consumeStep` bytes at a time.
    static func deliver(pieces: [Int], window: Int, consumeStep: Int, frameSize: Int,
                        trailers: Bool) throws -> (received: [UInt8], ended: Bool, sent: Int, events: [HTTP2Event], server: HTTP2Session) {
        var clientLimits = HTTP2Session.Limits()
        clientLimits.initialWindowSize = UInt32(window)
        clientLimits.maxFrameSize = UInt32(frameSize)
        let client = try HTTP2Session(role: .client, limits: clientLimits)
        let server = try HTTP2Session(role: .server)
        let request = HTTP2SessionTests.request + (trailers ? [HTTP2HeaderField("te", "trailers")] : [])
        let stream = try client.submitRequest(request, endStream: true)
        _ = try HTTP2SessionTests.exchange(client, server)
        try server.submitResponse(streamID: stream, [HTTP2HeaderField(":status", "200")], endStream: false)
        var offset = 0
        for (index, size) in pieces.enumerated() {
            let last = index == pieces.count - 1
            try server.sendBody(streamID: stream, piece: Self.bytes(from: offset, count: size), endStream: last,
                                trailers: last && trailers ? [HTTP2HeaderField("grpc-status", "0")] : nil)
            offset += size
        }
        if pieces.isEmpty {
            try server.sendBody(streamID: stream, [], endStream: true, trailers: trailers ? [HTTP2HeaderField("grpc-status", "0")] : nil)
        }
        var received: [UInt8] = []
        var ended = false
        var sent = 0
        var events: [HTTP2Event] = []
        // nghttp2 gives a window back once half of it is consumed: a round moves at least
        // half a window.
        for _ in 0..<(2 * offset / window + 40) where !ended {
            let round = try HTTP2SessionTests.exchange(client, server)
            events += round.client
            sent += server.takeSentBodyBytes()[stream, default: 0]
            let (bytes, end) = HTTP2SessionTests.body(round.client, stream: stream)
            received += bytes
            ended = end || round.client.contains { if case .headers(stream, _, true) = $0 { return true } else { return false } }
            var unconsumed = bytes.count
            while unconsumed > 0 {
                let step = min(unconsumed, consumeStep)
                try client.consumed(streamID: stream, bytes: step)
                unconsumed -= step
            }
        }
        return (received, ended, sent, events, server)
    }

    @Test("property: a body given in any pieces crosses whole under any windows and frame size, with or without trailers; every byte is reported sent once and no frame goes unsent")
    func bodiesCrossWhole() async {
        let shapes = Gen.int(in: 0...1_000_000).array(of: 1...12)
        await propertyCheck(count: 120, input: shapes) { codes in
            let pieces = codes.dropFirst(2).map { $0 % 40_000 }
            let window = 1_000 + (codes[0] % 70_000)
            let frameSize = [16_384, 65_536, 20_000][codes[0] % 3]
            let trailers = (codes.count > 1 ? codes[1] : 0) % 2 == 0
            let consumeStep = 1 + ((codes.count > 1 ? codes[1] : 1) % 30_000)
            do {
                let outcome = try Self.deliver(pieces: Array(pieces), window: window, consumeStep: consumeStep,
                                               frameSize: frameSize, trailers: trailers)
                let total = pieces.reduce(0, +)
                #expect(outcome.ended)
                #expect(outcome.received == Self.bytes(from: 0, count: total))
                #expect(outcome.sent == total, "each byte reported sent once")
                #expect(outcome.server.takeDiscardedBodyBytes().isEmpty)
                #expect(outcome.server.unsendableDataFrames == 0)
                if trailers {
                    #expect(outcome.events.contains(.headers(streamID: 1, fields: [HTTP2HeaderField("grpc-status", "0")], endStream: true)))
                }
            } catch {
                Issue.record("the exchange failed: \(error)")
            }
        }
    }

    @Test("DATA frames on the wire: payloads no larger than the window and frame size allow, in order, from pieces held by the session")
    func framesOnTheWire() throws {
        let (client, server) = try Self.answering(window: 40_000)
        try server.sendBody(streamID: 1, piece: Self.bytes(from: 0, count: 10), endStream: false)
        try server.sendBody(streamID: 1, piece: Self.bytes(from: 10, count: 50_000), endStream: true)
        let wire = try server.takeOutput()
        let data = HTTP2SessionTests.frames(wire).filter { $0.type == 0 }
        // The window (40,000) allows two full frames and 7,232 bytes of a third.
        #expect(data.count == 3)
        #expect(data.first?.payload == Self.bytes(from: 0, count: 8), "the first piece's bytes lead the first frame")
        var received: [UInt8] = []
        let events = try wire.withUnsafeBytes { try HTTP2SessionTests.resolved(client.receive($0), in: $0) }
        for case .data(1, .copied(let chunk), _) in events { received += chunk }
        #expect(received == Self.bytes(from: 0, count: 40_000))
        #expect(server.takeSentBodyBytes() == [1: 40_000])
        #expect(server.unsendableDataFrames == 0)
    }

    @Test("a piece the windows let go at once is held as it is, then let go once sent; one that must wait, or a small one, is copied at once, so its owner's buffer is free")
    func holdOrCopy() throws {
        let (client, server) = try Self.answering(window: 20_000)
        #expect(server.sendWindow(1) == 20_000)

        weak var held: PieceStorage?
        weak var waiting: PieceStorage?
        weak var small: PieceStorage?
        do {
            let first = PieceStorage(), second = PieceStorage(), third = PieceStorage()
            held = first
            waiting = second
            small = third
            try server.sendBody(streamID: 1, piece: TrackedPiece(storage: first, bytes: Self.bytes(from: 0, count: 15_000)), endStream: false)
            try server.sendBody(streamID: 1, piece: TrackedPiece(storage: second, bytes: Self.bytes(from: 15_000, count: 10_000)), endStream: false)
            try server.sendBody(streamID: 1, piece: TrackedPiece(storage: third, bytes: Self.bytes(from: 25_000, count: 100)), endStream: true)
        }
        #expect(held != nil, "15,000 bytes fit the 20,000-byte window: held as given")
        #expect(waiting == nil, "10,000 more would wait: copied, its storage free at once")
        #expect(small == nil, "100 bytes: copied")
        #expect(server.queuedBodyShape(1)?.heldPieces == 1)
        #expect(server.queuedBodyShape(1)?.copiedBytes == 10_100)

        var received: [UInt8] = []
        var ended = false
        for _ in 0..<10 where !ended {
            let events = try HTTP2SessionTests.exchange(client, server).client
            let (bytes, end) = HTTP2SessionTests.body(events, stream: 1)
            received += bytes
            ended = end
            if !bytes.isEmpty { try client.consumed(streamID: 1, bytes: bytes.count) }
            if received.count >= 15_000 { #expect(held == nil, "sent whole, let go") }
        }
        #expect(received == Self.bytes(from: 0, count: 25_100))
        #expect(server.queuedBodyShape(1) == nil, "the stream's record went with its last byte")
        #expect(server.unsendableDataFrames == 0)
    }

    @Test("100,000 one-byte pieces to a peer whose window is shut: one buffer of copied bytes, no slot per piece; all arrive once it opens")
    func tinyPiecesToAShutWindow() throws {
        let (client, server) = try Self.answering(window: 0)
        for index in 0..<100_000 {
            try server.sendBody(streamID: 1, piece: [UInt8(truncatingIfNeeded: index % 251)], endStream: index == 99_999)
        }
        #expect(server.queuedBodyShape(1)?.heldPieces == 0)
        #expect(server.queuedBodyShape(1)?.copiedBytes == 100_000)
        _ = try HTTP2SessionTests.exchange(client, server)
        #expect(server.takeSentBodyBytes().isEmpty, "nothing goes while the window is shut")
        try client.setStreamReceiveWindow(1, bytes: 200_000)
        let events = try HTTP2SessionTests.exchange(client, server).client
        let (bytes, ended) = HTTP2SessionTests.body(events, stream: 1)
        #expect(ended)
        #expect(bytes == Self.bytes(from: 0, count: 100_000))
        #expect(server.takeSentBodyBytes() == [1: 100_000])
    }

    @Test("a client's upload: a body piece given after the one that ended the stream is refused, once the end went out and while the answer is still to come")
    func bodyAfterTheEnd() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        let stream = try client.submitRequest(HTTP2SessionTests.request, endStream: false)
        try client.sendBody(streamID: stream, piece: Self.bytes(from: 0, count: 8_000), endStream: true)
        let events = try HTTP2SessionTests.exchange(client, server).server
        #expect(HTTP2SessionTests.body(events, stream: stream) == (Self.bytes(from: 0, count: 8_000), true))
        #expect(throws: HTTP2Error.self) { try client.sendBody(streamID: stream, piece: [1, 2, 3], endStream: false) }
        #expect(client.unsendableDataFrames == 0)
    }

    @Test("a stream reset while its body waits for the window: what was queued and not sent is reported discarded, once")
    func resetWhileQueued() throws {
        let (client, server) = try Self.answering(window: 5_000)
        try server.sendBody(streamID: 1, piece: Self.bytes(from: 0, count: 12_000), endStream: false)
        _ = try HTTP2SessionTests.exchange(client, server)
        #expect(server.takeSentBodyBytes() == [1: 5_000])
        try client.resetStream(1, errorCode: 8)
        _ = try HTTP2SessionTests.exchange(client, server)
        #expect(server.takeDiscardedBodyBytes() == [1: 7_000])
        #expect(server.takeDiscardedBodyBytes().isEmpty)
        #expect(throws: HTTP2Error.self) { try server.sendBody(streamID: 1, piece: [1, 2, 3], endStream: true) }
        #expect(server.unsendableDataFrames == 0)
    }

    @Test("three streams' bodies, given in pieces turn by turn, each arrive whole on their own stream")
    func interleavedStreams() throws {
        let client = try HTTP2Session(role: .client)
        let server = try HTTP2Session(role: .server)
        let streams = try (0..<3).map { _ in try client.submitRequest(HTTP2SessionTests.request, endStream: true) }
        _ = try HTTP2SessionTests.exchange(client, server)
        for stream in streams { try server.submitResponse(streamID: stream, [HTTP2HeaderField(":status", "200")], endStream: false) }
        var offsets = [Int32: Int]()
        for round in 0..<6 {
            for (index, stream) in streams.enumerated() {
                let size = 1_000 * (index + 1) + round * 7
                try server.sendBody(streamID: stream, piece: Self.bytes(from: offsets[stream, default: 0] + Int(stream) * 1000, count: size),
                                    endStream: round == 5)
                offsets[stream, default: 0] += size
            }
        }
        let events = try HTTP2SessionTests.exchange(client, server).client
        for stream in streams {
            let (bytes, ended) = HTTP2SessionTests.body(events, stream: stream)
            #expect(ended)
            #expect(bytes == Self.bytes(from: Int(stream) * 1000, count: offsets[stream, default: 0]))
        }
        #expect(server.unsendableDataFrames == 0)
    }
}

/// The storage a tracked piece keeps alive: a weak reference to it says whether anything
/// still holds the piece.
private final class PieceStorage {}

/// Body bytes whose storage is an object, to see who holds them.
private struct TrackedPiece: HTTP2BodyBytes {
    let storage: PieceStorage
    let bytes: [UInt8]
    var count: Int { bytes.count }
    func withBytes(in range: Range<Int>, _ body: (UnsafeRawBufferPointer) -> Void) { bytes.withBytes(in: range, body) }
}
