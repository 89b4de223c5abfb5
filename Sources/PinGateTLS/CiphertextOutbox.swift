internal import COpenSSL

/// The write side of a `TLSConnection`: a custom BIO that OpenSSL writes ciphertext into,
/// straight into the caller's buffer where it can.
///
/// Why: with a memory BIO every sent byte was copied twice after encryption, once from
/// OpenSSL's record buffer into the BIO (`BIO_write`, which grows the BIO's buffer and
/// zeroes what it grows into) and once out of it into the buffer that goes to the socket;
/// and the BIO's buffer was allocated and freed around every small write (a keep-alive
/// response). Here, while `TLSConnection.writePlaintext(_:sealingInto:)` runs, records go
/// into the caller's buffer (`window`), which goes to the socket as it is. What does not
/// fit, and what OpenSSL writes at other times (handshake flights, alerts, a KeyUpdate,
/// close_notify), waits in `backlog` for `take(into:)`.
///
/// Order is kept: the window takes a record only while the backlog is empty, so whatever
/// the backlog holds always comes after what the window got.
///
/// Owned by its `TLSConnection`; the BIO holds it unretained, and the `SSL` (which owns the
/// BIO) is freed in the connection's `deinit`, before the outbox goes.
///
/// Its stored properties carry no runtime exclusivity check, for the reason
/// `CiphertextInbox` gives: plain reads and assignments, memory copies, and nothing called
/// out while an access lasts.
final class CiphertextOutbox {
    /// Ciphertext not yet taken, from `backlogStart` on.
    @exclusivity(unchecked) private var backlog: [UInt8] = []
    @exclusivity(unchecked) private var backlogStart = 0
    /// The caller's buffer, writable only during `withWindow`; `windowUsed` is how much of
    /// it OpenSSL has filled.
    @exclusivity(unchecked) private var window: UnsafeMutableRawBufferPointer?
    @exclusivity(unchecked) private var windowUsed = 0
    /// Every ciphertext byte that went through the backlog (a copy in and a copy out),
    /// for tests and for deciding how big a window must be.
    @exclusivity(unchecked) private(set) var backlogBytesTotal = 0

    /// Ciphertext waiting in the backlog.
    var count: Int { backlog.count - backlogStart }

    /// Takes OpenSSL's `bytes`: into the window while they fit and the backlog is empty,
    /// else into the backlog. Never refuses: a TLS write either completes or fails.
    func write(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        if let window, backlogStart == backlog.count, bytes.count <= window.count - windowUsed {
            UnsafeMutableRawBufferPointer(rebasing: window[windowUsed..<(windowUsed + bytes.count)]).copyMemory(from: bytes)
            windowUsed += bytes.count
            return
        }
        if backlogStart == backlog.count {
            backlog = []
            backlogStart = 0
        }
        backlog.append(contentsOf: bytes)
        backlogBytesTotal += bytes.count
    }

    /// Lets OpenSSL write into `destination` while `body` runs; returns `body`'s result and
    /// how many bytes of `destination` it filled, from its start. Not reentrant: a nested
    /// call (not made by the gate) gets no window, and the outer one is closed while it
    /// runs, so the nested call's bytes go to the backlog, after what the outer window got.
    func withWindow<Result>(_ destination: UnsafeMutableRawBufferPointer, _ body: () throws -> Result) rethrows -> (Result, filled: Int) {
        if let outer = window {
            window = nil
            defer { window = outer }
            return (try body(), 0)
        }
        window = destination
        windowUsed = 0
        defer {
            window = nil
            windowUsed = 0
        }
        let result = try body()
        return (result, windowUsed)
    }

    /// Moves up to `destination.count` waiting bytes out of the backlog.
    func take(into destination: UnsafeMutableRawBufferPointer) -> Int {
        let moved = min(destination.count, count)
        guard moved > 0 else { return 0 }
        backlog.withUnsafeBytes { stored in
            destination.copyMemory(from: UnsafeRawBufferPointer(rebasing: stored[backlogStart..<(backlogStart + moved)]))
        }
        backlogStart += moved
        if backlogStart == backlog.count {
            // Emptied: its storage is not kept for the life of an idle connection.
            backlog = []
            backlogStart = 0
        }
        return moved
    }

    // MARK: the BIO

    /// A new BIO writing into `outbox` (held unretained: the caller keeps it alive for as
    /// long as the BIO, i.e. the `SSL` it is given to, lives).
    static func makeBIO(writingTo outbox: CiphertextOutbox) throws -> OpaquePointer {
        guard let method = Self.method else { throw OpenSSLError.drained("create ciphertext BIO method") }
        return try method.makeBIO(carrying: outbox)
    }

    /// The method of every outbox BIO.
    private static let method = CustomBIOMethod(name: "pingate ciphertext outbox") { method in
        _ = BIO_meth_set_write_ex(method) { bio, buffer, length, written in
            guard let bio else { return 0 }
            pg_BIO_clear_retry_flags(bio)
            // A BIO without its outbox (never the case while the SSL lives) refuses the
            // write, which fails the TLS write: no ciphertext is dropped silently.
            guard let outbox = CustomBIOMethod.owner(of: bio, as: CiphertextOutbox.self), let buffer else { return 0 }
            outbox.write(UnsafeRawBufferPointer(start: buffer, count: length))
            written?.pointee = length
            return 1
        }
        _ = BIO_meth_set_ctrl(method) { bio, command, _, _ in
            switch command {
            case pg_BIO_CTRL_WPENDING(), pg_BIO_CTRL_PENDING():
                return CustomBIOMethod.owner(of: bio, as: CiphertextOutbox.self).map { $0.count } ?? 0
            case pg_BIO_CTRL_FLUSH():
                // The caller takes the ciphertext when the TLS call returns.
                return 1
            default:
                // Push/pop, kTLS queries and the rest: not supported, which OpenSSL reads as 0.
                return 0
            }
        }
    }
}
