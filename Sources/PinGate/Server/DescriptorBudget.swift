import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// How many client connections the gate holds at once, from its own descriptor limit.
///
/// Why: a process out of descriptors does not fail cleanly. Accepting fails while the
/// listener stays readable, dials fail, and libdispatch (which runs Swift's timers and
/// signal sources here) retries what it cannot open, spinning a core (issue 12 measured a
/// full core with `nofile` 256 and 400 clients). So the gate never lets connections take
/// the last descriptors: each connection may need two (client and upstream leg), and
/// `reserve` are kept for everything else (the admin endpoint, list and state files, the
/// runtime's own). A connection beyond the cap is answered `503 over-capacity` and closed.
enum DescriptorBudget {
    /// Descriptors kept free for what is not a tunnel.
    static let reserve = 64

    /// The most client connections that fit under the current soft `RLIMIT_NOFILE`. Read
    /// at each accept (one system call), so a limit lowered on the running process
    /// (`prlimit --pid`) holds from the next connection on.
    static func connectionCap() -> Int {
        #if canImport(Glibc)
        var limit = rlimit()
        // RLIM_INFINITY is all ones (rlim_t.max); Swift cannot import its C spelling.
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else {
            return Int.max
        }
        return max(1, (Int(clamping: limit.rlim_cur) - reserve) / 2)
        #else
        return Int.max
        #endif
    }
}

/// Put on a connection accepted beyond `DescriptorBudget.connectionCap()`: answers
/// `503` with `Pingate-Refusal: over-capacity` as soon as the connection is active, reads
/// nothing, and closes.
final class OverCapacityHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private static let response: String = {
        let body = "pingate is holding as many connections as its descriptor limit allows; try again later\n"
        return "HTTP/1.1 503 Service Unavailable\r\nPingate-Refusal: \(DecisionReason.overCapacity.rawValue)\r\n"
            + "Content-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n" + body
    }()

    func channelActive(context: ChannelHandlerContext) {
        let buffer = context.channel.allocator.buffer(string: Self.response)
        context.writeAndFlush(wrapOutboundOut(buffer)).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // The request is not read: the answer does not depend on it.
    }
}
