import Foundation
import PinList

/// Why the list in force is the one in force: where it came from, and the choice that
/// put it there. An operator who restarts with a new `--pins` file and still sees the old
/// pins enforced needs this line more than any other.
public struct ListProvenance: Sendable, Equatable {
    /// Where a list in force came from.
    public enum Origin: String, Sendable, Codable {
        /// The local `--pins` file (or `pins.source` path), read at start-up or on SIGHUP.
        case pinsFile = "pins-file"
        /// The copy an earlier run persisted in the state directory.
        case persisted
        /// Fetched from the list server.
        case fetched
        /// The bundled fallback list, used because nothing better was usable.
        case fallback
        /// Put in force by hand (tests and embedders through `PinListStore.replace`).
        case replaced
    }

    /// Where it came from.
    public var origin: Origin
    /// Why it is in force, in words.
    public var reason: String

    /// A provenance: `reason` says why `origin`'s list is in force.
    public init(_ origin: Origin, _ reason: String) {
        self.origin = origin
        self.reason = reason
    }
}

/// The choice a gate started with a local list file makes, given what an earlier run
/// persisted. The file the operator names wins, unless it is older than what a reload
/// already put in force: then starting would quietly roll the pins back, so the gate
/// stops and says how to go on. Plain values in, a decision out: no files touched.
public enum PinsFileStartup {
    /// What the state directory holds.
    public enum Persisted: Sendable {
        /// No persisted list.
        case none
        /// A persisted list that does not parse or verify with the configured keys.
        case unverifiable(path: String, error: String)
        /// A persisted list that verifies.
        case verified(path: String, document: SignedListDocument, list: PinList)
    }

    /// The decision.
    public enum Decision: Sendable, Equatable {
        /// Put the file's list in force, for `provenance`; persist it when `persist` (so
        /// that the state directory holds what is in force, and `list show` shows it).
        case useFile(ListProvenance, persist: Bool)
        /// Stop start-up with this message.
        case refuse(String)
    }

    /// Decides between the file at `path` (its `document`, verified as `list`) and what
    /// is `persisted` in `stateDirectory`.
    public static func decide(path: String, document: SignedListDocument, list: PinList, persisted: Persisted,
                              stateDirectory: String, now: Date) -> Decision {
        let file = "the --pins file \(path)\(describe(list.metadata.sequence))"
        switch persisted {
        case .none:
            return .useFile(ListProvenance(.pinsFile, "\(file); no list was persisted before"), persist: true)
        case .unverifiable(let persistedPath, let error):
            return .useFile(ListProvenance(.pinsFile, "\(file); the list persisted in \(persistedPath) does not verify (\(error)) and is replaced"),
                            persist: true)
        case .verified(let persistedPath, let persistedDocument, let persistedList):
            if persistedDocument.body == document.body && persistedDocument.format == document.format {
                return .useFile(ListProvenance(.pinsFile, "\(file), the same list as the one persisted"), persist: false)
            }
            let persistedText = "the list persisted in \(persistedPath)\(describe(persistedList.metadata.sequence)), "
                + "from \(persistedDocument.source), received \(InternetTime.text(persistedDocument.receivedAt))"
            do {
                // One owner of the rollback rule: the file may replace the persisted list
                // exactly when an update could have.
                // Expired or not: the file the operator names is what the gate enforces, and
                // an expired one refuses everything, said at start-up and on /ready.
                try PinListAcceptance.check(list, replacing: persistedList, now: now, allowingExpired: true)
            } catch PinListRejection.rollback {
                return .refuse("\(file) is older than \(persistedText), which an earlier run put in force; starting with it "
                    + "would roll the pins back. Start with a list at least as new, or drop the persisted list with "
                    + "`pingate list forget --state-dir \(stateDirectory)` if the rollback is meant")
            } catch {
                return .refuse("\(file) cannot replace \(persistedText): \(error)")
            }
            return .useFile(ListProvenance(.pinsFile, "\(file); it replaces \(persistedText)"), persist: true)
        }
    }

    private static func describe(_ sequence: Int64?) -> String {
        sequence.map { " (sequence \($0))" } ?? " (no sequence)"
    }
}
