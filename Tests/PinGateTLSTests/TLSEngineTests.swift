import Foundation
import PinGateTestSupport
import Testing
import CHeapStats
@testable import PinGateTLS

/// The sans-IO engine on its own: digests, keys, certificates, and whole handshakes
/// pumped between two in-memory connections.
@Suite("TLS engine")
struct TLSEngineTests {
    @Test("SHA-256 matches the FIPS 180-2 \"abc\" vector")
    func sha256() {
        #expect(SHA256Digest.base64(Array("abc".utf8)) == "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=")
    }

    @Test("the vector signer's PEM and X9.63 forms are the same key, and verify its signature")
    func publicKeyForms() throws {
        let pem = try PublicKey(text: WultraVectors.text("test-signer.pub.pem"))
        let x963 = try PublicKey(text: WultraVectors.text("test-signer.pub.x963.b64"))
        #expect(pem.spkiDER == x963.spkiDER)
        let challenge = try WultraVectors.text("dynamic-challenge.txt")
        let body = try WultraVectors.data("dynamic-body.json")
        let signature = try #require(Data(base64Encoded: WultraVectors.text("dynamic-signature.txt")))
        let message = Array(challenge.utf8) + Array("&".utf8) + Array(body)
        #expect(x963.verifySHA256(signature: Array(signature), message: message))
        #expect(!x963.verifySHA256(signature: Array(signature), message: message + [0x20]))
    }

    @Test("sign then verify; a changed byte or garbage signature does not verify")
    func signVerify() throws {
        let key = try PrivateKey.generateP256()
        let publicKey = try key.publicKey()
        let message = Array("name&fingerprint&123".utf8)
        let signature = try key.signSHA256(message)
        #expect(publicKey.verifySHA256(signature: signature, message: message))
        #expect(!publicKey.verifySHA256(signature: signature, message: Array("name&fingerprint&124".utf8)))
        #expect(!publicKey.verifySHA256(signature: [0x30, 0x02, 0x01], message: message))
        #expect(!publicKey.verifySHA256(signature: [], message: message))
    }

    @Test("keys that are not P-256 points are refused with a reason")
    func rejectsBadKeys() {
        #expect(throws: OpenSSLError.self) { try PublicKey(text: "AAAA") }
        #expect(throws: OpenSSLError.self) { try PublicKey(text: "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n") }
    }

    @Test("garbage PEM fails with OpenSSL's reason text drained into the error")
    func typedErrors() {
        do {
            _ = try Certificate(pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            Issue.record("garbage parsed")
        } catch let error as OpenSSLError {
            #expect(error.operation == "parse certificate PEM")
            #expect(!error.reasons.isEmpty)
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("certificate fingerprint matches the vector list's entry 0")
    func certificateFingerprint() throws {
        let certificate = try Certificate(pem: WultraVectors.text("api.vector.test.pem"))
        #expect(certificate.sha256Fingerprint == "NqWBi99vB1leaGi8Jr5RixqVZ+O/SlPckBhva3bVV7c=")
        #expect(certificate.commonName == "api.vector.test")
        #expect(try Certificate(der: certificate.derBytes).sha256Fingerprint == certificate.sha256Fingerprint)
    }

    @Test("the SPKI pin equals what the openssl CLI computes (the HPKP recipe)")
    func spkiMatchesOpenSSL() async throws {
        let path = WultraVectors.path("api.vector.test.pem")
        let recipe = "openssl x509 -in \"$1\" -pubkey -noout | openssl pkey -pubin -outform DER | openssl dgst -sha256 -binary | base64"
        let result = try await TestProcess.run("bash", ["-c", recipe, "spki", path])
        #expect(result.status == 0, "\(result.stderr)")
        let certificate = try Certificate(pem: WultraVectors.text("api.vector.test.pem"))
        #expect(certificate.spkiSHA256 == result.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    // MARK: in-memory handshakes

    struct Peers {
        let ca: Certificate
        let caPath: String
        let serverContext: TLSContext
        let clientContext: TLSContext
    }

    static func makePeers(names: [SubjectAltName], directory: TemporaryDirectory) throws -> Peers {
        let caKey = try PrivateKey.generateP256()
        let ca = try CertificateBuilder.selfSignedCA(commonName: "Engine Test CA", key: caKey, validity: 86400)
        let leafKey = try PrivateKey.generateP256()
        let leaf = try CertificateBuilder.serverLeaf(names: names, subjectKey: leafKey, issuer: ca, issuerKey: caKey,
                                                     notBefore: Date().addingTimeInterval(-60), notAfter: Date().addingTimeInterval(3600))
        let caPath = try directory.write("ca.pem", try ca.pemString())
        return Peers(ca: ca, caPath: caPath,
                     serverContext: try TLSContext.server(certificate: leaf, key: leafKey),
                     clientContext: try TLSContext.client(trustRoots: .pemFiles([caPath])))
    }

    /// Moves ciphertext between the two until neither makes progress.
    static func pump(_ client: TLSConnection, _ server: TLSConnection) -> (TLSHandshakeProgress, TLSHandshakeProgress) {
        var clientState = client.handshake()
        var serverState = TLSHandshakeProgress.needsMoreInput
        for _ in 0..<20 {
            let moved = move(client, server) + move(server, client)
            if case .pausedAtClientHello = serverState { return (clientState, serverState) }
            if clientState != .complete { clientState = client.handshake() }
            if serverState != .complete { serverState = server.handshake() }
            if moved == 0 && clientState == .complete && serverState == .complete { break }
        }
        return (clientState, serverState)
    }

    @discardableResult
    static func move(_ from: TLSConnection, _ to: TLSConnection) -> Int {
        let count = from.pendingCiphertextCount
        guard count > 0 else { return 0 }
        var bytes = [UInt8](repeating: 0, count: count)
        let taken = bytes.withUnsafeMutableBytes { from.takeCiphertext(into: $0) }
        bytes.withUnsafeBytes { to.feedCiphertext(UnsafeRawBufferPointer(rebasing: $0.prefix(taken))) }
        return taken
    }

    /// Bytes the heap has handed out right now, across all arenas (glibc's `mallinfo2`).
    static var heapInUse: Int { Int(pg_heap_bytes_in_use()) }

    @Test("after a 256 KiB burst neither end keeps it: the reader keeps nothing, the writer nothing once its ciphertext is taken")
    func burstLeavesNothingBuffered() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.dns("engine.test")], directory: directory)
        let payload = [UInt8](repeating: 7, count: 256 * 1024)
        var sink = [UInt8](repeating: 0, count: 64 * 1024)
        // What the two ends hold once idle again, the median of several (an allocation on
        // another thread meanwhile must not decide it).
        var footprints: [Int] = []
        for _ in 0..<9 {
            var client: TLSConnection? = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: nil))
            var server: TLSConnection? = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
            let received = try Self.burst(payload, from: server!, to: client!, sink: &sink)
            #expect(received == payload.count)
            let holding = Self.heapInUse
            client = nil
            server = nil
            footprints.append(holding - Self.heapInUse)
        }
        let median = footprints.sorted()[footprints.count / 2]
        // Kept, the server's write side and the client's read side would hold the burst
        // each (a memory BIO: 4/3 of it, 680 KiB together); two idle connections are a
        // few dozen KiB.
        #expect(median < 96 * 1024, "two idle connections hold \(median) bytes")
    }

    /// Handshakes, then sends `payload` in one write and reads it all; returns the bytes read.
    static func burst(_ payload: [UInt8], from server: TLSConnection, to client: TLSConnection, sink: inout [UInt8]) throws -> Int {
        let (clientState, serverState) = pump(client, server)
        #expect(clientState == .complete && serverState == .complete)
        try payload.withUnsafeBytes { try server.writePlaintext($0) }
        move(server, client)
        var received = 0
        while case .bytes(let count) = sink.withUnsafeMutableBytes({ client.readPlaintext(into: $0) }), count > 0 {
            received += count
        }
        return received
    }

    @Test("handshake in memory: chain and hostname valid, ALPN chosen by the server's preference, data both ways, close_notify")
    func handshakeAndData() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.dns("engine.test")], directory: directory)
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: ["h2", "http/1.1"]))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: "http/1.1", pauseWhenPreferredALPNMissing: false))
        let (clientState, serverState) = Self.pump(client, server)
        #expect(clientState == .complete)
        #expect(serverState == .complete)
        let summary = client.peerSummary()
        #expect(summary.chainAndHostnameValid)
        #expect(summary.alpn == "http/1.1")
        #expect(server.negotiatedALPN == "http/1.1")

        let message = Array("ping through memory".utf8)
        try message.withUnsafeBytes { try client.writePlaintext($0) }
        Self.move(client, server)
        var buffer = [UInt8](repeating: 0, count: 100)
        let outcome = buffer.withUnsafeMutableBytes { server.readPlaintext(into: $0) }
        #expect(outcome == .bytes(message.count))
        #expect(Array(buffer.prefix(message.count)) == message)

        client.sendCloseNotify()
        Self.move(client, server)
        #expect(buffer.withUnsafeMutableBytes { server.readPlaintext(into: $0) } == .closeNotify)
    }

    @Test("ciphertext read in place: records split across deliveries at every size, the unread tail kept, bytes exact and in order")
    func inPlaceCiphertext() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.dns("engine.test")], directory: directory)
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: nil))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        let (clientState, serverState) = Self.pump(client, server)
        #expect(clientState == .complete && serverState == .complete)

        // 200 KiB in records of up to 16 KiB, delivered in slices whose sizes cut records
        // (and their 5-byte headers) everywhere; each slice is read in place, and only what
        // a slice leaves of a record may be carried to the next.
        let message = (0..<(200 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 9) }
        try message.withUnsafeBytes { try client.writePlaintext($0) }
        var ciphertext = [UInt8](repeating: 0, count: client.pendingCiphertextCount)
        let taken = ciphertext.withUnsafeMutableBytes { client.takeCiphertext(into: $0) }
        #expect(taken == ciphertext.count)
        var received: [UInt8] = []
        var plaintext = [UInt8](repeating: 0, count: 8 * 1024)
        var offset = 0
        var sizes = [1, 4, 5, 6, 17, 1000, 16 * 1024 + 22, 3, 40_000]
        while offset < ciphertext.count {
            let size = min(sizes.first ?? 7777, ciphertext.count - offset)
            sizes = Array(sizes.dropFirst()) + [sizes.first ?? 7777]
            let slice = Array(ciphertext[offset..<(offset + size)])
            offset += size
            slice.withUnsafeBytes { bytes in
                server.withIncomingCiphertext(bytes) {
                    while case .bytes(let count) = plaintext.withUnsafeMutableBytes({ server.readPlaintext(into: $0) }), count > 0 {
                        received += plaintext.prefix(count)
                    }
                }
            }
        }
        #expect(received.count == message.count)
        #expect(received == message)

        // Delivered in place while nothing reads (as while a handshake is paused at the
        // ClientHello): kept, and read after what arrives later only once asked.
        let held = Array("held while paused ".utf8), later = Array("then more".utf8)
        for part in [held, later] { try part.withUnsafeBytes { try client.writePlaintext($0) } }
        var pausedBytes = [UInt8](repeating: 0, count: client.pendingCiphertextCount)
        _ = pausedBytes.withUnsafeMutableBytes { client.takeCiphertext(into: $0) }
        let pausedCut = pausedBytes.count / 3
        pausedBytes[..<pausedCut].withUnsafeBytes { bytes in server.withIncomingCiphertext(bytes) {} }
        pausedBytes[pausedCut...].withUnsafeBytes { server.feedCiphertext($0) }
        var afterPause: [UInt8] = []
        while case .bytes(let count) = plaintext.withUnsafeMutableBytes({ server.readPlaintext(into: $0) }), count > 0 {
            afterPause += plaintext.prefix(count)
        }
        #expect(afterPause == held + later)

        // Fed by copy and then in place: the copied bytes are read first.
        let first = Array("first ".utf8), second = Array("second".utf8)
        for part in [first, second] { try part.withUnsafeBytes { try client.writePlaintext($0) } }
        var both = [UInt8](repeating: 0, count: client.pendingCiphertextCount)
        _ = both.withUnsafeMutableBytes { client.takeCiphertext(into: $0) }
        let cut = both.count / 2
        both[..<cut].withUnsafeBytes { server.feedCiphertext($0) }
        var tail: [UInt8] = []
        both[cut...].withUnsafeBytes { bytes in
            server.withIncomingCiphertext(bytes) {
                while case .bytes(let count) = plaintext.withUnsafeMutableBytes({ server.readPlaintext(into: $0) }), count > 0 {
                    tail += plaintext.prefix(count)
                }
            }
        }
        #expect(tail == first + second)
    }

    @Test("the ciphertext inbox keeps arrival order when a delivery happens inside another")
    func inboxNestedOrder() {
        let inbox = CiphertextInbox()
        let outer: [UInt8] = Array("outer-".utf8), inner: [UInt8] = Array("inner".utf8)
        var read: [UInt8] = []
        var two = [UInt8](repeating: 0, count: 2)
        outer.withUnsafeBytes { outerBytes in
            inbox.withIncoming(outerBytes) {
                // OpenSSL has read part of the outer bytes when the nested delivery comes.
                let count = two.withUnsafeMutableBytes { inbox.read(into: $0) }
                read += two.prefix(count)
                inner.withUnsafeBytes { innerBytes in inbox.withIncoming(innerBytes) {} }
            }
        }
        var rest = [UInt8](repeating: 0, count: 64)
        let count = rest.withUnsafeMutableBytes { inbox.read(into: $0) }
        read += rest.prefix(count)
        #expect(String(decoding: read, as: UTF8.self) == "outer-inner")
        #expect(inbox.count == 0)
    }

    @Test("ALPN: the preferred protocol when offered, else the fallback when offered, else none")
    func alpnFallback() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.dns("engine.test")], directory: directory)
        for (offer, expected) in [(["http/1.1", "h2"], "h2"), (["http/1.1"], "http/1.1"), (["spdy/3"], nil)] as [([String], String?)] {
            let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: offer))
            let server = try TLSConnection(serverOf: peers.serverContext,
                                           options: .init(preferredALPN: "h2", pauseWhenPreferredALPNMissing: false, fallbackALPN: "http/1.1"))
            let (clientState, serverState) = Self.pump(client, server)
            #expect(clientState == .complete && serverState == .complete)
            #expect(client.peerSummary().alpn == expected, "offer \(offer)")
        }
    }

    @Test("a name the certificate does not carry: the handshake completes but the verify code says hostname mismatch")
    func hostnameMismatch() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.dns("engine.test")], directory: directory)
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "other.test", alpnOffer: nil))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        let (clientState, _) = Self.pump(client, server)
        #expect(clientState == .complete)
        let summary = client.peerSummary()
        #expect(!summary.chainAndHostnameValid)
        #expect(summary.verifyCode == 62) // X509_V_ERR_HOSTNAME_MISMATCH
        #expect(summary.leaf != nil)
    }

    @Test("the verified chain is OpenSSL's, leaf to anchor: an extra certificate the server sends is not in it; a failed check leaves it empty")
    func verifiedChain() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let caKey = try PrivateKey.generateP256()
        let ca = try CertificateBuilder.selfSignedCA(commonName: "Chain Test CA", key: caKey, validity: 86400)
        let stranger = try CertificateBuilder.selfSignedCA(commonName: "Appended CA", key: try PrivateKey.generateP256(), validity: 86400)
        let leafKey = try PrivateKey.generateP256()
        let leaf = try CertificateBuilder.serverLeaf(names: [.dns("engine.test")], subjectKey: leafKey, issuer: ca, issuerKey: caKey,
                                                     notBefore: Date().addingTimeInterval(-60), notAfter: Date().addingTimeInterval(3600))
        let serverContext = try TLSContext.server(certificate: leaf, chain: [stranger], key: leafKey)
        let clientContext = try TLSContext.client(trustRoots: .pemFiles([try directory.write("ca.pem", try ca.pemString())]))
        for (host, valid) in [("engine.test", true), ("other.test", false)] {
            let client = try TLSConnection(clientOf: clientContext, options: .init(expectedHost: host, alpnOffer: nil))
            let server = try TLSConnection(serverOf: serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
            #expect(Self.pump(client, server).0 == .complete)
            let summary = client.peerSummary()
            #expect(summary.chainAndHostnameValid == valid)
            #expect(summary.verifiedChain.map(\.sha256Fingerprint) == (valid ? [leaf, ca].map(\.sha256Fingerprint) : []), "\(host)")
            #expect(!summary.verifiedChain.contains { $0.sha256Fingerprint == stranger.sha256Fingerprint })
        }
    }

    @Test("an IP literal is verified against the IP SAN")
    func ipLiteral() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.ip("127.0.0.1")], directory: directory)
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "127.0.0.1", alpnOffer: nil))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        _ = Self.pump(client, server)
        #expect(client.peerSummary().chainAndHostnameValid)
    }

    @Test("the server pauses at a ClientHello lacking its preferred protocol, then resumes with the client's choice")
    func clientHelloPause() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.dns("engine.test")], directory: directory)
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: ["http/1.1"]))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: "h2", pauseWhenPreferredALPNMissing: true))
        let (_, paused) = Self.pump(client, server)
        #expect(paused == .pausedAtClientHello(offeredALPN: ["http/1.1"]))
        server.resumeAfterClientHello(preferredALPN: "http/1.1")
        let (clientState, serverState) = Self.pump(client, server)
        #expect(clientState == .complete)
        #expect(serverState == .complete)
        #expect(client.negotiatedALPN == "http/1.1")
    }

    @Test("garbage instead of a ClientHello fails the handshake with a reason")
    func garbageHandshake() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try Self.makePeers(names: [.dns("engine.test")], directory: directory)
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8).withUnsafeBytes { server.feedCiphertext($0) }
        guard case .failed(let error) = server.handshake() else {
            Issue.record("garbage was accepted")
            return
        }
        #expect(!error.reasons.isEmpty)
    }
}
