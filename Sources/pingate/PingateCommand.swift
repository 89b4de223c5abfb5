import ArgumentParser
import Foundation
import PinGate
import PinGateTLS

/// The process's entry point: the `pingate` command, run on the global executor while the
/// main thread runs the main run loop.
///
/// Why not `@main` on the async command itself: Swift's async main on Linux ends the main
/// thread inside libdispatch's `dispatch_main` (a `pthread_exit`), and valgrind 3.19
/// crashes on that, so `scripts/bench` could not count the gate's instructions under
/// callgrind (issue 32's deterministic figure). The main run loop drains the main queue as
/// `dispatch_main` would; nothing in the gate runs on the main actor.
@main
enum PingateMain {
    static func main() {
        Task {
            await PingateCommand.main(nil)
            exit(0)
        }
        RunLoop.main.run()
        // `run()` returns only if the run loop has no source at all, which the main queue
        // always is: should that change, the main queue is drained as Swift's async main would.
        dispatchMain()
    }
}

/// The `pingate` command: a certificate-pinning gate for apps that use `HTTPS_PROXY`.
struct PingateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pingate",
        abstract: "A local HTTPS proxy that lets traffic through only to servers whose certificates match a signed fingerprint list.",
        discussion: """
        Point an app at the gate with HTTPS_PROXY=http://127.0.0.1:8080. For every CONNECT the gate \
        connects upstream itself, checks the server's leaf certificate against the signed list, and \
        either relays the traffic (presenting a leaf minted by its local CA, which the app must \
        trust: see `pingate ca export`) or refuses with a reason in the Pingate-Refusal header.

        First steps:
          pingate keygen --out signer                      # a list-signing key pair
          pingate sign --key signer.key --cert server.pem --name api.example.com > pins.json
          pingate run --pins pins.json --pins-key signer.pub.pem
          curl --proxy http://127.0.0.1:8080 --cacert "$(pingate ca export --path)" https://api.example.com/
        """,
        version: "pingate \(PinGateVersion.text) (\(OpenSSLVersion.text), nghttp2 \(PinGateServer.nghttp2Version))",
        subcommands: [RunCommand.self, CheckConfigCommand.self, ConfigKeysCommand.self, EnvCommand.self, CACommand.self, KeygenCommand.self, SignCommand.self, ListCommand.self, FingerprintCommand.self, DemoCommand.self, HarnessCommand.self, AttackCommand.self]
    )
}
