/*
 * test_cuda_ops.c - every CUDA kernel of kernels/cuda against its CPU twin,
 * on a GPU. Without a usable GPU it prints "SKIPPED: <reason>" and exits 77
 * (registered with SKIP_RETURN_CODE 77: ctest shows it as skipped, never as
 * passed); the argument checks of the launchers, which touch no GPU, run
 * first in every case.
 *
 * On a GPU:
 *   vector ops  zs_cuda_cast / accumulate / scale / adamw bitwise against the
 *               CPU (zs_cast, zs_adam_update, and the zs_dev element
 *               semantics written with zs_math.h) for every dtype pair;
 *               zs_cuda_sumsq against a long double CPU sum (rel 1e-12), the
 *               non-finite flag, and bitwise repeats
 *   GPT ops     each zs_cuda_* op against zs_op_* (kernels/zs_gpt_ops.h) on
 *               the test model's shapes and a GPT-2-width one: bitwise where
 *               zs_cuda_gpt.h promises it (embedding, residual, the column
 *               sums when N <= ZS_CUDA_COLSUM_ROWS, fused vs separate
 *               cross-entropy), else |gpu - cpu| <= atol * max|cpu| +
 *               rtol * |cpu| with the figures printed; and every op run
 *               twice from the same inputs is bitwise equal (determinism)
 *   mixed       the bf16 / fp16 GEMM ops (*_mixed) against the CPU twins
 *               (zs_op_*_mixed): fp32 tolerances where both round the same
 *               inputs (matmul), cmp_mixed where a rounded operand is an
 *               fp32 intermediate of each side's own (attention)
 *   flash       the fused attention (zs_cuda_attention_flash_*) against
 *               the CPU twins with the same rounding (cmp_mixed), outputs
 *               poisoned first, two runs bitwise equal; T = 40, 72 (not a
 *               multiple of the 64-row tiles), hs 16 and 64, bf16 and fp16
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_adam.h"
#include "zs_cast.h"
#include "zs_cuda_gpt.h"
#include "zs_cuda_vec.h"
#include "zs_gpt_ops.h"
#include "zs_math.h"
#include "zs_test.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        TEST_CHECKF(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                   \
    } while (0)

static cudaStream_t cs;
static zs_err_t err;
static zs_cuda_blas_t blas;
static void *workspace;

/* ---- host / device buffers ------------------------------------------------------- */

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint32_t rnd32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}

static float urand(void) /* [-1, 1) */
{
    return (float)((double)rnd32() / 2147483648.0 - 1.0);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    TEST_CHECK(p != NULL);
    return p;
}

static float *rnd(size_t n, float scale)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * urand();
    return p;
}

static void *dev(size_t bytes)
{
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    return d;
}

/* Copies go through cs and wait for it. Not cudaMemcpy: from pageable
 * memory it may return before the data reaches the device ("API
 * synchronization behavior"), and its legacy default stream does not order
 * cs, a cudaStreamNonBlocking stream: a kernel on cs could read the old
 * contents (the CUDA emulator did; a GPU's DMA is just fast enough). */
static void put(void *d, const void *h, size_t bytes)
{
    CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, cs));
    CK(cudaStreamSynchronize(cs));
}

static void *up(const void *h, size_t bytes)
{
    void *d = dev(bytes);
    put(d, h, bytes);
    return d;
}

static void get(void *h, const void *d, size_t bytes)
{
    CK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, cs));
    CK(cudaStreamSynchronize(cs));
}

static void *down(const void *d, size_t bytes)
{
    void *h = xmalloc(bytes);
    get(h, d, bytes);
    return h;
}

static void *dupb(const void *h, size_t bytes)
{
    void *p = xmalloc(bytes);
    memcpy(p, h, bytes);
    return p;
}

static void sync_ok(void)
{
    CK(cudaStreamSynchronize(cs));
    CK(cudaGetLastError());
}

/* ---- comparisons ----------------------------------------------------------------- */

static void cmp_bits(const char *what, const void *g, const void *c, size_t bytes)
{
    const unsigned char *a = g, *b = c;
    for (size_t i = 0; i < bytes; i++)
        TEST_CHECKF(a[i] == b[i], "%s: GPU and CPU differ at byte %zu of %zu", what, i, bytes);
    printf("  %-34s %9zu bytes bitwise equal\n", what, bytes);
}

/* |g - c| <= atol * max|c| + rtol * |c| for all elements. */
static void cmp_tol(const char *what, const float *g, const float *c, size_t n, double atol,
                    double rtol)
{
    double mx = 0, emax = 0;
    size_t same = 0;
    for (size_t i = 0; i < n; i++)
        mx = fabs(c[i]) > mx ? fabs(c[i]) : mx;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - c[i]);
        TEST_CHECKF(e <= atol * mx + rtol * fabs(c[i]),
                    "%s[%zu]: GPU %.9g CPU %.9g (err %.3g > %.3g * max|cpu| %.3g + %.3g rel)", what,
                    i, g[i], c[i], e, atol, mx, rtol);
        emax = e > emax ? e : emax;
        same += g[i] == c[i];
    }
    printf("  %-34s n=%8zu max abs err %.3g (max|cpu| %.3g, %.3g of it), %zu bitwise\n", what, n,
           emax, mx, mx > 0 ? emax / mx : 0.0, same);
}

static void cmp_repeat(const char *what, const void *a, const void *b, size_t bytes)
{
    TEST_CHECKF(memcmp(a, b, bytes) == 0, "%s: two GPU runs differ (not deterministic)", what);
}

/* ---- argument checks (no GPU needed) ---------------------------------------------- */

static void test_args(void)
{
    zs_err_t e;
    float x = 0.0f;
    TEST_CHECK(zs_cuda_cast(NULL, &x, ZS_DTYPE_NONE, &x, ZS_DTYPE_F32, 4, &e) == ZS_ERR_INVALID);
    TEST_CHECK(zs_cuda_cast(NULL, &x, ZS_DTYPE_F32, NULL, ZS_DTYPE_BF16, 4, &e) == ZS_ERR_INVALID);
    TEST_CHECK(zs_cuda_cast(NULL, NULL, ZS_DTYPE_F32, NULL, ZS_DTYPE_BF16, 0, &e) == ZS_OK);
    /* accumulate allows dst == src (x += x, as the CPU device); NULL is refused */
    TEST_CHECK(zs_cuda_accumulate(NULL, NULL, ZS_DTYPE_F32, &x, ZS_DTYPE_F32, 1, &e) ==
               ZS_ERR_INVALID);
    TEST_CHECK(zs_cuda_scale(NULL, &x, (zs_dtype_t)7, 1.0f, 1, &e) == ZS_ERR_INVALID);
    TEST_CHECK(zs_cuda_sumsq(NULL, &x, ZS_DTYPE_F32, 1, NULL, &e) == ZS_ERR_INVALID);
    TEST_CHECK(zs_cuda_adamw(NULL, NULL, NULL, &x, &x, &x, &x, ZS_DTYPE_F32, NULL, ZS_DTYPE_NONE, 1,
                             &e) == ZS_ERR_INVALID);
    zs_cuda_blas_t none;
    memset(&none, 0, sizeof none);
    TEST_CHECK(zs_cuda_gemm(NULL, &none, 0, 0, 2, 2, 2, 1.0f, &x, 2, &x, 2, 0.0f, &x, 2, &e) ==
               ZS_ERR_STATE);
    TEST_CHECK(zs_cuda_attention_fwd(NULL, &none, &x, &x, &x, 1, 4, 10, 3, &e) == ZS_ERR_INVALID);
    TEST_CHECKF(strstr(e.msg, "C=10 NH=3") != NULL, "message: %s", e.msg);
    TEST_CHECK(zs_cuda_residual_bwd(NULL, &x, &x, &x, 1, &e) == ZS_ERR_INVALID);
    /* flash attention: fp32 operands, a head size that is not a multiple of
     * 16 (or above 128), a misaligned buffer: refused, nothing enqueued */
    {
        static float buf[8] __attribute__((aligned(16)));
        zs_mixed_t bf = {ZS_DTYPE_BF16, NULL, 0}, f32 = {ZS_DTYPE_F32, NULL, 0};
        TEST_CHECK(zs_cuda_attention_flash_fwd(NULL, &f32, buf, buf, buf, 1, 4, 64, 1, &e) ==
                   ZS_ERR_INVALID);
        TEST_CHECK(zs_cuda_attention_flash_fwd(NULL, NULL, buf, buf, buf, 1, 4, 64, 1, &e) ==
                   ZS_ERR_INVALID);
        TEST_CHECK(zs_cuda_attention_flash_fwd(NULL, &bf, buf, buf, buf, 1, 4, 24, 3, &e) ==
                   ZS_ERR_INVALID);
        TEST_CHECKF(strstr(e.msg, "head size 8") != NULL, "message: %s", e.msg);
        TEST_CHECK(zs_cuda_attention_flash_bwd(NULL, &bf, buf, buf, buf, buf, buf, 1, 4, 288, 1,
                                               &e) == ZS_ERR_INVALID);
        TEST_CHECK(zs_cuda_attention_flash_fwd(NULL, &bf, buf + 1, buf, buf, 1, 4, 64, 1, &e) ==
                   ZS_ERR_INVALID);
        TEST_CHECKF(strstr(e.msg, "aligned") != NULL, "message: %s", e.msg);
    }
    TEST_CHECK(zs_cuda_layernorm_fwd(NULL, &x, &x, &x, &x, &x, &x, 1, 0, &e) == ZS_ERR_INVALID);
    printf("argument checks: bad dtypes, NULL buffers, shapes and an uninitialised "
           "cuBLASLt context refused\n");
}

/* ---- vector ops -------------------------------------------------------------------- */

static const zs_dtype_t dts[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};

/* n values in dtype dt: random over many magnitudes, with specials. */
static void *vec_data(zs_dtype_t dt, size_t n)
{
    float *f = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        float x = urand() * ldexpf(1.0f, (int)(rnd32() % 40) - 24);
        switch (i % 211) {
        case 0:
            x = 0.0f;
            break;
        case 1:
            x = -0.0f;
            break;
        case 2:
            x = 1.0f + 0x1p-8f; /* a bf16 tie */
            break;
        case 3:
            x = 1.0f + 0x1p-11f; /* an fp16 tie */
            break;
        case 4:
            x = 3e-7f; /* fp16 subnormal */
            break;
        case 5:
            x = 7e4f; /* fp16 overflow */
            break;
        default:
            break;
        }
        f[i] = x;
    }
    if (dt == ZS_DTYPE_F32)
        return f;
    void *h = xmalloc(n * 2);
    zs_cast(h, dt, f, ZS_DTYPE_F32, n);
    free(f);
    return h;
}

/* Replace the non-finite elements of x (n of dt) by 1. vec_data's fp16
 * overflow case (7e4) is +inf in fp16: sumsq's "finite data" checks would
 * compare inf with inf (found by the CUDA emulator prototype), and AdamW on
 * an inf gradient gives NaNs whose bits differ between the CPU (x86's
 * default NaN is negative) and the GPU (canonical 0x7fffffff) (found on an
 * H100, 2026-11-25). The engine never feeds AdamW a non-finite gradient: it
 * skips the step on overflow. */
static void finite_only(void *x, zs_dtype_t dt, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(zs_math_load(x, dt, i)))
            zs_math_store(x, dt, i, 1.0f);
}

/* zs_cuda_cast_rows: the GPU gathers and converts the rows of ids in
 * [lo, hi) (duplicates and ids outside included) in one launch; rows of
 * other ids keep the poison; bitwise the host loop over zs_cast. */
static void test_cast_rows(void)
{
    const size_t w = 771, n = 2049; /* w not a multiple of a block */
    const int32_t V = 5000, lo = 1200, hi = 3700;
    for (int a = 0; a < 3; a++) {
        zs_dtype_t sdt = dts[a];
        size_t ss = zs_dtype_size(sdt);
        void *src = vec_data(sdt, (size_t)(hi - lo) * w);
        int32_t *idx = xmalloc(n * sizeof *idx);
        for (size_t i = 0; i < n; i++)
            idx[i] = i % 7 == 0 ? idx[i / 2] : (int32_t)(rnd32() % (uint32_t)V);
        idx[0] = lo, idx[1] = hi - 1, idx[2] = hi, idx[3] = lo - 1; /* both edges */
        float *want = xmalloc(n * w * 4);
        memset(want, 0xA5, n * w * 4); /* poison: rows outside [lo, hi) keep it */
        size_t inside = 0;
        for (size_t i = 0; i < n; i++)
            if (idx[i] >= lo && idx[i] < hi) {
                zs_cast(want + i * w, ZS_DTYPE_F32, (const char *)src + (idx[i] - lo) * w * ss, sdt,
                        w);
                inside++;
            }
        void *dsrc = up(src, (size_t)(hi - lo) * w * ss), *didx = up(idx, n * sizeof *idx);
        float *ddst = dev(n * w * 4);
        CK(cudaMemsetAsync(ddst, 0xA5, n * w * 4, cs));
        TEST_OK(zs_cuda_cast_rows(cs, ddst, dsrc, sdt, didx, n, lo, hi, w, &err), err);
        sync_ok();
        float *got = down(ddst, n * w * 4);
        char what[64];
        snprintf(what, sizeof what, "cast_rows %s -> f32", zs_dtype_name(sdt));
        cmp_bits(what, got, want, n * w * 4);
        printf("  %s: %zu of %zu rows in [%d, %d), bitwise\n", what, inside, n, lo, hi);
        free(got), free(want), free(idx), free(src);
        CK(cudaFree(ddst));
        CK(cudaFree(dsrc));
        CK(cudaFree(didx));
    }
}

static void test_vec(void)
{
    const size_t n = 1000003;
    char name[96];
    printf("vector ops, n = %zu:\n", n);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            zs_dtype_t ddt = dts[a], sdt = dts[b];
            size_t ds = zs_dtype_size(ddt), ss = zs_dtype_size(sdt);
            void *src = vec_data(sdt, n), *dst0 = vec_data(ddt, n);
            void *dsrc = up(src, n * ss), *ddst = dev(n * ds);
            /* cast */
            void *want = xmalloc(n * ds);
            zs_cast(want, ddt, src, sdt, n);
            TEST_OK(zs_cuda_cast(cs, ddst, ddt, dsrc, sdt, n, &err), err);
            sync_ok();
            void *got = down(ddst, n * ds);
            snprintf(name, sizeof name, "cast %s <- %s", zs_dtype_name(ddt), zs_dtype_name(sdt));
            cmp_bits(name, got, want, n * ds);
            free(got);
            /* accumulate: dst = round(widen(dst) + widen(src)) */
            memcpy(want, dst0, n * ds);
            for (size_t i = 0; i < n; i++)
                zs_math_store(want, ddt, i, zs_math_load(want, ddt, i) + zs_math_load(src, sdt, i));
            put(ddst, dst0, n * ds);
            TEST_OK(zs_cuda_accumulate(cs, ddst, ddt, dsrc, sdt, n, &err), err);
            sync_ok();
            got = down(ddst, n * ds);
            snprintf(name, sizeof name, "accumulate %s += %s", zs_dtype_name(ddt),
                     zs_dtype_name(sdt));
            cmp_bits(name, got, want, n * ds);
            free(got), free(want), free(src), free(dst0);
            CK(cudaFree(dsrc));
            CK(cudaFree(ddst));
        }
    for (int a = 0; a < 3; a++) {
        zs_dtype_t dt = dts[a];
        size_t es = zs_dtype_size(dt);
        void *x = vec_data(dt, n), *want = dupb(x, n * es);
        void *dx = up(x, n * es);
        for (size_t i = 0; i < n; i++)
            zs_math_store(want, dt, i, zs_math_load(want, dt, i) * 0.37f);
        TEST_OK(zs_cuda_scale(cs, dx, dt, 0.37f, n, &err), err);
        sync_ok();
        void *got = down(dx, n * es);
        snprintf(name, sizeof name, "scale %s", zs_dtype_name(dt));
        cmp_bits(name, got, want, n * es);
        free(got);
        /* sumsq: the CPU sum in long double (64-bit mantissa), so the
         * reference's own error is far below the 1e-12 tolerance; the GPU's
         * fp64 tree over ~2^20 squares is good to ~1e-15 */
        finite_only(x, dt, n);
        long double lref = 0;
        for (size_t i = 0; i < n; i++) {
            long double v = zs_math_load(x, dt, i);
            lref += v * v;
        }
        double ref = (double)lref;
        double acc0[2] = {1.5, 0.0}, r1[2], r2[2];
        double *dacc = up(acc0, sizeof acc0);
        put(dx, x, n * es);
        TEST_OK(zs_cuda_sumsq(cs, dx, dt, n, dacc, &err), err);
        sync_ok();
        get(r1, dacc, sizeof r1);
        put(dacc, acc0, sizeof acc0);
        TEST_OK(zs_cuda_sumsq(cs, dx, dt, n, dacc, &err), err);
        sync_ok();
        get(r2, dacc, sizeof r2);
        TEST_CHECKF(fabs(r1[0] - (1.5 + ref)) <= 1e-12 * (1.5 + ref),
                    "sumsq %s: GPU %.17g CPU %.17g", zs_dtype_name(dt), r1[0], 1.5 + ref);
        TEST_CHECKF(r1[1] == 0.0, "sumsq %s: non-finite flag set on finite data",
                    zs_dtype_name(dt));
        cmp_repeat("sumsq", r1, r2, sizeof r1);
        printf("  sumsq %-28s GPU %.17g CPU %.17g (rel %.3g), repeat bitwise\n", zs_dtype_name(dt),
               r1[0], 1.5 + ref, fabs(r1[0] - 1.5 - ref) / (1.5 + ref));
        /* one inf, then one NaN, at the far end: the flag */
        for (int k = 0; k < 2; k++) {
            zs_math_store(x, dt, n - 2, k ? NAN : -INFINITY);
            put(dx, x, n * es);
            put(dacc, acc0, sizeof acc0);
            TEST_OK(zs_cuda_sumsq(cs, dx, dt, n, dacc, &err), err);
            sync_ok();
            get(r1, dacc, sizeof r1);
            TEST_CHECKF(r1[1] == 1.0 && !isfinite(r1[0]), "sumsq %s: %s not flagged",
                        zs_dtype_name(dt), k ? "NaN" : "inf");
        }
        free(x), free(want);
        CK(cudaFree(dx));
        CK(cudaFree(dacc));
    }
    printf("  sumsq: inf and NaN set acc[1] on every dtype\n");

    /* AdamW: 3 steps per (grad dtype, out dtype) pair, bitwise vs zs_adam_update */
    static const zs_dtype_t odts[4] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16, ZS_DTYPE_NONE};
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1};
    for (int g = 0; g < 3; g++)
        for (int o = 0; o < 4; o++) {
            zs_dtype_t gdt = dts[g], odt = odts[o];
            size_t gs = zs_dtype_size(gdt), os = odt == ZS_DTYPE_NONE ? 4 : zs_dtype_size(odt);
            float *p = rnd(n, 1), *m = rnd(n, 0.01f), *v = rnd(n, 0.001f);
            for (size_t i = 0; i < n; i++)
                v[i] = fabsf(v[i]);
            void *grad = vec_data(gdt, n);
            finite_only(grad, gdt, n);
            void *out = xmalloc(n * os);
            float *dp = up(p, n * 4), *dm = up(m, n * 4), *dv = up(v, n * 4);
            void *dg = up(grad, n * gs), *dout = dev(n * os);
            for (int t = 1; t <= 3; t++) {
                zs_adam_step_t st = {1e-3f / (float)t, t, 0.5f, t == 2 ? 0.8f : 1.0f};
                hp.adam_w_mode = !(g == 1 && o == 0); /* one Adam (L2) case */
                zs_adam_update(&hp, &st, p, m, v, grad, gdt, odt == ZS_DTYPE_NONE ? NULL : out, odt,
                               n);
                TEST_OK(zs_cuda_adamw(cs, &hp, &st, dp, dm, dv, dg, gdt,
                                      odt == ZS_DTYPE_NONE ? NULL : dout, odt, n, &err),
                        err);
            }
            sync_ok();
            float *gp = down(dp, n * 4), *gm = down(dm, n * 4), *gv = down(dv, n * 4);
            snprintf(name, sizeof name, "adamw grad %s out %s: p", zs_dtype_name(gdt),
                     zs_dtype_name(odt));
            cmp_bits(name, gp, p, n * 4);
            cmp_bits("  ... m", gm, m, n * 4);
            cmp_bits("  ... v", gv, v, n * 4);
            if (odt != ZS_DTYPE_NONE) {
                void *go = down(dout, n * os);
                cmp_bits("  ... out", go, out, n * os);
                free(go);
            }
            free(gp), free(gm), free(gv), free(p), free(m), free(v), free(grad), free(out);
            CK(cudaFree(dp));
            CK(cudaFree(dm));
            CK(cudaFree(dv));
            CK(cudaFree(dg));
            CK(cudaFree(dout));
        }
}

/* ---- GPT ops --------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int B, T, C, NH, V;
} shape_t;

/* fp32 tolerances (see cmp_tol): GEMM-based and row-reduction results */
#define ATOL 2e-5
#define RTOL 1e-4

/* Run `body` (which writes the device outputs from the device inputs) twice
 * from the same inputs and compare `nout` device outputs bitwise. reset()
 * re-uploads the inputs that the op accumulates into. */
typedef struct {
    void *d;
    const void *h0; /* initial contents (accumulating outputs), or NULL */
    size_t bytes;
} io_t;

static void reset(io_t *io, int n)
{
    for (int i = 0; i < n; i++)
        if (io[i].h0)
            put(io[i].d, io[i].h0, io[i].bytes);
}

static void **fetch_all(io_t *io, int n)
{
    void **r = xmalloc((size_t)n * sizeof *r);
    for (int i = 0; i < n; i++)
        r[i] = down(io[i].d, io[i].bytes);
    return r;
}

static void check_repeat(const char *op, void **a, void **b, io_t *io, int n)
{
    for (int i = 0; i < n; i++) {
        cmp_repeat(op, a[i], b[i], io[i].bytes);
        free(b[i]);
    }
    free(b);
}

static void free_all(void **a, int n)
{
    for (int i = 0; i < n; i++)
        free(a[i]);
    free(a);
}

static void test_gpt(const shape_t *s)
{
    int B = s->B, T = s->T, C = s->C, NH = s->NH, V = s->V, N = B * T, OC = 4 * C;
    size_t NC = (size_t)N * C;
    int small = N <= ZS_CUDA_COLSUM_ROWS;
    char nm[96];
    printf("GPT ops, %s: B=%d T=%d C=%d NH=%d V=%d (N=%d%s)\n", s->name, B, T, C, NH, V, N,
           small ? ", column sums bitwise" : "");

    /* embedding: tokens with repeats (every third repeats an earlier one) */
    int32_t *tok = xmalloc((size_t)N * 4);
    for (int i = 0; i < N; i++)
        tok[i] = i % 3 == 2 ? tok[i / 2] : (int32_t)(rnd32() % (uint32_t)V);
    float *wte = rnd((size_t)V * C, 0.1f), *wpe = rnd((size_t)T * C, 0.1f);
    int32_t *dtok = up(tok, (size_t)N * 4);
    float *dwte_in = up(wte, (size_t)V * C * 4), *dwpe_in = up(wpe, (size_t)T * C * 4);
    {
        float *ref = xmalloc(NC * 4);
        zs_op_embed_fwd(NULL, ref, tok, wte, wpe, B, T, C);
        io_t io[1] = {{dev(NC * 4), NULL, NC * 4}};
        TEST_OK(zs_cuda_embed_fwd(cs, io[0].d, dtok, dwte_in, dwpe_in, B, T, C, &err), err);
        sync_ok();
        void **g1 = fetch_all(io, 1);
        cmp_bits("embed_fwd out", g1[0], ref, NC * 4);
        TEST_OK(zs_cuda_embed_fwd(cs, io[0].d, dtok, dwte_in, dwpe_in, B, T, C, &err), err);
        sync_ok();
        check_repeat("embed_fwd", g1, fetch_all(io, 1), io, 1);
        free_all(g1, 1);
        free(ref);
        CK(cudaFree(io[0].d));
    }
    {
        float *dout = rnd(NC, 1), *gw = rnd((size_t)V * C, 0.5f), *gp = rnd((size_t)T * C, 0.5f);
        float *rw = dupb(gw, (size_t)V * C * 4), *rp = dupb(gp, (size_t)T * C * 4);
        zs_op_embed_bwd(NULL, rw, rp, dout, tok, B, T, C);
        float *ddout = up(dout, NC * 4);
        io_t io[2] = {{dev((size_t)V * C * 4), gw, (size_t)V * C * 4},
                      {dev((size_t)T * C * 4), gp, (size_t)T * C * 4}};
        void **g[2];
        for (int k = 0; k < 2; k++) {
            reset(io, 2);
            TEST_OK(zs_cuda_embed_bwd(cs, io[0].d, io[1].d, ddout, dtok, B, T, C, &err), err);
            sync_ok();
            g[k] = fetch_all(io, 2);
        }
        cmp_bits("embed_bwd dwte", g[0][0], rw, (size_t)V * C * 4);
        cmp_bits("embed_bwd dwpe", g[0][1], rp, (size_t)T * C * 4);
        check_repeat("embed_bwd", g[0], g[1], io, 2);
        free_all(g[0], 2);
        free(dout), free(gw), free(gp), free(rw), free(rp);
        CK(cudaFree(ddout));
        CK(cudaFree(io[0].d));
        CK(cudaFree(io[1].d));
    }

    /* LayerNorm */
    {
        float *inp = rnd(NC, 2), *w = rnd((size_t)C, 1), *b = rnd((size_t)C, 0.5f);
        for (size_t i = 0; i < NC; i++)
            inp[i] += (float)(i / (size_t)C % 5); /* row means away from 0 */
        float *out = xmalloc(NC * 4), *mean = xmalloc((size_t)N * 4),
              *rstd = xmalloc((size_t)N * 4);
        zs_op_layernorm_fwd(NULL, out, mean, rstd, inp, w, b, N, C);
        float *dinp = up(inp, NC * 4), *dw = up(w, (size_t)C * 4), *db = up(b, (size_t)C * 4);
        io_t io[3] = {{dev(NC * 4), NULL, NC * 4},
                      {dev((size_t)N * 4), NULL, (size_t)N * 4},
                      {dev((size_t)N * 4), NULL, (size_t)N * 4}};
        void **g[2];
        for (int k = 0; k < 2; k++) {
            TEST_OK(zs_cuda_layernorm_fwd(cs, io[0].d, io[1].d, io[2].d, dinp, dw, db, N, C, &err),
                    err);
            sync_ok();
            g[k] = fetch_all(io, 3);
        }
        cmp_tol("layernorm_fwd out", g[0][0], out, NC, ATOL, RTOL);
        cmp_tol("layernorm_fwd mean", g[0][1], mean, (size_t)N, 1e-6, 1e-5);
        cmp_tol("layernorm_fwd rstd", g[0][2], rstd, (size_t)N, 1e-6, 1e-5);
        check_repeat("layernorm_fwd", g[0], g[1], io, 3);
        /* a 16-bit output (the stored ln1 / ln2): the fp32 output rounded,
         * bitwise, and the same mean and rstd */
        for (int dt = ZS_DTYPE_BF16; dt <= ZS_DTYPE_F16; dt++) {
            uint16_t *want = xmalloc(NC * 2);
            zs_cast(want, (zs_dtype_t)dt, g[0][0], ZS_DTYPE_F32, NC);
            void *o16 = dev(NC * 2);
            io_t st[2] = {{dev((size_t)N * 4), NULL, (size_t)N * 4},
                          {dev((size_t)N * 4), NULL, (size_t)N * 4}};
            TEST_OK(
                zs_cuda_layernorm_fwd_dt(cs, o16, dt, st[0].d, st[1].d, dinp, dw, db, N, C, &err),
                err);
            sync_ok();
            uint16_t *got = down(o16, NC * 2);
            void **ms = fetch_all(st, 2);
            char what[64];
            snprintf(what, sizeof what, "layernorm_fwd %s out", zs_dtype_name(dt));
            cmp_bits(what, got, want, NC * 2);
            cmp_bits("  its mean", ms[0], g[0][1], (size_t)N * 4);
            cmp_bits("  its rstd", ms[1], g[0][2], (size_t)N * 4);
            free(want), free(got);
            free_all(ms, 2);
            CK(cudaFree(o16));
            CK(cudaFree(st[0].d));
            CK(cudaFree(st[1].d));
        }
        free_all(g[0], 3);
        /* backward from the CPU's mean / rstd, so the column sums see the
         * same terms */
        float *dout = rnd(NC, 1), *dx0 = rnd(NC, 0.5f), *dw0 = rnd((size_t)C, 0.5f),
              *db0 = rnd((size_t)C, 0.5f);
        float *rdx = dupb(dx0, NC * 4), *rdw = dupb(dw0, (size_t)C * 4),
              *rdb = dupb(db0, (size_t)C * 4);
        zs_op_layernorm_bwd(NULL, rdx, rdw, rdb, dout, inp, w, mean, rstd, N, C);
        float *ddout = up(dout, NC * 4), *dmean = up(mean, (size_t)N * 4),
              *drstd = up(rstd, (size_t)N * 4);
        io_t bo[3] = {{dev(NC * 4), dx0, NC * 4},
                      {dev((size_t)C * 4), dw0, (size_t)C * 4},
                      {dev((size_t)C * 4), db0, (size_t)C * 4}};
        for (int k = 0; k < 2; k++) {
            reset(bo, 3);
            TEST_OK(zs_cuda_layernorm_bwd(cs, bo[0].d, bo[1].d, bo[2].d, ddout, dinp, dw, dmean,
                                          drstd, N, C, &err),
                    err);
            sync_ok();
            g[k] = fetch_all(bo, 3);
        }
        cmp_tol("layernorm_bwd dinp (+=)", g[0][0], rdx, NC, ATOL, RTOL);
        if (small) {
            cmp_bits("layernorm_bwd dw (+=)", g[0][1], rdw, (size_t)C * 4);
            cmp_bits("layernorm_bwd db (+=)", g[0][2], rdb, (size_t)C * 4);
        } else {
            cmp_tol("layernorm_bwd dw (+=)", g[0][1], rdw, (size_t)C, ATOL, RTOL);
            cmp_tol("layernorm_bwd db (+=)", g[0][2], rdb, (size_t)C, ATOL, RTOL);
        }
        check_repeat("layernorm_bwd", g[0], g[1], bo, 3);
        free_all(g[0], 3);
        free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dx0),
            free(dw0), free(db0), free(rdx), free(rdw), free(rdb);
        void *fr[] = {dinp,    dw,      db,      ddout,   dmean,   drstd,
                      io[0].d, io[1].d, io[2].d, bo[0].d, bo[1].d, bo[2].d};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
            CK(cudaFree(fr[i]));
    }

    /* the fused residual + LayerNorm: bitwise residual_fwd then
     * layernorm_fwd on the device, within the tolerance of its CPU twin */
    {
        float *a = rnd(NC, 2), *b = rnd(NC, 1), *w = rnd((size_t)C, 1),
              *bias = rnd((size_t)C, 0.5f);
        for (size_t i = 0; i < NC; i++)
            a[i] += (float)(i / (size_t)C % 5); /* row means away from 0 */
        float *res = xmalloc(NC * 4), *out = xmalloc(NC * 4), *mean = xmalloc((size_t)N * 4),
              *rstd = xmalloc((size_t)N * 4);
        zs_op_residual_layernorm_fwd(NULL, res, out, mean, rstd, a, b, w, bias, N, C);
        float *da = up(a, NC * 4), *db = up(b, NC * 4), *dw = up(w, (size_t)C * 4),
              *dbias = up(bias, (size_t)C * 4);
        io_t io[4] = {{dev(NC * 4), NULL, NC * 4},
                      {dev(NC * 4), NULL, NC * 4},
                      {dev((size_t)N * 4), NULL, (size_t)N * 4},
                      {dev((size_t)N * 4), NULL, (size_t)N * 4}};
        void **g[3];
        for (int k = 0; k < 3; k++) { /* two fused runs, then the two ops */
            reset(io, 4);
            if (k < 2)
                TEST_OK(zs_cuda_residual_layernorm_fwd(cs, io[0].d, io[1].d, io[2].d, io[3].d, da,
                                                       db, dw, dbias, N, C, &err),
                        err);
            else {
                TEST_OK(zs_cuda_residual_fwd(cs, io[0].d, da, db, NC, &err), err);
                TEST_OK(zs_cuda_layernorm_fwd(cs, io[1].d, io[2].d, io[3].d, io[0].d, dw, dbias, N,
                                              C, &err),
                        err);
            }
            sync_ok();
            g[k] = fetch_all(io, 4);
        }
        static const char *const what[4] = {"residual_layernorm_fwd res", "... out", "... mean",
                                            "... rstd"};
        for (int t = 0; t < 4; t++)
            cmp_bits(what[t], g[0][t], g[2][t], t < 2 ? NC * 4 : (size_t)N * 4);
        cmp_bits("residual_layernorm_fwd res vs CPU", g[0][0], res, NC * 4);
        cmp_tol("residual_layernorm_fwd out vs CPU", g[0][1], out, NC, ATOL, RTOL);
        cmp_tol("residual_layernorm_fwd mean vs CPU", g[0][2], mean, (size_t)N, 1e-6, 1e-5);
        check_repeat("residual_layernorm_fwd", g[0], g[1], io, 4);
        free_all(g[0], 4);
        free_all(g[2], 4);
        /* the residual rounded where it is stored (rdt 16-bit), out fp32
         * or 16-bit: bitwise residual_fwd, zs_cuda_round and
         * layernorm_fwd_dt on the device; res16 and res bitwise the CPU
         * twin's */
        for (int dt = ZS_DTYPE_BF16; dt; dt = dt == ZS_DTYPE_BF16 ? ZS_DTYPE_F16 : 0)
            for (int oi = 0; oi < 2; oi++) {
                int odt = oi ? dt : ZS_DTYPE_F32;
                size_t ob = odt == ZS_DTYPE_F32 ? 4 : 2;
                uint16_t *h = xmalloc(NC * 2);
                zs_op_residual_layernorm_fwd_dt(NULL, res, h, dt, out, mean, rstd, a, b, w, bias, N,
                                                C);
                unsigned char *poison = xmalloc(NC * 4); /* NaNs: each run writes it all */
                memset(poison, 0xff, NC * 4);
                io_t jo[5] = {{dev(NC * 4), poison, NC * 4},
                              {dev(NC * 2), poison, NC * 2},
                              {dev(NC * ob), poison, NC * ob},
                              {dev((size_t)N * 4), poison, (size_t)N * 4},
                              {dev((size_t)N * 4), poison, (size_t)N * 4}};
                void **q[2];
                for (int k = 0; k < 2; k++) { /* fused, then the three ops */
                    reset(jo, 5);
                    if (k == 0)
                        TEST_OK(zs_cuda_residual_layernorm_fwd_dt(cs, jo[0].d, jo[1].d, dt, jo[2].d,
                                                                  odt, jo[3].d, jo[4].d, da, db, dw,
                                                                  dbias, N, C, &err),
                                err);
                    else {
                        TEST_OK(zs_cuda_residual_fwd(cs, jo[0].d, da, db, NC, &err), err);
                        TEST_OK(zs_cuda_round(cs, jo[0].d, jo[1].d, (zs_dtype_t)dt, NC, &err), err);
                        TEST_OK(zs_cuda_layernorm_fwd_dt(cs, jo[2].d, odt, jo[3].d, jo[4].d,
                                                         jo[0].d, dw, dbias, N, C, &err),
                                err);
                    }
                    sync_ok();
                    q[k] = fetch_all(jo, 5);
                }
                static const char *const jw[5] = {"residual_layernorm_fwd_dt res", "... res16",
                                                  "... out", "... mean", "... rstd"};
                for (int t = 0; t < 5; t++)
                    cmp_bits(jw[t], q[0][t], q[1][t], jo[t].bytes);
                cmp_bits("residual_layernorm_fwd_dt res16 vs CPU", q[0][1], h, NC * 2);
                cmp_bits("residual_layernorm_fwd_dt res vs CPU", q[0][0], res, NC * 4);
                TEST_CHECK(zs_cuda_residual_layernorm_fwd_dt(
                               cs, jo[0].d, jo[1].d, dt, jo[2].d,
                               dt == ZS_DTYPE_BF16 ? ZS_DTYPE_F16 : ZS_DTYPE_BF16, jo[3].d, jo[4].d,
                               da, db, dw, dbias, N, C, &err) == ZS_ERR_INVALID);
                free_all(q[0], 5);
                free_all(q[1], 5);
                free(h), free(poison);
                for (int t = 0; t < 5; t++)
                    CK(cudaFree(jo[t].d));
            }
        free(a), free(b), free(w), free(bias), free(res), free(out), free(mean), free(rstd);
        void *fr[] = {da, db, dw, dbias, io[0].d, io[1].d, io[2].d, io[3].d};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
            CK(cudaFree(fr[i]));
    }

    /* matmul [N, C] x [C, 4C] (+ bias), and its backward */
    {
        float *inp = rnd(NC, 1), *w = rnd((size_t)C * OC, 0.1f), *bias = rnd((size_t)OC, 0.5f);
        size_t NO = (size_t)N * OC;
        float *di = up(inp, NC * 4), *dwt = up(w, (size_t)C * OC * 4),
              *dbias = up(bias, (size_t)OC * 4);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            float *ref = xmalloc(NO * 4);
            zs_op_matmul_fwd(NULL, ref, inp, w, with_bias ? bias : NULL, N, C, OC);
            io_t io[1] = {{dev(NO * 4), NULL, NO * 4}};
            void **g[2];
            for (int k = 0; k < 2; k++) {
                TEST_OK(zs_cuda_matmul_fwd(cs, &blas, io[0].d, di, dwt, with_bias ? dbias : NULL, N,
                                           C, OC, &err),
                        err);
                sync_ok();
                g[k] = fetch_all(io, 1);
            }
            cmp_tol(with_bias ? "matmul_fwd (bias)" : "matmul_fwd (no bias)", g[0][0], ref, NO,
                    ATOL, RTOL);
            check_repeat("matmul_fwd", g[0], g[1], io, 1);
            free_all(g[0], 1);
            free(ref);
            CK(cudaFree(io[0].d));
        }
        float *dout = rnd(NO, 1), *dw0 = rnd((size_t)C * OC, 0.5f), *db0 = rnd((size_t)OC, 0.5f);
        float *rdi = xmalloc(NC * 4), *rdw = dupb(dw0, (size_t)C * OC * 4),
              *rdb = dupb(db0, (size_t)OC * 4);
        zs_op_matmul_bwd(NULL, rdi, rdw, rdb, dout, inp, w, N, C, OC);
        float *ddout = up(dout, NO * 4);
        io_t io[3] = {{dev(NC * 4), NULL, NC * 4},
                      {dev((size_t)C * OC * 4), dw0, (size_t)C * OC * 4},
                      {dev((size_t)OC * 4), db0, (size_t)OC * 4}};
        void **g[2];
        for (int k = 0; k < 2; k++) {
            reset(io, 3);
            TEST_OK(zs_cuda_matmul_bwd(cs, &blas, io[0].d, io[1].d, io[2].d, ddout, di, dwt, N, C,
                                       OC, &err),
                    err);
            sync_ok();
            g[k] = fetch_all(io, 3);
        }
        cmp_tol("matmul_bwd dinp", g[0][0], rdi, NC, ATOL, RTOL);
        cmp_tol("matmul_bwd dw (+=)", g[0][1], rdw, (size_t)C * OC, ATOL, RTOL);
        if (small)
            cmp_bits("matmul_bwd db (+=)", g[0][2], rdb, (size_t)OC * 4);
        else
            cmp_tol("matmul_bwd db (+=)", g[0][2], rdb, (size_t)OC, ATOL, RTOL);
        check_repeat("matmul_bwd", g[0], g[1], io, 3);
        free_all(g[0], 3);
        /* bias_bwd alone, also past one chunk of rows; the CPU twin is
         * zs_op_matmul_bwd's db with a dummy one-column product */
        int NB = small ? 3 * ZS_CUDA_COLSUM_ROWS + 5 : N;
        float *bd = rnd((size_t)NB * OC, 1), *rb = dupb(db0, (size_t)OC * 4);
        {
            float *zin = calloc((size_t)NB, 4), *zw = calloc((size_t)OC, 4),
                  *zdw = calloc((size_t)OC, 4);
            TEST_CHECK(zin && zw && zdw);
            zs_op_matmul_bwd(NULL, NULL, zdw, rb, bd, zin, zw, NB, 1, OC);
            free(zin), free(zw), free(zdw);
        }
        float *dbd = up(bd, (size_t)NB * OC * 4);
        put(io[2].d, db0, (size_t)OC * 4);
        TEST_OK(zs_cuda_bias_bwd(cs, io[2].d, dbd, NB, OC, &err), err);
        sync_ok();
        float *gb = down(io[2].d, (size_t)OC * 4);
        snprintf(nm, sizeof nm, "bias_bwd (N=%d)", NB);
        cmp_tol(nm, gb, rb, (size_t)OC, 1e-6, 1e-5);
        free(gb), free(bd), free(rb);
        CK(cudaFree(dbd));
        free(inp), free(w), free(bias), free(dout), free(dw0), free(db0), free(rdi), free(rdw),
            free(rdb);
        void *fr[] = {di, dwt, dbias, ddout, io[0].d, io[1].d, io[2].d};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
            CK(cudaFree(fr[i]));
    }

    /* attention */
    {
        size_t nq = (size_t)N * 3 * C, na = (size_t)B * NH * T * T;
        float *qkv = rnd(nq, 1), *out = xmalloc(NC * 4), *att = xmalloc(na * 4);
        zs_op_attention_fwd(NULL, out, att, qkv, B, T, C, NH);
        float *dq = up(qkv, nq * 4);
        io_t io[2] = {{dev(NC * 4), NULL, NC * 4}, {dev(na * 4), NULL, na * 4}};
        void **g[2];
        for (int k = 0; k < 2; k++) {
            TEST_OK(zs_cuda_attention_fwd(cs, &blas, io[0].d, io[1].d, dq, B, T, C, NH, &err), err);
            sync_ok();
            g[k] = fetch_all(io, 2);
        }
        cmp_tol("attention_fwd out", g[0][0], out, NC, ATOL, RTOL);
        cmp_tol("attention_fwd att", g[0][1], att, na, ATOL, RTOL);
        check_repeat("attention_fwd", g[0], g[1], io, 2);
        free_all(g[0], 2);
        float *dout = rnd(NC, 1), *rdq = xmalloc(nq * 4), *scr = xmalloc(na * 4);
        zs_op_attention_bwd(NULL, rdq, scr, dout, qkv, att, B, T, C, NH);
        float *ddout = up(dout, NC * 4), *datt = up(att, na * 4), *dscr = dev(na * 4);
        io_t bo[1] = {{dev(nq * 4), NULL, nq * 4}};
        for (int k = 0; k < 2; k++) {
            TEST_OK(
                zs_cuda_attention_bwd(cs, &blas, bo[0].d, dscr, ddout, dq, datt, B, T, C, NH, &err),
                err);
            sync_ok();
            g[k] = fetch_all(bo, 1);
        }
        cmp_tol("attention_bwd dqkv", g[0][0], rdq, nq, ATOL, RTOL);
        check_repeat("attention_bwd", g[0], g[1], bo, 1);
        free_all(g[0], 1);
        free(qkv), free(out), free(att), free(dout), free(rdq), free(scr);
        void *fr[] = {dq, ddout, datt, dscr, io[0].d, io[1].d, bo[0].d};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
            CK(cudaFree(fr[i]));
    }

    /* GELU and residual over [N, 4C] */
    {
        size_t n = (size_t)N * OC;
        float *x = rnd(n, 4), *d = rnd(n, 1), *y = rnd(n, 1);
        float *rf = xmalloc(n * 4), *rg = xmalloc(n * 4), *rr = xmalloc(n * 4);
        zs_op_gelu_fwd(NULL, rf, x, n);
        zs_op_gelu_bwd(NULL, rg, x, d, n);
        zs_op_residual_fwd(NULL, rr, x, y, n);
        float *dx = up(x, n * 4), *dd = up(d, n * 4), *dy = up(y, n * 4);
        io_t io[3] = {
            {dev(n * 4), NULL, n * 4}, {dev(n * 4), NULL, n * 4}, {dev(n * 4), NULL, n * 4}};
        void **g[2];
        for (int k = 0; k < 2; k++) {
            TEST_OK(zs_cuda_gelu_fwd(cs, io[0].d, dx, n, &err), err);
            TEST_OK(zs_cuda_gelu_bwd(cs, io[1].d, dx, dd, n, &err), err);
            TEST_OK(zs_cuda_residual_fwd(cs, io[2].d, dx, dy, n, &err), err);
            sync_ok();
            g[k] = fetch_all(io, 3);
        }
        /* GELU: the CUDA and glibc expf differ by an ulp or so */
        cmp_tol("gelu_fwd", g[0][0], rf, n, 1e-6, 1e-5);
        cmp_tol("gelu_bwd", g[0][1], rg, n, 1e-6, 1e-5);
        cmp_bits("residual_fwd", g[0][2], rr, n * 4);
        check_repeat("gelu/residual", g[0], g[1], io, 3);
        free_all(g[0], 3);
        /* in place: gelu_bwd dinp = dout, then gelu_fwd out = inp */
        TEST_OK(zs_cuda_gelu_bwd(cs, dd, dx, dd, n, &err), err);
        TEST_OK(zs_cuda_gelu_fwd(cs, dx, dx, n, &err), err);
        sync_ok();
        float *ipb = down(dd, n * 4), *ipf = down(dx, n * 4);
        cmp_tol("gelu_bwd in place", ipb, rg, n, 1e-6, 1e-5);
        cmp_tol("gelu_fwd in place", ipf, rf, n, 1e-6, 1e-5);
        free(ipb), free(ipf);
        /* 16-bit input (the stored pre-activation) and output (its stored
         * copy): bitwise the fp32 forms on the widened input, rounded
         * after; mixed 16-bit dtypes refused */
        for (int dt = ZS_DTYPE_BF16; dt <= ZS_DTYPE_F16; dt++) {
            const char *dn = zs_dtype_name(dt);
            uint16_t *h = xmalloc(n * 2);
            float *w = xmalloc(n * 4);
            zs_cast(h, (zs_dtype_t)dt, x, ZS_DTYPE_F32, n);
            zs_cast(w, ZS_DTYPE_F32, h, (zs_dtype_t)dt, n);
            void *dh = up(h, n * 2), *dw = up(w, n * 4), *o32 = dev(n * 4), *o16 = dev(n * 2);
            TEST_OK(zs_cuda_gelu_fwd(cs, o32, dw, n, &err), err); /* the fp32 reference */
            float *ref = down(o32, n * 4);
            uint16_t *ref16 = xmalloc(n * 2);
            zs_cast(ref16, (zs_dtype_t)dt, ref, ZS_DTYPE_F32, n);
            put(o32, x, n * 4); /* garbage where the result goes */
            TEST_OK(zs_cuda_gelu_fwd_dt(cs, o32, ZS_DTYPE_F32, dh, dt, n, &err), err);
            float *a = down(o32, n * 4);
            char what[96];
            snprintf(what, sizeof what, "gelu_fwd %s in, fp32 out", dn);
            cmp_bits(what, a, ref, n * 4);
            TEST_OK(zs_cuda_gelu_fwd_dt(cs, o16, dt, dh, dt, n, &err), err);
            uint16_t *b16 = down(o16, n * 2);
            snprintf(what, sizeof what, "gelu_fwd %s in, %s out", dn, dn);
            cmp_bits(what, b16, ref16, n * 2);
            TEST_OK(zs_cuda_gelu_fwd_dt(cs, o16, dt, dw, ZS_DTYPE_F32, n, &err), err);
            uint16_t *c16 = down(o16, n * 2);
            snprintf(what, sizeof what, "gelu_fwd fp32 in, %s out", dn);
            cmp_bits(what, c16, ref16, n * 2);
            TEST_OK(zs_cuda_gelu_bwd(cs, o32, dw, dd, n, &err), err);
            float *gref = down(o32, n * 4);
            put(o32, x, n * 4);
            TEST_OK(zs_cuda_gelu_bwd_dt(cs, o32, dh, dt, dd, n, &err), err);
            float *gb = down(o32, n * 4);
            snprintf(what, sizeof what, "gelu_bwd %s in", dn);
            cmp_bits(what, gb, gref, n * 4);
            /* with the rounded copy of dinp (for the GEMMs after it): dinp
             * as before, the copy bitwise its cast; fp32 or 16-bit input */
            uint16_t *gref16 = xmalloc(n * 2);
            zs_cast(gref16, (zs_dtype_t)dt, gref, ZS_DTYPE_F32, n);
            for (int i16 = 0; i16 < 2; i16++) {
                put(o32, x, n * 4);
                CK(cudaMemsetAsync(o16, 0xff, n * 2, cs));
                TEST_OK(zs_cuda_gelu_bwd_copy(cs, o32, o16, dt, i16 ? dh : dw,
                                              i16 ? dt : ZS_DTYPE_F32, dd, n, &err),
                        err);
                float *gc = down(o32, n * 4);
                uint16_t *gc16 = down(o16, n * 2);
                snprintf(what, sizeof what, "gelu_bwd_copy %s in: dinp", i16 ? dn : "fp32");
                cmp_bits(what, gc, gref, n * 4);
                snprintf(what, sizeof what, "gelu_bwd_copy %s in: its %s copy", i16 ? dn : "fp32",
                         dn);
                cmp_bits(what, gc16, gref16, n * 2);
                free(gc), free(gc16);
            }
            TEST_CHECK(zs_cuda_gelu_bwd_copy(cs, o32, o16, dt, dh,
                                             dt == ZS_DTYPE_BF16 ? ZS_DTYPE_F16 : ZS_DTYPE_BF16, dd,
                                             n, &err) == ZS_ERR_INVALID);
            free(gref16);
            TEST_CHECK(zs_cuda_gelu_fwd_dt(cs, o16, ZS_DTYPE_F16, dh, ZS_DTYPE_BF16, n, &err) ==
                       ZS_ERR_INVALID);
            free(h), free(w), free(ref), free(ref16), free(a), free(b16), free(c16), free(gref),
                free(gb);
            void *f2[] = {dh, dw, o32, o16};
            for (size_t i = 0; i < sizeof f2 / sizeof f2[0]; i++)
                CK(cudaFree(f2[i]));
        }
        /* residual backward accumulates into two distinct buffers */
        float *da0 = rnd(n, 1), *db0 = rnd(n, 1), *ra = dupb(da0, n * 4), *rb = dupb(db0, n * 4);
        zs_op_residual_bwd(NULL, ra, rb, d, n);
        put(dd, d, n * 4);
        io_t bo[2] = {{dev(n * 4), da0, n * 4}, {dev(n * 4), db0, n * 4}};
        reset(bo, 2);
        TEST_OK(zs_cuda_residual_bwd(cs, bo[0].d, bo[1].d, dd, n, &err), err);
        sync_ok();
        void **gb = fetch_all(bo, 2);
        cmp_bits("residual_bwd da (+=)", gb[0], ra, n * 4);
        cmp_bits("residual_bwd db (+=)", gb[1], rb, n * 4);
        free_all(gb, 2);
        free(x), free(d), free(y), free(rf), free(rg), free(rr), free(da0), free(db0), free(ra),
            free(rb);
        void *fr[] = {dx, dd, dy, io[0].d, io[1].d, io[2].d, bo[0].d, bo[1].d};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
            CK(cudaFree(fr[i]));
    }

    /* softmax cross-entropy over [N, V] */
    {
        size_t nl = (size_t)N * V;
        float *lg = rnd(nl, 4);
        int32_t *tg = xmalloc((size_t)N * 4);
        for (int i = 0; i < N; i++)
            tg[i] = (int32_t)(rnd32() % (uint32_t)V);
        float scale = 1.0f / (float)N;
        float *rl = xmalloc((size_t)N * 4), *rs = xmalloc((size_t)N * 4), *rd = xmalloc(nl * 4);
        zs_op_xent_fwd(NULL, rl, rs, lg, tg, N, V, V);
        zs_op_xent_bwd(NULL, rd, lg, rs, tg, N, V, V, scale);
        float *dl = up(lg, nl * 4);
        int32_t *dt = up(tg, (size_t)N * 4);
        io_t io[3] = {{dev((size_t)N * 4), NULL, (size_t)N * 4},
                      {dev((size_t)N * 4), NULL, (size_t)N * 4},
                      {dev(nl * 4), NULL, nl * 4}};
        void **g[2];
        for (int k = 0; k < 2; k++) {
            TEST_OK(zs_cuda_xent_fwd(cs, io[0].d, io[1].d, dl, dt, N, V, V, &err), err);
            TEST_OK(zs_cuda_xent_bwd(cs, io[2].d, dl, io[1].d, dt, N, V, V, scale, &err), err);
            sync_ok();
            g[k] = fetch_all(io, 3);
        }
        cmp_tol("xent_fwd losses", g[0][0], rl, (size_t)N, 1e-6, 1e-5);
        cmp_tol("xent_fwd lse", g[0][1], rs, (size_t)N, 1e-6, 1e-5);
        cmp_tol("xent_bwd dlogits", g[0][2], rd, nl, 1e-5, 1e-4);
        check_repeat("xent_fwd/bwd", g[0], g[1], io, 3);
        /* fused, out of place and in place: the same bits as the two calls */
        io_t fo[3] = {{dev((size_t)N * 4), NULL, (size_t)N * 4},
                      {dev((size_t)N * 4), NULL, (size_t)N * 4},
                      {dev(nl * 4), NULL, nl * 4}};
        TEST_OK(zs_cuda_xent_fused(cs, fo[0].d, fo[1].d, fo[2].d, dl, dt, N, V, V, scale, &err),
                err);
        sync_ok();
        void **gf = fetch_all(fo, 3);
        cmp_bits("xent_fused losses = xent_fwd", gf[0], g[0][0], (size_t)N * 4);
        cmp_bits("xent_fused lse = xent_fwd", gf[1], g[0][1], (size_t)N * 4);
        cmp_bits("xent_fused dlogits = xent_bwd", gf[2], g[0][2], nl * 4);
        free_all(gf, 3);
        TEST_OK(zs_cuda_xent_fused(cs, fo[0].d, fo[1].d, dl, dl, dt, N, V, V, scale, &err), err);
        sync_ok();
        float *ip = down(dl, nl * 4);
        cmp_bits("xent_fused in place", ip, g[0][2], nl * 4);
        free(ip);
        /* rows padded to ld = V + 7 floats, the padding NaN: bitwise the
         * unpadded results, padding neither read (NaN would spread) nor
         * written */
        {
            int ld = V + 7;
            size_t np = (size_t)N * ld;
            float *hp = xmalloc(np * 4);
            for (size_t i = 0; i < np; i++)
                hp[i] = NAN;
            for (int r = 0; r < N; r++)
                memcpy(hp + (size_t)r * ld, lg + (size_t)r * V, (size_t)V * 4);
            float *pl = up(hp, np * 4), *pd = up(hp, np * 4);
            io_t po[2] = {{dev((size_t)N * 4), NULL, (size_t)N * 4},
                          {dev((size_t)N * 4), NULL, (size_t)N * 4}};
            TEST_OK(zs_cuda_xent_fwd(cs, po[0].d, po[1].d, pl, dt, N, V, ld, &err), err);
            TEST_OK(zs_cuda_xent_bwd(cs, pd, pl, po[1].d, dt, N, V, ld, scale, &err), err);
            sync_ok();
            void **gp = fetch_all(po, 2);
            cmp_bits("xent_fwd losses, padded rows", gp[0], g[0][0], (size_t)N * 4);
            cmp_bits("xent_fwd lse, padded rows", gp[1], g[0][1], (size_t)N * 4);
            float *hd = down(pd, np * 4);
            for (int r = 0; r < N; r++) {
                cmp_bits("xent_bwd dlogits, padded rows", hd + (size_t)r * ld,
                         (float *)g[0][2] + (size_t)r * V, (size_t)V * 4);
                for (int v = V; v < ld; v++)
                    TEST_CHECKF(isnan(hd[(size_t)r * ld + v]), "xent_bwd wrote padding [%d, %d]", r,
                                v);
            }
            /* into a 16-bit copy (the head GEMMs' operand): each element the
             * fp32 dlogit rounded, the padding zeros; refused over logits */
            for (int dt16 = ZS_DTYPE_BF16; dt16; dt16 = dt16 == ZS_DTYPE_BF16 ? ZS_DTYPE_F16 : 0) {
                uint16_t *want = xmalloc(np * 2);
                float *z = xmalloc(np * 4);
                memcpy(z, hd, np * 4);
                for (int r = 0; r < N; r++)
                    for (int v = V; v < ld; v++)
                        z[(size_t)r * ld + v] = 0.0f;
                zs_cast(want, (zs_dtype_t)dt16, z, ZS_DTYPE_F32, np);
                void *p16 = dev(np * 2);
                CK(cudaMemsetAsync(p16, 0xff, np * 2, cs));
                TEST_OK(zs_cuda_xent_bwd_dt(cs, p16, dt16, pl, po[1].d, dt, N, V, ld, scale, &err),
                        err);
                sync_ok();
                uint16_t *got = down(p16, np * 2);
                char what[80];
                snprintf(what, sizeof what, "xent_bwd into %s, padded rows", zs_dtype_name(dt16));
                cmp_bits(what, got, want, np * 2);
                TEST_CHECK(zs_cuda_xent_bwd_dt(cs, pl, dt16, pl, po[1].d, dt, N, V, ld, scale,
                                               &err) == ZS_ERR_INVALID);
                free(want), free(z), free(got);
                CK(cudaFree(p16));
            }
            free_all(gp, 2);
            free(hd), free(hp);
            void *pf[] = {pl, pd, po[0].d, po[1].d};
            for (size_t i = 0; i < sizeof pf / sizeof pf[0]; i++)
                CK(cudaFree(pf[i]));
        }
        free_all(g[0], 3);
        free(lg), free(tg), free(rl), free(rs), free(rd);
        void *fr[] = {dl, dt, io[0].d, io[1].d, io[2].d, fo[0].d, fo[1].d, fo[2].d};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
            CK(cudaFree(fr[i]));
    }
    free(tok), free(wte), free(wpe);
    CK(cudaFree(dtok));
    CK(cudaFree(dwte_in));
    CK(cudaFree(dwpe_in));
}

/* zs_cuda_gemm on its own: all transposes, odd sizes, padded leading
 * dimensions, beta != 0. */
static void test_gemm(void)
{
    int M = 37, N = 53, K = 29;
    printf("GEMM (row-major, padded leading dimensions, beta 0.5):\n");
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 7;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb,
                   nc = (size_t)M * ldc;
            float *A = rnd(na, 1), *Bm = rnd(nb, 1), *Cm = rnd(nc, 1), *R = dupb(Cm, nc * 4);
            zs_op_gemm(NULL, ta, tb, M, N, K, 0.75f, A, lda, Bm, ldb, 0.5f, R, ldc);
            float *dA = up(A, na * 4), *dB = up(Bm, nb * 4), *dC = up(Cm, nc * 4);
            TEST_OK(zs_cuda_gemm(cs, &blas, ta, tb, M, N, K, 0.75f, dA, lda, dB, ldb, 0.5f, dC, ldc,
                                 &err),
                    err);
            sync_ok();
            float *G = down(dC, nc * 4);
            char nm[64];
            snprintf(nm, sizeof nm, "gemm ta=%d tb=%d", ta, tb);
            cmp_tol(nm, G, R, nc, ATOL, RTOL); /* includes the padding, untouched */
            free(A), free(Bm), free(Cm), free(R), free(G);
            CK(cudaFree(dA));
            CK(cudaFree(dB));
            CK(cudaFree(dC));
        }
}

/* ---- mixed precision (kernels/zs_mixed.h) ----------------------------------------- */

/* Mixed ops read the same rounded operands on both sides, so GEMM results
 * differ only by the order of fp32 additions (the fp32 tolerances) - except
 * where an operand is an fp32 intermediate each side computed itself (the
 * attention probabilities, the softmax gradient D): an ulp apart near a
 * rounding tie, the two round to neighbouring 16-bit values, moving one
 * product by a 16-bit ulp. So: every element within 4 16-bit unit roundoffs
 * of max|cpu|, and at least 99% within the fp32 tolerances. */
static void cmp_mixed(const char *what, const float *g, const float *c, size_t n, int dt)
{
    double u16 = dt == ZS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11, mx = 0, emax = 0;
    size_t tight = 0;
    for (size_t i = 0; i < n; i++)
        mx = fabs(c[i]) > mx ? fabs(c[i]) : mx;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - c[i]);
        TEST_CHECKF(e <= 4 * u16 * mx, "%s[%zu]: GPU %.9g CPU %.9g (max|cpu| %.3g)", what, i, g[i],
                    c[i], mx);
        tight += e <= ATOL * mx + RTOL * fabs(c[i]);
        emax = e > emax ? e : emax;
    }
    TEST_CHECKF(tight >= n - n / 100, "%s: only %zu of %zu within the fp32 tolerances", what, tight,
                n);
    printf("  %-34s n=%8zu max abs err %.3g (max|cpu| %.3g), %.4f%% within fp32 tolerances\n", what,
           n, emax, mx, 100.0 * (double)tight / (double)(n ? n : 1));
}

/* The *_mixed launchers against the zs_op_*_mixed CPU twins, dt bf16 or
 * fp16, on shape s; the CPU rounds into a float scratch, the GPU into a
 * 16-bit one of the same element count. */
static void test_mixed(const shape_t *s, int dt)
{
    int B = s->B, T = s->T, C = s->C, NH = s->NH, N = B * T, IC = C, OC = 4 * C;
    const char *dn = dt == ZS_DTYPE_BF16 ? "bf16" : "fp16";
    char nm[96];
    printf("mixed-precision GPT ops (%s GEMM operands), %s:\n", dn, s->name);
    size_t need = zs_mixed_matmul_bwd_elems(N, IC, OC),
           na = zs_mixed_attention_bwd_elems(B, T, C, NH);
    need = na > need ? na : need;
    float *hscr = xmalloc(need * 4);
    void *dscr = dev(need * 2);
    zs_mixed_t hm = {dt, hscr, need}, dm = {dt, dscr, need};
    /* matmul forward and backward */
    {
        float *inp = rnd((size_t)N * IC, 1), *w = rnd((size_t)IC * OC, 0.3f), *b = rnd(OC, 0.5f);
        float *dout = rnd((size_t)N * OC, 0.1f), *dw0 = rnd((size_t)IC * OC, 0.1f),
              *db0 = rnd(OC, 0.1f);
        size_t no = (size_t)N * OC, ni = (size_t)N * IC, nw = (size_t)IC * OC;
        float *out = xmalloc(no * 4), *dinp = xmalloc(ni * 4), *dw = dupb(dw0, nw * 4),
              *db = dupb(db0, OC * 4);
        TEST_CHECK(zs_op_matmul_fwd_mixed(NULL, &hm, out, inp, w, b, N, IC, OC) == ZS_OK);
        TEST_CHECK(zs_op_matmul_bwd_mixed(NULL, &hm, dinp, dw, db, dout, inp, w, N, IC, OC) ==
                   ZS_OK);
        float *g_inp = up(inp, ni * 4), *g_w = up(w, nw * 4), *g_b = up(b, OC * 4),
              *g_dout = up(dout, no * 4), *g_out = dev(no * 4), *g_dinp = dev(ni * 4),
              *g_dw = up(dw0, nw * 4), *g_db = up(db0, OC * 4);
        long long epi0 = blas.bias_epilogues, fb0 = blas.bias_fallbacks;
        TEST_OK(zs_cuda_matmul_fwd_mixed(cs, &blas, &dm, g_out, g_inp, g_w, g_b, N, IC, OC, &err),
                err);
        /* the bias went through cuBLASLt's BIAS epilogue (or, where the
         * library offers no algorithm for it, the counted fallback) */
        TEST_CHECKF(blas.bias_epilogues + blas.bias_fallbacks == epi0 + fb0 + 1,
                    "%s matmul_fwd: the bias took neither the epilogue nor the fallback", dn);
        TEST_OK(zs_cuda_matmul_bwd_mixed(cs, &blas, &dm, g_dinp, g_dw, g_db, g_dout, g_inp, g_w, N,
                                         IC, OC, &err),
                err);
        sync_ok();
        float *h_out = down(g_out, no * 4), *h_dinp = down(g_dinp, ni * 4),
              *h_dw = down(g_dw, nw * 4), *h_db = down(g_db, OC * 4);
        snprintf(nm, sizeof nm, "%s matmul_fwd out", dn);
        cmp_tol(nm, h_out, out, no, ATOL, RTOL);
        snprintf(nm, sizeof nm, "%s matmul_bwd dinp", dn);
        cmp_tol(nm, h_dinp, dinp, ni, ATOL, RTOL);
        snprintf(nm, sizeof nm, "%s matmul_bwd dw", dn);
        cmp_tol(nm, h_dw, dw, nw, ATOL, RTOL);
        snprintf(nm, sizeof nm, "%s matmul_bwd db", dn);
        cmp_tol(nm, h_db, db, OC, ATOL, RTOL);
        /* a scratch one element short is refused before anything runs */
        zs_mixed_t small = {dt, dscr, zs_mixed_matmul_fwd_elems(N, IC, OC) - 1};
        TEST_CHECK(zs_cuda_matmul_fwd_mixed(cs, &blas, &small, g_out, g_inp, g_w, g_b, N, IC, OC,
                                            &err) == ZS_ERR_RANGE);
        free(inp), free(w), free(b), free(dout), free(dw0), free(db0), free(out), free(dinp);
        free(dw), free(db), free(h_out), free(h_dinp), free(h_dw), free(h_db);
        void *ds[] = {g_inp, g_w, g_b, g_dout, g_out, g_dinp, g_dw, g_db};
        for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
            CK(cudaFree(ds[i]));
    }
    /* matmul forward into a fill twin of its output (the model's stored
     * 16-bit activations): with the bias's exact 16-bit twin one GEMM with a
     * 16-bit output; without it the fp32 GEMM and a cast. The reference is
     * the plain fp32-output op and a cast. fp32 out is never written. */
    {
        size_t no = (size_t)N * OC;
        float *inp = rnd((size_t)N * IC, 1), *w = rnd((size_t)IC * OC, 0.3f), *b = rnd(OC, 0.5f);
        uint16_t *b16 = xmalloc(OC * 2);
        zs_cast(b16, (zs_dtype_t)dt, b, ZS_DTYPE_F32, OC); /* b16 exact; b its widened values */
        zs_cast(b, ZS_DTYPE_F32, b16, (zs_dtype_t)dt, OC);
        float *nan = xmalloc(no * 4);
        for (size_t i = 0; i < no; i++)
            nan[i] = NAN;
        float *g_inp = up(inp, (size_t)N * IC * 4), *g_w = up(w, (size_t)IC * OC * 4),
              *g_b = up(b, OC * 4), *g_ref = dev(no * 4), *g_out = up(nan, no * 4);
        void *g_b16 = up(b16, OC * 2), *g_ref16 = dev(no * 2), *g_h16 = dev(no * 2);
        TEST_OK(zs_cuda_matmul_fwd_mixed(cs, &blas, &dm, g_ref, g_inp, g_w, g_b, N, IC, OC, &err),
                err);
        TEST_OK(zs_cuda_cast(cs, g_ref16, (zs_dtype_t)dt, g_ref, ZS_DTYPE_F32, no, &err), err);
        uint16_t *ref16 = down(g_ref16, no * 2);
        struct cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        int emu = strstr(prop.name, "emulator") != NULL;
        for (int with_bias16 = 1; with_bias16 >= 0; with_bias16--) {
            zs_mixed_t tm = dm;
            tm.ntwins = 0;
            if (with_bias16)
                tm.twins[tm.ntwins++] = (zs_mixed_twin_t){g_b, g_b16, (size_t)OC, 0};
            tm.twins[tm.ntwins++] = (zs_mixed_twin_t){g_out, g_h16, no, 1};
            CK(cudaMemsetAsync(g_h16, 0xff, no * 2, cs)); /* NaNs: each run writes it all */
            long long o0 = blas.out16, f0 = blas.out16_fallbacks;
            TEST_OK(
                zs_cuda_matmul_fwd_mixed(cs, &blas, &tm, g_out, g_inp, g_w, g_b, N, IC, OC, &err),
                err);
            sync_ok();
            /* the 16-bit GEMM where the bias has its twin (or, where cuBLASLt
             * offers no algorithm for it, the counted fallback) */
            TEST_CHECKF(with_bias16 ? blas.out16 + blas.out16_fallbacks == o0 + f0 + 1
                                    : blas.out16 == o0 && blas.out16_fallbacks == f0 + 1,
                        "%s matmul_fwd into a fill twin (bias twin %d): out16 %lld -> %lld, "
                        "fallbacks %lld -> %lld",
                        dn, with_bias16, o0, blas.out16, f0, blas.out16_fallbacks);
            uint16_t *h16 = down(g_h16, no * 2);
            size_t diff = 0, far = 0;
            for (size_t i = 0; i < no; i++) {
                float a = zs_math_load(h16, dt, i), r = zs_math_load(ref16, dt, i);
                diff += h16[i] != ref16[i];
                /* a GPU's 16-bit GEMM may round another fp32 sum: one step */
                far += !(fabsf(a - r) <= (dt == ZS_DTYPE_BF16 ? 0x1p-7f : 0x1p-10f) * fabsf(r));
            }
            if (emu || !with_bias16 || blas.out16 == o0)
                TEST_CHECKF(diff == 0,
                            "%s matmul_fwd into a fill twin (bias twin %d): %zu of %zu "
                            "elements differ from the fp32 output cast",
                            dn, with_bias16, diff, no);
            TEST_CHECKF(far == 0,
                        "%s matmul_fwd into a fill twin: %zu of %zu elements more than "
                        "one rounding step from the fp32 output cast",
                        dn, far, no);
            if (blas.out16 > o0) { /* only the fallback uses out (as scratch) */
                float *o = down(g_out, no * 4);
                size_t written = 0;
                for (size_t i = 0; i < no; i++)
                    written += !isnan(o[i]);
                TEST_CHECKF(written == 0,
                            "%s matmul_fwd into a fill twin wrote %zu elements of out", dn,
                            written);
                free(o);
            }
            printf(
                "  %s matmul_fwd into a fill twin, bias twin %d: %zu of %zu elements differ from "
                "the fp32 output cast\n",
                dn, with_bias16, diff, no);
            free(h16);
        }
        free(inp), free(w), free(b), free(b16), free(nan), free(ref16);
        void *ds[] = {g_inp, g_w, g_b, g_ref, g_out, g_b16, g_ref16, g_h16};
        for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
            CK(cudaFree(ds[i]));
    }
    /* attention forward, then backward from the CPU's probabilities (same
     * input on both sides) */
    {
        size_t nq = (size_t)N * 3 * C, nt = (size_t)B * NH * T * T, nc = (size_t)N * C;
        float *qkv = rnd(nq, 1), *dout = rnd(nc, 0.1f);
        float *out = xmalloc(nc * 4), *att = xmalloc(nt * 4), *D = xmalloc(nt * 4),
              *dqkv = xmalloc(nq * 4);
        TEST_CHECK(zs_op_attention_fwd_mixed(NULL, &hm, out, att, qkv, B, T, C, NH) == ZS_OK);
        TEST_CHECK(zs_op_attention_bwd_mixed(NULL, &hm, dqkv, D, dout, qkv, att, B, T, C, NH) ==
                   ZS_OK);
        float *g_qkv = up(qkv, nq * 4), *g_dout = up(dout, nc * 4), *g_out = dev(nc * 4),
              *g_att = dev(nt * 4), *g_catt = up(att, nt * 4), *g_D = dev(nt * 4),
              *g_dqkv = dev(nq * 4);
        TEST_OK(zs_cuda_attention_fwd_mixed(cs, &blas, &dm, g_out, g_att, g_qkv, B, T, C, NH, &err),
                err);
        TEST_OK(zs_cuda_attention_bwd_mixed(cs, &blas, &dm, g_dqkv, g_D, g_dout, g_qkv, g_catt, B,
                                            T, C, NH, &err),
                err);
        sync_ok();
        float *h_out = down(g_out, nc * 4), *h_att = down(g_att, nt * 4),
              *h_dqkv = down(g_dqkv, nq * 4);
        snprintf(nm, sizeof nm, "%s attention_fwd att", dn);
        cmp_tol(nm, h_att, att, nt, ATOL, RTOL);
        snprintf(nm, sizeof nm, "%s attention_fwd out", dn);
        cmp_mixed(nm, h_out, out, nc, dt);
        snprintf(nm, sizeof nm, "%s attention_bwd dqkv", dn);
        cmp_mixed(nm, h_dqkv, dqkv, nq, dt);
        /* determinism: the backward again, bitwise */
        TEST_OK(zs_cuda_attention_bwd_mixed(cs, &blas, &dm, g_dqkv, g_D, g_dout, g_qkv, g_catt, B,
                                            T, C, NH, &err),
                err);
        sync_ok();
        float *h2 = down(g_dqkv, nq * 4);
        cmp_repeat("attention_bwd_mixed", h2, h_dqkv, nq * 4);
        free(qkv), free(dout), free(out), free(att), free(D), free(dqkv), free(h_out), free(h_att);
        free(h_dqkv), free(h2);
        void *ds[] = {g_qkv, g_dout, g_out, g_att, g_catt, g_D, g_dqkv};
        for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
            CK(cudaFree(ds[i]));
    }
    free(hscr);
    CK(cudaFree(dscr));
}

/* ---- fused (flash) attention (zs_cuda_flash.cu) ---------------------------------- */

/* zs_cuda_attention_flash_fwd / _bwd against the CPU twins
 * zs_op_attention_flash_*_mixed with the same dt: both round q, k, v (and
 * dout) the same way and round the probabilities of the same key tiles
 * (ZS_FLASH_BK) against the same running max, and dS, at the same points
 * (zs_mixed.h), so they differ only by fp32 summation order and expf's ulp,
 * except where an fp32 p or dS lies within that difference of a 16-bit
 * rounding tie: cmp_mixed, as for the unfused mixed attention (every
 * element within 4 16-bit unit roundoffs of max|cpu|, 99% within the fp32
 * tolerances). lse involves no rounded intermediate: fp32 tolerances. The
 * backward reads the CPU's out and lse (the same inputs on both sides).
 * Outputs are poisoned (NaN) first; both ops run twice, bitwise equal. */
static void test_flash(int B, int T, int C, int NH, int dt)
{
    const char *dn = dt == ZS_DTYPE_BF16 ? "bf16" : "fp16";
    char nm[96];
    printf("flash attention (%s), B=%d T=%d C=%d NH=%d (hs %d):\n", dn, B, T, C, NH, C / NH);
    size_t nq = (size_t)B * T * 3 * C, nc = (size_t)B * T * C, nl = (size_t)B * NH * T;
    size_t cap = zs_mixed_flash_bwd_elems(B, T, C);
    float *hscr = xmalloc(cap * 4), *qkv = rnd(nq, 1), *dout = rnd(nc, 0.1f);
    float *out = xmalloc(nc * 4), *lse = xmalloc(nl * 4), *dqkv = xmalloc(nq * 4);
    zs_mixed_t hm = {dt, hscr, cap}, dm = {dt, NULL, 0};
    TEST_CHECK(zs_op_attention_flash_fwd_mixed(NULL, &hm, out, lse, qkv, B, T, C, NH) == ZS_OK);
    TEST_CHECK(zs_op_attention_flash_bwd_mixed(NULL, &hm, dqkv, dout, qkv, out, lse, B, T, C, NH) ==
               ZS_OK);
    float *g_qkv = up(qkv, nq * 4), *g_dout = up(dout, nc * 4), *g_cout = up(out, nc * 4),
          *g_clse = up(lse, nl * 4), *g_out = dev(nc * 4), *g_lse = dev(nl * 4),
          *g_dqkv = dev(nq * 4);
    float *h[2][3];
    for (int run = 0; run < 2; run++) {
        CK(cudaMemsetAsync(g_out, 0xFF, nc * 4, cs));
        CK(cudaMemsetAsync(g_lse, 0xFF, nl * 4, cs));
        CK(cudaMemsetAsync(g_dqkv, 0xFF, nq * 4, cs));
        TEST_OK(zs_cuda_attention_flash_fwd(cs, &dm, g_out, g_lse, g_qkv, B, T, C, NH, &err), err);
        TEST_OK(zs_cuda_attention_flash_bwd(cs, &dm, g_dqkv, g_dout, g_qkv, g_cout, g_clse, B, T, C,
                                            NH, &err),
                err);
        sync_ok();
        h[run][0] = down(g_out, nc * 4);
        h[run][1] = down(g_lse, nl * 4);
        h[run][2] = down(g_dqkv, nq * 4);
    }
    snprintf(nm, sizeof nm, "%s flash_fwd out", dn);
    cmp_mixed(nm, h[0][0], out, nc, dt);
    snprintf(nm, sizeof nm, "%s flash_fwd lse", dn);
    cmp_tol(nm, h[0][1], lse, nl, ATOL, RTOL);
    snprintf(nm, sizeof nm, "%s flash_bwd dqkv", dn);
    cmp_mixed(nm, h[0][2], dqkv, nq, dt);
    cmp_repeat("flash_fwd out", h[1][0], h[0][0], nc * 4);
    cmp_repeat("flash_fwd lse", h[1][1], h[0][1], nl * 4);
    cmp_repeat("flash_bwd dqkv", h[1][2], h[0][2], nq * 4);
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 3; i++)
            free(h[run][i]);
    free(hscr), free(qkv), free(dout), free(out), free(lse), free(dqkv);
    void *ds[] = {g_qkv, g_dout, g_cout, g_clse, g_out, g_lse, g_dqkv};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        CK(cudaFree(ds[i]));
}

int main(void)
{
    test_args();

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        printf("SKIPPED: no usable GPU: cudaGetDeviceCount failed with %s (%s)\n",
               cudaGetErrorName(e), cudaGetErrorString(e));
        return 77;
    }
    if (count == 0) {
        printf("SKIPPED: no usable GPU: cudaGetDeviceCount found 0 devices\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaSetDevice(0));
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30));
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    size_t ws = 32u << 20;
    workspace = dev(ws);
    TEST_OK(zs_cuda_blas_init(&blas, workspace, ws, &err), err);

    /* ZS_TEST_CUDA_OPS=flash: only the flash cases (a quick loop while
     * working on zs_cuda_flash.cu; the ctest runs everything) */
    const char *only = getenv("ZS_TEST_CUDA_OPS");
    int flash_only = only && strcmp(only, "flash") == 0;
    if (!flash_only) {
        test_vec();
        test_cast_rows();
        test_gemm();
        static const shape_t shapes[] = {
            {"test model (tests/test_gpt.c)", 2, 8, 16, 2, 32},
            {"test model, perturbed", 3, 17, 64, 4, 96},
            {"GPT-2 width", 4, 64, 768, 12, 8192},
        };
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            test_gpt(&shapes[i]);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            test_mixed(&shapes[i], ZS_DTYPE_BF16);
            test_mixed(&shapes[i], ZS_DTYPE_F16);
        }
    }
    /* T not a multiple of the 64-row tiles (one and two tiles), hs 16 and 64 */
    static const int flash_shapes[][2] = {{40, 16}, {72, 64}, {72, 16}, {40, 64}}; /* T, hs */
    for (size_t i = 0; i < sizeof flash_shapes / sizeof flash_shapes[0]; i++) {
        test_flash(2, flash_shapes[i][0], 3 * flash_shapes[i][1], 3, ZS_DTYPE_BF16);
        test_flash(2, flash_shapes[i][0], 3 * flash_shapes[i][1], 3, ZS_DTYPE_F16);
    }
    printf("cuBLASLt: %lld GEMMs, %lld without a pedantic algorithm; bias epilogues %lld, "
           "fallbacks to the fill kernel %lld; 16-bit outputs %lld, fallbacks to a cast %lld\n",
           blas.gemms, blas.non_pedantic, blas.bias_epilogues, blas.bias_fallbacks, blas.out16,
           blas.out16_fallbacks);

    zs_cuda_blas_deinit(&blas);
    CK(cudaFree(workspace));
    CK(cudaStreamDestroy(cs));
    printf("test_cuda_ops: OK\n");
    return 0;
}
