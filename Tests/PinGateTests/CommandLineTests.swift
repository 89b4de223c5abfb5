import Foundation
import PinGateTestSupport
import PinGateHarness
import PinGateTLS
import Testing

/// The `pingate` executable as a user runs it: keygen, sign, fingerprint, ca, and run
/// from a YAML config, with curl and openssl s_client as the clients.
@Suite("pingate command line")
struct CommandLineTests {
    static var pingate: String { TestProcess.pingateExecutable }

    @Test("startup with a tampered list exits non-zero with a clear message")
    func tamperedListStops() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let result = try await TestProcess.run(Self.pingate, [
            "run", "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
            "--pins", WultraVectors.path("static-list.tampered.json"),
            "--pins-key", WultraVectors.path("test-signer.pub.pem"),
        ], timeout: 30)
        #expect(result.status != 0)
        #expect(result.stderr.contains("refusing to start"))
        #expect(result.stderr.contains("entry 0 (api.vector.test) has no valid signature"))
        #expect(!result.stderr.contains("Fatal error"))
    }

    @Test("the good vector starts with either key form, and a wrong key is refused", arguments: [
        ("static-list.json", "test-signer.pub.x963.b64", true),
        ("static-list.wrong-key.json", "test-signer.pub.pem", false),
    ])
    func vectorsAtStartup(list: String, key: String, starts: Bool) async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try await RunningGate.withAttempt([
            "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"),
            "--pins", WultraVectors.path(list), "--pins-key", WultraVectors.path(key),
        ]) { gate in
            #expect((gate != nil) == starts)
        }
    }

    @Test("keygen, sign, fingerprint, ca export and run --config: curl and openssl s_client get through, an unpinned host does not")
    func fullWorkflow() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "workflow.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        // Both are stopped before the decision log is read; the origin's port is kept for it.
        let (log, originPort) = try await LoopbackOrigin.with(identity: leaf, behaviour: .http(body: "through the gate")) { origin in
            let keygen = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("cli-signer")])
            #expect(keygen.status == 0, "\(keygen.stderr)")
            let keyMode = try FileManager.default.attributesOfItem(atPath: directory.file("cli-signer.key"))[.posixPermissions] as? Int
            #expect(keyMode == 0o600)

            let fromFile = try await TestProcess.run(Self.pingate, ["fingerprint", "--cert", leaf.certificatePath])
            #expect(fromFile.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == leaf.fingerprint)
            let live = try await TestProcess.run(Self.pingate, ["fingerprint", "--connect", "\(host):\(origin.port)", "--resolve", "\(host):\(origin.port):127.0.0.1",
                                                                "--upstream-ca", pki.upstreamTrustPath])
            #expect(live.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == leaf.fingerprint, "\(live.stderr)")
            #expect(origin.observed.applicationBytes == 0)
            // What a live server presents is taken only when its chain and name validate: an
            // interceptor on the path would otherwise be what is pinned.
            let unrooted = try await TestProcess.run(Self.pingate, ["fingerprint", "--connect", "\(host):\(origin.port)", "--resolve", "\(host):\(origin.port):127.0.0.1"])
            #expect(unrooted.status != 0 && unrooted.stdout.isEmpty)
            #expect(unrooted.stderr.contains("did not validate") && unrooted.stderr.contains("--upstream-ca"), "\(unrooted.stderr)")
            let otherName = try await TestProcess.run(Self.pingate, ["sign", "--format", "v2", "--sequence", "1", "--key", directory.file("cli-signer.key"),
                                                                     "--connect", "bank.pingate.test:\(origin.port)", "--resolve", "bank.pingate.test:\(origin.port):127.0.0.1",
                                                                     "--upstream-ca", pki.upstreamTrustPath])
            #expect(otherName.status != 0 && otherName.stdout.isEmpty, "a certificate for \(host) signed as bank.pingate.test's")
            #expect(otherName.stderr.contains("bank.pingate.test"), "\(otherName.stderr)")
            let trusted = try await TestProcess.run(Self.pingate, ["fingerprint", "--connect", "\(host):\(origin.port)", "--resolve", "\(host):\(origin.port):127.0.0.1", "--no-verify"])
            #expect(trusted.status == 0 && trusted.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == leaf.fingerprint, "\(trusted.stderr)")
            #expect(trusted.stderr.contains("warning") && trusted.stderr.contains("--no-verify"), "\(trusted.stderr)")

            let sign = try await TestProcess.run(Self.pingate, ["sign", "--key", directory.file("cli-signer.key"), "--cert", leaf.certificatePath, "--name", host])
            #expect(sign.status == 0, "\(sign.stderr)")
            try directory.write("pins.json", sign.stdout)

            let config = """
            listen: 127.0.0.1:0
            state-dir: state
            pins:
              source: pins.json
              keys: [cli-signer.pub.pem]
            upstream-ca: [\(pki.upstreamTrustPath)]
            resolve: ["\(host):\(origin.port):127.0.0.1"]
            log-level: info
            """
            let configPath = try directory.write("pingate.yml", config)
            let log = try await RunningGate.with(["--config", configPath]) { gate in
                let export = try await TestProcess.run(Self.pingate, ["ca", "export", "--state-dir", directory.file("state")])
                #expect(export.stdout.hasPrefix("-----BEGIN CERTIFICATE-----"))
                let caPath = try directory.write("exported-ca.pem", export.stdout)

                let curl = try await TestProcess.run("curl", ["-sS", "--max-time", "20", "--cacert", caPath, "https://\(host):\(origin.port)/"],
                                                     environment: ["HTTPS_PROXY": "http://127.0.0.1:\(gate.port)"])
                #expect(curl.status == 0, "\(curl.stderr)")
                #expect(curl.stdout == "through the gate")

                let sClient = try await TestProcess.run("openssl", [
                    "s_client", "-proxy", "127.0.0.1:\(gate.port)", "-connect", "\(host):\(origin.port)", "-servername", host,
                    "-CAfile", caPath, "-verify_return_error", "-verify_hostname", host, "-alpn", "http/1.1", "-quiet",
                ], stdin: Data("GET / HTTP/1.1\r\nHost: \(host)\r\n\r\n".utf8), timeout: 20)
                #expect(sClient.stdout.contains("through the gate"), "\(sClient.stderr)")

                let refused = try await TestProcess.run("curl", ["-sS", "--max-time", "20", "--cacert", caPath, "https://elsewhere.pingate.test/"],
                                                        environment: ["HTTPS_PROXY": "http://127.0.0.1:\(gate.port)"])
                #expect(refused.status != 0)
                #expect(refused.stderr.contains("CONNECT tunnel failed, response 403"))

                // Stopped here for its log (the scope's own stop is then a no-op).
                return await gate.stop()
            }
            return (log, origin.port)
        }

        // The decision log: one JSON line per CONNECT.
        let decisions = log.split(whereSeparator: \.isNewline).compactMap { line -> [String: Any]? in
            guard line.hasPrefix("{") else { return nil }
            return try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        }
        let allowed = decisions.filter { $0["verdict"] as? String == "allowed" }
        let refusedLines = decisions.filter { $0["verdict"] as? String == "refused" }
        #expect(allowed.count == 2, "curl and s_client: \(decisions)")
        #expect(allowed.allSatisfy { ($0["bytes_down"] as? Int ?? 0) > 0 && $0["reason"] as? String == "trusted" && $0["port"] as? Int == originPort })
        #expect(allowed.allSatisfy { $0["observed_fingerprint"] as? String == leaf.fingerprint && $0["upstream_handshake_ms"] != nil && $0["alpn"] != nil })
        #expect(refusedLines.count == 1)
        #expect(refusedLines.first?["host"] as? String == "elsewhere.pingate.test")
        #expect(refusedLines.first?["reason"] as? String == "empty")
        #expect(decisions.allSatisfy { $0["ts"] != nil && $0["client"] != nil && $0["duration_ms"] != nil })
    }

    @Test("--help explains the subcommands; errors are messages, not stack traces")
    func helpAndErrors() async throws {
        let help = try await TestProcess.run(Self.pingate, ["--help"])
        for word in ["run", "ca", "keygen", "sign", "fingerprint", "HTTPS_PROXY"] {
            #expect(help.stdout.contains(word))
        }
        let runHelp = try await TestProcess.run(Self.pingate, ["run", "--help"])
        for flag in ["--config", "--listen", "--state-dir", "--pins", "--pins-key", "--upstream-ca", "--resolve"] {
            #expect(runHelp.stdout.contains(flag))
        }
        let missing = try await TestProcess.run(Self.pingate, ["ca", "export", "--state-dir", "/nonexistent/pingate-state"])
        #expect(missing.status != 0)
        #expect(missing.stderr.contains("pingate ca init"))
        let badResolve = try await TestProcess.run(Self.pingate, ["run", "--listen", "127.0.0.1:0", "--resolve", "nonsense"])
        #expect(badResolve.status != 0)
        #expect(badResolve.stderr.contains("--resolve expects HOST:PORT:ADDRESS"))
    }

    @Test("scripts/demo-origin, started as the README's first command starts it and ended as Ctrl-C ends it (SIGINT to the whole process group), frees its port; so does SIGTERM to the script")
    func demoOriginStopsWithItsShell() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        // As a terminal runs the README's first command: a foreground job with SIGINT at its
        // default, in a process group of its own, which Ctrl-C signals as a whole. Its
        // subshell starts the script in the background, so the script ignores SIGINT.
        let script = """
        import os, signal, socket, subprocess, sys, time
        os.chdir(sys.argv[1])
        def free_port():
            s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close(); return port
        def listening(port):
            s = socket.socket(); result = s.connect_ex(("127.0.0.1", port)); s.close(); return result == 0
        def wait_for(up, port):
            for _ in range(100):
                if listening(port) == up: return True
                time.sleep(0.1)
            return False
        def default_sigint(): signal.signal(signal.SIGINT, signal.SIG_DFL)
        port = free_port()
        shell = subprocess.Popen(["bash", "-c", "(scripts/demo-origin & sleep 60)"], env=dict(os.environ, DEMO_ORIGIN_PORT=str(port)),
                                 start_new_session=True, preexec_fn=default_sigint)
        if not wait_for(True, port): sys.exit("ctrl-c: never listened")
        os.killpg(shell.pid, signal.SIGINT)
        shell.wait()
        print("ctrl-c:", "freed" if wait_for(False, port) else "still listening")
        # SIGTERM to the script itself, as scripts/check-readme ends it.
        port = free_port()
        origin = subprocess.Popen(["scripts/demo-origin"], env=dict(os.environ, DEMO_ORIGIN_PORT=str(port)))
        if not wait_for(True, port): sys.exit("term: never listened")
        origin.terminate()
        origin.wait()
        print("term:", "freed" if wait_for(False, port) else "still listening")
        """
        let run = try await TestProcess.run("python3", ["-c", script, root.path], timeout: 60)
        #expect(run.stdout == "ctrl-c: freed\nterm: freed\n", "\(run.stdout) \(run.stderr)")
    }

    @Test("keygen refuses to overwrite an existing key pair, naming the file, its key id and --force; with --force it replaces both, and the key is 0600")
    func keygenDoesNotOverwrite() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let first = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("signer")])
        #expect(first.status == 0, "\(first.stderr)")
        let original = try String(contentsOfFile: directory.file("signer.key"), encoding: .utf8)
        let id = try #require(first.stdout.components(separatedBy: "key id ").last?.trimmingCharacters(in: .whitespacesAndNewlines))
        let again = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("signer")])
        #expect(again.status != 0)
        #expect(again.stderr.contains("\(directory.file("signer.key")) already exists (key id \(id))"), "\(again.stderr)")
        #expect(again.stderr.contains("--force"), "\(again.stderr)")
        #expect(try String(contentsOfFile: directory.file("signer.key"), encoding: .utf8) == original)
        // Only the public half left behind: still refused, the private key is not made alone.
        try FileManager.default.removeItem(atPath: directory.file("signer.key"))
        let half = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("signer")])
        #expect(half.status != 0 && half.stderr.contains("signer.pub.pem already exists"), "\(half.stderr)")
        let forced = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("signer"), "--force"])
        #expect(forced.status == 0, "\(forced.stderr)")
        #expect(try String(contentsOfFile: directory.file("signer.key"), encoding: .utf8) != original)
        let mode = try FileManager.default.attributesOfItem(atPath: directory.file("signer.key"))[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test("errors a user can cause name the thing and the fix: a missing file, a directory, a public key given to sign --key, a file that is not a certificate, a missing --pins file, a busy --listen and --admin-listen address; never Foundation's or OpenSSL's bare text")
    func errorsNameTheThingAndTheFix() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let keygen = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("signer")])
        #expect(keygen.status == 0, "\(keygen.stderr)")
        let certificate = directory.file("signer.pub.pem")
        let cases: [(arguments: [String], expected: String)] = [
            (["sign", "--key", "/nonexistent/signer.key", "--cert", certificate],
             "--key /nonexistent/signer.key: no such file (/nonexistent/signer.key). Check the path; it should be a PEM private key."),
            (["sign", "--key", directory.file("signer.pub.pem"), "--cert", certificate],
             "is a public key; signing needs the private key (the PREFIX.key that `pingate keygen --out PREFIX` wrote, not PREFIX.pub.pem)."),
            (["fingerprint", "--cert", directory.path], "--cert \(directory.path): is a directory; give the file itself (it should be a PEM certificate)."),
            (["fingerprint", "--cert", directory.file("signer.key")], "--cert \(directory.file("signer.key")): is not a PEM certificate OpenSSL can read"),
            (["fingerprint", "--cert", "/nonexistent/origin.pem"], "--cert /nonexistent/origin.pem: no such file"),
            // A missing local list is a missing file, not "malformed" and not the network.
            (["run", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state-dir", directory.file("state-list"),
              "--pins", "/nonexistent/pins.json", "--pins-key", directory.file("signer.pub.pem")],
             "cannot read the list file /nonexistent/pins.json: no such file. Check the path given to --pins (config: pins.source)"),
        ]
        for (arguments, expected) in cases {
            let run = try await TestProcess.run(Self.pingate, arguments)
            #expect(run.status != 0)
            #expect(run.stderr.contains(expected), "\(arguments): \(run.stderr)")
            #expect(!run.stderr.contains("NSCocoaErrorDomain") && !run.stderr.contains("DECODER routines") && !run.stderr.contains("malformed"),
                    "\(run.stderr)")
        }
        // A port that something already listens on.
        let holder = try TestProcess.resolve("python3")
        let busy = ChildProcess()
        busy.executableURL = URL(fileURLWithPath: holder)
        busy.arguments = ["-c", "import socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\nprint(s.getsockname()[1], flush=True); time.sleep(60)"]
        let out = Pipe()
        busy.standardOutput = out
        try busy.run()
        defer { busy.terminate() }
        let port = try #require(Int(String(decoding: out.fileHandleForReading.availableData, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)))
        let gate = try await TestProcess.run(Self.pingate, ["run", "--listen", "127.0.0.1:\(port)", "--admin-listen", "off",
                                                            "--state-dir", directory.file("state")])
        #expect(gate.status != 0)
        #expect(gate.stderr.contains("cannot listen on 127.0.0.1:\(port): the address is already in use") && gate.stderr.contains("with --listen"),
                "\(gate.stderr)")
        let admin = try await TestProcess.run(Self.pingate, ["run", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:\(port)",
                                                             "--state-dir", directory.file("state")])
        #expect(admin.status != 0)
        #expect(admin.stderr.contains("cannot listen on 127.0.0.1:\(port)") && admin.stderr.contains("with --admin-listen"), "\(admin.stderr)")
        #expect(!gate.stderr.contains("errno") && !admin.stderr.contains("errno"))
    }

    @Test("--help at 80 and at 120 columns wraps prose once, by argument-parser (no hard line breaks in the help texts leave short ragged lines), and attack --help gives its default once", arguments: [80, 120])
    func helpWrapsOnce(columns: Int) async throws {
        for command in [["--help"], ["run", "--help"], ["env", "--help"], ["sign", "--help"], ["fingerprint", "--help"],
                        ["list", "lint", "--help"], ["list", "forget", "--help"]] {
            let help = try await TestProcess.run(Self.pingate, command, environment: ["COLUMNS": "\(columns)"])
            let lines = help.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            // The discussion: the prose between OVERVIEW's first blank line and USAGE.
            guard let usage = lines.firstIndex(where: { $0.hasPrefix("USAGE:") }) else {
                Issue.record("\(command): no USAGE in \(help.stdout)")
                continue
            }
            for (index, line) in lines[..<usage].enumerated() where index + 1 < usage {
                let next = lines[index + 1]
                // A line of a paragraph that goes on must be filled: a hard break in the
                // source, wrapped again, leaves a short line before the paragraph's end.
                // (argument-parser fills lines to one column short of COLUMNS.)
                guard !line.isEmpty, !next.isEmpty, !line.hasPrefix(" "), !next.hasPrefix(" "), !line.hasSuffix(":") else { continue }
                #expect(line.count + 1 + (next.split(separator: " ").first?.count ?? 0) >= columns,
                        "\(command): a short line in the middle of a paragraph: \"\(line)\" then \"\(next)\"")
            }
        }
        let attack = try await TestProcess.run(Self.pingate, ["attack", "--help"], environment: ["COLUMNS": "\(columns)"])
        #expect(attack.stdout.components(separatedBy: "127.0.0.1:8081").count == 2, "\(attack.stdout)")
    }

    @Test("an unknown config key stops start-up, naming the key, its line and the nearest known key (pin for pins, pins.sourc for pins.source); one with nothing near lists the known keys; the example config has none")
    func unknownConfigKeys() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let cases: [(yaml: String, expected: String)] = [
            ("listen: 127.0.0.1:0\npin:\n  source: pins.json\n", "line 2: unknown key 'pin'; did you mean pins? Correct or remove it."),
            ("listen: 127.0.0.1:0\npins:\n  keys: [k.pem]\n  sourc: pins.json\n", "line 4: unknown key 'pins.sourc'; did you mean pins.source?"),
            ("admin:\n  listen: off\n  tokenfile: t\n", "line 3: unknown key 'admin.tokenfile'; did you mean admin.token-file?"),
            ("listen: 127.0.0.1:0\nwhatever-this-is: 1\n", "line 2: unknown key 'whatever-this-is'; the keys known there are listen, admin,"),
        ]
        for (index, (yaml, expected)) in cases.enumerated() {
            let path = try directory.write("config-\(index).yml", yaml)
            let run = try await TestProcess.run(Self.pingate, ["run", "--config", path, "--state-dir", directory.file("state-\(index)")])
            #expect(run.status != 0)
            #expect(run.stderr.contains("config file \(path), \(expected)"), "\(run.stderr)")
            #expect(!FileManager.default.fileExists(atPath: directory.file("state-\(index)")), "the gate went on after the error")
        }
        // The README's first command runs the example config: it must pass the check.
        let example = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("pingate.example.yml")
        let started = try await RunningGate.with(["--config", example.path, "--listen", "127.0.0.1:0", "--admin-listen", "off",
                                                  "--state-dir", directory.file("example-state")]) { gate in gate.port }
        #expect(started > 0)
    }

    @Test("a config value of the wrong type stops start-up with its line, its key path, what the key takes and what the file has (no Swift type names, no coding paths); pins given as a file name says how to write it; pin-warning-days out of range names the key")
    func configValueErrors() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let cases: [(yaml: String, expected: String)] = [
            ("listen: 127.0.0.1:0\nidle-timeout-seconds: 5m\n", "line 2: idle-timeout-seconds takes a whole number of seconds, not \"5m\"."),
            ("listen: 127.0.0.1:0\npins: pins.json\n",
             "line 2: pins takes a section of keys (`key: value` lines indented under it), not \"pins.json\"; the list goes under it: `pins:` then, indented, `source: pins.json` and `keys: [...]`."),
            ("pins:\n  source: p.json\n  keys:\n    - a.pem\n    - [b.pem]\n", "line 5: pins.keys[1] takes a single value, not a list."),
            ("upstream-pool: maybe\n", "line 1: upstream-pool takes true or false, not \"maybe\"."),
            ("admin:\n  allowed-hosts: example.test\n", "line 2: admin.allowed-hosts takes a list ([a, b], or one `- item` per line), not \"example.test\"."),
            ("pin-warning-days: -1\n", "line 1: pin-warning-days takes a whole number of days from 0 to 3650, not -1."),
            ("idle-timeout-seconds: 0\n", "line 1: idle-timeout-seconds takes a whole number of seconds from 1 to 31536000, not 0."),
            // Not YAML: where, and what libyaml found.
            ("listen: [127.0.0.1:8080\n", "line 2, column 1: not valid YAML: did not find expected ',' or ']'"),
            ("admin:\n\tlisten: off\n", "line 2, column 1: not valid YAML: found character that cannot start any token"),
            ("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n", "not valid YAML: a key is given twice (listen); keep one."),
            ("pins:\n  source: http://list.example/pins.json\n  keys: [k.pem]\n", "pins.source http://list.example/pins.json: a list is fetched over https:// only"),
        ]
        for (index, (yaml, expected)) in cases.enumerated() {
            let path = try directory.write("config-\(index).yml", yaml)
            let run = try await TestProcess.run(Self.pingate, ["run", "--config", path, "--state-dir", directory.file("state-\(index)")])
            #expect(run.status != 0)
            #expect(run.stderr.contains(expected), "\(yaml): \(run.stderr)")
            #expect(!run.stderr.contains("Swift.") && !run.stderr.contains("CodingKeys") && !run.stderr.contains("DecodingError"), "\(run.stderr)")
            #expect(!FileManager.default.fileExists(atPath: directory.file("state-\(index)")), "the gate went on after the error")
        }
        // A file of comments only sets nothing; a directory is no file; the admin endpoint on
        // the gate's own address is caught before run fails to bind it.
        let comments = try directory.write("comments.yml", "# nothing set yet\n")
        let defaults = try await TestProcess.run(Self.pingate, ["check-config", "--config", comments, "--state-dir", directory.file("state-c")])
        #expect(defaults.status == 0, "\(defaults.stderr)")
        let folder = try await TestProcess.run(Self.pingate, ["check-config", "--config", directory.path])
        #expect(folder.status != 0 && folder.stderr.contains("it is a directory; give the YAML file"), "\(folder.stderr)")
        let clash = try await TestProcess.run(Self.pingate, ["check-config", "--listen", "127.0.0.1:18096", "--admin-listen", "127.0.0.1:18096",
                                                             "--state-dir", directory.file("state-c")])
        #expect(clash.status != 0 && clash.stderr.contains("is the gate's own listen address"), "\(clash.stderr)")
        let plainHTTP = try await TestProcess.run(Self.pingate, ["check-config", "--pins", "http://list.example/pins.json", "--pins-key", "k.pem",
                                                                 "--state-dir", directory.file("state-c")])
        #expect(plainHTTP.status != 0 && plainHTTP.stderr.contains("--pins http://list.example/pins.json: a list is fetched over https:// only"), "\(plainHTTP.stderr)")
    }

    @Test("paper cuts a new user met, each with a message that names the thing and the fix: keygen --out given a directory or a missing one; ca init and ca export with the gate's --config use its state-dir; demo --junit into a missing directory; list health with no gate there")
    func operatorPaperCuts() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let intoDirectory = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.path + "/"])
        #expect(intoDirectory.status != 0 && intoDirectory.stderr.contains("is a directory; --out is a prefix for two files"), "\(intoDirectory.stderr)")
        #expect(!FileManager.default.fileExists(atPath: directory.file(".key")))
        let missing = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("nowhere/signer")])
        #expect(missing.status != 0 && missing.stderr.contains("the directory \(directory.file("nowhere")) does not exist; create it first"), "\(missing.stderr)")

        let config = try directory.write("gate.yml", "state-dir: gate-state\n")
        let created = try await TestProcess.run(Self.pingate, ["ca", "init", "--config", config])
        #expect(created.status == 0, "\(created.stderr)")
        let exported = try await TestProcess.run(Self.pingate, ["ca", "export", "--config", config, "--path"])
        #expect(exported.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == directory.file("gate-state/ca.pem"), "\(exported.stdout) \(exported.stderr)")

        let junit = try await TestProcess.run(Self.pingate, ["demo", "--junit", directory.file("reports/x.xml")], timeout: 60)
        #expect(junit.status != 0 && junit.stderr.contains("its directory \(directory.file("reports")) does not exist"), "\(junit.stderr)")

        let nobody = try await TestProcess.run(Self.pingate, ["list", "health", "--admin", "127.0.0.1:9"])
        #expect(nobody.status != 0 && nobody.stderr.contains("nothing answered there; is the gate running"), "\(nobody.stderr)")
        #expect(!nobody.stderr.contains("SingleConnectionFailure"))

        // keygen's private key given where the public one goes; a DER certificate; a
        // missing admin token file; a pin signed for a name its certificate does not carry.
        _ = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("signer")])
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns("api.pingate.test")], issuer: pki.originCA, file: "leaf")
        let listPath = try pki.signedList([("api.pingate.test", leaf.fingerprint)])
        let privateAsPublic = try await TestProcess.run(Self.pingate, ["check-config", "--pins", listPath, "--pins-key", directory.file("signer.key"),
                                                                       "--state-dir", directory.file("state-k")])
        #expect(privateAsPublic.stderr.contains("--pins-key: the list-verification key file \(directory.file("signer.key")) is a private key; the gate needs the public one"), "\(privateAsPublic.stderr)")
        _ = try await TestProcess.run("openssl", ["x509", "-in", leaf.certificatePath, "-outform", "der", "-out", directory.file("leaf.der")])
        let der = try await TestProcess.run(Self.pingate, ["fingerprint", "--cert", directory.file("leaf.der")])
        #expect(der.status != 0 && der.stderr.contains("is not text, so not PEM (DER, perhaps)") && der.stderr.contains("openssl x509 -inform der"), "\(der.stderr)")
        let token = try await TestProcess.run(Self.pingate, ["check-config", "--admin-token-file", directory.file("none.token"), "--state-dir", directory.file("state-k")])
        #expect(token.stderr.contains("none.token (admin.token-file, --admin-token-file): it does not exist"), "\(token.stderr)")
        let otherName = try await TestProcess.run(Self.pingate, ["sign", "--key", directory.file("signer.key"), "--cert", leaf.certificatePath, "--name", "bank.pingate.test"])
        #expect(otherName.status == 0 && otherName.stderr.contains("pin 0's certificate does not name bank.pingate.test"), "\(otherName.stderr)")
        let sameName = try await TestProcess.run(Self.pingate, ["sign", "--key", directory.file("signer.key"), "--cert", leaf.certificatePath, "--name", "api.pingate.test"])
        #expect(sameName.status == 0 && !sameName.stderr.contains("warning"), "\(sameName.stderr)")
        // A flag gets the range its config key has.
        let drain = try await TestProcess.run(Self.pingate, ["check-config", "--drain-timeout", "100000", "--state-dir", directory.file("state-k")])
        #expect(drain.status != 0 && drain.stderr.contains("--drain-timeout takes a whole number of seconds from 0 to 3600, not 100000"), "\(drain.stderr)")
    }

    @Test("--log-format json: every line the gate writes on stderr is one JSON object with ts, level, message and logger, the metadata as fields; an unknown format is refused naming the key")
    func jsonOperationalLog() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let text = try await RunningGate.with(["--listen", "127.0.0.1:0", "--state-dir", directory.file("state"), "--log-format", "json",
                                               "--decision-log", "off"]) { gate in
            _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
            return gate.logText
        }
        let lines = text.split(whereSeparator: \.isNewline)
        #expect(lines.count >= 3, "\(text)")
        for line in lines {
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            #expect(object?["ts"] is String && object?["level"] is String && object?["message"] is String && object?["logger"] as? String == "pingate",
                    "not a JSON log line: \(line)")
        }
        #expect(text.contains("\"message\":\"pingate listening\""), "\(text)")
        #expect(text.contains("\"level\":\"warning\""), "the no-list warning: \(text)")
        let unknown = try await TestProcess.run(Self.pingate, ["check-config", "--log-format", "yaml", "--state-dir", directory.file("s")])
        // check-config lists every problem, one per line, not just the first.
        let several = try directory.write("several.yml", "listen: 22180\nlog-format: yaml\nupstream-ca: [nope.pem]\nadmin:\n  listen: nowhere\n")
        let all = try await TestProcess.run(Self.pingate, ["check-config", "--config", several, "--state-dir", directory.file("s")])
        let problemLines = all.stderr.split(separator: "\n").dropFirst()
        #expect(all.status == 1 && all.stderr.hasPrefix("Error: config \(several): 4 problems, one per line:\n"), "\(all.stderr)")
        #expect(problemLines.count == 4 && problemLines.contains { $0.hasPrefix("--listen (config: listen)") }
                && problemLines.contains { $0.hasPrefix("--log-format (config: log-format)") }
                && problemLines.contains { $0.hasPrefix("--upstream-ca (config: upstream-ca): cannot read") }
                && problemLines.contains { $0.hasPrefix("--admin-listen (config: admin.listen)") }, "\(all.stderr)")
        #expect(unknown.status == 1 && unknown.stderr.contains("--log-format (config: log-format): unknown format \"yaml\"; give text or json"), "\(unknown.stderr)")
    }

    @Test("check-config (and run --check): the example config is valid and nothing is written; a missing or broken upstream-ca, an unsigned draft as --pins, a state dir under a file and a bare port as listen each fail with the key and the fix, before anything is created; run itself says the same")
    func runCheck() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let root = TestProcess.repositoryRoot
        let example = root.appendingPathComponent("pingate.example.yml").path
        let state = directory.file("state")
        let valid = try await TestProcess.run(Self.pingate, ["check-config", "--config", example, "--state-dir", state])
        #expect(valid.status == 0, "\(valid.stderr)")
        #expect(valid.stdout.hasPrefix("pingate: config \(example) is valid; the gate would start with:"), "\(valid.stdout)")
        #expect(valid.stdout.contains("pins:         \(root.path)/certs/example/pins.json: wultra-static, 1 pin (1 unexpired), verified with 1 key"), "\(valid.stdout)")
        #expect(valid.stdout.contains("(the local CA will be created at start)"))
        #expect(!FileManager.default.fileExists(atPath: state), "--check wrote the state directory")

        let garbage = try directory.write("garbage.pem", "not a certificate\n")
        let file = try directory.write("a-file", "")
        let draft = try directory.write("draft.json", #"{"comment":"x","pins":[{"host":"a.test","spki":"47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=","expires":1900000000,"why":"w"}]}"#)
        let bareListen = try directory.write("bare.yml", "listen: 22180\n")
        let cases: [([String], String)] = [
            (["--config", example, "--upstream-ca", directory.file("nope.pem")],
             "--upstream-ca (config: upstream-ca): cannot read \(directory.file("nope.pem")): no such file; give a readable PEM file of trust anchors"),
            (["--config", example, "--upstream-ca", garbage], "--upstream-ca (config: upstream-ca): \(garbage) is not usable as trust anchors"),
            (["--pins", draft, "--pins-key", root.appendingPathComponent("certs/example/list-signer.pub.pem").path],
             "\(draft) is an unsigned list draft (from pingate list propose); sign it first: pingate sign --draft"),
            (["--config", example, "--state-dir", "\(file)/state"], "\(file) is a file, not a directory; choose a directory path"),
            (["--config", bareListen], "--listen (config: listen): expected HOST:PORT or [IPv6]:PORT, got \"22180\"; a port alone is not enough: write 127.0.0.1:22180"),
        ]
        for (index, (arguments, expected)) in cases.enumerated() {
            let caseState = directory.file("state-\(index)")
            let withState = arguments.contains("--state-dir") ? arguments : arguments + ["--state-dir", caseState]
            for mode in [["run", "--check"], ["check-config"], ["run", "--admin-listen", "off", "--listen", "127.0.0.1:0"]] where !(mode.count > 2 && arguments.first == "--config" && arguments.contains(bareListen)) {
                let result = try await TestProcess.run(Self.pingate, mode + withState)
                #expect(result.status == 1, "\(mode) \(arguments): \(result.stdout)")
                #expect(result.stderr.contains(expected), "\(mode) \(arguments): \(result.stderr)")
                #expect(!FileManager.default.fileExists(atPath: caseState), "\(mode) \(arguments) created the state directory")
            }
        }
    }
}

/// `pingate run` as a child process; its port is read from its start-up log line.
final class RunningGate: Sendable {
    let process: ChildProcess
    let port: Int
    private let log: OutputCollector
    private let logDrain: PipeDrain

    private init(process: ChildProcess, port: Int, log: OutputCollector, logDrain: PipeDrain) {
        self.process = process
        self.port = port
        self.log = log
        self.logDrain = logDrain
    }

    /// Starts `pingate run ARGS`; nil if it exits before listening.
    static func start(_ arguments: [String], environment: [String: String] = [:]) async throws -> RunningGate? {
        try await launch(arguments, environment: environment).gate
    }

    /// Starts `pingate run ARGS`, runs `body` with it, and stops it (SIGTERM, then SIGKILL)
    /// whether `body` returns or throws. If pingate exits before listening, that is
    /// recorded as an issue at the caller, with pingate's log, and the test ends there.
    /// `body` may stop the gate itself, to read its full log or to restart it: the
    /// scope's own stop is then a no-op.
    static func with<Value>(
        _ arguments: [String],
        environment: [String: String] = [:],
        isolation: isolated (any Actor)? = #isolation,
        sourceLocation: SourceLocation = #_sourceLocation,
        _ body: (RunningGate) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: {
                let launched = try await launch(arguments, environment: environment)
                return try #require(launched.gate, "pingate run exited before listening: \(launched.log)",
                                    sourceLocation: sourceLocation)
            },
            stop: { await $0.stop() },
            body: body)
    }

    /// Like `with`, for a test about whether pingate starts at all: `body` gets nil when
    /// it exited before listening, and a running gate is stopped whether `body` returns
    /// or throws.
    static func withAttempt<Value>(
        _ arguments: [String],
        environment: [String: String] = [:],
        isolation: isolated (any Actor)? = #isolation,
        _ body: (RunningGate?) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: { try await start(arguments, environment: environment) },
            stop: { await $0?.stop() },
            body: body)
    }

    /// Starts `pingate run ARGS`: the gate once it listens, or nil if it exited first,
    /// with everything it logged up to then.
    private static func launch(_ arguments: [String], environment: [String: String]) async throws -> (gate: RunningGate?, log: String) {
        let process = ChildProcess()
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        }
        process.executableURL = URL(fileURLWithPath: TestProcess.pingateExecutable)
        // Parallel tests must not fight over the admin endpoint's default port.
        process.arguments = ["run"] + arguments + (arguments.contains("--admin-listen") ? [] : ["--admin-listen", "127.0.0.1:0"])
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = FileHandle.nullDevice
        let log = OutputCollector()
        try process.run()
        let drain = PipeDrain(pipe.fileHandleForReading, into: log.appendErr)
        _ = await eventually(timeout: .seconds(10), interval: .milliseconds(25)) {
            Self.listeningPort(in: log.errText) != nil || !process.isRunning
        }
        if let port = Self.listeningPort(in: log.errText) {
            return (RunningGate(process: process, port: port, log: log, logDrain: drain), log.errText)
        }
        if !process.isRunning {
            _ = await drain.finished(within: .seconds(5))  // its last words, e.g. why it refused to start
            return (nil, log.errText)
        }
        await process.terminateAndWait()
        _ = await drain.finished(within: .seconds(5))
        throw TestFailure("pingate did not start: \(log.errText)")
    }

    /// Stops the gate and returns everything it logged. Safe to call more than once:
    /// an exited gate is not signalled again, and the log is returned again.
    @discardableResult
    func stop() async -> String {
        await process.terminateAndWait()
        _ = await logDrain.finished(within: .seconds(5))  // everything up to its exit
        return log.errText
    }

    /// Everything the gate has logged so far.
    var logText: String { log.errText }

    /// The admin endpoint's port, from its "admin endpoint listening" line.
    var adminPort: Int? { Self.port(in: log.errText, line: "admin endpoint listening") }

    /// The port from "address=HOST:PORT … pingate listening".
    static func listeningPort(in text: String) -> Int? {
        port(in: text, line: "pingate listening")
    }

    /// The port of the `address=` on the first line containing `marker`.
    static func port(in text: String, line marker: String) -> Int? {
        for line in text.split(whereSeparator: \.isNewline) where line.contains(marker) {
            // swift-log's text lines (`address=HOST:PORT`), or --log-format json's ("address":"HOST:PORT").
            guard let range = line.range(of: "address=") ?? line.range(of: "\"address\":\"") else { continue }
            let address = line[range.upperBound...].prefix { $0 != " " && $0 != "\"" }
            return address.split(separator: ":").last.flatMap { Int($0) }
        }
        return nil
    }
}

/// The signed-list commands and a URL-fed `pingate run`.
@Suite("pingate list commands")
struct ListCommandLineTests {
    static var pingate: String { TestProcess.pingateExecutable }

    @Test("sign --format v2 → list verify (and a tampered copy fails) → run --pins v2 file → curl")
    func v2Workflow() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "v2.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        try await LoopbackOrigin.with(identity: leaf, behaviour: .http(body: "v2 ok")) { origin in
            _ = try await TestProcess.run(Self.pingate, ["keygen", "--out", directory.file("cli-signer")])
            let sign = try await TestProcess.run(Self.pingate, [
                "sign", "--format", "v2", "--sequence", "3", "--key", directory.file("cli-signer.key"),
                "--connect", "\(host):\(origin.port)", "--resolve", "\(host):\(origin.port):127.0.0.1", "--upstream-ca", pki.upstreamTrustPath, "--spki",
                "--revoke", SHA256Digest.base64(Array("old".utf8)),
            ])
            #expect(sign.status == 0, "\(sign.stderr)")
            let listPath = try directory.write("pins-v2.json", sign.stdout)

            let verify = try await TestProcess.run(Self.pingate, ["list", "verify", listPath, "--key", directory.file("cli-signer.pub.pem")])
            #expect(verify.status == 0, "\(verify.stderr)")
            #expect(verify.stdout.contains("valid pingate-v2 list"))
            #expect(verify.stdout.contains("sequence:   3"))
            #expect(verify.stdout.contains("\(host)  spki/\(leaf.certificate.spkiSHA256)  enforce"))
            #expect(verify.stdout.contains("days left"))

            let tampered = try directory.write("tampered.json", sign.stdout.replacingOccurrences(of: "\"keyId\" : \"", with: "\"keyId\" : \"0"))
            let bad = try await TestProcess.run(Self.pingate, ["list", "verify", tampered, "--key", directory.file("cli-signer.pub.pem")])
            #expect(bad.status != 0)
            #expect(bad.stderr.contains("does not verify"))

            try await RunningGate.with([
                "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"), "--pins", listPath,
                "--pins-key", directory.file("cli-signer.pub.pem"), "--upstream-ca", pki.upstreamTrustPath,
                "--resolve", "\(host):\(origin.port):127.0.0.1",
            ]) { gate in
                let curl = try await TestProcess.run("curl", ["-sS", "--max-time", "20", "--proxy", "http://127.0.0.1:\(gate.port)",
                                                              "--cacert", directory.file("state/ca.pem"), "https://\(host):\(origin.port)/"])
                #expect(curl.stdout == "v2 ok", "\(curl.stderr)")
            }
        }
    }

    /// `/status`'s `list` object from a running gate.
    static func listStatus(_ gate: RunningGate) async throws -> [String: Any] {
        // The admin endpoint says it listens just after the gate does.
        _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
        let adminPort = try #require(gate.adminPort)
        let answer = try await TestProcess.run("curl", ["-sS", "--max-time", "10", "http://127.0.0.1:\(adminPort)/status"])
        let status = try #require(try JSONSerialization.jsonObject(with: answer.stdoutData) as? [String: Any])
        return try #require(status["list"] as? [String: Any])
    }

    @Test("a SIGHUP re-read persists the --pins file; a restart with an older file stops and names `pingate list forget`; a newer file is in force, and the log and /status say why; after forget the older file starts")
    func pinsFileAgainstPersisted() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let (hostA, hostB) = ("a.files.pingate.test", "b.files.pingate.test")
        let leafA = try pki.leaf([.dns(hostA)], issuer: pki.originCA, file: "a")
        let leafB = try pki.leaf([.dns(hostB)], issuer: pki.originCA, file: "b")
        let state = directory.file("state")
        try await LoopbackOrigin.with(identity: leafA, behaviour: .http(body: "A")) { originA in
            try await LoopbackOrigin.with(identity: leafB, behaviour: .http(body: "B")) { originB in
                let one = try pki.signedV2(sequence: 1, pins: [TestPKI.pin(hostA, leafA)])
                let listPath = try directory.write("pins.json", String(decoding: one, as: UTF8.self))
                let oldPath = try directory.write("old.json", String(decoding: one, as: UTF8.self))
                let arguments = { (file: String) in [
                    "--listen", "127.0.0.1:0", "--state-dir", state, "--pins", file, "--pins-key", pki.signerPublicKeyPath,
                    "--upstream-ca", pki.upstreamTrustPath,
                    "--resolve", "\(hostA):\(originA.port):127.0.0.1", "--resolve", "\(hostB):\(originB.port):127.0.0.1",
                ] }
                let fetch = { (gate: RunningGate, host: String, port: Int) in
                    try await TestProcess.run("curl", ["-sS", "--max-time", "20", "--proxy", "http://127.0.0.1:\(gate.port)",
                                                       "--cacert", (state as NSString).appendingPathComponent("ca.pem"), "https://\(host):\(port)/"])
                }

                // 1. Start with sequence 1, then publish sequence 2 into the same file and reload.
                try await RunningGate.with(arguments(listPath)) { gate in
                    let started = try await Self.listStatus(gate)
                    #expect(started["origin"] as? String == "pins-file")
                    #expect(started["in_force_because"] as? String == "the --pins file \(listPath) (sequence 1); no list was persisted before")
                    _ = try directory.write("pins.json", String(decoding: try pki.signedV2(sequence: 2, pins: [
                        TestPKI.pin(hostA, leafA), TestPKI.pin(hostB, leafB),
                    ]), as: UTF8.self))
                    kill(gate.process.processIdentifier, SIGHUP)
                    #expect(await eventually(timeout: .seconds(10)) { (try? await Self.listStatus(gate))?["sequence"] as? Int == 2 })
                    let reloaded = try await Self.listStatus(gate)
                    #expect((reloaded["in_force_because"] as? String)?.hasPrefix("the --pins file \(listPath), re-read at ") == true, "\(reloaded)")
                    #expect(try await fetch(gate, hostB, originB.port).stdout == "B")
                }

                // 2. The older file: no start, and the message says what to do.
                let refused = try await TestProcess.run(Self.pingate, ["run"] + arguments(oldPath) + ["--admin-listen", "off"], timeout: 30)
                #expect(refused.status != 0)
                #expect(refused.stderr.contains("refusing to start: the --pins file \(oldPath) (sequence 1) is older than the list persisted in \(state)/pin-list.json (sequence 2), from \(listPath)"), "\(refused.stderr)")
                #expect(refused.stderr.contains("`pingate list forget --state-dir \(state)`"))

                // 3. A newer file with only B: it is in force, A is refused.
                let newerPath = try directory.write("newer.json", String(decoding: try pki.signedV2(sequence: 3, pins: [TestPKI.pin(hostB, leafB)]), as: UTF8.self))
                try await RunningGate.with(arguments(newerPath)) { gate in
                    #expect(try await fetch(gate, hostB, originB.port).stdout == "B")
                    #expect(try await fetch(gate, hostA, originA.port).stdout != "A")
                    let status = try await Self.listStatus(gate)
                    #expect(status["sequence"] as? Int == 3)
                    #expect((status["in_force_because"] as? String)?.contains("(sequence 3); it replaces the list persisted in \(state)/pin-list.json (sequence 2)") == true, "\(status)")
                    let log = await gate.stop()
                    #expect(log.contains("origin=pins-file"), "\(log)")
                }
                let show = try await TestProcess.run(Self.pingate, ["list", "show", "--state-dir", state, "--key", pki.signerPublicKeyPath])
                #expect(show.stdout.contains("sequence:   3"), "the file in force is what `list show` shows: \(show.stdout)\(show.stderr)")

                // 4. Forget, and the rollback to sequence 1 is allowed.
                let forget = try await TestProcess.run(Self.pingate, ["list", "forget", "--state-dir", state])
                #expect(forget.status == 0)
                #expect(forget.stdout.contains("removed \(state)/pin-list.json (a pingate-v2 list from \(newerPath)"), "\(forget.stdout)")
                let again = try await TestProcess.run(Self.pingate, ["list", "forget", "--state-dir", state])
                #expect(again.stdout.contains("nothing to forget"))
                try await RunningGate.with(arguments(oldPath)) { gate in
                    let answer = try await fetch(gate, hostA, originA.port)
                    #expect(answer.stdout == "A", "\(answer.stderr)")
                }
            }
        }
    }

    @Test("run --pins https://…: fetched, persisted, shown by `list show`; restart with the server down still enforces it")
    func urlSource() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "url.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        let listIdentity = try pki.leaf([.dns("lists.pingate.test")], issuer: pki.originCA, file: "lists")
        try await LoopbackOrigin.with(identity: leaf, behaviour: .http(body: "from url")) { origin in
            try await TestListServer.with(identity: listIdentity, behaviour: .serve(try pki.signedV2(sequence: 12, pins: [TestPKI.pin(host, leaf)]))) { listServer in
                let config = try directory.write("pingate.yml", """
                listen: 127.0.0.1:0
                state-dir: state
                pins:
                  source: https://lists.pingate.test:\(listServer.port)/pins.json
                  keys: [signer.pub.pem]
                  server-ca: [\(pki.originCA.certificatePath)]
                  wait-seconds: 3
                upstream-ca: [\(pki.upstreamTrustPath)]
                resolve: ["\(host):\(origin.port):127.0.0.1", "lists.pingate.test:\(listServer.port):127.0.0.1"]
                """)
                let url = "https://\(host):\(origin.port)/"
                let curlArguments = { (port: Int) in ["-sS", "--max-time", "20", "--proxy", "http://127.0.0.1:\(port)", "--cacert", directory.file("state/ca.pem"), url] }

                try await RunningGate.with(["--config", config]) { first in
                    let fetched = try await TestProcess.run("curl", curlArguments(first.port))
                    #expect(fetched.stdout == "from url", "\(fetched.stderr)")
                    let log = await first.stop() // its log, once stopped; the scope's stop is then a no-op
                    #expect(log.contains("fingerprint list in force"))
                }

                let show = try await TestProcess.run(Self.pingate, ["list", "show", "--state-dir", directory.file("state"), "--key", pki.signerPublicKeyPath])
                #expect(show.status == 0, "\(show.stderr)")
                #expect(show.stdout.contains("sequence:   12"))
                #expect(show.stdout.contains(host))

                // The restart runs with the list server down; the scope's stop of it is then a no-op.
                await listServer.stop()
                try await RunningGate.with(["--config", config]) { second in
                    let offline = try await TestProcess.run("curl", curlArguments(second.port))
                    #expect(offline.stdout == "from url", "\(offline.stderr)")
                    let secondLog = await second.stop()
                    #expect(secondLog.contains("origin=persisted"), "\(secondLog)")
                }
            }
        }
    }
}
