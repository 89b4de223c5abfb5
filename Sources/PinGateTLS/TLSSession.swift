internal import COpenSSL
import Foundation

/// One TLS session a client may offer to resume (`SSL_SESSION`), owned: `deinit` drops
/// the reference taken for it.
///
/// A resumed handshake presents no certificate and OpenSSL verifies nothing: the peer
/// the session remembers is whatever the first, full handshake proved. So a session is
/// only worth what the decision made on that handshake was worth, and the caller keeps
/// it next to that decision (see the gate's upstream session cache), never alone.
///
/// `@unchecked Sendable`: an `SSL_SESSION` is reference counted with atomic counts and
/// not changed once a handshake has produced it; OpenSSL allows one to be offered from
/// any thread (`SSL_set_session` takes its own reference).
public final class TLSSession: @unchecked Sendable {
    let pointer: OpaquePointer

    /// Takes over one reference to `pointer`.
    init(owning pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { SSL_SESSION_free(pointer) }

    /// The leaf certificate the server presented in the handshake that made the session.
    public var peerLeaf: Certificate? {
        guard let leaf = SSL_SESSION_get0_peer(pointer) else { return nil }
        X509_up_ref(leaf)
        return Certificate(owning: leaf)
    }

    /// True when the session can be offered at all (it has a ticket or an ID).
    public var isResumable: Bool { SSL_SESSION_is_resumable(pointer) == 1 }

    /// True for a TLS 1.3 session: its ticket should be offered once (RFC 8446 §C.4),
    /// and a resumed handshake brings a fresh one.
    public var isTLS13: Bool { SSL_SESSION_get_protocol_version(pointer) >= TLS1_3_VERSION }

    /// How long the server said the session may be resumed (the ticket lifetime hint in
    /// TLS 1.3 and for TLS 1.2 tickets, else the session's timeout), in seconds.
    public var lifetimeSeconds: Int {
        let hint = Int(SSL_SESSION_get_ticket_lifetime_hint(pointer))
        return hint > 0 ? hint : Int(SSL_SESSION_get_timeout(pointer))
    }
}
