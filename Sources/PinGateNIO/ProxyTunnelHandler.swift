import NIOCore
import NIOHTTP1

/// Why a parent proxy did not open the tunnel.
public struct ParentProxyError: Error, CustomStringConvertible, Sendable, Equatable {
    /// What the parent answered, or what went wrong.
    public let description: String
    /// The parent's HTTP status, when it answered.
    public var status: Int?
    /// Its `Pingate-Refusal` header, when the parent is a pingate.
    public var refusal: String?
    /// Its `Pingate-Observed-Fingerprint` header.
    public var observedFingerprint: String?
}

/// Opens a tunnel through a parent HTTP proxy: sends `CONNECT target`, waits for a 2xx
/// answer, then puts the real handlers (TLS first) in its place. The pin check still runs
/// end to end, on the TLS inside.
///
/// The answer is read by NIOHTTP1 (llhttp): `add` puts its request encoder and response
/// decoder in front of this handler. The decoder knows the request was a CONNECT, so a
/// 2xx ends with its head (RFC 9110 §9.3.6). Nothing may follow it before the gate's
/// ClientHello, since a TLS server speaks second. llhttp reads on after the 2xx until the
/// decoder has left, so what does follow is read as a further answer: a whole one, or
/// bytes that cannot start one, refuse the tunnel, as does an answer llhttp cannot read.
/// (The start of an answer that never ends is consumed unseen; the TLS inside is verified
/// end to end whatever the parent does.)
final class ProxyTunnelHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    /// The largest answer head taken from the parent (its status line and fields).
    private static let maximumHead = 16 * 1024

    private enum State {
        /// The CONNECT is out (or about to be); its answer has not ended.
        case awaitingAnswer(headWas2xx: Bool)
        /// A 2xx ended: the codecs are leaving, then the real handlers take this place.
        case opening
        /// Opened, or failed: nothing more is done.
        case finished
    }

    private let target: String
    private let onFailure: (Error) -> Void
    private let makeHandlers: () throws -> [ChannelHandler]
    private var state = State.awaitingAnswer(headWas2xx: false)
    private var sent = false

    /// `makeHandlers` builds what replaces this handler once the tunnel is open.
    init(target: String, onFailure: @escaping (Error) -> Void, makeHandlers: @escaping () throws -> [ChannelHandler]) {
        self.target = target
        self.onFailure = onFailure
        self.makeHandlers = makeHandlers
    }

    /// Adds the codecs and the handler to `pipeline`, which holds nothing else yet.
    static func add(_ handler: ProxyTunnelHandler, to pipeline: ChannelPipeline.SynchronousOperations) throws {
        // The encoder writes the head as given: a CONNECT has no body to frame.
        var encoding = HTTPRequestEncoder.Configuration()
        encoding.automaticallySetFramingHeaders = false
        let encoder = HTTPRequestEncoder(configuration: encoding)
        // `.fireError`: bytes the decoder still holds as it leaves (after a `101`, where llhttp
        // stops) are the parent's, sent before the ClientHello, and refused.
        let decoder = HTTPResponseDecoder(leftOverBytesStrategy: .fireError, informationalResponseStrategy: .drop,
                                          limitConfiguration: HTTPHeadLimits.decoder(maximumHeadBytes: maximumHead))
        try pipeline.addHandlers([encoder, ByteToMessageHandler(decoder), handler])
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { sendConnect(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        sendConnect(context: context)
        context.fireChannelActive()
    }

    private func sendConnect(context: ChannelHandlerContext) {
        guard !sent else { return }
        sent = true
        var headers = HTTPHeaders()
        headers.add(name: "host", value: target)
        let head = HTTPRequestHead(version: .http1_1, method: .CONNECT, uri: target, headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch (state, unwrapInboundIn(data)) {
        case (.awaitingAnswer, .head(let head)) where head.status.code < 200:
            // An interim answer (NIO drops 1xx but 101; a 101 opens nothing here).
            fail(context: context, "the parent proxy answered CONNECT \(target) with \(head.status.code)")
        case (.awaitingAnswer, .head(let head)) where !(200..<300).contains(head.status.code):
            var error = ParentProxyError(description: "the parent proxy refused CONNECT \(target): \(head.status.code) \(head.status.reasonPhrase)",
                                         status: Int(head.status.code))
            error.refusal = head.headers.first(name: "pingate-refusal")
            error.observedFingerprint = head.headers.first(name: "pingate-observed-fingerprint")
            state = .finished
            onFailure(error)
            context.close(promise: nil)
        case (.awaitingAnswer, .head):
            state = .awaitingAnswer(headWas2xx: true)
        case (.awaitingAnswer(headWas2xx: true), .end):
            open(context: context)
        case (.awaitingAnswer, .body), (.awaitingAnswer, .end):
            fail(context: context, "the parent proxy's answer to CONNECT \(target) was not HTTP")
        case (.opening, _):
            fail(context: context, "the parent proxy sent more after its answer to CONNECT \(target), before the TLS handshake")
        case (.finished, _):
            break
        }
    }

    /// The parent opened the tunnel: the codecs leave (the decoder watches what is
    /// written, and would take the TLS handler's records for requests), then the real
    /// handlers take this handler's place.
    private func open(context: ChannelHandlerContext) {
        state = .opening
        let pipeline = context.pipeline.syncOperations
        if let encoder = try? pipeline.handler(type: HTTPRequestEncoder.self) {
            pipeline.removeHandler(encoder, promise: nil)
        }
        guard let decoder = try? pipeline.handler(type: ByteToMessageHandler<HTTPResponseDecoder>.self) else {
            fail(context: context, "cannot set up the tunnel: the answer's decoder is gone")
            return
        }
        // NIO takes a decoder out on a later turn of the loop.
        let removed = context.eventLoop.makePromise(of: Void.self)
        pipeline.removeHandler(decoder, promise: removed)
        removed.futureResult.assumeIsolated().whenComplete { result in
            guard case .opening = self.state else { return }
            do {
                try result.get()
                try pipeline.addHandlers(self.makeHandlers(), position: .after(self))
            } catch {
                self.fail(context: context, "cannot set up the tunnel: \(error)")
                return
            }
            self.state = .finished
            pipeline.removeHandler(context: context, promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        switch state {
        case .awaitingAnswer:
            if case .headerOverflow? = error as? HTTPParserError {
                fail(context: context, "the parent proxy's answer head is over 16 KiB or \(HTTPHeadLimits.maximumFields) fields")
            } else {
                fail(context: context, "the parent proxy answered something that is not HTTP (\(error))")
            }
        case .opening:
            fail(context: context, "the parent proxy sent more after its answer to CONNECT \(target), before the TLS handshake (\(error))")
        case .finished:
            // Refused and closing (once opened, this handler is gone): a refusal's body is
            // read as more answers (none to a CONNECT has one), which llhttp objects to.
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if case .finished = state {} else {
            state = .finished
            onFailure(ParentProxyError(description: "the parent proxy closed the connection before answering CONNECT"))
        }
        context.fireChannelInactive()
    }

    private func fail(context: ChannelHandlerContext, _ message: String) {
        if case .finished = state { return }
        state = .finished
        onFailure(ParentProxyError(description: message))
        context.close(promise: nil)
    }
}
