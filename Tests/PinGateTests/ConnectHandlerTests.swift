import Foundation
import Logging
import NIOCore
import NIOEmbedded
import PinGateCA
import PinGateTestSupport
import PinList
import PinListService
import Testing
@testable import PinGate
@testable import PinGateNIO
@testable import PinGateTLS

/// `ConnectHandler` in an `EmbeddedChannel`: no sockets, a virtual clock, and an upstream
/// that is another embedded channel on the same loop. The client's TLS is real (the
/// engine over memory, trusting the gate's CA), so admission, the deadline and the join
/// run exactly as on the wire.
@Suite("CONNECT handler in an embedded channel")
struct ConnectHandlerTests {
    static let host = "pay.example.test"

    /// Says `trusted` for `pinned` hosts and refuses the rest before connecting.
    struct ScriptedPolicy: DecisionPolicy {
        let pinned: Set<String>
        let verdict: Verdict

        func refusalBeforeConnecting(host: String, port: Int, list: PinList?, now: Date) -> Verdict? {
            pinned.contains(host) ? nil : .empty
        }
        func upstreamALPNOffer(configured: [String]) -> [String] { configured }
        func verdict(host: String, leaf: CertificateHashes?, chain: PinPolicy.ChainCheck, list: PinList?, now: Date) -> Verdict { verdict }
        func makeTunnelInspectors(target: String) -> [ChannelHandler] { [] }
        // The embedded tests drive the admission and the join of a byte relay.
        var inspectsRequests: Bool { false }
    }

    /// Hands out upstreams that the test completes. Only touched from the test's thread,
    /// which is the embedded loop's.
    final class ScriptedDialer: UpstreamDialer, @unchecked Sendable {
        var dials: [(host: String, port: Int, promise: EventLoopPromise<UpstreamConnection>)] = []

        func connect(host: String, port: Int, alpnOffer: [String]?, on eventLoop: EventLoop,
                     countRelayed: @escaping GlueHandler.ByteCounter) -> EventLoopFuture<UpstreamConnection> {
            let promise = eventLoop.makePromise(of: UpstreamConnection.self)
            dials.append((host, port, promise))
            return promise.futureResult
        }
    }

    /// One client connection under test, its gate environment and its upstream.
    struct Harness {
        let loop: EmbeddedEventLoop
        let client: EmbeddedChannel
        let dialer: ScriptedDialer
        let environment: GateEnvironment
        let caPath: String
        let directory: TemporaryDirectory
        /// The handler under test, weakly: a closed connection must leave nothing behind.
        weak var handler: ConnectHandler?

        init(verdict: Verdict = .trusted(fingerprint: "AAAA"), configure: (inout GateConfiguration) -> Void = { _ in }) throws {
            directory = try TemporaryDirectory()
            let ca = try LocalCA.create(stateDirectory: directory.path)
            caPath = LocalCA.Paths(stateDirectory: directory.path).certificate
            var configuration = GateConfiguration()
            configure(&configuration)
            dialer = ScriptedDialer()
            let quiet = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }
            environment = GateEnvironment(
                configuration: configuration, store: PinListStore(nil),
                decisionPolicy: ScriptedPolicy(pinned: [ConnectHandlerTests.host], verdict: verdict),
                minter: try LeafMinter(ca: ca), connector: dialer, statistics: GateStatistics(), tunnels: TunnelRegistry(),
                reporter: nil, updater: nil, refusals: RefusalLog(capacity: 10), decisionLogger: quiet,
                requestLog: try RequestLog(destination: .off, includeQuery: false), logger: quiet, now: { Date() })
            loop = EmbeddedEventLoop()
            client = EmbeddedChannel(loop: loop)
            let handler = ConnectHandler(environment: environment)
            self.handler = handler
            try client.pipeline.syncOperations.addHandler(handler)
            try client.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 50000)).wait()
        }

        /// An upstream on the same loop: an active embedded channel with an unpaired glue.
        func makeUpstream(alpn: String? = nil) throws -> (UpstreamConnection, EmbeddedChannel) {
            try Self.makeUpstream(on: loop, alpn: alpn)
        }

        /// An upstream on `loop`: an active embedded channel with an unpaired glue.
        static func makeUpstream(on loop: EmbeddedEventLoop, alpn: String? = nil) throws -> (UpstreamConnection, EmbeddedChannel) {
            let glue = GlueHandler(countRelayed: { _ in })
            let channel = EmbeddedChannel(handler: glue, loop: loop)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 443)).wait()
            let leaf = try CertificateBuilder.selfSignedCA(commonName: "upstream", key: try PrivateKey.generateP256(), validity: 3600)
            let peer = TLSPeerSummary(leaf: leaf, verifyCode: 0, verifyReason: "ok", alpn: alpn, protocolVersion: "TLSv1.3", chain: [leaf],
                                      verifiedChain: [leaf])
            let upstream = UpstreamConnection(
                channel: channel, glue: NIOLoopBound(glue, eventLoop: loop), peer: peer,
                leaf: CertificateHashes(leaf),
                verifiedChain: [CertificateHashes(leaf)],
                handshakeDuration: .milliseconds(1))
            return (upstream, channel)
        }

        func send(_ text: String) throws {
            try client.writeInbound(ByteBuffer(string: text))
            // What the loop does after a read: the head decoder's removal, which NIO defers
            // to a task, hands on the bytes after the head.
            loop.run()
        }

        /// Everything the handler wrote to the client so far, as text.
        func written() throws -> String {
            var text = ""
            while let buffer = try client.readOutbound(as: ByteBuffer.self) {
                text += String(buffer: buffer)
            }
            return text
        }

        func finish() {
            _ = try? client.finish()
            directory.remove()
        }
    }

    @Test("an unpinned host is refused 403 empty, with no upstream dialled, and the connection closes")
    func refusedWithoutDialling() throws {
        let harness = try Harness()
        defer { harness.finish() }
        try harness.send("CONNECT other.example.test:443 HTTP/1.1\r\n\r\n")
        let answer = try harness.written()
        #expect(answer.hasPrefix("HTTP/1.1 403 Forbidden\r\n"))
        #expect(answer.contains("Pingate-Refusal: empty\r\n"))
        #expect(harness.dialer.dials.isEmpty)
        #expect(!harness.client.isActive)
        #expect(harness.environment.statistics.snapshot.count(.empty) == 1)
        #expect(harness.environment.refusals.entries.last?.reason == .empty)
        harness.loop.run()
        #expect(harness.handler == nil, "a refused connection leaves nothing behind")
    }

    @Test("a head that never completes gets 408 when the virtual clock passes the head timeout")
    func headTimeout() throws {
        let harness = try Harness { $0.headTimeout = .seconds(5) }
        defer { harness.finish() }
        try harness.send("CONNECT pay.example.test:443 HTTP/1.1\r\n")
        harness.loop.advanceTime(by: .seconds(4))
        #expect(try harness.written().isEmpty)
        harness.loop.advanceTime(by: .seconds(1))
        #expect(try harness.written().hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
        #expect(!harness.client.isActive)
    }

    @Test("an untrusted upstream is refused 502 on the CONNECT and closed; no 200 is ever written")
    func untrustedUpstream() throws {
        let harness = try Harness(verdict: .untrusted(observed: "BBBB", expected: ["AAAA"]))
        defer { harness.finish() }
        try harness.send("CONNECT pay.example.test:443 HTTP/1.1\r\n\r\n")
        #expect(harness.dialer.dials.count == 1)
        #expect(harness.dialer.dials.first?.host == Self.host)
        let (upstream, upstreamChannel) = try harness.makeUpstream()
        harness.dialer.dials[0].promise.succeed(upstream)
        let answer = try harness.written()
        #expect(answer.hasPrefix("HTTP/1.1 502 Bad Gateway\r\n"))
        #expect(answer.contains("Pingate-Refusal: pin-mismatch\r\n"))
        #expect(!answer.contains("200 Connection established"))
        #expect(!upstreamChannel.isActive)
        #expect(!harness.client.isActive)
    }

    @Test("a client that says nothing after the 200: at the deadline both legs close and the timeout is counted")
    func clientHandshakeDeadline() throws {
        let harness = try Harness { $0.clientHandshakeTimeout = .seconds(3) }
        defer { harness.finish() }
        try harness.send("CONNECT pay.example.test:443 HTTP/1.1\r\n\r\n")
        let (upstream, upstreamChannel) = try harness.makeUpstream()
        harness.dialer.dials[0].promise.succeed(upstream)
        #expect(try harness.written() == "HTTP/1.1 200 Connection established\r\n\r\n")
        #expect(harness.environment.statistics.snapshot.openTunnels == 1)
        harness.loop.advanceTime(by: .milliseconds(2_999))
        #expect(harness.client.isActive && upstreamChannel.isActive)
        harness.loop.advanceTime(by: .milliseconds(1))
        #expect(!harness.client.isActive)
        #expect(!upstreamChannel.isActive)
        let stats = harness.environment.statistics.snapshot
        #expect(stats.clientHandshakeTimeouts == 1)
        #expect(stats.clientHandshakeFailures == 0)
        #expect(stats.openTunnels == 0)
        harness.loop.run()
        #expect(harness.handler == nil, "a connection cut at the deadline leaves nothing behind")
    }

    @Test("the client leaves while the upstream connects: the upstream that arrives later is closed")
    func clientLeavesDuringConnect() throws {
        let harness = try Harness()
        defer { harness.finish() }
        try harness.send("CONNECT pay.example.test:443 HTTP/1.1\r\n\r\n")
        try harness.client.close().wait()
        let (upstream, upstreamChannel) = try harness.makeUpstream()
        harness.dialer.dials[0].promise.succeed(upstream)
        #expect(!upstreamChannel.isActive)
        #expect(harness.environment.statistics.snapshot.openTunnels == 0)
        harness.loop.run()
        #expect(harness.handler == nil)
    }

    @Test("the upstream closes before the client's handshake is done: the client is closed too")
    func upstreamLeavesBeforeJoin() throws {
        let harness = try Harness()
        defer { harness.finish() }
        try harness.send("CONNECT pay.example.test:443 HTTP/1.1\r\n\r\n")
        let (upstream, upstreamChannel) = try harness.makeUpstream()
        harness.dialer.dials[0].promise.succeed(upstream)
        _ = try harness.written()
        try upstreamChannel.close().wait()
        harness.loop.run() // the close's callbacks are queued on the loop
        #expect(!harness.client.isActive)
        harness.loop.run()
        #expect(harness.handler == nil)
    }

    @Test("a real TLS client (with its ClientHello sent early) completes the handshake on the minted leaf; the handler leaves and bytes relay both ways")
    func joinsAfterHandshake() throws {
        let harness = try Harness()
        defer { harness.finish() }
        let tlsClient = try TLSConnection(
            clientOf: try TLSContext.client(trustRoots: .pemFiles([harness.caPath])),
            options: .init(expectedHost: Self.host, alpnOffer: nil))
        // The ClientHello rides in the same packet as the CONNECT, as eager clients do.
        #expect(tlsClient.handshake() == .needsMoreInput)
        var first = ByteBuffer(string: "CONNECT pay.example.test:443 HTTP/1.1\r\n\r\n")
        first.writeBytes(Self.drain(tlsClient))
        try harness.client.writeInbound(first)
        harness.loop.run()
        let (upstream, upstreamChannel) = try harness.makeUpstream()
        harness.dialer.dials[0].promise.succeed(upstream)

        // The 200 comes out in clear, before any TLS record.
        var out = try #require(try harness.client.readOutbound(as: ByteBuffer.self))
        #expect(out.readString(length: 39) == "HTTP/1.1 200 Connection established\r\n\r\n")
        var toClient = Array(out.readableBytesView)
        var rounds = 0
        while tlsClient.handshake() != .complete && rounds < 10 {
            while let buffer = try harness.client.readOutbound(as: ByteBuffer.self) { toClient += buffer.readableBytesView }
            toClient.withUnsafeBytes { tlsClient.feedCiphertext($0) }
            toClient = []
            _ = tlsClient.handshake()
            let reply = Self.drain(tlsClient)
            if !reply.isEmpty { try harness.client.writeInbound(ByteBuffer(bytes: reply)) }
            rounds += 1
        }
        #expect(tlsClient.handshake() == .complete)
        #expect(tlsClient.peerSummary().chainAndHostnameValid, "the minted leaf must validate for the host")
        #expect((try? harness.client.pipeline.syncOperations.handler(type: ConnectHandler.self)) == nil,
                "the driver leaves the pipeline once the tunnel is joined")
        #expect(harness.environment.tunnels.count == 1)

        // Client → upstream: plaintext arrives at the upstream leg.
        try Array("GET / HTTP/1.1\r\n\r\n".utf8).withUnsafeBytes { try tlsClient.writePlaintext($0) }
        try harness.client.writeInbound(ByteBuffer(bytes: Self.drain(tlsClient)))
        let atUpstream = try #require(try upstreamChannel.readOutbound(as: ByteBuffer.self))
        #expect(String(buffer: atUpstream) == "GET / HTTP/1.1\r\n\r\n")

        // Upstream → client: encrypted for the client, decrypted by it.
        try upstreamChannel.writeInbound(ByteBuffer(string: "HTTP/1.1 204 No Content\r\n\r\n"))
        while let buffer = try harness.client.readOutbound(as: ByteBuffer.self) {
            buffer.withUnsafeReadableBytes { tlsClient.feedCiphertext($0) }
        }
        var plaintext = [UInt8](repeating: 0, count: 256)
        let outcome = plaintext.withUnsafeMutableBytes { tlsClient.readPlaintext(into: $0) }
        guard case .bytes(let count) = outcome else {
            Issue.record("expected plaintext, got \(outcome)")
            return
        }
        #expect(String(decoding: plaintext.prefix(count), as: UTF8.self) == "HTTP/1.1 204 No Content\r\n\r\n")
        #expect(harness.environment.statistics.snapshot.clientHandshakeTimeouts == 0)
        // The deadline was cancelled by the join: much later, the tunnel is still up.
        harness.loop.advanceTime(by: .seconds(60))
        #expect(harness.client.isActive && upstreamChannel.isActive)
    }

    @Test("a client that leaves while its upstream is reopened for its ALPN offer: the paused handshake is abandoned and the late upstream closed")
    func clientLeavesDuringALPNReconnect() throws {
        let harness = try Harness()
        defer { harness.finish() }
        // The client offers only http/1.1; the upstream chose h2: the gate pauses at the
        // ClientHello and dials a second upstream with the client's offer.
        let tlsClient = try TLSConnection(
            clientOf: try TLSContext.client(trustRoots: .pemFiles([harness.caPath])),
            options: .init(expectedHost: Self.host, alpnOffer: ["http/1.1"]))
        _ = tlsClient.handshake()
        try harness.send("CONNECT pay.example.test:443 HTTP/1.1\r\n\r\n")
        let (first, firstChannel) = try harness.makeUpstream(alpn: "h2")
        harness.dialer.dials[0].promise.succeed(first)
        #expect(try harness.written() == "HTTP/1.1 200 Connection established\r\n\r\n")
        try harness.client.writeInbound(ByteBuffer(bytes: Self.drain(tlsClient)))
        #expect(harness.dialer.dials.count == 2, "a second upstream is dialled with the client's offer")
        #expect(!firstChannel.isActive, "the first upstream is closed")

        try harness.client.close().wait()
        harness.loop.run()
        let (second, secondChannel) = try harness.makeUpstream(alpn: "http/1.1")
        harness.dialer.dials[1].promise.succeed(second)
        #expect(!secondChannel.isActive, "the upstream that arrives after the client left is closed")
        #expect(harness.environment.statistics.snapshot.openTunnels == 0)
        harness.loop.run()
        #expect(harness.handler == nil, "the paused handshake still holds the connection (a promise left pending)")
    }

    /// Everything the TLS engine has queued to send.
    static func drain(_ connection: TLSConnection) -> [UInt8] {
        var bytes: [UInt8] = []
        while connection.pendingCiphertextCount > 0 {
            var chunk = [UInt8](repeating: 0, count: connection.pendingCiphertextCount)
            let count = chunk.withUnsafeMutableBytes { connection.takeCiphertext(into: $0) }
            bytes += chunk.prefix(count)
        }
        return bytes
    }
}
