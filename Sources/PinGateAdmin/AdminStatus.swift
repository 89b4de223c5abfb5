import Foundation
import PinGate
import PinList

/// Everything the admin endpoint reports, gathered at one moment.
public struct AdminSnapshot: Sendable, Codable {
    /// `/status`.
    public struct Status: Sendable, Codable {
        /// The pingate version.
        public var version: String
        /// Seconds since the gate started.
        public var uptimeSeconds: Double
        /// The CONNECT listen addresses.
        public var listen: [String]
        /// The admin endpoint's address.
        public var admin: String
        /// The local CA.
        public var ca: CA
        /// The list in force.
        public var list: ListStatus
        /// Tunnel counters.
        public var counters: Counters
        /// The pool of verified upstream connections; absent when pooling is off.
        public var upstreamPool: UpstreamPoolStatus?
        /// `enforcing`, or in learn mode `learning, not enforcing`.
        public var mode: String = "enforcing"
        /// Learn mode: what each admitted host presented (absent when enforcing).
        public var learned: [LearnedHost]?
        /// Learn mode: tunnels admitted with no validated chain to record (pins-only
        /// hosts), and writes of the observations file that failed.
        public var learnUnrecordedTunnels: Int?
        /// See `learnUnrecordedTunnels`.
        public var learnWriteFailures: Int?
        /// Each host's pin health under the list in force (`PinHealthBook`): every host
        /// seen, and every pinned name not reached since the list came in force.
        public var pinHealth: [PinHealthBook.HostHealth] = []
        /// How many days before an expiry a host turns `expiring` (`pin-warning-days`).
        public var pinWarningDays: Int = PinHealthBook.defaultWarningDays
    }

    /// Learn mode: one host:port and the chains it presented.
    public struct LearnedHost: Sendable, Codable {
        /// The CONNECT host.
        public var host: String
        /// The CONNECT port.
        public var port: Int
        /// Tunnels admitted to it.
        public var count: Int
        /// When it was last seen.
        public var lastSeen: Date
        /// The latest chain's leaf: certificate and key hashes, subject, expiry.
        public var leafSHA256: String
        /// See `leafSHA256`.
        public var leafSPKI: String
        /// See `leafSHA256`.
        public var leafSubject: String
        /// See `leafSHA256`.
        public var leafNotAfter: Date?
        /// The latest chain's issuer (depth 1), when there is one: its subject and key hash.
        public var issuerSubject: String?
        /// See `issuerSubject`.
        public var issuerSPKI: String?
        /// The protocol agreed upstream.
        public var alpn: String?
        /// Distinct leaves seen (more than one: the host rotated, or serves several).
        public var leaves: Int
    }

    /// The text `/ready`, `/status` and the page use for learn mode.
    public static let learningMode = "learning, not enforcing"

    /// The local CA.
    public struct CA: Sendable, Codable {
        /// The CA certificate's subject.
        public var subject: String
        /// base64 SHA-256 of the CA certificate.
        public var sha256: String
        /// When the CA certificate expires.
        public var notAfter: Date?
        /// Whole days until it expires.
        public var daysLeft: Int?
    }

    /// The fingerprint list in force and its updates.
    public struct ListStatus: Sendable, Codable {
        /// True when an unexpired, fresh list is in force.
        public var usable: Bool
        /// Where the list came from (file or URL).
        public var source: String?
        /// How it came to be in force: `pins-file`, `persisted`, `fetched`, `fallback`.
        public var origin: String?
        /// Why it is the list in force, in words (which file or copy, and what it won over).
        public var inForceBecause: String?
        /// The list's format.
        public var format: String?
        /// The v2 sequence number, when the format has one.
        public var sequence: Int64?
        /// When the list was issued (v2).
        public var issuedAt: Date?
        /// When the list itself expires (v2).
        public var expiresAt: Date?
        /// Pins in the list.
        public var entries: Int
        /// Pins not yet expired.
        public var unexpiredEntries: Int
        /// The soonest expiry of an unexpired pin.
        public var earliestExpiry: Date?
        /// When the last update attempt finished.
        public var lastUpdate: Date?
        /// Its result token.
        public var lastResult: String?
        /// Update attempts by result token.
        public var updates: [String: Int]
        /// When the next scheduled update is due.
        public var nextUpdate: Date?
    }

    /// Tunnel counters.
    public struct Counters: Sendable, Codable {
        /// Tunnels relaying now.
        public var openTunnels: Int
        /// CONNECTs decided, by reason token.
        public var tunnelsByReason: [String: Int]
        /// Plaintext bytes relayed client → upstream.
        public var bytesUp: Int
        /// Plaintext bytes relayed upstream → client.
        public var bytesDown: Int
        /// Client TLS handshakes that failed after a `200`.
        public var clientHandshakeFailures: Int
        /// Client TLS handshakes cut at the deadline after the `200`.
        public var clientHandshakeTimeouts: Int
        /// Upstream TCP connections opened.
        public var upstreamConnections: Int
        /// Upstream TLS handshakes that resumed a kept session.
        public var upstreamSessionsResumed: Int
        /// Live tunnels closed by a list update, by reason.
        public var tunnelsClosedByUpdate: [String: Int]
        /// Connections allowed under report-only pins with no match.
        public var reportOnlyViolations: Int
        /// Requests inside tunnels passed on to their upstream.
        public var requestsForwarded: Int
        /// Requests refused inside tunnels, by reason token (`authority-mismatch`, …).
        public var requestsRefusedByReason: [String: Int]
        /// Requests inside tunnels the client abandoned before their answer ended (HTTP/2
        /// RST_STREAM).
        public var requestsCancelledByClient: Int = 0
        /// Responses cut after they began, by why ("upstream-closed", "idle-timeout").
        public var requestsCutByReason: [String: Int] = [:]
        /// Flow-control credit (bytes) the HTTP layer could not place: 0 unless a miscount,
        /// which would stall a connection.
        public var creditUnplacedBytes: Int = 0
        /// Upstream connections of tunnels admitted from the pool that went while the
        /// client's connection stayed.
        public var upstreamConnectionsLostInTunnels: Int = 0
        /// New upstream connections opened inside such tunnels, by outcome (`connected`,
        /// `pooled`, or the refusal's reason token).
        public var upstreamReconnects: [String: Int] = [:]
        /// Upstream connections closed because the upstream sent bytes no request asked for
        /// while a tunnel used them (between responses, or after a response's end); those
        /// parked in the pool are counted under its `closed` reasons.
        public var upstreamUnsolicitedBytes: Int = 0
        /// Requests that cannot be repeated sent on a new upstream connection because the
        /// tunnel's had idled past what its origin is trusted to keep.
        public var upstreamConnectionsLeftIdle: Int = 0
        /// Times an `h2` upstream stream's receive window grew past 64 KiB because its
        /// client took the bytes faster than one window per round trip.
        public var upstreamStreamWindowGrowths: Int = 0
        /// The largest receive window an `h2` upstream stream reached (0: none grew).
        public var upstreamStreamWindowLargestBytes: Int = 0
        /// Times the gate gave its heap's free memory back to the system after a busy
        /// spell, and the resident bytes released.
        public var heapTrims: Int = 0
        /// See `heapTrims`.
        public var heapTrimReleasedBytes: Int = 0
    }

    /// One pin in `/pins`.
    public struct Pin: Sendable, Codable, Equatable {
        /// The host pattern.
        public var host: String
        /// `sha256` (certificate) or `spki`.
        public var kind: String
        /// The base64 hash.
        public var fingerprint: String
        /// When the pin expires.
        public var expires: Date
        /// Whole days until it expires.
        public var daysLeft: Int
        /// `enforce` or `report-only`.
        public var mode: String
        /// True once past `expires`.
        public var expired: Bool
        /// The position of the validated chain it names: `0` (the leaf), `1`, … or `any`.
        public var depth: String
        /// Trusted verdicts this pin carried since the gate started.
        public var trustedVerdicts: Int
        /// The last match, e.g. `trusted by depth-1 spki …`; nil before the first.
        public var lastMatch: String?
    }

    /// `/status`.
    public var status: Status
    /// `/pins`.
    public var pins: [Pin]
    /// `/refusals`, newest first.
    public var refusals: [RefusalLog.Entry]
    /// True when `/ready` answers 200.
    public var ready: Bool
    /// Why not, when not ready.
    public var notReadyReason: String?

    /// Gathers the snapshot from a running gate.
    public static func gather(gate: PinGateServer, adminAddress: String, nextUpdate: Date?, now: Date) -> AdminSnapshot {
        let list = gate.store.list
        let listStatus = gate.store.status
        let provenance = gate.store.provenance
        let stats = gate.statistics.snapshot
        let usable = gate.store.isUsable(at: now)
        let pins = (list?.entries ?? []).map { entry in
            Pin(host: entry.name, kind: entry.kind.rawValue, fingerprint: entry.fingerprint, expires: entry.expires,
                daysLeft: Int((entry.expires.timeIntervalSince(now) / 86400).rounded(.down)),
                mode: entry.mode.rawValue, expired: !entry.isUnexpired(at: now), depth: entry.depth.description,
                trustedVerdicts: stats.trustedByPin[entry.statisticsKey, default: 0],
                lastMatch: stats.lastMatchByPin[entry.statisticsKey].map { "trusted by \($0)" })
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
                usable: usable, source: list?.source, origin: provenance?.origin.rawValue, inForceBecause: provenance?.reason,
                format: list?.metadata.format.rawValue, sequence: list?.metadata.sequence,
                issuedAt: list?.metadata.issuedAt, expiresAt: list?.metadata.expiresAt, entries: list?.entries.count ?? 0,
                unexpiredEntries: list?.entries.filter { $0.isUnexpired(at: now) }.count ?? 0,
                earliestExpiry: list?.earliestExpiry(after: now), lastUpdate: listStatus.lastUpdate,
                lastResult: listStatus.lastResult, updates: listStatus.updatesByResult, nextUpdate: nextUpdate),
            counters: Counters(
                openTunnels: stats.openTunnels, tunnelsByReason: stats.connectsByReason, bytesUp: stats.bytesUp,
                bytesDown: stats.bytesDown, clientHandshakeFailures: stats.clientHandshakeFailures,
                clientHandshakeTimeouts: stats.clientHandshakeTimeouts,
                upstreamConnections: stats.upstreamConnections, upstreamSessionsResumed: stats.upstreamSessionsResumed,
                tunnelsClosedByUpdate: stats.tunnelsClosedByUpdate,
                reportOnlyViolations: stats.reportOnlyViolations, requestsForwarded: stats.requestsForwarded,
                requestsRefusedByReason: stats.requestsRefusedByReason,
                requestsCancelledByClient: stats.requestsCancelledByClient, requestsCutByReason: stats.requestsCutByReason,
                creditUnplacedBytes: stats.creditUnplacedBytes,
                upstreamConnectionsLostInTunnels: stats.upstreamConnectionsLostInTunnels, upstreamReconnects: stats.upstreamReconnects,
                upstreamUnsolicitedBytes: stats.upstreamUnsolicitedBytes,
                upstreamConnectionsLeftIdle: stats.upstreamConnectionsLeftIdle,
                upstreamStreamWindowGrowths: stats.upstreamStreamWindowGrowths,
                upstreamStreamWindowLargestBytes: stats.upstreamStreamWindowLargestBytes,
                heapTrims: stats.heapTrims, heapTrimReleasedBytes: stats.heapTrimReleasedBytes),
            upstreamPool: gate.upstreamPool,
            mode: gate.configuration.learning ? learningMode : "enforcing",
            learned: gate.observations.flatMap { recorder in !gate.configuration.learning ? nil :
                recorder.book.hosts.compactMap { host -> LearnedHost? in
                    guard let latest = host.latest, let leaf = latest.chain.first else { return nil }
                    let issuer = latest.chain.count > 1 ? latest.chain[1] : nil
                    return LearnedHost(host: host.host, port: host.port, count: host.chains.reduce(0) { $0 + $1.count },
                                       lastSeen: latest.lastSeen, leafSHA256: leaf.sha256, leafSPKI: leaf.spki,
                                       leafSubject: leaf.subject, leafNotAfter: leaf.notAfter, issuerSubject: issuer?.subject,
                                       issuerSPKI: issuer?.spki, alpn: latest.alpn, leaves: host.chains.count)
                }
            },
            learnUnrecordedTunnels: gate.configuration.learning ? gate.observations?.unrecorded : nil,
            learnWriteFailures: gate.configuration.learning ? gate.observations?.writeFailures : nil,
            pinHealth: gate.statistics.pinHealth.health(list: list, generation: gate.store.generation, now: now),
            pinWarningDays: gate.statistics.pinHealth.warningDays)
        var reason: String?
        // Learn mode admits on validated chains with or without a list: ready unless draining.
        if !usable && !gate.configuration.learning {
            if let expired = list?.expiryReason(at: now) {
                reason = "list-expired: \(expired)"
            } else {
                reason = list == nil ? "no fingerprint list in force" : "the fingerprint list in force has no unexpired pin"
            }
            if let last = listStatus.lastResult, last != "ok" { reason = (reason ?? "") + " (last update: \(last))" }
        }
        if gate.isDraining {
            // A load balancer or supervisor must stop sending new work now; what is open
            // finishes within the drain.
            reason = "draining: the gate is shutting down, accepts no new connections and lets open ones finish"
        }
        return AdminSnapshot(status: status, pins: pins, refusals: gate.refusals.entries.reversed(),
                             ready: (usable || gate.configuration.learning) && !gate.isDraining,
                             notReadyReason: reason)
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
