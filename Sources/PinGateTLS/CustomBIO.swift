internal import COpenSSL

/// What the engine's two custom BIOs (`CiphertextInbox`, `CiphertextOutbox`) share: a
/// `BIO_METHOD` made once for the process, and BIOs whose data is their Swift owner, held
/// unretained.
///
/// The owner belongs to its `TLSConnection`, which frees the `SSL` (and with it the BIO)
/// in its `deinit`, before the owner goes; the BIO's destroy only forgets it.
final class CustomBIOMethod: @unchecked Sendable {
    /// Made once and never freed (BIOs made from it may live until exit); immutable once
    /// made, so shared across threads.
    let pointer: OpaquePointer

    /// A source/sink method named `name`, with `configure` setting its read or write and
    /// its ctrl; nil when OpenSSL cannot make one.
    init?(name: String, configure: (OpaquePointer) -> Void) {
        let index = BIO_get_new_index()
        guard index != -1, let method = BIO_meth_new(index | pg_BIO_TYPE_SOURCE_SINK(), name) else { return nil }
        pointer = method
        configure(method)
        _ = BIO_meth_set_create(method) { _ in 1 }
        _ = BIO_meth_set_destroy(method) { bio in
            if let bio { BIO_set_data(bio, nil); BIO_set_init(bio, 0) }
            return 1
        }
    }

    /// A new BIO of this method carrying `owner` (unretained: the caller keeps it alive for
    /// as long as the BIO, i.e. the `SSL` it is given to, lives).
    func makeBIO(carrying owner: AnyObject) throws -> OpaquePointer {
        OpenSSLErrorQueue.clear()
        guard let bio = BIO_new(pointer) else { throw OpenSSLError.drained("create ciphertext BIO") }
        BIO_set_data(bio, Unmanaged.passUnretained(owner).toOpaque())
        BIO_set_init(bio, 1)
        return bio
    }

    /// The owner a BIO of this kind carries, if it still does.
    static func owner<Owner: AnyObject>(of bio: OpaquePointer?, as type: Owner.Type) -> Owner? {
        guard let bio, let data = BIO_get_data(bio) else { return nil }
        return Unmanaged<Owner>.fromOpaque(data).takeUnretainedValue()
    }
}
