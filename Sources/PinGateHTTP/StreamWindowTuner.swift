/// How far ahead the gate lets an `h2` upstream send each stream's response: the size of
/// the stream's receive window, one per connection.
///
/// The window is what the gate may end up holding for a client that stops reading: the
/// upstream may send all of it before it must wait, and the gate keeps those bytes until
/// the client takes them. A fixed 1 MiB window held about 1 MiB per stopped reader (5,000
/// concurrent downloads took the gate's RSS past 2 GB), where nginx's proxy buffers hold
/// 64 KiB. A fixed small window would cap a long-distance download instead: one window per
/// round trip is 3.2 MB/s with 64 KiB at 20 ms.
///
/// So every stream starts small (`minimumWindow`) and its window doubles only while the rate
/// at which its client takes the bytes (the credit the ledger gives back: bytes written to
/// a client that can take them) times the connection's round trip fills most of it: the
/// bandwidth-delay product, as gRPC's BDP estimator and TCP's receive-buffer autotuning
/// size theirs. A client that reads slowly, or stops, gives little or no credit
/// and its window stays where it is; on a short path (loopback) a round trip is so short
/// that even a fast client's rate times it stays within the first window.
///
/// The round trip is the smallest seen (`UpstreamRoundTripSource`): the kernel's for the TCP
/// connection when its peer is the origin, else (through a parent proxy) from the session's
/// own SETTINGS and PINGs to their acknowledgements. Not PINGs on a direct connection: their
/// acknowledgement is read only when the gate's event loop comes round to the socket, so
/// they measure the gate's own busy loop as much as the path, and a window sized by that
/// grows on loopback, where it buys nothing.
///
/// Sans-IO: the connection feeds it times (nanoseconds on one monotonic clock) and credits,
/// and applies the windows it returns.
struct StreamWindowTuner {
    /// The window every stream starts with (HTTP/2's own default is 65,535).
    static let minimumWindow = 64 * 1024
    /// The largest window a stream grows to: 200 MB/s at a 20 ms round trip.
    static let maximumWindow = 4 << 20
    /// The largest window a stream grows to on a short path whose upstream still waits for
    /// credit while the client keeps up (the gate's own cycle is the round trip).
    static let busyLoopWindow = 256 << 10
    /// A rate is measured over at least this long, and over at least two round trips:
    /// shorter, it would measure one burst.
    static let minimumPeriodNanoseconds: Int64 = 5_000_000

    /// The smallest round trip measured so far, or nil before the first.
    private(set) var roundTripNanoseconds: Int64?
    /// Windows grown over the connection's life (for statistics and tests).
    private(set) var growths = 0
    /// The largest window any stream of the connection was given.
    private(set) var largestWindow = minimumWindow

    private struct Meter {
        var window: Int
        var periodStart: Int64?
        var credited = 0
        var upstreamWaited = false
    }

    private var meters: [Int32: Meter] = [:]

    /// How many streams are being measured.
    var meteredStreams: Int { meters.count }

    /// A round trip took `nanoseconds` (SETTINGS or PING to its acknowledgement).
    mutating func roundTripMeasured(_ nanoseconds: Int64) {
        guard nanoseconds > 0 else { return }
        roundTripNanoseconds = min(roundTripNanoseconds ?? nanoseconds, nanoseconds)
    }

    /// `streamID` opened: it starts with `minimumWindow` (the session's initial window).
    mutating func streamOpened(_ streamID: Int32) {
        meters[streamID] = Meter(window: Self.minimumWindow)
    }

    /// `streamID` closed: nothing more is measured for it.
    mutating func streamClosed(_ streamID: Int32) {
        meters[streamID] = nil
    }

    /// The window `streamID` has (nil for a stream not opened here).
    func window(of streamID: Int32) -> Int? { meters[streamID]?.window }

    /// `bytes` of `streamID`'s response were taken by the client at `now`. Returns the
    /// stream's new window when it should grow, else nil.
    ///   - upstreamWaiting: whether, before this credit, the upstream had less than a
    ///     quarter of the stream's window left to send with (it was, or was about to be,
    ///     waiting for this credit).
    mutating func credited(_ streamID: Int32, bytes: Int, now: Int64, upstreamWaiting: Bool = false) -> Int? {
        guard bytes > 0, var meter = meters[streamID] else { return nil }
        defer { meters[streamID] = meter }
        guard let start = meter.periodStart else {
            // The first credit starts the first period; its bytes were in flight before it.
            meter.periodStart = now
            return nil
        }
        meter.credited += bytes
        meter.upstreamWaited = meter.upstreamWaited || upstreamWaiting
        let elapsed = now - start
        guard elapsed >= max(Self.minimumPeriodNanoseconds, 2 * (roundTripNanoseconds ?? 0)) else { return nil }
        meter.periodStart = now
        let credited = meter.credited
        let upstreamWaited = meter.upstreamWaited
        meter.credited = 0
        meter.upstreamWaited = false
        var limit = 0
        if let roundTrip = roundTripNanoseconds {
            // What the client took per round trip at the rate just measured: the bytes that
            // must be in flight for that rate. Once that is most of the window (three
            // quarters, as gRPC's estimator has it: a window-bound stream measures close to
            // all of it), the window is what holds the stream back on this path.
            let inFlight = Double(credited) * Double(roundTrip) / Double(elapsed)
            if inFlight * 4 >= Double(meter.window * 3) { limit = Self.maximumWindow }
        }
        if upstreamWaited && credited >= meter.window {
            // The path is short, but the loop is not: the upstream ran out of window while
            // the client took a whole window or more in the period. The gate's own
            // processing is the round trip then, and a window per cycle makes a cycle per
            // 64 KiB (about 1 s more CPU per GB, bridged, in `scripts/bench`). Up to
            // `busyLoopWindow`, which amortises that and no more.
            limit = max(limit, Self.busyLoopWindow)
        }
        guard meter.window < limit else { return nil }
        meter.window = min(limit, 2 * meter.window)
        growths += 1
        largestWindow = max(largestWindow, meter.window)
        return meter.window
    }
}

/// Where an `h2` upstream connection's round trip is read from (`StreamWindowTuner`).
package enum UpstreamRoundTripSource: Sendable {
    /// The kernel's smoothed round trip of the TCP connection (TCP_INFO): its peer is the
    /// origin.
    case tcp
    /// HTTP/2 SETTINGS and PING acknowledgements: the TCP peer is a parent proxy, whose own
    /// round trip says nothing of the origin's.
    case http2Ping
}
