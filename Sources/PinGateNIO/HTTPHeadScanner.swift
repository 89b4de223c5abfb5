/// Finds the blank line that ends an HTTP/1 head in bytes that arrive in pieces: the one
/// scanner behind every head pingate reads (CONNECT requests, a parent proxy's answer,
/// the loopback origin, the attacker's recorder).
///
/// A head ends at `CRLF CRLF`, or at a bare `LF LF` / `LF CRLF` (RFC 9112 §2.2 lets a
/// recipient accept a bare LF as a line end; whether to accept the head is the parser's
/// call, not the scanner's). Each call scans only what is new since the last, less the
/// two bytes a terminator may straddle, so feeding a head byte by byte stays linear.
public struct HTTPHeadScanner: Sendable {
    /// Where a complete head ends.
    public struct End: Sendable, Equatable {
        /// The index of the head's last line feed: the head's text is `..<headEnd`.
        public let headEnd: Int
        /// The index of the first byte after the blank line (a body, or the next protocol).
        public let bodyStart: Int

        @usableFromInline init(headEnd: Int, bodyStart: Int) {
            self.headEnd = headEnd
            self.bodyStart = bodyStart
        }
    }

    @usableFromInline var scanFrom = 0

    /// A scanner at the start of a head.
    public init() {}

    /// The end of the head in `buffer` (all bytes received so far, from index 0), or nil
    /// when the blank line has not arrived yet. Inlinable, so that it is specialized for
    /// the caller's collection: unspecialized, every byte read went through the
    /// collection's witness table (20k instructions per CONNECT head; issue 32).
    @inlinable
    public mutating func end<Bytes: RandomAccessCollection<UInt8>>(in buffer: Bytes) -> End? where Bytes.Index == Int {
        let newline = UInt8(ascii: "\n")
        let carriageReturn = UInt8(ascii: "\r")
        var index = max(buffer.startIndex, scanFrom)
        while index < buffer.endIndex {
            if buffer[index] == newline {
                if index + 1 < buffer.endIndex, buffer[index + 1] == newline {
                    return End(headEnd: index, bodyStart: index + 2)
                }
                if index + 2 < buffer.endIndex, buffer[index + 1] == carriageReturn, buffer[index + 2] == newline {
                    return End(headEnd: index, bodyStart: index + 3)
                }
            }
            index += 1
        }
        // Rescan the last two bytes next time: the terminator may straddle two reads.
        scanFrom = max(buffer.startIndex, buffer.endIndex - 2)
        return nil
    }
}
