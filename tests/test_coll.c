/*
 * test_coll.c - the stream collectives over Open MPI (worker/coll/zs_coll.c,
 * zs_coll_mpi.c) on the CPU device, under mpirun with 1, 2 and 4 ranks
 * (tests/coll.cmake). MPI is initialised with MPI_THREAD_SERIALIZED; the
 * test calls MPI itself only while the communicator's stream is idle. On the
 * CPU device, device memory is host memory, so the test fills and reads the
 * buffers directly, and only while no stream work uses them.
 *
 * Exactness: inputs are small integers, so every partial sum is exactly
 * representable in fp32, bf16 and fp16 and any reduction order gives the
 * same exact result, which is checked element by element for every
 * collective, dtype, count (0, 1, odd, 3M), synchronising after each
 * collective and after a batch of them, and on the split paths (small max
 * chunk). Every buffer has guard zones on both sides that must stay
 * untouched. Layout: reduce-scatter leaves the block at buf + rank*count
 * (single call and pieces), all-gather fills the other ranks' blocks around
 * ours. Determinism on random, inexact data: the same reduction twice gives
 * the same bits, every rank gets the same bits, with 1-2 ranks the bits equal
 * the locally computed fp32-sum-then-round, with more ranks the error stays
 * within the per-step rounding bound. MAX with NaN, +-0 and Inf; broadcast
 * from every root.
 *
 * Stream ordering, sticky errors, host helpers and refusals are in
 * test_coll_stream.c (same program). Here also: our traffic does not match a
 * user's wildcard receive on MPI_COMM_WORLD; destroy waits for queued
 * work. With --funneled: create refuses an MPI below MPI_THREAD_SERIALIZED.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "test_coll.h"
#include "zs_cast.h"
#include "zs_coll.h"

int g_rank, g_size;
zs_dev_t *g_dev;

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- device buffers with guard zones --------------------------------------------- */

dbuf_t dbuf_new(size_t n, zs_dtype_t dt)
{
    zs_err_t err;
    dbuf_t b = {.n = n, .dt = dt};
    size_t es = zs_dtype_size(dt), bytes = (n + 2 * GUARD) * es;
    void *base = NULL;
    OK(zs_dev_alloc(g_dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &base, &err), err);
    memset(base, GUARD_BYTE, bytes);
    b.base = base;
    b.p = b.base + GUARD * es;
    return b;
}

/* The guard zones are untouched; then free. */
void dbuf_free(dbuf_t *b, const char *what)
{
    size_t es = zs_dtype_size(b->dt);
    const unsigned char *tail = b->base + (GUARD + b->n) * es;
    for (size_t i = 0; i < GUARD * es; i++) {
        CHECK(b->base[i] == GUARD_BYTE, "%s %s n=%zu: guard byte %zu before the buffer is %#x",
              what, zs_dtype_name(b->dt), b->n, i, b->base[i]);
        CHECK(tail[i] == GUARD_BYTE, "%s %s n=%zu: guard byte %zu after the buffer is %#x", what,
              zs_dtype_name(b->dt), b->n, i, tail[i]);
    }
    zs_dev_free(g_dev, b->base);
    b->base = b->p = NULL;
}

void put(void *b, zs_dtype_t dt, size_t i, float v)
{
    if (dt == ZS_DTYPE_F32)
        ((float *)b)[i] = v;
    else if (dt == ZS_DTYPE_BF16)
        ((uint16_t *)b)[i] = zs_f32_to_bf16(v);
    else
        ((uint16_t *)b)[i] = zs_f32_to_f16(v);
}

float get(const void *b, zs_dtype_t dt, size_t i)
{
    if (dt == ZS_DTYPE_F32)
        return ((const float *)b)[i];
    if (dt == ZS_DTYPE_BF16)
        return zs_bf16_to_f32(((const uint16_t *)b)[i]);
    return zs_f16_to_f32(((const uint16_t *)b)[i]);
}

static uint32_t bits(const void *b, zs_dtype_t dt, size_t i)
{
    if (dt == ZS_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, (const float *)b + i, 4);
        return u;
    }
    return ((const uint16_t *)b)[i];
}

/* Integer data of rank r at index i: |v| <= 8 for 16-bit types (sums over 4
 * ranks stay exact), |v| <= 1000 for fp32. */
float val(zs_dtype_t dt, int r, size_t i)
{
    uint64_t h = (uint64_t)i * 2654435761u + (uint64_t)r * 40503u + 7;
    if (dt == ZS_DTYPE_F32)
        return (float)((int)(h % 2001) - 1000);
    return (float)((int)(h % 17) - 8);
}

float sum_over_ranks(zs_dtype_t dt, size_t i)
{
    float s = 0;
    for (int r = 0; r < g_size; r++)
        s += val(dt, r, i);
    return s;
}

float max_over_ranks(zs_dtype_t dt, size_t i)
{
    float m = -INFINITY;
    for (int r = 0; r < g_size; r++)
        m = fmaxf(m, val(dt, r, i));
    return m;
}

void expect_eq(const void *b, zs_dtype_t dt, size_t i, float want, const char *what, size_t n)
{
    float got = get(b, dt, i);
    CHECK(got == want, "%s %s n=%zu: element %zu is %g, want %g", what, zs_dtype_name(dt), n, i,
          (double)got, (double)want);
}

/* ---- exact checks of every collective -------------------------------------------- */

/* One enqueued collective and what to check once the stream has run it. */
typedef struct {
    kind_t kind;
    zs_dtype_t dt;
    size_t n; /* the collective's count (per-rank block for RS and AG) */
    int root;
    dbuf_t b;
} job_t;

static const char *kind_name(kind_t k)
{
    static const char *names[] = {"all_reduce(sum)", "all_reduce(max)", "reduce_scatter",
                                  "all_gather", "broadcast"};
    return names[k];
}

/* Allocate and fill the buffer of job j and enqueue it (no after, no done). */
static void job_start(zs_coll_t *c, job_t *j)
{
    zs_err_t err;
    size_t n = j->n, whole = n * (size_t)g_size, es = zs_dtype_size(j->dt);
    switch (j->kind) {
    case K_AR_SUM:
    case K_AR_MAX:
        j->b = dbuf_new(n, j->dt);
        for (size_t i = 0; i < n; i++)
            put(j->b.p, j->dt, i, val(j->dt, g_rank, i));
        OK(zs_coll_all_reduce(c, j->b.p, n, j->dt, j->kind == K_AR_SUM ? ZS_OP_SUM : ZS_OP_MAX,
                              NULL, NULL, &err),
           err);
        break;
    case K_RS:
        j->b = dbuf_new(whole, j->dt);
        for (size_t i = 0; i < whole; i++)
            put(j->b.p, j->dt, i, val(j->dt, g_rank, i));
        OK(zs_coll_reduce_scatter(c, j->b.p, n, j->dt, NULL, NULL, &err), err);
        break;
    case K_AG: { /* other ranks' blocks hold garbage until gathered */
        j->b = dbuf_new(whole, j->dt);
        char *mine = (char *)j->b.p + (size_t)g_rank * n * es;
        for (size_t i = 0; i < n; i++)
            put(mine, j->dt, i, val(j->dt, g_rank, i));
        OK(zs_coll_all_gather(c, j->b.p, n, j->dt, NULL, NULL, &err), err);
        break;
    }
    case K_BC:
        j->b = dbuf_new(n, j->dt);
        if (g_rank == j->root)
            for (size_t i = 0; i < n; i++)
                put(j->b.p, j->dt, i, val(j->dt, j->root, i));
        OK(zs_coll_broadcast(c, j->b.p, n, j->dt, j->root, NULL, NULL, &err), err);
        break;
    }
}

/* Check the result of job j exactly (its stream work has run), its guard
 * zones, and free it. */
static void job_check(job_t *j)
{
    size_t n = j->n, es = zs_dtype_size(j->dt);
    const char *what = kind_name(j->kind);
    const void *p = j->b.p;
    switch (j->kind) {
    case K_AR_SUM:
        for (size_t i = 0; i < n; i++)
            expect_eq(p, j->dt, i, sum_over_ranks(j->dt, i), what, n);
        break;
    case K_AR_MAX:
        for (size_t i = 0; i < n; i++)
            expect_eq(p, j->dt, i, max_over_ranks(j->dt, i), what, n);
        break;
    case K_RS: { /* our block of the sum at buf + rank*n */
        const char *mine = (const char *)p + (size_t)g_rank * n * es;
        for (size_t i = 0; i < n; i++)
            expect_eq(mine, j->dt, i, sum_over_ranks(j->dt, (size_t)g_rank * n + i), what, n);
        break;
    }
    case K_AG:
        for (int r = 0; r < g_size; r++)
            for (size_t i = 0; i < n; i++)
                expect_eq(p, j->dt, (size_t)r * n + i, val(j->dt, r, i), what, n);
        break;
    case K_BC:
        for (size_t i = 0; i < n; i++)
            expect_eq(p, j->dt, i, val(j->dt, j->root, i), what, n);
        break;
    }
    dbuf_free(&j->b, what);
}

void run_one(zs_coll_t *c, kind_t kind, zs_dtype_t dt, size_t n, int root)
{
    zs_err_t err;
    job_t j = {.kind = kind, .dt = dt, .n = n, .root = root};
    job_start(c, &j);
    OK(zs_coll_sync(c, &err), err);
    job_check(&j);
}

/* Every collective x dtype x count, each synchronised on its own, then all of
 * one (dtype, count) enqueued back to back and synchronised once. */
static void test_exact(zs_coll_t *c, const size_t *counts, size_t ncounts)
{
    zs_err_t err;
    for (size_t d = 0; d < 3; d++) {
        zs_dtype_t dt = DTYPES[d];
        for (size_t k = 0; k < ncounts; k++) {
            size_t n = counts[k];
            run_one(c, K_AR_SUM, dt, n, 0);
            run_one(c, K_AR_MAX, dt, n, 0);
            run_one(c, K_RS, dt, n, 0);
            run_one(c, K_AG, dt, n, 0);
            for (int root = 0; root < g_size; root++)
                run_one(c, K_BC, dt, n, root);

            job_t jobs[4 + 4] = {
                {.kind = K_AR_SUM}, {.kind = K_AR_MAX}, {.kind = K_RS}, {.kind = K_AG}};
            int nj = 4;
            for (int root = 0; root < g_size && root < 4; root++)
                jobs[nj++] = (job_t){.kind = K_BC, .root = root};
            for (int i = 0; i < nj; i++) {
                jobs[i].dt = dt;
                jobs[i].n = n;
                job_start(c, &jobs[i]);
            }
            OK(zs_coll_sync(c, &err), err);
            for (int i = 0; i < nj; i++)
                job_check(&jobs[i]);
        }
    }
}

/* Large buffers (3M elements), all dtypes. */
static void test_large(zs_coll_t *c)
{
    const size_t big = 3000001;
    for (size_t d = 0; d < 3; d++) {
        zs_dtype_t dt = DTYPES[d];
        run_one(c, K_AR_SUM, dt, big, 0);
        run_one(c, K_RS, dt, big / (size_t)g_size + 1, 0);
        run_one(c, K_AG, dt, big / (size_t)g_size + 3, 0);
        run_one(c, K_BC, dt, big, g_size - 1);
    }
    run_one(c, K_AR_MAX, ZS_DTYPE_BF16, big, 0);
}

/* Small max chunk: every split path (pieces, resized all-gather type,
 * per-destination reduces for reduce-scatter), also with 1-element pieces. */
static void test_split(zs_coll_t *c)
{
    zs_err_t err;
    OK(zs_coll_mpi_set_max_chunk(c, 1000, &err), err);
    const size_t counts[] = {999, 1000, 1001, 2500};
    test_exact(c, counts, 4);
    OK(zs_coll_mpi_set_max_chunk(c, 1, &err), err);
    const size_t tiny[] = {1, 2, 5};
    test_exact(c, tiny, 3);
    OK(zs_coll_mpi_set_max_chunk(c, (size_t)1 << 30, &err), err);
}

/* ---- in-place layouts -------------------------------------------------------------- */

/* Reduce-scatter: block r of the input is distinct per rank and per block;
 * after it, exactly buf + rank*count holds our block's sum (not buf, unless
 * rank 0), and nothing outside buf (size*count) was written. All-gather: the
 * other blocks start as NaN; after it every block is its rank's data and
 * ours is unchanged. Single call and pieces (chunk 3), two counts. */
static void test_layout(zs_coll_t *c)
{
    zs_err_t err;
    const size_t counts[] = {5, 64};
    for (int split = 0; split < 2; split++) {
        OK(zs_coll_mpi_set_max_chunk(c, split ? 3 : (size_t)1 << 30, &err), err);
        for (size_t d = 0; d < 3; d++) {
            zs_dtype_t dt = DTYPES[d];
            size_t es = zs_dtype_size(dt);
            for (size_t k = 0; k < 2; k++) {
                size_t n = counts[k], whole = n * (size_t)g_size;
                dbuf_t rs = dbuf_new(whole, dt), ag = dbuf_new(whole, dt);
                /* element i of block r on rank q: 16 * r + q + (i % 4), exact */
                for (int r = 0; r < g_size; r++)
                    for (size_t i = 0; i < n; i++)
                        put(rs.p, dt, (size_t)r * n + i, (float)(16 * r + g_rank + (int)(i % 4)));
                for (size_t i = 0; i < whole; i++)
                    put(ag.p, dt, i, NAN);
                for (size_t i = 0; i < n; i++)
                    put(ag.p, dt, (size_t)g_rank * n + i, (float)(16 * g_rank + (int)i % 7));
                OK(zs_coll_reduce_scatter(c, rs.p, n, dt, NULL, NULL, &err), err);
                OK(zs_coll_all_gather(c, ag.p, n, dt, NULL, NULL, &err), err);
                OK(zs_coll_sync(c, &err), err);
                const char *mine = (const char *)rs.p + (size_t)g_rank * n * es;
                for (size_t i = 0; i < n; i++) {
                    float want = 0;
                    for (int q = 0; q < g_size; q++)
                        want += (float)(16 * g_rank + q + (int)(i % 4));
                    CHECK(get(mine, dt, i) == want,
                          "reduce_scatter %s n=%zu split=%d: buf[rank*count + %zu] = %g, want %g",
                          zs_dtype_name(dt), n, split, i, (double)get(mine, dt, i), (double)want);
                }
                for (int r = 0; r < g_size; r++)
                    for (size_t i = 0; i < n; i++) {
                        float want = (float)(16 * r + (int)i % 7);
                        float got = get(ag.p, dt, (size_t)r * n + i);
                        CHECK(got == want,
                              "all_gather %s n=%zu split=%d: block %d [%zu] = %g, want %g",
                              zs_dtype_name(dt), n, split, r, i, (double)got, (double)want);
                    }
                dbuf_free(&rs, "reduce_scatter layout");
                dbuf_free(&ag, "all_gather layout");
            }
        }
    }
    OK(zs_coll_mpi_set_max_chunk(c, (size_t)1 << 30, &err), err);
}

/* ---- MAX and SUM special values --------------------------------------------------- */

static void test_special(zs_coll_t *c)
{
    zs_err_t err;
    const uint32_t canon[] = {0x7FC00000u, 0x7FC0u, 0x7E00u};
    for (size_t d = 0; d < 3; d++) {
        zs_dtype_t dt = DTYPES[d];
        enum { N = 7 };
        dbuf_t bm = dbuf_new(N, dt), bs = dbuf_new(N, dt);
        void *mx = bm.p, *sm = bs.p;
        float nan_in = -__builtin_nanf("0x123"); /* non-canonical NaN */
        int last = g_size - 1;
        put(mx, dt, 0, g_rank == 0 ? nan_in : 1.0f); /* NaN wins */
        put(mx, dt, 1, -0.0f);                       /* all -0 -> -0 */
        put(mx, dt, 2, g_rank == 0 ? 0.0f : -0.0f);  /* +0 beats -0 */
        put(mx, dt, 3, g_rank == last ? INFINITY : (float)g_rank);
        put(mx, dt, 4, g_rank == 0 ? -5.0f : -INFINITY); /* -5 */
        put(mx, dt, 5, g_rank == last ? nan_in : -INFINITY);
        put(mx, dt, 6, g_rank == last ? 0.0f : -0.0f); /* +0 beats -0, whatever the order */
        put(sm, dt, 0, g_rank == last ? nan_in : 2.0f);
        put(sm, dt, 1, g_rank == 0 ? INFINITY : 1.0f);
        put(sm, dt, 2, -0.0f);
        put(sm, dt, 3, 0.5f);
        put(sm, dt, 4, g_rank == 0 ? INFINITY : -INFINITY);
        put(sm, dt, 5, 1.0f);
        put(sm, dt, 6, 3.0f);
        OK(zs_coll_all_reduce(c, mx, N, dt, ZS_OP_MAX, NULL, NULL, &err), err);
        OK(zs_coll_all_reduce(c, sm, N, dt, ZS_OP_SUM, NULL, NULL, &err), err);
        OK(zs_coll_sync(c, &err), err);

        CHECK(isnan(get(mx, dt, 0)) && isnan(get(mx, dt, 5)), "%s max NaN", zs_dtype_name(dt));
        if (g_size > 1)
            CHECK(bits(mx, dt, 0) == canon[d] && bits(mx, dt, 5) == canon[d],
                  "%s max NaN not canonical: %#x", zs_dtype_name(dt), bits(mx, dt, 0));
        CHECK(get(mx, dt, 1) == 0 && signbit(get(mx, dt, 1)), "%s max(-0..) sign",
              zs_dtype_name(dt));
        CHECK(get(mx, dt, 2) == 0 && !signbit(get(mx, dt, 2)), "%s max(+0,-0) is not +0",
              zs_dtype_name(dt));
        CHECK(get(mx, dt, 6) == 0 && !signbit(get(mx, dt, 6)), "%s max(-0,+0) is not +0",
              zs_dtype_name(dt));
        CHECK(get(mx, dt, 3) == INFINITY, "%s max inf", zs_dtype_name(dt));
        CHECK(get(mx, dt, 4) == -5.0f, "%s max -5: %g", zs_dtype_name(dt), (double)get(mx, dt, 4));

        CHECK(isnan(get(sm, dt, 0)), "%s sum NaN", zs_dtype_name(dt));
        if (g_size > 1 && dt != ZS_DTYPE_F32) /* fp32 uses MPI_SUM: payload not canonical */
            CHECK(bits(sm, dt, 0) == canon[d], "%s sum NaN not canonical: %#x", zs_dtype_name(dt),
                  bits(sm, dt, 0));
        CHECK(get(sm, dt, 1) == INFINITY, "%s sum inf", zs_dtype_name(dt));
        CHECK(get(sm, dt, 2) == 0 && signbit(get(sm, dt, 2)), "%s sum of -0", zs_dtype_name(dt));
        CHECK(get(sm, dt, 3) == 0.5f * (float)g_size, "%s sum 0.5", zs_dtype_name(dt));
        CHECK(g_size == 1 ? get(sm, dt, 4) == INFINITY : isnan(get(sm, dt, 4)), "%s inf - inf",
              zs_dtype_name(dt));
        dbuf_free(&bm, "max special");
        dbuf_free(&bs, "sum special");
    }
}

/* ---- determinism on inexact data ------------------------------------------------------ */

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* Random data of rank r: mixed signs and exponents 2^-6 .. 2^6, rounded into dt. */
static void rand_fill(void *b, zs_dtype_t dt, size_t n, int r)
{
    uint64_t s = 0x9E3779B97F4A7C15ull ^ ((uint64_t)r << 32) ^ (uint64_t)dt;
    for (size_t i = 0; i < n; i++) {
        uint64_t u = lcg(&s);
        float m = 1.0f + (float)(u & 0xFFFFFF) / 16777216.0f;
        int e = (int)((u >> 24) % 13) - 6;
        float v = ldexpf(m, e) * ((u >> 40) & 1 ? -1.0f : 1.0f);
        put(b, dt, i, v);
    }
}

/* v rounded to dt (to nearest even), as a float. */
static float round_to(zs_dtype_t dt, float v)
{
    if (dt == ZS_DTYPE_BF16)
        return zs_bf16_to_f32(zs_f32_to_bf16(v));
    if (dt == ZS_DTYPE_F16)
        return zs_f16_to_f32(zs_f32_to_f16(v));
    return v;
}

/* Every rank's bits of buf (n elements of dt) are the same as rank 0's. Calls
 * MPI on this thread: the communicator's stream must be idle. */
static void same_on_all_ranks(const void *buf, size_t n, zs_dtype_t dt, const char *what)
{
    size_t bytes = n * zs_dtype_size(dt);
    unsigned char *all = g_rank == 0 ? malloc(bytes * (size_t)g_size) : NULL;
    CHECK(bytes <= (size_t)INT32_MAX && (g_rank != 0 || all), "gather buffer");
    MPI_Gather(buf, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
        for (int r = 1; r < g_size; r++)
            CHECK(memcmp(all, all + (size_t)r * bytes, bytes) == 0,
                  "%s %s: rank %d has different bits than rank 0", what, zs_dtype_name(dt), r);
        free(all);
    }
}

/* Result element `got` of a sum over ranks of element gi of `inputs`: with
 * 1-2 ranks exactly the fp32-sum-then-round (one commutative step), with
 * more within (size - 1) roundings of the exact sum. */
static void check_sum(void **inputs, zs_dtype_t dt, size_t gi, float got, const char *what,
                      double *maxerr)
{
    if (g_size <= 2) {
        float want = get(inputs[0], dt, gi);
        if (g_size == 2)
            want = round_to(dt, want + get(inputs[1], dt, gi));
        CHECK(got == want, "%s %s element %zu: %g, want fp32-sum-then-round %g", what,
              zs_dtype_name(dt), gi, (double)got, (double)want);
        return;
    }
    double u = dt == ZS_DTYPE_F32    ? ldexp(1, -24)
               : dt == ZS_DTYPE_BF16 ? ldexp(1, -8)
                                     : ldexp(1, -11);
    double exact = 0, mag = 0;
    for (int r = 0; r < g_size; r++) {
        double x = get(inputs[r], dt, gi);
        exact += x;
        mag += fabs(x);
    }
    double bound = (g_size - 1) * u * mag * 1.01, e = fabs((double)got - exact);
    if (e / (mag > 0 ? mag : 1) > *maxerr)
        *maxerr = e / (mag > 0 ? mag : 1);
    CHECK(e <= bound, "%s %s element %zu: %g vs exact %g, error %g > bound %g", what,
          zs_dtype_name(dt), gi, (double)got, exact, e, bound);
}

/* Inexact random data: bitwise repeatable, same bits on every rank, and the
 * expected value per element. */
static void test_determinism(zs_coll_t *c)
{
    zs_err_t err;
    const size_t n = 100003, rc = n / (size_t)g_size;
    for (size_t d = 0; d < 3; d++) {
        zs_dtype_t dt = DTYPES[d];
        size_t es = zs_dtype_size(dt);
        void **inputs = malloc(sizeof(void *) * (size_t)g_size);
        CHECK(inputs, "malloc");
        for (int r = 0; r < g_size; r++) {
            inputs[r] = malloc(n * es);
            CHECK(inputs[r], "malloc");
            rand_fill(inputs[r], dt, n, r);
        }
        const void *in = inputs[g_rank];
        dbuf_t a = dbuf_new(n, dt), b = dbuf_new(n, dt);
        memcpy(a.p, in, n * es);
        memcpy(b.p, in, n * es);
        OK(zs_coll_all_reduce(c, a.p, n, dt, ZS_OP_SUM, NULL, NULL, &err), err);
        OK(zs_coll_all_reduce(c, b.p, n, dt, ZS_OP_SUM, NULL, NULL, &err), err);
        OK(zs_coll_sync(c, &err), err);
        CHECK(memcmp(a.p, b.p, n * es) == 0, "%s all_reduce not bitwise repeatable",
              zs_dtype_name(dt));
        same_on_all_ranks(a.p, n, dt, "all_reduce");
        double maxerr = 0;
        for (size_t i = 0; i < n; i++)
            check_sum(inputs, dt, i, get(a.p, dt, i), "all_reduce", &maxerr);

        /* reduce-scatter over the first rc * size elements */
        dbuf_t s1 = dbuf_new(rc * (size_t)g_size, dt), s2 = dbuf_new(rc * (size_t)g_size, dt);
        memcpy(s1.p, in, rc * (size_t)g_size * es);
        memcpy(s2.p, in, rc * (size_t)g_size * es);
        OK(zs_coll_reduce_scatter(c, s1.p, rc, dt, NULL, NULL, &err), err);
        OK(zs_coll_reduce_scatter(c, s2.p, rc, dt, NULL, NULL, &err), err);
        OK(zs_coll_sync(c, &err), err);
        size_t off = (size_t)g_rank * rc;
        CHECK(memcmp((char *)s1.p + off * es, (char *)s2.p + off * es, rc * es) == 0,
              "%s reduce_scatter not bitwise repeatable", zs_dtype_name(dt));
        for (size_t i = 0; i < rc; i++)
            check_sum(inputs, dt, off + i, get(s1.p, dt, off + i), "reduce_scatter", &maxerr);
        if (g_rank == 0 && g_size > 2)
            printf("    determinism %s: max relative error %.3g (bound %d roundings)\n",
                   zs_dtype_name(dt), maxerr, g_size - 1);

        for (int r = 0; r < g_size; r++)
            free(inputs[r]);
        free(inputs);
        dbuf_free(&a, "determinism");
        dbuf_free(&b, "determinism");
        dbuf_free(&s1, "determinism");
        dbuf_free(&s2, "determinism");
    }
}

/* ---- isolation, lifetime ------------------------------------------------------------ */

/* A wildcard receive posted by the user on MPI_COMM_WORLD is not matched by
 * our collectives (they run on a dup'ed communicator). The user's MPI calls
 * are made while the communicator's stream is idle (SERIALIZED). */
static void test_isolation(zs_coll_t *c)
{
    MPI_Request user = MPI_REQUEST_NULL;
    int got = -1, flag = 0;
    if (g_rank == 0)
        MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &user);
    job_t jobs[] = {{.kind = K_AR_SUM, .dt = ZS_DTYPE_F32, .n = 1000},
                    {.kind = K_RS, .dt = ZS_DTYPE_BF16, .n = 100},
                    {.kind = K_AG, .dt = ZS_DTYPE_F16, .n = 100},
                    {.kind = K_BC, .dt = ZS_DTYPE_F32, .n = 100}};
    for (int i = 0; i < 4; i++)
        job_start(c, &jobs[i]);
    zs_err_t err;
    OK(zs_coll_barrier(c, &err), err);
    for (int i = 0; i < 4; i++)
        job_check(&jobs[i]);
    if (g_rank == 0) {
        MPI_Test(&user, &flag, MPI_STATUS_IGNORE);
        CHECK(!flag, "the user's wildcard receive matched collective traffic (got %d)", got);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* the user's own message only after the test above */
    if (g_rank == g_size - 1) {
        int v = 42;
        MPI_Request s;
        MPI_Isend(&v, 1, MPI_INT, 0, 5, MPI_COMM_WORLD, &s);
        if (g_rank == 0)
            MPI_Wait(&user, MPI_STATUS_IGNORE);
        MPI_Wait(&s, MPI_STATUS_IGNORE);
    } else if (g_rank == 0) {
        MPI_Wait(&user, MPI_STATUS_IGNORE);
    }
    if (g_rank == 0)
        CHECK(got == 42, "user message %d", got);
}

/* A second communicator, destroyed with collectives queued behind a 30 ms
 * sleep: destroy waits for them. */
static int sleep_fn(void *args, zs_err_t *err)
{
    sleep_ms(*(const int *)args);
    return ZS_OK;
}

static void test_destroy_queued(void)
{
    zs_err_t err;
    zs_coll_t *c2 = NULL;
    OK(zs_coll_mpi_create(g_dev, &c2, &err), err);
    CHECK(c2->rank == g_rank && c2->size == g_size, "second communicator rank/size");
    int ms = 30;
    OK(zs_dev_host_fn(zs_coll_stream(c2), sleep_fn, &ms, sizeof ms, &err), err);
    job_t j = {.kind = K_AR_SUM, .dt = ZS_DTYPE_BF16, .n = 5000};
    job_t k = {.kind = K_AG, .dt = ZS_DTYPE_F32, .n = 33};
    job_start(c2, &j);
    job_start(c2, &k);
    zs_coll_destroy(c2);
    job_check(&j);
    job_check(&k);
}

/* --funneled: MPI at MPI_THREAD_FUNNELED is refused with a clear message. */
static int run_funneled(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    zs_err_t err;
    OK(zs_dev_cpu_create(1, &g_dev, &err), err);
    if (provided >= MPI_THREAD_SERIALIZED) {
        printf("SKIP test_coll --funneled: MPI gave thread level %d\n", provided);
    } else {
        zs_coll_t *c = NULL;
        REFUSED(zs_coll_mpi_create(g_dev, &c, &e_), ZS_ERR_STATE, "MPI_THREAD_SERIALIZED");
        CHECK(c == NULL, "out set on refusal");
        printf("PASS test_coll --funneled: refused\n");
    }
    zs_dev_destroy(g_dev);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--funneled") == 0)
        return run_funneled(argc, argv);
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI thread level %d", provided);
    double t0 = now_s();

    zs_err_t err;
    OK(zs_dev_cpu_create(1, &g_dev, &err), err);
    zs_coll_t *c = NULL;
    OK(zs_coll_mpi_create(g_dev, &c, &err), err);
    CHECK(strcmp(c->vt->name, "mpi") == 0, "name %s", c->vt->name);
    CHECK(c->rank == g_rank && c->size == g_size, "rank %d size %d", c->rank, c->size);
    CHECK(c->dev == g_dev && c->stream && c->after_ev, "communicator fields");
    OK(zs_coll_barrier(c, &err), err);

    const size_t counts[] = {0, 1, 2, 3, 5, 17, 1000, 65537};
    double t = now_s();
#define PHASE(call)                                                                                \
    do {                                                                                           \
        call;                                                                                      \
        OK(zs_coll_barrier(c, &err), err);                                                         \
        if (g_rank == 0)                                                                           \
            printf("  %-28s %.2f s\n", #call, now_s() - t);                                        \
        t = now_s();                                                                               \
    } while (0)
    PHASE(test_exact(c, counts, sizeof counts / sizeof counts[0]));
    PHASE(test_layout(c));
    PHASE(test_special(c));
    PHASE(test_large(c));
    PHASE(test_split(c));
    PHASE(test_determinism(c));
    PHASE(test_after(c));
    PHASE(test_done(c));
    PHASE(test_sticky(c));
    PHASE(test_host(c));
    PHASE(test_errors(c));
    PHASE(test_group(c));
    PHASE(test_isolation(c));
    PHASE(test_destroy_queued());

    OK(zs_coll_barrier(c, &err), err);
    zs_coll_destroy(c);
    zs_dev_destroy(g_dev);
    double dt = now_s() - t0;
    if (g_rank == 0)
        printf("PASS test_coll: %d ranks (%.1f s)\n", g_size, dt);
    MPI_Finalize();
    return 0;
}
