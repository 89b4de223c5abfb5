import Foundation
import PinGateTLS

/// Wultra's dynamic mode (the Mobile Utility Server): `GET <service>/app/init?appName=…`
/// with a fresh `X-Cert-Pinning-Challenge`; the answer's `X-Cert-Pinning-Signature` is an
/// ECDSA-P256-SHA256 signature over `challenge + "&" + body`. Entries carry no signature
/// of their own. Binding the signature to a fresh challenge stops replay of old answers.
///
/// Mobile Utility Server 2.x adds two members, read here with Wultra's names: each
/// fingerprint may carry `depth` (0 = leaf, the default; 1 = the first intermediate, …:
/// positions of the validated chain), and the body may carry `domainsConfig`
/// (`sslPinningRequiredForUnlisted`, `domains: [{name, sslPinningRequired}]`). Sources:
/// the READMEs of wultra/ssl-pinning-ios and wultra/ssl-pinning-android ("Certificate depth
/// pinning", "Domain bypass configuration") and their tests (CertStoreTests_Depth,
/// CertStoreTests_DomainsConfig, DomainsConfig.kt). The domain rules this returns are put
/// in force only for an answer to a challenge this gate just sent (`PinListStore.install`).
public enum WultraDynamicList {
    /// The request header carrying the challenge.
    public static let challengeHeader = "X-Cert-Pinning-Challenge"
    /// The response header carrying the signature.
    public static let signatureHeader = "X-Cert-Pinning-Signature"

    private struct Body: Decodable {
        struct Entry: Decodable {
            var name: String
            var fingerprint: String
            var expires: Int64
            /// MUS 2.x: the position in the validated chain; absent is the leaf.
            var depth: Int?
        }

        /// MUS 2.x `domainsConfig`.
        struct DomainsConfig: Decodable {
            struct Domain: Decodable {
                var name: String
                var sslPinningRequired: Bool
            }

            /// Absent means required: pingate's deny by default.
            var sslPinningRequiredForUnlisted: Bool?
            var domains: [Domain]?
        }

        var fingerprints: [Entry]
        var timestamp: Int64?
        var domainsConfig: DomainsConfig?
    }

    /// A fresh challenge: base64 of 16 random bytes.
    public static func makeChallenge() -> String {
        var generator = SystemRandomNumberGenerator()
        return Data((0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }).base64EncodedString()
    }

    /// The bytes the signature covers.
    public static func signedBytes(challenge: String, body: Data) -> [UInt8] {
        Array(challenge.utf8) + [UInt8(ascii: "&")] + Array(body)
    }

    /// Verifies `signature` over `challenge&body` with any of `keys`, then parses the body.
    public static func verify(body: Data, challenge: String, signature: String, keys: [PublicKey], source: String) throws -> PinList {
        guard !keys.isEmpty else { throw PinListError.noVerificationKey }
        guard let signatureBytes = Data(base64Encoded: signature.trimmingCharacters(in: .whitespaces)),
              keys.contains(where: { $0.verifySHA256(signature: Array(signatureBytes), message: signedBytes(challenge: challenge, body: body)) })
        else { throw PinListError.badSignature("dynamic response") }
        let parsed: Body
        do {
            parsed = try JSONDecoder().decode(Body.self, from: body)
        } catch {
            throw PinListError.malformed("dynamic body: \(error)")
        }
        let entries = try parsed.fingerprints.enumerated().map { index, entry -> PinEntry in
            guard let digest = Data(base64Encoded: entry.fingerprint), digest.count == 32 else {
                throw PinListError.malformed("entry \(index) (\(entry.name)): fingerprint is not base64 of 32 bytes")
            }
            let depth = entry.depth ?? 0
            guard depth >= 0 else { throw PinListError.malformed("entry \(index) (\(entry.name)): negative depth \(depth)") }
            return PinEntry(name: entry.name, fingerprint: digest.base64EncodedString(), expires: Date(timeIntervalSince1970: TimeInterval(entry.expires)),
                            depth: .position(depth))
        }
        let rules = parsed.domainsConfig.map { config in
            DomainRules(pinningRequiredForUnlisted: config.sslPinningRequiredForUnlisted ?? true,
                        domains: Dictionary((config.domains ?? []).map { ($0.name, $0.sslPinningRequired) }, uniquingKeysWith: { $0 || $1 }))
        }
        return PinList(source: source, entries: entries, metadata: .init(
            format: .wultraDynamic, issuedAt: parsed.timestamp.map { Date(timeIntervalSince1970: TimeInterval($0)) }),
            domainRules: rules)
    }

    /// The signature header value for `body` answering `challenge` (what a list server sends).
    public static func sign(body: Data, challenge: String, key: PrivateKey) throws -> String {
        Data(try key.signSHA256(signedBytes(challenge: challenge, body: body))).base64EncodedString()
    }
}
