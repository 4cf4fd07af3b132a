/*
 * zs_gpt_ops_table.h - the GPT layer kernels as a table of stream-ordered
 * operations, one table per device kind, so the model (zs_gpt.c) wires its
 * layers once and runs on any device of zs_dev.h.
 *
 * Every entry ENQUEUES one kernel of kernels/zs_gpt_ops.h on stream `s` and
 * returns: the work runs later, in stream order, and the arguments keep
 * their meaning from zs_gpt_ops.h exactly (shapes, layouts, which gradients
 * accumulate (+=) and which are written (=), which may alias). Tensor
 * pointers are fp32 (int32 for token ids) DEVICE pointers of the stream's
 * device; they must stay valid until the work has run. Scalars are copied
 * at enqueue time. The return value reports errors of the call itself (bad
 * stream, argument block too large); errors while the kernel runs are the
 * stream's sticky error (zs_dev_stream_sync).
 *
 * Implementations:
 *   cpu   zs_gpt_ops_cpu.c: packs the arguments into a struct and enqueues a
 *         host function (zs_dev_host_fn) that calls the zs_op_* function
 *         with the model's zs_pool_t, on the stream's thread. Same kernels,
 *         same results as calling them directly, bitwise.
 *   cuda  zs_gpt_ops_cuda.c (built with ZS_WITH_CUDA): the
 *         kernels/cuda/zs_cuda_gpt.h launchers on the cudaStream_t behind
 *         `s`, GEMMs through cuBLASLt (fp32, no TF32). Matches the CPU
 *         kernels within the tolerances of tests/test_cuda_ops.c (per op)
 *         and tests/test_gpt_cuda.c (the whole model); deterministic.
 *
 * Not here: choosing a table for a device (zs_gpt.c's bind does that),
 * memory allocation, synchronisation.
 */
#ifndef ZS_GPT_OPS_TABLE_H
#define ZS_GPT_OPS_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "zs_dev.h"
#include "zs_mixed.h"
#include "zs_pool.h"
#include "zs_status.h"

typedef struct zs_gpt_ops zs_gpt_ops_t;

struct zs_gpt_ops {
    const char *name; /* the device kind it runs on: "cpu", "cuda" */
    void *ctx;        /* first argument of every entry (cpu: the zs_pool_t) */
    /* Frees the table and its context (not what the context points to
     * unless the constructor says so). Queued work must have run. */
    void (*destroy)(zs_gpt_ops_t *ops);

    /* Mixed precision (kernels/zs_mixed.h): from now on the GEMM-based
     * entries (gemm, matmul_*, attention_*) round their GEMM operands to
     * mx->dt into mx->scratch, device memory of mx->cap elements of
     * mixed_elem_bytes each (the caller's; it must outlive the work queued
     * with it, and only one stream may use a table with scratch). mx NULL or
     * dt ZS_DTYPE_F32: plain fp32 again. Work already queued keeps the
     * setting it was queued with. An op whose need (zs_mixed_*_elems)
     * exceeds cap fails with ZS_ERR_RANGE (cuda: at enqueue; cpu: as the
     * stream's sticky error). */
    int (*set_mixed)(void *ctx, const zs_mixed_t *mx, zs_err_t *err);
    size_t mixed_elem_bytes; /* cpu: 4 (fp32 values), cuda: 2 (bf16 / fp16) */
    /* For the next GEMM-based entry, GELU or LayerNorm forward only
     * (gemm, matmul_*, attention_*, gelu_*, layernorm_fwd,
     * residual_layernorm_fwd), whatever it
     * returns: n (<= ZS_MIXED_TWINS_MAX) fp32 operands whose
     * 16-bit twins the caller holds (zs_mixed.h: exactly the rounded values,
     * in the set_mixed dtype, valid in stream order when the op runs); the
     * op reads a twin instead of rounding that operand (GELU: instead of
     * the fp32 input; a fill twin of the output of GELU, the LayerNorm or
     * matmul_fwd is written instead of the output, which is then its
     * scratch; matmul_fwd writes it in its GEMM where the bias has a twin;
     * gelu_bwd takes a copy twin of dinp, fill 2, and writes both).
     * The results are bitwise the same, except that a GPU's GEMM with a
     * 16-bit output may sum in another order (zs_cuda_gpt.h). Ignored under
     * fp32 GEMMs. NULL where a device has
     * none (cpu: its rounded copies are fp32 values anyway). */
    int (*set_twins)(void *ctx, const zs_mixed_twin_t *tw, int n, zs_err_t *err);

    /* C[M, N] = alpha op(A) op(B) + beta C (zs_op_gemm) */
    int (*gemm)(void *ctx, zs_stream_t *s, int ta, int tb, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                zs_err_t *err);
    int (*embed_fwd)(void *ctx, zs_stream_t *s, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C, zs_err_t *err);
    int (*embed_bwd)(void *ctx, zs_stream_t *s, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C, zs_err_t *err);
    int (*layernorm_fwd)(void *ctx, zs_stream_t *s, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int N, int C,
                         zs_err_t *err);
    int (*layernorm_bwd)(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                         const float *dout, const float *inp, const float *w, const float *mean,
                         const float *rstd, int N, int C, zs_err_t *err);
    int (*matmul_fwd)(void *ctx, zs_stream_t *s, float *out, const float *inp, const float *w,
                      const float *bias, int N, int IC, int OC, zs_err_t *err);
    int (*matmul_bwd)(void *ctx, zs_stream_t *s, float *dinp, float *dw, float *db,
                      const float *dout, const float *inp, const float *w, int N, int IC, int OC,
                      zs_err_t *err);
    int (*attention_fwd)(void *ctx, zs_stream_t *s, float *out, float *att, const float *qkv, int B,
                         int T, int C, int NH, zs_err_t *err);
    int (*attention_bwd)(void *ctx, zs_stream_t *s, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, int B, int T, int C, int NH,
                         zs_err_t *err);
    /* Fused causal attention without the [B, NH, T, T] probabilities
     * (zs_op_attention_flash_*_mixed: lse [B, NH, T] kept for the backward,
     * which reads the forward's qkv, out and lse), with the table's mixed
     * setting. NULL where the device has none. The CUDA kernels need bf16 /
     * fp16 (set_mixed) and refuse other settings and head sizes outside
     * flash_hs_mult / flash_hs_max with ZS_ERR_INVALID. */
    int (*attention_flash_fwd)(void *ctx, zs_stream_t *s, float *out, float *lse, const float *qkv,
                               int B, int T, int C, int NH, zs_err_t *err);
    int (*attention_flash_bwd)(void *ctx, zs_stream_t *s, float *dqkv, const float *dout,
                               const float *qkv, const float *out, const float *lse, int B, int T,
                               int C, int NH, zs_err_t *err);
    int flash_hs_mult, flash_hs_max; /* head sizes the flash entries take (cpu: 1, INT_MAX) */
    int flash_needs_mixed;           /* 1: the flash entries need bf16 / fp16 (cuda) */
    int (*gelu_fwd)(void *ctx, zs_stream_t *s, float *out, const float *inp, size_t n,
                    zs_err_t *err);
    int (*gelu_bwd)(void *ctx, zs_stream_t *s, float *dinp, const float *inp, const float *dout,
                    size_t n, zs_err_t *err);
    int (*residual_fwd)(void *ctx, zs_stream_t *s, float *out, const float *a, const float *b,
                        size_t n, zs_err_t *err);
    int (*residual_bwd)(void *ctx, zs_stream_t *s, float *da, float *db, const float *dout,
                        size_t n, zs_err_t *err);
    /* residual_fwd then layernorm_fwd of its output, fused: res = a + b,
     * out = LayerNorm(res) [N, C] (zs_op_residual_layernorm_fwd_dt); with
     * rdt bf16 / fp16, res is rounded where it is stored (res16 [N, C]
     * 16-bit, res its widened value, as zs_dev_round leaves them) before
     * the LayerNorm reads it; rdt fp32: res16 unused. Bitwise the entries
     * (and the round) one after the other. Takes a fill twin of out, as
     * layernorm_fwd does. NULL where a device has none. */
    int (*residual_layernorm_fwd)(void *ctx, zs_stream_t *s, float *res, void *res16, int rdt,
                                  float *out, float *mean, float *rstd, const float *a,
                                  const float *b, const float *w, const float *bias, int N, int C,
                                  zs_err_t *err);
    /* logits / dlogits [N, V] with rows ld >= V floats apart */
    int (*xent_fwd)(void *ctx, zs_stream_t *s, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int N, int V, int ld, zs_err_t *err);
    int (*xent_bwd)(void *ctx, zs_stream_t *s, float *dlogits, const float *logits,
                    const float *lse, const int32_t *targets, int N, int V, int ld, float scale,
                    zs_err_t *err);
};

/* The CPU table: every entry enqueues a host function on `s` (a stream of
 * the CPU device) that runs the zs_op_* kernel on `pool`. The pool is not
 * owned and must outlive the work queued with it (replace the table, not the
 * pool, to change threads). *out freed with zs_gpt_ops_destroy. */
int zs_gpt_ops_cpu_create(zs_pool_t *pool, zs_gpt_ops_t **out, zs_err_t *err);

/* The CUDA table (ZS_WITH_CUDA builds only): every entry launches the
 * zs_cuda_gpt.h kernel on the cudaStream_t of `s`, a stream of `dev` (a
 * CUDA device, zs_dev_cuda_create). The context owns a cuBLASLt handle and
 * its 32 MiB workspace (zs_dev_alloc, device space, ZS_MEM_SCRATCH), which
 * the first stream running a GEMM-based op (gemm, matmul, attention) keeps
 * for the table's life: such ops on another stream are refused
 * (ZS_ERR_INVALID). ZS_ERR_INVALID for a device that is not CUDA; cuBLASLt
 * and CUDA failures as zs_cuda_gpt.h reports them. dev must outlive the
 * table. *out freed with zs_gpt_ops_destroy once its queued work has run. */
int zs_gpt_ops_cuda_create(zs_dev_t *dev, zs_gpt_ops_t **out, zs_err_t *err);

/* NULL is a no-op. */
static inline void zs_gpt_ops_destroy(zs_gpt_ops_t *ops)
{
    if (ops)
        ops->destroy(ops);
}

#endif
