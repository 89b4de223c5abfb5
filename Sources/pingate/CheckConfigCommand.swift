import ArgumentParser

/// `pingate check-config`: `run --check` under its own name, as operators look for it
/// (`nginx -t`, `squid -k parse`, `haproxy -c`). It takes every option `run` takes.
struct CheckConfigCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Check the gate's configuration as run would load it, and exit: 0 when it would start, 1 with what is wrong.",
        discussion: "Takes the options run takes (--config, --state-dir, --pins, …) and checks every key and flag, the list file against its keys, the trust anchors, the local CA and its permissions, the admin token and the log destinations, writing nothing and binding no port; the same as pingate run --check. The packaged service runs it before it starts and before a reload.")

    @OptionGroup var options: GateOptions

    func run() async throws {
        var options = options
        options.check = true
        try await options.runGate()
    }
}
