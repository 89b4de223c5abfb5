import Foundation
import PinList
import Testing
@testable import PinGate

/// `PinHealthBook` without a gate: verdicts in, each host's state out (issue 34).
@Suite("Pin health per host")
struct PinHealthTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let day: TimeInterval = 86_400

    /// `api.pingate.test` pinned by its leaf (far expiry unless given) with its issuer as the
    /// depth-1 backup; `spare.pingate.test` pinned only at depth 1.
    static func list(leafExpires: TimeInterval = 200 * day, listExpires: Date? = nil) -> PinList {
        PinList(source: "test", entries: [
            PinEntry(name: "api.pingate.test", fingerprint: "leaf", expires: now + leafExpires),
            PinEntry(name: "api.pingate.test", fingerprint: "issuer", expires: now + 200 * day, depth: .position(1)),
            PinEntry(name: "spare.pingate.test", fingerprint: "issuer", expires: now + 200 * day, depth: .position(1)),
        ], metadata: .init(format: .pingateV2, sequence: 1, expiresAt: listExpires))
    }

    static func match(_ list: PinList, _ host: String, _ fingerprint: String, position: Int) throws -> PinMatch {
        PinMatch(pin: try #require(list.entries.first { $0.name == host && $0.fingerprint == fingerprint }), position: position)
    }

    static func state(_ book: PinHealthBook, _ list: PinList, _ host: String, generation: UInt64 = 1) -> PinHealthBook.HostHealth? {
        book.health(list: list, generation: generation, now: now).first { $0.host == host }
    }

    @Test("trusted by its leaf pin: ok; by the depth-1 backup while it has a leaf pin: backup-only; a host pinned only at depth 1 is ok there")
    func backupOnly() throws {
        let list = Self.list()
        var book = PinHealthBook()
        book.trusted(host: "api.pingate.test", pin: try Self.match(list, "api.pingate.test", "leaf", position: 0),
                     leafNotAfter: Self.now + 90 * Self.day, generation: 1, at: Self.now)
        #expect(Self.state(book, list, "api.pingate.test")?.state == .ok)
        book.trusted(host: "api.pingate.test", pin: try Self.match(list, "api.pingate.test", "issuer", position: 1),
                     leafNotAfter: Self.now + 90 * Self.day, generation: 1, at: Self.now)
        let rotated = try #require(Self.state(book, list, "api.pingate.test"))
        #expect(rotated.state == .backupOnly)
        #expect(rotated.why.contains("depth-1"), "\(rotated.why)")
        book.trusted(host: "spare.pingate.test", pin: try Self.match(list, "spare.pingate.test", "issuer", position: 1),
                     leafNotAfter: nil, generation: 1, at: Self.now)
        #expect(Self.state(book, list, "spare.pingate.test")?.state == .ok)
    }

    @Test("expiring: the pin that carries the verdict, the list, or the pinned leaf certificate itself within the warning window; further out is ok")
    func expiring() throws {
        for (list, leafNotAfter, expected, what) in [
            (Self.list(leafExpires: 10 * Self.day), Self.now + 90 * Self.day, PinHealthBook.State.expiring, "the pin that carries it"),
            (Self.list(listExpires: Self.now + 5 * Self.day), Self.now + 90 * Self.day, .expiring, "the list"),
            (Self.list(), Self.now + 20 * Self.day, .expiring, "its leaf certificate"),
            (Self.list(leafExpires: 40 * Self.day), Self.now + 40 * Self.day, .ok, ""),
        ] {
            var book = PinHealthBook()
            book.trusted(host: "api.pingate.test", pin: try Self.match(list, "api.pingate.test", "leaf", position: 0),
                         leafNotAfter: leafNotAfter, generation: 1, at: Self.now)
            let health = try #require(Self.state(book, list, "api.pingate.test"))
            #expect(health.state == expected, "\(health)")
            if !what.isEmpty { #expect(health.why.contains(what), "\(health.why)") }
        }
    }

    @Test("the list's own expiry warns at most half its validity ahead: a 30-day list signed today is ok, one 5 days from its end (25 days old) is expiring, a year-long list warns 30 days ahead")
    func listHalfLife() throws {
        func listHealth(issuedDaysAgo: Double, expiresInDays: Double) throws -> PinHealthBook.HostHealth {
            let base = Self.list()
            let list = PinList(source: "test", entries: base.entries,
                               metadata: .init(format: .pingateV2, sequence: 1, issuedAt: Self.now - issuedDaysAgo * Self.day,
                                               expiresAt: Self.now + expiresInDays * Self.day))
            var book = PinHealthBook()
            book.trusted(host: "api.pingate.test", pin: try Self.match(list, "api.pingate.test", "leaf", position: 0),
                         leafNotAfter: Self.now + 90 * Self.day, generation: 1, at: Self.now)
            return try #require(Self.state(book, list, "api.pingate.test"))
        }
        #expect(try listHealth(issuedDaysAgo: 0, expiresInDays: 30).state == .ok)
        #expect(try listHealth(issuedDaysAgo: 14, expiresInDays: 16).state == .ok)
        let late = try listHealth(issuedDaysAgo: 25, expiresInDays: 5)
        #expect(late.state == .expiring)
        #expect(late.why.contains("the list expires at") && late.why.contains("within half the list's validity (15 days)"), "\(late.why)")
        #expect(try listHealth(issuedDaysAgo: 300, expiresInDays: 35).state == .ok)
        let yearLong = try listHealth(issuedDaysAgo: 340, expiresInDays: 25)
        #expect(yearLong.state == .expiring && yearLong.why.contains("within 30 days"), "\(yearLong.why)")
    }

    @Test("pin-warning-days sets the window: a pin 10 days from expiry is expiring at 30 and 11 days, ok at 10, 5 and 0; the log line and /status agree", arguments: [(30, true), (11, true), (10, false), (5, false), (0, false)])
    func warningDays(days: Int, expiring: Bool) throws {
        let list = Self.list(leafExpires: 10 * Self.day)
        let monitor = PinHealthMonitor(warningDays: days)
        monitor.trusted(host: "api.pingate.test", pin: try Self.match(list, "api.pingate.test", "leaf", position: 0),
                        leafNotAfter: Self.now + 90 * Self.day, generation: 1, at: Self.now)
        let health = try #require(monitor.health(list: list, generation: 1, now: Self.now).first { $0.host == "api.pingate.test" })
        #expect(health.state == (expiring ? .expiring : .ok), "\(health)")
        if expiring { #expect(health.why.contains("within \(days) days"), "\(health.why)") }
        #expect(monitor.announcement(for: "api.pingate.test", list: list, now: Self.now)?.state == (expiring ? .expiring : nil))
    }

    @Test("refusing after a pin-mismatch, or an empty refusal of a host the list names, until a trusted verdict; an empty refusal of a host never pinned, and other refusals (the upstream unreachable), say nothing of the pins")
    func refusing() throws {
        let list = Self.list()
        var book = PinHealthBook()
        book.refused(host: "api.pingate.test", reason: .upstreamUnreachable, list: list, generation: 1, at: Self.now)
        #expect(Self.state(book, list, "api.pingate.test")?.state == .unseen)
        book.refused(host: "api.pingate.test", reason: .pinMismatch, list: list, generation: 1, at: Self.now)
        #expect(Self.state(book, list, "api.pingate.test")?.state == .refusing)
        book.trusted(host: "api.pingate.test", pin: try Self.match(list, "api.pingate.test", "leaf", position: 0),
                     leafNotAfter: Self.now + 90 * Self.day, generation: 1, at: Self.now)
        #expect(Self.state(book, list, "api.pingate.test")?.state == .ok)
        // `empty` for a host the list names, whose pins have all expired: refusing. For a
        // host it never named (anything an app tries): nothing, it is no pinned host.
        let expired = PinList(source: "test", entries: list.entries + [
            PinEntry(name: "gone.pingate.test", fingerprint: "old", expires: Self.now - Self.day),
        ], metadata: list.metadata)
        book.refused(host: "gone.pingate.test", reason: .empty, list: expired, generation: 1, at: Self.now)
        #expect(Self.state(book, expired, "gone.pingate.test")?.state == .refusing)
        book.refused(host: "telemetry.elsewhere.test", reason: .empty, list: expired, generation: 1, at: Self.now)
        #expect(Self.state(book, expired, "telemetry.elsewhere.test") == nil)
        #expect(book.announcement(for: "telemetry.elsewhere.test", list: expired, now: Self.now) == nil)
        // Let through under report-only pins that do not match: enforced, it would be refused.
        book.refused(host: "api.pingate.test", reason: .reportOnlyViolation, list: list, generation: 1, at: Self.now)
        let violated = try #require(Self.state(book, list, "api.pingate.test"))
        #expect(violated.state == .refusing)
        #expect(violated.why.contains("report-only"), "\(violated.why)")
    }

    @Test("a log line when a host's state changes: not for a first ok, at once for a first state worth a warning, not again while it stays, and a change back at most once per interval")
    func announcements() throws {
        let list = Self.list()
        var book = PinHealthBook()
        let leaf = try Self.match(list, "api.pingate.test", "leaf", position: 0)
        let issuer = try Self.match(list, "api.pingate.test", "issuer", position: 1)
        book.trusted(host: "api.pingate.test", pin: leaf, leafNotAfter: nil, generation: 1, at: Self.now)
        #expect(book.announcement(for: "api.pingate.test", list: list, now: Self.now) == nil)
        book.trusted(host: "api.pingate.test", pin: issuer, leafNotAfter: nil, generation: 1, at: Self.now)
        #expect(book.announcement(for: "api.pingate.test", list: list, now: Self.now)?.state == .backupOnly)
        #expect(book.announcement(for: "api.pingate.test", list: list, now: Self.now + 1) == nil)
        book.trusted(host: "api.pingate.test", pin: leaf, leafNotAfter: nil, generation: 1, at: Self.now + 2)
        #expect(book.announcement(for: "api.pingate.test", list: list, now: Self.now + 2) == nil, "within the interval")
        let later = Self.now + PinHealthBook.announcementInterval + 1
        #expect(book.announcement(for: "api.pingate.test", list: list, now: later)?.state == .ok)
        #expect(book.announcement(for: "nobody.pingate.test", list: list, now: later) == nil)
    }

    @Test("unseen: every pinned name no client reached since the list came in force, including one seen only under an earlier list")
    func unseen() throws {
        let list = Self.list()
        var book = PinHealthBook()
        #expect(book.health(list: list, generation: 1, now: Self.now).map(\.host) == ["api.pingate.test", "spare.pingate.test"])
        #expect(book.health(list: list, generation: 1, now: Self.now).allSatisfy { $0.state == .unseen })
        book.trusted(host: "api.pingate.test", pin: try Self.match(list, "api.pingate.test", "leaf", position: 0),
                     leafNotAfter: Self.now + 90 * Self.day, generation: 1, at: Self.now)
        #expect(Self.state(book, list, "api.pingate.test")?.state == .ok)
        // A new list (generation 2): seen before it only.
        #expect(Self.state(book, list, "api.pingate.test", generation: 2)?.state == .unseen)
    }
}
