#ifndef PINGATE_COPENSSL_SHIM_H
#define PINGATE_COPENSSL_SHIM_H

// Swift cannot import OpenSSL's function-like macros (most are thin wrappers over
// *_ctrl calls) nor its variadic functions. Each wrapper below exposes exactly one
// of those as a real function; nothing here holds logic of its own beyond that.

#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/rand.h>
#include <openssl/crypto.h>
#include <openssl/opensslv.h>

static inline int pg_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version) {
    return (int)SSL_CTX_set_min_proto_version(ctx, version);
}

static inline long pg_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) {
    return SSL_CTX_set_mode(ctx, mode);
}

static inline long pg_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER(void) { return SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER; }
static inline long pg_SSL_MODE_ENABLE_PARTIAL_WRITE(void) { return SSL_MODE_ENABLE_PARTIAL_WRITE; }
static inline long pg_SSL_MODE_RELEASE_BUFFERS(void) { return SSL_MODE_RELEASE_BUFFERS; }

static inline uint64_t pg_SSL_OP_NO_COMPRESSION(void) { return SSL_OP_NO_COMPRESSION; }
static inline uint64_t pg_SSL_OP_NO_RENEGOTIATION(void) { return SSL_OP_NO_RENEGOTIATION; }
static inline uint64_t pg_SSL_OP_CIPHER_SERVER_PREFERENCE(void) { return SSL_OP_CIPHER_SERVER_PREFERENCE; }
static inline uint64_t pg_SSL_OP_PRIORITIZE_CHACHA(void) { return SSL_OP_PRIORITIZE_CHACHA; }

static inline int pg_SSL_CTX_add1_chain_cert(SSL_CTX *ctx, X509 *cert) {
    return (int)SSL_CTX_add1_chain_cert(ctx, cert);
}

static inline int pg_SSL_set_tlsext_host_name(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}

static inline int pg_SSL_set_app_data(SSL *ssl, void *arg) {
    return SSL_set_app_data(ssl, arg);
}

static inline void *pg_SSL_get_app_data(const SSL *ssl) {
    return SSL_get_app_data(ssl);
}

/// The retry flags of a custom BIO are macros over BIO_set_flags / BIO_clear_flags.
static inline void pg_BIO_set_retry_read(BIO *bio) { BIO_set_retry_read(bio); }
static inline void pg_BIO_clear_retry_flags(BIO *bio) { BIO_clear_retry_flags(bio); }
static inline int pg_BIO_TYPE_SOURCE_SINK(void) { return BIO_TYPE_SOURCE_SINK; }
static inline int pg_BIO_CTRL_PENDING(void) { return BIO_CTRL_PENDING; }
static inline int pg_BIO_CTRL_WPENDING(void) { return BIO_CTRL_WPENDING; }
static inline int pg_BIO_CTRL_FLUSH(void) { return BIO_CTRL_FLUSH; }
static inline int pg_BIO_CTRL_EOF(void) { return BIO_CTRL_EOF; }

static inline void pg_OPENSSL_free(void *ptr) { OPENSSL_free(ptr); }

/// EVP_EC_gen is a variadic macro over EVP_PKEY_Q_keygen.
static inline EVP_PKEY *pg_EVP_EC_gen_P256(void) {
    return EVP_EC_gen("P-256");
}

/// X509V3_set_ctx_nodb is a macro that writes into the context struct; doing the
/// whole "build one extension from its config text and add it" step here keeps the
/// struct out of Swift.
static inline int pg_X509_add_ext_conf(X509 *cert, X509 *issuer, int nid, const char *value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (ext == NULL) return 0;
    int ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok;
}

static inline int pg_SSL_CLIENT_HELLO_SUCCESS(void) { return SSL_CLIENT_HELLO_SUCCESS; }
static inline int pg_SSL_CLIENT_HELLO_RETRY(void) { return SSL_CLIENT_HELLO_RETRY; }
static inline int pg_SSL_CLIENT_HELLO_ERROR(void) { return SSL_CLIENT_HELLO_ERROR; }
static inline int pg_SSL_TLSEXT_ERR_OK(void) { return SSL_TLSEXT_ERR_OK; }
static inline int pg_SSL_TLSEXT_ERR_NOACK(void) { return SSL_TLSEXT_ERR_NOACK; }
static inline int pg_SSL_TLSEXT_ERR_ALERT_FATAL(void) { return SSL_TLSEXT_ERR_ALERT_FATAL; }

/// Client-side session caching with OpenSSL's own store off: sessions are handed to the
/// new-session callback and kept only where the caller decides (bound to a verdict).
static inline long pg_SSL_CTX_set_client_session_callback_only(SSL_CTX *ctx) {
    return SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
}

#endif
