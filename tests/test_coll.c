/*
 * test_coll.c - the MPI collectives (worker/coll/zs_coll_mpi.c) under mpirun with
 * 1, 2 and 4 ranks (tests/coll.cmake).
 *
 * Exactness: inputs are small integers, so every partial sum is exactly
 * representable in fp32, bf16 and fp16 and any reduction order gives the
 * same exact result, which is checked element by element for every
 * collective, dtype, count (0, 1, odd, 3M), blocking and non-blocking, in
 * place and not, and on the split paths (small max chunk). Determinism is
 * checked separately on random, inexact data: the same reduction run twice
 * gives the same bits, every rank gets the same bits, with 1-2 ranks the bits
 * equal the locally computed fp32-sum-then-round, and with more ranks the
 * error stays within the per-step rounding bound. Also: MAX with NaN, +-0 and
 * Inf; broadcast from every root; several requests in flight waited in a
 * rank-dependent order; pool exhaustion, bad arguments and size overflow give
 * zs errors (no abort); our traffic does not match a user's wildcard receive
 * on MPI_COMM_WORLD; destroy with a request in flight.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "zs_cast.h"
#include "zs_coll.h"

static int g_rank, g_size;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL rank %d %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

#define OK(expr, err)                                                                              \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        CHECK(rc_ == ZS_OK, "returned %d: %s", rc_, (err).msg);                                    \
    } while (0)

/* expr must fail with code `want` and a message mentioning `needle`. */
#define REFUSED(expr, want, needle)                                                                \
    do {                                                                                           \
        zs_err_t e_;                                                                               \
        zs_err_clear(&e_);                                                                         \
        int rc_ = (expr);                                                                          \
        CHECK(rc_ == (want) && e_.code == (want) && strstr(e_.msg, (needle)),                      \
              "expected %s mentioning '%s', got %d (%s): %s", zs_status_name(want), (needle), rc_, \
              zs_status_name(rc_), e_.msg);                                                        \
    } while (0)

static const zs_dtype_t DTYPES[] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};

/* ---- buffers ------------------------------------------------------------------- */

static void *xalloc(size_t n, zs_dtype_t dt)
{
    size_t b = n * zs_dtype_size(dt);
    void *p = malloc(b ? b : 1);
    CHECK(p, "malloc %zu", b);
    memset(p, 0xA5, b); /* garbage that is a finite number in every dtype */
    return p;
}

static void put(void *b, zs_dtype_t dt, size_t i, float v)
{
    if (dt == ZS_DTYPE_F32)
        ((float *)b)[i] = v;
    else if (dt == ZS_DTYPE_BF16)
        ((uint16_t *)b)[i] = zs_f32_to_bf16(v);
    else
        ((uint16_t *)b)[i] = zs_f32_to_f16(v);
}

static float get(const void *b, zs_dtype_t dt, size_t i)
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
static float val(zs_dtype_t dt, int r, size_t i)
{
    uint64_t h = (uint64_t)i * 2654435761u + (uint64_t)r * 40503u + 7;
    if (dt == ZS_DTYPE_F32)
        return (float)((int)(h % 2001) - 1000);
    return (float)((int)(h % 17) - 8);
}

static float sum_over_ranks(zs_dtype_t dt, size_t i)
{
    float s = 0;
    for (int r = 0; r < g_size; r++)
        s += val(dt, r, i);
    return s;
}

static float max_over_ranks(zs_dtype_t dt, size_t i)
{
    float m = -INFINITY;
    for (int r = 0; r < g_size; r++)
        m = fmaxf(m, val(dt, r, i));
    return m;
}

static void expect_eq(const void *b, zs_dtype_t dt, size_t i, float want, const char *what,
                      size_t n)
{
    float got = get(b, dt, i);
    CHECK(got == want, "%s %s n=%zu: element %zu is %g, want %g", what, zs_dtype_name(dt), n, i,
          (double)got, (double)want);
}

/* ---- exact checks of every collective -------------------------------------------- */

/* A started collective (non-blocking) and what to check once it is done. */
typedef enum { K_AR_SUM, K_AR_MAX, K_RS, K_AG, K_BC } kind_t;

typedef struct {
    kind_t kind;
    zs_dtype_t dt;
    size_t n;
    int in_place, root;
    void *send, *recv;
    zs_coll_req_t *req;
} job_t;

static const char *kind_name(kind_t k)
{
    static const char *names[] = {"all_reduce(sum)", "all_reduce(max)", "reduce_scatter",
                                  "all_gather", "broadcast"};
    return names[k];
}

/* Allocate and fill the buffers of job j and start it (req NULL: blocking). */
static void job_start(zs_coll_t *c, job_t *j, int nonblocking)
{
    zs_err_t err;
    size_t n = j->n;
    zs_coll_req_t **req = nonblocking ? &j->req : NULL;
    j->req = NULL;
    switch (j->kind) {
    case K_AR_SUM:
    case K_AR_MAX:
        j->send = xalloc(n, j->dt);
        for (size_t i = 0; i < n; i++)
            put(j->send, j->dt, i, val(j->dt, g_rank, i));
        j->recv = j->in_place ? j->send : xalloc(n, j->dt);
        OK(zs_coll_all_reduce(c, j->send, j->recv, n, j->dt,
                              j->kind == K_AR_SUM ? ZS_OP_SUM : ZS_OP_MAX, req, &err),
           err);
        break;
    case K_RS:
        j->send = xalloc(n * (size_t)g_size, j->dt);
        for (size_t i = 0; i < n * (size_t)g_size; i++)
            put(j->send, j->dt, i, val(j->dt, g_rank, i));
        j->recv = xalloc(n, j->dt);
        OK(zs_coll_reduce_scatter(c, j->send, j->recv, n, j->dt, req, &err), err);
        break;
    case K_AG:
        j->recv = xalloc(n * (size_t)g_size, j->dt);
        if (j->in_place) {
            j->send = (char *)j->recv + (size_t)g_rank * n * zs_dtype_size(j->dt);
        } else {
            j->send = xalloc(n, j->dt);
        }
        for (size_t i = 0; i < n; i++)
            put(j->send, j->dt, i, val(j->dt, g_rank, i));
        OK(zs_coll_all_gather(c, j->send, j->recv, n, j->dt, req, &err), err);
        break;
    case K_BC:
        j->send = xalloc(n, j->dt);
        if (g_rank == j->root)
            for (size_t i = 0; i < n; i++)
                put(j->send, j->dt, i, val(j->dt, j->root, i));
        j->recv = j->send;
        OK(zs_coll_broadcast(c, j->send, n, j->dt, j->root, req, &err), err);
        break;
    }
}

/* Check the result of job j exactly and free its buffers. */
static void job_check(job_t *j)
{
    size_t n = j->n;
    const char *what = kind_name(j->kind);
    switch (j->kind) {
    case K_AR_SUM:
        for (size_t i = 0; i < n; i++)
            expect_eq(j->recv, j->dt, i, sum_over_ranks(j->dt, i), what, n);
        break;
    case K_AR_MAX:
        for (size_t i = 0; i < n; i++)
            expect_eq(j->recv, j->dt, i, max_over_ranks(j->dt, i), what, n);
        break;
    case K_RS:
        for (size_t i = 0; i < n; i++)
            expect_eq(j->recv, j->dt, i, sum_over_ranks(j->dt, (size_t)g_rank * n + i), what, n);
        break;
    case K_AG:
        for (int r = 0; r < g_size; r++)
            for (size_t i = 0; i < n; i++)
                expect_eq(j->recv, j->dt, (size_t)r * n + i, val(j->dt, r, i), what, n);
        break;
    case K_BC:
        for (size_t i = 0; i < n; i++)
            expect_eq(j->recv, j->dt, i, val(j->dt, j->root, i), what, n);
        break;
    }
    if (j->kind == K_AG && j->in_place) { /* send lies inside recv */
        free(j->recv);
    } else {
        if (j->recv != j->send)
            free(j->recv);
        free(j->send);
    }
}

static void run_one(zs_coll_t *c, kind_t kind, zs_dtype_t dt, size_t n, int in_place, int root,
                    int nonblocking)
{
    zs_err_t err;
    job_t j = {.kind = kind, .dt = dt, .n = n, .in_place = in_place, .root = root};
    job_start(c, &j, nonblocking);
    if (nonblocking) {
        CHECK(j.req != NULL, "non-blocking %s gave no request", kind_name(kind));
        OK(zs_coll_wait(c, j.req, &err), err);
    }
    job_check(&j);
}

/* Every collective x dtype x count x blocking/non-blocking x in place. */
static void test_exact(zs_coll_t *c, const size_t *counts, size_t ncounts)
{
    for (size_t d = 0; d < 3; d++) {
        zs_dtype_t dt = DTYPES[d];
        for (size_t k = 0; k < ncounts; k++) {
            size_t n = counts[k];
            for (int nb = 0; nb < 2; nb++) {
                for (int ip = 0; ip < 2; ip++) {
                    run_one(c, K_AR_SUM, dt, n, ip, 0, nb);
                    run_one(c, K_AR_MAX, dt, n, ip, 0, nb);
                    run_one(c, K_AG, dt, n, ip, 0, nb);
                }
                run_one(c, K_RS, dt, n, 0, 0, nb);
                for (int root = 0; root < g_size; root++)
                    run_one(c, K_BC, dt, n, 0, root, nb);
            }
        }
    }
}

/* Large buffers (3M elements), blocking and not, all dtypes. */
static void test_large(zs_coll_t *c)
{
    const size_t big = 3000001;
    for (size_t d = 0; d < 3; d++) {
        zs_dtype_t dt = DTYPES[d];
        run_one(c, K_AR_SUM, dt, big, d == 1, 0, d != 0);
        run_one(c, K_RS, dt, big / (size_t)g_size + 1, 0, 0, d == 2);
        run_one(c, K_AG, dt, big / (size_t)g_size + 3, d != 1, 0, d == 0);
        run_one(c, K_BC, dt, big, 0, g_size - 1, d == 1);
    }
    run_one(c, K_AR_MAX, ZS_DTYPE_BF16, big, 0, 0, 1);
}

/* Eight collectives in flight at once, waited in an order that differs per
 * rank. */
static void test_inflight(zs_coll_t *c)
{
    zs_err_t err;
    job_t jobs[] = {
        {.kind = K_AR_SUM, .dt = ZS_DTYPE_F32, .n = 4099, .in_place = 1},
        {.kind = K_AR_SUM, .dt = ZS_DTYPE_BF16, .n = 77777},
        {.kind = K_RS, .dt = ZS_DTYPE_F16, .n = 1001},
        {.kind = K_AG, .dt = ZS_DTYPE_BF16, .n = 3, .in_place = 1},
        {.kind = K_BC, .dt = ZS_DTYPE_F32, .n = 12345, .root = g_size - 1},
        {.kind = K_AR_MAX, .dt = ZS_DTYPE_F16, .n = 1},
        {.kind = K_RS, .dt = ZS_DTYPE_F32, .n = 1},
        {.kind = K_AG, .dt = ZS_DTYPE_F32, .n = 0},
    };
    const int nj = (int)(sizeof jobs / sizeof jobs[0]);
    for (int i = 0; i < nj; i++)
        job_start(c, &jobs[i], 1);
    for (int k = 0; k < nj; k++) {
        job_t *j = &jobs[(k * 3 + g_rank) % nj]; /* 3 is coprime with 8: a permutation */
        OK(zs_coll_wait(c, j->req, &err), err);
    }
    for (int i = 0; i < nj; i++)
        job_check(&jobs[i]);
}

/* Small max chunk: every split path (pieces, resized all-gather type,
 * per-rank reduces for reduce-scatter), also with 1-element pieces. */
static void test_split(zs_coll_t *c)
{
    zs_err_t err;
    OK(zs_coll_mpi_set_max_chunk(c, 1000, &err), err);
    const size_t counts[] = {999, 1000, 1001, 2500};
    test_exact(c, counts, 4);
    test_inflight(c); /* up to 78 pieces per request */
    OK(zs_coll_mpi_set_max_chunk(c, 1, &err), err);
    const size_t tiny[] = {1, 2, 5};
    test_exact(c, tiny, 3);
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
        void *mx = xalloc(N, dt), *sm = xalloc(N, dt);
        float nan_in = -__builtin_nanf("0x123"); /* non-canonical NaN */
        int last = g_size - 1;
        put(mx, dt, 0, g_rank == 0 ? nan_in : 1.0f); /* NaN wins */
        put(mx, dt, 1, -0.0f);                       /* all -0 -> -0 */
        put(mx, dt, 2, g_rank == 0 ? 0.0f : -0.0f);  /* +0 beats -0 */
        put(mx, dt, 3, g_rank == last ? INFINITY : (float)g_rank);
        put(mx, dt, 4, g_rank == 0 ? -5.0f : -INFINITY); /* -5 */
        put(mx, dt, 5, g_rank == last ? nan_in : -INFINITY);
        put(mx, dt, 6, g_rank == last ? 0.0f : -0.0f); /* +0 beats -0, whatever the order */
        OK(zs_coll_all_reduce(c, mx, mx, N, dt, ZS_OP_MAX, NULL, &err), err);
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

        put(sm, dt, 0, g_rank == last ? nan_in : 2.0f);
        put(sm, dt, 1, g_rank == 0 ? INFINITY : 1.0f);
        put(sm, dt, 2, -0.0f);
        put(sm, dt, 3, 0.5f);
        put(sm, dt, 4, g_rank == 0 ? INFINITY : -INFINITY);
        put(sm, dt, 5, 1.0f);
        put(sm, dt, 6, 3.0f);
        OK(zs_coll_all_reduce(c, sm, sm, N, dt, ZS_OP_SUM, NULL, &err), err);
        CHECK(isnan(get(sm, dt, 0)), "%s sum NaN", zs_dtype_name(dt));
        if (g_size > 1 && dt != ZS_DTYPE_F32) /* fp32 uses MPI_SUM: payload not canonical */
            CHECK(bits(sm, dt, 0) == canon[d], "%s sum NaN not canonical: %#x", zs_dtype_name(dt),
                  bits(sm, dt, 0));
        CHECK(get(sm, dt, 1) == INFINITY, "%s sum inf", zs_dtype_name(dt));
        CHECK(get(sm, dt, 2) == 0 && signbit(get(sm, dt, 2)), "%s sum of -0", zs_dtype_name(dt));
        CHECK(get(sm, dt, 3) == 0.5f * (float)g_size, "%s sum 0.5", zs_dtype_name(dt));
        CHECK(g_size == 1 ? get(sm, dt, 4) == INFINITY : isnan(get(sm, dt, 4)), "%s inf - inf",
              zs_dtype_name(dt));
        free(mx);
        free(sm);
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

/* Every rank's bits of buf (n elements of dt) are the same as rank 0's. */
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
static void check_sum(void **inputs, zs_dtype_t dt, size_t gi, float got, const char *what)
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
            inputs[r] = xalloc(n, dt);
            rand_fill(inputs[r], dt, n, r);
        }
        void *in = inputs[g_rank], *a = xalloc(n, dt), *b = xalloc(n, dt);
        zs_coll_req_t *rq;
        OK(zs_coll_all_reduce(c, in, a, n, dt, ZS_OP_SUM, NULL, &err), err);
        OK(zs_coll_all_reduce(c, in, b, n, dt, ZS_OP_SUM, &rq, &err), err);
        OK(zs_coll_wait(c, rq, &err), err);
        CHECK(memcmp(a, b, n * es) == 0, "%s all_reduce not bitwise repeatable", zs_dtype_name(dt));
        same_on_all_ranks(a, n, dt, "all_reduce");
        for (size_t i = 0; i < n; i++)
            check_sum(inputs, dt, i, get(a, dt, i), "all_reduce");

        void *rs1 = xalloc(rc, dt), *rs2 = xalloc(rc, dt);
        OK(zs_coll_reduce_scatter(c, in, rs1, rc, dt, NULL, &err), err);
        OK(zs_coll_reduce_scatter(c, in, rs2, rc, dt, &rq, &err), err);
        OK(zs_coll_wait(c, rq, &err), err);
        CHECK(memcmp(rs1, rs2, rc * es) == 0, "%s reduce_scatter not bitwise repeatable",
              zs_dtype_name(dt));
        for (size_t i = 0; i < rc; i++)
            check_sum(inputs, dt, (size_t)g_rank * rc + i, get(rs1, dt, i), "reduce_scatter");

        for (int r = 0; r < g_size; r++)
            free(inputs[r]);
        free(inputs);
        free(rs1);
        free(rs2);
        free(a);
        free(b);
    }
}

/* ---- errors ---------------------------------------------------------------------- */

static void test_errors(zs_coll_t *c)
{
    zs_err_t err;
    float buf[64] = {0};
    zs_coll_req_t *rq;
    const zs_dtype_t none = ZS_DTYPE_NONE;

    REFUSED(zs_coll_all_reduce(c, buf, buf, 4, none, ZS_OP_SUM, NULL, &e_), ZS_ERR_INVALID,
            "dtype");
    REFUSED(zs_coll_reduce_scatter(c, buf, buf + 32, 1, none, NULL, &e_), ZS_ERR_INVALID, "dtype");
    REFUSED(zs_coll_all_gather(c, buf, buf + 32, 1, none, NULL, &e_), ZS_ERR_INVALID, "dtype");
    REFUSED(zs_coll_broadcast(c, buf, 4, none, 0, NULL, &e_), ZS_ERR_INVALID, "dtype");
    REFUSED(zs_coll_all_reduce(c, buf, buf, 4, ZS_DTYPE_F32, (zs_coll_op_t)7, NULL, &e_),
            ZS_ERR_INVALID, "op 7");
    REFUSED(zs_coll_broadcast(c, buf, 4, ZS_DTYPE_F32, g_size, &rq, &e_), ZS_ERR_INVALID, "root");
    REFUSED(zs_coll_broadcast(c, buf, 4, ZS_DTYPE_F32, -1, NULL, &e_), ZS_ERR_INVALID, "root");
    /* sizes whose bytes overflow size_t */
    REFUSED(zs_coll_all_reduce(c, buf, buf, SIZE_MAX / 2, ZS_DTYPE_F32, ZS_OP_SUM, NULL, &e_),
            ZS_ERR_RANGE, "overflows");
    REFUSED(zs_coll_reduce_scatter(c, buf, buf + 32, SIZE_MAX / 3, ZS_DTYPE_F32, &rq, &e_),
            ZS_ERR_RANGE, "overflows");
    REFUSED(zs_coll_all_gather(c, buf, buf + 32, SIZE_MAX / 3, ZS_DTYPE_F32, NULL, &e_),
            ZS_ERR_RANGE, "overflows");
    REFUSED(zs_coll_broadcast(c, buf, SIZE_MAX / 3, ZS_DTYPE_F32, 0, NULL, &e_), ZS_ERR_RANGE,
            "overflows");
    /* buffers */
    REFUSED(zs_coll_all_reduce(c, NULL, buf, 4, ZS_DTYPE_F32, ZS_OP_SUM, NULL, &e_), ZS_ERR_INVALID,
            "NULL");
    REFUSED(zs_coll_broadcast(c, NULL, 4, ZS_DTYPE_F32, 0, NULL, &e_), ZS_ERR_INVALID, "NULL");
    REFUSED(zs_coll_reduce_scatter(c, buf, buf, 1, ZS_DTYPE_F32, NULL, &e_), ZS_ERR_INVALID,
            "send == recv");
    REFUSED(zs_coll_reduce_scatter(c, buf + 1, buf, 2, ZS_DTYPE_F32, NULL, &e_), ZS_ERR_INVALID,
            "overlap");
    REFUSED(zs_coll_all_reduce(c, buf, buf + 1, 4, ZS_DTYPE_F32, ZS_OP_SUM, NULL, &e_),
            ZS_ERR_INVALID, "overlap");
    {
        float *ag = calloc(4 * (size_t)g_size + 1, sizeof(float));
        CHECK(ag, "calloc");
        REFUSED(zs_coll_all_gather(c, ag + (size_t)g_rank * 4 + 1, ag, 4, ZS_DTYPE_F32, NULL, &e_),
                ZS_ERR_INVALID, "in place");
        free(ag);
    }
    /* requests */
    REFUSED(zs_coll_wait(c, NULL, &e_), ZS_ERR_INVALID, "NULL request");
    REFUSED(zs_coll_wait(c, (zs_coll_req_t *)(void *)buf, &e_), ZS_ERR_INVALID,
            "not from this communicator");
    REFUSED(zs_coll_mpi_set_max_chunk(c, 0, &e_), ZS_ERR_INVALID, "outside");
    REFUSED(zs_coll_mpi_set_max_chunk(c, ((size_t)1 << 30) + 1, &e_), ZS_ERR_INVALID, "outside");

    /* pool exhaustion: 16 in flight, the 17th is refused, blocking calls still work */
    enum { K = ZS_COLL_MAX_INFLIGHT };
    float *data = malloc(sizeof(float) * K * 8);
    zs_coll_req_t *reqs[K];
    CHECK(data, "malloc");
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < 8; i++)
            data[k * 8 + i] = (float)(k + i + g_rank);
        OK(zs_coll_all_reduce(c, data + k * 8, data + k * 8, 8, ZS_DTYPE_F32, ZS_OP_SUM, &reqs[k],
                              &err),
           err);
    }
    REFUSED(zs_coll_all_reduce(c, buf, buf, 4, ZS_DTYPE_F32, ZS_OP_SUM, &rq, &e_), ZS_ERR_BUSY,
            "in flight");
    REFUSED(zs_coll_mpi_set_max_chunk(c, 10, &e_), ZS_ERR_STATE, "in flight");
    run_one(c, K_AR_SUM, ZS_DTYPE_BF16, 33, 0, 0, 0); /* blocking, pool full */
    for (int k = K - 1; k >= 0; k--)
        OK(zs_coll_wait(c, reqs[k], &err), err);
    REFUSED(zs_coll_wait(c, reqs[3], &e_), ZS_ERR_INVALID, "not in flight");
    for (int k = 0; k < K; k++)
        for (int i = 0; i < 8; i++) {
            float want = 0;
            for (int r = 0; r < g_size; r++)
                want += (float)(k + i + r);
            CHECK(data[k * 8 + i] == want, "pool all_reduce %d/%d: %g != %g", k, i,
                  (double)data[k * 8 + i], (double)want);
        }
    free(data);

    /* a NULL error record is allowed */
    CHECK(zs_coll_all_reduce(c, buf, buf, 4, none, ZS_OP_SUM, NULL, NULL) == ZS_ERR_INVALID,
          "NULL err");
    /* the communicator still works after all the refusals */
    run_one(c, K_AR_SUM, ZS_DTYPE_F16, 5, 1, 0, 1);
    OK(zs_coll_barrier(c, &err), err);
}

/* ---- isolation, lifetime ------------------------------------------------------------ */

/* A wildcard receive posted by the user on MPI_COMM_WORLD is not matched by
 * our collectives (they run on a dup'ed communicator). */
static void test_isolation(zs_coll_t *c)
{
    MPI_Request user = MPI_REQUEST_NULL;
    int got = -1, flag = 0;
    if (g_rank == 0)
        MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &user);
    run_one(c, K_AR_SUM, ZS_DTYPE_F32, 1000, 0, 0, 1);
    run_one(c, K_RS, ZS_DTYPE_BF16, 100, 0, 0, 0);
    run_one(c, K_AG, ZS_DTYPE_F16, 100, 1, 0, 1);
    run_one(c, K_BC, ZS_DTYPE_F32, 100, 0, 0, 0);
    zs_err_t err;
    OK(zs_coll_barrier(c, &err), err);
    if (g_rank == 0) {
        MPI_Test(&user, &flag, MPI_STATUS_IGNORE);
        CHECK(!flag, "the user's wildcard receive matched collective traffic (got %d)", got);
    }
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

/* A second communicator, destroyed with a request in flight: destroy waits. */
static void test_destroy_inflight(void)
{
    zs_err_t err;
    zs_coll_t *c2 = NULL;
    OK(zs_coll_mpi_create(&c2, &err), err);
    CHECK(c2->rank == g_rank && c2->size == g_size, "second communicator rank/size");
    job_t j = {.kind = K_AR_SUM, .dt = ZS_DTYPE_BF16, .n = 5000};
    job_start(c2, &j, 1);
    zs_coll_destroy(c2);
    job_check(&j);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    double t0 = now_s();

    zs_err_t err;
    zs_coll_t *c = NULL;
    REFUSED(zs_coll_mpi_create(NULL, &e_), ZS_ERR_INVALID, "out is NULL");
    OK(zs_coll_mpi_create(&c, &err), err);
    CHECK(strcmp(c->vt->name, "mpi") == 0, "name %s", c->vt->name);
    CHECK(c->rank == g_rank && c->size == g_size, "rank %d size %d", c->rank, c->size);
    OK(zs_coll_barrier(c, &err), err);

    const size_t counts[] = {0, 1, 2, 3, 5, 17, 1000, 65537};
    double t = now_s();
#define PHASE(call)                                                                                \
    do {                                                                                           \
        call;                                                                                      \
        if (g_rank == 0)                                                                           \
            printf("  %-28s %.2f s\n", #call, now_s() - t);                                        \
        t = now_s();                                                                               \
    } while (0)
    PHASE(test_exact(c, counts, sizeof counts / sizeof counts[0]));
    PHASE(test_special(c));
    PHASE(test_inflight(c));
    PHASE(test_large(c));
    PHASE(test_split(c));
    PHASE(test_determinism(c));
    PHASE(test_errors(c));
    PHASE(test_isolation(c));
    PHASE(test_destroy_inflight());

    OK(zs_coll_barrier(c, &err), err);
    zs_coll_destroy(c);
    double dt = now_s() - t0;
    if (g_rank == 0)
        printf("PASS test_coll: %d ranks (%.1f s)\n", g_size, dt);
    MPI_Finalize();
    return 0;
}
