import Foundation
import Logging
import PinGateNIO
import PinGateStateFiles
import PinGateTLS
import PinList
import Synchronization

/// One certificate of a chain the gate saw in learn mode.
public struct ObservedCertificate: Codable, Sendable, Equatable {
    /// base64 SHA-256 of the certificate DER.
    public var sha256: String
    /// base64 SHA-256 of its SubjectPublicKeyInfo DER.
    public var spki: String
    /// Its subject, one line (`/CN=…`).
    public var subject: String
    /// When it expires.
    public var notAfter: Date?

    /// The observation of `certificate`.
    public init(_ certificate: Certificate) {
        self.init(sha256: certificate.sha256Fingerprint, spki: certificate.spkiSHA256,
                  subject: certificate.subjectDescription, notAfter: certificate.notAfter)
    }

    /// An observation from its parts (tests, files).
    public init(sha256: String, spki: String, subject: String, notAfter: Date?) {
        self.sha256 = sha256
        self.spki = spki
        self.subject = subject
        self.notAfter = notAfter
    }
}

/// The pin that carried a verdict on an observed chain (while enforcing).
public struct ObservedPinMatch: Codable, Sendable, Equatable {
    /// The pin's host pattern, as the list names it.
    public var pattern: String
    /// The position in the validated chain whose hash matched (0 is the leaf).
    public var position: Int
    /// The depth the pin named (`any` matches at `position`).
    public var depth: PinEntry.Depth
    /// `spki` or `sha256`.
    public var kind: String
    /// The matched fingerprint.
    public var fingerprint: String
    /// True when a pin deeper than the leaf carried it although the host has leaf pins:
    /// the leaf no longer matches them (pin health's `backup-only`).
    public var backup: Bool

    /// The observation of `match`; `backup` as pin health judges it.
    public init(_ match: PinMatch, backup: Bool) {
        pattern = match.host
        position = match.position
        depth = match.depth
        kind = match.kind.rawValue
        fingerprint = match.fingerprint
        self.backup = backup
    }
}

/// One validated chain a host presented, and when and how often it was seen.
public struct ObservedChain: Codable, Sendable, Equatable {
    /// The chain OpenSSL validated, leaf first and the trust anchor last (never what the
    /// server merely sent: positions are what depth pins count).
    public var chain: [ObservedCertificate]
    /// The application protocol agreed upstream (`h2`, `http/1.1`), if any.
    public var alpn: String?
    /// The first time it was seen.
    public var firstSeen: Date
    /// The last time it was seen.
    public var lastSeen: Date
    /// How many tunnels it carried.
    public var count: Int
    /// The pin that carried the last verdict on it, while enforcing (absent in learn mode,
    /// and for a host let through unpinned).
    public var matched: ObservedPinMatch?
    /// The earliest `notAfter` of its certificates: when the chain as a whole stops
    /// validating.
    public var earliestNotAfter: Date?

    /// A chain first seen at `time`.
    public init(chain: [ObservedCertificate], alpn: String?, firstSeen: Date, lastSeen: Date, count: Int,
                matched: ObservedPinMatch? = nil) {
        self.chain = chain
        self.alpn = alpn
        self.firstSeen = firstSeen
        self.lastSeen = lastSeen
        self.count = count
        self.matched = matched
        earliestNotAfter = chain.compactMap(\.notAfter).min()
    }
}

/// Everything seen for one `host:port`: one entry per distinct leaf, oldest first.
public struct ObservedHost: Codable, Sendable, Equatable {
    /// The CONNECT host, lower case.
    public var host: String
    /// The CONNECT port.
    public var port: Int
    /// The chains seen, one per leaf certificate.
    public var chains: [ObservedChain]

    /// The chain seen most recently.
    public var latest: ObservedChain? { chains.max { $0.lastSeen < $1.lastSeen } }
}

/// What the gate has seen, in learn mode and while enforcing: the file `observations.json`
/// in the state directory, and the rules for adding to it. One format for both modes; an
/// enforcing gate adds which pin carried each chain's verdict (`matched`). A plain value:
/// no I/O here. Bounded: at most `maximumHosts` host:ports and `maximumChainsPerHost`
/// leaves each, the least recently seen going first (a wildcard pin can cover any number
/// of names).
public struct ObservationBook: Codable, Sendable, Equatable {
    /// The file format's version.
    public var version = 1
    /// Every host:port seen, sorted by host then port.
    public var hosts: [ObservedHost] = []

    /// The most host:ports kept.
    public static let maximumHosts = 2_048
    /// The most distinct leaves kept per host:port.
    public static let maximumChainsPerHost = 8

    /// An empty book.
    public init() {}

    /// Records one tunnel to `host:port` on `chain` (validated, leaf first; an empty chain
    /// is not recorded: there is nothing to pin) at `time`, with the pin that carried its
    /// verdict when enforcing. Returns false when nothing was recorded.
    @discardableResult
    public mutating func record(host: String, port: Int, chain: [ObservedCertificate], alpn: String?,
                                matched: ObservedPinMatch? = nil, at time: Date) -> Bool {
        guard let leaf = chain.first else { return false }
        let host = host.lowercased()
        let (index, found) = position(host: host, port: port)
        if !found { hosts.insert(ObservedHost(host: host, port: port, chains: []), at: index) }
        if let known = hosts[index].chains.firstIndex(where: { $0.chain.first?.sha256 == leaf.sha256 }) {
            hosts[index].chains[known].chain = chain
            hosts[index].chains[known].alpn = alpn ?? hosts[index].chains[known].alpn
            hosts[index].chains[known].lastSeen = max(hosts[index].chains[known].lastSeen, time)
            hosts[index].chains[known].count += 1
            hosts[index].chains[known].matched = matched ?? hosts[index].chains[known].matched
            hosts[index].chains[known].earliestNotAfter = chain.compactMap(\.notAfter).min()
        } else {
            hosts[index].chains.append(ObservedChain(chain: chain, alpn: alpn, firstSeen: time, lastSeen: time, count: 1, matched: matched))
            if hosts[index].chains.count > Self.maximumChainsPerHost,
               let oldest = hosts[index].chains.indices.min(by: { hosts[index].chains[$0].lastSeen < hosts[index].chains[$1].lastSeen }) {
                hosts[index].chains.remove(at: oldest)
            }
        }
        if hosts.count > Self.maximumHosts,
           let stalest = hosts.indices.min(by: { (hosts[$0].latest?.lastSeen ?? .distantPast) < (hosts[$1].latest?.lastSeen ?? .distantPast) }) {
            hosts.remove(at: stalest)
        }
        return true
    }

    /// Counts one more tunnel on a chain already in the book, known by its leaf's SHA-256:
    /// the enforcing gate's usual case, which then needs no hashing of the rest of the
    /// chain. False when the host or that leaf is not in the book yet (`record` it).
    public mutating func touch(host: String, port: Int, leafSHA256: String, matched: ObservedPinMatch?, at time: Date) -> Bool {
        let (index, found) = position(host: host.lowercased(), port: port)
        guard found, let known = hosts[index].chains.firstIndex(where: { $0.chain.first?.sha256 == leafSHA256 }) else { return false }
        hosts[index].chains[known].lastSeen = max(hosts[index].chains[known].lastSeen, time)
        hosts[index].chains[known].count += 1
        hosts[index].chains[known].matched = matched ?? hosts[index].chains[known].matched
        return true
    }

    /// Where `host:port` is in `hosts` (sorted by host, then port), or would go.
    private func position(host: String, port: Int) -> (index: Int, found: Bool) {
        var low = 0, high = hosts.count
        while low < high {
            let middle = (low + high) / 2
            if (hosts[middle].host, hosts[middle].port) < (host, port) { low = middle + 1 } else { high = middle }
        }
        return (low, low < hosts.count && hosts[low].host == host && hosts[low].port == port)
    }

    /// The book as the file holds it: sorted keys, ISO 8601 dates, readable.
    public func encoded() throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return Array(try encoder.encode(self)) + [UInt8(ascii: "\n")]
    }

    /// A book from the file's bytes.
    public static func decode(_ data: Data) throws -> ObservationBook {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try decoder.decode(ObservationBook.self, from: data)
    }

    /// The file in `stateDirectory`.
    public static func path(stateDirectory: String) -> String {
        (stateDirectory as NSString).appendingPathComponent("observations.json")
    }
}

/// The recorder of what admitted hosts presented, in learn mode and while enforcing: keeps the book in memory, and writes it to the state directory
/// atomically (never half a file, even under `kill -9`) at most once per `writeDelay`, on a
/// queue of its own: `record` is called on event loops and never waits for the disk.
public final class ObservationRecorder: Sendable {
    private struct State {
        var book: ObservationBook
        var dirty = false
        var writeScheduled = false
        var writeFailures = 0
        var withoutValidatedChain = 0
    }

    /// The file the book is written to.
    public let path: String
    private let state: Mutex<State>
    private let queue = DispatchQueue(label: "pingate.observations")
    private let logger: Logger
    /// How long after a record the book is written (records meanwhile go in the same write).
    private let writeDelay: DispatchTimeInterval

    /// A recorder for `stateDirectory`, starting from the book already there: learn mode
    /// goes on where the last run stopped. A file that does not parse is kept aside (as
    /// `observations.json.unreadable-…`) and the book starts empty, with a log line.
    /// - Parameters:
    ///   - writeDelay: how long after a record the book is written: learn mode writes
    ///     within half a second, for `list propose` to see at once; an enforcing gate, whose
    ///     every tunnel is a record, writes every 10 s.
    public init(stateDirectory: String, logger: Logger, writeDelay: DispatchTimeInterval = .milliseconds(500)) throws {
        path = ObservationBook.path(stateDirectory: stateDirectory)
        self.logger = logger
        self.writeDelay = writeDelay
        var book = ObservationBook()
        if FileManager.default.fileExists(atPath: path) {
            // A file that is there but cannot be read stops start-up: starting empty would
            // overwrite it with the first write.
            let data: Data
            do {
                data = try Data(contentsOf: URL(fileURLWithPath: path))
            } catch {
                throw ConfigurationError("learn mode cannot read what it recorded before in \(path) (\(error.localizedDescription)): make it readable, or move it away to start afresh")
            }
            do {
                book = try ObservationBook.decode(data)
            } catch {
                let aside = "\(path).unreadable-\(Int(Date().timeIntervalSince1970))"
                guard rename(path, aside) == 0 else {
                    throw ConfigurationError("learn mode's \(path) does not parse (\(error)), and cannot be kept aside as \(aside) (\(String(cString: strerror(errno)))): move it away to start afresh")
                }
                logger.error("learn mode: the observations file does not parse; kept aside, starting afresh", metadata: [
                    "path": "\(path)", "kept": "\(aside)", "error": "\(error)",
                ])
            }
        }
        try StateFiles.ensureDirectory(stateDirectory)
        state = Mutex(State(book: book))
    }

    /// The book as it is now.
    public var book: ObservationBook { state.withLock { $0.book } }

    /// Writes of the book that failed (each is retried on the next record).
    public var writeFailures: Int { state.withLock { $0.writeFailures } }

    /// Tunnels admitted with no validated chain to record (a pins-only host whose chain
    /// did not validate): nothing to pin at any position, so not in the book.
    public var unrecorded: Int { state.withLock { $0.withoutValidatedChain } }

    /// Records a tunnel to `host:port` on `chain` (validated, leaf first), and the pin that
    /// carried its verdict when enforcing. Cheap: the write happens later, off the caller's
    /// thread.
    /// - Parameters:
    ///   - leafSHA256: the leaf's certificate hash when the caller has it (the verdict's):
    ///     a leaf already in the book is then counted without hashing its chain again.
    public func record(host: String, port: Int, chain: [Certificate], leafSHA256: String? = nil, alpn: String?,
                       matched: ObservedPinMatch? = nil, at time: Date) {
        if let leafSHA256, !chain.isEmpty {
            // One lock for the count and the write it may need.
            let touched = state.withLock { state -> (counted: Bool, schedule: Bool) in
                guard state.book.touch(host: host, port: port, leafSHA256: leafSHA256, matched: matched, at: time) else { return (false, false) }
                state.dirty = true
                guard !state.writeScheduled else { return (true, false) }
                state.writeScheduled = true
                return (true, true)
            }
            if touched.schedule {
                queue.asyncAfter(deadline: .now() + writeDelay) { self.writeIfDirty() }
            }
            if touched.counted { return }
        }
        let observed = chain.map(ObservedCertificate.init)
        let schedule = state.withLock { state -> Bool in
            guard state.book.record(host: host, port: port, chain: observed, alpn: alpn, matched: matched, at: time) else {
                state.withoutValidatedChain += 1
                return false
            }
            state.dirty = true
            guard !state.writeScheduled else { return false }
            state.writeScheduled = true
            return true
        }
        if schedule {
            queue.asyncAfter(deadline: .now() + writeDelay) { self.writeIfDirty() }
        }
    }


    /// Writes what is not written yet, now (shutdown), and waits for it.
    public func flush() {
        queue.sync { writeIfDirty() }
    }

    private func writeIfDirty() {
        let book = state.withLock { state -> ObservationBook? in
            state.writeScheduled = false
            guard state.dirty else { return nil }
            state.dirty = false
            return state.book
        }
        guard let book else { return }
        do {
            try StateFiles.writeAtomically(try book.encoded(), to: path, mode: 0o644)
        } catch {
            // Kept in memory: the next record schedules another try.
            state.withLock {
                $0.dirty = true
                $0.writeFailures += 1
            }
            logger.error("learn mode: cannot write the observations", metadata: ["path": "\(path)", "error": "\(error)"])
        }
    }
}
