// handshake-floor: what OpenSSL alone costs per intercepted connection on this machine,
// the floor under any gate (or nginx) built on the same library. Both TLS 1.3 handshakes
// an intercepting proxy performs per new connection, run in memory (no sockets, no event
// loop) with the bench's certificate and CA:
//   server leg  the proxy answering the client with an ECDSA P-256 leaf (2 session tickets,
//               OpenSSL's default, as the gate sends; and with none, as the bench's nginx)
//   client leg  the proxy's own connection upstream: chain and host name verified
// Prints one JSON line with the CPU (this thread's clock) per handshake of each side.
//
// build: cc -O2 -o handshake-floor scripts/handshake-floor.c -lssl -lcrypto
// usage: handshake-floor CERT.pem KEY.pem CA.pem HOST [COUNT]
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void move(BIO *from, BIO *to) {
    char bytes[16384];
    int n;
    while ((n = BIO_read(from, bytes, sizeof bytes)) > 0) BIO_write(to, bytes, n);
}

// Runs COUNT handshake pairs; adds each side's CPU seconds to *server and *client.
static int run(SSL_CTX *server_ctx, SSL_CTX *client_ctx, const char *host, int count, double *server, double *client) {
    for (int i = 0; i < count; i++) {
        SSL *s = SSL_new(server_ctx), *c = SSL_new(client_ctx);
        BIO *s_in = BIO_new(BIO_s_mem()), *s_out = BIO_new(BIO_s_mem());
        BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
        BIO_set_mem_eof_return(s_in, -1);
        BIO_set_mem_eof_return(c_in, -1);
        SSL_set_bio(s, s_in, s_out);
        SSL_set_bio(c, c_in, c_out);
        SSL_set_accept_state(s);
        SSL_set_connect_state(c);
        SSL_set_tlsext_host_name(c, host);
        SSL_set1_host(c, host);
        int done = 0;
        for (int step = 0; step < 10 && done != 3; step++) {
            double t = thread_cpu();
            if (SSL_do_handshake(c) == 1) done |= 1;
            *client += thread_cpu() - t;
            move(c_out, s_in);
            t = thread_cpu();
            if (SSL_do_handshake(s) == 1) done |= 2;
            *server += thread_cpu() - t;
            move(s_out, c_in);
        }
        // The client takes the session tickets, as a proxy's upstream leg does.
        char byte;
        double t = thread_cpu();
        SSL_read(c, &byte, 1);
        *client += thread_cpu() - t;
        if (done != 3 || SSL_get_verify_result(c) != X509_V_OK) {
            fprintf(stderr, "handshake %d failed\n", i);
            ERR_print_errors_fp(stderr);
            return 0;
        }
        t = thread_cpu();
        SSL_free(s);
        *server += thread_cpu() - t;
        t = thread_cpu();
        SSL_free(c);
        *client += thread_cpu() - t;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: handshake-floor CERT.pem KEY.pem CA.pem HOST [COUNT]\n"); return 2; }
    int count = argc > 5 ? atoi(argv[5]) : 500;
    SSL_CTX *server_ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX *client_ctx = SSL_CTX_new(TLS_client_method());
    if (SSL_CTX_use_certificate_file(server_ctx, argv[1], SSL_FILETYPE_PEM) != 1
        || SSL_CTX_use_PrivateKey_file(server_ctx, argv[2], SSL_FILETYPE_PEM) != 1
        || SSL_CTX_load_verify_locations(client_ctx, argv[3], NULL) != 1) {
        ERR_print_errors_fp(stderr);
        return 2;
    }
    SSL_CTX_set_mode(server_ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_verify(client_ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_session_cache_mode(client_ctx, SSL_SESS_CACHE_OFF);
    double server2 = 0, client2 = 0, server0 = 0, client0 = 0;
    run(server_ctx, client_ctx, argv[4], 20, &server2, &client2); // warm-up
    server2 = client2 = 0;
    if (!run(server_ctx, client_ctx, argv[4], count, &server2, &client2)) return 1;
    SSL_CTX_set_num_tickets(server_ctx, 0);
    if (!run(server_ctx, client_ctx, argv[4], count, &server0, &client0)) return 1;
    printf("{\"kind\":\"floor\",\"handshakes\":%d,\"server_ms\":%.4f,\"server_no_tickets_ms\":%.4f,\"client_ms\":%.4f}\n",
           count, server2 / count * 1e3, server0 / count * 1e3, client2 / count * 1e3);
    return 0;
}
