import Foundation
import PinGateTestSupport
import PinGateTLS
import Testing
@testable import PinGate

/// Long-lived and large exchanges through the gate's HTTP layer (nghttp2 and NIOHTTP1 on
/// the two legs, the router between): a gRPC-style bidirectional stream must flow message
/// by message in both directions and end with its trailers, whichever version the client
/// speaks; a client that stops reading must hold an HTTP/2 upstream back instead of the
/// gate buffering the body; and a WebSocket upgrade that does not happen (refused because an
/// HTTP/2 upstream cannot carry it, or answered without 101) does not cost the client its
/// connection.
@Suite("Long streams and backpressure through the HTTP layer", .serialized)
struct HTTP2StreamingTests {
    static let host = "stream.pingate.test"
    static let client = (H2EchoOrigin.peers as NSString).appendingPathComponent("stream_client.py")

    // MARK: helpers

    /// The size of message `index` as `stream_client.py` builds it (a 5-byte gRPC prefix
    /// and a payload of 1 byte up to 64 KiB), computed here on its own so the counts the
    /// test checks do not come from the peer alone.
    static func messageSize(_ index: Int) -> Int {
        5 + (index == 0 ? 1 : (index * 7919) % 65536 + 1)
    }

    /// The bytes of `count` messages together.
    static func streamBytes(_ count: Int) -> Int {
        (0..<count).reduce(0) { $0 + messageSize($1) }
    }

    /// Runs `stream_client.py MODE` through `gate` to `host:port`, with `arguments` after
    /// the common ones.
    static func runStreamClient(_ mode: String, gate: GateFixture, port: Int, _ arguments: [String] = []) async throws
        -> TestProcess.Result {
        try await TestProcess.run("python3", [
            client, mode, "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(host):\(port)", "--cacert", gate.caPath,
        ] + arguments, timeout: 120)
    }

    /// The one JSON object a `stream_client.py` run printed (empty if it printed none).
    static func json(_ run: TestProcess.Result) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: run.stdoutData)) as? [String: Any] ?? [:]
    }

    /// Runs `stream_client.py` as `runStreamClient` does; returns the run and its JSON.
    static func streamClient(_ mode: String, gate: GateFixture, port: Int, _ arguments: [String] = []) async throws
        -> (run: TestProcess.Result, json: [String: Any]) {
        let run = try await runStreamClient(mode, gate: gate, port: port, arguments)
        return (run, json(run))
    }

    /// A fresh PKI, the Python echo origin with a leaf for `host`, and a gate pinning that
    /// leaf with `--resolve` pointing at the origin; all stopped whatever `body` does.
    static func withEchoOrigin<Value>(_ body: (GateFixture, H2EchoOrigin) async throws -> Value) async throws -> Value {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        return try await H2EchoOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]),
                                       resolve: ["\(host):\(origin.port)"]) { gate in
                try await body(gate, origin)
            }
        }
    }

    /// The origin's log line for its one stream, once it printed it (it does so right
    /// after the trailers went out, which may be a moment after the client saw them).
    static func onlyStream(_ origin: H2EchoOrigin) async -> [String: Any] {
        _ = await eventually(timeout: .seconds(10)) { !origin.streams.isEmpty }
        #expect(origin.streams.count == 1, "\(origin.streams) \(origin.errors)")
        return origin.streams.first ?? [:]
    }

    /// `count` bytes from a seeded generator: incompressible, and quick to make in a debug build.
    static func payload(_ count: Int) -> Data {
        var generator = SeededGenerator(seed: 0x5eed_0064)
        var data = Data(count: count)
        data.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for index in words.indices { words[index] = generator.next() }
        }
        return data
    }

    // MARK: 1. a gRPC-style bidirectional stream

    @Test("gRPC-style bidirectional stream, HTTP/2 on both legs: 80 messages (2.5 MB, past both of the gate's windows) each echoed before the next is sent, then trailers grpc-status 0 / grpc-message ok")
    func grpcStreamOverHTTP2() async throws {
        let chunks = 80
        let total = Self.streamBytes(chunks)
        try await Self.withEchoOrigin { gate, origin in
            let (run, json) = try await Self.streamClient("grpc-echo", gate: gate, port: origin.port, ["--chunks", "\(chunks)"])
            #expect(run.status == 0, "\(run.stdout) \(run.stderr) \(origin.errors)")
            #expect(json["error"] == nil, "\(json)")
            #expect(json["chunks_sent"] as? Int == chunks)
            #expect(json["echoes_matched"] as? Int == chunks, "first mismatch: \(json["first_mismatch"] ?? "-")")
            #expect(json["bytes_sent"] as? Int == total)
            #expect(json["bytes_echoed"] as? Int == total)
            #expect(json["status"] as? Int == 200)
            #expect((json["headers"] as? [String: String])?["content-type"] == "application/grpc")
            #expect(json["trailers"] as? [String: String] == ["grpc-status": "0", "grpc-message": "ok"])
            #expect(json["ended"] as? Bool == true)
            #expect(json["reset"] is NSNull)

            // The origin's side: the gate passed `te: trailers` on, and every byte was
            // echoed while the request was still open (it was relayed as it came, not
            // held until END_STREAM).
            let stream = await Self.onlyStream(origin)
            let headers = stream["headers"] as? [String: String] ?? [:]
            #expect(headers["te"] == "trailers")
            #expect(headers["content-type"] == "application/grpc")
            #expect(headers[":authority"] == "\(Self.host):\(origin.port)")
            #expect(stream["received"] as? Int == total)
            #expect(stream["echoed_before_end"] as? Int == total)
            #expect(stream["data_frames"] as? Int ?? 0 >= chunks)
            #expect(stream["request_ended"] as? Bool == true)
            #expect(stream["trailers_sent"] as? Bool == true)
            #expect(stream["reset"] is NSNull)

            let stats = gate.statistics
            #expect(stats.count(.trusted) == 1)
            #expect(stats.upstreamConnections == 1)
            #expect(stats.requestsForwarded == 1)
            #expect(stats.bytesUp == total)
            #expect(stats.bytesDown == total)
        }
    }

    @Test("the same stream from an HTTP/1.1 client (chunked, TE: trailers): bridged onto HTTP/2, echoed chunk by chunk, request trailer passed on, response trailers in the chunked encoding")
    func grpcStreamFromHTTP1Client() async throws {
        let chunks = 80
        let total = Self.streamBytes(chunks)
        try await Self.withEchoOrigin { gate, origin in
            let (run, json) = try await Self.streamClient("h1-echo", gate: gate, port: origin.port, ["--chunks", "\(chunks)"])
            #expect(run.status == 0, "\(run.stdout) \(run.stderr) \(origin.errors)")
            #expect(json["error"] == nil, "\(json)")
            #expect(json["chunks_sent"] as? Int == chunks)
            #expect(json["echoes_matched"] as? Int == chunks, "first mismatch: \(json["first_mismatch"] ?? "-")")
            #expect(json["bytes_sent"] as? Int == total)
            #expect(json["bytes_echoed"] as? Int == total)
            #expect(json["unexpected_tail"] as? Int == 0)
            #expect(json["status"] as? Int == 200)
            let headers = json["headers"] as? [String: String] ?? [:]
            #expect(headers["content-type"] == "application/grpc")
            #expect(headers["transfer-encoding"] == "chunked")
            #expect(json["response_chunks"] as? Int ?? 0 >= chunks)
            #expect(json["trailers"] as? [String: String] == ["grpc-status": "0", "grpc-message": "ok"])
            #expect(json["ended"] as? Bool == true)

            // The origin saw an HTTP/2 request with `te: trailers` (kept though the client
            // named TE in Connection), every byte before the end, and the request trailer.
            let stream = await Self.onlyStream(origin)
            let originHeaders = stream["headers"] as? [String: String] ?? [:]
            #expect(originHeaders["te"] == "trailers")
            #expect(originHeaders["connection"] == nil)
            #expect(originHeaders["transfer-encoding"] == nil)
            #expect(stream["received"] as? Int == total)
            #expect(stream["echoed_before_end"] as? Int == total)
            #expect(stream["request_trailers"] as? [String: String] == ["x-request-digest": json["request_digest"] as? String ?? "?"])
            #expect(stream["trailers_sent"] as? Bool == true)

            let stats = gate.statistics
            #expect(stats.upstreamConnections == 1)
            #expect(stats.requestsForwarded == 1)
            #expect(stats.bytesUp == total)
            #expect(stats.bytesDown == total)
        }
    }

    // MARK: 2. backpressure on the HTTP/2 upstream path

    /// What a stalled download through the gate amounted to.
    struct StalledDownload {
        var run: TestProcess.Result
        var json: [String: Any]
        /// The gate's `bytesDown` (body bytes it read from the upstream) once it stopped
        /// growing while the client was not reading.
        var whileStalled: Int
        var after: Int
        var accessLog: [String]
    }

    /// 64 MiB from nginx (HTTP/2) through the gate to a client speaking `alpn`, which
    /// reads 1 MiB, stops reading its socket (SO_RCVBUF 256 KiB; for h2, windows of 1 GiB
    /// so only the socket holds the gate back) until told to go on, then reads the rest.
    static func stalledDownload(alpn: String, total: Int) async throws -> (StalledDownload, String) {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        let body = payload(total)
        let digest = SHA256Digest.base64(body)
        let paused = directory.file("paused")
        let resume = directory.file("resume")
        // Whatever happens, the client is not left waiting out its own limit.
        defer { _ = FileManager.default.createFile(atPath: resume, contents: nil) }
        let outcome = try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath,
                                                 files: ["big.bin": body], http2: true) { nginx in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]),
                                       resolve: ["\(host):\(nginx.port)"]) { gate in
                // Only Sendable values go into the task: the arguments, spelled out here.
                let arguments = [
                    client, "download", "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(host):\(nginx.port)",
                    "--cacert", gate.caPath, "--alpn", alpn, "--path", "/big.bin", "--pause-after", "\(1 << 20)",
                    "--paused-file", paused, "--resume-file", resume, "--rcvbuf", "\(256 * 1024)",
                ]
                let download = Task { try await TestProcess.run("python3", arguments, timeout: 120) }
                _ = await eventually(timeout: .seconds(60), interval: .milliseconds(50)) {
                    FileManager.default.fileExists(atPath: paused)
                }
                // Let whatever bound the path has fill up: wait until the count holds still
                // for a second (a gate that buffers without bound runs on to the full 64 MiB
                // and holds still there).
                var last = -1
                var steady = 0
                _ = await eventually(timeout: .seconds(20), interval: .milliseconds(250)) {
                    let now = gate.statistics.bytesDown
                    steady = now == last ? steady + 1 : 0
                    last = now
                    return steady >= 4
                }
                let whileStalled = gate.statistics.bytesDown
                _ = FileManager.default.createFile(atPath: resume, contents: nil)
                let run = try await download.value
                _ = await eventually(timeout: .seconds(5)) { !Self.accessLog(nginx).isEmpty }
                return StalledDownload(run: run, json: Self.json(run), whileStalled: whileStalled,
                                       after: gate.statistics.bytesDown, accessLog: Self.accessLog(nginx))
            }
        }
        return (outcome, digest)
    }

    /// nginx's access-log lines (`$server_protocol $status $body_bytes_sent $request_uri $connection`).
    static func accessLog(_ nginx: NginxOrigin) -> [String] {
        DomainFrontingTests.logLines(nginx, "access.log")
    }

    /// The checks both stalled downloads share.
    static func expectHeldBack(_ download: StalledDownload, digest: String, total: Int) {
        let json = download.json
        #expect(download.run.status == 0, "\(download.run.stdout) \(download.run.stderr)")
        #expect(json["error"] == nil, "\(json)")
        #expect(json["status"] as? Int == 200)
        #expect(json["paused_at"] as? Int ?? 0 >= 1 << 20)
        #expect(json["resumed"] as? Bool == true)
        // While the client read nothing, the gate took from nginx only what its windows,
        // its buffers and the kernel's hold: megabytes at most, never the whole body.
        #expect(download.whileStalled >= 1 << 20)
        #expect(download.whileStalled < 16 << 20,
                "the gate read \(download.whileStalled) bytes from the upstream while the client was stalled")
        // Then every byte arrived, intact.
        #expect(json["body_len"] as? Int == total)
        #expect(json["sha256_b64"] as? String == digest)
        #expect(download.after == total)
        #expect(download.accessLog.count == 1)
        #expect(download.accessLog.first?.hasPrefix("HTTP/2.0 200 \(total) /big.bin ") == true, "\(download.accessLog)")
    }

    @Test("an HTTP/2 client with 1 GiB windows stops reading its socket mid-download: the gate stops reading the HTTP/2 upstream; all 64 MiB arrive intact afterwards")
    func stalledHTTP2Client() async throws {
        let total = 64 << 20
        let (download, digest) = try await Self.stalledDownload(alpn: "h2", total: total)
        Self.expectHeldBack(download, digest: digest, total: total)
    }

    @Test("an HTTP/1.1 client bridged onto an HTTP/2 upstream stops reading mid-download: the upstream is held back the same way; all 64 MiB arrive intact afterwards")
    func stalledHTTP1ClientOverHTTP2Upstream() async throws {
        let total = 64 << 20
        let (download, digest) = try await Self.stalledDownload(alpn: "http/1.1", total: total)
        Self.expectHeldBack(download, digest: digest, total: total)
        #expect((download.json["headers"] as? [String: String])?["content-length"] == "\(total)")
    }

    /// A slow HTTP/1.1 client that asked for `Connection: close`: the gate has the whole
    /// response from nginx long before the client has read it, so when the response ends
    /// and the gate closes the connection, megabytes are still queued for the client's
    /// socket. The close must wait for them: NIO's close fails whatever is still queued,
    /// and the client got a body cut short (about 400 KiB short of 4 MiB over HTTP/1.1
    /// upstreams) while the gate logged it as sent whole.
    @Test("a slow HTTP/1.1 client with Connection: close gets every byte of a 4 MiB body before the gate closes", arguments: [false, true])
    func slowClientConnectionClose(http2Upstream: Bool) async throws {
        let total = 4 << 20
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "origin")
        let body = Self.payload(total)
        let run = try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath,
                                             files: ["big.bin": body], http2: http2Upstream) { nginx in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(nginx.port)"]) { gate in
                try await TestProcess.run("python3", [
                    Self.client, "download", "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(Self.host):\(nginx.port)",
                    "--cacert", gate.caPath, "--alpn", "http/1.1", "--path", "/big.bin", "--connection-close",
                    "--rcvbuf", "\(32 * 1024)", "--read-delay", "0.002",
                    // No pause: it would come after the last byte.
                    "--pause-after", "\(total + 1)", "--paused-file", directory.file("paused"), "--resume-file", directory.file("resume"),
                ], timeout: 120)
            }
        }
        let json = Self.json(run)
        #expect(run.status == 0, "\(run.stdout) \(run.stderr)")
        #expect(json["status"] as? Int == 200)
        #expect(json["body_len"] as? Int == total, "\(json)")
        #expect(json["sha256_b64"] as? String == SHA256Digest.base64(body))
    }

    // MARK: 3. an Upgrade the HTTP/2 upstream cannot carry

    @Test("a WebSocket upgrade that the HTTP/2 upstream cannot carry (nginx: no RFC 8441) goes on a connection of the tunnel's own with ALPN http/1.1, where nginx answers it (404: no WebSocket at /chat); the tunnel's next requests go there too, on one connection")
    func upgradeOverHTTP2UpstreamGoesOnPrivateConnection() async throws {
        try await PinnedNginx.with(host: Self.host, files: ["small.txt": Data("small\n".utf8)], http2: true) { gate, nginx in
            let target = "\(Self.host):\(nginx.port)"
            let upgrade = "GET /chat HTTP/1.1\r\nHost: \(target)\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            let get = "GET /small.txt HTTP/1.1\r\nHost: \(target)\r\n\r\n"

            // The upgrade alone first: nginx answers it over HTTP/1.1 (it has no WebSocket here).
            let answered = try await DomainFrontingTests.run([upgrade], gate: gate, target: target)
            #expect(answered.count == 1, "\(answered)")
            #expect(answered.first?.status == 404, "\(answered)")
            #expect(answered.first?.refusal == nil)
            #expect(Self.accessLog(nginx).map { $0.split(separator: " ").prefix(2).joined(separator: " ") } == ["HTTP/1.1 404"],
                    "\(Self.accessLog(nginx))")
            #expect(gate.statistics.requestsRefused(.upgradeUnsupported) == 0)
            #expect(gate.statistics.requestsForwarded == 1)

            // On one client connection: the upgrade, a GET, and the same again; after the
            // first, the tunnel's upstream is its own HTTP/1.1 connection, which carries all.
            let steps = try await DomainFrontingTests.run([upgrade, get, upgrade, get], gate: gate, target: target)
            #expect(steps.count == 4, "\(steps)")
            for (index, step) in steps.enumerated() {
                if index % 2 == 0 {
                    #expect(step.status == 404, "step \(index): \(steps)")
                } else {
                    #expect(step == DomainFrontingTests.Step(status: 200, body: "small\n"), "step \(index): \(steps)")
                }
            }
            let log = Self.accessLog(nginx)
            #expect(log.count == 5, "\(log)")
            #expect(log.allSatisfy { $0.hasPrefix("HTTP/1.1 ") }, "\(log)")
            // Two private connections (one per tunnel) carried every logged request.
            #expect(Set(nginx.accessLogConnections()).count == 2)
            let stats = gate.statistics
            #expect(stats.requestsRefused(.upgradeUnsupported) == 0)
            #expect(stats.requestsForwarded == 5)
        }
    }

    @Test("a WebSocket upgrade an HTTP/1.1 upstream answers without 101 (nginx: 404): the answer passes, and the same connection then serves a GET")
    func upgradeAnsweredWithoutSwitch() async throws {
        try await PinnedNginx.with(host: Self.host, files: ["small.txt": Data("small\n".utf8)], http2: false) { gate, nginx in
            let target = "\(Self.host):\(nginx.port)"
            let upgrade = "GET /chat HTTP/1.1\r\nHost: \(target)\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            let get = "GET /small.txt HTTP/1.1\r\nHost: \(target)\r\n\r\n"
            let steps = try await DomainFrontingTests.run([upgrade, get], gate: gate, target: target)
            #expect(steps.count == 2, "\(steps)")
            #expect(steps.first?.status == 404, "\(steps)")
            #expect(steps.first?.refusal == nil)
            #expect(steps.last == DomainFrontingTests.Step(status: 200, body: "small\n"), "\(steps)")
            // nginx saw both, on the one upstream connection the tunnel was made on.
            let log = Self.accessLog(nginx)
            #expect(log.count == 2, "\(log)")
            #expect(log.first?.hasPrefix("HTTP/1.1 404 ") == true, "\(log)")
            #expect(log.last?.hasPrefix("HTTP/1.1 200 6 /small.txt ") == true, "\(log)")
            #expect(Set(nginx.accessLogConnections()).count == 1)
            let stats = gate.statistics
            #expect(stats.requestsForwarded == 2)
            #expect(stats.requestsRefused(.upgradeUnsupported) == 0)
            #expect(stats.upstreamConnections == 1)
        }
    }
}
