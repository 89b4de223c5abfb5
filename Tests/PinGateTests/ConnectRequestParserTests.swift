import PinGateTestSupport
import PropertyBased
import Testing
@testable import PinGate

/// The request-head state machine, with no sockets.
@Suite("CONNECT request parser")
struct ConnectRequestParserTests {
    static func parse(_ text: String, limit: Int = 16 * 1024) -> ConnectRequestParser.Outcome {
        var parser = ConnectRequestParser(maximumHeadBytes: limit)
        return parser.feed(Array(text.utf8))
    }

    static func request(_ text: String) -> ConnectRequest? {
        if case .request(let request, _) = parse(text) { return request }
        return nil
    }

    static func rejection(_ text: String, limit: Int = 16 * 1024) -> HeadRejection? {
        if case .rejected(let rejection) = parse(text, limit: limit) { return rejection }
        return nil
    }

    @Test("names are normalized: lower case, trailing dot removed")
    func names() {
        #expect(Self.request("CONNECT API.Example.TEST.:443 HTTP/1.1\r\nHost: x\r\n\r\n") == ConnectRequest(host: "api.example.test", port: 443, isIPLiteral: false))
    }

    @Test("IPv4 and bracketed IPv6 literals")
    func literals() {
        #expect(Self.request("CONNECT 127.0.0.1:8443 HTTP/1.1\r\n\r\n") == ConnectRequest(host: "127.0.0.1", port: 8443, isIPLiteral: true))
        #expect(Self.request("CONNECT [::1]:443 HTTP/1.1\r\n\r\n") == ConnectRequest(host: "::1", port: 443, isIPLiteral: true))
        #expect(Self.request("CONNECT [2001:DB8::1]:443 HTTP/1.1\r\n\r\n")?.host == "2001:db8::1")
        #expect(Self.request("CONNECT [::1]:443 HTTP/1.1\r\n\r\n")?.authority == "[::1]:443")
    }

    @Test("bytes split anywhere, bare LF endings, and bytes after the head are kept")
    func incremental() {
        var parser = ConnectRequestParser()
        let text = Array("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n\u{16}\u{03}\u{01}".utf8)
        var outcome = ConnectRequestParser.Outcome.needMoreBytes
        for byte in text {
            outcome = parser.feed([byte])
            if outcome != .needMoreBytes { break }
        }
        // The head completes on its last byte; the TLS bytes arrive later and are not lost
        // because the real handler feeds whole reads. Here: feed the rest in one read.
        #expect(outcome == .request(ConnectRequest(host: "a.test", port: 443, isIPLiteral: false), leftover: []))
        #expect(Self.parse("CONNECT a.test:443 HTTP/1.1\nHost: a\n\nXYZ") == .request(ConnectRequest(host: "a.test", port: 443, isIPLiteral: false), leftover: Array("XYZ".utf8)))
        #expect(Self.parse("CONNECT a.test:443 HTTP/1.1\r\n") == .needMoreBytes)
    }

    @Test("malformed requests get 400", arguments: [
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
        "CONNECT  a.test:443 HTTP/1.1\r\n\r\n",            // double space
        "CONNECT a.test:443\r\n\r\n",                      // missing version
        "CONNECT a.test:443 HTTP/1.1\r\nNo colon here\r\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\r\n folded: header\r\n\r\n",
        "\u{16}\u{03}\u{01}\u{02}\u{00}\r\n\r\n",         // a TLS record sent to the proxy port
    ])
    func malformed(text: String) {
        let rejection = Self.rejection(text)
        #expect(rejection?.status == 400, "\(text.debugDescription) → \(String(describing: rejection))")
        #expect(rejection?.reason == .badRequest)
    }

    @Test("invalid UTF-8 is malformed")
    func invalidUTF8() {
        var parser = ConnectRequestParser()
        let outcome = parser.feed(Array("CONNECT a.test:443 HTTP/1.1\r\nX: ".utf8) + [0xFF, 0xFE] + Array("\r\n\r\n".utf8))
        guard case .rejected(let rejection) = outcome else {
            Issue.record("accepted invalid UTF-8")
            return
        }
        #expect(rejection.status == 400)
    }

    @Test("any other method gets 405 saying plain HTTP cannot be pinned", arguments: ["GET", "POST", "PUT", "OPTIONS"])
    func otherMethods(method: String) {
        let rejection = Self.rejection("\(method) http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(rejection?.status == 405)
        #expect(rejection?.reason == .methodNotAllowed)
        #expect(rejection?.detail.contains("only HTTPS via CONNECT") == true)
    }

    @Test("a head over the limit gets 431, with or without its blank line")
    func oversized() {
        let big = "CONNECT a.test:443 HTTP/1.1\r\nX-Big: \(String(repeating: "a", count: 17 * 1024))\r\n\r\n"
        #expect(Self.rejection(big)?.status == 431)
        var parser = ConnectRequestParser()
        var outcome = parser.feed(Array("CONNECT a.test:443 HTTP/1.1\r\n".utf8))
        while outcome == .needMoreBytes {
            outcome = parser.feed(Array("X-Filler: \(String(repeating: "b", count: 1000))\r\n".utf8))
        }
        #expect(outcome == .rejected(HeadRejection(status: 431, reason: .headerTooLarge, detail: "the request head exceeds 16 KiB")))
    }

    @Test("a head of exactly the limit is accepted")
    func atLimit() {
        let prefix = "CONNECT a.test:443 HTTP/1.1\r\nX: "
        let filler = String(repeating: "c", count: 100 - prefix.utf8.count - 4)
        #expect(Self.rejection(prefix + filler + "\r\n\r\n", limit: 100) == nil)
        #expect(Self.rejection(prefix + filler + "c\r\n\r\n", limit: 100)?.status == 431)
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

/// The head's checks over bytes, held to the `Character` version they replaced.
@Suite("CONNECT request parser, against its reference")
struct ConnectRequestParserReferenceTests {
    /// `parseHead` as written before it read bytes, kept as the reference.
    static func referenceParseHead(_ head: ArraySlice<UInt8>) -> Result<ConnectRequest, HeadRejection> {
        func isTokenCharacter(_ character: Character) -> Bool {
            guard let ascii = character.asciiValue else { return false }
            if (ascii >= 0x30 && ascii <= 0x39) || (ascii >= 0x41 && ascii <= 0x5A) || (ascii >= 0x61 && ascii <= 0x7A) { return true }
            return "!#$%&'*+-.^_`|~".utf8.contains(ascii)
        }
        func bad(_ detail: String) -> HeadRejection { HeadRejection(status: 400, reason: .badRequest, detail: detail) }
        var lines: [Substring] = []
        for rawLine in head.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            let line = rawLine.last == UInt8(ascii: "\r") ? rawLine.dropLast() : rawLine
            guard let text = String(validating: line, as: UTF8.self) else { return .failure(bad("the request head is not valid UTF-8")) }
            lines.append(Substring(text))
        }
        guard !lines.isEmpty else { return .failure(bad("empty request")) }
        let requestLine = lines.removeFirst()
        let parts = requestLine.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, parts[0].allSatisfy(isTokenCharacter) else {
            return .failure(bad("the request line must be `METHOD TARGET HTTP/1.1`"))
        }
        guard parts[2] == "HTTP/1.1" || parts[2] == "HTTP/1.0" else { return .failure(bad("unsupported protocol version \(parts[2])")) }
        for line in lines where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":"), colon != line.startIndex, line[..<colon].allSatisfy(isTokenCharacter)
            else { return .failure(bad("malformed header line")) }
        }
        let shownLine = HeadRejection.shown(method: parts[0], target: parts[1])
        guard parts[0] == "CONNECT" else {
            return .failure(HeadRejection(
                status: 405, reason: .methodNotAllowed,
                detail: "pingate forwards only HTTPS via CONNECT; plain HTTP (\(parts[0])) cannot be pinned, so it is refused",
                requestLine: shownLine))
        }
        return ConnectRequestParser.parseAuthority(parts[1]).mapError {
            HeadRejection(status: $0.status, reason: $0.reason, detail: $0.detail, requestLine: shownLine)
        }
    }

    @Test("ASCII heads: the same outcome, refusal text and shown request line included, as the Character version (random heads built from methods, targets, versions, separators, header lines and line ends, valid and not)")
    func asciiHeadsMatch() async {
        let methods = ["CONNECT", "GET", "G?T", "", "connect", "CONNECT:"]
        let targets = ["a.test:443", "[::1]:8443", "a.test", "", "A.Test.:443", "http://a.test/", "a.test:0", "a.test:+443", "1.2.3:443"]
        let versions = ["HTTP/1.1", "HTTP/1.0", "HTTP/2", "http/1.1", "HTTP/1.1 ", "", "HTTP/1.1\r"]
        let separators = [" ", " ", " ", "  ", "\t"]
        let fields = ["Host: x", "X-Y:", ": x", "b(c: d", " folded: x", "", "NoColon", "Host:\u{0}", "Proxy-Authorization: Basic eA=="]
        let ends = ["\r\n", "\n", "\r\n", "\r"]
        await propertyCheck(count: 4000, input: Gen.int(in: 0...999).array(of: 12...12)) { picks in
            var text = methods[picks[0] % methods.count] + separators[picks[1] % separators.count] + targets[picks[2] % targets.count]
                + separators[picks[3] % separators.count] + versions[picks[4] % versions.count]
            for index in 0..<(picks[5] % 4) {
                text += ends[picks[6 + index] % ends.count] + fields[picks[9 + min(index, 2)] % fields.count]
            }
            let head = ArraySlice(Array(text.utf8))
            #expect(ConnectRequestParser.parseHead(head) == Self.referenceParseHead(head), "\(text.debugDescription)")
        }
    }

    @Test("any bytes: what the reference accepts is accepted the same; what is refused for invalid UTF-8 is refused for it; a header value's non-ASCII bytes are RFC 9110's obs-text, so a colon followed by a combining mark still ends a header name")
    func anyBytes() async {
        let byte = Gen.element(of: Array("CONNECT a.test:443 HTTP/1.1\r\nHost: x\r\n".utf8) + [0x3A, 0xCC, 0x81, 0xC3, 0xA9, 0xFF, 0x80, 0x20]).compactMap { $0 }
        await propertyCheck(count: 3000, input: byte.array(of: 0...60)) { bytes in
            let head = ArraySlice(bytes)
            let reference = Self.referenceParseHead(head)
            let parsed = ConnectRequestParser.parseHead(head)
            if case .success = reference { #expect(parsed == reference, "\(bytes)") }
            if case .failure(let refusal) = reference, refusal.detail.contains("UTF-8") { #expect(parsed == reference, "\(bytes)") }
        }
        let combining = ArraySlice(Array("CONNECT a.test:443 HTTP/1.1\r\nX-Mark:\u{301}value\r\n".utf8))
        #expect(ConnectRequestParser.parseHead(combining) == .success(ConnectRequest(host: "a.test", port: 443, isIPLiteral: false)))
    }
}

/// Random and mutated heads, fed in random splits: the parser always ends in one of its
/// three outcomes, never accepts a head over the limit, and never crashes.
@Suite("CONNECT request parser, randomized")
struct ConnectRequestParserFuzzTests {
    @Test("10 000 random and mutated inputs")
    func randomized() {
        var generator = SeededGenerator(seed: 0x5eed_1234)
        let valid = Array("CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\nUser-Agent: fuzz\r\n\r\n".utf8)
        var outcomes = [0, 0, 0]
        for round in 0..<10_000 {
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
            var parser = ConnectRequestParser(maximumHeadBytes: 200)
            var outcome = ConnectRequestParser.Outcome.needMoreBytes
            var offset = 0
            while offset < input.count, outcome == .needMoreBytes {
                let length = min(input.count - offset, Int.random(in: 1...64, using: &generator))
                outcome = parser.feed(input[offset..<(offset + length)])
                offset += length
            }
            switch outcome {
            case .needMoreBytes:
                outcomes[0] += 1
                #expect(input.count <= 200)
            case .request(let request, _):
                outcomes[1] += 1
                #expect((1...65535).contains(request.port))
                #expect(request.host == request.host.lowercased())
            case .rejected(let rejection):
                outcomes[2] += 1
                #expect([400, 405, 431].contains(rejection.status))
            }
        }
        #expect(outcomes[1] > 0 && outcomes[2] > 0, "\(outcomes)")
    }
}
