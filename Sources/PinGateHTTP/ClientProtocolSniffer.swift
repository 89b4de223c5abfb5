import NIOCore

/// What a client's first bytes inside a tunnel say it speaks, decided as soon as they can
/// be told apart and without sockets (tested on bytes alone).
///
/// - `http2`: the connection preface `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n` (RFC 9113 §3.4),
///   whole: a client that knows the origin speaks h2 ("prior knowledge", no ALPN).
/// - `http1`: a request line's method, a token of at most 20 characters followed by a
///   space (RFC 9112 §3), after any empty lines a server should ignore (§2.2).
/// - `notHTTP`: anything else (another TLS protocol, garbage), which the gate refuses
///   unless the host is an opaque host (then the tunnel is a byte relay from the start).
struct FirstBytesClassifier {
    /// The verdict on the bytes so far.
    enum Verdict: Equatable {
        /// More bytes are needed.
        case undecided
        /// HTTP/1.x.
        case http1
        /// HTTP/2 with prior knowledge.
        case http2
        /// Neither; the text says what was seen.
        case notHTTP(String)
    }

    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
    static let longestMethod = 20

    /// Classifies the bytes a client sent first (all of them so far).
    static func classify(_ bytes: ByteBufferView) -> Verdict {
        let newline: Set<UInt8> = [UInt8(ascii: "\r"), UInt8(ascii: "\n")]
        let rest = bytes.drop { newline.contains($0) }
        guard !rest.isEmpty else { return .undecided }
        // The preface wins only whole ("PRI " alone could start a request line too).
        let head = rest.prefix(preface.count)
        if preface.starts(with: head) { return head.count == preface.count ? .http2 : .undecided }
        for (offset, byte) in rest.enumerated() {
            if byte == UInt8(ascii: " ") {
                return offset > 0 ? .http1 : .notHTTP("the first line starts with a space")
            }
            guard isTokenCharacter(byte) else {
                return .notHTTP("byte 0x\(String(byte, radix: 16)) where an HTTP method or the HTTP/2 preface belongs")
            }
            if offset >= longestMethod { return .notHTTP("no HTTP method in the first \(longestMethod) bytes") }
        }
        return .undecided
    }

    /// RFC 9110 §5.6.2 `tchar`.
    static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return Array("!#$%&'*+-.^_`|~".utf8).contains(byte)
        }
    }
}

/// Holds a tunnel's first client bytes until `FirstBytesClassifier` has decided what they
/// are, then hands them, and the channel, to the side for that protocol (`decided`), and
/// leaves the pipeline. Nothing is passed on before the decision, so nothing skips the
/// checks of the side that takes over.
final class ClientProtocolSniffer: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// The most bytes held while undecided (the preface is 24; a method 20 plus CRLFs).
    static let limit = 1024

    private var held: ByteBuffer?
    private let decided: (ChannelHandlerContext, FirstBytesClassifier.Verdict) -> Void

    /// A sniffer that calls `decided` once, with a verdict that is not `.undecided`.
    init(decided: @escaping (ChannelHandlerContext, FirstBytesClassifier.Verdict) -> Void) {
        self.decided = decided
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = unwrapInboundIn(data)
        if held == nil {
            held = incoming
        } else {
            held?.writeBuffer(&incoming)
        }
        guard let bytes = held else { return }
        var verdict = FirstBytesClassifier.classify(bytes.readableBytesView)
        if verdict == .undecided && bytes.readableBytes > Self.limit { verdict = .notHTTP("no request line in \(Self.limit) bytes") }
        guard verdict != .undecided else { return }
        held = nil
        decided(context, verdict)
        // The side for the protocol is now behind this handler: the bytes go to it, and
        // this handler leaves.
        context.fireChannelRead(wrapInboundOut(bytes))
        context.fireChannelReadComplete()
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            // The client half-closed before saying anything decidable: no request will come.
            context.close(promise: nil)
            return
        }
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
            return
        }
        if event is TunnelDrainEvent {
            // The gate is draining and the client has not sent its first request: nothing is
            // in flight, so the tunnel ends now rather than hold the drain.
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
