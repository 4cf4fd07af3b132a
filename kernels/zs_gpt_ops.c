/*
 * zs_gpt_ops.c - CPU layer kernels of the reference GPT model (see
 * zs_gpt_ops.h).
 *
 * Every kernel is a loop over independent items (rows, columns, (b, h)
 * pairs, element ranges) cut into tasks for zs_pool_run; a task owns the
 * elements it writes, so there are no atomics and no thread-count-dependent
 * reductions. Attention's four per-head products and every matmul are
 * cblas_sgemm calls on a single-threaded OpenBLAS. The element formulas
 * (LayerNorm, GELU, the cross-entropy gradient) are zs_math.h's, which the
 * CUDA kernels (kernels/cuda/zs_cuda_gpt.cu) use too.
 */
#include "zs_cast.h"
#include "zs_gpt_ops.h"
#include "zs_gpt_ops_internal.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* ---- task splitting ---- */

typedef zs__range_fn range_fn;

typedef struct {
    range_fn fn;
    const void *arg;
    size_t n, per;
} range_job_t;

static void range_task(void *a, size_t task, int thread)
{
    (void)thread;
    const range_job_t *j = a;
    size_t lo = task * j->per, hi = lo + j->per < j->n ? lo + j->per : j->n;
    if (lo < hi)
        j->fn(j->arg, lo, hi);
}

/* fn(arg, lo, hi) over [0, n) in pieces of at least `grain` items, a few
 * pieces per thread (tasks are claimed dynamically, so uneven rows balance). */
static void parallel_for(zs_pool_t *pool, size_t n, size_t grain, range_fn fn, const void *arg)
{
    int nt = pool ? zs_pool_threads(pool) : 1;
    if (n == 0)
        return;
    if (nt <= 1 || n <= grain) {
        fn(arg, 0, n);
        return;
    }
    size_t tasks = (size_t)nt * 4;
    if (tasks > n / grain)
        tasks = n / grain;
    if (tasks < 1)
        tasks = 1;
    range_job_t j = {fn, arg, n, (n + tasks - 1) / tasks};
    zs_pool_run(pool, (n + j.per - 1) / j.per, range_task, &j);
}

/* See zs_gpt_ops_internal.h. */
void zs__op_parallel_for(zs_pool_t *pool, size_t n, size_t grain, zs__range_fn fn, const void *arg)
{
    parallel_for(pool, n, grain, fn, arg);
}

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single(void)
{
    openblas_set_num_threads(1);
}

void zs_op_init(void)
{
    pthread_once(&blas_once, blas_single);
}

/* ---- GEMM ---- */

typedef struct {
    int ta, tb, M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    int split_n; /* split columns of C (else rows) */
} gemm_job_t;

static void gemm_part(const void *arg, size_t lo, size_t hi)
{
    const gemm_job_t *g = arg;
    const float *A = g->A, *B = g->B;
    float *C = g->C;
    int M = g->M, N = g->N;
    if (g->split_n) {
        N = (int)(hi - lo);
        B += g->tb ? lo * (size_t)g->ldb : lo;
        C += lo;
    } else {
        M = (int)(hi - lo);
        A += g->ta ? lo : lo * (size_t)g->lda;
        C += lo * (size_t)g->ldc;
    }
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                M, N, g->K, g->alpha, A, g->lda, B, g->ldb, g->beta, C, g->ldc);
}

typedef struct {
    const gemm_job_t *g;
    size_t per, n;
} gemm_split_t;

static void gemm_task(void *a, size_t task, int thread)
{
    (void)thread;
    const gemm_split_t *s = a;
    size_t lo = task * s->per, hi = lo + s->per < s->n ? lo + s->per : s->n;
    if (lo < hi)
        gemm_part(s->g, lo, hi);
}

/* Rows (or columns) per block of an M x N x K product split over n = M or
 * N: a function of the shape alone, never of the thread count. OpenBLAS
 * may sum a dot product in another order for a sub-product of another
 * shape (its SKYLAKEX small-matrix kernels do), so splitting by thread
 * count would make results depend on it; with fixed blocks every thread
 * count issues the same cblas_sgemm calls. At most ZS_GEMM_BLOCKS blocks,
 * each a multiple of 16 (the kernels' tile) and at least 64; products
 * under 2^18 multiply-adds stay whole. */
#define ZS_GEMM_BLOCKS 16
static size_t gemm_block(int M, int N, int K, size_t n)
{
    if ((double)M * N * K < 1 << 18 || n <= 64)
        return n;
    size_t per = (n + ZS_GEMM_BLOCKS - 1) / ZS_GEMM_BLOCKS;
    per = (per + 15) / 16 * 16;
    return per < 64 ? 64 : per;
}

void zs_op_gemm(zs_pool_t *pool, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    zs_op_init();
    if (M <= 0 || N <= 0)
        return;
    gemm_job_t g = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, N >= M};
    int nt = pool ? zs_pool_threads(pool) : 1;
    size_t n = g.split_n ? (size_t)N : (size_t)M, per = gemm_block(M, N, K, n);
    if (per >= n) {
        gemm_part(&g, 0, n);
        return;
    }
    gemm_split_t s = {&g, per, n};
    if (nt <= 1) { /* the same blocks, one after the other */
        for (size_t t = 0; t * per < n; t++)
            gemm_task(&s, t, 0);
        return;
    }
    zs_pool_run(pool, (n + per - 1) / per, gemm_task, &s);
}

/* ---- embedding ---- */

typedef struct {
    float *out;
    float *dwte, *dwpe;
    const float *dout;
    const int32_t *tok;
    const float *wte, *wpe;
    int B, T, C;
} embed_job_t;

static void embed_fwd_rows(const void *arg, size_t lo, size_t hi)
{
    const embed_job_t *e = arg;
    size_t C = (size_t)e->C;
    for (size_t r = lo; r < hi; r++) {
        const float *a = e->wte + (size_t)e->tok[r] * C, *p = e->wpe + (r % (size_t)e->T) * C;
        float *o = e->out + r * C;
        for (size_t c = 0; c < C; c++)
            o[c] = a[c] + p[c];
    }
}

void zs_op_embed_fwd(zs_pool_t *pool, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C)
{
    embed_job_t e = {.out = out, .tok = tok, .wte = wte, .wpe = wpe, .B = B, .T = T, .C = C};
    parallel_for(pool, (size_t)B * T, 16, embed_fwd_rows, &e);
}

static void embed_bwd_cols(const void *arg, size_t lo, size_t hi)
{
    const embed_job_t *e = arg;
    size_t C = (size_t)e->C;
    for (int b = 0; b < e->B; b++)
        for (int t = 0; t < e->T; t++) {
            size_t r = (size_t)b * e->T + t;
            const float *d = e->dout + r * C;
            float *gw = e->dwte + (size_t)e->tok[r] * C, *gp = e->dwpe + (size_t)t * C;
            for (size_t c = lo; c < hi; c++) {
                gw[c] += d[c];
                gp[c] += d[c];
            }
        }
}

void zs_op_embed_bwd(zs_pool_t *pool, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C)
{
    embed_job_t e = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .tok = tok, .B = B, .T = T, .C = C};
    parallel_for(pool, (size_t)C, 64, embed_bwd_cols, &e);
}

/* ---- LayerNorm ---- */

typedef struct {
    float *out, *mean, *rstd;
    float *dinp, *dw, *db;
    const float *dout, *inp, *w, *b;
    const float *cmean, *crstd;
    int N, C;
} ln_job_t;

/* One row of the LayerNorm forward: o[0..C), its mean and rstd. */
static void ln_fwd_row(float *o, float *mean, float *rstd, const float *x, const float *w,
                       const float *b, size_t C)
{
    float m = 0.0f;
    for (size_t c = 0; c < C; c++)
        m += x[c];
    m /= (float)C;
    float v = 0.0f;
    for (size_t c = 0; c < C; c++) {
        float d = x[c] - m;
        v += d * d;
    }
    v /= (float)C;
    float s = zs_math_ln_rstd(v);
    for (size_t c = 0; c < C; c++)
        o[c] = zs_math_ln_out(x[c], m, s, w[c], b[c]);
    *mean = m;
    *rstd = s;
}

static void ln_fwd_rows(const void *arg, size_t lo, size_t hi)
{
    const ln_job_t *j = arg;
    size_t C = (size_t)j->C;
    for (size_t r = lo; r < hi; r++)
        ln_fwd_row(j->out + r * C, j->mean + r, j->rstd + r, j->inp + r * C, j->w, j->b, C);
}

/* The fused residual + LayerNorm: per row, res = a + b (rounded through
 * res16 when rdt is 16-bit, as the device's round op does: zs_cast there
 * and back), then the row's LayerNorm of res (the same arithmetic as the
 * ops one after the other, so the same bits). */
typedef struct {
    float *res, *out, *mean, *rstd;
    void *res16;
    int rdt;
    const float *a, *b, *w, *bias;
    int C;
} resln_job_t;

static void resln_fwd_rows(const void *arg, size_t lo, size_t hi)
{
    const resln_job_t *j = arg;
    size_t C = (size_t)j->C;
    for (size_t r = lo; r < hi; r++) {
        float *x = j->res + r * C;
        const float *a = j->a + r * C, *b = j->b + r * C;
        for (size_t c = 0; c < C; c++)
            x[c] = a[c] + b[c];
        if (j->rdt != ZS_DTYPE_F32) {
            void *h = (uint16_t *)j->res16 + r * C;
            zs_cast(h, (zs_dtype_t)j->rdt, x, ZS_DTYPE_F32, C);
            zs_cast(x, ZS_DTYPE_F32, h, (zs_dtype_t)j->rdt, C);
        }
        ln_fwd_row(j->out + r * C, j->mean + r, j->rstd + r, x, j->w, j->bias, C);
    }
}

void zs_op_residual_layernorm_fwd_dt(zs_pool_t *pool, float *res, void *res16, int rdt, float *out,
                                     float *mean, float *rstd, const float *a, const float *b,
                                     const float *w, const float *bias, int N, int C)
{
    resln_job_t j = {res, out, mean, rstd, res16, rdt, a, b, w, bias, C};
    parallel_for(pool, (size_t)N, 4, resln_fwd_rows, &j);
}

void zs_op_residual_layernorm_fwd(zs_pool_t *pool, float *res, float *out, float *mean, float *rstd,
                                  const float *a, const float *b, const float *w, const float *bias,
                                  int N, int C)
{
    zs_op_residual_layernorm_fwd_dt(pool, res, NULL, ZS_DTYPE_F32, out, mean, rstd, a, b, w, bias,
                                    N, C);
}

void zs_op_layernorm_fwd(zs_pool_t *pool, float *out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b, int N, int C)
{
    ln_job_t j = {
        .out = out, .mean = mean, .rstd = rstd, .inp = inp, .w = w, .b = b, .N = N, .C = C};
    parallel_for(pool, (size_t)N, 4, ln_fwd_rows, &j);
}

static void ln_bwd_rows(const void *arg, size_t lo, size_t hi)
{
    const ln_job_t *j = arg;
    size_t C = (size_t)j->C;
    for (size_t r = lo; r < hi; r++) {
        const float *x = j->inp + r * C, *d = j->dout + r * C;
        float *dx = j->dinp + r * C;
        float m = j->cmean[r], s = j->crstd[r];
        float dmean = 0.0f, dnmean = 0.0f;
        for (size_t c = 0; c < C; c++) {
            float dn = zs_math_ln_dnorm(j->w[c], d[c]);
            dmean += dn;
            dnmean += zs_math_ln_dnorm_n(dn, x[c], m, s);
        }
        dmean /= (float)C;
        dnmean /= (float)C;
        for (size_t c = 0; c < C; c++)
            dx[c] += zs_math_ln_dx(x[c], m, s, j->w[c], d[c], dmean, dnmean);
    }
}

#define COLS_BLOCK 256

static void ln_bwd_cols(const void *arg, size_t lo, size_t hi)
{
    const ln_job_t *j = arg;
    size_t C = (size_t)j->C;
    float aw[COLS_BLOCK], ab[COLS_BLOCK];
    for (size_t c0 = lo; c0 < hi; c0 += COLS_BLOCK) {
        size_t n = hi - c0 < COLS_BLOCK ? hi - c0 : COLS_BLOCK;
        memset(aw, 0, sizeof aw);
        memset(ab, 0, sizeof ab);
        for (size_t r = 0; r < (size_t)j->N; r++) {
            const float *x = j->inp + r * C + c0, *d = j->dout + r * C + c0;
            float m = j->cmean[r], s = j->crstd[r];
            for (size_t c = 0; c < n; c++) {
                aw[c] += zs_math_ln_dw(x[c], m, s, d[c]);
                ab[c] += d[c];
            }
        }
        for (size_t c = 0; c < n; c++) {
            j->dw[c0 + c] += aw[c];
            j->db[c0 + c] += ab[c];
        }
    }
}

void zs_op_layernorm_bwd(zs_pool_t *pool, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, const float *mean, const float *rstd,
                         int N, int C)
{
    ln_job_t j = {.dinp = dinp,
                  .dw = dw,
                  .db = db,
                  .dout = dout,
                  .inp = inp,
                  .w = w,
                  .cmean = mean,
                  .crstd = rstd,
                  .N = N,
                  .C = C};
    parallel_for(pool, (size_t)N, 4, ln_bwd_rows, &j);
    parallel_for(pool, (size_t)C, 32, ln_bwd_cols, &j);
}

/* ---- matmul ---- */

typedef struct {
    float *out;
    const float *bias, *dout;
    float *db;
    int N, OC;
} bias_job_t;

static void bias_fill_rows(const void *arg, size_t lo, size_t hi)
{
    const bias_job_t *j = arg;
    for (size_t r = lo; r < hi; r++)
        memcpy(j->out + r * (size_t)j->OC, j->bias, (size_t)j->OC * sizeof(float));
}

void zs_op_matmul_fwd(zs_pool_t *pool, float *out, const float *inp, const float *w,
                      const float *bias, int N, int IC, int OC)
{
    if (bias) {
        bias_job_t j = {.out = out, .bias = bias, .N = N, .OC = OC};
        parallel_for(pool, (size_t)N, 16, bias_fill_rows, &j);
    }
    zs_op_gemm(pool, 0, 0, N, OC, IC, 1.0f, inp, IC, w, OC, bias ? 1.0f : 0.0f, out, OC);
}

static void bias_grad_cols(const void *arg, size_t lo, size_t hi)
{
    const bias_job_t *j = arg;
    float acc[COLS_BLOCK];
    for (size_t c0 = lo; c0 < hi; c0 += COLS_BLOCK) {
        size_t n = hi - c0 < COLS_BLOCK ? hi - c0 : COLS_BLOCK;
        memset(acc, 0, sizeof acc);
        for (size_t r = 0; r < (size_t)j->N; r++) {
            const float *d = j->dout + r * (size_t)j->OC + c0;
            for (size_t c = 0; c < n; c++)
                acc[c] += d[c];
        }
        for (size_t c = 0; c < n; c++)
            j->db[c0 + c] += acc[c];
    }
}

void zs_op_matmul_bwd(zs_pool_t *pool, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int IC, int OC)
{
    if (dinp)
        zs_op_gemm(pool, 0, 1, N, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, IC);
    zs_op_gemm(pool, 1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    if (db)
        zs_op_bias_bwd(pool, db, dout, N, OC);
}

void zs_op_bias_bwd(zs_pool_t *pool, float *db, const float *dout, int N, int OC)
{
    bias_job_t j = {.dout = dout, .db = db, .N = N, .OC = OC};
    parallel_for(pool, (size_t)OC, 64, bias_grad_cols, &j);
}

/* ---- attention ---- */

typedef struct {
    float *out, *att, *dqkv, *scratch;
    const float *qkv, *catt, *dout;
    int B, T, C, NH;
    int dt;       /* ZS_DTYPE_F32: plain; BF16 / F16: round att (and D) for the GEMMs */
    float *att_r; /* [B, NH, T, T]: the rounded probabilities (rounding only) */
} attn_job_t;

/* One (b, h) pair per item: scores = scale q k^T (the full T x T product:
 * BLAS beats skipping the masked half), causal softmax in place, out = att v. */
static void attn_fwd_heads(const void *arg, size_t lo, size_t hi)
{
    const attn_job_t *j = arg;
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t i = lo; i < hi; i++) {
        int b = (int)(i / (size_t)NH), h = (int)(i % (size_t)NH);
        const float *q = j->qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
        float *A = j->att + i * (size_t)T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, ld, k, ld, 0.0f, A,
                    T);
        for (int t = 0; t < T; t++) {
            float *row = A + (size_t)t * T;
            float mx = row[0];
            for (int u = 1; u <= t; u++)
                mx = row[u] > mx ? row[u] : mx;
            float sum = 0.0f;
            for (int u = 0; u <= t; u++) {
                row[u] = expf(row[u] - mx);
                sum += row[u];
            }
            float inv = 1.0f / sum;
            for (int u = 0; u <= t; u++)
                row[u] *= inv;
            for (int u = t + 1; u < T; u++)
                row[u] = 0.0f;
        }
        const float *P = A; /* the probabilities the product reads */
        if (j->att_r) {
            float *R = j->att_r + i * (size_t)T * T;
            zs_op_round(NULL, j->dt, R, A, (size_t)T * T); /* inside this head's task */
            P = R;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, v, ld, 0.0f,
                    j->out + (size_t)b * T * C + (size_t)h * hs, C);
    }
}

/* See zs_gpt_ops_internal.h: att_r NULL is the plain fp32 attention. */
void zs__op_attention_fwd(zs_pool_t *pool, int dt, float *att_r, float *out, float *att,
                          const float *qkv, int B, int T, int C, int NH)
{
    zs_op_init();
    attn_job_t j = {.out = out,
                    .att = att,
                    .qkv = qkv,
                    .B = B,
                    .T = T,
                    .C = C,
                    .NH = NH,
                    .dt = dt,
                    .att_r = att_r};
    parallel_for(pool, (size_t)B * NH, 1, attn_fwd_heads, &j);
}

void zs_op_attention_fwd(zs_pool_t *pool, float *out, float *att, const float *qkv, int B, int T,
                         int C, int NH)
{
    zs__op_attention_fwd(pool, ZS_DTYPE_F32, NULL, out, att, qkv, B, T, C, NH);
}

/* One (b, h) pair per item: D = dout v^T, dv = att^T dout, D <- scale *
 * softmax backward (att * (D - rowsum(att * D))), dq = D k, dk = D^T q. */
static void attn_bwd_heads(const void *arg, size_t lo, size_t hi)
{
    const attn_job_t *j = arg;
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t i = lo; i < hi; i++) {
        int b = (int)(i / (size_t)NH), h = (int)(i % (size_t)NH);
        size_t off = (size_t)b * T * ld + (size_t)h * hs;
        const float *q = j->qkv + off, *k = q + C, *v = q + 2 * C;
        float *dq = j->dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
        const float *A = j->catt + i * (size_t)T * T;
        const float *d = j->dout + (size_t)b * T * C + (size_t)h * hs;
        float *D = j->scratch + i * (size_t)T * T;
        const float *P = A; /* the probabilities dv = P^T dout reads */
        if (j->att_r) {
            float *R = j->att_r + i * (size_t)T * T;
            zs_op_round(NULL, j->dt, R, A, (size_t)T * T); /* inside this head's task */
            P = R;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, ld, 0.0f, D,
                    T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, d, C, 0.0f, dv,
                    ld);
        for (int t = 0; t < T; t++) {
            const float *a = A + (size_t)t * T;
            float *row = D + (size_t)t * T;
            float s = 0.0f;
            for (int u = 0; u <= t; u++)
                s += a[u] * row[u];
            for (int u = 0; u <= t; u++)
                row[u] = a[u] * (row[u] - s) * scale;
            for (int u = t + 1; u < T; u++)
                row[u] = 0.0f;
        }
        if (j->att_r)
            zs_op_round(NULL, j->dt, D, D, (size_t)T * T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, D, T, k, ld, 0.0f,
                    dq, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, D, T, q, ld, 0.0f, dk,
                    ld);
    }
}

/* See zs_gpt_ops_internal.h. */
void zs__op_attention_bwd(zs_pool_t *pool, int dt, float *att_r, float *dqkv, float *scratch,
                          const float *dout, const float *qkv, const float *att, int B, int T,
                          int C, int NH)
{
    zs_op_init();
    attn_job_t j = {.dqkv = dqkv,
                    .scratch = scratch,
                    .dout = dout,
                    .qkv = qkv,
                    .catt = att,
                    .B = B,
                    .T = T,
                    .C = C,
                    .NH = NH,
                    .dt = dt,
                    .att_r = att_r};
    parallel_for(pool, (size_t)B * NH, 1, attn_bwd_heads, &j);
}

void zs_op_attention_bwd(zs_pool_t *pool, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, int B, int T, int C, int NH)
{
    zs__op_attention_bwd(pool, ZS_DTYPE_F32, NULL, dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

/* ---- flash attention twin (see zs_gpt_ops.h) ---- */

typedef struct {
    float *out, *lse, *dqkv;
    const float *qkv, *dout, *dout_r, *cout, *clse;
    int B, T, C, NH;
    int dt; /* ZS_DTYPE_F32: no rounding; BF16 / F16: round P (and dS) */
} flash_job_t;

/* x rounded to dt (BF16 / F16, nearest even) and widened; x otherwise. */
static float flash_round(int dt, float x)
{
    if (dt == ZS_DTYPE_BF16)
        return zs_math_bf16_to_f32(zs_math_f32_to_bf16(x));
    if (dt == ZS_DTYPE_F16)
        return zs_math_f16_to_f32(zs_math_f32_to_f16(x));
    return x;
}

static float flash_dot(const float *a, const float *b, int n)
{
    float d = 0.0f;
    for (int c = 0; c < n; c++)
        d += a[c] * b[c];
    return d;
}

/* One (b, h) pair per item; per query row t the online softmax over key
 * tiles [j0, j0 + ZS_FLASH_BK) up to t: m the running max, l the running sum
 * of the fp32 p, the output accumulator rescaled by exp(m_old - m_new) and
 * added round(p) v. The output row is the accumulator itself. */
static void flash_fwd_heads(const void *arg, size_t lo, size_t hi)
{
    const flash_job_t *j = arg;
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float p[ZS_FLASH_BK];
    for (size_t i = lo; i < hi; i++) {
        int b = (int)(i / (size_t)NH), h = (int)(i % (size_t)NH);
        const float *qb = j->qkv + (size_t)b * T * ld + (size_t)h * hs;
        for (int t = 0; t < T; t++) {
            const float *q = qb + (size_t)t * ld;
            float *o = j->out + ((size_t)b * T + t) * C + (size_t)h * hs;
            float m = -INFINITY, l = 0.0f;
            for (int c = 0; c < hs; c++)
                o[c] = 0.0f;
            for (int j0 = 0; j0 <= t; j0 += ZS_FLASH_BK) {
                int n = t + 1 - j0 < ZS_FLASH_BK ? t + 1 - j0 : ZS_FLASH_BK;
                float mt = -INFINITY;
                for (int u = 0; u < n; u++) {
                    p[u] = flash_dot(q, qb + (size_t)(j0 + u) * ld + C, hs) * scale;
                    mt = p[u] > mt ? p[u] : mt;
                }
                float mn = m > mt ? m : mt, alpha = expf(m - mn), ps = 0.0f;
                for (int u = 0; u < n; u++) {
                    float e = expf(p[u] - mn);
                    ps += e;
                    p[u] = flash_round(j->dt, e);
                }
                l = l * alpha + ps;
                for (int c = 0; c < hs; c++)
                    o[c] *= alpha;
                for (int u = 0; u < n; u++) {
                    const float *v = qb + (size_t)(j0 + u) * ld + 2 * C;
                    for (int c = 0; c < hs; c++)
                        o[c] += p[u] * v[c];
                }
                m = mn;
            }
            for (int c = 0; c < hs; c++)
                o[c] /= l;
            j->lse[((size_t)b * NH + h) * T + t] = m + logf(l);
        }
    }
}

/* See zs_gpt_ops_internal.h. */
void zs__op_attention_flash_fwd(zs_pool_t *pool, int dt, float *out, float *lse, const float *qkv,
                                int B, int T, int C, int NH)
{
    flash_job_t j = {
        .out = out, .lse = lse, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH, .dt = dt};
    parallel_for(pool, (size_t)B * NH, 1, flash_fwd_heads, &j);
}

void zs_op_attention_flash_fwd(zs_pool_t *pool, float *out, float *lse, const float *qkv, int B,
                               int T, int C, int NH)
{
    zs__op_attention_flash_fwd(pool, ZS_DTYPE_F32, out, lse, qkv, B, T, C, NH);
}

/* One (b, h) pair per item: dq, dk, dv of the head zeroed, then for each
 * query t (ascending) and key u <= t (ascending): p = exp(scale q.k - lse),
 * dp = dout_r.v, dv_u += round(p) dout_r_t, ds = round(p (dp - D_t) scale),
 * dq_t += ds k_u, dk_u += ds q_t; D_t = dout_t . out_t on the fp32 dout. */
static void flash_bwd_heads(const void *arg, size_t lo, size_t hi)
{
    const flash_job_t *j = arg;
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t i = lo; i < hi; i++) {
        int b = (int)(i / (size_t)NH), h = (int)(i % (size_t)NH);
        size_t off = (size_t)b * T * ld + (size_t)h * hs;
        const float *qb = j->qkv + off;
        float *gb = j->dqkv + off;
        for (int t = 0; t < T; t++)
            for (int c = 0; c < hs; c++)
                gb[(size_t)t * ld + c] = gb[(size_t)t * ld + C + c] =
                    gb[(size_t)t * ld + 2 * C + c] = 0.0f;
        for (int t = 0; t < T; t++) {
            size_t to = ((size_t)b * T + t) * C + (size_t)h * hs;
            const float *q = qb + (size_t)t * ld, *dor = j->dout_r + to;
            float *dq = gb + (size_t)t * ld;
            float D = flash_dot(j->dout + to, j->cout + to, hs);
            float L = j->clse[((size_t)b * NH + h) * T + t];
            for (int u = 0; u <= t; u++) {
                const float *k = qb + (size_t)u * ld + C, *v = k + C;
                float *dk = gb + (size_t)u * ld + C, *dv = dk + C;
                float p = expf(flash_dot(q, k, hs) * scale - L);
                float dp = flash_dot(dor, v, hs);
                float pr = flash_round(j->dt, p);
                float ds = flash_round(j->dt, p * (dp - D) * scale);
                for (int c = 0; c < hs; c++) {
                    dv[c] += pr * dor[c];
                    dq[c] += ds * k[c];
                    dk[c] += ds * q[c];
                }
            }
        }
    }
}

/* See zs_gpt_ops_internal.h. */
void zs__op_attention_flash_bwd(zs_pool_t *pool, int dt, float *dqkv, const float *dout,
                                const float *dout_r, const float *qkv, const float *out,
                                const float *lse, int B, int T, int C, int NH)
{
    flash_job_t j = {.dqkv = dqkv,
                     .qkv = qkv,
                     .dout = dout,
                     .dout_r = dout_r,
                     .cout = out,
                     .clse = lse,
                     .B = B,
                     .T = T,
                     .C = C,
                     .NH = NH,
                     .dt = dt};
    parallel_for(pool, (size_t)B * NH, 1, flash_bwd_heads, &j);
}

void zs_op_attention_flash_bwd(zs_pool_t *pool, float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int C, int NH)
{
    zs__op_attention_flash_bwd(pool, ZS_DTYPE_F32, dqkv, dout, dout, qkv, out, lse, B, T, C, NH);
}

/* ---- GELU, residual ---- */

typedef struct {
    float *out, *o2;
    const float *a, *b;
} ew_job_t;

/* 0.5 x (1 + tanh(u)) = x * sigmoid(2u) (zs_math_gelu). */
static void gelu_fwd_range(const void *arg, size_t lo, size_t hi)
{
    const ew_job_t *j = arg;
    for (size_t i = lo; i < hi; i++)
        j->out[i] = zs_math_gelu(j->a[i]);
}

void zs_op_gelu_fwd(zs_pool_t *pool, float *out, const float *inp, size_t n)
{
    ew_job_t j = {.out = out, .a = inp};
    parallel_for(pool, n, 4096, gelu_fwd_range, &j);
}

/* d/dx 0.5 x (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'
 *                         = s + 2 x s (1 - s) u',  s = sigmoid(2u)
 * (zs_math_gelu_grad). */
static void gelu_bwd_range(const void *arg, size_t lo, size_t hi)
{
    const ew_job_t *j = arg;
    for (size_t i = lo; i < hi; i++)
        j->out[i] = zs_math_gelu_grad(j->a[i], j->b[i]);
}

void zs_op_gelu_bwd(zs_pool_t *pool, float *dinp, const float *inp, const float *dout, size_t n)
{
    ew_job_t j = {.out = dinp, .a = inp, .b = dout};
    parallel_for(pool, n, 4096, gelu_bwd_range, &j);
}

static void add_range(const void *arg, size_t lo, size_t hi)
{
    const ew_job_t *j = arg;
    for (size_t i = lo; i < hi; i++)
        j->out[i] = j->a[i] + j->b[i];
}

void zs_op_residual_fwd(zs_pool_t *pool, float *out, const float *a, const float *b, size_t n)
{
    ew_job_t j = {.out = out, .a = a, .b = b};
    parallel_for(pool, n, 16384, add_range, &j);
}

static void residual_bwd_range(const void *arg, size_t lo, size_t hi)
{
    const ew_job_t *j = arg;
    for (size_t i = lo; i < hi; i++) {
        float d = j->a[i];
        j->out[i] += d;
        j->o2[i] += d;
    }
}

void zs_op_residual_bwd(zs_pool_t *pool, float *da, float *db, const float *dout, size_t n)
{
    ew_job_t j = {.out = da, .o2 = db, .a = dout};
    parallel_for(pool, n, 16384, residual_bwd_range, &j);
}

/* ---- softmax cross-entropy ---- */

typedef struct {
    float *losses, *lse, *dlogits;
    const float *logits, *clse;
    const int32_t *targets;
    int N, V, ld;
    float scale;
} xent_job_t;

static void xent_fwd_rows(const void *arg, size_t lo, size_t hi)
{
    const xent_job_t *j = arg;
    size_t V = (size_t)j->V, ld = (size_t)j->ld;
    for (size_t r = lo; r < hi; r++) {
        const float *l = j->logits + r * ld;
        float mx = l[0];
        for (size_t v = 1; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        float sum = 0.0f;
        for (size_t v = 0; v < V; v++)
            sum += expf(l[v] - mx);
        float lse = mx + logf(sum);
        j->lse[r] = lse;
        j->losses[r] = lse - l[j->targets[r]];
    }
}

void zs_op_xent_fwd(zs_pool_t *pool, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int N, int V, int ld)
{
    xent_job_t j = {.losses = losses,
                    .lse = lse,
                    .logits = logits,
                    .targets = targets,
                    .N = N,
                    .V = V,
                    .ld = ld};
    parallel_for(pool, (size_t)N, 1, xent_fwd_rows, &j);
}

static void xent_bwd_rows(const void *arg, size_t lo, size_t hi)
{
    const xent_job_t *j = arg;
    size_t V = (size_t)j->V, ld = (size_t)j->ld;
    for (size_t r = lo; r < hi; r++) {
        const float *l = j->logits + r * ld;
        float *d = j->dlogits + r * ld, lse = j->clse[r];
        size_t t = (size_t)j->targets[r];
        for (size_t v = 0; v < V; v++)
            d[v] = zs_math_xent_dlogit(l[v], lse, j->scale, v == t);
    }
}

void zs_op_xent_bwd(zs_pool_t *pool, float *dlogits, const float *logits, const float *lse,
                    const int32_t *targets, int N, int V, int ld, float scale)
{
    xent_job_t j = {.dlogits = dlogits,
                    .logits = logits,
                    .clse = lse,
                    .targets = targets,
                    .N = N,
                    .V = V,
                    .ld = ld,
                    .scale = scale};
    parallel_for(pool, (size_t)N, 1, xent_bwd_rows, &j);
}
