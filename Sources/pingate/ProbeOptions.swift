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

    /// Handshakes with `target` (`HOST:PORT`) and returns what it proved; only the
    /// handshake is sent. Returns the lower-cased host too.
    func inspect(_ target: String) async throws -> (host: String, peer: TLSPeerSummary) {
        let (host, port) = try RunCommand.parseHostPort(target)
        var configuration = GateConfiguration()
        configuration.resolveOverrides = try resolve.map(ResolveOverride.init(parsing:))
        if !upstreamCA.isEmpty { configuration.upstreamTrust = .pemFiles(upstreamCA.map { PathText.resolve($0) }) }
        let name = host.lowercased()
        return (name, try await UpstreamProbe.inspect(host: name, port: port, configuration: configuration))
    }
}
