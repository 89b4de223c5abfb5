import Foundation
import PinGate
import Yams

/// The YAML configuration file for `pingate run`. Every key is optional; flags override
/// it. Relative paths are resolved against the file's own directory.
///
/// ```yaml
/// listen: 127.0.0.1:8080
/// state-dir: ./state
/// pins:
///   source: pins.json
///   keys: [signer.pub.pem]
/// upstream-ca: [origin-ca.pem]
/// resolve: ["api.example.test:8443:127.0.0.1"]
/// pins-only: []
/// idle-timeout-seconds: 300
/// log-level: info
/// ```
struct ConfigFile: Decodable {
    struct Pins: Decodable {
        var source: String?
        var keys: [String]?
    }

    var listen: String?
    var stateDir: String?
    var pins: Pins?
    var upstreamCA: [String]?
    var resolve: [String]?
    var pinsOnly: [String]?
    var idleTimeoutSeconds: Int?
    var upstreamTimeoutSeconds: Int?
    var logLevel: String?

    enum CodingKeys: String, CodingKey {
        case listen
        case stateDir = "state-dir"
        case pins
        case upstreamCA = "upstream-ca"
        case resolve
        case pinsOnly = "pins-only"
        case idleTimeoutSeconds = "idle-timeout-seconds"
        case upstreamTimeoutSeconds = "upstream-timeout-seconds"
        case logLevel = "log-level"
    }

    /// Loads `path`, resolving relative paths in it against its directory.
    static func load(_ path: String) throws -> ConfigFile {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigurationError("cannot read config file \(path): \(error.localizedDescription)")
        }
        var file: ConfigFile
        do {
            file = try YAMLDecoder().decode(ConfigFile.self, from: text)
        } catch {
            throw ConfigurationError("config file \(path) is not valid: \(error)")
        }
        let base = (path as NSString).deletingLastPathComponent
        func resolve(_ relative: String) -> String { PathText.resolve(relative, against: base) }
        file.stateDir = file.stateDir.map(resolve)
        if var pins = file.pins {
            pins.source = pins.source.map(resolve)
            pins.keys = pins.keys?.map(resolve)
            file.pins = pins
        }
        file.upstreamCA = file.upstreamCA?.map(resolve)
        return file
    }
}

/// Path helpers: `~` expansion and resolution against a base directory.
enum PathText {
    /// Expands a leading `~` and makes `path` absolute against `base` (or the working directory).
    static func resolve(_ path: String, against base: String = "") -> String {
        let expanded = (path as NSString).expandingTildeInPath
        if expanded.hasPrefix("/") { return (expanded as NSString).standardizingPath }
        let directory = base.isEmpty ? FileManager.default.currentDirectoryPath : base
        var joined = (directory as NSString).appendingPathComponent(expanded)
        if !joined.hasPrefix("/") {
            joined = (FileManager.default.currentDirectoryPath as NSString).appendingPathComponent(joined)
        }
        return (joined as NSString).standardizingPath
    }

    /// `$XDG_STATE_HOME/pingate`, or `~/.local/state/pingate`.
    static var defaultStateDirectory: String {
        if let xdg = ProcessInfo.processInfo.environment["XDG_STATE_HOME"], !xdg.isEmpty {
            return (xdg as NSString).appendingPathComponent("pingate")
        }
        return ("~/.local/state/pingate" as NSString).expandingTildeInPath
    }
}
