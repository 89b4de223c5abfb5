import Foundation
import PinGateTLS
import Testing
@testable import PinList

/// Entries Wultra published in its own library's tests, signed with Wultra's test key:
/// pingate's verifier must accept them as Wultra's clients do.
///
/// Source: github.com/wultra/ssl-pinning-android at commit 16a67a0 (2024-01-03),
/// library/src/test/java/com/wultra/android/sslpinning/CertStoreUpdateTest.kt (the two
/// `github.com` entries and the X9.63 public key `BC3kV9OI…XE=`, also used by
/// CertStoreValidationTest.java). The entries expired in 2022 and 2024: their signatures
/// still verify, and the policy treats the host as having no unexpired pin.
@Suite("Wultra's published test entries")
struct WultraPublishedVectorsTests {
    static let publicKey = "BC3kV9OIDnMuVoCdDR9nEA/JidJLTTDLuSA2TSZsGgODSshfbZg31MS90WC/HdbU/A5WL5GmyDkE/iks6INv+XE="
    static let entries = [
        (fingerprint: "kqN/vV4hpTqVxxbhFE9EL1grlND6/Gc+tnF6TrUaiKc=", expires: 1_710_460_799,
         signature: "MEUCICB69UpMPOdtrsR6XcJqHEh2L2RO4oSJ3SZ7BYnTBJbGAiEAnZ7rEWdMVGwa59Wx5QbAorEFxXH89Iu0CnqWa96Eda0="),
        (fingerprint: "trmmrz6GbL4OajB+fdoXOzcrLTrD8GrxX5dxh3OEgAg=", expires: 1_652_184_000,
         signature: "MEUCIQCs1y/nyrKh4+2DIuX/PufUYiaVUdt2FBZQg6rBeZ/r4QIgNlT4owBwJ1ThrDsE0SwGipTNI74vP1vNyLNEwuXY4lE="),
    ]

    static func list(expiresOffset: Int = 0) -> Data {
        let items = entries.map {
            #"{"name":"github.com","fingerprint":"\#($0.fingerprint)","expires":\#($0.expires + expiresOffset),"signature":"\#($0.signature)"}"#
        }
        return Data(#"{"fingerprints":[\#(items.joined(separator: ","))]}"#.utf8)
    }

    @Test("both entries verify with Wultra's test key (X9.63 form); one changed expiry rejects the list")
    func verify() throws {
        let key = try PublicKey(x963Base64: Self.publicKey)
        let verified = try WultraStaticList.verify(Self.list(), keys: [key])
        #expect(verified.map(\.fingerprint) == Self.entries.map(\.fingerprint))
        #expect(verified.allSatisfy { $0.name == "github.com" && $0.depth == .leaf })
        #expect(throws: PinListError.self) { try WultraStaticList.verify(Self.list(expiresOffset: 1), keys: [key]) }
        // Expired long ago: verified, but no pin counts now.
        let list = PinList(source: "wultra", entries: verified)
        let leaf = CertificateHashes(certificateSHA256: Self.entries[0].fingerprint, spkiSHA256: nil)
        #expect(PinPolicy().evaluate(host: "github.com", leaf: leaf, chain: .init(valid: true, reason: "ok"), list: list,
                                     now: Date(timeIntervalSince1970: 1_700_000_000)).reasonToken == "trusted")
        #expect(PinPolicy().evaluate(host: "github.com", leaf: leaf, chain: .init(valid: true, reason: "ok"), list: list, now: Date()) == .empty)
    }
}
