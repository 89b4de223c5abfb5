import Foundation
import PinGateTestSupport
import PinGateCA
import PinGateTLS
import PinList
import Testing
@testable import PinGate
import PinGateHarness
@testable import PinGateAdmin
@testable import PinListService
@testable import PinGateNIO

/// The admin endpoint after real traffic, read with curl, its metrics parsed by the
/// reference Prometheus parser.
@Suite("Admin endpoint")
struct AdminEndpointTests {
    @Test("curl every endpoint after one allowed and one refused CONNECT: counters, refusal, pins, metrics, token")
    func endpoints() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let host = "admin.pingate.test"
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        try await LoopbackOrigin.with(identity: leaf, behaviour: .http(body: "hello admin")) { origin in
            let listPath = try directory.write("pins-v2.json", String(decoding: try pki.signedV2(sequence: 4, pins: [TestPKI.pin(host, leaf)]), as: UTF8.self))
            var source = PinListSource(location: .file(listPath), keys: [try pki.signer.publicKey()])
            source.directWait = .seconds(2)
            let (metrics, registry) = AdminServer.makeMetrics()
            let state = directory.file("state")
            let (ca, _) = try LocalCA.loadOrCreate(stateDirectory: state)
            var configuration = GateConfiguration()
            configuration.listenPort = 0
            configuration.upstreamTrust = .pemFiles([pki.upstreamTrustPath])
            configuration.resolveOverrides = [try ResolveOverride(parsing: "\(host):\(origin.port):127.0.0.1")]
            // The gate and the admin endpoint are started directly (not through GateFixture),
            // so they get their own scopes; shutdown() and close() may run twice.
            try await withResource(
                start: {
                    try await PinGateServer.start(configuration: configuration, store: PinListStore(nil), ca: ca,
                                                  logger: GateFixture.quietLogger, listSource: source, metrics: metrics)
                },
                stop: { try? await $0.shutdown() }
            ) { gate in
                var adminConfiguration = AdminConfiguration()
                adminConfiguration.port = 0
                adminConfiguration.token = "s3cret-token"
                try await withResource(
                    start: {
                        try await AdminServer.start(configuration: adminConfiguration, gate: gate, registry: registry,
                                                    logger: GateFixture.quietLogger)
                    },
                    stop: { await $0.close() }
                ) { admin in
                    let base = "http://127.0.0.1:\(admin.port)"
                    let caPath = LocalCA.Paths(stateDirectory: state).certificate
                    func curl(_ arguments: [String]) async throws -> TestProcess.Result {
                        try await TestProcess.run("curl", ["-sS", "--max-time", "20"] + arguments)
                    }

                    // A body, so that bytes are counted both ways through the HTTP layer.
                    let allowed = try await curl(["--proxy", "http://127.0.0.1:\(gate.port)", "--cacert", caPath, "--data", "ping",
                                                  "https://\(host):\(origin.port)/"])
                    #expect(allowed.stdout == "hello admin", "\(allowed.stderr)")
                    _ = try await curl(["--proxy", "http://127.0.0.1:\(gate.port)", "--cacert", caPath, "https://nobody.pingate.test:443/"])
                    _ = await eventually { gate.statistics.snapshot.openTunnels == 0 } // the allowed tunnel's close is counted asynchronously

                    let ready = try await curl(["-i", "\(base)/ready"])
                    #expect(ready.stdout.hasPrefix("HTTP/1.1 200"))
                    #expect(ready.stdout.hasSuffix("ready\n"))

                    let status = try #require(try JSONSerialization.jsonObject(with: (try await curl(["\(base)/status"])).stdoutData) as? [String: Any])
                    let counters = try #require(status["counters"] as? [String: Any])
                    #expect((counters["tunnels_by_reason"] as? [String: Int]) == ["trusted": 1, "empty": 1])
                    #expect(counters["open_tunnels"] as? Int == 0)
                    #expect((counters["bytes_down"] as? Int ?? 0) > 0)
                    #expect((counters["bytes_up"] as? Int ?? 0) > 0)
                    let list = try #require(status["list"] as? [String: Any])
                    #expect(list["sequence"] as? Int == 4)
                    #expect(list["format"] as? String == "pingate-v2")
                    #expect(list["entries"] as? Int == 1)
                    #expect(list["last_result"] as? String == "ok")
                    #expect(list["next_update"] != nil)
                    let caStatus = try #require(status["ca"] as? [String: Any])
                    #expect(caStatus["sha256"] as? String == ca.certificate.sha256Fingerprint)
                    #expect(status["listen"] as? [String] == ["127.0.0.1:\(gate.port)"])
                    // The one allowed CONNECT looked in the pool and found nothing.
                    let pool = try #require(status["upstream_pool"] as? [String: Any], "\(status)")
                    #expect(pool["misses"] as? Int == 1 && pool["hits"] as? Int == 0, "\(pool)")
                    #expect(pool["maximum_idle_per_host"] as? Int == 16)
                    #expect(counters["upstream_reconnects"] as? [String: Int] == [:])

                    let pins = try #require(try JSONSerialization.jsonObject(with: (try await curl(["\(base)/pins"])).stdoutData) as? [[String: Any]])
                    #expect(pins.count == 1)
                    #expect(pins.first?["host"] as? String == host)
                    #expect(pins.first?["fingerprint"] as? String == leaf.fingerprint)
                    #expect(pins.first?["mode"] as? String == "enforce")
                    #expect((pins.first?["days_left"] as? Int ?? 0) >= 364)

                    let refusals = try #require(try JSONSerialization.jsonObject(with: (try await curl(["\(base)/refusals"])).stdoutData) as? [[String: Any]])
                    #expect(refusals.count == 1)
                    #expect(refusals.first?["host"] as? String == "nobody.pingate.test")
                    #expect(refusals.first?["reason"] as? String == "empty")
                    #expect((refusals.first?["client"] as? String)?.hasPrefix("127.0.0.1:") == true)

                    let metricsText = try await curl(["-i", "\(base)/metrics"])
                    #expect(metricsText.stdout.contains("Content-Type: text/plain; version=0.0.4"))
                    let parsed = try await TestProcess.run("python3", ["-c", Self.prometheusCheck], stdin: Data((try await curl(["\(base)/metrics"])).stdout.utf8))
                    #expect(parsed.status == 0, "\(parsed.stderr)")
                    let samples = Self.samples(parsed.stdout)
                    #expect(samples["pingate_tunnels_total{reason=trusted,verdict=allowed}"] == 1)
                    #expect(samples["pingate_tunnels_total{reason=empty,verdict=refused}"] == 1)
                    #expect(samples["pingate_open_tunnels{}"] == 0)
                    #expect((samples["pingate_relayed_bytes_total{direction=down}"] ?? 0) > 0)
                    #expect(samples["pingate_pin_list_entries{}"] == 1)
                    #expect((samples["pingate_pin_list_earliest_expiry_seconds{}"] ?? 0) > Date().timeIntervalSince1970)
                    #expect(samples["pingate_pin_list_updates_total{result=ok}"] == 1)
                    #expect(samples["pingate_upstream_handshake_seconds_count{}"] == 1)
                    #expect(samples["pingate_upstream_pool_checkouts_total{result=miss}"] == 1)
                    #expect(samples["pingate_upstream_pool_checkouts_total{result=hit}"] == 0)

                    let noToken = try await curl(["-i", "-X", "POST", "\(base)/pins/update"])
                    #expect(noToken.stdout.hasPrefix("HTTP/1.1 401"))
                    let wrongToken = try await curl(["-i", "-X", "POST", "-H", "Authorization: Bearer nope", "\(base)/pins/update"])
                    #expect(wrongToken.stdout.hasPrefix("HTTP/1.1 401"))
                    let get = try await curl(["-i", "\(base)/pins/update"])
                    #expect(get.stdout.hasPrefix("HTTP/1.1 405"))
                    let forced = try await curl(["-i", "-X", "POST", "-H", "Authorization: Bearer s3cret-token", "\(base)/pins/update"])
                    #expect(forced.stdout.hasPrefix("HTTP/1.1 200"), "\(forced.stdout)")
                    #expect(gate.store.status.updatesByResult["unchanged"] == 1)

                    // A plain-HTTP request through the proxy: refused 405, and the refusal says
                    // what was asked, not a target of "-:0".
                    let plain = try await curl(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--proxy", "http://127.0.0.1:\(gate.port)",
                                                "http://plain.pingate.test/asked?x=1"])
                    #expect(plain.stdout == "405", "\(plain.stdout) \(plain.stderr)")
                    let afterPlain = try #require(try JSONSerialization.jsonObject(with: (try await curl(["\(base)/refusals"])).stdoutData) as? [[String: Any]])
                    #expect(afterPlain.first?["request_line"] as? String == "GET http://plain.pingate.test/asked?x=1", "\(afterPlain)")

                    let page = try await curl(["\(base)/"])
                    #expect(page.stdout.contains("<td>\(host)</td>"))
                    #expect(page.stdout.contains("<td>nobody.pingate.test:443</td>"))
                    #expect(page.stdout.contains("<td>GET http://plain.pingate.test/asked?x=1</td>"), "\(page.stdout)")
                    #expect(!page.stdout.contains("<td>-:0</td>"))
                    // Per target, in-tunnel refusals apart, and it refreshes itself.
                    #expect(page.stdout.contains("<tr><td>nobody.pingate.test:443</td><td>1</td><td><code>empty</code> 1</td>"), "\(page.stdout)")
                    #expect(page.stdout.contains("<table id=\"request-refusals\">") && page.stdout.contains("<td colspan=\"2\">none</td>"))
                    #expect(page.stdout.contains("<meta http-equiv=\"refresh\" content=\"10\">"))
                    #expect(!page.stdout.contains("<script"))
                }
            }
        }
    }

    @Test("a non-loopback admin address needs a token; the HTML escapes what clients control")
    func safety() throws {
        var exposed = AdminConfiguration()
        exposed.host = "0.0.0.0"
        #expect(throws: ConfigurationError.self) { try exposed.validate() }
        exposed.token = "t"
        try exposed.validate()
        #expect(AdminPage.escape("<script>alert('x')</script>&") == "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;")
        #expect(AdminRoute.bearerMatches("Bearer abc", token: "abc"))
        #expect(!AdminRoute.bearerMatches("Bearer abcd", token: "abc"))
        #expect(!AdminRoute.bearerMatches("abc", token: "abc"))
    }

    @Test("the Host policy: the listen host and loopback names with the bound port, the allowed extras, nothing else")
    func hostPolicy() {
        let policy = AdminHostPolicy(listenHost: "127.0.0.1", port: 9090, allowed: ["Status.Example"])
        for ok in ["127.0.0.1:9090", "localhost:9090", "[::1]:9090", "status.example:9090", "LocalHost.:9090"] {
            #expect(policy.allows(ok), "\(ok)")
        }
        for refused in [nil, "", "evil.example:9090", "localhost:9091", "localhost", "::1:9090", "[::1", "localhost:x",
                        "127.0.0.1:9090:1", "status.example.evil:9090"] {
            #expect(!policy.allows(refused), "\(refused ?? "nil")")
        }
        #expect(AdminHostPolicy(listenHost: "::1", port: 80).allows("[::1]"))
        #expect(AdminHostPolicy(listenHost: "127.0.0.1", port: 1, allowed: ["*"]).allows("anything"))
    }

    /// Parses stdin with prometheus_client's own text parser; prints `name{labels} value`.
    static let prometheusCheck = """
    import sys
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(sys.stdin.read()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "le")
            if "le" in sample.labels: continue
            print(f"{sample.name}{{{labels}}} {sample.value}")
    """

    static func samples(_ text: String) -> [String: Double] {
        var result: [String: Double] = [:]
        for line in text.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: " ")
            guard parts.count == 2, let value = Double(parts[1]) else { continue }
            result[String(parts[0])] = value
        }
        return result
    }
}
