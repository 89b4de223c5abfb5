import NIOCore
import NIOHTTP1
import PinGateNIO

/// Encodes the requests the gate sends an HTTP/1.1 upstream: the request line and fields in
/// one pass into a buffer from the loop's recycler, a body as it came (between a chunk's size
/// line and its CRLF when chunked), and the end (the last chunk and the trailers).
///
/// In place of NIO's `HTTPRequestEncoder`, which wrote each name, separator, value and line
/// end with a buffer write of its own into a buffer it allocated per head (issue 32). The
/// requests still pass NIO's response decoder as `HTTPClientRequestPart`s before they reach
/// this handler: the decoder learns each request's method from them (an answer to `HEAD`
/// has no body). The gate frames every request itself (`RequestBodyFraming.applyHTTP1`); the
/// body is chunked when the head's first `Transfer-Encoding` field says exactly `chunked`,
/// as NIO's encoder with its automatic framing off decided. The tests hold the bytes to that
/// encoder's.
final class HTTP1RequestEncoderHandler: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = ByteBuffer

    /// The request being written is chunked.
    private var chunked = false
    /// Reached on the loop's thread.
    private lazy var recycler = ByteBufferRecycler.forCurrentThread()

    /// A head buffer's first size: most requests' heads fit (a larger one grows).
    private static let headBufferSize = 512

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head(let head):
            chunked = head.version.major == 1 && head.version.minor >= 1 && head.headers.first(name: "transfer-encoding") == "chunked"
            var buffer = recycler.take(minimumCapacity: Self.headBufferSize, allocator: context.channel.allocator)
            Self.writeHead(head, into: &buffer)
            context.write(wrapOutboundOut(buffer), promise: promise)
            recycler.give(buffer)
        case .body(.byteBuffer(let bytes)):
            guard chunked, bytes.readableBytes > 0 else {
                context.write(wrapOutboundOut(bytes), promise: promise)
                return
            }
            var size = context.channel.allocator.buffer(capacity: 18)
            size.writeString(String(bytes.readableBytes, radix: 16))
            size.writeStaticString("\r\n")
            context.write(wrapOutboundOut(size), promise: nil)
            context.write(wrapOutboundOut(bytes), promise: nil)
            // Writes complete in order: the last one's promise covers the three.
            context.write(wrapOutboundOut(HTTP1ResponseWriter.chunkEnd), promise: promise)
        case .body(.fileRegion):
            // The gate forwards bytes it read, never a file: nothing to encode, and the TLS
            // handler behind could not take one.
            promise?.fail(ChannelError.operationUnsupported)
        case .end(let trailers):
            let wasChunked = chunked
            chunked = false
            guard wasChunked else {
                if let promise { context.write(wrapOutboundOut(context.channel.allocator.buffer(capacity: 0)), promise: promise) }
                return
            }
            var buffer = context.channel.allocator.buffer(capacity: 64)
            HTTP1ResponseWriter.writeLastChunk(trailers: trailers, into: &buffer)
            context.write(wrapOutboundOut(buffer), promise: promise)
        }
    }

    /// Appends `head`'s request line and fields, as NIO's encoder spells them.
    static func writeHead(_ head: HTTPRequestHead, into buffer: inout ByteBuffer) {
        let method = head.method.rawValue
        let version: String
        switch (head.version.major, head.version.minor) {
        case (1, 1): version = "HTTP/1.1"
        case (0, 1): version = "HTTP/1.0"  // as NIO's encoder spells HTTP/0.1 (it reads the pair swapped)
        default: version = "HTTP/\(head.version.major).\(head.version.minor)"
        }
        let size = method.utf8.count + 1 + head.uri.utf8.count + 1 + version.utf8.count + 2
            + HTTP1ResponseWriter.fieldsSize(head.headers) + 2
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { space in
            var at = HTTP1ResponseWriter.copy(method, to: space, at: 0)
            space[at] = UInt8(ascii: " ")
            at = HTTP1ResponseWriter.copy(head.uri, to: space, at: at + 1)
            space[at] = UInt8(ascii: " ")
            at = HTTP1ResponseWriter.copy(version, to: space, at: at + 1)
            at = HTTP1ResponseWriter.crlf(space, at: at)
            at = HTTP1ResponseWriter.copyFields(head.headers, to: space, at: at)
            return HTTP1ResponseWriter.crlf(space, at: at)
        }
    }
}
