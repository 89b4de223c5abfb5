import NIOCore

/// Sits between an HTTP/1.1 upstream connection's TLS handler and its response decoder,
/// and feeds the decoder as `HTTP1ResponseBoundary` says: bytes no request asked for
/// never reach it (the side closes the connection, out of step), and a response's end is
/// confirmed as a clean boundary only when no byte followed it in its read burst.
final class HTTP1ResponseBoundaryHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// What the side hears: unsolicited bytes arrived (or followed a response's end), or
    /// the response that ended in the last read ended exactly at its end.
    struct Events {
        var unsolicited: () -> Void
        var boundaryReached: () -> Void
    }

    private(set) var boundary = HTTP1ResponseBoundary()
    private let events: Events

    init(events: Events) {
        self.events = events
    }

    /// A request head went out.
    func requestSent() { boundary.requestSent() }

    /// The decoder delivered a final response's end; true when the connection is at a
    /// boundary at once (see `HTTP1ResponseBoundary.responseEnded`).
    func responseEnded() -> Bool { boundary.responseEnded() }

    /// The connection switched protocols: every later byte passes.
    func switchedProtocols() { boundary.switchedProtocols() }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        let count = bytes.readableBytes
        switch boundary.bytesArrived(count) {
        case .whole:
            context.fireChannelRead(data)
        case .split:
            // Slices share the storage: no copy.
            guard let prefix = bytes.readSlice(length: count - 1) else { return }
            context.fireChannelRead(wrapInboundOut(prefix))
            guard boundary.prefixDelivered() else {
                events.unsolicited()
                return
            }
            context.fireChannelRead(wrapInboundOut(bytes))
        case .unsolicited:
            events.unsolicited()
            return
        case .drop:
            return
        }
        boundary.readFed()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // Before the decoder and the side hear of it: the next request goes first, then the
        // side's read-complete flushes the client.
        if boundary.readBurstEnded() { events.boundaryReached() }
        context.fireChannelReadComplete()
    }
}
