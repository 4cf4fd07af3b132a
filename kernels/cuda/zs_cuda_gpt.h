/*
 * zs_cuda_gpt.h - the layer kernels of the reference GPT on CUDA: the twins
 * of kernels/zs_gpt_ops.h, op for op, with the same arguments in the same
 * order, plus `void *stream` (a cudaStream_t; NULL = legacy default stream)
 * first, a zs_cuda_blas_t context after it for the ops that run GEMMs, and
 * `zs_err_t *err` last. fp32; the GEMM-based ops also have mixed-precision
 * forms (bf16 / fp16 GEMM operands, fp32 accumulation: *_mixed, below).
 *
 * Shapes, layouts and gradient conventions are exactly zs_gpt_ops.h's:
 * activations [N, C] row-major with N = B*T; weights [in, out]; qkv
 * [B, T, 3C]; att [B, NH, T, T]; PARAMETER gradients accumulate (+=),
 * ACTIVATION gradients are written (=) unless the function says otherwise.
 * All data pointers are device memory of the current device (cudaSetDevice),
 * which must be the stream's.
 *
 * Numerics: element formulas are kernels/zs_math.h's (the CPU kernels call
 * the same functions). GEMMs are cuBLASLt in fp32 with
 * CUBLAS_COMPUTE_32F_PEDANTIC (no TF32 or other reduced precision; plain
 * CUBLAS_COMPUTE_32F, which also excludes TF32 in cuBLASLt, only if no
 * pedantic algorithm exists for a shape, counted in zs_cuda_blas_t).
 * Row reductions (LayerNorm statistics, softmax sums) use fixed warp / block
 * trees, column reductions (dweight, dbias) a fixed two-pass split, and the
 * token-embedding backward sorts positions by token (a stable radix sort)
 * and adds each token's rows in position order: no atomics anywhere, so
 * every op gives the same bits on every run on the same GPU model. Against
 * the CPU: the embedding ops, GELU, residual and the cross-entropy gradient
 * are bitwise equal to the CPU's up to the exp implementation (expf on the
 * GPU and in glibc are each ~1 ulp, not identical); the column reductions are
 * bitwise equal when N <= ZS_CUDA_COLSUM_ROWS; the rest agree to fp32
 * rounding of a different summation order.
 *
 * Temporary memory: embed_bwd, layernorm_bwd, matmul_bwd (with db) and
 * bias_bwd take a small stream-ordered temporary (cudaMallocAsync /
 * cudaFreeAsync from the device's default memory pool): 12 bytes per token
 * plus the radix sort's scratch, or 8 bytes per column per
 * ZS_CUDA_COLSUM_ROWS rows.
 *
 * Each launcher checks its arguments, enqueues on the stream, checks the
 * launch and returns ZS_OK or a negative zs status with err filled (kernel
 * name, file:line, the CUDA or cuBLAS error and a hint). Errors raised while
 * kernels run show at the next synchronisation.
 */
#ifndef ZS_CUDA_GPT_H
#define ZS_CUDA_GPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "zs_mixed.h"
#include "zs_status.h"

/* Rows per chunk of the two-pass column reductions (dweight, dbias). */
#define ZS_CUDA_COLSUM_ROWS 128

/* cuBLASLt context for the GEMM ops. Embedded by the caller; one per stream
 * that runs GEMMs concurrently (the workspace is shared by its calls). */
typedef struct zs_cuda_blas {
    void *lt;                  /* cublasLtHandle_t, made by zs_cuda_blas_init */
    void *workspace;           /* device memory the caller owns (may be NULL) */
    size_t workspace_bytes;    /* its size; 32 MiB is plenty for these shapes */
    long long gemms;           /* GEMMs enqueued */
    long long non_pedantic;    /* of which ran with CUBLAS_COMPUTE_32F (no pedantic algorithm) */
    long long bias_epilogues;  /* of which added a bias in cuBLASLt's BIAS epilogue */
    long long bias_fallbacks;  /* matmuls whose bias epilogue had no algorithm (fill kernel) */
    long long out16;           /* GEMMs that wrote a 16-bit output (a fill twin's home) */
    long long out16_fallbacks; /* fill twins written by an fp32 GEMM and a cast instead */
} zs_cuda_blas_t;

/* Create the cuBLASLt handle; workspace (device memory, may be NULL with
 * bytes 0) stays the caller's and must outlive the context. Fails with
 * ZS_ERR_UNAVAILABLE and cuBLAS's reason when there is no usable GPU. */
int zs_cuda_blas_init(zs_cuda_blas_t *b, void *workspace, size_t workspace_bytes, zs_err_t *err);

/* Destroy the handle (not the workspace). Safe on a zeroed struct. */
void zs_cuda_blas_deinit(zs_cuda_blas_t *b);

/* C[M, N] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when
 * ta / tb is non-zero (A is [K, M] / B is [N, K] then): zs_op_gemm's
 * contract. beta == 0 does not read C. */
int zs_cuda_gemm(void *stream, zs_cuda_blas_t *blas, int ta, int tb, int M, int N, int K,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                 float *C, int ldc, zs_err_t *err);

/* zs_cuda_gemm with A and B already of dtype abdt (ZS_DTYPE_F32, BF16 or
 * F16; C fp32): 16-bit operands run on the tensor cores with fp32
 * accumulation (CUBLAS_COMPUTE_32F). For callers that hold 16-bit data
 * (benchmarks); the model's ops round fp32 tensors through *_mixed. */
int zs_cuda_gemm_typed(void *stream, zs_cuda_blas_t *blas, int abdt, int ta, int tb, int M, int N,
                       int K, float alpha, const void *A, int lda, const void *B, int ldb,
                       float beta, float *C, int ldc, zs_err_t *err);

/* out[b, t, :] = wte[tok[b, t], :] + wpe[t, :]; tok [B*T] each in [0, V)
 * (not checked: an out-of-range token reads out of bounds, as on CPU). */
int zs_cuda_embed_fwd(void *stream, float *out, const int32_t *tok, const float *wte,
                      const float *wpe, int B, int T, int C, zs_err_t *err);

/* dwte[tok[b, t], :] += dout[b, t, :] and dwpe[t, :] += sum over b, each
 * element's additions in position order (bitwise the CPU's). */
int zs_cuda_embed_bwd(void *stream, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                      int B, int T, int C, zs_err_t *err);

/* out = (inp - mean) * rstd * w + b per row of C; mean, rstd [N] kept. */
int zs_cuda_layernorm_fwd(void *stream, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C, zs_err_t *err);

/* The same with out of dtype odt: fp32, or a 16-bit copy (the GPT's stored
 * activation), each element rounded to nearest even from what the fp32
 * form writes (bitwise; mean and rstd as the fp32 form's). */
int zs_cuda_layernorm_fwd_dt(void *stream, void *out, int odt, float *mean, float *rstd,
                             const float *inp, const float *w, const float *b, int N, int C,
                             zs_err_t *err);

/* res = a + b, out = LayerNorm(res) (w, bias; mean, rstd [N] kept), one
 * launch: bitwise zs_cuda_residual_fwd then zs_cuda_layernorm_fwd. res
 * must not overlap a, b or out. CPU twin: zs_op_residual_layernorm_fwd. */
int zs_cuda_residual_layernorm_fwd(void *stream, float *res, float *out, float *mean, float *rstd,
                                   const float *a, const float *b, const float *w,
                                   const float *bias, int N, int C, zs_err_t *err);

/* The same with the residual rounded where it is stored (the GPT's 16-bit
 * activations): rdt bf16 / fp16 rounds a + b to nearest even into res16
 * and leaves that value widened in res, which the LayerNorm reads; rdt
 * fp32: as above, res16 unused. out of dtype odt: fp32, or rdt's 16-bit
 * type (rounded from what the fp32 form writes). Bitwise
 * zs_cuda_residual_fwd, zs_cuda_round and zs_cuda_layernorm_fwd_dt. CPU
 * twin: zs_op_residual_layernorm_fwd_dt. */
int zs_cuda_residual_layernorm_fwd_dt(void *stream, float *res, void *res16, int rdt, void *out,
                                      int odt, float *mean, float *rstd, const float *a,
                                      const float *b, const float *w, const float *bias, int N,
                                      int C, zs_err_t *err);

/* dinp ACCUMULATES (+=); dw, db +=. */
int zs_cuda_layernorm_bwd(void *stream, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C, zs_err_t *err);

/* out[N, OC] = inp[N, IC] w[IC, OC] + bias (bias may be NULL). */
int zs_cuda_matmul_fwd(void *stream, zs_cuda_blas_t *blas, float *out, const float *inp,
                       const float *w, const float *bias, int N, int IC, int OC, zs_err_t *err);

/* dinp = dout w^T (skipped when dinp is NULL); dw += inp^T dout; db +=
 * column sums of dout (skipped when db is NULL). */
int zs_cuda_matmul_bwd(void *stream, zs_cuda_blas_t *blas, float *dinp, float *dw, float *db,
                       const float *dout, const float *inp, const float *w, int N, int IC, int OC,
                       zs_err_t *err);

/* Causal self-attention: out [B, T, C] from qkv [B, T, 3C]; att
 * [B, NH, T, T] receives the probabilities (zeros past the diagonal). */
int zs_cuda_attention_fwd(void *stream, zs_cuda_blas_t *blas, float *out, float *att,
                          const float *qkv, int B, int T, int C, int NH, zs_err_t *err);

/* dqkv [B, T, 3C] = gradient of the input (written); scratch
 * [B, NH, T, T]. */
int zs_cuda_attention_bwd(void *stream, zs_cuda_blas_t *blas, float *dqkv, float *scratch,
                          const float *dout, const float *qkv, const float *att, int B, int T,
                          int C, int NH, zs_err_t *err);

/* out = gelu(inp), n elements (tanh approximation); out may equal inp. */
int zs_cuda_gelu_fwd(void *stream, float *out, const float *inp, size_t n, zs_err_t *err);

/* dinp = gelu'(inp) * dout; dinp may equal dout. */
int zs_cuda_gelu_bwd(void *stream, float *dinp, const float *inp, const float *dout, size_t n,
                     zs_err_t *err);

/* The same with inp of dtype idt and (forward) out of dtype odt: fp32, or
 * the 16-bit copies of the GPT's stored activations (zs_mixed_twin_t),
 * read widened and written rounded to nearest even; so the results are
 * bitwise those of the fp32 forms on the widened input, rounded after.
 * The forward takes fp32 with fp32 or one 16-bit dtype on either side or
 * both (a 16-bit out must not overlap inp unless both are that dtype). */
int zs_cuda_gelu_fwd_dt(void *stream, void *out, int odt, const void *inp, int idt, size_t n,
                        zs_err_t *err);
int zs_cuda_gelu_bwd_dt(void *stream, float *dinp, const void *inp, int idt, const float *dout,
                        size_t n, zs_err_t *err);
/* zs_cuda_gelu_bwd_dt that also writes each dinp element rounded to cdt
 * (bf16 / fp16, nearest even) into dcopy, which must not overlap the
 * others: the rounded copy a GEMM of the backward reads next, with no cast
 * pass of its own. idt fp32 or cdt. dcopy NULL: zs_cuda_gelu_bwd_dt. */
int zs_cuda_gelu_bwd_copy(void *stream, float *dinp, void *dcopy, int cdt, const void *inp, int idt,
                          const float *dout, size_t n, zs_err_t *err);

/* out = a + b (out may alias a or b). */
int zs_cuda_residual_fwd(void *stream, float *out, const float *a, const float *b, size_t n,
                         zs_err_t *err);

/* da += dout; db += dout (da and db distinct). */
int zs_cuda_residual_bwd(void *stream, float *da, float *db, const float *dout, size_t n,
                         zs_err_t *err);

/* Per row n of logits [N, V], rows ld >= V floats apart (the padding is
 * not read; a padded ld, e.g. a multiple of 64, keeps the head's GEMMs on
 * aligned rows): lse[n] = log sum exp(logits[n, :]), losses[n] = lse[n] -
 * logits[n, targets[n]]. A target outside [0, V) gives a NaN loss (the CPU
 * would read out of bounds). */
int zs_cuda_xent_fwd(void *stream, float *losses, float *lse, const float *logits,
                     const int32_t *targets, int N, int V, int ld, zs_err_t *err);

/* dlogits = scale * (softmax(logits) - onehot(targets)), both with rows ld
 * floats apart (padding neither read nor written); dlogits may equal
 * logits. */
int zs_cuda_xent_bwd(void *stream, float *dlogits, const float *logits, const float *lse,
                     const int32_t *targets, int N, int V, int ld, float scale, zs_err_t *err);
/* The same into dlogits of dtype odt: fp32 as above, or a bf16 / fp16
 * copy (each element rounded to nearest even from what the fp32 form
 * writes) that must not overlap logits and whose padding columns [V, ld)
 * are written as zeros: the whole operand of the head's padded GEMMs. */
int zs_cuda_xent_bwd_dt(void *stream, void *dlogits, int odt, const float *logits, const float *lse,
                        const int32_t *targets, int N, int V, int ld, float scale, zs_err_t *err);

/* Both in one pass over the logits (the fused classifier): losses, lse as
 * zs_cuda_xent_fwd, then dlogits as zs_cuda_xent_bwd with that lse.
 * dlogits may equal logits. Same bits as the two calls. */
int zs_cuda_xent_fused(void *stream, float *losses, float *lse, float *dlogits, const float *logits,
                       const int32_t *targets, int N, int V, int ld, float scale, zs_err_t *err);

/* db[OC] += column sums of dout [N, OC] (the bias gradient; deterministic
 * two-pass reduction, bitwise the CPU's when N <= ZS_CUDA_COLSUM_ROWS). */
int zs_cuda_bias_bwd(void *stream, float *db, const float *dout, int N, int OC, zs_err_t *err);

/* ---- mixed precision (zs_mixed.h) ----
 * The GEMM-based ops with their GEMM operands rounded to mx->dt (bf16 or
 * fp16, nearest even, zs_cuda_cast) into mx->scratch, which holds mx->cap
 * 16-bit elements of device memory, and cuBLASLt on the 16-bit copies with
 * fp32 accumulation and fp32 outputs (tensor cores). Rounding points and
 * scratch carving are zs_mixed.h's; the CPU twins are zs_op_*_mixed
 * (zs_gpt_ops.h). mx NULL or dt ZS_DTYPE_F32: the plain op. A scratch
 * smaller than the op's zs_mixed_*_elems: ZS_ERR_RANGE, nothing enqueued.
 * The scratch is reused by the next mixed op on the stream: one stream per
 * scratch. */
int zs_cuda_gemm_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx, int ta, int tb,
                       int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc, zs_err_t *err);
/* With a fill twin of out in mx (zs_mixed_twin_t.fill) the twin's home
 * receives out rounded to mx->dt and out is not written: one GEMM with a
 * 16-bit output (blas->out16) where the bias is NULL or has a twin (its
 * exact 16-bit copy, the bias then in D's type); otherwise the fp32 GEMM
 * into out and a cast (blas->out16_fallbacks). The emulator gives the two
 * the same bits; a GPU may round a different fp32 sum (cuBLASLt may pick
 * another algorithm for another output type). */
int zs_cuda_matmul_fwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx, float *out,
                             const float *inp, const float *w, const float *bias, int N, int IC,
                             int OC, zs_err_t *err);
/* The bias gradient sums the fp32 dout. */
int zs_cuda_matmul_bwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx, float *dinp,
                             float *dw, float *db, const float *dout, const float *inp,
                             const float *w, int N, int IC, int OC, zs_err_t *err);
/* att receives the fp32 probabilities; with a fill twin of att in mx
 * (zs_mixed_twin_t.fill) the twin's home receives them rounded and att only
 * the scores (scratch). */
int zs_cuda_attention_fwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx,
                                float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH, zs_err_t *err);
int zs_cuda_attention_bwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx,
                                float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH, zs_err_t *err);

/* ---- fused (flash) attention (zs_cuda_flash.cu) ----
 * The twins of zs_op_attention_flash_*_mixed: causal self-attention that
 * never materialises the [B, NH, T, T] probabilities, on tensor cores
 * (nvcuda::wmma, m16n16k16) with every product's operands rounded to mx->dt
 * (bf16 / fp16, zs_mixed.h's "flash" rounding points; mx->scratch is not
 * used) and fp32 softmax statistics and sums. Refused with ZS_ERR_INVALID
 * (nothing enqueued; the caller keeps the unfused ops): mx NULL or fp32,
 * a head size hs = C / NH that is not a multiple of 16 up to 128, a buffer
 * not 16-byte aligned. Deterministic: no atomics, every element summed by
 * one block in a fixed order (bitwise repeats on the same GPU model).
 * Against the CPU twin: fp32 rounding of other summation orders, and the
 * 16-bit roundings of p and dS where those fp32 values differ by an ulp
 * across a rounding tie. */

/* out [B, T, C] and lse [B, NH, T] (natural log-sum-exp of each query row's
 * scaled, masked scores) written (=) from qkv [B, T, 3C]. Shared memory:
 * about 31 KiB + 640 * hs bytes per block of 128 threads (71 KiB at hs 64). */
int zs_cuda_attention_flash_fwd(void *stream, const zs_mixed_t *mx, float *out, float *lse,
                                const float *qkv, int B, int T, int C, int NH, zs_err_t *err);

/* dqkv [B, T, 3C] written (=) from dout [B, T, C] and the forward's qkv,
 * out and lse. A stream-ordered temporary of B * NH * T floats (D). */
int zs_cuda_attention_flash_bwd(void *stream, const zs_mixed_t *mx, float *dqkv, const float *dout,
                                const float *qkv, const float *out, const float *lse, int B, int T,
                                int C, int NH, zs_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
