import Foundation
import PinGateStateFiles
import PinGateTestSupport
import PinGateTLS
import Synchronization
import Testing
@testable import PinGateCA

/// The local CA's files and the leaves it mints, checked by the `openssl` command itself.
@Suite("Local CA and leaf minting")
struct LocalCATests {
    @Test("ca init writes ca.pem and a 0600 ca.key in a 0700 directory; load round-trips; a second init refuses")
    func createAndLoad() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let state = directory.file("state/nested")
        let created = try LocalCA.create(stateDirectory: state)
        let paths = LocalCA.Paths(stateDirectory: state)
        let keyMode = try FileManager.default.attributesOfItem(atPath: paths.key)[.posixPermissions] as? Int
        let directoryMode = try FileManager.default.attributesOfItem(atPath: state)[.posixPermissions] as? Int
        #expect(keyMode == 0o600)
        #expect(directoryMode == 0o700)
        let loaded = try LocalCA.load(stateDirectory: state)
        #expect(loaded.certificate.sha256Fingerprint == created.certificate.sha256Fingerprint)
        #expect(throws: LocalCA.CAError.self) { try LocalCA.create(stateDirectory: state) }
        let (again, wasCreated) = try LocalCA.loadOrCreate(stateDirectory: state)
        #expect(!wasCreated)
        #expect(again.certificate.sha256Fingerprint == created.certificate.sha256Fingerprint)
    }

    @Test("twelve processes' worth of loadOrCreate at once on an empty directory: one creates, the others load that CA, none sees it half written (a gate and `pingate env` started together)")
    func concurrentLoadOrCreate() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let state = directory.file("state")
        let results = Mutex<[(fingerprint: String, created: Bool)]>([])
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 12) { _ in
            do {
                let (ca, created) = try LocalCA.loadOrCreate(stateDirectory: state)
                results.withLock { $0.append((ca.certificate.sha256Fingerprint, created)) }
            } catch {
                failures.withLock { $0.append("\(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        let all = results.withLock { $0 }
        #expect(all.filter(\.created).count == 1)
        #expect(Set(all.map(\.fingerprint)).count == 1)
        #expect(try LocalCA.load(stateDirectory: state).certificate.sha256Fingerprint == all.first?.fingerprint)
    }

    @Test("a CA half written by another process (its key, not yet its certificate, under the lock) is waited for, never loaded as incomplete")
    func halfWrittenIsWaitedFor() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let made = try LocalCA.create(stateDirectory: directory.file("made"))
        let madePaths = LocalCA.Paths(stateDirectory: directory.file("made"))
        let state = directory.file("state")
        let paths = LocalCA.Paths(stateDirectory: state)
        let outcome = Mutex<String?>(nil)
        let loader = Thread {
            let text: String
            do {
                let (ca, created) = try LocalCA.loadOrCreate(stateDirectory: state)
                text = "\(created ? "created" : "loaded") \(ca.certificate.sha256Fingerprint)"
            } catch {
                text = "failed: \(error)"
            }
            outcome.withLock { $0 = text }
        }
        try StateFiles.withExclusiveLock(in: state) {
            // What a creator has done half way: the key is written first.
            try StateFiles.writeAtomically(Array(try String(contentsOfFile: madePaths.key, encoding: .utf8).utf8), to: paths.key, mode: 0o600)
            loader.start()
            usleep(300_000)
            #expect(outcome.withLock { $0 } == nil, "it did not wait for the lock: \(outcome.withLock { $0 } ?? "")")
            try StateFiles.writeAtomically(Array(try String(contentsOfFile: madePaths.certificate, encoding: .utf8).utf8), to: paths.certificate, mode: 0o644)
        }
        let deadline = Date().addingTimeInterval(10)
        while outcome.withLock({ $0 }) == nil && Date() < deadline { usleep(10_000) }
        #expect(outcome.withLock { $0 } == "loaded \(made.certificate.sha256Fingerprint)")
    }

    @Test("a key that does not belong to the certificate is refused")
    func mismatchedKey() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        _ = try LocalCA.create(stateDirectory: directory.path)
        try PrivateKey.generateP256().pkcs8PEM().write(toFile: LocalCA.Paths(stateDirectory: directory.path).key, atomically: true, encoding: .utf8)
        #expect(throws: LocalCA.CAError.self) { try LocalCA.load(stateDirectory: directory.path) }
    }

    @Test("minted leaves pass `openssl verify -verify_hostname` (and -verify_ip), and fail for another name")
    func opensslVerifiesLeaves() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let ca = try LocalCA.create(stateDirectory: directory.path)
        let minter = try LeafMinter(ca: ca)
        let caPath = LocalCA.Paths(stateDirectory: directory.path).certificate

        let named = try directory.write("named.pem", try minter.leaf(for: "api.example.test").certificate.pemString())
        let good = try await TestProcess.run("openssl", ["verify", "-CAfile", caPath, "-purpose", "sslserver", "-verify_hostname", "api.example.test", named])
        #expect(good.status == 0, "\(good.stdout)\(good.stderr)")
        #expect(good.stdout.contains("OK"))
        let wrong = try await TestProcess.run("openssl", ["verify", "-CAfile", caPath, "-verify_hostname", "evil.example.test", named])
        #expect(wrong.status != 0)

        let ip = try directory.write("ip.pem", try minter.leaf(for: "::1").certificate.pemString())
        let ipCheck = try await TestProcess.run("openssl", ["verify", "-CAfile", caPath, "-verify_ip", "::1", ip])
        #expect(ipCheck.status == 0, "\(ipCheck.stdout)\(ipCheck.stderr)")

        let text = try await TestProcess.run("openssl", ["x509", "-in", named, "-noout", "-text"])
        #expect(text.stdout.contains("prime256v1") || text.stdout.contains("P-256"))
        #expect(text.stdout.contains("TLS Web Server Authentication"))
        #expect(text.stdout.contains("CA:FALSE"))
    }

    @Test("the leaf cache is a bounded LRU: hits reuse, the least recently used host is evicted")
    func leafCache() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let minter = try LeafMinter(ca: try LocalCA.create(stateDirectory: directory.path), capacity: 2)
        let a1 = try minter.leaf(for: "a.test")
        _ = try minter.leaf(for: "b.test")
        let a2 = try minter.leaf(for: "a.test") // hit; a becomes most recent
        #expect(a1.certificate.sha256Fingerprint == a2.certificate.sha256Fingerprint)
        #expect(minter.mintedCount == 2)
        _ = try minter.leaf(for: "c.test") // evicts b
        #expect(minter.cachedCount == 2)
        _ = try minter.leaf(for: "a.test") // still cached
        #expect(minter.mintedCount == 3)
        _ = try minter.leaf(for: "b.test") // was evicted: minted again
        #expect(minter.mintedCount == 4)
    }

    @Test("a cached leaf close to expiry is minted afresh")
    func leafRefresh() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let minter = try LeafMinter(ca: try LocalCA.create(stateDirectory: directory.path), validity: 3600)
        let now = Date()
        _ = try minter.leaf(for: "a.test", now: now)
        _ = try minter.leaf(for: "a.test", now: now.addingTimeInterval(600))
        #expect(minter.mintedCount == 1)
        _ = try minter.leaf(for: "a.test", now: now.addingTimeInterval(3000))
        #expect(minter.mintedCount == 2)
    }
}
