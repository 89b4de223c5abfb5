import PropertyBased
import Testing
@testable import PinGateHTTP

/// `StreamWindowTuner` without sockets: a stream's window grows only while its client takes
/// the bytes faster than one window per round trip, never past the maximum, at most double
/// per measuring period; a slow or stopped client, a short path, or no round trip yet leaves
/// it at 64 KiB.
@Suite("An upstream stream's window follows what its client takes")
struct StreamWindowTunerTests {
    static let minimum = StreamWindowTuner.minimumWindow
    static let maximum = StreamWindowTuner.maximumWindow
    static let millisecond: Int64 = 1_000_000

    /// A client that takes `window` bytes every `roundTrip` (as fast as the window lets the
    /// upstream send), in `chunks` credits per round trip, for `seconds`: the windows it got.
    static func windowLimited(roundTrip: Int64, seconds: Int64, chunks: Int = 4) -> (StreamWindowTuner, [Int]) {
        var tuner = StreamWindowTuner()
        tuner.roundTripMeasured(roundTrip)
        tuner.streamOpened(1)
        var window = minimum
        var windows: [Int] = []
        var now: Int64 = 0
        while now < seconds * 1_000 * millisecond {
            for _ in 0..<chunks {
                now += roundTrip / Int64(chunks)
                if let grown = tuner.credited(1, bytes: window / chunks, now: now) {
                    window = grown
                    windows.append(grown)
                }
            }
        }
        return (tuner, windows)
    }

    @Test("at 20 ms, a client that keeps up gets a window that grows to the maximum (200 MB/s), never past it, never more than double a step")
    func growsOnALongPath() {
        let (tuner, windows) = Self.windowLimited(roundTrip: 20 * Self.millisecond, seconds: 5)
        #expect(windows.last == Self.maximum, "\(windows)")
        #expect(tuner.window(of: 1) == Self.maximum)
        var previous = Self.minimum
        for window in windows {
            #expect(window == min(2 * previous, Self.maximum), "\(windows)")
            previous = window
        }
        #expect(tuner.largestWindow == Self.maximum)
    }

    @Test("on loopback (a 50 µs round trip) 500 MB/s needs 25 KB in flight: the window stays at 64 KiB")
    func staysOnAShortPath() {
        var tuner = StreamWindowTuner()
        tuner.roundTripMeasured(50_000)
        tuner.streamOpened(1)
        // 500 MB/s: 16 KiB every 32.8 µs, for one second.
        var now: Int64 = 0
        for _ in 0..<30_518 {
            now += 32_768
            #expect(tuner.credited(1, bytes: 16_384, now: now) == nil)
        }
        #expect(tuner.window(of: 1) == Self.minimum)
        #expect(tuner.growths == 0)
    }

    @Test("on a short path where the upstream still runs out of window while the client takes a window or more per period (the gate's own loop is the round trip), the window doubles up to 256 KiB and no further; without the upstream waiting, or with a client that takes less, it stays")
    func busyLoop() {
        func run(waiting: Bool, bytesPerMillisecond: Int) -> StreamWindowTuner {
            var tuner = StreamWindowTuner()
            tuner.roundTripMeasured(40_000)
            tuner.streamOpened(1)
            var now: Int64 = 0
            for _ in 0..<2_000 {
                now += Self.millisecond
                _ = tuner.credited(1, bytes: bytesPerMillisecond, now: now, upstreamWaiting: waiting)
            }
            return tuner
        }
        // 300 MB/s, the upstream waiting: 64 -> 128 -> 256 KiB, then no more.
        let busy = run(waiting: true, bytesPerMillisecond: 300_000)
        #expect(busy.window(of: 1) == StreamWindowTuner.busyLoopWindow)
        #expect(busy.growths == 2)
        // The same rate with the upstream never short of window: nothing to gain.
        #expect(run(waiting: false, bytesPerMillisecond: 300_000).window(of: 1) == Self.minimum)
        // A client that takes 10 KB a millisecond (50 KB per 5 ms period, less than a window).
        #expect(run(waiting: true, bytesPerMillisecond: 10_000).window(of: 1) == Self.minimum)
    }

    @Test("a client slower than one window per round trip (1 MB/s at 20 ms), one that stops, and a stream with no round trip measured yet keep 64 KiB")
    func slowStoppedOrUnmeasured() {
        var slow = StreamWindowTuner()
        slow.roundTripMeasured(20 * Self.millisecond)
        slow.streamOpened(1)
        var now: Int64 = 0
        for _ in 0..<5_000 {
            now += Self.millisecond
            #expect(slow.credited(1, bytes: 1_000, now: now) == nil)
        }
        // Stopped: one burst, then nothing for a long time, then a trickle.
        slow.streamOpened(3)
        _ = slow.credited(3, bytes: Self.minimum, now: 0)
        #expect(slow.credited(3, bytes: 100, now: 60_000 * Self.millisecond) == nil)
        #expect(slow.window(of: 3) == Self.minimum)

        var unmeasured = StreamWindowTuner()
        unmeasured.streamOpened(1)
        for step in 1...1_000 { #expect(unmeasured.credited(1, bytes: 1 << 20, now: Int64(step) * Self.millisecond) == nil) }
        #expect(unmeasured.growths == 0)
    }

    @Test("the smallest round trip counts (a busy moment's larger one does not), closed and unknown streams are not measured")
    func bookkeeping() {
        var tuner = StreamWindowTuner()
        tuner.roundTripMeasured(30 * Self.millisecond)
        tuner.roundTripMeasured(20 * Self.millisecond)
        tuner.roundTripMeasured(90 * Self.millisecond)
        tuner.roundTripMeasured(0)
        #expect(tuner.roundTripNanoseconds == 20 * Self.millisecond)
        tuner.streamOpened(5)
        tuner.streamClosed(5)
        #expect(tuner.credited(5, bytes: 1 << 20, now: 1) == nil)
        #expect(tuner.credited(7, bytes: 1 << 20, now: 1) == nil)
        #expect(tuner.meteredStreams == 0)
    }

    @Test("over random credits, gaps and round trips: every window stays within 64 KiB and 4 MiB, each growth doubles the window (up to the maximum), and a stream's window never shrinks")
    func randomHistories() async {
        await propertyCheck(count: 300, input: Gen.int(in: 0...1_000_000).array(of: 1...200)) { codes in
            var tuner = StreamWindowTuner()
            var windows: [Int32: Int] = [:]
            var now: Int64 = 0
            for code in codes {
                let stream = Int32(1 + 2 * (code % 3))
                switch code % 7 {
                case 0:
                    tuner.roundTripMeasured(Int64(1 + code % 50_000) * 1_000)
                case 1:
                    tuner.streamOpened(stream)
                    windows[stream] = Self.minimum
                case 2:
                    tuner.streamClosed(stream)
                    windows[stream] = nil
                default:
                    now += Int64(code % 20_000) * 1_000
                    let bytes = code % 300_000
                    if let grown = tuner.credited(stream, bytes: bytes, now: now, upstreamWaiting: code % 11 < 5) {
                        let before = windows[stream] ?? 0
                        #expect(windows[stream] != nil, "a window for a stream that is not open")
                        #expect(grown == min(2 * before, Self.maximum), "\(before) -> \(grown)")
                        #expect(grown <= Self.maximum)
                        windows[stream] = grown
                    }
                }
                for (id, window) in windows { #expect(tuner.window(of: id) == window) }
            }
            #expect(tuner.largestWindow <= Self.maximum && tuner.largestWindow >= Self.minimum)
        }
    }
}
