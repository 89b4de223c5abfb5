import NIOCore
import NIOHTTP1
import PinGateHTTP2

/// What both HTTP/2 sides of a request-aware tunnel share: the nghttp2 session, the
/// channel its bytes go over, and the credits for body bytes that left through it.
///
/// nghttp2 is sans-IO: frames come in through `receive`, and whatever the session wants
/// to send is taken after each step and written to the channel. Body bytes leave the
/// session only as far as the peer's flow-control windows allow; the owner reports the
/// bytes that did (and those a reset dropped) to the router, whose `CreditLedger` gives
/// their credit to the other leg once this channel is writable, so a slow peer on this side
/// holds the other leg back through its windows, and the gate never buffers a body whole.
///
/// A class, not a struct: crediting the other leg can call back into this side (its
/// answer reopens our windows) while a write is still being accounted for.
final class HTTP2Wire {
    /// The session (server toward the client, client toward the upstream).
    let session: HTTP2Session

    /// How long the session must have been quiet (no frame in or out) before the memory it
    /// keeps for sending is given back (`HTTP2Session.releaseIdleMemory`): long enough that
    /// a connection in use never pays for it (a system call, then page faults as it is
    /// written again), short enough that an idle tunnel soon costs its 20 KiB less.
    static let quietPeriod = TimeAmount.milliseconds(500)
    /// When frames last went either way (stamped by `write`, which follows every read burst).
    private var lastActivity: NIODeadline?
    /// Frames came in since `lastActivity` was stamped.
    private var receivedSinceStamp = true
    /// The one timer, moved on only when it fires (activity just stamps a time).
    private var quietCheck: Scheduled<Void>?

    init(session: HTTP2Session) {
        self.session = session
    }

    /// Feeds what the peer sent; returns the events, or the error that ends the connection
    /// (its GOAWAY, when nghttp2 queued one, goes out with the next `write`).
    func receive(_ buffer: ByteBuffer) -> Result<[HTTP2Event], HTTP2Error> {
        receivedSinceStamp = true
        do {
            return .success(try buffer.withUnsafeReadableBytes { try session.receive($0) })
        } catch let error as HTTP2Error {
            return .failure(error)
        } catch {
            return .failure(HTTP2Error(code: -902, operation: "receiving frames: \(error)"))
        }
    }

    /// Writes whatever the session has to send (flushed when `flush`); returns the body
    /// bytes that left, per stream, for the owner to report to the router (whose ledger
    /// credits the other leg with them). When the session cannot produce its output the
    /// connection cannot go on: it is closed.
    func write(_ context: ChannelHandlerContext, flush: Bool) -> [Int32: Int] {
        var output = OutputPieces(allocator: context.channel.allocator)
        do {
            try session.takeOutput { output.append($0) }
        } catch {
            context.close(promise: nil)
            return session.takeSentBodyBytes()
        }
        let wrote = output.finish { context.write(NIOAny($0), promise: nil) }
        if flush { context.flush() }
        if wrote || receivedSinceStamp || lastActivity == nil {
            // The loop's clock, not the wall's: one read per write burst, and virtual under test.
            let now = context.eventLoop.now
            lastActivity = now
            receivedSinceStamp = false
            if quietCheck == nil { scheduleQuietCheck(on: context.eventLoop, at: now + Self.quietPeriod) }
        }
        return session.takeSentBodyBytes()
    }

    /// Whether this side has sent its GOAWAY: a connection says it once, with its reason.
    private(set) var goAwaySent = false

    /// Queues GOAWAY with `errorCode` (RFC 9113 §6.8), once; `close` then sends no other.
    func goAway(errorCode: UInt32) {
        guard !goAwaySent else { return }
        goAwaySent = true
        try? session.goAway(errorCode: errorCode)
    }

    /// Ends the connection: a GOAWAY with `errorCode` (graceful, 0, when the session can
    /// still send one: streams the peer may retry), whatever is queued, then the close.
    func close(_ context: ChannelHandlerContext, errorCode: UInt32 = 0) {
        // What is queued goes first: nghttp2 sends control frames (GOAWAY) ahead of DATA, so
        // a stream's last DATA (its END_STREAM, e.g. as a relayed WebSocket ends with its
        // upstream connection) would otherwise follow the GOAWAY, which some peers (Python
        // `h2`) no longer read past.
        _ = write(context, flush: false)
        if !goAwaySent && (session.isAlive || errorCode != 0) { goAway(errorCode: errorCode) }
        _ = write(context, flush: true)
        // After the writes, which stamp activity and would arm it again.
        quietCheck?.cancel()
        quietCheck = nil
        context.close(promise: nil)
    }

    private func scheduleQuietCheck(on eventLoop: any EventLoop, at deadline: NIODeadline) {
        quietCheck = eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [weak self] in
            guard let self else { return }
            self.quietCheck = nil
            let now = eventLoop.now
            if self.receivedSinceStamp {
                // Frames came in with no write after them to stamp the time (not expected:
                // every read burst ends in one): they count as activity now.
                self.lastActivity = now
                self.receivedSinceStamp = false
            }
            let due = (self.lastActivity ?? now) + Self.quietPeriod
            if due > now {
                self.scheduleQuietCheck(on: eventLoop, at: due)
            } else {
                // Quiet since the last activity: the timer is armed again only by the next.
                self.session.releaseIdleMemory()
            }
        }
    }

    /// Queues body bytes on `streamID`; false when the stream cannot take them (reset it).
    ///
    /// When the peer's windows let the bytes go at once, the session keeps the buffer
    /// itself until they are framed, and copies them once, into the output (they were
    /// copied three times: into a queue, into nghttp2's frame buffer, and out of it); bytes
    /// that must wait are copied into the session's queue (`HTTP2Session.sendBody`).
    func sendBody(_ streamID: Int32, _ bytes: ByteBuffer) -> Bool {
        do {
            try session.sendBody(streamID: streamID, piece: BodyPiece(bytes), endStream: false)
            return true
        } catch {
            return false
        }
    }

    /// Ends `streamID`'s body, with `trailers` when there are any; false when the stream
    /// cannot be ended that way (reset it).
    func endBody(_ streamID: Int32, trailers: HTTPHeaders?) -> Bool {
        do {
            try session.sendBody(streamID: streamID, [], endStream: true, trailers: trailers.map(Self.fields))
            return true
        } catch {
            return false
        }
    }

    /// Where `write` puts what the session serializes: buffers of whole TLS records
    /// (`pieceBytes`), so a burst of DATA is never copied again by a growing buffer, and
    /// the TLS handler seals each as full records. They go to the channel only once the
    /// session is done (`finish`): a write must not reach the pipeline while the session
    /// is still framing.
    struct OutputPieces {
        /// Four records of plaintext (RFC 8446 §5.1: 2^14 bytes each).
        static let pieceBytes = 4 * 16_384
        /// The first piece of a write: a burst of control frames and heads fits.
        static let firstPieceBytes = 16_384
        let allocator: ByteBufferAllocator
        /// The piece being filled: the first (`firstPieceBytes`) while none is full, then
        /// a later one (`pieceBytes`).
        private var current: ByteBuffer?
        /// Pieces filled, in order, waiting for `finish`.
        private var full: [ByteBuffer] = []

        init(allocator: ByteBufferAllocator) {
            self.allocator = allocator
        }

        /// Copies `bytes` in.
        mutating func append(_ bytes: UnsafeRawBufferPointer) {
            var rest = bytes
            while !rest.isEmpty {
                let limit = full.isEmpty ? Self.firstPieceBytes : Self.pieceBytes
                // Taken out of `current` before the write: a second reference would make the
                // write copy the whole buffer (copy on write).
                var buffer = current.take() ?? allocator.buffer(capacity: limit)
                let run = min(limit - buffer.readableBytes, rest.count)
                buffer.writeBytes(UnsafeRawBufferPointer(rebasing: rest[..<run]))
                rest = UnsafeRawBufferPointer(rebasing: rest[run...])
                if buffer.readableBytes == limit {
                    full.append(buffer)
                    current = nil
                } else {
                    current = buffer
                }
            }
        }

        /// Hands every piece to `write`, in order; true when there was any.
        mutating func finish(write: (ByteBuffer) -> Void) -> Bool {
            var wrote = false
            for piece in full {
                write(piece)
                wrote = true
            }
            full = []
            if let buffer = current, buffer.readableBytes > 0 {
                write(buffer)
                wrote = true
            }
            current = nil
            return wrote
        }
    }

    /// Body bytes given to the session as the buffer they came in (`HTTP2BodyBytes`).
    struct BodyPiece: HTTP2BodyBytes {
        let buffer: ByteBuffer

        init(_ buffer: ByteBuffer) {
            self.buffer = buffer
        }

        var count: Int { buffer.readableBytes }

        func withBytes(in range: Range<Int>, _ body: (UnsafeRawBufferPointer) -> Void) {
            buffer.withUnsafeReadableBytes { body(UnsafeRawBufferPointer(rebasing: $0[range])) }
        }
    }

    /// Body bytes nghttp2 delivered, as a buffer for the router: a slice of the buffer the
    /// frames came in (no copy), or the copied bytes.
    static func buffer(_ bytes: HTTP2Bytes, from input: ByteBuffer?) -> ByteBuffer {
        switch bytes {
        case .input(let range):
            if let input, let slice = input.getSlice(at: input.readerIndex + range.lowerBound, length: range.count) { return slice }
            return ByteBuffer()
        case .copied(let copied):
            return ByteBuffer(bytes: copied)
        }
    }

    // MARK: header mapping

    /// HTTP/2 header fields for end-to-end `headers`: names lower case (RFC 9113 §8.2.1),
    /// connection-specific fields already gone (`HTTP1HeadFields.isConnectionSpecific`), and `te`
    /// kept only as `trailers` (§8.2.2).
    static func fields(_ headers: HTTPHeaders) -> [HTTP2HeaderField] {
        var fields: [HTTP2HeaderField] = []
        fields.reserveCapacity(headers.count)
        for (name, value) in headers {
            let lower = name.lowercased()
            if lower == "te" {
                if value.lowercased() != "trailers" { continue }
            } else if HTTP1HeadFields.isConnectionSpecific(lower) {
                continue
            }
            fields.append(HTTP2HeaderField(lower, value))
        }
        return fields
    }

    /// The regular (non-pseudo) fields of an HTTP/2 header block as HTTP/1.1 headers,
    /// end-to-end only. Split `cookie` fields are joined with "; " into one, as an
    /// HTTP/1.1 peer expects (RFC 9113 §8.2.3).
    ///
    /// The pairs go into an array that becomes the headers whole: `HTTPHeaders.add` scanned
    /// every name for non-ASCII bytes, and nghttp2 has already refused any name that is not
    /// a lower-case token (RFC 9113 §8.2.1).
    static func headers(_ fields: [HTTP2HeaderField]) -> HTTPHeaders {
        var pairs: [(String, String)] = []
        pairs.reserveCapacity(fields.count)
        var cookies: [String] = []
        // A pseudo-field's name starts with a colon; a byte compare (`hasPrefix` was a
        // generic string search per field).
        for field in fields where field.name.utf8.first != UInt8(ascii: ":") {
            if field.name == "cookie" {
                cookies.append(field.value)
            } else if field.name == "te" {
                if field.value.lowercased() == "trailers" { pairs.append(("te", "trailers")) }
            } else if !HTTP1HeadFields.isConnectionSpecific(field.name) {
                pairs.append((field.name, field.value))
            }
        }
        if !cookies.isEmpty { pairs.append(("cookie", cookies.joined(separator: "; "))) }
        return HTTPHeaders(pairs)
    }

    /// The value of pseudo-header `name` in `fields`, if present.
    static func pseudo(_ name: String, in fields: [HTTP2HeaderField]) -> String? {
        fields.first { $0.name == name }?.value
    }
}
