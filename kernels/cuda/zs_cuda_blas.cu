/*
 * zs_cuda_blas.cu - fp32 GEMMs through cuBLASLt for the CUDA GPT ops (see
 * zs_cuda_gpt.h): the context, the row-major zs_cuda_gemm, and the strided
 * batched form the attention uses (zs__cuda_gemm_batched, internal).
 *
 * Row-major to cuBLASLt's column-major: a row-major C[M, N] is a
 * column-major C^T[N, M] with the same leading dimension, and
 * C^T = op(B)^T op(A)^T, so the call swaps A and B and M and N and keeps the
 * transpose flags.
 *
 * Numerics: CUBLAS_COMPUTE_32F_PEDANTIC, fp32 in and out, so no TF32 and no
 * reduced-precision internals; if the heuristic has no pedantic algorithm
 * for a shape, CUBLAS_COMPUTE_32F (which in cuBLASLt also never uses TF32:
 * that needs CUBLAS_COMPUTE_32F_FAST_TF32) and the fallback is counted.
 * Determinism: the algorithm is the heuristic's first choice for the shape,
 * alignment and workspace, and cuBLAS's routines give the same bits on every
 * run on the same GPU architecture, SM count and toolkit. Alignment
 * preferences are computed from the actual pointers and batch strides, so an
 * algorithm that needs more alignment than a head slice has is never chosen;
 * the flip side is that the choice (and so the bits) may change when the same
 * GEMM runs on buffers of a different alignment (up to 256 bytes), e.g. a
 * re-carved arena. Repeats on the same buffers are bitwise equal.
 *
 * Mixed precision (zs_mixed.h): A and B may be bf16 or fp16 (C stays fp32,
 * compute CUBLAS_COMPUTE_32F, fp32 scale): the tensor-core path. Pedantic is
 * not asked for there (it would exclude the tensor cores); products of 16-bit
 * operands are exact in fp32 and the accumulation is fp32.
 *
 * Epilogues: only CUBLASLT_EPILOGUE_BIAS (zs__cuda_gemm_bias: the bias
 * added per output column in the GEMM instead of a fill kernel and beta = 1),
 * and only where cuBLASLt offers an algorithm for it; the caller falls back
 * otherwise.
 *
 * 16-bit outputs (zs__cuda_gemm_bias with ddt bf16 / fp16, 16-bit operands of
 * the same type only): the cuBLASLt "Datatypes Supported" rows with A/B and
 * C/D 16BF (or 16F) and CUBLAS_COMPUTE_32F: fp32 accumulation, the sum
 * (bias added in the epilogue) rounded once into D. The bias is then of D's
 * type (BIAS_DATA_TYPE left at its default, "the type of elements of the
 * output matrix"). cuBLAS does not promise the same algorithm, so not the
 * same bits, as the fp32-output GEMM followed by a cast: the emulator sums
 * in one order, so there they are bitwise equal.
 *
 * What it does not do: cache heuristics (one query per call), the GELU and
 * gradient epilogues.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <string.h>

#include "zs_cuda_blas.cuh"
#include "zs_cuda_gpt.h"
#include "zs_cuda_util.cuh"

/* A zs error for a failed cuBLASLt call. */
static int lt_fail(zs_err_t *err, cublasStatus_t s, const char *what, const char *file, int line)
{
    int code = s == CUBLAS_STATUS_NOT_INITIALIZED ? ZS_ERR_UNAVAILABLE
               : s == CUBLAS_STATUS_ALLOC_FAILED  ? ZS_ERR_NOMEM
               : s == CUBLAS_STATUS_INVALID_VALUE ? ZS_ERR_INVALID
               : s == CUBLAS_STATUS_NOT_SUPPORTED ? ZS_ERR_UNIMPLEMENTED
                                                  : ZS_ERR_INTERNAL;
    const char *hint = s == CUBLAS_STATUS_NOT_INITIALIZED
                           ? "no usable GPU or CUDA context (check nvidia-smi and the driver)"
                       : s == CUBLAS_STATUS_INVALID_VALUE ? "bad GEMM shape, leading dimension "
                                                            "or alignment"
                                                          : "see the cuBLAS status";
    return zs_err_set(err, code, "%s (%s:%d): cuBLASLt %s: %s; %s", what, file, line,
                      cublasLtGetStatusName(s), cublasLtGetStatusString(s), hint);
}

#define LT_TRY(call, what)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            rc = lt_fail(err, s_, (what), __FILE__, __LINE__);                                     \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_blas_init(zs_cuda_blas_t *b, void *workspace, size_t workspace_bytes,
                                 zs_err_t *err)
{
    int rc = ZS_OK;
    cublasLtHandle_t h = NULL;
    if (!b || (workspace_bytes && !workspace))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_blas_init: NULL context or workspace");
    memset(b, 0, sizeof *b);
    LT_TRY(cublasLtCreate(&h), "zs_cuda_blas_init: cublasLtCreate");
    b->lt = h;
    b->workspace = workspace;
    b->workspace_bytes = workspace_bytes;
out:
    return rc;
}

/* See zs_cuda_gpt.h. */
extern "C" void zs_cuda_blas_deinit(zs_cuda_blas_t *b)
{
    if (b && b->lt) {
        cublasLtDestroy((cublasLtHandle_t)b->lt);
        b->lt = NULL;
    }
}

/* Largest power of two (<= 256) dividing the address and the batch stride
 * (of elements of `esize` bytes). */
static uint32_t align_of(const void *p, long long stride_elems, int batch, size_t esize)
{
    uintptr_t a = (uintptr_t)p | 256u;
    if (batch > 1)
        a |= (uintptr_t)(stride_elems * (long long)esize);
    return (uint32_t)(a & (~a + 1));
}

/* cuBLAS's type of a zs dtype for A and B. */
static cudaDataType_t ab_type(int dt)
{
    return dt == ZS_DTYPE_BF16 ? CUDA_R_16BF : dt == ZS_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* One column-major matmul, D = C = alpha op(A) op(B) + beta C, strided
 * batched when batch > 1; C of ddt (fp32, or abdt when that is 16-bit);
 * with bias (m values of ddt, batch 1 only) the BIAS epilogue adds bias[i]
 * to row i of D. Returns a zs status; ZS_ERR_UNIMPLEMENTED when cuBLASLt
 * has no algorithm for it. */
static int lt_matmul(cudaStream_t cs, zs_cuda_blas_t *blas, int abdt, int transa, int transb, int m,
                     int n, int k, float alpha, const void *A, int lda, long long sA, const void *B,
                     int ldb, long long sB, float beta, void *C, int ddt, int ldc, long long sC,
                     int batch, const void *bias, zs_err_t *err)
{
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    int rc = ZS_OK;
    cublasLtHandle_t lt = (cublasLtHandle_t)blas->lt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0, pedantic;
    cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t ws = blas->workspace_bytes;
    cudaDataType_t abt = ab_type(abdt), dt = ab_type(ddt);
    size_t abs_ = abt == CUDA_R_32F ? 4 : 2, dsz = dt == CUDA_R_32F ? 4 : 2;
    uint32_t al_a = align_of(A, sA, batch, abs_), al_b = align_of(B, sB, batch, abs_),
             al_c = align_of(C, sC, batch, dsz);

    LT_TRY(cublasLtMatrixLayoutCreate(&la, abt, transa ? k : m, transa ? m : k, lda),
           "cublasLtMatrixLayoutCreate(A)");
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, abt, transb ? n : k, transb ? k : n, ldb),
           "cublasLtMatrixLayoutCreate(B)");
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, dt, m, n, ldc), "cublasLtMatrixLayoutCreate(C)");
    if (batch > 1) {
        cublasLtMatrixLayout_t ls[3] = {la, lb, lc};
        long long st[3] = {sA, sB, sC};
        for (int i = 0; i < 3; i++) {
            LT_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &batch, sizeof batch),
                   "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
            int64_t s = st[i];
            LT_TRY(cublasLtMatrixLayoutSetAttribute(
                       ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s),
                   "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
        }
    }
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws),
           "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &al_a, sizeof al_a),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &al_b, sizeof al_b),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &al_c, sizeof al_c),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &al_c, sizeof al_c),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D)");

    /* fp32: pedantic first; any refusal of it (descriptor, attribute,
     * heuristic) falls back to plain fp32; only the plain attempt's failure is
     * an error. 16-bit operands: plain CUBLAS_COMPUTE_32F only. */
    for (pedantic = abt == CUDA_R_32F; pedantic >= 0; pedantic--) {
        cublasComputeType_t ct = pedantic ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
        cublasStatus_t s = cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        if (s == CUBLAS_STATUS_SUCCESS && bias)
            s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (s == CUBLAS_STATUS_SUCCESS && bias)
            s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof bias);
        nres = 0;
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &nres);
        if (s == CUBLAS_STATUS_SUCCESS && nres > 0)
            break;
        if (op)
            cublasLtMatmulDescDestroy(op);
        op = NULL;
        if (pedantic)
            continue;
        if (bias) /* no epilogue algorithm: the caller adds the bias itself */
            rc = zs_err_set(err, ZS_ERR_UNIMPLEMENTED,
                            "cuBLASLt has no bias-epilogue algorithm for m=%d n=%d k=%d (%s)", m, n,
                            k, s == CUBLAS_STATUS_SUCCESS ? "none found" : "refused");
        else if (s != CUBLAS_STATUS_SUCCESS)
            rc = lt_fail(err, s, "cuBLASLt matmul descriptor / heuristic", __FILE__, __LINE__);
        else
            rc = zs_err_set(err, ZS_ERR_UNIMPLEMENTED,
                            "cuBLASLt has no %s-in %s-out algorithm for m=%d n=%d k=%d ta=%d "
                            "tb=%d batch=%d lda=%d ldb=%d ldc=%d align %u/%u/%u workspace %llu",
                            zs_dtype_name(abdt), zs_dtype_name(ddt), m, n, k, transa, transb, batch,
                            lda, ldb, ldc, al_a, al_b, al_c, (unsigned long long)ws);
        goto out;
    }
    LT_TRY(cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo,
                          blas->workspace, blas->workspace_bytes, cs),
           "cublasLtMatmul");
    blas->gemms++;
    zs__cuda_count_gemm();
    if (!pedantic && abt == CUDA_R_32F)
        blas->non_pedantic++;
    if (bias)
        blas->bias_epilogues++;
    if (dt != CUDA_R_32F)
        blas->out16++;
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (op)
        cublasLtMatmulDescDestroy(op);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    return rc;
}

/* See zs_cuda_blas.cuh: row-major, strided batched. */
int zs__cuda_gemm_batched(cudaStream_t cs, zs_cuda_blas_t *blas, int abdt, int ta, int tb, int M,
                          int N, int K, float alpha, const void *A, int lda, long long sA,
                          const void *B, int ldb, long long sB, float beta, float *C, int ldc,
                          long long sC, int batch, zs_err_t *err)
{
    if (!blas || !blas->lt)
        return zs_err_set(err, ZS_ERR_STATE, "zs_cuda_gemm: context not initialised");
    if (abdt != ZS_DTYPE_F32 && abdt != ZS_DTYPE_BF16 && abdt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_gemm: operand dtype %d", abdt);
    if (M < 0 || N < 0 || K < 0 || batch < 1)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_gemm: M=%d N=%d K=%d batch=%d", M, N, K,
                          batch);
    if (M == 0 || N == 0)
        return ZS_OK;
    if (!A || !B || !C)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_gemm: NULL matrix");
    if (ldc < N || lda < (ta ? M : K) || ldb < (tb ? K : N))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_cuda_gemm: leading dimensions lda=%d ldb=%d ldc=%d too small for "
                          "M=%d N=%d K=%d ta=%d tb=%d",
                          lda, ldb, ldc, M, N, K, ta, tb);
    /* C^T[N, M] = op(B)^T[N, K] op(A)^T[K, M], column-major. */
    return lt_matmul(cs, blas, abdt, tb, ta, N, M, K, alpha, B, ldb, sB, A, lda, sA, beta, C,
                     ZS_DTYPE_F32, ldc, sC, batch, NULL, err);
}

/* See zs_cuda_blas.cuh. */
int zs__cuda_gemm_bias(cudaStream_t cs, zs_cuda_blas_t *blas, int abdt, int M, int N, int K,
                       const void *A, int lda, const void *B, int ldb, const void *bias, void *C,
                       int ddt, int ldc, zs_err_t *err)
{
    if (!blas || !blas->lt)
        return zs_err_set(err, ZS_ERR_STATE, "zs_cuda_gemm: context not initialised");
    if (M <= 0 || N <= 0 || K <= 0 || !A || !B || !C || ldc < N || lda < K || ldb < N)
        return zs_err_set(err, ZS_ERR_INVALID, "zs__cuda_gemm_bias: M=%d N=%d K=%d", M, N, K);
    if (ddt != ZS_DTYPE_F32 && (ddt != abdt || abdt == ZS_DTYPE_F32))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs__cuda_gemm_bias: %s output with %s operands (a 16-bit output needs "
                          "operands of its type)",
                          zs_dtype_name(ddt), zs_dtype_name(abdt));
    if (ddt == ZS_DTYPE_F32 && !bias)
        return zs_err_set(err, ZS_ERR_INVALID, "zs__cuda_gemm_bias: fp32 output without a bias");
    /* C^T[N, M] = B^T[N, K] A^T[K, M] column-major: the bias is per row of
     * C^T, i.e. per column of the row-major C */
    return lt_matmul(cs, blas, abdt, 0, 0, N, M, K, 1.0f, B, ldb, 0, A, lda, 0, 0.0f, C, ddt, ldc,
                     0, 1, bias, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gemm(void *stream, zs_cuda_blas_t *blas, int ta, int tb, int M, int N, int K,
                            float alpha, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc, zs_err_t *err)
{
    return zs__cuda_gemm_batched((cudaStream_t)stream, blas, ZS_DTYPE_F32, ta, tb, M, N, K, alpha,
                                 A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gemm_typed(void *stream, zs_cuda_blas_t *blas, int abdt, int ta, int tb,
                                  int M, int N, int K, float alpha, const void *A, int lda,
                                  const void *B, int ldb, float beta, float *C, int ldc,
                                  zs_err_t *err)
{
    return zs__cuda_gemm_batched((cudaStream_t)stream, blas, abdt, ta, tb, M, N, K, alpha, A, lda,
                                 0, B, ldb, 0, beta, C, ldc, 0, 1, err);
}
