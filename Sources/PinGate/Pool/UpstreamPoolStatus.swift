/// What the upstream pool holds and has done, for `/status`.
public struct UpstreamPoolStatus: Sendable, Equatable, Codable {
    /// Connections waiting idle now.
    public var idle: Int
    /// Of those, per `host:port`.
    public var idleByHost: [String: Int]
    /// CONNECTs admitted on a pooled connection (no upstream handshake).
    public var hits: Int
    /// CONNECTs of request-aware tunnels that found none and opened a connection.
    public var misses: Int
    /// CONNECTs that found none but another tunnel's `h2` dial to the same host in flight,
    /// and waited for it (then counted as a hit on it, or a miss when it could not be
    /// shared; neither when the client left while it waited).
    public var waitedForDial: Int = 0
    /// Connections put in the pool when their tunnel ended.
    public var parked: Int
    /// Connections not put in the pool when their tunnel ended, by reason token.
    public var notPooled: [String: Int]
    /// Connections that left the pool without carrying another tunnel, by reason token.
    public var closed: [String: Int]
    /// The idle timeout in force.
    public var idleTimeoutSeconds: Double
    /// The per-host cap in force.
    public var maximumIdlePerHost: Int
}
