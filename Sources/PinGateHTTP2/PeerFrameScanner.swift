/// Frame boundaries in what an HTTP/2 client sends, tracked beside nghttp2 to find one error
/// nghttp2 cannot report here: DATA on a stream the client itself ended (END_STREAM) or
/// reset (RST_STREAM). RFC 9113 §5.1 and §6.1 make that `STREAM_CLOSED`. nghttp2 answers it
/// while it still knows the stream. But a server session keeps no closed streams
/// (`nghttp2_option_set_no_closed_streams`), and DATA on a stream it no longer knows is
/// skipped without a callback: h2spec 5.1/8 and 5.1/11 went unanswered.
///
/// Sans-IO: fed the same bytes as nghttp2, in order, it reads only the 9-byte frame headers
/// and jumps over payloads, so a large upload costs one header read per frame. What it
/// knows comes from the client's own frames alone: a stream the client ended cannot carry
/// more DATA whatever the gate did meanwhile.
struct PeerFrameScanner {
    /// A DATA frame header on a stream the client had ended or reset.
    struct LateData: Equatable {
        let streamID: Int32
        /// The offset in the scanned bytes just past the frame's header.
        let headerEnd: Int
    }

    /// Bytes of the client connection preface (RFC 9113 §3.4) still to pass over.
    private var prefaceLeft: Int
    /// The frame header being read, big-endian, and how many of its 9 bytes came.
    private var header: (length: Int, type: UInt8, flags: UInt8, streamID: UInt32) = (0, 0, 0, 0)
    private var headerCount = 0
    /// Payload bytes of the current frame still to pass over.
    private var payloadLeft = 0
    /// Streams the client ended or reset lately: clients open streams in order and end them
    /// soon after, so a bounded record covers the frames that cross on the wire. A stream
    /// older than the record is not checked: when in doubt the connection stays.
    private var endedByClient = RecentStreamIDs(capacity: 64)

    /// A scanner for a server session, whose input starts with the client preface.
    init(prefaceLength: Int = 24) {
        prefaceLeft = prefaceLength
    }

    /// Scans `bytes` from `offset`: the first DATA frame header on a stream the client had
    /// ended, or nil with every byte scanned. Call again from its `headerEnd` to go on.
    mutating func scan(_ bytes: UnsafeBufferPointer<UInt8>, from offset: Int) -> LateData? {
        var index = offset
        let count = bytes.count
        while index < count {
            if prefaceLeft > 0 {
                let skipped = min(prefaceLeft, count - index)
                prefaceLeft -= skipped
                index += skipped
                continue
            }
            if payloadLeft > 0 {
                let skipped = min(payloadLeft, count - index)
                payloadLeft -= skipped
                index += skipped
                continue
            }
            let byte = bytes[index]
            index += 1
            switch headerCount {
            case 0...2: header.length = header.length << 8 | Int(byte)
            case 3: header.type = byte
            case 4: header.flags = byte
            default: header.streamID = header.streamID << 8 | UInt32(byte)
            }
            headerCount += 1
            guard headerCount == 9 else { continue }
            let frame = header
            header = (0, 0, 0, 0)
            headerCount = 0
            payloadLeft = frame.length
            let streamID = Int32(bitPattern: frame.streamID & 0x7FFF_FFFF)
            guard streamID > 0 else { continue }
            let endsStream = frame.flags & Self.endStreamFlag != 0
            switch frame.type {
            case Self.dataType:
                if endedByClient.contains(streamID) { return LateData(streamID: streamID, headerEnd: index) }
                if endsStream { endedByClient.insert(streamID) }
            case Self.headersType:
                if endsStream && !endedByClient.contains(streamID) { endedByClient.insert(streamID) }
            case Self.resetType:
                if !endedByClient.contains(streamID) { endedByClient.insert(streamID) }
            default:
                break
            }
        }
        return nil
    }

    private static let dataType: UInt8 = 0x0
    private static let headersType: UInt8 = 0x1
    private static let resetType: UInt8 = 0x3
    private static let endStreamFlag: UInt8 = 0x1
}
