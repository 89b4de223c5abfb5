/// Body bytes a session is to send, left where their owner keeps them until nghttp2 frames
/// them: the session does not copy them into a queue of its own, nor into nghttp2's frame
/// buffer (`NGHTTP2_DATA_FLAG_NO_COPY`). Each DATA frame's payload goes straight from here
/// to the output `takeOutput` gives its owner, the one copy a body byte makes in the
/// session (issue 32, item 8: there were three).
///
/// Conformers hand out their bytes and call nothing else: `withBytes` runs while the
/// session is writing a frame, and must not reach back into the session.
public protocol HTTP2BodyBytes {
    /// How many bytes there are.
    var count: Int { get }
    /// Calls `body` with the bytes at `range` (offsets from the first byte, within
    /// `0..<count`), in place; valid only during the call.
    func withBytes(in range: Range<Int>, _ body: (UnsafeRawBufferPointer) -> Void)
}

extension Array: HTTP2BodyBytes where Element == UInt8 {
    /// Calls `body` with the elements at `range`, in place.
    public func withBytes(in range: Range<Int>, _ body: (UnsafeRawBufferPointer) -> Void) {
        withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[range])) }
    }
}

/// The body bytes queued on one stream and not yet sent, oldest first. A plain value: the
/// session keeps one per stream that sends a body, and tests drive it without nghttp2.
///
/// A piece is either held as its owner gave it (`append(_:)`: no copy, and whatever
/// storage it holds stays held until it is sent), or copied into the queue's own bytes
/// (`appendCopy`). The session holds a piece only when it will leave in the same
/// `takeOutput`, and copies it when it must wait for the peer's window: a peer that stops
/// reading then holds the bytes it owes, not the read buffers they came in (which the
/// loop's `ByteBufferRecycler` wants back), nor a slot and a buffer per tiny DATA frame.
struct HTTP2BodyQueue {
    /// Held pieces, from `head` on; those before `head` were sent and hold nothing.
    private var pieces: [any HTTP2BodyBytes] = []
    /// The oldest piece not wholly sent (`pieces.count`: all are; `copied` is next).
    private var head = 0
    /// How many bytes of the piece at `head` (or of `copied`, when all pieces are sent)
    /// were sent.
    private var offset = 0
    /// Copied bytes, after every held piece: consecutive copies share it.
    private var copied: [UInt8] = []
    /// Bytes queued and not yet sent.
    private(set) var count = 0

    /// True when nothing is queued.
    var isEmpty: Bool { count == 0 }

    /// How many pieces the queue holds (sent ones not yet dropped included), for tests.
    var heldPieceSlots: Int { pieces.count }

    /// The bytes the queue keeps of its own (copied, sent ones not yet dropped included).
    var copiedBytes: Int { copied.count }

    /// Queues `piece` itself after everything queued before it (an empty one is not kept).
    mutating func append(_ piece: any HTTP2BodyBytes) {
        guard piece.count > 0 else { return }
        if !copied.isEmpty {
            // The copied bytes go before the new piece: they become a piece themselves.
            // When every held piece is sent, `offset` is into `copied`, and stays right as
            // `copied` takes the place at `head`.
            pieces.append(copied)
            copied = []
        }
        pieces.append(piece)
        count += piece.count
    }

    /// Queues a copy of `piece`'s bytes after everything queued before it.
    mutating func appendCopy(_ piece: some HTTP2BodyBytes) {
        guard piece.count > 0 else { return }
        piece.withBytes(in: 0..<piece.count) { copied.append(contentsOf: $0) }
        count += piece.count
    }

    /// Hands the oldest `length` bytes to `sink`, in order, one run per piece, and drops
    /// them. False, and nothing handed, when fewer than `length` are queued.
    mutating func send(_ length: Int, to sink: (UnsafeRawBufferPointer) -> Void) -> Bool {
        guard length >= 0, length <= count else { return false }
        var left = length
        while left > 0 {
            if head < pieces.count {
                let piece = pieces[head]
                let run = min(left, piece.count - offset)
                piece.withBytes(in: offset..<offset + run, sink)
                offset += run
                left -= run
                if offset == piece.count {
                    // Let go of the piece now, not when the array is compacted: it may be
                    // a slice of a read buffer its owner wants back.
                    pieces[head] = [UInt8]()
                    head += 1
                    offset = 0
                }
            } else {
                let run = min(left, copied.count - offset)
                copied.withBytes(in: offset..<offset + run, sink)
                offset += run
                left -= run
            }
        }
        count -= length
        compact()
        return true
    }

    /// Drops what was sent, so that a long body's queue does not grow with what has gone.
    private mutating func compact() {
        if head == pieces.count && !pieces.isEmpty {
            pieces.removeAll(keepingCapacity: pieces.count <= 16)
            head = 0
        } else if head >= 16 && head * 2 >= pieces.count {
            pieces.removeFirst(head)
            head = 0
        }
        guard head == pieces.count && offset > 0 else { return }
        if offset == copied.count {
            // Room for the next small pieces is kept, up to a frame's worth.
            copied.removeAll(keepingCapacity: copied.capacity <= 16 * 1024)
            offset = 0
        } else if offset >= 64 * 1024 && offset * 2 >= copied.count {
            copied.removeFirst(offset)
            offset = 0
        }
    }
}
