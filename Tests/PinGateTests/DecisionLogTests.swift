import Foundation
import Logging
import PinGateTestSupport
import Testing
@testable import PinGate

/// The decision log's line format, which dashboards and the command-line tests parse.
@Suite("Decision log")
struct DecisionLogTests {
    @Test("timestamps are RFC 3339 UTC with milliseconds, exactly as ISO8601DateFormatter writes them")
    func timestampFormat() {
        let reference = ISO8601DateFormatter()
        reference.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let dates = [0, 1, 951_782_400.5, 1_795_000_000.123, 1_795_000_000.999, 1_795_000_000.9996, 1_795_000_000.0004, 1_795_000_000.0005, 4_102_444_799.001].map(Date.init(timeIntervalSince1970:))
            + (0..<200).map { _ in Date(timeIntervalSince1970: Double(Int64.random(in: 0...4_102_444_799_999)) / 1000) }
        for date in dates {
            #expect(RFC3339Timestamp.string(date) == reference.string(from: date), "\(date.timeIntervalSince1970)")
        }
    }

    @Test("lines logged from many threads at once stay whole JSON objects in a file, all there after flush()")
    func concurrentLines() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("decisions.jsonl")
        let handler = try JSONLineLogHandler(destination: .file(path))
        let logger = Logger(label: "pingate.decisions") { _ in handler }
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<8 {
                group.addTask {
                    for line in 0..<250 {
                        logger.info("connect decision", metadata: ["task": "\(task)", "line": "\(line)", "host": "a/b.example"])
                    }
                }
            }
        }
        // Written by a background thread: flushed before the file is read.
        handler.flush()
        #expect(handler.droppedLines == 0)
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 2000)
        let objects = lines.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        #expect(objects.count == 2000)
        #expect(objects.allSatisfy { $0["ts"] is String && $0["level"] as? String == "info" && $0["line"] is Int })
        #expect(lines.first?.contains("\"host\":\"a/b.example\"") == true)
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect((mode ?? 0o777) & 0o137 == 0, "created 0640 (less under a umask): \(String(mode ?? 0, radix: 8))")
    }
}
