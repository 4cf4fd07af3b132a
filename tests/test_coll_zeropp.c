/*
 * test_coll_zeropp.c - the collectives' ZeRO++ parts under mpirun, on MPI
 * (argv[1] "mpi", the CPU device) or NCCL ("nccl", one GPU per rank: the
 * emulated NCCL in CI):
 *   - topology: node numbers from MPI's shared-memory view, or blocks of
 *     ZS_RANKS_PER_NODE ranks; the intra-node and inter-node communicators
 *     (an all-reduce over each sums exactly its group);
 *   - refusals (MPI): ZS_RANKS_PER_NODE differing between ranks, or not
 *     dividing the world, fails create on every rank;
 *   - byte counters: each kind's bytes within and across nodes, exactly
 *     the model of zs_coll.h, for the world and the two sub-communicators;
 *   - qwZ: zs_coll_all_gather_q8 equals a plain all-gather followed by the
 *     CPU twin's pack and unpack of every block, bitwise (on NCCL this holds
 *     the CUDA kernels to the CPU twin), in fp32, bf16 and fp16, with a
 *     non-finite element and a partial last block;
 *   - qgZ: zs_coll_reduce_scatter_q8 equals its two hops replayed here
 *     from every rank's data, bitwise, and the exact sum within the bound
 *     of the records it went through (MPI and NCCL), a
 *     sub-communicator's refused.
 *
 *   - (NCCL, "kill 4") a rank SIGKILLed in the middle of its node's
 *     all-gather, with collectives queued on the inter-node and world
 *     communicators: every survivor's zs_coll_sync fails within the
 *     watchdog's deadline (+5 s), and a later collective on a
 *     communicator it shared with the dead rank fails.
 *
 * What it does not test: the engine's use of it (test_train_zeropp.c).
 */
#include <math.h>
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
#include "zs_dev.h"
#include "zs_mpitest.h"
#include "zs_quant.h"
#ifdef ZS_WITH_NCCL
#include "zs_coll_nccl.h"
#include "zs_dev_cuda.h"
#endif

int g_rank;
static int g_size;

/* Host -> device buffer of bytes, synchronously on c's stream. */
static void *to_dev(zs_coll_t *c, const void *host, size_t bytes)
{
    zs_err_t err;
    void *d = NULL;
    OK(zs_dev_alloc(c->dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, bytes, &d, &err), err);
    OK(zs_dev_memcpy(zs_coll_stream(c), d, host, bytes, &err), err);
    OK(zs_coll_sync(c, &err), err);
    return d;
}

static void to_host(zs_coll_t *c, void *host, const void *dev, size_t bytes)
{
    zs_err_t err;
    OK(zs_dev_memcpy(zs_coll_stream(c), host, dev, bytes, &err), err);
    OK(zs_coll_sync(c, &err), err);
}

/* All-reduce of one float (rank + 1) over c: the sum of (world rank + 1)
 * over c's ranks. */
static float sum_ranks(zs_coll_t *c)
{
    zs_err_t err;
    float v = (float)(g_rank + 1);
    OK(zs_coll_all_reduce_host(c, &v, 1, ZS_DTYPE_F32, ZS_OP_SUM, &err), err);
    return v;
}

static void check_topology(zs_coll_t *c)
{
    const zs_coll_topo_t *t = zs_coll_topo(c);
    const char *env = getenv("ZS_RANKS_PER_NODE");
    int n = env && *env ? atoi(env) : 0;
    if (n > 0) {
        CHECK(t->forced && t->node == g_rank / n && t->nnodes == g_size / n &&
                  t->local_rank == g_rank % n && t->local_size == n,
              "N=%d: node %d of %d, local %d of %d", n, t->node, t->nnodes, t->local_rank,
              t->local_size);
    } else { /* mpirun on one machine: one node */
        CHECK(!t->forced && t->node == 0 && t->nnodes == 1 && t->local_rank == g_rank &&
                  t->local_size == g_size,
              "node %d of %d, local %d of %d", t->node, t->nnodes, t->local_rank, t->local_size);
    }
    zs_coll_t *in = zs_coll_intra(c), *out = zs_coll_inter(c);
    CHECK(in && out && in->size == t->local_size && in->rank == t->local_rank &&
              out->size == t->nnodes && out->rank == t->node,
          "sub-communicators: intra %d/%d inter %d/%d", in ? in->rank : -1, in ? in->size : -1,
          out ? out->rank : -1, out ? out->size : -1);
    float want_in = 0, want_out = 0;
    int ls = t->local_size;
    for (int r = 0; r < g_size; r++) {
        if (r / ls == t->node)
            want_in += (float)(r + 1);
        if (r % ls == t->local_rank)
            want_out += (float)(r + 1);
    }
    float got_in = sum_ranks(in), got_out = sum_ranks(out), got_w = sum_ranks(c);
    CHECK(got_in == want_in && got_out == want_out && got_w == (float)(g_size * (g_size + 1) / 2),
          "sums: intra %g (want %g), inter %g (want %g), world %g", got_in, want_in, got_out,
          want_out, got_w);
}

/* Every kind once on the world, one all-gather on each sub-communicator;
 * the counters against the model. */
static void check_counters(zs_coll_t *c)
{
    zs_err_t err;
    const zs_coll_topo_t *t = zs_coll_topo(c);
    uint64_t pin = (uint64_t)t->local_size - 1, pout = (uint64_t)(g_size - t->local_size);
    size_t count = 1000;
    float *h = calloc((size_t)g_size * count, sizeof(float));
    CHECK(h, "no memory");
    void *d = to_dev(c, h, (size_t)g_size * count * 4);
    size_t rb = zs_quant_record_bytes(count);
    void *q = NULL;
    OK(zs_dev_alloc(c->dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, (size_t)g_size * rb, &q, &err), err);
    zs_coll_bytes_reset(c);
    OK(zs_coll_all_gather(c, d, count, ZS_DTYPE_F32, NULL, NULL, &err), err);
    OK(zs_coll_reduce_scatter(c, d, count, ZS_DTYPE_BF16, NULL, NULL, &err), err);
    OK(zs_coll_all_reduce(c, d, count, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    OK(zs_coll_broadcast(c, d, count, ZS_DTYPE_F16, 0, NULL, NULL, &err), err);
    OK(zs_coll_all_gather_q8(c, d, count, ZS_DTYPE_BF16, q, NULL, NULL, &err), err);
    int has_qgz = c->vt->reduce_scatter_q8 != NULL;
    void *wk = NULL;
    if (has_qgz) {
        OK(zs_dev_alloc(c->dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, zs_coll_rsq8_work_bytes(c, count),
                        &wk, &err),
           err);
        OK(zs_coll_reduce_scatter_q8(c, d, count, ZS_DTYPE_F32, wk, NULL, NULL, &err), err);
    }
    OK(zs_coll_all_gather(zs_coll_intra(c), d, count, ZS_DTYPE_F32, NULL, NULL, &err), err);
    OK(zs_coll_all_gather(zs_coll_inter(c), d, count, ZS_DTYPE_F32, NULL, NULL, &err), err);
    OK(zs_coll_sync(c, &err), err);
    zs_coll_bytes_t b = zs_coll_bytes(c);
    uint64_t ag4 = count * 4, rs2 = count * 2, ar = 2 * count * 4 / (uint64_t)g_size;
    uint64_t bc = g_rank == 0 ? count * 2 : 0;
    uint64_t nn = (uint64_t)t->nnodes;
    uint64_t want_in[ZS_COLL_NKINDS] = {rs2 * pin, ag4 * pin + ag4 * pin,      ar * pin, bc * pin,
                                        rb * pin,  has_qgz ? pin * nn * rb : 0};
    uint64_t want_out[ZS_COLL_NKINDS] = {rs2 * pout, ag4 * pout + ag4 * (nn - 1),
                                         ar * pout,  bc * pout,
                                         rb * pout,  has_qgz ? (nn - 1) * rb : 0};
    for (int k = 0; k < ZS_COLL_NKINDS; k++)
        CHECK(b.intra[k] == want_in[k] && b.inter[k] == want_out[k],
              "%s: intra %llu (want %llu) inter %llu (want %llu)", zs_coll_kind_name(k),
              (unsigned long long)b.intra[k], (unsigned long long)want_in[k],
              (unsigned long long)b.inter[k], (unsigned long long)want_out[k]);
    zs_coll_bytes_reset(c);
    b = zs_coll_bytes(c);
    CHECK(zs_coll_bytes_intra(&b) == 0 && zs_coll_bytes_inter(&b) == 0, "reset");
    zs_dev_free(c->dev, d);
    zs_dev_free(c->dev, q);
    zs_dev_free(c->dev, wk);
    free(h);
}

/* Rank r's whole reduce-scatter buffer (size blocks of count), as floats. */
static void fill_rs(float *f, size_t count, int r)
{
    for (size_t i = 0; i < (size_t)g_size * count; i++) {
        uint32_t x = (uint32_t)(i * 2246822519u + (uint32_t)r * 3266489917u);
        f[i] = ((float)(x % 40001) / 20000.0f - 1.0f) * (float)(1 + (i / ZS_QUANT_BLOCK) % 3);
    }
}

/* acc (count fp32) += the dequantized record of src (count of dt), or src
 * exactly when `exact` (a hop with one rank quantizes nothing). */
static void add_q(float *acc, const void *src, zs_dtype_t dt, size_t count, int exact)
{
    size_t rb = zs_quant_record_bytes(count);
    unsigned char *rec = malloc(rb);
    float *x = malloc(count * 4);
    CHECK(rec && x, "no memory");
    if (exact) {
        zs_cast(x, ZS_DTYPE_F32, src, dt, count);
        for (size_t i = 0; i < count; i++)
            acc[i] += x[i];
    } else {
        zs_quant_pack(rec, src, dt, count);
        zs_quant_unpack_add(acc, rec, count);
    }
    free(rec);
    free(x);
}

/* qgZ: zs_coll_reduce_scatter_q8 against the same two hops replayed here
 * from every rank's (regenerated) data, bitwise; and against the exact sum
 * within the bound of the records it went through (MPI, and NCCL through
 * ncclSend/ncclRecv: there the replay holds the CUDA kernels to the CPU
 * twin). */
static void check_rsq8(zs_coll_t *c, zs_dtype_t dt)
{
    zs_err_t err;
    const zs_coll_topo_t *t = zs_coll_topo(c);
    size_t count = ZS_QUANT_BLOCK + 77, es = zs_dtype_size(dt), all = (size_t)g_size * count;
    float *f = malloc(all * 4);
    unsigned char *h = malloc(all * es), *got = malloc(count * es), *want = malloc(count * es);
    CHECK(f && h && got && want, "no memory");
    fill_rs(f, count, g_rank);
    zs_cast(h, dt, f, ZS_DTYPE_F32, all);
    void *d = to_dev(c, h, all * es), *wk = NULL;
    OK(zs_dev_alloc(c->dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, zs_coll_rsq8_work_bytes(c, count), &wk,
                    &err),
       err);
    int rc = zs_coll_reduce_scatter_q8(c, d, count, dt, wk, NULL, NULL, &err);
    if (!c->vt->reduce_scatter_q8) {
        CHECK(rc == ZS_ERR_INVALID && strstr(err.msg, "qgZ"), "%s: rc %d: %s", c->vt->name, rc,
              err.msg);
        zs_dev_free(c->dev, d);
        zs_dev_free(c->dev, wk);
        free(f), free(h), free(got), free(want);
        return;
    }
    OK(rc, err);
    rc = zs_coll_reduce_scatter_q8(zs_coll_intra(c), d, count, dt, wk, NULL, NULL, &err);
    CHECK(rc == ZS_ERR_INVALID, "a sub-communicator's qgZ must be refused");
    to_host(c, got, (char *)d + (size_t)g_rank * count * es, count * es);
    /* replay: acc_k = node k's hop-1 sum of block (node, l) ... */
    int L = t->local_size, N = t->nnodes, l = t->local_rank, node = t->node;
    float *acc = calloc(count, 4), *sum = calloc(count, 4), *fr = malloc(all * 4);
    unsigned char *hr = malloc(all * es), *a16 = malloc(count * 4);
    CHECK(acc && sum && fr && hr && a16, "no memory");
    double exact_max = 0, worst = 0;
    for (int k = 0; k < N; k++) {
        if (N == 1 && k != node)
            continue;
        memset(acc, 0, count * 4);
        for (int i = 0; i < L; i++) { /* rank k*L + i's block node*L + l */
            fill_rs(fr, count, k * L + i);
            zs_cast(hr, dt, fr, ZS_DTYPE_F32, all);
            add_q(acc, hr + ((size_t)node * L + l) * count * es, dt, count, L == 1);
        }
        add_q(sum, acc, ZS_DTYPE_F32, count, N == 1);
    }
    zs_cast(want, dt, sum, ZS_DTYPE_F32, count);
    CHECK(memcmp(want, got, count * es) == 0, "%s: qgZ differs from its replay", zs_dtype_name(dt));
    /* the exact sum of the 16-bit (or fp32) inputs */
    for (size_t e = 0; e < count; e++) {
        double x = 0;
        for (int r = 0; r < g_size; r++) {
            fill_rs(fr, count, r);
            zs_cast(hr, dt, fr + (size_t)g_rank * count + e, ZS_DTYPE_F32, 1);
            float v;
            zs_cast(&v, ZS_DTYPE_F32, hr, dt, 1);
            x += v;
        }
        float y;
        zs_cast(&y, ZS_DTYPE_F32, got + e * es, dt, 1);
        exact_max = fmax(exact_max, fabs(x));
        worst = fmax(worst, fabs(y - x));
    }
    /* each hop's records are within half a step (amax/254) of their input;
     * inputs are at most 3 in size: |err| <= L*3/254 + N*(L*3)/254 + dt's
     * rounding of the sum */
    double bound = (L * 3.0 + N * L * 3.0) / 254.0 + exact_max / 128.0;
    CHECK(worst <= bound, "%s: qgZ error %g > bound %g", zs_dtype_name(dt), worst, bound);
    if (g_rank == 0)
        printf("qgZ %s: bitwise its replay, max error %.4g (bound %.4g, sums up to %.3g)\n",
               zs_dtype_name(dt), worst, bound, exact_max);
    zs_dev_free(c->dev, d);
    zs_dev_free(c->dev, wk);
    free(f), free(h), free(got), free(want), free(acc), free(sum), free(fr), free(hr), free(a16);
}

/* Rank r's block: values of magnitudes varying by block, one inf on rank 1. */
static void fill(float *f, size_t count, int r)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t x = (uint32_t)(i * 2654435761u + (uint32_t)r * 97u);
        f[i] = ((float)(x % 20001) / 10000.0f - 1.0f) * (float)(1 + (i / ZS_QUANT_BLOCK) * 50);
    }
    if (r == 1 % g_size)
        f[3] = INFINITY;
}

static void check_q8(zs_coll_t *c, zs_dtype_t dt)
{
    zs_err_t err;
    size_t count = ZS_QUANT_BLOCK + 905, es = zs_dtype_size(dt), all = (size_t)g_size * count;
    size_t rb = zs_quant_record_bytes(count);
    float *f = malloc(count * 4);
    unsigned char *h = calloc(all, es), *want = malloc(all * es), *got = malloc(all * es);
    unsigned char *rec = malloc(rb);
    CHECK(f && h && want && got && rec, "no memory");
    fill(f, count, g_rank);
    zs_cast(h + (size_t)g_rank * count * es, dt, f, ZS_DTYPE_F32, count);
    void *plain = to_dev(c, h, all * es), *qd = to_dev(c, h, all * es), *q = NULL;
    OK(zs_dev_alloc(c->dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, (size_t)g_size * rb, &q, &err), err);
    OK(zs_coll_all_gather(c, plain, count, dt, NULL, NULL, &err), err);
    OK(zs_coll_all_gather_q8(c, qd, count, dt, q, NULL, NULL, &err), err);
    to_host(c, want, plain, all * es);
    to_host(c, got, qd, all * es);
    for (int r = 0; r < g_size; r++) { /* the plain gather's blocks through the CPU twin */
        unsigned char *blk = want + (size_t)r * count * es;
        zs_quant_pack(rec, blk, dt, count);
        zs_quant_unpack(blk, dt, rec, count, 1);
    }
    CHECK(memcmp(want, got, all * es) == 0, "%s: qwZ gather differs from plain gather + dequant",
          zs_dtype_name(dt));
    /* and it did quantize: some element moved (not a plain gather) */
    to_host(c, h, plain, all * es);
    CHECK(memcmp(h, got, all * es) != 0, "%s: qwZ gather equals the plain one", zs_dtype_name(dt));
    zs_dev_free(c->dev, plain);
    zs_dev_free(c->dev, qd);
    zs_dev_free(c->dev, q);
    free(f);
    free(h);
    free(want);
    free(got);
    free(rec);
}

/* ZS_RANKS_PER_NODE differing between ranks, then one that does not
 * divide the world: create fails on every rank, saying why. */
static void check_refusals(zs_dev_t *dev)
{
    zs_err_t err;
    zs_coll_t *c = NULL;
    const char *orig = getenv("ZS_RANKS_PER_NODE");
    char *save = orig ? strdup(orig) : NULL;
    setenv("ZS_RANKS_PER_NODE", g_rank == 0 ? "1" : "2", 1);
    int rc = zs_coll_mpi_create(dev, &c, &err);
    CHECK((g_size == 1 && rc == ZS_OK) || (rc == ZS_ERR_INVALID && strstr(err.msg, "every rank")),
          "mismatch: rc %d: %s", rc, err.msg);
    zs_coll_destroy(c);
    c = NULL;
    char n[16];
    snprintf(n, sizeof n, "%d", g_size + 1);
    setenv("ZS_RANKS_PER_NODE", n, 1);
    rc = zs_coll_mpi_create(dev, &c, &err);
    CHECK(rc == ZS_ERR_INVALID && strstr(err.msg, "whole nodes"), "N=%s: rc %d: %s", n, rc,
          err.msg);
    if (save)
        setenv("ZS_RANKS_PER_NODE", save, 1);
    else
        unsetenv("ZS_RANKS_PER_NODE");
    free(save);
}

/* ---- a rank killed mid-collective, two levels (NCCL) ---------------------------- */

#define KILL_TIMEOUT_MS 4000
#define KILL_COUNT      ((size_t)8 << 20) /* fp32 elements per rank of the node's all-gather */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: a survivor did not stop within 60 s (hang)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(0);
}

/* The survivors leave together (mpirun ends the job at the first exit
 * without MPI_Finalize): done.<rank> files in $ZS_TEST_ZEROPP_DIR. */
static void exit_barrier(void)
{
    const char *dir = getenv("ZS_TEST_ZEROPP_DIR");
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

/* One rank of the kill run (NCCL, ZS_RANKS_PER_NODE=2): every rank
 * enqueues an all-gather over its node's communicator (large), an
 * all-reduce over its inter-node communicator and one over the world, and
 * the last rank SIGKILLs itself 5 ms later, in the middle of its node's
 * all-gather. Every survivor (its node peer in the all-gather, the ranks
 * of its local rank across nodes, the rest in the world all-reduce) must
 * get an error from zs_coll_sync within the watchdog's deadline (+5 s),
 * and ZS_ERR_STATE from a collective after it. */
static int run_kill_rank(void)
{
    char why[256];
    int ngpu = zs_dev_cuda_available(why, sizeof why);
    if (ngpu < g_size || g_size < 4) {
        if (g_rank == 0)
            printf("SKIPPED: %d rank(s), %d GPU(s): 4 ranks with a GPU each needed\n", g_size,
                   ngpu);
        return 77;
    }
    signal(SIGALRM, on_alarm);
    alarm(60);
    zs_err_t err;
    zs_nccl_boot_t b;
    OK(zs_coll_nccl_bootstrap(&b, &err), err);
    zs_dev_t *d;
    zs_coll_t *c;
    void *big, *small;
    OK(zs_dev_cuda_create(b.local_rank, &d, &err), err);
    OK(zs_coll_nccl_create(d, KILL_TIMEOUT_MS, &c, &err), err);
    zs_coll_t *in = zs_coll_intra(c), *out = zs_coll_inter(c);
    CHECK(in->size == 2 && out->size == g_size / 2, "topology: run with ZS_RANKS_PER_NODE=2");
    OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_COMM, KILL_COUNT * 4 * 2, &big, &err), err);
    OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_COMM, 4096 * 4, &small, &err), err);
    OK(zs_dev_memset(zs_coll_stream(c), big, 0, KILL_COUNT * 8, &err), err);
    OK(zs_dev_memset(zs_coll_stream(c), small, 0, 4096 * 4, &err), err);
    /* a first round that everyone finishes */
    OK(zs_coll_all_gather(in, big, 1024, ZS_DTYPE_F32, NULL, NULL, &err), err);
    OK(zs_coll_all_reduce(out, small, 1024, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    OK(zs_coll_all_reduce(c, small, 1024, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    OK(zs_coll_sync(c, &err), err);
    double t0 = now_s();
    OK(zs_coll_all_gather(in, big, KILL_COUNT, ZS_DTYPE_F32, NULL, NULL, &err), err);
    OK(zs_coll_all_reduce(out, small, 1024, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    OK(zs_coll_all_reduce(c, small, 1024, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    if (g_rank == g_size - 1) {
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
        printf("rank %d: SIGKILL to myself 5 ms into its node's all-gather\n", g_rank);
        fflush(stdout);
        raise(SIGKILL);
    }
    zs_err_clear(&err);
    int rc = zs_coll_sync(c, &err);
    double dt = now_s() - t0;
    printf("rank %d (node %d, local %d): zs_coll_sync returned %s after %.2f s: %s\n", g_rank,
           zs_coll_topo(c)->node, zs_coll_topo(c)->local_rank, zs_status_name(rc), dt, err.msg);
    int fail = 0;
    if (rc == ZS_OK) {
        fprintf(stderr, "FAIL rank %d: no error with a dead peer\n", g_rank);
        fail = 1;
    }
    if (dt > KILL_TIMEOUT_MS / 1000.0 + 5.0) {
        fprintf(stderr, "FAIL rank %d: stopped after %.2f s, deadline %d ms\n", g_rank, dt,
                KILL_TIMEOUT_MS);
        fail = 1;
    }
    /* every communicator this rank shares with the dead one is unusable */
    zs_coll_t *dead_with = g_rank == g_size - 2 ? in : g_rank % 2 == 1 ? out : c;
    rc = zs_coll_all_reduce(dead_with, small, 1, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err);
    if (rc == ZS_OK)
        rc = zs_coll_sync(c, &err);
    if (rc == ZS_OK) {
        fprintf(stderr, "FAIL rank %d: a collective after the failure succeeded\n", g_rank);
        fail = 1;
    }
    double t1 = now_s();
    zs_coll_destroy(c);
    zs_dev_free(d, big);
    zs_dev_free(d, small);
    zs_dev_destroy(d);
    if (!fail)
        printf("rank %d: KILL-PASS: stopped in %.2f s (deadline %d ms), destroy %.2f s\n", g_rank,
               dt, KILL_TIMEOUT_MS, now_s() - t1);
    fflush(stdout);
    fflush(stderr);
    exit_barrier();
    _exit(0); /* no MPI_Finalize with a dead peer; the driver reads the lines */
}

/* The driver (no MPI here): mpirun -np w this kill-rank with a 120 s hard
 * deadline and Open MPI told not to end the job at the first death; passes
 * when w-1 survivors print KILL-PASS and none FAIL. */
static int run_kill_driver(const char *self, int w)
{
    char dir[] = "/tmp/zs_test_zeropp_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    const char *mpiexec = getenv("ZS_MPIEXEC_BIN") ? getenv("ZS_MPIEXEC_BIN") : ZS_MPIEXEC;
    char log[128], cmd[2048];
    snprintf(log, sizeof log, "%s/kill.log", dir);
    snprintf(cmd, sizeof cmd,
             "OMPI_MCA_orte_abort_on_non_zero_status=0 ZS_RANKS_PER_NODE=2 "
             "ZS_TEST_ZEROPP_DIR=%s exec %s -np %d --oversubscribe -x ZS_RANKS_PER_NODE %s "
             "kill-rank > %s 2>&1",
             dir, mpiexec, w, self, log);
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
    while (now_s() - t0 < 120.0) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            done = 1;
            break;
        }
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
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    if (skip)
        return 77;
    printf("test_coll_zeropp kill %d: %d of %d survivors stopped in %.1f s%s\n", w, pass, w - 1,
           now_s() - t0, done ? "" : " (HUNG: mpirun killed at 120 s)");
    return done && !fail && pass == w - 1 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "kill") == 0) { /* the driver: no MPI in this process */
#ifdef ZS_WITH_NCCL
        return run_kill_driver(argv[0], atoi(argv[2]));
#else
        printf("SKIPPED: built without NCCL\n");
        return 77;
#endif
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *mode = argc > 1 ? argv[1] : "mpi";
    zs_err_t err;
    zs_dev_t *dev = NULL;
    zs_coll_t *c = NULL;
    if (strcmp(mode, "kill-rank") == 0) {
#ifdef ZS_WITH_NCCL
        return run_kill_rank();
#else
        return 77;
#endif
    }
    if (strcmp(mode, "nccl") == 0) {
#ifdef ZS_WITH_NCCL
        char why[256];
        int ngpu = zs_dev_cuda_available(why, sizeof why);
        if (ngpu < g_size) {
            if (g_rank == 0)
                printf("SKIPPED: %d rank(s), %d GPU(s): %s\n", g_size, ngpu, why);
            MPI_Finalize();
            return 77;
        }
        zs_nccl_boot_t b;
        OK(zs_coll_nccl_bootstrap(&b, &err), err);
        OK(zs_dev_cuda_create(b.local_rank, &dev, &err), err);
        OK(zs_coll_nccl_create(dev, 60000, &c, &err), err);
#else
        if (g_rank == 0)
            printf("SKIPPED: built without NCCL\n");
        MPI_Finalize();
        return 77;
#endif
    } else {
        OK(zs_dev_cpu_create(1, &dev, &err), err);
        check_refusals(dev);
        OK(zs_coll_mpi_create(dev, &c, &err), err);
    }
    check_topology(c);
    check_counters(c);
    check_q8(c, ZS_DTYPE_F32);
    check_q8(c, ZS_DTYPE_BF16);
    check_q8(c, ZS_DTYPE_F16);
    check_rsq8(c, ZS_DTYPE_F32);
    check_rsq8(c, ZS_DTYPE_BF16);
    zs_coll_destroy(c);
    zs_dev_destroy(dev);
    if (g_rank == 0)
        printf("test_coll_zeropp %s np %d: topology, sub-communicators, byte counters, qwZ gather "
               "ok\n",
               mode, g_size);
    MPI_Finalize();
    return 0;
}
