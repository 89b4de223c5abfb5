import Foundation
import NIOCore
import PinGateTLS
import PinList
import Synchronization

/// The fingerprint list in force, shared by every connection. Readers take a snapshot;
/// an update replaces the whole list at once, so no connection ever sees half of one.
/// A rejected update never touches the list in force.
public final class PinListStore: Sendable {
    /// What the store reports about its lifecycle.
    public struct Status: Sendable, Equatable {
        /// When the last update attempt finished.
        public var lastUpdate: Date?
        /// Its result token ("ok", "unchanged", "rollback", …).
        public var lastResult: String?
        /// Update attempts by result token.
        public var updatesByResult: [String: Int] = [:]
    }

    private struct State {
        var list: PinList?
        var generation: UInt64 = 1
        var document: SignedListDocument?
        var provenance: ListProvenance?
        var status = Status()
        var waiters: [(EventLoopPromise<Bool>, Scheduled<Void>?)] = []
        var observers: [@Sendable (PinList) -> Void] = []
        var resultObservers: [@Sendable (String) -> Void] = []
    }

    private let state: Mutex<State>

    /// A store holding `list` (nil: no usable list yet).
    public init(_ list: PinList?) {
        state = Mutex(State(list: list))
    }

    /// The list in force now.
    public var list: PinList? { state.withLock { $0.list } }

    /// Which list is in force: a number that changes each time a list is put in force
    /// (an update, a revocation, a replacement), so that something decided under one list
    /// (a pooled upstream connection's verdict) can tell it was decided under another.
    public var generation: UInt64 { state.withLock { $0.generation } }

    /// Why the list in force is in force (nil: none is).
    public var provenance: ListProvenance? { state.withLock { $0.list == nil ? nil : $0.provenance } }

    /// Update counters and the last result.
    public var status: Status { state.withLock { $0.status } }

    /// True when a fresh list with at least one unexpired pin is in force.
    public func isUsable(at now: Date) -> Bool {
        state.withLock { $0.list?.isUsable(at: now) ?? false }
    }

    /// Puts `list` in force unconditionally (start-up from a local file, tests).
    public func replace(with list: PinList?) {
        let observers = state.withLock { state -> [@Sendable (PinList) -> Void] in
            state.list = list
            state.provenance = ListProvenance(.replaced, "put in force by hand")
            state.generation += 1
            return state.observers
        }
        if let list { observers.forEach { $0(list) } }
        resolveWaiters()
    }

    /// Verifies `document`, checks it may replace the list in force (no rollback, not
    /// expired), persists it, then puts it in force. On any failure the list in force
    /// stays as it was, and the failure is counted.
    ///
    /// `provenance` says why the list is in force if it is put in force (or confirmed
    /// unchanged: a fetch that returns the persisted bytes makes them a fetched list).
    ///
    /// `answersFreshChallenge` is true only for a Wultra dynamic answer to the challenge
    /// this process just sent. Only then are its domain rules (`domainsConfig`, a bypass
    /// list) put in force: a persisted answer verifies with an old challenge anyone may
    /// replay, and a file or fallback has no challenge at all, so theirs are dropped.
    ///
    /// `allowingExpired` puts an expired list in force too (the `--pins` file at start-up:
    /// `PinListAcceptance.check`).
    @discardableResult
    public func install(_ document: SignedListDocument, keys: [PublicKey], persistence: PinListPersistence?, now: Date,
                        provenance: ListProvenance, answersFreshChallenge: Bool = false,
                        allowingExpired: Bool = false) -> Result<PinList, PinListRejection> {
        let candidate: PinList
        do {
            let verified = try document.verify(keys: keys)
            candidate = answersFreshChallenge && document.format == .wultraDynamic ? verified : verified.withoutDomainRules()
            try PinListAcceptance.check(candidate, replacing: list, now: now, allowingExpired: allowingExpired)
        } catch let rejection as PinListRejection {
            record(rejection.token, at: now)
            return .failure(rejection)
        } catch let error as PinListError {
            record(error.token, at: now)
            return .failure(.invalid(error))
        } catch {
            record("invalid-data", at: now)
            return .failure(.invalid(.malformed("\(error)")))
        }
        // The same bytes are unchanged only if they also give the same domain rules: the
        // persisted answer loaded at start-up had its rules dropped, and the first fresh
        // answer with the same body must put them back in force.
        let unchanged = state.withLock { state -> Bool in
            guard state.document?.body == document.body && state.document?.format == document.format
                && state.list?.domainRules == candidate.domainRules else { return false }
            state.provenance = provenance
            return true
        }
        if unchanged {
            record("unchanged", at: now)
            return .success(candidate)
        }
        do {
            try persistence?.save(document)
        } catch {
            // Not persisted means not safe across a restart, but the list itself is
            // good: put it in force and say so.
            record("persist-failed", at: now)
        }
        let observers = state.withLock { state -> [@Sendable (PinList) -> Void] in
            state.list = candidate
            state.document = document
            state.provenance = provenance
            state.generation += 1
            return state.observers
        }
        record("ok", at: now)
        observers.forEach { $0(candidate) }
        resolveWaiters()
        return .success(candidate)
    }

    /// Counts a failed attempt that never produced a document (network, server, timeout).
    public func recordFailure(_ rejection: PinListRejection, at now: Date) {
        record(rejection.token, at: now)
    }

    /// Calls `observer` with every list put in force from now on (e.g. to close tunnels
    /// whose pin was revoked).
    public func onInstall(_ observer: @escaping @Sendable (PinList) -> Void) {
        state.withLock { $0.observers.append(observer) }
    }

    /// Calls `observer` with the result token of every update attempt from now on.
    public func onResult(_ observer: @escaping @Sendable (String) -> Void) {
        state.withLock { $0.resultObservers.append(observer) }
    }

    /// Succeeds with true as soon as a usable list is in force, or false after `timeout`.
    public func waitForUsableList(on eventLoop: EventLoop, timeout: TimeAmount, now: @escaping @Sendable () -> Date) -> EventLoopFuture<Bool> {
        if isUsable(at: now()) { return eventLoop.makeSucceededFuture(true) }
        let promise = eventLoop.makePromise(of: Bool.self)
        let timer = eventLoop.scheduleTask(in: timeout) { promise.succeed(false) }
        state.withLock { $0.waiters.append((promise, timer)) }
        // A list may have arrived between the check and the registration.
        if isUsable(at: now()) { resolveWaiters() }
        return promise.futureResult
    }

    private func resolveWaiters() {
        let waiters = state.withLock { state -> [(EventLoopPromise<Bool>, Scheduled<Void>?)] in
            defer { state.waiters = [] }
            return state.waiters
        }
        for (promise, timer) in waiters {
            timer?.cancel()
            promise.succeed(true)
        }
    }

    private func record(_ result: String, at now: Date) {
        let observers = state.withLock { state -> [@Sendable (String) -> Void] in
            state.status.lastUpdate = now
            state.status.lastResult = result
            state.status.updatesByResult[result, default: 0] += 1
            return state.resultObservers
        }
        observers.forEach { $0(result) }
    }
}
