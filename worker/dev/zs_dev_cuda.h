/*
 * zs_dev_cuda.h - the CUDA device (zs_dev.h on one GPU): creation, the
 * "is there a GPU" probe, the CUDA error check every CUDA call in zeroshard
 * goes through, and a few internal hooks the NCCL collectives need.
 *
 * Plain C: no CUDA header is needed to include this one (CUDA handles travel
 * as void *). Built only when CMake finds nvcc (ZS_WITH_CUDA); callers that
 * must also build without CUDA test `#ifdef ZS_WITH_CUDA`.
 *
 * Not here: the vector-op kernels (kernels/cuda/zs_cuda_vec.h), the model's
 * CUDA ops, the collectives (worker/coll/zs_coll_nccl.c).
 */
#ifndef ZS_DEV_CUDA_H
#define ZS_DEV_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "zs_dev.h"
#include "zs_status.h"

/* Number of usable CUDA devices (> 0), or 0 with `why` (may be NULL; n
 * bytes) set to "no GPU: <CUDA error string> (<error name>)" when
 * cudaGetDeviceCount fails (e.g. no driver: cudaErrorInsufficientDriver), or
 * "no GPU: cudaGetDeviceCount found 0 devices". Never aborts. */
int zs_dev_cuda_available(char *why, size_t n);

/* The CUDA device `device` (0-based ordinal as CUDA numbers them after
 * CUDA_VISIBLE_DEVICES). Makes it current on the calling thread; every later
 * call sets it again on whichever thread calls. d->desc = "cuda:N <name>,
 * <total memory> GiB". Errors: ZS_ERR_UNAVAILABLE "no GPU: ..." when there
 * is none, ZS_ERR_RANGE for a bad ordinal, ZS_ERR_INTERNAL for CUDA
 * failures. Free with zs_dev_destroy (streams and events first). */
int zs_dev_cuda_create(int device, zs_dev_t **out, zs_err_t *err);

/* Device memory as the driver counts it on d's GPU (cudaMemGetInfo, all
 * processes and CUDA's own use included): *free_bytes and *total_bytes. The
 * allocator's figures (what zeroshard asked for, per category) are
 * zs_dev_mem_get's. ZS_ERR_INVALID when d is not a CUDA device. */
int zs_dev_cuda_mem_info(zs_dev_t *d, size_t *free_bytes, size_t *total_bytes, zs_err_t *err);

/* Limit d's device memory to `bytes` held (cur + cached, as zs_dev_mem_t
 * counts them; 0: no limit), to simulate a smaller GPU: a device block
 * that would take the held bytes above it makes the allocator wait for its
 * fences and trim its cache, then fails with ZS_ERR_NOMEM "out of device
 * memory ... over the device memory limit" (the CPU device's
 * zs_dev_cpu_opts_t.device_limit twin). Blocks already held are kept.
 * ZS_ERR_INVALID when d is not a CUDA device. (zs_dev_cuda_alloc.c) */
int zs_dev_cuda_set_mem_limit(zs_dev_t *d, uint64_t bytes, zs_err_t *err);

/* ---- for other CUDA code of zeroshard (not part of the device API) ----- */

/* ZS_OK when `code` (a cudaError_t) is cudaSuccess; otherwise fills err
 * with ZS_ERR_NOMEM (cudaErrorMemoryAllocation) or ZS_ERR_INTERNAL and
 * "CUDA <call> at file:line on cuda:<device>: <error string> (<name>)
 * (hint: <hint>)", clears the calling thread's last CUDA error (so a later
 * cudaGetLastError after a kernel launch does not report it again) and
 * returns that code. */
int zs__cuda_check(int code, const char *call, const char *file, int line, int device,
                   const char *hint, zs_err_t *err);

/* ZS_CUDA_CHECK(err, device, hint, cudaFn, args...): call cudaFn(args...)
 * and evaluate to ZS_OK or the zs error (see zs__cuda_check). */
#define ZS_CUDA_CHECK(err, device, hint, fn, ...)                                                  \
    zs__cuda_check((int)fn(__VA_ARGS__), #fn, __FILE__, __LINE__, (device), (hint), (err))

/* The CUDA ordinal of a CUDA device; -1 when d is NULL or not a CUDA device. */
int zs__dev_cuda_ordinal(const zs_dev_t *d);

/* The cudaStream_t of a stream of a CUDA device (NULL otherwise). */
void *zs__dev_cuda_stream_handle(zs_stream_t *s);

/* Mark s as watched: zs_dev_stream_sync on it polls the stream instead of
 * blocking in cudaStreamSynchronize, so zs__dev_cuda_stream_abort can end
 * the wait. Used for the NCCL stream. Call before feeding the stream. */
void zs__dev_cuda_stream_watch(zs_stream_t *s);

/* From any thread (the NCCL watchdog): record `e` as the stream's permanent
 * error. A zs_dev_stream_sync in progress or later returns it at once
 * without waiting for the stream to drain; work enqueued later is skipped.
 * The stream can only be destroyed afterwards (destroy still waits for the
 * queued work, which an NCCL abort ends). */
void zs__dev_cuda_stream_abort(zs_stream_t *s, const zs_err_t *e);

#endif
