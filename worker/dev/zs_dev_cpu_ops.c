/*
 * zs_dev_cpu_ops.c - the CPU device's vector ops (see zs_dev.h for their
 * contracts, zs_dev_cpu.c for the streams that run them).
 *
 * What it does: validates and queues cast, accumulate, scale, sumsq and
 * AdamW tasks, and runs them on the stream's thread. Elementwise ops split
 * into fixed chunks over the device's zs_pool, so results are bitwise the
 * same for any thread count; sums go through fp32 stack buffers of BLK
 * elements and round once to the destination type. sumsq adds fp64
 * partial sums in a fixed order (8 lanes per chunk, chunks in order), so
 * its bits do not depend on the thread count either.
 * sumsq's lanes run on AVX2 where the CPU has it (bitwise the scalar loop).
 * What it does not do: overlap checks for accumulate (dst == src is fine,
 * partial overlap is the caller's problem), other SIMD of its own (zs_cast
 * and zs_adam_update bring theirs).
 */
#include <math.h>
#include <string.h>

#include <immintrin.h>

#include "zs_cast.h"
#include "zs_dev_cpu_internal.h"
#include "zs_simd.h"

/* Vector ops run [i0, i1) of a task on one thread; elementwise ops split a
 * task into chunks of VEC_CHUNK elements (a multiple of BLK) over the pool. */
#define VEC_CHUNK ((size_t)32768)
#define BLK       256 /* elements converted at a time through stack buffers */

static void vec_range(const zs_cpu_task_t *t, size_t i0, size_t i1)
{
    size_t n = i1 - i0;
    switch (t->kind) {
    case ZS_CPU_T_CAST: {
        size_t ds = zs_dtype_size(t->u.vec.ddt), ss = zs_dtype_size(t->u.vec.sdt);
        zs_cast((char *)t->u.vec.dst + i0 * ds, t->u.vec.ddt, (const char *)t->u.vec.src + i0 * ss,
                t->u.vec.sdt, n);
        break;
    }
    case ZS_CPU_T_ROUND: { /* through the cache: BLK elements out and back */
        float *x = (float *)t->u.vec.dst + i0;
        char *h = (char *)t->u.vec.src + i0 * 2;
        for (size_t k = 0; k < n; k += BLK) {
            size_t m = n - k < BLK ? n - k : BLK;
            zs_cast(h + k * 2, t->u.vec.sdt, x + k, ZS_DTYPE_F32, m);
            zs_cast(x + k, ZS_DTYPE_F32, h + k * 2, t->u.vec.sdt, m);
        }
        break;
    }
    case ZS_CPU_T_ACC: {
        zs_dtype_t ddt = t->u.vec.ddt, sdt = t->u.vec.sdt;
        char *dst = (char *)t->u.vec.dst + i0 * zs_dtype_size(ddt);
        const char *src = (const char *)t->u.vec.src + i0 * zs_dtype_size(sdt);
        if (ddt == ZS_DTYPE_F32 && sdt == ZS_DTYPE_F32) {
            float *d = (float *)dst;
            const float *s = (const float *)src;
            for (size_t i = 0; i < n; i++)
                d[i] += s[i];
            break;
        }
        float a[BLK], b[BLK];
        for (size_t k = 0; k < n; k += BLK) {
            size_t m = n - k < BLK ? n - k : BLK;
            float *pa = ddt == ZS_DTYPE_F32 ? (float *)dst + k : a;
            const float *pb = b;
            if (ddt != ZS_DTYPE_F32)
                zs_cast(a, ZS_DTYPE_F32, dst + k * 2, ddt, m);
            if (sdt == ZS_DTYPE_F32)
                pb = (const float *)src + k;
            else
                zs_cast(b, ZS_DTYPE_F32, src + k * 2, sdt, m);
            for (size_t i = 0; i < m; i++)
                pa[i] += pb[i];
            if (ddt != ZS_DTYPE_F32)
                zs_cast(dst + k * 2, ddt, a, ZS_DTYPE_F32, m);
        }
        break;
    }
    case ZS_CPU_T_SCALE: {
        zs_dtype_t dt = t->u.vec.ddt;
        float alpha = t->u.vec.alpha;
        char *x = (char *)t->u.vec.dst + i0 * zs_dtype_size(dt);
        if (dt == ZS_DTYPE_F32) {
            float *f = (float *)x;
            for (size_t i = 0; i < n; i++)
                f[i] *= alpha;
            break;
        }
        float a[BLK];
        for (size_t k = 0; k < n; k += BLK) {
            size_t m = n - k < BLK ? n - k : BLK;
            zs_cast(a, ZS_DTYPE_F32, x + k * 2, dt, m);
            for (size_t i = 0; i < m; i++)
                a[i] *= alpha;
            zs_cast(x + k * 2, dt, a, ZS_DTYPE_F32, m);
        }
        break;
    }
    case ZS_CPU_T_ADAMW: {
        size_t gs = zs_dtype_size(t->u.adam.gdt), os = zs_dtype_size(t->u.adam.odt);
        void *out = t->u.adam.out ? (char *)t->u.adam.out + i0 * os : NULL;
        zs_adam_update(&t->u.adam.hp, &t->u.adam.st, t->u.adam.p + i0, t->u.adam.m + i0,
                       t->u.adam.v + i0, (const char *)t->u.adam.grad + i0 * gs, t->u.adam.gdt, out,
                       out ? t->u.adam.odt : ZS_DTYPE_NONE, n);
        break;
    }
    }
}

typedef struct vjob {
    const zs_cpu_task_t *t;
    size_t n;
} vjob_t;

static void vjob_fn(void *arg, size_t chunk, int thread)
{
    const vjob_t *j = arg;
    size_t i0 = chunk * VEC_CHUNK;
    size_t i1 = j->n - i0 < VEC_CHUNK ? j->n : i0 + VEC_CHUNK;
    vec_range(j->t, i0, i1);
}

/* An elementwise op over all its n elements, chunked over the pool. */
static void vec_run(zs_cpu_dev_t *dev, const zs_cpu_task_t *t, size_t n)
{
    if (!dev->pool || n <= VEC_CHUNK) {
        vec_range(t, 0, n);
        return;
    }
    vjob_t j = {t, n};
    zs_pool_run(dev->pool, (n + VEC_CHUNK - 1) / VEC_CHUNK, vjob_fn, &j);
}

/* Sum of squares of x[i0, i1) in fp64 (x rounded to fp32 first): 8 lanes,
 * lane l summing the elements i with (i - i0) % 8 == l in order, the lanes
 * then added in lane order. Eight independent chains let the loop run at
 * memory speed instead of one fp64 add latency per element. */
/* lane[j] += v[i]^2 for i = j mod 8, i < m (m a multiple of 8), in order:
 * the scalar loop's operations lane by lane (the fp64 product of two floats
 * is exact, the additions are the same), 8 lanes as two AVX vectors. */
__attribute__((target("avx2"))) static void sumsq_lanes_avx2(const float *v, size_t m,
                                                             double lane[8])
{
    __m256d a0 = _mm256_loadu_pd(lane), a1 = _mm256_loadu_pd(lane + 4);
    for (size_t i = 0; i < m; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(lo, lo));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(hi, hi));
    }
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
}

static zs_simd_choice_t sumsq_path = ZS_SIMD_AUTO;

static double sumsq_range(const void *src, zs_dtype_t dt, size_t i0, size_t i1)
{
    double lane[8] = {0};
    float a[BLK];
    int vec = zs__simd_path(&sumsq_path) != ZS_SIMD_PORTABLE;
    for (size_t k = i0; k < i1; k += BLK) {
        size_t m = i1 - k < BLK ? i1 - k : BLK, i = 0;
        const float *v = a;
        if (dt == ZS_DTYPE_F32)
            v = (const float *)src + k;
        else
            zs_cast(a, ZS_DTYPE_F32, (const char *)src + k * 2, dt, m);
        if (vec) {
            i = m & ~(size_t)7;
            sumsq_lanes_avx2(v, i, lane);
        }
        for (; i < m; i++) /* BLK is a multiple of 8: lanes stay aligned */
            lane[i & 7] += (double)v[i] * v[i];
    }
    double s = 0.0;
    for (int l = 0; l < 8; l++)
        s += lane[l];
    return s;
}

#define SUMSQ_BATCH 64 /* chunks summed in parallel before their partials are added */

typedef struct sjob {
    const zs_cpu_task_t *t;
    size_t first; /* chunk index of part[0] */
    double part[SUMSQ_BATCH];
} sjob_t;

static void sjob_fn(void *arg, size_t j, int thread)
{
    sjob_t *s = arg;
    size_t n = s->t->u.vec.n, i0 = (s->first + j) * VEC_CHUNK;
    size_t i1 = n - i0 < VEC_CHUNK ? n : i0 + VEC_CHUNK;
    s->part[j] = sumsq_range(s->t->u.vec.src, s->t->u.vec.sdt, i0, i1);
}

/* acc[0] += the sum of the chunks' sums (chunks of VEC_CHUNK elements, see
 * sumsq_range), added in chunk order: the same bits for any thread count.
 * Every finite fp32 square is below 1.2e77, so a finite sum of any
 * practical length never overflows fp64: the sum is non-finite exactly when
 * some element is, which gives the flag without a test per element. */
static void sumsq_run(zs_cpu_dev_t *dev, const zs_cpu_task_t *t)
{
    size_t n = t->u.vec.n, nchunks = (n + VEC_CHUNK - 1) / VEC_CHUNK;
    sjob_t job;
    job.t = t;
    double s = 0.0;
    for (job.first = 0; job.first < nchunks; job.first += SUMSQ_BATCH) {
        size_t m = nchunks - job.first < SUMSQ_BATCH ? nchunks - job.first : SUMSQ_BATCH;
        if (dev->pool && m > 1)
            zs_pool_run(dev->pool, m, sjob_fn, &job);
        else
            for (size_t j = 0; j < m; j++)
                sjob_fn(&job, j, 0);
        for (size_t j = 0; j < m; j++)
            s += job.part[j];
    }
    t->u.vec.acc[0] += s;
    if (!isfinite(s))
        t->u.vec.acc[1] = 1.0;
}

/* See zs_dev_cpu_internal.h. */
/* ZS_CPU_T_ROWS on the stream's thread: rows are short (one model width),
 * and the exact conversion gives the same bits in any order. */
static void rows_run(const zs_cpu_task_t *t)
{
    size_t w = t->u.rows.width, ss = zs_dtype_size(t->u.rows.sdt);
    for (size_t i = 0; i < t->u.rows.n; i++) {
        int32_t v = t->u.rows.idx[i];
        if (v >= t->u.rows.lo && v < t->u.rows.hi)
            zs_cast(t->u.rows.dst + i * w, ZS_DTYPE_F32,
                    (const char *)t->u.rows.src + (size_t)(v - t->u.rows.lo) * w * ss,
                    t->u.rows.sdt, w);
    }
}

void zs__cpu_vec_exec(zs_cpu_dev_t *dev, const zs_cpu_task_t *t)
{
    if (t->kind == ZS_CPU_T_ROWS)
        rows_run(t);
    else if (t->kind == ZS_CPU_T_SUMSQ)
        sumsq_run(dev, t);
    else if (t->kind == ZS_CPU_T_ADAMW)
        vec_run(dev, t, t->u.adam.n);
    else
        vec_run(dev, t, t->u.vec.n);
}

/* ---- enqueueing ------------------------------------------------------------ */

/* ZS_OK when dt is F32, BF16 or F16 (and, with allow_none, NONE). */
static int check_dtype(const char *fn, const char *what, int dt, int allow_none, zs_err_t *err)
{
    if (dt == ZS_DTYPE_F32 || dt == ZS_DTYPE_BF16 || dt == ZS_DTYPE_F16 ||
        (allow_none && dt == ZS_DTYPE_NONE))
        return ZS_OK;
    return zs_err_set(err, ZS_ERR_INVALID, "%s: %s dtype %d is not fp32, bf16 or fp16%s", fn, what,
                      dt, allow_none ? " or none" : "");
}

/* n elements of 4 bytes must fit in size_t (so every byte offset does). */
static int check_n(const char *fn, size_t n, zs_err_t *err)
{
    if (n > SIZE_MAX / 4)
        return zs_err_set(err, ZS_ERR_RANGE, "%s: %zu elements overflow the address space", fn, n);
    return ZS_OK;
}

/* Queue a vector task of `kind` on sb with these fields (a kind ignores
 * the ones it does not use: see zs_cpu_task_t). */
static int vec_enqueue(zs_stream_t *sb, int kind, void *dst, zs_dtype_t ddt, const void *src,
                       zs_dtype_t sdt, float alpha, double *acc, size_t n, zs_err_t *err)
{
    zs_cpu_task_t *t = zs__cpu_task_new(kind, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.vec.dst = dst;
    t->u.vec.ddt = ddt;
    t->u.vec.src = src;
    t->u.vec.sdt = sdt;
    t->u.vec.alpha = alpha;
    t->u.vec.acc = acc;
    t->u.vec.n = n;
    return zs__cpu_enqueue(sb, t, err);
}

/* Cast (ZS_CPU_T_CAST) or accumulate (ZS_CPU_T_ACC) n elements of src
 * (sdt) into dst (ddt), named fn in refusals. Only cast refuses
 * overlapping buffers (accumulate in place is allowed, see above). */
static int pair_op(zs_stream_t *sb, int kind, const char *fn, void *dst, zs_dtype_t ddt,
                   const void *src, zs_dtype_t sdt, size_t n, zs_err_t *err)
{
    int rc;
    if ((rc = check_dtype(fn, "destination", ddt, 0, err)) ||
        (rc = check_dtype(fn, "source", sdt, 0, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (n == 0)
        return ZS_OK;
    if (!dst || !src)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", fn, dst ? "src" : "dst");
    if (kind == ZS_CPU_T_CAST) {
        uintptr_t d0 = (uintptr_t)dst, d1 = d0 + n * zs_dtype_size(ddt);
        uintptr_t s0 = (uintptr_t)src, s1 = s0 + n * zs_dtype_size(sdt);
        if (d0 < s1 && s0 < d1)
            return zs_err_set(err, ZS_ERR_INVALID, "%s: dst and src overlap", fn);
    }
    return vec_enqueue(sb, kind, dst, ddt, src, sdt, 0.0f, NULL, n, err);
}

int zs__cpu_cast(zs_stream_t *sb, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                 size_t n, zs_err_t *err)
{
    return pair_op(sb, ZS_CPU_T_CAST, "zs_dev_cast", dst, ddt, src, sdt, n, err);
}

int zs__cpu_accumulate(zs_stream_t *sb, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                       size_t n, zs_err_t *err)
{
    return pair_op(sb, ZS_CPU_T_ACC, "zs_dev_accumulate", dst, ddt, src, sdt, n, err);
}

int zs__cpu_round(zs_stream_t *sb, float *x, void *h, zs_dtype_t dt, size_t n, zs_err_t *err)
{
    return vec_enqueue(sb, ZS_CPU_T_ROUND, x, ZS_DTYPE_F32, h, dt, 0.0f, NULL, n, err);
}

int zs__cpu_cast_rows(zs_stream_t *sb, float *dst, const void *src, zs_dtype_t sdt,
                      const int32_t *idx, size_t n, int32_t lo, int32_t hi, size_t width,
                      zs_err_t *err)
{
    zs_cpu_task_t *t = zs__cpu_task_new(ZS_CPU_T_ROWS, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.rows.dst = dst;
    t->u.rows.src = src;
    t->u.rows.sdt = sdt;
    t->u.rows.idx = idx;
    t->u.rows.n = n;
    t->u.rows.width = width;
    t->u.rows.lo = lo;
    t->u.rows.hi = hi;
    return zs__cpu_enqueue(sb, t, err);
}

int zs__cpu_scale(zs_stream_t *sb, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err)
{
    static const char fn[] = "zs_dev_scale";
    int rc;
    if ((rc = check_dtype(fn, "x", dt, 0, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (n == 0)
        return ZS_OK;
    if (!x)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: x is NULL", fn);
    return vec_enqueue(sb, ZS_CPU_T_SCALE, x, dt, NULL, dt, alpha, NULL, n, err);
}

int zs__cpu_sumsq(zs_stream_t *sb, const void *x, zs_dtype_t dt, size_t n, double *acc,
                  zs_err_t *err)
{
    static const char fn[] = "zs_dev_sumsq";
    int rc;
    if ((rc = check_dtype(fn, "x", dt, 0, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (!acc)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: acc is NULL", fn);
    if (n == 0)
        return ZS_OK;
    if (!x)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: x is NULL", fn);
    return vec_enqueue(sb, ZS_CPU_T_SUMSQ, NULL, dt, x, dt, 0.0f, acc, n, err);
}

int zs__cpu_adamw(zs_stream_t *sb, const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p,
                  float *m, float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t odt,
                  size_t n, zs_err_t *err)
{
    static const char fn[] = "zs_dev_adamw";
    int rc;
    if (!hp || !st)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", fn, hp ? "step" : "hparams");
    if ((rc = check_dtype(fn, "gradient", gdt, 0, err)) ||
        (rc = check_dtype(fn, "output", odt, 1, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (n == 0)
        return ZS_OK;
    if (!p || !m || !v || !grad)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", fn,
                          !p   ? "p"
                          : !m ? "m"
                          : !v ? "v"
                               : "grad");
    zs_cpu_task_t *t = zs__cpu_task_new(ZS_CPU_T_ADAMW, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.adam.hp = *hp; /* copied: the caller's structs may change before the task runs */
    t->u.adam.st = *st;
    t->u.adam.p = p;
    t->u.adam.m = m;
    t->u.adam.v = v;
    t->u.adam.grad = grad;
    t->u.adam.gdt = gdt;
    t->u.adam.out = odt == ZS_DTYPE_NONE ? NULL : out;
    t->u.adam.odt = out ? odt : ZS_DTYPE_NONE;
    t->u.adam.n = n;
    return zs__cpu_enqueue(sb, t, err);
}
