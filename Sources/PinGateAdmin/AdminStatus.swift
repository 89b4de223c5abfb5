import Foundation
import PinGate
import PinList

/// Everything the admin endpoint reports, gathered at one moment.
public struct AdminSnapshot: Sendable, Codable {
    /// `/status`.
    public struct Status: Sendable, Codable {
        public var version: String
        public var uptimeSeconds: Double
        public var listen: [String]
        public var admin: String
        public var ca: CA
        public var list: ListStatus
        public var counters: Counters
    }

    /// The local CA.
    public struct CA: Sendable, Codable {
        public var subject: String
        public var sha256: String
        public var notAfter: Date?
        public var daysLeft: Int?
    }

    /// The fingerprint list in force and its updates.
    public struct ListStatus: Sendable, Codable {
        public var usable: Bool
        public var source: String?
        public var format: String?
        public var sequence: Int64?
        public var issuedAt: Date?
        public var expiresAt: Date?
        public var entries: Int
        public var unexpiredEntries: Int
        public var earliestExpiry: Date?
        public var lastUpdate: Date?
        public var lastResult: String?
        public var updates: [String: Int]
        public var nextUpdate: Date?
    }

    /// Tunnel counters.
    public struct Counters: Sendable, Codable {
        public var openTunnels: Int
        public var tunnelsByReason: [String: Int]
        public var bytesUp: Int
        public var bytesDown: Int
        public var clientHandshakeFailures: Int
        /// Client TLS handshakes cut at the deadline after the `200`.
        public var clientHandshakeTimeouts: Int
        public var upstreamConnections: Int
        public var tunnelsClosedByUpdate: [String: Int]
        public var reportOnlyViolations: Int
    }

    /// One pin in `/pins`.
    public struct Pin: Sendable, Codable, Equatable {
        public var host: String
        public var kind: String
        public var fingerprint: String
        public var expires: Date
        public var daysLeft: Int
        public var mode: String
        public var expired: Bool
    }

    public var status: Status
    public var pins: [Pin]
    public var refusals: [RefusalLog.Entry]
    public var ready: Bool
    public var notReadyReason: String?

    /// Gathers the snapshot from a running gate.
    public static func gather(gate: PinGateServer, adminAddress: String, nextUpdate: Date?, now: Date) -> AdminSnapshot {
        let list = gate.store.list
        let listStatus = gate.store.status
        let stats = gate.statistics.snapshot
        let usable = gate.store.isUsable(at: now)
        let pins = (list?.entries ?? []).map { entry in
            Pin(host: entry.name, kind: entry.kind.rawValue, fingerprint: entry.fingerprint, expires: entry.expires,
                daysLeft: Int((entry.expires.timeIntervalSince(now) / 86400).rounded(.down)),
                mode: entry.mode.rawValue, expired: !entry.isUnexpired(at: now))
        }.sorted { ($0.host, $0.expires) < ($1.host, $1.expires) }
        let caNotAfter = gate.ca.certificate.notAfter
        let status = Status(
            version: PinGateVersion.text,
            uptimeSeconds: (now.timeIntervalSince(gate.startedAt) * 1000).rounded() / 1000,
            listen: ["\(gate.configuration.listenHost):\(gate.port)"],
            admin: adminAddress,
            ca: CA(subject: gate.ca.certificate.subjectDescription, sha256: gate.ca.certificate.sha256Fingerprint,
                   notAfter: caNotAfter, daysLeft: caNotAfter.map { Int(($0.timeIntervalSince(now) / 86400).rounded(.down)) }),
            list: ListStatus(
                usable: usable, source: list?.source, format: list?.metadata.format.rawValue, sequence: list?.metadata.sequence,
                issuedAt: list?.metadata.issuedAt, expiresAt: list?.metadata.expiresAt, entries: list?.entries.count ?? 0,
                unexpiredEntries: list?.entries.filter { $0.isUnexpired(at: now) }.count ?? 0,
                earliestExpiry: list?.earliestExpiry(after: now), lastUpdate: listStatus.lastUpdate,
                lastResult: listStatus.lastResult, updates: listStatus.updatesByResult, nextUpdate: nextUpdate),
            counters: Counters(
                openTunnels: stats.openTunnels, tunnelsByReason: stats.connectsByReason, bytesUp: stats.bytesUp,
                bytesDown: stats.bytesDown, clientHandshakeFailures: stats.clientHandshakeFailures,
                clientHandshakeTimeouts: stats.clientHandshakeTimeouts,
                upstreamConnections: stats.upstreamConnections, tunnelsClosedByUpdate: stats.tunnelsClosedByUpdate,
                reportOnlyViolations: stats.reportOnlyViolations))
        var reason: String?
        if !usable {
            reason = list == nil ? "no fingerprint list in force" : "the fingerprint list in force has no unexpired pin or is stale"
            if let last = listStatus.lastResult, last != "ok" { reason = (reason ?? "") + " (last update: \(last))" }
        }
        return AdminSnapshot(status: status, pins: pins, refusals: gate.refusals.entries.reversed(), ready: usable, notReadyReason: reason)
    }

    /// A JSON encoder with the endpoint's conventions: snake_case keys, ISO 8601 dates.
    static var encoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return encoder
    }
}
