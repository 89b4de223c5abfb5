import Foundation
import NIOCore
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
/// request head and the start of its body, records them, and passes every byte on.
final class InterceptionRecorder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private static let limit = 16 * 1024
    private let log: InterceptionLog
    private let target: String
    private var seen: [UInt8] = []
    private var scanner = HTTPHeadScanner()
    private var recorded = false

    init(log: InterceptionLog, target: String) {
        self.log = log
        self.target = target
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if !recorded {
            seen.append(contentsOf: unwrapInboundIn(data).readableBytesView.prefix(Self.limit - seen.count))
            recordIfComplete(final: seen.count >= Self.limit)
        }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !recorded && !seen.isEmpty { recordIfComplete(final: true) }
        context.fireChannelInactive()
    }

    private func recordIfComplete(final: Bool) {
        guard let end = scanner.end(in: seen) else {
            if final { record(method: "?", path: "?", host: "?", body: String(decoding: seen, as: UTF8.self)) }
            return
        }
        let head = String(decoding: seen[..<end.headEnd], as: UTF8.self)
        let lines = head.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).map(String.init)
        let requestLine = lines.first?.split(separator: " ") ?? []
        let hostHeader = lines.dropFirst().first { $0.lowercased().hasPrefix("host:") }
            .map { String($0.dropFirst(5)).trimmingCharacters(in: .whitespaces) } ?? ""
        let body = String(decoding: seen[end.bodyStart...].prefix(64), as: UTF8.self)
        let length = lines.dropFirst().first { $0.lowercased().hasPrefix("content-length:") }
            .flatMap { Int($0.dropFirst(15).trimmingCharacters(in: .whitespaces)) } ?? 0
        // Wait a little for the body's first bytes when one is announced.
        if body.isEmpty && length > 0 && !final { return }
        record(method: requestLine.first.map(String.init) ?? "?",
               path: requestLine.dropFirst().first.map(String.init) ?? "?", host: hostHeader, body: body)
    }

    private func record(method: String, path: String, host: String, body: String) {
        recorded = true
        seen = []
        log.record(.init(time: Date(), target: target, method: method, path: path, host: host, bodyPrefix: body))
    }
}
