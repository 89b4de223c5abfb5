import Foundation
import Testing
@testable import PinGate

/// The allocator setting behind the bulk-relay figures in `scripts/bench` is really
/// applied: a shim that quietly fell back to "not glibc" (as a first version did, testing
/// `__GLIBC__` before any header defined it) would leave the gate at the default trim
/// threshold and give back a third of its bulk throughput per CPU second. And memory freed
/// after a busy spell goes back to the system.
@Suite("Heap tuning")
struct HeapTuningTests {
    @Test("glibc accepts the trim threshold")
    func trimThresholdIsApplied() {
        #if os(Linux)
        #expect(HeapTuning.applyForRelaying())
        #endif
    }

    @Test("the policy trims once a spell is over (tunnels down to half their peak or less, 32 MiB or more free), never under steady load or for a little free memory")
    func trimPolicy() {
        var policy = HeapTrimPolicy()
        func trims(_ openTunnels: Int, free: Int) -> Bool { policy.shouldTrim(openTunnels: openTunnels, freeBytes: free) }
        let lots = 512 << 20
        // A spell building up and holding steady: no trim, however much is free.
        for tunnels in [100, 2_000, 5_000, 5_000, 4_800, 5_000] {
            #expect(!trims(tunnels, free: lots), "\(tunnels)")
        }
        // Over: one trim, then none while nothing changes.
        #expect(trims(12, free: lots))
        #expect(!trims(12, free: lots))
        #expect(!trims(20, free: lots))
        // The next spell, then idle again, with little free: nothing worth a trim.
        _ = trims(3_000, free: lots)
        #expect(!trims(0, free: 1 << 20))
        #expect(trims(0, free: HeapTrimPolicy.minimumFreeBytes))
        // A spell missed between samples (tunnels 0 before and after) still trims.
        #expect(!trims(0, free: 1 << 20))
        #expect(trims(0, free: lots))
    }

    @Test("a trim gives back freed heap pages that glibc kept: 96 MiB in 32 KiB blocks, one in 16 kept (so the heap's top cannot shrink), the rest freed: most of it leaves the resident set")
    func trimGivesMemoryBack() throws {
        #if os(Linux)
        let block = 32 << 10
        var blocks: [UnsafeMutableRawPointer] = []
        for _ in 0..<(96 << 20) / block {
            let pointer = UnsafeMutableRawPointer.allocate(byteCount: block, alignment: 16)
            pointer.initializeMemory(as: UInt8.self, repeating: 0xA5, count: block)
            blocks.append(pointer)
        }
        var kept: [UnsafeMutableRawPointer] = []
        for (index, pointer) in blocks.enumerated() {
            if index % 16 == 15 { kept.append(pointer) } else { pointer.deallocate() }
        }
        defer { for pointer in kept { pointer.deallocate() } }
        let released = HeapTrimmer.trimNow()
        // 90 MiB were freed; other tests allocate meanwhile, so ask for well over half.
        #expect(released > 48 << 20, "released \(released >> 20) MiB")
        #expect(try #require(ProcessMemory.residentBytes()) > 0)
        #endif
    }
}
