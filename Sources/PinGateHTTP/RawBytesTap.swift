import NIOCore

/// The last handler of a leg whose HTTP codecs left for a relayed protocol (a WebSocket
/// carried across HTTP versions): the raw bytes the TLS handler decrypts arrive here as
/// `ByteBuffer`s and go to the side's own relay logic, which owns the exchange, the
/// router and the credits. Reads and writes keep passing the side, which is in front.
final class RawBytesTap: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private let onBytes: (ByteBuffer) -> Void

    /// A tap handing every buffer to `onBytes`.
    init(_ onBytes: @escaping (ByteBuffer) -> Void) {
        self.onBytes = onBytes
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        onBytes(unwrapInboundIn(data))
    }
}
