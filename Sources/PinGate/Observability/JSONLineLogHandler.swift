import Foundation
import Logging

/// A swift-log handler that writes each record as one JSON object per line: the
/// decision log, and the operational log with `log-format: json`. Metadata values become
/// JSON fields (numbers stay numbers), next to `ts`, `level` and `message`.
///
/// A line is formatted on the logging thread and written by a background thread (see
/// `BackgroundLineWriter`): call `flush()` before the process exits, or the last lines
/// may be lost.
public struct JSONLineLogHandler: LogHandler {
    /// Where lines go.
    public enum Destination: Sendable {
        /// The process's standard error.
        case standardError
        /// A file, opened for appending (several runs share one log), created 0640.
        case file(String)
    }

    private let writer: BackgroundLineWriter
    /// The handler's metadata, merged under each record's.
    public var metadata: Logger.Metadata = [:]
    /// The minimum level written.
    public var logLevel: Logger.Level = .info

    /// A handler writing to `destination` (a file is opened for appending, created 0640).
    /// - Parameters:
    ///   - purpose: which log this is, for the error when its file cannot be opened.
    public init(destination: Destination, purpose: String = "decision log") throws {
        switch destination {
        case .standardError: writer = try BackgroundLineWriter(.standardError, purpose: purpose)
        case .file(let path): writer = try BackgroundLineWriter(.file(path), purpose: purpose)
        }
    }

    /// Opens its file again (log rotation: SIGHUP); nothing for standard error.
    public func reopen() async throws {
        try await writer.reopen()
    }

    /// Blocks until every line logged before the call is written: for shutdown, so the
    /// last decisions are not lost with the process.
    public func flush() {
        writer.flush()
    }

    /// `flush()`, giving up after `timeout` (a stderr nobody reads must not keep the
    /// process from exiting); false when it gave up.
    @discardableResult
    public func flush(timeout: Duration) -> Bool {
        writer.flush(timeout: timeout)
    }

    /// Lines dropped since the start because the writer had fallen too far behind.
    public var droppedLines: Int { writer.droppedLines }

    /// One metadata value of this handler.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes `event` as one JSON line.
    public func log(event: LogEvent) {
        writer.enqueue(Self.line(event, handlerMetadata: metadata))
    }

    /// `event`'s JSON object, without the newline: `ts`, `level` and `message`, then the
    /// handler's metadata and the event's (the event's win), keys in Swift's string order
    /// (by code point: the same as before for the lowercase snake_case keys the gate logs).
    static func line(_ event: LogEvent, handlerMetadata: Logger.Metadata, now: Date = Date()) -> [UInt8] {
        enum Field {
            case time(Date)
            case text(String)
            case metadata(Logger.Metadata.Value)
        }
        var fields: [String: Field] = ["ts": .time(now), "level": .text(event.level.rawValue), "message": .text(event.message.description)]
        for (key, value) in handlerMetadata { fields[key] = .metadata(value) }
        for (key, value) in event.metadata ?? [:] { fields[key] = .metadata(value) }
        var line: [UInt8] = []
        line.reserveCapacity(512)
        JSONLineText.appendObject(fields.sorted { $0.key < $1.key }, to: &line) { field, bytes in
            switch field {
            case .time(let date):
                bytes.append(UInt8(ascii: "\""))
                RFC3339Timestamp.append(date, to: &bytes)
                bytes.append(UInt8(ascii: "\""))
            case .text(let text):
                JSONLineText.appendString(text, to: &bytes)
            case .metadata(let value):
                JSONLineText.append(value, to: &bytes)
            }
        }
        return line
    }
}
