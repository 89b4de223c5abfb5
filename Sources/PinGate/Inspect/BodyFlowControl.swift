/// The backpressure bookkeeping of one HTTP/1.1 side of a request-aware tunnel, apart from
/// any channel so both sides share it.
///
/// Reading: body bytes this side handed to the router but the other side has not passed
/// on yet are "in flight"; past `bytesInFlightLimit` the side stops reading its socket
/// until credits come back. Writing: body bytes written while the channel is not writable
/// are "owed" to the other side, which is credited only once the channel drains, so a
/// slow reader on this side holds the other one back instead of the gate buffering.
struct BodyFlowControl {
    /// How many body bytes may be handed over and not yet passed on before reading stops.
    static let bytesInFlightLimit = 256 * 1024

    private var bytesInFlight = 0
    private var readHeld = false
    private var owed: [Int: Int] = [:]

    /// Whether a read may go ahead now; if not, it is remembered for `passedOn`.
    mutating func mayRead() -> Bool {
        guard bytesInFlight > Self.bytesInFlightLimit else { return true }
        readHeld = true
        return false
    }

    /// `count` body bytes were handed to the router.
    mutating func handedOver(_ count: Int) {
        bytesInFlight += count
    }

    /// `count` of them were passed on by the other side (`nil`: the exchange ended, all
    /// are settled). True when a held read should now go ahead.
    mutating func passedOn(_ count: Int?) -> Bool {
        bytesInFlight = count.map { max(0, bytesInFlight - $0) } ?? 0
        guard readHeld, bytesInFlight <= Self.bytesInFlightLimit else { return false }
        readHeld = false
        return true
    }

    /// `count` body bytes of exchange `id` were written: the credit to give now (the
    /// channel is writable), or nil (owed until it is).
    mutating func wrote(_ id: Int, bytes count: Int, writable: Bool) -> Int? {
        if writable { return count }
        owed[id, default: 0] += count
        return nil
    }

    /// The credits owed, once the channel became writable again.
    mutating func takeOwed() -> [Int: Int] {
        let credits = owed
        owed = [:]
        return credits
    }
}
