import Foundation

/// Runs real third-party programs (curl, openssl, nginx, python3) from tests, without
/// blocking Swift's cooperative threads while they run.
public enum TestProcess {
    /// A finished process: exit status and everything it printed.
    public struct Result: Sendable {
        public var status: Int32
        public var stdout: String
        public var stderr: String
        public var stdoutData: Data
    }

    /// Runs `executable` (looked up on PATH) to completion, killing it after `timeout` seconds.
    public static func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                    stdin: Data? = nil, timeout: TimeInterval = 60) async throws -> Result {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: try resolve(executable))
        process.arguments = arguments
        if let environment {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        }
        let outPipe = Pipe()
        let errPipe = Pipe()
        process.standardOutput = outPipe
        process.standardError = errPipe
        let inPipe = Pipe()
        process.standardInput = stdin == nil ? FileHandle.nullDevice : inPipe

        let collector = OutputCollector()
        var drains: [PipeDrain] = []

        let status: Int32 = try await withCheckedThrowingContinuation { continuation in
            process.terminationHandler = { finished in continuation.resume(returning: finished.terminationStatus) }
            do {
                try process.run()
            } catch {
                process.terminationHandler = nil
                continuation.resume(throwing: error)
                return
            }
            // Read both pipes while the child runs, so a chatty child never blocks on a full pipe.
            drains = [PipeDrain(outPipe.fileHandleForReading, into: collector.appendOut),
                      PipeDrain(errPipe.fileHandleForReading, into: collector.appendErr)]
            if let stdin {
                inPipe.fileHandleForWriting.write(stdin)
                try? inPipe.fileHandleForWriting.close()
            }
            let pid = process.processIdentifier
            DispatchQueue.global().asyncAfter(deadline: .now() + timeout) {
                if process.isRunning { kill(pid, SIGKILL) }
            }
        }
        // A grandchild that inherited the pipes could hold them open past the child's exit;
        // the bound keeps such a test from hanging (its output so far is still returned).
        for drain in drains { _ = await drain.finished(within: .seconds(10)) }
        let (out, err) = collector.contents
        return Result(status: status, stdout: String(decoding: out, as: UTF8.self),
                      stderr: String(decoding: err, as: UTF8.self), stdoutData: out)
    }

    /// The full path of `name`, searching PATH (and the build directory for `pingate`).
    public static func resolve(_ name: String) throws -> String {
        if name.hasPrefix("/") { return name }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        // The virtual environment scripts/bootstrap made, when the python3 on PATH lacked
        // the peers' modules, comes first (as scripts/python-env.sh puts it first).
        for directory in [virtualEnvironmentBin] + path.split(separator: ":").map(String.init) + ["/usr/sbin", "/sbin"] {
            let candidate = "\(directory)/\(name)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        throw TestFailure("\(name) is not installed (run scripts/bootstrap)")
    }

    /// `bin` of the virtual environment for the Python peers: `PINGATE_VENV`, else `.venv`
    /// in the project root.
    public static var virtualEnvironmentBin: String {
        if let venv = ProcessInfo.processInfo.environment["PINGATE_VENV"], !venv.isEmpty { return venv + "/bin" }
        return repositoryRoot.appendingPathComponent(".venv/bin").path
    }

    /// The project's root folder (for files the tests check, such as `packaging/`).
    public static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The `pingate` executable built next to this test bundle.
    public static var pingateExecutable: String {
        let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = URL(fileURLWithPath: me).deletingLastPathComponent()
        // On Linux the tests run from <build>/debug/pingatePackageTests.xctest.
        if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
        return directory.appendingPathComponent("pingate").path
    }
}

/// Reads a pipe to its end on a dedicated thread with blocking reads, handing each chunk
/// to `sink`.
///
/// Why not `FileHandle.readabilityHandler`: on Linux it arms a libdispatch read source, and
/// tearing such sources down while others are being set up races inside libdispatch's epoll
/// bookkeeping (swift-corelibs-libdispatch #949, swift-corelibs-foundation #3276). It
/// crashed this suite with SIGSEGV in `_dispatch_event_loop_drain` on a CI machine. A blocking
/// read never registers the descriptor with libdispatch, so there is nothing to race.
public final class PipeDrain: @unchecked Sendable {
    private let lock = NSLock()
    private var done = false

    /// Starts reading `handle` until end of file. The writer's end must be closed in this
    /// process (Foundation's `Process` does that once the child is launched).
    public init(_ handle: FileHandle, into sink: @escaping @Sendable (Data) -> Void) {
        let thread = Thread { [self] in
            while true {
                let chunk = handle.availableData  // blocks; empty only at end of file
                if chunk.isEmpty { break }
                sink(chunk)
            }
            lock.lock()
            done = true
            lock.unlock()
        }
        thread.name = "test-pipe-drain"
        thread.start()
    }

    /// True once the pipe reached end of file and every chunk went to the sink.
    public var isFinished: Bool { lock.lock(); defer { lock.unlock() }; return done }

    /// Waits until end of file or `limit`, whichever comes first; true if the pipe finished.
    public func finished(within limit: Duration) async -> Bool {
        await eventually(timeout: limit, interval: .milliseconds(10)) { self.isFinished }
    }
}

/// Collects a child's output from pipe callbacks on other threads.
public final class OutputCollector: @unchecked Sendable {
    private let lock = NSLock()
    private var out = Data()
    private var err = Data()

    public init() {}

    public func appendOut(_ data: Data) { lock.lock(); out.append(data); lock.unlock() }
    public func appendErr(_ data: Data) { lock.lock(); err.append(data); lock.unlock() }
    public var contents: (Data, Data) { lock.lock(); defer { lock.unlock() }; return (out, err) }
    /// Standard error so far, as text.
    public var errText: String { String(decoding: contents.1, as: UTF8.self) }
}

extension ChildProcess {
    /// Sends SIGTERM to this child (by its PID), waits up to `seconds` for it to exit,
    /// then SIGKILLs it; never blocks a thread while waiting. Does nothing once the child
    /// has exited, so scoped helpers may call it after a test already stopped the child.
    public func terminateAndWait(seconds: Double = 5) async {
        guard isRunning else { return }
        kill(processIdentifier, SIGTERM)
        if await eventually(timeout: .seconds(seconds), { !isRunning }) { return }
        kill(processIdentifier, SIGKILL)
        // SIGKILL cannot be ignored; the bound only keeps a wedged reaper from hanging the suite.
        _ = await eventually(timeout: .seconds(10)) { !isRunning }
    }
}

/// A test precondition that did not hold, with a message.
public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ message: String) { description = message }
}

/// A fresh temporary directory (0700), removed by `remove()`.
public struct TemporaryDirectory: Sendable {
    public let path: String

    public init() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("pingate-test-\(UUID().uuidString)")
        // 0700, as mkdtemp(3) makes one: it may serve as a state directory, which the gate
        // refuses when others can reach it.
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        path = base.path
    }

    public func file(_ name: String) -> String { (path as NSString).appendingPathComponent(name) }

    @discardableResult
    public func write(_ name: String, _ text: String) throws -> String {
        let target = file(name)
        try text.write(toFile: target, atomically: true, encoding: .utf8)
        return target
    }

    public func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// The Wultra signed-list vectors (a copy of shared/vectors/wultra, kept in Tests/Vectors).
public enum WultraVectors {
    /// The folder holding the committed copy.
    public static let directory: String = {
        let here = URL(fileURLWithPath: #filePath)
        return here.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Vectors/wultra").path
    }()

    /// The shared original beside the project root, when it is there.
    public static let sharedDirectory: String = {
        let here = URL(fileURLWithPath: #filePath)
        return here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("shared/vectors/wultra").path
    }()

    /// True when the shared original is there to compare with (it is beside the checkout
    /// on the team's machines and in CI, not necessarily elsewhere).
    public static var sharedIsPresent: Bool { FileManager.default.fileExists(atPath: sharedDirectory) }

    /// The path of vector file `name`.
    public static func path(_ name: String) -> String { (directory as NSString).appendingPathComponent(name) }

    /// The bytes of vector file `name`.
    public static func data(_ name: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: path(name))) }

    /// The text of vector file `name`, without a trailing newline.
    public static func text(_ name: String) throws -> String {
        var text = try String(contentsOfFile: path(name), encoding: .utf8)
        while text.hasSuffix("\n") { text.removeLast() }
        return text
    }
}
