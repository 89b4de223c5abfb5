import Foundation
import PinGateTestSupport
import Testing

/// Issue 12's "measure and hold", as correctness checks (never timed): faults, descriptor
/// exhaustion and load, against `pingate run` as a child process, so that
/// `/proc/PID/fd` counts the gate's own descriptors. The origin and the clients are
/// `Tests/Peers/hold_peer.py` (asyncio: one process holds thousands of connections).
@Suite("Measure and hold (issue 12)")
struct HoldTests {
    static let peer = (H2EchoOrigin.peers as NSString).appendingPathComponent("hold_peer.py")
    static let host = "hold.pingate.test"

    /// A pinned `hold_peer.py origin` and a gate for it, for the length of `body`, which
    /// gets the gate, the origin's port and the gate's CA; `idleTimeout` seconds when given.
    static func withGateAndOrigin<Value>(
        idleTimeout: Int? = nil,
        isolation: isolated (any Actor)? = #isolation,
        _ body: (RunningGate, _ originPort: Int, _ caPath: String) async throws -> Value
    ) async throws -> Value {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        let list = try pki.signedList([(host, leaf.fingerprint)])
        let config = try directory.write("gate.yml", idleTimeout.map { "idle-timeout-seconds: \($0)\n" } ?? "{}\n")
        return try await H2EchoOrigin.with(script: "hold_peer.py", ["origin", "--cert", leaf.certificatePath, "--key", leaf.keyPath]) { origin in
            try await RunningGate.with([
                "--config", config, "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
                "--pins", list, "--pins-key", pki.signerPublicKeyPath, "--upstream-ca", pki.upstreamTrustPath,
                "--resolve", "\(host):\(origin.port):127.0.0.1", "--decision-log", "off",
                // These tests count descriptors per tunnel and their return to the baseline;
                // pooled idle connections (bounded per host, closed after their own timeout)
                // are counted by UpstreamPoolTests.
                "--no-upstream-pool",
            ]) { gate in
                try await body(gate, origin.port, directory.file("state/ca.pem"))
            }
        }
    }

    /// `hold_peer.py MODE … ARGS` against `gate`; its one JSON line.
    static func peer(_ mode: String, gate: RunningGate, originPort: Int, caPath: String, _ arguments: [String],
                     timeout: TimeInterval = 120) async throws -> [String: Any] {
        let result = try await TestProcess.run("python3", [
            peer, mode, "--gate", "\(gate.port)", "--host", host, "--port", "\(originPort)", "--ca", caPath,
            "--gate-pid", "\(gate.process.processIdentifier)",
        ] + arguments, timeout: timeout)
        let line = result.stdout.split(whereSeparator: \.isNewline).last.map(String.init) ?? ""
        guard result.status == 0, let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
            throw TestFailure("hold_peer.py \(mode) \(arguments) exited \(result.status): \(result.stdout) \(result.stderr)")
        }
        return object
    }

    /// How many descriptors process `pid` has open.
    static func descriptors(_ pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    /// The gate's descriptor count once it has stopped changing (two equal readings half
    /// a second apart): after a warm-up tunnel, so lazily opened descriptors are counted.
    static func settledDescriptors(_ pid: Int32) async -> Int {
        var last = descriptors(pid)
        for _ in 0..<40 {
            try? await Task.sleep(for: .milliseconds(500))
            let now = descriptors(pid)
            if now == last { return now }
            last = now
        }
        return last
    }

    /// Waits (up to `seconds`) for the gate's descriptors to come back to `baseline`;
    /// the count it last saw.
    static func descriptorsReturn(to baseline: Int, pid: Int32, seconds: Int = 30) async -> Int {
        _ = await eventually(timeout: .seconds(seconds), interval: .milliseconds(100)) { descriptors(pid) <= baseline }
        return descriptors(pid)
    }

    @Test("faults: upstream reset mid-body, upstream stall, client gone after CONNECT, slowloris: no descriptor left, the other tunnel's bytes exact",
          arguments: ["reset", "stall", "vanish", "slowloris"])
    func fault(scenario: String) async throws {
        // A client that leaves while its request waits on a stalled upstream half-closes
        // the tunnel; the gate answers what is in flight before closing (a client may
        // half-close after its last request), so the stalled tunnel ends by the idle
        // timeout, 5 minutes by default: 6 s here, so it ends within the test.
        try await Self.withGateAndOrigin(idleTimeout: scenario == "stall" ? 6 : nil) { gate, originPort, caPath in
            let pid = gate.process.processIdentifier
            let warmup = try await Self.peer("fault", gate: gate, originPort: originPort, caPath: caPath, ["--scenario", "warmup"])
            #expect(warmup["other_during"] as? Bool == true, "\(warmup)")
            let baseline = await Self.settledDescriptors(pid)

            let report = try await Self.peer("fault", gate: gate, originPort: originPort, caPath: caPath,
                                             ["--scenario", scenario, "--count", scenario == "slowloris" ? "20" : "8"])
            // The tunnel open beside the fault carried its downloads byte for byte.
            #expect(report["other_before"] as? Bool == true, "\(report)")
            #expect(report["other_during"] as? Bool == true, "\(report)")
            #expect(report["other_after"] as? Bool == true, "\(report)")
            let fault = report["fault"] as? [String: Any] ?? [:]
            switch scenario {
            case "reset":
                // Each cut-short response ends with the connection closed (HTTP/1.1 cannot
                // say "aborted" otherwise), never a hang, and never the announced length.
                let tunnels = fault["tunnels"] as? [[String: Any]] ?? []
                #expect(tunnels.count == 8)
                for tunnel in tunnels {
                    #expect(tunnel["closed"] as? Bool == true, "\(tunnel)")
                    #expect((tunnel["body"] as? Int ?? 0) < 2_000_000, "\(tunnel)")
                }
            case "stall":
                #expect(fault["answered"] as? Int == 0, "\(fault)")
            case "vanish":
                #expect(fault["answered_200"] as? Int == 8, "\(fault)")
            default:
                // Every trickled head is answered 408 by the head timeout, then closed.
                #expect(fault["answers"] as? [String] == ["HTTP/1.1 408 Request Timeout"], "\(fault)")
            }
            let after = await Self.descriptorsReturn(to: baseline, pid: pid)
            #expect(after <= baseline, "the gate holds \(after) descriptors, \(baseline) before the \(scenario) fault")
            #expect(gate.process.isRunning)
        }
    }

    @Test("descriptor exhaustion: 400 connections at nofile 256: no crash, 96 admitted and 304 answered 503 over-capacity, no spinning, full recovery")
    func descriptorExhaustion() async throws {
        try await Self.withGateAndOrigin { gate, originPort, caPath in
            let pid = gate.process.processIdentifier
            _ = try await Self.peer("fault", gate: gate, originPort: originPort, caPath: caPath, ["--scenario", "warmup"])
            // Lower the running gate's limit (soft and hard) to 256; only the gate's.
            let limit = try await TestProcess.run("prlimit", ["--pid", "\(pid)", "--nofile=256:256"])
            #expect(limit.status == 0, "\(limit.stderr)")
            let baseline = await Self.settledDescriptors(pid)

            let burst = try await Self.peer("load", gate: gate, originPort: originPort, caPath: caPath,
                                            ["--phase", "burst", "--count", "400"], timeout: 240)
            let outcomes = burst["outcomes"] as? [String: Int] ?? [:]
            #expect(outcomes.values.reduce(0, +) == 400, "\(burst)")
            // More clients than descriptors: the gate serves as many as its limit leaves
            // room for (two descriptors each, 64 kept free: (256 - 64) / 2 = 96) and answers
            // the rest 503 over-capacity at once; no connection is reset, none waits.
            // Admitted within the cap: 96. On a loaded machine the single-threaded test origin
            // can take longer than the gate's 10 s upstream timeouts for a few of 96 TLS
            // handshakes at once (CI saw 3 answered 502 upstream-unreachable, admitted and
            // then failed upstream): those count as admitted, not as the cap's doing.
            let served = outcomes["HTTP/1.1 200 Connection established"] ?? 0
            let upstreamFailed = outcomes["HTTP/1.1 502 Bad Gateway upstream-unreachable"] ?? 0
            #expect(served + upstreamFailed == 96, "\(burst)")
            #expect(upstreamFailed <= 8, "\(burst)")
            #expect(outcomes["HTTP/1.1 503 Service Unavailable over-capacity"] == 304, "\(burst)")
            // At most the cap's descriptors, plus the few connections accepted only to be
            // answered 503 at that moment (each exists until its answer is written: one was
            // caught in flight on a loaded CI machine); never the limit itself.
            let during = burst["gate_fds_during"] as? Int ?? 999
            #expect(during <= 256 - 64 + baseline + 8 && during < 256, "\(burst)")
            // Held at its cap, the gate is idle. Before the cap it ran out of descriptors
            // and spun a whole core (libdispatch retrying what it could not open, NIO
            // retrying accept): a ceiling on CPU used, not a measure of speed.
            let ticks = burst["gate_cpu_ticks_held_3s"] as? Int ?? Int.max
            let perSecond = burst["clock_ticks_per_second"] as? Int ?? 100
            #expect(ticks < perSecond, "the gate used \(ticks) clock ticks in 3 s held at its cap: \(burst)")
            #expect(burst["new_connect_after_ok"] as? Bool == true, "\(burst)")
            #expect(gate.process.isRunning, "the gate exited: \(gate.logText.suffix(2000))")
            let after = await Self.descriptorsReturn(to: baseline, pid: pid)
            #expect(after <= baseline, "the gate holds \(after) descriptors, \(baseline) before the burst")
            // And a plain tunnel works as before.
            let again = try await Self.peer("fault", gate: gate, originPort: originPort, caPath: caPath, ["--scenario", "warmup"])
            #expect(again["other_during"] as? Bool == true, "\(again)")
        }
    }

    /// The tunnels are opened 100 at a time (all 1,000 are then open together for their
    /// GETs): a thousand handshakes at one instant on a shared 2-core machine, with the
    /// clients and the origin in Python on the same cores, would test the 10 s handshake
    /// timeouts rather than the gate (scripts/hold measures the all-at-once case).
    @Test("load: 1,000 concurrent tunnels, each CONNECT + TLS + GET, byte-exact with 0 errors; 1,000 idle tunnels held while a new CONNECT works")
    func load() async throws {
        try await Self.withGateAndOrigin { gate, originPort, caPath in
            let pid = gate.process.processIdentifier
            // The gate and this test's clients each need more than the usual 1,024.
            let limit = try await TestProcess.run("prlimit", ["--pid", "\(pid)", "--nofile=8192:8192"])
            #expect(limit.status == 0, "\(limit.stderr)")
            _ = try await Self.peer("fault", gate: gate, originPort: originPort, caPath: caPath, ["--scenario", "warmup"])
            let baseline = await Self.settledDescriptors(pid)

            let concurrent = try await Self.peer("load", gate: gate, originPort: originPort, caPath: caPath,
                                                 ["--phase", "concurrent", "--count", "1000", "--parallel", "100"], timeout: 300)
            #expect(concurrent["errors"] as? Int == 0, "\(concurrent)")
            #expect(concurrent["exact"] as? Int == 1000, "\(concurrent)")

            let idle = try await Self.peer("load", gate: gate, originPort: originPort, caPath: caPath,
                                           ["--phase", "idle", "--count", "1000"], timeout: 300)
            #expect(idle["held"] as? Int == 1000, "\(idle)")
            #expect(idle["errors"] as? Int == 0, "\(idle)")
            #expect(idle["new_connect_ok"] as? Bool == true, "\(idle)")
            #expect(idle["held_sample_ok"] as? String == "20/20", "\(idle)")
            // Two descriptors per held tunnel (client and upstream), nothing more.
            let held = idle["gate_fds_held"] as? Int ?? 0
            #expect(held >= baseline + 2000 && held <= baseline + 2010, "\(idle), baseline \(baseline)")
            let after = await Self.descriptorsReturn(to: baseline, pid: pid)
            #expect(after <= baseline, "the gate holds \(after) descriptors, \(baseline) before the load")
        }
    }
}
