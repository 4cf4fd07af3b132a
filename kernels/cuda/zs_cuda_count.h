/*
 * zs_cuda_count.h - how much GPU work this process has enqueued: kernel
 * launches through ZS_CUDA_LAUNCH (every kernel of kernels/cuda) and
 * cuBLASLt matmuls, since the process started.
 *
 * Why: a step of small ops is bound by launches as much as by bytes (llm.c
 * fuses for that reason), and a launch count that grows with the data is a
 * bug no timing shows on a small test (one cast per distinct token once
 * cost a 124M step 14,000 launches). Counted on the host at enqueue, one
 * relaxed atomic add each, so the figures are exact on a GPU and on the CUDA
 * emulator alike; a step's count is the difference of two readings taken
 * on the thread that enqueues (or after joining the others).
 *
 * Not counted: copies, memsets, events, host functions, NCCL calls, and the
 * kernels cuBLASLt launches inside one matmul (one matmul counts once).
 */
#ifndef ZS_CUDA_COUNT_H
#define ZS_CUDA_COUNT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_cuda_counts {
    uint64_t kernels; /* ZS_CUDA_LAUNCH launches */
    uint64_t gemms;   /* cublasLtMatmul calls */
} zs_cuda_counts_t;

/* The totals so far. */
zs_cuda_counts_t zs_cuda_counts(void);

/* Internal: called by ZS_CUDA_LAUNCH and by the GEMM launcher. */
void zs__cuda_count_kernel(void);
void zs__cuda_count_gemm(void);

#ifdef __cplusplus
}
#endif

#endif
