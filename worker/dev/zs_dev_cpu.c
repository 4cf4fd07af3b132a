/*
 * zs_dev_cpu.c - the CPU device (zs_dev_cpu_create, see zs_dev.h).
 *
 * What it does:
 *   memory   posix_memalign(64) for all three spaces (all are RAM here). A
 *            64-byte header before each block keeps its size, space and
 *            category, so free needs only the pointer and the block stays
 *            64-byte aligned. Counters under one mutex; nothing is cached.
 *   streams  each stream owns a thread and a FIFO of tasks; the thread runs
 *            them in enqueue order, different streams run concurrently.
 *   events   each record is a refcounted node (done flag + the error the
 *            recording stream had at that point); the event points at its
 *            last node. A wait captures that node at call time, so
 *            re-recording never changes what an earlier wait waits for, and
 *            records completing out of order on different streams are right.
 *            Nodes are under one device-wide mutex and condition variable.
 *   vector   cast, accumulate, scale and AdamW are elementwise: split in
 *            fixed chunks over a zs_pool (bitwise identical to one thread).
 *            sumsq is one sequential loop so its fp64 sum never depends on
 *            the thread count.
 * What it does not do: timing, priorities (high_priority only names the
 * thread), detect use of freed memory by queued work (the caller orders frees
 * after the work with events, as on CUDA).
 */
#define _GNU_SOURCE
#include "zs_dev.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs_cast.h"
#include "zs_log.h"
#include "zs_pool.h"

/* ---- device -------------------------------------------------------------- */

typedef struct cpu_dev {
    zs_dev_t base;
    int threads;
    zs_pool_t *pool; /* NULL when threads == 1: vector ops run on the stream thread */
    pthread_mutex_t mem_mu;
    zs_dev_mem_t mem;      /* under mem_mu */
    pthread_mutex_t ev_mu; /* every rec_t and every cpu_event_t.last */
    pthread_cond_t ev_cv;  /* broadcast when a record completes */
} cpu_dev_t;

/* ---- memory ---------------------------------------------------------------- */

#define HDR_BYTES  64 /* header before each block; keeps the block 64-aligned */
#define MAGIC_LIVE 0x7a73646576616c6cULL
#define MAGIC_FREE 0x7a73646576667265ULL

typedef struct blk_hdr {
    uint64_t magic;
    uint64_t bytes;
    cpu_dev_t *dev;
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

/* See zs_dev_alloc. Errors: ZS_ERR_INVALID (space, category, out), ZS_ERR_NOMEM. */
static int cpu_alloc(zs_dev_t *d, int space, int cat, size_t bytes, void **out, zs_err_t *err)
{
    cpu_dev_t *dev = (cpu_dev_t *)d;
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
    void *raw = NULL;
    int rc = posix_memalign(&raw, 64, HDR_BYTES + bytes);
    if (rc != 0 || !raw)
        return zs_err_set(
            err, ZS_ERR_NOMEM,
            "zs_dev_alloc: out of memory allocating %zu bytes of %s memory for %s (%s)", bytes,
            zs_space_name(space), zs_memcat_name(cat), strerror(rc));
    blk_hdr_t *h = raw;
    h->magic = MAGIC_LIVE;
    h->bytes = bytes;
    h->dev = dev;
    h->space = space;
    h->cat = cat;
    pthread_mutex_lock(&dev->mem_mu);
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
    cpu_dev_t *dev = (cpu_dev_t *)d;
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

static void cpu_mem(zs_dev_t *d, zs_dev_mem_t *out)
{
    cpu_dev_t *dev = (cpu_dev_t *)d;
    pthread_mutex_lock(&dev->mem_mu);
    *out = dev->mem;
    pthread_mutex_unlock(&dev->mem_mu);
}

static void cpu_mem_reset_peak(zs_dev_t *d)
{
    cpu_dev_t *dev = (cpu_dev_t *)d;
    pthread_mutex_lock(&dev->mem_mu);
    memcpy(dev->mem.peak, dev->mem.cur, sizeof dev->mem.peak);
    memcpy(dev->mem.held_peak, dev->mem.held, sizeof dev->mem.held_peak);
    pthread_mutex_unlock(&dev->mem_mu);
}

/* ---- events: one node per record ---------------------------------------- */

typedef struct rec {
    int refs;     /* the event's `last` and each task or waiter holding it */
    int done;     /* the recording stream reached it */
    zs_err_t err; /* that stream's sticky error at that point */
} rec_t;

typedef struct cpu_event {
    zs_event_t base;
    rec_t *last; /* NULL: never recorded */
} cpu_event_t;

/* Drop one reference; caller holds ev_mu. */
static void rec_release(rec_t *r)
{
    if (r && --r->refs == 0)
        free(r);
}

/* ---- tasks and streams ------------------------------------------------------- */

enum {
    T_HOST,
    T_MEMCPY,
    T_MEMSET,
    T_RECORD,
    T_WAIT,
    T_CAST,
    T_ACC,
    T_SCALE,
    T_SUMSQ,
    T_ADAMW,
};

typedef struct task {
    struct task *next;
    int kind;
    union {
        struct {
            zs_host_fn_t fn;
        } host;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } copy;
        struct {
            void *dst;
            int byte;
            size_t bytes;
        } set;
        rec_t *rec; /* T_RECORD, T_WAIT: one reference owned by the task */
        struct {
            void *dst;
            const void *src;
            zs_dtype_t ddt, sdt;
            float alpha; /* T_SCALE: dst is x, src unused */
            size_t n;
            double *acc; /* T_SUMSQ: src is x */
        } vec;
        struct {
            zs_adam_hparams_t hp;
            zs_adam_step_t st;
            float *p, *m, *v;
            const void *grad;
            zs_dtype_t gdt, odt;
            void *out;
            size_t n;
        } adam;
    } u;
    _Alignas(16) unsigned char args[]; /* T_HOST: the copied arguments */
} task_t;

typedef struct cpu_stream {
    zs_stream_t base;
    cpu_dev_t *dev;
    char name[32];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;     /* a task was queued, or stop */
    pthread_cond_t idle;     /* `done` advanced */
    task_t *head, *tail;     /* under mu */
    uint64_t enqueued, done; /* tasks queued / finished so far, under mu */
    int stop;                /* under mu: destroy asked the thread to drain and exit */
    zs_err_t err;            /* sticky error, under mu; code 0 = none */
} cpu_stream_t;

/* Vector ops run [i0, i1) of a task on one thread; elementwise ops split a
 * task into chunks of VEC_CHUNK elements (a multiple of BLK) over the pool. */
#define VEC_CHUNK ((size_t)32768)
#define BLK       256 /* elements converted at a time through stack buffers */

static void vec_range(const task_t *t, size_t i0, size_t i1)
{
    size_t n = i1 - i0;
    switch (t->kind) {
    case T_CAST: {
        size_t ds = zs_dtype_size(t->u.vec.ddt), ss = zs_dtype_size(t->u.vec.sdt);
        zs_cast((char *)t->u.vec.dst + i0 * ds, t->u.vec.ddt, (const char *)t->u.vec.src + i0 * ss,
                t->u.vec.sdt, n);
        break;
    }
    case T_ACC: {
        zs_dtype_t ddt = t->u.vec.ddt, sdt = t->u.vec.sdt;
        char *dst = (char *)t->u.vec.dst + i0 * zs_dtype_size(ddt);
        const char *src = (const char *)t->u.vec.src + i0 * zs_dtype_size(sdt);
        if (ddt == ZS_DTYPE_F32 && sdt == ZS_DTYPE_F32) {
            float *d = (float *)dst;
            const float *s = (const float *)src;
            for (size_t i = 0; i < n; i++)
                d[i] += s[i];
            break;
        }
        float a[BLK], b[BLK];
        for (size_t k = 0; k < n; k += BLK) {
            size_t m = n - k < BLK ? n - k : BLK;
            float *pa = ddt == ZS_DTYPE_F32 ? (float *)dst + k : a;
            const float *pb = b;
            if (ddt != ZS_DTYPE_F32)
                zs_cast(a, ZS_DTYPE_F32, dst + k * 2, ddt, m);
            if (sdt == ZS_DTYPE_F32)
                pb = (const float *)src + k;
            else
                zs_cast(b, ZS_DTYPE_F32, src + k * 2, sdt, m);
            for (size_t i = 0; i < m; i++)
                pa[i] += pb[i];
            if (ddt != ZS_DTYPE_F32)
                zs_cast(dst + k * 2, ddt, a, ZS_DTYPE_F32, m);
        }
        break;
    }
    case T_SCALE: {
        zs_dtype_t dt = t->u.vec.ddt;
        float alpha = t->u.vec.alpha;
        char *x = (char *)t->u.vec.dst + i0 * zs_dtype_size(dt);
        if (dt == ZS_DTYPE_F32) {
            float *f = (float *)x;
            for (size_t i = 0; i < n; i++)
                f[i] *= alpha;
            break;
        }
        float a[BLK];
        for (size_t k = 0; k < n; k += BLK) {
            size_t m = n - k < BLK ? n - k : BLK;
            zs_cast(a, ZS_DTYPE_F32, x + k * 2, dt, m);
            for (size_t i = 0; i < m; i++)
                a[i] *= alpha;
            zs_cast(x + k * 2, dt, a, ZS_DTYPE_F32, m);
        }
        break;
    }
    case T_ADAMW: {
        size_t gs = zs_dtype_size(t->u.adam.gdt), os = zs_dtype_size(t->u.adam.odt);
        void *out = t->u.adam.out ? (char *)t->u.adam.out + i0 * os : NULL;
        zs_adam_update(&t->u.adam.hp, &t->u.adam.st, t->u.adam.p + i0, t->u.adam.m + i0,
                       t->u.adam.v + i0, (const char *)t->u.adam.grad + i0 * gs, t->u.adam.gdt, out,
                       out ? t->u.adam.odt : ZS_DTYPE_NONE, n);
        break;
    }
    }
}

typedef struct vjob {
    const task_t *t;
    size_t n;
} vjob_t;

static void vjob_fn(void *arg, size_t chunk, int thread)
{
    const vjob_t *j = arg;
    size_t i0 = chunk * VEC_CHUNK;
    size_t i1 = j->n - i0 < VEC_CHUNK ? j->n : i0 + VEC_CHUNK;
    vec_range(j->t, i0, i1);
}

/* An elementwise op over all its n elements, chunked over the pool. */
static void vec_run(cpu_dev_t *dev, const task_t *t, size_t n)
{
    if (!dev->pool || n <= VEC_CHUNK) {
        vec_range(t, 0, n);
        return;
    }
    vjob_t j = {t, n};
    zs_pool_run(dev->pool, (n + VEC_CHUNK - 1) / VEC_CHUNK, vjob_fn, &j);
}

/* acc[0] += sum of x^2 in one sequential fp64 loop (x rounded to fp32 first,
 * as the reference). Every finite fp32 square is below 1.2e77 so a finite
 * sum of any practical length never overflows fp64: the sum is non-finite
 * exactly when some element is, which gives the flag without a second test
 * per element. */
static void sumsq_run(const task_t *t)
{
    size_t n = t->u.vec.n;
    zs_dtype_t dt = t->u.vec.sdt;
    double s = 0.0;
    if (dt == ZS_DTYPE_F32) {
        const float *x = t->u.vec.src;
        for (size_t i = 0; i < n; i++)
            s += (double)x[i] * x[i];
    } else {
        const char *x = t->u.vec.src;
        float a[BLK];
        for (size_t k = 0; k < n; k += BLK) {
            size_t m = n - k < BLK ? n - k : BLK;
            zs_cast(a, ZS_DTYPE_F32, x + k * 2, dt, m);
            for (size_t i = 0; i < m; i++)
                s += (double)a[i] * a[i];
        }
    }
    t->u.vec.acc[0] += s;
    if (!isfinite(s))
        t->u.vec.acc[1] = 1.0;
}

/* Run one task on stream s's thread. `failed`: the stream already has a
 * sticky error (work is skipped; records and waits still happen);
 * `snap` is that error. Returns ZS_OK or the error (filled into *e). */
static int task_run(cpu_stream_t *s, task_t *t, int failed, const zs_err_t *snap, zs_err_t *e)
{
    cpu_dev_t *dev = s->dev;
    int rc = ZS_OK;
    if (t->kind == T_RECORD || t->kind == T_WAIT) {
        rec_t *r = t->u.rec;
        pthread_mutex_lock(&dev->ev_mu);
        if (t->kind == T_RECORD) {
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
    case T_HOST:
        rc = t->u.host.fn(t->args, e);
        if (rc != ZS_OK) {
            if (e->code == ZS_OK)
                zs_err_set(e, rc, "host function failed with %s and no message",
                           zs_status_name(rc));
            e->code = rc;
            zs_err_prefix(e, "stream \"%s\": ", s->name);
        }
        break;
    case T_MEMCPY:
        memcpy(t->u.copy.dst, t->u.copy.src, t->u.copy.bytes);
        break;
    case T_MEMSET:
        memset(t->u.set.dst, t->u.set.byte, t->u.set.bytes);
        break;
    case T_SUMSQ:
        sumsq_run(t);
        break;
    case T_ADAMW:
        vec_run(dev, t, t->u.adam.n);
        break;
    default:
        vec_run(dev, t, t->u.vec.n);
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
        task_t *t = s->head;
        if (!t)
            break; /* stop and drained */
        s->head = t->next;
        if (!s->head)
            s->tail = NULL;
        int failed = s->err.code != ZS_OK;
        zs_err_t snap;
        if (failed && t->kind == T_RECORD)
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

/* A zeroed task with `extra` bytes of arguments, or NULL (error set). */
static task_t *task_new(int kind, size_t extra, zs_err_t *err)
{
    task_t *t = calloc(1, sizeof *t + extra);
    if (!t) {
        zs_err_set(err, ZS_ERR_NOMEM, "zs_dev: out of memory queueing a task");
        return NULL;
    }
    t->kind = kind;
    return t;
}

/* Append t to s's queue; takes ownership of t. */
static int enqueue(cpu_stream_t *s, task_t *t, zs_err_t *err)
{
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
    s->dev = (cpu_dev_t *)d;
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
    cpu_dev_t *dev = (cpu_dev_t *)base->dev;
    pthread_mutex_lock(&dev->ev_mu);
    rec_release(e->last);
    pthread_mutex_unlock(&dev->ev_mu);
    free(e);
}

static int cpu_event_record(zs_event_t *base, zs_stream_t *sb, zs_err_t *err)
{
    cpu_event_t *e = (cpu_event_t *)base;
    cpu_stream_t *s = (cpu_stream_t *)sb;
    cpu_dev_t *dev = s->dev;
    rec_t *r = calloc(1, sizeof *r);
    task_t *t = task_new(T_RECORD, 0, err);
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
    int rc = enqueue(s, t, err);
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
    cpu_dev_t *dev = s->dev;
    task_t *t = task_new(T_WAIT, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    pthread_mutex_lock(&dev->ev_mu);
    rec_t *r = e->last;
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
    int rc = enqueue(s, t, err);
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
    cpu_dev_t *dev = (cpu_dev_t *)base->dev;
    pthread_mutex_lock(&dev->ev_mu);
    int done = !e->last || e->last->done;
    pthread_mutex_unlock(&dev->ev_mu);
    return done;
}

static int cpu_event_sync(zs_event_t *base, zs_err_t *err)
{
    cpu_event_t *e = (cpu_event_t *)base;
    cpu_dev_t *dev = (cpu_dev_t *)base->dev;
    pthread_mutex_lock(&dev->ev_mu);
    rec_t *r = e->last;
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
    task_t *t = task_new(T_MEMCPY, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.copy.dst = dst;
    t->u.copy.src = src;
    t->u.copy.bytes = bytes;
    return enqueue((cpu_stream_t *)sb, t, err);
}

static int cpu_memset(zs_stream_t *sb, void *dst, int byte, size_t bytes, zs_err_t *err)
{
    if (bytes == 0)
        return ZS_OK;
    if (!dst)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_dev_memset: dst is NULL (%zu bytes)", bytes);
    task_t *t = task_new(T_MEMSET, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.set.dst = dst;
    t->u.set.byte = byte;
    t->u.set.bytes = bytes;
    return enqueue((cpu_stream_t *)sb, t, err);
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
    task_t *t = task_new(T_HOST, argbytes, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.host.fn = fn;
    if (argbytes)
        memcpy(t->args, args, argbytes);
    return enqueue((cpu_stream_t *)sb, t, err);
}

/* ZS_OK when dt is F32, BF16 or F16 (and, with allow_none, NONE). */
static int check_dtype(const char *fn, const char *what, int dt, int allow_none, zs_err_t *err)
{
    if (dt == ZS_DTYPE_F32 || dt == ZS_DTYPE_BF16 || dt == ZS_DTYPE_F16 ||
        (allow_none && dt == ZS_DTYPE_NONE))
        return ZS_OK;
    return zs_err_set(err, ZS_ERR_INVALID, "%s: %s dtype %d is not fp32, bf16 or fp16%s", fn, what,
                      dt, allow_none ? " or none" : "");
}

/* n elements of 4 bytes must fit in size_t (so every byte offset does). */
static int check_n(const char *fn, size_t n, zs_err_t *err)
{
    if (n > SIZE_MAX / 4)
        return zs_err_set(err, ZS_ERR_RANGE, "%s: %zu elements overflow the address space", fn, n);
    return ZS_OK;
}

static int cpu_cast(zs_stream_t *sb, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                    size_t n, zs_err_t *err)
{
    static const char fn[] = "zs_dev_cast";
    int rc;
    if ((rc = check_dtype(fn, "destination", ddt, 0, err)) ||
        (rc = check_dtype(fn, "source", sdt, 0, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (n == 0)
        return ZS_OK;
    if (!dst || !src)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", fn, dst ? "src" : "dst");
    uintptr_t d0 = (uintptr_t)dst, d1 = d0 + n * zs_dtype_size(ddt);
    uintptr_t s0 = (uintptr_t)src, s1 = s0 + n * zs_dtype_size(sdt);
    if (d0 < s1 && s0 < d1)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: dst and src overlap", fn);
    task_t *t = task_new(T_CAST, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.vec.dst = dst;
    t->u.vec.ddt = ddt;
    t->u.vec.src = src;
    t->u.vec.sdt = sdt;
    t->u.vec.n = n;
    return enqueue((cpu_stream_t *)sb, t, err);
}

static int cpu_accumulate(zs_stream_t *sb, void *dst, zs_dtype_t ddt, const void *src,
                          zs_dtype_t sdt, size_t n, zs_err_t *err)
{
    static const char fn[] = "zs_dev_accumulate";
    int rc;
    if ((rc = check_dtype(fn, "destination", ddt, 0, err)) ||
        (rc = check_dtype(fn, "source", sdt, 0, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (n == 0)
        return ZS_OK;
    if (!dst || !src)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", fn, dst ? "src" : "dst");
    task_t *t = task_new(T_ACC, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.vec.dst = dst;
    t->u.vec.ddt = ddt;
    t->u.vec.src = src;
    t->u.vec.sdt = sdt;
    t->u.vec.n = n;
    return enqueue((cpu_stream_t *)sb, t, err);
}

static int cpu_scale(zs_stream_t *sb, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err)
{
    static const char fn[] = "zs_dev_scale";
    int rc;
    if ((rc = check_dtype(fn, "x", dt, 0, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (n == 0)
        return ZS_OK;
    if (!x)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: x is NULL", fn);
    task_t *t = task_new(T_SCALE, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.vec.dst = x;
    t->u.vec.ddt = dt;
    t->u.vec.alpha = alpha;
    t->u.vec.n = n;
    return enqueue((cpu_stream_t *)sb, t, err);
}

static int cpu_sumsq(zs_stream_t *sb, const void *x, zs_dtype_t dt, size_t n, double *acc,
                     zs_err_t *err)
{
    static const char fn[] = "zs_dev_sumsq";
    int rc;
    if ((rc = check_dtype(fn, "x", dt, 0, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (!acc)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: acc is NULL", fn);
    if (n == 0)
        return ZS_OK;
    if (!x)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: x is NULL", fn);
    task_t *t = task_new(T_SUMSQ, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.vec.src = x;
    t->u.vec.sdt = dt;
    t->u.vec.acc = acc;
    t->u.vec.n = n;
    return enqueue((cpu_stream_t *)sb, t, err);
}

static int cpu_adamw(zs_stream_t *sb, const zs_adam_hparams_t *hp, const zs_adam_step_t *st,
                     float *p, float *m, float *v, const void *grad, zs_dtype_t gdt, void *out,
                     zs_dtype_t odt, size_t n, zs_err_t *err)
{
    static const char fn[] = "zs_dev_adamw";
    int rc;
    if (!hp || !st)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", fn, hp ? "step" : "hparams");
    if ((rc = check_dtype(fn, "gradient", gdt, 0, err)) ||
        (rc = check_dtype(fn, "output", odt, 1, err)) || (rc = check_n(fn, n, err)))
        return rc;
    if (n == 0)
        return ZS_OK;
    if (!p || !m || !v || !grad)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", fn,
                          !p   ? "p"
                          : !m ? "m"
                          : !v ? "v"
                               : "grad");
    task_t *t = task_new(T_ADAMW, 0, err);
    if (!t)
        return ZS_ERR_NOMEM;
    t->u.adam.hp = *hp; /* copied: the caller's structs may change before the task runs */
    t->u.adam.st = *st;
    t->u.adam.p = p;
    t->u.adam.m = m;
    t->u.adam.v = v;
    t->u.adam.grad = grad;
    t->u.adam.gdt = gdt;
    t->u.adam.out = odt == ZS_DTYPE_NONE ? NULL : out;
    t->u.adam.odt = out ? odt : ZS_DTYPE_NONE;
    t->u.adam.n = n;
    return enqueue((cpu_stream_t *)sb, t, err);
}

/* ---- the device ------------------------------------------------------------------ */

/* Streams and events must be destroyed first; live allocations are logged
 * (they stay valid memory but are no longer counted). */
static void cpu_destroy(zs_dev_t *d)
{
    cpu_dev_t *dev = (cpu_dev_t *)d;
    uint64_t live = 0;
    for (int s = 0; s < ZS_NSPACES; s++)
        live += dev->mem.held[s];
    if (live)
        ZS_WARN("zs_dev_destroy: device \"%s\" still has %llu bytes allocated", d->desc,
                (unsigned long long)live);
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
    .cast = cpu_cast,
    .accumulate = cpu_accumulate,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
    .destroy = cpu_destroy,
};

#define MAX_THREADS 4096

int zs_dev_cpu_create(int threads, zs_dev_t **out, zs_err_t *err)
{
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
    cpu_dev_t *dev = calloc(1, sizeof *dev);
    if (!dev)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_dev_cpu_create: out of memory");
    dev->base.vt = &cpu_vt;
    dev->threads = threads;
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
    snprintf(dev->base.desc, sizeof dev->base.desc, "cpu (%d thread%s)", threads,
             threads == 1 ? "" : "s");
    *out = &dev->base;
    return ZS_OK;
}
