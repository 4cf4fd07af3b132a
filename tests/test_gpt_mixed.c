/*
 * test_gpt_mixed.c - the mixed-precision GEMM ops of the GPT
 * (kernels/zs_gpt_mixed.c, rules in kernels/zs_mixed.h) against plain
 * double-precision loops that round the same operands with an independent
 * rounding (frexp + nearbyint, not zs_math.h's bit tricks).
 *
 *   1. zs_op_round against that rounding, bf16 and fp16, including fp16
 *      subnormals, ties and overflow;
 *   2. gemm (all four transposes, leading dimensions wider than the rows),
 *      matmul forward and backward (bias gradient from the fp32 dout) for
 *      bf16 and fp16: each output within the fp32 accumulation bound of the
 *      exact sum of rounded products, and farther than that from the fp32
 *      op (the rounding is seen);
 *   3. attention forward and backward stage by stage (each stage's
 *      reference starts from the kernel's previous fp32 result, so a
 *      rounding point in the wrong place shows at its stage);
 *   4. dt fp32 is the plain op bitwise; 3 threads equal 1 thread bitwise; a
 *      scratch one element short is ZS_ERR_RANGE with the outputs untouched.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_ops.h"
#include "zs_pool.h"
#include "zs_status.h"
#include "zs_test.h"

static zs_pool_t *pool3;
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static float urand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) * 0x1p-52 - 1.0);
}

static float *rnd(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    TEST_CHECK(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * urand();
    return p;
}

static float *zeros(size_t n)
{
    float *p = calloc(n, sizeof *p);
    TEST_CHECK(p != NULL);
    return p;
}

/* x rounded to nearest even with `bits` significant bits and normal
 * exponents down to emin (below: the subnormal step 2^(emin - bits + 1));
 * overflow past `maxv` gives +-inf. bf16: 8 bits, fp16: 11 bits, emin -14,
 * max 65504. nearbyint rounds half to even in the default mode. */
static double ref_round(int dt, double x)
{
    int bits = dt == ZS_DTYPE_BF16 ? 8 : 11, emin = dt == ZS_DTYPE_BF16 ? -126 : -14;
    double maxv = dt == ZS_DTYPE_BF16 ? 0x1.FEp127 : 65504.0;
    if (x == 0 || !isfinite(x))
        return x;
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    int ex = e - 1 < emin ? emin : e - 1;
    double step = ldexp(1.0, ex - bits + 1);
    double r = nearbyint(x / step) * step;
    if (fabs(r) > maxv) /* past the largest finite value after rounding */
        return copysign(INFINITY, x);
    return r;
}

static const char *dtn(int dt)
{
    return dt == ZS_DTYPE_BF16 ? "bf16" : "fp16";
}

/* ---- 1. rounding ---- */

static void test_round(int dt)
{
    enum { N = 4096 };
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = urand() * ldexpf(1.0f, (i % 40) - 30); /* 2^-30 .. 2^9 */
    /* ties: halfway between two 16-bit neighbours, both parities */
    int bits = dt == ZS_DTYPE_BF16 ? 8 : 11;
    for (int i = 0; i < 64; i++)
        in[i] = (float)((1.0 + (i + 0.5) * ldexp(1.0, 1 - bits)) * (i & 1 ? -1 : 1));
    in[64] = 65519.0f, in[65] = 65520.0f, in[66] = 1e-8f, in[67] = 0x1p-25f, in[68] = 0x1p-24f;
    zs_op_round(pool3, dt, out, in, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double r = ref_round(dt, in[i]);
        if (!((double)out[i] == r ||
              (isinf(r) && isinf(out[i]) && signbit(r) == signbit(out[i])))) {
            if (bad++ < 5)
                fprintf(stderr, "  %s round(%.9g) = %.9g, reference %.9g\n", dtn(dt), in[i], out[i],
                        r);
        }
    }
    TEST_CHECKF(bad == 0, "%s rounding: %d of %d differ", dtn(dt), bad, N);
    zs_op_round(pool3, dt, in, in, N); /* in place */
    TEST_CHECK(memcmp(in, out, sizeof in) == 0);
    printf("  %s round: %d values equal the reference (ties, subnormals, overflow)\n", dtn(dt), N);
}

/* ---- 2. gemm, matmul ---- */

/* Element (i, j) of op(X) for a row-major X with leading dimension ld. */
static double el(const float *X, int t, int i, int j, int ld)
{
    return t ? X[(size_t)j * ld + i] : X[(size_t)i * ld + j];
}

/* out[M, N] (ldc) against sum_k R(op(A)[i,k]) R(op(B)[k,j]) * alpha +
 * beta * c0, within the fp32 accumulation bound K 2^-23 sum |terms| plus
 * the final rounding. Returns the max error; *far = the smallest margin
 * by which the fp32-op result `plain` misses the same bound, as max over
 * elements of |plain - ref| / bound (must exceed 1 somewhere). */
static double check_gemm(const char *what, int dt, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta,
                         const float *c0, const float *out, const float *plain, int ldc,
                         double *far)
{
    double maxe = 0, worst_plain = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                double p =
                    ref_round(dt, el(A, ta, i, k, lda)) * ref_round(dt, el(B, tb, k, j, ldb));
                s += p;
                sa += fabs(p);
            }
            size_t o = (size_t)i * ldc + j;
            double ref = alpha * s + beta * c0[o];
            double bound = (K + 2) * 0x1p-23 * (fabs(alpha) * sa + fabs(beta * c0[o])) + 1e-30;
            double e = fabs(out[o] - ref);
            maxe = fmax(maxe, e);
            TEST_CHECKF(e <= bound, "%s %s (%d, %d): %.9g vs %.9g (bound %.3g)", what, dtn(dt), i,
                        j, out[o], ref, bound);
            worst_plain = fmax(worst_plain, fabs(plain[o] - ref) / bound);
        }
    *far = worst_plain;
    return maxe;
}

static void test_gemm(int dt)
{
    const int M = 19, N = 23, K = 37, pad = 5;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            float *A = rnd((size_t)(ta ? K : M) * lda, 1.0f);
            float *B = rnd((size_t)(tb ? N : K) * ldb, 1.0f);
            float *c0 = rnd((size_t)M * ldc, 1.0f);
            float *C = malloc((size_t)M * ldc * sizeof(float));
            float *P = malloc((size_t)M * ldc * sizeof(float));
            memcpy(C, c0, (size_t)M * ldc * sizeof(float));
            memcpy(P, c0, (size_t)M * ldc * sizeof(float));
            size_t need = zs_mixed_gemm_elems(ta, tb, M, N, K, lda, ldb);
            float *scr = malloc(need * sizeof(float));
            zs_mixed_t mx = {dt, scr, need};
            TEST_CHECK(zs_op_gemm_mixed(pool3, &mx, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C,
                                        ldc) == ZS_OK);
            zs_op_gemm(pool3, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, P, ldc);
            double far;
            double e = check_gemm("gemm", dt, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, c0, C,
                                  P, ldc, &far);
            printf("  %s gemm ta=%d tb=%d: max err %.3g; fp32 GEMM misses the bound by up to "
                   "%.0fx\n",
                   dtn(dt), ta, tb, e, far);
            TEST_CHECKF(far > 4, "%s gemm: the fp32 result is within the bound: no rounding?",
                        dtn(dt));
            /* one element short of scratch: refused, C untouched */
            zs_mixed_t small = {dt, scr, need - 1};
            memcpy(P, C, (size_t)M * ldc * sizeof(float));
            TEST_CHECK(zs_op_gemm_mixed(pool3, &small, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f,
                                        C, ldc) == ZS_ERR_RANGE);
            TEST_CHECK(memcmp(P, C, (size_t)M * ldc * sizeof(float)) == 0);
            free(A), free(B), free(c0), free(C), free(P), free(scr);
        }
}

static void test_matmul(int dt)
{
    const int N = 29, IC = 24, OC = 40;
    float *inp = rnd((size_t)N * IC, 1.0f), *w = rnd((size_t)IC * OC, 0.3f), *b = rnd(OC, 0.5f);
    float *dout = rnd((size_t)N * OC, 0.01f);
    size_t need = zs_mixed_matmul_bwd_elems(N, IC, OC);
    TEST_CHECK(need >= zs_mixed_matmul_fwd_elems(N, IC, OC));
    float *scr = malloc(need * sizeof(float));
    zs_mixed_t mx = {dt, scr, need};
    float *out = zeros((size_t)N * OC), *pout = zeros((size_t)N * OC),
          *zero = zeros((size_t)N * OC);
    TEST_CHECK(zs_op_matmul_fwd_mixed(pool3, &mx, out, inp, w, b, N, IC, OC) == ZS_OK);
    zs_op_matmul_fwd(pool3, pout, inp, w, b, N, IC, OC);
    /* out = inp w + bias: the bias as beta * c0 with c0 = bias rows */
    float *brows = zeros((size_t)N * OC);
    for (int r = 0; r < N; r++)
        memcpy(brows + (size_t)r * OC, b, OC * sizeof(float));
    double far, e = check_gemm("matmul_fwd", dt, 0, 0, N, OC, IC, 1.0f, inp, IC, w, OC, 1.0f, brows,
                               out, pout, OC, &far);
    printf("  %s matmul_fwd: max err %.3g (fp32 op off by up to %.0fx the bound)\n", dtn(dt), e,
           far);
    TEST_CHECK(far > 4);

    /* backward: dinp = R(dout) R(w)^T, dw += R(inp)^T R(dout), db += sum dout (fp32) */
    float *dinp = zeros((size_t)N * IC), *pdinp = zeros((size_t)N * IC);
    float *dw0 = rnd((size_t)IC * OC, 0.1f), *db0 = rnd(OC, 0.1f);
    float *dw = malloc((size_t)IC * OC * sizeof(float)), *db = malloc(OC * sizeof(float));
    float *pdw = malloc((size_t)IC * OC * sizeof(float)), *pdb = malloc(OC * sizeof(float));
    memcpy(dw, dw0, (size_t)IC * OC * sizeof(float)),
        memcpy(pdw, dw, (size_t)IC * OC * sizeof(float));
    memcpy(db, db0, OC * sizeof(float)), memcpy(pdb, db, OC * sizeof(float));
    TEST_CHECK(zs_op_matmul_bwd_mixed(pool3, &mx, dinp, dw, db, dout, inp, w, N, IC, OC) == ZS_OK);
    zs_op_matmul_bwd(pool3, pdinp, pdw, pdb, dout, inp, w, N, IC, OC);
    double f1, f2;
    double e1 = check_gemm("matmul_bwd dinp", dt, 0, 1, N, IC, OC, 1.0f, dout, OC, w, OC, 0.0f,
                           zero, dinp, pdinp, IC, &f1);
    double e2 = check_gemm("matmul_bwd dw", dt, 1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw0,
                           dw, pdw, OC, &f2);
    TEST_CHECK(f1 > 4 && f2 > 4);
    /* the bias gradient reads the fp32 dout: the fp32 op's, bitwise */
    TEST_CHECKF(memcmp(db, pdb, OC * sizeof(float)) == 0, "%s matmul_bwd: db differs from fp32",
                dtn(dt));
    printf("  %s matmul_bwd: dinp max err %.3g, dw %.3g; db equals the fp32 op's\n", dtn(dt), e1,
           e2);
    free(inp), free(w), free(b), free(dout), free(scr), free(out), free(pout), free(zero);
    free(brows), free(dinp), free(pdinp), free(dw0), free(db0), free(dw), free(db), free(pdw);
    free(pdb);
}

/* ---- 3. attention ---- */

typedef struct {
    int B, T, C, NH, hs;
} ashape_t;

static size_t qi(ashape_t s, int b, int t, int part, int h, int d) /* qkv [B, T, 3C] */
{
    return ((size_t)b * s.T + t) * 3 * s.C + (size_t)part * s.C + (size_t)h * s.hs + d;
}

static size_t ti(ashape_t s, int b, int h, int t, int u) /* [B, NH, T, T] */
{
    return (((size_t)b * s.NH + h) * s.T + t) * s.T + u;
}

static size_t ci(ashape_t s, int b, int t, int h, int d) /* [B, T, C] */
{
    return ((size_t)b * s.T + t) * s.C + (size_t)h * s.hs + d;
}

static void test_attention(int dt)
{
    ashape_t s = {2, 9, 16, 2, 8};
    size_t nqkv = (size_t)s.B * s.T * 3 * s.C, ntt = (size_t)s.B * s.NH * s.T * s.T;
    size_t nbtc = (size_t)s.B * s.T * s.C;
    float *qkv = rnd(nqkv, 1.0f), *dout = rnd(nbtc, 0.1f);
    float *out = zeros(nbtc), *att = zeros(ntt), *pout = zeros(nbtc), *patt = zeros(ntt);
    size_t need = zs_mixed_attention_bwd_elems(s.B, s.T, s.C, s.NH);
    TEST_CHECK(need >= zs_mixed_attention_fwd_elems(s.B, s.T, s.C, s.NH));
    float *scr = malloc(need * sizeof(float));
    zs_mixed_t mx = {dt, scr, need};
    TEST_CHECK(zs_op_attention_fwd_mixed(pool3, &mx, out, att, qkv, s.B, s.T, s.C, s.NH) == ZS_OK);
    zs_op_attention_fwd(pool3, pout, patt, qkv, s.B, s.T, s.C, s.NH);
    double scale = 1.0 / sqrt((double)s.hs), e_att = 0, e_out = 0, far_out = 0;
    float *D = zeros(ntt), *dqkv = zeros(nqkv), *pD = zeros(ntt), *pdqkv = zeros(nqkv);
    TEST_CHECK(zs_op_attention_bwd_mixed(pool3, &mx, dqkv, D, dout, qkv, att, s.B, s.T, s.C,
                                         s.NH) == ZS_OK);
    zs_op_attention_bwd(pool3, pdqkv, pD, dout, qkv, patt, s.B, s.T, s.C, s.NH);
    double e_dv = 0, e_ds = 0, e_dq = 0, e_dk = 0, far_dq = 0;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            double Dm[16][16], Ds[16][16];
            for (int t = 0; t < s.T; t++) {
                /* forward stage 1: probabilities from rounded q, k (double) */
                double sc[16], mx_ = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    double a = 0;
                    for (int d = 0; d < s.hs; d++)
                        a += ref_round(dt, qkv[qi(s, b, t, 0, h, d)]) *
                             ref_round(dt, qkv[qi(s, b, u, 1, h, d)]);
                    sc[u] = a * scale;
                    mx_ = fmax(mx_, sc[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += exp(sc[u] - mx_);
                for (int u = 0; u < s.T; u++) {
                    double p = u <= t ? exp(sc[u] - mx_) / sum : 0.0;
                    double e = fabs(att[ti(s, b, h, t, u)] - p);
                    e_att = fmax(e_att, e);
                    TEST_CHECKF(e <= 2e-6, "%s att (%d,%d,%d,%d): %.9g vs %.9g", dtn(dt), b, h, t,
                                u, att[ti(s, b, h, t, u)], p);
                }
                /* forward stage 2: out = R(att) R(v) from the kernel's att */
                for (int d = 0; d < s.hs; d++) {
                    double o = 0, oa = 0;
                    for (int u = 0; u <= t; u++) {
                        double p = ref_round(dt, att[ti(s, b, h, t, u)]) *
                                   ref_round(dt, qkv[qi(s, b, u, 2, h, d)]);
                        o += p, oa += fabs(p);
                    }
                    double bound = (s.T + 2) * 0x1p-23 * oa + 1e-30;
                    double e = fabs(out[ci(s, b, t, h, d)] - o);
                    e_out = fmax(e_out, e);
                    far_out = fmax(far_out, fabs(pout[ci(s, b, t, h, d)] - o) / bound);
                    TEST_CHECKF(e <= bound, "%s out: %.9g vs %.9g", dtn(dt), out[ci(s, b, t, h, d)],
                                o);
                }
                /* backward stage 1: Dm = R(dout) R(v)^T */
                for (int u = 0; u < s.T; u++) {
                    double a = 0;
                    for (int d = 0; d < s.hs; d++)
                        a += ref_round(dt, dout[ci(s, b, t, h, d)]) *
                             ref_round(dt, qkv[qi(s, b, u, 2, h, d)]);
                    Dm[t][u] = a;
                }
                /* stage 2: softmax backward on the fp32 att, then R */
                double dot = 0;
                for (int u = 0; u <= t; u++)
                    dot += att[ti(s, b, h, t, u)] * Dm[t][u];
                for (int u = 0; u < s.T; u++) {
                    Ds[t][u] = u <= t ? scale * att[ti(s, b, h, t, u)] * (Dm[t][u] - dot) : 0.0;
                    double k = D[ti(s, b, h, t, u)]; /* the kernel's rounded D */
                    double e = fabs(k - ref_round(dt, Ds[t][u]));
                    /* rounding may land on the other neighbour near a tie */
                    double tol = fabs(Ds[t][u]) * (dt == ZS_DTYPE_BF16 ? 0x1p-7 : 0x1p-10) + 1e-9;
                    e_ds = fmax(e_ds, e);
                    TEST_CHECKF(e <= tol, "%s D (%d,%d,%d,%d): %.9g vs R(%.9g)", dtn(dt), b, h, t,
                                u, k, Ds[t][u]);
                    TEST_CHECKF(ref_round(dt, k) == k,
                                "%s D (%d,%d,%d,%d) = %.9g is not a %s value", dtn(dt), b, h, t, u,
                                k, dtn(dt));
                }
            }
            for (int u = 0; u < s.T; u++)
                for (int d = 0; d < s.hs; d++) {
                    /* dv = R(att)^T R(dout) */
                    double a = 0, aa = 0;
                    for (int t = 0; t < s.T; t++) {
                        double p = ref_round(dt, att[ti(s, b, h, t, u)]) *
                                   ref_round(dt, dout[ci(s, b, t, h, d)]);
                        a += p, aa += fabs(p);
                    }
                    double e = fabs(dqkv[qi(s, b, u, 2, h, d)] - a);
                    e_dv = fmax(e_dv, e);
                    TEST_CHECKF(e <= (s.T + 2) * 0x1p-23 * aa + 1e-30, "%s dv: %.9g vs %.9g",
                                dtn(dt), dqkv[qi(s, b, u, 2, h, d)], a);
                    /* stage 3 from the kernel's rounded D: dq = D R(k), dk = D^T R(q) */
                    double q = 0, qa = 0, k = 0, ka = 0;
                    for (int v = 0; v < s.T; v++) {
                        double p = D[ti(s, b, h, u, v)] * ref_round(dt, qkv[qi(s, b, v, 1, h, d)]);
                        q += p, qa += fabs(p);
                        p = D[ti(s, b, h, v, u)] * ref_round(dt, qkv[qi(s, b, v, 0, h, d)]);
                        k += p, ka += fabs(p);
                    }
                    double bq = (s.T + 2) * 0x1p-23 * qa + 1e-30,
                           bk = (s.T + 2) * 0x1p-23 * ka + 1e-30;
                    double eq = fabs(dqkv[qi(s, b, u, 0, h, d)] - q);
                    double ek = fabs(dqkv[qi(s, b, u, 1, h, d)] - k);
                    e_dq = fmax(e_dq, eq), e_dk = fmax(e_dk, ek);
                    far_dq = fmax(far_dq, fabs(pdqkv[qi(s, b, u, 0, h, d)] - q) / bq);
                    TEST_CHECKF(eq <= bq, "%s dq: %.9g vs %.9g", dtn(dt),
                                dqkv[qi(s, b, u, 0, h, d)], q);
                    TEST_CHECKF(ek <= bk, "%s dk: %.9g vs %.9g", dtn(dt),
                                dqkv[qi(s, b, u, 1, h, d)], k);
                }
        }
    printf("  %s attention: att %.3g, out %.3g (fp32 op up to %.0fx the bound), dv %.3g, D %.3g, "
           "dq %.3g (fp32 op up to %.0fx), dk %.3g\n",
           dtn(dt), e_att, e_out, far_out, e_dv, e_ds, e_dq, far_dq, e_dk);
    TEST_CHECK(far_out > 4 && far_dq > 4);

    /* 3 threads vs 1: bitwise */
    float *out1 = zeros(nbtc), *att1 = zeros(ntt), *D1 = zeros(ntt), *dqkv1 = zeros(nqkv);
    TEST_CHECK(zs_op_attention_fwd_mixed(NULL, &mx, out1, att1, qkv, s.B, s.T, s.C, s.NH) == ZS_OK);
    TEST_CHECK(zs_op_attention_bwd_mixed(NULL, &mx, dqkv1, D1, dout, qkv, att1, s.B, s.T, s.C,
                                         s.NH) == ZS_OK);
    TEST_CHECK(memcmp(out1, out, nbtc * sizeof(float)) == 0);
    TEST_CHECK(memcmp(dqkv1, dqkv, nqkv * sizeof(float)) == 0);
    /* scratch one short: refused, nothing written */
    zs_mixed_t small = {dt, scr, zs_mixed_attention_fwd_elems(s.B, s.T, s.C, s.NH) - 1};
    memset(out1, 0, nbtc * sizeof(float));
    TEST_CHECK(zs_op_attention_fwd_mixed(pool3, &small, out1, att1, qkv, s.B, s.T, s.C, s.NH) ==
               ZS_ERR_RANGE);
    for (size_t i = 0; i < nbtc; i++)
        TEST_CHECK(out1[i] == 0.0f);
    free(qkv), free(dout), free(out), free(att), free(pout), free(patt), free(scr), free(D);
    free(dqkv), free(pD), free(pdqkv), free(out1), free(att1), free(D1), free(dqkv1);
}

/* ---- 4. fp32 passes through ---- */

static void test_fp32_is_plain(void)
{
    const int N = 17, IC = 12, OC = 20;
    float *inp = rnd((size_t)N * IC, 1.0f), *w = rnd((size_t)IC * OC, 0.3f), *b = rnd(OC, 0.5f);
    float *o1 = zeros((size_t)N * OC), *o2 = zeros((size_t)N * OC);
    zs_mixed_t f32 = {ZS_DTYPE_F32, NULL, 0};
    TEST_CHECK(zs_op_matmul_fwd_mixed(pool3, &f32, o1, inp, w, b, N, IC, OC) == ZS_OK);
    TEST_CHECK(zs_op_matmul_fwd_mixed(pool3, NULL, o2, inp, w, b, N, IC, OC) == ZS_OK);
    float *o3 = zeros((size_t)N * OC);
    zs_op_matmul_fwd(pool3, o3, inp, w, b, N, IC, OC);
    TEST_CHECK(memcmp(o1, o3, (size_t)N * OC * sizeof(float)) == 0);
    TEST_CHECK(memcmp(o2, o3, (size_t)N * OC * sizeof(float)) == 0);
    printf("  fp32 / NULL setting: the plain op, bitwise\n");
    free(inp), free(w), free(b), free(o1), free(o2), free(o3);
}

int main(void)
{
    pool3 = zs_pool_create(3);
    TEST_CHECK(pool3 != NULL);
    printf("test_gpt_mixed: 1. rounding\n");
    test_round(ZS_DTYPE_BF16);
    test_round(ZS_DTYPE_F16);
    printf("test_gpt_mixed: 2. gemm, matmul\n");
    for (int dt = ZS_DTYPE_BF16; dt <= ZS_DTYPE_F16; dt++) {
        test_gemm(dt);
        test_matmul(dt);
    }
    printf("test_gpt_mixed: 3. attention\n");
    test_attention(ZS_DTYPE_BF16);
    test_attention(ZS_DTYPE_F16);
    printf("test_gpt_mixed: 4. fp32\n");
    test_fp32_is_plain();
    zs_pool_destroy(pool3);
    printf("test_gpt_mixed: OK\n");
    return 0;
}
