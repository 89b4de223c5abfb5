import NIOCore
import NIOHTTP1

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
/// client's early ClientHello). A head the decoder refuses goes on as `.unreadable`, and
/// nothing more is read; after any other method's head (refused) both stay, and take
/// what the client still sends.
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

    /// Adds the decoder and this handler in front of `handler` (the connection's
    /// `ConnectHandler`), for heads of at most `maximumHeadBytes`.
    static func add(before handler: ChannelHandler, to pipeline: ChannelPipeline.SynchronousOperations, maximumHeadBytes: Int) throws {
        let decoder = HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes,
                                         limitConfiguration: ConnectHeadCheck.decoderLimits(maximumHeadBytes: maximumHeadBytes))
        try pipeline.addHandlers([ByteToMessageHandler(decoder), ConnectHeadHandler()], position: .before(handler))
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
        guard case .reading = state else { return }
        state = .done
        // A client that closed mid-head is not refused: the end of input made the decoder
        // object, and `ConnectHandler` hears the close itself.
        guard context.channel.isActive else { return }
        context.fireUserInboundEventTriggered(ConnectHeadEvent.unreadable(error))
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
