import Foundation
import Logging
import PinGateNIO
import Synchronization

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

    /// One metadata value of this handler.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes `event` as one JSON line.
    public func log(event: LogEvent) {
        var object: [String: Any] = [
            "ts": Self.timestamp(Date()),
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

    /// `date` as RFC 3339 UTC with milliseconds, `2026-11-22T06:00:00.123Z`: what
    /// `ISO8601DateFormatter` with fractional seconds writes, rounding included. Built by hand: a Foundation
    /// formatter per line was the decision log's main cost, and a shared one is not
    /// documented as safe across threads.
    static func timestamp(_ date: Date) -> String {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded())
        var seconds = time_t(milliseconds.floorDivided(by: 1000))
        let fraction = Int(milliseconds - Int64(seconds) * 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ value: Int32, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(fraction), 3))Z"
    }

    /// Serializes writes from many threads into whole lines: one `write(2)` loop per
    /// line under a lock, so lines from different connections never interleave.
    private final class LineSink: Sendable {
        private let descriptor: Mutex<Int32>
        private let ownsDescriptor: Bool

        init(_ destination: Destination) throws {
            switch destination {
            case .standardError:
                descriptor = Mutex(STDERR_FILENO)
                ownsDescriptor = false
            case .file(let path):
                // Created 0640 if missing; appended to, so several runs share one log.
                let opened = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o640)
                guard opened >= 0 else {
                    throw ConfigurationError("cannot open decision log \(path): \(String(cString: strerror(errno)))")
                }
                descriptor = Mutex(opened)
                ownsDescriptor = true
            }
        }

        deinit {
            if ownsDescriptor { descriptor.withLock { _ = close($0) } }
        }

        func write(_ data: Data) {
            descriptor.withLock { descriptor in
                data.withUnsafeBytes { buffer in
                    guard var next = buffer.baseAddress else { return }
                    var remaining = buffer.count
                    while remaining > 0 {
                        let written = Glibc.write(descriptor, next, remaining)
                        if written < 0 {
                            if errno == EINTR { continue }
                            return // a log that cannot be written must not stop the gate
                        }
                        next += written
                        remaining -= written
                    }
                }
            }
        }
    }
}

private extension Int64 {
    /// Division rounding towards minus infinity (dates before 1970 stay correct).
    func floorDivided(by divisor: Int64) -> Int64 {
        let quotient = self / divisor
        return (self % divisor != 0 && (self < 0) != (divisor < 0)) ? quotient - 1 : quotient
    }
}
