/*
 * zs_dev_cuda_alloc.c - memory of the CUDA device: a caching allocator for
 * device memory, pinned host memory (cudaHostAlloc) and host memory
 * (posix_memalign), with the accounting of zs_dev.h (identical categories
 * and `cur`/`peak` figures as the CPU device: requested bytes).
 *
 * Device memory. A request is rounded up to a block size (512 B multiples
 * below 1 MiB, 2 MiB multiples above) and served from a cached block of
 * exactly that size when one is ready, else by cudaMalloc. zs_dev_free
 * does not know which streams used a block, so a freed block is not reused
 * at once: it waits in a quarantine. When an allocation finds the
 * quarantine non-empty it makes a fence: one event recorded on every live
 * stream of the device. Every use of a freed block was enqueued before the
 * free (nobody enqueues work on freed memory), hence before the fence, so
 * once all of the fence's events have completed the blocks behind it are
 * idle and move to the cache. Fences complete in order (each records later
 * than the one before on every stream), so they are checked from the
 * oldest and never waited for in the common path. Freed blocks count as
 * `cached` (real size) until cudaFree'd. When cudaMalloc fails, the
 * allocator waits for every fence, tries the cache again, then frees every
 * cached block (trim) and retries once; then ZS_ERR_NOMEM with the figures.
 * An optional limit on held device bytes (zs_dev_cuda_set_mem_limit, to
 * simulate a smaller GPU) is checked before cudaMalloc the same way: wait,
 * reuse, trim, then ZS_ERR_NOMEM naming the limit. Never run on a GPU yet.
 * Device destroy waits for the fences and frees everything.
 *
 * Cost: one event per stream per fence and no synchronisation in the
 * steady state of a training loop (same sizes each step); memory reuse
 * lags one allocation behind the frees while streams are busy.
 *
 * Pinned memory is not cached: zs_dev_free calls cudaFreeHost at once, so
 * (as on the CPU device, which frees at once too) the caller must have
 * waited for the copies that use it. Host memory is posix_memalign'ed.
 * Caller memory page-locked with zs_dev_host_register (cudaHostRegister)
 * is a live pinned block marked `registered`: counted like pinned memory,
 * ended by zs_dev_host_unregister (cudaHostUnregister), never by
 * zs_dev_free.
 * `held` = cur + cached, per zs_dev.h; the rounding slack of live device
 * blocks (under 512 B, or under 2 MiB for blocks over 1 MiB) is in
 * neither.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_dev_cuda_internal.h"
#include "zs_log.h"

#define SMALL_LIMIT ((size_t)1 << 20) /* blocks below: 512 B steps */
#define SMALL_STEP  ((size_t)512)
#define LARGE_STEP  ((size_t)2 << 20)

#define HINT_ALLOC "is another process using this GPU? (nvidia-smi)"

static size_t round_up(size_t n, size_t step)
{
    return (n + step - 1) / step * step;
}

/* Real size of the device block serving `bytes` (0 when it would overflow). */
static size_t block_size(size_t bytes)
{
    if (bytes == 0)
        return SMALL_STEP;
    if (bytes > SIZE_MAX - LARGE_STEP)
        return 0;
    return bytes < SMALL_LIMIT ? round_up(bytes, SMALL_STEP) : round_up(bytes, LARGE_STEP);
}

/* ---- accounting (under cd->mu) ------------------------------------------- */

static void update_held(zs__cuda_dev_t *cd, int space)
{
    zs_dev_mem_t *m = &cd->mem;
    uint64_t h = m->cached[space];
    for (int c = 0; c < ZS_MEM_NCATS; c++)
        h += m->cur[space][c];
    m->held[space] = h;
    if (h > m->held_peak[space])
        m->held_peak[space] = h;
}

static void count_alloc(zs__cuda_dev_t *cd, const zs__cuda_block_t *b)
{
    zs_dev_mem_t *m = &cd->mem;
    m->cur[b->space][b->cat] += b->bytes;
    if (m->cur[b->space][b->cat] > m->peak[b->space][b->cat])
        m->peak[b->space][b->cat] = m->cur[b->space][b->cat];
    m->nallocs++;
    update_held(cd, b->space);
}

static void count_free(zs__cuda_dev_t *cd, const zs__cuda_block_t *b)
{
    cd->mem.cur[b->space][b->cat] -= b->bytes;
    update_held(cd, b->space);
}

/* ---- live blocks: a chained hash by pointer (under cd->mu) ---------------- */

static size_t bucket_of(const zs__cuda_dev_t *cd, const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p >> 6;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 20) & (cd->nbuckets - 1);
}

static int live_grow(zs__cuda_dev_t *cd)
{
    size_t nb = cd->nbuckets * 2;
    zs__cuda_block_t **nt = calloc(nb, sizeof *nt);
    if (!nt)
        return -1; /* keep the old table: longer chains, still correct */
    zs__cuda_block_t **old = cd->live;
    size_t ob = cd->nbuckets;
    cd->live = nt;
    cd->nbuckets = nb;
    for (size_t i = 0; i < ob; i++) {
        for (zs__cuda_block_t *b = old[i], *nx; b; b = nx) {
            nx = b->next;
            size_t k = bucket_of(cd, b->p);
            b->next = nt[k];
            nt[k] = b;
        }
    }
    free(old);
    return 0;
}

static void live_add(zs__cuda_dev_t *cd, zs__cuda_block_t *b)
{
    if (cd->nlive >= 2 * cd->nbuckets)
        live_grow(cd);
    size_t k = bucket_of(cd, b->p);
    b->next = cd->live[k];
    cd->live[k] = b;
    cd->nlive++;
}

static zs__cuda_block_t *live_take(zs__cuda_dev_t *cd, const void *p)
{
    for (zs__cuda_block_t **pp = &cd->live[bucket_of(cd, p)]; *pp; pp = &(*pp)->next) {
        if ((*pp)->p == p) {
            zs__cuda_block_t *b = *pp;
            *pp = b->next;
            b->next = NULL;
            cd->nlive--;
            return b;
        }
    }
    return NULL;
}

/* ---- fences (under cd->mu) ------------------------------------------------- */

static int pool_event(zs__cuda_dev_t *cd, cudaEvent_t *ev, zs_err_t *err)
{
    if (cd->nevpool > 0) {
        *ev = cd->evpool[--cd->nevpool];
        return ZS_OK;
    }
    return ZS_CUDA_CHECK(err, cd->device, "event for an allocator fence", cudaEventCreateWithFlags,
                         ev, cudaEventDisableTiming);
}

static void unpool_event(zs__cuda_dev_t *cd, cudaEvent_t ev)
{
    if (cd->nevpool == cd->capevpool) {
        int cap = cd->capevpool ? 2 * cd->capevpool : 16;
        cudaEvent_t *np = realloc(cd->evpool, (size_t)cap * sizeof *np);
        if (!np) {
            cudaEventDestroy(ev);
            return;
        }
        cd->evpool = np;
        cd->capevpool = cap;
    }
    cd->evpool[cd->nevpool++] = ev;
}

static void cache_blocks(zs__cuda_dev_t *cd, zs__cuda_block_t *list)
{
    while (list) {
        zs__cuda_block_t *nx = list->next;
        list->next = cd->cache;
        cd->cache = list;
        list = nx;
    }
}

/* Fence the quarantine: record an event on every live stream. With no
 * stream nothing can be in flight and the blocks are cached at once. */
static int fence_new(zs__cuda_dev_t *cd, zs_err_t *err)
{
    if (!cd->quarantine)
        return ZS_OK;
    if (cd->nstreams == 0) {
        cache_blocks(cd, cd->quarantine);
        cd->quarantine = NULL;
        return ZS_OK;
    }
    zs__cuda_fence_t *f = calloc(1, sizeof *f);
    cudaEvent_t *ev = calloc((size_t)cd->nstreams, sizeof *ev);
    if (!f || !ev) {
        free(f);
        free(ev);
        return zs_err_set(err, ZS_ERR_NOMEM, "cuda:%d allocator: no host memory for a fence",
                          cd->device);
    }
    f->ev = ev;
    int rc = ZS_OK;
    for (zs__cuda_stream_t *s = cd->streams; s && rc == ZS_OK; s = s->next) {
        rc = pool_event(cd, &ev[f->nev], err);
        if (rc == ZS_OK) {
            f->nev++;
            rc = ZS_CUDA_CHECK(err, cd->device, "allocator fence", cudaEventRecord, ev[f->nev - 1],
                               s->h);
        }
    }
    if (rc != ZS_OK) {
        for (int i = 0; i < f->nev; i++)
            unpool_event(cd, ev[i]);
        free(ev);
        free(f);
        return rc; /* the quarantine stays for the next try */
    }
    f->blocks = cd->quarantine;
    cd->quarantine = NULL;
    if (cd->fences_tail)
        cd->fences_tail->next = f;
    else
        cd->fences = f;
    cd->fences_tail = f;
    return ZS_OK;
}

/* Move the blocks of completed fences (oldest first) to the cache. wait:
 * block on each fence instead of stopping at the first incomplete one. */
static int fences_reap(zs__cuda_dev_t *cd, int wait, zs_err_t *err)
{
    while (cd->fences) {
        zs__cuda_fence_t *f = cd->fences;
        for (int i = 0; i < f->nev; i++) {
            if (wait) {
                int rc =
                    ZS_CUDA_CHECK(err, cd->device, "waiting for a stream before reusing memory",
                                  cudaEventSynchronize, f->ev[i]);
                if (rc)
                    return rc;
                continue;
            }
            cudaError_t q = cudaEventQuery(f->ev[i]);
            if (q == cudaErrorNotReady) {
                /* recorded as the thread's last error: a kernel launcher's
                 * cudaGetLastError would report it as its own failure */
                (void)cudaGetLastError();
                return ZS_OK;
            }
            if (q != cudaSuccess)
                return zs__cuda_check(q, "cudaEventQuery", __FILE__, __LINE__, cd->device,
                                      "an earlier kernel or copy failed on this GPU", err);
        }
        cd->fences = f->next;
        if (!cd->fences)
            cd->fences_tail = NULL;
        for (int i = 0; i < f->nev; i++)
            unpool_event(cd, f->ev[i]);
        cache_blocks(cd, f->blocks);
        free(f->ev);
        free(f);
    }
    return ZS_OK;
}

/* A cached block of b->size bytes for b: its memory becomes b's and the
 * cache's record of it is freed. 1 if there was one, else 0. */
static int cache_take(zs__cuda_dev_t *cd, zs__cuda_block_t *b)
{
    for (zs__cuda_block_t **pp = &cd->cache; *pp; pp = &(*pp)->next) {
        if ((*pp)->size == b->size) {
            zs__cuda_block_t *c = *pp;
            *pp = c->next;
            cd->mem.cached[ZS_SPACE_DEVICE] -= c->size;
            b->p = c->p;
            free(c);
            return 1;
        }
    }
    return 0;
}

/* cudaFree every cached block (they are idle: they passed their fence). */
static void cache_trim(zs__cuda_dev_t *cd)
{
    while (cd->cache) {
        zs__cuda_block_t *b = cd->cache;
        cd->cache = b->next;
        cudaFree(b->p);
        cd->mem.cached[ZS_SPACE_DEVICE] -= b->size;
        free(b);
    }
    update_held(cd, ZS_SPACE_DEVICE);
}

/* ---- the vtable's entries ----------------------------------------------------- */

/* 1 when a new block for b would take the held device bytes above the
 * limit (zs_dev_cuda_set_mem_limit; under cd->mu). */
static int over_limit(const zs__cuda_dev_t *cd, const zs__cuda_block_t *b)
{
    uint64_t held = cd->mem.held[ZS_SPACE_DEVICE];
    return cd->limit && (held > cd->limit || b->bytes > cd->limit - held);
}

/* A device block of `size` bytes for `b` (under cd->mu): cache, fence,
 * cudaMalloc, then wait + trim + retry on failure. */
static int device_block(zs__cuda_dev_t *cd, zs__cuda_block_t *b, zs_err_t *err)
{
    int rc = fences_reap(cd, 0, err);
    if (rc)
        return rc;
    if (cache_take(cd, b))
        return ZS_OK;
    if (cd->quarantine) {
        rc = fence_new(cd, err);
        if (rc == ZS_OK)
            rc = fences_reap(cd, 0, err); /* idle streams: reusable at once */
        if (rc)
            return rc;
        if (cache_take(cd, b))
            return ZS_OK;
    }
    if (over_limit(cd, b)) { /* as a failed cudaMalloc: wait, reuse, trim, then refuse */
        rc = fences_reap(cd, 1, err);
        if (rc)
            return rc;
        if (cache_take(cd, b))
            return ZS_OK;
        cache_trim(cd);
        if (over_limit(cd, b))
            return zs_err_set(
                err, ZS_ERR_NOMEM,
                "cuda:%d: out of device memory for %zu bytes (%s): %llu bytes (%.2f GiB) held "
                "by zeroshard, cache trimmed, over the device memory limit of %llu bytes (%.2f "
                "GiB) (zs_dev_cuda_set_mem_limit) (hint: smaller micro-batch, higher ZeRO stage "
                "or offload)",
                cd->device, b->bytes, zs_memcat_name(b->cat),
                (unsigned long long)cd->mem.held[ZS_SPACE_DEVICE],
                cd->mem.held[ZS_SPACE_DEVICE] / 1073741824.0, (unsigned long long)cd->limit,
                cd->limit / 1073741824.0);
    }
    cudaError_t ce = cudaMalloc(&b->p, b->size);
    if (ce == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* not sticky, but clear it for later checks */
        rc = fences_reap(cd, 1, err);
        if (rc)
            return rc;
        if (cache_take(cd, b))
            return ZS_OK;
        cache_trim(cd);
        ce = cudaMalloc(&b->p, b->size);
        if (ce == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            uint64_t live = 0;
            for (int k = 0; k < ZS_MEM_NCATS; k++)
                live += cd->mem.cur[ZS_SPACE_DEVICE][k];
            return zs_err_set(err, ZS_ERR_NOMEM,
                              "cuda:%d: out of device memory for %zu bytes (%s): %.2f GiB live "
                              "in zeroshard, cache trimmed, GPU has %.2f of %.2f GiB free "
                              "(hint: smaller micro-batch, higher ZeRO stage or offload; %s)",
                              cd->device, b->bytes, zs_memcat_name(b->cat), live / 1073741824.0,
                              fr / 1073741824.0, tot / 1073741824.0, HINT_ALLOC);
        }
    }
    return zs__cuda_check(ce, "cudaMalloc", __FILE__, __LINE__, cd->device, HINT_ALLOC, err);
}

int zs__cuda_alloc(zs_dev_t *d, int space, int cat, size_t bytes, void **out, zs_err_t *err)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_alloc: out is NULL");
    *out = NULL;
    if (space < 0 || space >= ZS_NSPACES || cat < 0 || cat >= ZS_MEM_NCATS)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_alloc: space %d / category %d out of range",
                          space, cat);
    zs__cuda_block_t *b = calloc(1, sizeof *b);
    if (!b)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_alloc: no host memory for a block record");
    b->bytes = bytes;
    b->space = space;
    b->cat = cat;
    int rc = ZS_CUDA_CHECK(err, cd->device, "was the device reset?", cudaSetDevice, cd->device);
    if (rc) {
        free(b);
        return rc;
    }
    if (space == ZS_SPACE_DEVICE) {
        b->size = block_size(bytes);
        if (b->size == 0) {
            free(b);
            return zs_err_set(err, ZS_ERR_NOMEM,
                              "zs_dev_alloc: %zu bytes of device memory (%s) overflow", bytes,
                              zs_memcat_name(cat));
        }
        pthread_mutex_lock(&cd->mu);
        rc = device_block(cd, b, err);
    } else {
        b->size = bytes ? bytes : 1;
        if (space == ZS_SPACE_PINNED) {
            rc = ZS_CUDA_CHECK(err, cd->device, "pinned memory counts against `ulimit -l`",
                               cudaHostAlloc, &b->p, b->size, cudaHostAllocDefault);
            if (rc == ZS_ERR_NOMEM)
                cudaGetLastError();
        } else if (posix_memalign(&b->p, 64, b->size) != 0) {
            b->p = NULL;
            rc = zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_alloc: no host memory for %zu bytes (%s)",
                            bytes, zs_memcat_name(cat));
        }
        pthread_mutex_lock(&cd->mu);
    }
    if (rc == ZS_OK) {
        live_add(cd, b);
        count_alloc(cd, b);
        *out = b->p;
    }
    pthread_mutex_unlock(&cd->mu);
    if (rc)
        free(b);
    return rc;
}

void zs__cuda_free(zs_dev_t *d, void *p)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    pthread_mutex_lock(&cd->mu);
    zs__cuda_block_t *b = live_take(cd, p);
    if (b && b->registered) { /* the caller's memory: zs_dev_host_unregister ends it */
        live_add(cd, b);
        pthread_mutex_unlock(&cd->mu);
        ZS_WARN("zs_dev_free: %p is registered caller memory, not an allocation (ignored; "
                "zs_dev_host_unregister ends it)",
                p);
        return;
    }
    if (!b) {
        int warn = !cd->warned_bad_free;
        cd->warned_bad_free = 1;
        pthread_mutex_unlock(&cd->mu);
        if (warn)
            ZS_WARN("zs_dev_free: %p was not allocated by cuda:%d (ignored; warned once)", p,
                    cd->device);
        return;
    }
    count_free(cd, b);
    if (b->space == ZS_SPACE_DEVICE) {
        b->next = cd->quarantine;
        cd->quarantine = b;
        cd->mem.cached[ZS_SPACE_DEVICE] += b->size;
        update_held(cd, ZS_SPACE_DEVICE);
        b = NULL;
    }
    pthread_mutex_unlock(&cd->mu);
    if (!b)
        return;
    if (b->space == ZS_SPACE_PINNED) {
        cudaSetDevice(cd->device);
        cudaFreeHost(b->p); /* nothing to report to a void call */
    } else {
        free(b->p);
    }
    free(b);
}

/* See zs_dev_host_register (arguments checked there): cudaHostRegister
 * (default flags: portable mapping is not needed, one device per process),
 * then a live pinned block marked `registered`, counted as pinned memory
 * of `cat` (not in nallocs: nothing was allocated). */
int zs__cuda_host_register(zs_dev_t *d, void *p, size_t bytes, int cat, zs_err_t *err)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    zs__cuda_block_t *b = calloc(1, sizeof *b);
    if (!b)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_host_register: no host memory for a record");
    *b = (zs__cuda_block_t){p, bytes, bytes, ZS_SPACE_PINNED, cat, 1, NULL};
    int rc = ZS_CUDA_CHECK(err, cd->device, "was the device reset?", cudaSetDevice, cd->device);
    cudaError_t ce = rc ? cudaSuccess : cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (ce == cudaErrorHostMemoryAlreadyRegistered) { /* the caller's mistake, as on the CPU */
        (void)cudaGetLastError();
        rc = zs_err_set(err, ZS_ERR_INVALID,
                        "zs_dev_host_register: [%p, +%zu) overlaps memory already registered", p,
                        bytes);
    } else if (ce != cudaSuccess) {
        rc = zs__cuda_check((int)ce, "cudaHostRegister", __FILE__, __LINE__, cd->device,
                            "page-locked memory counts against `ulimit -l`", err);
    }
    if (rc) {
        free(b);
        return rc;
    }
    pthread_mutex_lock(&cd->mu);
    live_add(cd, b);
    zs_dev_mem_t *m = &cd->mem;
    m->cur[ZS_SPACE_PINNED][cat] += bytes;
    if (m->cur[ZS_SPACE_PINNED][cat] > m->peak[ZS_SPACE_PINNED][cat])
        m->peak[ZS_SPACE_PINNED][cat] = m->cur[ZS_SPACE_PINNED][cat];
    update_held(cd, ZS_SPACE_PINNED);
    pthread_mutex_unlock(&cd->mu);
    return ZS_OK;
}

/* See zs_dev_host_unregister: cudaHostUnregister, and the bytes leave the
 * counts. A pointer that is not a registration is logged and left alone. */
void zs__cuda_host_unregister(zs_dev_t *d, void *p)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    pthread_mutex_lock(&cd->mu);
    zs__cuda_block_t *b = live_take(cd, p);
    if (b && !b->registered) {
        live_add(cd, b);
        b = NULL;
    }
    if (b)
        count_free(cd, b);
    pthread_mutex_unlock(&cd->mu);
    if (!b) {
        ZS_WARN("zs_dev_host_unregister: %p is not registered with cuda:%d (ignored)", p,
                cd->device);
        return;
    }
    cudaSetDevice(cd->device);
    if (cudaHostUnregister(p) != cudaSuccess) /* nothing to report to a void call */
        (void)cudaGetLastError();
    free(b);
}

/* See zs_dev_cuda.h. */
int zs_dev_cuda_set_mem_limit(zs_dev_t *d, uint64_t bytes, zs_err_t *err)
{
    if (zs__dev_cuda_ordinal(d) < 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_dev_cuda_set_mem_limit: \"%s\" is not a CUDA device",
                          d ? d->desc : "(null)");
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    pthread_mutex_lock(&cd->mu);
    cd->limit = bytes;
    pthread_mutex_unlock(&cd->mu);
    return ZS_OK;
}

void zs__cuda_mem(zs_dev_t *d, zs_dev_mem_t *out)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    pthread_mutex_lock(&cd->mu);
    *out = cd->mem;
    pthread_mutex_unlock(&cd->mu);
}

void zs__cuda_mem_reset_peak(zs_dev_t *d)
{
    zs__cuda_dev_t *cd = (zs__cuda_dev_t *)d;
    pthread_mutex_lock(&cd->mu);
    memcpy(cd->mem.peak, cd->mem.cur, sizeof cd->mem.peak);
    memcpy(cd->mem.held_peak, cd->mem.held, sizeof cd->mem.held_peak);
    pthread_mutex_unlock(&cd->mu);
}

int zs__cuda_alloc_init(zs__cuda_dev_t *cd, zs_err_t *err)
{
    cd->nbuckets = 256;
    cd->live = calloc(cd->nbuckets, sizeof *cd->live);
    if (!cd->live)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_cuda_create: no memory");
    return ZS_OK;
}

/* Device destroy: wait for every fence, free cached, quarantined and (with
 * a warning: the caller leaked them) live blocks, and the event pool. */
void zs__cuda_alloc_deinit(zs__cuda_dev_t *cd)
{
    if (!cd->live)
        return;
    zs_err_t e;
    if (fences_reap(cd, 1, &e) != ZS_OK)
        ZS_WARN("zs_dev_destroy: %s", e.msg);
    while (cd->fences) { /* only after a CUDA error: free without waiting */
        zs__cuda_fence_t *f = cd->fences;
        cd->fences = f->next;
        cache_blocks(cd, f->blocks);
        for (int i = 0; i < f->nev; i++)
            cudaEventDestroy(f->ev[i]);
        free(f->ev);
        free(f);
    }
    cd->fences_tail = NULL;
    cache_blocks(cd, cd->quarantine);
    cd->quarantine = NULL;
    cache_trim(cd);
    size_t leaked = 0;
    for (size_t i = 0; i < cd->nbuckets; i++) {
        for (zs__cuda_block_t *b = cd->live[i], *nx; b; b = nx) {
            nx = b->next;
            leaked++;
            if (b->registered)
                cudaHostUnregister(b->p);
            else if (b->space == ZS_SPACE_DEVICE)
                cudaFree(b->p);
            else if (b->space == ZS_SPACE_PINNED)
                cudaFreeHost(b->p);
            else
                free(b->p);
            free(b);
        }
    }
    if (leaked)
        ZS_WARN("zs_dev_destroy: cuda:%d freed %zu allocations the caller had not freed",
                cd->device, leaked);
    free(cd->live);
    cd->live = NULL;
    for (int i = 0; i < cd->nevpool; i++)
        cudaEventDestroy(cd->evpool[i]);
    free(cd->evpool);
    cd->evpool = NULL;
    cd->nevpool = cd->capevpool = 0;
}
