import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// One event loop per CPU the gate may use, its affinity mask included.
@Suite("Usable processors")
struct UsableProcessorsTests {
    @Test("the Cpus_allowed mask of /proc/PID/status is counted bit by bit, over comma-separated words; anything else is no answer")
    func maskParsing() {
        #expect(UsableProcessors.affinityCount(status: "Name:\tpingate\nCpus_allowed:\t1\nCpus_allowed_list:\t0\n") == 1)
        #expect(UsableProcessors.affinityCount(status: "Cpus_allowed:\t3\n") == 2)
        #expect(UsableProcessors.affinityCount(status: "Cpus_allowed:\tff,ffffffff\n") == 40)
        #expect(UsableProcessors.affinityCount(status: "Cpus_allowed:\t00000000,00000a05\n") == 4)
        #expect(UsableProcessors.affinityCount(status: "Name:\tpingate\n") == nil)
        #expect(UsableProcessors.affinityCount(status: "Cpus_allowed:\t0\n") == nil)
        #expect(UsableProcessors.affinityCount(status: "Cpus_allowed:\tzz\n") == nil)
        // This process's own mask: at least one CPU, never more than the machine has.
        let own = UsableProcessors.affinityCount
        #expect(own.map { $0 >= 1 && $0 <= ProcessInfo.processInfo.processorCount } == true, "\(String(describing: own))")
    }

    @Test("a gate started under taskset on one CPU runs one event loop (NIO's core count reads the cgroup, not the affinity mask)")
    func pinnedGateRunsOneLoop() async throws {
        let taskset = try TestProcess.resolve("taskset")
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let gate = ChildProcess()
        gate.executableURL = URL(fileURLWithPath: taskset)
        gate.arguments = ["-c", "0", TestProcess.pingateExecutable, "run", "--listen", "127.0.0.1:0", "--admin-listen", "off",
                          "--state-dir", directory.file("state"), "--log-level", "warning"]
        let output = Pipe()
        gate.standardError = output
        gate.standardOutput = output
        try gate.run()
        defer { gate.terminate() }
        // taskset execs the gate: the PID is the gate's. Its loops start before it listens.
        var loops: [String] = []
        let started = await eventually(timeout: .seconds(20)) {
            loops = Self.threadNames(gate.processIdentifier).filter { $0.hasPrefix("NIO-ELT") }
            return !loops.isEmpty
        }
        #expect(started, "no event loop thread appeared")
        #expect(loops.count == 1, "\(loops)")
    }

    private static func threadNames(_ pid: Int32) -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.compactMap { task in
            (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }
}
