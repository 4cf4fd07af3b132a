/*
 * zs_mixed.h - mixed-precision GEMMs of the GPT: what is rounded, where, and
 * how much scratch it takes. Shared by the CPU kernels (zs_gpt_ops.c), the
 * CUDA kernels (cuda/zs_cuda_gpt.cu, cuda/zs_cuda_attn.cu) and the model
 * (worker/model/zs_gpt.c sizes the scratch with the functions below), so
 * the three agree by construction.
 *
 * The rule ("bf16 / fp16 in, fp32 compute"): with a compute dtype dt of
 * ZS_DTYPE_BF16 or ZS_DTYPE_F16, every GEMM of the model reads its two
 * operands rounded to dt (round to nearest even, zs_math.h), multiplies and
 * accumulates in fp32, and writes fp32. Everything else (LayerNorm, softmax,
 * GELU, residuals, the loss, bias gradients) stays fp32 and reads the fp32
 * tensors. Rounding points, op by op:
 *   gemm          A and B
 *   matmul fwd    inp, w
 *   matmul bwd    dout, w, inp (the bias gradient sums the fp32 dout)
 *   attention fwd qkv (scores = q k^T, out = att v), the probabilities att
 *                 for att v (the fp32 att is what is kept for backward)
 *   attention bwd dout, qkv, att (D = dout v^T, dv = att^T dout); the
 *                 softmax backward on the fp32 att and D, then D rounded
 *                 (dq = D k, dk = D^T q)
 *   flash fwd     qkv; per key tile of ZS_FLASH_BK keys the unnormalised
 *                 probabilities exp(s - m) (m the running row max) for p v
 *   flash bwd     qkv, dout (D = rowsum(dout * out) reads the fp32 ones),
 *                 p = exp(s - lse) for dv = p^T dout, dS = p (dp - D) scale
 *                 for dq = dS k and dk = dS^T q
 * A product of two bf16 (8-bit significand) or fp16 (11-bit) numbers is exact
 * in fp32, so a GPU tensor-core GEMM and the CPU's sgemm of the rounded
 * operands differ only by the order of the fp32 additions.
 *
 * Storage of the rounded copies: the CPU keeps them as fp32 values (so
 * OpenBLAS's sgemm reads them: 4 bytes an element), CUDA as 16-bit (what
 * cuBLASLt reads: 2 bytes). zs_mixed_t.scratch holds them, carved op by op
 * in the order listed above, each piece a multiple of ZS_MIXED_ALIGN
 * elements long (256-byte aligned pieces for cuBLASLt).
 *
 * Not here: the rounding itself (zs_math_f32_to_bf16 / _f16), loss scaling
 * (the engine's, for fp16), 16-bit activations (activations stay fp32).
 */
#ifndef ZS_MIXED_H
#define ZS_MIXED_H

#include <stddef.h>

#include "zs_dtype.h"

/* Piece granularity in elements (256 bytes of 16-bit elements). */
#define ZS_MIXED_ALIGN 128

/* A GEMM operand its caller already holds rounded: the first n elements
 * of the fp32 tensor f32 are exactly h16 (16-bit, of the op's dt) widened,
 * as the GPT's 16-bit activations are (zs_dev_round). An op may then read
 * h16 where it would round f32 into its scratch: the same values, with no
 * cast and no pass over f32. Matched by pointer (f32 == the operand's
 * pointer) and length (the operand's n <= this n). The CPU kernels ignore
 * twins (their rounded copies are fp32 values anyway). An operand held only
 * in 16 bits (the GPT's zero-padded vocabulary) is a twin keyed by the h16
 * copy's own address, with no fp32 tensor behind it: a caller gives such a
 * twin only to a table that takes twins, whose ops never read f32. */
typedef struct zs_mixed_twin {
    const float *f32;
    const void *h16;
    size_t n;
    int fill; /* 1: the op computes f32 itself (the attention probabilities,
               * GELU's, the LayerNorm's and a matmul's outputs) and rounds it into h16,
               * a buffer the caller lets it write, instead of into its
               * scratch: the caller's stored 16-bit copy without a pass of
               * its own. h16 is then the result and f32 the op's scratch,
               * unspecified afterwards (the attention leaves its scores
               * there; GELU and the LayerNorm do not write it). Taken only
               * by tables that take twins. 2 (GELU's backward only): the
               * op writes f32 as usual and h16 = f32 rounded as well, a
               * twin for the op after it. 0: h16 already holds f32
               * rounded. */
} zs_mixed_twin_t;

#define ZS_MIXED_TWINS_MAX 4 /* a matmul forward: input, weight, bias, output's fill */

/* How an op rounds its GEMM operands. dt = ZS_DTYPE_F32 (or a NULL
 * zs_mixed_t pointer) means no rounding: the plain fp32 kernels. */
typedef struct zs_mixed {
    int dt;        /* ZS_DTYPE_F32, ZS_DTYPE_BF16 or ZS_DTYPE_F16 */
    void *scratch; /* the rounded copies: float (CPU) or uint16_t (CUDA) elements */
    size_t cap;    /* scratch capacity in elements */
    int ntwins;    /* operands held rounded already (zs_mixed_twin_t); 0: none */
    zs_mixed_twin_t twins[ZS_MIXED_TWINS_MAX];
} zs_mixed_t;

/* Whether m asks for rounding. */
static inline int zs_mixed_on(const zs_mixed_t *m)
{
    return m && (m->dt == ZS_DTYPE_BF16 || m->dt == ZS_DTYPE_F16);
}

/* *dst = src normalised (NULL or no rounding: dt F32, no scratch). Returns
 * 0, or -1 (dst unchanged) for rounding with a NULL scratch of non-zero cap. */
static inline int zs_mixed_set(zs_mixed_t *dst, const zs_mixed_t *src)
{
    if (!zs_mixed_on(src)) {
        dst->dt = ZS_DTYPE_F32;
        dst->scratch = NULL;
        dst->cap = 0;
        dst->ntwins = 0;
        return 0;
    }
    if (!src->scratch && src->cap)
        return -1;
    *dst = *src;
    return 0;
}

/* The twin m holds for the first n elements of the fp32 tensor f32 (matched
 * by pointer, and n within its length), or NULL; m may be NULL. */
static inline const zs_mixed_twin_t *zs_mixed_twin(const zs_mixed_t *m, const float *f32, size_t n)
{
    for (int i = 0; m && i < m->ntwins; i++)
        if (m->twins[i].f32 == f32 && n <= m->twins[i].n)
            return &m->twins[i];
    return NULL;
}

/* n rounded up to a whole piece. */
static inline size_t zs_mixed_piece(size_t n)
{
    return (n + ZS_MIXED_ALIGN - 1) / ZS_MIXED_ALIGN * ZS_MIXED_ALIGN;
}

/* Elements spanned by a row-major matrix of `rows` rows of `cols` used
 * columns with leading dimension ld (the last row needs only cols). */
static inline size_t zs_mixed_extent(size_t rows, size_t cols, size_t ld)
{
    return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

/* Scratch elements of each op (pieces in the order the op carves them). */
static inline size_t zs_mixed_gemm_elems(int ta, int tb, int M, int N, int K, int lda, int ldb)
{
    size_t a = ta ? zs_mixed_extent((size_t)K, (size_t)M, (size_t)lda)
                  : zs_mixed_extent((size_t)M, (size_t)K, (size_t)lda);
    size_t b = tb ? zs_mixed_extent((size_t)N, (size_t)K, (size_t)ldb)
                  : zs_mixed_extent((size_t)K, (size_t)N, (size_t)ldb);
    return zs_mixed_piece(a) + zs_mixed_piece(b);
}

static inline size_t zs_mixed_matmul_fwd_elems(int N, int IC, int OC)
{
    return zs_mixed_piece((size_t)N * IC) + zs_mixed_piece((size_t)IC * OC);
}

static inline size_t zs_mixed_matmul_bwd_elems(int N, int IC, int OC)
{
    return zs_mixed_piece((size_t)N * OC) + zs_mixed_piece((size_t)IC * OC) +
           zs_mixed_piece((size_t)N * IC);
}

static inline size_t zs_mixed_attention_fwd_elems(int B, int T, int C, int NH)
{
    return zs_mixed_piece((size_t)B * T * 3 * C) + zs_mixed_piece((size_t)B * NH * T * T);
}

static inline size_t zs_mixed_attention_bwd_elems(int B, int T, int C, int NH)
{
    return zs_mixed_piece((size_t)B * T * C) + zs_mixed_piece((size_t)B * T * 3 * C) +
           zs_mixed_piece((size_t)B * NH * T * T);
}

/* Keys per tile of flash attention's online softmax: the CPU twin
 * (zs_op_attention_flash_*) and the CUDA kernels (zs_cuda_flash.cu) rescale
 * and round at the same tile boundaries, so their rounded probabilities
 * agree. */
#define ZS_FLASH_BK 64

/* CPU scratch of the flash twins (the CUDA kernels round while loading their
 * tiles and need none). */
static inline size_t zs_mixed_flash_fwd_elems(int B, int T, int C)
{
    return zs_mixed_piece((size_t)B * T * 3 * C);
}

static inline size_t zs_mixed_flash_bwd_elems(int B, int T, int C)
{
    return zs_mixed_piece((size_t)B * T * C) + zs_mixed_piece((size_t)B * T * 3 * C);
}

#endif
