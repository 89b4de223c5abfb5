import Foundation
import PinGateTestSupport
import PinGateHarness
import PinGateTLS
import PinList
import PinGateNIO
import Testing

/// Issue 12's "found" items: each one as a new user met it, against `pingate run` as a
/// child process on 127.0.0.1 with port 0 and material minted at test time.
@Suite("Hardening (issue 12)")
struct HardeningTests {
    static var pingate: String { TestProcess.pingateExecutable }

    /// What a CONNECT through a gate got: the proxy's status and refusal, curl's exit
    /// status and everything it said, and how long it took.
    struct ProxyAnswer {
        var status: String
        var refusal: String?
        var exitStatus: Int32
        var stderr: String
        var seconds: Double
        var body: String
    }

    /// `curl --proxy` to `url` through the gate on `port`; `caPath` for the gate's CA.
    static func connect(gatePort port: Int, _ url: String, caPath: String? = nil, extra: [String] = []) async throws -> ProxyAnswer {
        // curl's own clock (time_total): a loaded machine's process start-up is not counted.
        var arguments = ["-sS", "-v", "--max-time", "30", "--proxy", "http://127.0.0.1:\(port)", "-w", "\u{1}%{time_total} %{http_connect}"]
        if let caPath { arguments += ["--cacert", caPath] }
        let result = try await TestProcess.run("curl", arguments + extra + [url])
        let refusal = result.stderr.split(whereSeparator: \.isNewline)
            .first { $0.lowercased().hasPrefix("< pingate-refusal:") }
            .map { $0.split(separator: ":", maxSplits: 1)[1].trimmingCharacters(in: .whitespaces) }
        // The write-out comes last, after a 0x01 no body here contains:
        // "<body>\u{1}<time_total> <http_connect>".
        let (body, writeOut) = result.stdout.lastIndex(of: "\u{1}").map {
            (String(result.stdout[..<$0]), result.stdout[result.stdout.index(after: $0)...].split(separator: " "))
        } ?? (result.stdout, [])
        let status = writeOut.count == 2 ? String(writeOut[1]) : ""
        let seconds = writeOut.first.flatMap { Double($0) } ?? .infinity
        return ProxyAnswer(status: status, refusal: refusal, exitStatus: result.status, stderr: result.stderr,
                           seconds: seconds, body: body)
    }

    /// The whole answer (head and body) to a raw `CONNECT target` sent to the gate on `port`.
    static func rawConnect(gatePort port: Int, _ target: String) async throws -> String {
        let script = """
        import socket, sys
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
        s.sendall(("CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (sys.argv[2], sys.argv[2])).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk: break
            data += chunk
        sys.stdout.write(data.decode("utf-8", "replace"))
        """
        return try await TestProcess.run("python3", ["-c", script, "\(port)", target], timeout: 30).stdout
    }

    /// `curl` to the admin endpoint on `port` with `extra` arguments (e.g. `-H Host:…`).
    static func admin(port: Int, _ path: String, _ extra: [String] = []) async throws -> (status: Int, body: String) {
        let result = try await TestProcess.run("curl", ["-s", "--max-time", "10", "-w", "\n%{http_code}"] + extra
                                                   + ["http://127.0.0.1:\(port)\(path)"])
        let lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        return (Int(lines.last ?? "") ?? 0, lines.dropLast().joined(separator: "\n"))
    }

    /// The admin port of `gate`, once it has logged it.
    static func adminPort(_ gate: RunningGate) async throws -> Int {
        _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
        return try #require(gate.adminPort, "no admin endpoint line in: \(gate.logText)")
    }

    // MARK: item 3

    @Test("a list whose pins have all expired: a warning at start-up, 503 list-expired at once, /ready says why")
    func expiredList() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("expired.pingate.test")], issuer: pki.originCA, file: "origin")
        let list = try pki.signedList([("expired.pingate.test", leaf.fingerprint)], expires: Date().addingTimeInterval(-86400))
        try await RunningGate.with([
            "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
            "--pins", list, "--pins-key", pki.signerPublicKeyPath, "--decision-log", "off",
        ]) { gate in
            let answer = try await Self.connect(gatePort: gate.port, "https://expired.pingate.test:443/")
            #expect(answer.status == "503", "\(answer.stderr)")
            #expect(answer.refusal == "list-expired", "\(answer.stderr)")
            // At once: not after the direct-update wait (10 s) that a missing list gets.
            #expect(answer.seconds < 5)
            #expect(gate.logText.contains("the fingerprint list in force has expired"), "\(gate.logText)")
            let ready = try await Self.admin(port: try await Self.adminPort(gate), "/ready")
            #expect(ready.status == 503)
            #expect(ready.body.contains("list-expired"), "\(ready.body)")
            #expect(ready.body.contains("has expired"), "\(ready.body)")
        }
        let help = try await TestProcess.run(Self.pingate, ["run", "--help"])
        #expect(help.stdout.contains("list-expired"))
    }

    @Test("a v2 list past its own expiresAt starts the gate refusing, as an all-expired static list does (issue 33, item 4): the admin endpoint is up, /ready 503 says why, every CONNECT is 503 list-expired, an error is logged; a renewed list on SIGHUP lifts it")
    func expiredV2ListStartsRefusing() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "expired-v2.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        let now = Int64(Date().timeIntervalSince1970)
        let pin = PinGateSignedList.Pin(host: host, sha256: leaf.fingerprint, expires: now + 86_400 * 30)
        func signed(sequence: Int64, expiresAt: Int64) throws -> Data {
            try PinGateSignedList.sign(.init(sequence: sequence, issuedAt: expiresAt - 7 * 86_400, expiresAt: expiresAt, pins: [pin]),
                                       key: pki.signer)
        }
        let listPath = directory.file("pins.json")
        try signed(sequence: 1, expiresAt: now - 3_600).write(to: URL(fileURLWithPath: listPath))
        try await RunningGate.with([
            "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
            "--pins", listPath, "--pins-key", pki.signerPublicKeyPath, "--decision-log", "off",
        ]) { gate in
            let answer = try await Self.connect(gatePort: gate.port, "https://\(host):443/")
            #expect(answer.status == "503", "\(answer.stderr)")
            #expect(answer.refusal == "list-expired", "\(answer.stderr)")
            #expect(gate.logText.contains("error") && gate.logText.contains("the fingerprint list in force has expired"), "\(gate.logText)")
            let adminPort = try await Self.adminPort(gate)
            let ready = try await Self.admin(port: adminPort, "/ready")
            #expect(ready.status == 503)
            #expect(ready.body.contains("list-expired: the fingerprint list from"), "\(ready.body)")
            // Renewed: the same file, re-signed with a later expiry and sequence, on SIGHUP.
            try signed(sequence: 2, expiresAt: now + 86_400).write(to: URL(fileURLWithPath: listPath))
            kill(gate.process.processIdentifier, SIGHUP)
            #expect(await eventually(timeout: .seconds(10)) {
                (try? await Self.admin(port: adminPort, "/ready"))?.status == 200
            }, "\(gate.logText)")
        }
    }

    @Test("SIGHUP reopens the decision log for rotation (issue 33, item 7): after the file is moved aside and the gate gets SIGHUP, new lines go to a new file at the old path, and the moved file keeps only what came before")
    func hangupReopensTheDecisionLog() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("pinned.pingate.test")], issuer: pki.originCA, file: "origin")
        let list = try pki.signedList([("pinned.pingate.test", leaf.fingerprint)])
        let logPath = directory.file("decisions.log")
        try await RunningGate.with([
            "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", directory.file("state"),
            "--pins", list, "--pins-key", pki.signerPublicKeyPath, "--decision-log", logPath,
        ]) { gate in
            func lines(_ path: String) -> [String] {
                ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
            }
            _ = try await Self.connect(gatePort: gate.port, "https://before.pingate.test:443/")
            #expect(await eventually(timeout: .seconds(10)) { lines(logPath).contains { $0.contains("before.pingate.test") } })
            try FileManager.default.moveItem(atPath: logPath, toPath: logPath + ".1")
            kill(gate.process.processIdentifier, SIGHUP)
            // The reopen is done once the re-read it comes with is logged.
            #expect(await eventually(timeout: .seconds(10)) { gate.logText.contains("list update requested (SIGHUP)") })
            _ = try await Self.connect(gatePort: gate.port, "https://after.pingate.test:443/")
            #expect(await eventually(timeout: .seconds(10)) { lines(logPath).contains { $0.contains("after.pingate.test") } },
                    "\(lines(logPath)) \(gate.logText)")
            #expect(!lines(logPath).contains { $0.contains("before.pingate.test") })
            #expect(lines(logPath + ".1").contains { $0.contains("before.pingate.test") })
            #expect(!lines(logPath + ".1").contains { $0.contains("after.pingate.test") })
            let mode = try FileManager.default.attributesOfItem(atPath: logPath)[.posixPermissions] as? Int
            #expect(mode == 0o640)
        }
    }

    // MARK: item 6

    @Test("--pins-key errors name the key file and what is wrong with it, never the list")
    func keyFileErrors() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let missing = directory.file("no-such-signer.pub.pem")
        let garbage = try directory.write("garbage.pub.pem", "not a key\n")
        for (key, problem) in [(missing, "does not exist"), (garbage, "holds no P-256 public key"), (directory.path, "is a directory")] {
            let result = try await TestProcess.run(Self.pingate, [
                "run", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", directory.file("state"),
                "--pins", WultraVectors.path("static-list.json"), "--pins-key", key,
            ], timeout: 30)
            #expect(result.status != 0)
            #expect(result.stderr.contains("the list-verification key file \(key) \(problem)"), "\(result.stderr)")
            #expect(!result.stderr.contains("malformed"), "\(result.stderr)")
            let verify = try await TestProcess.run(Self.pingate, ["list", "verify", WultraVectors.path("static-list.json"), "--key", key])
            #expect(verify.status != 0)
            #expect(verify.stderr.contains("the list-verification key file \(key) \(problem)"), "\(verify.stderr)")
            #expect(!verify.stderr.contains("does not verify"), "\(verify.stderr)")
        }
    }

    @Test("--pins-key takes Wultra's base64 X9.63 key inline, for run and list verify")
    func inlineKey() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let inline = try String(contentsOfFile: WultraVectors.path("test-signer.pub.x963.b64"), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(inline.contains("/"))  // so it must not be taken for a path and resolved
        let verify = try await TestProcess.run(Self.pingate, ["list", "verify", WultraVectors.path("static-list.json"), "--key", inline])
        #expect(verify.status == 0, "\(verify.stderr)")
        try await RunningGate.withAttempt([
            "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
            "--pins", WultraVectors.path("static-list.json"), "--pins-key", inline,
        ]) { gate in
            #expect(gate != nil)
        }
        // The same key in a config file's `keys:`, next to a relative path that is resolved.
        let config = try directory.write("pingate.yml", """
            listen: 127.0.0.1:0
            admin:
              listen: "off"
            state-dir: state
            pins:
              source: \(WultraVectors.path("static-list.json"))
              keys: ["\(inline)"]
            """)
        let configured = try await RunningGate.withAttempt(["--config", config]) { gate in gate != nil }
        #expect(configured)
    }

    // MARK: item 2

    @Test("ca.key deleted: run names the missing file; ca init --force replaces the CA and keeps the old files as timestamped backups")
    func caDeadEnd() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let state = directory.file("state")
        let first = try await TestProcess.run(Self.pingate, ["ca", "init", "--state-dir", state])
        #expect(first.status == 0, "\(first.stderr)")
        let oldCertificate = try String(contentsOfFile: state + "/ca.pem", encoding: .utf8)
        try FileManager.default.removeItem(atPath: state + "/ca.key")

        let run = try await TestProcess.run(Self.pingate, ["run", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", state], timeout: 30)
        #expect(run.status != 0)
        #expect(run.stderr.contains("\(state)/ca.key is missing"), "\(run.stderr)")
        #expect(run.stderr.contains("pingate ca init --force"), "\(run.stderr)")

        let plain = try await TestProcess.run(Self.pingate, ["ca", "init", "--state-dir", state])
        #expect(plain.status != 0)
        #expect(plain.stderr.contains("--force"), "\(plain.stderr)")

        let forced = try await TestProcess.run(Self.pingate, ["ca", "init", "--force", "--state-dir", state])
        #expect(forced.status == 0, "\(forced.stderr)")
        var names = try FileManager.default.contentsOfDirectory(atPath: state)
        let certificateBackups = names.filter { $0.hasPrefix("ca.pem.bak-") }
        #expect(certificateBackups.count == 1, "\(names)")
        if let backup = certificateBackups.first {
            #expect(backup.range(of: #"^ca\.pem\.bak-\d{8}T\d{6}Z$"#, options: .regularExpression) != nil, "\(backup)")
            #expect(try String(contentsOfFile: state + "/" + backup, encoding: .utf8) == oldCertificate)
        }
        let keyMode = try FileManager.default.attributesOfItem(atPath: state + "/ca.key")[.posixPermissions] as? Int
        #expect(keyMode == 0o600)
        #expect(try String(contentsOfFile: state + "/ca.pem", encoding: .utf8) != oldCertificate)

        // Again, at once: both files are kept, under names that do not collide.
        let again = try await TestProcess.run(Self.pingate, ["ca", "init", "--force", "--state-dir", state])
        #expect(again.status == 0, "\(again.stderr)")
        names = try FileManager.default.contentsOfDirectory(atPath: state)
        #expect(names.filter { $0.hasPrefix("ca.pem.bak-") }.count == 2, "\(names)")
        #expect(names.filter { $0.hasPrefix("ca.key.bak-") }.count == 1, "\(names)")

        try await RunningGate.withAttempt(["--listen", "127.0.0.1:0", "--state-dir", state]) { gate in
            #expect(gate != nil)
        }
    }

    @Test("ca.key open to others or a state directory that is not 0700: run refuses by default, warns with --no-strict-permissions")
    func caPermissions() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let state = directory.file("state")
        let created = try await TestProcess.run(Self.pingate, ["ca", "init", "--state-dir", state])
        #expect(created.status == 0, "\(created.stderr)")
        #expect(try FileManager.default.attributesOfItem(atPath: state)[.posixPermissions] as? Int == 0o700)
        #expect(try FileManager.default.attributesOfItem(atPath: state + "/ca.key")[.posixPermissions] as? Int == 0o600)

        for (path, mode, says) in [(state + "/ca.key", 0o644, "\(state)/ca.key has mode 644"),
                                   (state, 0o755, "the state directory \(state) has mode 755, not 700")] {
            chmod(path, mode_t(mode))
            let refused = try await TestProcess.run(Self.pingate, [
                "run", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", state,
            ], timeout: 30)
            #expect(refused.status != 0)
            #expect(refused.stderr.contains(says), "\(refused.stderr)")
            #expect(refused.stderr.contains("--no-strict-permissions"), "\(refused.stderr)")
            try await RunningGate.with(["--listen", "127.0.0.1:0", "--state-dir", state, "--no-strict-permissions"]) { gate in
                #expect(gate.logText.contains("the local CA is exposed"), "\(gate.logText)")
                #expect(gate.logText.contains(says), "\(gate.logText)")
            }
            chmod(path, path == state ? 0o700 : 0o600)
        }
        try await RunningGate.withAttempt(["--listen", "127.0.0.1:0", "--state-dir", state]) { gate in
            #expect(gate != nil)
        }

        // An existing, empty state directory open to everyone (an emptyDir volume, a /tmp
        // folder): refused before anything is written into it, by run and by check-config.
        let open = directory.file("open")
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: false)
        chmod(open, 0o777)
        for command in [["run", "--listen", "127.0.0.1:0", "--admin-listen", "off"], ["check-config", "--listen", "127.0.0.1:0"],
                        ["ca", "init"], ["env", "--listen", "127.0.0.1:9"]] {
            let refused = try await TestProcess.run(Self.pingate, command + ["--state-dir", open], timeout: 30)
            #expect(refused.status != 0, "\(command)")
            #expect(refused.stderr.contains("the state directory \(open) has mode 777, not 700"), "\(command): \(refused.stderr)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: open).isEmpty, "\(command) wrote into it")
        }

        // A public-dir others can write: the gate does not publish there, and env does not
        // hand files from such a place to apps (they decide what apps trust and what Node runs).
        let shared = directory.file("shared")
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: false)
        chmod(shared, 0o777)
        for command in ["run", "check-config"] {
            let refused = try await TestProcess.run(Self.pingate, [
                command, "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", state, "--public-dir", shared,
            ], timeout: 30)
            #expect(refused.status != 0, "\(command)")
            #expect(refused.stderr.contains("public-dir \(shared) is writable by group or others (mode 777)"), "\(command): \(refused.stderr)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: shared).isEmpty)
        for name in ["ca.pem", "ca-bundle.pem", "node-proxy.cjs"] { _ = try directory.write("shared/\(name)", "planted\n") }
        let planted = try await TestProcess.run(Self.pingate, ["env", "--listen", "127.0.0.1:9", "--public-dir", shared])
        #expect(planted.status != 0 && !planted.stdout.contains("NODE_OPTIONS"), "\(planted.stdout)")
        #expect(planted.stderr.contains("\(shared) is writable by group or others"), "\(planted.stderr)")
        // Not writable by others, but made by an ordinary other user (in a shared place,
        // before the gate started): not handed to apps either.
        if getuid() == 0 {
            chmod(shared, 0o755)
            for name in ["", "/ca.pem", "/ca-bundle.pem", "/node-proxy.cjs"] { _ = chown(shared + name, 1234, 1234) }
            let foreign = try await TestProcess.run(Self.pingate, ["env", "--listen", "127.0.0.1:9", "--public-dir", shared])
            #expect(foreign.status != 0 && foreign.stderr.contains("belongs to user 1234, neither root, you, nor a system account"), "\(foreign.stderr)")
        }
    }

    // MARK: item 5

    @Test("admin endpoint: only its own names in Host are answered; anything else (DNS rebinding) gets 421 with a reason")
    func adminHostCheck() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try await RunningGate.with(["--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
                                    "--admin-allowed-hosts", "gate.internal"]) { gate in
            let port = try await Self.adminPort(gate)
            for path in ["/status", "/pins", "/refusals", "/ready", "/metrics", "/"] {
                let rebound = try await Self.admin(port: port, path, ["-i", "-H", "Host: attacker.example:\(port)"])
                #expect(rebound.status == 421, "\(path): \(rebound.body)")
                #expect(rebound.body.lowercased().contains("pingate-refusal: admin-host-not-allowed"), "\(rebound.body)")
                #expect(rebound.body.contains("DNS rebinding"), "\(rebound.body)")
                #expect(!rebound.body.contains("\"counters\""))
            }
            for host in ["127.0.0.1:\(port)", "localhost:\(port)", "LOCALHOST.:\(port)", "[::1]:\(port)", "gate.internal:\(port)"] {
                let own = try await Self.admin(port: port, "/status", ["-H", "Host: \(host)"])
                #expect(own.status == 200, "\(host): \(own.body)")
            }
            for host in ["localhost:\(port + 1)", "localhost", "127.0.0.1.attacker.example:\(port)", "gate.internal.evil:\(port)"] {
                let other = try await Self.admin(port: port, "/status", ["-H", "Host: \(host)"])
                #expect(other.status == 421, "\(host): \(other.body)")
            }
            // curl with no Host at all (HTTP/1.0 style).
            let none = try await Self.admin(port: port, "/status", ["-H", "Host:"])
            #expect(none.status == 421, "\(none.body)")
        }
        try await RunningGate.with(["--listen", "127.0.0.1:0", "--state-dir", directory.file("state2"),
                                    "--admin-allowed-hosts", "*"]) { gate in
            let port = try await Self.adminPort(gate)
            let any = try await Self.admin(port: port, "/ready", ["-H", "Host: anything.example"])
            #expect(any.status != 421, "\(any.body)")
        }
    }

    // MARK: item 4

    /// A port that was free a moment ago (for a test that must name the gate's own port
    /// in a `--resolve` mapping before the gate starts).
    static func freePort() throws -> Int {
        let probe = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(probe) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(probe, $0, length) == 0 && getsockname(probe, $0, &length) == 0 }
        }
        guard bound else { throw TestFailure("cannot bind a probe socket") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    @Test("CONNECTs to the gate itself, its admin endpoint, unspecified, multicast and broadcast addresses: 403 destination-not-allowed at once, --resolve included")
    func neverDestinations() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("x.pingate.test")], issuer: pki.originCA, file: "origin")
        let names = ["127.0.0.1", "0.0.0.0", "loop.pingate.test", "zero.pingate.test", "v6zero.pingate.test",
                     "mcast.pingate.test", "bcast.pingate.test", "mapped-zero.pingate.test"]
        let list = try pki.signedList(names.map { ($0, leaf.fingerprint) })
        let listenPort = try Self.freePort()
        try await RunningGate.with([
            "--listen", "127.0.0.1:\(listenPort)", "--state-dir", directory.file("state"),
            "--pins", list, "--pins-key", pki.signerPublicKeyPath, "--upstream-ca", pki.upstreamTrustPath,
            "--resolve", "loop.pingate.test:443:127.0.0.1", "--resolve", "loop.pingate.test:\(listenPort):127.0.0.1",
            "--resolve", "zero.pingate.test:443:0.0.0.0", "--resolve", "v6zero.pingate.test:443:[::]",
            "--resolve", "mcast.pingate.test:443:224.0.0.1", "--resolve", "bcast.pingate.test:443:255.255.255.255",
            "--resolve", "mapped-zero.pingate.test:443:[::ffff:0.0.0.0]",
        ]) { gate in
            let admin = try await Self.adminPort(gate)
            let targets = [
                ("https://127.0.0.1:\(gate.port)/", "own listener"),
                ("https://127.0.0.1:\(admin)/", "own listener"),
                ("https://loop.pingate.test:\(listenPort)/", "own listener"),
                ("https://0.0.0.0:\(gate.port)/", "unspecified"),
                ("https://zero.pingate.test:443/", "unspecified"),
                ("https://v6zero.pingate.test:443/", "unspecified"),
                ("https://mapped-zero.pingate.test:443/", "unspecified"),
                ("https://mcast.pingate.test:443/", "multicast"),
                ("https://bcast.pingate.test:443/", "broadcast"),
            ]
            for (url, says) in targets {
                let answer = try await Self.connect(gatePort: gate.port, url)
                #expect(answer.status == "403", "\(url): \(answer.stderr)")
                #expect(answer.refusal == "destination-not-allowed", "\(url): \(answer.stderr)")
                #expect(answer.seconds < 5, "\(url) took \(answer.seconds) s")
                let authority = url.dropFirst("https://".count).dropLast()
                let raw = try await Self.rawConnect(gatePort: gate.port, String(authority))
                #expect(raw.contains(says), "\(url): \(raw)")
            }
            // An explicit mapping to loopback on another port is the operator's choice: dialled
            // (nothing listens there, so it is unreachable, not refused by policy).
            let mapped = try await Self.connect(gatePort: gate.port, "https://loop.pingate.test:443/")
            #expect(mapped.refusal == "upstream-unreachable", "\(mapped.stderr)")
        }
    }

    @Test("a name whose DNS answer is loopback is refused by default; allow-private-destinations or a --resolve mapping lets it through")
    func internalAddressesFromDNS() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("localhost")], issuer: pki.originCA, file: "origin")
        let list = try pki.signedList([("localhost", leaf.fingerprint)])
        try await LoopbackOrigin.with(identity: leaf, behaviour: .http(body: "reached")) { origin in
            let url = "https://localhost:\(origin.port)/"
            let base = ["--listen", "127.0.0.1:0", "--pins", list, "--pins-key", pki.signerPublicKeyPath,
                        "--upstream-ca", pki.upstreamTrustPath]
            try await RunningGate.with(base + ["--state-dir", directory.file("state1")]) { gate in
                let refused = try await Self.connect(gatePort: gate.port, url, caPath: directory.file("state1/ca.pem"))
                #expect(refused.status == "403", "\(refused.stderr)")
                #expect(refused.refusal == "destination-not-allowed", "\(refused.stderr)")
                let raw = try await Self.rawConnect(gatePort: gate.port, "localhost:\(origin.port)")
                #expect(raw.contains("loopback address from DNS"), "\(raw)")
            }
            #expect(origin.observed.tcpConnections == 0)
            try await RunningGate.with(base + ["--state-dir", directory.file("state2"), "--allow-private-destinations"]) { gate in
                let allowed = try await Self.connect(gatePort: gate.port, url, caPath: directory.file("state2/ca.pem"))
                #expect(allowed.status == "200", "\(allowed.stderr)")
                #expect(allowed.body == "reached", "\(allowed.stderr)")
            }
            try await RunningGate.with(base + ["--state-dir", directory.file("state3"),
                                               "--resolve", "localhost:\(origin.port):127.0.0.1"]) { gate in
                let mapped = try await Self.connect(gatePort: gate.port, url, caPath: directory.file("state3/ca.pem"))
                #expect(mapped.status == "200", "\(mapped.stderr)")
                #expect(mapped.body == "reached", "\(mapped.stderr)")
            }
        }
    }

    @Test("address kinds: what is never dialled, what is internal when it comes from DNS")
    func addressKinds() throws {
        func kind(_ text: String) -> DestinationAddress.Kind? { DestinationAddress(text: text)?.kind }
        #expect(kind("0.0.0.0") == .unspecified)
        #expect(kind("0.1.2.3") == .unspecified)
        #expect(kind("::") == .unspecified)
        #expect(kind("255.255.255.255") == .broadcast)
        #expect(kind("224.0.0.1") == .multicast)
        #expect(kind("239.255.255.250") == .multicast)
        #expect(kind("ff02::1") == .multicast)
        #expect(kind("127.0.0.1") == .loopback)
        #expect(kind("127.5.6.7") == .loopback)
        #expect(kind("::1") == .loopback)
        for privateAddress in ["10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "fd00::1", "fc00::1"] {
            #expect(kind(privateAddress) == .privateNetwork, "\(privateAddress)")
        }
        #expect(kind("172.32.0.1") == .global)
        #expect(kind("169.254.169.254") == .linkLocal)
        #expect(kind("fe80::1") == .linkLocal)
        #expect(kind("100.64.0.1") == .sharedAddressSpace)
        #expect(kind("100.127.255.255") == .sharedAddressSpace)
        #expect(kind("100.128.0.1") == .global)
        #expect(kind("::ffff:127.0.0.1") == .ipv4Mapped)
        #expect(kind("93.184.216.34") == .global)
        #expect(kind("2606:4700::1111") == .global)
        #expect(kind("not an address") == nil)
        let mappedZero = try #require(DestinationAddress(text: "::ffff:0.0.0.0"))
        #expect(mappedZero.isNeverAllowed)
        #expect(try #require(DestinationAddress(text: "::ffff:127.0.0.1")).canonical == DestinationAddress(text: "127.0.0.1"))

        let destinations = DestinationGuard(allowPrivate: false)
        let loopback = try #require(DestinationAddress(text: "127.0.0.1"))
        #expect(destinations.refusal(address: loopback, port: 443, fromDNS: false) == nil)
        #expect(destinations.refusal(address: loopback, port: 443, fromDNS: true)?.contains("loopback address from DNS") == true)
        #expect(destinations.refusal(address: try #require(DestinationAddress(text: "::ffff:10.0.0.1")), port: 443, fromDNS: true) != nil)
        #expect(destinations.refusal(address: try #require(DestinationAddress(text: "93.184.216.34")), port: 443, fromDNS: true) == nil)
        #expect(DestinationGuard(allowPrivate: true).refusal(address: loopback, port: 443, fromDNS: true) == nil)
        #expect(DestinationGuard(allowPrivate: true).refusal(address: mappedZero, port: 443, fromDNS: false) != nil)
    }

    // MARK: item 1

    /// `openssl s_server ARGS -accept 127.0.0.1:0` for the length of `body`; its port is
    /// read from its `ACCEPT` line.
    static func withOpenSSLServer<Value>(_ arguments: [String], isolation: isolated (any Actor)? = #isolation,
                                         _ body: (Int) async throws -> Value) async throws -> Value {
        try await withResource(
            start: { () async throws -> (ChildProcess, PipeDrain, OutputCollector) in
                let process = ChildProcess()
                process.executableURL = URL(fileURLWithPath: try TestProcess.resolve("openssl"))
                process.arguments = ["s_server", "-accept", "127.0.0.1:0"] + arguments
                let pipe = Pipe()
                process.standardOutput = pipe
                process.standardError = FileHandle.nullDevice
                process.standardInput = Pipe()  // s_server reads commands from stdin; keep it open
                let output = OutputCollector()
                try process.run()
                // Only the child may hold the write end, or the drain never sees end of file.
                try? pipe.fileHandleForWriting.close()
                let drain = PipeDrain(pipe.fileHandleForReading, into: output.appendOut)
                return (process, drain, output)
            },
            stop: { server in
                // s_server keeps nothing worth a graceful stop, and started from the test
                // process it does not always act on SIGTERM: SIGKILL follows at once.
                await server.0.terminateAndWait(seconds: 0.2)
                _ = await server.1.finished(within: .seconds(5))
            },
            body: { server in
                func port() -> Int? {
                    let text = String(decoding: server.2.contents.0, as: UTF8.self)
                    return text.split(whereSeparator: \.isNewline).first { $0.hasPrefix("ACCEPT ") }
                        .flatMap { $0.split(separator: ":").last }.flatMap { Int($0) }
                }
                _ = await eventually(timeout: .seconds(10)) { port() != nil }
                let found = try #require(port(), "s_server said: \(String(decoding: server.2.contents.0, as: UTF8.self))")
                return try await body(found)
            })
    }

    @Test("an upstream that demands a client certificate over TLS 1.3: 502 upstream-tls-failed with the alert, before any 200", arguments: [
        (["-Verify", "1", "-tls1_3"], "502", "upstream-tls-failed"),
        (["-Verify", "1", "-tls1_2"], "502", "upstream-tls-failed"),
        (["-verify", "1", "-tls1_3"], "200", nil),  // asks, does not insist: not a false alarm
        (["-tls1_3"], "200", nil),
    ])
    func clientCertificateRequired(serverFlags: [String], status: String, refusal: String?) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "clientcert.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        let list = try pki.signedList([(host, leaf.fingerprint)])
        try await Self.withOpenSSLServer(["-cert", leaf.certificatePath, "-key", leaf.keyPath, "-CAfile", pki.originCA.certificatePath,
                                          "-www"] + serverFlags) { port in
            try await RunningGate.with([
                "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
                "--pins", list, "--pins-key", pki.signerPublicKeyPath, "--upstream-ca", pki.upstreamTrustPath,
                "--resolve", "\(host):\(port):127.0.0.1",
            ]) { gate in
                let answer = try await Self.connect(gatePort: gate.port, "https://\(host):\(port)/", caPath: directory.file("state/ca.pem"))
                #expect(answer.status == status, "\(serverFlags): \(answer.stderr)")
                #expect(answer.refusal == refusal, "\(serverFlags): \(answer.stderr)")
                #expect(answer.seconds < 5)
                if serverFlags.contains("-Verify") {
                    let raw = try await Self.rawConnect(gatePort: gate.port, "\(host):\(port)")
                    #expect(raw.hasPrefix("HTTP/1.1 502"), "\(raw)")
                    #expect(raw.contains("alert"), "\(raw)")
                    if serverFlags.contains("-tls1_3") {
                        #expect(raw.contains("certificate required"), "\(raw)")
                        #expect(raw.contains("client certificate"), "\(raw)")
                    }
                }
            }
        }
    }
}
