import Foundation
import PinGateTestSupport
import Testing

/// `eval "$(pingate env)"` as a user types it: curl, Python requests, Node and git reach a
/// pinned nginx origin through the gate with no flags of their own.
@Suite("pingate env")
struct EnvCommandTests {
    static let host = "env.pingate.test"

    @Test("after eval \"$(pingate env)\", curl, requests, Node's https and fetch() and git clone go through the gate with no flags; a refused host's reason reaches Node's https and fetch()")
    func fourClientsThroughTheGate() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host), .dns("unpinned.pingate.test")], issuer: pki.originCA, file: "origin")
        let listPath = try directory.write("pins.json", String(decoding: try pki.signedV2(sequence: 1, pins: [TestPKI.pin(Self.host, leaf)]), as: UTF8.self))

        // A bare repository served as files: git's "dumb" HTTP protocol needs no git server.
        let work = directory.file("work")
        let git = try TestProcess.resolve("git")
        for arguments in [["init", "-q", "-b", "main", work], ["-C", work, "config", "user.email", "t@pingate.test"],
                          ["-C", work, "config", "user.name", "t"]] {
            _ = try await TestProcess.run(git, arguments)
        }
        _ = try directory.write("work/README", "cloned through the gate\n")
        for arguments in [["-C", work, "add", "README"], ["-C", work, "commit", "-q", "-m", "one"],
                          ["clone", "-q", "--bare", work, directory.file("repo.git")], ["-C", directory.file("repo.git"), "update-server-info"]] {
            let result = try await TestProcess.run(git, arguments)
            #expect(result.status == 0, "git \(arguments): \(result.stderr)")
        }

        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath,
                                   files: ["index.txt": Data("hello through the gate".utf8)]) { origin in
            _ = try await TestProcess.run("cp", ["-r", directory.file("repo.git"), (origin.directory.file("www") as NSString).appendingPathComponent("repo.git")])
            let state = directory.file("state")
            try await RunningGate.with([
                "--listen", "127.0.0.1:0", "--state-dir", state, "--pins", listPath, "--pins-key", pki.signerPublicKeyPath,
                "--upstream-ca", pki.upstreamTrustPath, "--resolve", "\(Self.host):\(origin.port):127.0.0.1",
                "--resolve", "unpinned.pingate.test:\(origin.port):127.0.0.1", "--decision-log", "off",
            ]) { gate in
                let url = "https://\(Self.host):\(origin.port)/index.txt"
                let python = try TestProcess.resolve("python3")
                let node = try TestProcess.resolve("node")
                let nodeGet = { (target: String) in
                    "\(node) -e 'require(\"https\").get(\"\(target)\", (r) => { let b = \"\"; r.on(\"data\", (d) => b += d); r.on(\"end\", () => console.log(r.statusCode + \" \" + b)); }).on(\"error\", (e) => { console.log(\"error: \" + e.message); process.exit(3); })'"
                }
                let nodeFetch = { (target: String) in
                    "\(node) -e 'fetch(\"\(target)\").then(async (r) => console.log(r.status + \" \" + await r.text()), (e) => { console.log(\"error: \" + (e.cause ? e.cause.message : e.message)); process.exit(3); })'"
                }
                // Each client in a shell of its own: only what `eval` sets reaches it. The
                // names resolve nowhere but in the gate, so an answer proves the gate was used.
                let clients: [(String, String, String)] = [
                    ("curl", "curl -sS --max-time 20 \(url)", "hello through the gate"),
                    ("requests", "\(python) -c 'import requests; print(requests.get(\"\(url)\", timeout=20).text)'", "hello through the gate"),
                    ("node", nodeGet(url), "200 hello through the gate"),
                    ("node fetch", nodeFetch(url), "200 hello through the gate"),
                    ("git", "\(git) clone -q https://\(Self.host):\(origin.port)/repo.git \(directory.file("clone")) && cat \(directory.file("clone/README"))", "cloned through the gate"),
                ]
                let clean = ["HTTPS_PROXY", "https_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                             "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "NODE_OPTIONS", "NO_PROXY", "no_proxy"]
                for (name, command, expected) in clients {
                    let script = "unset \(clean.joined(separator: " ")); eval \"$(\(TestProcess.pingateExecutable) env --listen 127.0.0.1:\(gate.port) --state-dir \(state))\" && \(command)"
                    let result = try await TestProcess.run("sh", ["-c", script], timeout: 60)
                    #expect(result.status == 0, "\(name): \(result.stderr)")
                    #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == expected, "\(name): \(result.stdout) \(result.stderr)")
                }
                // Without the environment the same curl cannot even resolve the name.
                let bare = try await TestProcess.run("sh", ["-c", "unset \(clean.joined(separator: " ")); curl -sS --max-time 10 \(url)"])
                #expect(bare.status != 0)

                // A host the list does not pin: Node's error carries the gate's reason.
                let refused = try await TestProcess.run("sh", ["-c", "eval \"$(\(TestProcess.pingateExecutable) env --listen 127.0.0.1:\(gate.port) --state-dir \(state))\" && \(nodeGet("https://unpinned.pingate.test:\(origin.port)/"))"])
                #expect(refused.status == 3)
                #expect(refused.stdout.contains("error: the proxy refused CONNECT unpinned.pingate.test:\(origin.port): 403"), "\(refused.stdout)")
                // The same for fetch(): refused with the reason, never sent around the gate.
                let refusedFetch = try await TestProcess.run("sh", ["-c", "eval \"$(\(TestProcess.pingateExecutable) env --listen 127.0.0.1:\(gate.port) --state-dir \(state))\" && \(nodeFetch("https://unpinned.pingate.test:\(origin.port)/"))"])
                #expect(refusedFetch.status == 3)
                #expect(refusedFetch.stdout.contains("error: the proxy refused CONNECT unpinned.pingate.test:\(origin.port): 403"), "\(refusedFetch.stdout)")

                // Four tunnels were trusted (git may open more than one).
                _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
                let adminPort = try #require(gate.adminPort)
                let status = try await TestProcess.run("curl", ["-sS", "http://127.0.0.1:\(adminPort)/status"])
                let counters = try #require((try JSONSerialization.jsonObject(with: status.stdoutData) as? [String: Any])?["counters"] as? [String: Any])
                #expect(((counters["tunnels_by_reason"] as? [String: Int])?["trusted"] ?? 0) >= 4, "\(counters)")
            }
        }
    }

    @Test("the packaged layout: a gate run by root with its state directory root's only and a public-dir; another user (nobody) gets the gate's environment from pingate env --config, reading only the published files, and its curl reaches the pinned origin through the gate; before the gate published them, env says to start it",
          .enabled(if: getuid() == 0, "switching to another user needs root (CI runs as root)"))
    func anotherUserOfThePackagedGate() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        // The other user must reach the config and the published files (not the state).
        _ = chmod(directory.path, 0o755)
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(Self.host)], issuer: pki.originCA, file: "origin")
        let listPath = try directory.write("pins.json", String(decoding: try pki.signedV2(sequence: 1, pins: [TestPKI.pin(Self.host, leaf)]), as: UTF8.self))
        let state = directory.file("state"), published = directory.file("public")
        let pingate = TestProcess.pingateExecutable
        let asNobody = { (script: String) in
            try await TestProcess.run("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i", "PATH=/usr/bin:/bin",
                                                  "HOME=/nonexistent", "sh", "-c", script], timeout: 60)
        }
        // Before any gate ran: nothing published, and env says what to do.
        let early = try directory.write("early.yml", "listen: 127.0.0.1:9\nstate-dir: state\npublic-dir: public\n")
        _ = chmod(early, 0o644)
        let before = try await asNobody("\(pingate) env --config \(early)")
        #expect(before.status == 1 && before.stderr.contains("\(published)/ca.pem does not exist: the gate writes it into its public-dir"), "\(before.stderr)")

        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: ["index.txt": Data("hello, other user".utf8)]) { origin in
            try await RunningGate.with([
                "--listen", "127.0.0.1:0", "--state-dir", state, "--public-dir", published, "--pins", listPath, "--pins-key", pki.signerPublicKeyPath,
                "--upstream-ca", pki.upstreamTrustPath, "--resolve", "\(Self.host):\(origin.port):127.0.0.1", "--decision-log", "off",
            ]) { gate in
                let config = try directory.write("gate.yml", "listen: 127.0.0.1:\(gate.port)\nstate-dir: state\npublic-dir: public\n")
                _ = chmod(config, 0o644)
                var stateInfo = stat()
                #expect(stat(state, &stateInfo) == 0 && stateInfo.st_mode & 0o777 == 0o700, "the state directory is the gate's own")
                var publicInfo = stat()
                #expect(stat(published, &publicInfo) == 0 && publicInfo.st_mode & 0o777 == 0o755)
                for name in ["ca.pem", "ca-bundle.pem", "node-proxy.cjs"] {
                    var info = stat()
                    #expect(stat("\(published)/\(name)", &info) == 0 && info.st_mode & 0o777 == 0o644, "\(name)")
                }
                #expect(try String(contentsOfFile: "\(published)/ca.pem", encoding: .utf8) == String(contentsOfFile: "\(state)/ca.pem", encoding: .utf8))
                #expect(!FileManager.default.fileExists(atPath: "\(published)/ca.key"))

                let printed = try await asNobody("\(pingate) env --config \(config)")
                #expect(printed.status == 0, "\(printed.stderr)")
                #expect(printed.stdout.contains("export SSL_CERT_FILE='\(published)/ca-bundle.pem'"), "\(printed.stdout)")
                #expect(printed.stdout.contains("export HTTPS_PROXY='http://127.0.0.1:\(gate.port)'"), "\(printed.stdout)")
                let fetched = try await asNobody("eval \"$(\(pingate) env --config \(config))\" && curl -sS --max-time 20 https://\(Self.host):\(origin.port)/index.txt")
                #expect(fetched.status == 0 && fetched.stdout == "hello, other user", "\(fetched.stdout) \(fetched.stderr)")
                // env wrote nothing of its own into the gate's state directory.
                #expect(!FileManager.default.fileExists(atPath: "\(state)/ca-bundle.pem"))
            }
        }
    }

    @Test("the bundle holds the system roots and the gate's CA; the default state dir follows XDG_STATE_HOME, then HOME; fish and PowerShell get their own syntax; a re-eval adds the Node preload once; awkward paths are quoted or refused")
    func outputs() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let state = directory.file("state")
        let pingate = TestProcess.pingateExecutable
        let sh = try await TestProcess.run(pingate, ["env", "--state-dir", state, "--listen", "0.0.0.0:18080"])
        #expect(sh.status == 0, "\(sh.stderr)")
        #expect(sh.stdout.contains("export HTTPS_PROXY='http://127.0.0.1:18080'\n"), "a gate on every address is reached through loopback")
        #expect(sh.stdout.contains("export SSL_CERT_FILE='\(state)/ca-bundle.pem'\n"))
        let bundle = try String(contentsOfFile: "\(state)/ca-bundle.pem", encoding: .utf8)
        let ca = try String(contentsOfFile: "\(state)/ca.pem", encoding: .utf8)
        #expect(bundle.hasSuffix(ca))
        #expect(bundle.components(separatedBy: "BEGIN CERTIFICATE").count > 10, "the system roots are in the bundle")
        // Node before 24 on PATH: a note that the preload carries its https module and fetch().
        let nodeVersion = try await TestProcess.run("node", ["--version"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let nodeMajor = Int(nodeVersion.dropFirst().prefix { $0 != "." }) ?? 0
        #expect(sh.stderr.contains("Node \(nodeVersion) is on PATH") == (nodeMajor < 24), "\(nodeVersion): \(sh.stderr)")
        #expect(sh.stderr.contains("sends its https module and fetch() through the gate") == (nodeMajor < 24), "\(sh.stderr)")

        let twice = try await TestProcess.run("sh", ["-c", "unset NODE_OPTIONS; export NODE_OPTIONS=--no-warnings; eval \"$(\(pingate) env --state-dir \(state))\"; eval \"$(\(pingate) env --state-dir \(state))\"; printf %s \"$NODE_OPTIONS\""])
        #expect(twice.stdout == "--require \"\(state)/node-proxy.cjs\" --no-warnings", "\(twice.stdout)")

        // A state directory with a quote and a space: sh gets it whole, and Node loads the
        // preload from it (its agent replaces https.globalAgent).
        let awkward = directory.file("it's a state")
        let node = try TestProcess.resolve("node")
        let quoted = try await TestProcess.run("sh", ["-c", "unset NODE_OPTIONS; eval \"$(\(pingate) env --state-dir \"$0\")\" && printf '%s\\n' \"$SSL_CERT_FILE\" && \(node) -e 'console.log(require(\"https\").globalAgent.constructor.name)'", awkward])
        #expect(quoted.stdout == "\(awkward)/ca-bundle.pem\nPingateTunnelAgent\n", "\(quoted.stdout)\(quoted.stderr)")
        let refused = try await TestProcess.run(pingate, ["env", "--state-dir", directory.file("bad\"dir")])
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("which pingate env cannot put into every shell and into NODE_OPTIONS safely"), "\(refused.stderr)")
        let curly = directory.file("it’s")
        let powershellCurly = try await TestProcess.run(pingate, ["env", "--shell", "powershell", "--state-dir", curly])
        #expect(powershellCurly.stdout.contains("$env:SSL_CERT_FILE = '\(directory.path)/it’’s/ca-bundle.pem'\n"),
                "PowerShell ends a single-quoted string at ’ too: \(powershellCurly.stdout)")

        // Without --state-dir: $XDG_STATE_HOME/pingate, else ~/.local/state/pingate.
        let xdg = try await TestProcess.run(pingate, ["env"], environment: ["XDG_STATE_HOME": directory.file("xdg"), "HOME": directory.file("home")])
        #expect(xdg.stdout.contains("export SSL_CERT_FILE='\(directory.file("xdg"))/pingate/ca-bundle.pem'\n"), "\(xdg.stdout)\(xdg.stderr)")
        let home = try await TestProcess.run(pingate, ["env"], environment: ["XDG_STATE_HOME": "", "HOME": directory.file("home")])
        #expect(home.stdout.contains("export SSL_CERT_FILE='\(directory.file("home"))/.local/state/pingate/ca-bundle.pem'\n"), "\(home.stdout)\(home.stderr)")

        // The listen host goes into shell code: only an address or a plain name.
        let hostile = try directory.write("hostile.yml", "listen: \"x;touch pwned:8080\"\n")
        let badHost = try await TestProcess.run(pingate, ["env", "--config", hostile, "--state-dir", state])
        #expect(badHost.status != 0 && badHost.stderr.contains("is neither an IP address nor a plain host name"), "\(badHost.stdout)\(badHost.stderr)")

        let fish = try await TestProcess.run(pingate, ["env", "--state-dir", state, "--shell", "fish"])
        #expect(fish.stdout.contains("set -gx HTTPS_PROXY 'http://127.0.0.1:8080'\n"))
        #expect(fish.stdout.contains("set -gx GIT_SSL_CAINFO '\(state)/ca-bundle.pem'\n"))
        let powershell = try await TestProcess.run(pingate, ["env", "--state-dir", state, "--shell", "powershell", "--listen", "[::1]:9"])
        #expect(powershell.stdout.contains("$env:HTTPS_PROXY = 'http://[::1]:9'\n"))
        #expect(powershell.stdout.contains("$env:NODE_EXTRA_CA_CERTS = '\(state)/ca-bundle.pem'\n"))
        #expect(sh.stdout.contains("# Java reads none of these: trust the CA with keytool -importcert"))
    }
}
