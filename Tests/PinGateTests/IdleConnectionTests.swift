import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// A request that cannot be repeated never goes on a connection its origin may be closing
/// (issue 31, defect 5: a POST on a pooled connection that had idled as long as its origin
/// keeps one failed with a 502, and a POST is not re-sent). From outside: curl through the
/// gate to a real nginx, whose access log names the connection each request came on.
@Suite("Idle upstream connections and requests that cannot be repeated")
struct IdleConnectionTests {
    static let post = "location = /post { return 200 \"posted\\n\"; }"

    static func postThroughGate(_ gate: GateFixture, _ nginx: NginxOrigin) async throws {
        let result = try await curlThroughGate(gate, "https://\(UpstreamPoolTests.host):\(nginx.port)/post", ["-d", "order=1"])
        #expect(result.exitStatus == 0 && result.httpCode == "200" && result.body == Data("posted\n".utf8),
                "\(result.httpCode) \(result.stderr)")
    }

    @Test("a POST on a pooled HTTP/1.1 connection idle past the default estimate (1 s) goes on a new connection; nothing is refused and nothing is sent twice")
    func postAfterIdleGoesOnANewConnection() async throws {
        try await UpstreamPoolTests.withOrigin(http2: false, serverDirectives: "keepalive_timeout 60s; \(Self.post)",
                                               configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await UpstreamPoolTests.fetch(gate, nginx)
            await UpstreamPoolTests.waitForIdle(gate, 1)
            try await Task.sleep(for: .milliseconds(1_600))
            // Idle past the estimate: the tunnel takes the pooled connection, and the POST goes
            // on a new one. (Only longer under load: the test does not depend on speed.)
            try await Self.postThroughGate(gate, nginx)
            #expect(gate.statistics.upstreamConnectionsLeftIdle == 1)
            let log = try String(contentsOfFile: nginx.directory.file("access.log"), encoding: .utf8)
            #expect(log.split(separator: "\n").count == 2, "each request once: \(log)")
            let connections = nginx.accessLogConnections()
            #expect(connections.count == 2 && connections[0] != connections[1], "the late POST on a new connection: \(log)")
            #expect(gate.statistics.requestsRefusedByReason.isEmpty, "\(gate.statistics.requestsRefusedByReason)")
            // The idle one went back to the pool, for what may be repeated: a GET takes one.
            #expect(await UpstreamPoolTests.waitForIdle(gate, 2))
        }
    }

    @Test("the pool learns an origin's keep-alive timeout from its idle closes: behind nginx's keepalive_timeout 10s, a POST on a connection idle about 1.2 s stays on it (half the learned 10 s), where the default 1 s would have dialled")
    func learnsTheOriginsKeepAlive() async throws {
        try await UpstreamPoolTests.withOrigin(http2: false, serverDirectives: "keepalive_timeout 10s; \(Self.post)",
                                               configure: { $0.eventLoopThreads = 1 }) { gate, nginx, _ in
            try await UpstreamPoolTests.fetch(gate, nginx)
            await UpstreamPoolTests.waitForIdle(gate, 1)
            // nginx closes it after 10 s; the pool sees the close and learns.
            #expect(await UpstreamPoolTests.waitForIdle(gate, 0, timeout: .seconds(16)), "nginx did not close the idle connection")
            let learned = gate.server.keepAlive.estimate(matching: { $0.host == UpstreamPoolTests.host && $0.port == nginx.port })
            #expect(learned.map { $0.safeIdle >= .milliseconds(4_800) && $0.safeIdle <= .milliseconds(5_600) } == true,
                    "\(String(describing: learned))")
            let getStarted = Date()
            try await UpstreamPoolTests.fetch(gate, nginx)
            await UpstreamPoolTests.waitForIdle(gate, 1)
            try await Task.sleep(for: .milliseconds(1_200))
            // Idle more than the default 1 s, well under the learned 5 s.
            try await Self.postThroughGate(gate, nginx)
            let connections = nginx.accessLogConnections()
            if gate.statistics.upstreamConnectionsLeftIdle == 0 {
                #expect(connections.count == 3 && connections[1] == connections[2], "\(connections)")
            } else {
                // Only a machine so busy that the connection really idled past the learned 5 s
                // may dial (its idle is at most the time since the GET began): under the
                // default 1 s limit it would have dialled within about 1.5 s.
                let elapsed = Date().timeIntervalSince(getStarted)
                #expect(elapsed > 4.8, "dialled after \(elapsed) s of idle at most: the learned limit was not the one used")
            }
        }
    }
}
