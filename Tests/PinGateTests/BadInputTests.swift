import Foundation
import NIOCore
import PinGateTestSupport
import Testing
@testable import PinGate

/// Bad input on real sockets: each gets its status and reason, and the gate keeps serving.
@Suite("Bad input on the wire")
struct BadInputTests {
    /// Sends `bytes` to the gate (optionally closing our side after) and returns everything it answered.
    static func exchange(_ port: Int, _ bytes: [UInt8], halfClose: Bool = false, wait: Double = 0) async throws -> String {
        try await timedExchange(port, bytes, halfClose: halfClose, wait: wait).answer
    }

    /// `exchange`, with the seconds from the connection's opening to the gate's close as
    /// the client itself measured them: a loaded machine's process start-up is not counted.
    static func timedExchange(_ port: Int, _ bytes: [UInt8], halfClose: Bool = false, wait: Double = 0) async throws
        -> (answer: String, seconds: Double) {
        let script = """
        import socket, sys, time
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=15)
        started = time.monotonic()
        data = sys.stdin.buffer.read()
        if data: s.sendall(data)
        time.sleep(float(sys.argv[3]))
        if sys.argv[2] == "1": s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk: break
            out += chunk
        sys.stdout.buffer.write(out)
        sys.stderr.write("%.6f" % (time.monotonic() - started))
        """
        let result = try await TestProcess.run("python3", ["-c", script, "\(port)", halfClose ? "1" : "0", "\(wait)"], stdin: Data(bytes))
        guard result.status == 0, let seconds = Double(result.stderr.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw TestFailure("client failed: \(result.stderr)")
        }
        return (result.stdout, seconds)
    }

    @Test("plain HTTP through the proxy (curl http://) gets 405 and the explanation")
    func plainHTTP() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let result = try await GateFixture.with(pki: try TestPKI(directory: directory), listPath: nil) { gate in
            try await TestProcess.run("curl", ["-sS", "-i", "--max-time", "10", "--proxy", "http://127.0.0.1:\(gate.port)", "http://plain.example.test/"])
        }
        #expect(result.stdout.hasPrefix("HTTP/1.1 405 Method Not Allowed"))
        #expect(result.stdout.contains("Pingate-Refusal: method-not-allowed"))
        #expect(result.stdout.contains("plain HTTP (GET) cannot be pinned"))
    }

    @Test("garbage, an oversized head and a silent client get 400, 431 and 408; the gate keeps serving")
    func malformedOversizedSlow() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let stats = try await GateFixture.with(pki: try TestPKI(directory: directory), listPath: nil, configure: {
            // Long enough that a loaded machine reads the 20 KB head before it, short enough to wait for.
            $0.headTimeout = .milliseconds(1500)
        }) { gate in
            let garbage = try await Self.exchange(gate.port, [0x16, 0x03, 0x01, 0x00, 0x05, 0x0d, 0x0a, 0x0d, 0x0a])
            #expect(garbage.hasPrefix("HTTP/1.1 400 Bad Request\r\n"))
            #expect(garbage.contains("Pingate-Refusal: bad-request"))

            let oversized = try await Self.exchange(gate.port, Array(("CONNECT a.test:443 HTTP/1.1\r\nX: " + String(repeating: "z", count: 20_000)).utf8))
            #expect(oversized.hasPrefix("HTTP/1.1 431 "))
            #expect(oversized.contains("Pingate-Refusal: header-too-large"))

            let slow = try await Self.exchange(gate.port, Array("CONNECT a.test:443 HTTP/1.1\r\n".utf8))
            #expect(slow.hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
            #expect(slow.contains("Pingate-Refusal: request-timeout"))

            // Still serving, and the verdicts were counted.
            let after = try await Self.exchange(gate.port, Array("CONNECT a.test:443 HTTP/1.1\r\n\r\n".utf8))
            #expect(after.hasPrefix("HTTP/1.1 403 Forbidden\r\n"))
            return gate.statistics
        }
        #expect(stats.count(.badRequest) == 1)
        #expect(stats.count(.headerTooLarge) == 1)
        #expect(stats.count(.requestTimeout) == 1)
        #expect(stats.count(.empty) == 1)
    }

    @Test("garbage instead of a ClientHello after the 200: the tunnel is dropped, counted, nothing reaches the origin")
    func garbageTLSAfterAdmission() async throws {
        let (stats, origin) = try await PinnedOriginScenario.with(behaviour: .echo) { scenario in
            let gate = scenario.gate
            let answer = try await Self.exchange(gate.port, Array("CONNECT \(scenario.target) HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n".utf8))
            #expect(answer.hasPrefix("HTTP/1.1 200 Connection established\r\n\r\n"))
            _ = await eventually { gate.statistics.clientHandshakeFailures == 1 }
            return (gate.statistics, scenario.origin)
        }
        #expect(stats.clientHandshakeFailures == 1)
        #expect(origin.observed.applicationBytes == 0)
    }

    @Test("a client that goes quiet after the 200 is cut at the client-handshake deadline: both legs closed, counted")
    func quietClientAfterAdmission() async throws {
        let (answer, elapsed, stats, observed) = try await PinnedOriginScenario.with(behaviour: .echo, configure: {
            $0.clientHandshakeTimeout = .milliseconds(500)
        }) { scenario in
            let (gate, origin) = (scenario.gate, scenario.origin)
            // CONNECT, then nothing: the client never starts its TLS handshake.
            let (answer, elapsed) = try await Self.timedExchange(gate.port, Array("CONNECT \(scenario.target) HTTP/1.1\r\n\r\n".utf8))
            _ = await eventually { origin.observed.closedConnections == 1 } // the upstream's close reaches the origin
            return (answer, elapsed, gate.statistics, origin.observed)
        }
        #expect(answer == "HTTP/1.1 200 Connection established\r\n\r\n")
        #expect(elapsed >= 0.45 && elapsed < 5, "closed after \(elapsed) s")
        #expect(stats.clientHandshakeTimeouts == 1)
        #expect(stats.openTunnels == 0)
        #expect(observed.handshakes == 1 && observed.closedConnections == 1, "the upstream leg was closed too: \(observed)")
        #expect(observed.applicationBytes == 0)
    }

    @Test("an idle tunnel is closed after the idle timeout")
    func idleTimeout() async throws {
        let script = """
        import socket, ssl, sys, time
        raw = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
        raw.sendall(f"CONNECT {sys.argv[2]} HTTP/1.1\\r\\n\\r\\n".encode())
        head = b""
        while b"\\r\\n\\r\\n" not in head: head += raw.recv(1)
        tls = ssl.create_default_context(cafile=sys.argv[3]).wrap_socket(raw, server_hostname=sys.argv[2].split(":")[0])
        tls.sendall(b"hello"); assert tls.recv(5) == b"hello"
        started = time.monotonic()
        try:
            data = tls.recv(1)
        except (ssl.SSLError, OSError):
            data = b""
        print("closed" if data == b"" else "data", round(time.monotonic() - started, 1))
        """
        let (result, stats) = try await PinnedOriginScenario.with(behaviour: .echo, alpn: nil, configure: {
            $0.idleTimeout = .milliseconds(400)
            $0.opaqueHosts = ["origin.pingate.test"]  // a raw TLS client, relayed as bytes
        }) { scenario in
            let gate = scenario.gate
            let result = try await TestProcess.run("python3", ["-c", script, "\(gate.port)", scenario.target, gate.caPath])
            return (result, gate.statistics)
        }
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.hasPrefix("closed"))
        let seconds = Double(result.stdout.split(separator: " ").last?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? -1
        #expect(seconds >= 0.2 && seconds < 5)
        #expect(stats.openTunnels == 0)
    }

    @Test("a tunnel that keeps talking is not idle: 1.5 s of echoes every 150 ms with a 400 ms idle timeout, then closed once quiet")
    func activityKeepsTunnelOpen() async throws {
        let script = """
        import socket, ssl, sys, time
        raw = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
        raw.sendall(f"CONNECT {sys.argv[2]} HTTP/1.1\\r\\n\\r\\n".encode())
        head = b""
        while b"\\r\\n\\r\\n" not in head: head += raw.recv(1)
        tls = ssl.create_default_context(cafile=sys.argv[3]).wrap_socket(raw, server_hostname=sys.argv[2].split(":")[0])
        echoed = 0
        for _ in range(10):
            tls.sendall(b"x")
            if tls.recv(1) == b"x": echoed += 1
            time.sleep(0.15)
        started = time.monotonic()
        try:
            data = tls.recv(1)
        except (ssl.SSLError, OSError):
            data = b""
        print(echoed, "closed" if data == b"" else "data", round(time.monotonic() - started, 1))
        """
        let result = try await PinnedOriginScenario.with(behaviour: .echo, alpn: nil, configure: {
            $0.idleTimeout = .milliseconds(400)
            $0.opaqueHosts = ["origin.pingate.test"]
        }) { scenario in
            try await TestProcess.run("python3", ["-c", script, "\(scenario.gate.port)", scenario.target, scenario.gate.caPath])
        }
        #expect(result.status == 0, "\(result.stderr)")
        let words = result.stdout.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        #expect(words.first == "10", "every echo came back: \(result.stdout)")
        #expect(words.dropFirst().first == "closed", "\(result.stdout)")
    }
}
