/*
 * test_math.c - the shared CPU/CUDA formulas of kernels/zs_math.h against
 * references written independently of them (this is the CI check of the
 * math that the CUDA kernels run, since CI has no GPU):
 *
 *   bf16/fp16 -> fp32  all 65536 bit patterns, against a decode in double
 *                      (ldexp of sign, exponent, mantissa) and the NaN rules
 *                      of zs_cast.h; fp16 also against F16C when the CPU has it
 *   fp32 -> bf16/fp16  every upper-16-bit pattern with a set of low halves
 *                      (exact, just below / at / above the rounding point),
 *                      the midpoints between all consecutive 16-bit values and
 *                      their fp32 neighbours (ties), fp16 subnormals, the
 *                      overflow boundaries, NaN payloads, and 2^24 random
 *                      values, against round-to-nearest-even done in double
 *                      (and F16C for fp16)
 *   load / store       round trips and ZS_DTYPE_NONE storing nothing
 *   AdamW element      zs_math_adam_init + zs_math_adam_elem (with load/store)
 *                      bitwise against zs_adam_update_ref (zs_adam.c's
 *                      line-by-line reference) over modes, dtypes, steps and
 *                      special values; the per-step scalars against the
 *                      formulas documented in zs_adam.h
 *   GELU, gradient     against 0.5 x (1 + tanh(...)) and its derivative in
 *                      double, dense over [-12, 12] and at large |x|
 *   LayerNorm, xent    element helpers against double formulas
 *
 * Max errors are printed; tolerances are stated next to each check.
 */
#include <fenv.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_adam.h"
#include "zs_math.h"
#include "zs_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float bits_f(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint32_t f_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* ---- 16 -> 32 ------------------------------------------------------------------ */

/* Value of a 16-bit float with `mbits` mantissa bits and exponent bias
 * `bias` (bf16: 7, 127; fp16: 10, 15), decoded in double. */
static double decode16(uint16_t h, int mbits, int bias)
{
    int ebits = 15 - mbits;
    int s = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
    double v;
    if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp((double)(m | (1 << mbits)), e - bias - mbits);
    return s ? -v : v;
}

__attribute__((target("f16c"))) static float f16c_to_f32(uint16_t h)
{
    return _cvtsh_ss(h);
}

__attribute__((target("f16c"))) static uint16_t f16c_from_f32(float x)
{
    return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
}

static int have_f16c;

static void test_widen_exhaustive(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        /* bf16 */
        float b = zs_math_bf16_to_f32((uint16_t)h);
        int bnan = ((h >> 7) & 0xFF) == 0xFF && (h & 0x7F);
        int binf = ((h >> 7) & 0xFF) == 0xFF && !(h & 0x7F);
        if (bnan)
            TEST_CHECKF(f_bits(b) == h << 16, "bf16 NaN %04x -> %08x", h, f_bits(b));
        else if (binf)
            TEST_CHECKF(isinf(b) && !!signbit(b) == !!(h & 0x8000), "bf16 inf %04x", h);
        else
            TEST_CHECKF((double)b == decode16((uint16_t)h, 7, 127) &&
                            !!signbit(b) == !!(h & 0x8000),
                        "bf16 %04x -> %.9g want %.17g", h, b, decode16((uint16_t)h, 7, 127));
        /* fp16 */
        float f = zs_math_f16_to_f32((uint16_t)h);
        int e = (h >> 10) & 0x1F, m = h & 0x3FF;
        if (e == 31 && m) {
            uint32_t want = ((h & 0x8000u) << 16) | 0x7FC00000u | ((uint32_t)m << 13);
            TEST_CHECKF(f_bits(f) == want, "fp16 NaN %04x -> %08x want %08x", h, f_bits(f), want);
        } else if (e == 31) {
            TEST_CHECKF(isinf(f) && !!signbit(f) == !!(h & 0x8000), "fp16 inf %04x", h);
        } else {
            TEST_CHECKF((double)f == decode16((uint16_t)h, 10, 15) &&
                            !!signbit(f) == !!(h & 0x8000),
                        "fp16 %04x -> %.9g want %.17g", h, f, decode16((uint16_t)h, 10, 15));
        }
        if (have_f16c) {
            float hw = f16c_to_f32((uint16_t)h);
            TEST_CHECKF(f_bits(hw) == f_bits(f), "fp16 %04x: %08x, F16C %08x", h, f_bits(f),
                        f_bits(hw));
        }
    }
    printf("16 -> 32: all 65536 bf16 and fp16 patterns exact%s\n",
           have_f16c ? " (fp16 also equal to F16C)" : "");
}

/* ---- 32 -> 16: references in double ---------------------------------------------- */

/* Round |x| (finite, double-exact) to a multiple of `unit` to nearest even. */
static double rne(double ax, double unit)
{
    return nearbyint(ax / unit) * unit; /* FE_TONEAREST: ties to even */
}

/* fp32 -> bf16 by value: nearest of the 2^8-per-binade grid, ties to even,
 * overflow to Inf at maxfinite + half an ulp; NaN as zs_cast.h says. */
static uint16_t ref_bf16(float x)
{
    uint32_t u = f_bits(x);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40);
    if (isinf(x))
        return s | 0x7F80;
    double ax = fabs((double)x);
    if (ax == 0)
        return s;
    int e = ilogb(ax);
    if (e < -126)
        e = -126; /* fp32/bf16 subnormal grid */
    double r = rne(ax, ldexp(1.0, e - 7));
    if (r >= ldexp(1.0, 128))
        return s | 0x7F80;
    /* encode r (a bf16 value) through its fp32 bits: exact */
    return (uint16_t)(s | (f_bits((float)r) >> 16));
}

static uint16_t ref_f16(float x)
{
    uint32_t u = f_bits(x);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(x))
        return (uint16_t)(s | 0x7E00 | ((u >> 13) & 0x3FF));
    double ax = fabs((double)x);
    if (isinf(x) || ax >= 65520.0)
        return s | 0x7C00;
    int e = ax == 0 ? -14 : ilogb(ax);
    if (e < -14)
        e = -14;
    double r = rne(ax, ldexp(1.0, e - 10));
    if (r == 0)
        return s;
    if (r < ldexp(1.0, -14))
        return (uint16_t)(s | (uint16_t)(r / ldexp(1.0, -24))); /* subnormal */
    int re = ilogb(r);                                          /* a carry may bump it */
    uint16_t mant = (uint16_t)(r / ldexp(1.0, re - 10) - 1024.0);
    return (uint16_t)(s | (uint16_t)((re + 15) << 10) | mant);
}

static size_t n_narrow;

static void check_narrow(float x)
{
    uint16_t b = zs_math_f32_to_bf16(x), rb = ref_bf16(x);
    TEST_CHECKF(b == rb, "bf16(%08x = %.9g) = %04x want %04x", f_bits(x), x, b, rb);
    uint16_t h = zs_math_f32_to_f16(x), rh = ref_f16(x);
    TEST_CHECKF(h == rh, "fp16(%08x = %.9g) = %04x want %04x", f_bits(x), x, h, rh);
    if (have_f16c) {
        uint16_t hw = f16c_from_f32(x);
        TEST_CHECKF(h == hw, "fp16(%08x) = %04x, F16C %04x", f_bits(x), h, hw);
    }
    n_narrow++;
}

static void test_narrow(void)
{
    static const uint16_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000,
                                    0x3000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF};
    TEST_CHECK(fegetround() == FE_TONEAREST);
    /* every sign/exponent/top-mantissa pattern with low halves around the
     * bf16 rounding point (0x8000) and the fp16 one (0x1000 at bit 13) */
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++)
            check_narrow(bits_f(hi << 16 | lows[k]));
    /* midpoints between consecutive finite 16-bit values and their fp32
     * neighbours: the ties of both formats (both signs) */
    for (uint32_t h = 0; h < 0x7C00; h++) {
        double lo = decode16((uint16_t)h, 10, 15), hi = decode16((uint16_t)(h + 1), 10, 15);
        if (h + 1 == 0x7C00)
            hi = 65536.0;                   /* the overflow point past 65504 */
        float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
        for (int sgn = 0; sgn < 2; sgn++) {
            float m = sgn ? -mid : mid;
            check_narrow(m);
            check_narrow(nextafterf(m, INFINITY));
            check_narrow(nextafterf(m, -INFINITY));
        }
    }
    for (uint32_t h = 0; h < 0x7F80; h++) {
        float mid = bits_f(h << 16 | 0x8000); /* bf16 midpoints */
        check_narrow(mid);
        check_narrow(nextafterf(mid, 0.0f));
        check_narrow(-mid);
    }
    /* specials: zeros, extremes, overflow boundaries, NaN payloads */
    static const uint32_t sp[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000,
        0x7F7F8001, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x33000000, 0x33000001,
        0x32FFFFFF, 0x33800000, 0x387FC000, 0x387FE000, 0x38800000, 0x7F800000, 0xFF800000,
        0x7FC00000, 0x7F800001, 0xFFBFFFFF, 0x7FFFFFFF, 0x7FA00000, 0xFFC0DEAD};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        check_narrow(bits_f(sp[i]));
    for (int i = 0; i < 1 << 24; i++)
        check_narrow(bits_f(rnd32()));
    printf("32 -> 16: %zu fp32 values (ties, neighbours, subnormals, overflow, NaN, random) "
           "equal to the double-precision references%s\n",
           n_narrow, have_f16c ? " and F16C" : "");
}

/* ---- load / store -------------------------------------------------------------- */

static void test_load_store(void)
{
    float f[3] = {0};
    uint16_t h[3] = {0};
    float x = 1.0f + 0x1p-9f + 0x1p-12f; /* rounds differently in bf16 and fp16 */
    zs_math_store(f, ZS_DTYPE_F32, 1, x);
    TEST_CHECK(zs_math_load(f, ZS_DTYPE_F32, 1) == x && f[0] == 0 && f[2] == 0);
    zs_math_store(h, ZS_DTYPE_BF16, 1, x);
    TEST_CHECK(h[1] == zs_math_f32_to_bf16(x) && h[0] == 0 && h[2] == 0);
    TEST_CHECK(zs_math_load(h, ZS_DTYPE_BF16, 1) == zs_math_bf16_to_f32(h[1]));
    zs_math_store(h, ZS_DTYPE_F16, 2, x);
    TEST_CHECK(h[2] == zs_math_f32_to_f16(x) && h[2] != h[1]);
    TEST_CHECK(zs_math_load(h, ZS_DTYPE_F16, 2) == zs_math_f16_to_f32(h[2]));
    uint16_t before[3];
    memcpy(before, h, sizeof h);
    zs_math_store(h, ZS_DTYPE_NONE, 0, 5.0f);
    TEST_CHECK(memcmp(before, h, sizeof h) == 0);
    printf("load/store: fp32, bf16, fp16 round trips; NONE stores nothing\n");
}

/* ---- AdamW -------------------------------------------------------------------- */

static float rndf(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)rnd32() / 4294967296.0);
}

static void test_adam(void)
{
    enum { N = 4099 };
    static const int64_t ts[] = {1, 2, 7, 1000, 123456};
    static const zs_dtype_t gdts[] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};
    static const zs_dtype_t odts[] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16, ZS_DTYPE_NONE};
    float *p = malloc(N * 4), *m = malloc(N * 4), *v = malloc(N * 4);
    float *rp = malloc(N * 4), *rm = malloc(N * 4), *rv = malloc(N * 4);
    float *g32 = malloc(N * 4);
    uint16_t *g16 = malloc(N * 2);
    float *o = malloc(N * 4), *ro = malloc(N * 4);
    TEST_CHECK(p && m && v && rp && rm && rv && g32 && g16 && o && ro);
    int cases = 0;
    for (int mode = 0; mode < 8; mode++) {
        zs_adam_hparams_t hp = {1e-3f,        0.9f,       0.999f, 1e-8f, (mode & 1) ? 0.01f : 0.0f,
                                !!(mode & 2), !(mode & 4)};
        for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
            zs_adam_step_t st = {3e-4f * (float)(ti + 1), ts[ti], 1.0f / 3.0f, 0.75f};
            /* the documented per-step scalars */
            zs_math_adam_t c;
            zs_math_adam_init(&c, &hp, &st);
            double bc1 = hp.bias_correction ? 1.0 - pow(0.9f, (double)st.t) : 1.0;
            double bc2 = hp.bias_correction ? 1.0 - pow(0.999f, (double)st.t) : 1.0;
            TEST_CHECK(c.step_size == (float)(st.lr / bc1));
            TEST_CHECK(c.bc2_sqrt == (float)sqrt(bc2));
            TEST_CHECK(c.decay == (float)(1.0 - (double)st.lr * hp.weight_decay));
            TEST_CHECK(c.omb1 == 1.0f - 0.9f && c.omb2 == 1.0f - 0.999f);
            TEST_CHECK(c.l2 == (!hp.adam_w_mode && hp.weight_decay != 0));
            TEST_CHECK(c.decoupled == (hp.adam_w_mode && hp.weight_decay != 0));
            for (size_t gi = 0; gi < 3; gi++)
                for (size_t oi = 0; oi < 4; oi++) {
                    zs_dtype_t gdt = gdts[gi], odt = odts[oi];
                    for (int i = 0; i < N; i++) {
                        p[i] = rndf(-1, 1);
                        m[i] = rndf(-0.01f, 0.01f);
                        v[i] = rndf(0, 1e-4f);
                        float g = rndf(-3, 3);
                        if (i % 97 == 0) /* specials: zero / tiny / big grads, zero state */
                            g = (i % 3 == 0) ? 0.0f : (i % 3 == 1) ? 1e-30f : 6e4f;
                        if (i % 101 == 0)
                            m[i] = v[i] = 0.0f;
                        g32[i] = g;
                        g16[i] =
                            gdt == ZS_DTYPE_BF16 ? zs_math_f32_to_bf16(g) : zs_math_f32_to_f16(g);
                    }
                    const void *grad = gdt == ZS_DTYPE_F32 ? (const void *)g32 : (const void *)g16;
                    memcpy(rp, p, N * 4);
                    memcpy(rm, m, N * 4);
                    memcpy(rv, v, N * 4);
                    memset(o, 0xA5, N * 4);
                    memset(ro, 0xA5, N * 4);
                    zs_adam_update_ref(&hp, &st, rp, rm, rv, grad, gdt,
                                       odt == ZS_DTYPE_NONE ? NULL : ro, odt, N);
                    for (int i = 0; i < N; i++) {
                        zs_math_adam_elem(&c, zs_math_load(grad, gdt, i), &p[i], &m[i], &v[i]);
                        zs_math_store(o, odt, i, p[i]);
                    }
                    TEST_CHECKF(!memcmp(p, rp, N * 4) && !memcmp(m, rm, N * 4) &&
                                    !memcmp(v, rv, N * 4) && !memcmp(o, ro, N * 4),
                                "AdamW element differs from zs_adam_update_ref (mode %d, t %lld, "
                                "grad %s, out %s)",
                                mode, (long long)st.t, zs_dtype_name(gdt), zs_dtype_name(odt));
                    cases++;
                }
        }
    }
    printf("AdamW element: %d cases x %d elements bitwise equal to zs_adam_update_ref\n", cases, N);
    free(p), free(m), free(v), free(rp), free(rm), free(rv), free(g32), free(g16), free(o),
        free(ro);
}

/* ---- GELU --------------------------------------------------------------------- */

static double gelu_ref(double x)
{
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(u));
}

static double gelu_grad_ref(double x)
{
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    double du = sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
    double th = tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

static void test_gelu(void)
{
    /* tolerance: |a - b| <= 1e-6 * (1 + |b|) for the value and 4e-6 * (1 + |b|)
     * for the gradient: a few fp32 roundings of intermediate terms of size
     * O(1 + |x|); the gradient's (1 - s) term loses a little more */
    double e_f = 0, e_g = 0, r_f = 0, r_g = 0;
    int n = 0;
    for (int i = -6000000; i <= 6000000; i += 3) {
        float x = (float)i * 2e-6f;
        float dout = 1.0f - (float)(i % 7) * 0.25f;
        double rf = gelu_ref(x), rg = gelu_grad_ref(x) * dout;
        double f = zs_math_gelu(x), g = zs_math_gelu_grad(x, dout);
        double ef = fabs(f - rf), eg = fabs(g - rg);
        TEST_CHECKF(ef <= 1e-6 * (1 + fabs(rf)), "gelu(%.9g) = %.9g want %.12g", x, f, rf);
        TEST_CHECKF(eg <= 4e-6 * (1 + fabs(rg)), "gelu'(%.9g) * %g = %.9g want %.12g", x, dout, g,
                    rg);
        e_f = ef > e_f ? ef : e_f;
        e_g = eg > e_g ? eg : e_g;
        if (fabs(rf) > 1e-3 && ef / fabs(rf) > r_f)
            r_f = ef / fabs(rf);
        if (fabs(rg) > 1e-3 && eg / fabs(rg) > r_g)
            r_g = eg / fabs(rg);
        n++;
    }
    /* beyond ~5e19 the gradient's u' overflows and 0 * inf gives NaN (the
     * CPU formula, kept bit for bit) */
    static const float big[] = {20.0f, 100.0f, 1e4f, 1e18f};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        float x = big[i];
        TEST_CHECKF(zs_math_gelu(x) == x, "gelu(%g)", x);
        TEST_CHECKF(zs_math_gelu(-x) == 0.0f, "gelu(%g) = %g", -x, zs_math_gelu(-x));
        TEST_CHECKF(zs_math_gelu_grad(x, 1.0f) == 1.0f, "gelu'(%g)", x);
        TEST_CHECKF(zs_math_gelu_grad(-x, 1.0f) == 0.0f, "gelu'(%g)", -x);
    }
    printf("GELU: %d points in [-12, 12] vs double: max abs err %.3g (rel %.3g where |y| > 1e-3); "
           "gradient max abs err %.3g (rel %.3g)\n",
           n, e_f, r_f, e_g, r_g);
}

/* ---- LayerNorm and cross-entropy element helpers ----------------------------------- */

static void test_ln_xent(void)
{
    /* Each helper is a few fp32 roundings: |got - ref| <= 1e-6 * mag, mag the
     * sum of the magnitudes of the terms (the reference reuses the float
     * rstd, so its own rounding is not counted twice). */
    double e_max = 0;
    for (int i = 0; i < 200000; i++) {
        float x = rndf(-4, 4), mean = rndf(-1, 1), var = rndf(0, 3), w = rndf(-2, 2),
              b = rndf(-1, 1), d = rndf(-1, 1), dm = rndf(-0.1f, 0.1f), dnm = rndf(-0.1f, 0.1f);
        float r = zs_math_ln_rstd(var);
        double xm = (double)x - mean, n = xm * r;
        double refs[6] = {
            1.0 / sqrt((double)var + 1e-5),     n * w + b, (double)w * d, (double)w * d * xm * r,
            ((double)w * d - dm - n * dnm) * r, n * d};
        double mags[6] = {refs[0],
                          fabs(n * w) + fabs(b),
                          fabs(refs[2]),
                          fabs(refs[3]),
                          (fabs((double)w * d) + fabs(dm) + fabs(n * dnm)) * r,
                          fabs(refs[5])};
        float got[6] = {r,
                        zs_math_ln_out(x, mean, r, w, b),
                        zs_math_ln_dnorm(w, d),
                        zs_math_ln_dnorm_n(w * d, x, mean, r),
                        zs_math_ln_dx(x, mean, r, w, d, dm, dnm),
                        zs_math_ln_dw(x, mean, r, d)};
        for (int k = 0; k < 6; k++) {
            double e = fabs(got[k] - refs[k]);
            TEST_CHECKF(e <= 1e-6 * mags[k] + 1e-30, "LayerNorm helper %d: %.9g want %.12g", k,
                        got[k], refs[k]);
            e_max = e / mags[k] > e_max ? e / mags[k] : e_max;
        }
    }
    /* dlogit: the exp of a rounded difference (|l - lse| <= 45, so up to
     * 2e-6 relative) times scale, minus scale at the target */
    double x_max = 0;
    for (int i = 0; i < 200000; i++) {
        float l = rndf(-20, 20), lse = rndf(0, 25), s = rndf(0.001f, 2);
        int tgt = i % 5 == 0;
        double ex = s * exp((double)l - lse), ref = ex - s * tgt;
        double e = fabs(zs_math_xent_dlogit(l, lse, s, tgt) - ref);
        TEST_CHECKF(e <= 4e-6 * (ex + s * tgt), "xent dlogit(%g, %g, %g, %d)", l, lse, s, tgt);
        x_max = e / (ex + s * tgt) > x_max ? e / (ex + s * tgt) : x_max;
    }
    printf("LayerNorm helpers: max rel err %.3g (of the terms' magnitude); xent dlogit max rel err "
           "%.3g\n",
           e_max, x_max);
}

int main(void)
{
    have_f16c = __builtin_cpu_supports("f16c");
    test_widen_exhaustive();
    test_narrow();
    test_load_store();
    test_adam();
    test_gelu();
    test_ln_xent();
    printf("test_math: OK\n");
    return 0;
}
