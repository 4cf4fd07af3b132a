/*
 * bench_rpc.c - push and pull throughput through a real zs-server against a
 * raw TCP socket over 127.0.0.1, plus the unary round-trip latency.
 *
 * Run:
 *   cmake --build build-rpc -j2 --target bench_rpc zs-server
 *   ./build-rpc/bench/bench_rpc [MiB ...]        (default: 64 256)
 *   env: ZS_BENCH_REPS (default 7), ZS_BENCH_RPC_MIB="64,256" (sizes when no
 *   argv), ZS_BENCH_RPC_HELLOS (Hellos per latency rep, default 200),
 *   ZS_BENCH_RPC_CASES="push,pull,bf16,hello" (a subset, e.g. for perf).
 *
 * What it measures, in one run, median of ZS_BENCH_REPS reps (each case and
 * its baseline alternate rep by rep, after one untimed warm-up of each):
 *
 *   - push: zs_client_push of P = bytes/4 fp32 gradients for step 1 (the same
 *     step again every rep: a re-push overwrites the staged range), timed
 *     until the server's reply. Baseline: the same bytes written to a TCP
 *     socket with 1 MiB send() calls, received by a forked peer process with
 *     1 MiB recv() calls into a preallocated buffer, timed until the peer's
 *     1-byte acknowledgement.
 *   - pull fp32: after one commit of step 1 (with a bf16 copy), zs_client_pull
 *     of the full range as fp32. Baseline: the peer sends the same bytes with
 *     1 MiB send(), this process recv()s them with 1 MiB calls into its
 *     destination buffer.
 *   - pull bf16: the same as bf16 (P*2 bytes), against a TCP transfer of the
 *     same P*2 bytes.
 *   - latency: zs_client_hello (one unary call, 1 server) in microseconds per
 *     call, against an 8-byte TCP ping-pong with the peer (ratio = how many
 *     times slower the gRPC round trip is).
 * GB/s = 1e9 payload bytes per second. The zs-server runs with --threads 2
 * (tests/zs_proc.c) in its own process; the TCP peer is forked before this
 * process initializes gRPC (gRPC state does not survive fork).
 *
 * Does not: assert speeds, pin threads, or measure TLS.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zs_bench.h"
#include "zs_client.h"
#include "zs_proc.h"

#define IO_CHUNK  (1u << 20) /* the baseline's send/recv size */
#define MAX_SIZES 8
#define MIB       (1ull << 20)

/* Command header on the TCP connection to the peer. */
typedef struct {
    uint32_t op; /* 'R' receive n bytes, ack; 'S' send n bytes; 'P' n ping-pongs; 'Q' quit */
    uint32_t pad;
    uint64_t n;
} cmd_t;

static void die(const char *what)
{
    fprintf(stderr, "bench_rpc: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void die_err(const char *what, const zs_err_t *err)
{
    fprintf(stderr, "bench_rpc: %s: %s\n", what, err->msg);
    exit(1);
}

static void write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        size_t k = n < IO_CHUNK ? n : IO_CHUNK;
        ssize_t w = send(fd, c, k, 0);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("send");
        c += w;
        n -= (size_t)w;
    }
}

static void read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        size_t k = n < IO_CHUNK ? n : IO_CHUNK;
        ssize_t r = recv(fd, c, k, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die("recv");
        c += r;
        n -= (size_t)r;
    }
}

/* Touch every page so no rep pays for first faults. */
static void *alloc_touched(size_t n)
{
    char *p = malloc(n);
    if (!p)
        die("malloc");
    memset(p, 0x3c, n);
    return p;
}

/* ---- the TCP peer (a forked process, no gRPC) ---------------------------- */

static void peer_main(int lfd, size_t max_bytes)
{
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        die("accept");
    close(lfd);
    char *buf = alloc_touched(max_bytes);
    for (;;) {
        cmd_t c;
        read_all(fd, &c, sizeof c);
        if (c.op == 'Q')
            break;
        if (c.op == 'R') {
            read_all(fd, buf, c.n);
            write_all(fd, "k", 1);
        } else if (c.op == 'S') {
            write_all(fd, buf, c.n);
        } else if (c.op == 'P') {
            uint64_t x;
            for (uint64_t i = 0; i < c.n; i++) {
                read_all(fd, &x, sizeof x);
                write_all(fd, &x, sizeof x);
            }
        }
    }
    close(fd);
    free(buf);
    _exit(0);
}

/* Fork the peer; returns this side's connected socket. */
static int peer_start(size_t max_bytes, pid_t *pid)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&a, &al))
        die("listen");
    fflush(NULL);
    *pid = fork();
    if (*pid < 0)
        die("fork");
    if (*pid == 0)
        peer_main(lfd, max_bytes);
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a))
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void peer_cmd(int fd, uint32_t op, uint64_t n)
{
    cmd_t c = {op, 0, n};
    write_all(fd, &c, sizeof c);
}

/* Baseline push: this side sends n bytes, the peer receives and acks. */
static double tcp_push(int fd, const void *src, size_t n)
{
    double t0 = zs_bench_now();
    peer_cmd(fd, 'R', n);
    write_all(fd, src, n);
    char ack;
    read_all(fd, &ack, 1);
    return (double)n / (zs_bench_now() - t0) / 1e9;
}

/* Baseline pull: the peer sends n bytes, this side receives them into dst. */
static double tcp_pull(int fd, void *dst, size_t n)
{
    double t0 = zs_bench_now();
    peer_cmd(fd, 'S', n);
    read_all(fd, dst, n);
    return (double)n / (zs_bench_now() - t0) / 1e9;
}

/* Baseline latency: microseconds per 8-byte ping-pong, mean of k. */
static double tcp_rtt_us(int fd, int k)
{
    peer_cmd(fd, 'P', (uint64_t)k);
    double t0 = zs_bench_now();
    for (uint64_t i = 0; i < (uint64_t)k; i++) {
        uint64_t x = i;
        write_all(fd, &x, sizeof x);
        read_all(fd, &x, sizeof x);
    }
    return (zs_bench_now() - t0) / k * 1e6;
}

/* ---- the zs-server side --------------------------------------------------- */

static double rpc_push(zs_client_t *c, uint64_t P, const float *grad)
{
    zs_err_t err;
    double t0 = zs_bench_now();
    if (zs_client_push(c, 1, 0, P, grad, ZS_DTYPE_F32, &err))
        die_err("push", &err);
    return (double)P * 4 / (zs_bench_now() - t0) / 1e9;
}

static double rpc_pull(zs_client_t *c, uint64_t P, void *dst, zs_dtype_t dt)
{
    zs_err_t err;
    uint64_t step;
    double t0 = zs_bench_now();
    if (zs_client_pull(c, 1, 0, P, dst, dt, &step, &err))
        die_err("pull", &err);
    double r = (double)P * zs_dtype_size(dt) / (zs_bench_now() - t0) / 1e9;
    if (step != 1) {
        fprintf(stderr, "bench_rpc: pulled step %llu, wanted 1\n", (unsigned long long)step);
        exit(1);
    }
    return r;
}

static double rpc_hello_us(zs_client_t *c, int k)
{
    zs_err_t err;
    double t0 = zs_bench_now();
    for (int i = 0; i < k; i++)
        if (zs_client_hello(c, NULL, 0, NULL, &err))
            die_err("hello", &err);
    return (zs_bench_now() - t0) / k * 1e6;
}

/* ---- driver ------------------------------------------------------------------- */

static int parse_sizes(int argc, char **argv, uint64_t *mib)
{
    int n = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && n < MAX_SIZES; i++)
            mib[n++] = strtoull(argv[i], NULL, 10);
    } else {
        const char *s = getenv("ZS_BENCH_RPC_MIB");
        char buf[256];
        snprintf(buf, sizeof buf, "%s", s ? s : "64,256");
        for (char *t = strtok(buf, ", "); t && n < MAX_SIZES; t = strtok(NULL, ", "))
            mib[n++] = strtoull(t, NULL, 10);
    }
    for (int i = 0; i < n; i++)
        if (mib[i] == 0 || mib[i] > 4096) {
            fprintf(stderr, "usage: bench_rpc [MiB ...]  (each 1..4096)\n");
            exit(2);
        }
    return n;
}

/* Is `name` among the cases to run (ZS_BENCH_RPC_CASES; default all)? */
static int want(const char *name)
{
    const char *s = getenv("ZS_BENCH_RPC_CASES");
    if (!s || !*s)
        return 1;
    size_t n = strlen(name);
    for (const char *p = strstr(s, name); p; p = strstr(p + 1, name))
        if ((p == s || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

/* Alternate case and baseline rep by rep (which goes first alternates too). */
typedef double (*rate_fn)(void *ctx, int baseline);

static void measure(rate_fn fn, void *ctx, int reps, double *rate, double *base)
{
    fn(ctx, 0); /* warm-up */
    fn(ctx, 1);
    for (int r = 0; r < reps; r++) {
        if (r % 2) {
            base[r] = fn(ctx, 1);
            rate[r] = fn(ctx, 0);
        } else {
            rate[r] = fn(ctx, 0);
            base[r] = fn(ctx, 1);
        }
    }
}

typedef struct {
    zs_client_t *c;
    int fd;
    uint64_t P;
    float *grad;
    void *dst;
    zs_dtype_t dt;
    int k; /* latency: calls per rep */
} ctx_t;

static double push_case(void *p, int baseline)
{
    ctx_t *x = p;
    return baseline ? tcp_push(x->fd, x->grad, x->P * 4) : rpc_push(x->c, x->P, x->grad);
}

static double pull_case(void *p, int baseline)
{
    ctx_t *x = p;
    size_t n = x->P * zs_dtype_size(x->dt);
    return baseline ? tcp_pull(x->fd, x->dst, n) : rpc_pull(x->c, x->P, x->dst, x->dt);
}

static double lat_case(void *p, int baseline)
{
    ctx_t *x = p;
    return baseline ? tcp_rtt_us(x->fd, x->k) : rpc_hello_us(x->c, x->k);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    uint64_t mib[MAX_SIZES];
    int nsizes = parse_sizes(argc, argv, mib);
    int reps = zs_bench_reps(7);
    const char *hs = getenv("ZS_BENCH_RPC_HELLOS");
    int hellos = hs && atoi(hs) > 0 ? atoi(hs) : 200;
    uint64_t maxb = 0;
    for (int i = 0; i < nsizes; i++)
        maxb = mib[i] * MIB > maxb ? mib[i] * MIB : maxb;

    /* Fork the TCP peer first: gRPC is not initialized yet. */
    pid_t peer;
    int fd = peer_start(maxb, &peer);

    zs_test_server_t srv;
    memset(&srv, 0, sizeof srv);
    snprintf(srv.data_dir, sizeof srv.data_dir, "%s/s0", zs_test_tmpdir("bench-rpc"));
    zs_test_server_start(&srv);
    zs_client_opts_t o = {srv.addr, NULL, NULL, 600000, 0};
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    if (zs_client_create(&o, &c, &err))
        die_err("client", &err);

    float *grad = alloc_touched(maxb);
    void *dst = alloc_touched(maxb);
    for (uint64_t i = 0; i < maxb / 4; i++)
        grad[i] = 1e-3f * (float)((i * 2654435761u) % 1000) - 0.5f;
    printf("bench_rpc: zs-server %s (--threads 2), %d reps, sizes", srv.addr, reps);
    for (int i = 0; i < nsizes; i++)
        printf(" %llu MiB", (unsigned long long)mib[i]);
    printf("\n");

    zs_bench_header("zs-server push/pull vs raw TCP (1 MiB send/recv), 127.0.0.1", "GB/s");
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    for (int s = 0; s < nsizes; s++) {
        uint64_t P = mib[s] * MIB / 4;
        char model[64], size[32], name[96];
        snprintf(model, sizeof model, "bench-%llumib", (unsigned long long)mib[s]);
        snprintf(size, sizeof size, "%llu MiB", (unsigned long long)mib[s]);
        if (zs_client_init(c, model, P, &hp, grad, 0, 1, &err))
            die_err("init", &err);
        ctx_t x = {c, fd, P, grad, dst, ZS_DTYPE_F32, 0};
        double rate[ZS_BENCH_MAX_REPS], base[ZS_BENCH_MAX_REPS];

        if (want("push")) {
            measure(push_case, &x, reps, rate, base);
            zs_bench_row("push fp32 (zs_client_push)", size, rate, reps, base, reps);
            zs_bench_row("raw TCP send (baseline)", size, base, reps, NULL, 0);
        }

        rpc_push(c, P, grad); /* the commit needs the whole range staged */
        zs_step_scalars_t sc = {1, 1.0f, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
        if (zs_client_commit(c, &sc, &err))
            die_err("commit", &err);
        if (want("pull")) {
            measure(pull_case, &x, reps, rate, base);
            zs_bench_row("pull fp32 (zs_client_pull)", size, rate, reps, base, reps);
            zs_bench_row("raw TCP recv (baseline)", size, base, reps, NULL, 0);
        }
        if (want("bf16")) {
            x.dt = ZS_DTYPE_BF16;
            snprintf(size, sizeof size, "%llu MiB", (unsigned long long)mib[s] / 2);
            measure(pull_case, &x, reps, rate, base);
            snprintf(name, sizeof name, "pull bf16 of %llu MiB fp32 state",
                     (unsigned long long)mib[s]);
            zs_bench_row(name, size, rate, reps, base, reps);
            zs_bench_row("raw TCP recv, same bytes (baseline)", size, base, reps, NULL, 0);
        }
    }

    if (want("hello")) {
        zs_bench_header("Unary round trip (ratio = times slower than TCP ping-pong)", "us");
        ctx_t x = {c, fd, 0, NULL, NULL, ZS_DTYPE_F32, hellos};
        double rate[ZS_BENCH_MAX_REPS], base[ZS_BENCH_MAX_REPS];
        measure(lat_case, &x, reps, rate, base);
        char size[32];
        snprintf(size, sizeof size, "%d calls", hellos);
        zs_bench_row("Hello (zs_client_hello)", size, rate, reps, base, reps);
        zs_bench_row("TCP 8-byte ping-pong (baseline)", size, base, reps, NULL, 0);
    }

    peer_cmd(fd, 'Q', 0);
    close(fd);
    waitpid(peer, NULL, 0);
    zs_client_destroy(c);
    zs_test_server_stop(&srv, SIGTERM);
    free(grad);
    free(dst);
    return 0;
}
