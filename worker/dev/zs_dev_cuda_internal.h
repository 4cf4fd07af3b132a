/*
 * zs_dev_cuda_internal.h - the objects of the CUDA device, shared by its two
 * files: zs_dev_cuda.c (creation, streams, events, work) and
 * zs_dev_cuda_alloc.c (the caching allocator and the accounting). Not for
 * use outside worker/dev.
 *
 * Locks: a device's `mu` guards its allocator, its accounting and its list
 * of streams; a stream's `mu` guards that stream's error slot and its count
 * of pending host functions. Never hold a stream's `mu` across a CUDA call,
 * and never take a device's `mu` while holding a stream's.
 */
#ifndef ZS_DEV_CUDA_INTERNAL_H
#define ZS_DEV_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <cuda_runtime.h>

#include "zs_dev.h"
#include "zs_dev_cuda.h"

/* One allocation, live or cached. `bytes` is what was asked (what the
 * accounting counts as `cur`), `size` the real size of the block. */
typedef struct zs__cuda_block {
    void *p;
    size_t bytes, size;
    int space, cat;
    int registered; /* caller memory page-locked by zs_dev_host_register, not ours */
    struct zs__cuda_block *next;
} zs__cuda_block_t;

/* Device blocks freed before this fence: reusable once every event (one per
 * stream that existed when the fence was made) has completed. */
typedef struct zs__cuda_fence {
    cudaEvent_t *ev;
    int nev;
    zs__cuda_block_t *blocks;
    struct zs__cuda_fence *next;
} zs__cuda_fence_t;

typedef struct zs__cuda_stream {
    zs_stream_t base; /* first: zs_stream_t * points here */
    cudaStream_t h;
    char name[32];
    int watched; /* sync polls (NCCL stream) */
    pthread_mutex_t mu;
    int failed; /* sticky error slot (zs_dev.h): first error, until a sync */
    zs_err_t err;
    int pending;                  /* host functions enqueued that have not run yet */
    atomic_int aborted;           /* set once by zs__dev_cuda_stream_abort */
    zs_err_t abort_err;           /* written before `aborted` is set */
    struct zs__cuda_stream *next; /* device's list (under the device's mu) */
} zs__cuda_stream_t;

typedef struct zs__cuda_dev {
    zs_dev_t base; /* first: zs_dev_t * points here */
    int device;
    int prio_low, prio_high; /* cudaDeviceGetStreamPriorityRange */
    pthread_mutex_t mu;
    /* allocator (zs_dev_cuda_alloc.c) */
    zs__cuda_block_t **live; /* hash by pointer, chained */
    size_t nbuckets, nlive;
    zs__cuda_block_t *cache;      /* device blocks ready for reuse */
    zs__cuda_block_t *quarantine; /* device blocks freed since the last fence */
    zs__cuda_fence_t *fences, *fences_tail;
    cudaEvent_t *evpool; /* spare events for fences */
    int nevpool, capevpool;
    zs_dev_mem_t mem;
    uint64_t limit; /* zs_dev_cuda_set_mem_limit: held device bytes allowed (0: none) */
    /* streams */
    zs__cuda_stream_t *streams;
    int nstreams;
    int warned_bad_free;
} zs__cuda_dev_t;

/* zs_dev_cuda_alloc.c: the vtable's memory entries. */
int zs__cuda_alloc(zs_dev_t *d, int space, int cat, size_t bytes, void **out, zs_err_t *err);
void zs__cuda_free(zs_dev_t *d, void *p);
void zs__cuda_mem(zs_dev_t *d, zs_dev_mem_t *out);
void zs__cuda_mem_reset_peak(zs_dev_t *d);
int zs__cuda_host_register(zs_dev_t *d, void *p, size_t bytes, int cat, zs_err_t *err);
void zs__cuda_host_unregister(zs_dev_t *d, void *p);
/* Allocator set-up and tear-down (device creation and destroy; the latter
 * waits for the fences, then frees every block, live or cached). */
int zs__cuda_alloc_init(zs__cuda_dev_t *cd, zs_err_t *err);
void zs__cuda_alloc_deinit(zs__cuda_dev_t *cd);

#endif
