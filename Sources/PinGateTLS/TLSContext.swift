internal import COpenSSL
import Foundation

/// Where a TLS client finds the roots it validates server chains against.
public enum TrustRoots: Sendable, Equatable {
    /// The system store (OpenSSL's default paths, e.g. /etc/ssl/certs).
    case system
    /// Only the certificates in these PEM files (bundles allowed).
    case pemFiles([String])

    /// The system's roots as one PEM bundle file, where OpenSSL looks for it (its
    /// compiled-in default, `/usr/lib/ssl/cert.pem` on Debian) or where the common
    /// distributions keep it; nil when there is none.
    public static var systemBundlePath: String? {
        var candidates: [String] = []
        if let compiledIn = X509_get_default_cert_file() { candidates.append(String(cString: compiledIn)) }
        candidates += ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"]
        return candidates.first { FileManager.default.isReadableFile(atPath: $0) }
    }
}

/// A configured OpenSSL `SSL_CTX`: shared, read-only settings for many connections.
///
/// `@unchecked Sendable`: it is fully configured before the first connection is made
/// from it and never changed afterwards, which is how OpenSSL allows an `SSL_CTX` to
/// be shared between threads.
public final class TLSContext: @unchecked Sendable {
    let pointer: OpaquePointer

    private init(owning pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { SSL_CTX_free(pointer) }

    /// A client context: TLS 1.2 minimum, chains checked against `trustRoots`.
    ///
    /// The handshake itself never aborts on a bad chain (`SSL_VERIFY_NONE`): OpenSSL
    /// still validates and records the result, and the pin policy reads it, because a
    /// pins-only host may legitimately present a chain no root vouches for.
    ///
    /// With `collectsSessions`, each connection made from the context keeps the sessions
    /// its server hands out (see `TLSConnection.deliverSessions(to:)`) and may offer one
    /// (`TLSConnection.offer(_:)`); OpenSSL's own client cache stays off, because a
    /// session must be kept only next to the decision its handshake led to.
    public static func client(trustRoots: TrustRoots, collectsSessions: Bool = false) throws -> TLSContext {
        let context = try make(method: TLS_client_method(), operation: "create client TLS context")
        SSL_CTX_set_verify(context.pointer, SSL_VERIFY_NONE, nil)
        if collectsSessions {
            _ = pg_SSL_CTX_set_client_session_callback_only(context.pointer)
            SSL_CTX_sess_set_new_cb(context.pointer, TLSConnectionHooks.newSessionCallback)
        }
        OpenSSLErrorQueue.clear()
        switch trustRoots {
        case .system:
            guard SSL_CTX_set_default_verify_paths(context.pointer) == 1 else {
                throw OpenSSLError.drained("load system trust store")
            }
        case .pemFiles(let paths):
            for path in paths {
                guard SSL_CTX_load_verify_locations(context.pointer, path, nil) == 1 else {
                    throw OpenSSLError.drained("load trust roots from \(path)")
                }
            }
        }
        return context
    }

    /// A server context presenting `certificate` (then `chain`) with `key`.
    ///
    /// ALPN selection and the ClientHello pause are decided per connection (see
    /// `TLSConnection.ServerOptions`), so one context serves every connection for a host.
    public static func server(certificate: Certificate, chain: [Certificate] = [], key: PrivateKey) throws -> TLSContext {
        let context = try make(method: TLS_server_method(), operation: "create server TLS context")
        OpenSSLErrorQueue.clear()
        guard SSL_CTX_use_certificate(context.pointer, certificate.pointer) == 1 else {
            throw OpenSSLError.drained("use server certificate")
        }
        for extra in chain {
            // add1 takes its own reference, so the Certificate keeps ownership of ours.
            guard pg_SSL_CTX_add1_chain_cert(context.pointer, extra.pointer) == 1 else {
                throw OpenSSLError.drained("add chain certificate")
            }
        }
        guard SSL_CTX_use_PrivateKey(context.pointer, key.pointer) == 1,
              SSL_CTX_check_private_key(context.pointer) == 1
        else { throw OpenSSLError.drained("use server private key") }
        // Our order of TLS 1.3 suites (see `make`) decides, except that a client listing
        // ChaCha20 first (no AES instructions, typically) gets it.
        _ = SSL_CTX_set_options(context.pointer, pg_SSL_OP_CIPHER_SERVER_PREFERENCE() | pg_SSL_OP_PRIORITIZE_CHACHA())
        SSL_CTX_set_alpn_select_cb(context.pointer, TLSConnectionHooks.alpnSelectCallback, nil)
        SSL_CTX_set_client_hello_cb(context.pointer, TLSConnectionHooks.clientHelloCallback, nil)
        return context
    }

    /// The TLS 1.3 cipher suites, most preferred first.
    static let tls13Suites = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

    private static func make(method: OpaquePointer?, operation: String) throws -> TLSContext {
        OpenSSLErrorQueue.clear()
        guard let method, let raw = SSL_CTX_new(method) else { throw OpenSSLError.drained(operation) }
        let context = TLSContext(owning: raw)
        guard pg_SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION) == 1 else {
            throw OpenSSLError.drained("\(operation): set TLS 1.2 minimum")
        }
        _ = SSL_CTX_set_options(raw, pg_SSL_OP_NO_COMPRESSION() | pg_SSL_OP_NO_RENEGOTIATION())
        // TLS 1.3: AES-128-GCM first (OpenSSL's default puts AES-256-GCM first). Both are
        // strong AEADs; 128 is the mandatory suite (RFC 8446 §9.1) and what Go and
        // BoringSSL prefer, and it is cheaper on every byte the gate decrypts and
        // re-encrypts on both legs. The same three suites as OpenSSL's default, reordered.
        guard SSL_CTX_set_ciphersuites(raw, Self.tls13Suites) == 1 else {
            throw OpenSSLError.drained("\(operation): set TLS 1.3 cipher suites")
        }
        // The write side is a growable memory BIO: buffers may move between calls.
        _ = pg_SSL_CTX_set_mode(raw, pg_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER() | pg_SSL_MODE_RELEASE_BUFFERS())
        return context
    }
}
