import Foundation
import PinList
import PinListService
import PropertyBased
import Testing

/// `list propose --next` without a gate: the list in force and observed chains in, the next
/// draft out (issue 34).
@Suite("The next list")
struct NextListProposalTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let day: TimeInterval = 86_400

    static func certificate(_ name: String, daysLeft: Double = 90) -> ObservedCertificate {
        ObservedCertificate(sha256: "sha-\(name)", spki: "spki-\(name)", subject: "/CN=\(name)", notAfter: now.addingTimeInterval(daysLeft * day))
    }

    static func list(_ entries: [PinEntry], sequence: Int64 = 7) -> PinList {
        PinList(source: "pins.json", entries: entries, metadata: .init(format: .pingateV2, sequence: sequence))
    }

    static func spki(_ host: String, _ name: String, depth: PinEntry.Depth = .leaf, daysLeft: Double = 200) throws -> PinEntry {
        PinEntry(host: try HostPattern(parsing: host), fingerprint: "spki-\(name)", kind: .spki,
                 expires: now.addingTimeInterval(daysLeft * day), depth: depth)
    }

    static func book(_ seen: [(host: String, chain: [ObservedCertificate], daysAgo: Double)]) -> ObservationBook {
        var book = ObservationBook()
        for entry in seen {
            book.record(host: entry.host, port: 443, chain: entry.chain, alpn: "h2", at: now.addingTimeInterval(-entry.daysAgo * day))
        }
        return book
    }

    static func propose(_ list: PinList, _ book: ObservationBook) -> (draft: ListDraft, notes: [String]) {
        var options = NextListProposal.Options()
        options.now = now
        return NextListProposal.propose(list: list, book: book, options: options, source: "observations.json")
    }

    @Test("the rotation: a host pinned by its leaf key with its issuer as backup now presents a re-keyed leaf; the next list adds the new leaf's key, keeps the issuer, drops the old leaf once it is out of use (kept while both are presented), and carries the next sequence")
    func rotation() throws {
        let issuer = Self.certificate("issuer", daysLeft: 400), root = Self.certificate("root", daysLeft: 4000)
        let old = Self.certificate("leaf-old"), new = Self.certificate("leaf-new", daysLeft: 80)
        let list = Self.list([try Self.spki("api.example.test", "leaf-old"), try Self.spki("api.example.test", "issuer", depth: .position(1))])

        // The old leaf last seen 10 days before the new one: out of use.
        let (draft, _) = Self.propose(list, Self.book([("api.example.test", [old, issuer, root], 12), ("api.example.test", [new, issuer, root], 1)]))
        #expect(draft.sequence == 8)
        #expect(draft.pins.map { "\($0.depth.map { "\($0)" } ?? "0") \($0.spki ?? "")" } == ["0 spki-leaf-new", "1 spki-issuer"])
        let added = try #require(draft.pins.first)
        #expect(added.expires == Int64(new.notAfter?.timeIntervalSince1970 ?? 0))
        #expect(added.why.hasPrefix("added: the key of the leaf /CN=leaf-new"), "\(added.why)")
        #expect(draft.pins[1].why.hasPrefix("still matches what api.example.test presents"), "\(draft.pins[1].why)")
        let changes = draft.changes ?? []
        #expect(changes.count == 2, "\(changes)")
        #expect(changes.contains { $0.hasPrefix("dropped api.example.test depth-0 spki spki-leaf-old: api.example.test presented it until") })
        #expect(changes.contains { $0.hasPrefix("added api.example.test depth-0 spki spki-leaf-new") })
        #expect(draft.comment.contains("sequence 8, from the draft"), "\(draft.comment)")

        // Both leaves presented this week (a rollout): both kept.
        let (rollout, _) = Self.propose(list, Self.book([("api.example.test", [old, issuer, root], 2), ("api.example.test", [new, issuer, root], 1)]))
        #expect(Set(rollout.pins.compactMap(\.spki)) == ["spki-leaf-old", "spki-leaf-new", "spki-issuer"])
    }

    @Test("expired pins are dropped; a host no client reached keeps its pins; a pin that matched nothing observed is kept as a possible backup; a host left with one pin gets its issuer's key as the backup; an observed host no pin covers is only noted; a pattern with nothing left is left out, with a note")
    func keepsDropsAndBackups() throws {
        let issuer = Self.certificate("issuer", daysLeft: 400), root = Self.certificate("root", daysLeft: 4000)
        let leaf = Self.certificate("leaf")
        let list = Self.list([
            try Self.spki("api.example.test", "leaf"),
            try Self.spki("api.example.test", "spare-key"),
            try Self.spki("api.example.test", "ancient", daysLeft: -1),
            try Self.spki("quiet.example.test", "q"),
            try Self.spki("quiet.example.test", "q-ca", depth: .position(1)),
            try Self.spki("*.cdn.example.test", "leaf"),
            try Self.spki("gone.example.test", "gone", daysLeft: -3),
        ])
        let (draft, notes) = Self.propose(list, Self.book([
            ("api.example.test", [leaf, issuer, root], 1),
            ("img.cdn.example.test", [leaf, issuer, root], 1),
            ("stranger.example.test", [Self.certificate("stranger"), issuer, root], 1),
        ]))
        let byHost = Dictionary(grouping: draft.pins, by: \.host)
        #expect(Set(byHost["api.example.test"]?.compactMap(\.spki) ?? []) == ["spki-leaf", "spki-spare-key"])
        #expect(byHost["api.example.test"]?.first { $0.spki == "spki-spare-key" }?.why.contains("a backup key not in use yet?") == true)
        #expect(Set(byHost["quiet.example.test"]?.compactMap(\.spki) ?? []) == ["spki-q", "spki-q-ca"])
        #expect(byHost["quiet.example.test"]?.allSatisfy { $0.why.hasPrefix("kept: no client reached") } == true)
        // The wildcard had one pin: the issuer of what its host presents becomes the backup.
        #expect(byHost["*.cdn.example.test"]?.map { "\($0.depth.map { "\($0)" } ?? "0") \($0.spki ?? "")" } == ["0 spki-leaf", "1 spki-issuer"])
        #expect(byHost["gone.example.test"] == nil)
        let changes = draft.changes ?? []
        #expect(changes.contains { $0.hasPrefix("dropped api.example.test depth-0 spki spki-ancient: it expired at") }, "\(changes)")
        #expect(changes.contains { $0.hasPrefix("dropped gone.example.test depth-0 spki spki-gone: it expired") }, "\(changes)")
        #expect(changes.contains { $0.hasPrefix("added *.cdn.example.test depth-1 spki spki-issuer: a backup") }, "\(changes)")
        #expect(notes.contains { $0.hasPrefix("stranger.example.test: observed, but no pin of the list covers it") }, "\(notes)")
        #expect(notes.contains { $0.hasPrefix("gone.example.test: left out") }, "\(notes)")
        #expect(!draft.pins.contains { $0.spki == "spki-stranger" })
    }

    /// The reference rule for "this pin set trusts this chain": an unexpired pin whose hash
    /// is the certificate's at the position it names (any position for `any`). Written
    /// apart from `PinEntry.match`.
    static func trusts(_ pins: [(fingerprint: String, depth: PinEntry.Depth, expires: Date)], _ chain: [ObservedCertificate]) -> Bool {
        pins.contains { pin in
            guard pin.expires > now else { return false }
            switch pin.depth {
            case .position(let position): return chain.indices.contains(position) && chain[position].spki == pin.fingerprint
            case .any: return chain.contains { $0.spki == pin.fingerprint }
            }
        }
    }

    @Test("over random lists and random observed chains: every chain a host presents now that the list in force trusts, the next list trusts too; every pin it adds comes from an observed (validated) chain; no pin is expired; every pattern whose hosts present a chain with an issuer keeps a backup")
    func properties() async {
        await propertyCheck(count: 300, input: Gen.int(in: 0...1_000_000).array(of: 10...60)) { codes in
            var codes = codes.makeIterator()
            func next(_ range: Int) -> Int { (codes.next() ?? 0) % range }
            // A small world: five keys that can sit anywhere in a chain, three hosts, one wildcard.
            let keys = (0..<6).map { Self.certificate("k\($0)", daysLeft: [90, 400, -1, 30, 200, 1000][$0]) }
            let hosts = ["a.example.test", "b.example.test", "x.w.example.test"]
            let patterns = ["a.example.test", "b.example.test", "*.w.example.test"]
            var entries: [PinEntry] = []
            for pattern in patterns {
                for _ in 0..<next(4) {
                    let depth: PinEntry.Depth = [.leaf, .leaf, .position(1), .position(2), .any][next(5)]
                    entries.append(PinEntry(host: (try? HostPattern(parsing: pattern)) ?? .exact(pattern), fingerprint: "spki-k\(next(6))", kind: .spki,
                                            expires: Self.now.addingTimeInterval(Double(next(400) - 50) * Self.day), depth: depth))
                }
            }
            let list = Self.list(entries)
            var book = ObservationBook()
            for _ in 0..<next(8) {
                let chain = (0..<(1 + next(3))).map { _ in keys[next(6)] }
                book.record(host: hosts[next(3)], port: 443, chain: chain, alpn: nil, at: Self.now.addingTimeInterval(-Double(next(20)) * Self.day))
            }
            let (draft, _) = Self.propose(list, book)
            let proposed = draft.pins.map { (pattern: $0.host, fingerprint: $0.spki ?? "", depth: $0.depth ?? .leaf,
                                             expires: Date(timeIntervalSince1970: TimeInterval($0.expires))) }
            let observedKeys = Set(book.hosts.flatMap(\.chains).flatMap(\.chain).map(\.spki))
            for pin in proposed {
                #expect(pin.expires > Self.now, "an expired pin: \(pin)")
                let inList = entries.contains { $0.name == pin.pattern && $0.fingerprint == pin.fingerprint && $0.depth == pin.depth }
                #expect(inList || observedKeys.contains(pin.fingerprint), "a pin from nowhere: \(pin)")
            }
            for host in book.hosts {
                guard let pattern = patterns.first(where: { (try? HostPattern(parsing: $0))?.matches(host.host) == true }) else { continue }
                let latest = host.chains.map(\.lastSeen).max() ?? .distantPast
                let before = entries.filter { $0.name == pattern }.map { ($0.fingerprint, $0.depth, $0.expires) }
                let after = proposed.filter { $0.pattern == pattern }.map { ($0.fingerprint, $0.depth, $0.expires) }
                for chain in host.chains where latest.timeIntervalSince(chain.lastSeen) <= NextListProposal.currentWindow
                    && (chain.earliestNotAfter ?? .distantFuture) > Self.now && Self.trusts(before, chain.chain) {
                    #expect(Self.trusts(after, chain.chain), "\(host.host) passes today on \(chain.chain.map(\.spki)) but not under \(after)")
                }
                let presentsIssuer = host.chains.contains { latest.timeIntervalSince($0.lastSeen) <= NextListProposal.currentWindow
                    && ($0.earliestNotAfter ?? .distantFuture) > Self.now && $0.chain.count > 1 }
                if presentsIssuer && !after.isEmpty {
                    #expect(after.count >= 2, "\(pattern) has no backup: \(after)")
                }
            }
        }
    }
}
