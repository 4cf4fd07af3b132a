/*
 * zs_cuda_attn.cu - causal multi-head self-attention on CUDA (see
 * zs_cuda_gpt.h): the twin of zs_op_attention_fwd / _bwd, and with mixed
 * precision (zs_mixed.h) of zs_op_attention_fwd_mixed / _bwd_mixed.
 *
 * Per (b, h) pair, exactly the CPU's sequence of products:
 *   forward   att = scale q k^T (full T x T), causal softmax in place
 *             (zeros past the diagonal), out = att v
 *   backward  D = dout v^T, dv = att^T dout, D <- scale att (D - rowsum(att D))
 *             (zeros past the diagonal), dq = D k, dk = D^T q
 * The products are cuBLASLt strided batched GEMMs reading q, k, v straight
 * out of qkv [B, T, 3C] (no permute copies): the (b, h) slices are not one
 * uniform stride apart, so one loop index runs on the host and the other is
 * the batch (heads within a sequence when B <= NH, else sequences for one
 * head). The softmax kernels run one warp per row of T with fixed-order
 * reductions, so the results repeat bitwise. Given a 16-bit twin of att
 * (zs_mixed_twin_t: the GPT's stored probabilities), the backward reads
 * only the twin, the softmax backward included, never att's fp32 values.
 *
 * What it does not do: a fused score/softmax kernel, skipping the masked
 * half of the products (the CPU computes it too). The fused, FlashAttention-2
 * style attention that keeps no [B, NH, T, T] tensor is zs_cuda_flash.cu.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "zs_cuda_blas.cuh"
#include "zs_cuda_gpt.h"
#include "zs_math.h"
#include "zs_cuda_util.cuh"
#include "zs_cuda_vec.h"

#define SM_WARPS 8 /* rows (warps) per block of the softmax kernels */

/* In place over rows of att [rows, T]; row r is query position r % T.
 * With HDT 16-bit, also h = att rounded to HDT (the GEMM's operand), in
 * the same pass. KEEP 0 (HDT 16-bit, h the caller's fill twin): the
 * probabilities go to h only and att keeps the scores, one fp32 write pass
 * fewer; the last pass recomputes each exponential instead of reading it
 * back (the same expf of the same operands: the same bits). */
template <int HDT, int KEEP>
__global__ void __launch_bounds__(SM_WARPS * 32)
    k_causal_softmax(float *__restrict__ att, void *__restrict__ h, int T, size_t rows)
{
    size_t row = (size_t)blockIdx.x * SM_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    int t = (int)(row % (size_t)T);
    float *p = att + row * T;
    float mx = -INFINITY;
    for (int u = lane; u <= t; u += 32)
        mx = fmaxf(mx, p[u]);
    mx = zs__warp_max(mx);
    float s = 0.0f;
    for (int u = lane; u <= t; u += 32) {
        float e = expf(p[u] - mx);
        if (KEEP)
            p[u] = e;
        s = s + e;
    }
    float inv = 1.0f / zs__warp_sum(s);
    for (int u = lane; u <= t; u += 32) {
        float x = (KEEP ? p[u] : expf(p[u] - mx)) * inv;
        if (KEEP)
            p[u] = x;
        if (HDT != ZS_DTYPE_F32)
            zs_math_store(h, HDT, row * T + u, x);
    }
    for (int u = t + 1 + lane; u < T; u += 32) {
        if (KEEP)
            p[u] = 0.0f;
        if (HDT != ZS_DTYPE_F32)
            zs_math_store(h, HDT, row * T + u, 0.0f);
    }
}

/* out <- scale * att * (D - sum_u att D) on u <= t, 0 past t; rows as
 * above. att of dtype ADT: fp32, or the caller's 16-bit twin of it (the
 * same values widened, so the same results bitwise). out of dtype ODT:
 * D itself (fp32, in place), or the 16-bit operand of the GEMMs after it,
 * rounded here instead of in a pass of its own. out may be D, or att's
 * twin (then the GEMMs' piece for both): the row's sum is complete (the
 * butterfly) before any lane writes, and each lane then reads the elements
 * it writes before writing them, so no __restrict__ on the three. */
template <int ADT, int ODT>
__global__ void __launch_bounds__(SM_WARPS * 32)
    k_causal_softmax_bwd(const float *D, void *out, const void *att, float scale, int T,
                         size_t rows)
{
    size_t row = (size_t)blockIdx.x * SM_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    int t = (int)(row % (size_t)T);
    size_t a = row * T;
    const float *d = D + a;
    float s = 0.0f;
    for (int u = lane; u <= t; u += 32)
        s = s + zs_math_load(att, ADT, a + u) * d[u];
    s = zs__warp_sum(s);
    for (int u = lane; u <= t; u += 32)
        zs_math_store(out, ODT, a + u, zs_math_load(att, ADT, a + u) * (d[u] - s) * scale);
    for (int u = t + 1 + lane; u < T; u += 32)
        zs_math_store(out, ODT, a + u, 0.0f);
}

/* How the B x NH slices map to host loops and GEMM batches: slice (i, j)
 * with i the loop index and j the batch index starts at i * *_off + j *
 * *_st elements into qkv-like [B, T, 3C], tc-like [B, T, C] and tt-like
 * [B, NH, T, T] arrays. */
typedef struct {
    int loops, batch;
    long long qkv_off, qkv_st, tc_off, tc_st, tt_off, tt_st;
} attn_plan_t;

static attn_plan_t attn_plan(int B, int T, int C, int NH)
{
    long long hs = C / NH, tt = (long long)T * T;
    attn_plan_t p;
    if (B <= NH) { /* loop over sequences, batch the heads */
        p.loops = B;
        p.batch = NH;
        p.qkv_off = (long long)T * 3 * C;
        p.qkv_st = hs;
        p.tc_off = (long long)T * C;
        p.tc_st = hs;
        p.tt_off = NH * tt;
        p.tt_st = tt;
    } else { /* loop over heads, batch the sequences */
        p.loops = NH;
        p.batch = B;
        p.qkv_off = hs;
        p.qkv_st = (long long)T * 3 * C;
        p.tc_off = hs;
        p.tc_st = (long long)T * C;
        p.tt_off = tt;
        p.tt_st = NH * tt;
    }
    return p;
}

static int attn_args(const char *fn, int B, int T, int C, int NH, zs_err_t *err)
{
    if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: bad shape B=%d T=%d C=%d NH=%d", fn, B, T, C,
                          NH);
    if ((long long)B * NH * T > INT32_MAX || (long long)T * 3 * C > INT32_MAX)
        return zs_err_set(err, ZS_ERR_RANGE, "%s: shape too large B=%d T=%d C=%d NH=%d", fn, B, T,
                          C, NH);
    return ZS_OK;
}

static unsigned sm_blocks(size_t rows)
{
    return (unsigned)((rows + SM_WARPS - 1) / SM_WARPS);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_attention_fwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx,
                                           float *out, float *att, const float *qkv, int B, int T,
                                           int C, int NH, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    int rc = attn_args("zs_cuda_attention_fwd", B, T, C, NH, err);
    if (rc != ZS_OK || B == 0 || T == 0)
        return rc;
    if (!out || !att || !qkv)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_attention_fwd: NULL buffer");
    zs__opnd_t o;
    rc = zs__opnd_init("zs_cuda_attention_fwd", mx, zs_mixed_attention_fwd_elems(B, T, C, NH), &o,
                       err);
    if (rc != ZS_OK)
        return rc;
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    attn_plan_t p = attn_plan(B, T, C, NH);
    size_t rows = (size_t)B * NH * T;
    const void *gq = qkv, *ga = att; /* what the GEMMs read */
    if (o.dt != ZS_DTYPE_F32 && (rc = zs__opnd_round(cs, &o, qkv, (size_t)B * T * 3 * C, &gq, err)))
        return rc;
    for (int i = 0; i < p.loops; i++) {
        const void *q = zs__at(gq, i * p.qkv_off, o.es), *k = zs__at(gq, i * p.qkv_off + C, o.es);
        rc = zs__cuda_gemm_batched(cs, blas, o.dt, 0, 1, T, T, hs, scale, q, ld, p.qkv_st, k, ld,
                                   p.qkv_st, 0.0f, att + i * p.tt_off, T, p.tt_st, p.batch, err);
        if (rc != ZS_OK) {
            zs_err_prefix(err, "zs_cuda_attention_fwd scores: ");
            return rc;
        }
    }
    /* the softmax writes the GEMM's 16-bit operand too (its piece, or the
     * caller's fill twin: zs_mixed_twin_t.fill) */
    void *h = o.dt != ZS_DTYPE_F32 ? zs__opnd_out(&o, att, rows * T) : NULL;
    /* a fill twin is the caller's result: att is then only our scratch */
    const zs_mixed_twin_t *tw = h ? zs__opnd_twin_of(&o, att, rows * T) : NULL;
    int keep = !(tw && tw->fill);
    decltype(&k_causal_softmax<ZS_DTYPE_F32, 1>) fk = k_causal_softmax<ZS_DTYPE_F32, 1>;
    if (h && o.dt == ZS_DTYPE_BF16)
        fk = keep ? k_causal_softmax<ZS_DTYPE_BF16, 1> : k_causal_softmax<ZS_DTYPE_BF16, 0>;
    else if (h)
        fk = keep ? k_causal_softmax<ZS_DTYPE_F16, 1> : k_causal_softmax<ZS_DTYPE_F16, 0>;
    ZS_CUDA_LAUNCH(fk, sm_blocks(rows), SM_WARPS * 32, 0, cs, att, h, T, rows);
    ZS_CUDA_LAUNCHED("k_causal_softmax");
    if (h)
        ga = h;
    for (int i = 0; i < p.loops; i++) {
        const void *v = zs__at(gq, i * p.qkv_off + 2 * C, o.es),
                   *a = zs__at(ga, i * p.tt_off, o.es);
        rc = zs__cuda_gemm_batched(cs, blas, o.dt, 0, 0, T, hs, T, 1.0f, a, T, p.tt_st, v, ld,
                                   p.qkv_st, 0.0f, out + i * p.tc_off, C, p.tc_st, p.batch, err);
        if (rc != ZS_OK) {
            zs_err_prefix(err, "zs_cuda_attention_fwd att v: ");
            return rc;
        }
    }
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_attention_fwd(void *stream, zs_cuda_blas_t *blas, float *out, float *att,
                                     const float *qkv, int B, int T, int C, int NH, zs_err_t *err)
{
    return zs_cuda_attention_fwd_mixed(stream, blas, NULL, out, att, qkv, B, T, C, NH, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_attention_bwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx,
                                           float *dqkv, float *scratch, const float *dout,
                                           const float *qkv, const float *att, int B, int T, int C,
                                           int NH, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    int rc = attn_args("zs_cuda_attention_bwd", B, T, C, NH, err);
    if (rc != ZS_OK || B == 0 || T == 0)
        return rc;
    if (!dqkv || !scratch || !dout || !qkv || !att)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_attention_bwd: NULL buffer");
    zs__opnd_t o;
    rc = zs__opnd_init("zs_cuda_attention_bwd", mx, zs_mixed_attention_bwd_elems(B, T, C, NH), &o,
                       err);
    if (rc != ZS_OK)
        return rc;
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    attn_plan_t p = attn_plan(B, T, C, NH);
    size_t rows = (size_t)B * NH * T;
    const void *gd = dout, *gq = qkv, *ga = att, *gD = scratch; /* what the GEMMs read */
    if (o.dt != ZS_DTYPE_F32) {
        if ((rc = zs__opnd_round(cs, &o, dout, (size_t)B * T * C, &gd, err)) ||
            (rc = zs__opnd_round(cs, &o, qkv, (size_t)B * T * 3 * C, &gq, err)) ||
            (rc = zs__opnd_round(cs, &o, att, rows * T, &ga, err)))
            return rc;
        gD = ga; /* D is rounded into att's piece once dv has read it (stream order) */
    }
    for (int i = 0; i < p.loops; i++) {
        const void *v = zs__at(gq, i * p.qkv_off + 2 * C, o.es),
                   *d = zs__at(gd, i * p.tc_off, o.es);
        const void *a = zs__at(ga, i * p.tt_off, o.es);
        float *D = scratch + i * p.tt_off, *dv = dqkv + i * p.qkv_off + 2 * C;
        /* D = dout v^T */
        rc = zs__cuda_gemm_batched(cs, blas, o.dt, 0, 1, T, T, hs, 1.0f, d, C, p.tc_st, v, ld,
                                   p.qkv_st, 0.0f, D, T, p.tt_st, p.batch, err);
        /* dv = att^T dout */
        if (rc == ZS_OK)
            rc = zs__cuda_gemm_batched(cs, blas, o.dt, 1, 0, T, hs, T, 1.0f, a, T, p.tt_st, d, C,
                                       p.tc_st, 0.0f, dv, ld, p.qkv_st, p.batch, err);
        if (rc != ZS_OK) {
            zs_err_prefix(err, "zs_cuda_attention_bwd D / dv: ");
            return rc;
        }
    }
    /* with att's 16-bit twin given, the softmax backward reads the twin
     * too, so att's fp32 contents are never read (the GPT then skips
     * casting them back: zs_gpt_act16.c) */
    const void *att16 = o.dt != ZS_DTYPE_F32 ? zs__opnd_twin(&o, att, rows * T) : NULL;
    decltype(&k_causal_softmax_bwd<ZS_DTYPE_F32, ZS_DTYPE_F32>) sk;
    if (o.dt == ZS_DTYPE_F32) /* D in place, the GEMMs' fp32 operand */
        sk = k_causal_softmax_bwd<ZS_DTYPE_F32, ZS_DTYPE_F32>;
    else if (o.dt == ZS_DTYPE_BF16) /* D rounded into gD in the same pass */
        sk = att16 ? k_causal_softmax_bwd<ZS_DTYPE_BF16, ZS_DTYPE_BF16>
                   : k_causal_softmax_bwd<ZS_DTYPE_F32, ZS_DTYPE_BF16>;
    else
        sk = att16 ? k_causal_softmax_bwd<ZS_DTYPE_F16, ZS_DTYPE_F16>
                   : k_causal_softmax_bwd<ZS_DTYPE_F32, ZS_DTYPE_F16>;
    ZS_CUDA_LAUNCH(sk, sm_blocks(rows), SM_WARPS * 32, 0, cs, scratch,
                   o.dt == ZS_DTYPE_F32 ? (void *)scratch : (void *)gD,
                   att16 ? att16 : (const void *)att, scale, T, rows);
    ZS_CUDA_LAUNCHED("k_causal_softmax_bwd");
    for (int i = 0; i < p.loops; i++) {
        const void *q = zs__at(gq, i * p.qkv_off, o.es), *k = zs__at(gq, i * p.qkv_off + C, o.es);
        const void *D = zs__at(gD, i * p.tt_off, o.es);
        float *dq = dqkv + i * p.qkv_off, *dk = dq + C;
        /* dq = D k */
        rc = zs__cuda_gemm_batched(cs, blas, o.dt, 0, 0, T, hs, T, 1.0f, D, T, p.tt_st, k, ld,
                                   p.qkv_st, 0.0f, dq, ld, p.qkv_st, p.batch, err);
        /* dk = D^T q */
        if (rc == ZS_OK)
            rc = zs__cuda_gemm_batched(cs, blas, o.dt, 1, 0, T, hs, T, 1.0f, D, T, p.tt_st, q, ld,
                                       p.qkv_st, 0.0f, dk, ld, p.qkv_st, p.batch, err);
        if (rc != ZS_OK) {
            zs_err_prefix(err, "zs_cuda_attention_bwd dq / dk: ");
            return rc;
        }
    }
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_attention_bwd(void *stream, zs_cuda_blas_t *blas, float *dqkv,
                                     float *scratch, const float *dout, const float *qkv,
                                     const float *att, int B, int T, int C, int NH, zs_err_t *err)
{
    return zs_cuda_attention_bwd_mixed(stream, blas, NULL, dqkv, scratch, dout, qkv, att, B, T, C,
                                       NH, err);
}
