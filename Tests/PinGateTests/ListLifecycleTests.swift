import Foundation
import NIOCore
import PinGateTestSupport
import PinGateTLS
import PinList
import Synchronization
import Testing
@testable import PinGate
import PinGateHarness
@testable import PinListService

/// The list lifecycle against a real HTTPS list server on loopback: updates reach new
/// and live connections, every bad update is refused and counted while the list in
/// force stays, persistence survives restarts, and certificates rotate without refusals.
@Suite("Fingerprint list lifecycle")
struct ListLifecycleTests {
    /// A gate fed by a list server, with two pinned origins ready.
    struct Setup {
        let directory: TemporaryDirectory
        let pki: TestPKI
        let listServer: TestListServer
        let listIdentity: TestPKI.Identity
        let originA: LoopbackOrigin
        let leafA: TestPKI.Identity
        let originB: LoopbackOrigin
        let leafB: TestPKI.Identity
        static let hostA = "a.pingate.test"
        static let hostB = "b.pingate.test"

        static func start(initialPins: (TestPKI, TestPKI.Identity, TestPKI.Identity) throws -> Data) async throws -> Setup {
            // A part that fails to start must not leave the parts before it running.
            try await startInParts { started in
                let directory = try TemporaryDirectory()
                started.onFailure { directory.remove() }
                let pki = try TestPKI(directory: directory)
                let leafA = try pki.leaf([.dns(hostA)], issuer: pki.originCA, file: "a")
                let leafB = try pki.leaf([.dns(hostB)], issuer: pki.originCA, file: "b")
                let listIdentity = try pki.leaf([.dns("lists.pingate.test")], issuer: pki.originCA, file: "lists")
                let listServer = try await TestListServer.start(identity: listIdentity, behaviour: .serve(try initialPins(pki, leafA, leafB)))
                started.onFailure { await listServer.stop() }
                let originA = try await LoopbackOrigin.start(identity: leafA, behaviour: .http(body: "A"), alpn: nil)
                started.onFailure { await originA.stop() }
                let originB = try await LoopbackOrigin.start(identity: leafB, behaviour: .echo, alpn: nil)
                return Setup(directory: directory, pki: pki, listServer: listServer, listIdentity: listIdentity,
                             originA: originA, leafA: leafA, originB: originB, leafB: leafB)
            }
        }

        /// Starts the list server and both origins as `start` does, runs `body` with them,
        /// and stops them whether `body` returns or throws. `body` may stop the list server
        /// itself (a restart with it down): its `stop()` is idempotent.
        static func with<Value>(
            initialPins: (TestPKI, TestPKI.Identity, TestPKI.Identity) throws -> Data,
            isolation: isolated (any Actor)? = #isolation,
            _ body: (Setup) async throws -> Value
        ) async throws -> Value {
            try await withResource(start: { try await start(initialPins: initialPins) }, stop: { await $0.stop() }, body: body)
        }

        func source(format: PinListFormat? = nil, path: String = "/pins.json") -> PinListSource {
            var source = PinListSource(location: .url(URL(string: "https://lists.pingate.test:\(listServer.port)\(path)")!),
                                       format: format, keys: [(try? pki.signer.publicKey())!])
            source.serverTrust = .pemFiles([pki.originCA.certificatePath])
            source.fetchTimeout = .milliseconds(700)
            source.directWait = .milliseconds(600)
            source.retryBase = 3600 // tests drive updates themselves
            return source
        }

        var resolve: [String] {
            ["\(Self.hostA):\(originA.port)", "\(Self.hostB):\(originB.port)", "lists.pingate.test:\(listServer.port)"]
        }

        /// Runs `body` with a gate fed by this list server (through `source`, by default
        /// `source()`), and stops the gate whether `body` returns or throws.
        func withGate<Value>(
            source: PinListSource? = nil,
            stateDirectory: String? = nil,
            isolation: isolated (any Actor)? = #isolation,
            _ body: (GateFixture) async throws -> Value
        ) async throws -> Value {
            // B is an echo origin driven by raw TLS clients: relayed as bytes (opaque).
            try await GateFixture.with(pki: pki, listPath: nil, resolve: resolve, listSource: source ?? self.source(),
                                       stateDirectory: stateDirectory, configure: { $0.opaqueHosts = [Setup.hostB] }, body)
        }

        /// Stops the list server and both origins and removes the files. Safe to call more than once.
        func stop() async {
            await listServer.stop()
            await originA.stop()
            await originB.stop()
            directory.remove()
        }
    }

    @Test("a newly published list is picked up: an empty host becomes allowed; a revoked pin closes an open tunnel and refuses new CONNECTs")
    func publishAndRevoke() async throws {
        try await Setup.with(initialPins: { pki, a, _ in try pki.signedV2(sequence: 1, pins: [TestPKI.pin(Setup.hostA, a)]) }) { setup in
            try await setup.withGate { gate in
                let urlB = "https://\(Setup.hostB):\(setup.originB.port)/"

                let before = try await curlThroughGate(gate, urlB)
                #expect(before.proxyHeaders["pingate-refusal"] == "empty")

                setup.listServer.set(.serve(try setup.pki.signedV2(sequence: 2, pins: [TestPKI.pin(Setup.hostA, setup.leafA), TestPKI.pin(Setup.hostB, setup.leafB)])))
                let update = try await #require(gate.server.updater).updateNow().get()
                #expect(update == .installed(sequence: 2))

                // An open tunnel to B (the echo origin), held by a Python client.
                let flag = setup.directory.file("tunnel-up")
                let script = """
                import os, socket, ssl, sys, time
                raw = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
                raw.sendall(f"CONNECT {sys.argv[2]} HTTP/1.1\\r\\n\\r\\n".encode())
                head = b""
                while b"\\r\\n\\r\\n" not in head: head += raw.recv(1)
                assert head.startswith(b"HTTP/1.1 200"), head
                tls = ssl.create_default_context(cafile=sys.argv[3]).wrap_socket(raw, server_hostname=sys.argv[2].split(":")[0])
                tls.sendall(b"ping"); assert tls.recv(4) == b"ping"
                open(sys.argv[4], "w").close()
                try:
                    data = tls.recv(1)
                except (ssl.SSLError, OSError):
                    data = b""
                print("closed" if data == b"" else "open")
                """
                let client = Task { try await TestProcess.run("python3", ["-c", script, "\(gate.port)", "\(Setup.hostB):\(setup.originB.port)", gate.caPath, flag], timeout: 30) }
                _ = await eventually(timeout: .seconds(5)) { FileManager.default.fileExists(atPath: flag) }
                #expect(gate.server.statistics.snapshot.openTunnels == 1)

                setup.listServer.set(.serve(try setup.pki.signedV2(sequence: 3, pins: [TestPKI.pin(Setup.hostA, setup.leafA), TestPKI.pin(Setup.hostB, setup.leafB)],
                                                                   revoked: [setup.leafB.fingerprint])))
                #expect(try await gate.server.updater?.updateNow().get() == .installed(sequence: 3))
                let held = try await client.value
                #expect(held.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "closed", "\(held.stderr)")

                let after = try await curlThroughGate(gate, urlB)
                #expect(after.proxyHeaders["pingate-refusal"] == "revoked")
                let stats = gate.statistics
                #expect(stats.tunnelsClosedByUpdate["revoked"] == 1)
                #expect(gate.server.store.status.updatesByResult["ok"] == 3)
            }
        }
    }

    @Test("every bad update is refused and counted, and the list in force stays")
    func badUpdatesAreRefused() async throws {
        try await Setup.with(initialPins: { pki, a, _ in try pki.signedV2(sequence: 5, pins: [TestPKI.pin(Setup.hostA, a)]) }) { setup in
            try await setup.withGate { gate in
                let updater = try #require(gate.server.updater)
                let pki = setup.pki
                let good = try pki.signedV2(sequence: 6, pins: [TestPKI.pin(Setup.hostA, setup.leafA)])
                var tampered = try JSONDecoder().decode(PinGateSignedList.Envelope.self, from: good)
                var payload = try #require(Data(base64Encoded: tampered.payload))
                payload[payload.count - 5] ^= 0x01
                tampered.payload = payload.base64EncodedString()

                let cases: [(String, TestListServer.Behaviour)] = [
                    ("invalid-signature", .serve(try JSONEncoder().encode(tampered))),
                    ("invalid-signature", .serve(try pki.signedV2(sequence: 6, pins: [], key: try PrivateKey.generateP256()))),
                    ("rollback", .serve(try pki.signedV2(sequence: 4, pins: [TestPKI.pin(Setup.hostA, setup.leafA)]))),
                    ("network-error", .truncated(good)),
                    ("invalid-data", .serve(Data("<html>garbage</html>".utf8))),
                    ("server-error", .status(500)),
                    ("timeout", .hang),
                ]
                for (expected, behaviour) in cases {
                    setup.listServer.set(behaviour)
                    let outcome = try await updater.updateNow().get()
                    guard case .rejected(let rejection) = outcome else {
                        Issue.record("\(expected): was installed")
                        continue
                    }
                    #expect(rejection.token == expected, "\(rejection)")
                    #expect(gate.server.store.list?.metadata.sequence == 5, "after \(expected)")
                }
                let counts = gate.server.store.status.updatesByResult
                #expect(counts["invalid-signature"] == 2)
                for token in ["rollback", "network-error", "invalid-data", "server-error", "timeout"] {
                    #expect(counts[token] == 1, "\(token): \(counts)")
                }
                // Still enforcing the list in force.
                let stillWorks = try await curlThroughGate(gate, "https://\(Setup.hostA):\(setup.originA.port)/")
                #expect(String(decoding: stillWorks.body, as: UTF8.self) == "A")
            }
        }
    }

    @Test("Wultra dynamic: a fresh challenge per request; a wrong or missing signature is refused")
    func dynamicMode() async throws {
        try await Setup.with(initialPins: { _, _, _ in Data() }) { setup in
            let body = Data(#"{"timestamp":1763790000,"fingerprints":[{"name":"a.pingate.test","fingerprint":"FINGERPRINT","expires":2110000000}]}"#
                .replacingOccurrences(of: "FINGERPRINT", with: setup.leafA.fingerprint).utf8)
            setup.listServer.set(.dynamic(body, key: setup.pki.signer))
            try await setup.withGate(source: setup.source(format: .wultraDynamic, path: "/service")) { gate in
                let updater = try #require(gate.server.updater)
                #expect(gate.server.store.list?.metadata.format == .wultraDynamic)
                let ok = try await curlThroughGate(gate, "https://\(Setup.hostA):\(setup.originA.port)/")
                #expect(String(decoding: ok.body, as: UTF8.self) == "A")

                setup.listServer.set(.dynamic(body, key: try PrivateKey.generateP256()))
                guard case .rejected(let wrong) = try await updater.updateNow().get() else { Issue.record("wrong key accepted"); return }
                #expect(wrong.token == "invalid-signature")
                setup.listServer.set(.dynamic(body, key: nil))
                guard case .rejected(let missing) = try await updater.updateNow().get() else { Issue.record("unsigned accepted"); return }
                #expect(missing.token == "invalid-signature")
                setup.listServer.set(.dynamic(body, key: setup.pki.signer, signatureHeaderName: "x-cert-pinning-SIGNATURE"))
                #expect(try await updater.updateNow().get() == .installed(sequence: nil))

                let requests = setup.listServer.receivedRequests
                #expect(requests.allSatisfy { $0.uri == "/service/app/init?appName=pingate" })
                let challenges = requests.compactMap { $0.headers.first(name: "X-Cert-Pinning-Challenge") }
                #expect(challenges.count == requests.count)
                #expect(Set(challenges).count == challenges.count, "every request carries a fresh challenge")
                #expect(challenges.allSatisfy { Data(base64Encoded: $0)?.count == 16 })
            }
        }
    }

    @Test("restart with the list server down enforces the persisted list; an edited persisted file is rejected at load (503 list-unavailable)")
    func persistenceAcrossRestarts() async throws {
        try await Setup.with(initialPins: { pki, a, _ in try pki.signedV2(sequence: 9, pins: [TestPKI.pin(Setup.hostA, a)]) }) { setup in
            let state = setup.directory.file("gate-state")
            let urlA = "https://\(Setup.hostA):\(setup.originA.port)/"
            // Three gates in turn on one state directory: each scope ends (its gate stopped)
            // before the next gate starts.
            try await setup.withGate(stateDirectory: state) { first in
                #expect(first.server.store.list?.metadata.sequence == 9)
            }

            setup.listServer.set(.status(503))
            try await setup.withGate(stateDirectory: state) { second in
                #expect(second.server.store.list?.metadata.sequence == 9)
                let allowed = try await curlThroughGate(second, urlA)
                #expect(String(decoding: allowed.body, as: UTF8.self) == "A", "\(allowed.stderr)")
            }

            let persisted = PinListPersistence(stateDirectory: state).path
            var text = try String(contentsOfFile: persisted, encoding: .utf8)
            text = text.replacingOccurrences(of: "\"format\" : \"pingate-v2\"", with: "\"format\" : \"wultra-static\"")
            try text.write(toFile: persisted, atomically: true, encoding: .utf8)
            try await setup.withGate(stateDirectory: state) { third in
                #expect(third.server.store.list == nil)
                let refused = try await curlThroughGate(third, urlA)
                #expect(refused.stderr.contains("CONNECT tunnel failed, response 503"))
                #expect(refused.proxyHeaders["pingate-refusal"] == "list-unavailable")
            }
        }
    }

    @Test("rotation drill: A and B pinned, the origin switches to B with zero refusals, then A is dropped and refused")
    func rotationDrill() async throws {
        try await Setup.with(initialPins: { _, _, _ in Data() }) { setup in
            let pki = setup.pki
            let host = Setup.hostA
            let certA = setup.leafA
            let certB = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "a-next")
            setup.listServer.set(.serve(try pki.signedV2(sequence: 1, pins: [TestPKI.pin(host, certA), TestPKI.pin(host, certB)])))
            try await setup.withGate { gate in
                let url = "https://\(host):\(setup.originA.port)/"
                var refusals = 0
                for round in 0..<6 {
                    if round == 3 { try setup.originA.present(certB) }
                    let result = try await curlThroughGate(gate, url)
                    if result.exitStatus != 0 || String(decoding: result.body, as: UTF8.self) != "A" { refusals += 1 }
                }
                #expect(refusals == 0)

                setup.listServer.set(.serve(try pki.signedV2(sequence: 2, pins: [TestPKI.pin(host, certB)])))
                #expect(try await gate.server.updater?.updateNow().get() == .installed(sequence: 2))
                try setup.originA.present(certA)
                let old = try await curlThroughGate(gate, url)
                #expect(old.proxyHeaders["pingate-refusal"] == "pin-mismatch")
                #expect(old.proxyHeaders["pingate-observed-fingerprint"] == certA.fingerprint)
                try setup.originA.present(certB)
                let current = try await curlThroughGate(gate, url)
                #expect(current.exitStatus == 0)
            }
        }
    }
}

/// The pool threads held by `scheduleDoesNotWaitForThePool`, and what was seen meanwhile.
private final class PoolHold: Sendable {
    let arrived = Atomic<Int>(0)
    let window = Mutex<(before: Int, after: Int)?>(nil)
}

/// Silent mode and the list server's own pin.
@Suite("List updates on schedule")
struct ScheduledUpdateTests {
    /// A gate fed by the list server (sequence 1 pinning host A) on a schedule due every 0.2 s.
    static func withGateOnFastSchedule(_ body: (ListLifecycleTests.Setup, GateFixture) async throws -> Void) async throws {
        try await ListLifecycleTests.Setup.with(initialPins: { pki, a, _ in try pki.signedV2(sequence: 1, pins: [TestPKI.pin(ListLifecycleTests.Setup.hostA, a)]) }) { setup in
            var source = setup.source()
            source.schedule = UpdateSchedule(periodicInterval: 0.2, expirationThreshold: 0, minimumInterval: 0.2)
            try await setup.withGate(source: source) { gate in try await body(setup, gate) }
        }
    }

    @Test("silent mode: the gate fetches again by itself on the schedule and puts the new list in force")
    func silentUpdates() async throws {
        try await Self.withGateOnFastSchedule { setup, gate in
            setup.listServer.set(.serve(try setup.pki.signedV2(sequence: 2, pins: [TestPKI.pin(ListLifecycleTests.Setup.hostA, setup.leafA)])))
            // Due every 0.2 s; the wait is long only for a machine loaded by the suites
            // running beside this one (it ends as soon as the new list is in force).
            _ = await eventually(timeout: .seconds(10)) { gate.server.store.list?.metadata.sequence == 2 }
            #expect(gate.server.store.list?.metadata.sequence == 2)
            #expect(setup.listServer.receivedRequests.count >= 2)
        }
    }

    @Test("the schedule keeps time with every thread of Swift's cooperative pool held: list requests still arrive on the 0.2 s schedule (its timer is on the event loop)")
    func scheduleDoesNotWaitForThePool() async throws {
        try await Self.withGateOnFastSchedule { setup, _ in
            // One blocking job per pool thread, released together: while they all sleep,
            // no task on the pool runs (the suite beside this one, on a busy machine,
            // did the same to the schedule's old sleeping task for seconds at a time).
            let width = ProcessInfo.processInfo.activeProcessorCount
            let held = PoolHold()
            let listServer = setup.listServer
            await withTaskGroup(of: Void.self) { group in
                for index in 0..<width {
                    group.addTask {
                        held.arrived.add(1, ordering: .sequentiallyConsistent)
                        // Bounded: a pool wider than the processor count never fills, and
                        // the others must not hold every thread (and every test) for long.
                        let deadline = Date().addingTimeInterval(3)
                        while held.arrived.load(ordering: .sequentiallyConsistent) < width && Date() < deadline { usleep(1_000) }
                        guard index == 0 else { _ = usleep(1_700_000); return }
                        let before = listServer.receivedRequests.count
                        usleep(1_500_000)
                        held.window.withLock { $0 = (before, listServer.receivedRequests.count) }
                    }
                }
            }
            let counts = try #require(held.window.withLock { $0 })
            #expect(counts.after - counts.before >= 2, "\(counts.after - counts.before) list requests in 1.5 s with the pool held")
        }
    }

    @Test("a list server that does not match its configured pin is refused")
    func listServerPin() async throws {
        try await ListLifecycleTests.Setup.with(initialPins: { pki, a, _ in
            try pki.signedV2(sequence: 1, pins: [TestPKI.pin(ListLifecycleTests.Setup.hostA, a)])
        }) { setup in
            var wrongPin = setup.source()
            wrongPin.serverPins = [setup.leafA.fingerprint]
            try await setup.withGate(source: wrongPin) { refused in
                #expect(refused.server.store.list == nil)
                #expect(refused.server.store.status.lastResult == "network-error")
            }

            var rightPin = setup.source()
            rightPin.serverPins = [setup.listIdentity.certificate.spkiSHA256]
            try await setup.withGate(source: rightPin) { accepted in
                #expect(accepted.server.store.list?.metadata.sequence == 1)
            }
        }
    }
}

/// The bundled fallback list.
@Suite("Fallback list")
struct FallbackListTests {
    @Test("with the list server failing and nothing persisted, the bundled fallback is used; a fetched list replaces it")
    func fallback() async throws {
        try await ListLifecycleTests.Setup.with(initialPins: { _, _, _ in Data() }) { setup in
            setup.listServer.set(.status(500))
            let fallbackPath = try setup.directory.write("fallback.json", String(decoding: try setup.pki.signedV2(
                sequence: 1, pins: [TestPKI.pin(ListLifecycleTests.Setup.hostA, setup.leafA)]), as: UTF8.self))
            var source = setup.source()
            source.fallbackFile = fallbackPath
            try await setup.withGate(source: source) { gate in
                #expect(gate.server.store.list?.source == fallbackPath)
                let viaFallback = try await curlThroughGate(gate, "https://\(ListLifecycleTests.Setup.hostA):\(setup.originA.port)/")
                #expect(String(decoding: viaFallback.body, as: UTF8.self) == "A")

                setup.listServer.set(.serve(try setup.pki.signedV2(sequence: 2, pins: [TestPKI.pin(ListLifecycleTests.Setup.hostA, setup.leafA)])))
                #expect(try await gate.server.updater?.updateNow().get() == .installed(sequence: 2))
                #expect(gate.server.store.list?.source.hasPrefix("https://") == true)
            }
        }
    }
}

/// A real crash of the real binary in the middle of persisting a list.
@Suite("Crash while persisting")
struct CrashWhilePersistingTests {
    @Test("pingate killed between writing the new list and renaming it: the old list survives intact and is enforced on restart")
    func crashBeforeRename() async throws {
        try await ListLifecycleTests.Setup.with(initialPins: { pki, a, _ in
            try pki.signedV2(sequence: 1, pins: [TestPKI.pin(ListLifecycleTests.Setup.hostA, a)])
        }) { setup in
            let state = setup.directory.file("state")
            let config = try setup.directory.write("pingate.yml", """
            listen: 127.0.0.1:0
            state-dir: state
            pins:
              source: https://lists.pingate.test:\(setup.listServer.port)/pins.json
              keys: [\(setup.pki.signerPublicKeyPath)]
              server-ca: [\(setup.pki.originCA.certificatePath)]
              wait-seconds: 3
            upstream-ca: [\(setup.pki.upstreamTrustPath)]
            resolve: ["\(ListLifecycleTests.Setup.hostA):\(setup.originA.port):127.0.0.1", "lists.pingate.test:\(setup.listServer.port):127.0.0.1"]
            admin: {listen: "off"}
            """)
            // 1. A normal run persists sequence 1.
            try await RunningGate.with(["--config", config]) { _ in } // its start-up fetch persists the list
            let persistence = PinListPersistence(stateDirectory: state)
            let keys = [try setup.pki.signer.publicKey()]
            #expect(try persistence.load(keys: keys)?.1.metadata.sequence == 1)

            // 2. The server publishes sequence 2; SIGHUP makes the gate fetch it, and the gate
            //    dies between writing it and renaming it into place.
            setup.listServer.set(.serve(try setup.pki.signedV2(sequence: 2, pins: [TestPKI.pin(ListLifecycleTests.Setup.hostA, setup.leafA)])))
            // It exits by itself; the scope's stop then has nothing left to signal.
            try await RunningGate.with(["--config", config], environment: ["PINGATE_FAULT_INJECTION": "crash-before-rename"]) { doomed in
                kill(doomed.process.processIdentifier, SIGHUP)
                _ = await eventually(timeout: .seconds(5)) { !doomed.process.isRunning }
                #expect(!doomed.process.isRunning)
                #expect(doomed.process.terminationReason == .exit && doomed.process.terminationStatus == 86)
            }
            let leftovers = try FileManager.default.contentsOfDirectory(atPath: state).filter { $0.contains(".tmp-") }
            #expect(!leftovers.isEmpty, "the crash left the new bytes under a temporary name")
            #expect(try persistence.load(keys: keys)?.1.metadata.sequence == 1, "the old list is intact")

            // 3. Restart with the list server down: the old list is enforced. (The setup's
            //    scope stops the list server again at the end: a no-op.)
            await setup.listServer.stop()
            try await RunningGate.with(["--config", config]) { restarted in
                let through = try await TestProcess.run("curl", ["-sS", "--max-time", "20", "--proxy", "http://127.0.0.1:\(restarted.port)",
                                                                 "--cacert", (state as NSString).appendingPathComponent("ca.pem"),
                                                                 "https://\(ListLifecycleTests.Setup.hostA):\(setup.originA.port)/"])
                #expect(through.stdout == "A", "\(through.stderr)")
                // The crashed write's temporary file is gone, and the log says which.
                #expect(try FileManager.default.contentsOfDirectory(atPath: state).filter { $0.contains(".tmp-") }.isEmpty)
                #expect(restarted.logText.contains("removed temporary files left by an interrupted write"))
                #expect(restarted.logText.contains(leftovers[0]), "\(restarted.logText)")
            }
        }
    }
}
