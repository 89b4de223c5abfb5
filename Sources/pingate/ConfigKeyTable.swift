import PinGateNIO

/// Every key of the YAML config file, once: its name, what it takes, its default, the flag
/// that overrides it, and what it means. The config decoding is checked against it (a key
/// the decoder reads and the table lacks, or the other way round, fails the tests), the
/// unknown-key check and the decoding errors read it, and `pingate config-keys` prints it
/// for the man page (the `config-keys` section), the README's reference and the packaged
/// yml's comments, each of which a test compares with what it prints (issue 33, item 6).
enum ConfigKeyTable {
    /// What a key takes, as a person writes it.
    enum Kind: Equatable {
        case text, path, paths, hostPort, wholeNumber(unit: String?), boolean, names, section

        /// In words, for the reference and for errors: "takes a whole number of seconds".
        var words: String {
            switch self {
            case .text: "a text"
            case .path: "a file or directory path (relative to the config file)"
            case .paths: "a list of paths ([a.pem, b.pem], or one `- path` per line)"
            case .hostPort: "HOST:PORT"
            case .wholeNumber(let unit?): "a whole number of \(unit)"
            case .wholeNumber(nil): "a whole number"
            case .boolean: "true or false"
            case .names: "a list ([a, b], or one `- item` per line)"
            case .section: "a section of keys (`key: value` lines indented under it)"
            }
        }

        /// Short, for the reference's type column.
        var short: String {
            switch self {
            case .text: "text"
            case .path: "path"
            case .paths: "list of paths"
            case .hostPort: "HOST:PORT"
            case .wholeNumber(let unit?): "number (\(unit))"
            case .wholeNumber(nil): "number"
            case .boolean: "true/false"
            case .names: "list"
            case .section: "section"
            }
        }
    }

    /// One key.
    struct Key: Equatable {
        /// Its path: `listen`, or `pins.source` inside a section.
        var name: String
        var kind: Kind
        /// The value used when the key is left out, as written in the file; nil: none.
        var defaultValue: String?
        /// The `run` flag that overrides it, if there is one.
        var flag: String?
        /// What it does, one paragraph.
        var meaning: String
        /// A whole number's allowed values (checked when the file is read).
        var range: ClosedRange<Int>?

        init(_ name: String, _ kind: Kind, default defaultValue: String? = nil, flag: String? = nil, range: ClosedRange<Int>? = nil, _ meaning: String) {
            self.name = name
            self.kind = kind
            self.defaultValue = defaultValue
            self.flag = flag
            self.meaning = meaning
            // A duration is at least a second (0 would close every tunnel at once, or refuse
            // every CONNECT) and at most a year (TimeAmount counts nanoseconds in 64 bits).
            self.range = range ?? (kind == .wholeNumber(unit: "seconds") ? 1...Self.year : nil)
        }

        /// Seconds in a year: the longest duration a key takes.
        static let year = 31_536_000
    }

    /// The keys, in the order the reference lists them.
    static let keys: [Key] = [
        Key("listen", .hostPort, default: "127.0.0.1:8080", flag: "--listen",
            "Where the gate takes CONNECT requests. A host other than loopback lets other machines use the gate."),
        Key("state-dir", .path, default: "$XDG_STATE_HOME/pingate or ~/.local/state/pingate", flag: "--state-dir",
            "Holds the local CA (ca.pem, ca.key, 0600), the persisted list and observations.json; the gate keeps it 0700."),
        Key("public-dir", .path, flag: "--public-dir",
            "Where the gate publishes at start, world-readable, its CA certificate, a CA bundle (the system roots and it) and the Node preload, so that `pingate env --config` works for every user; the key never goes there. The packaged service uses /run/pingate."),
        Key("pins", .section,
            "The signed fingerprint list and how it is checked and refreshed."),
        Key("pins.source", .path, flag: "--pins",
            "The list: a file, or an https:// URL fetched at start and refreshed on the schedule below. Without a list every CONNECT is refused (empty)."),
        Key("pins.keys", .paths, flag: "--pins-key",
            "The public keys that may have signed the list: PEM files, or Wultra's base64 X9.63 key inline (88 characters)."),
        Key("pins.format", .text, default: "auto", flag: "--pins-format",
            "auto (Wultra static or pingate v2, detected), wultra-static, wultra-dynamic or pingate-v2."),
        Key("pins.app-name", .text, default: "pingate",
            "Wultra dynamic lists: the appName query parameter."),
        Key("pins.server-ca", .paths, default: "the system store",
            "Roots the list server's chain must reach."),
        Key("pins.server-pins", .names,
            "Base64 SHA-256 of the list server's certificate or SPKI; when given, the list server must present one of them."),
        Key("pins.update-interval-seconds", .wholeNumber(unit: "seconds"), default: "604800",
            "The longest wait between list fetches (Wultra's periodic interval: 7 days)."),
        Key("pins.expiration-threshold-seconds", .wholeNumber(unit: "seconds"), default: "1209600", range: 0...Key.year,
            "Inside this much time before a pin or the list expires, the waits between fetches shrink eightfold (Wultra's rule)."),
        Key("pins.minimum-interval-seconds", .wholeNumber(unit: "seconds"), default: "60",
            "The shortest wait between successful fetches, so a list about to expire does not make the gate hammer its server."),
        Key("pins.wait-seconds", .wholeNumber(unit: "seconds"), default: "10", range: 0...3600,
            "How long a CONNECT waits for a first list when none is usable; then 503 list-unavailable."),
        Key("pins.fallback", .path,
            "A bundled list used only when nothing better (persisted or fetched) is available; verified like any."),
        Key("upstream-ca", .paths, default: "the system store", flag: "--upstream-ca",
            "Roots that upstream chains must reach."),
        Key("resolve", .names, flag: "--resolve",
            "HOST:PORT:ADDR entries: connect to ADDR for HOST:PORT, as curl's --resolve does."),
        Key("pins-only", .names, flag: "--pins-only",
            "Hosts whose pin alone decides: chain and host name errors are ignored for them."),
        Key("opaque-hosts", .names, flag: "--opaque-host",
            "Hosts whose tunnels are relayed as bytes instead of read as HTTP, for TLS protocols other than HTTP."),
        Key("allow-private-destinations", .boolean, default: "false", flag: "--allow-private-destinations",
            "Allow CONNECTs to names whose DNS answer is loopback, private, link-local, CGNAT or IPv4-mapped; refused by default, so a name cannot be pointed at the gate's own network."),
        Key("upstream-session-resumption", .boolean, default: "true", flag: "--upstream-session-resumption",
            "Resume upstream TLS sessions of verified, pin-trusted handshakes; each resumed connection is checked against the list again."),
        Key("upstream-proxy", .text, flag: "--upstream-proxy",
            "A parent HTTP proxy (http://proxy.corp:3128) that upstream connections go through with CONNECT; pins still apply end to end."),
        Key("upstream-timeout-seconds", .wholeNumber(unit: "seconds"), default: "10", range: 1...3600,
            "How long the upstream TCP connect, and then its TLS handshake, may each take before the CONNECT is refused (upstream-timeout)."),
        Key("upstream-pool", .boolean, default: "true", flag: "--upstream-pool",
            "Keep verified upstream connections after their tunnel ends and admit later CONNECTs to the same host on them, without an upstream handshake."),
        Key("upstream-pool-idle-timeout-seconds", .wholeNumber(unit: "seconds"), default: "30", flag: "--upstream-pool-idle-timeout",
            "How long a pooled upstream connection may stay idle before it is closed."),
        Key("upstream-pool-max-per-host", .wholeNumber(unit: "connections"), default: "16", flag: "--upstream-pool-max-per-host", range: 1...10_000,
            "The most idle upstream connections kept per host and port."),
        Key("report-uris", .names, flag: "--report-uri",
            "https:// URLs that pin-failure reports (TrustKit JSON) are POSTed to."),
        Key("report-ca", .paths, default: "the system store",
            "Roots the report collectors' chains must reach."),
        Key("admin", .section,
            "The admin endpoint: /ready, /status, /metrics, /refusals, the status page, POST /pins/update."),
        Key("admin.listen", .hostPort, default: "127.0.0.1:9090", flag: "--admin-listen",
            "Where the admin endpoint listens, or off. A non-loopback address needs a token."),
        Key("admin.token-file", .path, flag: "--admin-token-file",
            "A file holding the bearer token for POST /pins/update."),
        Key("admin.token", .text,
            "The bearer token inline, instead of token-file."),
        Key("admin.allowed-hosts", .names, flag: "--admin-allowed-hosts",
            "Host names the admin endpoint answers besides its listen host and the localhost forms; * for any. Any other Host gets 421, against DNS rebinding."),
        Key("decision-log", .text, default: "stderr", flag: "--decision-log",
            "One JSON line per CONNECT: stderr, a file path, or off. SIGHUP reopens the file."),
        Key("request-log", .text, default: "off", flag: "--request-log",
            "One JSON line per HTTP request inside a tunnel: stderr, a file path, or off. SIGHUP reopens the file."),
        Key("request-log-query", .boolean, default: "false", flag: "--request-log-query",
            "Keep query strings in the request log's paths; by default they are cut at the first ?."),
        Key("refusal-log-size", .wholeNumber(unit: "refusals"), default: "100", range: 1...100_000,
            "How many recent refusals GET /refusals and the status page keep."),
        Key("idle-timeout-seconds", .wholeNumber(unit: "seconds"), default: "300",
            "A tunnel with no traffic either way for this long is closed (it is noticed within a quarter of this time after)."),
        Key("client-handshake-timeout-seconds", .wholeNumber(unit: "seconds"), default: "10", flag: "--client-handshake-timeout",
            "After the 200, how long the client has to finish its TLS handshake with the gate; then both legs are closed."),
        Key("drain-timeout-seconds", .wholeNumber(unit: "seconds"), default: "30", flag: "--drain-timeout", range: 0...3600,
            "On SIGTERM or SIGINT, how long open tunnels may take to finish before they are closed."),
        Key("pin-warning-days", .wholeNumber(unit: "days"), default: "30", flag: "--pin-warning-days", range: 0...3650,
            "How many days before an expiry a host's pin health turns expiring: the pin that carries its verdicts, the list, or a leaf pinned by its hash."),
        Key("log-level", .text, default: "info", flag: "--log-level",
            "The operational log's level: trace, debug, info, notice, warning or error."),
        Key("log-format", .text, default: "text", flag: "--log-format",
            "The operational log's format on stderr: text, or json (one JSON object per line)."),
        Key("strict-permissions", .boolean, default: "true", flag: "--strict-permissions",
            "Refuse to start when ca.key is open to group or others, or the state directory is not 0700; false starts anyway, with a warning."),
        Key("learn", .boolean, default: "false", flag: "--learn",
            "Learn mode: hosts without a pin pass when their chain and host name validate, and what every host presents is recorded for `pingate list propose`. Pinned hosts are enforced as usual."),
        Key("learn-allow-remote", .boolean, default: "false", flag: "--learn-allow-remote",
            "With learn, allow a listen address other than loopback."),
    ]

    /// Checks a whole number given for `key` against its range, as the file's values are
    /// checked: a flag's value (`flag`, when it came from one) gets the same bounds and words.
    static func check(_ value: Int, key name: String, flag: String?) throws {
        guard let key = key(name), let range = key.range, !range.contains(value) else { return }
        throw ConfigurationError("\(flag ?? name) takes \(key.kind.words) from \(range.lowerBound) to \(range.upperBound), not \(value)\(key.name.hasPrefix("upstream-pool") ? " (--no-upstream-pool turns pooling off)" : "")")
    }

    /// The key at `path` (`pins.keys`), if the table has it.
    static func key(_ path: String) -> Key? { keys.first { $0.name == path } }

    /// The top-level names, and each section's names, as the unknown-key check reads them.
    static var topLevelNames: [String] { keys.map(\.name).filter { !$0.contains(".") } }

    /// The names inside `section`.
    static func names(in section: String) -> [String] {
        keys.compactMap { $0.name.hasPrefix(section + ".") ? String($0.name.dropFirst(section.count + 1)) : nil }
    }

    /// The sections (keys of kind `.section`).
    static var sectionNames: [String] { keys.filter { $0.kind == .section }.map(\.name) }

    // MARK: renderings

    /// For the man page and `--help`: one paragraph per key, no hard line breaks.
    static var manual: String {
        keys.map { key in
            var facts = [key.kind.short]
            if let range = key.range { facts.append("\(range.lowerBound) to \(range.upperBound)") }
            if let value = key.defaultValue { facts.append("default \(value)") }
            if let flag = key.flag { facts.append("flag \(flag)") }
            return "\(key.name) (\(facts.joined(separator: "; "))): \(key.meaning)"
        }.joined(separator: "\n\n")
    }

    /// For the README: a Markdown table.
    static var markdown: String {
        var lines = ["| key | takes | default | flag | meaning |", "|---|---|---|---|---|"]
        for key in keys {
            let takes = key.kind.short + (key.range.map { ", \($0.lowerBound) to \($0.upperBound)" } ?? "")
            let cells = ["`\(key.name)`", takes, key.defaultValue.map { "`\($0)`" } ?? "", key.flag.map { "`\($0)`" } ?? "", key.meaning]
            lines.append("| " + cells.map { $0.replacingOccurrences(of: "|", with: "\\|") }.joined(separator: " | ") + " |")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// For the packaged yml: every key as a commented-out line with its default, its
    /// meaning indented under it, wrapped to fit 90 columns.
    static var yamlComments: String {
        var lines: [String] = []
        for key in keys {
            let parts = key.name.split(separator: ".")
            let indent = String(repeating: "  ", count: parts.count - 1)
            let leaf = parts.last.map(String.init) ?? key.name
            switch (key.kind, key.defaultValue) {
            case (.section, _): lines.append("# \(indent)\(leaf):")
            case (_, let value?) where !value.contains(" "): lines.append("# \(indent)\(leaf): \(value)")
            case (_, let value?): lines.append("# \(indent)\(leaf):          (default: \(value))")
            case (_, nil): lines.append("# \(indent)\(leaf):")
            }
            let text = key.meaning + (key.range.map { " From \($0.lowerBound) to \($0.upperBound)." } ?? "") + (key.flag.map { " Flag: \($0)." } ?? "")
            for line in wrap(text, width: 86 - indent.count) { lines.append("# \(indent)    \(line)") }
        }
        return lines.joined(separator: "\n") + "\n"
    }

    private static func wrap(_ text: String, width: Int) -> [String] {
        var lines: [String] = []
        var current = ""
        for word in text.split(separator: " ") {
            if !current.isEmpty && current.count + 1 + word.count > width {
                lines.append(current)
                current = ""
            }
            current += current.isEmpty ? String(word) : " " + word
        }
        if !current.isEmpty { lines.append(current) }
        return lines
    }
}
