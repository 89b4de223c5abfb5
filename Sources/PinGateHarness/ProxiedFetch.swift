import Foundation
import NIOCore
import PinGateNIO
import PinGateTLS

/// An HTTPS GET through an HTTP proxy, as an app behind the gate makes it: CONNECT, then
/// TLS trusting the given roots, then one request. The harness's built-in client.
public enum ProxiedFetch {
    /// What came back.
    public struct Result: Sendable {
        /// The origin's HTTP status, when the tunnel and TLS came up.
        public var status: Int?
        /// The response body.
        public var body: Data = Data()
        /// The proxy's status when it refused the CONNECT.
        public var proxyStatus: Int?
        /// `Pingate-Refusal`, when the proxy is a pingate that refused.
        public var refusal: String?
        /// `Pingate-Observed-Fingerprint`.
        public var observedFingerprint: String?
        /// Any other failure, in words.
        public var error: String?
    }

    /// GETs `url` through `proxy`, trusting `trust` for the TLS inside the tunnel.
    public static func get(_ url: URL, via proxy: ParentProxy, trust: TrustRoots, on group: EventLoopGroup,
                           timeout: TimeAmount = .seconds(20)) async -> Result {
        var settings = TLSClientSettings()
        settings.parentProxy = proxy
        settings.connectTimeout = timeout
        settings.handshakeTimeout = timeout
        do {
            let connector = TLSClientConnector(settings: settings, context: try TLSContext.client(trustRoots: trust))
            let client = HTTPSClient(connector: connector, serverPins: [], timeout: timeout, maximumBodyBytes: 64 << 20)
            let response = try await client.send(.GET, url, headers: [], body: nil, on: group.next()).get()
            return Result(status: response.status, body: response.body)
        } catch HTTPSClientError.connection(.parentProxy(let refusal)) {
            return Result(proxyStatus: refusal.status, refusal: refusal.refusal, observedFingerprint: refusal.observedFingerprint,
                          error: refusal.description)
        } catch {
            return Result(error: "\(error)")
        }
    }
}
