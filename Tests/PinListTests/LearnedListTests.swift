import Foundation
import PinList
import PinListService
import PropertyBased
import Testing

/// Learn mode's book of observations and the proposal made from it: plain values, no gate.
@Suite("Observations and list proposals")
struct LearnedListTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    static func certificate(_ name: String, daysLeft: Double = 60) -> ObservedCertificate {
        ObservedCertificate(sha256: "sha-\(name)", spki: "spki-\(name)", subject: "/CN=\(name)",
                            notAfter: now.addingTimeInterval(daysLeft * 86400))
    }

    @Test("over random sequences of records: hosts stay sorted and unique, one entry per leaf, every tunnel counted once, first seen never after last seen, and the file round-trips")
    func bookInvariants() async {
        await propertyCheck(count: 200, input: Gen.int(in: 0...10_000).array(of: 0...80)) { codes in
            var book = ObservationBook()
            var recorded = 0
            let hosts = ["b.example", "a.example", "c.example"], leaves = ["one", "two", "three"]
            for code in codes {
                let chain = code % 11 == 0 ? [] : [Self.certificate(leaves[code % 3]), Self.certificate("issuer")]
                let time = Self.now.addingTimeInterval(Double(code % 97) * 60)
                let host = hosts[(code / 3) % 3].uppercased(), port = 443 + (code / 9) % 2
                // The enforcing gate's fast path first, as it calls it: a known leaf is
                // counted by its hash alone.
                if code % 5 == 0, let leaf = chain.first,
                   book.touch(host: host, port: port, leafSHA256: leaf.sha256, matched: nil, at: time) {
                    recorded += 1
                } else if book.record(host: host, port: port, chain: chain, alpn: "h2", at: time) {
                    recorded += 1
                }
                #expect(!chain.isEmpty || book.hosts.allSatisfy { $0.chains.allSatisfy { !$0.chain.isEmpty } })
            }
            let keys = book.hosts.map { ($0.host, $0.port) }
            #expect(keys.elementsEqual(keys.sorted { $0 < $1 }, by: ==))
            #expect(Set(keys.map { "\($0.0):\($0.1)" }).count == keys.count)
            #expect(book.hosts.allSatisfy { $0.host == $0.host.lowercased() })
            for host in book.hosts {
                #expect(Set(host.chains.compactMap { $0.chain.first?.sha256 }).count == host.chains.count)
                #expect(host.chains.allSatisfy { $0.firstSeen <= $0.lastSeen && $0.count > 0 })
            }
            #expect(book.hosts.flatMap(\.chains).reduce(0) { $0 + $1.count } == recorded)
            let decoded = try? ObservationBook.decode(Data((try? book.encoded()) ?? []))
            #expect(decoded == book)
        }
    }

    @Test("the book is bounded: past its hosts the least recently seen host goes, past its leaves per host the least recently seen leaf; earliestNotAfter is the chain's earliest; a touch of an unknown leaf records nothing")
    func bookBounds() {
        var book = ObservationBook()
        for index in 0..<(ObservationBook.maximumHosts + 3) {
            book.record(host: "h\(index).example", port: 443, chain: [Self.certificate("leaf\(index)")], alpn: nil,
                        at: Self.now.addingTimeInterval(Double(index)))
        }
        #expect(book.hosts.count == ObservationBook.maximumHosts)
        #expect(!book.hosts.contains { ["h0.example", "h1.example", "h2.example"].contains($0.host) })
        #expect(book.hosts.contains { $0.host == "h3.example" })
        var one = ObservationBook()
        for index in 0..<(ObservationBook.maximumChainsPerHost + 2) {
            one.record(host: "api.example", port: 443, chain: [Self.certificate("leaf\(index)", daysLeft: 90), Self.certificate("ca", daysLeft: 30)],
                       alpn: nil, at: Self.now.addingTimeInterval(Double(index)))
        }
        let chains = one.hosts.first?.chains ?? []
        #expect(chains.count == ObservationBook.maximumChainsPerHost)
        #expect(!chains.contains { $0.chain.first?.sha256 == "sha-leaf0" || $0.chain.first?.sha256 == "sha-leaf1" })
        #expect(chains.allSatisfy { $0.earliestNotAfter == Self.now.addingTimeInterval(30 * 86400) })
        let unknownLeaf = one.touch(host: "api.example", port: 443, leafSHA256: "sha-unknown", matched: nil, at: Self.now)
        let unknownHost = one.touch(host: "other.example", port: 443, leafSHA256: "sha-leaf5", matched: nil, at: Self.now)
        #expect(!unknownLeaf && !unknownHost)
        #expect(one.hosts.first?.chains.reduce(0) { $0 + $1.count } == ObservationBook.maximumChainsPerHost)
    }

    /// A book with `host` seen on `chains` (each leaf first) once each.
    static func book(_ entries: [(host: String, chain: [ObservedCertificate])]) -> ObservationBook {
        var book = ObservationBook()
        for (offset, entry) in entries.enumerated() {
            book.record(host: entry.host, port: 443, chain: entry.chain, alpn: "h2", at: now.addingTimeInterval(Double(offset)))
        }
        return book
    }

    @Test("each host gets its leaf's key and its issuer's key at depth 1, expiring with each certificate; depth 0 leaves the backup out; expired leaves and unmatched globs are left out, with a note")
    func proposalChoices() {
        let issuer = Self.certificate("Issuing CA", daysLeft: 400), root = Self.certificate("Root", daysLeft: 4000)
        let book = Self.book([
            ("api.example.com", [Self.certificate("api", daysLeft: 60), issuer, root]),
            ("api.example.com", [Self.certificate("api-renewed", daysLeft: 90), issuer, root]),
            ("old.example.com", [Self.certificate("old", daysLeft: -1), issuer, root]),
            ("self.example.net", [Self.certificate("self", daysLeft: 30)]),
        ])
        var options = ListProposal.Options()
        options.now = Self.now
        let (draft, notes) = ListProposal.propose(book, options: options, source: "test")
        let api = draft.pins.filter { $0.host == "api.example.com" }
        #expect(api.map(\.spki) == ["spki-api-renewed", "spki-api", "spki-Issuing CA"], "newest leaf first, then the backup")
        #expect(api.map(\.depth) == [nil, nil, .position(1)])
        #expect(api.map(\.expires) == [90, 60, 400].map { Int64(Self.now.timeIntervalSince1970) + $0 * 86400 })
        #expect(api[2].why.hasPrefix("the backup: the key of /CN=Issuing CA, which issued the leaf"))
        #expect(api[0].why.contains("expires with the certificate (notAfter"))
        #expect(!draft.pins.contains { $0.host == "old.example.com" })
        #expect(notes.contains { $0.hasPrefix("old.example.com: skipped: every leaf it presented has expired") })
        #expect(draft.pins.filter { $0.host == "self.example.net" }.count == 1)
        #expect(notes.contains { $0.hasPrefix("self.example.net: its leaf is its own trust anchor") })

        options.depth = 0
        options.hosts = ["*.example.com"]
        let leavesOnly = ListProposal.propose(book, options: options, source: "test").draft
        #expect(leavesOnly.pins.map(\.host) == ["api.example.com", "api.example.com"])
        #expect(leavesOnly.pins.allSatisfy { $0.depth == nil })

        options.format = .wultraStatic
        options.depth = 1
        let (wultra, wultraNotes) = ListProposal.propose(book, options: options, source: "test")
        #expect(wultra.pins.allSatisfy { $0.sha256 != nil && $0.spki == nil && $0.depth == nil })
        #expect(wultraNotes.contains { $0.contains("wultra-static has no depth pins") })
    }

    @Test("--group puts the hosts of one parent domain under one *. pattern only when every one seen there shares the issuer key; a parent with another issuer among its hosts, or a public suffix, is never grouped")
    func grouping() {
        let issuer = Self.certificate("Shared CA", daysLeft: 400), other = Self.certificate("Other CA", daysLeft: 400)
        let book = Self.book([
            ("a.shop.example", [Self.certificate("a"), issuer]),
            ("b.shop.example", [Self.certificate("b"), issuer]),
            ("a.mixed.example", [Self.certificate("ma"), issuer]),
            ("b.mixed.example", [Self.certificate("mb"), issuer]),
            ("c.mixed.example", [Self.certificate("mc"), other]),
            ("x.co.uk", [Self.certificate("x"), issuer]),
            ("y.co.uk", [Self.certificate("y"), issuer]),
        ])
        var options = ListProposal.Options()
        options.now = Self.now
        options.group = true
        let (draft, notes) = ListProposal.propose(book, options: options, source: "test")
        let grouped = draft.pins.filter { $0.host == "*.shop.example" }
        #expect(grouped.compactMap(\.spki).sorted() == ["spki-Shared CA", "spki-a", "spki-b"])
        #expect(!draft.pins.contains { $0.host == "a.shop.example" || $0.host == "*.co.uk" || $0.host == "*.mixed.example" },
                "*.mixed.example would let c.mixed.example through on the shared CA's pin")
        #expect(draft.pins.filter { $0.host.hasSuffix(".mixed.example") }.count == 6)
        #expect(draft.pins.filter { $0.host == "x.co.uk" }.count == 2)
        #expect(notes.contains("*.shop.example: grouped a.shop.example, b.shop.example: every host seen under it, with the same issuer key; the pattern also covers names never seen"))
    }

    @Test("a draft's pins are checked as a signed list's are: exactly one of sha256 and spki, each base64 of 32 bytes (canonicalized), and the error names the pin")
    func draftPinsChecked() throws {
        let hash = Data(repeating: 7, count: 32).base64EncodedString()
        func draft(_ pin: String) throws -> ListDraft {
            try ListDraft.decode(Data(#"{"comment": "t", "pins": [\#(pin)]}"#.utf8))
        }
        let good = try draft(#"{"host": "a.example", "spki": "\#(hash)", "expires": 1900000000, "why": "w"}"#).entries()
        #expect(good.map(\.fingerprint) == [hash] && good.map(\.kind) == [.spki])
        let cases = [
            (#"{"host": "a.example", "expires": 1900000000, "why": "w"}"#, "draft pin 0 (a.example) needs exactly one of sha256 and spki"),
            (#"{"host": "a.example", "sha256": "\#(hash)", "spki": "\#(hash)", "expires": 1900000000, "why": "w"}"#,
             "draft pin 0 (a.example) needs exactly one of sha256 and spki"),
            (#"{"host": "a.example", "sha256": "c2hvcnQ=", "expires": 1900000000, "why": "w"}"#,
             "draft pin 0 (a.example): not base64 of a 32-byte SHA-256"),
        ]
        for (pin, expected) in cases {
            #expect(throws: PinListError.malformed(expected)) { try draft(pin).entries() }
        }
    }

    @Test("list diff: added, dropped and changed pins per host; a new host and a host no longer pinned say so; identical lists have no differences")
    func diff() throws {
        let year = Self.now.addingTimeInterval(365 * 86400)
        func pin(_ host: String, _ hash: String, depth: PinEntry.Depth = .leaf, expires: Date = year, mode: PinEntry.Mode = .enforce) throws -> PinEntry {
            PinEntry(host: try HostPattern(parsing: host), fingerprint: hash, kind: .spki, expires: expires, mode: mode, depth: depth)
        }
        let old = [try pin("api.example", "A"), try pin("api.example", "CA", depth: .position(1)), try pin("gone.example", "G"),
                   try pin("same.example", "S")]
        let new = [try pin("api.example", "B"), try pin("api.example", "CA", depth: .position(1), expires: Self.now, mode: .reportOnly),
                   try pin("fresh.example", "F"), try pin("same.example", "S")]
        let changes = ListDiff.compare(old: old, new: new)
        #expect(changes.map(\.host) == ["api.example", "fresh.example", "gone.example"])
        #expect(changes[0].added.map(\.fingerprint) == ["B"] && changes[0].dropped.map(\.fingerprint) == ["A"])
        #expect(changes[0].changed.count == 1 && !changes[0].isNewHost && !changes[0].isGoneHost)
        #expect(changes[1].isNewHost && changes[2].isGoneHost)
        let text = ListDiff.describe(changes)
        #expect(text.contains("api.example: changed\n  + spki/B, expires"))
        #expect(text.contains("  - spki/A, expires"))
        #expect(text.contains("  ~ spki/CA depth 1 report-only: expires "))
        #expect(text.contains("enforce → report-only"))
        #expect(text.contains("fresh.example: new host") && text.contains("gone.example: no longer pinned"))
        #expect(ListDiff.compare(old: old, new: old).isEmpty)
    }
}
