import Foundation
import NIOCore

/// How many CPUs the gate can use: what the cgroup allows (NIO's `System.coreCount`, which
/// reads the CPU quota and the cpuset), and no more than the process's CPU affinity mask
/// holds (`taskset`, `systemd`'s `CPUAffinity=`, a container runtime's `--cpuset-cpus`
/// applied as affinity), which `System.coreCount` does not read.
///
/// The gate runs one event loop per usable CPU. More loops than CPUs only take turns on
/// the same ones: every hand-off between loops (an accepted connection registered on
/// another loop) becomes a context switch, and each loop keeps its own pooled upstream
/// connections. Go's `GOMAXPROCS`, the JVM's `availableProcessors` and nginx's
/// `worker_processes auto` read the mask the same way.
enum UsableProcessors {
    /// The usable CPU count, at least 1: read once per process (the mask and the cgroup
    /// are set before the gate starts; every `GateConfiguration` takes its default from it).
    static let count: Int = {
        let cores = System.coreCount
        return max(1, min(cores, affinityCount ?? cores))
    }()

    /// The CPUs in this process's affinity mask, or nil when it cannot be read: the
    /// `Cpus_allowed` mask of `/proc/self/status` (hexadecimal words separated by commas).
    /// Read from the file because Swift's Glibc module leaves out `sched_getaffinity`
    /// (a `_GNU_SOURCE` declaration) and Foundation's `activeProcessorCount` ignores it.
    static var affinityCount: Int? {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
        return affinityCount(status: status)
    }

    /// The CPUs in the `Cpus_allowed` line of a `/proc/PID/status` text, or nil without one.
    static func affinityCount(status: String) -> Int? {
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("Cpus_allowed:") }) else { return nil }
        var count = 0
        for byte in line.dropFirst("Cpus_allowed:".count).utf8 {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): count += (byte - UInt8(ascii: "0")).nonzeroBitCount
            case UInt8(ascii: "a")...UInt8(ascii: "f"): count += (byte - UInt8(ascii: "a") + 10).nonzeroBitCount
            case UInt8(ascii: ","), UInt8(ascii: " "), UInt8(ascii: "\t"): continue
            default: return nil
            }
        }
        return count > 0 ? count : nil
    }
}
