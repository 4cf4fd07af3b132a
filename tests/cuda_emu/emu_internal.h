/*
 * emu_internal.h - the contract between the parts of the CUDA emulator
 * (tests/cuda_emu/): the runtime (streams, memory, kernels) and the
 * libraries built on it (cuBLASLt, CUB, NCCL). Not a public API: only
 * emulator sources include it.
 *
 * What the runtime guarantees to the libraries:
 *  - zs_emu_enqueue runs fn(arg) on stream s in stream order (after all
 *    work enqueued on s before it, after the events s waits on), on one of
 *    the emulator's executor threads, never on the caller's thread. While fn
 *    runs, the device memory of the stream's device is accessible (the
 *    protected build maps it without access when no work of that device
 *    runs). fn may block (an NCCL collective waits for its peers); it must
 *    not call the CUDA runtime. When fn returns an error other than
 *    cudaSuccess, the runtime records it as a sticky error of the context
 *    of that device (every later call of that device returns it), as an
 *    illegal address or launch failure on a GPU would be. free_arg (may be
 *    NULL) is called with arg once fn has run, or at once when the enqueue
 *    fails.
 *  - s follows CUDA's rules: NULL or cudaStreamLegacy is the legacy default
 *    stream of the current device, cudaStreamPerThread the per-thread one.
 *  - zs_emu_dev_ptr tells whether [p, p + bytes) lies inside one live
 *    device allocation and of which device; libraries use it to validate
 *    pointers the way a GPU would fault on them.
 */
#ifndef ZS_EMU_INTERNAL_H
#define ZS_EMU_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef cudaError_t (*zs_emu_work_fn)(void *arg);

/* Enqueue fn(arg) on s (see above). Returns cudaSuccess, or the error the
 * runtime would return for s (invalid handle, sticky context error). Does
 * not set the thread's last error: the caller decides what its API
 * returns. */
cudaError_t zs_emu_enqueue(cudaStream_t s, zs_emu_work_fn fn, void *arg, void (*free_arg)(void *));

/* Device of [p, p + bytes) if it lies inside one live device allocation
 * (cudaMalloc / cudaMallocAsync, not yet freed), else -1. bytes 0 asks
 * about p alone. */
int zs_emu_dev_ptr(const void *p, size_t bytes);

/* The calling thread's current device (cudaSetDevice), 0 by default. */
int zs_emu_current_device(void);

/* Stop the process with an emulator diagnostic: "cuda-emu: <where>: <msg>"
 * on stderr, then abort(). For errors that are undefined behaviour on a GPU
 * (a divergent barrier, a shuffle naming an exited lane, a CUDA call from a
 * host function) and must never pass silently. */
void zs_emu_fatal(const char *where, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
