/*
 * zs_gpt_ops_cpu.c - the CPU op table of zs_gpt_ops_table.h: each entry
 * packs its arguments (device pointers, which are host memory on the CPU
 * device, shapes and scalars) and the pool into a struct and enqueues a
 * host function on the stream; the host function runs the kernels/
 * zs_gpt_ops.h kernel on the stream's thread with the pool. The kernels
 * themselves are unchanged, so results are bitwise those of a direct call.
 *
 * Does not check shapes (the model passes validated ones) and does not
 * synchronise: errors of the enqueue are returned, the kernels cannot fail.
 */
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_ops.h"
#include "zs_gpt_ops_table.h"

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
} gemm_args_t;

static int gemm_run(void *args, zs_err_t *err)
{
    UNPACK(gemm_args_t);
    zs_op_gemm(a.pool, a.ta, a.tb, a.M, a.N, a.K, a.alpha, a.A, a.lda, a.B, a.ldb, a.beta, a.C,
               a.ldc);
    return ZS_OK;
}

static int gemm(void *ctx, zs_stream_t *s, int ta, int tb, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                zs_err_t *err)
{
    gemm_args_t a = {ctx, ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C};
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
    embed_fwd_args_t a = {ctx, out, tok, wte, wpe, B, T, C};
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
    embed_bwd_args_t a = {ctx, dwte, dwpe, dout, tok, B, T, C};
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
    ln_fwd_args_t a = {ctx, out, mean, rstd, inp, w, b, N, C};
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
    ln_bwd_args_t a = {ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C};
    return zs_dev_host_fn(s, ln_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out;
    const float *inp, *w, *bias;
    int N, IC, OC;
} mm_fwd_args_t;

static int mm_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(mm_fwd_args_t);
    zs_op_matmul_fwd(a.pool, a.out, a.inp, a.w, a.bias, a.N, a.IC, a.OC);
    return ZS_OK;
}

static int matmul_fwd(void *ctx, zs_stream_t *s, float *out, const float *inp, const float *w,
                      const float *bias, int N, int IC, int OC, zs_err_t *err)
{
    mm_fwd_args_t a = {ctx, out, inp, w, bias, N, IC, OC};
    return zs_dev_host_fn(s, mm_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *dinp, *dw, *db;
    const float *dout, *inp, *w;
    int N, IC, OC;
} mm_bwd_args_t;

static int mm_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(mm_bwd_args_t);
    zs_op_matmul_bwd(a.pool, a.dinp, a.dw, a.db, a.dout, a.inp, a.w, a.N, a.IC, a.OC);
    return ZS_OK;
}

static int matmul_bwd(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                      const float *dout, const float *inp, const float *w, int N, int IC, int OC,
                      zs_err_t *err)
{
    mm_bwd_args_t a = {ctx, dinp, dw, db, dout, inp, w, N, IC, OC};
    return zs_dev_host_fn(s, mm_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out, *att;
    const float *qkv;
    int B, T, C, NH;
} att_fwd_args_t;

static int att_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(att_fwd_args_t);
    zs_op_attention_fwd(a.pool, a.out, a.att, a.qkv, a.B, a.T, a.C, a.NH);
    return ZS_OK;
}

static int attention_fwd(void *ctx, zs_stream_t *s, float *out, float *att, const float *qkv, int B,
                         int T, int C, int NH, zs_err_t *err)
{
    att_fwd_args_t a = {ctx, out, att, qkv, B, T, C, NH};
    return zs_dev_host_fn(s, att_fwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *dqkv, *scratch;
    const float *dout, *qkv, *att;
    int B, T, C, NH;
} att_bwd_args_t;

static int att_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(att_bwd_args_t);
    zs_op_attention_bwd(a.pool, a.dqkv, a.scratch, a.dout, a.qkv, a.att, a.B, a.T, a.C, a.NH);
    return ZS_OK;
}

static int attention_bwd(void *ctx, zs_stream_t *s, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, int B, int T, int C, int NH,
                         zs_err_t *err)
{
    att_bwd_args_t a = {ctx, dqkv, scratch, dout, qkv, att, B, T, C, NH};
    return zs_dev_host_fn(s, att_bwd_run, &a, sizeof a, err);
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
    ew_args_t a = {ctx, out, inp, NULL, n};
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
    ew_args_t a = {ctx, dinp, inp, dout, n};
    return zs_dev_host_fn(s, gelu_bwd_run, &a, sizeof a, err);
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
    ew_args_t a = {ctx, out, x, y, n};
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
    res_bwd_args_t a = {ctx, da, db, dout, n};
    return zs_dev_host_fn(s, residual_bwd_run, &a, sizeof a, err);
}

typedef struct {
    zs_pool_t *pool;
    float *out, *lse; /* fwd: losses, lse; bwd: dlogits, unused */
    const float *logits, *lse_in;
    const int32_t *targets;
    int N, V;
    float scale;
} xent_args_t;

static int xent_fwd_run(void *args, zs_err_t *err)
{
    UNPACK(xent_args_t);
    zs_op_xent_fwd(a.pool, a.out, a.lse, a.logits, a.targets, a.N, a.V);
    return ZS_OK;
}

static int xent_fwd(void *ctx, zs_stream_t *s, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int N, int V, zs_err_t *err)
{
    xent_args_t a = {ctx, losses, lse, logits, NULL, targets, N, V, 0.0f};
    return zs_dev_host_fn(s, xent_fwd_run, &a, sizeof a, err);
}

static int xent_bwd_run(void *args, zs_err_t *err)
{
    UNPACK(xent_args_t);
    zs_op_xent_bwd(a.pool, a.out, a.logits, a.lse_in, a.targets, a.N, a.V, a.scale);
    return ZS_OK;
}

static int xent_bwd(void *ctx, zs_stream_t *s, float *dlogits, const float *logits,
                    const float *lse, const int32_t *targets, int N, int V, float scale,
                    zs_err_t *err)
{
    xent_args_t a = {ctx, dlogits, NULL, logits, lse, targets, N, V, scale};
    return zs_dev_host_fn(s, xent_bwd_run, &a, sizeof a, err);
}

static void cpu_destroy(zs_gpt_ops_t *ops)
{
    free(ops);
}

int zs_gpt_ops_cpu_create(zs_pool_t *pool, zs_gpt_ops_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_gpt_ops_t *o = calloc(1, sizeof *o);
    if (!o)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt ops: out of memory");
    o->name = "cpu";
    o->ctx = pool;
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
    o->gelu_fwd = gelu_fwd;
    o->gelu_bwd = gelu_bwd;
    o->residual_fwd = residual_fwd;
    o->residual_bwd = residual_bwd;
    o->xent_fwd = xent_fwd;
    o->xent_bwd = xent_bwd;
    zs_op_init();
    *out = o;
    return ZS_OK;
}
