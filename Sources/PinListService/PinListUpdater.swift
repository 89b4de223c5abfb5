import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import PinGateNIO
import PinGateTLS
import PinList
import ServiceLifecycle
import Synchronization

/// Where the list comes from and how it is checked and refreshed.
public struct PinListSource: Sendable {
    /// A local file or an `https://` URL.
    public enum Location: Sendable, Equatable {
        case file(String)
        case url(URL)
    }

    /// Where to read the list.
    public var location: Location
    /// The format; nil detects Wultra static or pingate v2 (dynamic needs saying).
    public var format: PinListFormat?
    /// Keys that may have signed it.
    public var keys: [PublicKey]
    /// Wultra dynamic: the `appName` query parameter.
    public var appName: String = "pingate"
    /// Roots the list server's chain must reach.
    public var serverTrust: TrustRoots = .system
    /// Optional pins (base64 SHA-256 of certificate or SPKI) on the list server itself.
    public var serverPins: Set<String> = []
    /// The refresh rule.
    public var schedule = UpdateSchedule()
    /// First retry delay after a failure (doubles per failure, with jitter).
    public var retryBase: TimeInterval = 5
    /// Longest retry delay.
    public var retryMaximum: TimeInterval = 3600
    /// How long one fetch may take.
    public var fetchTimeout: TimeAmount = .seconds(15)
    /// How long a CONNECT waits for a list when none is usable (then 503 list-unavailable).
    public var directWait: TimeAmount = .seconds(10)
    /// The largest list accepted.
    public var maximumBytes = 4 << 20
    /// A bundled list used only when nothing better (persisted or fetched) is available.
    public var fallbackFile: String?

    /// Creates a source.
    public init(location: Location, format: PinListFormat? = nil, keys: [PublicKey]) {
        self.location = location
        self.format = format
        self.keys = keys
    }

    /// Parses a `--pins` value: an `https://` URL or a file path.
    public static func location(parsing text: String) -> Location {
        if text.lowercased().hasPrefix("https://"), let url = URL(string: text) { return .url(url) }
        return .file(text)
    }

    var description: String {
        switch location {
        case .file(let path): return path
        case .url(let url): return url.absoluteString
        }
    }
}

/// Keeps the list in force fresh: loads the persisted list at start (verified again),
/// fetches at once when nothing usable is in force (direct mode), then on the Wultra
/// schedule (silent mode); retries failures with backoff. Its fetch state lives on one
/// event loop; file reads, verification and the fsync of persisting run on a thread
/// pool, never on that loop.
///
/// As a `Service`, `run()` is the silent schedule: while it runs, a timer on the event loop
/// starts each update when it is due; it ends on graceful shutdown. Without `run()` nothing
/// is fetched on a schedule (direct updates and `updateNow()` still work).
public final class PinListUpdater: Service, Sendable {
    /// The outcome of one update attempt.
    public enum Outcome: Sendable, Equatable {
        case installed(sequence: Int64?)
        case rejected(PinListRejection)
    }

    private struct State {
        var inFlight: EventLoopFuture<Outcome>?
        var failuresInRow = 0
        var lastDirectRequest: Date?
    }

    /// When the next silent update is due, and the timer that starts it. The timer runs on
    /// the updater's event loop, not on Swift's cooperative pool: with the pool busy (two
    /// cores and a test suite, or a host under load), a sleeping task woke seconds late, and
    /// the schedule with it (issue 33, item 11: one list request in 10 s on a 0.2 s schedule).
    private struct Schedule {
        var nextUpdate: Date?
        var timer: Scheduled<Void>?
        /// `run()` is under way: only then does the timer start updates.
        var running = false
        var stopped = false
        /// `run()` waiting for the end.
        var end: CheckedContinuation<Void, Never>?
    }

    /// The longest single wait of the timer: it runs on the monotonic clock, which stands
    /// still while the host sleeps, so the wall clock is checked again at least this often.
    private static let longestTimerWait: TimeInterval = 3600

    private let source: PinListSource
    private let store: PinListStore
    private let persistence: PinListPersistence?
    private let client: HTTPSClient
    private let eventLoop: EventLoop
    private let logger: Logger
    private let now: @Sendable () -> Date
    private let state: NIOLoopBoundBox<State>
    private let schedule = Mutex(Schedule())
    private let threadPool: NIOThreadPool

    /// An updater for `source` that installs into `store`, persists with `persistence`, and
    /// fetches through `connector`; its fetch state lives on `eventLoop`, its blocking
    /// file work runs on `threadPool`.
    public init(source: PinListSource, store: PinListStore, persistence: PinListPersistence?, connector: TLSClientConnector,
         eventLoop: EventLoop, threadPool: NIOThreadPool = .singleton, logger: Logger, now: @escaping @Sendable () -> Date) {
        self.source = source
        self.store = store
        self.persistence = persistence
        self.client = HTTPSClient(connector: connector, serverPins: source.serverPins,
                                       timeout: source.fetchTimeout, maximumBodyBytes: source.maximumBytes)
        self.eventLoop = eventLoop
        self.threadPool = threadPool
        self.logger = logger
        self.now = now
        self.state = NIOLoopBoundBox.makeBoxSendingValue(State(), eventLoop: eventLoop)
    }

    /// How long a CONNECT should wait for a list when none is usable.
    public var directWait: TimeAmount { source.directWait }

    /// When the next scheduled update is due.
    public var nextUpdate: EventLoopFuture<Date?> {
        eventLoop.makeSucceededFuture(schedule.withLock { $0.nextUpdate })
    }

    /// Loads what is persisted (or the fallback), then updates at once if that is not
    /// usable (direct mode), else schedules the next silent update. Completes when the
    /// direct update has finished, or after `directWait` if it is still running.
    public func start() -> EventLoopFuture<Void> {
        threadPool.runIfActive(eventLoop: eventLoop) {
            self.loadPersistedOrFallback()
        }.flatMap {
            guard !self.store.isUsable(at: self.now()) else {
                self.scheduleNext(after: nil)
                return self.eventLoop.makeSucceededVoidFuture()
            }
            let started = self.eventLoop.makePromise(of: Void.self)
            let deadline = self.eventLoop.scheduleTask(in: self.source.directWait) { started.succeed(()) }
            self.updateNow().whenComplete { _ in
                deadline.cancel()
                started.succeed(())
            }
            return started.futureResult
        }
    }

    /// Stops scheduling further updates (and ends `run()`).
    public func stop() {
        let (timer, end) = schedule.withLock { schedule -> (Scheduled<Void>?, CheckedContinuation<Void, Never>?) in
            schedule.stopped = true
            schedule.running = false
            let ending = (schedule.timer, schedule.end)
            schedule.timer = nil
            schedule.end = nil
            return ending
        }
        timer?.cancel()
        end?.resume()
    }

    /// The silent schedule: from now on the timer starts each update when it is due, and
    /// each update sets the next due date. Returns on graceful shutdown, on cancellation,
    /// or after `stop()`.
    public func run() async throws {
        let started = schedule.withLock { schedule -> Bool in
            // Stopped, or already running (a second run() would take the first one's place
            // as the one stop() ends, and the first would never return).
            guard !schedule.stopped, !schedule.running else { return false }
            schedule.running = true
            if let due = schedule.nextUpdate {
                schedule.timer?.cancel()
                schedule.timer = armTimer(for: due)
            }
            return true
        }
        guard started else { return }
        await withGracefulShutdownHandler {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    // stop() may have come first (a cancellation before this point).
                    let endsNow = schedule.withLock { schedule -> Bool in
                        guard !schedule.stopped else { return true }
                        schedule.end = continuation
                        return false
                    }
                    if endsNow { continuation.resume() }
                }
            } onCancel: {
                self.stop()
            }
        } onGracefulShutdown: {
            self.stop()
        }
    }

    /// A timer on the event loop towards `due`, at most `longestTimerWait` away. Called
    /// with the schedule locked; scheduling a task on a loop calls nothing back at once.
    private func armTimer(for due: Date) -> Scheduled<Void> {
        let seconds = min(max(0, due.timeIntervalSince(now())), Self.longestTimerWait)
        return eventLoop.scheduleTask(in: .nanoseconds(Int64(seconds * 1e9))) { self.timerFired(due: due) }
    }

    private func timerFired(due: Date) {
        let fire = schedule.withLock { schedule -> Bool in
            // A timer that lost a race with a newer due date, or with stop(), does nothing.
            guard schedule.running, !schedule.stopped, schedule.nextUpdate == due else { return false }
            guard now() >= due else {
                // Woken by the longest wait, or early by the wall clock: wait the rest.
                schedule.timer = armTimer(for: due)
                return false
            }
            schedule.nextUpdate = nil
            schedule.timer = nil
            return true
        }
        if fire { _ = updateNow() }
    }

    /// A CONNECT found no usable list: fetch now, unless a direct fetch was started within
    /// the last second. Many waiting CONNECTs share one fetch, and a list server that is
    /// down is not hammered by the gate's own traffic.
    public func requestDirectUpdate() {
        eventLoop.execute {
            let now = self.now()
            if let last = self.state.value.lastDirectRequest, now.timeIntervalSince(last) < 1 { return }
            self.state.value.lastDirectRequest = now
            _ = self.updateNow()
        }
    }

    /// Fetches and installs now, joining an update already under way.
    public func updateNow() -> EventLoopFuture<Outcome> {
        eventLoop.flatSubmit {
            if let running = self.state.value.inFlight { return running }
            let attempt = self.fetchAndInstall()
            self.state.value.inFlight = attempt
            attempt.whenComplete { result in
                self.state.value.inFlight = nil
                if case .success(let outcome) = result { self.scheduleNext(after: outcome) }
            }
            return attempt
        }
    }

    // MARK: steps

    private func loadPersistedOrFallback() {
        // A local file was read and weighed against the persisted list before the gate
        // started (`PinsFileStartup`): loading the persisted list again here would undo
        // that choice, which is how an old persisted list used to override `--pins`.
        if let persistence, case .url = source.location {
            do {
                if let (document, _) = try persistence.load(keys: source.keys) {
                    let provenance = ListProvenance(.persisted, "persisted in \(persistence.path) by an earlier run "
                        + "(from \(document.source), received \(InternetTime.text(document.receivedAt))); "
                        + "the list server replaces it when it answers with a newer list")
                    let result = store.install(document, keys: source.keys, persistence: nil, now: now(), provenance: provenance)
                    log(result)
                }
            } catch {
                store.recordFailure(.invalid(error as? PinListError ?? .malformed("\(error)")), at: now())
                logger.error("persisted fingerprint list rejected", metadata: ["path": "\(persistence.path)", "error": "\(error)"])
            }
        }
        if !store.isUsable(at: now()), let fallback = source.fallbackFile {
            do {
                let document = try SignedListDocument.read(file: fallback, format: source.format, receivedAt: now())
                let provenance = ListProvenance(.fallback, "the bundled fallback \(fallback): no usable list was persisted, "
                    + "and the list server has not answered yet")
                let result = store.install(document, keys: source.keys, persistence: nil, now: now(), provenance: provenance)
                log(result)
            } catch {
                logger.error("fallback fingerprint list unreadable", metadata: ["path": "\(fallback)", "error": "\(error)"])
            }
        }
    }

    private func fetchAndInstall() -> EventLoopFuture<Outcome> {
        fetchDocument().flatMap { document in
            // Verification and the fsync of persisting block: off the event loop.
            self.threadPool.runIfActive(eventLoop: self.eventLoop) {
                // A challenge on a fetched document is the one fetchDynamic just sent.
                self.store.install(document, keys: self.source.keys, persistence: self.persistence, now: self.now(),
                                   provenance: self.provenance(of: document), answersFreshChallenge: self.isFreshDynamicFetch(document))
            }
        }.map { result in
            self.log(result)
            switch result {
            case .success(let list): return .installed(sequence: list.metadata.sequence)
            case .failure(let rejection): return .rejected(rejection)
            }
        }.flatMapErrorThrowing { error in
            let rejection = Self.rejection(for: error)
            self.store.recordFailure(rejection, at: self.now())
            self.logger.warning("fingerprint list update failed; the list in force stays", metadata: [
                "source": "\(self.source.description)", "result": "\(rejection.token)", "error": "\(rejection)",
            ])
            return .rejected(rejection)
        }
    }

    private func fetchDocument() -> EventLoopFuture<SignedListDocument> {
        switch source.location {
        case .file(let path):
            return threadPool.runIfActive(eventLoop: eventLoop) {
                do {
                    return try SignedListDocument.read(file: path, format: self.source.format, receivedAt: self.now())
                } catch {
                    throw PinListRejection.networkError("\(error)")
                }
            }
        case .url(let url):
            if source.format == .wultraDynamic {
                return fetchDynamic(url)
            }
            return client.get(url, headers: [], on: eventLoop).flatMapThrowing { response in
                guard (200..<300).contains(response.status) else { throw PinListRejection.serverError(status: response.status) }
                return SignedListDocument(format: self.source.format ?? SignedListDocument.detectFormat(response.body),
                                          source: url.absoluteString, body: response.body, receivedAt: self.now())
            }
        }
    }

    /// True for a document `fetchDynamic` just received: a URL source in the dynamic format
    /// whose document carries the challenge sent with the request.
    private func isFreshDynamicFetch(_ document: SignedListDocument) -> Bool {
        guard case .url = source.location, source.format == .wultraDynamic else { return false }
        return document.format == .wultraDynamic && document.challenge != nil
    }

    /// Wultra dynamic: `GET <service>/app/init?appName=…` with a fresh challenge; the
    /// signature header is read case-insensitively.
    private func fetchDynamic(_ serviceURL: URL) -> EventLoopFuture<SignedListDocument> {
        let challenge = WultraDynamicList.makeChallenge()
        var components = URLComponents(url: serviceURL.appendingPathComponent("app/init"), resolvingAgainstBaseURL: false)
        components?.queryItems = [URLQueryItem(name: "appName", value: source.appName)]
        guard let url = components?.url else {
            return eventLoop.makeFailedFuture(PinListRejection.networkError("bad service URL \(serviceURL)"))
        }
        return client.get(url, headers: [(WultraDynamicList.challengeHeader, challenge)], on: eventLoop).flatMapThrowing { response in
            guard (200..<300).contains(response.status) else { throw PinListRejection.serverError(status: response.status) }
            guard let signature = response.headers.first(name: WultraDynamicList.signatureHeader) else {
                throw PinListRejection.invalid(.badSignature("dynamic response (no \(WultraDynamicList.signatureHeader) header)"))
            }
            return SignedListDocument(format: .wultraDynamic, source: url.absoluteString, body: response.body,
                                      challenge: challenge, signature: signature, receivedAt: self.now())
        }
    }

    /// What a failed fetch means for the list: transport failures are network errors,
    /// except a timeout and an oversized body, which have their own results.
    private static func rejection(for error: Error) -> PinListRejection {
        switch error {
        case let rejection as PinListRejection: return rejection
        case HTTPSClientError.timedOut, HTTPSClientError.connection(.timedOut): return .timeout
        case HTTPSClientError.bodyTooLarge(let limit): return .invalid(.malformed("the list is larger than \(limit) bytes"))
        case let failure as HTTPSClientError: return .networkError(failure.description)
        default: return .networkError("\(error)")
        }
    }

    private func scheduleNext(after outcome: Outcome?) {
        let delay: TimeInterval
        switch outcome {
        case .rejected?:
            state.value.failuresInRow += 1
            delay = UpdateSchedule.retryDelay(failures: state.value.failuresInRow, base: source.retryBase, maximum: source.retryMaximum)
        case .installed?, nil:
            state.value.failuresInRow = 0
            delay = source.schedule.delay(after: store.list, now: now())
        }
        let due = now().addingTimeInterval(delay)
        let replaced = schedule.withLock { schedule -> Scheduled<Void>? in
            guard !schedule.stopped else { return nil }
            schedule.nextUpdate = due
            let replaced = schedule.timer
            schedule.timer = schedule.running ? armTimer(for: due) : nil
            return replaced
        }
        replaced?.cancel()
    }

    /// Why a list this updater fetched or re-read is in force.
    private func provenance(of document: SignedListDocument) -> ListProvenance {
        let received = InternetTime.text(document.receivedAt)
        switch source.location {
        case .file(let path): return ListProvenance(.pinsFile, "the --pins file \(path), re-read at \(received)")
        case .url(let url): return ListProvenance(.fetched, "fetched from \(url.absoluteString) at \(received)")
        }
    }

    private func log(_ result: Result<PinList, PinListRejection>) {
        switch result {
        case .success(let list):
            let provenance = store.provenance
            // The bundled fallback is worth noticing: the real list has not arrived.
            logger.log(level: provenance?.origin == .fallback ? .notice : .info, "fingerprint list in force", metadata: [
                "origin": "\(provenance?.origin.rawValue ?? "-")", "why": "\(provenance?.reason ?? "-")", "format": "\(list.metadata.format.rawValue)",
                "sequence": "\(list.metadata.sequence.map(String.init) ?? "-")", "entries": "\(list.entries.count)",
            ])
        case .failure(let rejection):
            logger.warning("fingerprint list rejected; the list in force stays", metadata: [
                "source": "\(source.description)", "result": "\(rejection.token)", "error": "\(rejection)",
            ])
        }
    }
}
