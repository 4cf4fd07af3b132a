/*
 * test_cuda_attn.c - the fused (FlashAttention-2 style) causal attention on
 * CUDA, kernel level: zs_cuda_attention_flash_fwd / _bwd (zs_cuda_flash.cu)
 * against two CPU references, on a GPU or the CUDA emulator. Without a
 * usable GPU it prints "SKIPPED: <reason>" and exits 77.
 *
 * Each case (B, T, head size hs, NH heads, bf16 or fp16 operands) runs the
 * CUDA forward, then the CUDA backward on the forward's own out and lse,
 * twice, and checks:
 *   - the two runs are bitwise equal (out, lse, dqkv);
 *   - every output element was written (the outputs are NaN-filled before
 *     each run) and nothing past the end was (a guard of 64 rows past each
 *     output holds a sentinel); the inputs' 64 rows past the end are NaN, so
 *     a read past the last sequence's row T - 1 shows;
 *   - against the CPU twin (zs_op_attention_flash_*_mixed: the same 16-bit
 *     rounding points; its backward reads the CUDA forward's out and lse):
 *     max |cuda - twin| <= TWIN_U u x M;
 *   - against the exact attention in double of the operands the products
 *     read (qkv and dout rounded to the 16-bit dtype, zs_mixed.h's "flash"
 *     points; D from the fp32 dout): max |cuda - exact| <= EXACT_U u x M.
 *     (From the unrounded fp32 inputs the error of rounding q and k grows
 *     with the scores: 8 u at scores ~40, below; that is the mixed
 *     precision contract's, not the kernel's.)
 * u is the 16-bit unit roundoff (bf16 2^-8, fp16 2^-11), M per tensor the
 * largest magnitude of its terms, computed in double beside the exact
 * result (so a tensor whose exact value is 0, as dq and dk at T = 1, still
 * gets a scale): out_t: sum_u p_tu |v_u|; dv_u: sum_t p_tu |dout_t|; dq_t:
 * sum_u a_tu |k_u|, dk_u: sum_t a_tu |q_t| with a_tu = p_tu scale
 * (|dout_t| . |v_u| + |dout_t| . |out_t|); lse: max(1, max scale |q_t| .
 * |k_u|). dq, dk and dv are checked separately.
 *
 * Measured (emulator; the ctest entries' schedules and cases, 2026-11-28;
 * the largest over out, dq, dk, dv and all cases): CUDA vs twin 0.08 u
 * (bf16), 0.21 u (fp16, T = 1024 hs 128): fp32 summation orders and a
 * 16-bit rounding of p or dS flipped across a tie; CUDA vs exact 0.40 u
 * (bf16), 0.34 u (fp16), the twin vs exact the same (printed per case);
 * lse 3e-4 u (fp32 rounding only). Bounds: TWIN_U 0.5, EXACT_U 1, LSE_U
 * 0.01.
 *
 * Cases ("small", every run): T in {1, 7, 64} x hs in {64, 128} x bf16 /
 * fp16, B = 2, NH = 2 (two sequences, two heads interleaved in qkv); T =
 * 130 (three tiles, the last partial) hs 64 fp16 with large logits (q and k
 * in [-6, 6): scores up to ~40, the running max grows across tiles).
 * "long=HS/DT,...": T = 1024 (16 tiles), B = 1, NH = 1, the listed head
 * sizes and dtypes. Without arguments: everything (on a GPU).
 *
 * "skip": the kernel claims that key blocks past the diagonal are never
 * multiplied (16-key blocks: tiles past the diagonal skipped, and per warp
 * the blocks of the diagonal tile past its 16 rows). Observable: a NaN
 * that enters a product poisons it (0 x NaN = NaN on tensor cores, and in
 * the emulator), so with every input row >= P NaN (qkv, dout, and the
 * forward's out / lse), out, lse and dq of the rows < P must be bitwise
 * those of the clean run; and with every input row < P NaN, dk and dv of
 * the rows >= P must be (the backward's query blocks before a key block
 * are skipped). P in {16, 64, 80}, T = 144, hs 64, bf16, B = 1, NH = 2. A
 * kernel that computed the masked blocks and masked p after the product
 * would fail it.
 *
 * Not here: the refusals (fp32, head sizes, alignment: test_cuda_ops), the
 * model around the op (test_gpt_flash), speed.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cuda_gpt.h"
#include "zs_gpt_ops.h"
#include "zs_test.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        TEST_CHECKF(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                   \
    } while (0)

#define TWIN_U  0.5  /* CUDA vs the CPU twin, in u x M (see above) */
#define EXACT_U 1.0  /* CUDA vs the exact attention, in u x M */
#define LSE_U   0.01 /* lse, both comparisons, in u x M */
#define GUARD   64   /* rows past the end of every buffer */

static const uint32_t SENTINEL = 0x7fc0beefu; /* a NaN with a payload: the output guards */

static cudaStream_t cs;
static zs_err_t err;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

/* ---- host helpers ---------------------------------------------------------------- */

static float urand(void) /* [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(uint32_t)(rng >> 32) / 2147483648.0 - 1.0);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    TEST_CHECK(p != NULL);
    return p;
}

static double u16(int dt)
{
    return dt == ZS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
}

static const char *dname(int dt)
{
    return dt == ZS_DTYPE_BF16 ? "bf16" : "fp16";
}

static void fill_bits(void *p, uint32_t bits, size_t n)
{
    uint32_t *w = p;
    for (size_t i = 0; i < n; i++)
        w[i] = bits;
}

/* ---- device buffers: n floats and GUARD rows of `row` floats after them ---- */

typedef struct {
    float *d;
    size_t n, guard; /* floats */
} dbuf_t;

static dbuf_t dbuf(size_t n, size_t row)
{
    dbuf_t b = {NULL, n, GUARD * row};
    CK(cudaMalloc((void **)&b.d, (n + b.guard) * sizeof(float)));
    return b;
}

/* Host data into the buffer (n floats), the guard set to bits. */
static void dbuf_put(dbuf_t *b, const float *h, uint32_t bits)
{
    size_t tot = b->n + b->guard;
    float *t = xmalloc(tot * sizeof(float));
    memcpy(t, h, b->n * sizeof(float));
    fill_bits(t + b->n, bits, b->guard);
    CK(cudaMemcpyAsync(b->d, t, tot * sizeof(float), cudaMemcpyHostToDevice, cs));
    CK(cudaStreamSynchronize(cs));
    free(t);
}

/* An output buffer before a run: NaN (0xFF bytes), the guard SENTINEL. */
static void dbuf_poison(dbuf_t *b)
{
    size_t tot = b->n + b->guard;
    uint32_t *t = xmalloc(tot * sizeof(float));
    fill_bits(t, 0xffffffffu, b->n);
    fill_bits(t + b->n, SENTINEL, b->guard);
    CK(cudaMemcpyAsync(b->d, t, tot * sizeof(float), cudaMemcpyHostToDevice, cs));
    CK(cudaStreamSynchronize(cs));
    free(t);
}

/* The n floats of an output; checks they were all written (finite) and
 * the guard still holds SENTINEL. */
static float *dbuf_get(const dbuf_t *b, const char *what)
{
    size_t tot = b->n + b->guard;
    float *t = xmalloc(tot * sizeof(float));
    CK(cudaMemcpyAsync(t, b->d, tot * sizeof(float), cudaMemcpyDeviceToHost, cs));
    CK(cudaStreamSynchronize(cs));
    for (size_t i = 0; i < b->n; i++)
        TEST_CHECKF(isfinite(t[i]), "%s[%zu] = %g: not written (or non-finite)", what, i, t[i]);
    const uint32_t *g = (const uint32_t *)(t + b->n);
    for (size_t i = 0; i < b->guard; i++)
        TEST_CHECKF(g[i] == SENTINEL, "%s: written %zu floats past the end", what, i);
    return t;
}

static float *dbuf_get_raw(const dbuf_t *b)
{
    float *t = xmalloc(b->n * sizeof(float));
    CK(cudaMemcpyAsync(t, b->d, b->n * sizeof(float), cudaMemcpyDeviceToHost, cs));
    CK(cudaStreamSynchronize(cs));
    return t;
}

static void dbuf_free(dbuf_t *b)
{
    CK(cudaFree(b->d));
    b->d = NULL;
}

/* ---- the exact attention in double ------------------------------------------------ */

typedef struct {
    double *out, *lse, *dqkv;   /* exact results */
    double *mout, *mdqkv, mlse; /* magnitudes (M, see the header) */
} exact_t;

/* Forward and backward of causal attention in double, with the
 * magnitudes, from the operands the kernels' products read: qkv and dout
 * rounded to dt (zs_mixed.h's "flash" points); D = dout . out from the fp32
 * dout. */
static void exact_attn(exact_t *x, const float *qkv32, const float *dout32, int B, int T, int C,
                       int NH, int dt)
{
    size_t nq0 = (size_t)B * T * 3 * C, nc0 = (size_t)B * T * C;
    float *qkv = xmalloc(nq0 * 4), *dout = xmalloc(nc0 * 4);
    zs_op_round(NULL, dt, qkv, qkv32, nq0);
    zs_op_round(NULL, dt, dout, dout32, nc0);
    int hs = C / NH, ld = 3 * C;
    double scale = 1.0 / sqrt((double)hs);
    size_t nq = (size_t)B * T * ld, nc = (size_t)B * T * C;
    x->out = calloc(nc, sizeof(double));
    x->mout = calloc(nc, sizeof(double));
    x->lse = calloc((size_t)B * NH * T, sizeof(double));
    x->dqkv = calloc(nq, sizeof(double));
    x->mdqkv = calloc(nq, sizeof(double));
    double *s = xmalloc((size_t)T * sizeof(double));
    TEST_CHECK(x->out && x->mout && x->lse && x->dqkv && x->mdqkv);
    x->mlse = 1.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
            for (int t = 0; t < T; t++) {
                const float *q = base + (size_t)t * ld;
                double m = -INFINITY, l = 0;
                for (int u = 0; u <= t; u++) {
                    const float *k = base + (size_t)u * ld + C;
                    double d = 0, a = 0;
                    for (int i = 0; i < hs; i++) {
                        d += (double)q[i] * k[i];
                        a += fabs((double)q[i] * k[i]);
                    }
                    s[u] = d * scale;
                    m = fmax(m, s[u]);
                    x->mlse = fmax(x->mlse, a * scale);
                }
                for (int u = 0; u <= t; u++)
                    l += exp(s[u] - m);
                size_t ro = ((size_t)b * T + t) * C + (size_t)h * hs;
                double *o = x->out + ro, *mo = x->mout + ro;
                for (int u = 0; u <= t; u++) {
                    double p = exp(s[u] - m) / l;
                    const float *v = base + (size_t)u * ld + 2 * C;
                    for (int i = 0; i < hs; i++) {
                        o[i] += p * v[i];
                        mo[i] += p * fabs((double)v[i]);
                    }
                }
                x->lse[((size_t)b * NH + h) * T + t] = m + log(l);
            }
            /* backward from the exact out and lse */
            for (int t = 0; t < T; t++) {
                const float *q = base + (size_t)t * ld;
                size_t ro = ((size_t)b * T + t) * C + (size_t)h * hs;
                const float *dor = dout + ro;
                double D = 0, Da = 0, L = x->lse[((size_t)b * NH + h) * T + t];
                for (int i = 0; i < hs; i++) {
                    D += dout32[ro + i] * x->out[ro + i];
                    Da += fabs(dout32[ro + i] * x->out[ro + i]);
                }
                size_t go = ((size_t)b * T + t) * ld + (size_t)h * hs;
                double *dq = x->dqkv + go, *mdq = x->mdqkv + go;
                for (int u = 0; u <= t; u++) {
                    const float *k = base + (size_t)u * ld + C, *v = k + C;
                    size_t gu = ((size_t)b * T + u) * ld + (size_t)h * hs;
                    double *dk = x->dqkv + gu + C, *dv = dk + C, *mdk = x->mdqkv + gu + C,
                           *mdv = mdk + C;
                    double sd = 0, dp = 0, dpa = 0;
                    for (int i = 0; i < hs; i++) {
                        sd += (double)q[i] * k[i];
                        dp += (double)dor[i] * v[i];
                        dpa += fabs((double)dor[i] * v[i]);
                    }
                    double p = exp(sd * scale - L), ds = p * (dp - D) * scale,
                           da = p * (dpa + Da) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        mdq[i] += da * fabs((double)k[i]);
                        dk[i] += ds * q[i];
                        mdk[i] += da * fabs((double)q[i]);
                        dv[i] += p * dor[i];
                        mdv[i] += p * fabs((double)dor[i]);
                    }
                }
            }
        }
    free(s), free(qkv), free(dout);
}

static void exact_free(exact_t *x)
{
    free(x->out), free(x->mout), free(x->lse), free(x->dqkv), free(x->mdqkv);
}

/* max |a - ref| / M in units of u over the elements of part `part` (0 q,
 * 1 k, 2 v of each row of 3C; -1 every element), M = max mag (or mconst
 * when mag is NULL); a NULL ref is a float one (fref). */
static double err_u(const float *a, const double *ref, const float *fref, const double *mag,
                    double mconst, size_t n, int C, int part, double u)
{
    double e = 0, M = mconst;
    for (size_t i = 0; i < n; i++) {
        if (part >= 0 && (int)(i % (size_t)(3 * C)) / C != part)
            continue;
        double r = ref ? ref[i] : (double)fref[i], d = fabs((double)a[i] - r);
        if (isnan(d))
            return INFINITY; /* fmax would skip it */
        e = fmax(e, d);
        if (mag)
            M = fmax(M, mag[i]);
    }
    return M > 0 ? e / M / u : (e > 0 ? INFINITY : 0);
}

/* ---- one case ------------------------------------------------------------------- */

static double worst_twin, worst_exact, worst_lse;

/* Checks one tensor: CUDA vs twin and vs exact (both within their bounds),
 * the twin vs exact printed. */
static void check(const char *tag, const char *what, const float *g, const float *tw,
                  const double *ex, const double *mag, double mconst, size_t n, int C, int part,
                  double u)
{
    double et = err_u(g, NULL, tw, mag, mconst, n, C, part, u);
    double ee = err_u(g, ex, NULL, mag, mconst, n, C, part, u);
    double te = err_u(tw, ex, NULL, mag, mconst, n, C, part, u);
    printf("  %-4s vs twin %.3g u, vs exact %.3g u (twin vs exact %.3g u)\n", what, et, ee, te);
    int is_lse = strcmp(what, "lse") == 0;
    double bt = is_lse ? LSE_U : TWIN_U, be = is_lse ? LSE_U : EXACT_U;
    TEST_CHECKF(et <= bt, "%s %s: CUDA vs twin %.3g u > %.3g u", tag, what, et, bt);
    TEST_CHECKF(ee <= be, "%s %s: CUDA vs exact %.3g u > %.3g u", tag, what, ee, be);
    double *wt = is_lse ? &worst_lse : &worst_twin, *we = is_lse ? &worst_lse : &worst_exact;
    *wt = fmax(*wt, et);
    *we = fmax(*we, ee);
}

static void test_case(int B, int T, int hs, int NH, int dt, float amp)
{
    int C = hs * NH;
    zs_mixed_t dm = {dt, NULL, 0};
    size_t nq = (size_t)B * T * 3 * C, nc = (size_t)B * T * C, nl = (size_t)B * NH * T;
    char tag[96];
    snprintf(tag, sizeof tag, "%s B=%d T=%d hs=%d NH=%d amp=%g", dname(dt), B, T, hs, NH, amp);
    printf("flash %s:\n", tag);
    float *qkv = xmalloc(nq * 4), *dout = xmalloc(nc * 4);
    for (size_t i = 0; i < nq; i++)
        qkv[i] = (int)(i % (size_t)(3 * C)) < 2 * C ? amp * urand() : urand();
    for (size_t i = 0; i < nc; i++)
        dout[i] = urand();
    dbuf_t g_qkv = dbuf(nq, 3 * C), g_dout = dbuf(nc, C), g_out = dbuf(nc, C), g_lse = dbuf(nl, 1),
           g_dqkv = dbuf(nq, 3 * C);
    dbuf_put(&g_qkv, qkv, 0xffffffffu);
    dbuf_put(&g_dout, dout, 0xffffffffu);
    float *h[2][3];
    for (int run = 0; run < 2; run++) {
        dbuf_poison(&g_out);
        dbuf_poison(&g_lse);
        dbuf_poison(&g_dqkv);
        TEST_OK(zs_cuda_attention_flash_fwd(cs, &dm, g_out.d, g_lse.d, g_qkv.d, B, T, C, NH, &err),
                err);
        TEST_OK(zs_cuda_attention_flash_bwd(cs, &dm, g_dqkv.d, g_dout.d, g_qkv.d, g_out.d, g_lse.d,
                                            B, T, C, NH, &err),
                err);
        CK(cudaStreamSynchronize(cs));
        CK(cudaGetLastError());
        h[run][0] = dbuf_get(&g_out, "out");
        h[run][1] = dbuf_get(&g_lse, "lse");
        h[run][2] = dbuf_get(&g_dqkv, "dqkv");
    }
    TEST_CHECKF(memcmp(h[0][0], h[1][0], nc * 4) == 0, "%s: two runs' out differ", tag);
    TEST_CHECKF(memcmp(h[0][1], h[1][1], nl * 4) == 0, "%s: two runs' lse differ", tag);
    TEST_CHECKF(memcmp(h[0][2], h[1][2], nq * 4) == 0, "%s: two runs' dqkv differ", tag);
    printf("  two runs bitwise equal; outputs fully written, guards untouched\n");

    /* the twin: forward from qkv, backward from the CUDA forward's out / lse */
    size_t cap = zs_mixed_flash_bwd_elems(B, T, C);
    float *hscr = xmalloc(cap * 4), *tout = xmalloc(nc * 4), *tlse = xmalloc(nl * 4),
          *tdqkv = xmalloc(nq * 4);
    zs_mixed_t hm = {dt, hscr, cap};
    TEST_CHECK(zs_op_attention_flash_fwd_mixed(NULL, &hm, tout, tlse, qkv, B, T, C, NH) == ZS_OK);
    TEST_CHECK(zs_op_attention_flash_bwd_mixed(NULL, &hm, tdqkv, dout, qkv, h[0][0], h[0][1], B, T,
                                               C, NH) == ZS_OK);
    exact_t x;
    exact_attn(&x, qkv, dout, B, T, C, NH, dt);
    double u = u16(dt);
    check(tag, "out", h[0][0], tout, x.out, x.mout, 0, nc, C, -1, u);
    check(tag, "lse", h[0][1], tlse, x.lse, NULL, x.mlse, nl, C, -1, u);
    static const char *parts[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++)
        check(tag, parts[p], h[0][2], tdqkv, x.dqkv, x.mdqkv, 0, nq, C, p, u);
    exact_free(&x);
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 3; i++)
            free(h[run][i]);
    free(hscr), free(tout), free(tlse), free(tdqkv), free(qkv), free(dout);
    dbuf_free(&g_qkv), dbuf_free(&g_dout), dbuf_free(&g_out), dbuf_free(&g_lse), dbuf_free(&g_dqkv);
}

/* ---- masked blocks never multiplied (see the header) ----------------------------- */

/* Rows [r0, r1) of every sequence of a [B, T, w] tensor set to NaN. */
static void nan_rows(float *p, int B, int T, size_t w, int r0, int r1)
{
    for (int b = 0; b < B; b++)
        fill_bits(p + ((size_t)b * T + r0) * w, 0xffffffffu, (size_t)(r1 - r0) * w);
}

static void test_skip(void)
{
    const int B = 1, T = 144, hs = 64, NH = 2, C = hs * NH, dt = ZS_DTYPE_BF16;
    static const int Ps[] = {16, 64, 80};
    zs_mixed_t dm = {dt, NULL, 0};
    size_t nq = (size_t)B * T * 3 * C, nc = (size_t)B * T * C, nl = (size_t)B * NH * T;
    printf("flash masked blocks (bf16 B=%d T=%d hs=%d NH=%d): NaN rows must not reach the "
           "unmasked results\n",
           B, T, hs, NH);
    float *qkv = xmalloc(nq * 4), *dout = xmalloc(nc * 4);
    for (size_t i = 0; i < nq; i++)
        qkv[i] = (int)(i % (size_t)(3 * C)) < 2 * C ? 2 * urand() : urand();
    for (size_t i = 0; i < nc; i++)
        dout[i] = urand();
    dbuf_t g_qkv = dbuf(nq, 3 * C), g_dout = dbuf(nc, C), g_out = dbuf(nc, C), g_lse = dbuf(nl, 1),
           g_dqkv = dbuf(nq, 3 * C);
    /* the clean run */
    dbuf_put(&g_qkv, qkv, 0xffffffffu);
    dbuf_put(&g_dout, dout, 0xffffffffu);
    TEST_OK(zs_cuda_attention_flash_fwd(cs, &dm, g_out.d, g_lse.d, g_qkv.d, B, T, C, NH, &err),
            err);
    TEST_OK(zs_cuda_attention_flash_bwd(cs, &dm, g_dqkv.d, g_dout.d, g_qkv.d, g_out.d, g_lse.d, B,
                                        T, C, NH, &err),
            err);
    float *cout = dbuf_get_raw(&g_out), *clse = dbuf_get_raw(&g_lse),
          *cdqkv = dbuf_get_raw(&g_dqkv);
    float *pq = xmalloc(nq * 4), *pd = xmalloc(nc * 4), *po = xmalloc(nc * 4),
          *pl = xmalloc(nl * 4);
    for (size_t i = 0; i < sizeof Ps / sizeof Ps[0]; i++) {
        int P = Ps[i];
        /* future: rows >= P NaN; out, lse, dq of rows < P unchanged */
        memcpy(pq, qkv, nq * 4), memcpy(pd, dout, nc * 4);
        nan_rows(pq, B, T, 3 * (size_t)C, P, T);
        nan_rows(pd, B, T, C, P, T);
        dbuf_put(&g_qkv, pq, 0xffffffffu);
        dbuf_put(&g_dout, pd, 0xffffffffu);
        TEST_OK(zs_cuda_attention_flash_fwd(cs, &dm, g_out.d, g_lse.d, g_qkv.d, B, T, C, NH, &err),
                err);
        TEST_OK(zs_cuda_attention_flash_bwd(cs, &dm, g_dqkv.d, g_dout.d, g_qkv.d, g_out.d, g_lse.d,
                                            B, T, C, NH, &err),
                err);
        float *o = dbuf_get_raw(&g_out), *l = dbuf_get_raw(&g_lse), *g = dbuf_get_raw(&g_dqkv);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < P; t++) {
                size_t r = (size_t)b * T + t;
                TEST_CHECKF(memcmp(o + r * C, cout + r * C, (size_t)C * 4) == 0,
                            "NaN in rows >= %d changed out of row %d", P, t);
                TEST_CHECKF(memcmp(g + r * 3 * C, cdqkv + r * 3 * C, (size_t)C * 4) == 0,
                            "NaN in rows >= %d changed dq of row %d", P, t);
                for (int h = 0; h < NH; h++) {
                    size_t li = ((size_t)b * NH + h) * T + t;
                    TEST_CHECKF(memcmp(l + li, clse + li, 4) == 0,
                                "NaN in rows >= %d changed lse of row %d head %d", P, t, h);
                }
            }
        free(o), free(l), free(g);
        /* past: rows < P NaN (qkv, dout, out, lse); dk, dv of rows >= P unchanged */
        memcpy(pq, qkv, nq * 4), memcpy(pd, dout, nc * 4), memcpy(po, cout, nc * 4),
            memcpy(pl, clse, nl * 4);
        nan_rows(pq, B, T, 3 * (size_t)C, 0, P);
        nan_rows(pd, B, T, C, 0, P);
        nan_rows(po, B, T, C, 0, P);
        nan_rows(pl, B * NH, T, 1, 0, P);
        dbuf_put(&g_qkv, pq, 0xffffffffu);
        dbuf_put(&g_dout, pd, 0xffffffffu);
        dbuf_put(&g_out, po, SENTINEL);
        dbuf_put(&g_lse, pl, SENTINEL);
        TEST_OK(zs_cuda_attention_flash_bwd(cs, &dm, g_dqkv.d, g_dout.d, g_qkv.d, g_out.d, g_lse.d,
                                            B, T, C, NH, &err),
                err);
        g = dbuf_get_raw(&g_dqkv);
        for (int b = 0; b < B; b++)
            for (int t = P; t < T; t++) {
                size_t r = ((size_t)b * T + t) * 3 * C + C;
                TEST_CHECKF(memcmp(g + r, cdqkv + r, 2 * (size_t)C * 4) == 0,
                            "NaN in rows < %d changed dk / dv of row %d", P, t);
            }
        free(g);
        printf("  P=%3d: NaN rows >= P leave out, lse, dq of rows < P bitwise; NaN rows < P "
               "leave dk, dv of rows >= P bitwise\n",
               P);
    }
    free(pq), free(pd), free(po), free(pl), free(cout), free(clse), free(cdqkv), free(qkv),
        free(dout);
    dbuf_free(&g_qkv), dbuf_free(&g_dout), dbuf_free(&g_out), dbuf_free(&g_lse), dbuf_free(&g_dqkv);
}

/* ---- main ----------------------------------------------------------------------- */

static void run_small(void)
{
    static const int Ts[] = {1, 7, 64}, hss[] = {64, 128};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        for (size_t j = 0; j < sizeof hss / sizeof hss[0]; j++) {
            test_case(2, Ts[i], hss[j], 2, ZS_DTYPE_BF16, 2.0f);
            test_case(2, Ts[i], hss[j], 2, ZS_DTYPE_F16, 2.0f);
        }
    test_case(1, 130, 64, 1, ZS_DTYPE_F16, 6.0f);
}

/* "long=HS/DT[,HS/DT...]": T = 1024 cases; 0 on a bad spec. */
static int run_long(const char *spec)
{
    while (*spec) {
        int hs = 0, n = 0;
        char d[8] = "";
        if (sscanf(spec, "%d/%4[bf16p]%n", &hs, d, &n) != 2 || (hs != 64 && hs != 128) ||
            (strcmp(d, "bf16") != 0 && strcmp(d, "fp16") != 0))
            return 0;
        test_case(1, 1024, hs, 1, strcmp(d, "bf16") == 0 ? ZS_DTYPE_BF16 : ZS_DTYPE_F16, 2.0f);
        spec += n;
        if (*spec == ',')
            spec++;
        else if (*spec)
            return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("SKIPPED: no usable GPU: cudaGetDeviceCount %s, %d devices\n", cudaGetErrorName(e),
               count);
        return 77;
    }
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    if (argc == 1) {
        run_small();
        test_skip();
        TEST_CHECK(run_long("64/bf16,64/fp16,128/bf16,128/fp16"));
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "small") == 0)
            run_small();
        else if (strcmp(argv[i], "skip") == 0)
            test_skip();
        else
            TEST_CHECKF(strncmp(argv[i], "long=", 5) == 0 && run_long(argv[i] + 5),
                        "usage: %s [small] [skip] [long=HS/DT,...] (HS 64 or 128, DT bf16 or "
                        "fp16); no argument: all",
                        argv[0]);
    }
    printf("worst: CUDA vs twin %.3g u (bound %g), CUDA vs exact %.3g u (bound %g), lse %.3g u "
           "(bound %g)\n",
           worst_twin, TWIN_U, worst_exact, EXACT_U, worst_lse, LSE_U);
    CK(cudaStreamDestroy(cs));
    printf("test_cuda_attn: OK\n");
    return 0;
}
