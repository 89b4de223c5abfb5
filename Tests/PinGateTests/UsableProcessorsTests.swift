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
        // This process's own mask: at least one CPU (some kernels list possible CPUs beyond
        // those present, which `count` bounds with the cgroup's view).
        #expect((UsableProcessors.affinityCount ?? 0) >= 1)
        #expect(UsableProcessors.count >= 1 && UsableProcessors.count <= ProcessInfo.processInfo.processorCount)
    }

    @Test("a gate started under taskset on one CPU runs one event loop (NIO's core count reads the cgroup, not the affinity mask)")
    func pinnedGateRunsOneLoop() async throws {
        let taskset = try TestProcess.resolve("taskset")
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let gate = ChildProcess()
        gate.executableURL = URL(fileURLWithPath: taskset)
        gate.arguments = ["-c", "0", TestProcess.pingateExecutable, "run", "--listen", "127.0.0.1:0", "--admin-listen", "off",
                          "--state-dir", directory.file("state"), "--log-level", "info"]
        let output = Pipe()
        gate.standardError = output
        gate.standardOutput = output
        try gate.run()
        defer { if gate.isRunning { gate.terminate() } }
        // taskset execs the gate: the PID is the gate's. Its loops are all up before it
        // listens, and it says so on stderr.
        let said = OutputCollector()
        let drain = PipeDrain(output.fileHandleForReading) { said.appendErr($0) }
        #expect(await eventually(timeout: .seconds(20)) { said.errText.contains("pingate listening") }, "\(said.errText)")
        let loops = Self.threadNames(gate.processIdentifier).filter { $0.hasPrefix("NIO-ELT") }
        #expect(loops.count == 1, "\(loops)")
        await gate.terminateAndWait()
        _ = await drain.finished(within: .seconds(5))
    }

    private static func threadNames(_ pid: Int32) -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.compactMap { task in
            (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }
}
