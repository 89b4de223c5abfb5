import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
import PinGate
import PinGateNIO
import PinList
import Synchronization

/// The attacker's decision policy: with it, the gate's core becomes a Charles-like
/// intercepting proxy. It mints forged leaves from its own CA (the core does that for
/// any admitted tunnel), trusts whatever upstream it reaches, offers only HTTP/1.1 so
/// what it intercepts stays readable, and records each tunnel's first request.
public struct InterceptingDecisionPolicy: DecisionPolicy {
    /// Where intercepted requests are recorded.
    public let log: InterceptionLog

    /// An attacker recording into `log`.
    public init(log: InterceptionLog) {
        self.log = log
    }

    /// Never: an attacker connects to anything.
    public func refusalBeforeConnecting(host: String, port: Int, list: PinList?, now: Date) -> Verdict? { nil }

    /// HTTP/1.1 only, whatever is configured: the recorder reads HTTP/1 heads.
    public func upstreamALPNOffer(configured: [String]) -> [String] { ["http/1.1"] }

    /// Trusted, whatever the upstream presented: that is the point of the attack.
    public func verdict(host: String, leaf: CertificateHashes?, chain: PinPolicy.ChainCheck, list: PinList?, now: Date) -> Verdict {
        .trusted(fingerprint: leaf?.certificateSHA256 ?? "none")
    }

    /// The recorder, reading the tunnel's first request head and body prefix.
    public func makeTunnelInspectors(target: String) -> [ChannelHandler] {
        [InterceptionRecorder(log: log, target: target)]
    }

    /// False: the attacker relays bytes (its recorder reads them as they pass).
    public var inspectsRequests: Bool { false }

    /// False: an interceptor dials whatever it is asked, loopback origins included (the
    /// harness and the tests run it against origins on 127.0.0.1).
    public var refusesInternalDestinations: Bool { false }
}

/// What an intercepting proxy read from a tunnel: the proof that interception worked.
public final class InterceptionLog: Sendable {
    /// One intercepted request.
    public struct Entry: Sendable, Equatable, Codable {
        /// When it was read.
        public var time: Date
        /// The CONNECT target.
        public var target: String
        /// The request line's method, e.g. `POST`.
        public var method: String
        /// The request line's path.
        public var path: String
        /// The `Host` header.
        public var host: String
        /// The first bytes of the body (at most 64), as text.
        public var bodyPrefix: String
    }

    private let entries = Mutex<[Entry]>([])

    /// An empty log.
    public init() {}

    /// Everything intercepted so far, oldest first.
    public var all: [Entry] { entries.withLock { $0 } }

    func record(_ entry: Entry) { entries.withLock { $0.append(entry) } }
}

/// Sits between the attacker's TLS (client side) and the relay, reads the first HTTP/1
/// request head and the start of its body, records them, and passes every byte on as it
/// came. The reading is NIOHTTP1's (llhttp), on a copy of the bytes: a decoder of its own
/// in an `EmbeddedChannel`, since the relay behind must see the bytes themselves.
final class InterceptionRecorder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// How much is read before the recorder gives up on a head.
    private static let limit = 16 * 1024
    /// How much of a body is recorded.
    private static let bodyPrefixBytes = 64
    private let log: InterceptionLog
    private let target: String
    /// Made on the tunnel's loop, on the first bytes (an embedded channel belongs to the
    /// thread that made it).
    private var reader: EmbeddedChannel?
    private var head: HTTPRequestHead?
    private var body: [UInt8] = []
    /// The first bytes as they came, recorded when they are not HTTP.
    private var raw: [UInt8] = []
    private var seen = 0
    private var recorded = false

    init(log: InterceptionLog, target: String) {
        self.log = log
        self.target = target
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if !recorded { read(unwrapInboundIn(data)) }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !recorded && seen > 0 { recordWhatWasRead() }
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        _ = try? reader?.finish(acceptAlreadyClosed: true)
        reader = nil
    }

    private func read(_ bytes: ByteBuffer) {
        seen += bytes.readableBytes
        raw += bytes.readableBytesView.prefix(Self.bodyPrefixBytes - raw.count)
        let reader = self.reader ?? EmbeddedChannel(handler: ByteToMessageHandler(HTTPRequestDecoder()))
        self.reader = reader
        do {
            try reader.writeInbound(bytes)
            while let part = try reader.readInbound(as: HTTPServerRequestPart.self) {
                switch part {
                case .head(let read):
                    head = read
                case .body(let chunk):
                    body += chunk.readableBytesView.prefix(Self.bodyPrefixBytes - body.count)
                    // The body's first bytes are what an attacker wants (a password form):
                    // recorded as soon as some came.
                    return recordWhatWasRead()
                case .end:
                    return recordWhatWasRead()
                }
            }
        } catch {
            // Not HTTP/1.1: what came is recorded as it was.
            return recordWhatWasRead()
        }
        if seen >= Self.limit { recordWhatWasRead() }
    }

    private func recordWhatWasRead() {
        recorded = true
        _ = try? reader?.finish(acceptAlreadyClosed: true)
        reader = nil
        guard let head else {
            log.record(.init(time: Date(), target: target, method: "?", path: "?", host: "?", bodyPrefix: String(decoding: raw, as: UTF8.self)))
            return
        }
        log.record(.init(time: Date(), target: target, method: head.method.rawValue, path: head.uri,
                         host: head.headers.first(name: "host") ?? "", bodyPrefix: String(decoding: body, as: UTF8.self)))
    }
}
