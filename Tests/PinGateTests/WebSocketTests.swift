import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// WebSocket through the tunnel: a real `websockets` server and client (Python), the
/// gate relaying the bytes untouched between them.
@Suite("WebSocket through the gate")
struct WebSocketTests {
    @Test("a wss:// echo server behind the gate: the upgrade, text and binary frames, and the close handshake all pass")
    func websocketEcho() async throws {
        let (result, stats, _) = try await Self.throughGate(clientPart: """
        with connect(f"ws://{host}:{port}/echo", sock=tls) as ws:
            ws.send("hello through the gate")
            text = ws.recv(timeout=10)
            payload = os.urandom(16384)  # incompressible, so permessage-deflate cannot shrink it
            ws.send(payload)
            binary = ws.recv(timeout=10)
        server.shutdown()
        print(text == "hello through the gate", binary == payload)
        """)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "True True")
        #expect(stats.count(.trusted) == 1)
        #expect(stats.bytesDown > 16_384)
    }

    @Test("an upgraded connection never goes to the upstream pool: the client leaves a WebSocket open at the origin, and the pool records it as not pooled (upgraded), holding nothing")
    func upgradedConnectionNotPooled() async throws {
        // The client drops its TCP connection without the close handshake, so the origin
        // still holds the WebSocket open when the gate decides what becomes of it.
        let (result, _, pool) = try await Self.throughGate(clientPart: """
        ws = connect(f"ws://{host}:{port}/echo", sock=tls)
        ws.send("one message")
        print(ws.recv(timeout=10) == "one message")
        raw.close()
        tls.close()
        """, poolSettled: { $0.notPooled["upgraded"] == 1 })
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "True")
        #expect(pool?.notPooled == ["upgraded": 1], "\(String(describing: pool))")
        #expect(pool?.idle == 0 && pool?.parked == 0, "\(String(describing: pool))")
    }

    /// Runs a `websockets` echo origin and, in the same Python process, a client that
    /// CONNECTs through a gate started for it and runs `clientPart` (Python, with `host`,
    /// `port`, `raw` (the TCP socket), `tls` (TLS to the gate's leaf), `server` and `connect`
    /// in scope). Returns the script's result, the gate's statistics, and its pool's status
    /// once `poolSettled` holds (or after 10 s).
    static func throughGate(clientPart: String, poolSettled: @escaping @Sendable (UpstreamPoolStatus) -> Bool = { _ in true })
        async throws -> (TestProcess.Result, GateStatistics.Snapshot, UpstreamPoolStatus?) {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "ws.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "ws")
        let portFile = directory.file("origin-port")
        let gateFile = directory.file("gate-port")
        let clientCA = directory.file("client-ca.pem") // the gate's CA, written once the gate exists
        // The server binds port 0 and reports it in a file; the test then starts the gate
        // with the matching --resolve and hands its port back the same way.
        let script = """
        import os, socket, ssl, sys, threading, time
        from websockets.sync.server import serve
        from websockets.sync.client import connect
        host, cert, key, ca, port_file, gate_file = sys.argv[1:7]

        def echo(ws):
            for message in ws:
                ws.send(message)

        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_tls.load_cert_chain(cert, key)
        server = serve(echo, "127.0.0.1", 0, ssl=server_tls)
        port = server.socket.getsockname()[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with open(port_file + ".tmp", "w") as f: f.write(str(port))
        os.rename(port_file + ".tmp", port_file)
        deadline = time.monotonic() + 30
        while not os.path.exists(gate_file) and time.monotonic() < deadline: time.sleep(0.02)
        gate_port = int(open(gate_file).read())

        raw = socket.create_connection(("127.0.0.1", gate_port), timeout=20)
        raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
        head = b""
        while b"\\r\\n\\r\\n" not in head: head += raw.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        tls = ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname=host)
        # The socket is already TLS (to the gate-minted leaf), so the URI says ws://.

        """ + clientPart
        let client = Task {
            try await TestProcess.run("python3", ["-c", script, host, leaf.certificatePath, leaf.keyPath, clientCA, portFile, gateFile], timeout: 60)
        }
        _ = await eventually(timeout: .seconds(30), interval: .milliseconds(50)) { FileManager.default.fileExists(atPath: portFile) }
        let originPort = try String(contentsOfFile: portFile, encoding: .utf8)
        return try await GateFixture.with(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]),
                                          resolve: ["\(host):\(originPort)"]) { gate in
            try FileManager.default.copyItem(atPath: gate.caPath, toPath: clientCA)
            try directory.write("gate-port.tmp", "\(gate.port)")
            try FileManager.default.moveItem(atPath: directory.file("gate-port.tmp"), toPath: gateFile)
            let result = try await client.value
            _ = await eventually(timeout: .seconds(10)) { gate.server.upstreamPool.map(poolSettled) ?? false }
            return (result, gate.statistics, gate.server.upstreamPool)
        }
    }
}
