import Foundation
import PinGateTestSupport
import PinGateTLS
import Testing
@testable import PinGate

/// An upstream that closes its connection right after a response, while part of that
/// response still waits in the gate for an HTTP/2 client's flow-control window: an
/// HTTP/1.1 body delimited by the close, or an `h2` origin that says GOAWAY after one
/// request. The gate used to close the client's connection as soon as the upstream's
/// went, so the client got its window's worth (65,535 bytes for Python `h2`) and a stream
/// that never ended. Now the client's connection stays up until every response already
/// passed on has gone out, and only then says GOAWAY and closes.
@Suite("An upstream that closes right after a response larger than the client's window, or refuses a stream")
struct UpstreamCloseDrainTests {
    static let host = "drain.pingate.test"
    static let bodySize = 300_000

    /// `h2_client.py get-paths` through `gate` to `host:port`; its JSON report.
    static func fetch(_ gate: GateFixture, port: Int, paths: [String]) async throws -> [String: Any] {
        let run = try await TestProcess.run("python3", [
            HTTP2InsideTunnelTests.peer, "--proxy", "127.0.0.1:\(gate.port)", "--connect", "\(host):\(port)",
            "--cacert", gate.caPath, "--scenario", "get-paths", "--paths", paths.joined(separator: ","), "--timeout", "15",
        ], timeout: 60)
        #expect(run.status == 0, "\(run.stderr)")
        return try #require(try JSONSerialization.jsonObject(with: run.stdoutData) as? [String: Any], "\(run.stdout)")
    }

    static func hex(_ bytes: [UInt8]) -> String {
        SHA256Digest.hash(bytes).map { String(format: "%02x", $0) }.joined()
    }

    @Test("HTTP/1.1 origin, body delimited by its close: an h2-only client gets all of it, and the request queued behind it goes on a new connection; the client's connection stays")
    func closeDelimitedBody() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "drain")
        try await H2EchoOrigin.with(script: "held_answer_origin.py", ["--cert", leaf.certificatePath, "--key", leaf.keyPath]) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(origin.port)"]) { gate in
                let output = try await Self.fetch(gate, port: origin.port, paths: ["/close-delimited/\(Self.bodySize)", "/next"])
                let body = HTTP2InsideTunnelTests.stream(output, "1")
                #expect(body["status"] as? Int == 200, "\(output)")
                #expect(body["body_len"] as? Int == Self.bodySize, "\(output)")
                #expect(body["body_sha256"] as? String == Self.hex(Array("0123456789abcdef".utf8.cycled(Self.bodySize))))
                #expect(body["ended"] as? Bool == true)
                // Queued behind it on the one HTTP/1.1 connection, which closed before it was
                // sent: it goes on the tunnel's next connection (it was never sent, so this
                // sends it once), and the client's connection stays (issue 31).
                let next = HTTP2InsideTunnelTests.stream(output, "3")
                #expect(next["status"] as? Int == 200, "\(output)")
                #expect(next["body_text"] as? String == "/next\n", "\(output)")
                #expect(gate.statistics.requestsRefused(.upstreamUnreachable) == 0)
                #expect(output["goaway"] == nil || output["goaway"] is NSNull, "\(output)")
                #expect(output["closed"] as? Bool == false, "\(output)")
                let requests = origin.events.filter { $0["event"] as? String == "request" }
                #expect(requests.compactMap { $0["path"] as? String } == ["/close-delimited/\(Self.bodySize)", "/next"])
                #expect(requests.compactMap { $0["connection"] as? Int } == [1, 2], "\(requests)")
            }
        }
    }

    @Test("h2 origin that says GOAWAY after one request (nginx keepalive_requests 1): an h2 client gets all of the body")
    func goAwayAfterOneRequest() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "drain")
        let payload = (0..<Self.bodySize).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: ["big.bin": Data(payload)],
                                   http2: true, serverDirectives: "keepalive_requests 1;") { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(origin.port)"]) { gate in
                let output = try await Self.fetch(gate, port: origin.port, paths: ["/big.bin"])
                let body = HTTP2InsideTunnelTests.stream(output, "1")
                #expect(body["status"] as? Int == 200, "\(output)")
                #expect(body["body_len"] as? Int == Self.bodySize, "\(output)")
                #expect(body["body_sha256"] as? String == Self.hex(payload))
                #expect(body["ended"] as? Bool == true)
                // The client's connection outlives the upstream's (issue 31): no GOAWAY, no close.
                #expect(output["closed"] as? Bool == false, "\(output)")
                #expect(output["goaway"] == nil || output["goaway"] is NSNull, "\(output)")
                #expect(gate.statistics.requestsForwarded == 1)
            }
        }
    }

    @Test("h2 origin that ends its connection with GOAWAY every 2 requests (nginx keepalive_requests 2): an HTTP/1.1 client's 7 requests on one kept-alive tunnel are all answered 200, each once, with the pool on and off",
          arguments: [true, false])
    func goAwayEveryTwoRequests(pool: Bool) async throws {
        try await UpstreamPoolTests.withOrigin(http2: true, serverDirectives: "keepalive_requests 2;",
                                               configure: { $0.upstreamPoolEnabled = pool }) { gate, nginx, _ in
            let urls = (1...7).map { "https://\(UpstreamPoolTests.host):\(nginx.port)/a.txt?n=\($0)" }
            let result = try await curlThroughGate(gate, urls: urls, ["--http1.1"])
            #expect(result.exitStatus == 0, "\(result.stderr)")
            #expect(result.transfers == Array(repeating: "200 1.1", count: 7), "\(result.transfers)")
            #expect(result.body == Array(repeating: UpstreamPoolTests.body, count: 7).reduce(Data(), +))
            #expect(result.stderr.components(separatedBy: "> CONNECT ").count - 1 == 1, "one tunnel")
            #expect(gate.statistics.requestsForwarded == 7)
            #expect(gate.statistics.requestsRefused(.upstreamUnreachable) == 0)
            // Each request reached the origin once, over at least 4 connections (2 each).
            #expect(nginx.accessLogProtocols().count == 7, "\(nginx.accessLogConnections())")
            #expect(Set(nginx.accessLogConnections()).count >= 4, "\(nginx.accessLogConnections())")
        }
    }

    @Test("h2 origin whose GOAWAY crosses a request (it serves one request per connection, then GOAWAYs the next unprocessed and closes): an HTTP/1.1 client's requests on one kept-alive tunnel are each carried to a new connection and answered by the origin, none twice, with the pool on and off",
          arguments: [true, false])
    func goAwayCrossesRequest(pool: Bool) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "goaway")
        try await H2EchoOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath,
                                    extraArguments: ["--goaway-unprocessed-after", "1"]) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(origin.port)"], configure: { $0.upstreamPoolEnabled = pool }) { gate in
                let urls = Array(repeating: "https://\(Self.host):\(origin.port)/echo", count: 3)
                let result = try await curlThroughGate(gate, urls: urls, ["--http1.1"])
                #expect(result.exitStatus == 0, "\(result.stderr)")
                // The echo origin's own answer to a GET (it echoes POSTs), never the gate's 502.
                #expect(result.transfers == ["400 1.1", "400 1.1", "400 1.1"], "\(result.transfers)")
                #expect(result.stderr.components(separatedBy: "> CONNECT ").count - 1 == 1, "one tunnel")
                let served = origin.events.filter { $0["event"] as? String == "stream" && $0["status"] as? Int == 400 }
                #expect(served.count == 3, "each served once: \(origin.events)")
                #expect(origin.events.filter { $0["event"] as? String == "goaway-unprocessed" }.count == 2, "\(origin.events)")
                #expect(gate.statistics.requestsForwarded == 3)
                #expect(gate.statistics.requestsRefused(.upstreamUnreachable) == 0)
            }
        }
    }

    @Test("h2 origin that refuses every stream (REFUSED_STREAM): an h2 client hears REFUSED_STREAM, which it may retry; an HTTP/1.1 client's request is sent once more on a new connection, and refused again, gets 502 upstream-unreachable")
    func refusedStream() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "refusing")
        try await H2EchoOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath,
                                    extraArguments: ["--refuse-streams"]) { origin in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(Self.host, leaf.fingerprint)]),
                                       resolve: ["\(Self.host):\(origin.port)"]) { gate in
                let output = try await Self.fetch(gate, port: origin.port, paths: ["/one"])
                let stream = HTTP2InsideTunnelTests.stream(output, "1")
                #expect(stream["reset"] as? Int == 7, "\(output)")
                #expect(stream["status"] is NSNull, "\(output)")
                #expect(output["goaway"] is NSNull, "\(output)")
                let h1 = try await curlThroughGate(gate, "https://\(Self.host):\(origin.port)/two", ["--http1.1", "-i"])
                #expect(h1.httpCode == "502", "\(h1.stderr)")
                #expect(String(decoding: h1.body, as: UTF8.self).lowercased().contains("pingate-refusal: upstream-unreachable"))
                #expect(String(decoding: h1.body, as: UTF8.self).contains("the upstream did not process the request"))
                // The h2 client's stream once; the HTTP/1.1 client's request twice (carried once).
                #expect(origin.events.filter { $0["event"] as? String == "refused" }.count == 3)
                #expect(gate.statistics.requestsRefused(.upstreamUnreachable) == 2)
                #expect(gate.statistics.requestsForwarded == 2)
            }
        }
    }
}

private extension Collection where Element == UInt8 {
    /// The bytes repeated and cut to `count`.
    func cycled(_ count: Int) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(count)
        while out.count < count { out.append(contentsOf: self.prefix(count - out.count)) }
        return out
    }
}
