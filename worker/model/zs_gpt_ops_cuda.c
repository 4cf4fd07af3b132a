/*
 * zs_gpt_ops_cuda.c - the CUDA op table of zs_gpt_ops_table.h: every entry
 * launches the kernels/cuda/zs_cuda_gpt.h twin of the CPU op on the
 * cudaStream_t behind the zs_stream_t it is given, with the same arguments,
 * so the model (zs_gpt.c) wires its layers once for both devices.
 *
 * The table's context owns one cuBLASLt context (zs_cuda_blas_t) and its
 * workspace (ZS_GPT_CUDA_WORKSPACE bytes of device memory from the device's
 * allocator, counted as ZS_MEM_SCRATCH). A workspace may only be used by
 * one stream at a time, so the first stream that runs a GEMM-based op (gemm,
 * matmul, attention) owns it for the life of the table and GEMM-based ops on
 * any other stream are refused (ZS_ERR_INVALID): the model uses a single
 * compute stream. Entries make the device current on the calling thread
 * first (the launchers need it), check every CUDA call, and never touch
 * device memory on the host. Like every table, they return errors of the
 * enqueue (bad stream, bad shape, launch failure); errors of the running
 * kernels show at the next synchronisation of the stream.
 *
 * Mixed precision (set_mixed): the GEMM-based entries call the *_mixed
 * launchers with the table's setting, which round the operands into the
 * 16-bit scratch on the same stream (mixed_elem_bytes 2), except operands
 * whose 16-bit twin the model gave for that call (set_twins): those are
 * read as they are. GELU and the LayerNorm forward take twins as well
 * (GELU's input read from the copy; their output written to a fill twin's
 * home).
 *
 * Deviation from the CPU table: a stream's sticky error (zs_dev.h) does not
 * stop these launches (the CPU device skips queued host functions after a
 * failure; CUDA cannot cancel kernels either, see zs_dev_cuda.c). The model
 * reads results only through synchronising calls, which return the error.
 *
 * Not here: the kernels (kernels/cuda), choosing the table (zs_gpt.c's
 * ops_for_device), allocation of the model's tensors. Built only with
 * ZS_WITH_CUDA.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "zs_cuda_gpt.h"
#include "zs_dev_cuda.h"
#include "zs_gpt_ops_table.h"

/* cuBLASLt workspace: what zs_cuda_gpt.h calls plenty for these shapes. */
#define ZS_GPT_CUDA_WORKSPACE ((size_t)32 << 20)

#define HINT_DEV "was the device reset, or is this thread's CUDA context gone?"

typedef struct {
    zs_gpt_ops_t ops;         /* first: the table handed out */
    zs_dev_t *dev;            /* not owned */
    int device;               /* CUDA ordinal of dev */
    void *workspace;          /* device, ZS_MEM_SCRATCH, owned */
    zs_cuda_blas_t blas;      /* owned handle; uses workspace */
    zs_stream_t *gemm_stream; /* the stream that owns the workspace (first GEMM user) */
    zs_mixed_t mx;            /* set_mixed; dt ZS_DTYPE_F32: plain fp32 */
} cuda_ops_t;

/* Checks common to every entry: s is a stream of this table's device, the
 * device is current on this thread; *cs = its cudaStream_t. gemm: the op
 * uses the cuBLASLt workspace, so s must be the stream that owns it (the
 * first one to ask). */
static int enter(cuda_ops_t *c, zs_stream_t *s, int gemm, void **cs, zs_err_t *err)
{
    if (!s || zs_dev_of_stream(s) != c->dev)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "gpt ops (cuda): the stream is not a stream of %s (the table's device)",
                          c->dev->desc);
    *cs = zs__dev_cuda_stream_handle(s);
    if (!*cs)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt ops (cuda): the stream has no cudaStream_t");
    if (gemm) {
        if (!c->gemm_stream)
            c->gemm_stream = s;
        else if (c->gemm_stream != s)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "gpt ops (cuda): GEMM-based op on a second stream; the table's "
                              "cuBLASLt workspace belongs to the first stream that ran one (make "
                              "one table per stream)");
    }
    return ZS_CUDA_CHECK(err, c->device, HINT_DEV, cudaSetDevice, c->device);
}

#define ENTER(gemm)                                                                                \
    cuda_ops_t *c = ctx;                                                                           \
    void *cs;                                                                                      \
    int rc_ = enter(c, s, (gemm), &cs, err);                                                       \
    if (rc_)                                                                                       \
    return rc_

/* A GEMM-based entry: the twins given by set_twins are this call's only
 * (taken before anything can fail); `mx` is the setting it runs with. */
#define ENTER_MX(gemm)                                                                             \
    zs_mixed_t mx = ((cuda_ops_t *)ctx)->mx;                                                       \
    ((cuda_ops_t *)ctx)->mx.ntwins = 0;                                                            \
    ENTER(gemm)

/* The 16-bit twin given for the first n elements of t: fill 0, a copy to
 * read (t rounded); fill 1, a home the op writes instead of t. NULL: none. */
static void *twin_of(const zs_mixed_t *mx, const float *t, size_t n, int fill)
{
    const zs_mixed_twin_t *tw = zs_mixed_twin(mx, t, n);
    return tw && tw->fill == fill ? (void *)(uintptr_t)tw->h16 : NULL;
}

static int gemm(void *ctx, zs_stream_t *s, int ta, int tb, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                zs_err_t *err)
{
    ENTER_MX(1);
    return zs_cuda_gemm_mixed(cs, &c->blas, &mx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                              ldc, err);
}

static int embed_fwd(void *ctx, zs_stream_t *s, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C, zs_err_t *err)
{
    ENTER(0);
    return zs_cuda_embed_fwd(cs, out, tok, wte, wpe, B, T, C, err);
}

static int embed_bwd(void *ctx, zs_stream_t *s, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C, zs_err_t *err)
{
    ENTER(0);
    return zs_cuda_embed_bwd(cs, dwte, dwpe, dout, tok, B, T, C, err);
}

static int layernorm_fwd(void *ctx, zs_stream_t *s, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int N, int C,
                         zs_err_t *err)
{
    ENTER_MX(0); /* out's fill twin: the op writes its home instead */
    void *out16 = twin_of(&mx, out, (size_t)N * C, 1);
    return zs_cuda_layernorm_fwd_dt(cs, out16 ? out16 : (void *)out, out16 ? mx.dt : ZS_DTYPE_F32,
                                    mean, rstd, inp, w, b, N, C, err);
}

static int layernorm_bwd(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                         const float *dout, const float *inp, const float *w, const float *mean,
                         const float *rstd, int N, int C, zs_err_t *err)
{
    ENTER(0);
    return zs_cuda_layernorm_bwd(cs, dinp, dw, db, dout, inp, w, mean, rstd, N, C, err);
}

static int matmul_fwd(void *ctx, zs_stream_t *s, float *out, const float *inp, const float *w,
                      const float *bias, int N, int IC, int OC, zs_err_t *err)
{
    ENTER_MX(1);
    return zs_cuda_matmul_fwd_mixed(cs, &c->blas, &mx, out, inp, w, bias, N, IC, OC, err);
}

static int matmul_bwd(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                      const float *dout, const float *inp, const float *w, int N, int IC, int OC,
                      zs_err_t *err)
{
    ENTER_MX(1);
    return zs_cuda_matmul_bwd_mixed(cs, &c->blas, &mx, dinp, dw, db, dout, inp, w, N, IC, OC, err);
}

static int attention_fwd(void *ctx, zs_stream_t *s, float *out, float *att, const float *qkv, int B,
                         int T, int C, int NH, zs_err_t *err)
{
    ENTER_MX(1);
    return zs_cuda_attention_fwd_mixed(cs, &c->blas, &mx, out, att, qkv, B, T, C, NH, err);
}

static int attention_bwd(void *ctx, zs_stream_t *s, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, int B, int T, int C, int NH,
                         zs_err_t *err)
{
    ENTER_MX(1);
    return zs_cuda_attention_bwd_mixed(cs, &c->blas, &mx, dqkv, scratch, dout, qkv, att, B, T, C,
                                       NH, err);
}

static int attention_flash_fwd(void *ctx, zs_stream_t *s, float *out, float *lse, const float *qkv,
                               int B, int T, int C, int NH, zs_err_t *err)
{
    ENTER_MX(0); /* the flash kernels round their tiles themselves: twins unused */
    return zs_cuda_attention_flash_fwd(cs, &mx, out, lse, qkv, B, T, C, NH, err);
}

static int attention_flash_bwd(void *ctx, zs_stream_t *s, float *dqkv, const float *dout,
                               const float *qkv, const float *out, const float *lse, int B, int T,
                               int C, int NH, zs_err_t *err)
{
    ENTER_MX(0);
    return zs_cuda_attention_flash_bwd(cs, &mx, dqkv, dout, qkv, out, lse, B, T, C, NH, err);
}

/* GELU takes twins too: it reads inp's copy, and writes out's home instead
 * of out (then out is not written). */
static int gelu_fwd(void *ctx, zs_stream_t *s, float *out, const float *inp, size_t n,
                    zs_err_t *err)
{
    ENTER_MX(0);
    const void *in16 = twin_of(&mx, inp, n, 0);
    void *out16 = twin_of(&mx, out, n, 1);
    return zs_cuda_gelu_fwd_dt(cs, out16 ? out16 : (void *)out, out16 ? mx.dt : ZS_DTYPE_F32,
                               in16 ? in16 : (const void *)inp, in16 ? mx.dt : ZS_DTYPE_F32, n,
                               err);
}

static int gelu_bwd(void *ctx, zs_stream_t *s, float *dinp, const float *inp, const float *dout,
                    size_t n, zs_err_t *err)
{
    ENTER_MX(0); /* dinp's copy twin (fill 2): also its rounded copy there */
    const void *in16 = twin_of(&mx, inp, n, 0);
    return zs_cuda_gelu_bwd_copy(cs, dinp, twin_of(&mx, dinp, n, 2), mx.dt,
                                 in16 ? in16 : (const void *)inp, in16 ? mx.dt : ZS_DTYPE_F32, dout,
                                 n, err);
}

static int residual_layernorm_fwd(void *ctx, zs_stream_t *s, float *res, void *res16, int rdt,
                                  float *out, float *mean, float *rstd, const float *a,
                                  const float *b, const float *w, const float *bias, int N, int C,
                                  zs_err_t *err)
{
    ENTER_MX(0); /* out's fill twin: the op writes its home instead */
    void *out16 = twin_of(&mx, out, (size_t)N * C, 1);
    return zs_cuda_residual_layernorm_fwd_dt(cs, res, res16, rdt, out16 ? out16 : (void *)out,
                                             out16 ? mx.dt : ZS_DTYPE_F32, mean, rstd, a, b, w,
                                             bias, N, C, err);
}

static int residual_fwd(void *ctx, zs_stream_t *s, float *out, const float *a, const float *b,
                        size_t n, zs_err_t *err)
{
    ENTER(0);
    return zs_cuda_residual_fwd(cs, out, a, b, n, err);
}

static int residual_bwd(void *ctx, zs_stream_t *s, float *da, float *db, const float *dout,
                        size_t n, zs_err_t *err)
{
    ENTER(0);
    return zs_cuda_residual_bwd(cs, da, db, dout, n, err);
}

static int xent_fwd(void *ctx, zs_stream_t *s, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int N, int V, int ld, zs_err_t *err)
{
    ENTER(0);
    return zs_cuda_xent_fwd(cs, losses, lse, logits, targets, N, V, ld, err);
}

static int xent_bwd(void *ctx, zs_stream_t *s, float *dlogits, const float *logits,
                    const float *lse, const int32_t *targets, int N, int V, int ld, float scale,
                    zs_err_t *err)
{
    ENTER_MX(0); /* dlogits' fill twin: the op writes its home instead */
    void *d16 = twin_of(&mx, dlogits, (size_t)N * ld, 1);
    return zs_cuda_xent_bwd_dt(cs, d16 ? d16 : (void *)dlogits, d16 ? mx.dt : ZS_DTYPE_F32, logits,
                               lse, targets, N, V, ld, scale, err);
}

static int set_mixed(void *ctx, const zs_mixed_t *mx, zs_err_t *err)
{
    cuda_ops_t *c = ctx;
    if (zs_mixed_set(&c->mx, mx))
        return zs_err_set(err, ZS_ERR_INVALID, "gpt ops (cuda): mixed precision without scratch");
    c->mx.ntwins = 0;
    return ZS_OK;
}

static int set_twins(void *ctx, const zs_mixed_twin_t *tw, int n, zs_err_t *err)
{
    cuda_ops_t *c = ctx;
    if (n < 0 || n > ZS_MIXED_TWINS_MAX || (n && !tw))
        return zs_err_set(err, ZS_ERR_INVALID, "gpt ops (cuda): %d twins (at most %d)", n,
                          ZS_MIXED_TWINS_MAX);
    for (int i = 0; i < n; i++)
        c->mx.twins[i] = tw[i];
    c->mx.ntwins = zs_mixed_on(&c->mx) ? n : 0; /* fp32 GEMMs round nothing */
    return ZS_OK;
}

/* The cuBLASLt handle, then the workspace (the allocator frees device
 * blocks only once the streams that may use them are past the free). */
static void cuda_destroy(zs_gpt_ops_t *ops)
{
    cuda_ops_t *c = (cuda_ops_t *)ops;
    if (!c)
        return;
    if (c->blas.lt) {
        /* the handle belongs to the device current when it was made */
        if (ZS_CUDA_CHECK(NULL, c->device, HINT_DEV, cudaSetDevice, c->device) == ZS_OK)
            zs_cuda_blas_deinit(&c->blas);
    }
    zs_dev_free(c->dev, c->workspace);
    free(c);
}

int zs_gpt_ops_cuda_create(zs_dev_t *dev, zs_gpt_ops_t **out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt ops (cuda): out is NULL");
    *out = NULL;
    int device = zs__dev_cuda_ordinal(dev);
    if (device < 0)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt ops (cuda): device %s is not a CUDA device",
                          dev ? dev->desc : "(null)");
    cuda_ops_t *c = calloc(1, sizeof *c);
    if (!c)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt ops (cuda): out of memory");
    c->dev = dev;
    c->device = device;
    int rc = ZS_CUDA_CHECK(err, device, HINT_DEV, cudaSetDevice, device);
    if (rc == ZS_OK)
        rc = zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, ZS_GPT_CUDA_WORKSPACE,
                          &c->workspace, err);
    if (rc == ZS_OK)
        rc = zs_cuda_blas_init(&c->blas, c->workspace, ZS_GPT_CUDA_WORKSPACE, err);
    if (rc) {
        zs_err_prefix(err, "gpt ops (cuda) on %s: ", dev->desc);
        cuda_destroy(&c->ops);
        return rc;
    }
    zs_gpt_ops_t *o = &c->ops;
    o->name = "cuda";
    o->ctx = c;
    o->set_mixed = set_mixed;
    o->set_twins = set_twins;
    o->mixed_elem_bytes = 2;
    zs_mixed_set(&c->mx, NULL);
    o->destroy = cuda_destroy;
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
    o->flash_hs_mult = 16; /* zs_cuda_attention_flash_*: multiples of 16 up to 128 */
    o->flash_hs_max = 128;
    o->flash_needs_mixed = 1;
    o->gelu_fwd = gelu_fwd;
    o->gelu_bwd = gelu_bwd;
    o->residual_fwd = residual_fwd;
    o->residual_layernorm_fwd = residual_layernorm_fwd;
    o->residual_bwd = residual_bwd;
    o->xent_fwd = xent_fwd;
    o->xent_bwd = xent_bwd;
    *out = o;
    return ZS_OK;
}
