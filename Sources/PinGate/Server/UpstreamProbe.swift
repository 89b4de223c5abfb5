import NIOCore
import NIOPosix
import PinGateNIO
import PinGateTLS

/// Connects to a live TLS server the way the gate would and reports what it presented,
/// without sending any application data (for `pingate fingerprint --connect` and
/// `pingate sign --connect`).
public enum UpstreamProbe {
    /// Handshakes with `host:port` and returns the peer summary (leaf, chain verdict, ALPN).
    public static func inspect(
        host: String,
        port: Int,
        configuration: GateConfiguration
    ) async throws -> TLSPeerSummary {
        signal(SIGPIPE, SIG_IGN)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let connector = UpstreamConnector(client: TLSClientConnector(
                settings: configuration.upstreamClientSettings,
                context: try TLSContext.client(trustRoots: configuration.upstreamTrust)))
            let eventLoop = group.next()
            let connection = try await connector.connect(
                host: host, port: port, alpnOffer: configuration.upstreamALPNOffer, on: eventLoop, countRelayed: { _ in }
            ).get()
            try? await connection.channel.close()
            try await group.shutdownGracefully()
            return connection.peer
        } catch let failure as TLSClientError {
            try? await group.shutdownGracefully()
            throw ConfigurationError(Refusal(failure).explanation(host: host, port: port))
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }
}
