internal import COpenSSL
import Foundation

/// The two ends of a TLS connection.
public enum TLSRole: Sendable {
    case client
    case server
}

/// Where a handshake stands after feeding it what has arrived so far.
public enum TLSHandshakeProgress: Equatable {
    /// The handshake finished; application data may flow.
    case complete
    /// OpenSSL needs more ciphertext from the peer.
    case needsMoreInput
    /// Server only: the ClientHello arrived and the connection was asked to pause there.
    /// `offeredALPN` is the client's list (nil when it sent no ALPN extension).
    case pausedAtClientHello(offeredALPN: [String]?)
    /// The handshake failed; any alert for the peer is waiting as ciphertext.
    case failed(OpenSSLError)
}

/// The outcome of one attempt to read plaintext.
public enum TLSReadOutcome: Equatable {
    /// This many plaintext bytes were written into the buffer.
    case bytes(Int)
    /// No whole record is buffered yet.
    case needsMoreInput
    /// The peer sent close_notify: it will send no more data.
    case closeNotify
    /// The stream is broken (bad record, protocol violation).
    case failed(OpenSSLError)
}

/// What the peer proved during the handshake, read once it completed.
public struct TLSPeerSummary: Sendable {
    /// The peer's leaf certificate (nil if it sent none).
    public internal(set) var leaf: Certificate?
    /// OpenSSL's chain-and-hostname verdict: `X509_V_OK` (0) when both passed.
    public internal(set) var verifyCode: Int
    /// OpenSSL's text for `verifyCode`.
    public internal(set) var verifyReason: String
    /// The application protocol both ends agreed on through ALPN, if any.
    public internal(set) var alpn: String?
    /// The protocol version, e.g. "TLSv1.3".
    public internal(set) var protocolVersion: String
    /// The chain as validated (leaf first), or as the peer sent it when validation failed.
    /// For reports only: never pin against it, since a peer can send anything here.
    public internal(set) var chain: [Certificate]
    /// The chain OpenSSL built and verified from the leaf to a trust anchor (leaf first,
    /// the anchor last), and only when chain and host name both passed; empty otherwise.
    /// Depth pins count positions here and never in what the peer sent, so a peer cannot
    /// satisfy an intermediate pin by appending a copy of that intermediate to its own chain.
    /// After a resumed handshake it is the full handshake's, kept with the session (OpenSSL
    /// builds no verified chain for a resumption).
    public internal(set) var verifiedChain: [Certificate]
    /// True when the handshake resumed an offered session: the server proved nothing
    /// new, and OpenSSL verified nothing (see `resumed(alpn:protocolVersion:)`).
    public internal(set) var resumed = false
    /// Client only: the server asked for a client certificate (the gate sends none) in the
    /// full handshake. Kept across resumption like the rest of the summary: a resumed
    /// handshake carries no CertificateRequest, but whatever the server tied to the
    /// session it tied in that full handshake.
    public internal(set) var certificateRequested = false

    /// True when the chain validated to a trusted root and matched the expected host.
    public var chainAndHostnameValid: Bool { leaf != nil && verifyCode == Int(X509_V_OK) }

    /// This summary, which the full handshake that made a session produced, as the
    /// summary of a later handshake that resumed that session with `alpn` and
    /// `protocolVersion` agreed anew. Its leaf, chain and verify result stay those the
    /// full handshake proved: a resumed handshake proves no certificate itself, and
    /// what OpenSSL would report for it is the session's copy (the chain as *sent*, not
    /// as verified), so the caller rebuilds it from the decision it kept instead.
    public func resumed(alpn: String?, protocolVersion: String) -> TLSPeerSummary {
        var summary = self
        summary.alpn = alpn
        summary.protocolVersion = protocolVersion
        summary.resumed = true
        return summary
    }
}

/// One TLS connection over in-memory BIOs: ciphertext in, ciphertext out, plaintext both
/// ways, and no sockets. The caller moves bytes between this and the network.
///
/// Not `Sendable`: an `SSL*` must only ever be used from one thread at a time; the proxy
/// keeps each connection on its channel's event loop.
public final class TLSConnection {
    /// Options for a server-side connection.
    public struct ServerOptions: Sendable {
        /// The ALPN protocol to select when the client offers it (nil: select none).
        public var preferredALPN: String?
        /// Pause at the ClientHello when the client does not offer `preferredALPN`,
        /// so the caller can fetch a matching upstream before answering.
        public var pauseWhenPreferredALPNMissing: Bool
        /// The protocol to select when the client does not offer `preferredALPN` but
        /// offers this one (the gate's HTTP layer: `h2`, else `http/1.1`).
        public var fallbackALPN: String?

        /// Creates server options.
        public init(preferredALPN: String?, pauseWhenPreferredALPNMissing: Bool, fallbackALPN: String? = nil) {
            self.preferredALPN = preferredALPN
            self.pauseWhenPreferredALPNMissing = pauseWhenPreferredALPNMissing
            self.fallbackALPN = fallbackALPN
        }
    }

    /// Options for a client-side connection.
    public struct ClientOptions: Sendable {
        /// The host name or IP literal the server must prove; also the SNI for names.
        public var expectedHost: String
        /// The ALPN protocols to offer, most preferred first (nil: no ALPN extension).
        public var alpnOffer: [String]?

        /// Creates client options.
        public init(expectedHost: String, alpnOffer: [String]?) {
            self.expectedHost = expectedHost
            self.alpnOffer = alpnOffer
        }
    }

    private let ssl: OpaquePointer
    /// What the read BIO serves to OpenSSL (see `CiphertextInbox`).
    private let inbox: CiphertextInbox
    /// Where the write BIO puts what OpenSSL sends (see `CiphertextOutbox`).
    private let outbox: CiphertextOutbox
    private let hooks: TLSConnectionHooks

    /// The role this connection plays.
    public let role: TLSRole

    private init(context: TLSContext, role: TLSRole, hooks: TLSConnectionHooks) throws {
        OpenSSLErrorQueue.clear()
        guard let ssl = SSL_new(context.pointer) else { throw OpenSSLError.drained("create TLS connection") }
        let inbox = CiphertextInbox()
        let outbox = CiphertextOutbox()
        let readBIO: OpaquePointer
        let writeBIO: OpaquePointer
        do {
            readBIO = try CiphertextInbox.makeBIO(reading: inbox)
        } catch {
            SSL_free(ssl)
            throw error
        }
        do {
            writeBIO = try CiphertextOutbox.makeBIO(writingTo: outbox)
        } catch {
            BIO_free(readBIO)
            SSL_free(ssl)
            throw error
        }
        SSL_set_bio(ssl, readBIO, writeBIO) // the SSL now owns both BIOs
        self.ssl = ssl
        self.inbox = inbox
        self.outbox = outbox
        self.hooks = hooks
        self.role = role
        _ = pg_SSL_set_app_data(ssl, Unmanaged.passUnretained(hooks).toOpaque())
    }

    /// A client connection that will verify `options.expectedHost` and offer its ALPN list.
    public convenience init(clientOf context: TLSContext, options: ClientOptions) throws {
        try self.init(context: context, role: .client, hooks: TLSConnectionHooks())
        let host = options.expectedHost
        OpenSSLErrorQueue.clear()
        if IPAddressText.isIPLiteral(host) {
            // No SNI for IP literals (RFC 6066 §3); the certificate must carry the IP SAN.
            guard X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1 else {
                throw OpenSSLError.drained("set expected IP \(host)")
            }
        } else {
            guard pg_SSL_set_tlsext_host_name(ssl, host) == 1 else { throw OpenSSLError.drained("set SNI \(host)") }
            guard SSL_set1_host(ssl, host) == 1 else { throw OpenSSLError.drained("set expected host \(host)") }
        }
        // The gate has no client certificate; the callback only records that the server
        // asked for one, so the caller can wait for the server's verdict on the empty
        // answer (in TLS 1.3 it comes after the client's handshake has completed).
        SSL_set_cert_cb(ssl, TLSConnectionHooks.certificateCallback, nil)
        if let offer = options.alpnOffer, !offer.isEmpty {
            let wire = ALPNWire.encode(offer)
            // SSL_set_alpn_protos returns 0 on success, unlike most OpenSSL calls.
            let result = wire.withUnsafeBufferPointer { SSL_set_alpn_protos(ssl, $0.baseAddress, UInt32($0.count)) }
            guard result == 0 else { throw OpenSSLError.drained("set ALPN offer") }
        }
        SSL_set_connect_state(ssl)
    }

    /// A server connection using the certificate in `context` and the ALPN rules in `options`.
    public convenience init(serverOf context: TLSContext, options: ServerOptions) throws {
        let hooks = TLSConnectionHooks()
        hooks.preferredALPN = options.preferredALPN
        hooks.pauseWhenPreferredALPNMissing = options.pauseWhenPreferredALPNMissing
        hooks.fallbackALPN = options.fallbackALPN
        try self.init(context: context, role: .server, hooks: hooks)
        SSL_set_accept_state(ssl)
    }

    deinit { SSL_free(ssl) }

    // MARK: ciphertext

    /// Hands ciphertext that arrived from the peer to OpenSSL (copied: it is read later).
    public func feedCiphertext(_ bytes: UnsafeRawBufferPointer) {
        inbox.append(bytes)
    }

    /// Lets OpenSSL read `bytes`, which arrived from the peer, in place while `body` runs
    /// (the handshake and plaintext reads `body` makes see them); only what is still
    /// unread when `body` returns is copied, to be read first next time. The bytes must
    /// stay unchanged until then.
    public func withIncomingCiphertext<Result>(_ bytes: UnsafeRawBufferPointer, _ body: () throws -> Result) rethrows -> Result {
        try inbox.withIncoming(bytes, body)
    }

    /// How many ciphertext bytes are waiting to go to the peer (outside any buffer given
    /// to `writePlaintext(_:sealingInto:)`).
    public var pendingCiphertextCount: Int { outbox.count }

    /// Moves waiting ciphertext into `buffer`; returns how many bytes were moved. The
    /// connection keeps no storage once everything waiting has been taken.
    public func takeCiphertext(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        outbox.take(into: buffer)
    }

    /// Every ciphertext byte so far that waited to be taken with `takeCiphertext` instead
    /// of going straight into a buffer given to `writePlaintext(_:sealingInto:)`: the
    /// handshake's flights, alerts, and writes whose buffer was too small.
    public var ciphertextCopiedCount: Int { outbox.backlogBytesTotal }

    /// A buffer size that holds the records of `plaintextCount` bytes written at once,
    /// with room for OpenSSL's largest record overhead (TLS 1.2 CBC with SHA-384: 5 bytes
    /// of header, a 16-byte IV, a 48-byte MAC and up to 16 bytes of padding) per 16 KiB
    /// record, and for one small record more (a KeyUpdate OpenSSL sends first). A peer
    /// that negotiated smaller records gets more records than this allows for: what does
    /// not fit waits as pending ciphertext, which costs a copy, never a byte.
    public static func sealedCapacity(plaintextCount: Int) -> Int {
        let records = (plaintextCount + recordPlaintextLimit - 1) / recordPlaintextLimit
        return plaintextCount + records * recordOverheadAllowance + 64
    }

    /// The most plaintext one TLS record carries (RFC 8446 §5.1).
    public static let recordPlaintextLimit = 16 * 1024
    private static let recordOverheadAllowance = 96

    // MARK: handshake

    /// Advances the handshake with what has been fed so far.
    public func handshake() -> TLSHandshakeProgress {
        OpenSSLErrorQueue.clear()
        let result = SSL_do_handshake(ssl)
        if result == 1 { return .complete }
        let error = SSL_get_error(ssl, result)
        switch error {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            return .needsMoreInput
        case SSL_ERROR_WANT_CLIENT_HELLO_CB:
            return .pausedAtClientHello(offeredALPN: hooks.offeredALPN)
        default:
            var failure = OpenSSLError.drained("TLS handshake")
            if failure.reasons.isEmpty {
                failure = OpenSSLError(operation: "TLS handshake", reasons: ["SSL error \(error)"])
            }
            return .failed(failure)
        }
    }

    /// Server only: ends a ClientHello pause, choosing the ALPN protocol to select if offered.
    public func resumeAfterClientHello(preferredALPN: String?) {
        hooks.preferredALPN = preferredALPN
        hooks.pauseWhenPreferredALPNMissing = false
    }

    /// Client only: true when the server asked for a client certificate (a
    /// CertificateRequest arrived). None was sent: the gate has none to give.
    public var serverRequestedCertificate: Bool { hooks.certificateRequested }

    /// Client only: true once a TLS 1.3 NewSessionTicket arrived after the handshake. A
    /// server sends one only after it has read and accepted the client's Finished (and
    /// its empty certificate), so it settles that a certificate request was not fatal.
    /// Counted from `watchForSessionTickets()` on.
    public var receivedSessionTicket: Bool { hooks.sessionTicketReceived }

    /// Client only: from now on, notes NewSessionTicket messages (see
    /// `receivedSessionTicket`). Off until asked: the callback runs for every record.
    public func watchForSessionTickets() {
        SSL_set_msg_callback(ssl, TLSConnectionHooks.messageCallback)
    }

    // MARK: sessions (client, from a context that collects them)

    /// Offers `session` for resumption; call before the handshake starts. Whether the
    /// server took it is `sessionWasReused` once the handshake is complete.
    public func offer(_ session: TLSSession) throws {
        OpenSSLErrorQueue.clear()
        // SSL_set_session takes its own reference; the TLSSession keeps ours.
        guard SSL_set_session(ssl, session.pointer) == 1 else { throw OpenSSLError.drained("offer TLS session") }
    }

    /// True when the completed handshake resumed the offered session.
    public var sessionWasReused: Bool { SSL_session_reused(ssl) == 1 }

    /// Hands every session the server gives this connection to `sink`: those already
    /// received, then each one as it arrives (TLS 1.3 tickets come after the handshake,
    /// while reading). Until then at most two are held, and none once the connection
    /// ends, so a connection whose verdict never trusted the server keeps nothing.
    public func deliverSessions(to sink: @escaping (TLSSession) -> Void) {
        hooks.sessionSink = sink
        let held = hooks.heldSessions
        hooks.heldSessions = []
        held.forEach(sink)
    }

    /// Drops the sessions held so far and every one the server sends from now on: the
    /// caller will never keep them (its verdict did not trust the server). Held, up to two
    /// would stay for as long as the connection does, each pinning the server's chain.
    public func discardSessions() {
        hooks.sessionSink = { _ in }
        hooks.heldSessions = []
    }

    /// How many sessions are held until `deliverSessions` (for tests).
    var heldSessionCount: Int { hooks.heldSessions.count }

    /// What the peer proved; meaningful once the handshake is complete.
    public func peerSummary() -> TLSPeerSummary {
        let leaf = SSL_get1_peer_certificate(ssl).map { Certificate(owning: $0) }
        let code = Int(SSL_get_verify_result(ssl))
        let reason = X509_verify_cert_error_string(code).map { String(cString: $0) } ?? "unknown"
        let version = SSL_get_version(ssl).map { String(cString: $0) } ?? "unknown"
        // OpenSSL keeps whatever chain it built even when verification failed (a partial
        // chain, or one ending at an untrusted self-signed root), so the verified chain is
        // taken only when the verdict is X509_V_OK.
        // One walk of the stack, shared by both fields: when it is the verified chain, the
        // two are the same certificates.
        let verifiedStack = SSL_get0_verified_chain(ssl)
        let chain = Certificate.owningEach(of: verifiedStack ?? SSL_get_peer_cert_chain(ssl))
        let verified = code == Int(X509_V_OK) && leaf != nil && verifiedStack != nil ? chain : []
        return TLSPeerSummary(leaf: leaf, verifyCode: code, verifyReason: reason, alpn: negotiatedALPN, protocolVersion: version,
                              chain: chain, verifiedChain: verified, certificateRequested: hooks.certificateRequested)
    }

    /// The ALPN protocol agreed in the handshake, if any.
    public var negotiatedALPN: String? {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    // MARK: plaintext

    /// Whether a read could find anything now: received ciphertext waits unread, or
    /// OpenSSL holds some (part of a record, plaintext not yet taken; a record header whose
    /// body has not begun to arrive it does not report, but then the inbox is empty too and
    /// a read could only wait). When false, a read would only answer `needsMoreInput`, and
    /// `inputDrained()` does what it would have done besides, with no buffer to read into.
    public var hasInputToRead: Bool { inbox.count > 0 || SSL_has_pending(ssl) == 1 }

    /// What a read that finds nothing does besides answering `needsMoreInput`: frees the
    /// record buffers of a connection gone quiet (see `releaseIdleRecordBuffers`).
    public func inputDrained() {
        releaseIdleRecordBuffers()
    }

    /// Decrypts into `buffer` as much as one call can.
    public func readPlaintext(into buffer: UnsafeMutableRawBufferPointer) -> TLSReadOutcome {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return .bytes(0) }
        OpenSSLErrorQueue.clear()
        var read = 0
        if SSL_read_ex(ssl, base, buffer.count, &read) == 1 { return .bytes(read) }
        switch SSL_get_error(ssl, 0) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            // Everything fed has been read: nothing buffered is worth keeping while idle.
            releaseIdleRecordBuffers()
            return .needsMoreInput
        case SSL_ERROR_ZERO_RETURN:
            return .closeNotify
        default:
            return .failed(OpenSSLError.drained("TLS read"))
        }
    }

    /// Frees OpenSSL's record buffers (16.7 KiB to read, one to write) once a read found
    /// nothing more to do and no byte of a record is held in them.
    ///
    /// `SSL_MODE_RELEASE_BUFFERS` frees the read buffer only after application data has
    /// been read from it: a read that processes only handshake records (the TLS 1.3
    /// NewSessionTickets a server sends after the handshake) leaves it allocated, and an
    /// idle connection then holds it for as long as it stays open (issue 12: the upstream
    /// leg of every idle tunnel kept one). The next read allocates it again.
    ///
    /// Only at a record boundary: OpenSSL must be waiting for a record header (`RH`) with
    /// nothing in its buffer (`SSL_has_pending`) or in the read BIO. `SSL_free_buffers`
    /// refuses a buffer still holding data itself, but before 3.0.14 it missed a header
    /// whose body had not arrived (CVE-2024-4741), so this does not rely on that alone.
    private func releaseIdleRecordBuffers() {
        guard inbox.count == 0, SSL_has_pending(ssl) == 0, SSL_pending(ssl) == 0,
              let state = SSL_rstate_string(ssl), strcmp(state, "RH") == 0 else { return }
        _ = SSL_free_buffers(ssl)
    }

    /// Encrypts all of `bytes`; the ciphertext waits to be taken (`takeCiphertext`).
    public func writePlaintext(_ bytes: UnsafeRawBufferPointer) throws {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        OpenSSLErrorQueue.clear()
        var written = 0
        // Without partial-write mode and with a write BIO that takes everything,
        // SSL_write_ex either takes everything or fails.
        guard SSL_write_ex(ssl, base, bytes.count, &written) == 1, written == bytes.count else {
            throw OpenSSLError.drained("TLS write")
        }
    }

    /// Encrypts all of `bytes` into `destination`, from its start, and returns how many
    /// bytes of it were filled: no copy after encryption when it is large enough
    /// (`sealedCapacity(plaintextCount:)`). Ciphertext that does not fit, or that was
    /// already waiting, waits to be taken (`takeCiphertext`) and comes after what
    /// `destination` got.
    public func writePlaintext(_ bytes: UnsafeRawBufferPointer, sealingInto destination: UnsafeMutableRawBufferPointer) throws -> Int {
        try outbox.withWindow(destination) { try writePlaintext(bytes) }.filled
    }

    /// TLS 1.3: asks OpenSSL to update this end's sending keys with its next record, and
    /// the peer to update its own (`peerToo`). The gate never asks; its tests do, to see
    /// that records OpenSSL sends of its own accord keep their place among the sealed ones.
    func requestKeyUpdate(peerToo: Bool) throws {
        OpenSSLErrorQueue.clear()
        guard SSL_key_update(ssl, peerToo ? SSL_KEY_UPDATE_REQUESTED : SSL_KEY_UPDATE_NOT_REQUESTED) == 1 else {
            throw OpenSSLError.drained("request key update")
        }
    }

    /// Queues a close_notify alert for the peer. Further writes fail.
    public func sendCloseNotify() {
        OpenSSLErrorQueue.clear()
        _ = SSL_shutdown(ssl)
        OpenSSLErrorQueue.clear()
    }
}

/// Per-connection state that OpenSSL's C callbacks reach through the SSL's app data.
final class TLSConnectionHooks {
    var preferredALPN: String?
    var pauseWhenPreferredALPNMissing = false
    var fallbackALPN: String?
    var offeredALPN: [String]?
    var certificateRequested = false
    var sessionTicketReceived = false
    /// Sessions the server handed out before anyone asked for them (see `deliverSessions`).
    var heldSessions: [TLSSession] = []
    var sessionSink: ((TLSSession) -> Void)?

    /// Client, from a context that collects sessions: a session the server handed out
    /// (TLS 1.3: a NewSessionTicket; TLS 1.2: the handshake's own). Returning 1 keeps
    /// OpenSSL's reference, which the `TLSSession` now owns.
    static let newSessionCallback: @convention(c) (OpaquePointer?, OpaquePointer?) -> Int32 = { ssl, session in
        guard let session, let hooks = TLSConnectionHooks.hooks(ssl) else { return 0 }
        let owned = TLSSession(owning: session)
        guard owned.isResumable else { return 1 } // freed with `owned`
        if let sink = hooks.sessionSink {
            sink(owned)
        } else {
            // Servers send two tickets by default; more would only pile up unused.
            if hooks.heldSessions.count == 2 { hooks.heldSessions.removeFirst() }
            hooks.heldSessions.append(owned)
        }
        return 1
    }

    /// Client: called when the server sent a CertificateRequest; goes on with no certificate.
    static let certificateCallback: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Int32 = { ssl, _ in
        TLSConnectionHooks.hooks(ssl)?.certificateRequested = true
        return 1
    }

    /// Client, after the handshake: notes a NewSessionTicket (handshake message type 4).
    static let messageCallback: @convention(c) (
        Int32, Int32, Int32, UnsafeRawPointer?, Int, OpaquePointer?, UnsafeMutableRawPointer?
    ) -> Void = { writing, _, contentType, buffer, length, ssl, _ in
        // 22 = handshake (RFC 8446 §5.1); its first byte is the message type.
        guard writing == 0, contentType == 22, let buffer, length > 0,
              buffer.load(as: UInt8.self) == 4 else { return }
        TLSConnectionHooks.hooks(ssl)?.sessionTicketReceived = true
    }

    private static func hooks(_ ssl: OpaquePointer?) -> TLSConnectionHooks? {
        guard let ssl, let raw = pg_SSL_get_app_data(ssl) else { return nil }
        return Unmanaged<TLSConnectionHooks>.fromOpaque(raw).takeUnretainedValue()
    }

    /// Records the client's ALPN offer and pauses the handshake when the caller asked to.
    static let clientHelloCallback: @convention(c) (OpaquePointer?, UnsafeMutablePointer<Int32>?, UnsafeMutableRawPointer?) -> Int32 = { ssl, _, _ in
        guard let hooks = TLSConnectionHooks.hooks(ssl) else { return pg_SSL_CLIENT_HELLO_ERROR() }
        var data: UnsafePointer<UInt8>?
        var length = 0
        // 16 = application_layer_protocol_negotiation (RFC 7301).
        if SSL_client_hello_get0_ext(ssl, 16, &data, &length) == 1, let data, length >= 2 {
            let body = UnsafeBufferPointer(start: data + 2, count: length - 2)
            hooks.offeredALPN = ALPNWire.decode(body)
        } else {
            hooks.offeredALPN = nil
        }
        if hooks.pauseWhenPreferredALPNMissing, let preferred = hooks.preferredALPN,
           !(hooks.offeredALPN ?? []).contains(preferred) {
            return pg_SSL_CLIENT_HELLO_RETRY()
        }
        return pg_SSL_CLIENT_HELLO_SUCCESS()
    }

    /// Selects the preferred protocol when the client offered it, else the fallback when
    /// it offered that, and no protocol otherwise.
    static let alpnSelectCallback: @convention(c) (
        OpaquePointer?, UnsafeMutablePointer<UnsafePointer<UInt8>?>?, UnsafeMutablePointer<UInt8>?,
        UnsafePointer<UInt8>?, UInt32, UnsafeMutableRawPointer?
    ) -> Int32 = { ssl, out, outLength, input, inputLength, _ in
        guard let hooks = TLSConnectionHooks.hooks(ssl), let input, let out, let outLength
        else { return pg_SSL_TLSEXT_ERR_NOACK() }
        for wanted in [hooks.preferredALPN, hooks.fallbackALPN].compactMap({ $0 }).map({ Array($0.utf8) }) {
            var index = 0
            let count = Int(inputLength)
            while index < count {
                let length = Int(input[index])
                let start = index + 1
                guard start + length <= count else { break }
                if length == wanted.count, Array(UnsafeBufferPointer(start: input + start, count: length)) == wanted {
                    // `out` must point into OpenSSL's own buffer, which outlives this call.
                    out.pointee = input + start
                    outLength.pointee = UInt8(length)
                    return pg_SSL_TLSEXT_ERR_OK()
                }
                index = start + length
            }
        }
        return pg_SSL_TLSEXT_ERR_NOACK()
    }
}

/// The ALPN protocol-list wire format: each name prefixed by its one-byte length.
enum ALPNWire {
    static func encode(_ protocols: [String]) -> [UInt8] {
        var wire: [UInt8] = []
        for name in protocols {
            let bytes = Array(name.utf8)
            guard !bytes.isEmpty, bytes.count <= 255 else { continue }
            wire.append(UInt8(bytes.count))
            wire.append(contentsOf: bytes)
        }
        return wire
    }

    static func decode(_ wire: UnsafeBufferPointer<UInt8>) -> [String] {
        var names: [String] = []
        var index = 0
        while index < wire.count {
            let length = Int(wire[index])
            let start = index + 1
            guard length > 0, start + length <= wire.count else { break }
            names.append(String(decoding: wire[start..<(start + length)], as: UTF8.self))
            index = start + length
        }
        return names
    }
}

/// The port of a `host:port` text: one to five ASCII digits (leading zeros allowed), read
/// as bytes. Digits only: `Int` alone would take "+443"; `Character.isNumber` would take
/// other scripts' digits and cost a Unicode lookup per character. The caller checks the range.
public enum PortText {
    /// The digits' value, or nil when they are not one to five ASCII digits.
    public static func value(_ digits: some Collection<UInt8>) -> Int? {
        guard !digits.isEmpty, digits.count <= 5 else { return nil }
        var value = 0
        for byte in digits {
            guard byte >= 0x30 && byte <= 0x39 else { return nil }
            value = value * 10 + Int(byte - 0x30)
        }
        return value
    }
}

/// Recognizes IP literals so they are verified as IP SANs and never sent as SNI.
public enum IPAddressText {
    /// True for a textual IPv4 or IPv6 address (no brackets).
    public static func isIPLiteral(_ text: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, text, &v4) == 1 || inet_pton(AF_INET6, text, &v6) == 1
    }
}
