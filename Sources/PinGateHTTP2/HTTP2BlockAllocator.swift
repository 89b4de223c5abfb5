internal import CNghttp2

/// A session allocator of its own, driven directly: what nghttp2 does to one (malloc, calloc,
/// realloc, free, in any order) without a session, so that the small-block lists behind
/// `HTTP2Session` can be tested on their own. Owns its `pg_nghttp2_allocator`; `deinit`
/// frees what its lists keep and the allocator. Used from one thread, as a session is.
final class HTTP2BlockAllocator {
    private let allocator: UnsafeMutablePointer<pg_nghttp2_allocator>

    init() {
        allocator = .allocate(capacity: 1)
        pg_nghttp2_allocator_init(allocator)
        // No session is being created: nothing is taken as its frame buffer or stream table.
        allocator.pointee.capturing = 0
    }

    deinit {
        pg_nghttp2_release_cache(allocator)
        allocator.deallocate()
    }

    /// nghttp2's `malloc`.
    func allocate(_ size: Int) -> UnsafeMutableRawPointer? {
        allocator.pointee.mem.malloc(size, allocator)
    }

    /// nghttp2's `calloc`.
    func allocateZeroed(count: Int, size: Int) -> UnsafeMutableRawPointer? {
        allocator.pointee.mem.calloc(count, size, allocator)
    }

    /// nghttp2's `realloc`.
    func resize(_ pointer: UnsafeMutableRawPointer?, to size: Int) -> UnsafeMutableRawPointer? {
        allocator.pointee.mem.realloc(pointer, size, allocator)
    }

    /// nghttp2's `free`.
    func free(_ pointer: UnsafeMutableRawPointer?) {
        allocator.pointee.mem.free(pointer, allocator)
    }

    /// Blocks kept on the lists, all classes together.
    var cachedBlocks: Int {
        withUnsafeBytes(of: allocator.pointee.cached_count) { counts in
            counts.bindMemory(to: UInt32.self).reduce(0) { $0 + Int($1) }
        }
    }

    /// Frees what the lists keep; the bytes given back.
    func releaseCache() -> Int {
        pg_nghttp2_release_cache(allocator)
    }
}
