/// Sent through every client connection's pipeline when the gate begins a graceful
/// shutdown: each request-aware client side ends its connection the way its protocol says
/// a server does, letting what is in flight finish (HTTP/2: GOAWAY with the last stream
/// processed, then the close once those streams are done; HTTP/1.1: `Connection: close` on
/// the response in flight, or the close at once when idle). The drain timeout bounds it.
public struct TunnelDrainEvent: Sendable, Equatable {
    /// The event.
    public init() {}
}
