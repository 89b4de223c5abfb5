import FuzzSupport
import Foundation
import PinGateTLS
import PinList

/// The list-signing key of Tests/Vectors/wultra (test material: every key there is
/// public). Raw documents are verified against it, and documents built from fuzz bytes
/// are signed with it, so that the parsing behind a valid signature is reached too: a
/// fuzzer cannot forge ECDSA, and without the re-signing modes it would only ever see
/// the signature check refuse.
private let signerPEM = """
-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIOAZxbU7wz2mNky/Z+ARB5+thKzdbN3aQyIvKStvQ5i4oAoGCCqGSM49
AwEHoUQDQgAE+8BwKpMiYrRITOT1aBI4XxfgdXmLaR7f+o/qDwL0+iQDLZfZ1htF
IMyOjGb9EtH4X7GqLGY0gFB4QN2xsrWD7Q==
-----END EC PRIVATE KEY-----
"""

/// Made once: libFuzzer calls the entry point from one thread.
private nonisolated(unsafe) let signer: PrivateKey? = try? PrivateKey(pem: signerPEM)
private nonisolated(unsafe) let keys: [PublicKey] = (try? signer?.publicKey()).map { [$0] } ?? []
/// A fixed clock (2027-01-15), so a run is repeatable from its input alone.
private let now = Date(timeIntervalSince1970: 1_800_000_000)

/// What a list that verified must still do: the policy answers for its hosts without
/// trapping, and the acceptance check (expiry, sequence) runs against itself.
private func exercise(_ list: PinList) {
    let policy = PinPolicy()
    for entry in list.entries.prefix(8) {
        let host = "\(entry.host)"
        _ = policy.isPinned(host: host, list: list, now: now)
        _ = policy.evaluate(host: host, leaf: nil, chain: .init(valid: true, reason: "fuzz"), list: list, now: now)
    }
    _ = try? PinListAcceptance.check(list, replacing: list, now: now)
}

/// libFuzzer's entry. The first byte picks the mode; the rest is the document:
/// 0 Wultra static as is, 1 pingate v2 envelope as is, 2 Wultra dynamic as is
/// (`challenge\nsignature\nbody`), 3 a v2 payload signed here, 4 a dynamic body signed
/// here, 5 a static document whose entries are re-signed here, 6 format detection and
/// `SignedListDocument` as `run` reads a file.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPinLists(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    guard count > 0, let signer else { return 0 }
    let mode = start[0] % 7
    let data = Data(UnsafeBufferPointer(start: start + 1, count: count - 1))
    switch mode {
    case 0:
        if let entries = try? WultraStaticList.verify(data, keys: keys) { exercise(PinList(source: "fuzz", entries: entries)) }
    case 1:
        if let list = try? PinGateSignedList.verify(data, keys: keys, source: "fuzz") { exercise(list) }
    case 2:
        let parts = data.split(separator: UInt8(ascii: "\n"), maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return 0 }
        let challenge = String(decoding: parts[0], as: UTF8.self)
        let signature = String(decoding: parts[1], as: UTF8.self)
        if let list = try? WultraDynamicList.verify(body: Data(parts[2]), challenge: challenge, signature: signature,
                                                    keys: keys, source: "fuzz") { exercise(list) }
    case 3:
        guard let signature = try? signer.signSHA256(Array(data)), let keyID = keys.first?.keyID else { return 0 }
        // The envelope's fields by name (its type has no public initializer: lists are
        // made by `sign`, which takes a typed payload, not bytes).
        let envelope = ["format": PinGateSignedList.formatName, "keyId": keyID,
                        "payload": data.base64EncodedString(), "signature": Data(signature).base64EncodedString()]
        guard let encoded = try? JSONSerialization.data(withJSONObject: envelope) else { return 0 }
        if let list = try? PinGateSignedList.verify(encoded, keys: keys, source: "fuzz") { exercise(list) }
    case 4:
        let challenge = "q83vEjRWeJCrze8SNFZ4kA=="
        guard let signature = try? WultraDynamicList.sign(body: data, challenge: challenge, key: signer) else { return 0 }
        if let list = try? WultraDynamicList.verify(body: data, challenge: challenge, signature: signature,
                                                    keys: keys, source: "fuzz") { exercise(list) }
    case 5:
        struct Document: Codable { var fingerprints: [WultraStaticList.SignedEntry] }
        guard let document = try? JSONDecoder().decode(Document.self, from: data) else { return 0 }
        var resigned: [WultraStaticList.SignedEntry] = []
        for entry in document.fingerprints.prefix(16) {
            guard let signed = try? WultraStaticList.sign(name: entry.name, fingerprint: entry.fingerprint,
                                                          expires: entry.expires, key: signer) else { return 0 }
            resigned.append(signed)
        }
        guard let text = try? WultraStaticList.encode(resigned) else { return 0 }
        if let entries = try? WultraStaticList.verify(Data(text.utf8), keys: keys) {
            exercise(PinList(source: "fuzz", entries: entries))
        }
    default:
        let format = SignedListDocument.detectFormat(data)
        let document = SignedListDocument(format: format, source: "fuzz", body: data, receivedAt: now)
        if let list = try? document.verify(keys: keys) { exercise(list) }
    }
    return 0
}

/// The process entry (SwiftPM names it `FuzzPinLists_main`): libFuzzer's driver, running `fuzzPinLists`.
@_cdecl("FuzzPinLists_main")
public func main(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc: argc, argv: argv, fuzzPinLists)
}
