import Foundation
import Logging
import PinGateNIO

/// A swift-log handler that writes each record as one JSON object per line: the
/// decision log. Metadata values become JSON fields (numbers stay numbers), next to
/// `ts`, `level` and `message`.
public struct JSONLineLogHandler: LogHandler {
    /// Where lines go.
    public enum Destination: Sendable {
        case standardError
        case file(String)
    }

    private let sink: LineSink
    /// The handler's metadata, merged under each record's.
    public var metadata: Logger.Metadata = [:]
    /// The minimum level written.
    public var logLevel: Logger.Level = .info

    /// A handler writing to `destination` (a file is opened for appending, created 0640).
    public init(destination: Destination) throws {
        sink = try LineSink(destination)
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var object: [String: Any] = [
            "ts": ISO8601DateFormatter.withFractionalSeconds.string(from: Date()),
            "level": event.level.rawValue,
            "message": event.message.description,
        ]
        for (key, value) in metadata.merging(event.metadata ?? [:], uniquingKeysWith: { _, new in new }) {
            object[key] = Self.json(value)
        }
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]) else { return }
        sink.write(data + Data("\n".utf8))
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

    /// Serializes writes from many threads into whole lines.
    private final class LineSink: @unchecked Sendable {
        private let lock = NSLock()
        private let handle: FileHandle

        init(_ destination: Destination) throws {
            switch destination {
            case .standardError:
                handle = FileHandle.standardError
            case .file(let path):
                if !FileManager.default.fileExists(atPath: path) {
                    guard FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o640]) else {
                        throw ConfigurationError("cannot create decision log \(path)")
                    }
                }
                guard let opened = FileHandle(forWritingAtPath: path) else { throw ConfigurationError("cannot open decision log \(path)") }
                opened.seekToEndOfFile()
                handle = opened
            }
        }

        func write(_ data: Data) {
            lock.lock()
            defer { lock.unlock() }
            handle.write(data)
        }
    }
}

extension ISO8601DateFormatter {
    /// `2026-11-22T06:00:00.123Z`.
    static var withFractionalSeconds: ISO8601DateFormatter {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter
    }
}
