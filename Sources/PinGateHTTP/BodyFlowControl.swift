/// The read gate of one HTTP/1.1 side of a request-aware tunnel: how many body bytes this
/// side read and handed to the router that the other leg has not yet written out (their
/// credit is `CreditLedger`'s to give back). Past `bytesInFlightLimit` the side stops
/// reading its socket until credit comes back, so a slow reader on the other leg holds this
/// one back instead of the gate buffering. HTTP/2 sides need no gate: their peer's windows
/// are the same bound.
struct BodyFlowControl {
    /// How many body bytes may be handed over and not yet passed on before reading stops.
    static let bytesInFlightLimit = 64 * 1024

    private(set) var bytesInFlight = 0
    private var readHeld = false
    /// Credit given back beyond what was handed over: never expected (the ledger gives each
    /// byte back once); counted, and the count is asserted 0 in tests.
    private(set) var overCredited = 0

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

    /// `count` of them were passed on by the other side. True when a held read should now
    /// go ahead.
    mutating func passedOn(_ count: Int) -> Bool {
        if count > bytesInFlight { overCredited += count - bytesInFlight }
        bytesInFlight = max(0, bytesInFlight - count)
        guard readHeld, bytesInFlight <= Self.bytesInFlightLimit else { return false }
        readHeld = false
        return true
    }
}
