import NIOCore
import NIOEmbedded
import Testing
@testable import PinGateNIO

/// The CONNECT to a parent proxy and the reading of its answer (NIOHTTP1's codecs in front
/// of `ProxyTunnelHandler`), in an `EmbeddedChannel`: what is sent, what opens the tunnel,
/// and what is refused. No sockets (the tunnel through tinyproxy is `HarnessTests`').
@Suite("CONNECT through a parent proxy")
struct ProxyTunnelHandlerTests {
    /// Stands for the TLS handler that takes over: records what reaches it.
    final class Successor: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        var received: [UInt8] = []
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received += unwrapInboundIn(data).readableBytesView
        }
    }

    final class Harness {
        let channel = EmbeddedChannel()
        let successor = Successor()
        var failures: [ParentProxyError] = []

        init() throws {
            let handler = ProxyTunnelHandler(target: "a.test:443", onFailure: { [weak self] error in
                self?.failures.append(error as? ParentProxyError ?? ParentProxyError(description: "\(error)"))
            }, makeHandlers: { [successor] in [successor] })
            try ProxyTunnelHandler.add(handler, to: channel.pipeline.syncOperations)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 3128)).wait()
        }

        deinit {
            _ = try? channel.finish(acceptAlreadyClosed: true)
        }

        /// What the gate wrote to the parent, as text.
        func written() throws -> String {
            var text = ""
            while let buffer = try channel.readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
            return text
        }

        /// The parent's bytes, one read, then a turn of the loop.
        func answer(_ text: String) throws {
            try channel.writeInbound(ByteBuffer(string: text))
            channel.embeddedEventLoop.run()
        }

        var opened: Bool { (try? channel.pipeline.syncOperations.handler(type: Successor.self)) != nil }
        var codecsLeft: Bool { (try? channel.pipeline.syncOperations.handler(type: ProxyTunnelHandler.self)) == nil }
    }

    @Test("the CONNECT names the target in its line and Host; a 200 ends with its head, the codecs leave, and the next handler gets what the parent sends after")
    func opens() throws {
        let harness = try Harness()
        #expect(try harness.written() == "CONNECT a.test:443 HTTP/1.1\r\nhost: a.test:443\r\n\r\n")
        try harness.answer("HTTP/1.1 200 Connection established\r\nVia: 1.1 parent\r\n\r\n")
        #expect(harness.opened && harness.codecsLeft)
        #expect(harness.failures.isEmpty)
        try harness.channel.writeInbound(ByteBuffer(bytes: [0x16, 0x03, 0x03]))
        #expect(harness.successor.received == [0x16, 0x03, 0x03])
        // What the next handler writes passes as bytes (no codec is left to take it for a request).
        try harness.channel.writeAndFlush(ByteBuffer(bytes: [0x16, 0x03, 0x01])).wait()
        #expect(try harness.channel.readOutbound(as: ByteBuffer.self).map { Array($0.readableBytesView) } == [0x16, 0x03, 0x01])
    }

    @Test("a refusal names the parent's status and, from a pingate parent, its refusal and observed fingerprint; the connection closes")
    func refused() throws {
        let harness = try Harness()
        try harness.answer("HTTP/1.1 502 Bad Gateway\r\nPingate-Refusal: pin-mismatch\r\nPingate-Observed-Fingerprint: OBS=\r\nContent-Length: 3\r\n\r\nno\n")
        #expect(harness.failures.count == 1)
        #expect(harness.failures.first?.status == 502)
        #expect(harness.failures.first?.refusal == "pin-mismatch")
        #expect(harness.failures.first?.observedFingerprint == "OBS=")
        #expect(harness.failures.first?.description == "the parent proxy refused CONNECT a.test:443: 502 Bad Gateway")
        #expect(!harness.channel.isActive && !harness.opened)
    }

    @Test("refused, the tunnel never opens: bytes after the 200 before the ClientHello, an answer that is not HTTP, a bare LF, a head over 16 KiB, a close before the answer", arguments: [
        ("HTTP/1.1 200 OK\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", "sent more after its answer"),
        ("HTTP/1.1 200 OK\r\n\r\n\u{16}\u{03}\u{03}", "sent more after its answer"),
        ("SSH-2.0-OpenSSH\r\n\r\n", "not HTTP"),
        ("HTTP/1.1 200 OK\nVia: x\n\n", "not HTTP"),
        ("HTTP/1.1 200 OK\r\nX: \(String(repeating: "a", count: 17 * 1024))\r\n\r\n", "over 16 KiB"),
        ("", "closed the connection before answering"),
    ])
    func refusedAnswers(answer: String, saying: String) throws {
        let harness = try Harness()
        if answer.isEmpty {
            try harness.channel.close().wait()
        } else {
            try harness.answer(answer)
        }
        #expect(harness.failures.count == 1)
        #expect(harness.failures.first?.description.contains(saying) == true, "\(harness.failures)")
        #expect(!harness.opened)
        #expect(!harness.channel.isActive)
    }
}
