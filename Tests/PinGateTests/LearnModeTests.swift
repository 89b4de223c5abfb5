import Foundation
import PinGateTestSupport
import PinListService
import Testing

/// Learn mode as an operator runs it: `run --learn`, real clients, `list propose`,
/// `sign --draft`, `list lint --strict`, then `run` enforcing what was learned.
@Suite("Learn mode")
struct LearnModeTests {
    static let pingate = TestProcess.pingateExecutable

    /// Chains made with the openssl CLI: a.learn.test, b.learn.test and e.learn.test under
    /// one intermediate, c.other.test under another CA altogether, d.learn.test from a CA
    /// the gate does not trust, and a re-keyed a.learn.test under the first intermediate.
    struct Origins {
        let directory: TemporaryDirectory
        let trustPath: String
        let fullchains: [String: (certificate: String, key: String)]
        let rekeyedA: (certificate: String, key: String)
        let intermediateSPKI: String

        static func make(_ directory: TemporaryDirectory) async throws -> Origins {
            let first = try await TestChainPKI.make(in: directory, rootName: "learn-root")
            let intermediate = try await first.intermediate("learn-int")
            let second = try await TestChainPKI.make(in: directory, rootName: "other-root")
            let otherIntermediate = try await second.intermediate("other-int", issuer: second.root)
            let rogue = try await TestChainPKI.make(in: directory, rootName: "rogue-root")
            var fullchains: [String: (String, String)] = [:]
            func fullchain(_ name: String, host: String, chain: TestChainPKI, issuer: TestPKI.Identity) async throws -> (String, String) {
                let leaf = try await chain.leaf(name, host: host, issuer: issuer)
                let path = try directory.write("\(name)-fullchain.pem", try leaf.certificate.pemString() + issuer.certificate.pemString())
                return (path, leaf.keyPath)
            }
            fullchains["a.learn.test"] = try await fullchain("leaf-a", host: "a.learn.test", chain: first, issuer: intermediate)
            fullchains["b.learn.test"] = try await fullchain("leaf-b", host: "b.learn.test", chain: first, issuer: intermediate)
            fullchains["e.learn.test"] = try await fullchain("leaf-e", host: "e.learn.test", chain: first, issuer: intermediate)
            fullchains["c.other.test"] = try await fullchain("leaf-c", host: "c.other.test", chain: second, issuer: otherIntermediate)
            fullchains["d.learn.test"] = try await fullchain("leaf-d", host: "d.learn.test", chain: rogue, issuer: rogue.root)
            let rekeyed = try await fullchain("leaf-a2", host: "a.learn.test", chain: first, issuer: intermediate)
            let trustPath = try directory.write("learn-trust.pem", try first.root.certificate.pemString() + second.root.certificate.pemString())
            return Origins(directory: directory, trustPath: trustPath, fullchains: fullchains, rekeyedA: rekeyed,
                           intermediateSPKI: intermediate.certificate.spkiSHA256)
        }

        /// One nginx answering every name by SNI, each with its own chain, with "host NAME".
        func serve<Value>(_ body: (NginxOrigin) async throws -> Value) async throws -> Value {
            let first = try #require(fullchains["a.learn.test"])
            let extra = fullchains.filter { $0.key != "a.learn.test" }.sorted { $0.key < $1.key }.map { host, files in
                """
                server {
                    listen 127.0.0.1:$PORT ssl;
                    server_name \(host);
                    ssl_certificate \(files.certificate);
                    ssl_certificate_key \(files.key);
                    location / { return 200 "host \(host)\\n"; }
                }
                """
            }.joined(separator: "\n")
            return try await NginxOrigin.with(certificatePath: first.certificate, keyPath: first.key, files: [:], http2: false,
                                              serverDirectives: "server_name a.learn.test; location / { return 200 \"host a.learn.test\\n\"; }",
                                              extraServers: extra, body)
        }
    }

    /// The CONNECT status and the body of `curl https://HOST:PORT/` through the gate.
    static func curl(_ gate: RunningGate, _ host: String, _ port: Int, state: String) async throws -> (connect: String, body: String) {
        let result = try await TestProcess.run("curl", [
            "-sS", "--max-time", "20", "--proxy", "http://127.0.0.1:\(gate.port)", "--cacert", "\(state)/ca.pem",
            "-w", "\n%{http_connect}", "https://\(host):\(port)/",
        ])
        let lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        return (lines.last ?? "", lines.dropLast().joined(separator: "\n").trimmingCharacters(in: .whitespacesAndNewlines))
    }

    @Test("learn with three origins (two under one intermediate, one under another CA): curl and requests reach them, an untrusted chain is refused; propose, sign --draft and lint --strict; enforcing, the three pass, a re-keyed leaf passes by its depth-1 pin, and a fifth host is refused")
    func learnProposeEnforce() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let origins = try await Origins.make(directory)
        let pki = try TestPKI(directory: directory)
        let state = directory.file("state")
        let learned = ["a.learn.test", "b.learn.test", "c.other.test"]
        try await origins.serve { nginx in
            let rekeyed = origins.rekeyedA
            try await NginxOrigin.with(certificatePath: rekeyed.certificate, keyPath: rekeyed.key, files: [:], http2: false,
                                       serverDirectives: "location / { return 200 \"host a.learn.test (re-keyed)\\n\"; }") { rekeyedOrigin in
                let resolve = (learned + ["d.learn.test", "e.learn.test"]).flatMap { ["--resolve", "\($0):\(nginx.port):127.0.0.1"] }
                    + ["--resolve", "a.learn.test:\(rekeyedOrigin.port):127.0.0.1"]
                let common = ["--listen", "127.0.0.1:0", "--state-dir", state, "--upstream-ca", origins.trustPath] + resolve

                // 1. Learn.
                try await RunningGate.with(common + ["--learn"]) { gate in
                    for host in learned {
                        let answer = try await Self.curl(gate, host, nginx.port, state: state)
                        #expect(answer.body == "host \(host)", "\(host): \(answer)")
                    }
                    let python = try TestProcess.resolve("python3")
                    for host in learned {
                        let result = try await TestProcess.run(python, ["-c", """
                        import requests
                        r = requests.get("https://\(host):\(nginx.port)/", proxies={"https": "http://127.0.0.1:\(gate.port)"}, verify="\(state)/ca.pem", timeout=20)
                        print(r.status_code, r.text.strip())
                        """])
                        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "200 host \(host)", "\(result.stderr)")
                    }
                    let untrusted = try await Self.curl(gate, "d.learn.test", nginx.port, state: state)
                    #expect(untrusted.connect == "502", "a chain the upstream trust does not reach is refused even in learn mode: \(untrusted)")

                    _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
                    let adminPort = try #require(gate.adminPort)
                    let ready = try await TestProcess.run("curl", ["-sS", "http://127.0.0.1:\(adminPort)/ready"])
                    #expect(ready.stdout == "ready (learning, not enforcing)\n")
                    let status = try #require(try JSONSerialization.jsonObject(
                        with: try await TestProcess.run("curl", ["-sS", "http://127.0.0.1:\(adminPort)/status"]).stdoutData) as? [String: Any])
                    #expect(status["mode"] as? String == "learning, not enforcing")
                    #expect((status["learned"] as? [[String: Any]])?.compactMap { $0["host"] as? String } == learned)
                    #expect(status["learn_unrecorded_tunnels"] as? Int == 0 && status["learn_write_failures"] as? Int == 0, "\(status)")
                    let page = try await TestProcess.run("curl", ["-sS", "http://127.0.0.1:\(adminPort)/"])
                    #expect(page.stdout.contains("Learn mode: learning, not enforcing"))
                    #expect(page.stdout.contains("c.other.test:\(nginx.port)"))

                    let log = await gate.stop()
                    #expect(log.contains("LEARN MODE: learning, not enforcing"))
                    #expect(log.components(separatedBy: "\"reason\":\"learned\"").count - 1 == 6, "six passes, each marked learned")
                    #expect(log.contains("\"host\":\"d.learn.test\"") && log.contains("\"reason\":\"chain-invalid\""))
                }
                let book = try ObservationBook.decode(try Data(contentsOf: URL(fileURLWithPath: "\(state)/observations.json")))
                #expect(book.hosts.map(\.host) == learned)
                #expect(book.hosts.allSatisfy { $0.chains.count == 1 && $0.chains[0].count == 2 && $0.chains[0].chain.count == 3 })
                #expect(book.hosts.first?.chains.first?.alpn == "http/1.1")

                // 2. Propose, sign, lint.
                let propose = try await TestProcess.run(Self.pingate, ["list", "propose", "--state-dir", state])
                #expect(propose.status == 0, "\(propose.stderr)")
                let draftPath = try directory.write("draft.json", propose.stdout)
                let draft = try ListDraft.decode(Data(propose.stdout.utf8))
                #expect(draft.pins.count == 6, "a leaf pin and a depth-1 backup for each of the three")
                #expect(draft.pins.filter { $0.depth == .position(1) && $0.spki == origins.intermediateSPKI }.map(\.host) == ["a.learn.test", "b.learn.test"])
                #expect(draft.pins.allSatisfy { $0.why.contains("expires with") })
                let signerKey = try directory.write("signer.key", try pki.signer.pkcs8PEM())
                let sign = try await TestProcess.run(Self.pingate, ["sign", "--draft", draftPath, "--key", signerKey, "--format", "v2", "--sequence", "1"])
                #expect(sign.status == 0, "\(sign.stderr)")
                let listPath = try directory.write("pins.json", sign.stdout)
                let lint = try await TestProcess.run(Self.pingate, ["list", "lint", listPath, "--key", pki.signerPublicKeyPath, "--strict"])
                #expect(lint.status == 0, "\(lint.stdout)\(lint.stderr)")
                // Review: the signed list holds exactly the draft; a draft without c.other.test drops its two pins.
                let same = try await TestProcess.run(Self.pingate, ["list", "diff", listPath, draftPath, "--key", pki.signerPublicKeyPath])
                #expect(same.status == 0 && same.stdout == "no differences in pins\n", "\(same.stdout)\(same.stderr)")
                let narrower = try await TestProcess.run(Self.pingate, ["list", "propose", "--state-dir", state, "--hosts", "*.learn.test"])
                let narrowerPath = try directory.write("narrower.json", narrower.stdout)
                let dropped = try await TestProcess.run(Self.pingate, ["list", "diff", listPath, narrowerPath, "--key", pki.signerPublicKeyPath])
                #expect(dropped.status == 1)
                #expect(dropped.stdout.hasPrefix("c.other.test: no longer pinned\n  - spki/"), "\(dropped.stdout)")
                #expect(dropped.stdout.components(separatedBy: "\n  - ").count == 3)

                // 3. Enforce what was learned.
                try await RunningGate.with(common + ["--pins", listPath, "--pins-key", pki.signerPublicKeyPath]) { gate in
                    for host in learned {
                        let answer = try await Self.curl(gate, host, nginx.port, state: state)
                        #expect(answer.body == "host \(host)", "\(host): \(answer)")
                    }
                    let again = try await Self.curl(gate, "a.learn.test", rekeyedOrigin.port, state: state)
                    #expect(again.body == "host a.learn.test (re-keyed)", "a re-keyed leaf under the same intermediate: \(again)")
                    let fifth = try await Self.curl(gate, "e.learn.test", nginx.port, state: state)
                    #expect(fifth.connect == "403", "a host not learned is refused: \(fifth)")
                    _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
                    let adminPort = try #require(gate.adminPort)
                    let ready = try await TestProcess.run("curl", ["-sS", "http://127.0.0.1:\(adminPort)/ready"])
                    #expect(ready.stdout == "ready\n")
                }
            }
        }
    }

    @Test("the observations file survives kill -9 in the middle of a write: the old book stays whole, and the next start goes on from it")
    func crashWhileWriting() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let origins = try await Origins.make(directory)
        let state = directory.file("state")
        try await origins.serve { nginx in
            let common = ["--listen", "127.0.0.1:0", "--state-dir", state, "--upstream-ca", origins.trustPath, "--learn",
                          "--resolve", "a.learn.test:\(nginx.port):127.0.0.1", "--resolve", "b.learn.test:\(nginx.port):127.0.0.1"]
            try await RunningGate.with(common) { gate in
                let answer = try await Self.curl(gate, "a.learn.test", nginx.port, state: state)
                #expect(answer.body == "host a.learn.test")
            }
            let path = "\(state)/observations.json"
            let before = try Data(contentsOf: URL(fileURLWithPath: path))
            #expect(try ObservationBook.decode(before).hosts.map(\.host) == ["a.learn.test"])

            // The next write dies between its temporary file and the rename.
            try await RunningGate.with(common, environment: ["PINGATE_FAULT_INJECTION": "crash-before-rename"]) { doomed in
                _ = try? await Self.curl(doomed, "b.learn.test", nginx.port, state: state)
                #expect(await eventually(timeout: .seconds(10)) { !doomed.process.isRunning })
                #expect(doomed.process.terminationStatus == 86)
            }
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before, "the old book is untouched")
            #expect(try FileManager.default.contentsOfDirectory(atPath: state).contains { $0.hasPrefix("observations.json.tmp-") })

            try await RunningGate.with(common) { gate in
                let answer = try await Self.curl(gate, "b.learn.test", nginx.port, state: state)
                #expect(answer.body == "host b.learn.test")
                let log = await gate.stop()
                #expect(log.contains("removed temporary files left by an interrupted write"))
            }
            #expect(try ObservationBook.decode(try Data(contentsOf: URL(fileURLWithPath: path))).hosts.map(\.host) == ["a.learn.test", "b.learn.test"])
        }
    }

    @Test("--learn on a non-loopback address stops with the reason and the flag that allows it")
    func remoteListenRefused() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let refused = try await TestProcess.run(Self.pingate, ["run", "--learn", "--listen", "0.0.0.0:0", "--admin-listen", "off",
                                                               "--state-dir", directory.file("state")], timeout: 30)
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("--listen 0.0.0.0:0 is not a loopback address"), "\(refused.stderr)")
        #expect(refused.stderr.contains("--learn-allow-remote"))
        #expect(!FileManager.default.fileExists(atPath: directory.file("state")), "nothing was started")
        // The same from the config file (learn: true), which --no-learn overrides.
        let config = try directory.write("learn.yml", "listen: 0.0.0.0:0\nlearn: true\nadmin: {listen: \"off\"}\nstate-dir: state\n")
        let fromConfig = try await TestProcess.run(Self.pingate, ["run", "--config", config], timeout: 30)
        #expect(fromConfig.status != 0 && fromConfig.stderr.contains("is not a loopback address"), "\(fromConfig.stderr)")
        try await RunningGate.with(["--config", config, "--no-learn", "--listen", "127.0.0.1:0"]) { gate in
            let log = await gate.stop()
            #expect(!log.contains("LEARN MODE"))
        }
    }
}
