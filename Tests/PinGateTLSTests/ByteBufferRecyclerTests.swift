import NIOCore
import PinGateNIO
import PropertyBased
import Testing

/// The per-thread buffers the TLS handlers read into and seal into: a buffer is handed out
/// again only when nobody else holds it, so reuse never overwrites bytes someone still reads.
@Suite("Byte buffer recycler")
struct ByteBufferRecyclerTests {
    private static let allocator = ByteBufferAllocator()

    /// The address of a buffer's storage, to tell storages apart.
    private static func storage(_ buffer: ByteBuffer) -> UnsafeRawPointer? {
        buffer.withVeryUnsafeBytes { UnsafeRawPointer($0.baseAddress) }
    }

    @Test("a buffer given back while a slice of it is still held is not handed out; once the slice goes, it is, cleared")
    func heldBufferPassedOver() {
        let recycler = ByteBufferRecycler()
        var first = recycler.take(minimumCapacity: 1024, allocator: Self.allocator)
        first.writeString("still read by someone")
        var slice = first.getSlice(at: 0, length: 5)
        let firstStorage = Self.storage(first)
        recycler.give(first)
        first = ByteBuffer()

        var second = recycler.take(minimumCapacity: 1024, allocator: Self.allocator)
        #expect(Self.storage(second) != firstStorage, "handed out a buffer a slice still reads")
        second.writeString("other bytes")
        #expect(slice?.getString(at: 0, length: 5) == "still")
        #expect(recycler.counts == .init(reused: 0, allocated: 2, released: 0))

        slice = nil
        let third = recycler.take(minimumCapacity: 1024, allocator: Self.allocator)
        #expect(Self.storage(third) == firstStorage)
        #expect(third.readableBytes == 0)
        #expect(recycler.counts == .init(reused: 1, allocated: 2, released: 0))
        _ = (second, slice)
    }

    @Test("a free buffer is handed out again, empty, with the same storage; a smaller free one is grown rather than a new one allocated")
    func freeBufferReused() {
        let recycler = ByteBufferRecycler()
        var buffer = recycler.take(minimumCapacity: 512, allocator: Self.allocator)
        buffer.writeString("old bytes")
        let storage = Self.storage(buffer)
        recycler.give(buffer)
        buffer = ByteBuffer()

        var again = recycler.take(minimumCapacity: 512, allocator: Self.allocator)
        #expect(Self.storage(again) == storage)
        #expect(again.readableBytes == 0 && again.readerIndex == 0 && again.writerIndex == 0)
        recycler.give(again)
        again = ByteBuffer()

        let larger = recycler.take(minimumCapacity: 4096, allocator: Self.allocator)
        #expect(larger.capacity >= 4096)
        #expect(recycler.counts == .init(reused: 2, allocated: 1, released: 0))
        #expect(recycler.keptCount == 0)
    }

    @Test("buffers larger than the largest kept are let go; with the limit kept, the longest kept one goes, and the last given comes out first")
    func bounds() {
        let recycler = ByteBufferRecycler(keptLimit: 2, largestKept: 4096)
        recycler.give(Self.allocator.buffer(capacity: 8192))
        #expect(recycler.keptCount == 0 && recycler.counts.released == 1)
        var storages: [UnsafeRawPointer?] = []
        for _ in 0..<3 {
            let buffer = Self.allocator.buffer(capacity: 1024)
            storages.append(Self.storage(buffer))
            recycler.give(buffer)
        }
        #expect(recycler.keptCount == 2 && recycler.counts.released == 2)
        let last = recycler.take(minimumCapacity: 100, allocator: Self.allocator)
        let middle = recycler.take(minimumCapacity: 100, allocator: Self.allocator)
        #expect(Self.storage(last) == storages[2] && Self.storage(middle) == storages[1])
        _ = recycler.take(minimumCapacity: 100, allocator: Self.allocator)
        #expect(recycler.counts == .init(reused: 2, allocated: 1, released: 2))
        // Larger than is kept: allocated, and the kept (free) one is not grown and lost.
        recycler.give(Self.allocator.buffer(capacity: 1024))
        let large = recycler.take(minimumCapacity: 8192, allocator: Self.allocator)
        #expect(large.capacity >= 8192 && recycler.keptCount == 1)
        #expect(recycler.counts == .init(reused: 2, allocated: 2, released: 2))
    }

    @Test("property: over random takes, writes, slices held and dropped, and gives, no buffer handed out shares storage with one still held, held bytes never change, a free kept buffer is always taken before a new one is allocated, and every take is counted once")
    func reuseNeverOverwritesHeldBytes() async {
        // An operation: 0 takes (size from the second list), 1 gives back the oldest held
        // buffer keeping a slice of it, 2 gives back the newest held buffer, 3 drops the
        // oldest kept slice, 4 drops every slice.
        let operations = Gen.int(in: 0...4).array(of: 1...60)
        let sizes = Gen.int(in: 1...20_000).array(of: 60...60)
        await propertyCheck(count: 200, input: operations, sizes) { operations, sizes in
            Self.run(operations, sizes: sizes)
        }
    }

    private static func ends(_ buffer: ByteBuffer) -> [UInt8] {
        let count = min(8, buffer.readableBytes)
        return (buffer.getBytes(at: buffer.readerIndex, length: count) ?? [])
            + (buffer.getBytes(at: buffer.writerIndex - count, length: count) ?? [])
    }

    private static func run(_ operations: [Int], sizes: [Int]) {
        let recycler = ByteBufferRecycler(keptLimit: 3, largestKept: 16 * 1024)
        // What is held outside the recycler, with the byte each was filled with.
        var held: [(buffer: ByteBuffer, fill: UInt8)] = []
        var slices: [(slice: ByteBuffer, fill: UInt8)] = []
        var takes = 0
        var fill: UInt8 = 0
        for (step, operation) in operations.enumerated() {
            switch operation {
            case 0:
                let size = sizes[step % sizes.count]
                // With no slice out, nothing outside holds a kept buffer: one must be taken
                // again (grown if need be) rather than a new one allocated.
                // (A size larger than is ever kept is allocated: growing a kept one to it
                // would only lose it when it comes back.)
                let mustReuse = slices.isEmpty && recycler.keptCount > 0 && size <= recycler.largestKept
                let reusedBefore = recycler.counts.reused
                var buffer = recycler.take(minimumCapacity: size, allocator: allocator)
                takes += 1
                if mustReuse { #expect(recycler.counts.reused == reusedBefore + 1, "allocated while a free buffer was kept") }
                #expect(buffer.readableBytes == 0 && buffer.capacity >= size)
                let storage = Self.storage(buffer)
                #expect(!held.contains { Self.storage($0.buffer) == storage }, "handed out a held buffer")
                #expect(!slices.contains { Self.storage($0.slice).map { $0 >= storage! && $0 < storage! + buffer.capacity } ?? false },
                        "handed out a buffer a slice still reads")
                fill &+= 1
                buffer.writeRepeatingByte(fill, count: size)
                held.append((buffer, fill))
            case 1 where !held.isEmpty:
                let oldest = held.removeFirst()
                if let slice = oldest.buffer.getSlice(at: 0, length: min(16, oldest.buffer.readableBytes)) {
                    slices.append((slice, oldest.fill))
                }
                recycler.give(oldest.buffer)
            case 2 where !held.isEmpty:
                recycler.give(held.removeLast().buffer)
            case 3 where !slices.isEmpty:
                slices.removeFirst()
            case 4:
                slices.removeAll()
            default:
                break
            }
            // A buffer handed out again is cleared and filled from its start: its first and
            // last bytes tell (checking every byte made the property take half a minute).
            for (buffer, fill) in held {
                #expect(Self.ends(buffer).allSatisfy { $0 == fill }, "a held buffer's bytes changed")
            }
            for (slice, fill) in slices {
                #expect(Self.ends(slice).allSatisfy { $0 == fill }, "a held slice's bytes changed")
            }
            #expect(recycler.keptCount <= recycler.keptLimit)
        }
        #expect(recycler.counts.reused + recycler.counts.allocated == takes)
    }
}
