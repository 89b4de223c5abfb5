import Foundation
import Testing
@testable import PinList

/// The Wultra refresh rule and the retry backoff, at fixed times.
@Suite("Update schedule")
struct UpdateScheduleTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let day: TimeInterval = 86400

    static func list(expiringIn days: [Double], listExpiresIn: Double? = nil) -> PinList {
        PinList(source: "t", entries: days.enumerated().map { index, days in
            PinEntry(name: "h\(index).test", fingerprint: "x", expires: now.addingTimeInterval(days * day))
        }, metadata: .init(format: .pingateV2, expiresAt: listExpiresIn.map { now.addingTimeInterval($0 * day) }))
    }

    @Test("far from expiry: the periodic interval (7 days)")
    func periodic() {
        #expect(UpdateSchedule().delay(after: Self.list(expiringIn: [100, 200]), now: Self.now) == 7 * Self.day)
    }

    @Test("inside the 14-day threshold: an eighth of the time left")
    func threshold() {
        #expect(UpdateSchedule().delay(after: Self.list(expiringIn: [8, 100]), now: Self.now) == Self.day)
    }

    @Test("each name's newest pin counts: an old pin next to a fresh one does not hurry updates")
    func newestPerName() {
        let list = PinList(source: "t", entries: [
            PinEntry(name: "a.test", fingerprint: "old", expires: Self.now.addingTimeInterval(1 * Self.day)),
            PinEntry(name: "a.test", fingerprint: "new", expires: Self.now.addingTimeInterval(100 * Self.day)),
        ])
        #expect(UpdateSchedule().delay(after: list, now: Self.now) == 7 * Self.day)
    }

    @Test("a v2 list's own expiry counts; past expiry the minimum interval applies")
    func listExpiryAndFloor() {
        #expect(UpdateSchedule().delay(after: Self.list(expiringIn: [100], listExpiresIn: 4), now: Self.now) == 0.5 * Self.day)
        #expect(UpdateSchedule(minimumInterval: 60).delay(after: Self.list(expiringIn: [-1]), now: Self.now) == 60)
        #expect(UpdateSchedule(minimumInterval: 60).delay(after: nil, now: Self.now) == 60)
    }

    @Test("retries back off exponentially with jitter, capped")
    func backoff() {
        #expect(UpdateSchedule.retryDelay(failures: 1, base: 5, maximum: 3600, jitter: 1) == 5)
        #expect(UpdateSchedule.retryDelay(failures: 4, base: 5, maximum: 3600, jitter: 1) == 40)
        #expect(UpdateSchedule.retryDelay(failures: 40, base: 5, maximum: 3600, jitter: 1) == 3600)
        #expect(UpdateSchedule.retryDelay(failures: 4, base: 5, maximum: 3600, jitter: 0.5) == 20)
        let jittered = UpdateSchedule.retryDelay(failures: 2, base: 5, maximum: 3600)
        #expect(jittered >= 5 && jittered <= 10)
    }
}
