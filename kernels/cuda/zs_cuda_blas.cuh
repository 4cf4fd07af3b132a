/*
 * zs_cuda_blas.cuh - the strided batched row-major GEMM behind the CUDA GPT
 * ops (internal; zs_cuda_blas.cu). The public zs_cuda_gemm is its
 * batch = 1 case.
 */
#ifndef ZS_CUDA_BLAS_CUH
#define ZS_CUDA_BLAS_CUH

#include <cuda_runtime.h>

#include "zs_cuda_gpt.h"

/* For i in [0, batch): C_i[M, N] = alpha op(A_i) op(B_i) + beta C_i,
 * row-major, X_i = X + i * sX (strides in elements), op as zs_cuda_gemm.
 * Returns a zs status (err filled). */
int zs__cuda_gemm_batched(cudaStream_t cs, zs_cuda_blas_t *blas, int ta, int tb, int M, int N,
                          int K, float alpha, const float *A, int lda, long long sA, const float *B,
                          int ldb, long long sB, float beta, float *C, int ldc, long long sC,
                          int batch, zs_err_t *err);

#endif
