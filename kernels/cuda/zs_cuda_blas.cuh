/*
 * zs_cuda_blas.cuh - the strided batched row-major GEMM behind the CUDA GPT
 * ops (internal; zs_cuda_blas.cu). The public zs_cuda_gemm is its
 * batch = 1 case.
 */
#ifndef ZS_CUDA_BLAS_CUH
#define ZS_CUDA_BLAS_CUH

#include <cuda_runtime.h>

#include "zs_cuda_gpt.h"
#include "zs_cuda_vec.h"

/* For i in [0, batch): C_i[M, N] = alpha op(A_i) op(B_i) + beta C_i,
 * row-major, X_i = X + i * sX (strides in elements), op as zs_cuda_gemm.
 * A and B hold elements of abdt (ZS_DTYPE_F32, BF16 or F16), C is fp32.
 * Returns a zs status (err filled). */
int zs__cuda_gemm_batched(cudaStream_t cs, zs_cuda_blas_t *blas, int abdt, int ta, int tb, int M,
                          int N, int K, float alpha, const void *A, int lda, long long sA,
                          const void *B, int ldb, long long sB, float beta, float *C, int ldc,
                          long long sC, int batch, zs_err_t *err);

/* C[M, N] = A[M, K] B[K, N] + bias[N] (row-major, no transposes, batch
 * 1), the bias added by cuBLASLt's BIAS epilogue in the GEMM. C and bias
 * hold elements of ddt: ZS_DTYPE_F32 (bias required), or abdt when that is
 * bf16 / fp16 (a 16-bit output, fp32 accumulation rounded once; bias NULL:
 * none). Returns ZS_ERR_UNIMPLEMENTED (err set) when cuBLASLt has no
 * algorithm for it: the caller then does it another way. */
int zs__cuda_gemm_bias(cudaStream_t cs, zs_cuda_blas_t *blas, int abdt, int M, int N, int K,
                       const void *A, int lda, const void *B, int ldb, const void *bias, void *C,
                       int ddt, int ldc, zs_err_t *err);

/* Element `off` of an array of elements of `es` bytes. */
static inline const void *zs__at(const void *base, long long off, size_t es)
{
    return (const char *)base + off * (long long)es;
}

/* The GEMM operands of one attention call: fp32 tensors as given, or their
 * 16-bit copies in mx->scratch (dt BF16 / F16). */
typedef struct {
    int dt;               /* operand dtype of the GEMMs */
    size_t es;            /* its size in bytes */
    uint16_t *next;       /* next free piece of the scratch */
    const zs_mixed_t *mx; /* its twins (zs_mixed_twin_t), or NULL */
} zs__opnd_t;

/* The twin (of o->dt) the caller gave for the first n elements of src,
 * or NULL. */
static inline const zs_mixed_twin_t *zs__opnd_twin_of(const zs__opnd_t *o, const float *src,
                                                      size_t n)
{
    return zs_mixed_twin(o->mx, src, n);
}

/* The 16-bit twin holding src's first n elements rounded, or NULL (a fill
 * twin is not one: it is written by the op). */
static inline const void *zs__opnd_twin(const zs__opnd_t *o, const float *src, size_t n)
{
    const zs_mixed_twin_t *t = zs__opnd_twin_of(o, src, n);
    return t && !t->fill ? t->h16 : NULL;
}

/* Where src's rounded copy goes: src's fill twin (zs_mixed_twin_t.fill),
 * else the next piece of the scratch, carved whether or not it is written
 * (so the pieces after it stay where the scratch size assumes). Used as is
 * by a kernel of the op that produces src and rounds it itself (the
 * attention's softmax). */
static inline void *zs__opnd_out(zs__opnd_t *o, const float *src, size_t n)
{
    uint16_t *p = o->next;
    o->next += zs_mixed_piece(n);
    const zs_mixed_twin_t *t = zs__opnd_twin_of(o, src, n);
    return t && t->fill ? (void *)(uintptr_t)t->h16 : (void *)p;
}

/* Round n fp32 elements of src into zs__opnd_out's place: *out; or, when
 * the caller gave src's 16-bit twin, *out = the twin and nothing runs. */
static inline int zs__opnd_round(cudaStream_t cs, zs__opnd_t *o, const float *src, size_t n,
                                 const void **out, zs_err_t *err)
{
    void *p = zs__opnd_out(o, src, n);
    if ((*out = zs__opnd_twin(o, src, n)) != NULL)
        return ZS_OK;
    *out = p;
    return zs_cuda_cast(cs, p, (zs_dtype_t)o->dt, src, ZS_DTYPE_F32, n, err);
}

/* Start carving mx's scratch for an op needing `need` elements: plain fp32
 * operands when mx asks for no rounding; ZS_ERR_RANGE (naming fn) when the
 * scratch is smaller than the need. */
static inline int zs__opnd_init(const char *fn, const zs_mixed_t *mx, size_t need, zs__opnd_t *o,
                                zs_err_t *err)
{
    o->dt = ZS_DTYPE_F32;
    o->es = sizeof(float);
    o->next = NULL;
    o->mx = mx;
    if (!zs_mixed_on(mx))
        return ZS_OK;
    if (need > mx->cap || !mx->scratch)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "%s: mixed-precision scratch of %zu elements, the op needs %zu", fn,
                          mx->cap, need);
    o->dt = mx->dt;
    o->es = 2;
    o->next = (uint16_t *)mx->scratch;
    return ZS_OK;
}

#endif
