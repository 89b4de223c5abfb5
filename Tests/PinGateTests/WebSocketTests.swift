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
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "ws.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "ws")
        let port = try closedLoopbackPort()
        let gate = try await GateFixture.start(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]), resolve: ["\(host):\(port)"])
        let script = """
        import os, socket, ssl, sys, threading
        from websockets.sync.server import serve
        from websockets.sync.client import connect
        gate_port, host, port, cert, key, ca = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]

        def echo(ws):
            for message in ws:
                ws.send(message)

        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_tls.load_cert_chain(cert, key)
        server = serve(echo, "127.0.0.1", port, ssl=server_tls)
        threading.Thread(target=server.serve_forever, daemon=True).start()

        raw = socket.create_connection(("127.0.0.1", gate_port), timeout=20)
        raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
        head = b""
        while b"\\r\\n\\r\\n" not in head: head += raw.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        client_tls = ssl.create_default_context(cafile=ca)
        tls = client_tls.wrap_socket(raw, server_hostname=host)
        # The socket is already TLS (to the gate-minted leaf), so the URI says ws://.
        with connect(f"ws://{host}:{port}/echo", sock=tls) as ws:
            ws.send("hello through the gate")
            text = ws.recv(timeout=10)
            payload = os.urandom(16384) # incompressible, so permessage-deflate cannot shrink it
            ws.send(payload)
            binary = ws.recv(timeout=10)
        server.shutdown()
        print(text == "hello through the gate", binary == payload)
        """
        let result = try await TestProcess.run("python3", ["-c", script, "\(gate.port)", host, "\(port)", leaf.certificatePath, leaf.keyPath, gate.caPath], timeout: 60)
        let stats = gate.statistics
        await gate.stop()
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "True True")
        #expect(stats.count("trusted") == 1)
        #expect(stats.bytesDown > 16_384)
    }
}
