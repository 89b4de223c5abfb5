import Foundation
import PinList
import Synchronization

/// Pin health per host (issue 34): what the gate's own verdicts say about each pinned host
/// before a pin breaks. Pinning's usual failure is not an attack but a rotation the list
/// did not follow; the gate sees every chain it enforces, so it can say which hosts already
/// pass only on a backup, which pins are about to expire, which pinned hosts nobody reached,
/// and which are being refused.
///
/// Sans-IO: the gate feeds it verdicts; `health(list:…)` judges them against the list in
/// force. The states, worst first:
/// - `refusing`: the host's last verdict was a refusal for its pins (`pin-mismatch`) or
///   for having none (`empty`), or it was let through only because its pins are
///   report-only (`report-only-violation`): enforced, it would be refused;
/// - `expiring`: the pin that carried the last verdict, or the list itself, expires within
///   the warning window, or (for a pin on the leaf certificate's hash) that certificate
///   does: its renewal changes the hash, where an SPKI pin survives a renewal that keeps
///   the key;
/// - `backup-only`: the last verdict came from a pin deeper in the chain (an issuer's key,
///   say) although the host has leaf pins: its leaf no longer matches them, so the rotation
///   has started and the next list should pin the new leaf;
/// - `unseen`: a pinned host no client has reached since the list came in force;
/// - `ok`.
public struct PinHealthBook: Sendable {
    /// A host's health.
    public enum State: String, Sendable, Codable, CaseIterable {
        case ok
        case backupOnly = "backup-only"
        case expiring
        case unseen
        case refusing

        /// The states from the one that needs attention most to `ok`.
        public static let worstFirst: [State] = [.refusing, .expiring, .backupOnly, .unseen, .ok]
    }

    /// One host's health, with why.
    public struct HostHealth: Sendable, Codable, Equatable {
        /// The host name clients asked for (or the pinned pattern, when unseen).
        public var host: String
        /// Its state.
        public var state: State
        /// Why, in words.
        public var why: String
        /// The pin that carried the last trusted verdict (`depth-1 spki …`), if any.
        public var lastPin: String?
        /// When that pin expires.
        public var pinExpires: Date?
        /// When the last verdict was made.
        public var lastVerdict: Date?
    }

    private struct Record {
        var generation: UInt64
        var at: Date
        /// The last trusted verdict's pin, and the leaf's notAfter.
        var pin: PinMatch?
        var leafNotAfter: Date?
        /// Set when the last verdict was a refusal for the host's pins.
        var refusal: DecisionReason?
    }

    /// The days before an expiry that make a host `expiring` (`pin-warning-days`).
    public static let defaultWarningDays = 30
    /// How many hosts are kept: the least recently seen goes first beyond it.
    public static let capacity = 1_000

    private var records: [String: Record] = [:]
    /// The state last announced per host (`announcement`), and when.
    private var announced: [String: (state: State, at: Date)] = [:]

    /// An empty book.
    public init() {}

    /// A trusted verdict for `host` under list `generation`: `pin` matched (nil when no pin
    /// carried it: a host let through unpinned); the leaf certificate's own expiry is
    /// `leafNotAfter`.
    public mutating func trusted(host: String, pin: PinMatch?, leafNotAfter: Date?, generation: UInt64, at now: Date) {
        records[host] = Record(generation: generation, at: now, pin: pin, leafNotAfter: leafNotAfter)
        trim()
    }

    /// A refusal of `host` for `reason` under `list`, or a report-only violation let
    /// through; only verdicts about its pins change its health. An `empty` refusal counts
    /// only for a host the list names (its pins all expired, say): every host an app tries
    /// that was never pinned is refused `empty` too, and is no pinned host's health.
    public mutating func refused(host: String, reason: DecisionReason, list: PinList?, generation: UInt64, at now: Date) {
        switch reason {
        case .pinMismatch, .reportOnlyViolation: break
        case .empty where list?.names(host) == true: break
        default: return
        }
        var record = records[host] ?? Record(generation: generation, at: now)
        record.generation = generation
        record.at = now
        record.refusal = reason
        records[host] = record
        trim()
    }

    private mutating func trim() {
        guard records.count > Self.capacity, let oldest = records.min(by: { $0.value.at < $1.value.at })?.key else { return }
        records[oldest] = nil
    }

    /// Each host's health under `list` (in force since `generation`) at `now`: every host
    /// seen, and every exactly named pinned host not seen since the list came in force.
    public func health(list: PinList?, generation: UInt64, now: Date,
                       warningDays: Int = defaultWarningDays) -> [HostHealth] {
        var result = records.map { host, record in
            Self.judge(host, record, list: list, now: now, warningDays: warningDays)
        }
        // Pinned names nobody reached since this list came in force.
        let seenNow = Set(records.filter { $0.value.generation == generation }.keys)
        for name in Set(list?.entries.filter { $0.isUnexpired(at: now) && !$0.name.contains("*") }.map(\.name) ?? [])
        where !seenNow.contains(name) {
            if let index = result.firstIndex(where: { $0.host == name }) {
                // Seen under an earlier list only: what it was then says little now.
                result[index].state = .unseen
                result[index].why = "not reached since the list in force came in (last seen under an earlier one)"
            } else {
                result.append(HostHealth(host: name, state: .unseen, why: "pinned, and not reached since the list came in force"))
            }
        }
        return result.sorted { $0.host < $1.host }
    }

    /// `host`'s health from its `record` alone (not `unseen`: that needs the generation).
    private static func judge(_ host: String, _ record: Record, list: PinList?, now: Date, warningDays: Int) -> HostHealth {
        // The host's own pins only (a dictionary lookup, and the wildcards): this runs for
        // every CONNECT (`announcement`), and a list may hold thousands of entries.
        let pins = list?.unexpiredEntries(for: host, at: now) ?? []
        let pinExpires = record.pin.flatMap { pin in
            pins.first { $0.fingerprint == pin.fingerprint && $0.kind == pin.kind && $0.depth == pin.depth && $0.name == pin.host }?.expires
        }
        var health = HostHealth(host: host, state: .ok, why: "its leaf matches a pin", lastPin: record.pin?.description,
                                pinExpires: pinExpires, lastVerdict: record.at)
        if let refusal = record.refusal {
            health.state = .refusing
            switch refusal {
            case .empty: health.why = "refused: no unexpired pin for it in the list"
            case .reportOnlyViolation: health.why = "let through only because its pins are report-only: what it presents matches none of them"
            default: health.why = "refused: what it presents matches none of its pins"
            }
        } else if let expiry = nearestWarningExpiry(record, pinExpires: pinExpires, list: list, now: now, warningDays: warningDays) {
            health.state = .expiring
            health.why = "\(expiry.what) expires at \(expiry.date.formatted(.iso8601)), within \(expiry.window)"
        } else if let pin = record.pin, pin.position > 0, pins.contains(where: { $0.depth.isLeaf }) {
            health.state = .backupOnly
            health.why = "trusted only by the depth-\(pin.position) pin: its leaf no longer matches its leaf pins; the rotation has started, and the next list should pin the new leaf"
        } else if record.pin == nil {
            health.why = "let through unpinned by the list's rules"
        }
        return health
    }

    /// The shortest time between two log lines about one host's state.
    public static let announcementInterval: TimeInterval = 600

    /// `host`'s health when it has changed since it was last announced and is worth a log
    /// line now: a first state other than `ok`, or any change, at most once per
    /// `announcementInterval` per host (a host flapping between two states is said once in
    /// a while, not on every CONNECT). Nil otherwise.
    public mutating func announcement(for host: String, list: PinList?, now: Date,
                                      warningDays: Int = defaultWarningDays) -> HostHealth? {
        guard let record = records[host] else { return nil }
        let last = announced[host]
        // Said lately: nothing now, whatever the state (and no judging, which formats a date
        // for an expiring pin: about 18k instructions on every CONNECT; issue 32).
        if let last, now.timeIntervalSince(last.at) < Self.announcementInterval { return nil }
        let health = Self.judge(host, record, list: list, now: now, warningDays: warningDays)
        if let last, last.state == health.state { return nil }
        if last == nil && health.state == .ok { return nil }
        announced[host] = (health.state, now)
        if announced.count > Self.capacity, let oldest = announced.min(by: { $0.value.at < $1.value.at })?.key {
            announced[oldest] = nil
        }
        return health
    }

    /// The nearest expiry the host's last trusted verdict depends on that is inside its
    /// warning window, with the window in words; nil when none is.
    ///
    /// The pin and a hash-pinned leaf warn `warningDays` ahead. The list's own expiry warns
    /// at most half its validity ahead: a list signed for 30 days and re-published on a
    /// schedule (what `pingate sign` makes by default) would otherwise be `expiring` from
    /// the moment it is signed; a list whose next copy is overdue past half its life is
    /// worth the warning.
    private static func nearestWarningExpiry(_ record: Record, pinExpires: Date?, list: PinList?, now: Date,
                                             warningDays: Int) -> (what: String, date: Date, window: String)? {
        let days = TimeInterval(warningDays) * 86_400
        var candidates: [(what: String, date: Date, window: TimeInterval)] = []
        if let expires = pinExpires { candidates.append(("the pin that carries it", expires, days)) }
        if let expires = list?.metadata.expiresAt {
            let validity = list?.metadata.issuedAt.map { expires.timeIntervalSince($0) } ?? .infinity
            candidates.append(("the list", expires, min(days, validity / 2)))
        }
        if let pin = record.pin, pin.position == 0, pin.kind == .certificate, let notAfter = record.leafNotAfter {
            candidates.append(("its leaf certificate (pinned by its hash)", notAfter, days))
        }
        guard let nearest = candidates.filter({ $0.date.timeIntervalSince(now) < $0.window }).min(by: { $0.date < $1.date }) else { return nil }
        let window = nearest.window == days ? "\(warningDays) days" : "half the list's validity (\(Int(nearest.window / 86_400)) days)"
        return (nearest.what, nearest.date, window)
    }

}

/// `PinHealthBook` shared by the event loops that record verdicts and the admin endpoint
/// that reads it.
public final class PinHealthMonitor: Sendable {
    private let book = Mutex(PinHealthBook())
    /// The days before an expiry that make a host `expiring` (`pin-warning-days`).
    public let warningDays: Int

    /// An empty monitor warning `warningDays` ahead of an expiry.
    public init(warningDays: Int = PinHealthBook.defaultWarningDays) {
        self.warningDays = warningDays
    }

    /// See `PinHealthBook.trusted`.
    public func trusted(host: String, pin: PinMatch?, leafNotAfter: Date?, generation: UInt64, at now: Date) {
        book.withLock { $0.trusted(host: host, pin: pin, leafNotAfter: leafNotAfter, generation: generation, at: now) }
    }

    /// See `PinHealthBook.refused`.
    public func refused(host: String, reason: DecisionReason, list: PinList?, generation: UInt64, at now: Date) {
        book.withLock { $0.refused(host: host, reason: reason, list: list, generation: generation, at: now) }
    }

    /// See `PinHealthBook.announcement`.
    public func announcement(for host: String, list: PinList?, now: Date) -> PinHealthBook.HostHealth? {
        book.withLock { $0.announcement(for: host, list: list, now: now, warningDays: warningDays) }
    }

    /// See `PinHealthBook.health`.
    public func health(list: PinList?, generation: UInt64, now: Date) -> [PinHealthBook.HostHealth] {
        book.withLock { $0.health(list: list, generation: generation, now: now, warningDays: warningDays) }
    }
}
