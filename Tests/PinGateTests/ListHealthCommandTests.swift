import Foundation
import PinGateTestSupport
import PinList
import Testing

/// `pingate list health` against a running gate (`pingate run`, real nginx, curl): each
/// state as the command prints it, `--json`, `--fail-on` and the errors a user meets.
@Suite("pingate list health")
struct ListHealthCommandTests {
    @Test("six pinned hosts, one per state (ok, expiring at 10 days with pin-warning-days 30, backup-only after a leaf the list no longer pins, backup-only on the root after a leaf and its intermediate both rotated, refusing, unseen): the table says each with why and a count per state, worst first; /metrics and the status page say the same; --json matches /status; --fail-on exits 3 naming the states; --config finds the admin endpoint; errors name the fix")
    func statesThroughTheCommand() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let names = ["ok", "soon", "backup", "refused", "never"].map { "\($0).health.pingate.test" }
        let leaf = try pki.leaf(names.map { .dns($0) }, issuer: pki.originCA, file: "origin")
        // A key the origin no longer presents: the leaf before a rotation.
        let retired = try pki.leaf([.dns(names[2])], issuer: pki.originCA, file: "retired")
        // A host whose leaf and intermediate both rotated under the same root, which its
        // list pins at depth 2 (with the old leaf and old intermediate).
        let both = "both.health.pingate.test"
        let chainPKI = try await TestChainPKI.make(in: directory)
        let oldIntermediate = try await chainPKI.intermediate("old-intermediate")
        let newIntermediate = try await chainPKI.intermediate("new-intermediate")
        let oldLeaf = try await chainPKI.leaf("both-old", host: both, issuer: oldIntermediate)
        let newLeaf = try await chainPKI.leaf("both-new", host: both, issuer: newIntermediate)
        let fullChain = try directory.write("both-fullchain.pem", try newLeaf.certificate.pemString() + newIntermediate.certificate.pemString())
        let now = Int64(Date().timeIntervalSince1970)
        let far = now + 200 * 86_400
        let listPath = try directory.write("pins.json", String(decoding: try pki.signedV2(sequence: 1, pins: [
            .init(host: names[0], spki: leaf.certificate.spkiSHA256, expires: far),
            .init(host: names[1], spki: leaf.certificate.spkiSHA256, expires: now + 10 * 86_400),
            .init(host: names[2], spki: retired.certificate.spkiSHA256, expires: far),
            .init(host: names[2], spki: pki.originCA.certificate.spkiSHA256, expires: far, depth: .position(1)),
            .init(host: names[3], spki: retired.certificate.spkiSHA256, expires: far),
            .init(host: names[4], spki: leaf.certificate.spkiSHA256, expires: far),
            .init(host: both, spki: oldLeaf.certificate.spkiSHA256, expires: far),
            .init(host: both, spki: oldIntermediate.certificate.spkiSHA256, expires: far, depth: .position(1)),
            .init(host: both, spki: chainPKI.root.certificate.spkiSHA256, expires: far, depth: .position(2)),
        ], expiresAt: Date().addingTimeInterval(200 * 86_400)), as: UTF8.self))
        let pingate = TestProcess.pingateExecutable

        try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath,
                                   files: ["index.txt": Data("fine".utf8)]) { origin in
          try await NginxOrigin.with(certificatePath: fullChain, keyPath: newLeaf.keyPath, files: ["index.txt": Data("fine".utf8)]) { rotated in
            try await RunningGate.with([
                "--listen", "127.0.0.1:0", "--state-dir", directory.file("state"), "--pins", listPath, "--pins-key", pki.signerPublicKeyPath,
                "--upstream-ca", pki.upstreamTrustPath, "--upstream-ca", chainPKI.root.certificatePath,
                "--decision-log", "off", "--pin-warning-days", "30", "--resolve", "\(both):\(rotated.port):127.0.0.1",
            ] + names.flatMap { ["--resolve", "\($0):\(origin.port):127.0.0.1"] }) { gate in
                let bothResult = try await TestProcess.run("curl", [
                    "-sS", "-o", "/dev/null", "--max-time", "30", "--proxy", "http://127.0.0.1:\(gate.port)",
                    "--cacert", directory.file("state/ca.pem"), "-w", "%{http_connect} %{http_code}", "https://\(both):\(rotated.port)/index.txt",
                ])
                #expect(bothResult.stdout == "200 200", "\(bothResult.stdout) \(bothResult.stderr)")
                for name in names.prefix(4) {
                    // %{http_connect}: the gate's answer to CONNECT; %{http_code}: the origin's.
                    let result = try await TestProcess.run("curl", [
                        "-sS", "-o", "/dev/null", "--max-time", "30", "--proxy", "http://127.0.0.1:\(gate.port)",
                        "--cacert", directory.file("state/ca.pem"), "-w", "%{http_connect} %{http_code}",
                        "https://\(name):\(origin.port)/index.txt",
                    ])
                    #expect(result.stdout == (name == names[3] ? "502 000" : "200 200"), "\(name): \(result.stdout) \(result.stderr)")
                }
                _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
                let admin = "127.0.0.1:\(try #require(gate.adminPort))"

                let table = try await TestProcess.run(pingate, ["list", "health", "--admin", admin])
                #expect(table.status == 0, "\(table.stderr)")
                let lines = table.stdout.split(separator: "\n").map(String.init)
                let expected: [(String, String, String)] = [
                    (names[3], "refusing", "matches none of its pins"),
                    (names[1], "expiring", "the pin that carries it expires at"),
                    (names[2], "backup-only", "trusted only by the depth-1 pin"),
                    (both, "backup-only", "trusted only by the depth-2 pin"),
                    (names[4], "unseen", "not reached since the list came in force"),
                    (names[0], "ok", "its leaf matches a pin"),
                ]
                #expect(lines.count == expected.count + 1, "\(table.stdout)")
                for (line, (host, state, why)) in zip(lines, expected) {
                    let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                    #expect(fields.first.map(String.init) == host && fields.dropFirst().first.map(String.init) == state, "\(line)")
                    #expect(line.contains(why), "\(line)")
                }
                #expect(lines.last == "6 hosts: 1 refusing, 1 expiring, 2 backup-only, 1 unseen, 1 ok (pin-warning-days: 30)", "\(table.stdout)")

                // /metrics and the status page say the same of each host.
                let metrics = try await TestProcess.run("curl", ["-sS", "--max-time", "10", "http://\(admin)/metrics"]).stdout
                let page = try await TestProcess.run("curl", ["-sS", "--max-time", "10", "http://\(admin)/"]).stdout
                for (host, state, _) in expected {
                    #expect(metrics.contains("pingate_pin_health{host=\"\(host)\",state=\"\(state)\"} 1"), "\(host) \(state): \(metrics)")
                    #expect(page.contains("<td>\(host)</td><td><code>\(state)</code></td>"), "\(host) \(state) not on the page")
                }

                let json = try await TestProcess.run(pingate, ["list", "health", "--admin", admin, "--json"])
                let entries = try #require(try JSONSerialization.jsonObject(with: json.stdoutData) as? [[String: Any]], "\(json.stdout)")
                let status = try await TestProcess.run("curl", ["-sS", "--max-time", "10", "http://\(admin)/status"])
                let statusObject = try #require(try JSONSerialization.jsonObject(with: status.stdoutData) as? [String: Any])
                let fromStatus = try #require(statusObject["pin_health"] as? [[String: Any]])
                #expect(statusObject["pin_warning_days"] as? Int == 30)
                #expect(Dictionary(uniqueKeysWithValues: entries.map { ($0["host"] as? String ?? "", $0["state"] as? String ?? "") })
                        == Dictionary(uniqueKeysWithValues: fromStatus.map { ($0["host"] as? String ?? "", $0["state"] as? String ?? "") }))
                #expect(entries.count == 6)

                let failing = try await TestProcess.run(pingate, ["list", "health", "--admin", admin, "--fail-on", "backup-only,expiring"])
                #expect(failing.status == 3)
                #expect(failing.stderr.contains("3 hosts backup-only, expiring (--fail-on backup-only,expiring)"), "\(failing.stderr)")
                let passing = try await TestProcess.run(pingate, ["list", "health", "--admin", admin, "--fail-on", "ok"])
                #expect(passing.status == 3, "ok is a state too; one host is ok")
                let none = try await TestProcess.run(pingate, ["list", "health", "--admin", admin, "--fail-on", "refusing"])
                #expect(none.status == 3)

                // The config file's admin.listen is where it asks.
                let config = try directory.write("gate.yml", "admin:\n  listen: \(admin)\n")
                let viaConfig = try await TestProcess.run(pingate, ["list", "health", "--config", config])
                #expect(viaConfig.status == 0 && viaConfig.stdout == table.stdout, "\(viaConfig.stderr)")
            }
          }
        }

        // What a user gets wrong: a state that does not exist, a gate that is not there,
        // an admin endpoint that is off.
        let unknown = try await TestProcess.run(pingate, ["list", "health", "--fail-on", "backup"])
        #expect(unknown.status == 64)
        #expect(unknown.stderr.contains("unknown state \"backup\"; the states are ok, backup-only, expiring, unseen, refusing"), "\(unknown.stderr)")
        let closed = try closedLoopbackPort()
        let absent = try await TestProcess.run(pingate, ["list", "health", "--admin", "127.0.0.1:\(closed)"])
        #expect(absent.status == 1)
        #expect(absent.stderr.contains("cannot read the gate's /status at http://127.0.0.1:\(closed)"), "\(absent.stderr)")
        #expect(absent.stderr.contains("is the gate running"), "\(absent.stderr)")
        let offConfig = try directory.write("off.yml", "admin:\n  listen: off\n")
        let off = try await TestProcess.run(pingate, ["list", "health", "--config", offConfig])
        #expect(off.status == 1)
        #expect(off.stderr.contains("the admin endpoint is off in \(offConfig)"), "\(off.stderr)")
    }

    @Test("the rotation drill through the commands: a host pinned by its leaf key with its issuer as backup re-keys its leaf; traffic passes on the backup and list health says backup-only; after the gate stops, list propose --next (from the observations it wrote) adds the new key, list diff shows it, sign --draft signs it with the next sequence without --sequence; the gate restarted on it says ok; nothing was refused")
    func rotationDrillThroughTheCommands() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "rotate.health.pingate.test"
        let old = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "old", notAfter: Date().addingTimeInterval(90 * 86_400))
        let new = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "new", notAfter: Date().addingTimeInterval(90 * 86_400))
        let far = Int64(Date().timeIntervalSince1970) + 200 * 86_400
        let listPath = try directory.write("pins.json", String(decoding: try pki.signedV2(sequence: 4, pins: [
            .init(host: host, spki: old.certificate.spkiSHA256, expires: far),
            .init(host: host, spki: pki.originCA.certificate.spkiSHA256, expires: far, depth: .position(1)),
        ], expiresAt: Date().addingTimeInterval(200 * 86_400)), as: UTF8.self))
        let signerKey = try directory.write("signer.key", try pki.signer.pkcs8PEM())
        let pingate = TestProcess.pingateExecutable
        let state = directory.file("state")

        try await NginxOrigin.with(certificatePath: new.certificatePath, keyPath: new.keyPath, files: ["index.txt": Data("rotated".utf8)]) { origin in
            func gateArguments(_ list: String) -> [String] {
                ["--listen", "127.0.0.1:0", "--state-dir", state, "--pins", list, "--pins-key", pki.signerPublicKeyPath,
                 "--upstream-ca", pki.upstreamTrustPath, "--decision-log", "off", "--resolve", "\(host):\(origin.port):127.0.0.1"]
            }
            func request(_ gate: RunningGate) async throws -> String {
                try await TestProcess.run("curl", ["-sS", "--max-time", "30", "--proxy", "http://127.0.0.1:\(gate.port)",
                                                   "--cacert", "\(state)/ca.pem", "https://\(host):\(origin.port)/index.txt"]).stdout
            }
            func health(_ gate: RunningGate) async throws -> TestProcess.Result {
                _ = await eventually(timeout: .seconds(10)) { gate.adminPort != nil }
                return try await TestProcess.run(pingate, ["list", "health", "--admin", "127.0.0.1:\(try #require(gate.adminPort))", "--fail-on", "backup-only,refusing"])
            }
            try await RunningGate.with(gateArguments(listPath)) { gate in
                #expect(try await request(gate) == "rotated")
                let before = try await health(gate)
                #expect(before.status == 3 && before.stdout.hasPrefix("\(host)  backup-only"), "\(before.stdout) \(before.stderr)")
            }
            // The stopped gate wrote what it observed; the next list comes from it.
            let proposed = try await TestProcess.run(pingate, ["list", "propose", "--next", "--state-dir", state, "--list", listPath, "--key", pki.signerPublicKeyPath])
            #expect(proposed.status == 0, "\(proposed.stderr)")
            #expect(proposed.stderr.contains("list propose --next: added \(host) depth-0 spki \(new.certificate.spkiSHA256)"), "\(proposed.stderr)")
            let draft = try directory.write("next.json", proposed.stdout)
            let diff = try await TestProcess.run(pingate, ["list", "diff", listPath, draft, "--key", pki.signerPublicKeyPath])
            #expect(diff.status == 1)
            #expect(diff.stdout.contains(new.certificate.spkiSHA256), "\(diff.stdout)")
            let signed = try await TestProcess.run(pingate, ["sign", "--draft", draft, "--key", signerKey, "--format", "v2"])
            #expect(signed.status == 0, "\(signed.stderr)")
            let nextList = try directory.write("pins-next.json", signed.stdout)
            let verified = try await TestProcess.run(pingate, ["list", "verify", nextList, "--key", pki.signerPublicKeyPath])
            #expect(verified.status == 0 && verified.stdout.contains("sequence:   5\n"), "\(verified.stdout) \(verified.stderr)")

            try await RunningGate.with(gateArguments(nextList)) { gate in
                #expect(try await request(gate) == "rotated")
                let after = try await health(gate)
                #expect(after.status == 0 && after.stdout.hasPrefix("\(host)  ok"), "\(after.stdout) \(after.stderr)")
            }
        }
    }
}
