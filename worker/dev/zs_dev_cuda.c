/*
 * zs_dev_cuda.c - the CUDA implementation of the device interface (zs_dev.h):
 * creation and the GPU probe, streams, events, host functions, copies,
 * memsets and the vector ops. Memory lives in zs_dev_cuda_alloc.c.
 *
 * Streams are cudaStreamCreateWithPriority(cudaStreamNonBlocking), high
 * priority for communication; events are cudaEventDisableTiming. Every
 * call makes the device current on the calling thread first (any thread
 * may call), and every CUDA call goes through ZS_CUDA_CHECK.
 *
 * Sticky errors (zs_dev.h) on CUDA. Two kinds of errors happen in queued
 * work: CUDA's own (a faulting kernel: CUDA makes them sticky for the whole
 * context, and every later sync reports them) and a host function returning
 * an error. For the latter each stream has an error slot:
 *  - a host function that fails writes the slot (first error wins);
 *  - host functions that run after it on the stream are skipped, and so is
 *    any work enqueued while the slot is known to be set (enqueue returns
 *    ZS_OK, like the CPU device, and the error comes back at sync). Kernels
 *    and copies enqueued before the failure became known still run: CUDA
 *    cannot cancel them (documented deviation from the CPU device);
 *  - an event carries the slot of its stream at the point it was recorded:
 *    if the slot is already set it is copied at record time; if host
 *    functions are still pending on the stream, a small host function
 *    enqueued just before cudaEventRecord copies it (a refcounted cell
 *    shared with later waiters), else the event is clean. No host function
 *    is added on a stream that never ran one;
 *  - a stream that waits on a failed event takes the error (at enqueue if
 *    already known, else through a host function enqueued after the
 *    cudaStreamWaitEvent);
 *  - zs_dev_stream_sync returns the slot and clears it; zs_dev_event_sync
 *    returns the event's error. CUDA errors are returned as they come.
 *
 * Host functions run on CUDA's callback thread through cudaLaunchHostFunc
 * with a heap copy of their arguments, freed after the call. They must not
 * call CUDA (CUDA's rule); the wrappers here only take a mutex and copy.
 *
 * Watched streams (the NCCL stream, zs__dev_cuda_stream_watch) are
 * synchronised by polling cudaStreamQuery, so the NCCL watchdog can end a
 * wait on a hung collective with zs__dev_cuda_stream_abort.
 *
 * Not here: timing events, graphs, peer access, several devices per
 * zs_dev_t.
 */
#include <sched.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cuda_vec.h"
#include "zs_dev_cuda_internal.h"
#include "zs_log.h"

#define HINT_STICKY "an earlier kernel or copy on this GPU failed; the context is unusable"

static const zs_dev_vtable_t cuda_vt;

/* ---- errors --------------------------------------------------------------- */

int zs__cuda_check(int code, const char *call, const char *file, int line, int device,
                   const char *hint, zs_err_t *err)
{
    if (code == (int)cudaSuccess)
        return ZS_OK;
    cudaError_t e = (cudaError_t)code;
    /* A failed runtime call also stays in the thread's "last error", and the
     * kernel launchers read that with cudaGetLastError: a non-sticky error
     * reported here would fail the next, unrelated launch on this thread.
     * Reported now, so drop it (a sticky error comes back from every call). */
    (void)cudaGetLastError();
    int zc = ZS_ERR_INTERNAL;
    if (e == cudaErrorMemoryAllocation)
        zc = ZS_ERR_NOMEM;
    else if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
        zc = ZS_ERR_UNAVAILABLE;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    return zs_err_set(err, zc, "%s at %s:%d on cuda:%d: %s (%s) (hint: %s)", call, base, line,
                      device, cudaGetErrorString(e), cudaGetErrorName(e), hint ? hint : "none");
}

int zs_dev_cuda_available(char *why, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (why && n)
            snprintf(why, n, "no GPU: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return 0;
    }
    if (count <= 0) {
        if (why && n)
            snprintf(why, n, "no GPU: cudaGetDeviceCount found 0 devices");
        return 0;
    }
    if (why && n)
        snprintf(why, n, "%d CUDA device%s", count, count == 1 ? "" : "s");
    return count;
}

static zs__cuda_dev_t *dev_of(zs_stream_t *s)
{
    return (zs__cuda_dev_t *)s->dev;
}

static int use_dev(zs__cuda_dev_t *cd, zs_err_t *err)
{
    return ZS_CUDA_CHECK(err, cd->device, "was the device reset?", cudaSetDevice, cd->device);
}

/* ---- error cells: what an event carries -------------------------------------- */

enum { CELL_UNKNOWN = 0, CELL_CLEAN = 1, CELL_FAILED = 2 };

typedef struct err_cell {
    atomic_int refs;
    atomic_int state;
    zs_err_t err; /* valid once state == CELL_FAILED (release/acquire) */
} err_cell_t;

static err_cell_t *cell_new(void)
{
    err_cell_t *c = calloc(1, sizeof *c);
    if (c)
        atomic_init(&c->refs, 1);
    return c;
}

static void cell_ref(err_cell_t *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

static void cell_unref(err_cell_t *c)
{
    if (c && atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
        free(c);
}

static void cell_fail(err_cell_t *c, const zs_err_t *e)
{
    c->err = *e;
    atomic_store_explicit(&c->state, CELL_FAILED, memory_order_release);
}

typedef struct zs__cuda_event {
    zs_event_t base; /* first */
    cudaEvent_t h;
    pthread_mutex_t mu;
    err_cell_t *cell; /* of the last record; NULL: never recorded */
} zs__cuda_event_t;

/* ---- the stream's error slot ------------------------------------------------- */

static void slot_set(zs__cuda_stream_t *s, const zs_err_t *e)
{
    pthread_mutex_lock(&s->mu);
    if (!s->failed) {
        s->failed = 1;
        s->err = *e;
    }
    pthread_mutex_unlock(&s->mu);
}

/* s waited on an event that carries error e (wording as the CPU device). */
static void slot_set_waited(zs__cuda_stream_t *s, const zs_err_t *e)
{
    zs_err_t w;
    zs_err_set(&w, e->code, "stream \"%s\" waited on a failed event: %.260s", s->name, e->msg);
    slot_set(s, &w);
}

/* Entry of every enqueue: device current, *skip when the slot is set. */
static int enter(zs__cuda_stream_t *s, int *skip, zs_err_t *err)
{
    pthread_mutex_lock(&s->mu);
    *skip = s->failed || atomic_load(&s->aborted);
    pthread_mutex_unlock(&s->mu);
    return use_dev(dev_of(&s->base), err);
}

static void pending_add(zs__cuda_stream_t *s, int d)
{
    pthread_mutex_lock(&s->mu);
    s->pending += d;
    pthread_mutex_unlock(&s->mu);
}

/* ---- host functions (run on CUDA's callback thread: no CUDA calls) ---------- */

typedef struct hostcall {
    zs__cuda_stream_t *s;
    zs_host_fn_t fn;
    alignas(max_align_t) unsigned char args[];
} hostcall_t;

static void CUDART_CB run_hostcall(void *p)
{
    hostcall_t *h = p;
    zs__cuda_stream_t *s = h->s;
    pthread_mutex_lock(&s->mu);
    int skip = s->failed || atomic_load(&s->aborted);
    pthread_mutex_unlock(&s->mu);
    if (!skip) {
        zs_err_t e;
        zs_err_clear(&e);
        int rc = h->fn(h->args, &e);
        if (rc != ZS_OK) {
            if (e.code != rc || !e.msg[0])
                zs_err_set(&e, rc, "host function failed with %s and no message",
                           zs_status_name(rc));
            zs_err_prefix(&e, "stream \"%s\": ", s->name); /* as the CPU device */
            slot_set(s, &e);
        }
    }
    pending_add(s, -1);
    free(h);
}

typedef struct cell_link {
    zs__cuda_stream_t *s;
    err_cell_t *cell;
} cell_link_t;

/* Before an event record: the cell takes the stream's slot as it is now. */
static void CUDART_CB run_snap(void *p)
{
    cell_link_t *l = p;
    zs__cuda_stream_t *s = l->s;
    zs_err_t e;
    pthread_mutex_lock(&s->mu);
    int failed = s->failed;
    if (failed)
        e = s->err;
    pthread_mutex_unlock(&s->mu);
    if (failed)
        cell_fail(l->cell, &e);
    else
        atomic_store_explicit(&l->cell->state, CELL_CLEAN, memory_order_release);
    pending_add(s, -1);
    cell_unref(l->cell);
    free(l);
}

/* After a cudaStreamWaitEvent: the waiting stream takes the event's error. */
static void CUDART_CB run_adopt(void *p)
{
    cell_link_t *l = p;
    if (atomic_load_explicit(&l->cell->state, memory_order_acquire) == CELL_FAILED)
        slot_set_waited(l->s, &l->cell->err);
    pending_add(l->s, -1);
    cell_unref(l->cell);
    free(l);
}

/* Enqueue fn(arg) on s as a counted host function; frees arg on failure. */
static int launch_host(zs__cuda_stream_t *s, cudaHostFn_t fn, void *arg, zs_err_t *err)
{
    pending_add(s, 1);
    int rc = ZS_CUDA_CHECK(err, dev_of(&s->base)->device, HINT_STICKY, cudaLaunchHostFunc, s->h, fn,
                           arg);
    if (rc)
        pending_add(s, -1);
    return rc;
}

static int cu_host_fn(zs_stream_t *zs, zs_host_fn_t fn, const void *args, size_t argbytes,
                      zs_err_t *err)
{
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    if (!fn || argbytes > ZS_DEV_MAX_ARGS || (argbytes && !args))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_dev_host_fn: fn NULL, args NULL or %zu bytes of arguments (at most "
                          "%d)",
                          argbytes, ZS_DEV_MAX_ARGS);
    int skip, rc = enter(s, &skip, err);
    if (rc || skip)
        return rc;
    hostcall_t *h = malloc(sizeof *h + argbytes);
    if (!h)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_host_fn: no memory");
    h->s = s;
    h->fn = fn;
    if (argbytes)
        memcpy(h->args, args, argbytes);
    rc = launch_host(s, run_hostcall, h, err);
    if (rc)
        free(h);
    return rc;
}

/* ---- streams ------------------------------------------------------------------- */

static int cu_stream_create(zs_dev_t *d, int high_priority, const char *name, zs_stream_t **out,
                            zs_err_t *err)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_stream_create: out is NULL");
    *out = NULL;
    int rc = use_dev(cd, err);
    if (rc)
        return rc;
    zs__cuda_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_stream_create: no memory");
    s->base.dev = d;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "stream");
    rc = ZS_CUDA_CHECK(err, cd->device, "too many streams?", cudaStreamCreateWithPriority, &s->h,
                       cudaStreamNonBlocking, high_priority ? cd->prio_high : cd->prio_low);
    if (rc) {
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_lock(&cd->mu);
    s->next = cd->streams;
    cd->streams = s;
    cd->nstreams++;
    pthread_mutex_unlock(&cd->mu);
    *out = &s->base;
    return ZS_OK;
}

/* Poll a watched stream until it drains, fails or is aborted. */
static int poll_sync(zs__cuda_stream_t *s, zs_err_t *err)
{
    int device = dev_of(&s->base)->device;
    for (long i = 0;; i++) {
        if (atomic_load(&s->aborted))
            return ZS_OK; /* the caller reports abort_err */
        cudaError_t q = cudaStreamQuery(s->h);
        if (q == cudaSuccess)
            return ZS_OK;
        if (q == cudaErrorNotReady)
            (void)cudaGetLastError(); /* "not ready" is recorded too: see zs__cuda_check */
        if (q != cudaErrorNotReady)
            return zs__cuda_check(q, "cudaStreamQuery", __FILE__, __LINE__, device, HINT_STICKY,
                                  err);
        if (i < 1000) {
            sched_yield();
        } else {
            /* 50 us steps: a collective's tail latency, not a busy core */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static int cu_stream_sync(zs_stream_t *zs, zs_err_t *err)
{
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    zs__cuda_dev_t *cd = dev_of(zs);
    int rc = use_dev(cd, err);
    if (rc == ZS_OK)
        rc = s->watched ? poll_sync(s, err)
                        : ZS_CUDA_CHECK(err, cd->device, HINT_STICKY, cudaStreamSynchronize, s->h);
    if (atomic_load(&s->aborted)) {
        if (err)
            *err = s->abort_err;
        return s->abort_err.code;
    }
    pthread_mutex_lock(&s->mu);
    int failed = s->failed;
    zs_err_t e = s->err;
    s->failed = 0;
    pthread_mutex_unlock(&s->mu);
    if (rc == ZS_OK && failed) {
        if (err)
            *err = e;
        rc = e.code;
    }
    return rc;
}

static void cu_stream_destroy(zs_stream_t *zs)
{
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    zs__cuda_dev_t *cd = dev_of(zs);
    cudaSetDevice(cd->device);
    /* wait even when aborted: queued host functions point at s */
    cudaError_t e = cudaStreamSynchronize(s->h);
    pthread_mutex_lock(&cd->mu);
    for (zs__cuda_stream_t **pp = &cd->streams; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            cd->nstreams--;
            break;
        }
    }
    pthread_mutex_unlock(&cd->mu);
    cudaStreamDestroy(s->h);
    pthread_mutex_lock(&s->mu);
    int pending = s->pending;
    pthread_mutex_unlock(&s->mu);
    if (pending) {
        /* only after a CUDA failure: callbacks that never ran may still run */
        ZS_WARN("zs_dev_stream_destroy: stream '%s' on cuda:%d kept (%d host functions never ran: "
                "%s)",
                s->name, cd->device, pending, cudaGetErrorString(e));
        return;
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- events ------------------------------------------------------------------- */

static int cu_event_create(zs_dev_t *d, zs_event_t **out, zs_err_t *err)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    *out = NULL;
    int rc = use_dev(cd, err);
    if (rc)
        return rc;
    zs__cuda_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_event_create: no memory");
    e->base.dev = d;
    rc = ZS_CUDA_CHECK(err, cd->device, HINT_STICKY, cudaEventCreateWithFlags, &e->h,
                       cudaEventDisableTiming);
    if (rc) {
        free(e);
        return rc;
    }
    pthread_mutex_init(&e->mu, NULL);
    *out = &e->base;
    return ZS_OK;
}

static void cu_event_destroy(zs_event_t *ze)
{
    zs__cuda_event_t *e = (zs__cuda_event_t *)ze;
    cudaSetDevice(((zs__cuda_dev_t *)ze->dev)->device);
    cudaEventDestroy(e->h); /* CUDA releases it once a pending record completes */
    cell_unref(e->cell);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* The cell of e's last record, with a reference (NULL: never recorded). */
static err_cell_t *event_cell(zs__cuda_event_t *e)
{
    pthread_mutex_lock(&e->mu);
    err_cell_t *c = e->cell;
    if (c)
        cell_ref(c);
    pthread_mutex_unlock(&e->mu);
    return c;
}

static int cu_event_record(zs_event_t *ze, zs_stream_t *zs, zs_err_t *err)
{
    zs__cuda_event_t *e = (zs__cuda_event_t *)ze;
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    zs__cuda_dev_t *cd = dev_of(zs);
    int rc = use_dev(cd, err);
    if (rc)
        return rc;
    err_cell_t *c = cell_new();
    if (!c)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_event_record: no memory");
    zs_err_t known;
    pthread_mutex_lock(&s->mu);
    int failed = s->failed || atomic_load(&s->aborted);
    if (failed)
        known = s->failed ? s->err : s->abort_err;
    int snap = !failed && s->pending > 0;
    pthread_mutex_unlock(&s->mu);
    if (failed) {
        cell_fail(c, &known);
    } else if (!snap) {
        atomic_store(&c->state, CELL_CLEAN);
    } else {
        cell_link_t *l = malloc(sizeof *l);
        if (!l) {
            cell_unref(c);
            return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_event_record: no memory");
        }
        l->s = s;
        l->cell = c;
        cell_ref(c);
        rc = launch_host(s, run_snap, l, err);
        if (rc) {
            cell_unref(c);
            cell_unref(c);
            free(l);
            return rc;
        }
    }
    rc = ZS_CUDA_CHECK(err, cd->device, HINT_STICKY, cudaEventRecord, e->h, s->h);
    if (rc) {
        cell_unref(c);
        return rc;
    }
    pthread_mutex_lock(&e->mu);
    err_cell_t *old = e->cell;
    e->cell = c;
    pthread_mutex_unlock(&e->mu);
    cell_unref(old);
    return ZS_OK;
}

static int cu_stream_wait(zs_stream_t *zs, zs_event_t *ze, zs_err_t *err)
{
    zs__cuda_event_t *e = (zs__cuda_event_t *)ze;
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    err_cell_t *c = event_cell(e);
    if (!c)
        return ZS_OK; /* never recorded: complete */
    int rc = use_dev(dev_of(zs), err);
    if (rc == ZS_OK)
        rc =
            ZS_CUDA_CHECK(err, dev_of(zs)->device, HINT_STICKY, cudaStreamWaitEvent, s->h, e->h, 0);
    if (rc == ZS_OK) {
        int st = atomic_load_explicit(&c->state, memory_order_acquire);
        if (st == CELL_FAILED) {
            slot_set_waited(s, &c->err);
        } else if (st == CELL_UNKNOWN) {
            cell_link_t *l = malloc(sizeof *l);
            if (!l) {
                rc = zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_stream_wait: no memory");
            } else {
                l->s = s;
                l->cell = c;
                rc = launch_host(s, run_adopt, l, err);
                if (rc == ZS_OK)
                    return ZS_OK; /* the link holds our reference */
                free(l);
            }
        }
    }
    cell_unref(c);
    return rc;
}

static int cu_event_query(zs_event_t *ze)
{
    zs__cuda_event_t *e = (zs__cuda_event_t *)ze;
    err_cell_t *c = event_cell(e);
    if (!c)
        return 1;
    cell_unref(c);
    cudaSetDevice(((zs__cuda_dev_t *)ze->dev)->device);
    cudaError_t q = cudaEventQuery(e->h);
    if (q != cudaSuccess)
        (void)cudaGetLastError(); /* not left for the next launch check (zs__cuda_check) */
    /* an error also ends the wait: zs_dev_event_sync reports it */
    return q != cudaErrorNotReady;
}

static int cu_event_sync(zs_event_t *ze, zs_err_t *err)
{
    zs__cuda_event_t *e = (zs__cuda_event_t *)ze;
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)ze->dev;
    err_cell_t *c = event_cell(e);
    if (!c)
        return ZS_OK;
    int rc = use_dev(cd, err);
    if (rc == ZS_OK)
        rc = ZS_CUDA_CHECK(err, cd->device, HINT_STICKY, cudaEventSynchronize, e->h);
    if (rc == ZS_OK && atomic_load_explicit(&c->state, memory_order_acquire) == CELL_FAILED) {
        if (err)
            *err = c->err;
        rc = c->err.code;
    }
    cell_unref(c);
    return rc;
}

/* ---- copies, memsets, vector ops ------------------------------------------------ */

static int cu_memcpy(zs_stream_t *zs, void *dst, const void *src, size_t bytes, zs_err_t *err)
{
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    if (bytes == 0)
        return ZS_OK;
    if (!dst || !src)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_memcpy: NULL pointer for %zu bytes", bytes);
    int skip, rc = enter(s, &skip, err);
    if (rc || skip)
        return rc;
    return ZS_CUDA_CHECK(err, dev_of(zs)->device, "are both pointers live allocations?",
                         cudaMemcpyAsync, dst, src, bytes, cudaMemcpyDefault, s->h);
}

typedef struct {
    void *dst;
    int byte;
    size_t bytes;
} host_memset_t;

static int host_memset(void *args, zs_err_t *err)
{
    const host_memset_t *a = args;
    memset(a->dst, a->byte, a->bytes);
    return ZS_OK;
}

static int cu_memset(zs_stream_t *zs, void *dst, int byte, size_t bytes, zs_err_t *err)
{
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    if (bytes == 0)
        return ZS_OK;
    if (!dst)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_memset: NULL pointer for %zu bytes", bytes);
    int skip, rc = enter(s, &skip, err);
    if (rc || skip)
        return rc;
    /* host memory (pinned or pageable) is set on the host, in stream order:
     * pageable memory is not reachable by the GPU at all */
    struct cudaPointerAttributes pa;
    cudaError_t q = cudaPointerGetAttributes(&pa, dst);
    if (q != cudaSuccess)
        cudaGetLastError(); /* older drivers: unregistered host memory */
    if (q != cudaSuccess || (pa.type != cudaMemoryTypeDevice && pa.type != cudaMemoryTypeManaged)) {
        host_memset_t a = {dst, byte, bytes};
        return cu_host_fn(zs, host_memset, &a, sizeof a, err);
    }
    return ZS_CUDA_CHECK(err, dev_of(zs)->device, "is the pointer a live allocation?",
                         cudaMemsetAsync, dst, byte, bytes, s->h);
}

/* The launchers check their own arguments and cudaGetLastError. */
#define VEC_ENTER(zs)                                                                              \
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)(zs);                                              \
    int skip_, rc_ = enter(s, &skip_, err);                                                        \
    if (rc_ || skip_)                                                                              \
        return rc_;

static int cu_cast(zs_stream_t *zs, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                   size_t n, zs_err_t *err)
{
    VEC_ENTER(zs);
    return zs_cuda_cast((void *)s->h, dst, ddt, src, sdt, n, err);
}

static int cu_round(zs_stream_t *zs, float *x, void *h, zs_dtype_t dt, size_t n, zs_err_t *err)
{
    VEC_ENTER(zs);
    return zs_cuda_round((void *)s->h, x, h, dt, n, err);
}

static int cu_cast_rows(zs_stream_t *zs, float *dst, const void *src, zs_dtype_t sdt,
                        const int32_t *idx, size_t n, int32_t lo, int32_t hi, size_t width,
                        zs_err_t *err)
{
    VEC_ENTER(zs);
    return zs_cuda_cast_rows((void *)s->h, dst, src, sdt, idx, n, lo, hi, width, err);
}

static int cu_accumulate(zs_stream_t *zs, void *dst, zs_dtype_t ddt, const void *src,
                         zs_dtype_t sdt, size_t n, zs_err_t *err)
{
    VEC_ENTER(zs);
    return zs_cuda_accumulate((void *)s->h, dst, ddt, src, sdt, n, err);
}

static int cu_scale(zs_stream_t *zs, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err)
{
    VEC_ENTER(zs);
    return zs_cuda_scale((void *)s->h, x, dt, alpha, n, err);
}

static int cu_sumsq(zs_stream_t *zs, const void *x, zs_dtype_t dt, size_t n, double *acc,
                    zs_err_t *err)
{
    VEC_ENTER(zs);
    return zs_cuda_sumsq((void *)s->h, x, dt, n, acc, err);
}

static int cu_adamw(zs_stream_t *zs, const zs_adam_hparams_t *hp, const zs_adam_step_t *st,
                    float *p, float *m, float *v, const void *grad, zs_dtype_t gdt, void *out,
                    zs_dtype_t odt, size_t n, zs_err_t *err)
{
    VEC_ENTER(zs);
    return zs_cuda_adamw((void *)s->h, hp, st, p, m, v, grad, gdt, out, odt, n, err);
}

/* ---- device --------------------------------------------------------------------- */

static void cu_destroy(zs_dev_t *d)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    cudaSetDevice(cd->device);
    int left = 0;
    for (;;) {
        pthread_mutex_lock(&cd->mu);
        zs__cuda_stream_t *s = cd->streams;
        pthread_mutex_unlock(&cd->mu);
        if (!s)
            break;
        left++;
        cu_stream_destroy(&s->base); /* unlinks s */
    }
    if (left)
        ZS_WARN("zs_dev_destroy: cuda:%d destroyed %d streams the caller had not", cd->device,
                left);
    pthread_mutex_lock(&cd->mu);
    zs__cuda_alloc_deinit(cd);
    pthread_mutex_unlock(&cd->mu);
    pthread_mutex_destroy(&cd->mu);
    free(cd);
}

static const zs_dev_vtable_t cuda_vt = {
    .name = "cuda",
    .alloc = zs__cuda_alloc,
    .free = zs__cuda_free,
    .mem = zs__cuda_mem,
    .mem_reset_peak = zs__cuda_mem_reset_peak,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_sync = cu_stream_sync,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait = cu_stream_wait,
    .event_query = cu_event_query,
    .event_sync = cu_event_sync,
    .memcpy_async = cu_memcpy,
    .memset_async = cu_memset,
    .host_fn = cu_host_fn,
    .cast = cu_cast,
    .round = cu_round,
    .cast_rows = cu_cast_rows,
    .accumulate = cu_accumulate,
    .scale = cu_scale,
    .sumsq = cu_sumsq,
    .adamw = cu_adamw,
    .destroy = cu_destroy,
    .host_register = zs__cuda_host_register,
    .host_unregister = zs__cuda_host_unregister,
};

int zs_dev_cuda_create(int device, zs_dev_t **out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_cuda_create: out is NULL");
    *out = NULL;
    char why[200];
    int count = zs_dev_cuda_available(why, sizeof why);
    if (count == 0)
        return zs_err_set(err, ZS_ERR_UNAVAILABLE, "zs_dev_cuda_create: %s", why);
    if (device < 0 || device >= count)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "zs_dev_cuda_create: device %d does not exist (%d visible; hint: "
                          "check CUDA_VISIBLE_DEVICES)",
                          device, count);
    zs__cuda_dev_t *cd = calloc(1, sizeof *cd);
    if (!cd)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_cuda_create: no memory");
    cd->base.vt = &cuda_vt;
    cd->device = device;
    pthread_mutex_init(&cd->mu, NULL);
    struct cudaDeviceProp prop;
    static const char hint[] = "is the GPU in exclusive mode, or busy in another process?";
    int rc = ZS_CUDA_CHECK(err, device, hint, cudaSetDevice, device);
    if (rc == ZS_OK)
        rc = ZS_CUDA_CHECK(err, device, hint, cudaGetDeviceProperties, &prop, device);
    if (rc == ZS_OK)
        rc = ZS_CUDA_CHECK(err, device, hint, cudaDeviceGetStreamPriorityRange, &cd->prio_low,
                           &cd->prio_high);
    if (rc == ZS_OK)
        rc = zs__cuda_alloc_init(cd, err);
    if (rc) {
        zs_err_prefix(err, "zs_dev_cuda_create: ");
        pthread_mutex_destroy(&cd->mu);
        free(cd->live);
        free(cd);
        return rc;
    }
    snprintf(cd->base.desc, sizeof cd->base.desc, "cuda:%d %.80s, %.1f GiB", device, prop.name,
             (double)prop.totalGlobalMem / 1073741824.0);
    *out = &cd->base;
    return ZS_OK;
}

int zs_dev_cuda_mem_info(zs_dev_t *d, size_t *free_bytes, size_t *total_bytes, zs_err_t *err)
{
    if (!d || d->vt != &cuda_vt || !free_bytes || !total_bytes)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_cuda_mem_info: not a CUDA device");
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    int rc = use_dev(cd, err);
    if (rc == ZS_OK)
        rc = ZS_CUDA_CHECK(err, cd->device, "is the GPU still usable? (nvidia-smi)", cudaMemGetInfo,
                           free_bytes, total_bytes);
    return rc;
}

/* ---- hooks for the NCCL collectives ------------------------------------------- */

int zs__dev_cuda_ordinal(const zs_dev_t *d)
{
    return d && d->vt == &cuda_vt ? ((const zs__cuda_dev_t *)d)->device : -1;
}

void *zs__dev_cuda_stream_handle(zs_stream_t *s)
{
    return s && s->dev->vt == &cuda_vt ? (void *)((zs__cuda_stream_t *)s)->h : NULL;
}

void zs__dev_cuda_stream_watch(zs_stream_t *s)
{
    if (s && s->dev->vt == &cuda_vt)
        ((zs__cuda_stream_t *)s)->watched = 1;
}

void zs__dev_cuda_stream_abort(zs_stream_t *zs, const zs_err_t *e)
{
    if (!zs || zs->dev->vt != &cuda_vt)
        return;
    zs__cuda_stream_t *s = (zs__cuda_stream_t *)zs;
    pthread_mutex_lock(&s->mu);
    if (!atomic_load(&s->aborted)) {
        s->abort_err = *e;
        if (!s->failed) {
            s->failed = 1;
            s->err = *e;
        }
        atomic_store(&s->aborted, 1);
    }
    pthread_mutex_unlock(&s->mu);
}
