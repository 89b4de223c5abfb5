internal import COpenSSL

/// An owned OpenSSL memory BIO, used to move PEM and DER text in and out of OpenSSL.
final class MemoryBIO {
    let pointer: OpaquePointer

    /// An empty, growable memory BIO for OpenSSL to write into.
    init() throws {
        OpenSSLErrorQueue.clear()
        guard let bio = BIO_new(BIO_s_mem()) else { throw OpenSSLError.drained("allocate memory BIO") }
        pointer = bio
    }

    /// A memory BIO holding a copy of `bytes` for OpenSSL to read.
    convenience init(bytes: [UInt8]) throws {
        try self.init()
        let written = bytes.withUnsafeBytes { raw -> Int32 in
            guard let base = raw.baseAddress, raw.count > 0 else { return 0 }
            return BIO_write(pointer, base, Int32(raw.count))
        }
        guard written == Int32(bytes.count) else { throw OpenSSLError.drained("fill memory BIO") }
    }

    deinit { BIO_free(pointer) }

    /// Everything OpenSSL wrote into the BIO.
    func readAll() -> [UInt8] {
        let pending = Int(BIO_ctrl_pending(pointer))
        guard pending > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: pending)
        let read = bytes.withUnsafeMutableBytes { BIO_read(pointer, $0.baseAddress, Int32(pending)) }
        return Array(bytes.prefix(max(0, Int(read))))
    }
}
