import ArgumentParser

/// `--state-dir` and `--config` for the commands that read or write a gate's state
/// directory (ca, list show, forget, propose): the same directory `run --config` uses, so
/// that after the quick start `pingate ca export --config pingate.example.yml` finds the
/// gate's CA instead of saying to create another.
struct StateDirectoryOptions: ParsableArguments {
    @Option(name: .long, help: "State directory (default: the config file's state-dir, else $XDG_STATE_HOME/pingate, or ~/.local/state/pingate).")
    var stateDir: String?

    @Option(name: .long, help: "The gate's YAML config file: its state-dir is used.")
    var config: String?

    /// The directory: the flag, else the config file's, else the default; resolved.
    func path() throws -> String {
        PathText.stateDirectory(flag: stateDir, file: try config.map(ConfigFile.load))
    }
}
