import Foundation
import PinGateStateFiles
import PinGateTestSupport
import PinGateTLS
import PinList
import PinListService
import Testing

/// The start-up choice between a `--pins` file and the list an earlier run persisted,
/// and the state directory's leftover temporary files: plain values, no gate.
@Suite("A --pins file against the persisted list; leftover temporary files")
struct PinsFileStartupTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let hash = SHA256Digest.base64(Array("certificate".utf8))

    /// A verified v2 list with `sequence` (pins differ per sequence, so bodies differ).
    static func v2(_ sequence: Int64, key: PrivateKey, source: String) throws -> (SignedListDocument, PinList) {
        let body = try PinGateSignedList.sign(.init(sequence: sequence, issuedAt: 1_700_000_000, expiresAt: 1_900_000_000, pins: [
            .init(host: "api\(sequence).example.com", sha256: hash, expires: 1_850_000_000),
        ]), key: key)
        let document = SignedListDocument(format: .pingateV2, source: source, body: body, receivedAt: now)
        return (document, try document.verify(keys: [try key.publicKey()]))
    }

    static func decide(file: (SignedListDocument, PinList), persisted: PinsFileStartup.Persisted) -> PinsFileStartup.Decision {
        PinsFileStartup.decide(path: "/etc/pins.json", document: file.0, list: file.1, persisted: persisted,
                               stateDirectory: "/var/lib/pingate", now: now)
    }

    @Test("an older file stops start-up, naming both sequences and `pingate list forget`; a newer one replaces the copy; the same one is not written again")
    func fileAgainstPersisted() throws {
        let key = try PrivateKey.generateP256()
        let three = try Self.v2(3, key: key, source: "/etc/pins.json")
        let five = try Self.v2(5, key: key, source: "https://lists.example/pins.json")
        let persistedFive = PinsFileStartup.Persisted.verified(path: "/var/lib/pingate/pin-list.json", document: five.0, list: five.1)

        guard case .refuse(let message) = Self.decide(file: three, persisted: persistedFive) else {
            Issue.record("an older --pins file was put in force over the persisted list")
            return
        }
        #expect(message.contains("/etc/pins.json (sequence 3) is older than the list persisted in /var/lib/pingate/pin-list.json (sequence 5)"))
        #expect(message.contains("from https://lists.example/pins.json"))
        #expect(message.contains("`pingate list forget --state-dir /var/lib/pingate`"))

        let seven = try Self.v2(7, key: key, source: "/etc/pins.json")
        guard case .useFile(let provenance, let persist) = Self.decide(file: seven, persisted: persistedFive) else {
            Issue.record("a newer --pins file was refused")
            return
        }
        #expect(provenance.origin == .pinsFile)
        #expect(provenance.reason.contains("(sequence 7); it replaces the list persisted in /var/lib/pingate/pin-list.json (sequence 5)"))
        #expect(persist)

        #expect(Self.decide(file: five, persisted: persistedFive)
            == .useFile(ListProvenance(.pinsFile, "the --pins file /etc/pins.json (sequence 5), the same list as the one persisted"), persist: false))
    }

    @Test("nothing persisted, or a persisted copy that does not verify: the file is in force and persisted, and the reason says so")
    func nothingUsablePersisted() throws {
        let key = try PrivateKey.generateP256()
        let three = try Self.v2(3, key: key, source: "/etc/pins.json")
        guard case .useFile(let fresh, true) = Self.decide(file: three, persisted: .none) else {
            Issue.record("a file with nothing persisted was not put in force and persisted")
            return
        }
        #expect(fresh.reason == "the --pins file /etc/pins.json (sequence 3); no list was persisted before")
        guard case .useFile(let replacing, true) = Self.decide(file: three, persisted: .unverifiable(path: "/s/pin-list.json", error: "bad signature")) else {
            Issue.record("an unverifiable persisted copy stopped the file")
            return
        }
        #expect(replacing.reason.contains("/s/pin-list.json does not verify (bad signature) and is replaced"))
    }

    @Test("Wultra static lists carry no sequence: the file the operator names wins over a different persisted one")
    func noSequence() throws {
        let key = try PrivateKey.generateP256()
        func wultra(_ host: String) throws -> (SignedListDocument, PinList) {
            let entry = try WultraStaticList.sign(name: host, fingerprint: Self.hash, expires: 1_850_000_000, key: key)
            let document = SignedListDocument(format: .wultraStatic, source: host, body: Data(try WultraStaticList.encode([entry]).utf8), receivedAt: Self.now)
            return (document, try document.verify(keys: [try key.publicKey()]))
        }
        let old = try wultra("old.example.com"), new = try wultra("new.example.com")
        guard case .useFile(let provenance, true) = Self.decide(
            file: new, persisted: .verified(path: "/s/pin-list.json", document: old.0, list: old.1)) else {
            Issue.record("a Wultra file was refused over a different persisted Wultra list")
            return
        }
        #expect(provenance.reason.contains("(no sequence); it replaces the list persisted in /s/pin-list.json (no sequence)"))
    }

    @Test("leftover temporary files of dead writers are removed, a live writer's and every other file are kept")
    func leftovers() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        // A pid that is surely not running: past the kernel's pid_max ceiling (4,194,304).
        let dead = "pin-list.json.tmp-4194305-17"
        for name in [dead, "ca.pem", "ca.key", "pin-list.json", "notes.tmp-x-1", "pin-list.json.tmp-1-1"] {
            _ = try directory.write(name, "x")
        }
        #expect(StateFiles.removeLeftovers(in: directory.path) == ([dead], []))
        let kept = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
        // pid 1 (init) is alive: its temporary file may be mid-write, so it stays.
        #expect(kept == ["ca.key", "ca.pem", "notes.tmp-x-1", "pin-list.json", "pin-list.json.tmp-1-1"])
        #expect(StateFiles.removeLeftovers(in: directory.file("missing")) == ([], []))
    }
}
