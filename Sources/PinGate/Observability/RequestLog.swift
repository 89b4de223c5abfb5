import Foundation

/// One HTTP request that passed through a tunnel (or that the gate answered itself), as
/// the request log writes it. Never headers or bodies: the log is for auditing who
/// reached what, not for what was said.
public struct RequestRecord: Sendable, Equatable {
    /// When the request started (its head arrived); the line's `ts`.
    public var time: Date
    /// The client's address, `ip:port`.
    public var client: String
    /// The host of the tunnel's CONNECT.
    public var connectHost: String
    /// The port of the tunnel's CONNECT.
    public var connectPort: Int
    /// The request's authority (`Host` or `:authority`), as the HTTP layer normalizes it.
    public var authority: String
    /// The request method.
    public var method: String
    /// The request target as received, origin-form; its query is cut off in the log
    /// unless the log was made with `includeQuery`.
    public var path: String
    /// The response status, the gate's own refusals (e.g. 421) included.
    public var status: Int
    /// Request body bytes relayed client → upstream.
    public var bytesUp: Int
    /// Response body bytes relayed upstream → client.
    public var bytesDown: Int
    /// From the start of the request to the end of its response.
    public var durationMilliseconds: Int
    /// The client's protocol: "HTTP/1.1" or "HTTP/2".
    public var protocolName: String
    /// The protocol spoken to the upstream for this request.
    public var upstreamProtocol: String
    /// The HTTP/2 stream id on the client's side; nil on HTTP/1.1.
    public var streamID: Int?
    /// Why the gate answered the request itself (e.g. "authority-mismatch"); nil when the
    /// upstream answered.
    public var refusal: String?
    /// Why the response was cut after it began ("upstream-closed", "idle-timeout"): the
    /// client got a reset or a short close, not the end. Nil when it ended.
    public var cut: String?

    /// A record with every field given.
    public init(time: Date, client: String, connectHost: String, connectPort: Int, authority: String, method: String,
                path: String, status: Int, bytesUp: Int, bytesDown: Int, durationMilliseconds: Int, protocolName: String,
                upstreamProtocol: String, streamID: Int? = nil, refusal: String? = nil, cut: String? = nil) {
        self.time = time
        self.client = client
        self.connectHost = connectHost
        self.connectPort = connectPort
        self.authority = authority
        self.method = method
        self.path = path
        self.status = status
        self.bytesUp = bytesUp
        self.bytesDown = bytesDown
        self.durationMilliseconds = durationMilliseconds
        self.protocolName = protocolName
        self.upstreamProtocol = upstreamProtocol
        self.streamID = streamID
        self.refusal = refusal
        self.cut = cut
    }
}

/// The request log: one JSON line per HTTP request through a tunnel, to stderr or a file.
///
/// `record` is called on NIO event loops, so it never waits: the line is formatted on the
/// caller (by hand, with sorted keys) and handed to a background writer thread through a
/// bounded queue (10,000 lines or 8 MiB). When the writer has fallen that far behind the
/// line is dropped and counted in `droppedLines`. `flush()` waits for the queue to be
/// written; `PinGateServer` flushes on shutdown.
public final class RequestLog: Sendable {
    /// Where the lines go.
    public enum Destination: Sendable, Equatable {
        /// No log: `record` returns at once and costs nothing.
        case off
        /// The process's standard error.
        case standardError
        /// A file, opened for appending (several runs share one log), created 0640.
        case file(String)
    }

    /// Where the lines go.
    public let destination: Destination
    /// Whether paths keep their query string (off by default: queries carry tokens and
    /// personal data more often than paths do).
    public let includesQuery: Bool
    /// Nil when off.
    private let writer: BackgroundLineWriter?

    /// A log writing to `destination`; throws when the file cannot be opened.
    public convenience init(destination: Destination, includeQuery: Bool) throws {
        try self.init(destination: destination, includeQuery: includeQuery, limits: BackgroundLineWriter.Limits())
    }

    /// A log whose queue has other bounds than the default (tests).
    init(destination: Destination, includeQuery: Bool, limits: BackgroundLineWriter.Limits) throws {
        self.destination = destination
        self.includesQuery = includeQuery
        switch destination {
        case .off: writer = nil
        case .standardError: writer = try BackgroundLineWriter(.standardError, purpose: "request log", limits: limits)
        case .file(let path): writer = try BackgroundLineWriter(.file(path), purpose: "request log", limits: limits)
        }
    }

    /// Whether records are written at all; callers may skip building a record when not.
    public var isEnabled: Bool { writer != nil }

    /// Logs `record` without blocking: formats its line and queues it, or drops it (and
    /// counts the drop) when the queue is full. Does nothing when the log is off.
    public func record(_ record: RequestRecord) {
        guard let writer else { return }
        writer.enqueue(line(record))
    }

    /// Lines dropped since the start because the queue was full.
    public var droppedLines: Int { writer?.droppedLines ?? 0 }

    /// Blocks until every record logged before the call is written: for shutdown and tests.
    /// Opens its file again (log rotation: SIGHUP); nothing when it is off or on stderr.
    public func reopen() async throws {
        try await writer?.reopen()
    }

    public func flush() {
        writer?.flush()
    }

    /// `flush()`, giving up after `timeout` (a stderr nobody reads must not keep the
    /// process from exiting); false when it gave up.
    @discardableResult
    public func flush(timeout: Duration) -> Bool {
        writer?.flush(timeout: timeout) ?? true
    }

    /// `flush()` without blocking a thread: the server's async shutdown uses it.
    func waitUntilWritten() async {
        await writer?.waitUntilWritten()
    }

    /// Lines waiting for the writer thread (tests).
    var queuedLines: Int { writer?.queuedLines ?? 0 }

    /// `record`'s JSON object, without the newline. Keys are written in sorted order by
    /// hand: JSONSerialization would cost a dictionary of `Any` per request.
    func line(_ record: RequestRecord) -> [UInt8] {
        var line: [UInt8] = []
        line.reserveCapacity(320 + record.path.utf8.count + record.authority.utf8.count)
        var separator: UInt8 = UInt8(ascii: "{")
        func key(_ name: StaticString) {
            line.append(separator)
            separator = UInt8(ascii: ",")
            line.append(UInt8(ascii: "\""))
            name.withUTF8Buffer { line.append(contentsOf: $0) }
            line.append(contentsOf: "\":".utf8)
        }
        func field(_ name: StaticString, _ value: String) {
            key(name)
            JSONLineText.appendString(value, to: &line)
        }
        func field(_ name: StaticString, _ value: Int) {
            key(name)
            line.append(contentsOf: String(value).utf8)
        }
        var path = record.path
        if !includesQuery, let query = path.firstIndex(of: "?") { path = String(path[..<query]) }

        field("authority", record.authority)
        field("bytes_down", record.bytesDown)
        field("bytes_up", record.bytesUp)
        field("client", record.client)
        field("connect_host", record.connectHost)
        field("connect_port", record.connectPort)
        if let cut = record.cut { field("cut", cut) }
        field("duration_ms", record.durationMilliseconds)
        field("method", record.method)
        field("path", path)
        field("protocol", record.protocolName)
        if let refusal = record.refusal { field("refusal", refusal) }
        field("status", record.status)
        if let streamID = record.streamID { field("stream_id", streamID) }
        key("ts")
        line.append(UInt8(ascii: "\""))
        RFC3339Timestamp.append(record.time, to: &line)
        line.append(UInt8(ascii: "\""))
        field("upstream_protocol", record.upstreamProtocol)
        line.append(UInt8(ascii: "}"))
        return line
    }
}
