import NIOCore
import NIOHTTP1
import PinGateNIO

/// What `ConnectHeadHandler` tells `ConnectHandler` (a user inbound event).
enum ConnectHeadEvent {
    /// The decoder read a request head.
    case head(HTTPRequestHead)
    /// The decoder could not read the head (`ConnectHeadCheck.rejection` says how to refuse it).
    case unreadable(any Error)
}

/// Reads the proxy request head with NIOHTTP1's decoder (llhttp), for `ConnectHandler`, and
/// then leaves with the decoder.
///
/// Pipeline, on a new client connection: the decoder (`ByteToMessageHandler` of
/// `HTTPRequestDecoder`), this handler, then `ConnectHandler`, which adds the first two in
/// front of itself. The head goes on as `ConnectHeadEvent.head`. llhttp takes a CONNECT
/// as the end of HTTP on the connection (the tunnel's bytes follow, RFC 9110 §9.3.6): the
/// request ends with its head and the decoder stops. Both handlers then leave, and the
/// decoder hands on the bytes that followed the head, as they came (`.forwardBytes`: a
/// client's early ClientHello; one that half-closed in the same read loses them, which
/// matters nothing, as its handshake cannot finish). A head the decoder refuses goes on as
/// `.unreadable`, and nothing more is read; after any other method's head (refused) both
/// stay, and take what the client still sends.
final class ConnectHeadHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = Never

    private enum State {
        /// The head has not been read.
        case reading
        /// A head was passed on; a CONNECT's end is awaited.
        case afterHead(isConnect: Bool)
        /// The head was refused, or the handler is leaving.
        case done
    }

    private var state = State.reading
    /// The decoder's objections after the head, taken here: reads past its bound after a
    /// refused upgrade request, or what followed a refused head. (For the tests: a count
    /// that stays 0 while a refused client's bytes pile up would say the bound is gone.)
    private(set) var objectionsAfterHead = 0

    /// What the decoder may hold after a head: a CONNECT's early bytes (as many as
    /// `ConnectStateMachine` takes) until the decoder has left.
    static let maximumBytesAfterHead = 64 * 1024

    /// Adds the decoder and this handler in front of `handler` (the connection's
    /// `ConnectHandler`), for heads of at most `maximumHeadBytes`.
    static func add(before handler: ChannelHandler, to pipeline: ChannelPipeline.SynchronousOperations, maximumHeadBytes: Int) throws {
        let decoder = HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes,
                                         limitConfiguration: HTTPHeadLimits.decoder(maximumHeadBytes: maximumHeadBytes))
        // Bounded: after a refused upgrade request (a GET with `Upgrade`), llhttp stops and
        // the decoder would keep everything the client sends during the refusal's linger.
        // Past the bound it drops what comes, with an error this handler takes.
        let bounded = ByteToMessageHandler(decoder, maximumBufferSize: maximumHeadBytes + maximumBytesAfterHead)
        try pipeline.addHandlers([bounded, ConnectHeadHandler()], position: .before(handler))
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch (state, unwrapInboundIn(data)) {
        case (.reading, .head(let head)):
            state = .afterHead(isConnect: head.method == .CONNECT)
            context.fireUserInboundEventTriggered(ConnectHeadEvent.head(head))
        case (.afterHead(isConnect: true), .end):
            state = .done
            leave(context: context)
        case (.reading, _), (.afterHead, _), (.done, _):
            // Another method's body, or what follows it: its head was refused, and this
            // handler stays to take whatever the decoder still reports (its errors too), so
            // that the refusal's linger is not cut short by them. llhttp gives no part
            // before a head.
            break
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // The connection's own errors (a reset, a TLS-less read failing) are `ConnectHandler`'s.
        guard Self.isDecoders(error) else {
            context.fireErrorCaught(error)
            return
        }
        // After the head, the decoder's objections are to what a refused client still sends.
        guard case .reading = state else {
            objectionsAfterHead += 1
            return
        }
        state = .done
        // A client that closed mid-head is not refused: the end of input made the decoder
        // object, and `ConnectHandler` hears the close itself. (One that only half-closed is:
        // its head can never end.)
        guard context.channel.isActive else { return }
        context.fireUserInboundEventTriggered(ConnectHeadEvent.unreadable(error))
    }

    /// Whether `error` is the decoder's: llhttp's, NIO's HTTP decoding's, or the bound's.
    private static func isDecoders(_ error: any Error) -> Bool {
        error is HTTPParserError || error is NIOHTTPDecoderError || error is ByteToMessageDecoderError
            || error is ByteToMessageDecoderError.PayloadTooLargeError
    }

    /// This handler first, then the decoder: the bytes it hands on as it leaves go to
    /// `ConnectHandler`, never to this handler, which reads only request parts.
    private func leave(context: ChannelHandlerContext) {
        let pipeline = context.pipeline.syncOperations
        let decoder = try? pipeline.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
        pipeline.removeHandler(context: context, promise: nil)
        if let decoder { pipeline.removeHandler(decoder, promise: nil) }
    }
}
