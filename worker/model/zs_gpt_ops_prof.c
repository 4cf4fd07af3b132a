/*
 * zs_gpt_ops_prof.c - a profiling wrapper around any GPT op table
 * (zs_gpt_ops_table.h): each entry calls the inner table's, then waits for
 * the stream (zs_dev_stream_sync), and adds the wall time of that call and
 * wait to a row keyed by the op's name and shape. With nothing else on the
 * stream, that is the op's device time plus one launch and one wait
 * (~10-20 us on CUDA), so the table says where a step's time goes without
 * a profiler on the machine (Nsight Compute could not profile bench_gpt on
 * the lent H200: bench/RESULTS.md).
 *
 * Switched on by ZS_GPT_PROFILE=1 in the environment (zs_gpt.c wraps its
 * table at bind); the rows go to stderr when the table is destroyed, or
 * when zs_gpt_ops_prof_report is called. Serialising every op changes the
 * timing of what overlapped (other streams' copies and collectives): read
 * the rows as costs, not as a timeline. Results are unchanged (the same
 * inner calls in the same order).
 *
 * Does not: time ops run outside the table (the engine's casts, AdamW,
 * collectives), or profile anything when the variable is unset.
 */
#include "zs_gpt_ops_prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ROWS 96
#define KEY_MAX  64

typedef struct {
    char key[KEY_MAX]; /* "matmul_fwd N=.. IC=.. OC=.." */
    long calls;
    double ms;
} row_t;

typedef struct {
    zs_gpt_ops_t ops; /* first: the table handed out */
    zs_gpt_ops_t *in; /* owned */
    row_t rows[MAX_ROWS];
    int nrows;
    long dropped; /* calls whose key found no free row */
} prof_t;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* Wait for the op, then add its time to the key's row (created on first
 * use). Only the model's thread calls the table, so no lock. */
static int done(prof_t *p, zs_stream_t *s, int rc, double t0, const char *key, zs_err_t *err)
{
    if (rc == ZS_OK)
        rc = zs_dev_stream_sync(s, err);
    double ms = now_ms() - t0;
    for (int i = 0; i < p->nrows; i++)
        if (!strcmp(p->rows[i].key, key)) {
            p->rows[i].calls++;
            p->rows[i].ms += ms;
            return rc;
        }
    if (p->nrows == MAX_ROWS) {
        p->dropped++;
        return rc;
    }
    row_t *r = &p->rows[p->nrows++];
    snprintf(r->key, sizeof r->key, "%s", key);
    r->calls = 1;
    r->ms = ms;
    return rc;
}

/* Entry bodies: time the inner call and its wait under key K. */
#define CALL(K, ENTRY, ...)                                                                        \
    prof_t *p = ctx;                                                                               \
    double t0 = now_ms();                                                                          \
    int rc = p->in->ENTRY(p->in->ctx, s, __VA_ARGS__, err);                                        \
    return done(p, s, rc, t0, K, err)

#define KEY(fmt, ...)                                                                              \
    char k_[KEY_MAX];                                                                              \
    snprintf(k_, sizeof k_, fmt, __VA_ARGS__)

static int set_mixed(void *ctx, const zs_mixed_t *mx, zs_err_t *err)
{
    prof_t *p = ctx;
    return p->in->set_mixed(p->in->ctx, mx, err);
}

static int set_twins(void *ctx, const zs_mixed_twin_t *tw, int n, zs_err_t *err)
{
    prof_t *p = ctx;
    return p->in->set_twins(p->in->ctx, tw, n, err);
}

static int gemm(void *ctx, zs_stream_t *s, int ta, int tb, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                zs_err_t *err)
{
    KEY("gemm %c%c M=%d N=%d K=%d", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K);
    CALL(k_, gemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static int embed_fwd(void *ctx, zs_stream_t *s, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C, zs_err_t *err)
{
    CALL("embed_fwd", embed_fwd, out, tok, wte, wpe, B, T, C);
}

static int embed_bwd(void *ctx, zs_stream_t *s, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C, zs_err_t *err)
{
    CALL("embed_bwd", embed_bwd, dwte, dwpe, dout, tok, B, T, C);
}

static int layernorm_fwd(void *ctx, zs_stream_t *s, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int N, int C,
                         zs_err_t *err)
{
    CALL("layernorm_fwd", layernorm_fwd, out, mean, rstd, inp, w, b, N, C);
}

static int layernorm_bwd(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                         const float *dout, const float *inp, const float *w, const float *mean,
                         const float *rstd, int N, int C, zs_err_t *err)
{
    CALL("layernorm_bwd", layernorm_bwd, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

static int matmul_fwd(void *ctx, zs_stream_t *s, float *out, const float *inp, const float *w,
                      const float *bias, int N, int IC, int OC, zs_err_t *err)
{
    KEY("matmul_fwd N=%d IC=%d OC=%d%s", N, IC, OC, bias ? " +bias" : "");
    CALL(k_, matmul_fwd, out, inp, w, bias, N, IC, OC);
}

static int matmul_bwd(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                      const float *dout, const float *inp, const float *w, int N, int IC, int OC,
                      zs_err_t *err)
{
    KEY("matmul_bwd N=%d IC=%d OC=%d%s", N, IC, OC, db ? " +bias" : "");
    CALL(k_, matmul_bwd, dinp, dw, db, dout, inp, w, N, IC, OC);
}

static int attention_fwd(void *ctx, zs_stream_t *s, float *out, float *att, const float *qkv, int B,
                         int T, int C, int NH, zs_err_t *err)
{
    CALL("attention_fwd", attention_fwd, out, att, qkv, B, T, C, NH);
}

static int attention_bwd(void *ctx, zs_stream_t *s, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, int B, int T, int C, int NH,
                         zs_err_t *err)
{
    CALL("attention_bwd", attention_bwd, dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

static int attention_flash_fwd(void *ctx, zs_stream_t *s, float *out, float *lse, const float *qkv,
                               int B, int T, int C, int NH, zs_err_t *err)
{
    CALL("attention_flash_fwd", attention_flash_fwd, out, lse, qkv, B, T, C, NH);
}

static int attention_flash_bwd(void *ctx, zs_stream_t *s, float *dqkv, const float *dout,
                               const float *qkv, const float *out, const float *lse, int B, int T,
                               int C, int NH, zs_err_t *err)
{
    CALL("attention_flash_bwd", attention_flash_bwd, dqkv, dout, qkv, out, lse, B, T, C, NH);
}

static int gelu_fwd(void *ctx, zs_stream_t *s, float *out, const float *inp, size_t n,
                    zs_err_t *err)
{
    CALL("gelu_fwd", gelu_fwd, out, inp, n);
}

static int gelu_bwd(void *ctx, zs_stream_t *s, float *dinp, const float *inp, const float *dout,
                    size_t n, zs_err_t *err)
{
    CALL("gelu_bwd", gelu_bwd, dinp, inp, dout, n);
}

static int residual_fwd(void *ctx, zs_stream_t *s, float *out, const float *a, const float *b,
                        size_t n, zs_err_t *err)
{
    CALL("residual_fwd", residual_fwd, out, a, b, n);
}

static int residual_layernorm_fwd(void *ctx, zs_stream_t *s, float *res, void *res16, int rdt,
                                  float *out, float *mean, float *rstd, const float *a,
                                  const float *b, const float *w, const float *bias, int N, int C,
                                  zs_err_t *err)
{
    CALL("residual_layernorm_fwd", residual_layernorm_fwd, res, res16, rdt, out, mean, rstd, a, b,
         w, bias, N, C);
}

static int residual_bwd(void *ctx, zs_stream_t *s, float *da, float *db, const float *dout,
                        size_t n, zs_err_t *err)
{
    CALL("residual_bwd", residual_bwd, da, db, dout, n);
}

static int xent_fwd(void *ctx, zs_stream_t *s, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int N, int V, int ld, zs_err_t *err)
{
    CALL("xent_fwd", xent_fwd, losses, lse, logits, targets, N, V, ld);
}

static int xent_bwd(void *ctx, zs_stream_t *s, float *dlogits, const float *logits,
                    const float *lse, const int32_t *targets, int N, int V, int ld, float scale,
                    zs_err_t *err)
{
    CALL("xent_bwd", xent_bwd, dlogits, logits, lse, targets, N, V, ld, scale);
}

static int by_ms(const void *a, const void *b)
{
    double x = ((const row_t *)a)->ms, y = ((const row_t *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void zs_gpt_ops_prof_report(const zs_gpt_ops_t *ops, FILE *f)
{
    if (!ops || ops->destroy == NULL || strncmp(ops->name, "prof:", 5) != 0)
        return;
    const prof_t *p = (const prof_t *)ops;
    row_t rows[MAX_ROWS];
    memcpy(rows, p->rows, sizeof rows);
    qsort(rows, (size_t)p->nrows, sizeof rows[0], by_ms);
    double total = 0;
    for (int i = 0; i < p->nrows; i++)
        total += rows[i].ms;
    fprintf(f, "GPT op profile (%s; each op waited for: device time + one launch and wait)\n",
            ops->name);
    fprintf(f, "| op and shape | calls | total ms | mean us | share |\n|---|---|---|---|---|\n");
    for (int i = 0; i < p->nrows; i++)
        fprintf(f, "| %s | %ld | %.2f | %.1f | %.1f%% |\n", rows[i].key, rows[i].calls, rows[i].ms,
                1e3 * rows[i].ms / (double)rows[i].calls,
                total > 0 ? 100 * rows[i].ms / total : 0.0);
    fprintf(f, "total %.2f ms over %d rows%s\n", total, p->nrows,
            p->dropped ? " (some calls dropped: too many shapes)" : "");
}

static void destroy(zs_gpt_ops_t *ops)
{
    prof_t *p = (prof_t *)ops;
    zs_gpt_ops_prof_report(ops, stderr);
    zs_gpt_ops_destroy(p->in);
    free(p);
}

int zs_gpt_ops_prof_wrap(zs_gpt_ops_t *in, zs_gpt_ops_t **out, zs_err_t *err)
{
    prof_t *p = calloc(1, sizeof *p);
    if (!p) {
        zs_gpt_ops_destroy(in);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    p->in = in;
    static char names[2][16] = {"prof:cpu", "prof:cuda"};
    p->ops = (zs_gpt_ops_t){
        .name = strcmp(in->name, "cuda") ? names[0] : names[1],
        .ctx = p,
        .destroy = destroy,
        .set_mixed = set_mixed,
        .set_twins = in->set_twins ? set_twins : NULL,
        .mixed_elem_bytes = in->mixed_elem_bytes,
        .gemm = gemm,
        .embed_fwd = embed_fwd,
        .embed_bwd = embed_bwd,
        .layernorm_fwd = layernorm_fwd,
        .layernorm_bwd = layernorm_bwd,
        .matmul_fwd = matmul_fwd,
        .matmul_bwd = matmul_bwd,
        .attention_fwd = attention_fwd,
        .attention_bwd = attention_bwd,
        .attention_flash_fwd = in->attention_flash_fwd ? attention_flash_fwd : NULL,
        .attention_flash_bwd = in->attention_flash_bwd ? attention_flash_bwd : NULL,
        .flash_hs_mult = in->flash_hs_mult,
        .flash_hs_max = in->flash_hs_max,
        .flash_needs_mixed = in->flash_needs_mixed,
        .gelu_fwd = gelu_fwd,
        .gelu_bwd = gelu_bwd,
        .residual_fwd = residual_fwd,
        .residual_bwd = residual_bwd,
        .residual_layernorm_fwd = in->residual_layernorm_fwd ? residual_layernorm_fwd : NULL,
        .xent_fwd = xent_fwd,
        .xent_bwd = xent_bwd,
    };
    *out = &p->ops;
    return ZS_OK;
}
