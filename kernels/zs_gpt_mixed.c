/*
 * zs_gpt_mixed.c - the CPU reference of the GPT's mixed-precision GEMMs
 * (zs_mixed.h): the GEMM-based ops of zs_gpt_ops.h with their operands
 * rounded to bf16 / fp16 into the caller's scratch (as fp32 values), then
 * the fp32 kernels on the rounded copies. The CUDA twins
 * (kernels/cuda/zs_cuda_gpt.h, *_mixed) round the same tensors at the same
 * points into 16-bit copies and run cuBLASLt on them.
 *
 * Does not allocate: every rounded copy lives in mx->scratch, carved in the
 * order zs_mixed.h lists, and an op whose need exceeds mx->cap computes
 * nothing and returns ZS_ERR_RANGE.
 */
#include <string.h>

#include "zs_gpt_ops.h"
#include "zs_gpt_ops_internal.h"
#include "zs_status.h"

typedef struct {
    int dt;
    float *out;
    const float *in;
} round_job_t;

static void round_range(const void *arg, size_t lo, size_t hi)
{
    const round_job_t *j = arg;
    if (j->dt == ZS_DTYPE_BF16)
        for (size_t i = lo; i < hi; i++)
            j->out[i] = zs_math_bf16_to_f32(zs_math_f32_to_bf16(j->in[i]));
    else
        for (size_t i = lo; i < hi; i++)
            j->out[i] = zs_math_f16_to_f32(zs_math_f32_to_f16(j->in[i]));
}

void zs_op_round(zs_pool_t *pool, int dt, float *out, const float *in, size_t n)
{
    if (dt != ZS_DTYPE_BF16 && dt != ZS_DTYPE_F16) {
        if (out != in)
            memmove(out, in, n * sizeof(float));
        return;
    }
    round_job_t j = {dt, out, in};
    zs__op_parallel_for(pool, n, 4096, round_range, &j);
}

/* A cursor over mx->scratch handing out pieces in carve order. */
typedef struct {
    float *next;
} carver_t;

static float *take(carver_t *c, size_t n)
{
    float *p = c->next;
    c->next += zs_mixed_piece(n);
    return p;
}

/* Round n elements of `in` into the next piece and return it. */
static const float *rounded(zs_pool_t *pool, const zs_mixed_t *mx, carver_t *c, const float *in,
                            size_t n)
{
    float *p = take(c, n);
    zs_op_round(pool, mx->dt, p, in, n);
    return p;
}

int zs_op_gemm_mixed(zs_pool_t *pool, const zs_mixed_t *mx, int ta, int tb, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                     float *C, int ldc)
{
    if (!zs_mixed_on(mx)) {
        zs_op_gemm(pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return ZS_OK;
    }
    if (zs_mixed_gemm_elems(ta, tb, M, N, K, lda, ldb) > mx->cap)
        return ZS_ERR_RANGE;
    if (M <= 0 || N <= 0)
        return ZS_OK;
    carver_t c = {mx->scratch};
    size_t na = ta ? zs_mixed_extent((size_t)K, (size_t)M, (size_t)lda)
                   : zs_mixed_extent((size_t)M, (size_t)K, (size_t)lda);
    size_t nb = tb ? zs_mixed_extent((size_t)N, (size_t)K, (size_t)ldb)
                   : zs_mixed_extent((size_t)K, (size_t)N, (size_t)ldb);
    const float *ra = rounded(pool, mx, &c, A, na);
    const float *rb = rounded(pool, mx, &c, B, nb);
    zs_op_gemm(pool, ta, tb, M, N, K, alpha, ra, lda, rb, ldb, beta, C, ldc);
    return ZS_OK;
}

int zs_op_matmul_fwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *out, const float *inp,
                           const float *w, const float *bias, int N, int IC, int OC)
{
    if (!zs_mixed_on(mx)) {
        zs_op_matmul_fwd(pool, out, inp, w, bias, N, IC, OC);
        return ZS_OK;
    }
    if (zs_mixed_matmul_fwd_elems(N, IC, OC) > mx->cap)
        return ZS_ERR_RANGE;
    carver_t c = {mx->scratch};
    const float *ri = rounded(pool, mx, &c, inp, (size_t)N * IC);
    const float *rw = rounded(pool, mx, &c, w, (size_t)IC * OC);
    zs_op_matmul_fwd(pool, out, ri, rw, bias, N, IC, OC);
    return ZS_OK;
}

int zs_op_matmul_bwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w, int N, int IC,
                           int OC)
{
    if (!zs_mixed_on(mx)) {
        zs_op_matmul_bwd(pool, dinp, dw, db, dout, inp, w, N, IC, OC);
        return ZS_OK;
    }
    if (zs_mixed_matmul_bwd_elems(N, IC, OC) > mx->cap)
        return ZS_ERR_RANGE;
    carver_t c = {mx->scratch};
    const float *rd = rounded(pool, mx, &c, dout, (size_t)N * OC);
    const float *rw = rounded(pool, mx, &c, w, (size_t)IC * OC);
    const float *ri = rounded(pool, mx, &c, inp, (size_t)N * IC);
    zs_op_matmul_bwd(pool, dinp, dw, NULL, rd, ri, rw, N, IC, OC);
    if (db)
        zs_op_bias_bwd(pool, db, dout, N, OC); /* the fp32 dout */
    return ZS_OK;
}

int zs_op_attention_fwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *out, float *att,
                              const float *qkv, int B, int T, int C, int NH)
{
    if (!zs_mixed_on(mx)) {
        zs_op_attention_fwd(pool, out, att, qkv, B, T, C, NH);
        return ZS_OK;
    }
    if (zs_mixed_attention_fwd_elems(B, T, C, NH) > mx->cap)
        return ZS_ERR_RANGE;
    carver_t c = {mx->scratch};
    const float *rq = rounded(pool, mx, &c, qkv, (size_t)B * T * 3 * C);
    float *att_r = take(&c, (size_t)B * NH * T * T);
    zs__op_attention_fwd(pool, mx->dt, att_r, out, att, rq, B, T, C, NH);
    return ZS_OK;
}

int zs_op_attention_bwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *dqkv, float *scratch,
                              const float *dout, const float *qkv, const float *att, int B, int T,
                              int C, int NH)
{
    if (!zs_mixed_on(mx)) {
        zs_op_attention_bwd(pool, dqkv, scratch, dout, qkv, att, B, T, C, NH);
        return ZS_OK;
    }
    if (zs_mixed_attention_bwd_elems(B, T, C, NH) > mx->cap)
        return ZS_ERR_RANGE;
    carver_t c = {mx->scratch};
    const float *rd = rounded(pool, mx, &c, dout, (size_t)B * T * C);
    const float *rq = rounded(pool, mx, &c, qkv, (size_t)B * T * 3 * C);
    float *att_r = take(&c, (size_t)B * NH * T * T);
    zs__op_attention_bwd(pool, mx->dt, att_r, dqkv, scratch, rd, rq, att, B, T, C, NH);
    return ZS_OK;
}

int zs_op_attention_flash_fwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *out, float *lse,
                                    const float *qkv, int B, int T, int C, int NH)
{
    if (!zs_mixed_on(mx)) {
        zs_op_attention_flash_fwd(pool, out, lse, qkv, B, T, C, NH);
        return ZS_OK;
    }
    if (zs_mixed_flash_fwd_elems(B, T, C) > mx->cap)
        return ZS_ERR_RANGE;
    carver_t c = {mx->scratch};
    const float *rq = rounded(pool, mx, &c, qkv, (size_t)B * T * 3 * C);
    zs__op_attention_flash_fwd(pool, mx->dt, out, lse, rq, B, T, C, NH);
    return ZS_OK;
}

int zs_op_attention_flash_bwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *dqkv,
                                    const float *dout, const float *qkv, const float *out,
                                    const float *lse, int B, int T, int C, int NH)
{
    if (!zs_mixed_on(mx)) {
        zs_op_attention_flash_bwd(pool, dqkv, dout, qkv, out, lse, B, T, C, NH);
        return ZS_OK;
    }
    if (zs_mixed_flash_bwd_elems(B, T, C) > mx->cap)
        return ZS_ERR_RANGE;
    carver_t c = {mx->scratch};
    const float *rd = rounded(pool, mx, &c, dout, (size_t)B * T * C);
    const float *rq = rounded(pool, mx, &c, qkv, (size_t)B * T * 3 * C);
    zs__op_attention_flash_bwd(pool, mx->dt, dqkv, dout, rd, rq, out, lse, B, T, C, NH);
    return ZS_OK;
}
