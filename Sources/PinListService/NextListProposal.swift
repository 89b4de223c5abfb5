import Foundation
import PinList

/// `pingate list propose --next`: the list that follows the one in force, from the list and
/// what the gate observed while enforcing it (issue 34). Plain values in and out.
///
/// For each pattern of the list:
/// - a pin that matches a chain its hosts present now is kept;
/// - a pin past its `expires` is dropped;
/// - a pin that matched only chains its hosts no longer present (a leaf rotated away, an
///   intermediate replaced) is dropped;
/// - a pin that matched nothing observed is kept: nothing says it changed (a host no client
///   reached), or it is a backup key not yet in use;
/// - where a host passes now only on a deeper pin (pin health's `backup-only`), the key of
///   the leaf it now presents is added, so the next rotation of its issuer does not refuse
///   it;
/// - every pattern keeps a backup: a second pin, the issuer's key at depth 1 added when it
///   has none.
///
/// Only chains in the observations are used, and the gate records only chains OpenSSL
/// validated, so no pin is added for a chain that did not validate; and only chains a pin of
/// the list carried lead to an addition (a new host is for `list propose`, after learn mode).
public enum NextListProposal {
    /// A chain seen for a host counts as what the host presents now when it was last seen
    /// within this long of the host's latest chain (a load balancer may serve old and new
    /// leaves side by side during a rollout).
    public static let currentWindow: TimeInterval = 7 * 86_400

    /// What to propose.
    public struct Options: Sendable {
        /// The format of the next list: v2 (key pins at any depth) or Wultra's static
        /// format (leaf certificates only); nil: the format of the list in force.
        public var format: ListProposal.Format?
        /// The time expiries are judged at.
        public var now = Date()

        /// Default options: the list's own format, now.
        public init() {}
    }

    /// The draft (with the next sequence and every change explained), and notes for stderr.
    public static func propose(list: PinList, book: ObservationBook, options: Options, source: String) -> (draft: ListDraft, notes: [String]) {
        let now = options.now
        let format = options.format ?? (list.metadata.format == .pingateV2 ? .v2 : .wultraStatic)
        var notes: [String] = []
        var changes: [String] = []
        let observed = ObservedHosts(book: book, now: now)

        // The list's pins grouped by pattern, in the list's order.
        var patterns: [String] = []
        var entriesByPattern: [String: [PinEntry]] = [:]
        for entry in list.entries {
            if entriesByPattern[entry.name] == nil { patterns.append(entry.name) }
            entriesByPattern[entry.name, default: []].append(entry)
        }

        var pins: [ListDraft.Pin] = []
        for pattern in patterns {
            let entries = entriesByPattern[pattern] ?? []
            let hosts = observed.hosts(coveredBy: entries[0].host)
            var kept: [ListDraft.Pin] = []
            for entry in entries {
                let text = "\(pattern) depth-\(entry.depth) \(entry.kind.rawValue) \(entry.fingerprint)"
                guard entry.isUnexpired(at: now) else {
                    changes.append("dropped \(text): it expired at \(iso(entry.expires))")
                    continue
                }
                if format == .wultraStatic && (entry.kind != .certificate || !entry.depth.isLeaf) {
                    changes.append("dropped \(text): Wultra's static format holds leaf certificate pins only")
                    continue
                }
                let current = hosts.flatMap { host in host.current.filter { entry.match(chain: $0.chain) }.map { (host.name, $0) } }
                let earlier = hosts.flatMap { host in host.earlier.filter { entry.match(chain: $0.chain) }.map { (host.name, $0) } }
                let why: String
                if let (host, chain) = current.max(by: { $0.1.lastSeen < $1.1.lastSeen }) {
                    why = "still matches what \(host) presents (seen until \(iso(chain.lastSeen)))"
                } else if let (host, chain) = earlier.max(by: { $0.1.lastSeen < $1.1.lastSeen }) {
                    changes.append("dropped \(text): \(host) presented it until \(iso(chain.lastSeen)) and presents another chain now")
                    continue
                } else if hosts.isEmpty {
                    why = "kept: no client reached a host it covers while the gate observed, so nothing says it changed"
                } else {
                    why = "kept: it matches nothing \(hosts.map(\.name).joined(separator: ", ")) presented (a backup key not in use yet?); remove it by hand if it is retired"
                }
                kept.append(ListDraft.Pin(entry: entry, why: why))
            }

            // The key of the leaf each host now presents where only a deeper pin carried it.
            // (Judged from the list itself, as pin health judges `backup-only`: the pattern has
            // leaf pins, none matches the leaf, a deeper pin matches the chain.)
            let live = entries.filter { $0.isUnexpired(at: now) }
            for host in hosts {
                guard let latest = host.current.first, let leaf = latest.chain.first else { continue }
                let carriedDeeper = live.contains { $0.depth.isLeaf } && !live.contains { $0.depth.isLeaf && $0.match(chain: latest.chain) }
                    && live.contains { !$0.depth.isLeaf && $0.match(chain: latest.chain) }
                let leafPinned = kept.contains { $0.pinsLeaf(leaf) }
                guard carriedDeeper, !leafPinned else { continue }
                let expires = leaf.notAfter ?? now.addingTimeInterval(90 * 86_400)
                let seen = "\(host.name) has presented it since \(iso(latest.firstSeen)) (\(latest.count) tunnel\(latest.count == 1 ? "" : "s")), passing on a deeper pin only"
                let pin: ListDraft.Pin
                switch format {
                case .v2:
                    pin = ListDraft.Pin(host: pattern, spki: leaf.spki, expires: Int64(expires.timeIntervalSince1970),
                                        why: "added: the key of the leaf \(leaf.subject): \(seen); expires with the certificate (notAfter \(iso(expires)))")
                case .wultraStatic:
                    pin = ListDraft.Pin(host: pattern, sha256: leaf.sha256, expires: Int64(expires.timeIntervalSince1970),
                                        why: "added: the leaf certificate \(leaf.subject): \(seen); expires with the certificate (notAfter \(iso(expires)))")
                }
                changes.append("added \(pattern) depth-0 \(pin.spki != nil ? "spki \(leaf.spki)" : "sha256 \(leaf.sha256)"): the leaf \(host.name) now presents, which only a deeper pin carried")
                kept.append(pin)
            }

            // A backup for every pattern: from the most recent chain with an issuer that a
            // host it covers presents, the issuer's key (depth 1); when that is the one pin
            // already, the key above it (depth 2), else the leaf's.
            // (A pattern whose pins all went gets two: a backup needs something to back up.)
            let chain = hosts.flatMap(\.current).sorted { $0.lastSeen > $1.lastSeen }.first { $0.chain.count > 1 }?.chain ?? []
            let candidates = [1, 2, 0].filter { chain.indices.contains($0) }.map { (position: $0, certificate: chain[$0]) }
            while kept.count < 2 {
                let backup = candidates.first { candidate in
                    !kept.contains { $0.spki == candidate.certificate.spki && ($0.depth ?? .leaf) == .position(candidate.position) }
                }
                if format == .v2, let backup, let expiresAt = Optional(backup.certificate.notAfter ?? now.addingTimeInterval(365 * 86_400)) {
                    let role = switch backup.position {
                    case 1: "which issues the leaf presented now (depth 1 of the validated chain), so a re-keyed leaf from the same CA passes"
                    case 2: "the CA above the issuer (depth 2 of the validated chain), so a leaf from a new issuer under it passes"
                    default: "the leaf presented now"
                    }
                    kept.append(ListDraft.Pin(host: pattern, spki: backup.certificate.spki, depth: backup.position == 0 ? nil : .position(backup.position),
                                              expires: Int64(expiresAt.timeIntervalSince1970),
                                              why: "added as the backup: the key of \(backup.certificate.subject), \(role); expires with that certificate (notAfter \(iso(expiresAt)))"))
                    changes.append("added \(pattern) depth-\(backup.position) spki \(backup.certificate.spki): a backup, the pattern having \(kept.count == 1 ? "no pin" : "one pin") left")
                } else {
                    if kept.count == 1 {
                        notes.append("\(pattern): one pin and no backup: \(format == .v2 ? "no chain with an issuer was observed for it" : "Wultra's static format pins leaves only"); add a second pin by hand (list lint warns about it)")
                    }
                    break
                }
            }
            if kept.isEmpty {
                notes.append("\(pattern): left out: none of its pins is still good, and nothing observed would replace them; it would be refused (empty) under the next list")
            }
            pins += kept.sorted { ListProposal.depthOrder($0.depth) < ListProposal.depthOrder($1.depth) }
        }
        for host in observed.all where !patterns.contains(where: { (try? HostPattern(parsing: $0))?.matches(host.name) == true }) {
            notes.append("\(host.name): observed, but no pin of the list covers it: not proposed here (pingate list propose, after learn mode, proposes new hosts)")
        }
        let sequence = list.metadata.sequence.map { $0 + 1 }
        let comment = "pingate list propose --next: the list after \(list.source)"
            + (list.metadata.sequence.map { " (sequence \($0))" } ?? "")
            + ", from what the gate observed (\(source)), made \(iso(now)). \(changes.count) change\(changes.count == 1 ? "" : "s"). Review it (pingate list diff), then sign it: pingate sign --draft FILE --key signer.key --format "
            + (format == .v2 ? "v2" + (sequence.map { " (sequence \($0), from the draft)" } ?? " --sequence N") : "static")
        return (ListDraft(comment: comment, pins: pins, sequence: format == .v2 ? sequence : nil, changes: changes), notes)
    }

    private static func iso(_ date: Date) -> String { InternetTime.text(date) }
}

/// The observations by host name (ports merged), each host's chains split into what it
/// presents now and what it presented before.
struct ObservedHosts {
    struct Host {
        var name: String
        /// Chains seen within `NextListProposal.currentWindow` of the latest, latest first,
        /// whose certificates have not expired.
        var current: [ObservedChain]
        /// The others.
        var earlier: [ObservedChain]
    }

    let all: [Host]

    init(book: ObservationBook, now: Date) {
        var chainsByName: [String: [ObservedChain]] = [:]
        for host in book.hosts { chainsByName[host.host, default: []] += host.chains }
        all = chainsByName.keys.sorted().map { name in
            let chains = (chainsByName[name] ?? []).sorted { $0.lastSeen > $1.lastSeen }
            let latest = chains.first?.lastSeen ?? .distantPast
            let isCurrent = { (chain: ObservedChain) in
                latest.timeIntervalSince(chain.lastSeen) <= NextListProposal.currentWindow && (chain.earliestNotAfter ?? .distantFuture) > now
            }
            return Host(name: name, current: chains.filter(isCurrent), earlier: chains.filter { !isCurrent($0) })
        }
    }

    /// The hosts `pattern` covers.
    func hosts(coveredBy pattern: HostPattern) -> [Host] {
        all.filter { pattern.matches($0.name) }
    }
}

extension PinEntry {
    /// True when this pin matches the observed validated `chain` (leaf first).
    func match(chain: [ObservedCertificate]) -> Bool {
        let hashes = chain.map { CertificateHashes(certificateSHA256: $0.sha256, spkiSHA256: $0.spki) }
        guard let leaf = hashes.first else { return false }
        return match(leaf: leaf, verifiedChain: hashes) != nil
    }
}

extension ListDraft.Pin {
    /// The list's `entry` as a draft pin, with `why`.
    init(entry: PinEntry, why: String) {
        self.init(host: entry.name, sha256: entry.kind == .certificate ? entry.fingerprint : nil,
                  spki: entry.kind == .spki ? entry.fingerprint : nil, depth: entry.depth.isLeaf ? nil : entry.depth,
                  expires: Int64(entry.expires.timeIntervalSince1970), why: why)
    }

    /// True when this is a leaf pin on `leaf` (its key or its certificate).
    func pinsLeaf(_ leaf: ObservedCertificate) -> Bool {
        guard depth == nil || depth == .leaf else { return false }
        return spki == leaf.spki || sha256 == leaf.sha256
    }
}
