import NIOCore
import NIOEmbedded
import NIOHTTP1
import PropertyBased
import Testing
@testable import PinGateHTTP

/// `HTTP1ResponseBoundary` with NIO's real response decoder behind it, in an
/// `EmbeddedChannel` (no sockets): a model origin answers one request at a time, and its
/// bytes for a response become readable only once the request was sent, as on a wire.
@Suite("An HTTP/1.1 upstream's response boundaries")
struct HTTP1ResponseBoundaryTests {
    /// The last handler: a model of `HTTP1UpstreamSide` that tells the boundary about each
    /// final end, and notes when the boundary says the next request may go (the driver
    /// sends it, as a client's next request arrives).
    final class ModelSide: ChannelInboundHandler {
        typealias InboundIn = HTTPClientResponsePart
        typealias OutboundOut = HTTPClientRequestPart
        var heads: [Int] = []
        var context: ChannelHandlerContext?
        var bodies: [[UInt8]] = []
        var ends = 0
        var unsolicited = 0
        var requestsSent = 0
        /// Set when the boundary confirmed the last response's end: the next request may go.
        var mayStartNext = true {
            didSet { if mayStartNext && queued > 0 { queued -= 1; sendRequest() } }
        }
        /// Requests waiting for the boundary (an HTTP/2 client's other streams, a pipelined
        /// request): the side sends one the moment the boundary allows.
        var queued = 0
        var boundary: HTTP1ResponseBoundaryHandler?

        /// Writes a GET (the decoder pairs each response with a request it saw go out).
        func sendRequest() {
            #expect(mayStartNext, "a request went before the last response's boundary was confirmed")
            mayStartNext = false
            requestsSent += 1
            context?.write(wrapOutboundOut(.head(HTTPRequestHead(version: .http1_1, method: .GET, uri: "/\(requestsSent)"))),
                           promise: nil)
            context?.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            boundary?.requestSent()
        }

        func handlerAdded(context: ChannelHandlerContext) { self.context = context }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                heads.append(Int(head.status.code))
                bodies.append([])
            case .body(let bytes):
                bodies[bodies.count - 1] += bytes.readableBytesView
            case .end:
                ends += 1
                if boundary?.responseEnded() == true { mayStartNext = true }
            }
        }
    }

    /// A channel with the boundary handler in front of NIO's decoder and `side` behind.
    static func channel(_ side: ModelSide) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        let boundary = HTTP1ResponseBoundaryHandler(events: .init(
            unsolicited: { side.unsolicited += 1 },
            boundaryReached: { side.mayStartNext = true }))
        side.boundary = boundary
        try channel.pipeline.syncOperations.addHandlers([
            boundary, ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes)), side,
        ])
        return channel
    }

    /// A random tape of choices.
    struct Tape {
        var codes: [Int]
        var index = 0
        mutating func next(_ range: ClosedRange<Int>) -> Int {
            defer { index += 1 }
            let code = codes.isEmpty ? 0 : codes[index % codes.count] &+ index &* 7919
            return range.lowerBound + abs(code) % (range.count)
        }
    }

    /// Response `number`, framed by length or chunked, with a body that names it.
    static func response(_ number: Int, chunked: Bool, size: Int) -> (bytes: [UInt8], body: [UInt8]) {
        let body = Array(String(repeating: "r\(number).", count: size).utf8)
        if chunked {
            var bytes = Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
            if !body.isEmpty { bytes += Array("\(String(body.count, radix: 16))\r\n".utf8) + body + Array("\r\n".utf8) }
            bytes += Array("0\r\n\r\n".utf8)
            return (bytes, body)
        }
        return (Array("HTTP/1.1 200 OK\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body, body)
    }

    static let strays: [[UInt8]] = ["H", "HTTP/1.1 200 OK\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n", "\r\n",
                                    "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nPOISON", "POISON"].map { Array($0.utf8) }

    /// Splits `bytes` into reads at random points.
    static func reads(_ bytes: [UInt8], _ tape: inout Tape) -> [[UInt8]] {
        var reads: [[UInt8]] = []
        var start = 0
        while start < bytes.count {
            let length = min(bytes.count - start, tape.next(1...max(1, bytes.count)))
            reads.append(Array(bytes[start..<start + length]))
            start += length
        }
        return reads
    }

    @Test("over random responses, framings, read splits and bursts: with no stray every response is delivered whole and the next request goes only at a clean boundary; a stray after response k, in its last read, a later read of the same burst or a later burst, is reported once, and no response after k is ever delivered")
    func randomStreams() async throws {
        await propertyCheck(count: 400, input: Gen.int(in: 0...1_000_000).array(of: 4...40)) { codes in
            var tape = Tape(codes: codes)
            let side = ModelSide()
            let channel: EmbeddedChannel
            do {
                channel = try Self.channel(side)
            } catch {
                Issue.record("no channel: \(error)")
                return
            }
            let count = tape.next(1...6)
            // -1: no stray; else after response k, in its last read (0) or in a read of its own (1).
            let strayAfter = tape.next(0...1) == 0 ? -1 : tape.next(0...(count - 1))
            let stray = Self.strays[tape.next(0...(Self.strays.count - 1))]
            let strayPlace = tape.next(0...2)
            var expectedBodies: [[UInt8]] = []
            side.sendRequest()
            for number in 0..<count {
                if number > 0 {
                    // The client's next request was queued (sent at the boundary), or arrives now.
                    guard side.unsolicited == 0 else { break }
                    if side.requestsSent < number + 1 {
                        guard side.mayStartNext else { break }
                        side.sendRequest()
                    }
                }
                // Whether the next request is already waiting as this response arrives. Not
                // with a stray in a later burst: a request sent before it is the race HTTP/1.1
                // cannot tell apart (the origin's stray and its answer look alike).
                let strayLater = number == strayAfter && strayPlace == 2
                if number + 1 < count && !strayLater && tape.next(0...1) == 1 { side.queued = 1 }
                let (bytes, body) = Self.response(number, chunked: tape.next(0...1) == 1, size: tape.next(0...40))
                expectedBodies.append(body)
                var reads = Self.reads(bytes, &tape)
                // Where the stray goes: in the answer's last read, in a read of its own in the
                // same burst (a second TLS record of one socket read), or in a later burst.
                var strayBurst: [[UInt8]] = []
                if number == strayAfter {
                    switch strayPlace {
                    case 0: reads[reads.count - 1] += stray
                    case 1: reads.append(stray)
                    default: strayBurst = [stray]
                    }
                }
                // Reads go in bursts, each ended by a read-complete, as the TLS handler hands
                // on the records of one socket read; the last read always ends a burst.
                // A stray read of its own (place 1) stays in the burst of the answer's last read.
                let strayRead = number == strayAfter && strayPlace == 1 ? reads.count - 1 : nil
                for (index, read) in reads.enumerated() {
                    channel.pipeline.fireChannelRead(NIOAny(ByteBuffer(bytes: read)))
                    let burstMayEnd = strayRead.map { index < $0 - 1 } ?? true
                    if index == reads.count - 1 || (burstMayEnd && tape.next(0...2) == 0) { channel.pipeline.fireChannelReadComplete() }
                }
                for read in strayBurst {
                    channel.pipeline.fireChannelRead(NIOAny(ByteBuffer(bytes: read)))
                    channel.pipeline.fireChannelReadComplete()
                }
            }
            if strayAfter < 0 {
                #expect(side.unsolicited == 0)
                #expect(side.ends == count && side.heads.count == count)
                #expect(side.bodies == expectedBodies)
                #expect(side.requestsSent == count && side.mayStartNext)
            } else {
                #expect(side.unsolicited == 1, "stray \(stray) after \(strayAfter) of \(count), place \(strayPlace)")
                // Response k itself was delivered; nothing after it was ever taken for an answer.
                #expect(side.heads.count == strayAfter + 1, "\(side.heads) stray after \(strayAfter)")
                #expect(Array(side.bodies.prefix(strayAfter + 1)) == Array(expectedBodies.prefix(strayAfter + 1)))
                // No request went after the stray: the connection was out of step.
                #expect(side.requestsSent == strayAfter + 1)
            }
            #expect(side.boundary?.boundary.impossible == 0)
            _ = try? channel.finish()
        }
    }

    @Test("bytes with no request outstanding are unsolicited, and the connection stays out of step: later bytes are dropped")
    func bytesWhileIdle() throws {
        var boundary = HTTP1ResponseBoundary()
        #expect(boundary.isAtBoundary)
        let outcome1 = boundary.bytesArrived(1)
        #expect(outcome1 == .unsolicited)
        let outcome2 = boundary.bytesArrived(10)
        #expect(outcome2 == .drop)
        boundary.requestSent()
        let outcome3 = boundary.bytesArrived(10)
        #expect(outcome3 == .drop)
        #expect(!boundary.isAtBoundary)
        #expect(boundary.impossible == 0)
    }

    @Test("a response that ends with its connection's close (outside a read) is at a boundary at once; a 101 lets every later byte pass")
    func endOutsideAReadAndSwitch() throws {
        var boundary = HTTP1ResponseBoundary()
        boundary.requestSent()
        let outcome4 = boundary.responseEnded()
        #expect(outcome4)
        #expect(boundary.isAtBoundary)
        boundary.requestSent()
        let outcome5 = boundary.bytesArrived(5)
        #expect(outcome5 == .split)
        boundary.switchedProtocols()
        let outcome6 = boundary.prefixDelivered()
        #expect(outcome6)
        boundary.readFed()
        let outcome7 = boundary.readBurstEnded()
        #expect(!outcome7)
        let outcome8 = boundary.bytesArrived(5)
        #expect(outcome8 == .whole)
        #expect(boundary.impossible == 0)
    }

    @Test("a response end nobody awaited, and a request sent while one is outstanding, are counted as impossible")
    func impossibleCalls() throws {
        var boundary = HTTP1ResponseBoundary()
        let outcome9 = boundary.responseEnded()
        #expect(!outcome9)
        boundary.requestSent()
        boundary.requestSent()
        #expect(boundary.impossible == 2)
    }
}

