import PropertyBased
import Testing
@testable import PinGateHTTP2

/// `PeerFrameScanner` without a session: frames written by hand, fed whole and in pieces.
@Suite("The client's frame headers, scanned beside nghttp2")
struct PeerFrameScannerTests {
    struct Frame {
        let type: UInt8
        let flags: UInt8
        let stream: UInt32
        let length: Int
    }

    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    static func bytes(_ frames: [Frame]) -> [UInt8] {
        var bytes = preface
        for frame in frames {
            bytes += [UInt8(frame.length >> 16 & 0xFF), UInt8(frame.length >> 8 & 0xFF), UInt8(frame.length & 0xFF),
                      frame.type, frame.flags,
                      UInt8(frame.stream >> 24 & 0x7F), UInt8(frame.stream >> 16 & 0xFF), UInt8(frame.stream >> 8 & 0xFF),
                      UInt8(frame.stream & 0xFF)]
            // The payload repeats a frame header's bytes, so a scanner that lost its place
            // would read frames in it.
            bytes += (0..<frame.length).map { [0x00, 0x00, 0x04, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01][$0 % 9] }
        }
        return bytes
    }

    /// Every finding in `bytes`, fed in pieces cut at `cuts`, as (stream, offset past its header).
    static func findings(_ bytes: [UInt8], cuts: [Int]) -> [(Int32, Int)] {
        var scanner = PeerFrameScanner()
        var found: [(Int32, Int)] = []
        var start = 0
        for end in (cuts.filter { $0 > 0 && $0 < bytes.count }.sorted() + [bytes.count]) where end > start {
            let piece = Array(bytes[start..<end])
            piece.withUnsafeBufferPointer { buffer in
                var offset = 0
                while let late = scanner.scan(buffer, from: offset) {
                    found.append((late.streamID, start + late.headerEnd))
                    offset = late.headerEnd
                }
            }
            start = end
        }
        return found
    }

    /// What the scan must find: DATA on a stream after the client's own END_STREAM or
    /// RST_STREAM on it, at the offset just past that frame's header.
    static func expected(_ frames: [Frame]) -> [(Int32, Int)] {
        var ended: Set<UInt32> = []
        var offset = preface.count
        var found: [(Int32, Int)] = []
        for frame in frames {
            offset += 9
            switch frame.type {
            case 0x0:
                if ended.contains(frame.stream) { found.append((Int32(frame.stream), offset)) }
                if frame.flags & 0x1 != 0 { ended.insert(frame.stream) }
            case 0x1: if frame.flags & 0x1 != 0 { ended.insert(frame.stream) }
            case 0x3: ended.insert(frame.stream)
            default: break
            }
            offset += frame.length
        }
        return found
    }

    @Test("DATA after the client's END_STREAM (HEADERS or DATA) or its RST_STREAM is found, just past its header; DATA on an open stream, and frames of other types, are not")
    func findsLateData() {
        let frames = [
            Frame(type: 0x1, flags: 0x5, stream: 1, length: 10),  // a GET, ended
            Frame(type: 0x1, flags: 0x4, stream: 3, length: 10),  // a POST, open
            Frame(type: 0x0, flags: 0x0, stream: 3, length: 100),
            Frame(type: 0x0, flags: 0x1, stream: 1, length: 4),   // late: 5.1/11
            Frame(type: 0x3, flags: 0x0, stream: 3, length: 4),   // the client resets 3
            Frame(type: 0x8, flags: 0x0, stream: 3, length: 4),   // WINDOW_UPDATE: allowed
            Frame(type: 0x0, flags: 0x0, stream: 3, length: 0),   // late: 5.1/8
        ]
        let bytes = Self.bytes(frames)
        let found = Self.findings(bytes, cuts: [])
        #expect(found.map(\.0) == [1, 3])
        #expect(found.map(\.1) == Self.expected(frames).map(\.1))
    }

    @Test("random frame sequences, cut into random pieces: the same findings as the sequence read whole, at the same offsets")
    func piecesAgreeWithWhole() async {
        // Each code is a frame (its type, END_STREAM, stream and payload length) and maybe a cut.
        await propertyCheck(count: 300, input: Gen.int(in: 0...10_000_000).array(of: 0...40)) { codes in
            let frames = codes.map { code in
                Frame(type: [0x0, 0x0, 0x1, 0x3, 0x8][code % 5], flags: UInt8(code / 5 % 2), stream: UInt32(1 + 2 * (code / 10 % 4)),
                      length: code / 40 % 41)
            }
            let total = Self.bytes(frames).count
            let cuts = codes.filter { $0 / 1_640 % 3 == 0 }.map { $0 / 4_920 % total }
            let bytes = Self.bytes(frames)
            let found = Self.findings(bytes, cuts: cuts)
            let expected = Self.expected(frames)
            #expect(found.map(\.0) == expected.map(\.0))
            #expect(found.map(\.1) == expected.map(\.1))
        }
    }
}
