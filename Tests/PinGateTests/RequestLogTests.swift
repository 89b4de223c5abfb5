import Foundation
import PinGateTestSupport
import Synchronization
import Testing
@testable import PinGate
@testable import pingate

/// The request log's line format, its background writer and its configuration.
@Suite("Request log")
struct RequestLogTests {
    /// 2026-11-22T06:18:10.183Z
    static let start = Date(timeIntervalSince1970: 1_795_328_290.183)

    static func record(path: String = "/v1/items?token=secret&page=2", streamID: Int? = nil, refusal: String? = nil) -> RequestRecord {
        RequestRecord(
            time: start, client: "127.0.0.1:50916", connectHost: "api.example.test", connectPort: 443,
            authority: "api.example.test", method: "GET", path: path, status: 200, bytesUp: 0, bytesDown: 5226,
            durationMilliseconds: 13, protocolName: "HTTP/1.1", upstreamProtocol: "HTTP/2", streamID: streamID, refusal: refusal)
    }

    /// The file's lines, each parsed as a JSON object.
    static func objects(_ path: String) throws -> [[String: Any]] {
        try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false).dropLast().map { line in
            try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "\(line)")
        }
    }

    @Test("a record is one JSON line with exactly the documented fields, keys sorted; the query is cut, stream_id and refusal left out when nil")
    func lineFormat() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("requests.jsonl")
        let log = try RequestLog(destination: .file(path), includeQuery: false)
        #expect(log.isEnabled)
        log.record(Self.record())
        var h2 = Self.record(path: "/other", streamID: 3, refusal: "authority-mismatch")
        h2.authority = "elsewhere.example.test:8443"
        h2.method = "POST"
        h2.status = 421
        h2.bytesUp = 17
        h2.bytesDown = 0
        h2.durationMilliseconds = 0
        h2.protocolName = "HTTP/2"
        h2.upstreamProtocol = "HTTP/1.1"
        log.record(h2)
        log.flush()

        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(text == """
        {"authority":"api.example.test","bytes_down":5226,"bytes_up":0,"client":"127.0.0.1:50916","connect_host":"api.example.test",\
        "connect_port":443,"duration_ms":13,"method":"GET","path":"/v1/items","protocol":"HTTP/1.1","status":200,\
        "ts":"2026-11-22T06:18:10.183Z","upstream_protocol":"HTTP/2"}
        {"authority":"elsewhere.example.test:8443","bytes_down":0,"bytes_up":17,"client":"127.0.0.1:50916","connect_host":"api.example.test",\
        "connect_port":443,"duration_ms":0,"method":"POST","path":"/other","protocol":"HTTP/2","refusal":"authority-mismatch","status":421,\
        "stream_id":3,"ts":"2026-11-22T06:18:10.183Z","upstream_protocol":"HTTP/1.1"}

        """)

        let objects = try Self.objects(path)
        try #require(objects.count == 2)
        let first = objects[0]
        #expect(Set(first.keys) == ["ts", "client", "connect_host", "connect_port", "authority", "method", "path", "status",
                                    "bytes_up", "bytes_down", "duration_ms", "protocol", "upstream_protocol"])
        #expect(first["ts"] as? String == "2026-11-22T06:18:10.183Z")
        #expect(first["client"] as? String == "127.0.0.1:50916")
        #expect(first["connect_host"] as? String == "api.example.test")
        #expect(first["connect_port"] as? Int == 443)
        #expect(first["authority"] as? String == "api.example.test")
        #expect(first["method"] as? String == "GET")
        #expect(first["path"] as? String == "/v1/items")
        #expect(first["status"] as? Int == 200)
        #expect(first["bytes_up"] as? Int == 0)
        #expect(first["bytes_down"] as? Int == 5226)
        #expect(first["duration_ms"] as? Int == 13)
        #expect(first["protocol"] as? String == "HTTP/1.1")
        #expect(first["upstream_protocol"] as? String == "HTTP/2")
        let second = objects[1]
        #expect(Set(second.keys) == Set(first.keys).union(["stream_id", "refusal"]))
        #expect(second["stream_id"] as? Int == 3)
        #expect(second["refusal"] as? String == "authority-mismatch")
        #expect(second["status"] as? Int == 421)
        #expect(log.droppedLines == 0)
    }

    @Test("with includeQuery the path is logged whole; a path with quotes and control characters stays one valid line")
    func queryOptInAndEscaping() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("requests.jsonl")
        let log = try RequestLog(destination: .file(path), includeQuery: true)
        let hostile = "/a\"b\\c\n\r\t\u{1}\u{7F}é?x=\"}\n{\"status\":1"
        log.record(Self.record())
        log.record(Self.record(path: hostile))
        log.record(Self.record(path: "/no-query"))
        log.flush()
        let objects = try Self.objects(path)
        #expect(objects.map { $0["path"] as? String } == ["/v1/items?token=secret&page=2", hostile, "/no-query"])
        #expect(objects[1]["status"] as? Int == 200)

        let cut = try RequestLog(destination: .off, includeQuery: false)
        #expect(String(decoding: cut.line(Self.record(path: "/?")), as: UTF8.self).contains(#""path":"/","#))
        #expect(String(decoding: cut.line(Self.record(path: "/a?b?c")), as: UTF8.self).contains(#""path":"/a","#))
    }

    @Test("the file is appended to, and created 0640")
    func appendsAndMode() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = try directory.write("requests.jsonl", "{\"earlier\":true}\n")
        let log = try RequestLog(destination: .file(path), includeQuery: false)
        log.record(Self.record())
        log.flush()
        let objects = try Self.objects(path)
        #expect(objects.count == 2)
        #expect(objects.first?["earlier"] as? Bool == true)

        let created = directory.file("new.jsonl")
        let other = try RequestLog(destination: .file(created), includeQuery: false)
        other.flush()
        let mode = try FileManager.default.attributesOfItem(atPath: created)[.posixPermissions] as? Int
        #expect((mode ?? 0o777) & 0o137 == 0, "created 0640 (less under a umask): \(String(mode ?? 0, radix: 8))")

        #expect(throws: (any Error).self) { try RequestLog(destination: .file(directory.file("missing/requests.jsonl")), includeQuery: false) }
    }

    @Test(".off writes nothing and keeps no writer")
    func off() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let log = try RequestLog(destination: .off, includeQuery: true)
        #expect(!log.isEnabled)
        for _ in 0..<1000 { log.record(Self.record()) }
        log.flush()
        #expect(log.flush(timeout: .milliseconds(1)))
        #expect(log.droppedLines == 0)
        #expect(log.queuedLines == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path).isEmpty)
        #expect(GateConfiguration().requestLog == .off)
        #expect(GateConfiguration().requestLogIncludesQuery == false)
    }

    @Test("50,000 records from 4 concurrent tasks all arrive, each task's in order (a queue that holds them all: nothing may drop)")
    func burst() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("requests.jsonl")
        let log = try RequestLog(destination: .file(path), includeQuery: false,
                                 limits: BackgroundLineWriter.Limits(lines: 50_000, bytes: 64 << 20))
        let tasks = 4
        let perTask = 12_500
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<tasks {
                group.addTask {
                    for index in 0..<perTask {
                        log.record(Self.record(path: "/task/\(task)", streamID: index))
                    }
                }
            }
        }
        log.flush()
        #expect(log.droppedLines == 0)

        // Each line must be the next one expected of one of the tasks. A task's lines
        // differ only in their stream_id, so each is checked as its task's prefix, the
        // number, and the common suffix, by memcmp: parsing 50,000 lines as JSON (or
        // comparing them byte by byte) costs seconds of CPU in a debug build, which the
        // suite's other tests running meanwhile need. The format tests parse lines.
        let marker = Array(#""stream_id":"#.utf8)
        let templates = (0..<tasks).map { task in log.line(Self.record(path: "/task/\(task)", streamID: 0)) }
        let prefixes = try templates.map { template in
            let range = try #require(template.firstRange(of: marker))
            return Array(template[..<range.upperBound])
        }
        let suffix = Array(templates[0][(prefixes[0].count + 1)...])
        let written = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))
        let lines = Self.lines(written)
        #expect(lines.count == tasks * perTask)
        #expect(written.last == UInt8(ascii: "\n"))
        var next = [Int](repeating: 0, count: tasks)
        var unexpected = 0
        for line in lines {
            guard let task = (0..<tasks).first(where: { Self.same(line.prefix(prefixes[$0].count), prefixes[$0]) }),
                  line.count > prefixes[task].count + suffix.count,
                  Self.same(line.suffix(suffix.count), suffix),
                  let index = Int(String(decoding: line.dropFirst(prefixes[task].count).dropLast(suffix.count), as: UTF8.self)),
                  index == next[task] else {
                unexpected += 1
                continue
            }
            next[task] += 1
        }
        #expect(unexpected == 0, "lines that were not the next of any task")
        #expect(next == [Int](repeating: perTask, count: tasks))
    }

    /// `bytes` cut after each newline (dropped), found by memchr for the same reason; an
    /// unterminated last line is kept.
    static func lines(_ bytes: [UInt8]) -> [ArraySlice<UInt8>] {
        var lines: [ArraySlice<UInt8>] = []
        bytes.withUnsafeBytes { buffer in
            guard let base = buffer.baseAddress else { return }
            var start = 0
            while start < buffer.count {
                guard let found = memchr(base + start, Int32(UInt8(ascii: "\n")), buffer.count - start) else {
                    lines.append(bytes[start...])
                    return
                }
                let end = base.distance(to: UnsafeRawPointer(found))
                lines.append(bytes[start..<end])
                start = end + 1
            }
        }
        return lines
    }

    /// Byte equality by memcmp: an element-wise loop is slow in debug builds.
    static func same(_ line: ArraySlice<UInt8>, _ expected: [UInt8]) -> Bool {
        line.count == expected.count && line.withUnsafeBytes { left in
            expected.withUnsafeBytes { right in
                guard let leftBytes = left.baseAddress, let rightBytes = right.baseAddress else { return left.count == 0 }
                return memcmp(leftBytes, rightBytes, left.count) == 0
            }
        }
    }

    @Test("a writer stuck on a full pipe: the queue takes exactly its bound, the rest is dropped and counted, and nothing blocks")
    func dropsWhenFull() async throws {
        // The reader end is closed while the writer may still hold its end.
        signal(SIGPIPE, SIG_IGN)
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        let (reader, writer) = (ends[0], ends[1])
        defer { _ = close(reader) }
        // Fill the pipe through a non-blocking descriptor; the log opens its own,
        // blocking one, whose first write then waits until the pipe is read.
        _ = fcntl(writer, F_SETFL, fcntl(writer, F_GETFL) | O_NONBLOCK)
        let filler = [UInt8](repeating: UInt8(ascii: "#"), count: 4096)
        var filled = 0
        while true {
            let written = filler.withUnsafeBytes { write(writer, $0.baseAddress, $0.count) }
            if written <= 0 { break }
            filled += written
        }
        let output = PipeOutput()
        do {
            let log = try RequestLog(destination: .file("/proc/self/fd/\(writer)"), includeQuery: false,
                                     limits: BackgroundLineWriter.Limits(lines: 10, bytes: 1 << 20))
            _ = close(writer) // the log's descriptor is now the pipe's only write end

            // The first line is taken by the writer thread, which then blocks in write(2).
            log.record(Self.record(path: "/0"))
            #expect(await eventually(timeout: .seconds(5), interval: .milliseconds(5)) { log.queuedLines == 0 })
            let started = ContinuousClock.now
            for index in 1...25 { log.record(Self.record(path: "/\(index)")) }
            #expect(ContinuousClock.now - started < .seconds(1), "record never waits for the writer")
            #expect(log.queuedLines == 10)
            #expect(log.droppedLines == 15)

            // Read until the log's thread closes its end (when the log is gone): on a thread
            // of its own, as blocking reads must not hold the tests' cooperative threads.
            output.readToEnd(reader)
            await log.waitUntilWritten()
            #expect(log.droppedLines == 15)
        }
        #expect(await eventually(timeout: .seconds(5)) { output.isFinished }, "the log's thread closed its end of the pipe")
        // The first line and the ten that were queued, in order.
        let text = String(decoding: output.bytes.dropFirst(filled), as: UTF8.self)
        let paths = text.split(separator: "\n").map { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["path"] as? String
        }
        #expect(paths == (0...10).map { "/\($0)" })
    }
}

/// What a thread read from a pipe until its end.
final class PipeOutput: Sendable {
    private let state = Mutex<(bytes: [UInt8], finished: Bool)>(([], false))

    var bytes: [UInt8] { state.withLock { $0.bytes } }
    var isFinished: Bool { state.withLock { $0.finished } }

    /// Starts a thread reading `descriptor` until end of file.
    func readToEnd(_ descriptor: Int32) {
        Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
                if count < 0, errno == EINTR { continue }
                guard count > 0 else { break }
                state.withLock { $0.bytes += buffer[0..<count] }
            }
            state.withLock { $0.finished = true }
        }.start()
    }
}

/// `request-log` and `request-log-query` in the config file and as flags.
@Suite("Request log configuration")
struct RequestLogConfigurationTests {
    @Test("the config file's keys are read, its relative path resolved against the file's directory; flags override them")
    func configFile() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = try directory.write("pingate.yml", """
        listen: 127.0.0.1:0
        request-log: logs/requests.jsonl
        request-log-query: true
        """)
        let file = try ConfigFile.load(path)
        #expect(file.requestLog == directory.file("logs/requests.jsonl"))
        #expect(file.requestLogQuery == true)

        let fromFile = try RunCommand.parse(["--config", path]).options.gateConfiguration(file: file)
        #expect(fromFile.requestLog == .file(directory.file("logs/requests.jsonl")))
        #expect(fromFile.requestLogIncludesQuery)

        let overridden = try RunCommand.parse(["--config", path, "--request-log", "stderr", "--no-request-log-query"]).options.gateConfiguration(file: file)
        #expect(overridden.requestLog == .standardError)
        #expect(!overridden.requestLogIncludesQuery)

        let off = try directory.write("off.yml", "request-log: off\nrequest-log-query: false\n")
        let offFile = try ConfigFile.load(off)
        #expect(try RunCommand.parse([]).options.gateConfiguration(file: offFile).requestLog == .off)
        #expect(try RunCommand.parse(["--request-log", "requests.jsonl", "--request-log-query"]).options.gateConfiguration(file: offFile).requestLog
                == .file(FileManager.default.currentDirectoryPath + "/requests.jsonl"))
        #expect(try RunCommand.parse(["--request-log-query"]).options.gateConfiguration(file: offFile).requestLogIncludesQuery)

        let defaults = try RunCommand.parse([]).options.gateConfiguration(file: nil)
        #expect(defaults.requestLog == .off)
        #expect(!defaults.requestLogIncludesQuery)
    }

    @Test("PinGateServer builds the request log from its configuration and writes it out when it shuts down")
    func serverOwnsTheLog() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("requests.jsonl")
        try await GateFixture.with(pki: try TestPKI(directory: directory), listPath: nil, configure: {
            $0.requestLog = .file(path)
            $0.requestLogIncludesQuery = true
        }) { gate in
            #expect(gate.server.requestLog.destination == .file(path))
            #expect(gate.server.requestLog.includesQuery)
            for _ in 0..<100 { gate.server.requestLog.record(RequestLogTests.record()) }
            try await gate.server.shutdown() // no flush() of its own: the shutdown's
        }
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 100)
        #expect(lines.first?.contains(#""path":"/v1/items?token=secret&page=2""#) == true)
    }

    @Test("pingate run --config with request-log opens (creates) the log at start-up; an unopenable one stops start-up")
    func runOpensTheLog() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let config = try directory.write("pingate.yml", """
        listen: 127.0.0.1:0
        state-dir: state
        request-log: requests.jsonl
        admin: {listen: "off"}
        """)
        try await RunningGate.with(["--config", config]) { _ in
            #expect(FileManager.default.fileExists(atPath: directory.file("requests.jsonl")))
        }
        let refused = try await TestProcess.run(TestProcess.pingateExecutable, [
            "run", "--config", config, "--request-log", directory.file("missing/requests.jsonl"),
        ], timeout: 30)
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("cannot open request log"), "\(refused.stderr)")
    }
}
