import ArgumentParser
import Foundation
import PinGate
import PinGateTLS
import PinList
import PinListService
import PinGateNIO

/// `pingate list verify|show`: read signed lists the way the gate does.
struct ListCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Verify, lint or show signed fingerprint lists, forget the persisted one, propose one from what learn mode saw, or show the running gate's pin health.",
        subcommands: [Verify.self, Show.self, Lint.self, Forget.self, Propose.self, Diff.self, Health.self]
    )

    /// `pingate list verify FILE --key KEY`.
    struct Verify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Verify a list file and print its entries with days left; exits 1 on a list that does not verify, 4 on one that has expired.")

        @OptionGroup var list: ListFileOptions

        @Option(name: .long, help: "wultra-dynamic: the challenge the request carried.")
        var challenge: String?

        @Option(name: .long, help: "wultra-dynamic: the X-Cert-Pinning-Signature header.")
        var signature: String?

        /// `--key` values (files or inline keys) loaded, or a `ConfigurationError` naming the key at fault.
        static func keys(_ values: [String]) throws -> [PublicKey] {
            do {
                return try PinListFile.loadKeys(values.map { PathText.resolveKey($0) })
            } catch {
                throw ConfigurationError("\(error)")
            }
        }

        func run() throws {
            let (path, list) = try self.list.verified(challenge: challenge, signature: signature)
            let now = Date()
            print("\(path): valid \(list.metadata.format.rawValue) list")
            print(ListPrinter.describe(list, now: now), terminator: "")
            // Signed, but no gate would use it: as lint does, exit 4 (a script checking a list
            // before publishing it took 0 for "good").
            if !list.isUsable(at: now) {
                FileHandle.standardError.write(Data("pingate list verify: \(path) verifies but has expired (\(list.isFresh(at: now) ? "every pin is past its expiry" : "the list is past its expiresAt")): a gate refuses every CONNECT with it (list-expired)\n".utf8))
                throw ExitCode(4)
            }
        }
    }

    /// `pingate list lint FILE --key KEY`.
    struct Lint: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Verify a list file, then warn about fragile or pointless pins; exit 4 when the list or a pin has expired, and 3 with --strict when there is a warning.",
            discussion: """
            Warns when a host has a single pin and no backup (TrustKit's two-pin rule), when a \
            pin (or a v2 list) expires within 14 days, when a wildcard covers a public suffix \
            (every TLD, and a small built-in list of common multi-label suffixes such as co.uk \
            and com.au: not the full Public Suffix List), and, given --upstream-ca, when a \
            depth pin names a root that is the only trust anchor configured.
            """)

        @OptionGroup var list: ListFileOptions

        @Option(name: .customLong("upstream-ca"), help: "The gate's upstream trust anchors (PEM), for the depth-pin check. Repeatable.")
        var upstreamCA: [String] = []

        @Flag(name: .long, help: "Exit non-zero when there is any warning.")
        var strict = false

        func run() throws {
            let (path, list) = try self.list.verified()
            let anchors: [CertificateHashes]? = upstreamCA.isEmpty ? nil : try upstreamCA.flatMap { file in
                try InputFile.certificates(file, flag: "--upstream-ca")
                    .map(CertificateHashes.init)
            }
            let findings = PinListLint.findings(for: list, now: Date(), trustAnchors: anchors)
            for finding in findings { print(finding) }
            let errors = findings.filter(\.isError).count
            let warnings = findings.count - errors
            print("\(path): \(list.entries.count) pins, \(warnings) warning\(warnings == 1 ? "" : "s")"
                + (errors > 0 ? ", \(errors) error\(errors == 1 ? "" : "s")" : ""))
            // An expiry already past is not a matter of taste: the list, as it stands,
            // refuses what it was for.
            if errors > 0 { throw ExitCode(4) }
            if strict && !findings.isEmpty { throw ExitCode(3) }
        }
    }

    /// `pingate list show`.
    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show the list in force: the document persisted in the state directory, verified again.")

        @OptionGroup var state: StateDirectoryOptions

        @Option(name: .long, help: "A public key that may have signed it. Repeatable.")
        var key: [String]

        func run() throws {
            let state = try self.state.path()
            let persistence = PinListPersistence(stateDirectory: state)
            let keys = try Verify.keys(key)
            let loaded: (SignedListDocument, PinList)?
            do {
                loaded = try persistence.load(keys: keys)
            } catch {
                throw ConfigurationError("the persisted list \(persistence.path) does not verify: \(error)")
            }
            guard let (document, list) = loaded else {
                throw ConfigurationError("no list persisted in \(state) (the gate persists the list it puts in force there, fetched or from a --pins file, once it has run with that state directory; give the gate's --config or --state-dir)")
            }
            print("\(persistence.path): \(list.metadata.format.rawValue) list from \(document.source), received \(ListPrinter.iso(document.receivedAt))")
            print(ListPrinter.describe(list, now: Date()), terminator: "")
        }
    }
}

extension ListCommand {
    /// `pingate list forget`.
    struct Forget: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Drop the list persisted in the state directory, so that the next start uses its --pins file as it is.",
            discussion: """
            A gate persists every list it puts in force (from a URL, or a --pins file re-read on SIGHUP). \
            A later start with a --pins file older than that copy stops rather than roll the pins back; \
            when the rollback is what you want, stop the gate, run this, and start it again. The local CA \
            in the same directory is kept.
            """)

        @OptionGroup var state: StateDirectoryOptions

        func run() throws {
            let state = try self.state.path()
            let persistence = PinListPersistence(stateDirectory: state)
            let stored = persistence.storedDocument()
            let removed: Bool
            removed = try persistence.forget()
            guard removed else {
                print("no list persisted in \(state): nothing to forget")
                return
            }
            let what = stored.map { "a \($0.format.rawValue) list from \($0.source), received \(ListPrinter.iso($0.receivedAt))" }
                ?? "a copy that does not parse"
            print("removed \(persistence.path) (\(what)); the next start puts its --pins file in force, or fetches its URL")
        }
    }
}

extension ListCommand {
    /// `pingate list propose`.
    struct Propose: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Turn what `pingate run --learn` recorded into a list draft (JSON on stdout) for `pingate sign --draft`.",
            discussion: """
            For each host: a pin on the leaf's key, and with --depth 1 (the default) a pin on the key \
            of the CA that issued it (depth 1 of the validated chain) as the backup, so that a leaf \
            re-keyed under the same CA still passes. Each pin expires with the certificate it names. \
            Every choice is explained in the pin's why field; hosts left out, and why, go to stderr. \
            Review the draft, then sign it: pingate sign --draft FILE --key signer.key --format v2 \
            --sequence N.

            With --next, the list that follows the one in force (--list FILE, or the list persisted in \
            the state directory; verified with --key), from what the enforcing gate observed: pins \
            that still match what their hosts present are kept, expired pins and pins that matched \
            only chains their hosts no longer present are dropped, the key of the leaf a host now \
            presents is added where only a backup pin carried it (pin health's backup-only), and \
            every host keeps a backup. The draft lists each change with why, and carries the next \
            sequence, which sign --draft uses.
            """)

        @Flag(name: .long, help: "Propose the list that follows the one in force, from it and what the enforcing gate observed (see the discussion).")
        var next = false

        @Option(name: .long, help: "With --next: the list in force, a signed list file (default: the list persisted in the state directory).")
        var list: String?

        @Option(name: .long, help: "With --next: a public key that may have signed the list in force (PEM or base64 X9.63). Repeatable.")
        var key: [String] = []

        @OptionGroup var state: StateDirectoryOptions

        @Option(name: .long, help: "0: leaf pins only; 1: each leaf pin and its issuer's key as the backup.")
        var depth = 1

        @Option(name: .long, parsing: .upToNextOption, help: "Only hosts matching these globs (e.g. '*.example.com').")
        var hosts: [String] = []

        @Option(name: .long, help: "v2 (key pins at any depth) or wultra-static (leaf certificates only); default v2, or with --next the format of the list in force.")
        var format: String?

        @Flag(name: .long, help: "Group hosts under one parent domain that share an issuer key into one *. pattern.")
        var group = false

        func validate() throws {
            if !next && (list != nil || !key.isEmpty) { throw ValidationError("--list and --key are for --next") }
            if next && key.isEmpty { throw ValidationError("--next needs --key, the public key that signed the list in force") }
            guard depth == 0 || depth == 1 else { throw ValidationError("--depth is 0 or 1, not \(depth)") }
            if let format, ListProposal.Format(rawValue: format) == nil { throw ValidationError("--format is v2 or wultra-static, not \(format)") }
        }

        func run() throws {
            let state = try self.state.path()
            let path = ObservationBook.path(stateDirectory: state)
            guard let data = FileManager.default.contents(atPath: path) else {
                throw ConfigurationError("nothing learned in \(state): \(path) does not exist (run the gate with --learn and this --state-dir first)")
            }
            let book: ObservationBook
            do {
                book = try ObservationBook.decode(data)
            } catch {
                throw ConfigurationError("\(path) is not an observations file: \(error)")
            }
            if next {
                try proposeNext(book: book, observationsPath: path, state: state)
                return
            }
            var options = ListProposal.Options()
            options.depth = depth
            options.hosts = hosts
            options.format = format.flatMap(ListProposal.Format.init(rawValue:)) ?? .v2
            options.group = group
            let (draft, notes) = ListProposal.propose(book, options: options, source: path)
            for note in notes { FileHandle.standardError.write(Data("list propose: \(note)\n".utf8)) }
            guard !draft.pins.isEmpty else {
                throw ConfigurationError("no host to propose from \(path)\(hosts.isEmpty ? "" : " matching \(hosts.joined(separator: " "))")")
            }
            print(String(decoding: try draft.encoded(), as: UTF8.self))
        }

        /// `--next`: the list in force, verified, and the observations → the next draft.
        private func proposeNext(book: ObservationBook, observationsPath: String, state: String) throws {
            let keys = try Verify.keys(key)
            let inForce: PinList
            let source: String
            if let list {
                source = PathText.resolve(list)
                do {
                    inForce = try SignedListDocument.read(file: source).verify(keys: keys)
                } catch {
                    throw ConfigurationError("--list \(source) does not verify: \(error)")
                }
            } else {
                let persistence = PinListPersistence(stateDirectory: state)
                source = persistence.path
                let loaded: (SignedListDocument, PinList)?
                do {
                    loaded = try persistence.load(keys: keys)
                } catch {
                    throw ConfigurationError("the persisted list \(persistence.path) does not verify: \(error)")
                }
                guard let (_, persisted) = loaded else {
                    throw ConfigurationError("no list persisted in \(state) (a gate given a local --pins file does not persist it): give the list in force with --list FILE")
                }
                inForce = persisted
            }
            var options = NextListProposal.Options()
            options.format = format.flatMap(ListProposal.Format.init(rawValue:))
            let (draft, notes) = NextListProposal.propose(list: inForce, book: book, options: options, source: observationsPath)
            for note in notes { FileHandle.standardError.write(Data("list propose --next: \(note)\n".utf8)) }
            for change in draft.changes ?? [] { FileHandle.standardError.write(Data("list propose --next: \(change)\n".utf8)) }
            guard !draft.pins.isEmpty else {
                throw ConfigurationError("the next list would have no pins: none of \(source)'s pins is still good and nothing observed replaces them")
            }
            print(String(decoding: try draft.encoded(), as: UTF8.self))
        }
    }
}

extension ListCommand {
    /// `pingate list diff OLD NEW`.
    struct Diff: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show what NEW adds, drops or changes against OLD, per host; exits 0 when the pins are the same, 1 when they differ, 2 on an error.",
            discussion: """
            Each of OLD and NEW is a signed list file (verified with --key), the persisted list in a \
            state directory (its pin-list.json, verified with --key), or a draft from pingate list \
            propose (not signed, so not verified). Review a proposal against the list in force with \
            pingate list diff ~/.local/state/pingate/pin-list.json draft.json --key signer.pub.pem.
            """)

        @Argument(help: "The list before: a signed list, a persisted pin-list.json, or a draft.")
        var old: String

        @Argument(help: "The list after.")
        var new: String

        @Option(name: .long, help: "A public key that may have signed the lists (PEM or base64 X9.63). Repeatable; not needed for drafts.")
        var key: [String] = []

        func run() throws {
            // As diff(1): 0 the same, 1 different, 2 trouble (so a script can tell them apart).
            let changes: [ListDiff.HostChanges]
            do {
                changes = ListDiff.compare(old: try entries(old), new: try entries(new))
            } catch {
                FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
                throw ExitCode(2)
            }
            if changes.isEmpty {
                print("no differences in pins")
                return
            }
            print(ListDiff.describe(changes), terminator: "")
            throw ExitCode(1)
        }

        /// The pins of `file`, whichever of the three kinds it is.
        private func entries(_ file: String) throws -> [PinEntry] {
            let path = PathText.resolve(file)
            let data = Data(try InputFile.text(file, what: "a signed list, a persisted pin-list.json or a draft", flag: "list diff").utf8)
            // A draft says so by its why fields; one that does not decode gets its own error,
            // not a request for the key of a signed list it is not.
            if String(decoding: data, as: UTF8.self).contains("\"why\"") {
                do {
                    return try ListDraft.decode(data).entries()
                } catch {
                    throw ConfigurationError("\(path) looks like a list draft but is not one: \(error)")
                }
            }
            let keys = try Verify.keys(key)
            guard !keys.isEmpty else { throw ConfigurationError("\(path) is a signed list: give the key that signed it with --key") }
            let document = try PinListPersistence.decodeStored(data) ?? SignedListDocument.read(file: path)
            do {
                return try document.verify(keys: keys).entries
            } catch {
                throw ConfigurationError("\(path) does not verify: \(error)")
            }
        }
    }
}

/// The list file and its keys, as `list verify` and `list lint` read them.
struct ListFileOptions: ParsableArguments {
    @Argument(help: "The list file.")
    var file: String

    @Option(name: .long, help: "A public key that may have signed it (PEM or base64 X9.63). Repeatable.")
    var key: [String]

    @Option(name: .long, help: "auto, wultra-static, wultra-dynamic or pingate-v2.")
    var format: String = "auto"

    /// Reads and verifies the file (a dynamic answer with its `challenge` and `signature`);
    /// returns its resolved path and the list, or a `ConfigurationError` saying why not.
    func verified(challenge: String? = nil, signature: String? = nil) throws -> (path: String, list: PinList) {
        let path = PathText.resolve(file)
        // A challenge means the dynamic format unless one was named.
        let listFormat = try PathText.listFormat(format) ?? (challenge == nil ? nil : .wultraDynamic)
        var document = try SignedListDocument.read(file: path, format: listFormat)
        document.challenge = challenge
        document.signature = signature
        // Keys first, on their own: a bad key is the key's fault, not the list's.
        let keys = try ListCommand.Verify.keys(key)
        do {
            return (path, try document.verify(keys: keys))
        } catch {
            throw ConfigurationError("\(path) does not verify: \(error)")
        }
    }
}

/// Human-readable list output shared by `list verify` and `list show`.
enum ListPrinter {
    static func describe(_ list: PinList, now: Date) -> String {
        var text = ""
        if let sequence = list.metadata.sequence { text += "sequence:   \(sequence)\n" }
        if let issued = list.metadata.issuedAt { text += "issued:     \(iso(issued))\n" }
        if let expires = list.metadata.expiresAt {
            text += "expires:    \(iso(expires)) (\(days(until: expires, now: now)))\(list.isFresh(at: now) ? "" : "  STALE: not used")\n"
        }
        if let keyID = list.metadata.keyID { text += "signed by:  key \(keyID)\n" }
        if let rules = list.domainRules {
            text += "domains:    unlisted \(rules.pinningRequiredForUnlisted ? "need a pin" : "allowed unpinned")\n"
            for (name, required) in rules.domains.sorted(by: { $0.key < $1.key }) {
                text += "  \(name)  \(required ? "pin required" : "unpinned-allowed")\n"
            }
        }
        text += "entries:    \(list.entries.count)\n"
        for entry in list.entries {
            let state = entry.isUnexpired(at: now) ? days(until: entry.expires, now: now) : "EXPIRED"
            let depth = entry.depth.isLeaf ? "" : "  depth \(entry.depth)"
            text += "  \(entry.name)  \(entry.kind.rawValue)/\(entry.fingerprint)  \(entry.mode.rawValue)\(depth)  expires \(iso(entry.expires)) (\(state))\n"
        }
        for revoked in list.revoked.sorted() { text += "  revoked \(revoked)\n" }
        return text
    }

    /// Whole days left, or whole days since: a list that expired three seconds ago expired
    /// "less than a day ago", not "1 days ago".
    static func days(until date: Date, now: Date) -> String {
        let interval = date.timeIntervalSince(now)
        let days = Int((abs(interval) / 86400).rounded(.down))
        if interval >= 0 { return days == 1 ? "1 day left" : "\(days) days left" }
        return days == 0 ? "less than a day ago" : days == 1 ? "1 day ago" : "\(days) days ago"
    }

    static func iso(_ date: Date) -> String { InternetTime.text(date) }
}
