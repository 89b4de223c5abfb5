import Foundation
import Logging
import PinGateNIO
import PinGateStateFiles
import PinGateTLS
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

/// What learn mode has seen: the file `observations.json` in the state directory, and the
/// rules for adding to it. A plain value: no I/O here.
public struct ObservationBook: Codable, Sendable, Equatable {
    /// The file format's version.
    public var version = 1
    /// Every host:port seen, sorted by host then port.
    public var hosts: [ObservedHost] = []

    /// An empty book.
    public init() {}

    /// Records one tunnel to `host:port` on `chain` (validated, leaf first; an empty chain
    /// is not recorded: there is nothing to pin) at `time`. Returns false when nothing was
    /// recorded.
    @discardableResult
    public mutating func record(host: String, port: Int, chain: [ObservedCertificate], alpn: String?, at time: Date) -> Bool {
        guard let leaf = chain.first else { return false }
        let host = host.lowercased()
        let index: Int
        if let found = hosts.firstIndex(where: { $0.host == host && $0.port == port }) {
            index = found
        } else {
            hosts.append(ObservedHost(host: host, port: port, chains: []))
            hosts.sort { ($0.host, $0.port) < ($1.host, $1.port) }
            guard let inserted = hosts.firstIndex(where: { $0.host == host && $0.port == port }) else { return false }
            index = inserted
        }
        if let known = hosts[index].chains.firstIndex(where: { $0.chain.first?.sha256 == leaf.sha256 }) {
            hosts[index].chains[known].chain = chain
            hosts[index].chains[known].alpn = alpn ?? hosts[index].chains[known].alpn
            hosts[index].chains[known].lastSeen = max(hosts[index].chains[known].lastSeen, time)
            hosts[index].chains[known].count += 1
        } else {
            hosts[index].chains.append(ObservedChain(chain: chain, alpn: alpn, firstSeen: time, lastSeen: time, count: 1))
        }
        return true
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

/// Learn mode's recorder: keeps the book in memory, and writes it to the state directory
/// atomically (never half a file, even under `kill -9`) at most twice a second, on a
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
    private static let writeDelay = DispatchTimeInterval.milliseconds(500)

    /// A recorder for `stateDirectory`, starting from the book already there: learn mode
    /// goes on where the last run stopped. A file that does not parse is kept aside (as
    /// `observations.json.unreadable-…`) and the book starts empty, with a log line.
    public init(stateDirectory: String, logger: Logger) throws {
        path = ObservationBook.path(stateDirectory: stateDirectory)
        self.logger = logger
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

    /// Records a tunnel to `host:port` on `chain` (validated, leaf first). Cheap: the write
    /// happens later, off the caller's thread.
    public func record(host: String, port: Int, chain: [Certificate], alpn: String?, at time: Date) {
        let observed = chain.map(ObservedCertificate.init)
        let schedule = state.withLock { state -> Bool in
            guard state.book.record(host: host, port: port, chain: observed, alpn: alpn, at: time) else {
                state.withoutValidatedChain += 1
                return false
            }
            state.dirty = true
            guard !state.writeScheduled else { return false }
            state.writeScheduled = true
            return true
        }
        if schedule {
            queue.asyncAfter(deadline: .now() + Self.writeDelay) { self.writeIfDirty() }
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
