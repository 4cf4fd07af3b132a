/*
 * zs_gpt_ops_cpu.c - the CPU op table of zs_gpt_ops_table.h: each entry
 * packs its arguments (device pointers, which are host memory on the CPU
 * device, shapes and scalars) and the pool into a struct and enqueues a
 * host function on the stream; the host function runs the kernels/
 * zs_gpt_ops.h kernel on the stream's thread with the pool. The kernels
 * themselves are unchanged, so results are bitwise those of a direct call.
 *
 * Mixed precision (zs_mixed.h, set_mixed): the GEMM-based entries run the
 * zs_op_*_mixed kernels with the setting as it was when they were enqueued;
 * the rounded copies are fp32 values (mixed_elem_bytes 4).
 *
 * Does not check shapes (the model passes validated ones) and does not
 * synchronise: errors of the enqueue are returned; the only error of a
 * running kernel is a mixed-precision scratch too small for the op
 * (ZS_ERR_RANGE, the stream's sticky error).
 */
#include <stdlib.h>
#include <limits.h>
#include <string.h>

#include "zs_gpt_ops.h"
#include "zs_gpt_ops_table.h"

/* The table's context: the pool the kernels run on (not owned) and the
 * mixed-precision setting of the GEMM-based ops (set_mixed). */
typedef struct {
    zs_gpt_ops_t ops; /* first: the table handed out */
    zs_pool_t *pool;
    zs_mixed_t mx; /* dt ZS_DTYPE_F32: plain fp32 */
} cpu_ops_t;

#define POOL(ctx)  (((cpu_ops_t *)(ctx))->pool)
#define MIXED(ctx) (((cpu_ops_t *)(ctx))->mx)

/* The error of a mixed op whose scratch is too small (ZS_ERR_RANGE). */
static int mixed_rc(int rc, const char *op, const zs_mixed_t *mx, size_t need, zs_err_t *err)
{
    if (rc == ZS_OK)
        return ZS_OK;
    return zs_err_set(err, rc,
                      "gpt ops (cpu) %s: mixed-precision scratch of %zu elements, needs %zu", op,
                      mx->cap, need);
}

/* The argument block is copied by zs_dev_host_fn; copy it out again into an
 * aligned local, whatever alignment the device gives its copy. */
#define UNPACK(type)                                                                               \
    type a;                                                                                        \
    memcpy(&a, args, sizeof a)

typedef struct {
    zs_pool_t *pool;
    int ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    zs_mixed_t mx;
} gemm_args_t;

static int gemm_run(void *args, zs_err_t *err)
{
    UNPACK(gemm_args_t);
    int rc = zs_op_gemm_mixed(a.pool, &a.mx, a.ta, a.tb, a.M, a.N, a.K, a.alpha, a.A, a.lda, a.B,
                              a.ldb, a.beta, a.C, a.ldc);
    return mixed_rc(rc, "gemm", &a.mx, zs_mixed_gemm_elems(a.ta, a.tb, a.M, a.N, a.K, a.lda, a.ldb),
                    err);
}

static int gemm(void *ctx, zs_stream_t *s, int ta, int tb, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                zs_err_t *err)
{
    gemm_args_t a = {POOL(ctx), ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, MIXED(ctx)};
    return zs_dev_host_fn(s, gemm_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out;
    const int32_t *tok;
    const float *wte, *wpe;
    int B, T, C;
} embed_fwd_args_t;

static int embed_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(embed_fwd_args_t);
    zs_op_embed_fwd(a.pool, a.out, a.tok, a.wte, a.wpe, a.B, a.T, a.C);
    return ZS_OK;
}

static int embed_fwd(void *ctx, zs_stream_t *s, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C, zs_err_t *err)
{
    embed_fwd_args_t a = {POOL(ctx), out, tok, wte, wpe, B, T, C};
    return zs_dev_host_fn(s, embed_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *dwte, *dwpe;
    const float *dout;
    const int32_t *tok;
    int B, T, C;
} embed_bwd_args_t;

static int embed_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(embed_bwd_args_t);
    zs_op_embed_bwd(a.pool, a.dwte, a.dwpe, a.dout, a.tok, a.B, a.T, a.C);
    return ZS_OK;
}

static int embed_bwd(void *ctx, zs_stream_t *s, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C, zs_err_t *err)
{
    embed_bwd_args_t a = {POOL(ctx), dwte, dwpe, dout, tok, B, T, C};
    return zs_dev_host_fn(s, embed_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out, *mean, *rstd;
    const float *inp, *w, *b;
    int N, C;
} ln_fwd_args_t;

static int ln_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(ln_fwd_args_t);
    zs_op_layernorm_fwd(a.pool, a.out, a.mean, a.rstd, a.inp, a.w, a.b, a.N, a.C);
    return ZS_OK;
}

static int layernorm_fwd(void *ctx, zs_stream_t *s, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int N, int C,
                         zs_err_t *err)
{
    ln_fwd_args_t a = {POOL(ctx), out, mean, rstd, inp, w, b, N, C};
    return zs_dev_host_fn(s, ln_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *dinp, *dw, *db;
    const float *dout, *inp, *w, *mean, *rstd;
    int N, C;
} ln_bwd_args_t;

static int ln_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(ln_bwd_args_t);
    zs_op_layernorm_bwd(a.pool, a.dinp, a.dw, a.db, a.dout, a.inp, a.w, a.mean, a.rstd, a.N, a.C);
    return ZS_OK;
}

static int layernorm_bwd(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                         const float *dout, const float *inp, const float *w, const float *mean,
                         const float *rstd, int N, int C, zs_err_t *err)
{
    ln_bwd_args_t a = {POOL(ctx), dinp, dw, db, dout, inp, w, mean, rstd, N, C};
    return zs_dev_host_fn(s, ln_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out;
    const float *inp, *w, *bias;
    int N, IC, OC;
    zs_mixed_t mx;
} mm_fwd_args_t;

static int mm_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(mm_fwd_args_t);
    int rc = zs_op_matmul_fwd_mixed(a.pool, &a.mx, a.out, a.inp, a.w, a.bias, a.N, a.IC, a.OC);
    return mixed_rc(rc, "matmul_fwd", &a.mx, zs_mixed_matmul_fwd_elems(a.N, a.IC, a.OC), err);
}

static int matmul_fwd(void *ctx, zs_stream_t *s, float *out, const float *inp, const float *w,
                      const float *bias, int N, int IC, int OC, zs_err_t *err)
{
    mm_fwd_args_t a = {POOL(ctx), out, inp, w, bias, N, IC, OC, MIXED(ctx)};
    return zs_dev_host_fn(s, mm_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *dinp, *dw, *db;
    const float *dout, *inp, *w;
    int N, IC, OC;
    zs_mixed_t mx;
} mm_bwd_args_t;

static int mm_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(mm_bwd_args_t);
    int rc = zs_op_matmul_bwd_mixed(a.pool, &a.mx, a.dinp, a.dw, a.db, a.dout, a.inp, a.w, a.N,
                                    a.IC, a.OC);
    return mixed_rc(rc, "matmul_bwd", &a.mx, zs_mixed_matmul_bwd_elems(a.N, a.IC, a.OC), err);
}

static int matmul_bwd(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                      const float *dout, const float *inp, const float *w, int N, int IC, int OC,
                      zs_err_t *err)
{
    mm_bwd_args_t a = {POOL(ctx), dinp, dw, db, dout, inp, w, N, IC, OC, MIXED(ctx)};
    return zs_dev_host_fn(s, mm_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out, *att;
    const float *qkv;
    int B, T, C, NH;
    zs_mixed_t mx;
} att_fwd_args_t;

static int att_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(att_fwd_args_t);
    int rc = zs_op_attention_fwd_mixed(a.pool, &a.mx, a.out, a.att, a.qkv, a.B, a.T, a.C, a.NH);
    return mixed_rc(rc, "attention_fwd", &a.mx, zs_mixed_attention_fwd_elems(a.B, a.T, a.C, a.NH),
                    err);
}

static int attention_fwd(void *ctx, zs_stream_t *s, float *out, float *att, const float *qkv, int B,
                         int T, int C, int NH, zs_err_t *err)
{
    att_fwd_args_t a = {POOL(ctx), out, att, qkv, B, T, C, NH, MIXED(ctx)};
    return zs_dev_host_fn(s, att_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *dqkv, *scratch;
    const float *dout, *qkv, *att;
    int B, T, C, NH;
    zs_mixed_t mx;
} att_bwd_args_t;

static int att_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(att_bwd_args_t);
    int rc = zs_op_attention_bwd_mixed(a.pool, &a.mx, a.dqkv, a.scratch, a.dout, a.qkv, a.att, a.B,
                                       a.T, a.C, a.NH);
    return mixed_rc(rc, "attention_bwd", &a.mx, zs_mixed_attention_bwd_elems(a.B, a.T, a.C, a.NH),
                    err);
}

static int attention_bwd(void *ctx, zs_stream_t *s, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, int B, int T, int C, int NH,
                         zs_err_t *err)
{
    att_bwd_args_t a = {POOL(ctx), dqkv, scratch, dout, qkv, att, B, T, C, NH, MIXED(ctx)};
    return zs_dev_host_fn(s, att_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out, *lse;
    const float *qkv;
    int B, T, C, NH;
    zs_mixed_t mx;
} flash_fwd_args_t;

static int flash_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(flash_fwd_args_t);
    int rc =
        zs_op_attention_flash_fwd_mixed(a.pool, &a.mx, a.out, a.lse, a.qkv, a.B, a.T, a.C, a.NH);
    return mixed_rc(rc, "attention_flash_fwd", &a.mx, zs_mixed_flash_fwd_elems(a.B, a.T, a.C), err);
}

static int attention_flash_fwd(void *ctx, zs_stream_t *s, float *out, float *lse, const float *qkv,
                               int B, int T, int C, int NH, zs_err_t *err)
{
    flash_fwd_args_t a = {POOL(ctx), out, lse, qkv, B, T, C, NH, MIXED(ctx)};
    return zs_dev_host_fn(s, flash_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *dqkv;
    const float *dout, *qkv, *out, *lse;
    int B, T, C, NH;
    zs_mixed_t mx;
} flash_bwd_args_t;

static int flash_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(flash_bwd_args_t);
    int rc = zs_op_attention_flash_bwd_mixed(a.pool, &a.mx, a.dqkv, a.dout, a.qkv, a.out, a.lse,
                                             a.B, a.T, a.C, a.NH);
    return mixed_rc(rc, "attention_flash_bwd", &a.mx, zs_mixed_flash_bwd_elems(a.B, a.T, a.C), err);
}

static int attention_flash_bwd(void *ctx, zs_stream_t *s, float *dqkv, const float *dout,
                               const float *qkv, const float *out, const float *lse, int B, int T,
                               int C, int NH, zs_err_t *err)
{
    flash_bwd_args_t a = {POOL(ctx), dqkv, dout, qkv, out, lse, B, T, C, NH, MIXED(ctx)};
    return zs_dev_host_fn(s, flash_bwd_run, &a, sizeof a, err);
}

/* gelu fwd/bwd and residual fwd/bwd: two outputs/inputs and a length */
typedef struct {
    zs_pool_t *pool;
    float *out;
    const float *x, *y;
    size_t n;
} ew_args_t;

static int gelu_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(ew_args_t);
    zs_op_gelu_fwd(a.pool, a.out, a.x, a.n);
    return ZS_OK;
}

static int gelu_fwd(void *ctx, zs_stream_t *s, float *out, const float *inp, size_t n,
                    zs_err_t *err)
{
    ew_args_t a = {POOL(ctx), out, inp, NULL, n};
    return zs_dev_host_fn(s, gelu_fwd_run, &a, sizeof a, err);
}

static int gelu_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(ew_args_t);
    zs_op_gelu_bwd(a.pool, a.out, a.x, a.y, a.n);
    return ZS_OK;
}

static int gelu_bwd(void *ctx, zs_stream_t *s, float *dinp, const float *inp, const float *dout,
                    size_t n, zs_err_t *err)
{
    ew_args_t a = {POOL(ctx), dinp, inp, dout, n};
    return zs_dev_host_fn(s, gelu_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *res, *out, *mean, *rstd;
    void *res16;
    int rdt;
    const float *a, *b, *w, *bias;
    int N, C;
} resln_args_t;

static int resln_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(resln_args_t);
    zs_op_residual_layernorm_fwd_dt(a.pool, a.res, a.res16, a.rdt, a.out, a.mean, a.rstd, a.a, a.b,
                                    a.w, a.bias, a.N, a.C);
    return ZS_OK;
}

static int residual_layernorm_fwd(void *ctx, zs_stream_t *s, float *res, void *res16, int rdt,
                                  float *out, float *mean, float *rstd, const float *x,
                                  const float *y, const float *w, const float *bias, int N, int C,
                                  zs_err_t *err)
{
    resln_args_t a = {POOL(ctx), res, out, mean, rstd, res16, rdt, x, y, w, bias, N, C};
    return zs_dev_host_fn(s, resln_fwd_run, &a, sizeof a, err);
}

static int residual_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(ew_args_t);
    zs_op_residual_fwd(a.pool, a.out, a.x, a.y, a.n);
    return ZS_OK;
}

static int residual_fwd(void *ctx, zs_stream_t *s, float *out, const float *x, const float *y,
                        size_t n, zs_err_t *err)
{
    ew_args_t a = {POOL(ctx), out, x, y, n};
    return zs_dev_host_fn(s, residual_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *da, *db;
    const float *dout;
    size_t n;
} res_bwd_args_t;

static int residual_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(res_bwd_args_t);
    zs_op_residual_bwd(a.pool, a.da, a.db, a.dout, a.n);
    return ZS_OK;
}

static int residual_bwd(void *ctx, zs_stream_t *s, float *da, float *db, const float *dout,
                        size_t n, zs_err_t *err)
{
    res_bwd_args_t a = {POOL(ctx), da, db, dout, n};
    return zs_dev_host_fn(s, residual_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out, *lse; /* fwd: losses, lse; bwd: dlogits, unused */
    const float *logits, *lse_in;
    const int32_t *targets;
    int N, V, ld;
    float scale;
} xent_args_t;

static int xent_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(xent_args_t);
    zs_op_xent_fwd(a.pool, a.out, a.lse, a.logits, a.targets, a.N, a.V, a.ld);
    return ZS_OK;
}

static int xent_fwd(void *ctx, zs_stream_t *s, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int N, int V, int ld, zs_err_t *err)
{
    xent_args_t a = {POOL(ctx), losses, lse, logits, NULL, targets, N, V, ld, 0.0f};
    return zs_dev_host_fn(s, xent_fwd_run, &a, sizeof a, err);
}

static int xent_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(xent_args_t);
    zs_op_xent_bwd(a.pool, a.out, a.logits, a.lse_in, a.targets, a.N, a.V, a.ld, a.scale);
    return ZS_OK;
}

static int xent_bwd(void *ctx, zs_stream_t *s, float *dlogits, const float *logits,
                    const float *lse, const int32_t *targets, int N, int V, int ld, float scale,
                    zs_err_t *err)
{
    xent_args_t a = {POOL(ctx), dlogits, NULL, logits, lse, targets, N, V, ld, scale};
    return zs_dev_host_fn(s, xent_bwd_run, &a, sizeof a, err);
}

static int set_mixed(void *ctx, const zs_mixed_t *mx, zs_err_t *err)
{
    cpu_ops_t *c = ctx;
    if (zs_mixed_set(&c->mx, mx))
        return zs_err_set(err, ZS_ERR_INVALID, "gpt ops (cpu): mixed precision without scratch");
    return ZS_OK;
}

static void cpu_destroy(zs_gpt_ops_t *ops)
{
    free(ops);
}

int zs_gpt_ops_cpu_create(zs_pool_t *pool, zs_gpt_ops_t **out, zs_err_t *err)
{
    *out = NULL;
    cpu_ops_t *c = calloc(1, sizeof *c);
    if (!c)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt ops: out of memory");
    c->pool = pool;
    zs_mixed_set(&c->mx, NULL);
    zs_gpt_ops_t *o = &c->ops;
    o->name = "cpu";
    o->ctx = c;
    o->mixed_elem_bytes = sizeof(float);
    o->set_mixed = set_mixed;
    o->destroy = cpu_destroy;
    o->gemm = gemm;
    o->embed_fwd = embed_fwd;
    o->embed_bwd = embed_bwd;
    o->layernorm_fwd = layernorm_fwd;
    o->layernorm_bwd = layernorm_bwd;
    o->matmul_fwd = matmul_fwd;
    o->matmul_bwd = matmul_bwd;
    o->attention_fwd = attention_fwd;
    o->attention_bwd = attention_bwd;
    o->attention_flash_fwd = attention_flash_fwd;
    o->attention_flash_bwd = attention_flash_bwd;
    o->flash_hs_mult = 1;
    o->flash_hs_max = INT_MAX;
    o->gelu_fwd = gelu_fwd;
    o->gelu_bwd = gelu_bwd;
    o->residual_fwd = residual_fwd;
    o->residual_layernorm_fwd = residual_layernorm_fwd;
    o->residual_bwd = residual_bwd;
    o->xent_fwd = xent_fwd;
    o->xent_bwd = xent_bwd;
    zs_op_init();
    *out = o;
    return ZS_OK;
}
