import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// After an HTTP/1.1 `Upgrade: websocket` was checked and answered `101`, the tunnel
/// relays bytes. A reader that stops, at either end, must hold the sender back through
/// the gate (its writes stop progressing) instead of the gate reading everything into
/// memory; once the reader resumes every byte arrives, in order. Raw RFC 6455 peers
/// (`Tests/Peers/ws_flow_peer.py`) so that each end reads exactly when the test says.
@Suite("WebSocket relay backpressure", .serialized)
struct WebSocketBackpressureTests {
    static let total = 48 << 20
    /// Far below `total`: what the kernel buffers on the way (loopback socket buffers
    /// autotune to a few MiB each) plus the gate's bounded share, never the whole flood.
    static let bound = 24 << 20
    /// What the sending peer may have got out, besides the gate's share: the gate's own
    /// receive buffer on the stalled leg, which the kernel autotunes up to `tcp_rmem`'s
    /// maximum (32 MiB on some machines, where the sender then got 37 MiB out while the gate
    /// itself had read under `bound`). The gate's share is checked on its own counter
    /// against `bound`; this one says at least that the flood did not all get out.
    static var senderBound: Int {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/tcp_rmem", encoding: .utf8)) ?? ""
        let maximum = text.split(whereSeparator: \.isWhitespace).last.flatMap { Int($0) } ?? (6 << 20)
        return min(bound + maximum, total)
    }
    static let peer = (H2EchoOrigin.peers as NSString).appendingPathComponent("ws_flow_peer.py")

    /// The raw WebSocket origin behind a gate pinning its leaf; both stopped whatever `body` does.
    static func withFlowOrigin<Value>(_ body: (GateFixture, H2EchoOrigin, TemporaryDirectory) async throws -> Value)
        async throws -> Value {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        return try await ExtendedConnectTests.withOrigin("ws_flow_peer.py", {
            ["server", "--cert", $0.certificatePath, "--key", $0.keyPath]
        }) { gate, origin in try await body(gate, origin, files) }
    }

    /// Runs the raw client through `gate` (in a task of its own: the test acts while it runs).
    static func client(gatePort: Int, caPath: String, port: Int, _ arguments: [String]) async throws -> TestProcess.Result {
        try await TestProcess.run("python3", [
            peer, "client", "--proxy", "127.0.0.1:\(gatePort)", "--connect", "\(ExtendedConnectTests.host):\(port)",
            "--cacert", caPath,
        ] + arguments, timeout: 120)
    }

    /// The client's JSON report, once it exited 0.
    static func report(_ run: TestProcess.Result) -> [String: Any] {
        #expect(run.status == 0, "ws client: \(run.stderr) \(run.stdout)")
        return (try? JSONSerialization.jsonObject(with: run.stdoutData)) as? [String: Any] ?? [:]
    }

    /// Polls `figure` until it stops moving for `still` (the pipeline filled up to whatever
    /// bound it has), at most `limit`; returns its last value.
    static func settled(_ figure: () -> Int, still: Duration = .milliseconds(800), limit: Duration = .seconds(20)) async -> Int {
        let deadline = ContinuousClock.now + limit
        var last = figure()
        var since = ContinuousClock.now
        while ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(100))
            let now = figure()
            if now != last {
                last = now
                since = ContinuousClock.now
            } else if ContinuousClock.now - since >= still {
                break
            }
        }
        return last
    }

    @Test("a WebSocket client that stops reading holds the origin's sends back through the gate; after it resumes, all 48 MiB arrive exact")
    func stalledClient() async throws {
        try await Self.withFlowOrigin { gate, origin, files in
            let paused = files.file("paused")
            let resume = files.file("resume")
            let (gatePort, caPath, port) = (gate.port, gate.caPath, origin.port)
            let client = Task {
                try await Self.client(gatePort: gatePort, caPath: caPath, port: port,
                                      ["--path", "/flood?bytes=\(Self.total)", "--paused", paused, "--resume", resume])
            }
            // Resume whatever happens below, so the client never waits out its own limit.
            defer { _ = FileManager.default.createFile(atPath: resume, contents: nil) }
            let pausedInTime = await eventually(timeout: .seconds(30), interval: .milliseconds(50)) {
                FileManager.default.fileExists(atPath: paused)
            }
            #expect(pausedInTime, "the client never read its first MiB: \(origin.events) \(origin.errors)")
            let sentWhileStalled = await Self.settled {
                origin.events.filter { $0["event"] as? String == "progress" }.compactMap { $0["bytes"] as? Int }.max() ?? 0
            }
            let relayedWhileStalled = gate.statistics.bytesDown
            _ = FileManager.default.createFile(atPath: resume, contents: nil)
            let report = Self.report(try await client.value)

            #expect(report["status"] as? Int == 101, "\(report)")
            #expect(report["accept_ok"] as? Bool == true)
            #expect(sentWhileStalled < Self.senderBound, "the origin got \(sentWhileStalled) bytes out while the client read 1 MiB")
            #expect(relayedWhileStalled < Self.bound, "the gate read \(relayedWhileStalled) bytes from the origin while the client read 1 MiB")
            let sent = origin.events.first { $0["event"] as? String == "sent" }
            #expect(sent?["bytes"] as? Int == Self.total, "\(origin.events.suffix(3))")
            #expect(report["bytes"] as? Int == Self.total, "\(report)")
            #expect(report["sha256"] as? String == sent?["sha256"] as? String)
            #expect(report["close_code"] as? Int == 1000)
            #expect(report["masked_from_server"] == nil)
            #expect(report["error"] == nil, "\(report)")
            #expect(gate.statistics.count(.trusted) == 1)
            #expect(gate.statistics.requestsForwarded == 1)
        }
    }

    @Test("an origin that stops reading holds the WebSocket client's sends back through the gate; after it resumes, all 48 MiB arrive exact")
    func stalledOrigin() async throws {
        try await Self.withFlowOrigin { gate, origin, files in
            let hold = files.file("hold")
            let progress = files.file("progress")
            let (gatePort, caPath, port) = (gate.port, gate.caPath, origin.port)
            let client = Task {
                try await Self.client(gatePort: gatePort, caPath: caPath, port: port,
                                      ["--path", "/sink?hold=\(hold)", "--bytes", "\(Self.total)", "--progress", progress])
            }
            defer { _ = FileManager.default.createFile(atPath: hold, contents: nil) }
            let started = await eventually(timeout: .seconds(30), interval: .milliseconds(50)) {
                FileManager.default.fileExists(atPath: progress)
            }
            #expect(started, "the client never started sending: \(origin.events) \(origin.errors)")
            let sentWhileStalled = await Self.settled {
                Int((try? String(contentsOfFile: progress, encoding: .utf8)) ?? "") ?? 0
            }
            let relayedWhileStalled = gate.statistics.bytesUp
            _ = FileManager.default.createFile(atPath: hold, contents: nil)
            let report = Self.report(try await client.value)
            _ = await eventually(timeout: .seconds(10)) { origin.events.contains { $0["event"] as? String == "received" } }

            #expect(report["status"] as? Int == 101, "\(report)")
            #expect(sentWhileStalled < Self.senderBound, "the client got \(sentWhileStalled) bytes out while the origin read nothing")
            #expect(relayedWhileStalled < Self.bound, "the gate read \(relayedWhileStalled) bytes from the client while the origin read nothing")
            let received = origin.events.first { $0["event"] as? String == "received" }
            #expect(report["bytes"] as? Int == Self.total, "\(report)")
            #expect(received?["bytes"] as? Int == Self.total, "\(origin.events.suffix(3)) \(origin.errors)")
            #expect(received?["sha256"] as? String == report["sha256"] as? String)
            #expect(received?["unmasked_frames"] as? Int == 0)
            #expect(report["close_code"] as? Int == 1000, "\(report)")
            #expect(report["error"] == nil, "\(report)")
        }
    }
}

extension WebSocketBackpressureTests {
    @Test("bytes that are not TLS on a client leg already relaying a WebSocket end the tunnel (no HTTP answer written where the codecs are gone)")
    func garbageAfterUpgrade() async throws {
        try await Self.withFlowOrigin { gate, origin, files in
            let hold = files.file("hold")
            _ = FileManager.default.createFile(atPath: hold, contents: nil)
            let report = Self.report(try await Self.client(gatePort: gate.port, caPath: gate.caPath, port: origin.port,
                                                           ["--path", "/sink?hold=\(hold)", "--garbage"]))
            #expect(report["status"] as? Int == 101, "\(report)")
            #expect(report["eof"] as? Bool == true, "\(report)")
            #expect(await eventually(timeout: .seconds(10)) { gate.statistics.openTunnels == 0 }, "\(gate.statistics)")
            // The origin's connection ended too, with no frame through.
            _ = await eventually(timeout: .seconds(10)) { origin.events.contains { $0["event"] as? String == "error" } }
            #expect(origin.events.contains { $0["event"] as? String == "error" }, "\(origin.events)")
        }
    }
}
