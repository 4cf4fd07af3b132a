/*
 * zs_dev_cpu.c - the CPU device (zs_dev_cpu_create, see zs_dev.h).
 *
 * What it does:
 *   memory   posix_memalign(64) for all three spaces (all are RAM here). A
 *            64-byte header before each block keeps its size, space and
 *            category, so free needs only the pointer and the block stays
 *            64-byte aligned. Counters under one mutex; nothing is cached.
 *            An optional limit on held device bytes (zs_dev_cpu_opts_t)
 *            makes it run out of "device memory" like a GPU of that size.
 *            Caller memory registered as pinned (zs_dev_host_register) is
 *            only counted: nothing needs locking on the CPU.
 *   streams  each stream owns a thread and a FIFO of tasks; the thread runs
 *            them in enqueue order, different streams run concurrently.
 *   events   each record is a refcounted node (done flag + the error the
 *            recording stream had at that point); the event points at its
 *            last node. A wait captures that node at call time, so
 *            re-recording never changes what an earlier wait waits for, and
 *            records completing out of order on different streams are right.
 *            Nodes are under one device-wide mutex and condition variable.
 *   vector   ops are queued and run by zs_dev_cpu_ops.c (chunked over the
 *            device's zs_pool); their tasks run on the stream thread too.
 * What it does not do: timing, priorities (high_priority only names the
 * thread), detect use of freed memory by queued work (the caller orders frees
 * after the work with events, as on CUDA).
 */
#define _GNU_SOURCE
#include "zs_dev.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs_dev_cpu_internal.h"
#include "zs_log.h"

/* ---- memory ---------------------------------------------------------------- */

#define HDR_BYTES  64 /* header before each block; keeps the block 64-aligned */
#define MAGIC_LIVE 0x7a73646576616c6cULL
#define MAGIC_FREE 0x7a73646576667265ULL

typedef struct blk_hdr {
    uint64_t magic;
    uint64_t bytes;
    zs_cpu_dev_t *dev;
    int32_t space, cat;
} blk_hdr_t;

_Static_assert(sizeof(blk_hdr_t) <= HDR_BYTES, "block header must fit in 64 bytes");

static void mem_add(zs_dev_mem_t *m, int space, int cat, uint64_t bytes)
{
    m->cur[space][cat] += bytes;
    if (m->cur[space][cat] > m->peak[space][cat])
        m->peak[space][cat] = m->cur[space][cat];
    m->held[space] += bytes;
    if (m->held[space] > m->held_peak[space])
        m->held_peak[space] = m->held[space];
}

/* See zs_dev_alloc. Errors: ZS_ERR_INVALID (space, category, out);
 * ZS_ERR_NOMEM when posix_memalign fails or one block would exceed the
 * machine's physical RAM (the CPU twin of exceeding device memory, refused
 * before asking the OS so sanitizers and overcommit do not get a say), or
 * when a device block would take the held device bytes above the device's
 * limit (zs_dev_cpu_opts_t.device_limit; "out of device memory", as CUDA). */
static int cpu_alloc(zs_dev_t *d, int space, int cat, size_t bytes, void **out, zs_err_t *err)
{
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)d;
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_alloc: out is NULL");
    *out = NULL;
    if (space < 0 || space >= ZS_NSPACES)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_alloc: memory space %d is not one of 0..%d",
                          space, ZS_NSPACES - 1);
    if (cat < 0 || cat >= ZS_MEM_NCATS)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_dev_alloc: memory category %d is not one of 0..%d", cat,
                          ZS_MEM_NCATS - 1);
    if (bytes > SIZE_MAX - HDR_BYTES)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_alloc: %zu bytes of %s memory (%s) overflow",
                          bytes, zs_space_name(space), zs_memcat_name(cat));
    if (bytes > dev->ram)
        return zs_err_set(err, ZS_ERR_NOMEM,
                          "zs_dev_alloc: %zu bytes of %s memory for %s exceed the machine's %llu "
                          "bytes of RAM",
                          bytes, zs_space_name(space), zs_memcat_name(cat),
                          (unsigned long long)dev->ram);
    /* The limit: held + what other threads are allocating right now
     * (`reserved`) + this block, so two concurrent allocations cannot both
     * pass the check. */
    int capped = dev->limit && space == ZS_SPACE_DEVICE;
    if (capped) {
        pthread_mutex_lock(&dev->mem_mu);
        uint64_t held = dev->mem.held[ZS_SPACE_DEVICE] + dev->reserved;
        if (held > dev->limit || bytes > dev->limit - held) {
            pthread_mutex_unlock(&dev->mem_mu);
            return zs_err_set(err, ZS_ERR_NOMEM,
                              "cpu: out of device memory for %zu bytes (%s): %llu bytes (%.2f GiB) "
                              "held by zeroshard, the device memory limit is %llu bytes (%.2f "
                              "GiB) (hint: smaller micro-batch, higher ZeRO stage or offload)",
                              bytes, zs_memcat_name(cat), (unsigned long long)held,
                              held / 1073741824.0, (unsigned long long)dev->limit,
                              dev->limit / 1073741824.0);
        }
        dev->reserved += bytes;
        pthread_mutex_unlock(&dev->mem_mu);
    }
    void *raw = NULL;
    int rc = posix_memalign(&raw, 64, HDR_BYTES + bytes);
    if (rc != 0 || !raw) {
        if (capped) {
            pthread_mutex_lock(&dev->mem_mu);
            dev->reserved -= bytes;
            pthread_mutex_unlock(&dev->mem_mu);
        }
        return zs_err_set(
            err, ZS_ERR_NOMEM,
            "zs_dev_alloc: out of memory allocating %zu bytes of %s memory for %s (%s)", bytes,
            zs_space_name(space), zs_memcat_name(cat), strerror(rc));
    }
    blk_hdr_t *h = raw;
    h->magic = MAGIC_LIVE;
    h->bytes = bytes;
    h->dev = dev;
    h->space = space;
    h->cat = cat;
    pthread_mutex_lock(&dev->mem_mu);
    if (capped)
        dev->reserved -= bytes;
    mem_add(&dev->mem, space, cat, bytes);
    dev->mem.nallocs++;
    pthread_mutex_unlock(&dev->mem_mu);
    *out = (char *)raw + HDR_BYTES;
    return ZS_OK;
}

/* See zs_dev_free. A pointer this device did not allocate (or freed twice)
 * is logged and left alone: free cannot return an error. */
static void cpu_free(zs_dev_t *d, void *p)
{
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)d;
    if (!p)
        return;
    blk_hdr_t *h = (blk_hdr_t *)((char *)p - HDR_BYTES);
    if (h->magic != MAGIC_LIVE || h->dev != dev) {
        ZS_ERROR("zs_dev_free: %p was not allocated by device \"%s\" or was freed twice; ignored",
                 p, d->desc);
        return;
    }
    pthread_mutex_lock(&dev->mem_mu);
    dev->mem.cur[h->space][h->cat] -= h->bytes;
    dev->mem.held[h->space] -= h->bytes;
    pthread_mutex_unlock(&dev->mem_mu);
    h->magic = MAGIC_FREE;
    free(h);
}

/* See zs_dev_host_register (arguments checked there). Nothing to lock on
 * the CPU: the registration only counts the bytes, as pinned memory of
 * `cat`, and remembers them for unregister. ZS_ERR_INVALID for a range
 * overlapping a registered one. */
static int cpu_host_register(zs_dev_t *d, void *p, size_t bytes, int cat, zs_err_t *err)
{
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)d;
    zs_cpu_reg_t *r = malloc(sizeof *r);
    if (!r)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_host_register: out of memory");
    *r = (zs_cpu_reg_t){p, bytes, cat, NULL};
    pthread_mutex_lock(&dev->mem_mu);
    for (zs_cpu_reg_t *o = dev->regs; o; o = o->next)
        if (r->p < o->p + o->bytes && o->p < r->p + bytes) {
            pthread_mutex_unlock(&dev->mem_mu);
            free(r);
            return zs_err_set(err, ZS_ERR_INVALID,
                              "zs_dev_host_register: [%p, +%zu) overlaps registered [%p, +%zu)", p,
                              bytes, (void *)o->p, o->bytes);
        }
    r->next = dev->regs;
    dev->regs = r;
    mem_add(&dev->mem, ZS_SPACE_PINNED, cat, bytes);
    pthread_mutex_unlock(&dev->mem_mu);
    return ZS_OK;
}

/* See zs_dev_host_unregister: the bytes leave the counts. */
static void cpu_host_unregister(zs_dev_t *d, void *p)
{
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)d;
    pthread_mutex_lock(&dev->mem_mu);
    zs_cpu_reg_t **pp = &dev->regs;
    while (*pp && (*pp)->p != p)
        pp = &(*pp)->next;
    zs_cpu_reg_t *r = *pp;
    if (r) {
        *pp = r->next;
        dev->mem.cur[ZS_SPACE_PINNED][r->cat] -= r->bytes;
        dev->mem.held[ZS_SPACE_PINNED] -= r->bytes;
    }
    pthread_mutex_unlock(&dev->mem_mu);
    if (!r)
        ZS_ERROR("zs_dev_host_unregister: %p is not registered with device \"%s\"; ignored", p,
                 d->desc);
    free(r);
}

static void cpu_mem(zs_dev_t *d, zs_dev_mem_t *out)
{
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)d;
    pthread_mutex_lock(&dev->mem_mu);
    *out = dev->mem;
    pthread_mutex_unlock(&dev->mem_mu);
}

static void cpu_mem_reset_peak(zs_dev_t *d)
{
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)d;
    pthread_mutex_lock(&dev->mem_mu);
    memcpy(dev->mem.peak, dev->mem.cur, sizeof dev->mem.peak);
    memcpy(dev->mem.held_peak, dev->mem.held, sizeof dev->mem.held_peak);
    pthread_mutex_unlock(&dev->mem_mu);
}

/* ---- events: one node per record ---------------------------------------- */

typedef struct zs_cpu_rec {
    int refs;     /* the event's `last` and each task or waiter holding it */
    int done;     /* the recording stream reached it */
    zs_err_t err; /* that stream's sticky error at that point */
} zs_cpu_rec_t;

typedef struct cpu_event {
    zs_event_t base;
    zs_cpu_rec_t *last; /* NULL: never recorded */
} cpu_event_t;

/* Drop one reference; caller holds ev_mu. */
static void rec_release(zs_cpu_rec_t *r)
{
    if (r && --r->refs == 0)
        free(r);
}

/* ---- tasks and streams ------------------------------------------------------- */

typedef struct cpu_stream {
    zs_stream_t base;
    zs_cpu_dev_t *dev;
    char name[32];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;        /* a task was queued, or stop */
    pthread_cond_t idle;        /* `done` advanced */
    zs_cpu_task_t *head, *tail; /* under mu */
    uint64_t enqueued, done;    /* tasks queued / finished so far, under mu */
    int stop;                   /* under mu: destroy asked the thread to drain and exit */
    zs_err_t err;               /* sticky error, under mu; code 0 = none */
} cpu_stream_t;

/* Run one task on stream s's thread. `failed`: the stream already has a
 * sticky error (work is skipped; records and waits still happen);
 * `snap` is that error. Returns ZS_OK or the error (filled into *e). */
static int task_run(cpu_stream_t *s, zs_cpu_task_t *t, int failed, const zs_err_t *snap,
                    zs_err_t *e)
{
    zs_cpu_dev_t *dev = s->dev;
    int rc = ZS_OK;
    if (t->kind == ZS_CPU_T_RECORD || t->kind == ZS_CPU_T_WAIT) {
        zs_cpu_rec_t *r = t->u.rec;
        pthread_mutex_lock(&dev->ev_mu);
        if (t->kind == ZS_CPU_T_RECORD) {
            if (failed)
                r->err = *snap;
            r->done = 1;
            pthread_cond_broadcast(&dev->ev_cv);
        } else {
            while (!r->done)
                pthread_cond_wait(&dev->ev_cv, &dev->ev_mu);
            if (r->err.code != ZS_OK && !failed)
                rc = zs_err_set(e, r->err.code, "stream \"%s\" waited on a failed event: %s",
                                s->name, r->err.msg);
        }
        rec_release(r);
        pthread_mutex_unlock(&dev->ev_mu);
        return rc;
    }
    if (failed)
        return ZS_OK;
    switch (t->kind) {
    case ZS_CPU_T_HOST:
        rc = t->u.host.fn(t->args, e);
        if (rc != ZS_OK) {
            if (e->code == ZS_OK)
                zs_err_set(e, rc, "host function failed with %s and no message",
                           zs_status_name(rc));
            e->code = rc;
            zs_err_prefix(e, "stream \"%s\": ", s->name);
        }
        break;
    case ZS_CPU_T_MEMCPY:
        memcpy(t->u.copy.dst, t->u.copy.src, t->u.copy.bytes);
        break;
    case ZS_CPU_T_MEMSET:
        memset(t->u.set.dst, t->u.set.byte, t->u.set.bytes);
        break;
    default:
        zs__cpu_vec_exec(dev, t);
        break;
    }
    return rc;
}

static void *stream_main(void *arg)
{
    cpu_stream_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->work, &s->mu);
        zs_cpu_task_t *t = s->head;
        if (!t)
            break; /* stop and drained */
        s->head = t->next;
        if (!s->head)
            s->tail = NULL;
        int failed = s->err.code != ZS_OK;
        zs_err_t snap;
        if (failed && t->kind == ZS_CPU_T_RECORD)
            snap = s->err;
        pthread_mutex_unlock(&s->mu);

        zs_err_t e;
        zs_err_clear(&e);
        int rc = task_run(s, t, failed, &snap, &e);
        free(t);

        pthread_mutex_lock(&s->mu);
        if (rc != ZS_OK && s->err.code == ZS_OK)
            s->err = e;
        s->done++;
        pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* See zs_dev_cpu_internal.h. */
zs_cpu_task_t *zs__cpu_task_new(int kind, size_t extra, zs_err_t *err)
{
    zs_cpu_task_t *t = calloc(1, sizeof *t + extra);
    if (!t) {
        zs_err_set(err, ZS_ERR_NOMEM, "zs_dev: out of memory queueing a task");
        return NULL;
    }
    t->kind = kind;
    return t;
}

/* See zs_dev_cpu_internal.h. */
int zs__cpu_enqueue(zs_stream_t *sb, zs_cpu_task_t *t, zs_err_t *err)
{
    cpu_stream_t *s = (cpu_stream_t *)sb;
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        free(t);
        return zs_err_set(err, ZS_ERR_STATE, "stream \"%s\" is being destroyed", s->name);
    }
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    s->enqueued++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return ZS_OK;
}

static int cpu_stream_create(zs_dev_t *d, int high_priority, const char *name, zs_stream_t **out,
                             zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_stream_create: out is NULL");
    *out = NULL;
    cpu_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_stream_create: out of memory");
    s->base.dev = d;
    s->dev = (zs_cpu_dev_t *)d;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "stream");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    int rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->idle);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return zs_err_set(err, ZS_ERR_IO,
                          "zs_dev_stream_create: pthread_create for stream \"%s\": %s",
                          name ? name : "stream", strerror(rc));
    }
    char tname[16];
    snprintf(tname, sizeof tname, "zs-%s%.11s", high_priority ? "!" : "", s->name);
    pthread_setname_np(s->thread, tname); /* best effort: names are for debuggers */
    *out = &s->base;
    return ZS_OK;
}

/* Drain the queue (the work runs), join the thread, free. Must not be
 * called from a task on the same stream. */
static void cpu_stream_destroy(zs_stream_t *base)
{
    cpu_stream_t *s = (cpu_stream_t *)base;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    if (s->err.code != ZS_OK)
        ZS_WARN("stream \"%s\" destroyed with an unreported error: %s", s->name, s->err.msg);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int cpu_stream_sync(zs_stream_t *base, zs_err_t *err)
{
    cpu_stream_t *s = (cpu_stream_t *)base;
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->enqueued;
    while (s->done < target)
        pthread_cond_wait(&s->idle, &s->mu);
    int rc = s->err.code;
    if (rc != ZS_OK) {
        if (err)
            *err = s->err;
        zs_err_clear(&s->err);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int cpu_event_create(zs_dev_t *d, zs_event_t **out, zs_err_t *err)
{
    cpu_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_event_create: out of memory");
    e->base.dev = d;
    *out = &e->base;
    return ZS_OK;
}

/* Records still queued keep their node alive; only the event goes. */
static void cpu_event_destroy(zs_event_t *base)
{
    cpu_event_t *e = (cpu_event_t *)base;
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)base->dev;
    pthread_mutex_lock(&dev->ev_mu);
    rec_release(e->last);
    pthread_mutex_unlock(&dev->ev_mu);
    free(e);
}

static int cpu_event_record(zs_event_t *base, zs_stream_t *sb, zs_err_t *err)
{
    cpu_event_t *e = (cpu_event_t *)base;
    cpu_stream_t *s = (cpu_stream_t *)sb;
    zs_cpu_dev_t *dev = s->dev;
    zs_cpu_rec_t *r = calloc(1, sizeof *r);
    zs_cpu_task_t *t = zs__cpu_task_new(ZS_CPU_T_RECORD, 0, err);
    if (!r || !t) {
        free(r);
        free(t);
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_event_record: out of memory");
    }
    r->refs = 2; /* the event and the task */
    t->u.rec = r;
    /* Swap and queue under ev_mu so a concurrent stream_wait sees either the
     * old record or the new one already queued. */
    pthread_mutex_lock(&dev->ev_mu);
    int rc = zs__cpu_enqueue(&s->base, t, err);
    if (rc == ZS_OK) {
        rec_release(e->last);
        e->last = r;
    } else {
        free(r);
    }
    pthread_mutex_unlock(&dev->ev_mu);
    return rc;
}

static int cpu_stream_wait(zs_stream_t *sb, zs_event_t *base, zs_err_t *err)
{
    cpu_event_t *e = (cpu_event_t *)base;
    cpu_stream_t *s = (cpu_stream_t *)sb;
    zs_cpu_dev_t *dev = s->dev;
    zs_cpu_task_t *t = zs__cpu_task_new(ZS_CPU_T_WAIT, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    pthread_mutex_lock(&dev->ev_mu);
    zs_cpu_rec_t *r = e->last;
    if (!r || r->done) {
        /* Never recorded, or complete: nothing to wait for, but a failed
         * record still fails the stream, so only a clean one is skipped. */
        if (!r || r->err.code == ZS_OK) {
            pthread_mutex_unlock(&dev->ev_mu);
            free(t);
            return ZS_OK;
        }
    }
    r->refs++;
    t->u.rec = r;
    pthread_mutex_unlock(&dev->ev_mu);
    /* Queued outside ev_mu: r is already captured and the stream thread
     * needs ev_mu to complete records. */
    int rc = zs__cpu_enqueue(&s->base, t, err);
    if (rc != ZS_OK) {
        pthread_mutex_lock(&dev->ev_mu);
        rec_release(r);
        pthread_mutex_unlock(&dev->ev_mu);
    }
    return rc;
}

static int cpu_event_query(zs_event_t *base)
{
    cpu_event_t *e = (cpu_event_t *)base;
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)base->dev;
    pthread_mutex_lock(&dev->ev_mu);
    int done = !e->last || e->last->done;
    pthread_mutex_unlock(&dev->ev_mu);
    return done;
}

static int cpu_event_sync(zs_event_t *base, zs_err_t *err)
{
    cpu_event_t *e = (cpu_event_t *)base;
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)base->dev;
    pthread_mutex_lock(&dev->ev_mu);
    zs_cpu_rec_t *r = e->last;
    int rc = ZS_OK;
    if (r) {
        r->refs++;
        while (!r->done)
            pthread_cond_wait(&dev->ev_cv, &dev->ev_mu);
        rc = r->err.code;
        if (rc != ZS_OK && err)
            *err = r->err;
        rec_release(r);
    }
    pthread_mutex_unlock(&dev->ev_mu);
    return rc;
}

/* ---- enqueueing work ----------------------------------------------------------- */

static int cpu_memcpy(zs_stream_t *sb, void *dst, const void *src, size_t bytes, zs_err_t *err)
{
    if (bytes == 0)
        return ZS_OK;
    if (!dst || !src)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_memcpy: %s is NULL (%zu bytes)",
                          dst ? "src" : "dst", bytes);
    zs_cpu_task_t *t = zs__cpu_task_new(ZS_CPU_T_MEMCPY, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.copy.dst = dst;
    t->u.copy.src = src;
    t->u.copy.bytes = bytes;
    return zs__cpu_enqueue(sb, t, err);
}

static int cpu_memset(zs_stream_t *sb, void *dst, int byte, size_t bytes, zs_err_t *err)
{
    if (bytes == 0)
        return ZS_OK;
    if (!dst)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_memset: dst is NULL (%zu bytes)", bytes);
    zs_cpu_task_t *t = zs__cpu_task_new(ZS_CPU_T_MEMSET, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.set.dst = dst;
    t->u.set.byte = byte;
    t->u.set.bytes = bytes;
    return zs__cpu_enqueue(sb, t, err);
}

static int cpu_host_fn(zs_stream_t *sb, zs_host_fn_t fn, const void *args, size_t argbytes,
                       zs_err_t *err)
{
    if (!fn)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_host_fn: fn is NULL");
    if (argbytes > ZS_DEV_MAX_ARGS)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_dev_host_fn: %zu bytes of arguments, at most %d allowed", argbytes,
                          ZS_DEV_MAX_ARGS);
    if (argbytes && !args)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_host_fn: args is NULL (%zu bytes)",
                          argbytes);
    zs_cpu_task_t *t = zs__cpu_task_new(ZS_CPU_T_HOST, argbytes, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.host.fn = fn;
    if (argbytes)
        memcpy(t->args, args, argbytes);
    return zs__cpu_enqueue(sb, t, err);
}

/* ---- the device ------------------------------------------------------------------ */

/* Streams and events must be destroyed first; live allocations are logged
 * (they stay valid memory but are no longer counted). */
static void cpu_destroy(zs_dev_t *d)
{
    zs_cpu_dev_t *dev = (zs_cpu_dev_t *)d;
    uint64_t live = 0;
    for (int s = 0; s < ZS_NSPACES; s++)
        live += dev->mem.held[s];
    if (live)
        ZS_WARN("zs_dev_destroy: device \"%s\" still has %llu bytes allocated or registered",
                d->desc, (unsigned long long)live);
    while (dev->regs) {
        zs_cpu_reg_t *r = dev->regs;
        dev->regs = r->next;
        free(r);
    }
    zs_pool_destroy(dev->pool);
    pthread_cond_destroy(&dev->ev_cv);
    pthread_mutex_destroy(&dev->ev_mu);
    pthread_mutex_destroy(&dev->mem_mu);
    free(dev);
}

static const zs_dev_vtable_t cpu_vt = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .mem = cpu_mem,
    .mem_reset_peak = cpu_mem_reset_peak,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    .memcpy_async = cpu_memcpy,
    .memset_async = cpu_memset,
    .host_fn = cpu_host_fn,
    .cast = zs__cpu_cast,
    .round = zs__cpu_round,
    .cast_rows = zs__cpu_cast_rows,
    .accumulate = zs__cpu_accumulate,
    .scale = zs__cpu_scale,
    .sumsq = zs__cpu_sumsq,
    .adamw = zs__cpu_adamw,
    .destroy = cpu_destroy,
    .host_register = cpu_host_register,
    .host_unregister = cpu_host_unregister,
};

#define MAX_THREADS 4096

int zs_dev_cpu_create(int threads, zs_dev_t **out, zs_err_t *err)
{
    zs_dev_cpu_opts_t o = {threads, 0};
    return zs_dev_cpu_create_opts(&o, out, err);
}

/* See zs_dev.h. */
int zs_dev_cpu_create_opts(const zs_dev_cpu_opts_t *o, zs_dev_t **out, zs_err_t *err)
{
    if (!o)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_cpu_create: options are NULL");
    int threads = o->threads;
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_cpu_create: out is NULL");
    *out = NULL;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)(n < MAX_THREADS ? n : MAX_THREADS) : 1;
    }
    if (threads > MAX_THREADS)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_cpu_create: %d threads, at most %d", threads,
                          MAX_THREADS);
    zs_cpu_dev_t *dev = calloc(1, sizeof *dev);
    if (!dev)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_cpu_create: out of memory");
    dev->base.vt = &cpu_vt;
    dev->base.host_addressable = 1;
    dev->threads = threads;
    dev->limit = o->device_limit;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    dev->ram = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
    if (threads > 1) {
        dev->pool = zs_pool_create(threads);
        if (!dev->pool) {
            free(dev);
            return zs_err_set(err, ZS_ERR_NOMEM,
                              "zs_dev_cpu_create: could not start a pool of %d threads", threads);
        }
    }
    pthread_mutex_init(&dev->mem_mu, NULL);
    pthread_mutex_init(&dev->ev_mu, NULL);
    pthread_cond_init(&dev->ev_cv, NULL);
    if (dev->limit)
        snprintf(dev->base.desc, sizeof dev->base.desc,
                 "cpu (%d thread%s, device memory limit %llu bytes)", threads,
                 threads == 1 ? "" : "s", (unsigned long long)dev->limit);
    else
        snprintf(dev->base.desc, sizeof dev->base.desc, "cpu (%d thread%s)", threads,
                 threads == 1 ? "" : "s");
    *out = &dev->base;
    return ZS_OK;
}
