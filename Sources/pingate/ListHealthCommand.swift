import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import PinGate
import PinGateNIO

extension ListCommand {
    /// `pingate list health`: each pinned host's pin health, as the running gate judges it.
    struct Health: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show each pinned host's pin health, as the running gate sees it: ok, backup-only, expiring, unseen or refusing, with why; --fail-on makes a state fail the command.",
            discussion: "Reads GET /status from the gate's admin endpoint (from --admin, else the config file's admin.listen, else 127.0.0.1:9090). backup-only: the host passes only on a deeper pin (its issuer's key, say), because its leaf no longer matches its leaf pins; the rotation has started and the next list should pin the new leaf. expiring: the pin carrying its verdicts, the list, or a leaf pinned by its certificate hash expires within pin-warning-days. unseen: pinned, and no client reached it since the list came in force. refusing: its last verdict refused it for its pins, or let it through only because they are report-only. Exit status: 0; 3 when a host is in a state --fail-on names (for cron jobs and CI); 1 when the gate cannot be asked.")

        @Option(name: .long, help: "The gate's config file: its admin.listen is where to ask.")
        var config: String?

        @Option(name: .long, help: "The gate's admin endpoint, HOST:PORT (default: the config file's admin.listen, else 127.0.0.1:9090).")
        var admin: String?

        @Option(name: .long, help: "Comma-separated states that make the command exit 3 when any host is in one: backup-only, expiring, unseen, refusing (e.g. --fail-on backup-only,expiring,refusing).")
        var failOn: String?

        @Flag(name: .long, help: "Print the gate's pin_health entries as JSON instead of a table.")
        var json = false

        @Option(name: .long, help: "Seconds to wait for the gate's answer.")
        var timeout: Int = 10

        func validate() throws {
            _ = try PinHealthStates.parse(failOn)
            guard timeout > 0 else { throw ValidationError("--timeout must be at least 1 second") }
        }

        /// Where to ask: the flag, the config file's admin listen address, or the default.
        func adminAddress() throws -> (host: String, port: Int) {
            let file = try config.map(ConfigFile.load)
            let text = admin ?? file?.admin?.listen ?? "127.0.0.1:9090"
            guard text != "off" else {
                throw ConfigurationError("the admin endpoint is off in \(config ?? "the config file") (admin.listen: off); pin health is read from it: give --admin HOST:PORT of a gate whose admin endpoint is on")
            }
            var (host, port) = try RunCommand.parseHostPort(text, key: admin != nil ? "--admin" : "admin.listen")
            // A gate listening on every address answers on loopback too.
            if host == "0.0.0.0" { host = "127.0.0.1" } else if host == "::" { host = "::1" }
            return (host, port)
        }

        func run() throws {
            let failing = try PinHealthStates.parse(failOn)
            let (host, port) = try adminAddress()
            let status = try Self.fetchStatus(host: host, port: port, timeout: timeout)
            if json {
                let encoder = JSONEncoder()
                encoder.keyEncodingStrategy = .convertToSnakeCase
                encoder.dateEncodingStrategy = .iso8601
                encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
                print(String(decoding: try encoder.encode(status.pinHealth), as: UTF8.self))
            } else {
                print(Self.table(status.pinHealth, warningDays: status.pinWarningDays), terminator: "")
            }
            let failed = status.pinHealth.filter { failing.contains($0.state) }
            if !failed.isEmpty {
                FileHandle.standardError.write(Data("pingate list health: \(failed.count) host\(failed.count == 1 ? "" : "s") \(Set(failed.map(\.state.rawValue)).sorted().joined(separator: ", ")) (--fail-on \(failOn ?? ""))\n".utf8))
                throw ExitCode(3)
            }
        }

        /// The part of `/status` this command reads.
        struct Status: Decodable {
            var pinHealth: [PinHealthBook.HostHealth]
            var pinWarningDays: Int?
        }

        /// GETs and decodes `/status` from the admin endpoint at `host:port`.
        static func fetchStatus(host: String, port: Int, timeout: Int) throws -> Status {
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            defer { try? group.syncShutdownGracefully() }
            let response: HTTPSResponse
            do {
                response = try PlainHTTPClient.get(host: host, port: port, path: "/status", headers: [("Accept", "application/json")],
                                                   timeout: .seconds(Int64(timeout)), maximumBodyBytes: 16 << 20,
                                                   on: group.next()).wait()
            } catch {
                // NIO's connection errors print every attempt with its socket details: say
                // what happened in words a user acts on.
                let text = "\(error)".lowercased()
                let reason = text.contains("refused") || text.contains("connection reset") ? "nothing answered there"
                    : text.contains("timed out") || text.contains("timeout") ? "no answer within \(timeout) s"
                    : String("\(error)".prefix(160))
                throw ConfigurationError("cannot read the gate's /status at http://\(Authority(host: host, port: port)): \(reason); is the gate running, with its admin endpoint there (--admin, or --config with admin.listen)?")
            }
            guard response.status == 200 else {
                throw ConfigurationError("the gate's admin endpoint at \(Authority(host: host, port: port)) answered \(response.status) to GET /status: \(String(decoding: response.body.prefix(200), as: UTF8.self))")
            }
            let decoder = JSONDecoder()
            decoder.keyDecodingStrategy = .convertFromSnakeCase
            decoder.dateDecodingStrategy = .iso8601
            do {
                return try decoder.decode(Status.self, from: response.body)
            } catch {
                throw ConfigurationError("the answer from \(Authority(host: host, port: port))/status has no pin health (a gate older than this pingate, or not a gate): \(error)")
            }
        }

        /// One line per host, worst state first, then a count per state.
        static func table(_ hosts: [PinHealthBook.HostHealth], warningDays: Int?) -> String {
            guard !hosts.isEmpty else { return "no pinned hosts and no verdicts yet\n" }
            let order = PinHealthBook.State.worstFirst
            let sorted = hosts.sorted { (order.firstIndex(of: $0.state) ?? 0, $0.host) < (order.firstIndex(of: $1.state) ?? 0, $1.host) }
            let hostWidth = min(48, sorted.map(\.host.count).max() ?? 4)
            let stateWidth = order.map(\.rawValue.count).max() ?? 11
            var text = ""
            for host in sorted {
                var line = host.host.padding(toLength: max(hostWidth, host.host.count), withPad: " ", startingAt: 0) + "  "
                    + host.state.rawValue.padding(toLength: stateWidth, withPad: " ", startingAt: 0) + "  " + host.why
                if let pin = host.lastPin {
                    line += "; pin \(pin)" + (host.pinExpires.map { ", expires \(ListPrinter.iso($0))" } ?? "")
                }
                text += line + "\n"
            }
            let counts = order.compactMap { state -> String? in
                let count = hosts.filter { $0.state == state }.count
                return count == 0 ? nil : "\(count) \(state.rawValue)"
            }
            text += "\(hosts.count) host\(hosts.count == 1 ? "" : "s"): \(counts.joined(separator: ", "))"
                + (warningDays.map { " (pin-warning-days: \($0))" } ?? "") + "\n"
            return text
        }
    }
}

/// `--fail-on` values (`list health`, `harness`): comma-separated pin health states.
enum PinHealthStates {
    /// The states `text` names, each checked; none for nil.
    static func parse(_ text: String?) throws -> Set<PinHealthBook.State> {
        guard let text else { return [] }
        return Set(try text.split(separator: ",").map { name in
            let trimmed = name.trimmingCharacters(in: .whitespaces)
            guard let state = PinHealthBook.State(rawValue: trimmed) else {
                throw ValidationError("--fail-on: unknown state \"\(trimmed)\"; the states are \(PinHealthBook.State.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            return state
        })
    }
}
