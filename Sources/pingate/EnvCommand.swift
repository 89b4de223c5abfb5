import ArgumentParser
import Foundation
import PinGate
import PinGateCA
import PinGateHarness
import PinGateNIO
import PinGateStateFiles
import PinGateTLS

/// `pingate env`: the environment an app needs to go through a gate, for `eval`.
struct EnvCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "env",
        abstract: "Print the environment that sends apps through the gate: eval \"$(pingate env)\".",
        discussion: """
        Takes the same --config, --listen and --state-dir as run, and prints HTTPS_PROXY (and \
        https_proxy), NO_PROXY for loopback, and a CA bundle (the system roots plus the gate's CA, \
        written to the state directory as ca-bundle.pem, because SSL_CERT_FILE replaces the system \
        store rather than adding to it) as SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, \
        NODE_EXTRA_CA_CERTS and GIT_SSL_CAINFO. curl, git, Python requests and OpenSSL-based tools \
        read these as they are. Node reads no proxy variable before version 24 \
        (NODE_USE_ENV_PROXY=1 there, which is set too): NODE_OPTIONS loads node-proxy.cjs from the state \
        directory, which sends the https module's requests and fetch() through the gate on any \
        version, unless the app brings its own agent or undici dispatcher. Java reads none of these: the \
        last line says how to trust the CA and set the proxy for a JVM. The CA is created if the \
        gate has not run yet, exactly as run would create it.

        With a public-dir (the config file's, or --public-dir), the files the gate published \
        there are used instead, and the state directory is not touched: any user can point apps \
        at a gate run by another (the packaged service publishes in /run/pingate).
        """)

    /// The shells `env` writes for.
    enum Shell: String, ExpressibleByArgument, CaseIterable {
        case sh, fish, powershell
    }

    @Option(name: .long, help: "The gate's YAML config file: its listen address and state directory are used.")
    var config: String?

    @Option(name: .long, help: "The gate's listen address HOST:PORT (default 127.0.0.1:8080).")
    var listen: String?

    @Option(name: .long, help: "The gate's state directory (default $XDG_STATE_HOME/pingate, or ~/.local/state/pingate).")
    var stateDir: String?

    @Option(name: .long, help: "Where the gate publishes its CA for apps (its public-dir): read from there, as any user may, instead of the state directory (default: the config file's public-dir).")
    var publicDir: String?

    @Option(name: .long, help: "The syntax to print: sh (bash, zsh, dash), fish or powershell.")
    var shell: Shell = .sh

    func run() throws {
        let file = try config.map(ConfigFile.load)
        let (host, port) = try RunCommand.parseHostPort(listen ?? file?.listen ?? PathText.defaultListen)
        // The host goes into shell code and a URL: an address, or a plain DNS name.
        guard DestinationAddress(text: host) != nil
            || (!host.isEmpty && host.unicodeScalars.allSatisfy { CharacterSet.alphanumerics.contains($0) && $0.isASCII || $0 == "-" || $0 == "." }) else {
            throw ConfigurationError("the listen host \(host.debugDescription) is neither an IP address nor a plain host name; pingate env cannot hand it to apps (give --listen HOST:PORT)")
        }
        let stateDirectory = PathText.stateDirectory(flag: stateDir, file: file)
        // The paths go into shell code and into NODE_OPTIONS, which Node splits on spaces
        // and reads double quotes in: a control character or a `"` or `\` cannot be said
        // safely in all of them, so such a directory is refused rather than half-quoted.
        if let bad = stateDirectory.unicodeScalars.first(where: { $0.value < 0x20 || $0.value == 0x7F || $0 == "\"" || $0 == "\\" }) {
            throw ConfigurationError("the state directory \(stateDirectory.debugDescription) holds \(bad.escaped(asASCII: true)), which pingate env cannot put into every shell and into NODE_OPTIONS safely; use a state directory without it (--state-dir)")
        }
        let paths: AppTrustFiles.Paths
        if let published = publicDir.map({ PathText.resolve($0) }) ?? file?.publicDir {
            // A gate that publishes its CA (the packaged service): read what it wrote, as
            // any user may, and leave its state directory alone.
            paths = AppTrustFiles.paths(in: published)
            for path in [paths.caCertificate, paths.bundle, paths.nodePreload] where !FileManager.default.isReadableFile(atPath: path) {
                throw ConfigurationError("\(path) \(FileManager.default.fileExists(atPath: path) ? "cannot be read by this user" : "does not exist"): the gate writes it into its public-dir \(published) when it starts; start the gate (sudo systemctl start pingate), or leave public-dir out to use a state directory of your own")
            }
            if let problem = AppTrustFiles.publishedFilesProblem(published) { throw ConfigurationError(problem) }
        } else {
            let ca = try LocalCA.loadOrCreate(stateDirectory: stateDirectory).ca
            // The bundle and the preload go next to the key: not into a directory others can
            // write (the gate refuses to start on one too).
            let exposed = LocalCA.permissionProblems(stateDirectory: stateDirectory)
            if !exposed.isEmpty { throw ConfigurationError("pingate env: \(LocalCA.CAError.insecurePermissions(exposed))") }
            let (written, systemBundleFound) = try AppTrustFiles.write(ca, to: stateDirectory, copyingCertificate: false)
            paths = AppTrustFiles.Paths(caCertificate: LocalCA.Paths(stateDirectory: stateDirectory).certificate,
                                        bundle: written.bundle, nodePreload: written.nodePreload)
            if !systemBundleFound {
                // Still usable for the gate's own traffic; say why other hosts will fail.
                FileHandle.standardError.write(Data("pingate env: no system CA bundle found; \(paths.bundle) holds only the gate's CA\n".utf8))
            }
        }
        if let version = Self.nodeVersion(), let major = Int(version.dropFirst().prefix { $0 != "." }), major < 24 {
            // Said once, where the user evals: what the preload covers and what it cannot
            // (issue 33: Node 20's fetch went around the gate, silently).
            FileHandle.standardError.write(Data(("pingate env: Node \(version) is on PATH; it ignores HTTPS_PROXY before Node 24, "
                + "so the preload NODE_OPTIONS loads sends its https module and fetch() through the gate; a request given "
                + "its own agent or undici dispatcher goes where that sends it\n").utf8))
        }

        // An app reaches a gate listening on every address through loopback.
        let proxyHost = switch host {
        case "0.0.0.0", "": "127.0.0.1"
        case "::": "[::1]"
        default: host.contains(":") ? "[\(host)]" : host
        }
        let environment = ShellEnvironment(
            proxyHost: proxyHost, proxyPort: port, bundle: paths.bundle, nodePreload: paths.nodePreload, caCertificate: paths.caCertificate)
        print(environment.render(for: shell), terminator: "")
    }
}

extension EnvCommand {
    /// `node --version` (e.g. `v20.20.2`) of the `node` on PATH, or nil when there is none or
    /// it does not answer within 5 s.
    static func nodeVersion() -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        guard let node = path.split(separator: ":").map({ ($0 as NSString).appendingPathComponent("node") })
            .first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else { return nil }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: node)
        process.arguments = ["--version"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        do { try process.run() } catch { return nil }
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            process.terminate()
            return nil
        }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        return text.hasPrefix("v") ? text : nil
    }
}

/// The variables `pingate env` sets, and how each shell says them.
struct ShellEnvironment {
    /// The gate's host as a URL has it (an IPv6 address in brackets).
    var proxyHost: String
    /// The gate's port.
    var proxyPort: Int
    /// The system roots plus the gate's CA.
    var bundle: String
    /// The Node preload that tunnels the https module through the proxy.
    var nodePreload: String
    /// The gate's CA alone (for Java's keytool).
    var caCertificate: String

    /// Loopback never goes through the gate: it is where the gate itself and local
    /// services live, and the gate refuses private destinations anyway.
    static let noProxy = "localhost,127.0.0.1,::1"

    /// The plain `NAME=value` pairs, in order.
    var variables: [(String, String)] {
        [
            ("HTTPS_PROXY", proxy), ("https_proxy", proxy),
            ("NO_PROXY", Self.noProxy), ("no_proxy", Self.noProxy),
            ("SSL_CERT_FILE", bundle), ("REQUESTS_CA_BUNDLE", bundle), ("CURL_CA_BUNDLE", bundle),
            ("NODE_EXTRA_CA_CERTS", bundle), ("GIT_SSL_CAINFO", bundle), ("NODE_USE_ENV_PROXY", "1"),
        ]
    }

    /// The Java advice, as a comment line.
    var javaLine: String {
        "Java reads none of these: trust the CA with keytool -importcert -noprompt -alias pingate -file \(caCertificate) "
            + "-cacerts -storepass changeit, and run java with -Dhttps.proxyHost=\(proxyHost) -Dhttps.proxyPort=\(proxyPort)"
    }

    /// `http://HOST:PORT` of the gate.
    var proxy: String { "http://\(proxyHost):\(proxyPort)" }

    /// The whole text for `shell`, ending in a newline.
    func render(for shell: EnvCommand.Shell) -> String {
        // NODE_OPTIONS keeps what the user had, and gains the preload once however often
        // the output is evaluated. Node reads double quotes in it, so the path is quoted so.
        let require = "--require \"\(nodePreload)\""
        var lines = ["# pingate at \(proxy): apps started from this shell go through it"]
        switch shell {
        case .sh:
            lines += variables.map { "export \($0)=\(Self.shQuote($1))" }
            lines.append("case \" ${NODE_OPTIONS:-} \" in *\(Self.shQuote(nodePreload))*) ;; "
                + "*) export NODE_OPTIONS=\(Self.shQuote(require))\"${NODE_OPTIONS:+ $NODE_OPTIONS}\" ;; esac")
        case .fish:
            lines += variables.map { "set -gx \($0) \(Self.fishQuote($1))" }
            lines.append("string match -q -- \(Self.fishQuote("*\(nodePreload)*")) \"$NODE_OPTIONS\"; "
                + "or set -gx NODE_OPTIONS (string trim -- \(Self.fishQuote(require))\" $NODE_OPTIONS\")")
        case .powershell:
            lines += variables.map { "$env:\($0) = \(Self.powershellQuote($1))" }
            lines.append("if (-not (\"$env:NODE_OPTIONS\").Contains(\(Self.powershellQuote(nodePreload)))) "
                + "{ $env:NODE_OPTIONS = (\(Self.powershellQuote(require)) + ' ' + \"$env:NODE_OPTIONS\").Trim() }")
        }
        lines.append("# \(javaLine)")
        return lines.joined(separator: "\n") + "\n"
    }

    static func shQuote(_ text: String) -> String {
        "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
    }

    static func fishQuote(_ text: String) -> String {
        "'" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") + "'"
    }

    static func powershellQuote(_ text: String) -> String {
        // PowerShell ends a single-quoted string at the typographic single quotes too
        // (U+2018 to U+201B): each is doubled like the ASCII one.
        var quoted = "'"
        for character in text {
            quoted.append(character)
            if "'\u{2018}\u{2019}\u{201A}\u{201B}".contains(character) { quoted.append(character) }
        }
        return quoted + "'"
    }
}
