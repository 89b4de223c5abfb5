import NIOCore

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
/// answer, then puts the real handlers (TLS first) in its place and hands them any bytes
/// that followed the answer. The pin check still runs end to end, on the TLS inside.
final class ProxyTunnelHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private static let maximumHead = 16 * 1024

    private let target: String
    private let onFailure: (Error) -> Void
    private let makeHandlers: () throws -> [ChannelHandler]
    private var received: [UInt8] = []
    private var scanner = HTTPHeadScanner()
    private var done = false

    /// `makeHandlers` builds what replaces this handler once the tunnel is open.
    init(target: String, onFailure: @escaping (Error) -> Void, makeHandlers: @escaping () throws -> [ChannelHandler]) {
        self.target = target
        self.onFailure = onFailure
        self.makeHandlers = makeHandlers
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { sendConnect(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        sendConnect(context: context)
        context.fireChannelActive()
    }

    private func sendConnect(context: ChannelHandlerContext) {
        var request = context.channel.allocator.buffer(capacity: 128)
        request.writeString("CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n\r\n")
        context.writeAndFlush(wrapOutboundOut(request), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        received.append(contentsOf: unwrapInboundIn(data).readableBytesView)
        guard let end = scanner.end(in: received)?.bodyStart else {
            if received.count > Self.maximumHead { fail(context: context, "the parent proxy's answer head is over 16 KiB") }
            return
        }
        let statusLine = String(decoding: received.prefix { $0 != UInt8(ascii: "\r") && $0 != UInt8(ascii: "\n") }, as: UTF8.self)
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            fail(context: context, "the parent proxy answered something that is not HTTP: \(statusLine.prefix(80))")
            return
        }
        guard (200..<300).contains(status) else {
            var error = ParentProxyError(description: "the parent proxy refused CONNECT \(target): \(statusLine)", status: status)
            let head = String(decoding: received[..<end], as: UTF8.self)
            for line in head.split(whereSeparator: \.isNewline) {
                let parts = line.split(separator: ":", maxSplits: 1)
                guard parts.count == 2 else { continue }
                let value = parts[1].trimmingCharacters(in: .whitespaces)
                switch parts[0].lowercased() {
                case "pingate-refusal": error.refusal = value
                case "pingate-observed-fingerprint": error.observedFingerprint = value
                default: break
                }
            }
            done = true
            onFailure(error)
            context.close(promise: nil)
            return
        }
        done = true
        let leftover = Array(received[end...])
        received = []
        do {
            try context.pipeline.syncOperations.addHandlers(makeHandlers(), position: .after(self))
        } catch {
            fail(context: context, "cannot set up the tunnel: \(error)")
            return
        }
        if !leftover.isEmpty {
            var buffer = context.channel.allocator.buffer(capacity: leftover.count)
            buffer.writeBytes(leftover)
            context.fireChannelRead(wrapInboundOut(buffer))
        }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !done { onFailure(ParentProxyError(description: "the parent proxy closed the connection before answering CONNECT")) }
        context.fireChannelInactive()
    }

    private func fail(context: ChannelHandlerContext, _ message: String) {
        done = true
        onFailure(ParentProxyError(description: message))
        context.close(promise: nil)
    }
}
