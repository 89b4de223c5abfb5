import PinGate
import Testing

/// The allocator setting behind the bulk-relay figures in `scripts/bench` is really
/// applied: a shim that quietly fell back to "not glibc" (as a first version did, testing
/// `__GLIBC__` before any header defined it) would leave the gate at the default trim
/// threshold and give back a third of its bulk throughput per CPU second.
@Suite("Heap tuning")
struct HeapTuningTests {
    @Test("glibc accepts the trim threshold")
    func trimThresholdIsApplied() {
        #if os(Linux)
        #expect(HeapTuning.applyForRelaying())
        #endif
    }
}
