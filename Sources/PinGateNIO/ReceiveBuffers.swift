import NIOCore

/// How the gate's TCP channels size the buffers they read the socket into.
public enum ReceiveBuffers {
    /// NIO's adaptive allocator, starting at 256 bytes instead of 2 KiB, growing to the
    /// same 64 KiB.
    ///
    /// Why: each channel keeps its last receive buffer for its next read, for as long as
    /// it lives, and never shrinks it, so an idle connection holds a buffer the size of
    /// the largest read it needed so far. On a tunnel that only did its handshakes that
    /// is the size of a ClientHello or a server's first flight: with a 2 KiB start, 2 KiB
    /// per leg whatever those came to (issue 12: 4 KiB per idle tunnel); from 256 bytes
    /// it grows only as far as they need. A busy connection still doubles its buffer on
    /// every full read up to the maximum, three reads more than from 2 KiB, once.
    public static var allocator: AdaptiveRecvByteBufferAllocator {
        AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 256, maximum: 64 * 1024)
    }
}
