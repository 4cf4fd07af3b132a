/*
 * test_nccl.c - the NCCL collectives (worker/coll/zs_coll_nccl*.c) against
 * the MPI ones (zs_coll_mpi.c) on the same data, and a rank killed in the
 * middle of a collective. test_nccl_boot.c holds the bootstrap, the
 * in-place layouts on small integers, refusals and the watchdog on a hung
 * stream; this file holds what needs both communicators or a dying rank.
 *
 *   mpirun -np W test_nccl vsmpi     (a GPU per rank; exit 77 without)
 *     Every rank makes both communicators: NCCL on its GPU, MPI on the CPU
 *     device. The same per-rank data goes through reduce-scatter,
 *     all-gather, all-reduce (sum, max) and broadcast (every root) in
 *     fp32, bf16 and fp16, at counts from 1 to past the CUDA emulator's
 *     NCCL chunk, and through one group of 120 mixed collectives. The
 *     results of the two must be bitwise equal wherever the order of the
 *     additions cannot matter: copies, max, sums on two ranks (one
 *     addition, commutative), sums of data whose partial sums are exact.
 *     Sums of random data on more ranks: Open MPI chooses its own order
 *     (recursive doubling, rings), so they must agree within the bound of
 *     a reordered sum, and - on the CUDA emulator, whose NCCL reduces in
 *     rank order, ((v0 + v1) + v2) + ..., rounding to the type after each
 *     step (tests/cuda_emu/README.md) - NCCL's result must equal that fold
 *     computed here bitwise.
 *   test_nccl kill W                 (driver: no MPI in this process)
 *     Runs `mpirun -np W test_nccl kill-rank` with Open MPI told not to end
 *     the job when a process dies (orte_abort_on_non_zero_status 0: by
 *     default mpirun kills the survivors itself, which would test nothing).
 *     Rank W-1 SIGKILLs itself 5 ms into a 64 MiB all-reduce (which takes
 *     ~80 ms on the emulator at W=2 with 16 KiB chunks: still running). Every other
 *     rank's zs_coll_sync must fail within the watchdog's deadline (4 s)
 *     plus 5 s, with an error naming its rank and the collective; later
 *     calls are refused; destroy returns. Each survivor prints KILL-PASS;
 *     the driver wants W-1 of them, no FAIL, within a hard 120 s. Twice:
 *     the all-reduce waited for with zs_coll_sync, then one made by
 *     zs_coll_all_reduce_host (what the engine's norm and failure
 *     agreements use), which must fail too rather than return garbage.
 *
 * Exit 77 (skip) where the ranks have no GPU of their own.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "zs_cast.h"
#include "zs_coll.h"
#include "zs_coll_nccl.h"
#include "zs_dev.h"
#include "zs_dev_cuda.h"
#include "zs_dtypetest.h"
#include "zs_mpitest.h"

int g_rank; /* zs_mpitest.h */
static int g_size;
static zs_err_t err;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- data ---------------------------------------------------------------------- */

static const zs_dtype_t DTS[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};

/* x rounded to dt (identity for fp32). */
static float rnd(zs_dtype_t dt, float x)
{
    uint16_t h;
    if (dt == ZS_DTYPE_F32)
        return x;
    if (dt == ZS_DTYPE_BF16) {
        h = zs_f32_to_bf16(x);
        return zs_bf16_to_f32(h);
    }
    h = zs_f32_to_f16(x);
    return zs_f16_to_f32(h);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Element i of rank r's data for case `cs`. exact: multiples of a power of
 * two small enough that every partial sum over 4 ranks is exact in dt
 * (fp32: 21-bit integers / 4096; 16-bit: -15..15 / 8). Otherwise random
 * values in +-[2^-3, 2^3) with a random mantissa, rounded to dt. */
static float val(int exact, zs_dtype_t dt, int r, int cs, size_t i)
{
    uint64_t h =
        mix(((uint64_t)cs << 40) ^ ((uint64_t)r << 32) ^ (uint64_t)i ^ 0x9e3779b97f4a7c15ull);
    if (exact) {
        if (dt == ZS_DTYPE_F32)
            return (float)((int64_t)(h % (2u << 20)) - (1 << 20)) / 4096.0f;
        return (float)((int)(h % 31) - 15) / 8.0f;
    }
    float m = 1.0f + (float)(h >> 40) / (float)(1ull << 24); /* [1, 2) */
    int e = (int)((h >> 8) % 7) - 3;
    return rnd(dt, (h & 1 ? -m : m) * ldexpf(1.0f, e));
}

/* ---- the two communicators ------------------------------------------------------ */

typedef struct {
    zs_dev_t *gpu, *cpu;
    zs_coll_t *nccl, *mpi;
    zs_stream_t *up;  /* the GPU's compute stream: uploads, downloads */
    zs_event_t *done; /* NCCL's done */
    void *pin;        /* pinned staging on the GPU device */
    size_t pin_bytes;
} pair_t;

/* One collective on one communicator, in place on a buffer of `elems`
 * elements; kind: 0 RS, 1 AG, 2 AR sum, 3 AR max, 4 BC from root. */
static int coll(zs_coll_t *c, int kind, void *buf, size_t n, zs_dtype_t dt, int root,
                zs_stream_t *after, zs_event_t *done)
{
    switch (kind) {
    case 0:
        return zs_coll_reduce_scatter(c, buf, n, dt, after, done, &err);
    case 1:
        return zs_coll_all_gather(c, buf, n, dt, after, done, &err);
    case 2:
        return zs_coll_all_reduce(c, buf, n, dt, ZS_OP_SUM, after, done, &err);
    case 3:
        return zs_coll_all_reduce(c, buf, n, dt, ZS_OP_MAX, after, done, &err);
    default:
        return zs_coll_broadcast(c, buf, n, dt, root, after, done, &err);
    }
}

static const char *KIND[5] = {"reduce_scatter", "all_gather", "all_reduce sum", "all_reduce max",
                              "broadcast"};

/* Elements of the buffer a collective of `n` works on. */
static size_t span(int kind, size_t n)
{
    return kind <= 1 ? n * (size_t)g_size : n;
}

/* Where this rank's result lies: [*lo, *hi) of the buffer. */
static void result_range(int kind, size_t n, size_t *lo, size_t *hi)
{
    *lo = kind == 0 ? (size_t)g_rank * n : 0;
    *hi = kind == 0 ? *lo + n : span(kind, n);
}

/* Rank r's input element i of the buffer (all-gather: its own block only,
 * the rest holds garbage the collective must overwrite). */
static float input(int exact, zs_dtype_t dt, int r, int cs, int kind, size_t n, size_t i)
{
    if (kind == 1 && (i < (size_t)r * n || i >= (size_t)(r + 1) * n))
        return -777.0f;
    return val(exact, dt, r, cs, i);
}

/* What the emulated NCCL must give at element i of the buffer: the rank
 * fold in order, rounded to dt after each step (sum) - or the plain value
 * for max, copies. */
static float fold(int exact, zs_dtype_t dt, int cs, int kind, size_t n, int root, size_t i)
{
    if (kind == 1)
        return val(exact, dt, (int)(i / n), cs, i);
    if (kind == 4)
        return val(exact, dt, root, cs, i);
    float a = val(exact, dt, 0, cs, i);
    for (int r = 1; r < g_size; r++) {
        float b = val(exact, dt, r, cs, i);
        a = kind == 3 ? (b > a ? b : a) : rnd(dt, a + b);
    }
    return a;
}

/* Run case cs on both communicators and compare. Returns 1 if the sums were
 * compared within a bound rather than bitwise. */
static int one_case(pair_t *x, int exact, zs_dtype_t dt, int kind, size_t n, int root, int cs)
{
    size_t es = zs_dtype_size(dt), elems = span(kind, n), bytes = elems * es;
    CHECK(bytes <= x->pin_bytes, "case too large");
    void *g, *h;
    OK(zs_dev_alloc(x->gpu, ZS_SPACE_DEVICE, ZS_MEM_COMM, bytes, &g, &err), err);
    OK(zs_dev_alloc(x->cpu, ZS_SPACE_DEVICE, ZS_MEM_COMM, bytes, &h, &err), err);
    for (size_t i = 0; i < elems; i++) {
        float v = input(exact, dt, g_rank, cs, kind, n, i);
        st(dt, x->pin, i, v);
        st(dt, h, i, v); /* CPU device memory is host memory */
    }
    OK(zs_dev_memcpy(x->up, g, x->pin, bytes, &err), err);
    OK(coll(x->nccl, kind, g, n, dt, root, x->up, x->done), err);
    OK(coll(x->mpi, kind, h, n, dt, root, NULL, NULL), err);
    OK(zs_coll_sync(x->mpi, &err), err);
    OK(zs_dev_stream_wait(x->up, x->done, &err), err);
    OK(zs_dev_memcpy(x->up, x->pin, g, bytes, &err), err);
    OK(zs_dev_stream_sync(x->up, &err), err);

    /* Order matters only for sums of inexact data on more than two ranks. */
    int bounded = kind == 2 || kind == 0 ? (!exact && g_size > 2) : 0;
    double eps = dt == ZS_DTYPE_F32 ? 0x1p-24 : dt == ZS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    size_t lo, hi;
    result_range(kind, n, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        float a = ld(dt, x->pin, i), b = ld(dt, h, i);
        if (!bounded) {
            CHECK(memcmp(&a, &b, sizeof a) == 0,
                  "%s %s n=%zu %s case %d [%zu]: NCCL %.9g, MPI %.9g (bitwise expected)",
                  KIND[kind], zs_dtype_name(dt), n, exact ? "exact" : "random", cs, i, a, b);
        } else {
            /* two orders of the same W-term sum, each rounding W-1 times */
            double mag = 0;
            for (int r = 0; r < g_size; r++)
                mag += fabs(val(exact, dt, r, cs, i));
            double tol = 2.0 * (g_size - 1) * eps * mag;
            CHECK(fabs((double)a - b) <= tol,
                  "%s %s n=%zu case %d [%zu]: NCCL %.9g, MPI %.9g (bound %.3g)", KIND[kind],
                  zs_dtype_name(dt), n, cs, i, a, b, tol);
        }
#ifdef ZS_TEST_EMU
        float f = fold(exact, dt, cs, kind, n, root, i);
        CHECK(memcmp(&a, &f, sizeof a) == 0,
              "%s %s n=%zu case %d [%zu]: emulated NCCL %.9g, rank-order fold %.9g", KIND[kind],
              zs_dtype_name(dt), n, cs, i, a, f);
#else
        (void)fold;
#endif
    }
    zs_dev_free(x->gpu, g);
    zs_dev_free(x->cpu, h);
    return bounded;
}

static void test_vs_mpi(pair_t *x)
{
    /* 300007 fp32 elements per rank: past the emulator's 1 MiB chunk */
    const size_t counts[] = {1, 777, 4099, 300007};
    int cs = 0, bitwise = 0, bounded = 0;
    for (int exact = 1; exact >= 0; exact--)
        for (int t = 0; t < 3; t++)
            for (int k = 0; k < 4; k++)
                for (int kind = 0; kind < 5; kind++) {
                    int roots = kind == 4 ? g_size : 1;
                    for (int root = 0; root < roots; root++) {
                        if (one_case(x, exact, DTS[t], kind, counts[k], root, cs++))
                            bounded++;
                        else
                            bitwise++;
                    }
                }
    printf("rank %d: NCCL vs MPI on the same data: %d cases bitwise equal, %d random sums within "
           "the reordering bound%s\n",
           g_rank, bitwise, bounded,
#ifdef ZS_TEST_EMU
           "; every NCCL result bitwise the rank-order fold"
#else
           ""
#endif
    );
}

/* One group of NG mixed collectives (all four kinds, the three dtypes) on
 * slices of one buffer per dtype, on both communicators; exact data, so
 * results must be bitwise equal. */
static void test_group(pair_t *x)
{
    enum { NG = 120, CNT = 37 };
    size_t per = (size_t)g_size * CNT; /* elements per collective slot */
    void *g[3], *h[3], *pin[3];
    for (int t = 0; t < 3; t++) {
        size_t bytes = NG * per * zs_dtype_size(DTS[t]);
        OK(zs_dev_alloc(x->gpu, ZS_SPACE_DEVICE, ZS_MEM_COMM, bytes, &g[t], &err), err);
        OK(zs_dev_alloc(x->gpu, ZS_SPACE_PINNED, ZS_MEM_COMM, bytes, &pin[t], &err), err);
        OK(zs_dev_alloc(x->cpu, ZS_SPACE_DEVICE, ZS_MEM_COMM, bytes, &h[t], &err), err);
        for (int k = 0; k < NG; k++)
            for (size_t i = 0; i < per; i++) {
                int kind = k % 5;
                float v = input(1, DTS[t], g_rank, 1000 + k, kind, CNT, i);
                st(DTS[t], pin[t], k * per + i, v);
                st(DTS[t], h[t], k * per + i, v);
            }
        OK(zs_dev_memcpy(x->up, g[t], pin[t], bytes, &err), err);
    }
    OK(zs_coll_group_start(x->nccl, &err), err);
    OK(zs_coll_group_start(x->mpi, &err), err);
    for (int k = 0; k < NG; k++) {
        int t = (k / 5) % 3, kind = k % 5, root = k % g_size;
        size_t off = k * per * zs_dtype_size(DTS[t]);
        OK(coll(x->nccl, kind, (char *)g[t] + off, CNT, DTS[t], root, k == 0 ? x->up : NULL,
                k == NG - 1 ? x->done : NULL),
           err);
        OK(coll(x->mpi, kind, (char *)h[t] + off, CNT, DTS[t], root, NULL, NULL), err);
    }
    OK(zs_coll_group_end(x->nccl, &err), err);
    OK(zs_coll_group_end(x->mpi, &err), err);
    OK(zs_coll_sync(x->mpi, &err), err);
    OK(zs_dev_stream_wait(x->up, x->done, &err), err);
    for (int t = 0; t < 3; t++)
        OK(zs_dev_memcpy(x->up, pin[t], g[t], NG * per * zs_dtype_size(DTS[t]), &err), err);
    OK(zs_dev_stream_sync(x->up, &err), err);
    for (int k = 0; k < NG; k++) {
        int t = (k / 5) % 3, kind = k % 5;
        size_t lo, hi;
        result_range(kind, CNT, &lo, &hi);
        for (size_t i = lo; i < hi; i++) {
            float a = ld(DTS[t], pin[t], k * per + i), b = ld(DTS[t], h[t], k * per + i);
            CHECK(memcmp(&a, &b, sizeof a) == 0, "group member %d (%s %s) [%zu]: NCCL %g MPI %g", k,
                  KIND[kind], zs_dtype_name(DTS[t]), i, a, b);
        }
    }
    for (int t = 0; t < 3; t++) {
        zs_dev_free(x->gpu, g[t]);
        zs_dev_free(x->gpu, pin[t]);
        zs_dev_free(x->cpu, h[t]);
    }
    printf("rank %d: one group of %d mixed collectives (fused launches of %d): NCCL == MPI "
           "bitwise\n",
           g_rank, NG, ZS_COLL_GROUP_MAX);
}

static int run_vs_mpi(void)
{
    char why[256];
    int ngpu = zs_dev_cuda_available(why, sizeof why);
    if (ngpu < g_size) {
        if (g_rank == 0)
            printf("SKIPPED: %d rank(s), %d GPU(s): %s\n", g_size, ngpu,
                   ngpu ? "one GPU per rank needed" : why);
        return 77;
    }
    zs_nccl_boot_t b;
    OK(zs_coll_nccl_bootstrap(&b, &err), err);
    pair_t x = {0};
    OK(zs_dev_cuda_create(b.local_rank, &x.gpu, &err), err);
    OK(zs_dev_cpu_create(1, &x.cpu, &err), err);
    OK(zs_coll_nccl_create(x.gpu, 60000, &x.nccl, &err), err);
    OK(zs_coll_mpi_create(x.cpu, &x.mpi, &err), err);
    OK(zs_dev_stream_create(x.gpu, 0, "compute", &x.up, &err), err);
    OK(zs_dev_event_create(x.gpu, &x.done, &err), err);
    x.pin_bytes = (size_t)300007 * 4 * g_size;
    OK(zs_dev_alloc(x.gpu, ZS_SPACE_PINNED, ZS_MEM_COMM, x.pin_bytes, &x.pin, &err), err);
    printf("rank %d: NCCL on %s, MPI on the CPU device\n", g_rank, x.gpu->desc);
    test_vs_mpi(&x);
    test_group(&x);
    zs_dev_free(x.gpu, x.pin);
    zs_dev_event_destroy(x.done);
    zs_dev_stream_destroy(x.up);
    zs_coll_destroy(x.nccl);
    zs_coll_destroy(x.mpi);
    zs_dev_destroy(x.cpu);
    zs_dev_destroy(x.gpu);
    return 0;
}

/* ---- a rank killed mid-collective ---------------------------------------------- */

#define KILL_TIMEOUT_MS 4000
#define KILL_COUNT      ((size_t)16 << 20) /* fp32 elements: 64 MiB, ~80 ms emulated at W=2 */

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: a survivor did not stop within 60 s (hang)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(0); /* the verdict is the FAIL line (see run_kill_rank's exit) */
}

/* The survivors leave together: mpirun ends the whole job when the first
 * rank exits without MPI_Finalize, which would cut a slower survivor's
 * verdict short. MPI cannot be used with a dead peer, so they meet in the
 * driver's directory ($ZS_TEST_NCCL_DIR): each writes done.<rank> and waits
 * (at most 30 s) until the W-1 survivors' files are there. */
static void exit_barrier(void)
{
    const char *dir = getenv("ZS_TEST_NCCL_DIR");
    if (!dir)
        return;
    char path[512];
    snprintf(path, sizeof path, "%s/done.%d", dir, g_rank);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
    for (double t0 = now_s(); now_s() - t0 < 30.0;) {
        int n = 0;
        for (int r = 0; r < g_size - 1; r++) {
            snprintf(path, sizeof path, "%s/done.%d", dir, r);
            n += access(path, F_OK) == 0;
        }
        if (n == g_size - 1)
            return;
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
}

static void *die_soon(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 5 * 1000000};
    nanosleep(&ts, NULL);
    printf("rank %d: SIGKILL to myself 5 ms into the all-reduce\n", g_rank);
    fflush(stdout);
    raise(SIGKILL);
    return NULL;
}

/* One rank of the kill run: rank W-1 dies 5 ms into the all-reduce, which
 * is a stream collective waited for with zs_coll_sync (scenario "stream")
 * or zs_coll_all_reduce_host (scenario "host": the engine's norm and flag
 * agreements). */
static int run_kill_rank(const char *scenario)
{
    int host = strcmp(scenario, "host") == 0;
    char why[256];
    int ngpu = zs_dev_cuda_available(why, sizeof why);
    if (ngpu < g_size || g_size < 2) {
        if (g_rank == 0)
            printf("SKIPPED: %d rank(s), %d GPU(s): %s\n", g_size, ngpu,
                   ngpu ? "a GPU per rank and at least 2 ranks needed" : why);
        return 77;
    }
    signal(SIGALRM, on_alarm);
    alarm(60);
    zs_nccl_boot_t b;
    OK(zs_coll_nccl_bootstrap(&b, &err), err);
    zs_dev_t *d;
    zs_coll_t *c;
    zs_stream_t *s;
    void *buf;
    OK(zs_dev_cuda_create(b.local_rank, &d, &err), err);
    OK(zs_coll_nccl_create(d, KILL_TIMEOUT_MS, &c, &err), err);
    OK(zs_dev_stream_create(d, 0, "compute", &s, &err), err);
    OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_COMM, KILL_COUNT * 4, &buf, &err), err);
    OK(zs_dev_memset(s, buf, 0, KILL_COUNT * 4, &err), err);
    /* a first collective that everyone finishes */
    OK(zs_coll_all_reduce(c, buf, 1024, ZS_DTYPE_F32, ZS_OP_SUM, s, NULL, &err), err);
    OK(zs_coll_sync(c, &err), err);
    float *hbuf = calloc(KILL_COUNT, sizeof *hbuf);
    CHECK(hbuf, "out of memory");
    double t0 = now_s();
    int rc;
    zs_err_clear(&err);
    if (host) {
        pthread_t killer;
        if (g_rank == g_size - 1)
            CHECK(pthread_create(&killer, NULL, die_soon, NULL) == 0, "thread");
        rc = zs_coll_all_reduce_host(c, hbuf, KILL_COUNT, ZS_DTYPE_F32, ZS_OP_SUM, &err);
    } else {
        OK(zs_coll_all_reduce(c, buf, KILL_COUNT, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
        if (g_rank == g_size - 1)
            die_soon(NULL);
        rc = zs_coll_sync(c, &err);
    }
    if (g_rank == g_size - 1) /* the host all-reduce can end before the kill lands */
        for (;;)
            pause();
    double dt = now_s() - t0;
    char want_rank[32], want_coll[64];
    snprintf(want_rank, sizeof want_rank, "on rank %d", g_rank);
    snprintf(want_coll, sizeof want_coll, "all_reduce of %zu fp32", KILL_COUNT);
    printf("rank %d: %s returned %s after %.2f s: %s\n", g_rank,
           host ? "zs_coll_all_reduce_host" : "zs_coll_sync", zs_status_name(rc), dt, err.msg);
    int fail = 0;
    if (rc == ZS_OK || !strstr(err.msg, want_rank) || !strstr(err.msg, want_coll)) {
        fprintf(stderr, "FAIL rank %d: want an error naming '%s' and '%s'\n", g_rank, want_rank,
                want_coll);
        fail = 1;
    }
#ifdef ZS_TEST_EMU
    /* the emulated NCCL's text (its last error, which our message carries)
     * names the dead peer; real NCCL's wording differs */
    char want_dead[48];
    snprintf(want_dead, sizeof want_dead, "rank %d (pid", g_size - 1);
    if (rc != ZS_OK && !strstr(err.msg, want_dead)) {
        fprintf(stderr, "FAIL rank %d: the error should name the dead '%s...)'\n", g_rank,
                want_dead);
        fail = 1;
    }
#endif
    if (dt > KILL_TIMEOUT_MS / 1000.0 + 5.0) {
        fprintf(stderr, "FAIL rank %d: stopped after %.2f s, deadline %d ms\n", g_rank, dt,
                KILL_TIMEOUT_MS);
        fail = 1;
    }
    rc = zs_coll_all_reduce(c, buf, 1, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err);
    if (rc != ZS_ERR_STATE) {
        fprintf(stderr, "FAIL rank %d: a collective after the failure gave %d: %s\n", g_rank, rc,
                err.msg);
        fail = 1;
    }
    double t1 = now_s();
    zs_coll_destroy(c);
    zs_dev_free(d, buf);
    zs_dev_stream_destroy(s);
    zs_dev_destroy(d);
    free(hbuf);
    if (!fail)
        printf("rank %d: KILL-PASS: stopped in %.2f s (deadline %d ms), destroy %.2f s\n", g_rank,
               dt, KILL_TIMEOUT_MS, now_s() - t1);
    fflush(stdout);
    fflush(stderr);
    exit_barrier();
    /* No MPI_Finalize: a peer is dead, and Open MPI's finalize waits for it.
     * Exit 0 either way: with orte_abort_on_non_zero_status 0, mpirun
     * (4.1) never returns after a non-zero exit; the driver reads the
     * FAIL / KILL-PASS lines instead. */
    _exit(0);
}

static void rm_tree(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_nccl: could not remove %s\n", dir);
}

/* The driver: mpirun the ranks with a hard deadline, then count verdicts. */
static int run_kill_driver(const char *self, int w, const char *scenario)
{
    char dir[] = "/tmp/zs_test_nccl_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* ZS_MPIEXEC_BIN: the launcher where the build's is not (tests/gpu.sh) */
    const char *mpiexec = getenv("ZS_MPIEXEC_BIN") ? getenv("ZS_MPIEXEC_BIN") : ZS_MPIEXEC;
    char log[128], cmd[2048];
    snprintf(log, sizeof log, "%s/kill.log", dir);
    snprintf(cmd, sizeof cmd,
             "OMPI_MCA_orte_abort_on_non_zero_status=0 ZS_TEST_NCCL_DIR=%s exec %s -np %d "
             "--oversubscribe %s kill-rank %s > %s 2>&1",
             dir, mpiexec, w, self, scenario, log);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0, done = 0;
    while (now_s() - t0 < 120.0)
        if (waitpid(pid, &status, WNOHANG) == pid) {
            done = 1;
            break;
        } else {
            struct timespec ts = {0, 50 * 1000000};
            nanosleep(&ts, NULL);
        }
    if (!done) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    char line[1024];
    int pass = 0, fail = 0, skip = 0;
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof line, f)) {
        fputs(line, stdout);
        pass += strstr(line, "KILL-PASS") != NULL;
        fail += strstr(line, "FAIL") != NULL;
        skip += strncmp(line, "SKIPPED", 7) == 0;
    }
    if (f)
        fclose(f);
    rm_tree(dir);
    if (skip)
        return 77;
    printf("test_nccl kill %d (%s): %d of %d survivors stopped cleanly in %.1f s%s\n", w, scenario,
           pass, w - 1, now_s() - t0, done ? "" : " (HUNG: mpirun killed at the 120 s deadline)");
    return done && !fail && pass == w - 1 ? 0 : 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "kill") == 0) {
        int w = argc > 2 ? atoi(argv[2]) : 2;
        int a = run_kill_driver(argv[0], w, "stream");
        int b = a == 77 ? 77 : run_kill_driver(argv[0], w, "host");
        return a == 77 ? 77 : (a || b);
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int status;
    if (strcmp(mode, "vsmpi") == 0)
        status = run_vs_mpi();
    else if (strcmp(mode, "kill-rank") == 0)
        status = run_kill_rank(argc > 2 ? argv[2] : "stream");
    else {
        CHECK(0, "unknown mode '%s' (vsmpi | kill W | kill-rank)", mode);
        status = 2;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0 && status == 0)
        printf("test_nccl %s: all passed on %d rank(s)\n", mode, g_size);
    MPI_Finalize();
    return status;
}
