import Foundation
import ArgumentParser
import PinGate
import PinGateNIO
import PinGateTLS

/// How `fingerprint --connect` and `sign --connect` reach a live server: `--resolve`
/// like curl's, and `--upstream-ca` roots to validate its chain against (the system
/// store without them), as `pingate run` would.
struct ProbeOptions: ParsableArguments {
    @Option(name: .long, help: "Connect to ADDR for HOST:PORT (with --connect), like curl's --resolve. Repeatable.")
    var resolve: [String] = []

    @Option(name: .customLong("upstream-ca"), help: "PEM roots to validate the server's chain against (default: the system store). Repeatable.")
    var upstreamCA: [String] = []

    @Flag(name: .customLong("no-verify"), help: "With --connect: take what the server presents even when its chain does not reach the roots or its certificate does not name the host. Only for a server reached over a path you trust: whoever intercepts the connection would be what is pinned.")
    var noVerify = false

    /// Handshakes with `target` (`HOST:PORT`) and returns what it proved; only the
    /// handshake is sent. Returns the lower-cased host too.
    func inspect(_ target: String) async throws -> (host: String, peer: TLSPeerSummary) {
        let (host, port) = try RunCommand.parseHostPort(target)
        var configuration = GateConfiguration()
        configuration.resolveOverrides = try resolve.map(ResolveOverride.init(parsing:))
        if !upstreamCA.isEmpty { configuration.upstreamTrust = .pemFiles(upstreamCA.map { PathText.resolve($0) }) }
        let name = host.lowercased()
        let peer = try await UpstreamProbe.inspect(host: name, port: port, configuration: configuration)
        // What is read off a live connection is pinned or printed as that host's: unchecked,
        // an interceptor on the path at that moment would be what the list trusts.
        if !peer.chainAndHostnameValid {
            guard noVerify else {
                throw ConfigurationError("\(target): the server's certificate did not validate (\(peer.verifyReason)), so it is not taken as \(name)'s: give its roots with --upstream-ca, or --no-verify if you reached it over a path you trust, or pin a certificate file with --cert")
            }
            FileHandle.standardError.write(Data("pingate: warning: \(target)'s certificate did not validate (\(peer.verifyReason)); taken anyway (--no-verify)\n".utf8))
        }
        return (name, peer)
    }
}
