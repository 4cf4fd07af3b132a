/*
 * zs_dev.h - the device interface: everything the engine, the model and the
 * collectives do to tensor memory goes through here.
 *
 *   memory   three spaces (device, pinned host, host); every allocation names
 *            a category and is counted (current and peak bytes per space and
 *            category); blocks an allocator keeps for reuse count as held
 *   streams  ordered queues of work; work on one stream runs in enqueue
 *            order, work on different streams runs concurrently
 *   events   a point in a stream: record, make another stream wait for it,
 *            query, synchronize (no timing)
 *   work     async copies (any direction) and memset, host functions, and the
 *            engine's vector ops (casts, accumulate, scale, sum of squares
 *            with a non-finite flag, the fused AdamW)
 *
 * Two implementations share this table: the CPU one (zs_dev_cpu.c: every
 * stream is a real thread that runs its queue in order, so a missing event
 * wait is a wrong result on CPU too) and the CUDA one (cudaStream_t,
 * cudaEvent_t with timing disabled, a caching allocator). Device pointers
 * are never dereferenced by the caller: on CPU they happen to be host
 * memory, on CUDA they are not. Pinned and host memory are host-addressable
 * in both, but only after the work writing them has been waited for.
 *
 * Errors in queued work are sticky: the stream remembers the first one,
 * skips its later work (events recorded after it still complete, carrying
 * the error), and a stream that waits on a failed event fails too. Every
 * synchronizing call returns that error (zs_dev_stream_sync,
 * zs_dev_event_sync). Enqueue calls return errors of the call itself (bad
 * arguments, out of memory).
 *
 * Thread-safety: allocation, accounting and enqueue may be called from any
 * thread; one stream should be fed by one thread at a time for a defined
 * order. Not provided: timing events, graphs, peer access.
 */
#ifndef ZS_DEV_H
#define ZS_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "zs_adam.h"
#include "zs_dtype.h"
#include "zs_status.h"

typedef enum {
    ZS_SPACE_DEVICE = 0, /* where compute runs (GPU memory; RAM on CPU) */
    ZS_SPACE_PINNED = 1, /* page-locked host memory for async copies (RAM on CPU) */
    ZS_SPACE_HOST = 2,   /* ordinary host memory */
    ZS_NSPACES = 3
} zs_space_t;

/* What an allocation is for: the rows of the memory table. */
typedef enum {
    ZS_MEM_PARAMS = 0,  /* compute-precision parameters (full or partition) */
    ZS_MEM_GRADS,       /* reduced gradients (full or partition) */
    ZS_MEM_OPTIMIZER,   /* fp32 master + Adam moments (in-process optimizer) */
    ZS_MEM_GATHERED,    /* stage 3 gathered parameters, fp32 compute copies */
    ZS_MEM_COMM,        /* communication buffers and offload staging */
    ZS_MEM_ACTIVATIONS, /* the model's saved activations */
    ZS_MEM_SCRATCH,     /* gradient accumulation scratch, the model's scratch */
    ZS_MEM_HPZ,         /* ZeRO++ hpZ: the secondary parameter partition within the node */
    ZS_MEM_NCATS
} zs_memcat_t;

/* "params", "grads", "optimizer", "gathered", "comm", "activations", "scratch" */
const char *zs_memcat_name(int cat);
/* "device", "pinned", "host" */
const char *zs_space_name(int space);

/* Bytes by space and category. `cur` is live (allocated, not freed); `peak`
 * the high-water mark of `cur` since creation or the last reset; `cached`
 * freed blocks the allocator holds for reuse (CPU: always 0); `held` =
 * sum of cur + cached, `held_peak` its high-water mark. */
typedef struct zs_dev_mem {
    uint64_t cur[ZS_NSPACES][ZS_MEM_NCATS];
    uint64_t peak[ZS_NSPACES][ZS_MEM_NCATS];
    uint64_t cached[ZS_NSPACES];
    uint64_t held[ZS_NSPACES], held_peak[ZS_NSPACES];
    uint64_t nallocs; /* allocations made so far (all spaces) */
} zs_dev_mem_t;

typedef struct zs_dev zs_dev_t;
typedef struct zs_stream zs_stream_t;
typedef struct zs_event zs_event_t;

/* A host function run in stream order: on CPU on the stream's thread, on
 * CUDA through cudaLaunchHostFunc (it must not call CUDA then). `args` is
 * the copy made at enqueue time. Return ZS_OK or an error (sticky). On
 * CUDA the host functions of different streams may run one at a time on one
 * driver thread, so a host function must never wait for another stream's
 * host function (it would deadlock there, not on the CPU device, which
 * gives each stream a thread). */
typedef int (*zs_host_fn_t)(void *args, zs_err_t *err);

#define ZS_DEV_MAX_ARGS 512 /* bytes of arguments a host function may carry */

typedef struct zs_dev_vtable {
    const char *name; /* "cpu", "cuda" */
    int (*alloc)(zs_dev_t *d, int space, int cat, size_t bytes, void **out, zs_err_t *err);
    void (*free)(zs_dev_t *d, void *p);
    void (*mem)(zs_dev_t *d, zs_dev_mem_t *out);
    void (*mem_reset_peak)(zs_dev_t *d);
    int (*stream_create)(zs_dev_t *d, int high_priority, const char *name, zs_stream_t **out,
                         zs_err_t *err);
    void (*stream_destroy)(zs_stream_t *s);
    int (*stream_sync)(zs_stream_t *s, zs_err_t *err);
    int (*event_create)(zs_dev_t *d, zs_event_t **out, zs_err_t *err);
    void (*event_destroy)(zs_event_t *e);
    int (*event_record)(zs_event_t *e, zs_stream_t *s, zs_err_t *err);
    int (*stream_wait)(zs_stream_t *s, zs_event_t *e, zs_err_t *err);
    int (*event_query)(zs_event_t *e);
    int (*event_sync)(zs_event_t *e, zs_err_t *err);
    int (*memcpy_async)(zs_stream_t *s, void *dst, const void *src, size_t bytes, zs_err_t *err);
    int (*memset_async)(zs_stream_t *s, void *dst, int byte, size_t bytes, zs_err_t *err);
    int (*host_fn)(zs_stream_t *s, zs_host_fn_t fn, const void *args, size_t argbytes,
                   zs_err_t *err);
    int (*cast)(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                size_t n, zs_err_t *err);
    int (*accumulate)(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                      size_t n, zs_err_t *err);
    int (*scale)(zs_stream_t *s, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err);
    int (*sumsq)(zs_stream_t *s, const void *x, zs_dtype_t dt, size_t n, double *acc,
                 zs_err_t *err);
    int (*adamw)(zs_stream_t *s, const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p,
                 float *m, float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t odt,
                 size_t n, zs_err_t *err);
    /* zs_dev_round, arguments already checked by zs_dev.c */
    int (*round)(zs_stream_t *s, float *x, void *h, zs_dtype_t dt, size_t n, zs_err_t *err);
    /* zs_dev_cast_rows, arguments already checked by zs_dev.c */
    int (*cast_rows)(zs_stream_t *s, float *dst, const void *src, zs_dtype_t sdt,
                     const int32_t *idx, size_t n, int32_t lo, int32_t hi, size_t width,
                     zs_err_t *err);
    void (*destroy)(zs_dev_t *d);
    /* Caller-owned host memory used as pinned (zs_dev_host_register). */
    int (*host_register)(zs_dev_t *d, void *p, size_t bytes, int cat, zs_err_t *err);
    void (*host_unregister)(zs_dev_t *d, void *p);
} zs_dev_vtable_t;

struct zs_dev {
    const zs_dev_vtable_t *vt;
    char desc[128]; /* e.g. "cpu (2 threads)", "cuda:0 NVIDIA H100 80GB HBM3" */
    /* 1 when device memory is host memory (the CPU device): the host may
     * write a device buffer directly once no queued work uses it (every
     * stream that touched it was waited for), e.g. a network transfer
     * landing in place; 0 on CUDA, where it must be copied. */
    int host_addressable;
};

/* The CPU device. `threads`: worker threads the vector ops may use (<= 0:
 * one per online CPU). Free with zs_dev_destroy. */
int zs_dev_cpu_create(int threads, zs_dev_t **out, zs_err_t *err);

/* Creation options of the CPU device (zero-initialise, then set). */
typedef struct zs_dev_cpu_opts {
    int threads; /* as zs_dev_cpu_create's (<= 0: one per online CPU) */
    /* Device memory limit in bytes (0: none): an allocation of
     * ZS_SPACE_DEVICE that would take `held[ZS_SPACE_DEVICE]` above it
     * fails with ZS_ERR_NOMEM and a message naming the limit, phrased as
     * the CUDA device's "out of device memory", so a search for what fits
     * in a GPU of that size runs the same on CPU. Pinned and host memory
     * are not limited. */
    uint64_t device_limit;
} zs_dev_cpu_opts_t;

/* The CPU device with options (zs_dev_cpu_create(t) is threads = t, no
 * limit). desc gets ", limit N bytes" when a limit is set. */
int zs_dev_cpu_create_opts(const zs_dev_cpu_opts_t *o, zs_dev_t **out, zs_err_t *err);

/* ---- memory ------------------------------------------------------------- */

/* *out = `bytes` of `space` for category `cat`, 64-byte aligned, contents
 * undefined (zero it with zs_dev_memset). bytes == 0 gives a valid unique
 * pointer. Free with zs_dev_free (NULL is a no-op). */
static inline int zs_dev_alloc(zs_dev_t *d, int space, int cat, size_t bytes, void **out,
                               zs_err_t *err)
{
    return d->vt->alloc(d, space, cat, bytes, out, err);
}

static inline void zs_dev_free(zs_dev_t *d, void *p)
{
    if (p)
        d->vt->free(d, p);
}

static inline void zs_dev_mem_get(zs_dev_t *d, zs_dev_mem_t *out)
{
    d->vt->mem(d, out);
}

/* Use `bytes` of host memory at p, which the caller allocated and keeps
 * (e.g. a shared-memory segment, common/zs_shm.h), as pinned memory: async
 * copies to and from it run as from ZS_SPACE_PINNED (CUDA: cudaHostRegister,
 * page-locking it; the CPU device has nothing to lock), and its bytes count
 * as pinned memory of category `cat` (cur, peak, held; not nallocs) until
 * zs_dev_host_unregister, so the memory figures stay the allocator's. p
 * should be page-aligned. ZS_ERR_INVALID for NULL, 0 bytes, a bad
 * category or a range overlapping one already registered; CUDA's own
 * errors (ZS_ERR_NOMEM: the page-lock limit, `ulimit -l`). */
int zs_dev_host_register(zs_dev_t *d, void *p, size_t bytes, int cat, zs_err_t *err);

/* End a registration made by zs_dev_host_register with the same p (the
 * caller has waited for the copies that use it); the memory stays the
 * caller's. An unknown p is logged and ignored. NULL is a no-op. */
void zs_dev_host_unregister(zs_dev_t *d, void *p);

/* Start the peaks again from the current figures. */
static inline void zs_dev_mem_reset_peak(zs_dev_t *d)
{
    d->vt->mem_reset_peak(d);
}

/* ---- streams and events --------------------------------------------------- */

/* A stream; high_priority for communication (CUDA priority; the CPU
 * implementation only names its thread). `name` is for logs ("compute",
 * "copy", "comm"). Destroy waits for the queued work. */
static inline int zs_dev_stream_create(zs_dev_t *d, int high_priority, const char *name,
                                       zs_stream_t **out, zs_err_t *err)
{
    return d->vt->stream_create(d, high_priority, name, out, err);
}

/* Wait until everything enqueued on s so far has run; returns the stream's
 * sticky error (and clears it, so the stream can be used again). */
int zs_dev_stream_sync(zs_stream_t *s, zs_err_t *err);
void zs_dev_stream_destroy(zs_stream_t *s);

int zs_dev_event_create(zs_dev_t *d, zs_event_t **out, zs_err_t *err);
void zs_dev_event_destroy(zs_event_t *e);

/* e completes when the work enqueued on s before this call has run.
 * Re-recording moves the event to the new point (as cudaEventRecord). */
int zs_dev_event_record(zs_event_t *e, zs_stream_t *s, zs_err_t *err);

/* Work enqueued on s after this call starts only when e's last record has
 * completed. An event never recorded is complete. */
int zs_dev_stream_wait(zs_stream_t *s, zs_event_t *e, zs_err_t *err);

/* 1 when e's last record has completed (or it was never recorded), else 0. */
int zs_dev_event_query(zs_event_t *e);

/* Block until e completes; returns the error the recording stream had. */
int zs_dev_event_sync(zs_event_t *e, zs_err_t *err);

/* ---- work on a stream -------------------------------------------------------- */

/* Copy bytes between any two spaces (direction from the pointers). */
int zs_dev_memcpy(zs_stream_t *s, void *dst, const void *src, size_t bytes, zs_err_t *err);
int zs_dev_memset(zs_stream_t *s, void *dst, int byte, size_t bytes, zs_err_t *err);

/* Run fn(copy of args) in stream order; argbytes <= ZS_DEV_MAX_ARGS. */
int zs_dev_host_fn(zs_stream_t *s, zs_host_fn_t fn, const void *args, size_t argbytes,
                   zs_err_t *err);

/* Vector ops on device memory (n elements). Conversions round to nearest
 * even (zs_cast.h); sums are done in fp32 and rounded once to the
 * destination type.
 *   cast        dst (ddt) = src (sdt); dst and src must not overlap
 *   accumulate  dst (ddt) += src (sdt)
 *   scale       x (dt) *= alpha
 *   sumsq       acc[0] += sum of x^2 (summed in fp64, in a fixed order);
 *               acc[1] = 1.0 if any element is inf or NaN (else unchanged).
 *               acc is 2 doubles of device memory
 *   adamw       zs_adam_update (zs_adam.h) on device memory */
int zs_dev_cast(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                size_t n, zs_err_t *err);
int zs_dev_accumulate(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                      size_t n, zs_err_t *err);

/* Gather and convert rows, in one launch: for each i < n with lo <= idx[i]
 * < hi, row i of dst (width fp32 elements) = row idx[i] - lo of src (width
 * elements of sdt, converted exactly to fp32); the other rows of dst are
 * left as they are. idx is n int32 in device memory (read in stream
 * order). src is rows [lo, hi) of a row-major matrix, so one call serves
 * one chunk of a table split by rows. dst must not overlap src or idx.
 * Used by the GPT to convert the embedding rows of a batch's distinct
 * tokens (zs_gpt_split.c): one launch where a cast per row was one each. */
int zs_dev_cast_rows(zs_stream_t *s, float *dst, const void *src, zs_dtype_t sdt,
                     const int32_t *idx, size_t n, int32_t lo, int32_t hi, size_t width,
                     zs_err_t *err);

/* Round in place, keeping the rounded copy, in one pass (one launch): for
 * each i < n, h[i] (dt: bf16 or fp16) = x[i] rounded to nearest even, then
 * x[i] = h[i] widened back to fp32 (exact). Bitwise zs_dev_cast(h, dt, x,
 * F32) followed by zs_dev_cast(x, F32, h, dt); fp16 overflow gives inf in
 * both. x and h must not overlap. Used by the GPT's 16-bit activations
 * (zs_gpt_act16.c): each saved tensor is rounded where it is stored. */
int zs_dev_round(zs_stream_t *s, float *x, void *h, zs_dtype_t dt, size_t n, zs_err_t *err);
int zs_dev_scale(zs_stream_t *s, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err);
int zs_dev_sumsq(zs_stream_t *s, const void *x, zs_dtype_t dt, size_t n, double *acc,
                 zs_err_t *err);
int zs_dev_adamw(zs_stream_t *s, const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p,
                 float *m, float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t odt,
                 size_t n, zs_err_t *err);

/* The device a stream belongs to (an event's is e->dev). */
zs_dev_t *zs_dev_of_stream(const zs_stream_t *s);

/* Free the device. Destroy its streams and events first; memory still
 * allocated is reported in the log, not freed. NULL is a no-op. */
static inline void zs_dev_destroy(zs_dev_t *d)
{
    if (d)
        d->vt->destroy(d);
}

/* Common header of every implementation's stream and event, so the
 * dispatching functions above can find the table. Implementations embed it
 * first in their structs. */
struct zs_stream {
    zs_dev_t *dev;
};
struct zs_event {
    zs_dev_t *dev;
};

#endif
