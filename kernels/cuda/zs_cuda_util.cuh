/*
 * zs_cuda_util.cuh - helpers shared by the .cu files of kernels/cuda
 * (internal, CUDA C++ only): CUDA error -> zs status with an actionable
 * message, launch-shape helpers, warp reductions.
 *
 * What it does not do: allocate, synchronise, or own any state.
 */
#ifndef ZS_CUDA_UTIL_CUH
#define ZS_CUDA_UTIL_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "zs_dtype.h"
#include "zs_status.h"
}
#include "zs_cuda_count.h"

/* Threads per block of the element-wise kernels, and the most blocks one
 * grid-stride launch uses (any count gives the same bits: each element is
 * computed by exactly one thread with the same formula). */
#define ZS_CUDA_EW_THREADS    256
#define ZS_CUDA_EW_MAX_BLOCKS 32768

/* A zs status for a CUDA error: out of memory, no usable device, bad
 * argument, or INTERNAL for the rest. */
static inline int zs__cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return ZS_ERR_NOMEM;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
        return ZS_ERR_UNAVAILABLE;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
        return ZS_ERR_INVALID;
    default:
        return ZS_ERR_INTERNAL;
    }
}

/* What a person can do about a CUDA error. */
static inline const char *zs__cuda_hint(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "out of device memory: lower the micro-batch or offload more";
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
        return "no usable GPU: check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
        return "this build has no code for this GPU (built for sm_80 and sm_90)";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
        return "a kernel faulted (sticky: the process must restart); run compute-sanitizer";
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
        return "a bad argument or launch shape: check sizes and pointers";
    default:
        return "see the CUDA error above";
    }
}

/* Fill err for a failed CUDA call `what` at file:line and clear the
 * thread's last CUDA error; returns the status. */
static inline int zs__cuda_fail(zs_err_t *err, cudaError_t e, const char *what, const char *file,
                                int line)
{
    /* the failed call also left e as the thread's last error; reported here,
     * so it must not fail the next launch check (sticky errors persist anyway) */
    (void)cudaGetLastError();
    return zs_err_set(err, zs__cuda_status(e), "%s (%s:%d): CUDA error %s: %s; %s", what, file,
                      line, cudaGetErrorName(e), cudaGetErrorString(e), zs__cuda_hint(e));
}

/* Return from the calling launcher (which has a zs_err_t *err) on error. */
#define ZS_CUDA_TRY(call, what)                                                                    \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return zs__cuda_fail(err, e_, (what), __FILE__, __LINE__);                             \
    } while (0)

/* The one way our code launches a kernel: counted (zs_cuda_count.h), then
 * ZS_CUDA_LAUNCH_KERNEL, which nvcc expands to the usual chevrons,
 * kernel<<<grid, block, shmem, stream>>>(args...). The CUDA emulator
 * (tests/cuda_emu/emu_shim.h, force-included before this file when the .cu
 * files are compiled as host C++) defines ZS_CUDA_LAUNCH_KERNEL first, as a
 * call that runs the grid on its emulated stream (and its own uncounted
 * ZS_CUDA_LAUNCH for its tests, replaced here). `kernel` is a __global__
 * function or a pointer to one (a template instance with commas in its
 * arguments goes through a pointer: see the dispatch in zs_cuda_vec.cu).
 * A statement, not an expression. */
#ifdef ZS_CUDA_LAUNCH_KERNEL
#undef ZS_CUDA_LAUNCH
#else
#define ZS_CUDA_LAUNCH_KERNEL(kernel, grid, block, shmem, stream, ...)                             \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#endif
#define ZS_CUDA_LAUNCH(kernel, grid, block, shmem, stream, ...)                                    \
    do {                                                                                           \
        zs__cuda_count_kernel();                                                                   \
        ZS_CUDA_LAUNCH_KERNEL(kernel, grid, block, shmem, stream, __VA_ARGS__);                    \
    } while (0)

/* After a ZS_CUDA_LAUNCH: the launch error, if any, named after the kernel. */
#define ZS_CUDA_LAUNCHED(kernel) ZS_CUDA_TRY(cudaGetLastError(), "launch of " kernel)

/* Blocks for a grid-stride loop over n elements. */
static inline unsigned zs__cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < ZS_CUDA_EW_MAX_BLOCKS ? (b ? b : 1) : ZS_CUDA_EW_MAX_BLOCKS);
}

static inline int zs__cuda_dtype_ok(int dt)
{
    return dt == ZS_DTYPE_F32 || dt == ZS_DTYPE_BF16 || dt == ZS_DTYPE_F16;
}

/* Grid-stride loop header: i over [0, n). */
#define ZS_CUDA_FOR(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* Warp-wide sum / max in a fixed butterfly order (deterministic: every lane
 * ends with the same value, the same bits on every run). */
static __device__ __forceinline__ float zs__warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = __fadd_rn(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
    return x;
}

static __device__ __forceinline__ float zs__warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
    return x;
}

#endif
