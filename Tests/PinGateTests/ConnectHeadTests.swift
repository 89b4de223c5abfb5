import Foundation
import NIOCore
import PinGateTestSupport
import Testing
@testable import PinGate

/// The proxy request head as the gate reads it: NIOHTTP1's decoder (llhttp) and
/// `ConnectHeadHandler` in an `EmbeddedChannel` (`ConnectHeadReader`), then
/// `ConnectHeadCheck`. No sockets.
@Suite("CONNECT request head")
struct ConnectHeadTests {
    static func request(_ text: String) throws -> ConnectRequest? {
        if case .request(let request, _) = try ConnectHeadReader.read(text) { return request }
        return nil
    }

    static func rejection(_ text: String, limit: Int = 16 * 1024) throws -> HeadRejection? {
        if case .rejected(let rejection) = try ConnectHeadReader.read(text, maximumHeadBytes: limit) { return rejection }
        return nil
    }

    @Test("names are normalized: lower case, trailing dot removed")
    func names() throws {
        #expect(try Self.request("CONNECT API.Example.TEST.:443 HTTP/1.1\r\nHost: x\r\n\r\n") == ConnectRequest(host: "api.example.test", port: 443, isIPLiteral: false))
        #expect(try Self.request("CONNECT a.test:443 HTTP/1.0\r\n\r\n") == ConnectRequest(host: "a.test", port: 443, isIPLiteral: false))
        // RFC 9112 §3: a recipient may split the request line on whitespace runs; llhttp does.
        #expect(try Self.request("CONNECT  a.test:443 HTTP/1.1\r\n\r\n") == ConnectRequest(host: "a.test", port: 443, isIPLiteral: false))
    }

    @Test("IPv4 and bracketed IPv6 literals")
    func literals() throws {
        #expect(try Self.request("CONNECT 127.0.0.1:8443 HTTP/1.1\r\n\r\n") == ConnectRequest(host: "127.0.0.1", port: 8443, isIPLiteral: true))
        #expect(try Self.request("CONNECT [::1]:443 HTTP/1.1\r\n\r\n") == ConnectRequest(host: "::1", port: 443, isIPLiteral: true))
        #expect(try Self.request("CONNECT [2001:DB8::1]:443 HTTP/1.1\r\n\r\n")?.host == "2001:db8::1")
        #expect(try Self.request("CONNECT [::1]:443 HTTP/1.1\r\n\r\n")?.authority == "[::1]:443")
    }

    @Test("a head split anywhere is read whole; the bytes after it are handed on as they came, in the read with the head's end and after it, and the decoder leaves")
    func incremental() throws {
        let head = Array("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n".utf8)
        let request = ConnectRequest(host: "a.test", port: 443, isIPLiteral: false)
        for split in 0...head.count {
            let reader = try ConnectHeadReader()
            let first = try reader.feed(head[..<split])
            #expect(first == (split == head.count ? .request(request, leftover: []) : .needMoreBytes), "split at \(split)")
            for byte in head[split...] { _ = try reader.feed([byte]) }
            #expect(try reader.feed([0x16, 0x03]) == .request(request, leftover: [0x16, 0x03]))
            #expect(!reader.decoding)
        }
        let together = try ConnectHeadReader()
        #expect(try together.feed(head + [0x16, 0x03, 0x01]) == .request(request, leftover: [0x16, 0x03, 0x01]))
        #expect(try together.feed([0x02]) == .request(request, leftover: [0x16, 0x03, 0x01, 0x02]))
        #expect(together.verdicts == 1)
        #expect(try ConnectHeadReader.read("CONNECT a.test:443 HTTP/1.1\r\n") == .needMoreBytes)
    }

    @Test("malformed heads get 400", arguments: [
        "CONNECT a.test HTTP/1.1\r\n\r\n",                 // no port
        "CONNECT a.test:0 HTTP/1.1\r\n\r\n",               // port 0
        "CONNECT a.test:65536 HTTP/1.1\r\n\r\n",           // port too large
        "CONNECT a.test:44x HTTP/1.1\r\n\r\n",             // port not numeric
        "CONNECT ::1:443 HTTP/1.1\r\n\r\n",                // IPv6 without brackets
        "CONNECT [::1:443 HTTP/1.1\r\n\r\n",               // unterminated bracket
        "CONNECT [nothex]:443 HTTP/1.1\r\n\r\n",           // not an IPv6 literal
        "CONNECT bad_host!.test:443 HTTP/1.1\r\n\r\n",     // invalid character
        "CONNECT a..test:443 HTTP/1.1\r\n\r\n",            // empty label
        "CONNECT -a.test:443 HTTP/1.1\r\n\r\n",            // label starts with '-'
        "CONNECT a.test:443 HTTP/2.0\r\n\r\n",             // unsupported version
        "CONNECT a.test:443 HTTP/1.2\r\n\r\n",             // unsupported version
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",                // an HTTP/2 preface in clear
        "CONNECT a.test:443\r\n\r\n",                      // missing version
        "CONNECT a.test:443 HTTP/1.1\r\nNo colon here\r\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\r\n folded: header\r\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\r\nX: a\r\n  folded\r\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\r\nBad Name: x\r\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\nHost: a\n\n",        // bare LF line ends (llhttp is strict, as inside tunnels)
        "CONNECT a.test:443 HTTP/1.1\r\nHost: a\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\r\nX: a\rb\r\n\r\n",   // a bare CR
        "CONNECT a.test:443 HTTP/1.1\r\nX: a\0b\r\n\r\n",   // a NUL
        "\u{16}\u{03}\u{01}\u{02}\u{00}\r\n\r\n",         // a TLS record sent to the proxy port
    ])
    func malformed(text: String) throws {
        let rejection = try Self.rejection(text)
        #expect(rejection?.status == 400, "\(text.debugDescription) → \(String(describing: rejection))")
        #expect(rejection?.reason == .badRequest)
        #expect(rejection?.detail.isEmpty == false)
    }

    @Test("non-ASCII bytes: refused in the method, the target and a field name; a field value's are RFC 9110's obs-text, read and unused (the gate takes nothing from a CONNECT's fields)")
    func nonASCII() throws {
        #expect(try Self.rejection("CONN\u{C9}CT a.test:443 HTTP/1.1\r\n\r\n")?.status == 400)
        #expect(try Self.rejection("CONNECT \u{E9}.test:443 HTTP/1.1\r\n\r\n")?.status == 400)
        #expect(try Self.rejection("CONNECT a.test:443 HTTP/1.1\r\nN\u{E9}: x\r\n\r\n")?.status == 400)
        let reader = try ConnectHeadReader()
        let outcome = try reader.feed(Array("CONNECT a.test:443 HTTP/1.1\r\nX: ".utf8) + [0xFF, 0xFE] + Array("\r\n\r\n".utf8))
        #expect(outcome == .request(ConnectRequest(host: "a.test", port: 443, isIPLiteral: false), leftover: []))
    }

    @Test("any other method gets 405 saying plain HTTP cannot be pinned, with the request line for the log", arguments: ["GET", "POST", "PUT", "OPTIONS"])
    func otherMethods(method: String) throws {
        let rejection = try Self.rejection("\(method) http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\n")
        #expect(rejection?.status == 405)
        #expect(rejection?.reason == .methodNotAllowed)
        #expect(rejection?.detail.contains("only HTTPS via CONNECT") == true)
        #expect(rejection?.requestLine == "\(method) http://a.test/")
    }

    @Test("after a refused head, what the client sends next (more requests, bytes that are not HTTP) is taken and dropped: one verdict, and no error reaches the handler behind (whose linger it would cut short)")
    func afterARefusedHead() throws {
        let reader = try ConnectHeadReader()
        let first = try reader.feed(Array("GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n".utf8) + Array(repeating: 0x22, count: 100))
        guard case .rejected(let rejection) = first else {
            Issue.record("a GET was not refused: \(first)")
            return
        }
        #expect(rejection.status == 405)
        _ = try reader.feed(Array("CONNECT a.test:443 HTTP/1.1\r\n\r\n".utf8))
        #expect(reader.verdicts == 1)
        let unreadable = try ConnectHeadReader()
        _ = try unreadable.feed(Array("\u{16}\u{03}\u{01}\r\n\r\nCONNECT a.test:443 HTTP/1.1\r\n\r\n".utf8))
        #expect(unreadable.verdicts == 1)
    }

    @Test("a refused upgrade request (llhttp stops reading after it): what the client sends during the linger is neither handed on nor taken for anything, however much")
    func refusedUpgrade() throws {
        let reader = try ConnectHeadReader()
        let outcome = try reader.feed(Array("GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n".utf8))
        guard case .rejected(let rejection) = outcome else {
            Issue.record("the upgrade GET was not refused: \(outcome)")
            return
        }
        #expect(rejection.status == 405)
        for _ in 0..<64 { _ = try reader.feed(repeatElement(0x41, count: 16 * 1024)) }
        #expect(reader.verdicts == 1 && reader.errorsPassedOn == 0 && reader.decoding)
        // The decoder holds at most the head and 64 KiB; past that, reads are dropped, each
        // with an objection the handler takes (1 MiB came in 16 KiB reads: about 59 of them).
        #expect(reader.objectionsAfterHead > 50, "\(reader.objectionsAfterHead)")
        #expect(try reader.feed([0x42]) == outcome)
    }

    @Test("the connection's own errors before the head pass on to the handler behind, and are no refusal; a half-close mid-head is refused 400, since the head can never end")
    func connectionErrors() throws {
        let reset = try ConnectHeadReader()
        _ = try reset.feed(Array("CONN".utf8))
        reset.connectionFailed(IOError(errnoCode: ECONNRESET, reason: "read(descriptor:pointer:size:)"))
        #expect(reset.errorsPassedOn == 1 && reset.verdicts == 0 && reset.outcome == .needMoreBytes)
        let halfClosed = try ConnectHeadReader()
        _ = try halfClosed.feed(Array("CONNECT a.test:443 HTTP/1.1\r\nHost: a".utf8))
        guard case .rejected(let rejection) = try halfClosed.inputClosed() else {
            Issue.record("a head cut short by a half-close was not refused")
            return
        }
        #expect(rejection.status == 400 && halfClosed.errorsPassedOn == 0)
    }

    @Test("a head over the limit gets 431, in one field or many, whether or not its end came")
    func oversized() throws {
        let big = "CONNECT a.test:443 HTTP/1.1\r\nX-Big: \(String(repeating: "a", count: 17 * 1024))\r\n\r\n"
        #expect(try Self.rejection(big) == HeadRejection(status: 431, reason: .headerTooLarge,
                                                          detail: "the request head exceeds 16 KiB (its target and header fields) or 256 fields"))
        let reader = try ConnectHeadReader()
        var outcome = try reader.feed(Array("CONNECT a.test:443 HTTP/1.1\r\n".utf8))
        var lines = 0
        while outcome == .needMoreBytes, lines < 100 {
            outcome = try reader.feed(Array("X-Filler: \(String(repeating: "b", count: 1000))\r\n".utf8))
            lines += 1
        }
        #expect(outcome == .rejected(HeadRejection(status: 431, reason: .headerTooLarge, detail: "the request head exceeds 16 KiB (its target and header fields) or 256 fields")))
        #expect(lines == 17)
        #expect(try Self.rejection("CONNECT a.test:443 HTTP/1.1\r\nX: \(String(repeating: "c", count: 200))\r\n\r\n", limit: 100)?.detail
                == "the request head exceeds 100 bytes (its target and header fields) or 256 fields")
    }

    @Test("at most 256 header fields: 256 empty ones are read, 257 are 431")
    func fieldCount() throws {
        let fields = { (count: Int) in "CONNECT a.test:443 HTTP/1.1\r\n" + String(repeating: "a:\r\n", count: count) + "\r\n" }
        #expect(try Self.rejection(fields(256)) == nil)
        #expect(try Self.rejection(fields(257))?.status == 431)
    }

    @Test("the limit counts the target and the fields' names and values: a head of exactly the limit is accepted, a byte more is 431")
    func atLimit() throws {
        // "a.test:443" (10) + "X" (1) + the value.
        #expect(try Self.rejection("CONNECT a.test:443 HTTP/1.1\r\nX: \(String(repeating: "c", count: 89))\r\n\r\n", limit: 100) == nil)
        #expect(try Self.rejection("CONNECT a.test:443 HTTP/1.1\r\nX: \(String(repeating: "c", count: 90))\r\n\r\n", limit: 100)?.status == 431)
    }

    @Test("refusal responses carry the status, the reason header, the fingerprint and a body")
    func refusalResponse() {
        let response = String(decoding: Refusal.verdict(.untrusted(observed: "OBS=", expected: ["EXP="])).httpResponse(host: "a.test", port: 443), as: UTF8.self)
        #expect(response.hasPrefix("HTTP/1.1 502 Bad Gateway\r\n"))
        #expect(response.contains("\r\nPingate-Refusal: pin-mismatch\r\n"))
        #expect(response.contains("\r\nPingate-Observed-Fingerprint: OBS=\r\n"))
        #expect(response.contains("matches none of its pins (EXP=)"))
        let empty = String(decoding: Refusal.verdict(.empty).httpResponse(host: "a.test", port: 443), as: UTF8.self)
        #expect(empty.hasPrefix("HTTP/1.1 403 Forbidden\r\n"))
        #expect(!empty.contains("Pingate-Observed-Fingerprint"))
        #expect(Refusal.upstreamTimeout("x").status == 504)
        #expect(Refusal.upstreamUnreachable("x").status == 502)
    }
}

/// Random and mutated heads, fed in random splits: the reading always ends in one of its
/// three outcomes, at most one verdict per connection, and never crashes.
@Suite("CONNECT request head, randomized")
struct ConnectHeadRandomizedTests {
    @Test("5 000 random and mutated inputs")
    func randomized() throws {
        var generator = SeededGenerator(seed: 0x5eed_1234)
        let valid = Array("CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\nUser-Agent: fuzz\r\n\r\n".utf8)
        var outcomes = [0, 0, 0]
        for round in 0..<5_000 {
            var input: [UInt8]
            if round % 2 == 0 {
                input = (0..<Int.random(in: 0...300, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            } else {
                input = valid
                for _ in 0..<Int.random(in: 1...6, using: &generator) {
                    let index = Int.random(in: 0..<input.count, using: &generator)
                    switch Int.random(in: 0...2, using: &generator) {
                    case 0: input[index] = UInt8.random(in: 0...255, using: &generator)
                    case 1: input.remove(at: index)
                    default: input.insert(UInt8.random(in: 0...255, using: &generator), at: index)
                    }
                    if input.isEmpty { input = [0x0A] }
                }
            }
            let reader = try ConnectHeadReader(maximumHeadBytes: 200)
            var outcome = ConnectHeadReader.Outcome.needMoreBytes
            var offset = 0
            while offset < input.count {
                let length = min(input.count - offset, Int.random(in: 1...64, using: &generator))
                outcome = try reader.feed(input[offset..<(offset + length)])
                offset += length
            }
            #expect(reader.verdicts <= 1)
            switch outcome {
            case .needMoreBytes:
                outcomes[0] += 1
                #expect(reader.decoding)
            case .request(let request, let leftover):
                outcomes[1] += 1
                #expect((1...65535).contains(request.port))
                #expect(request.host == request.host.lowercased())
                #expect(!reader.decoding)
                #expect(input.suffix(leftover.count).elementsEqual(leftover), "the bytes after the head are handed on as they came")
            case .rejected(let rejection):
                outcomes[2] += 1
                #expect([400, 405, 431].contains(rejection.status))
            }
        }
        #expect(outcomes[1] > 0 && outcomes[2] > 0, "\(outcomes)")
    }
}
