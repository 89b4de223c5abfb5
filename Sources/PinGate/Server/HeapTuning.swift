import CMallocTuning
import Foundation
import ServiceLifecycle

/// Process-wide allocator settings for a relaying gate.
///
/// Why: relaying a large body moves through buffers of tens to hundreds of KiB that are
/// allocated and freed once per TLS flight (OpenSSL's record buffers, which
/// `SSL_MODE_RELEASE_BUFFERS` frees whenever they empty so idle tunnels cost little, and
/// the ciphertext buffers the TLS handler hands to the socket). With glibc's default trim
/// threshold (128 KiB, adjusted dynamically) each free at the top of the heap gives the
/// pages back to the kernel and the next allocation faults them in again, zeroed. A
/// `perf` profile of a 64 MiB download through the byte relay showed a quarter of the
/// gate's CPU in `sysmalloc`, page faults and page clearing. Keeping up to
/// `trimThresholdBytes` of free memory at the top of each heap stops that churn
/// (measured in the `scripts/bench` bulk rows: 2.9 → 1.9 s of gate CPU per GB relayed).
/// It costs at most that much resident memory per malloc arena, a fixed amount that
/// does not grow with the number of tunnels.
public enum HeapTuning {
    /// Free memory glibc may keep at the top of each heap instead of returning it.
    public static let trimThresholdBytes: Int32 = 4 << 20

    /// Applies the settings; call once at start-up, before the event loops allocate.
    /// Returns false where the C library offers no such knob (not glibc) or refused it.
    @discardableResult
    public static func applyForRelaying() -> Bool {
        // M_TRIM_THRESHOLD also turns off glibc's dynamic adjustment of the mmap
        // threshold, which is wanted: it leaves allocations above 128 KiB on mmap, so a
        // rare very large buffer is still returned to the kernel when freed.
        pg_malloc_set_trim_threshold(trimThresholdBytes) == 1
    }
}

/// When to give the heap's free memory back to the system: once a busy spell is over.
///
/// Why: memory freed by closed tunnels stays in glibc's arenas, resident, for reuse (an
/// outside probe saw 1.2–2.4 GB stay after 5,000 concurrent downloads had all closed), and
/// `M_TRIM_THRESHOLD` (`HeapTuning`) only ever trims the top of a heap. `malloc_trim(0)`
/// gives back every free page of every arena, at the cost of faulting them in again if
/// they are needed soon, so it runs only when there is a lot to give back and the number
/// of open tunnels has fallen to half or less of the peak since the last trim: not under
/// steady load, where the pages would come straight back.
///
/// Sans-IO: `HeapTrimmer` samples, this decides.
struct HeapTrimPolicy {
    /// Free heap below this is not worth a trim.
    static let minimumFreeBytes = 32 << 20

    /// The most tunnels open at any sample since the last trim.
    private(set) var peakSinceTrim = 0

    /// One sample: `openTunnels` now, `freeBytes` free in the heap's arenas. True when
    /// the heap should be trimmed now.
    mutating func shouldTrim(openTunnels: Int, freeBytes: Int) -> Bool {
        peakSinceTrim = max(peakSinceTrim, openTunnels)
        guard freeBytes >= Self.minimumFreeBytes, openTunnels <= peakSinceTrim / 2 else { return false }
        peakSinceTrim = openTunnels
        return true
    }
}

/// Trims the heap (`HeapTrimPolicy`) every `interval`, off the event loops, and counts what
/// each trim gave back in `statistics`. Ends with the service group.
public struct HeapTrimmer: Service {
    let statistics: GateStatistics
    let interval: Duration

    /// A trimmer sampling `statistics`' open tunnels every `interval`.
    public init(statistics: GateStatistics, interval: Duration = .seconds(5)) {
        self.statistics = statistics
        self.interval = interval
    }

    /// Samples until the service group shuts down. Returns then (a service that throws
    /// would end the group at once, cutting the gate's drain short).
    public func run() async {
        await cancelWhenGracefulShutdown {
            var policy = HeapTrimPolicy()
            while true {
                do {
                    try await Task.sleep(for: interval)
                } catch {
                    return
                }
                let free = Int(pg_malloc_free_bytes())
                if policy.shouldTrim(openTunnels: statistics.snapshot.openTunnels, freeBytes: free) {
                    statistics.heapTrimmed(released: Self.trimNow())
                }
            }
        }
    }

    /// Gives the heap's free pages back now; returns the resident bytes that went (0 when
    /// they cannot be read, or none did). Blocks while glibc walks its arenas: not for an
    /// event loop.
    @discardableResult
    public static func trimNow() -> Int {
        let before = ProcessMemory.residentBytes()
        pg_malloc_trim()
        let after = ProcessMemory.residentBytes()
        guard let before, let after else { return 0 }
        return max(0, before - after)
    }
}

/// The process's own memory, as the kernel counts it.
enum ProcessMemory {
    /// Resident bytes (`/proc/self/statm`'s second field, in pages), or nil off Linux.
    static func residentBytes() -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return nil }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return nil }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }
}
