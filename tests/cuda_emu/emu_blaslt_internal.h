/*
 * emu_blaslt_internal.h - what the emulated cuBLASLt's files share: the
 * layouts of its handle and descriptors (kept inside NVIDIA's semi-opaque
 * structs, so cublasLt*Init on caller memory works as well as *Create), the
 * validated problem, and the fp16/bf16/tf32 conversions.
 *
 * Does not: declare any public API (cublasLt.h does that), or run work (that
 * is emu_blaslt_matmul.c through emu_internal.h's zs_emu_enqueue).
 */
#ifndef ZS_EMU_BLASLT_INTERNAL_H
#define ZS_EMU_BLASLT_INTERNAL_H

#include <cuda_runtime.h>
#include <cublasLt.h>
#include <stdint.h>
#include <string.h>

/* Magic numbers in the first word of every descriptor: a descriptor that was
 * never Created/Init'ed (stack garbage, zeroed memory, destroyed) is refused
 * with CUBLAS_STATUS_INVALID_VALUE instead of being read as a problem. */
#define ZS_EMU_LT_LAYOUT_MAGIC 0x4c61796f75744c74u /* "LayoutLt" */
#define ZS_EMU_LT_DESC_MAGIC   0x4d6d446573634c74u /* "MmDescLt" */
#define ZS_EMU_LT_PREF_MAGIC   0x507265664c744c74u /* "PrefLtLt" */
#define ZS_EMU_LT_ALGO_MAGIC   0x416c676f456d7521u /* "AlgoEmu!" */

/* cublasLtMatrixLayoutOpaque_t holds 64 bytes: this must fit. */
typedef struct {
    uint64_t magic;
    uint32_t type; /* cudaDataType */
    int32_t order; /* cublasLtOrder_t */
    uint64_t rows, cols;
    int64_t ld;
    int64_t stride; /* STRIDED_BATCH_OFFSET, elements */
    int32_t batch;  /* BATCH_COUNT */
    uint32_t batch_mode;
    int64_t plane_offset;
} zs_emu_lt_layout;

/* cublasLtMatmulDescOpaque_t holds 256 bytes. */
typedef struct {
    uint64_t magic;
    int32_t compute; /* cublasComputeType_t */
    int32_t scale;   /* cudaDataType */
    int32_t pointer_mode;
    int32_t transa, transb, transc;
    int32_t fill_mode;
    uint32_t epilogue;
    int32_t sm_count_target;
    int8_t fast_accum;
    uint64_t other_set; /* bit per attribute we accept but do not honour */
    /* epilogue attributes (cublasLt.h, cublasLtMatmulDescAttributes_t) */
    const void *bias;    /* BIAS_POINTER (bias input or bias gradient output) */
    int64_t bias_stride; /* BIAS_BATCH_STRIDE, elements, default 0 */
    void *aux;           /* EPILOGUE_AUX_POINTER */
    int64_t aux_ld;      /* EPILOGUE_AUX_LD, elements, default 0 */
    int64_t aux_stride;  /* EPILOGUE_AUX_BATCH_STRIDE, elements, default 0 */
    int32_t bias_type;   /* BIAS_DATA_TYPE, default -1 (= D's type) */
    int32_t aux_type;    /* EPILOGUE_AUX_DATA_TYPE, default -1 (= D's type) */
} zs_emu_lt_desc;

/* cublasLtMatmulPreferenceOpaque_t holds 64 bytes. */
typedef struct {
    uint64_t magic;
    uint64_t max_workspace;
    uint32_t search_mode;
    uint32_t reduction_mask;
    uint32_t align[4]; /* A, B, C, D minimum alignment, bytes */
    float max_waves;
    uint32_t pad;
    uint64_t impl_mask;
} zs_emu_lt_pref;

/* cublasLtMatmulAlgo_t holds 64 bytes: what an algorithm was chosen for. */
typedef struct {
    uint64_t magic;
    uint64_t problem;   /* hash of types, ops and shapes it was chosen for */
    uint64_t workspace; /* bytes it needs */
    uint32_t align[4];  /* A, B, C, D pointer alignment it assumes, bytes */
    uint64_t serial;
    uint32_t align_bias, align_aux; /* epilogue pointers' alignment it assumes */
} zs_emu_lt_algo;

_Static_assert(sizeof(zs_emu_lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
_Static_assert(sizeof(zs_emu_lt_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "desc fits");
_Static_assert(sizeof(zs_emu_lt_pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "pref fits");
_Static_assert(sizeof(zs_emu_lt_algo) <= sizeof(cublasLtMatmulAlgo_t), "algo fits");

/* The handle: cublasLtHandle_t is a pointer to an incomplete struct, which
 * the library owns (cublasLt.h: "Opaque structure holding CUBLASLT context"). */
struct cublasLtContext {
    uint64_t magic;
    int device; /* cuBLAS docs, cublasLtCreate(): "tied to the current CUDA device" */
};

/* One GEMM as the descriptors define it, after validation. */
typedef struct {
    int compute;
    int transa, transb;  /* CUBLAS_OP_N or CUBLAS_OP_T (OP_C is T for real types) */
    uint32_t ta, tb, tc; /* A/B type, C = D type */
    int64_t m, n, k;
    int64_t lda, ldb, ldc, ldd;
    int64_t sa, sb, sc, sd; /* batch strides, elements */
    int64_t batch;
    /* footprint of each matrix in elements over all batches (0 if empty) */
    int64_t ea, eb, ec, ed;
    /* epilogue (emu_blaslt_matmul.c, epilogue section) */
    uint32_t epilogue; /* cublasLtEpilogue_t */
    int ep_bias;       /* adds the bias vector (BIAS, GELU_BIAS, GELU_AUX_BIAS) */
    int ep_gelu;       /* applies GELU */
    int ep_aux_out;    /* writes the GELU input to aux (GELU_AUX, GELU_AUX_BIAS) */
    int ep_dgelu;      /* multiplies by GELU'(aux) (DGELU, DGELU_BGRAD) */
    int ep_bgrad;      /* writes a bias gradient: 0, 'D' (DGELU_BGRAD), 'A', 'B' */
    const void *bias;
    void *aux;
    uint32_t tbias, taux; /* bias and aux element types */
    int64_t bias_len, bias_stride, aux_ld, aux_stride;
    int64_t ebias, eaux; /* footprints in elements (0 if unused or empty) */
} zs_emu_lt_problem;

/* Shared validation (emu_blaslt_matmul.c): fills p or returns the status
 * the docs give for the first thing wrong. Cdesc NULL means Ddesc. */
cublasStatus_t zs_emu_lt_check(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                               cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                               zs_emu_lt_problem *p);

/* Nonzero if h is a live handle (emu_blaslt.c keeps a registry so a garbage
 * pointer is never dereferenced). */
int zs_emu_lt_handle_live(cublasLtHandle_t h);

static inline size_t zs_emu_lt_type_size(uint32_t t)
{
    switch (t) {
    case CUDA_R_32F:
        return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
        return 2;
    default:
        return 0;
    }
}

/* ---- exact 16-bit <-> fp32 conversions (IEEE binary16, bfloat16) ---- */

static inline float zs_emu_bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t zs_emu_f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* binary16 -> fp32: every half is exactly representable in fp32. */
static inline float zs_emu_h2f(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
        float v = (float)m * 5.9604644775390625e-8f;
        return s ? -v : v;
    }
    if (e == 31)
        return zs_emu_bits_f(s | 0x7f800000u | (m << 13));
    return zs_emu_bits_f(s | ((e + 112u) << 23) | (m << 13));
}

/* fp32 -> binary16, round to nearest even (CUDA's __float2half_rn);
 * overflow gives inf, NaN stays NaN (quiet). */
static inline uint16_t zs_emu_f2h(float f)
{
    uint32_t x = zs_emu_f_bits(f), sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    uint16_t o;
    if (x >= 0x47800000u) { /* >= 65536, inf or NaN */
        o = x > 0x7f800000u ? 0x7e00 : 0x7c00;
    } else if (x < 0x38800000u) { /* below 2^-14: subnormal or 0 */
        /* adding 0.5 (2^-1) leaves the value's 2^-24 multiples in the low
         * mantissa bits, rounded to nearest even by the fp32 add */
        float t = zs_emu_bits_f(x) + 0.5f;
        o = (uint16_t)(zs_emu_f_bits(t) - 0x3f000000u);
    } else {
        uint32_t odd = (x >> 13) & 1u;
        x += 0xc8000fffu + odd; /* rebias exponent (-112 << 23), round */
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | sign);
}

static inline float zs_emu_bf2f(uint16_t b)
{
    return zs_emu_bits_f((uint32_t)b << 16);
}

/* fp32 -> bfloat16, round to nearest even (CUDA's __float2bfloat16_rn). */
static inline uint16_t zs_emu_f2bf(float f)
{
    uint32_t x = zs_emu_f_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* fp32 -> TF32 (10 explicit mantissa bits), round to nearest with ties away
 * from zero as PTX cvt.rna.tf32.f32 does; the value stays an fp32. */
static inline float zs_emu_tf32(float f)
{
    uint32_t x = zs_emu_f_bits(f);
    if ((x & 0x7f800000u) == 0x7f800000u)
        return f; /* inf, NaN unchanged */
    x = (x + 0x1000u) & 0xffffe000u;
    return zs_emu_bits_f(x);
}

#endif
