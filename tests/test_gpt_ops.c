/*
 * test_gpt_ops.c - finite-difference checks of every GPT kernel's backward
 * (kernels/zs_gpt_ops.h), plus the forward of attention and LayerNorm
 * against plain double-precision loops.
 *
 * For an op y = f(x) and random weights w, the objective is S = sum_k w_k y_k.
 * The analytic gradient dS/dx_i (the op's backward with dout = w) is
 * compared with the central difference sum_k w_k (y_k(x + h e_i) -
 * y_k(x - h e_i)) / (x_i+ - x_i-), accumulated in double from the
 * difference of each output (so outputs that x_i does not touch contribute
 * exactly zero). Pass: |analytic - fd| <= atol + rtol |fd| + noise for
 * every input checked, noise being the bound on the final fp32 rounding of the
 * outputs that moved, sum_k |w_k| 2^-24 (|y_k+| + |y_k-|) / (x_i+ - x_i-),
 * checked (all of them, or an even sample for big tensors). Parameter
 * gradients start from non-zero values to check that they accumulate.
 * Every op runs on a 3-thread pool (shapes chosen so the splits have uneven
 * tails) and is also compared with the single-threaded run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_gpt_ops.h"
#include "zs_status.h"
#include "zs_pool.h"
#include "zs_test.h"

static zs_pool_t *pool;
static uint64_t rng_state = 0x1234567ull;

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

static float *dup(const float *p, size_t n)
{
    float *q = malloc(n * sizeof *q);
    TEST_CHECK(q != NULL);
    memcpy(q, p, n * sizeof *q);
    return q;
}

typedef void (*fwd_fn)(void *ctx, float *out);

/* Check grad (the analytic dS/dx, already minus any initial accumulator)
 * against central differences over x. Returns the max abs error. */
static double fd_check(const char *op, const char *wrt, fwd_fn fwd, void *ctx, float *x, size_t nx,
                       const double *grad, size_t nout, const float *w, float h, double atol,
                       double rtol, size_t max_checks)
{
    float *yp = malloc(nout * sizeof *yp), *ym = malloc(nout * sizeof *ym);
    TEST_CHECK(yp && ym);
    size_t step = nx > max_checks ? (nx + max_checks - 1) / max_checks : 1;
    double maxerr = 0, maxrel = 0;
    size_t checked = 0;
    for (size_t i = 0; i < nx; i += step) {
        float x0 = x[i], xp = x0 + h, xm = x0 - h;
        x[i] = xp;
        fwd(ctx, yp);
        x[i] = xm;
        fwd(ctx, ym);
        x[i] = x0;
        double s = 0, noise = 0;
        for (size_t k = 0; k < nout; k++) {
            s += (double)w[k] * ((double)yp[k] - (double)ym[k]);
            if (yp[k] != ym[k]) /* the final rounding of each output that moved */
                noise += fabs((double)w[k]) * 0x1p-24 * (fabs(yp[k]) + fabs(ym[k]));
        }
        double fd = s / ((double)xp - (double)xm);
        noise /= (double)xp - (double)xm;
        double e = fabs(grad[i] - fd);
        if (e > maxerr)
            maxerr = e;
        if (e / (fabs(fd) + 1e-3) > maxrel)
            maxrel = e / (fabs(fd) + 1e-3);
        TEST_CHECKF(e <= atol + rtol * fabs(fd) + noise,
                    "%s d/d%s[%zu]: analytic %.8g fd %.8g (rounding noise %.3g)", op, wrt, i,
                    grad[i], fd, noise);
        checked++;
    }
    printf("  %-10s d/d%-5s %6zu checked  max abs err %.3g  max rel err %.3g\n", op, wrt, checked,
           maxerr, maxrel);
    free(yp);
    free(ym);
    return maxerr;
}

/* grad[i] = after[i] - before[i] in double (the accumulated part). */
static double *accum_part(const float *after, const float *before, size_t n)
{
    double *g = malloc(n * sizeof *g);
    TEST_CHECK(g != NULL);
    for (size_t i = 0; i < n; i++)
        g[i] = (double)after[i] - (before ? (double)before[i] : 0.0);
    return g;
}

static void expect_same(const char *what, const float *a, const float *b, size_t n, double tol)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        m = e > m ? e : m;
    }
    TEST_CHECKF(m <= tol, "%s: 3 threads vs 1 differ by %.3g", what, m);
}

/* ---- embedding ---- */

typedef struct {
    int B, T, C, V;
    int32_t *tok;
    float *wte, *wpe;
    zs_pool_t *pool;
} embed_t;

static void embed_fwd(void *c, float *out)
{
    embed_t *e = c;
    zs_op_embed_fwd(e->pool, out, e->tok, e->wte, e->wpe, e->B, e->T, e->C);
}

static void test_embed(void)
{
    embed_t e = {3, 5, 20, 7, NULL, NULL, NULL, pool};
    size_t n = (size_t)e.B * e.T * e.C;
    e.tok = malloc((size_t)e.B * e.T * sizeof *e.tok);
    for (int i = 0; i < e.B * e.T; i++)
        e.tok[i] = i % 3 == 0 ? 2 : (i * 5) % e.V; /* repeated ids accumulate */
    e.wte = rnd((size_t)e.V * e.C, 1);
    e.wpe = rnd((size_t)e.T * e.C, 1);
    float *w = rnd(n, 1), *g0 = rnd((size_t)e.V * e.C, 0.5f), *p0 = rnd((size_t)e.T * e.C, 0.5f);
    float *dwte = dup(g0, (size_t)e.V * e.C), *dwpe = dup(p0, (size_t)e.T * e.C);
    zs_op_embed_bwd(pool, dwte, dwpe, w, e.tok, e.B, e.T, e.C);
    float *d1 = dup(g0, (size_t)e.V * e.C), *p1 = dup(p0, (size_t)e.T * e.C);
    zs_op_embed_bwd(NULL, d1, p1, w, e.tok, e.B, e.T, e.C);
    expect_same("embed dwte", dwte, d1, (size_t)e.V * e.C, 0);
    double *gw = accum_part(dwte, g0, (size_t)e.V * e.C),
           *gp = accum_part(dwpe, p0, (size_t)e.T * e.C);
    fd_check("embed", "wte", embed_fwd, &e, e.wte, (size_t)e.V * e.C, gw, n, w, 1e-2f, 1e-5, 1e-5,
             1000);
    fd_check("embed", "wpe", embed_fwd, &e, e.wpe, (size_t)e.T * e.C, gp, n, w, 1e-2f, 1e-5, 1e-5,
             1000);
    free(e.tok), free(e.wte), free(e.wpe), free(w), free(g0), free(p0), free(dwte), free(dwpe);
    free(d1), free(p1), free(gw), free(gp);
}

/* ---- LayerNorm ---- */

typedef struct {
    int N, C;
    float *inp, *w, *b, *mean, *rstd;
} ln_t;

static void ln_fwd(void *c, float *out)
{
    ln_t *l = c;
    zs_op_layernorm_fwd(pool, out, l->mean, l->rstd, l->inp, l->w, l->b, l->N, l->C);
}

static void test_layernorm(void)
{
    ln_t l = {13, 40, NULL, NULL, NULL, NULL, NULL};
    size_t n = (size_t)l.N * l.C;
    l.inp = rnd(n, 2);
    for (size_t i = 0; i < n; i++)
        l.inp[i] += 0.5f; /* a non-zero mean */
    l.w = rnd((size_t)l.C, 1);
    l.b = rnd((size_t)l.C, 1);
    l.mean = malloc((size_t)l.N * sizeof(float));
    l.rstd = malloc((size_t)l.N * sizeof(float));
    float *out = malloc(n * sizeof *out), *w = rnd(n, 1);
    ln_fwd(&l, out);
    /* forward vs double */
    double maxf = 0;
    for (int r = 0; r < l.N; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < l.C; c++)
            m += l.inp[r * l.C + c];
        m /= l.C;
        for (int c = 0; c < l.C; c++)
            v += (l.inp[r * l.C + c] - m) * (l.inp[r * l.C + c] - m);
        v /= l.C;
        for (int c = 0; c < l.C; c++) {
            double y = (l.inp[r * l.C + c] - m) / sqrt(v + 1e-5) * l.w[c] + l.b[c];
            maxf = fmax(maxf, fabs(y - out[r * l.C + c]));
        }
    }
    printf("  layernorm  forward vs double: max abs err %.3g\n", maxf);
    TEST_CHECK(maxf < 1e-5);
    float *dx0 = rnd(n, 0.5f), *dw0 = rnd((size_t)l.C, 0.5f), *db0 = rnd((size_t)l.C, 0.5f);
    float *dx = dup(dx0, n), *dw = dup(dw0, (size_t)l.C), *db = dup(db0, (size_t)l.C);
    zs_op_layernorm_bwd(pool, dx, dw, db, w, l.inp, l.w, l.mean, l.rstd, l.N, l.C);
    float *dx1 = dup(dx0, n), *dw1 = dup(dw0, (size_t)l.C), *db1 = dup(db0, (size_t)l.C);
    zs_op_layernorm_bwd(NULL, dx1, dw1, db1, w, l.inp, l.w, l.mean, l.rstd, l.N, l.C);
    expect_same("layernorm dinp", dx, dx1, n, 0);
    expect_same("layernorm dw", dw, dw1, (size_t)l.C, 0);
    double *gx = accum_part(dx, dx0, n), *gw = accum_part(dw, dw0, (size_t)l.C),
           *gb = accum_part(db, db0, (size_t)l.C);
    fd_check("layernorm", "inp", ln_fwd, &l, l.inp, n, gx, n, w, 1e-2f, 1e-4, 1e-3, 600);
    fd_check("layernorm", "w", ln_fwd, &l, l.w, (size_t)l.C, gw, n, w, 1e-2f, 1e-4, 1e-3, 600);
    fd_check("layernorm", "b", ln_fwd, &l, l.b, (size_t)l.C, gb, n, w, 1e-2f, 1e-4, 1e-3, 600);
    free(l.inp), free(l.w), free(l.b), free(l.mean), free(l.rstd), free(out), free(w);
    free(dx0), free(dw0), free(db0), free(dx), free(dw), free(db), free(dx1), free(dw1), free(db1);
    free(gx), free(gw), free(gb);
}

/* ---- matmul ---- */

typedef struct {
    int N, IC, OC;
    float *inp, *w, *bias;
} mm_t;

static void mm_fwd(void *c, float *out)
{
    mm_t *m = c;
    zs_op_matmul_fwd(pool, out, m->inp, m->w, m->bias, m->N, m->IC, m->OC);
}

/* The fused residual + LayerNorm: bitwise the residual then the LayerNorm
 * (the LayerNorm itself is checked above against double and finite
 * differences). */
static void test_residual_layernorm(void)
{
    int N = 11, C = 37;
    size_t n = (size_t)N * C;
    float *a = rnd(n, 2), *b = rnd(n, 1), *w = rnd((size_t)C, 1), *bias = rnd((size_t)C, 1);
    float *r1 = malloc(n * 4), *o1 = malloc(n * 4), *m1 = malloc((size_t)N * 4),
          *s1 = malloc((size_t)N * 4), *r2 = malloc(n * 4), *o2 = malloc(n * 4),
          *m2 = malloc((size_t)N * 4), *s2 = malloc((size_t)N * 4);
    TEST_CHECK(r1 && o1 && m1 && s1 && r2 && o2 && m2 && s2);
    zs_op_residual_fwd(pool, r1, a, b, n);
    zs_op_layernorm_fwd(pool, o1, m1, s1, r1, w, bias, N, C);
    zs_op_residual_layernorm_fwd(pool, r2, o2, m2, s2, a, b, w, bias, N, C);
    TEST_CHECKF(!memcmp(r1, r2, n * 4) && !memcmp(o1, o2, n * 4) &&
                    !memcmp(m1, m2, (size_t)N * 4) && !memcmp(s1, s2, (size_t)N * 4),
                "residual_layernorm_fwd differs from residual_fwd then layernorm_fwd");
    printf("residual_layernorm_fwd: bitwise residual_fwd then layernorm_fwd\n");
    /* with the residual rounded where it is stored (16-bit activations):
     * bitwise the residual, the device's round (zs_cast there and back)
     * and the LayerNorm of the rounded values */
    uint16_t *h1 = malloc(n * 2), *h2 = malloc(n * 2);
    TEST_CHECK(h1 && h2);
    for (int dt = ZS_DTYPE_BF16; dt; dt = dt == ZS_DTYPE_BF16 ? ZS_DTYPE_F16 : 0) {
        zs_op_residual_fwd(pool, r1, a, b, n);
        zs_cast(h1, (zs_dtype_t)dt, r1, ZS_DTYPE_F32, n);
        zs_cast(r1, ZS_DTYPE_F32, h1, (zs_dtype_t)dt, n);
        zs_op_layernorm_fwd(pool, o1, m1, s1, r1, w, bias, N, C);
        zs_op_residual_layernorm_fwd_dt(pool, r2, h2, dt, o2, m2, s2, a, b, w, bias, N, C);
        TEST_CHECKF(!memcmp(h1, h2, n * 2) && !memcmp(r1, r2, n * 4) && !memcmp(o1, o2, n * 4) &&
                        !memcmp(m1, m2, (size_t)N * 4) && !memcmp(s1, s2, (size_t)N * 4),
                    "residual_layernorm_fwd_dt (%s) differs from residual_fwd, the round and "
                    "layernorm_fwd",
                    zs_dtype_name(dt));
        size_t rounded = 0;
        for (size_t i = 0; i < n; i++) {
            float x = a[i] + b[i];
            rounded += memcmp(&x, &r2[i], 4) != 0;
        }
        TEST_CHECKF(rounded > n / 2, "residual_layernorm_fwd_dt (%s): res left unrounded",
                    zs_dtype_name(dt));
    }
    printf("residual_layernorm_fwd_dt: bitwise residual_fwd, the 16-bit round and layernorm_fwd "
           "(bf16, fp16)\n");
    free(h1), free(h2);
    free(a), free(b), free(w), free(bias), free(r1), free(o1), free(m1), free(s1), free(r2),
        free(o2), free(m2), free(s2);
}

static void test_matmul(int N, int IC, int OC)
{
    mm_t m = {N, IC, OC, NULL, NULL, NULL};
    size_t ni = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
    m.inp = rnd(ni, 1);
    m.w = rnd(nw, 0.5f);
    m.bias = rnd((size_t)OC, 1);
    float *out = malloc(no * sizeof *out), *w = rnd(no, 1);
    mm_fwd(&m, out);
    double maxf = 0;
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double s = m.bias[o];
            for (int i = 0; i < IC; i++)
                s += (double)m.inp[(size_t)r * IC + i] * m.w[(size_t)i * OC + o];
            maxf = fmax(maxf, fabs(s - out[(size_t)r * OC + o]));
        }
    printf("  matmul     %dx%dx%d forward vs double: max abs err %.3g\n", N, IC, OC, maxf);
    TEST_CHECK(maxf < 1e-5 * IC);
    float *dx = rnd(ni, 1), *dw0 = rnd(nw, 0.5f), *db0 = rnd((size_t)OC, 0.5f);
    float *dw = dup(dw0, nw), *db = dup(db0, (size_t)OC);
    zs_op_matmul_bwd(pool, dx, dw, db, w, m.inp, m.w, N, IC, OC);
    float *dx1 = rnd(ni, 1), *dw1 = dup(dw0, nw), *db1 = dup(db0, (size_t)OC);
    zs_op_matmul_bwd(NULL, dx1, dw1, db1, w, m.inp, m.w, N, IC, OC);
    expect_same("matmul dinp", dx, dx1, ni, 1e-5);
    expect_same("matmul dw", dw, dw1, nw, 1e-5);
    expect_same("matmul db", db, db1, (size_t)OC, 0);
    double *gx = accum_part(dx, NULL, ni), *gw = accum_part(dw, dw0, nw),
           *gb = accum_part(db, db0, (size_t)OC);
    fd_check("matmul", "inp", mm_fwd, &m, m.inp, ni, gx, no, w, 1e-2f, 2e-4, 1e-3, 300);
    fd_check("matmul", "w", mm_fwd, &m, m.w, nw, gw, no, w, 1e-2f, 2e-4, 1e-3, 300);
    fd_check("matmul", "bias", mm_fwd, &m, m.bias, (size_t)OC, gb, no, w, 1e-2f, 2e-4, 1e-3, 300);
    free(m.inp), free(m.w), free(m.bias), free(out), free(w), free(dx), free(dw0), free(db0);
    free(dw), free(db), free(dx1), free(dw1), free(db1), free(gx), free(gw), free(gb);
}

/* ---- attention ---- */

typedef struct {
    int B, T, C, NH;
    float *qkv, *att;
} at_t;

static void at_fwd(void *c, float *out)
{
    at_t *a = c;
    zs_op_attention_fwd(pool, out, a->att, a->qkv, a->B, a->T, a->C, a->NH);
}

static void test_attention(int B, int T, int C, int NH)
{
    at_t a = {B, T, C, NH, NULL, NULL};
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    int hs = C / NH;
    a.qkv = rnd(nq, 1.5f);
    a.att = malloc(na * sizeof(float));
    float *out = malloc(no * sizeof *out), *w = rnd(no, 1);
    at_fwd(&a, out);
    /* forward vs double, probabilities causal and normalised */
    double maxf = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double s[256], mx = -1e300, sum = 0;
                TEST_CHECK(T <= 256);
                for (int u = 0; u <= t; u++) {
                    double d = 0;
                    for (int k = 0; k < hs; k++)
                        d += (double)a.qkv[((size_t)b * T + t) * 3 * C + h * hs + k] *
                             a.qkv[((size_t)b * T + u) * 3 * C + C + h * hs + k];
                    s[u] = d / sqrt((double)hs);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += (s[u] = exp(s[u] - mx));
                const float *arow = a.att + (((size_t)b * NH + h) * T + t) * T;
                double psum = 0;
                for (int u = 0; u < T; u++) {
                    psum += arow[u];
                    if (u > t)
                        TEST_CHECK(arow[u] == 0.0f);
                }
                TEST_CHECK(fabs(psum - 1) < 1e-5);
                for (int k = 0; k < hs; k++) {
                    double y = 0;
                    for (int u = 0; u <= t; u++)
                        y += s[u] / sum * a.qkv[((size_t)b * T + u) * 3 * C + 2 * C + h * hs + k];
                    maxf = fmax(maxf, fabs(y - out[((size_t)b * T + t) * C + h * hs + k]));
                }
            }
    printf("  attention  B%d T%d C%d NH%d forward vs double: max abs err %.3g\n", B, T, C, NH,
           maxf);
    TEST_CHECK(maxf < 1e-5);
    float *scratch = malloc(na * sizeof(float)), *dq = rnd(nq, 1), *dq1 = rnd(nq, 1);
    zs_op_attention_bwd(pool, dq, scratch, w, a.qkv, a.att, B, T, C, NH);
    zs_op_attention_bwd(NULL, dq1, scratch, w, a.qkv, a.att, B, T, C, NH);
    expect_same("attention dqkv", dq, dq1, nq, 0);
    double *g = accum_part(dq, NULL, nq);
    fd_check("attention", "qkv", at_fwd, &a, a.qkv, nq, g, no, w, 1e-2f, 1e-4, 1e-3, 1500);
    free(a.qkv), free(a.att), free(out), free(w), free(scratch), free(dq), free(dq1), free(g);
}

/* ---- flash attention twin ---- */

typedef struct {
    int B, T, C, NH;
    float *qkv, *lse;
} fl_t;

static void fl_fwd(void *c, float *out)
{
    fl_t *a = c;
    zs_op_attention_flash_fwd(pool, out, a->lse, a->qkv, a->B, a->T, a->C, a->NH);
}

/* zs_op_attention_flash_fwd / _bwd against the unfused ops (fp32: both are
 * exact attention, so they differ by fp32 rounding of other summation
 * orders: abs 2e-6 on values of order 1), lse against double, the pool
 * split bitwise, the backward by finite differences of the flash forward,
 * and the bf16 / fp16 twins (zs_op_attention_flash_*_mixed) within a few
 * 16-bit roundoffs of fp32. T > ZS_FLASH_BK exercises several key tiles. */
static void test_flash(int B, int T, int C, int NH)
{
    fl_t a = {B, T, C, NH, NULL, NULL};
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T,
           nl = (size_t)B * NH * T;
    int hs = C / NH;
    a.qkv = rnd(nq, 1.5f);
    a.lse = malloc(nl * sizeof(float));
    float *out = malloc(no * 4), *uout = malloc(no * 4), *att = malloc(na * 4),
          *scr = malloc(na * 4), *w = rnd(no, 1), *dq = rnd(nq, 1), *udq = malloc(nq * 4),
          *dq1 = rnd(nq, 1), *out1 = malloc(no * 4), *lse1 = malloc(nl * 4);
    fl_fwd(&a, out);
    zs_op_attention_fwd(pool, uout, att, a.qkv, B, T, C, NH);
    double mo = 0, ml = 0;
    for (size_t i = 0; i < no; i++)
        mo = fmax(mo, fabs((double)out[i] - uout[i]));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double s[256], mx = -1e300, sum = 0;
                TEST_CHECK(T <= 256);
                for (int u = 0; u <= t; u++) {
                    double d = 0;
                    for (int k = 0; k < hs; k++)
                        d += (double)a.qkv[((size_t)b * T + t) * 3 * C + h * hs + k] *
                             a.qkv[((size_t)b * T + u) * 3 * C + C + h * hs + k];
                    s[u] = d / sqrt((double)hs);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += exp(s[u] - mx);
                ml = fmax(ml, fabs(mx + log(sum) - a.lse[((size_t)b * NH + h) * T + t]));
            }
    printf("  flash      B%d T%d C%d NH%d forward: out vs unfused %.3g, lse vs double %.3g\n", B, T,
           C, NH, mo, ml);
    TEST_CHECK(mo < 2e-6);
    TEST_CHECK(ml < 1e-5);
    zs_op_attention_flash_fwd(NULL, out1, lse1, a.qkv, B, T, C, NH);
    expect_same("flash out", out, out1, no, 0);
    expect_same("flash lse", a.lse, lse1, nl, 0);
    zs_op_attention_flash_bwd(pool, dq, w, a.qkv, out, a.lse, B, T, C, NH);
    zs_op_attention_flash_bwd(NULL, dq1, w, a.qkv, out, a.lse, B, T, C, NH);
    expect_same("flash dqkv", dq, dq1, nq, 0);
    zs_op_attention_bwd(pool, udq, scr, w, a.qkv, att, B, T, C, NH);
    double mg = 0, mgs = 0;
    for (size_t i = 0; i < nq; i++) {
        mg = fmax(mg, fabs((double)dq[i] - udq[i]));
        mgs = fmax(mgs, fabs(udq[i]));
    }
    printf("  flash      backward: dqkv vs unfused %.3g (max|dqkv| %.3g)\n", mg, mgs);
    TEST_CHECK(mg < 1e-5 * (mgs > 1 ? mgs : 1));
    double *g = accum_part(dq, NULL, nq);
    fd_check("flash", "qkv", fl_fwd, &a, a.qkv, nq, g, no, w, 1e-2f, 1e-4, 1e-3, 1000);
    /* bf16 / fp16: rounded q, k, v and p move out by a few 16-bit roundoffs
     * of max|out| (|out| <= max|v|, sum of the rounded p within (1 + u) of
     * l); the same for dqkv relative to its max */
    for (int dt = ZS_DTYPE_BF16; dt; dt = dt == ZS_DTYPE_BF16 ? ZS_DTYPE_F16 : 0) {
        double u16 = dt == ZS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
        size_t cap = zs_mixed_flash_bwd_elems(B, T, C);
        float *scratch = malloc(cap * 4), *mout = malloc(no * 4), *mlse = malloc(nl * 4),
              *mdq = malloc(nq * 4);
        zs_mixed_t mx = {dt, scratch, cap},
                   small = {dt, scratch, zs_mixed_flash_fwd_elems(B, T, C) - 1};
        TEST_CHECK(zs_op_attention_flash_fwd_mixed(pool, &small, mout, mlse, a.qkv, B, T, C, NH) ==
                   ZS_ERR_RANGE);
        TEST_CHECK(zs_op_attention_flash_fwd_mixed(pool, &mx, mout, mlse, a.qkv, B, T, C, NH) ==
                   ZS_OK);
        TEST_CHECK(zs_op_attention_flash_bwd_mixed(pool, &mx, mdq, w, a.qkv, mout, mlse, B, T, C,
                                                   NH) == ZS_OK);
        double eo = 0, mxo = 0, eg = 0;
        for (size_t i = 0; i < no; i++) {
            eo = fmax(eo, fabs((double)mout[i] - out[i]));
            mxo = fmax(mxo, fabs(out[i]));
        }
        for (size_t i = 0; i < nq; i++)
            eg = fmax(eg, fabs((double)mdq[i] - dq[i]));
        printf("  flash      %s twin vs fp32: out %.3g (max %.3g), dqkv %.3g (max %.3g)\n",
               dt == ZS_DTYPE_BF16 ? "bf16" : "fp16", eo, mxo, eg, mgs);
        TEST_CHECK(eo < 16 * u16 * mxo);
        TEST_CHECK(eg < 16 * u16 * mgs);
        free(scratch), free(mout), free(mlse), free(mdq);
    }
    free(a.qkv), free(a.lse), free(out), free(uout), free(att), free(scr), free(w), free(dq);
    free(udq), free(dq1), free(out1), free(lse1), free(g);
}

/* ---- GELU, residual ---- */

typedef struct {
    size_t n;
    float *x, *y;
} ew_t;

static void gelu_fwd(void *c, float *out)
{
    ew_t *e = c;
    zs_op_gelu_fwd(pool, out, e->x, e->n);
}

static void res_fwd(void *c, float *out)
{
    ew_t *e = c;
    zs_op_residual_fwd(pool, out, e->x, e->y, e->n);
}

static void test_gelu_residual(void)
{
    ew_t e = {20000, NULL, NULL};
    e.x = rnd(e.n, 4);
    e.y = rnd(e.n, 1);
    float *w = rnd(e.n, 1), *out = malloc(e.n * sizeof *out);
    gelu_fwd(&e, out);
    double maxf = 0;
    for (size_t i = 0; i < e.n; i++) {
        double x = e.x[i];
        double y = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
        maxf = fmax(maxf, fabs(y - out[i]));
    }
    printf("  gelu       forward vs double: max abs err %.3g\n", maxf);
    TEST_CHECK(maxf < 1e-6);
    float *dx = malloc(e.n * sizeof *dx), *dx1 = dup(w, e.n);
    zs_op_gelu_bwd(pool, dx, e.x, w, e.n);
    zs_op_gelu_bwd(NULL, dx1, e.x, dx1, e.n); /* in place */
    expect_same("gelu dinp", dx, dx1, e.n, 0);
    double *g = accum_part(dx, NULL, e.n);
    fd_check("gelu", "inp", gelu_fwd, &e, e.x, e.n, g, e.n, w, 1e-2f, 1e-4, 1e-3, 2000);
    free(g);

    float *da0 = rnd(e.n, 1), *db0 = rnd(e.n, 1), *da = dup(da0, e.n), *db = dup(db0, e.n);
    zs_op_residual_bwd(pool, da, db, w, e.n);
    double *ga = accum_part(da, da0, e.n), *gb = accum_part(db, db0, e.n);
    fd_check("residual", "a", res_fwd, &e, e.x, e.n, ga, e.n, w, 1e-2f, 1e-5, 1e-5, 2000);
    fd_check("residual", "b", res_fwd, &e, e.y, e.n, gb, e.n, w, 1e-2f, 1e-5, 1e-5, 2000);
    free(e.x), free(e.y), free(w), free(out), free(dx), free(dx1), free(da0), free(db0), free(da);
    free(db), free(ga), free(gb);
}

/* ---- softmax cross-entropy ---- */

typedef struct {
    int N, V;
    float *logits, *lse;
    int32_t *tg;
} xe_t;

static void xe_fwd(void *c, float *out)
{
    xe_t *x = c;
    zs_op_xent_fwd(pool, out, x->lse, x->logits, x->tg, x->N, x->V, x->V);
}

static void test_xent(void)
{
    xe_t x = {11, 300, NULL, NULL, NULL};
    size_t n = (size_t)x.N * x.V;
    x.logits = rnd(n, 4);
    x.lse = malloc((size_t)x.N * sizeof(float));
    x.tg = malloc((size_t)x.N * sizeof(int32_t));
    for (int i = 0; i < x.N; i++)
        x.tg[i] = (i * 37) % x.V;
    float *losses = malloc((size_t)x.N * sizeof(float));
    xe_fwd(&x, losses);
    double maxf = 0;
    for (int r = 0; r < x.N; r++) {
        double s = 0;
        for (int v = 0; v < x.V; v++)
            s += exp((double)x.logits[(size_t)r * x.V + v]);
        maxf = fmax(maxf, fabs(log(s) - x.logits[(size_t)r * x.V + x.tg[r]] - losses[r]));
    }
    printf("  xent       forward vs double: max abs err %.3g\n", maxf);
    TEST_CHECK(maxf < 1e-5);
    float dloss = 0.75f, scale = dloss / (float)x.N;
    float *w = malloc((size_t)x.N * sizeof *w), *d = malloc(n * sizeof *d), *d1 = dup(x.logits, n);
    for (int i = 0; i < x.N; i++)
        w[i] = scale;
    zs_op_xent_bwd(pool, d, x.logits, x.lse, x.tg, x.N, x.V, x.V, scale);
    zs_op_xent_bwd(NULL, d1, d1, x.lse, x.tg, x.N, x.V, x.V, scale); /* in place */
    expect_same("xent dlogits", d, d1, n, 0);
    /* rows ld > V floats apart: the same numbers, the padding (NaN here)
     * neither read (the results would be NaN) nor written */
    {
        const int ld = 320;
        size_t np = (size_t)x.N * ld;
        float *lp = malloc(np * sizeof *lp), *dp = malloc(np * sizeof *dp);
        float *lsp = malloc((size_t)x.N * sizeof *lsp), *lop = malloc((size_t)x.N * sizeof *lop);
        for (size_t i = 0; i < np; i++)
            lp[i] = dp[i] = NAN;
        for (int r = 0; r < x.N; r++)
            memcpy(lp + (size_t)r * ld, x.logits + (size_t)r * x.V, (size_t)x.V * sizeof *lp);
        zs_op_xent_fwd(pool, lop, lsp, lp, x.tg, x.N, x.V, ld);
        zs_op_xent_bwd(pool, dp, lp, lsp, x.tg, x.N, x.V, ld, scale);
        /* memcmp: a NaN read from the padding must fail (expect_same skips NaN) */
        TEST_CHECKF(memcmp(lop, losses, (size_t)x.N * sizeof *lop) == 0,
                    "xent losses differ with padded rows");
        TEST_CHECKF(memcmp(lsp, x.lse, (size_t)x.N * sizeof *lsp) == 0,
                    "xent lse differs with padded rows");
        for (int r = 0; r < x.N; r++) {
            TEST_CHECKF(
                memcmp(dp + (size_t)r * ld, d + (size_t)r * x.V, (size_t)x.V * sizeof *dp) == 0,
                "xent dlogits row %d differs with padded rows", r);
            for (int v = x.V; v < ld; v++)
                TEST_CHECKF(isnan(dp[(size_t)r * ld + v]), "xent_bwd wrote padding [%d, %d]", r, v);
        }
        printf("  xent       rows padded to %d floats: bitwise the unpadded, padding untouched\n",
               ld);
        free(lp), free(dp), free(lsp), free(lop);
    }
    double *g = accum_part(d, NULL, n);
    fd_check("xent", "logit", xe_fwd, &x, x.logits, n, g, (size_t)x.N, w, 1e-2f, 1e-5, 1e-3, 3300);
    free(x.logits), free(x.lse), free(x.tg), free(losses), free(w), free(d), free(d1), free(g);
}

int main(void)
{
    pool = zs_pool_create(3);
    TEST_CHECK(pool != NULL);
    printf("test_gpt_ops: finite differences (abs err = |analytic - fd|)\n");
    test_embed();
    test_layernorm();
    test_residual_layernorm();
    test_matmul(7, 9, 11);
    test_matmul(70, 96, 130); /* large enough for zs_op_gemm to split */
    test_matmul(130, 64, 40); /* split along rows */
    test_attention(2, 7, 12, 3);
    test_attention(1, 33, 32, 2);
    test_flash(2, 7, 12, 3);
    test_flash(1, 150, 32, 2); /* three key tiles */
    test_gelu_residual();
    test_xent();
    zs_pool_destroy(pool);
    printf("test_gpt_ops: OK\n");
    return 0;
}
