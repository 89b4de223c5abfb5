import Dispatch
import Foundation
import PinGateNIO
import Synchronization

/// Writes whole lines to standard error or to a log file from a thread of its own, for
/// the decision log and the request log: the threads that produce lines are NIO event
/// loops, and a slow disk or a full stderr pipe must not stall the connections on them.
///
/// Lines reach the thread through a bounded queue. When it is full a line is dropped and
/// counted rather than waited for or kept: a log that falls behind must neither hold up
/// traffic nor grow without bound. Each `write(2)` carries whole lines only and, on
/// anything but a regular file, at most `PIPE_BUF` bytes, which a pipe writes atomically:
/// the process's other stderr writers (the other log, swift-log's handler) can never land
/// inside a line.
final class BackgroundLineWriter: Sendable {
    /// Where lines go.
    enum Target: Sendable, Equatable {
        case standardError
        /// Opened for appending (several runs share one log), created 0640 if missing.
        case file(String)
    }

    /// How much may wait for the writer thread; a line beyond either bound is dropped.
    struct Limits: Sendable {
        var lines = 10_000
        var bytes = 8 << 20
    }

    private let core: Core
    /// The file written to, for `reopen`; nil for standard error.
    private let path: String?
    private let purpose: String

    /// Opens `target` and starts the writer thread. `purpose` names the log in the error
    /// thrown when its file cannot be opened ("decision log", "request log").
    init(_ target: Target, purpose: String, limits: Limits = Limits()) throws {
        let descriptor: Int32
        let ownsDescriptor: Bool
        switch target {
        case .standardError:
            descriptor = STDERR_FILENO
            ownsDescriptor = false
        case .file(let path):
            descriptor = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o640)
            guard descriptor >= 0 else {
                throw ConfigurationError("cannot open \(purpose) \(path): \(String(cString: strerror(errno)))")
            }
            ownsDescriptor = true
        }
        let core = Core(descriptor: descriptor, ownsDescriptor: ownsDescriptor, limits: limits)
        self.core = core
        if case .file(let path) = target { self.path = path } else { self.path = nil }
        self.purpose = purpose
        // The thread holds the core, not this object: the last owner of the writer going
        // away is what tells the thread to write what is left, close the file and end.
        let thread = Thread { core.run() }
        thread.name = "pingate-log"
        thread.start()
    }

    deinit {
        core.finish()
    }

    /// Queues `line` (without its newline; one is added) and returns at once; false when
    /// the queue was full and the line was dropped.
    @discardableResult
    func enqueue(_ line: some Collection<UInt8>) -> Bool {
        core.enqueue(line)
    }

    /// Opens the file again by its path, for log rotation (logrotate moves the file, then
    /// SIGHUP): what was queued before goes to the old file, and lines from here on to the
    /// new one, created 0640 if missing. The new descriptor takes the old one's number
    /// (`dup2`), so the writer thread never sees it change. Nothing for standard error.
    /// - Throws: a `ConfigurationError` naming the file when it cannot be opened; the log
    ///   then goes on to the old file.
    func reopen() async throws {
        guard let path else { return }
        await waitUntilWritten()
        let fresh = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o640)
        guard fresh >= 0 else {
            throw ConfigurationError("cannot reopen \(purpose) \(path): \(String(cString: strerror(errno))); it goes on to the file it had open")
        }
        defer { _ = close(fresh) }
        try core.replaceDescriptor(with: fresh, purpose: purpose, path: path)
    }

    /// Lines dropped because the queue was full, since the start.
    var droppedLines: Int { core.droppedLines }

    /// Lines queued and not yet taken by the writer thread.
    var queuedLines: Int { core.queuedLines }

    /// Blocks until every line queued before the call has been written (or has failed to
    /// be: a write error drops the line rather than retrying it forever).
    func flush() {
        let semaphore = DispatchSemaphore(value: 0)
        guard core.onWritten({ semaphore.signal() }) else { return }
        semaphore.wait()
    }

    /// `flush()`, giving up after `timeout`: at exit a stderr nobody reads any more must
    /// not keep the process from ending. False when it gave up.
    func flush(timeout: Duration) -> Bool {
        let semaphore = DispatchSemaphore(value: 0)
        guard core.onWritten({ semaphore.signal() }) else { return true }
        let (seconds, attoseconds) = timeout.components
        return semaphore.wait(timeout: .now() + max(0, Double(seconds) + Double(attoseconds) / 1e18)) == .success
    }

    /// `flush()` without blocking a thread, for async callers.
    func waitUntilWritten() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            if !core.onWritten({ continuation.resume() }) { continuation.resume() }
        }
    }

    /// The queue, the descriptor and the thread's loop: everything the writer thread
    /// touches, owned jointly by the thread and the `BackgroundLineWriter`.
    private final class Core: Sendable {
        private struct Waiter {
            /// Done once this many lines have been written.
            let target: UInt64
            let resume: @Sendable () -> Void
        }

        private struct State {
            /// Queued lines, each ending in "\n", back to back.
            var pending: [UInt8] = []
            var pendingLines = 0
            /// Lines ever queued, and lines the thread has finished with: a flush waits
            /// for the second to reach what the first was when it was called.
            var queued: UInt64 = 0
            var written: UInt64 = 0
            var dropped = 0
            /// Set by the thread before it sleeps; whoever clears it wakes the thread,
            /// so a busy writer costs its producers no system call per line.
            var idle = false
            var finishing = false
            var waiters: [Waiter] = []
        }

        private let descriptor: Int32
        private let ownsDescriptor: Bool
        private let limits: Limits
        /// The largest write: a regular file takes big ones whole (O_APPEND), a pipe
        /// writes atomically only up to PIPE_BUF.
        private let chunkLimit: Int
        private let state = Mutex(State())
        private let wake = DispatchSemaphore(value: 0)

        init(descriptor: Int32, ownsDescriptor: Bool, limits: Limits) {
            self.descriptor = descriptor
            self.ownsDescriptor = ownsDescriptor
            self.limits = limits
            var status = stat()
            let isRegularFile = fstat(descriptor, &status) == 0 && (status.st_mode & S_IFMT) == S_IFREG
            chunkLimit = isRegularFile ? 64 * 1024 : Int(PIPE_BUF)
        }

        func enqueue(_ line: some Collection<UInt8>) -> Bool {
            let size = line.count + 1
            let outcome = state.withLock { state -> Bool? in
                guard state.pendingLines < limits.lines, state.pending.count + size <= limits.bytes else {
                    state.dropped += 1
                    return nil
                }
                state.pending.append(contentsOf: line)
                state.pending.append(UInt8(ascii: "\n"))
                state.pendingLines += 1
                state.queued += 1
                defer { state.idle = false }
                return state.idle
            }
            guard let mustWake = outcome else { return false }
            if mustWake { wake.signal() }
            return true
        }

        var droppedLines: Int { state.withLock { $0.dropped } }

        var queuedLines: Int { state.withLock { $0.pendingLines } }

        /// Registers `resume` for when every line queued so far is written; false (and
        /// `resume` not kept) when there is nothing to wait for. No wake-up is needed:
        /// unwritten lines mean the thread is writing or has been woken for them.
        func onWritten(_ resume: @escaping @Sendable () -> Void) -> Bool {
            state.withLock { state in
                guard state.written < state.queued else { return false }
                state.waiters.append(Waiter(target: state.queued, resume: resume))
                return true
            }
        }

        /// Points the descriptor at `fresh`'s file (`dup2`: atomic, and the number stays).
        func replaceDescriptor(with fresh: Int32, purpose: String, path: String) throws {
            guard dup2(fresh, descriptor) >= 0 else {
                throw ConfigurationError("cannot reopen \(purpose) \(path): \(String(cString: strerror(errno))); it goes on to the file it had open")
            }
        }

        /// Asks the thread to write what is queued, close the file and end.
        func finish() {
            let mustWake = state.withLock { state in
                state.finishing = true
                defer { state.idle = false }
                return state.idle
            }
            if mustWake { wake.signal() }
        }

        /// The writer thread: takes everything queued in one go, writes it, repeats;
        /// sleeps when there is nothing.
        func run() {
            enum Step {
                case write(lines: Int)
                case sleep
                case end
            }
            var batch: [UInt8] = []
            while true {
                let step = state.withLock { state -> Step in
                    if state.pendingLines > 0 {
                        swap(&batch, &state.pending)
                        defer { state.pendingLines = 0 }
                        return .write(lines: state.pendingLines)
                    }
                    if state.finishing { return .end }
                    state.idle = true
                    return .sleep
                }
                switch step {
                case .sleep:
                    wake.wait()
                case .end:
                    if ownsDescriptor { _ = close(descriptor) }
                    let waiters = state.withLock { state in
                        defer { state.waiters = [] }
                        return state.waiters
                    }
                    waiters.forEach { $0.resume() }
                    return
                case .write(let lines):
                    writeLines(batch)
                    // The emptied buffer becomes the next queue; one swollen by a burst
                    // is let go rather than kept at its peak size for good.
                    batch.removeAll(keepingCapacity: batch.capacity <= 1 << 20)
                    let done = state.withLock { state -> [Waiter] in
                        state.written += UInt64(lines)
                        let written = state.written
                        let done = state.waiters.filter { $0.target <= written }
                        state.waiters.removeAll { $0.target <= written }
                        return done
                    }
                    done.forEach { $0.resume() }
                    // Lines that come meanwhile wait for the next write instead of waking
                    // this thread one by one: a busy gate logs a line per connection, and a
                    // wake-up and a write(2) per line cost more than formatting it. A few
                    // milliseconds late is nothing to a log; a flush waits as long at most.
                    if state.withLock({ !$0.finishing && $0.waiters.isEmpty }) { usleep(Self.batchingPause) }
                }
            }
        }

        /// How long the thread pauses after a write, in microseconds (see `run`).
        private static let batchingPause: UInt32 = 5_000

        /// Writes `bytes` (whole lines) in chunks of whole lines of at most `chunkLimit`
        /// bytes; a single longer line goes out alone.
        private func writeLines(_ bytes: [UInt8]) {
            bytes.withUnsafeBytes { buffer in
                var start = 0
                while start < buffer.count {
                    var end = min(start + chunkLimit, buffer.count)
                    if end < buffer.count {
                        if let newline = buffer[start..<end].lastIndex(of: UInt8(ascii: "\n")) {
                            end = newline + 1
                        } else {
                            end = buffer[end...].firstIndex(of: UInt8(ascii: "\n")).map { $0 + 1 } ?? buffer.count
                        }
                    }
                    writeAll(UnsafeRawBufferPointer(rebasing: buffer[start..<end]))
                    start = end
                }
            }
        }

        private func writeAll(_ chunk: UnsafeRawBufferPointer) {
            guard var next = chunk.baseAddress else { return }
            var remaining = chunk.count
            while remaining > 0 {
                let written = write(descriptor, next, remaining)
                if written < 0 {
                    if errno == EINTR { continue }
                    if errno == EAGAIN || errno == EWOULDBLOCK {
                        // A non-blocking stderr inherited from the parent: this thread
                        // may wait, so it waits until the pipe takes more.
                        var poller = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
                        _ = poll(&poller, 1, -1)
                        continue
                    }
                    return // a log that cannot be written must not stop the gate
                }
                next += written
                remaining -= written
            }
        }
    }
}
