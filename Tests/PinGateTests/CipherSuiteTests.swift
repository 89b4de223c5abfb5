import Foundation
import PinGateTestSupport
import Testing

/// The gate's own TLS 1.3 order (AES-128-GCM first, `TLSContext.tls13Suites`) decides the
/// client leg's suite, except for a client that lists ChaCha20 first.
@Suite("TLS 1.3 cipher suite choice")
struct CipherSuiteTests {
    /// The suite `openssl s_client` (with `suites`, or its default order when nil)
    /// negotiates with the gate's client leg.
    static func negotiated(_ scenario: PinnedOriginScenario, suites: String?) async throws -> String {
        var arguments = ["s_client", "-proxy", "127.0.0.1:\(scenario.gate.port)", "-connect", scenario.target,
                         "-servername", scenario.host, "-CAfile", scenario.gate.caPath, "-verify_return_error", "-brief"]
        if let suites { arguments += ["-ciphersuites", suites] }
        let run = try await TestProcess.run("openssl", arguments, stdin: Data("GET / HTTP/1.1\r\nHost: \(scenario.host)\r\n\r\n".utf8), timeout: 20)
        let line = run.stderr.split(whereSeparator: \.isNewline).first { $0.hasPrefix("Ciphersuite:") }
        return line.map { $0.dropFirst("Ciphersuite:".count).trimmingCharacters(in: .whitespaces) } ?? "none: \(run.stderr)"
    }

    @Test("OpenSSL's default offer (AES-256-GCM first) gets AES-128-GCM; a client listing ChaCha20 first gets ChaCha20; one offering AES-256 only gets it")
    func gateOrderDecides() async throws {
        try await PinnedOriginScenario.with(host: "suite.pingate.test", behaviour: .http(body: "ok")) { scenario in
            let byDefault = try await Self.negotiated(scenario, suites: nil)
            let chachaFirst = try await Self.negotiated(scenario, suites: "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256")
            let aes256Only = try await Self.negotiated(scenario, suites: "TLS_AES_256_GCM_SHA384")
            #expect(byDefault == "TLS_AES_128_GCM_SHA256")
            #expect(chachaFirst == "TLS_CHACHA20_POLY1305_SHA256")
            #expect(aes256Only == "TLS_AES_256_GCM_SHA384")
        }
    }
}
