import Foundation
import Logging

/// A swift-log handler that writes each record as one JSON object per line: the
/// decision log. Metadata values become JSON fields (numbers stay numbers), next to
/// `ts`, `level` and `message`.
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
    public init(destination: Destination) throws {
        switch destination {
        case .standardError: writer = try BackgroundLineWriter(.standardError, purpose: "decision log")
        case .file(let path): writer = try BackgroundLineWriter(.file(path), purpose: "decision log")
        }
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
        var object: [String: Any] = [
            "ts": RFC3339Timestamp.string(Date()),
            "level": event.level.rawValue,
            "message": event.message.description,
        ]
        for (key, value) in metadata.merging(event.metadata ?? [:], uniquingKeysWith: { _, new in new }) {
            object[key] = Self.json(value)
        }
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]) else { return }
        writer.enqueue(data)
    }

    private static func json(_ value: Logger.Metadata.Value) -> Any {
        switch value {
        case .string(let text):
            if let number = Int(text), String(number) == text { return number }
            return text
        case .stringConvertible(let convertible): return convertible.description
        case .array(let values): return values.map(json)
        case .dictionary(let values): return values.mapValues(json)
        }
    }
}
