import Foundation
import PinGateTestSupport
import Testing
@testable import PinGate

/// The gate frames what it sends to clients (`ResponseBodyFraming`, NIO's automatic framing
/// off), from outside: curl through the gate to a real HTTP/2 origin whose streamed answer
/// has no length.
@Suite("The gate frames what it sends to clients")
struct ClientFramingTests {
    /// curl POSTing `payload` to the echo origin's `/echo` as gRPC asks, with `extra`.
    static func echo(_ gate: GateFixture, _ origin: H2EchoOrigin, _ payload: Data, _ extra: [String]) async throws -> CurlResult {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("payload")
        try payload.write(to: URL(fileURLWithPath: file))
        return try await curlThroughGate(gate, "https://\(ExtendedConnectTests.host):\(origin.port)/echo", [
            "--max-time", "20", "-H", "content-type: application/grpc", "-H", "te: trailers", "--data-binary", "@\(file)",
        ] + extra)
    }

    /// The response header lines curl printed (`< name: value`), lowercased.
    static func responseFields(_ result: CurlResult) -> [String] {
        result.stderr.split(whereSeparator: \.isNewline).filter { $0.hasPrefix("< ") }.map { $0.dropFirst(2).lowercased().trimmingCharacters(in: .whitespacesAndNewlines) }
    }

    @Test("an answer with no length to an HTTP/1.0 client that asked for keep-alive is ended by the close and says Connection: close (ApacheBench's -k, say), not left with nothing to end it; an HTTP/1.1 client gets it chunked on a connection that stays")
    func openBodyToHTTP10Client() async throws {
        let payload = Data((0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        try await ExtendedConnectTests.withH2Origin(connectProtocol: false) { gate, origin in
            let started = ContinuousClock.now
            let old = try await Self.echo(gate, origin, payload, ["--http1.0", "-H", "connection: keep-alive"])
            let took = ContinuousClock.now - started
            #expect(old.exitStatus == 0, "\(old.stderr)")
            #expect(old.httpCode == "200")
            #expect(old.body == payload, "the HTTP/1.0 client read \(old.body.count) of \(payload.count) bytes")
            let oldFields = Self.responseFields(old)
            #expect(oldFields.contains("connection: close"), "\(oldFields)")
            #expect(!oldFields.contains { $0.hasPrefix("transfer-encoding") || $0.hasPrefix("content-length") }, "\(oldFields)")
            // Held open, it would end only at curl's 20 s limit or the gate's idle timeout.
            #expect(took < .seconds(15), "the answer took \(took): nothing ended it but a timeout")

            let current = try await Self.echo(gate, origin, payload, ["--http1.1"])
            #expect(current.exitStatus == 0, "\(current.stderr)")
            #expect(current.body == payload)
            let fields = Self.responseFields(current)
            #expect(fields.contains("transfer-encoding: chunked"), "\(fields)")
            #expect(!fields.contains("connection: close"), "\(fields)")
        }
    }
}
