import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A child process for tests, started with `posix_spawn`: the subset of Foundation's
/// `Process` the tests use, with the same names.
///
/// Why not `Process`: on Linux, Foundation's `Process.run()` lists `/proc/self/fd` to close
/// every descriptor in the child, and copies each entry's whole 256-byte `d_name` although
/// `readdir` returns records sized to the name; a record at the end of glibc's buffer next
/// to an unmapped page then crashes the whole test process (swiftlang/swift-corelibs-
/// foundation#5472, Swift 6.3.1: it crashed this suite about one run in eight, with its
/// hundreds of descriptors). Here the child closes them with `closefrom` semantics instead
/// (`posix_spawn_file_actions_addclosefrom_np`, glibc 2.34+), and no directory is read.
public final class ChildProcess: @unchecked Sendable {
    /// Why the child ended.
    public enum TerminationReason: Int, Sendable {
        /// It exited; `terminationStatus` is its exit status.
        case exit
        /// A signal ended it; `terminationStatus` is the signal.
        case uncaughtSignal
    }

    /// The program to run.
    public var executableURL: URL?
    /// Its arguments (without the program name).
    public var arguments: [String]?
    /// Its environment; nil inherits this process's.
    public var environment: [String: String]?
    /// A `Pipe`, a `FileHandle`, or nil (`/dev/null`) for each standard stream.
    public var standardInput: Any?
    public var standardOutput: Any?
    public var standardError: Any?
    /// Called once, on a thread of its own, when the child has exited.
    public var terminationHandler: (@Sendable (ChildProcess) -> Void)?

    private let lock = NSLock()
    private var pid: pid_t = 0
    private var running = false
    private var status: Int32 = 0
    private var reason: TerminationReason = .exit

    public init() {}

    /// The child's PID (0 before `run`).
    public var processIdentifier: Int32 { lock.withLock { pid } }
    /// True from `run` until the child has been reaped.
    public var isRunning: Bool { lock.withLock { running } }
    /// The exit status, or the signal that ended it.
    public var terminationStatus: Int32 { lock.withLock { status } }
    /// Whether it exited or was killed by a signal.
    public var terminationReason: TerminationReason { lock.withLock { reason } }

    /// Starts the child; throws when it cannot be spawned.
    public func run() throws {
        guard let executable = executableURL?.path else { throw TestFailure("ChildProcess: no executable") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var nullDevice: FileHandle?
        func descriptor(_ stream: Any?, reading: Bool) throws -> Int32 {
            switch stream {
            case let pipe as Pipe:
                return reading ? pipe.fileHandleForReading.fileDescriptor : pipe.fileHandleForWriting.fileDescriptor
            case let handle as FileHandle:
                return handle.fileDescriptor
            default:
                if nullDevice == nil { nullDevice = FileHandle(forUpdatingAtPath: "/dev/null") }
                guard let handle = nullDevice else { throw TestFailure("ChildProcess: cannot open /dev/null") }
                return handle.fileDescriptor
            }
        }
        let streams = [try descriptor(standardInput, reading: true), try descriptor(standardOutput, reading: false),
                       try descriptor(standardError, reading: false)]
        for (target, source) in streams.enumerated() {
            posix_spawn_file_actions_adddup2(&actions, source, Int32(target))
        }
        // Everything else the test process holds (sockets, other children's pipes) stays out.
        guard let addCloseFrom = Self.addCloseFrom, addCloseFrom(&actions, 3) == 0 else {
            throw TestFailure("ChildProcess: posix_spawn_file_actions_addclosefrom_np (glibc 2.34+) is not available")
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Its own process group, as Foundation does, so a signal to the tests' group spares it.
        // And signals as a fresh process has them: the test process ignores SIGPIPE (the gate
        // sets that) and may block SIGTERM/SIGINT/SIGHUP (service-lifecycle traps them), and
        // a spawned child inherits both, so a SIGTERM to it would go unheard.
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        posix_spawnattr_setpgroup(&attributes, 0)
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)

        let argumentList = [executable] + (arguments ?? [])
        let environmentList = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        var argv: [UnsafeMutablePointer<CChar>?] = argumentList.map { strdup($0) } + [nil]
        var envp: [UnsafeMutablePointer<CChar>?] = environmentList.map { strdup($0) } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var spawned: pid_t = 0
        let result = posix_spawn(&spawned, executable, &actions, &attributes, &argv, &envp)
        let child = spawned
        guard result == 0 else { throw TestFailure("ChildProcess: cannot spawn \(executable): \(String(cString: strerror(result)))") }
        lock.withLock {
            pid = child
            running = true
        }
        // The child has its copies; the parent keeps only its own ends.
        if let pipe = standardInput as? Pipe { try? pipe.fileHandleForReading.close() }
        if let pipe = standardOutput as? Pipe { try? pipe.fileHandleForWriting.close() }
        if let pipe = standardError as? Pipe { try? pipe.fileHandleForWriting.close() }
        try? nullDevice?.close()

        let reaper = Thread { [self] in
            var raw: Int32 = 0
            while waitpid(child, &raw, 0) == -1 && errno == EINTR {}
            let signalled = (raw & 0x7f) != 0 && (raw & 0x7f) != 0x7f
            let handler = lock.withLock { () -> (@Sendable (ChildProcess) -> Void)? in
                status = signalled ? raw & 0x7f : (raw >> 8) & 0xff
                reason = signalled ? .uncaughtSignal : .exit
                running = false
                return terminationHandler
            }
            handler?(self)
        }
        reaper.start()
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np`, looked up at run time: Swift's
    /// Glibc module does not export it (it is a GNU extension).
    private typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private static let addCloseFrom: AddCloseFrom? = {
        guard let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: AddCloseFrom.self)
    }()

    /// Blocks the calling thread until the child has exited.
    public func waitUntilExit() {
        while isRunning { usleep(10_000) }
    }

    /// Sends SIGTERM.
    public func terminate() {
        let child = processIdentifier
        if child > 0 { kill(child, SIGTERM) }
    }
}
