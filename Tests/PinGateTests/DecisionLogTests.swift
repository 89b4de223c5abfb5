import Foundation
import Logging
import PinGateTestSupport
import PropertyBased
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
            var written: [UInt8] = []
            RFC3339Timestamp.append(date, to: &written)
            #expect(String(decoding: written, as: UTF8.self) == reference.string(from: date), "\(date.timeIntervalSince1970)")
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
                        logger.info("connect decision", metadata: ["task": "\(task)", "line": .stringConvertible(line), "host": "a/b.example"])
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

    @Test("a line is one JSON object whatever its fields hold (quotes, backslashes, control characters, non-ASCII, U+2028): every field reads back as written, integers logged as numbers are numbers and strings stay strings whatever they spell, keys in sorted order, no line break of any kind inside")
    func linesReadBack() async throws {
        // Keys and values from the first 2,048 scalars (every control character, C1 ones
        // too, quotes, backslashes, slashes, Latin and other two-byte UTF-8) and the two
        // Unicode line and paragraph separators.
        let text = Gen.character(in: "\u{0}"..."\u{7FF}").string(of: 0...16)
            .map { $0 + ($0.count % 5 == 0 ? "\u{2028}x\u{2029}" : "") }
        let when = Date(timeIntervalSince1970: 1_795_000_000.25)
        await propertyCheck(count: 400, input: text.array(of: 0...6), text.array(of: 0...6), Gen.int(in: -1000...1000)) { keys, values, number in
            var metadata: Logger.Metadata = ["count": .stringConvertible(number), "padded": "0\(abs(number))", "flag": "\(number > 0)",
                                             "spelled": "\(number)"]
            for (key, value) in zip(keys, values) where !["ts", "level", "message", "run", "count", "padded", "flag", "spelled", "chain"].contains(key) {
                metadata[key] = .string(value)
            }
            metadata["chain"] = .array(values.map { .string($0) })
            let event = LogEvent(level: .notice, message: "connect \"decision\"\n", metadata: metadata, source: nil,
                                 file: #fileID, function: #function, line: #line)
            let line = JSONLineLogHandler.line(event, handlerMetadata: ["run": "a\u{1}b"], now: when)
            #expect(!line.contains(UInt8(ascii: "\n")) && !line.contains(UInt8(ascii: "\r")))
            // No NEL (C2 85) and no U+2028/U+2029 (E2 80 A8/A9) written raw: readers that
            // split on Unicode line ends would cut the line there.
            let raw = Array(line)
            #expect(!zip(raw, raw.dropFirst()).contains { $0 == 0xC2 && (0x80...0x9F).contains($1) })
            #expect(!zip(zip(raw, raw.dropFirst()), raw.dropFirst(2)).contains { $0.0 == 0xE2 && $0.1 == 0x80 && ($1 == 0xA8 || $1 == 0xA9) })
            guard let object = (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any] else {
                Issue.record("not a JSON object: \(String(decoding: line, as: UTF8.self))")
                return
            }
            #expect(object["ts"] as? String == "2026-11-18T11:06:40.250Z")
            #expect(object["level"] as? String == "notice")
            #expect(object["message"] as? String == "connect \"decision\"\n")
            #expect(object["run"] as? String == "a\u{1}b")
            #expect(object["count"] as? Int == number)
            #expect(object["spelled"] as? String == "\(number)", "a string that spells a number stays a string")
            #expect(object["padded"] as? String == "0\(abs(number))")
            #expect(object["flag"] as? String == "\(number > 0)")
            #expect(object["chain"] as? [String] == values)
            for (key, value) in metadata {
                if case .string(let text) = value {
                    #expect(object[key] as? String == text, "\(key.debugDescription)")
                }
            }
            #expect(object.count == metadata.count + 4)
            // Keys in the order Swift sorts them, read off the line itself.
            let keyOrder = Self.topLevelKeys(line)
            #expect(keyOrder == keyOrder.sorted() && keyOrder.count == object.count, "\(keyOrder)")
        }
    }

    /// The keys of a one-level JSON object line, in the order written (the values are
    /// strings, numbers or arrays of strings, as in `linesReadBack`).
    private static func topLevelKeys(_ line: [UInt8]) -> [String] {
        var keys: [String] = []
        var index = 1
        var depth = 0
        var expectingKey = true
        while index < line.count {
            let byte = line[index]
            if byte == UInt8(ascii: "\"") {
                var end = index + 1
                var text: [UInt8] = []
                while line[end] != UInt8(ascii: "\"") {
                    if line[end] == UInt8(ascii: "\\") { text.append(line[end]); end += 1 }
                    text.append(line[end])
                    end += 1
                }
                if expectingKey && depth == 0 {
                    let quoted = [UInt8(ascii: "\"")] + text + [UInt8(ascii: "\"")]
                    keys.append((try? JSONSerialization.jsonObject(with: Data(quoted), options: .fragmentsAllowed)) as? String ?? "?")
                    expectingKey = false
                }
                index = end + 1
                continue
            }
            switch byte {
            case UInt8(ascii: "["): depth += 1
            case UInt8(ascii: "]"): depth -= 1
            case UInt8(ascii: ","): if depth == 0 { expectingKey = true }
            default: break
            }
            index += 1
        }
        return keys
    }
}
