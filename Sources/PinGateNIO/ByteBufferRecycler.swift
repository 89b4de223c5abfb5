import NIOCore
import NIOPosix

/// A few byte buffers kept per thread for the TLS handlers of that thread's event loop to
/// take again: the plaintext each read decrypts into, and the ciphertext each flush seals.
///
/// Why: each of those was a fresh `ByteBuffer` (two allocations: the storage object and its
/// bytes), and a keep-alive exchange through the gate makes about five of them (issue 32:
/// about 10 of the 61 `malloc` calls per HTTP/1.1 keep-alive request). A buffer kept per
/// *connection* would cost every idle tunnel its size (issue 12 measured it); kept per
/// *thread*, a handful serve every connection on the loop, and memory does not grow with
/// the number of tunnels.
///
/// A buffer is handed out again only when nothing else holds its storage
/// (`modifyIfUniquelyOwned`): a buffer given back while the pipeline still holds it (a body
/// slice waiting in another connection's write queue, ciphertext NIO has not written yet)
/// is passed over until it is free, so bytes somebody still reads are never overwritten.
/// Given-back buffers hold no meaning: whoever takes one clears it first.
///
/// One thread only: a recycler is reached through `forCurrentThread()` and used by the
/// handlers of the event loop that runs on that thread, never shared.
public final class ByteBufferRecycler {
    /// What the recycler did, for tests and the bench: buffers handed out again, buffers it
    /// had to allocate, and buffers given back that it did not keep (too large, or full).
    public struct Counts: Equatable, Sendable {
        /// `take` handed out a kept buffer.
        public var reused = 0
        /// `take` found none free and allocated one.
        public var allocated = 0
        /// Buffers let go: given larger than `largestKept`, or the longest kept one when
        /// `keptLimit` were kept.
        public var released = 0

        /// Counts as given (tests compare with them).
        public init(reused: Int = 0, allocated: Int = 0, released: Int = 0) {
            self.reused = reused
            self.allocated = allocated
            self.released = released
        }
    }

    /// The most buffers kept at once (a keep-alive exchange has about three out at a time).
    public let keptLimit: Int
    /// The largest capacity kept: a read chunk, or a flush sealed into a few records. A
    /// larger buffer (a long burst gathered at once) is left to the allocator.
    public let largestKept: Int
    /// No runtime exclusivity check on `kept` and `counts`: they are touched only by this
    /// class's methods, whose accesses call nothing that could reach them again (the
    /// closure given to `modifyIfUniquelyOwned` is empty); the checks were about 1.5 % of
    /// the gate's instructions per keep-alive request (issue 32, callgrind).
    @exclusivity(unchecked) private var kept: [ByteBuffer] = []
    /// What it did so far.
    @exclusivity(unchecked) public private(set) var counts = Counts()

    /// A recycler of its own (tests; the gate's handlers use `forCurrentThread()`).
    /// - Parameters:
    ///   - keptLimit: the most buffers kept at once.
    ///   - largestKept: the largest capacity a kept buffer may have.
    public init(keptLimit: Int = 6, largestKept: Int = 80 * 1024) {
        self.keptLimit = keptLimit
        self.largestKept = largestKept
        kept.reserveCapacity(keptLimit)
    }

    // The variable itself is safe to reach from any thread (NIO's documentation), and each
    // thread only ever sees its own recycler.
    nonisolated(unsafe) private static let perThread = ThreadSpecificVariable<ByteBufferRecycler>()

    /// The calling thread's recycler, made on first use and freed with the thread.
    public static func forCurrentThread() -> ByteBufferRecycler {
        if let recycler = perThread.currentValue { return recycler }
        let recycler = ByteBufferRecycler()
        perThread.currentValue = recycler
        return recycler
    }

    /// An empty buffer with room for at least `minimumCapacity` bytes: a kept one that
    /// nothing else holds (the most recently given first, a large enough one preferred;
    /// else a smaller one grown, which realloc may do in place), or a new one from `allocator`.
    public func take(minimumCapacity: Int, allocator: ByteBufferAllocator) -> ByteBuffer {
        // Larger than is ever kept: growing a kept buffer to it would only lose that buffer
        // when it comes back (`give` lets it go).
        guard minimumCapacity <= largestKept else {
            counts.allocated += 1
            return allocator.buffer(capacity: minimumCapacity)
        }
        var smaller: Int?
        for index in kept.indices.reversed() {
            // Free when this array holds the storage's only reference.
            guard kept[index].modifyIfUniquelyOwned({ _ in }) != nil else { continue }
            if kept[index].capacity >= minimumCapacity { return handOut(index, minimumCapacity: minimumCapacity) }
            if smaller == nil { smaller = index }
        }
        if let index = smaller { return handOut(index, minimumCapacity: minimumCapacity) }
        counts.allocated += 1
        return allocator.buffer(capacity: minimumCapacity)
    }

    private func handOut(_ index: Int, minimumCapacity: Int) -> ByteBuffer {
        counts.reused += 1
        var buffer = kept.remove(at: index)
        buffer.clear(minimumCapacity: minimumCapacity)
        return buffer
    }

    /// Gives `buffer` back for a later `take`, once nothing else holds it. A buffer larger
    /// than `largestKept` is not kept; with `keptLimit` kept, the longest kept one goes
    /// (most likely one still held elsewhere, or the least recently used).
    public func give(_ buffer: ByteBuffer) {
        guard buffer.capacity <= largestKept else {
            counts.released += 1
            return
        }
        if kept.count >= keptLimit {
            kept.removeFirst()
            counts.released += 1
        }
        kept.append(buffer)
    }

    /// How many buffers are kept now.
    public var keptCount: Int { kept.count }
}
