import NIOCore
import NIOEmbedded
import NIOHTTP1
@testable import PinGate

/// The gate's reading of a proxy request head, without a socket: NIOHTTP1's decoder and
/// `ConnectHeadHandler` as `ConnectHandler` puts them in front of itself, in an
/// `EmbeddedChannel`, with `ConnectHeadCheck` applied to the head as the handler's machine
/// does. The unit tests feed it chosen bytes; the fuzz target (Fuzz/, through a symbolic
/// link) feeds it arbitrary ones.
public final class ConnectHeadReader {
    /// What the bytes fed so far amount to.
    public enum Outcome: Equatable, Sendable {
        /// The head is not complete yet.
        case needMoreBytes
        /// A CONNECT request, and the bytes that followed its head (handed on as they came).
        case request(ConnectRequest, leftover: [UInt8])
        /// The head is refused.
        case rejected(HeadRejection)
    }

    /// Stands where `ConnectHandler` stands: hears the head and the bytes after it.
    private final class Recorder: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let maximumHeadBytes: Int
        var decided: Result<ConnectRequest, HeadRejection>?
        /// How many heads or refusals came (one at most, or the decoder read on).
        var verdicts = 0
        var leftover: [UInt8] = []
        /// Errors that came past the head's reading (the connection's own).
        var errors = 0

        init(maximumHeadBytes: Int) {
            self.maximumHeadBytes = maximumHeadBytes
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            leftover += unwrapInboundIn(data).readableBytesView
        }

        func errorCaught(context: ChannelHandlerContext, error: Error) {
            errors += 1
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            guard let event = event as? ConnectHeadEvent else { return }
            verdicts += 1
            switch event {
            case .head(let head): decided = ConnectHeadCheck.check(head)
            case .unreadable(let error): decided = .failure(ConnectHeadCheck.rejection(for: error, maximumHeadBytes: maximumHeadBytes))
            }
        }
    }

    private let channel = EmbeddedChannel()
    private let recorder: Recorder

    /// A connection whose heads may be `maximumHeadBytes` long (the gate's default 16 KiB).
    public init(maximumHeadBytes: Int = 16 * 1024) throws {
        recorder = Recorder(maximumHeadBytes: maximumHeadBytes)
        try channel.pipeline.syncOperations.addHandler(recorder)
        try ConnectHeadHandler.add(before: recorder, to: channel.pipeline.syncOperations, maximumHeadBytes: maximumHeadBytes)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 50000)).wait()
    }

    /// The channel is closed with the reader: an open one keeps its pipeline alive.
    deinit {
        _ = try? channel.finish(acceptAlreadyClosed: true)
    }

    /// Feeds `bytes` as one read; what everything fed so far amounts to.
    public func feed(_ bytes: some Sequence<UInt8>) throws -> Outcome {
        try channel.writeInbound(ByteBuffer(bytes: Array(bytes)))
        // What the loop does after a read: the decoder's removal, which NIO defers to a task.
        channel.embeddedEventLoop.run()
        return outcome
    }

    /// What everything fed so far amounts to.
    public var outcome: Outcome {
        switch recorder.decided {
        case nil: return .needMoreBytes
        case .success(let request)?: return .request(request, leftover: recorder.leftover)
        case .failure(let rejection)?: return .rejected(rejection)
        }
    }

    /// How many heads or refusals the decoder reported: never more than one.
    public var verdicts: Int { recorder.verdicts }

    /// Errors that reached the handler behind (`ConnectHandler`'s place), not taken as a
    /// head's refusal.
    public var errorsPassedOn: Int { recorder.errors }

    /// The decoder's objections `ConnectHeadHandler` took after the head (0 once it left).
    public var objectionsAfterHead: Int {
        (try? channel.pipeline.syncOperations.handler(type: ConnectHeadHandler.self))?.objectionsAfterHead ?? 0
    }

    /// The connection's own error (a reset, say), raised where the socket would raise it.
    public func connectionFailed(_ error: Error) {
        channel.pipeline.fireErrorCaught(error)
    }

    /// The client half-closes (its FIN, with half-closure allowed).
    public func inputClosed() throws -> Outcome {
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        channel.embeddedEventLoop.run()
        return outcome
    }

    /// Whether the decoder and `ConnectHeadHandler` are still in the pipeline.
    public var decoding: Bool {
        (try? channel.pipeline.syncOperations.handler(type: ConnectHeadHandler.self)) != nil
    }

    /// One head, whole, as one read.
    public static func read(_ text: String, maximumHeadBytes: Int = 16 * 1024) throws -> Outcome {
        try ConnectHeadReader(maximumHeadBytes: maximumHeadBytes).feed(Array(text.utf8))
    }
}
