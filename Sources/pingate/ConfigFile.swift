import Foundation
import PinGate
import PinList
import Yams
import PinGateNIO

/// The YAML configuration file for `pingate run`. Every key is optional; flags override
/// it. Relative paths are resolved against the file's own directory. The keys, their
/// defaults and meanings are in `ConfigKeyTable` (`pingate config-keys` prints them).
struct ConfigFile: Decodable {
    struct Pins: Decodable {
        var source: String?
        var keys: [String]?
        var format: String?
        var appName: String?
        var serverCA: [String]?
        var serverPins: [String]?
        var updateIntervalSeconds: Int?
        var expirationThresholdSeconds: Int?
        var minimumIntervalSeconds: Int?
        var waitSeconds: Int?
        var fallback: String?

        enum CodingKeys: String, CodingKey, CaseIterable {
            case source, keys, format, fallback
            case appName = "app-name"
            case serverCA = "server-ca"
            case serverPins = "server-pins"
            case updateIntervalSeconds = "update-interval-seconds"
            case expirationThresholdSeconds = "expiration-threshold-seconds"
            case minimumIntervalSeconds = "minimum-interval-seconds"
            case waitSeconds = "wait-seconds"
        }
    }

    struct Admin: Decodable {
        var listen: String?
        var token: String?
        var tokenFile: String?
        var allowedHosts: [String]?

        enum CodingKeys: String, CodingKey, CaseIterable {
            case listen, token
            case tokenFile = "token-file"
            case allowedHosts = "allowed-hosts"
        }
    }

    var listen: String?
    var admin: Admin?
    var decisionLog: String?
    var requestLog: String?
    var requestLogQuery: Bool?
    var refusalLogSize: Int?
    var stateDir: String?
    var publicDir: String?
    var pins: Pins?
    var upstreamCA: [String]?
    var resolve: [String]?
    var pinsOnly: [String]?
    var opaqueHosts: [String]?
    var upstreamProxy: String?
    var reportURIs: [String]?
    var reportCA: [String]?
    var idleTimeoutSeconds: Int?
    var clientHandshakeTimeoutSeconds: Int?
    var drainTimeoutSeconds: Int?
    var pinWarningDays: Int?
    var upstreamPool: Bool?
    var upstreamPoolIdleTimeoutSeconds: Int?
    var upstreamPoolMaxPerHost: Int?
    var upstreamTimeoutSeconds: Int?
    var logLevel: String?
    var logFormat: String?
    var strictPermissions: Bool?
    var allowPrivateDestinations: Bool?
    var upstreamSessionResumption: Bool?
    var learn: Bool?
    var learnAllowRemote: Bool?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case listen, admin
        case decisionLog = "decision-log"
        case requestLog = "request-log"
        case requestLogQuery = "request-log-query"
        case refusalLogSize = "refusal-log-size"
        case stateDir = "state-dir"
        case publicDir = "public-dir"
        case pins
        case upstreamCA = "upstream-ca"
        case resolve
        case pinsOnly = "pins-only"
        case opaqueHosts = "opaque-hosts"
        case upstreamProxy = "upstream-proxy"
        case reportURIs = "report-uris"
        case reportCA = "report-ca"
        case idleTimeoutSeconds = "idle-timeout-seconds"
        case clientHandshakeTimeoutSeconds = "client-handshake-timeout-seconds"
        case drainTimeoutSeconds = "drain-timeout-seconds"
        case pinWarningDays = "pin-warning-days"
        case upstreamPool = "upstream-pool"
        case upstreamPoolIdleTimeoutSeconds = "upstream-pool-idle-timeout-seconds"
        case upstreamPoolMaxPerHost = "upstream-pool-max-per-host"
        case upstreamTimeoutSeconds = "upstream-timeout-seconds"
        case logLevel = "log-level"
        case logFormat = "log-format"
        case strictPermissions = "strict-permissions"
        case allowPrivateDestinations = "allow-private-destinations"
        case upstreamSessionResumption = "upstream-session-resumption"
        case learn
        case learnAllowRemote = "learn-allow-remote"
    }

    /// Loads `path`, resolving relative paths in it against its directory.
    static func load(_ path: String) throws -> ConfigFile {
        let text: String
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw ConfigurationError("cannot read config file \(path): it is a directory; give the YAML file (--config FILE)")
        }
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigurationError("cannot read config file \(path): \(error.localizedDescription)")
        }
        var file: ConfigFile
        do {
            // A file with nothing but comments sets nothing: every key keeps its default.
            let empty: Bool
            do { empty = try Yams.compose(yaml: text) == nil } catch { empty = false } // the decoder reports it
            file = empty ? try YAMLDecoder().decode(ConfigFile.self, from: "{}") : try YAMLDecoder().decode(ConfigFile.self, from: text)
        } catch let error as DecodingError {
            throw ConfigurationError("config file \(path), \(ConfigKeys.describe(error, in: text))")
        } catch {
            throw ConfigurationError("config file \(path) is not valid YAML: \(error)")
        }
        // A key the gate does not know is a typo or a key of another version, and either way
        // the gate would run without what it says (`pin:` for `pins:` refuses every CONNECT).
        if let unknown = try? ConfigKeys.unknownKeys(in: text).first {
            let hint = unknown.suggestion.map { "did you mean \($0)?" }
                ?? "the keys known there are \(unknown.known.joined(separator: ", "))"
            throw ConfigurationError("config file \(path), line \(unknown.line): unknown key '\(unknown.path)'; \(hint) Correct or remove it.")
        }
        if let problem = ConfigKeys.outOfRange(in: text).first {
            throw ConfigurationError("config file \(path), \(problem)")
        }
        let base = (path as NSString).deletingLastPathComponent
        func resolve(_ relative: String) -> String { PathText.resolve(relative, against: base) }
        file.stateDir = file.stateDir.map(resolve)
        file.publicDir = file.publicDir.map(resolve)
        if var pins = file.pins {
            if let source = pins.source { try PathText.refuseNonHTTPSListURL(source, key: "pins.source") }
            pins.source = pins.source.map { $0.lowercased().hasPrefix("https://") ? $0 : resolve($0) }
            pins.keys = pins.keys?.map { PathText.resolveKey($0, against: base) }
            pins.serverCA = pins.serverCA?.map(resolve)
            pins.fallback = pins.fallback.map(resolve)
            file.pins = pins
        }
        file.upstreamCA = file.upstreamCA?.map(resolve)
        file.reportCA = file.reportCA?.map(resolve)
        if var admin = file.admin {
            admin.tokenFile = admin.tokenFile.map(resolve)
            file.admin = admin
        }
        if let log = file.decisionLog, log != "stderr", log != "off" { file.decisionLog = resolve(log) }
        if let log = file.requestLog, log != "stderr", log != "off" { file.requestLog = resolve(log) }
        return file
    }
}

/// Path helpers: `~` expansion and resolution against a base directory.
enum PathText {
    /// Expands a leading `~` and makes `path` absolute against `base` (or the working directory).
    static func resolve(_ path: String, against base: String = "") -> String {
        let expanded = expandingTilde(path)
        if expanded.hasPrefix("/") { return (expanded as NSString).standardizingPath }
        let directory = base.isEmpty ? FileManager.default.currentDirectoryPath : base
        var joined = (directory as NSString).appendingPathComponent(expanded)
        if !joined.hasPrefix("/") {
            joined = (FileManager.default.currentDirectoryPath as NSString).appendingPathComponent(joined)
        }
        return (joined as NSString).standardizingPath
    }

    /// Refuses a list location with a URL scheme other than https (`http://…` was taken for
    /// a relative file path). A signature protects what a list says, not that the newest one
    /// arrives: over plain HTTP anyone on the path could hold updates back.
    static func refuseNonHTTPSListURL(_ text: String, key: String) throws {
        guard let scheme = text.range(of: "://").map({ text[..<$0.lowerBound] }), !scheme.isEmpty,
              scheme.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) }),
              scheme.lowercased() != "https" else { return }
        throw ConfigurationError("\(key) \(text): a list is fetched over https:// only (its signature protects its content, not that the newest list arrives); give an https:// URL or a file path")
    }

    /// A `--pins-key` / `keys:` value: an inline Wultra base64 key stays as it is (it may
    /// hold `/`, which is no path separator there); anything else is a path, resolved.
    static func resolveKey(_ value: String, against base: String = "") -> String {
        PinListFile.isInlineKey(value) ? value.trimmingCharacters(in: .whitespacesAndNewlines) : resolve(value, against: base)
    }

    /// A `--pins-format` / `format:` value: `auto` (nil, detect) or a format name.
    static func listFormat(_ text: String) throws -> PinListFormat? {
        if text == "auto" { return nil }
        guard let known = PinListFormat(rawValue: text) else {
            throw ConfigurationError("unknown list format \(text) (auto, wultra-static, wultra-dynamic, pingate-v2)")
        }
        return known
    }

    /// The state directory `run`, `env` and the other commands use: the flag, else the
    /// config file's `state-dir`, else the default; resolved.
    static func stateDirectory(flag: String?, file: ConfigFile?) -> String {
        resolve(flag ?? file?.stateDir ?? defaultStateDirectory)
    }

    /// The listen address when neither a flag nor the config file gives one.
    static let defaultListen = "127.0.0.1:8080"

    /// `$XDG_STATE_HOME/pingate`, or `~/.local/state/pingate`.
    static var defaultStateDirectory: String {
        // The XDG base directory spec: a relative value is invalid and ignored.
        if let xdg = ProcessInfo.processInfo.environment["XDG_STATE_HOME"], xdg.hasPrefix("/") {
            return (xdg as NSString).appendingPathComponent("pingate")
        }
        return expandingTilde("~/.local/state/pingate")
    }

    /// The user's home: `$HOME` as the shell has it (Foundation's `~` expansion reads the
    /// password database instead, so `HOME=/srv/ci pingate …` would still use /root), else
    /// the account's home directory.
    static var home: String {
        if let home = ProcessInfo.processInfo.environment["HOME"], home.hasPrefix("/") { return home }
        return FileManager.default.homeDirectoryForCurrentUser.path
    }

    /// `path` with a leading `~` or `~/` replaced by `home` (`~user` is left to Foundation).
    static func expandingTilde(_ path: String) -> String {
        if path == "~" { return home }
        if path.hasPrefix("~/") { return (home as NSString).appendingPathComponent(String(path.dropFirst(2))) }
        return (path as NSString).expandingTildeInPath
    }
}

/// The keys a config file may use, and the ones it uses that the gate does not know.
enum ConfigKeys {
    /// A key in the file that no part of the configuration has.
    struct Unknown: Equatable {
        /// Where it is: `pin`, or `pins.sourc` inside a section.
        var path: String
        /// Its line in the file (1-based).
        var line: Int
        /// The nearest known key at the same level, when one is close enough to be a typo.
        var suggestion: String?
        /// The keys known at that level.
        var known: [String]
    }

    /// The names the decoder reads, level by level. `ConfigKeyTable` must list exactly
    /// these (a test holds the two together), so what is documented is what is read.
    static let topLevel = ConfigFile.CodingKeys.allCases.map(\.rawValue)
    static let sections: [String: [String]] = [
        "pins": ConfigFile.Pins.CodingKeys.allCases.map(\.rawValue),
        "admin": ConfigFile.Admin.CodingKeys.allCases.map(\.rawValue),
    ]

    /// Every unknown key in `text`, in file order (the top level and the `pins` and
    /// `admin` sections).
    static func unknownKeys(in text: String) throws -> [Unknown] {
        guard let root = try Yams.compose(yaml: text)?.mapping else { return [] }
        var unknown: [Unknown] = []
        for (key, value) in root {
            guard let name = key.string else { continue }
            if !topLevel.contains(name) {
                unknown.append(Unknown(path: name, line: key.mark?.line ?? 0, suggestion: nearest(name, in: topLevel), known: topLevel))
            } else if let known = sections[name], let section = value.mapping {
                for (inner, _) in section {
                    guard let innerName = inner.string, !known.contains(innerName) else { continue }
                    unknown.append(Unknown(path: "\(name).\(innerName)", line: inner.mark?.line ?? 0,
                                           suggestion: nearest(innerName, in: known).map { "\(name).\($0)" }, known: known))
                }
            }
        }
        return unknown
    }

    /// Each whole number in `text` outside its key's range in `ConfigKeyTable`, as `line N:
    /// key takes … from A to B, not V.` (the file decoded, so each is a number).
    static func outOfRange(in text: String) -> [String] {
        guard let root = try? Yams.compose(yaml: text)?.mapping else { return [] }
        var problems: [String] = []
        for key in ConfigKeyTable.keys {
            guard let range = key.range else { continue }
            let parts = key.name.split(separator: ".").map(String.init)
            var node: Yams.Node? = root[parts[0]]
            if parts.count == 2 { node = node?.mapping?[parts[1]] }
            guard let node, let value = node.int, !range.contains(value) else { continue }
            problems.append("line \(node.mark?.line ?? 0): \(key.name) takes \(key.kind.words) from \(range.lowerBound) to \(range.upperBound), not \(value).")
        }
        return problems
    }

    /// A decoding failure as a person fixes it: the line, the key's path (`pins.keys`), what
    /// the key takes and what the file has there, e.g. `line 12: idle-timeout-seconds takes
    /// a whole number, not "5m"`. (Yams reports the coding path and Swift's type names only.)
    static func describe(_ error: DecodingError, in text: String) -> String {
        let context: DecodingError.Context
        var expected: String?
        switch error {
        case .typeMismatch(let type, let errorContext):
            context = errorContext
            expected = expectation(for: type)
        case .valueNotFound(let type, let errorContext):
            context = errorContext
            expected = expectation(for: type)
        case .dataCorrupted(let errorContext) where errorContext.underlyingError is YamlError:
            return syntaxError(errorContext.underlyingError as? YamlError)
        case .keyNotFound(_, let errorContext), .dataCorrupted(let errorContext):
            context = errorContext
        @unknown default:
            return "not valid: \(error)"
        }
        let keyPath = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }
        let name = keyPath.reduce("") { path, part in part.hasPrefix("[") || path.isEmpty ? path + part : path + "." + part }
        let node = try? node(at: context.codingPath, in: text)
        let place = node?.mark.map { "line \($0.line): " } ?? ""
        let found = node.map(Self.shortText) ?? "nothing"
        guard let expected, !name.isEmpty else {
            return "\(place)\(name.isEmpty ? "the file" : name) is not valid: \(context.debugDescription)"
        }
        // The table's words where it has the key ("a whole number of seconds"), else the type's.
        let takes = ConfigKeyTable.key(name)?.kind.words ?? expected
        var message = "\(place)\(name) takes \(takes), not \(found)"
        if name == "pins", node?.scalar != nil {
            message += "; the list goes under it: `pins:` then, indented, `source: \(found.trimmingCharacters(in: CharacterSet(charactersIn: "\"")))` and `keys: [...]`"
        }
        return message + "."
    }

    /// Not YAML at all, in a line: where, and what libyaml found there.
    private static func syntaxError(_ error: YamlError?) -> String {
        switch error {
        case .scanner(let context, let problem, let mark, _)?, .parser(let context, let problem, let mark, _)?,
             .composer(let context, let problem, let mark, _)?:
            let during = context.map { " (\($0.text) at line \($0.mark.line))" } ?? ""
            return "line \(mark.line), column \(mark.column): not valid YAML: \(problem)\(during). Indent with spaces, not tabs; quote a value that holds `: `, `[` or `#`."
        case .duplicatedKeysInMapping(let duplicates, _)?:
            return "not valid YAML: a key is given twice (\(duplicates.sorted().joined(separator: ", "))); keep one."
        case let other?:
            return "not valid YAML: \(other)"
        case nil:
            return "not valid YAML."
        }
    }

    /// What a key of `type` takes, in words.
    private static func expectation(for type: Any.Type) -> String {
        switch type {
        case is Int.Type, is Int?.Type: "a whole number"
        case is Bool.Type, is Bool?.Type: "true or false"
        case is String.Type, is String?.Type: "a text"
        // Yams names the YAML shape it needed when the value has another shape.
        case is Node.Sequence.Type, is [String].Type, is [String]?.Type: "a list ([a, b], or one `- item` per line)"
        case is Node.Scalar.Type: "a single value"
        default: "a section of keys (`key: value` lines indented under it)"
        }
    }

    /// The YAML node at `path` in `text`, for its line and its text.
    private static func node(at path: [any CodingKey], in text: String) throws -> Yams.Node? {
        var current = try Yams.compose(yaml: text)
        for key in path {
            if let index = key.intValue, let sequence = current?.sequence {
                current = index < sequence.count ? sequence[index] : nil
            } else {
                current = current?.mapping?[key.stringValue]
            }
        }
        return current
    }

    /// A node as it reads in the file: a scalar quoted, a list or section by its shape.
    private static func shortText(_ node: Yams.Node) -> String {
        switch node {
        case .scalar(let scalar): "\"\(scalar.string)\""
        case .sequence: "a list"
        case .mapping: "a section"
        case .alias: "an alias"
        }
    }

    /// The known key nearest to `name` by edit distance, when it is within a third of the
    /// name's length (at least 2 edits): close enough to be a typo.
    static func nearest(_ name: String, in known: [String]) -> String? {
        let scored = known.map { ($0, editDistance(name, $0)) }.min { $0.1 < $1.1 }
        guard let (best, distance) = scored, distance <= max(2, name.count / 3) else { return nil }
        return best
    }

    /// Levenshtein distance between `a` and `b`.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a), b = Array(b)
        var previous = Array(0...b.count)
        for (i, characterA) in a.enumerated() {
            var current = [i + 1] + Array(repeating: 0, count: b.count)
            for (j, characterB) in b.enumerated() {
                current[j + 1] = min(previous[j + 1] + 1, current[j] + 1, previous[j] + (characterA == characterB ? 0 : 1))
            }
            previous = current
        }
        return previous[b.count]
    }
}
