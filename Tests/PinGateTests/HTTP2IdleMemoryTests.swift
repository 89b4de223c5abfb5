import NIOCore
import NIOEmbedded
import PinGateHTTP2
import Testing
@testable import PinGate
@testable import PinGateHTTP

/// An HTTP/2 side's session gives back the memory nghttp2 keeps for sending once the
/// connection has been quiet for `HTTP2Wire.quietPeriod`, and not while it is in use.
/// The wire runs on an embedded channel (virtual time), its peer is an nghttp2 server
/// session in memory.
@Suite("HTTP/2 idle memory")
struct HTTP2IdleMemoryTests {
    /// Hands the test the channel handler context the wire writes through.
    final class ContextHolder: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        var context: ChannelHandlerContext?
        func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    }

    /// A wire on an embedded channel and the server session at the other end.
    struct Pair {
        let channel: EmbeddedChannel
        let context: ChannelHandlerContext
        let wire: HTTP2Wire
        let server: HTTP2Session

        init() throws {
            channel = EmbeddedChannel()
            let holder = ContextHolder()
            try channel.pipeline.syncOperations.addHandler(holder)
            context = try #require(holder.context)
            wire = HTTP2Wire(session: try HTTP2Session(role: .client))
            server = try HTTP2Session(role: .server)
        }

        /// Moves frames both ways until neither end has more; returns the server's events.
        @discardableResult
        func pump() throws -> [HTTP2Event] {
            var events: [HTTP2Event] = []
            for _ in 0..<20 {
                _ = wire.write(context, flush: true)
                var moved = false
                while let out = try channel.readOutbound(as: ByteBuffer.self) {
                    moved = true
                    events += try out.withUnsafeReadableBytes { try server.receive($0) }
                }
                let back = try server.takeOutput()
                if !back.isEmpty {
                    moved = true
                    _ = try wire.receive(ByteBuffer(bytes: back)).get()
                }
                if !moved { break }
            }
            return events
        }

        /// One GET answered with a small body, as the bench's idle tunnels carry.
        func get() throws {
            let stream = try wire.session.submitRequest([
                HTTP2HeaderField(":method", "GET"), HTTP2HeaderField(":scheme", "https"),
                HTTP2HeaderField(":authority", "idle.pingate.test"), HTTP2HeaderField(":path", "/small.txt"),
            ], endStream: true)
            try pump()
            try server.submitResponse(streamID: stream, [HTTP2HeaderField(":status", "200")], endStream: false)
            try server.sendBody(streamID: stream, Array("small\n".utf8), endStream: true)
            try pump()
        }

        func advance(milliseconds: Int64) {
            channel.embeddedEventLoop.advanceTime(by: .milliseconds(milliseconds))
        }
    }

    @Test("after a GET, the session keeps its send buffer and stream table until quiet for the period, then gives them back")
    func quietSessionReleases() throws {
        let pair = try Pair()
        try pair.get()
        let session = pair.wire.session
        #expect(session.frameBufferResidentBytes == 4096, "the frames of the GET were written to its first page")
        #expect((session.streamTableResidentBytes ?? 0) > 0)
        pair.advance(milliseconds: HTTP2Wire.quietPeriod.nanoseconds / 1_000_000 - 100)
        #expect(session.frameBufferResidentBytes == 4096, "not before the period")
        pair.advance(milliseconds: 200)
        #expect(session.frameBufferResidentBytes == 0)
        #expect(session.streamTableResidentBytes == 0)

        // The next exchange finds zeroed pages and works as before.
        try pair.get()
        #expect(session.frameBufferResidentBytes == 4096)
        pair.advance(milliseconds: HTTP2Wire.quietPeriod.nanoseconds / 1_000_000 + 100)
        #expect(session.frameBufferResidentBytes == 0)
    }

    @Test("activity puts the release off: a session in use keeps its buffer")
    func activityDefers() throws {
        let pair = try Pair()
        let period = HTTP2Wire.quietPeriod.nanoseconds / 1_000_000
        try pair.get()
        for _ in 0..<5 {
            pair.advance(milliseconds: period - 100)
            try pair.get()
            #expect(pair.wire.session.frameBufferResidentBytes == 4096)
        }
        pair.advance(milliseconds: period + 100)
        #expect(pair.wire.session.frameBufferResidentBytes == 0)
    }

    @Test("a closed wire's timer is cancelled")
    func closeCancels() throws {
        let pair = try Pair()
        try pair.get()
        pair.wire.close(pair.context)
        let before = pair.wire.session.frameBufferResidentBytes
        pair.advance(milliseconds: HTTP2Wire.quietPeriod.nanoseconds / 1_000_000 * 3)
        #expect(pair.wire.session.frameBufferResidentBytes == before)
    }
}
