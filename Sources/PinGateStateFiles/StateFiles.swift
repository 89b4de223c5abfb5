import Foundation

/// Writes files the way secrets and state need: the directory private, the write atomic
/// (temporary file, fsync, rename, fsync of the directory), and the mode set at creation
/// so a key is never readable by others, not even for an instant. It is its own target,
/// below the CA and the list service, because both write state with it, and it has
/// nothing to do with TLS.
public enum StateFiles {
    /// Why a state file could not be written.
    public struct WriteError: Error, CustomStringConvertible, Sendable {
        /// The file being written.
        public let path: String
        /// The failing step and `errno` text.
        public let detail: String
        /// An error for the step on `path` that failed.
        public init(path: String, detail: String) {
            self.path = path
            self.detail = detail
        }
        /// The error in words, for logs and the operator.
        public var description: String { "cannot write \(path): \(detail)" }
    }

    /// Creates `path` (and parents) as a directory with `mode` (0700 unless said) if it does
    /// not exist; an existing directory is left as it is.
    public static func ensureDirectory(_ path: String, mode: mode_t = 0o700) throws {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw WriteError(path: path, detail: "exists and is not a directory") }
            return
        }
        // The nearest part of the path that exists must be a directory we may write in:
        // said plainly, where Foundation would say `NSCocoaErrorDomain error 512`.
        var existing = (path as NSString).deletingLastPathComponent
        while !existing.isEmpty, existing != "/", !FileManager.default.fileExists(atPath: existing) {
            existing = (existing as NSString).deletingLastPathComponent
        }
        if !existing.isEmpty, FileManager.default.fileExists(atPath: existing, isDirectory: &isDirectory), !isDirectory.boolValue {
            throw WriteError(path: path, detail: "\(existing) is a file, not a directory; choose a directory path")
        }
        do {
            try FileManager.default.createDirectory(
                atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: Int(mode)])
        } catch {
            let denied = !existing.isEmpty && !FileManager.default.isWritableFile(atPath: existing)
            throw WriteError(path: path, detail: denied ? "\(existing) is not writable by this user" : "\(error.localizedDescription)")
        }
    }

    /// Atomically replaces `path` with `contents`, created with `mode`.
    public static func writeAtomically(_ contents: [UInt8], to path: String, mode: mode_t) throws {
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = "\(path).tmp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard descriptor >= 0 else { throw failure(temporary, "open") }
        var written = 0
        while written < contents.count {
            let result = contents.withUnsafeBytes { raw -> Int in
                guard let base = raw.baseAddress else { return 0 }
                return write(descriptor, base + written, raw.count - written)
            }
            if result < 0 {
                if errno == EINTR { continue }
                let error = failure(temporary, "write")
                close(descriptor)
                unlink(temporary)
                throw error
            }
            written += result
        }
        // The mode passed to open() is filtered by the umask; set it exactly.
        guard fchmod(descriptor, mode) == 0, fsync(descriptor) == 0 else {
            let error = failure(temporary, "fchmod/fsync")
            close(descriptor)
            unlink(temporary)
            throw error
        }
        close(descriptor)
        // The crash test dies exactly here, where a power cut hurts most: the new bytes
        // are on disk under the temporary name and the rename is not done.
        FaultInjection.crashIfRequested(at: .beforeRename)
        guard rename(temporary, path) == 0 else {
            let error = failure(path, "rename")
            unlink(temporary)
            throw error
        }
        let directoryDescriptor = open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryDescriptor >= 0 {
            _ = fsync(directoryDescriptor)
            close(directoryDescriptor)
        }
    }

    /// Runs `body` holding an exclusive lock on `directory` (`flock` on its `.lock` file,
    /// created 0600), so that two processes starting at once (a gate and `pingate env`)
    /// do not both create what only one may: two CAs, one's key beside the other's
    /// certificate. It blocks until the lock is free: for start-up and commands, never
    /// for an event loop. The directory is created (0700) if missing.
    public static func withExclusiveLock<Value>(in directory: String, _ body: () throws -> Value) throws -> Value {
        try ensureDirectory(directory)
        let lockPath = (directory as NSString).appendingPathComponent(".lock")
        let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw failure(lockPath, "open") }
        defer { close(descriptor) }  // closing releases the lock
        while flock(descriptor, LOCK_EX) != 0 {
            guard errno == EINTR else { throw failure(lockPath, "flock") }
        }
        return try body()
    }

    /// Removes the temporary files that writes in `directory` left behind when their
    /// process died between creating and renaming them (a `kill -9`, a power cut), and
    /// returns their names. A file whose writer is still alive (another gate sharing the
    /// directory, mid-write) is left alone. Nothing else is touched.
    /// Those that could not be removed are in `failed`, with the reason.
    @discardableResult
    public static func removeLeftovers(in directory: String) -> (removed: [String], failed: [String]) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return ([], []) }
        var removed: [String] = [], failed: [String] = []
        for name in names.sorted() {
            guard let writer = temporaryFileWriter(name), !isAlive(writer) || writer == getpid() else { continue }
            if unlink((directory as NSString).appendingPathComponent(name)) == 0 {
                removed.append(name)
            } else {
                failed.append("\(name) (\(String(cString: strerror(errno))))")
            }
        }
        return (removed, failed)
    }

    /// The process that wrote `name`, when `name` is one of `writeAtomically`'s
    /// temporary files (`FILE.tmp-PID-RANDOM`).
    static func temporaryFileWriter(_ name: String) -> pid_t? {
        guard let marker = name.range(of: ".tmp-", options: .backwards), marker.lowerBound > name.startIndex else { return nil }
        let parts = name[marker.upperBound...].split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, let pid = pid_t(parts[0]), pid > 0, UInt32(parts[1]) != nil else { return nil }
        return pid
    }

    private static func isAlive(_ pid: pid_t) -> Bool {
        kill(pid, 0) == 0 || errno == EPERM
    }

    private static func failure(_ path: String, _ step: String) -> WriteError {
        WriteError(path: path, detail: "\(step): \(String(cString: strerror(errno)))")
    }
}
