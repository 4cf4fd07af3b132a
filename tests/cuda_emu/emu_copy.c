/*
 * emu_copy.c - cudaMemcpy, cudaMemcpyAsync, cudaMemset, cudaMemsetAsync for
 * the CUDA emulator (tests/cuda_emu/): which calls wait for the copy and
 * which return early, per the Runtime API's "API synchronization
 * behavior", in the most hostile reading.
 *
 * Does not: allocate or protect memory (emu_mem.c), 2D/3D copies, symbol
 * or array copies, peer copies between processes.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <stdlib.h>
#include <string.h>

#include "emu_core.h"

typedef struct copy_arg {
    void *dst;
    const void *src;
    size_t n;
    void *staging; /* freed after the copy */
    int value;     /* memset */
} copy_arg;

static cudaError_t do_copy(void *p)
{
    copy_arg *c = p;
    memmove(c->dst, c->src, c->n);
    return cudaSuccess;
}

static cudaError_t do_set(void *p)
{
    copy_arg *c = p;
    memset(c->dst, c->value, c->n);
    return cudaSuccess;
}

static void free_copy(void *p)
{
    copy_arg *c = p;
    free(c->staging);
    free(c);
}

static cudaError_t memcpy_common(const char *api, void *dst, const void *src, size_t n,
                                 enum cudaMemcpyKind kind, cudaStream_t s, int is_async)
{
    zs_emu_stream *st = zs_emu_stream_get(s);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    int sdev = zs_emu_stream_device(st);
    cudaError_t e = zs_emu_sticky(sdev);
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    if (n == 0)
        return cudaSuccess;
    if (!dst || !src || (unsigned)kind > cudaMemcpyDefault)
        return zs_emu_ret(kind > cudaMemcpyDefault ? cudaErrorInvalidMemcpyDirection
                                                   : cudaErrorInvalidValue);
    int ddev, srcdev;
    int dk = zs_emu_classify(dst, n, &ddev), sk = zs_emu_classify(src, n, &srcdev);
    if (dk == ZS_EMU_P_BAD || sk == ZS_EMU_P_BAD)
        return zs_emu_ret(cudaErrorInvalidValue);
    int d_dev = dk == ZS_EMU_P_DEVICE, s_dev = sk == ZS_EMU_P_DEVICE;
    /* cudaMemcpy: "Calling cudaMemcpy() with dst and src pointers that do
     * not match the direction of the copy results in an undefined
     * behavior." Undefined behaviour never passes silently here. */
    if (kind != cudaMemcpyDefault) {
        int want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        int want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        if (want_s != s_dev || want_d != d_dev)
            zs_emu_fatal(api,
                         "copy of %zu bytes from %p (%s) to %p (%s) with kind %d: the "
                         "pointers do not match the direction (undefined behaviour)",
                         n, src, s_dev ? "device" : "host", dst, d_dev ? "device" : "host",
                         (int)kind);
    }
    copy_arg *c = calloc(1, sizeof *c);
    if (!c)
        return zs_emu_ret(cudaErrorMemoryAllocation);
    c->dst = dst;
    c->src = src;
    c->n = n;
    int wait = 0;
    /* CUDA Runtime API, 2. API synchronization behavior, Memcpy. */
    if (!s_dev && !d_dev) {
        /* "For transfers from any host memory to any host memory, the
         * function is fully synchronous with respect to the host" (both
         * forms). */
        wait = 1;
    } else if (!is_async) {
        if (!s_dev && sk == ZS_EMU_P_PAGEABLE) {
            /* Pageable to device: "The function will return once the
             * pageable buffer has been copied to the staging memory for DMA
             * transfer to device memory, but the DMA to final destination
             * may not have completed." Hostile: return right after staging. */
            c->staging = malloc(n);
            if (!c->staging) {
                free(c);
                return zs_emu_ret(cudaErrorMemoryAllocation);
            }
            memcpy(c->staging, src, n);
            c->src = c->staging;
        } else if (!s_dev) {
            /* "For transfers from pinned host memory to device memory, the
             * function is synchronous with respect to the host." */
            wait = 1;
        } else if (!d_dev) {
            /* "For transfers from device to either pageable or pinned host
             * memory, the function returns only once the copy has
             * completed." */
            wait = 1;
        } else {
            /* "For transfers from device memory to device memory, no
             * host-side synchronization is performed." */
            wait = 0;
        }
    } else {
        /* Async forms: "For transfers between device memory and pageable
         * host memory, the function might be synchronous with respect to
         * host." Hostile reading: it is not: the pageable buffer is read or
         * written when the stream reaches the copy, so a caller that
         * reuses it early sees the damage. All other transfers: "fully
         * asynchronous". */
        wait = 0;
    }
    int extra = s_dev && srcdev != sdev ? srcdev : d_dev && ddev != sdev ? ddev : -1;
    uint64_t seq = zs_emu_stream_push(st, ZS_EMU_WORK_DEVICE, extra, do_copy, c, free_copy);
    if (!seq)
        return zs_emu_ret(zs_emu_sticky(sdev));
    if (wait)
        zs_emu_stream_wait(st, seq);
    return wait ? zs_emu_ret(zs_emu_sticky(sdev)) : cudaSuccess;
}

/* cudaMemcpy is issued on the legacy default stream (CUDA Runtime API, 3.
 * Stream synchronization behavior: synchronous calls use the default
 * stream), so it is ordered after the device's blocking streams. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    zs_emu_api_enter("cudaMemcpy");
    return memcpy_common("cudaMemcpy", dst, src, count, kind, NULL, 0);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    zs_emu_api_enter("cudaMemcpyAsync");
    return memcpy_common("cudaMemcpyAsync", dst, src, count, kind, stream, 1);
}

/* CUDA Runtime API, 2. API synchronization behavior, Memset: "The
 * cudaMemset functions are asynchronous with respect to the host except
 * when the target memory is pinned host memory." So cudaMemset on device
 * memory returns before the memory is set (hostile reading of a sync
 * name). Pageable host memory is not a valid target. */
static cudaError_t memset_common(void *p, int value, size_t n, cudaStream_t s)
{
    zs_emu_stream *st = zs_emu_stream_get(s);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    int sdev = zs_emu_stream_device(st);
    cudaError_t e = zs_emu_sticky(sdev);
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    if (n == 0)
        return cudaSuccess;
    int dev;
    int k = zs_emu_classify(p, n, &dev);
    if (k != ZS_EMU_P_DEVICE && k != ZS_EMU_P_PINNED)
        return zs_emu_ret(cudaErrorInvalidValue);
    copy_arg *c = calloc(1, sizeof *c);
    if (!c)
        return zs_emu_ret(cudaErrorMemoryAllocation);
    c->dst = p;
    c->n = n;
    c->value = value;
    uint64_t seq =
        zs_emu_stream_push(st, ZS_EMU_WORK_DEVICE, k == ZS_EMU_P_DEVICE && dev != sdev ? dev : -1,
                           do_set, c, free_copy);
    if (!seq)
        return zs_emu_ret(zs_emu_sticky(sdev));
    if (k == ZS_EMU_P_PINNED)
        zs_emu_stream_wait(st, seq);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    zs_emu_api_enter("cudaMemset");
    return memset_common(devPtr, value, count, NULL);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    zs_emu_api_enter("cudaMemsetAsync");
    return memset_common(devPtr, value, count, stream);
}
