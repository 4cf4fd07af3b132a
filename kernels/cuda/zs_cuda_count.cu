/*
 * zs_cuda_count.cu - the launch counters of zs_cuda_count.h: two process-wide
 * 64-bit counters, added to with relaxed atomics (the order of counts
 * between threads does not matter, only their sum).
 */
#include "zs_cuda_count.h"

static uint64_t g_kernels, g_gemms;

void zs__cuda_count_kernel(void)
{
    __atomic_fetch_add(&g_kernels, 1, __ATOMIC_RELAXED);
}

void zs__cuda_count_gemm(void)
{
    __atomic_fetch_add(&g_gemms, 1, __ATOMIC_RELAXED);
}

zs_cuda_counts_t zs_cuda_counts(void)
{
    zs_cuda_counts_t c;
    c.kernels = __atomic_load_n(&g_kernels, __ATOMIC_RELAXED);
    c.gemms = __atomic_load_n(&g_gemms, __ATOMIC_RELAXED);
    return c;
}
