import NIOCore
import PinGateHTTP2
import PropertyBased
import Testing
@testable import PinGateHTTP

/// How an HTTP/2 side hands its session's output to the channel, and what of a body it
/// keeps while the peer's window is shut (issue 32, item 8).
@Suite("HTTP/2 wire output")
struct HTTP2WireOutputTests {
    @Test("property: output in any chunks goes out in order and whole; a first piece of one record, then pieces of four, each full but the last")
    func piecesAreWholeRecords() async {
        let pattern = (0..<600_000).map { UInt8(truncatingIfNeeded: $0 % 253) }
        await propertyCheck(count: 300, input: Gen.int(in: 0...40_000).array(of: 0...12)) { sizes in
            var output = HTTP2Wire.OutputPieces(allocator: ByteBufferAllocator())
            var written: [ByteBuffer] = []
            var expected: [UInt8] = []
            for size in sizes {
                let chunk = pattern[expected.count..<expected.count + size]
                expected += chunk
                chunk.withUnsafeBytes { output.append($0) }
            }
            let wrote = output.finish { written.append($0) }
            #expect(wrote == !expected.isEmpty)
            #expect(written.flatMap { Array($0.readableBytesView) } == expected)
            for (index, piece) in written.enumerated() {
                let limit = index == 0 ? HTTP2Wire.OutputPieces.firstPieceBytes : HTTP2Wire.OutputPieces.pieceBytes
                if index < written.count - 1 {
                    #expect(piece.readableBytes == limit, "piece \(index) is full")
                } else {
                    #expect(piece.readableBytes > 0 && piece.readableBytes <= limit)
                }
            }
        }
    }

    @Test("a body piece hands out its buffer's readable bytes in place")
    func bodyPieceInPlace() {
        var read = ByteBufferAllocator().buffer(capacity: 1024)
        read.writeBytes(Array(0..<200).map { UInt8($0) })
        read.moveReaderIndex(forwardBy: 50)
        let piece = HTTP2Wire.BodyPiece(read)
        #expect(piece.count == 150)
        var bytes: [UInt8] = []
        var address: UnsafeRawPointer?
        piece.withBytes(in: 10..<30) { bytes += $0; address = $0.baseAddress }
        #expect(bytes == Array(60..<80).map { UInt8($0) })
        #expect(address == read.withUnsafeReadableBytes { $0.baseAddress.map { $0 + 10 } }, "no copy")
    }
}
