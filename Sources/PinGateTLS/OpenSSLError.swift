internal import COpenSSL

/// A failed OpenSSL call: which operation failed and the reason texts OpenSSL queued for it.
///
/// OpenSSL reports failures through a thread-local queue. Every wrapper in this module
/// clears that queue before a call and drains it right after a failure, on the same
/// thread, so the reasons here belong to this call and nothing leaks into the next one.
public struct OpenSSLError: Error, CustomStringConvertible, Sendable, Equatable {
    /// The operation that failed, in our words (e.g. "load certificate PEM").
    public let operation: String
    /// The reason strings drained from OpenSSL's error queue, oldest first.
    public let reasons: [String]

    /// Creates an error for `operation` with explicit `reasons`.
    public init(operation: String, reasons: [String]) {
        self.operation = operation
        self.reasons = reasons
    }

    /// Creates an error for `operation` taking its reasons from OpenSSL's queue now.
    static func drained(_ operation: String) -> OpenSSLError {
        OpenSSLError(operation: operation, reasons: OpenSSLErrorQueue.drain())
    }

    /// The error in words, for logs and the operator.
    public var description: String {
        reasons.isEmpty ? "\(operation) failed" : "\(operation) failed: \(reasons.joined(separator: "; "))"
    }
}

/// Access to OpenSSL's per-thread error queue.
enum OpenSSLErrorQueue {
    /// Forgets anything an earlier call left behind, so a later drain reports only new failures.
    ///
    /// Only when something is queued: OpenSSL 3's `ERR_clear_error` resets all 16 slots of
    /// the queue whatever it holds, about 1,500 instructions, and it ran around every
    /// `SSL_read` and `SSL_write` (3.4k of a keep-alive request's 192k, issue 32's callgrind
    /// profile). Peeking an empty queue is a few dozen.
    static func clear() {
        if ERR_peek_error() != 0 { ERR_clear_error() }
    }

    /// Pops every queued error and returns its reason text (library and reason, as OpenSSL prints them).
    static func drain() -> [String] {
        var reasons: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            reasons.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return reasons
    }
}
