import ArgumentParser

/// `pingate config-keys`: every key of the config file, from `ConfigKeyTable`. Its help is
/// the table too, so the man page's `config-keys` section is the configuration reference.
struct ConfigKeysCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "config-keys",
        abstract: "Print every key of the YAML config file: what it takes, its default, the flag that overrides it, and what it does.",
        discussion: """
        The config file (--config) is YAML; every key is optional, flags given to run override \
        it, and relative paths in it are resolved against the file's own directory. A key the \
        gate does not know stops start-up (pingate check-config says which, on which line). \
        The keys, inside a section written as section.key:

        \(ConfigKeyTable.manual)
        """)

    /// The renderings of the table.
    enum Format: String, ExpressibleByArgument, CaseIterable {
        case text, markdown, yaml
    }

    @Option(name: .long, help: "text (as in the manual), markdown (the README's reference table) or yaml (commented lines with the defaults, as the packaged pingate.yml ends).")
    var format: Format = .text

    func run() throws {
        switch format {
        case .text: print(ConfigKeyTable.manual)
        case .markdown: print(ConfigKeyTable.markdown, terminator: "")
        case .yaml: print(ConfigKeyTable.yamlComments, terminator: "")
        }
    }
}
