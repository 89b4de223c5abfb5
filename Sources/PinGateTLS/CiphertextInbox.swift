internal import COpenSSL

/// The read side of a `TLSConnection`: a custom BIO that OpenSSL reads received
/// ciphertext from, without the copy into a memory BIO.
///
/// Why: with a memory BIO every received byte was copied twice before decryption, once
/// into the BIO (`BIO_write`, which also zeroes the space it grows into) and once out of
/// it into OpenSSL's record buffer. In a `perf` profile of a bulk download through the
/// gate, the first copy alone was 12-15 % of the gate's CPU. Here OpenSSL reads straight
/// from the caller's buffer while `TLSConnection.withIncomingCiphertext` runs, and only
/// what is left unread at its end (part of one record, typically) is copied, into
/// `backlog`, to be read first next time.
///
/// Owned by its `TLSConnection`; the BIO holds it unretained, and the `SSL` (which owns the
/// BIO) is freed in the connection's `deinit`, before the inbox goes.
///
/// Its stored properties carry no runtime exclusivity check: each access is a plain read or
/// assignment, or a `withUnsafeBytes` whose closure only copies memory, and none calls out
/// while it lasts (`withIncoming` runs its body between accesses, not during one), so no
/// two accesses can overlap. The checks were about 1 % of the gate's instructions per
/// keep-alive request (issue 32, callgrind).
final class CiphertextInbox {
    /// Bytes received earlier and not yet read by OpenSSL, from `backlogStart` on.
    @exclusivity(unchecked) private var backlog: [UInt8] = []
    @exclusivity(unchecked) private var backlogStart = 0
    /// The caller's bytes, readable only during `withIncoming`; `windowStart` is how far
    /// OpenSSL has read in them.
    @exclusivity(unchecked) private var window: UnsafeRawBufferPointer?
    @exclusivity(unchecked) private var windowStart = 0

    /// Bytes OpenSSL can read now.
    var count: Int {
        (backlog.count - backlogStart) + (window.map { $0.count - windowStart } ?? 0)
    }

    /// Keeps a copy of `bytes` to be read after what is already waiting.
    func append(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        if backlogStart == backlog.count {
            backlog = []
            backlogStart = 0
        }
        backlog.append(contentsOf: bytes)
    }

    /// Lets OpenSSL read `bytes` in place while `body` runs; what it left unread is copied
    /// into the backlog at the end. A nested call (not made by the gate) falls back to
    /// copying: the outer window's unread rest goes to the backlog first, then `bytes`, so
    /// the order of bytes is kept whatever the caller does.
    func withIncoming<Result>(_ bytes: UnsafeRawBufferPointer, _ body: () throws -> Result) rethrows -> Result {
        if let outer = window {
            if windowStart < outer.count {
                append(UnsafeRawBufferPointer(rebasing: outer[windowStart...]))
                windowStart = outer.count // the outer call's end then finds nothing left
            }
            append(bytes)
            return try body()
        }
        window = bytes
        windowStart = 0
        defer {
            if let window, windowStart < window.count {
                append(UnsafeRawBufferPointer(rebasing: window[windowStart...]))
            }
            window = nil
            windowStart = 0
        }
        return try body()
    }

    /// Moves up to `destination.count` bytes to OpenSSL: the backlog first, then the window.
    func read(into destination: UnsafeMutableRawBufferPointer) -> Int {
        var moved = 0
        let fromBacklog = min(destination.count, backlog.count - backlogStart)
        if fromBacklog > 0 {
            backlog.withUnsafeBytes { stored in
                destination.copyMemory(from: UnsafeRawBufferPointer(rebasing: stored[backlogStart..<(backlogStart + fromBacklog)]))
            }
            backlogStart += fromBacklog
            moved = fromBacklog
            if backlogStart == backlog.count {
                // Emptied: its storage is not kept for the life of an idle connection.
                backlog = []
                backlogStart = 0
            }
        }
        if moved < destination.count, let window {
            let fromWindow = min(destination.count - moved, window.count - windowStart)
            if fromWindow > 0 {
                UnsafeMutableRawBufferPointer(rebasing: destination[moved...])
                    .copyMemory(from: UnsafeRawBufferPointer(rebasing: window[windowStart..<(windowStart + fromWindow)]))
                windowStart += fromWindow
                moved += fromWindow
            }
        }
        return moved
    }

    // MARK: the BIO

    /// A new BIO reading from `inbox` (held unretained: the caller keeps it alive for as
    /// long as the BIO, i.e. the `SSL` it is given to, lives).
    static func makeBIO(reading inbox: CiphertextInbox) throws -> OpaquePointer {
        guard let method = Self.method else { throw OpenSSLError.drained("create ciphertext BIO method") }
        return try method.makeBIO(carrying: inbox)
    }

    /// The method of every inbox BIO.
    private static let method = CustomBIOMethod(name: "pingate ciphertext inbox") { method in
        _ = BIO_meth_set_read_ex(method) { bio, buffer, length, readBytes in
            guard let bio else { return 0 }
            pg_BIO_clear_retry_flags(bio)
            guard let inbox = CustomBIOMethod.owner(of: bio, as: CiphertextInbox.self), let buffer, length > 0 else { return 0 }
            let moved = inbox.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: length))
            readBytes?.pointee = moved
            guard moved > 0 else {
                // Nothing yet is "try again later", never end of stream: the end of the
                // TCP stream reaches the TLS handler as its own event.
                pg_BIO_set_retry_read(bio)
                return 0
            }
            return 1
        }
        _ = BIO_meth_set_ctrl(method) { bio, command, _, _ in
            switch command {
            case pg_BIO_CTRL_PENDING():
                return CustomBIOMethod.owner(of: bio, as: CiphertextInbox.self).map { $0.count } ?? 0
            case pg_BIO_CTRL_FLUSH():
                return 1
            case pg_BIO_CTRL_EOF():
                return 0
            default:
                // Push/pop, kTLS queries and the rest: not supported, which OpenSSL reads as 0.
                return 0
            }
        }
    }
}
