import Foundation
import PinGateTestSupport
import PinGateCA
import PinGateTLS
import PinList
import Testing
@testable import PinGate
@testable import PinGateHarness
@testable import PinListService
@testable import PinGateNIO

/// The MITM harness against loopback origins, with real clients as the app under test,
/// and parent-proxy chaining through a real third-party proxy.
@Suite("MITM harness")
struct HarnessTests {
    struct Target {
        let directory: TemporaryDirectory
        let pki: TestPKI
        let leaf: TestPKI.Identity
        let origin: LoopbackOrigin
        let host: String
        var url: URL { URL(string: "https://\(host):\(origin.port)/login")! }

        static func start(host: String = "app.pingate.test") async throws -> Target {
            try await startInParts { started in
                let directory = try TemporaryDirectory()
                started.onFailure { directory.remove() }
                let pki = try TestPKI(directory: directory)
                let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
                let origin = try await LoopbackOrigin.start(identity: leaf, behaviour: .http(body: "logged in"))
                return Target(directory: directory, pki: pki, leaf: leaf, origin: origin, host: host)
            }
        }

        /// Starts a target as `start` does, runs `body` with it, and stops its origin and
        /// removes its files whether `body` returns or throws.
        static func with<Value>(
            host: String = "app.pingate.test",
            isolation: isolated (any Actor)? = #isolation,
            _ body: (Target) async throws -> Value
        ) async throws -> Value {
            try await withResource(start: { try await start(host: host) }, stop: { await $0.stop() }, body: body)
        }

        /// The pins a list gives the target.
        enum ListShape: String, CaseIterable, Sendable {
            /// The leaf certificate's hash.
            case leaf
            /// The leaf's public key hash.
            case spki
            /// What `pingate list propose` writes by default: the leaf, and its issuer as a
            /// depth-1 backup.
            case proposed
        }

        func configuration(mode: String = "enforce", app: String? = nil, shape: ListShape = .leaf) throws -> HarnessConfiguration {
            let expires = Int64(Date().timeIntervalSince1970) + 86400
            let pins: [PinGateSignedList.Pin]
            switch shape {
            case .leaf: pins = [.init(host: host, sha256: leaf.fingerprint, expires: expires, mode: mode)]
            case .spki: pins = [.init(host: host, spki: leaf.certificate.spkiSHA256, expires: expires, mode: mode)]
            case .proposed:
                pins = [.init(host: host, sha256: leaf.fingerprint, expires: expires, mode: mode),
                        .init(host: host, sha256: pki.originCA.fingerprint, expires: expires, mode: mode, depth: .position(1))]
            }
            let list = try PinGateSignedList.verify(try pki.signedV2(sequence: 1, pins: pins),
                                                    keys: [try pki.signer.publicKey()], source: "test")
            var configuration = HarnessConfiguration(target: url, list: list)
            configuration.resolve = [try ResolveOverride(parsing: "\(host):\(origin.port):127.0.0.1")]
            configuration.upstreamTrust = .pemFiles([pki.originCA.certificatePath])
            configuration.app = app
            configuration.timeout = 30
            return configuration
        }

        /// Stops the origin and removes the files. Safe to call more than once.
        func stop() async {
            await origin.stop()
            directory.remove()
        }
    }

    @Test("all legs pass with curl as the app, with a Python requests script, and with a Node https script and a Node fetch() script; the attacker reads nothing in the attack leg", arguments: [
        "curl -sS --fail --max-time 20 -d 'password=hunter2' \"$PINGATE_TARGET\"",
        "python3 -c 'import os, requests; r = requests.post(os.environ[\"PINGATE_TARGET\"], data={\"password\": \"hunter2\"}, timeout=20); r.raise_for_status()'",
        // Node's https module: through the gates only by the preload the harness gives it, as
        // `pingate env` gives a shell (Node before 24 reads no proxy variable).
        "node -e 'const r = require(\"https\").request(process.env.PINGATE_TARGET, { method: \"POST\", headers: { \"content-type\": \"application/x-www-form-urlencoded\" } }, (res) => { res.resume(); res.on(\"end\", () => process.exit(res.statusCode === 200 ? 0 : 1)); }); r.on(\"error\", (error) => { console.error(error.message); process.exit(1); }); r.end(\"password=hunter2\");'",
        // Node 20's fetch() (undici, which reads no proxy variable before Node 24): through the
        // gates by the dispatcher the preload installs.
        "node -e 'fetch(process.env.PINGATE_TARGET, { method: \"POST\", body: new URLSearchParams({ password: \"hunter2\" }) }).then(async (r) => { await r.arrayBuffer(); process.exit(r.status === 200 ? 0 : 1); }, (error) => { console.error(error.message, error.cause && error.cause.message); process.exit(1); });'",
    ])
    func appLegs(app: String) async throws {
        // The python3 the peers use (scripts/bootstrap's virtual environment when it made
        // one), not whichever comes first on PATH.
        let app = app.hasPrefix("python3 ") ? (try TestProcess.resolve("python3")) + app.dropFirst("python3".count) : app
        let (report, applicationBytes) = try await Target.with { target in
            let report = try await HarnessRunner.run(try target.configuration(app: app), logger: GateFixture.quietLogger)
            return (report, target.origin.observed.applicationBytes)
        }
        #expect(report.passed, "\(report.table())")
        #expect(report.legs.map(\.name) == ["gate", "attack", "control"])
        #expect(report.legs.map(\.appExitStatus) == [0, report.legs[1].appExitStatus, 0])
        #expect((report.legs[1].appExitStatus ?? 0) != 0)
        #expect(report.legs[1].refusal == "pin-mismatch")
        #expect(report.legs[1].interceptedRequests == 0)
        #expect(report.legs[2].interceptedRequests >= 1)
        #expect(report.legs[2].detail.contains("POST /login"))
        #expect(report.legs[2].detail.contains("password=hunter2"))
        #expect(applicationBytes > 0) // the gate and control legs did reach the origin
    }

    @Test("the attack leg passes for any refusal of the interception, whatever its reason, and reports the reason: with a leaf list (pin-mismatch), an SPKI list, and a `list propose` list whose depth-1 backup needs a valid chain (chain-invalid)",
          arguments: Target.ListShape.allCases)
    func attackLegJudgesTheOutcome(shape: Target.ListShape) async throws {
        let report = try await Target.with { target in
            try await HarnessRunner.run(try target.configuration(shape: shape), logger: GateFixture.quietLogger)
        }
        #expect(report.passed, "\(report.table())")
        #expect(report.legs.map(\.passed) == [true, true, true], "\(report.table())")
        let attack = report.legs[1]
        #expect(attack.interceptedRequests == 0)
        let reason = try #require(attack.refusal, "\(attack.detail)")
        #expect(["pin-mismatch", "chain-invalid"].contains(reason), "\(attack.detail)")
        if shape == .proposed { #expect(reason == "chain-invalid", "\(attack.detail)") }
        #expect(attack.detail.contains("refused: \(reason)") || attack.detail.contains(reason), "\(attack.detail)")
        // The gate leg's verdict, as pin health: the pins expire in a day.
        #expect(report.pinHealth?.state == .expiring, "\(String(describing: report.pinHealth))")
        #expect(report.junit().contains("<property name=\"pin_health\" value=\"expiring\"/>"), "\(report.junit())")
        #expect(report.table().contains("pin health: expiring: the pin that carries it expires at"), "\(report.table())")
        // --fail-on: a state it names fails the run, with the legs passing; another does not.
        var strict = report
        strict.failOn = ["backup-only", "expiring"]
        #expect(!strict.passed && strict.pinHealthFails)
        #expect(strict.table().contains("FAIL: the legs passed, but the host's pin health is expiring"), "\(strict.table())")
        #expect(strict.junit().contains("tests=\"4\" failures=\"1\""), "\(strict.junit())")
        strict.failOn = ["backup-only"]
        #expect(strict.passed)
    }

    @Test("a gate that does not gate (a report-only, pins-only host) is caught: the attack leg fails and the run fails; JUnit says why")
    func catchesAGateThatDoesNotGate() async throws {
        let report = try await Target.with { target in
            var misconfigured = try target.configuration(mode: "report-only")
            misconfigured.pinsOnly = [target.host] // chain checks off, and pins only reported: nothing stops an interceptor
            return try await HarnessRunner.run(misconfigured, logger: GateFixture.quietLogger)
        }
        #expect(!report.passed)
        #expect(report.legs.map(\.passed) == [true, false, true])
        #expect(report.legs[1].detail.contains("went THROUGH an intercepting proxy"))

        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let xmlPath = try directory.write("report.xml", report.junit())
        let check = """
        import sys, xml.etree.ElementTree as ET
        root = ET.parse(sys.argv[1]).getroot()
        assert root.tag == "testsuites" and root.get("tests") == "3" and root.get("failures") == "1", root.attrib
        cases = root.findall("./testsuite/testcase")
        print(len(cases), [c.get("name").split(":")[0] for c in cases], [c.find("failure") is not None for c in cases])
        print(cases[1].find("failure").text)
        """
        let parsed = try await TestProcess.run("python3", ["-c", check, xmlPath])
        #expect(parsed.status == 0, "\(parsed.stderr)")
        #expect(parsed.stdout.hasPrefix("3 ['gate', 'attack', 'control'] [False, True, False]"))
        #expect(parsed.stdout.contains("pinned fingerprints: sha256/"))
    }

    @Test("pingate demo exits 0 and shows the gate leg succeeding and the attack refused; the harness CLI passes with curl and writes JUnit and JSON")
    func demoAndCommandLine() async throws {
        let demo = try await TestProcess.run(TestProcess.pingateExecutable, ["demo"], timeout: 60)
        #expect(demo.status == 0, "\(demo.stdout)\(demo.stderr)")
        #expect(demo.stdout.contains("gate     PASS"))
        #expect(demo.stdout.contains("attack   PASS"))
        #expect(demo.stdout.contains("refused: 502 pin-mismatch"))
        #expect(demo.stdout.contains("control  PASS"))

        try await Target.with { target in
            let pinsPath = try target.directory.write("pins.json", String(decoding: try target.pki.signedV2(sequence: 1, pins: [TestPKI.pin(target.host, target.leaf)]), as: UTF8.self))
            let junitPath = target.directory.file("junit.xml")
            let run = try await TestProcess.run(TestProcess.pingateExecutable, [
                "harness", "--target", target.url.absoluteString, "--resolve", "\(target.host):\(target.origin.port):127.0.0.1",
                "--pins", pinsPath, "--pins-key", target.pki.signerPublicKeyPath, "--upstream-ca", target.pki.originCA.certificatePath,
                "--app", "curl -sS --fail --max-time 20 \"$PINGATE_TARGET\"", "--junit", junitPath, "--json",
            ], timeout: 90)
            #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
            let json = try #require(try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any])
            #expect(json["passed"] as? Bool == true)
            #expect((json["pin_health"] as? [String: Any])?["state"] as? String == "expiring", "\(json)")
            #expect(FileManager.default.fileExists(atPath: junitPath))

            // The same run with --fail-on expiring: the legs pass, the run fails on the pin
            // health (its leaf, pinned by its certificate hash, expires within 30 days), and
            // JUnit says so in a fourth test case and the properties.
            let failing = try await TestProcess.run(TestProcess.pingateExecutable, [
                "harness", "--target", target.url.absoluteString, "--resolve", "\(target.host):\(target.origin.port):127.0.0.1",
                "--pins", pinsPath, "--pins-key", target.pki.signerPublicKeyPath, "--upstream-ca", target.pki.originCA.certificatePath,
                "--junit", junitPath, "--fail-on", "backup-only,expiring",
            ], timeout: 90)
            #expect(failing.status == 1, "\(failing.stdout)\(failing.stderr)")
            #expect(failing.stdout.contains("pin health: expiring: its leaf certificate (pinned by its hash) expires at"), "\(failing.stdout)")
            #expect(failing.stdout.contains("FAIL: the legs passed, but the host's pin health is expiring"), "\(failing.stdout)")
            let xml = try String(contentsOfFile: junitPath, encoding: .utf8)
            #expect(xml.contains("tests=\"4\" failures=\"1\"") && xml.contains("<property name=\"pin_health\" value=\"expiring\"/>")
                    && xml.contains("type=\"PinHealth\""), "\(xml)")
            let unknown = try await TestProcess.run(TestProcess.pingateExecutable, ["harness", "--target", "https://x.test/", "--pins", pinsPath,
                                                                                    "--pins-key", target.pki.signerPublicKeyPath, "--fail-on", "soon"])
            #expect(unknown.status == 64 && unknown.stderr.contains("unknown state \"soon\""), "\(unknown.stderr)")
        }
    }

    @Test("parent proxy: through tinyproxy (a plain tunnel) pinned traffic works; through pingate attack it is refused")
    func parentProxyChaining() async throws {
        // tinyproxy resolves names itself, so this origin is `localhost`.
        try await Target.with(host: "localhost") { target in
            let through = try await Tinyproxy.with { tinyproxy in
                let list = try target.pki.signedList([("localhost", target.leaf.fingerprint)])
                return try await GateFixture.with(pki: target.pki, listPath: list, configure: {
                    $0.upstreamProxy = ParentProxy(host: "127.0.0.1", port: tinyproxy.port)
                }) { viaTunnel in
                    try await curlThroughGate(viaTunnel, "https://localhost:\(target.origin.port)/")
                }
            }
            #expect(through.exitStatus == 0, "\(through.stderr)")
            #expect(String(decoding: through.body, as: UTF8.self) == "logged in")

            let list = try target.pki.signedList([("localhost", target.leaf.fingerprint)])
            let log = InterceptionLog()
            let attackerState = try TemporaryDirectory()
            defer { attackerState.remove() }
            // The attacker is the gate's core started directly, so it gets its own scope.
            let (refused, attackerBytes) = try await withResource(
                start: {
                    try await PinGateServer.start(
                        configuration: { var c = GateConfiguration(); c.listenPort = 0; c.eventLoopThreads = 1; return c }(),
                        store: PinListStore(nil), ca: try LocalCA.create(stateDirectory: attackerState.path),
                        logger: GateFixture.quietLogger, decisionPolicy: InterceptingDecisionPolicy(log: log))
                },
                stop: { try? await $0.shutdown() }
            ) { attacker in
                try await GateFixture.with(pki: target.pki, listPath: list, configure: {
                    $0.upstreamProxy = ParentProxy(host: "127.0.0.1", port: attacker.port)
                }) { viaAttacker in
                    let refused = try await curlThroughGate(viaAttacker, "https://localhost:\(target.origin.port)/", ["-d", "secret=1"])
                    return (refused, attacker.statistics.snapshot.bytesUp)
                }
            }
            #expect(refused.stderr.contains("CONNECT tunnel failed, response 502"))
            #expect(refused.proxyHeaders["pingate-refusal"] == "pin-mismatch")
            #expect(log.all.isEmpty)
            #expect(attackerBytes == 0)
        }
    }
}

/// Debian's tinyproxy as a plain CONNECT tunnel on a port that was free a moment ago.
final class Tinyproxy {
    let port: Int
    private let process: ChildProcess
    private let directory: TemporaryDirectory

    private init(port: Int, process: ChildProcess, directory: TemporaryDirectory) {
        self.port = port
        self.process = process
        self.directory = directory
    }

    static func start() async throws -> Tinyproxy {
        let directory = try TemporaryDirectory()
        let binary = try TestProcess.resolve("tinyproxy")
        for _ in 0..<5 {
            let port = try closedLoopbackPort()
            let config = try directory.write("tinyproxy.conf", "Port \(port)\nListen 127.0.0.1\nMaxClients 50\nLogLevel Critical\nTimeout 30\n")
            let process = ChildProcess()
            process.executableURL = URL(fileURLWithPath: binary)
            process.arguments = ["-d", "-c", config]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            let listening = await eventually(timeout: .seconds(5), interval: .milliseconds(50)) {
                !process.isRunning || LoopbackProbe.isListening(port: port)
            } && process.isRunning
            if listening { return Tinyproxy(port: port, process: process, directory: directory) }
            // It exited (the port was taken meanwhile) or never listened: try another port.
            await process.terminateAndWait()
        }
        directory.remove()
        throw TestFailure("tinyproxy did not start")
    }

    /// Starts tinyproxy, runs `body` with it, and stops it whether `body` returns or throws.
    static func with<Value>(
        isolation: isolated (any Actor)? = #isolation,
        _ body: (Tinyproxy) async throws -> Value
    ) async throws -> Value {
        try await withResource(start: { try await start() }, stop: { await $0.stop() }, body: body)
    }

    /// Stops tinyproxy (by its PID) and removes its files. Safe to call more than once.
    func stop() async {
        await process.terminateAndWait()
        directory.remove()
    }
}
