import Foundation
import NIOCore
import Synchronization

/// What the gate is: the pinning gate, or (for the MITM test harness) a Charles-like
/// attacker that mints forged leaves from its own CA, forwards without pinning, and
/// records what it could read.
public enum GateRole: Sendable {
    /// Pin, refuse, relay.
    case gate
    /// Intercept everything and record it in the log.
    case attacker(InterceptionLog)
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
        let text = String(decoding: seen, as: UTF8.self)
        guard let headEnd = text.range(of: "\r\n\r\n") else {
            if final { record(method: "?", path: "?", host: "?", body: text) }
            return
        }
        let head = text[..<headEnd.lowerBound]
        let lines = head.components(separatedBy: "\r\n")
        let requestLine = lines.first?.split(separator: " ") ?? []
        let hostHeader = lines.dropFirst().first { $0.lowercased().hasPrefix("host:") }
            .map { String($0.dropFirst(5)).trimmingCharacters(in: .whitespaces) } ?? ""
        let body = String(text[headEnd.upperBound...].prefix(64))
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
