import Foundation
import PinGateTestSupport
import PinList
import Testing
@testable import PinGate

/// One nginx front end serving two names on one port with one certificate for both (as a
/// CDN or shared load balancer does). The list pins one name. Requests inside a tunnel
/// pinned for it must not reach the other name: domain fronting is refused with 421.
@Suite("Requests inside a tunnel are bound to the pinned host")
struct DomainFrontingTests {
    static let pinned = "pay.example.test"
    static let other = "other.example.test"

    /// A Python client on one kept-alive tunnel: each step sends raw request bytes and
    /// reads one response (status, `pingate-refusal`, body), or, when the step pipelines
    /// several requests, one per method listed for it (a `HEAD` answer has no body).
    /// It prints one JSON array.
    static let client = #"""
    import json, socket, ssl, sys
    gate_port, target, ca = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    steps = json.loads(sys.argv[4])
    methods = json.loads(sys.argv[5]) if len(sys.argv) > 5 else [["GET"]] * len(steps)
    raw = socket.create_connection(("127.0.0.1", gate_port), timeout=10)
    raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head: head += raw.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["http/1.1"])
    tls = context.wrap_socket(raw, server_hostname=target.split(":")[0])
    reader = tls.makefile("rb")
    results = []
    def read_response(method):
        status_line = reader.readline()
        if not status_line:
            results.append({"closed": True}); return False
        status = int(status_line.split()[1])
        headers = {}
        while True:
            line = reader.readline()
            if line in (b"\r\n", b"\n", b""): break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b"" if method == "HEAD" else reader.read(int(headers.get("content-length", "0")))
        results.append({"status": status, "refusal": headers.get("pingate-refusal"), "body": body.decode("latin-1"),
                        "connection": headers.get("connection")})
        return headers.get("connection") != "close"
    for step, step_methods in zip(steps, methods):
        try:
            tls.sendall(step.encode("latin-1"))
            if not all(read_response(method) for method in step_methods): break
        except (OSError, ValueError, IndexError) as error:
            results.append({"error": str(error)}); break
    print(json.dumps(results))
    """#

    struct Step: Decodable, Equatable {
        var status: Int?
        var refusal: String?
        var body: String?
        var connection: String?
        var closed: Bool?
        var error: String?
    }

    /// nginx with `pay` and `other` on one port, one certificate naming both; each name
    /// logs to its own file, so a test can tell which name the gate let a request reach.
    static func withFrontEnd<Value>(
        pins: (TestPKI, TestPKI.Identity) throws -> String,
        configure: (inout GateConfiguration) -> Void = { _ in },
        http2: Bool = false,
        _ body: (GateFixture, NginxOrigin) async throws -> Value
    ) async throws -> Value {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(pinned), .dns(other)], issuer: pki.originCA, file: "front")
        let extra = """
        server {
            listen 127.0.0.1:$PORT ssl;
            server_name \(other);
            ssl_certificate \(leaf.certificatePath);
            ssl_certificate_key \(leaf.keyPath);
            access_log other.log proto;
            location / { return 200 "other\\n"; }
        }
        """
        return try await NginxOrigin.with(
            certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: [:], http2: http2,
            serverDirectives: "server_name \(pinned); access_log pay.log proto; access_log pay-framing.log framing; location / { return 200 \"pay\\n\"; }",
            extraServers: extra
        ) { nginx in
            try await GateFixture.with(pki: pki, listPath: try pins(pki, leaf),
                                       resolve: ["\(pinned):\(nginx.port)", "\(other):\(nginx.port)"],
                                       configure: configure) { gate in
                try await body(gate, nginx)
            }
        }
    }

    /// Runs `steps` on one tunnel; `methods` lists, per step, the requests it pipelines
    /// (by default one `GET` each).
    static func run(_ steps: [String], methods: [[String]]? = nil, gate: GateFixture, target: String) async throws -> [Step] {
        let encoded = String(decoding: try JSONEncoder().encode(steps), as: UTF8.self)
        let perStep = String(decoding: try JSONEncoder().encode(methods ?? steps.map { _ in ["GET"] }), as: UTF8.self)
        let result = try await TestProcess.run("python3", ["-c", client, "\(gate.port)", target, gate.caPath, encoded, perStep],
                                               timeout: 30)
        #expect(result.status == 0, "\(result.stderr)")
        return try JSONDecoder().decode([Step].self, from: result.stdoutData)
    }

    static func logLines(_ nginx: NginxOrigin, _ name: String) -> [String] {
        let text = (try? String(contentsOfFile: nginx.directory.file(name), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").map(String.init)
    }

    @Test("Host: other on a tunnel pinned for pay gets 421 authority-mismatch; pay works before and after on the same connection; nginx never sees other")
    func hostHeaderFronting() async throws {
        try await Self.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let target = "\(Self.pinned):\(nginx.port)"
            let steps = try await Self.run([
                "GET / HTTP/1.1\r\nHost: \(Self.pinned):\(nginx.port)\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: \(Self.other)\r\n\r\n",
                "GET https://\(Self.other):\(nginx.port)/ HTTP/1.1\r\nHost: \(Self.pinned)\r\n\r\n",
                "POST / HTTP/1.1\r\nHost: \(Self.other):\(nginx.port)\r\nContent-Length: 5\r\n\r\nhello",
                "GET / HTTP/1.1\r\nHost: PAY.Example.TEST.:\(nginx.port)\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: \(Self.pinned):1\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: \(Self.pinned)\r\n\r\n",
            ], gate: gate, target: target)
            #expect(steps.count == 7, "\(steps)")
            #expect(steps[0] == Step(status: 200, body: "pay\n"))
            for index in [1, 2, 3] {
                #expect(steps[index].status == 421, "step \(index): \(steps)")
                #expect(steps[index].refusal == "authority-mismatch", "step \(index)")
            }
            // Case, a trailing dot and an explicit default port are the same authority.
            #expect(steps[4] == Step(status: 200, body: "pay\n"))
            #expect(steps[5].status == 421)  // the same host on another port is another origin
            #expect(steps[6] == Step(status: 200, body: "pay\n"))

            // Not one byte of a refused request reached the front end.
            #expect(Self.logLines(nginx, "other.log").isEmpty)
            #expect(Self.logLines(nginx, "pay.log").count == 3)
            let stats = gate.statistics
            #expect(stats.count(.trusted) == 1)
            #expect(stats.requestsRefused(.authorityMismatch) == 4)
            #expect(stats.requestsForwarded == 3)
            #expect(stats.upstreamConnections == 1)
            let refused = gate.server.refusals.entries.filter { $0.reason == .authorityMismatch }
            #expect(refused.count == 4)
            #expect(refused.first?.host == Self.pinned)
            #expect(refused.first?.authority == "\(Self.other):\(nginx.port)")
        }
    }

    @Test("pipelined requests in one write: answered in order, the refused one with 421 in its place, HEAD without a body; nothing of the refused one reaches nginx")
    func pipelinedRequests() async throws {
        try await Self.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let authority = "\(Self.pinned):\(nginx.port)"
            let pipelined = [
                "GET /one HTTP/1.1\r\nHost: \(authority)\r\n\r\n",
                "HEAD /two HTTP/1.1\r\nHost: \(authority)\r\n\r\n",
                "POST /three HTTP/1.1\r\nHost: \(Self.other)\r\nContent-Length: 5\r\n\r\nhello",
                "POST /four HTTP/1.1\r\nHost: \(authority)\r\nContent-Length: 5\r\n\r\nhello",
                "GET /five HTTP/1.1\r\nHost: \(authority)\r\n\r\n",
            ].joined()
            let steps = try await Self.run(
                [pipelined, "GET /six HTTP/1.1\r\nHost: \(authority)\r\n\r\n"],
                methods: [["GET", "HEAD", "POST", "POST", "GET"], ["GET"]], gate: gate, target: authority)
            #expect(steps.count == 6, "\(steps)")
            guard steps.count == 6 else { return }
            #expect(steps[0] == Step(status: 200, body: "pay\n"))
            #expect(steps[1] == Step(status: 200, body: ""))
            #expect(steps[2].status == 421)
            #expect(steps[2].refusal == "authority-mismatch")
            #expect(steps[3] == Step(status: 200, body: "pay\n"))
            #expect(steps[4] == Step(status: 200, body: "pay\n"))
            #expect(steps[5] == Step(status: 200, body: "pay\n"))
            // nginx logs requests in the order it answered them: the order sent, less the refused one.
            let paths = Self.logLines(nginx, "pay.log").compactMap { $0.split(separator: " ").first { $0.hasPrefix("/") } }
            #expect(paths == ["/one", "/two", "/four", "/five", "/six"], "\(Self.logLines(nginx, "pay.log"))")
            #expect(Self.logLines(nginx, "other.log").isEmpty)
            #expect(gate.statistics.requestsForwarded == 5)
            #expect(gate.statistics.requestsRefused(.authorityMismatch) == 1)
            #expect(gate.statistics.upstreamConnections == 1)
        }
    }

    @Test("CONNECT inside a tunnel is refused with 405 (a tunnel in the tunnel would escape every check); the connection carries on")
    func connectInsideTunnel() async throws {
        try await Self.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let authority = "\(Self.pinned):\(nginx.port)"
            let steps = try await Self.run([
                "CONNECT \(authority) HTTP/1.1\r\nHost: \(authority)\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: \(authority)\r\n\r\n",
            ], gate: gate, target: authority)
            #expect(steps.count == 2, "\(steps)")
            #expect(steps.first?.status == 405)
            #expect(steps.first?.refusal == "method-not-allowed")
            #expect(steps.last == Step(status: 200, body: "pay\n"))
            #expect(Self.logLines(nginx, "pay.log").count == 1)
            #expect(gate.statistics.requestsRefused(.methodNotAllowed) == 1)
            #expect(gate.statistics.requestsForwarded == 1)
        }
    }

    @Test("curl -H 'Host: other' through the gate, asking for HTTP/1.1 and for HTTP/2: 421 with Pingate-Refusal; without it: 200")
    func curlFronting() async throws {
        try await Self.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) },
                                    http2: true) { gate, nginx in
            let url = "https://\(Self.pinned):\(nginx.port)/"
            // curl sends `-H Host:` as `:authority` over h2: the gate's HTTP/2 side reads it
            // and answers the stream itself. The front end speaks h2, so the gate gives a
            // client that offers h2 its h2 (and bridges curl --http1.1 onto it).
            for (version, expected) in [("--http1.1", "1.1"), ("--http2", "2")] {
                let fronted = try await curlThroughGate(gate, url, [version, "-H", "Host: \(Self.other)", "-i"])
                #expect(fronted.httpCode == "421", "\(version): \(fronted.stderr)")
                #expect(fronted.httpVersion == expected)
                #expect(String(decoding: fronted.body, as: UTF8.self).lowercased().contains("pingate-refusal: authority-mismatch"))
                let direct = try await curlThroughGate(gate, url, [version])
                #expect(direct.httpCode == "200", "\(version)")
                #expect(String(decoding: direct.body, as: UTF8.self) == "pay\n")
            }
            #expect(Self.logLines(nginx, "other.log").isEmpty)
            #expect(Self.logLines(nginx, "pay.log").count == 2)
            #expect(gate.statistics.requestsRefused(.authorityMismatch) == 2)
            // Four tunnels, each on a verified connection: its own, or one from the pool.
            #expect(gate.statistics.upstreamConnections + (gate.server.upstreamPool?.hits ?? 0) == 4)
        }
    }

    @Test("a wildcard pin that covers both names lets both through the one tunnel")
    func wildcardPinCoversBoth() async throws {
        try await Self.withFrontEnd(pins: { pki, leaf in
            // A v2 list: its host patterns take a wildcard label.
            let list = try pki.signedV2(sequence: 1, pins: [TestPKI.pin("*.example.test", leaf)])
            let path = pki.directory.file("wildcard-v2.json")
            try list.write(to: URL(fileURLWithPath: path))
            return path
        }) { gate, nginx in
            let steps = try await Self.run([
                "GET / HTTP/1.1\r\nHost: \(Self.pinned)\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: \(Self.other)\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: third.example.test\r\n\r\n",
            ], gate: gate, target: "\(Self.pinned):\(nginx.port)")
            #expect(steps.count == 3, "\(steps)")
            #expect(steps[0] == Step(status: 200, body: "pay\n"))
            #expect(steps[1] == Step(status: 200, body: "other\n"))
            // Covered by the pin pattern but not named by the certificate: refused.
            #expect(steps[2].status == 421)
            #expect(Self.logLines(nginx, "other.log").count == 1)
        }
    }

    @Test("request smuggling shapes and malformed heads: 400 malformed-request, nothing forwarded")
    func smuggling() async throws {
        try await Self.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let target = "\(Self.pinned):\(nginx.port)"
            let host = "Host: \(Self.pinned)\r\n"
            let shapes = [
                "POST / HTTP/1.1\r\n\(host)Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                "POST / HTTP/1.1\r\n\(host)Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
                "GET / HTTP/1.1\n\(host)\n",
                "GET / HTTP/1.1\r\n\(host)X-Folded: a\r\n  b\r\n\r\n",
                "GET / HTTP/1.1\r\n\r\n",
                "GET / HTTP/1.1\r\n\(host)\(host)\r\n",
            ]
            var outcomes: [Step] = []
            for shape in shapes {
                let steps = try await Self.run([shape], gate: gate, target: target)
                outcomes.append(steps.first ?? Step(closed: true))
            }
            for (index, outcome) in outcomes.enumerated() {
                #expect(outcome.status == 400, "shape \(index): \(outcome)")
                #expect(outcome.refusal == "malformed-request", "shape \(index): \(outcome)")
            }
            #expect(Self.logLines(nginx, "pay.log").isEmpty)
            #expect(gate.statistics.requestsForwarded == 0)
            #expect(gate.statistics.requestsRefused(.malformedRequest) == shapes.count)
        }
    }

    @Test("the request log: one JSON line per request with exact fields, query cut, no headers or bodies")
    func requestAuditLog() async throws {
        let logDirectory = try TemporaryDirectory()
        defer { logDirectory.remove() }
        let logPath = logDirectory.file("requests.jsonl")
        try await Self.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) },
                                    configure: { $0.requestLog = .file(logPath) }) { gate, nginx in
            let steps = try await Self.run([
                "GET /a?secret=1 HTTP/1.1\r\nHost: \(Self.pinned)\r\nAuthorization: Bearer x\r\n\r\n",
                "GET /b HTTP/1.1\r\nHost: \(Self.other)\r\n\r\n",
                "POST /c HTTP/1.1\r\nHost: \(Self.pinned)\r\nContent-Length: 5\r\n\r\nhello",
            ], gate: gate, target: "\(Self.pinned):\(nginx.port)")
            #expect(steps.map(\.status) == [200, 421, 200])
            gate.server.requestLog.flush()
            let text = try String(contentsOfFile: logPath, encoding: .utf8)
            #expect(!text.contains("secret") && !text.contains("Bearer") && !text.contains("hello"))
            let lines = try text.split(separator: "\n").map {
                try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
            }
            #expect(lines.count == 3)
            guard lines.count == 3 else { return }
            let expectedKeys: Set<String> = ["ts", "client", "connect_host", "connect_port", "authority", "method", "path", "status",
                                             "bytes_up", "bytes_down", "duration_ms", "protocol", "upstream_protocol"]
            #expect(Set(lines[0].keys) == expectedKeys)
            #expect(Set(lines[1].keys) == expectedKeys.union(["refusal"]))
            for line in lines {
                #expect(line["connect_host"] as? String == Self.pinned)
                #expect(line["connect_port"] as? Int == nginx.port)
                #expect(line["protocol"] as? String == "HTTP/1.1")
                #expect(line["upstream_protocol"] as? String == "HTTP/1.1")
                #expect((line["client"] as? String)?.hasPrefix("127.0.0.1:") == true)
            }
            #expect(lines[0]["method"] as? String == "GET")
            #expect(lines[0]["path"] as? String == "/a")
            #expect(lines[0]["authority"] as? String == Self.pinned)
            #expect(lines[0]["status"] as? Int == 200)
            #expect(lines[0]["bytes_down"] as? Int == 4)
            #expect(lines[1]["path"] as? String == "/b")
            #expect(lines[1]["status"] as? Int == 421)
            #expect(lines[1]["refusal"] as? String == "authority-mismatch")
            #expect(lines[1]["authority"] as? String == "\(Self.other):\(nginx.port)")
            #expect(lines[2]["method"] as? String == "POST")
            #expect(lines[2]["bytes_up"] as? Int == 5)
            #expect(lines[2]["status"] as? Int == 200)
        }
    }
}
