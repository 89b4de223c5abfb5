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
