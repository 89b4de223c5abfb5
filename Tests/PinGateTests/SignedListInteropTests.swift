import Foundation
import PinGateTestSupport
import Testing

/// docs/signed-list-v2.md says another tool can produce a v2 list from its definition
/// alone. This test does it with the openssl command line and a shell, then verifies
/// the result with `pingate list verify`.
@Suite("Signed list v2 interoperability")
struct SignedListInteropTests {
    @Test("a v2 list made with the openssl CLI from the documented bytes verifies; one changed payload byte does not")
    func opensslMadeList() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let script = """
        set -euo pipefail
        cd "$1"
        openssl ecparam -name prime256v1 -genkey -noout -out signer.key
        openssl pkey -in signer.key -pubout -out signer.pub.pem
        printf '%s' '{"sequence":1,"issuedAt":1763790000,"expiresAt":4102444800,"pins":[{"host":"**.example.com","spki":"NqWBi99vB1leaGi8Jr5RixqVZ+O/SlPckBhva3bVV7c=","expires":4102444800,"mode":"report-only"}],"revoked":["V4Uo6EKBrkD6hRrfXmFxJvrIsv3bM+wXAoJt4sdp0ww="]}' > payload.json
        openssl dgst -sha256 -sign signer.key -out payload.sig payload.json
        key_id=$(openssl pkey -pubin -in signer.pub.pem -outform DER | openssl dgst -sha256 -binary | head -c 8 | od -An -tx1 | tr -d ' \\n')
        printf '{"format":"pingate-signed-list/2","keyId":"%s","payload":"%s","signature":"%s"}\\n' "$key_id" "$(base64 -w0 payload.json)" "$(base64 -w0 payload.sig)" > good.json
        printf '%s' '{"sequence":2,"issuedAt":1763790000,"expiresAt":4102444800,"pins":[]}' > other.json
        printf '{"format":"pingate-signed-list/2","keyId":"%s","payload":"%s","signature":"%s"}\\n' "$key_id" "$(base64 -w0 other.json)" "$(base64 -w0 payload.sig)" > bad.json
        """
        let made = try await TestProcess.run("bash", ["-c", script, "make", directory.path])
        #expect(made.status == 0, "\(made.stderr)")
        let pingate = TestProcess.pingateExecutable
        let good = try await TestProcess.run(pingate, ["list", "verify", directory.file("good.json"), "--key", directory.file("signer.pub.pem")])
        #expect(good.status == 0, "\(good.stderr)")
        #expect(good.stdout.contains("valid pingate-v2 list"))
        #expect(good.stdout.contains("**.example.com  spki/NqWBi99vB1leaGi8Jr5RixqVZ+O/SlPckBhva3bVV7c=  report-only"))
        #expect(good.stdout.contains("revoked V4Uo6EKBrkD6hRrfXmFxJvrIsv3bM+wXAoJt4sdp0ww="))
        let bad = try await TestProcess.run(pingate, ["list", "verify", directory.file("bad.json"), "--key", directory.file("signer.pub.pem")])
        #expect(bad.status != 0)
    }
}
