import NIOCore
import NIOHTTP1

/// The bytes of the HTTP/1.1 answers the gate writes to a client, encoded by the gate: a
/// head in one pass into one buffer, a body as it came (between a chunk's size line and its
/// CRLF when chunked), and the end (the last chunk and the trailers).
///
/// Why not NIO's `HTTPResponseEncoder`: every answer's parts went through it as
/// `HTTPServerResponsePart`s in `NIOAny` (a dynamic cast per part), each head as an
/// `HTTPResponseHead` (an allocation) encoded by a write per name, separator, value and line
/// end (about 25 exclusivity-checked buffer writes for a typical answer) into a buffer of its
/// own (another allocation). The gate already decides every answer's framing
/// (`ResponseBodyFraming`); this only spells it. Issue 32 measured it with callgrind.
///
/// The rules are NIO's, which the tests hold it to byte for byte: a body is chunked when the
/// head's first `Transfer-Encoding` field says exactly `chunked` on HTTP/1.1; an answer to
/// `HEAD` or `CONNECT` carries no body and no last chunk, whatever its head says; an interim
/// `1xx` other than `101` leaves the state to the final answer that follows. One rule is
/// stricter than NIO's: a `101` is never chunked (what follows it is the switched protocol).
struct HTTP1ResponseWriter {
    /// The answer being written is chunked.
    private(set) var chunked = false
    /// The answer being written answers `HEAD` or `CONNECT`: no body bytes go out.
    private(set) var bodySuppressed = false

    /// The two bytes after each chunk's data.
    static let chunkEnd: ByteBuffer = ByteBufferAllocator().buffer(staticString: "\r\n")

    /// Appends the status line and the fields of an answer to a request with `requestMethod`
    /// (nil: the answer to no request, a refusal of bytes that were not one), and takes the
    /// framing of the body that follows from them.
    mutating func writeHead(version: HTTPVersion, status: Int, headers: HTTPHeaders, requestMethod: HTTPMethod?,
                            into buffer: inout ByteBuffer) {
        if !(100..<200).contains(status) || status == 101 {
            bodySuppressed = requestMethod == .HEAD || requestMethod == .CONNECT
            // After a 101 the connection carries another protocol: never a last chunk of
            // ours in its bytes, whatever the head said (the gate's framing drops the field).
            chunked = !bodySuppressed && status != 101 && version.major == 1 && version.minor >= 1
                && headers.first(name: "transfer-encoding") == "chunked"
        }
        let reason = HTTPResponseStatus(statusCode: status).reasonPhrase
        let statusLine: String
        switch (version.major, version.minor) {
        case (1, 1): statusLine = "HTTP/1.1 "
        case (1, 0): statusLine = "HTTP/1.0 "
        default: statusLine = "HTTP/\(version.major).\(version.minor) "
        }
        // Three digits written in place; any other code (never from a parser) as NIO spells it.
        let code = (100...999).contains(status) ? nil : String(status)
        let size = statusLine.utf8.count + (code?.utf8.count ?? 3) + 1 + reason.utf8.count + 2 + Self.fieldsSize(headers) + 2
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { space in
            var at = Self.copy(statusLine, to: space, at: 0)
            if let code {
                at = Self.copy(code, to: space, at: at)
            } else {
                space[at] = UInt8(ascii: "0") + UInt8(status / 100)
                space[at + 1] = UInt8(ascii: "0") + UInt8(status / 10 % 10)
                space[at + 2] = UInt8(ascii: "0") + UInt8(status % 10)
                at += 3
            }
            space[at] = UInt8(ascii: " ")
            at = Self.copy(reason, to: space, at: at + 1)
            at = Self.crlf(space, at: at)
            at = Self.copyFields(headers, to: space, at: at)
            return Self.crlf(space, at: at)
        }
    }

    /// The size line that goes before `count` bytes of body, when chunked and not empty
    /// (an empty chunk would end the body); nil when the bytes go as they are.
    func chunkHead(count: Int, allocator: ByteBufferAllocator) -> ByteBuffer? {
        guard chunked, count > 0 else { return nil }
        let digits = String(count, radix: 16)
        var buffer = allocator.buffer(capacity: digits.utf8.count + 2)
        buffer.writeString(digits)
        buffer.writeStaticString("\r\n")
        return buffer
    }

    /// Ends the answer and makes the writer ready for the next one: true when it was
    /// chunked, so its last chunk (`writeLastChunk`) must follow.
    mutating func endAnswer() -> Bool {
        defer {
            chunked = false
            bodySuppressed = false
        }
        return chunked
    }

    /// Appends a chunked body's end: the last chunk, the trailers and the empty line.
    static func writeLastChunk(trailers: HTTPHeaders?, into buffer: inout ByteBuffer) {
        let size = 3 + (trailers.map(fieldsSize) ?? 0) + 2
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { space in
            space[0] = UInt8(ascii: "0")
            var at = crlf(space, at: 1)
            if let trailers { at = copyFields(trailers, to: space, at: at) }
            return crlf(space, at: at)
        }
    }

    /// The bytes `name: value\r\n` take for every field.
    static func fieldsSize(_ headers: HTTPHeaders) -> Int {
        var size = 0
        for (name, value) in headers { size += name.utf8.count + 2 + value.utf8.count + 2 }
        return size
    }

    /// Copies every field as `name: value\r\n` to `space` at `start`; returns where they end.
    static func copyFields(_ headers: HTTPHeaders, to space: UnsafeMutableRawBufferPointer, at start: Int) -> Int {
        var at = start
        for (name, value) in headers {
            at = copy(name, to: space, at: at)
            space[at] = UInt8(ascii: ":")
            space[at + 1] = UInt8(ascii: " ")
            at = copy(value, to: space, at: at + 2)
            at = crlf(space, at: at)
        }
        return at
    }

    /// Writes CRLF at `at`; returns where it ends.
    static func crlf(_ space: UnsafeMutableRawBufferPointer, at: Int) -> Int {
        space[at] = UInt8(ascii: "\r")
        space[at + 1] = UInt8(ascii: "\n")
        return at + 2
    }

    /// Copies `text`'s UTF-8 bytes to `space` at `at`; returns where they end.
    static func copy(_ text: String, to space: UnsafeMutableRawBufferPointer, at: Int) -> Int {
        let count = text.utf8.count
        let target = UnsafeMutableRawBufferPointer(rebasing: space[at..<(at + count)])
        if text.utf8.withContiguousStorageIfAvailable({ target.copyMemory(from: UnsafeRawBufferPointer($0)) }) == nil {
            _ = target.copyBytes(from: text.utf8)
        }
        return at + count
    }
}
