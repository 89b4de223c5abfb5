import NIOCore

/// Joins two channels into a tunnel: what one side reads, the other side writes.
///
/// Backpressure: a side stops reading while its partner's channel is not writable, and
/// starts again when it becomes writable, so a slow reader never makes the gate buffer
/// without bound. Half-close: end of input on one side closes the partner's output
/// (which, under TLS, sends close_notify first); a channel whose input and output are
/// both done closes.
///
/// Before it is paired a glue buffers what it reads (an HTTP/2 server speaks first),
/// and stops reading past `unpairedBufferLimit`.
package final class GlueHandler: ChannelDuplexHandler, RemovableChannelHandler {
    package typealias InboundIn = ByteBuffer
    package typealias OutboundIn = ByteBuffer
    package typealias OutboundOut = ByteBuffer

    /// Counts relayed bytes: called with the size of each buffer this side hands over.
    package typealias ByteCounter = @Sendable (Int) -> Void

    private static let unpairedBufferLimit = 1 << 20

    private var partner: GlueHandler?
    private var context: ChannelHandlerContext?
    private var pendingRead = false
    private var unpairedReads: [ByteBuffer] = []
    private var unpairedBytes = 0
    private var inputEnded = false
    private var inputEndedBeforePairing = false
    private var outputEnded = false
    private let countRelayed: ByteCounter

    /// A glue whose reads are counted with `countRelayed`.
    package init(countRelayed: @escaping ByteCounter) {
        self.countRelayed = countRelayed
    }

    /// Joins `first` and `second`, and hands over whatever each read before pairing.
    package static func join(_ first: GlueHandler, _ second: GlueHandler) {
        first.partner = second
        second.partner = first
        first.releaseUnpaired()
        second.releaseUnpaired()
    }

    /// Takes what this unpaired glue buffered (and whether input ended), for a layer that
    /// replaces it at the join; it then holds nothing.
    package func takeUnpaired() -> (reads: [ByteBuffer], inputEnded: Bool) {
        let reads = unpairedReads
        unpairedReads = []
        unpairedBytes = 0
        return (reads, inputEndedBeforePairing)
    }

    private func releaseUnpaired() {
        guard let partner else { return }
        let reads = unpairedReads
        unpairedReads = []
        unpairedBytes = 0
        for buffer in reads {
            countRelayed(buffer.readableBytes)
            partner.partnerWrite(buffer)
        }
        if !reads.isEmpty { partner.partnerFlush() }
        if inputEndedBeforePairing { partner.partnerEndOutput() }
        if pendingRead && partner.partnerWritable {
            pendingRead = false
            context?.read()
        }
    }

    // MARK: channel events

    package func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner = nil
    }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        if let partner {
            countRelayed(buffer.readableBytes)
            partner.partnerWrite(buffer)
        } else {
            unpairedReads.append(buffer)
            unpairedBytes += buffer.readableBytes
        }
    }

    package func channelReadComplete(context: ChannelHandlerContext) {
        partner?.partnerFlush()
    }

    package func channelInactive(context: ChannelHandlerContext) {
        partner?.partnerClose()
        context.fireChannelInactive()
    }

    package func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            inputEnded = true
            if let partner {
                partner.partnerEndOutput()
            } else {
                inputEndedBeforePairing = true
            }
            closeIfBothDirectionsEnded()
        } else if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    package func errorCaught(context: ChannelHandlerContext, error: Error) {
        // Either side failing ends the tunnel; the close propagates via channelInactive.
        context.close(promise: nil)
    }

    package func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { partner?.partnerBecameWritable() }
        context.fireChannelWritabilityChanged()
    }

    // MARK: outbound

    package func read(context: ChannelHandlerContext) {
        let mayRead: Bool
        if let partner {
            mayRead = partner.partnerWritable
        } else {
            mayRead = unpairedBytes < Self.unpairedBufferLimit
        }
        if mayRead {
            context.read()
        } else {
            pendingRead = true
        }
    }

    // MARK: calls from the partner

    private func partnerWrite(_ buffer: ByteBuffer) {
        context?.write(wrapOutboundOut(buffer), promise: nil)
    }

    private func partnerFlush() {
        context?.flush()
    }

    private func partnerEndOutput() {
        guard !outputEnded, let context else { return }
        outputEnded = true
        context.close(mode: .output, promise: nil)
        closeIfBothDirectionsEnded()
    }

    private func partnerClose() {
        context?.close(promise: nil)
    }

    private var partnerWritable: Bool {
        context?.channel.isWritable ?? false
    }

    private func partnerBecameWritable() {
        if pendingRead {
            pendingRead = false
            context?.read()
        }
    }

    private func closeIfBothDirectionsEnded() {
        if inputEnded && outputEnded { context?.close(promise: nil) }
    }
}
