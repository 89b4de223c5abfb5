import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// Issue 22's holes, tried from outside as an attacker would: one nginx front end serving
/// `pay.example.test` (pinned) and `other.example.test` (not) on one certificate, over an
/// HTTP/1.1-only port and over an h2 port. Every request that could carry a second request
/// past the authority binding must arrive framed by the gate, or be refused; the other
/// name's access log stays empty, and the pinned name keeps working on the same tunnel.
@Suite("The HTTP layer frames what it forwards")
struct HTTPLayerHoldsTests {
    typealias Front = DomainFrontingTests
    static let pinned = Front.pinned
    static let other = Front.other

    /// A chunked body whose content is a whole request for the other name.
    static func smuggling(_ method: String) -> String {
        let inner = "GET / HTTP/1.1\r\nHost: \(other)\r\n\r\n"
        let size = String(inner.utf8.count, radix: 16)
        return "\(method) / HTTP/1.1\r\nHost: \(pinned)\r\nTransfer-Encoding: chunked\r\n\r\n\(size)\r\n\(inner)\r\n0\r\n\r\n"
    }

    static let plain = "GET / HTTP/1.1\r\nHost: \(pinned)\r\n\r\n"

    @Test("a chunked body on GET, HEAD, DELETE, OPTIONS carrying a request for the other name goes upstream chunked: the other name never answers, over an HTTP/1.1 and an h2 front end",
          arguments: [false, true])
    func chunkedBodyOnBodilessMethods(http2: Bool) async throws {
        try await Front.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) },
                                     http2: http2) { gate, nginx in
            let target = "\(Self.pinned):\(nginx.port)"
            let methods = ["GET", "HEAD", "DELETE", "OPTIONS"]
            var steps: [String] = []
            var perStep: [[String]] = []
            for method in methods {
                steps += [Self.smuggling(method), Self.plain]
                perStep += [[method], ["GET"]]
            }
            let results = try await Front.run(steps, methods: perStep, gate: gate, target: target)
            #expect(results.count == steps.count, "\(results)")
            for (index, result) in results.enumerated() {
                let expected = perStep[index] == ["HEAD"] ? "" : "pay\n"
                #expect(result.status == 200 && result.body == expected, "step \(index) (\(perStep[index])): \(result)")
            }
            #expect(Front.logLines(nginx, "other.log").isEmpty, "\(Front.logLines(nginx, "other.log"))")
            let framing = Front.logLines(nginx, "pay-framing.log")
            #expect(framing.count == steps.count, "\(framing)")
            if !http2 {
                // Each smuggling request arrived chunked, as the gate framed it.
                for method in methods {
                    #expect(framing.contains { $0.hasPrefix("\(method) / 200 te=[chunked]") }, "\(method): \(framing)")
                }
            }
            #expect(gate.statistics.requestsForwarded == steps.count)
        }
    }

    @Test("absolute-form targets with a scheme other than http or https get 400 malformed-request; nothing is forwarded; the tunnel goes on")
    func otherSchemes() async throws {
        try await Front.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let target = "\(Self.pinned):\(nginx.port)"
            let schemes = ["ftp", "ws", "wss", "WSS", "gopher"]
            var steps = schemes.map { "GET \($0)://\(Self.other)/ HTTP/1.1\r\nHost: \(Self.pinned)\r\n\r\n" }
            steps.append(Self.plain)
            let results = try await Front.run(steps, gate: gate, target: target)
            #expect(results.count == steps.count, "\(results)")
            for result in results.dropLast() {
                #expect(result.status == 400 && result.refusal == "malformed-request", "\(result)")
            }
            #expect(results.last == Front.Step(status: 200, body: "pay\n"))
            #expect(Front.logLines(nginx, "other.log").isEmpty)
            #expect(Front.logLines(nginx, "pay.log").count == 1)
            #expect(gate.statistics.requestsRefused(.malformedRequest) == schemes.count)
            #expect(gate.statistics.requestsForwarded == 1)
        }
    }

    @Test("Upgrade: h2c never reaches the upstream (nor HTTP2-Settings); the request is answered as an ordinary one, and so is a request pipelined behind it or behind a WebSocket upgrade answered 200")
    func h2cUpgradeDropped() async throws {
        try await Front.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let target = "\(Self.pinned):\(nginx.port)"
            let h2c = "GET /h2c HTTP/1.1\r\nHost: \(Self.pinned)\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            let webSocket = "GET /ws HTTP/1.1\r\nHost: \(Self.pinned)\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            let results = try await Front.run(
                [h2c, h2c + "GET /after-h2c HTTP/1.1\r\nHost: \(Self.pinned)\r\n\r\n",
                 webSocket + "GET /after-ws HTTP/1.1\r\nHost: \(Self.pinned)\r\n\r\n", Self.plain],
                methods: [["GET"], ["GET", "GET"], ["GET", "GET"], ["GET"]], gate: gate, target: target)
            #expect(results.count == 6, "\(results)")
            for result in results { #expect(result.status == 200 && result.body == "pay\n", "\(results)") }
            let framing = Front.logLines(nginx, "pay-framing.log")
            #expect(framing.count == 6, "\(framing)")
            for line in framing where line.contains("/h2c") {
                #expect(line.contains("upgrade=[-] settings=[-]"), "\(line)")
            }
            #expect(framing.contains { $0.hasPrefix("GET /ws 200") && $0.contains("upgrade=[websocket]") }, "\(framing)")
            #expect(framing.contains { $0.hasPrefix("GET /after-h2c 200") }, "\(framing)")
            #expect(framing.contains { $0.hasPrefix("GET /after-ws 200") }, "\(framing)")
        }
    }

    @Test("a malformed chunk after the head went upstream: the client gets 400 malformed-request and the connection closes; the upstream's half request is abandoned",
          arguments: ["FFFFFFFFFFFFFFFFFFFF\r\nx\r\n", "5x\r\nhello\r\n0\r\n\r\n", "5\nhello\n0\n\n", "5;\u{1}\r\nhello\r\n0\r\n\r\n"])
    func malformedChunk(tail: String) async throws {
        try await Front.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let target = "\(Self.pinned):\(nginx.port)"
            let request = "POST / HTTP/1.1\r\nHost: \(Self.pinned)\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n" + tail
            let results = try await Front.run([request, Self.plain], gate: gate, target: target)
            #expect(results.first?.status == 400, "\(results)")
            #expect(results.first?.refusal == "malformed-request", "\(results)")
            #expect(results.first?.connection == "close", "\(results)")
            #expect(results.count == 1 || results.last?.closed == true || results.last?.error != nil, "\(results)")
            #expect(Front.logLines(nginx, "other.log").isEmpty)
            // The origin saw the one head (nginx's `return` answers it before reading the body,
            // and logs it when the gate closes the connection), and nothing after it.
            #expect(Front.logLines(nginx, "pay.log").count <= 1, "\(Front.logLines(nginx, "pay.log"))")
            #expect(gate.statistics.requestsForwarded == 1)
            #expect(gate.statistics.requestsRefused(.malformedRequest) == 1)
        }
    }

    @Test("bytes that are not a request, pipelined after a good one (PRI * HTTP/2.0, garbage): the good one is answered first, then 400 and the close")
    func badBytesAfterGoodRequest() async throws {
        try await Front.withFrontEnd(pins: { pki, leaf in try pki.signedList([(Self.pinned, leaf.fingerprint)]) }) { gate, nginx in
            let target = "\(Self.pinned):\(nginx.port)"
            for tail in ["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "\u{0}\u{1}garbage\r\n\r\n"] {
                let results = try await Front.run([Self.plain + Self.plain + tail], methods: [["GET", "GET", "GET"]],
                                                  gate: gate, target: target)
                #expect(results.count == 3, "\(results)")
                #expect(results.prefix(2).allSatisfy { $0 == Front.Step(status: 200, body: "pay\n") }, "\(results)")
                #expect(results.last?.status == 400 && results.last?.refusal == "malformed-request", "\(results)")
            }
            #expect(Front.logLines(nginx, "pay.log").count == 4)
        }
    }
}
