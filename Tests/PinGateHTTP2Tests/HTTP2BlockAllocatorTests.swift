import PropertyBased
import Testing
@testable import PinGateHTTP2

/// The small-block lists nghttp2's sessions allocate from (issue 32: about 19 malloc calls
/// per keep-alive request were nghttp2's own). Whatever the order of allocations, resizes
/// and frees, every live block keeps its bytes, no two live blocks overlap, freed blocks
/// come back for the next allocation of their class, and the lists stay bounded.
@Suite("HTTP/2 session allocator")
struct HTTP2BlockAllocatorTests {
    /// A live block: where, how big as asked, and the byte it was filled with.
    private struct Live {
        var pointer: UnsafeMutableRawPointer
        var size: Int
        var fill: UInt8
    }

    @Test("property: over random mallocs, callocs, reallocs and frees of 0 to 5,000 bytes, live blocks keep their bytes and never overlap; the lists hold at most 16 blocks per class")
    func blocksKeepTheirBytes() async {
        let operations = Gen.int(in: 0...3).array(of: 1...120)
        await propertyCheck(count: 300, input: operations, Gen.int(in: 0...5000).array(of: 120...120)) { kinds, sizes in
            Self.run(kinds: kinds, sizes: sizes)
        }
    }

    private static func run(kinds: [Int], sizes: [Int]) {
        let allocator = HTTP2BlockAllocator()
        var live: [Live] = []
        var fill: UInt8 = 1
        func check(_ block: Live) -> Bool {
            UnsafeRawBufferPointer(start: block.pointer, count: block.size).allSatisfy { $0 == block.fill }
        }
        for (index, kind) in kinds.enumerated() {
            // Small sizes most of the time, as nghttp2's are.
            let size = sizes[index] % 7 == 0 ? sizes[index] : sizes[index] % 300
            switch kind {
            case 0, 1:
                let pointer = kind == 0 ? allocator.allocate(size) : allocator.allocateZeroed(count: 1, size: size)
                guard let pointer else { Issue.record("allocation of \(size) failed"); return }
                if kind == 1 && size > 0 {
                    #expect(UnsafeRawBufferPointer(start: pointer, count: size).allSatisfy { $0 == 0 }, "calloc gave non-zero bytes")
                }
                pointer.initializeMemory(as: UInt8.self, repeating: fill, count: size)
                live.append(Live(pointer: pointer, size: size, fill: fill))
            case 2 where !live.isEmpty:
                let at = sizes[index] % live.count
                var block = live[at]
                guard let moved = allocator.resize(block.pointer, to: size) else { Issue.record("realloc to \(size) failed"); return }
                // What fits of the old bytes came along.
                #expect(UnsafeRawBufferPointer(start: moved, count: min(block.size, size)).allSatisfy { $0 == block.fill })
                block.pointer = moved
                block.size = size
                moved.initializeMemory(as: UInt8.self, repeating: block.fill, count: size)
                live[at] = block
            default:
                guard !live.isEmpty else { continue }
                let block = live.remove(at: sizes[index] % live.count)
                #expect(check(block), "a block lost its bytes before its free")
                allocator.free(block.pointer)
            }
            fill = fill == 255 ? 1 : fill + 1
            #expect(allocator.cachedBlocks <= 16 * 6)
        }
        for block in live { #expect(check(block), "kinds \(kinds) sizes \(sizes)") }
        // No two live blocks overlap.
        let ranges = live.map { (Int(bitPattern: $0.pointer), Int(bitPattern: $0.pointer) + max($0.size, 1)) }.sorted { $0.0 < $1.0 }
        for (first, second) in zip(ranges, ranges.dropFirst()) { #expect(first.1 <= second.0) }
        for block in live { allocator.free(block.pointer) }
    }

    @Test("a freed small block is what the next allocation of its class gets; large blocks go back to the heap; releasing the lists empties them")
    func freedBlocksComeBack() throws {
        let allocator = HTTP2BlockAllocator()
        let first = try #require(allocator.allocate(100))
        allocator.free(first)
        #expect(allocator.cachedBlocks == 1)
        // 100 and 120 bytes are the same class (128): the block comes back.
        let second = try #require(allocator.allocate(120))
        #expect(second == first)
        #expect(allocator.cachedBlocks == 0)
        // Grown within its class, a block stays where it is.
        #expect(allocator.resize(second, to: 128) == second)
        allocator.free(second)

        let large = try #require(allocator.allocate(10_000))
        allocator.free(large)
        #expect(allocator.cachedBlocks == 1, "a large block is not kept")

        // A class's list is bounded: 40 blocks freed, 16 kept.
        let many = (0..<40).compactMap { _ in allocator.allocate(60) }
        #expect(many.count == 40)
        for pointer in many { allocator.free(pointer) }
        #expect(allocator.cachedBlocks == 1 + 16)
        #expect(allocator.releaseCache() > 0)
        #expect(allocator.cachedBlocks == 0)
        allocator.free(nil)
    }
}
