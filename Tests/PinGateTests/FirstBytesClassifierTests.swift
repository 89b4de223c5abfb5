import NIOCore
import Testing
@testable import PinGate
@testable import PinGateHTTP

/// The decision on a client's first bytes inside a tunnel, on bytes alone (no sockets).
@Suite("What a client's first bytes say it speaks")
struct FirstBytesClassifierTests {
    static func classify(_ text: String) -> FirstBytesClassifier.Verdict {
        FirstBytesClassifier.classify(ByteBuffer(string: text).readableBytesView)
    }

    @Test("request lines are HTTP/1 as soon as the method's space arrives; empty lines before them are skipped")
    func requestLines() {
        #expect(Self.classify("GET / HTTP/1.1\r\n") == .http1)
        #expect(Self.classify("M-SEARCH ") == .http1)
        #expect(Self.classify("\r\n\r\nPOST /x HTTP/1.1") == .http1)
        #expect(Self.classify("GE") == .undecided)
        #expect(Self.classify("\r\n") == .undecided)
        #expect(Self.classify("") == .undecided)
    }

    @Test("the HTTP/2 preface is HTTP/2 only once whole; a request line starting PRI is HTTP/1")
    func preface() {
        #expect(Self.classify("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") == .http2)
        #expect(Self.classify("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\u{0}\u{0}") == .http2)
        #expect(Self.classify("PRI * HTTP/2.0\r\n") == .undecided)
        #expect(Self.classify("PRI /x HTTP/1.1\r\n") == .http1)
    }

    @Test("a TLS record, binary bytes, a space first or an overlong token are not HTTP")
    func notHTTP() {
        for text in ["\u{16}\u{3}\u{1}\u{0}", "\u{0}\u{1}hello", " GET / HTTP/1.1", "SSH-2.0-OpenSSH_9.2\r\n", String(repeating: "A", count: 30)] {
            guard case .notHTTP = Self.classify(text) else {
                Issue.record("\(text.debugDescription) was not refused: \(Self.classify(text))")
                continue
            }
        }
    }
}
