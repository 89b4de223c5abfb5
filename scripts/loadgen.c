// loadgen: the load generator behind scripts/bench. One C process, one thread per
// concurrent client, blocking sockets and OpenSSL: cheap enough per connection that the
// proxy under test, not this, is what saturates (its own ceiling is the `direct` row).
//
// Modes (one JSON line on stdout each):
//   conn       COUNT new connections in all, CONCURRENCY at a time: TCP (+ CONNECT through
//              --proxy) + a full TLS handshake (no client session reuse) + GET PATH +
//              read the whole response + close. Reports latency percentiles per connection.
//   keepalive  per client, one connection and COUNT GETs of PATH on it.
//   bulk       per client, one connection, GET PATH, body hashed with SHA-256 and compared
//              with --sha256 (and --length).
//   idle       COUNT tunnels opened (CONNECT + TLS + one GET each, all answered) and held
//              open; prints a JSON line when all are up, then waits for stdin to close.
//
// --connect-host NAME sends NAME in the CONNECT instead of HOST (a plain tunnel that
// resolves names itself is given the address; TLS still checks HOST).
//
// Every response must be 200 with the expected length; anything else counts as an error
// and makes the exit status non-zero.
//
// build: cc -O2 -o loadgen scripts/loadgen.c -lssl -lcrypto -lpthread
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *mode, *host, *connect_host, *proxy, *dial, *ca_file, *path = "/small.txt", *want_sha256;
static int port, concurrency = 1;
static long count = 1, want_length = -1;
static SSL_CTX *ctx;
static long next_index, errors, requests_done;
static long long bytes_done;
static double *latencies;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char first_error[512];

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void fail(const char *what) {
    pthread_mutex_lock(&lock);
    errors++;
    if (!first_error[0]) {
        unsigned long e = ERR_peek_last_error();
        snprintf(first_error, sizeof first_error, "%s%s%s (errno %d)", what, e ? ": " : "",
                 e ? ERR_reason_error_string(e) : "", errno);
    }
    pthread_mutex_unlock(&lock);
    ERR_clear_error();
}

static int dial_tcp(const char *addrport) {
    char address[128];
    snprintf(address, sizeof address, "%s", addrport);
    char *colon = strrchr(address, ':');
    if (!colon) return -1;
    *colon = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
    if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { close(fd); return -1; }
    return fd;
}

// TCP to the proxy (and its CONNECT answered 200) or straight to the origin.
static int open_stream(void) {
    int fd = dial_tcp(proxy ? proxy : dial);
    if (fd < 0) { fail("tcp connect"); return -1; }
    if (!proxy) return fd;
    char request[512];
    const char *target = connect_host ? connect_host : host;
    int n = snprintf(request, sizeof request, "CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n", target, port, target, port);
    if (write(fd, request, n) != n) { fail("write CONNECT"); close(fd); return -1; }
    // Read byte by byte up to the end of the head: nothing of the TLS stream may be eaten.
    char head[2048];
    int used = 0;
    while (used < (int)sizeof head - 1) {
        ssize_t r = read(fd, head + used, 1);
        if (r <= 0) { fail("CONNECT answer"); close(fd); return -1; }
        used++;
        if (used >= 4 && memcmp(head + used - 4, "\r\n\r\n", 4) == 0) break;
    }
    head[used] = 0;
    if (strncmp(head, "HTTP/1.1 200", 12) != 0 && strncmp(head, "HTTP/1.0 200", 12) != 0) {
        fail("CONNECT refused"); close(fd); return -1;
    }
    return fd;
}

static SSL *open_tls(int fd) {
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, host);
    SSL_set1_host(ssl, host);
    if (SSL_connect(ssl) != 1) { fail("TLS handshake"); SSL_free(ssl); return NULL; }
    return ssl;
}

// One GET on `ssl`; reads the whole response. Returns the body length, or -1.
static long get(SSL *ssl, int keep_alive, EVP_MD_CTX *digest) {
    char request[512];
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: %s:%d\r\n%s\r\n", path, host, port,
                     keep_alive ? "" : "Connection: close\r\n");
    if (SSL_write(ssl, request, n) != n) { fail("write request"); return -1; }
    static __thread char buffer[65536];
    int used = 0, head_end = -1;
    while (head_end < 0) {
        if (used == (int)sizeof buffer) { fail("response head too large"); return -1; }
        int r = SSL_read(ssl, buffer + used, (int)sizeof buffer - used);
        if (r <= 0) { fail("read response head"); return -1; }
        used += r;
        char *end = memmem(buffer, used, "\r\n\r\n", 4);
        if (end) head_end = (int)(end - buffer) + 4;
    }
    if (strncmp(buffer, "HTTP/1.1 200", 12) != 0) { fail("status not 200"); return -1; }
    char *cl = memmem(buffer, head_end, "\r\nContent-Length:", 17);
    if (!cl) cl = memmem(buffer, head_end, "\r\ncontent-length:", 17);
    if (!cl) { fail("no Content-Length"); return -1; }
    long length = atol(cl + 17);
    long have = used - head_end;
    if (digest) EVP_DigestUpdate(digest, buffer + head_end, have);
    while (have < length) {
        int r = SSL_read(ssl, buffer, (int)sizeof buffer);
        if (r <= 0) { fail("read body"); return -1; }
        if (digest) EVP_DigestUpdate(digest, buffer, r);
        have += r;
    }
    if (have != length || (want_length >= 0 && length != want_length)) { fail("body length"); return -1; }
    return length;
}

static void close_tls(SSL *ssl, int fd) {
    if (ssl) { SSL_shutdown(ssl); SSL_free(ssl); }
    if (fd >= 0) close(fd);
}

static void *conn_worker(void *unused) {
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&lock);
        long index = next_index < count ? next_index++ : -1;
        pthread_mutex_unlock(&lock);
        if (index < 0) return NULL;
        double t0 = now_s();
        int fd = open_stream();
        SSL *ssl = fd >= 0 ? open_tls(fd) : NULL;
        long length = ssl ? get(ssl, 0, NULL) : -1;
        close_tls(ssl, fd);
        latencies[index] = now_s() - t0;
        if (length >= 0) {
            pthread_mutex_lock(&lock);
            requests_done++;
            bytes_done += length;
            pthread_mutex_unlock(&lock);
        }
    }
}

static void *keepalive_worker(void *unused) {
    (void)unused;
    int fd = open_stream();
    SSL *ssl = fd >= 0 ? open_tls(fd) : NULL;
    for (long i = 0; ssl && i < count; i++) {
        long length = get(ssl, 1, NULL);
        if (length < 0) break;
        pthread_mutex_lock(&lock);
        requests_done++;
        bytes_done += length;
        pthread_mutex_unlock(&lock);
    }
    close_tls(ssl, fd);
    return NULL;
}

static void *bulk_worker(void *unused) {
    (void)unused;
    int fd = open_stream();
    SSL *ssl = fd >= 0 ? open_tls(fd) : NULL;
    EVP_MD_CTX *digest = EVP_MD_CTX_new();
    EVP_DigestInit_ex(digest, EVP_sha256(), NULL);
    long length = ssl ? get(ssl, 0, digest) : -1;
    unsigned char md[32];
    EVP_DigestFinal_ex(digest, md, NULL);
    EVP_MD_CTX_free(digest);
    close_tls(ssl, fd);
    if (length < 0) return NULL;
    char hex[65];
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    if (want_sha256 && strcmp(hex, want_sha256) != 0) { fail("body SHA-256 differs"); return NULL; }
    pthread_mutex_lock(&lock);
    requests_done++;
    bytes_done += length;
    pthread_mutex_unlock(&lock);
    return NULL;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run_idle(void) {
    // Raise our own descriptor limit to the hard limit: one socket per tunnel.
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0) { limit.rlim_cur = limit.rlim_max; setrlimit(RLIMIT_NOFILE, &limit); }
    SSL **ssls = calloc(count, sizeof *ssls);
    int *fds = calloc(count, sizeof *fds);
    double t0 = now_s();
    long up = 0;
    for (long i = 0; i < count; i++) {
        fds[i] = open_stream();
        ssls[i] = fds[i] >= 0 ? open_tls(fds[i]) : NULL;
        if (ssls[i] && get(ssls[i], 1, NULL) >= 0) up++;
    }
    printf("{\"mode\":\"idle\",\"tunnels\":%ld,\"errors\":%ld,\"open_s\":%.3f,\"first_error\":\"%s\"}\n",
           up, errors, now_s() - t0, first_error);
    fflush(stdout);
    char sink[64];
    while (read(0, sink, sizeof sink) > 0) {}
    for (long i = 0; i < count; i++) close_tls(ssls[i], fds[i]);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: loadgen conn|keepalive|bulk|idle --target HOST:PORT [options]\n"); return 2; }
    mode = argv[1];
    static char target[256], dial_default[64];
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--target")) snprintf(target, sizeof target, "%s", v);
        else if (!strcmp(k, "--proxy")) proxy = v;
        else if (!strcmp(k, "--dial")) dial = v;
        else if (!strcmp(k, "--connect-host")) connect_host = v;
        else if (!strcmp(k, "--ca")) ca_file = v;
        else if (!strcmp(k, "--path")) path = v;
        else if (!strcmp(k, "--concurrency")) concurrency = atoi(v);
        else if (!strcmp(k, "--count")) count = atol(v);
        else if (!strcmp(k, "--sha256")) want_sha256 = v;
        else if (!strcmp(k, "--length")) want_length = atol(v);
        else { fprintf(stderr, "unknown option %s\n", k); return 2; }
    }
    char *colon = strrchr(target, ':');
    if (!colon || !ca_file) { fprintf(stderr, "--target HOST:PORT and --ca are required\n"); return 2; }
    *colon = 0;
    host = target;
    port = atoi(colon + 1);
    if (!dial) { snprintf(dial_default, sizeof dial_default, "127.0.0.1:%d", port); dial = dial_default; }

    ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    // Every connection is a new one: no client-side session reuse.
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    if (SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) { fprintf(stderr, "cannot load %s\n", ca_file); return 2; }

    if (!strcmp(mode, "idle")) { run_idle(); return errors ? 1 : 0; }
    void *(*worker)(void *) = !strcmp(mode, "conn") ? conn_worker : !strcmp(mode, "keepalive") ? keepalive_worker
                            : !strcmp(mode, "bulk") ? bulk_worker : NULL;
    if (!worker) { fprintf(stderr, "unknown mode %s\n", mode); return 2; }
    if (worker == conn_worker) latencies = calloc(count, sizeof *latencies);
    pthread_t *threads = calloc(concurrency, sizeof *threads);
    double t0 = now_s();
    for (int i = 0; i < concurrency; i++) pthread_create(&threads[i], NULL, worker, NULL);
    for (int i = 0; i < concurrency; i++) pthread_join(threads[i], NULL);
    double wall = now_s() - t0;
    printf("{\"mode\":\"%s\",\"concurrency\":%d,\"requests\":%ld,\"bytes\":%lld,\"errors\":%ld,\"wall_s\":%.6f",
           mode, concurrency, requests_done, bytes_done, errors, wall);
    if (latencies) {
        qsort(latencies, count, sizeof *latencies, compare_double);
        printf(",\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f", latencies[count / 2] * 1e3,
               latencies[count * 9 / 10] * 1e3, latencies[count * 99 / 100] * 1e3);
    }
    printf(",\"first_error\":\"%s\"}\n", first_error);
    return errors ? 1 : 0;
}
