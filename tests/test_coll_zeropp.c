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
 *     of the records it went through (MPI; NCCL refuses it), a
 *     sub-communicator's refused.
 *
 * What it does not test: the engine's use of it (test_engine_zeropp.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
 * within the bound of the records it went through. NCCL: refused. */
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

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *mode = argc > 1 ? argv[1] : "mpi";
    zs_err_t err;
    zs_dev_t *dev = NULL;
    zs_coll_t *c = NULL;
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
