import NIOCore
import NIOEmbedded
import NIOHTTP1
import PropertyBased
import Testing
@testable import PinGateHTTP

/// The gate's own HTTP/1.1 request encoding on the upstream leg, held byte for byte to NIO's
/// `HTTPRequestEncoder` with its automatic framing off, which it replaced.
@Suite("HTTP/1.1 request encoder")
struct HTTP1RequestEncoderTests {
    /// The bytes `handler` writes for `parts`.
    private static func encode(_ parts: [HTTPClientRequestPart], with handler: ChannelHandler) throws -> ByteBuffer {
        let channel = EmbeddedChannel(handler: handler)
        defer { _ = try? channel.finish() }
        for part in parts { try channel.writeOutbound(part) }
        var wire = ByteBuffer()
        while var written = try channel.readOutbound(as: ByteBuffer.self) { wire.writeBuffer(&written) }
        return wire
    }

    private static func nioEncoder() -> HTTPRequestEncoder {
        var configuration = HTTPRequestEncoder.Configuration()
        configuration.automaticallySetFramingHeaders = false
        return HTTPRequestEncoder(configuration: configuration)
    }

    /// One random request, from a list of codes: some requests in a row on one connection.
    private static func parts(_ codes: [Int]) -> [HTTPClientRequestPart] {
        func code(_ index: Int) -> Int { codes.isEmpty ? 0 : codes[index % codes.count] }
        var parts: [HTTPClientRequestPart] = []
        for request in 0..<(1 + code(0) % 3) {
            let base = request * 7
            let method: HTTPMethod = [.GET, .POST, .PUT, .HEAD, .DELETE, .OPTIONS, .RAW(value: "PURGE")][code(base + 1) % 7]
            let uri = ["/", "/a/b?c=d&e=%20", "*", "/ünï", "/" + String(repeating: "p", count: code(base + 2) % 3000)][code(base + 2) % 5]
            var fields: [(String, String)] = [("host", "origin.test:8443")]
            let names = ["user-agent", "X-Mixed", "accept", "cookie", "x-ünï"]
            for index in 0..<(code(base + 3) % 6) {
                fields.append((names[(code(base + 4) + index) % names.count], String(repeating: "v", count: code(base + 5 + index) % 50)))
            }
            switch code(base + 6) % 4 {
            case 0: fields.append(("transfer-encoding", "chunked"))
            case 1: fields.append(("content-length", "\(code(base + 7) % 9000)"))
            case 2: fields.append(("transfer-encoding", "gzip, chunked"))  // not exactly "chunked"
            default: break
            }
            let version: HTTPVersion = code(base + 8) % 5 == 0 ? .http1_0 : .http1_1
            parts.append(.head(HTTPRequestHead(version: version, method: method, uri: uri, headers: HTTPHeaders(fields))))
            for chunk in 0..<(code(base + 9) % 4) {
                parts.append(.body(.byteBuffer(ByteBuffer(repeating: UInt8(97 + chunk), count: code(base + 10 + chunk) % 5000))))
            }
            parts.append(.end(code(base + 11) % 3 == 0 ? HTTPHeaders([("x-checksum", "1"), ("x-more", "2")]) : nil))
        }
        return parts
    }

    @Test("property: over random methods, targets, versions, fields, framings, bodies and trailers, several requests in a row, the gate's bytes are NIO's encoder's, byte for byte")
    func sameBytesAsNIO() async {
        await propertyCheck(count: 400, input: Gen.int(in: 0...1_000_000).array(of: 1...40)) { codes in
            let parts = Self.parts(codes)
            do {
                let expected = try Self.encode(parts, with: Self.nioEncoder())
                let wire = try Self.encode(parts, with: HTTP1RequestEncoderHandler())
                #expect(wire == expected, "\(parts.count) parts\ngate: \(String(buffer: wire).prefix(300))\nNIO:  \(String(buffer: expected).prefix(300))")
            } catch {
                Issue.record("\(error)")
            }
        }
    }

    @Test("a chunked request: the size line in hex, each chunk's CRLF, an empty chunk skipped, the last chunk with its trailers; the next request is framed afresh")
    func chunkedRequest() throws {
        let parts: [HTTPClientRequestPart] = [
            .head(HTTPRequestHead(version: .http1_1, method: .POST, uri: "/up", headers: ["host": "a", "transfer-encoding": "chunked"])),
            .body(.byteBuffer(ByteBuffer(string: "hello"))), .body(.byteBuffer(ByteBuffer())),
            .body(.byteBuffer(ByteBuffer(repeating: 0x78, count: 31))), .end(["x-sum": "9"]),
            .head(HTTPRequestHead(version: .http1_1, method: .GET, uri: "/next", headers: ["host": "a"])),
            .body(.byteBuffer(ByteBuffer(string: "raw"))), .end(nil),
        ]
        let wire = try Self.encode(parts, with: HTTP1RequestEncoderHandler())
        #expect(String(buffer: wire) == "POST /up HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n1f\r\n"
            + String(repeating: "x", count: 31) + "\r\n0\r\nx-sum: 9\r\n\r\nGET /next HTTP/1.1\r\nhost: a\r\n\r\nraw")
    }

    @Test("a file region is refused, not written: the gate never forwards one, and the TLS handler could not take it")
    func fileRegionRefused() throws {
        let channel = EmbeddedChannel(handler: HTTP1RequestEncoderHandler())
        defer { _ = try? channel.finish() }
        try channel.writeOutbound(HTTPClientRequestPart.head(HTTPRequestHead(version: .http1_1, method: .POST, uri: "/", headers: ["host": "a"])))
        _ = try channel.readOutbound(as: ByteBuffer.self)
        let handle = NIOFileHandle(_deprecatedTakingOwnershipOfDescriptor: -1)
        defer { _ = try? handle.takeDescriptorOwnership() }
        let region = FileRegion(fileHandle: handle, readerIndex: 0, endIndex: 0)
        #expect(throws: ChannelError.self) {
            try channel.writeOutbound(HTTPClientRequestPart.body(.fileRegion(region)))
        }
        #expect(try channel.readOutbound(as: ByteBuffer.self) == nil)
    }
}
