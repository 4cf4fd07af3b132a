/*
 * zs_gpt_ops.h - CPU layer kernels of the reference GPT-2-style model
 * (worker/zs_gpt.c): embedding, LayerNorm, matmul, causal multi-head
 * attention, GELU, residual, softmax cross-entropy, each forward and backward.
 *
 * These are the fp32 reference the CUDA kernels must match. Math as GPT-2 /
 * llm.c's train_gpt2.c: LayerNorm eps 1e-5 (biased variance), attention
 * scores scaled by 1/sqrt(head_dim) with a causal mask and a max-subtracted
 * softmax, GELU tanh approximation 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))),
 * cross-entropy through a max-subtracted log-sum-exp.
 *
 * Layouts (row-major): activations [N, C] with N = B*T rows; weights
 * [in, out] (y = x W + b); qkv [B, T, 3C] = (q | k | v), head h of each at
 * columns h*hs .. h*hs+hs-1 (hs = C / NH); attention probabilities
 * [B, NH, T, T] (row t holds zeros past column t).
 *
 * Gradient conventions: gradients of PARAMETERS (dw, db, dwte, dwpe)
 * accumulate (+=), as the engine's grad buffers require. Gradients of
 * ACTIVATIONS are written (=) unless the function says "accumulates".
 *
 * Threads: every function takes a zs_pool_t (NULL = run on the caller only)
 * and splits its work into tasks that never write the same element, so the
 * results do not depend on the thread count or on scheduling. GEMMs go to
 * OpenBLAS's cblas_sgemm, split by rows or columns over the pool; OpenBLAS
 * itself is set to one thread (openblas_set_num_threads(1), on the first
 * zs_op_* call) so the pool's threads are the only ones computing: OpenBLAS's
 * own threads busy-wait after each call and would steal the cores the pool
 * runs the other kernels on.
 */
#ifndef ZS_GPT_OPS_H
#define ZS_GPT_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "zs_math.h" /* ZS_LN_EPS and the element formulas shared with CUDA */
#include "zs_mixed.h"
#include "zs_pool.h"

/* Make OpenBLAS single-threaded (idempotent; every zs_op_* calls it). */
void zs_op_init(void);

/* C[M, N] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when
 * ta / tb is non-zero (A is [K, M] / B is [N, K] then). Split along the
 * larger of M and N into blocks that depend on the shape only, run on the
 * pool's threads: the result is bitwise the same for every thread count,
 * whatever OpenBLAS kernel the CPU selects (OPENBLAS_CORETYPE). Products of
 * other shapes (a chunk of the columns, say) may sum in another order. */
void zs_op_gemm(zs_pool_t *pool, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* out[b, t, :] = wte[tok[b, t], :] + wpe[t, :]; tok [B*T] each < V (not
 * checked here). */
void zs_op_embed_fwd(zs_pool_t *pool, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C);

/* dwte[tok[b, t], :] += dout[b, t, :]; dwpe[t, :] += sum over b of
 * dout[b, t, :]. Deterministic (split by columns). */
void zs_op_embed_bwd(zs_pool_t *pool, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C);

/* out = (inp - mean) * rstd * w + b per row of C; mean, rstd [N] are kept
 * for the backward. */
void zs_op_layernorm_fwd(zs_pool_t *pool, float *out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b, int N, int C);

/* The residual add and the LayerNorm after it in one pass over the rows:
 * res = a + b, out = LayerNorm(res) with w, bias (mean, rstd [N] kept), all
 * [N, C] but mean, rstd. Bitwise zs_op_residual_fwd then
 * zs_op_layernorm_fwd. res must not overlap a, b or out. */
void zs_op_residual_layernorm_fwd(zs_pool_t *pool, float *res, float *out, float *mean, float *rstd,
                                  const float *a, const float *b, const float *w, const float *bias,
                                  int N, int C);

/* The same with the residual rounded where it is stored (16-bit
 * activations): rdt ZS_DTYPE_BF16 / F16 rounds each a + b to nearest even
 * into res16 ([N, C] 16-bit) and leaves that value widened in res, which
 * the LayerNorm reads; rdt ZS_DTYPE_F32: zs_op_residual_layernorm_fwd
 * (res16 unused). Bitwise zs_op_residual_fwd, the device's round
 * (zs_dev_round) and zs_op_layernorm_fwd. */
void zs_op_residual_layernorm_fwd_dt(zs_pool_t *pool, float *res, void *res16, int rdt, float *out,
                                     float *mean, float *rstd, const float *a, const float *b,
                                     const float *w, const float *bias, int N, int C);

/* dinp ACCUMULATES (+=) the input gradient (a residual stream); dw, db +=. */
void zs_op_layernorm_bwd(zs_pool_t *pool, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, const float *mean, const float *rstd,
                         int N, int C);

/* out[N, OC] = inp[N, IC] w[IC, OC] + bias (bias may be NULL). */
void zs_op_matmul_fwd(zs_pool_t *pool, float *out, const float *inp, const float *w,
                      const float *bias, int N, int IC, int OC);

/* dinp = dout w^T (skipped when dinp is NULL); dw += inp^T dout; db += column
 * sums of dout (skipped when db is NULL). */
void zs_op_matmul_bwd(zs_pool_t *pool, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int IC, int OC);

/* db[OC] += column sums of dout [N, OC] (the bias gradient of matmul_bwd). */
void zs_op_bias_bwd(zs_pool_t *pool, float *db, const float *dout, int N, int OC);

/* Causal self-attention: out [B, T, C] from qkv [B, T, 3C]; att
 * [B, NH, T, T] receives the softmax probabilities (kept for backward). */
void zs_op_attention_fwd(zs_pool_t *pool, float *out, float *att, const float *qkv, int B, int T,
                         int C, int NH);

/* dqkv [B, T, 3C] = gradient of the input; scratch [B, NH, T, T]. */
void zs_op_attention_bwd(zs_pool_t *pool, float *dqkv, float *scratch, const float *dout,
                         const float *qkv, const float *att, int B, int T, int C, int NH);

/* Causal self-attention without the [B, NH, T, T] probabilities (the twin of
 * the fused FlashAttention-2-style CUDA kernels, zs_cuda_attention_flash_*):
 * out [B, T, C] as zs_op_attention_fwd's (up to fp32 rounding), and lse
 * [B, NH, T] the natural log-sum-exp of each query row's scaled, causally
 * masked scores (row t of head h of sequence b at (b * NH + h) * T + t).
 * Per query row, an online softmax over key tiles of ZS_FLASH_BK keys
 * (zs_mixed.h): running max m, running sum l, the output accumulator
 * rescaled by exp(m_old - m_new) per tile and divided by l at the end. Both
 * outputs are written (=). Deterministic: one (b, h) pair per task. */
void zs_op_attention_flash_fwd(zs_pool_t *pool, float *out, float *lse, const float *qkv, int B,
                               int T, int C, int NH);

/* dqkv [B, T, 3C] written (=): the gradient of the input, the probabilities
 * recomputed from qkv and lse (p = exp(scale q.k - lse)), D_t = dout_t .
 * out_t, dS = p (dout.v - D) scale; dq = dS k, dk = dS^T q, dv = p^T dout.
 * out and lse are the forward's. No scratch; deterministic (one (b, h) pair
 * per task, sums in key / query order). */
void zs_op_attention_flash_bwd(zs_pool_t *pool, float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int C, int NH);

/* out = gelu(inp), n elements (tanh approximation). out may equal inp. */
void zs_op_gelu_fwd(zs_pool_t *pool, float *out, const float *inp, size_t n);

/* dinp = gelu'(inp) * dout; dinp may equal dout. */
void zs_op_gelu_bwd(zs_pool_t *pool, float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b (n elements; out may alias a or b). */
void zs_op_residual_fwd(zs_pool_t *pool, float *out, const float *a, const float *b, size_t n);

/* da += dout; db += dout. */
void zs_op_residual_bwd(zs_pool_t *pool, float *da, float *db, const float *dout, size_t n);

/* Per row n of logits [N, V] (rows ld >= V floats apart; the ld - V
 * floats after each row are never read): lse[n] = log sum exp(logits[n, :])
 * and losses[n] = lse[n] - logits[n, targets[n]]. targets each < V. */
void zs_op_xent_fwd(zs_pool_t *pool, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int N, int V, int ld);

/* dlogits = scale * (softmax(logits) - onehot(targets)); e.g. scale =
 * dloss / N for the gradient of dloss * mean(losses). Both [N, V] with rows
 * ld floats apart (the padding is neither read nor written). dlogits may
 * equal logits. */
void zs_op_xent_bwd(zs_pool_t *pool, float *dlogits, const float *logits, const float *lse,
                    const int32_t *targets, int N, int V, int ld, float scale);

/* ---- mixed precision (zs_mixed.h; zs_gpt_mixed.c) ----
 * The GEMM-based ops with their GEMM operands rounded to mx->dt (bf16 or
 * fp16) at the points zs_mixed.h lists, fp32 everywhere else. mx NULL or
 * mx->dt ZS_DTYPE_F32: exactly the plain op (bitwise). mx->scratch holds
 * mx->cap FLOAT elements; an op needing more (zs_mixed_*_elems) computes
 * nothing and returns ZS_ERR_RANGE; otherwise ZS_OK. */

/* out[i] = in[i] rounded to dt (BF16 / F16, nearest even) and widened back;
 * any other dt copies. out may equal in. */
void zs_op_round(zs_pool_t *pool, int dt, float *out, const float *in, size_t n);

int zs_op_gemm_mixed(zs_pool_t *pool, const zs_mixed_t *mx, int ta, int tb, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                     float *C, int ldc);
int zs_op_matmul_fwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *out, const float *inp,
                           const float *w, const float *bias, int N, int IC, int OC);
/* The bias gradient sums the fp32 dout. */
int zs_op_matmul_bwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w, int N, int IC,
                           int OC);
/* att receives the fp32 probabilities (what the backward's softmax reads). */
int zs_op_attention_fwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *out, float *att,
                              const float *qkv, int B, int T, int C, int NH);
int zs_op_attention_bwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *dqkv, float *scratch,
                              const float *dout, const float *qkv, const float *att, int B, int T,
                              int C, int NH);

/* Flash attention with zs_mixed.h's rounding: qkv (and dout for the
 * products of the backward) rounded into mx->scratch (zs_mixed_flash_*_elems
 * FLOAT elements), the probabilities of each key tile rounded before p v,
 * the backward's p before p^T dout and dS before dS k / dS^T q. Softmax
 * statistics, D and the sums fp32. mx NULL / F32: the plain twins. */
int zs_op_attention_flash_fwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *out, float *lse,
                                    const float *qkv, int B, int T, int C, int NH);
int zs_op_attention_flash_bwd_mixed(zs_pool_t *pool, const zs_mixed_t *mx, float *dqkv,
                                    const float *dout, const float *qkv, const float *out,
                                    const float *lse, int B, int T, int C, int NH);

#endif
