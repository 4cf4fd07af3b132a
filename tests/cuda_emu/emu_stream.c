/*
 * emu_stream.c - streams, events, host functions and stream-ordered work
 * for the CUDA emulator (tests/cuda_emu/).
 *
 * Each stream has one executor thread that runs its work items in order;
 * streams run concurrently with each other. An item may depend on items of
 * other streams (an event wait, the legacy default stream's implicit
 * synchronisation) and runs only once those completed. Host functions of
 * all streams run on ONE host-function thread, one at a time.
 *
 * Does not: events (emu_event.c), copy or allocate memory (emu_mem.c,
 * emu_copy.c), run kernels (emu_launch.cpp, emu_fiber.cpp), emulate graphs, stream capture
 * or stream priorities (priorities are recorded only).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu_core.h"

#define STREAM_MAGIC 0x5a537472u

typedef struct work {
    struct work *next;
    uint64_t seq;
    int flags, extra_dev;
    zs_emu_work_fn fn;
    void *arg;
    void (*free_arg)(void *);
    int ndeps;
    zs_emu_dep deps[];
} work;

enum { KIND_CREATED, KIND_LEGACY, KIND_PER_THREAD };

struct zs_emu_stream {
    uint32_t magic;
    int device, kind, destroyed, priority;
    unsigned flags;
    /* Items get seq 1, 2, ...; done_seq is the last completed one. Never
     * reset, also when a destroyed stream's struct is reused, so an old
     * (stream, seq) dependency stays satisfied. */
    uint64_t enq_seq, done_seq;
    work *head, *tail;
    int thread_running;
    zs_emu_stream *next_all;
};

typedef struct hostfn_req {
    struct hostfn_req *next;
    zs_emu_work_fn fn;
    void *arg;
    int done;
} hostfn_req;

/* One lock and one condition for all stream state: simple, and the
 * emulator's throughput is bounded by the fibers, not by this. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static zs_emu_stream *g_streams; /* all streams ever made; never freed */
static zs_emu_stream *g_legacy[ZS_EMU_MAX_DEVICES];
static _Thread_local zs_emu_stream *t_per_thread[ZS_EMU_MAX_DEVICES];
static hostfn_req *g_hf_head, *g_hf_tail;
static int g_hf_running;
static int g_hf_busy; /* a host function is running now */

/* g_lock held. */
static zs_emu_stream *stream_new(int device, int kind, unsigned flags, int priority)
{
    zs_emu_stream *st = NULL;
    for (zs_emu_stream *s = g_streams; s; s = s->next_all)
        if (s->destroyed && !s->head && !s->thread_running) {
            st = s;
            break;
        }
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st)
            zs_emu_fatal("stream", "out of host memory");
        st->next_all = g_streams;
        g_streams = st;
    }
    st->magic = STREAM_MAGIC;
    st->device = device;
    st->kind = kind;
    st->flags = flags;
    st->priority = priority;
    st->destroyed = 0;
    return st;
}

zs_emu_stream *zs_emu_stream_get(cudaStream_t s)
{
    int dev = zs_emu_current_device();
    zs_emu_stream *r = NULL;
    pthread_mutex_lock(&g_lock);
    if (s == NULL || s == cudaStreamLegacy) {
        /* CUDA Runtime API, 3. Stream synchronization behavior: the NULL
         * handle is the legacy default stream unless the per-thread
         * default stream is compiled in (it is not, here). */
        if (!g_legacy[dev])
            g_legacy[dev] = stream_new(dev, KIND_LEGACY, cudaStreamDefault, 0);
        r = g_legacy[dev];
    } else if (s == cudaStreamPerThread) {
        /* Same section: the per-thread default stream is not a
         * non-blocking stream and synchronises with the legacy default
         * stream. One per host thread and device. */
        if (!t_per_thread[dev])
            t_per_thread[dev] = stream_new(dev, KIND_PER_THREAD, cudaStreamDefault, 0);
        r = t_per_thread[dev];
    } else {
        for (zs_emu_stream *x = g_streams; x; x = x->next_all)
            if (x == (zs_emu_stream *)s && x->magic == STREAM_MAGIC && !x->destroyed &&
                x->kind == KIND_CREATED)
                r = x;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

int zs_emu_stream_device(zs_emu_stream *st)
{
    return st->device;
}

static int deps_done(const work *w)
{
    for (int i = 0; i < w->ndeps; i++)
        if (w->deps[i].st->done_seq < w->deps[i].seq)
            return 0;
    return 1;
}

static void *hostfn_thread(void *unused)
{
    (void)unused;
    zs_emu_set_role(ZS_EMU_ROLE_HOSTFN);
    pthread_mutex_lock(&g_lock);
    for (;;) {
        while (!g_hf_head)
            pthread_cond_wait(&g_cond, &g_lock);
        hostfn_req *r = g_hf_head;
        g_hf_head = r->next;
        if (!g_hf_head)
            g_hf_tail = NULL;
        g_hf_busy = 1;
        pthread_mutex_unlock(&g_lock);
        r->fn(r->arg);
        pthread_mutex_lock(&g_lock);
        g_hf_busy = 0;
        r->done = 1;
        pthread_cond_broadcast(&g_cond);
    }
    return NULL;
}

/* Run a host function on the single host-function thread and wait for it.
 * CUDA Runtime API, 6.5 Stream Management, cudaLaunchHostFunc: "Host
 * functions without a mandated order (such as in independent streams)
 * execute in undefined order and may be serialized." Hostile reading: all
 * of them are serialised on one thread, so a host function that waits for
 * another stream's host function deadlocks here as it may on a GPU. */
static void run_hostfn(zs_emu_work_fn fn, void *arg)
{
    hostfn_req r = {NULL, fn, arg, 0};
    pthread_mutex_lock(&g_lock);
    if (!g_hf_running) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, hostfn_thread, NULL))
            zs_emu_fatal("cudaLaunchHostFunc", "cannot start the host-function thread");
        pthread_attr_destroy(&a);
        g_hf_running = 1;
    }
    if (g_hf_tail)
        g_hf_tail->next = &r;
    else
        g_hf_head = &r;
    g_hf_tail = &r;
    pthread_cond_broadcast(&g_cond);
    while (!r.done)
        pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
}

/* What a real GPU does (measured on an H100, driver 580, 2026-11-25:
 * bench/gpu/h100-2026-11-25-probe.txt): a kernel launch, cudaFree and
 * cudaFreeHost on the calling thread wait until the host function running
 * on CUDA's callback thread returns, whichever stream it belongs to. The
 * documentation allows it ("Any CUDA API call may block or synchronize for
 * various reasons", CUDA Driver API, 2. API synchronization behavior), and a
 * host function that waits for the thread that launches deadlocks there:
 * our test_dev_cuda did on the H100. The emulator does the same. */
void zs_emu_hostfn_wait_idle(void)
{
    pthread_mutex_lock(&g_lock);
    while (g_hf_busy)
        pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
}

static void *executor(void *p)
{
    zs_emu_stream *st = p;
    zs_emu_set_role(ZS_EMU_ROLE_EXECUTOR);
#if ZS_EMU_PROTECT
    /* The SIGSEGV diagnostic must run when a kernel thread overflows its
     * fiber stack: give it a stack of its own. (ASan sets up its own.) */
    stack_t ss = {.ss_sp = malloc(64 << 10), .ss_size = 64 << 10, .ss_flags = 0};
    if (ss.ss_sp)
        sigaltstack(&ss, NULL);
#endif
    /* held: this executor holds its device's memory window open. It stays
     * open across back-to-back ready work (the device is busy; each
     * open/close is an mprotect of every allocation), and closes as soon as
     * the stream goes idle, waits on another stream, or reaches a host
     * function, so host code is caught again. */
    int held = 0;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        work *w = st->head;
        int ready = w && deps_done(w);
        if (held && !(ready && !(w->flags & ZS_EMU_WORK_HOSTFN))) {
            pthread_mutex_unlock(&g_lock);
            zs_emu_window_close(st->device);
            held = 0;
            pthread_mutex_lock(&g_lock);
            continue;
        }
        if (!w && st->destroyed)
            break;
        if (!ready) {
            pthread_cond_wait(&g_cond, &g_lock);
            continue;
        }
        pthread_mutex_unlock(&g_lock);
        if (w->fn) {
            if (w->flags & ZS_EMU_WORK_HOSTFN) {
                run_hostfn(w->fn, w->arg);
            } else if (zs_emu_sticky(st->device) == cudaSuccess) {
                /* A corrupted context runs no further work (CUDA C++
                 * Programming Guide, Error Checking: sticky errors). */
                int dv = (w->flags & ZS_EMU_WORK_DEVICE) != 0;
                if (dv && !held) {
                    zs_emu_window_open(st->device);
                    held = 1;
                }
                if (dv && w->extra_dev >= 0 && w->extra_dev != st->device)
                    zs_emu_window_open(w->extra_dev);
                cudaError_t e = w->fn(w->arg);
                if (dv && w->extra_dev >= 0 && w->extra_dev != st->device)
                    zs_emu_window_close(w->extra_dev);
                zs_emu_set_sticky(st->device, e);
            }
        }
        if (w->free_arg)
            w->free_arg(w->arg);
        pthread_mutex_lock(&g_lock);
        /* Close the window before the item counts as done: a host thread
         * synchronising on it must find the memory protected again. */
        work *nx = w->next;
        if (held && !(nx && deps_done(nx) && !(nx->flags & ZS_EMU_WORK_HOSTFN))) {
            pthread_mutex_unlock(&g_lock);
            zs_emu_window_close(st->device);
            held = 0;
            pthread_mutex_lock(&g_lock);
        }
        st->head = w->next;
        if (!st->head)
            st->tail = NULL;
        st->done_seq = w->seq;
        pthread_cond_broadcast(&g_cond);
        free(w);
    }
    st->thread_running = 0;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    zs_emu_kernel_thread_exit();
#if ZS_EMU_PROTECT
    stack_t off = {.ss_sp = NULL, .ss_size = 0, .ss_flags = SS_DISABLE};
    sigaltstack(&off, NULL);
    free(ss.ss_sp);
#endif
    return NULL;
}

/* g_lock held. */
static int has_pending(const zs_emu_stream *s)
{
    return s->enq_seq > s->done_seq;
}

void zs_emu_lock(void)
{
    pthread_mutex_lock(&g_lock);
}

void zs_emu_unlock(void)
{
    pthread_mutex_unlock(&g_lock);
}

uint64_t zs_emu_stream_done_seq(const zs_emu_stream *st)
{
    return st->done_seq;
}

/* on_seq (may be NULL) is called under g_lock with the item's seq before
 * the item can run: cudaEventRecord publishes the captured point there. */
uint64_t zs_emu_stream_push_ex(zs_emu_stream *st, int flags, int extra_dev, zs_emu_work_fn fn,
                               void *arg, void (*free_arg)(void *), const zs_emu_dep *extra,
                               void (*on_seq)(void *, uint64_t), void *on_seq_arg)
{
    if (zs_emu_sticky(st->device) != cudaSuccess) {
        if (free_arg)
            free_arg(arg);
        return 0;
    }
    pthread_mutex_lock(&g_lock);
    int n = 0;
    for (zs_emu_stream *s = g_streams; s; s = s->next_all)
        n++;
    work *w = calloc(1, sizeof *w + (size_t)(n + 1) * sizeof(zs_emu_dep));
    if (!w)
        zs_emu_fatal("stream", "out of host memory");
    /* CUDA Runtime API, 3. Stream synchronization behavior, "Legacy default
     * stream": work on the legacy stream waits for all prior work in every
     * blocking stream of the device, and work in a blocking stream waits for
     * prior work in the legacy stream. Streams created with
     * cudaStreamNonBlocking take no part. */
    zs_emu_stream *leg = g_legacy[st->device];
    if (st->kind == KIND_LEGACY) {
        for (zs_emu_stream *s = g_streams; s; s = s->next_all)
            if (s != st && s->device == st->device && !(s->flags & cudaStreamNonBlocking) &&
                has_pending(s))
                w->deps[w->ndeps++] = (zs_emu_dep){s, s->enq_seq};
    } else if (!(st->flags & cudaStreamNonBlocking) && leg && has_pending(leg)) {
        w->deps[w->ndeps++] = (zs_emu_dep){leg, leg->enq_seq};
    }
    if (extra && extra->st && extra->st != st)
        w->deps[w->ndeps++] = *extra;
    w->flags = flags;
    w->extra_dev = extra_dev;
    w->fn = fn;
    w->arg = arg;
    w->free_arg = free_arg;
    w->seq = ++st->enq_seq;
    if (on_seq)
        on_seq(on_seq_arg, w->seq);
    if (st->tail)
        st->tail->next = w;
    else
        st->head = w;
    st->tail = w;
    if (!st->thread_running) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        /* Executors run fibers' scheduler and library work: 8 MiB stack. */
        pthread_attr_setstacksize(&a, 8 << 20);
        if (pthread_create(&t, &a, executor, st))
            zs_emu_fatal("stream", "cannot start an executor thread");
        pthread_attr_destroy(&a);
        st->thread_running = 1;
    }
    pthread_cond_broadcast(&g_cond);
    uint64_t seq = w->seq;
    pthread_mutex_unlock(&g_lock);
    return seq;
}

static uint64_t push(zs_emu_stream *st, int flags, int extra_dev, zs_emu_work_fn fn, void *arg,
                     void (*free_arg)(void *), const zs_emu_dep *extra)
{
    return zs_emu_stream_push_ex(st, flags, extra_dev, fn, arg, free_arg, extra, NULL, NULL);
}

uint64_t zs_emu_stream_push(zs_emu_stream *st, int flags, int extra_dev, zs_emu_work_fn fn,
                            void *arg, void (*free_arg)(void *))
{
    return push(st, flags, extra_dev, fn, arg, free_arg, NULL);
}

void zs_emu_stream_wait(zs_emu_stream *st, uint64_t seq)
{
    pthread_mutex_lock(&g_lock);
    while (st->done_seq < seq)
        pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
}

void zs_emu_device_wait(int dev)
{
    pthread_mutex_lock(&g_lock);
    for (zs_emu_stream *s = g_streams; s; s = s->next_all) {
        if (s->device != dev)
            continue;
        uint64_t target = s->enq_seq;
        while (s->done_seq < target)
            pthread_cond_wait(&g_cond, &g_lock);
    }
    pthread_mutex_unlock(&g_lock);
}

/* emu_internal.h contract. */
cudaError_t zs_emu_enqueue(cudaStream_t s, zs_emu_work_fn fn, void *arg, void (*free_arg)(void *))
{
    zs_emu_api_enter("zs_emu_enqueue");
    zs_emu_stream *st = zs_emu_stream_get(s);
    if (!st) {
        if (free_arg)
            free_arg(arg);
        return cudaErrorInvalidResourceHandle;
    }
    cudaError_t e = zs_emu_sticky(st->device);
    if (e != cudaSuccess) {
        if (free_arg)
            free_arg(arg);
        return e;
    }
    if (!push(st, ZS_EMU_WORK_DEVICE, -1, fn, arg, free_arg, NULL))
        return zs_emu_sticky(st->device);
    return cudaSuccess;
}

/* ---- Stream management (CUDA Runtime API, 6.5 Stream Management) ---- */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority)
{
    zs_emu_api_enter("cudaStreamCreateWithPriority");
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return zs_emu_ret(cudaErrorInvalidValue);
    int dev = zs_emu_current_device();
    cudaError_t e = zs_emu_sticky(dev);
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    /* cudaStreamCreateWithPriority: priorities outside [greatest, least]
     * are clamped. */
    if (priority > 0)
        priority = 0;
    if (priority < -5)
        priority = -5;
    pthread_mutex_lock(&g_lock);
    zs_emu_stream *st = stream_new(dev, KIND_CREATED, flags, priority);
    pthread_mutex_unlock(&g_lock);
    *pStream = (cudaStream_t)st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

/* cudaStreamDestroy: "In case the device is still doing work in the stream
 * when cudaStreamDestroy() is called, the function will return immediately
 * and the resources associated with stream will be released automatically
 * once the device has completed all work in stream." */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    zs_emu_api_enter("cudaStreamDestroy");
    if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    zs_emu_stream *st = zs_emu_stream_get(stream);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_lock);
    st->destroyed = 1;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    return zs_emu_ret(zs_emu_sticky(st->device));
}

/* cudaStreamSynchronize: blocks until the stream has completed all
 * operations; returns the context's sticky error if one occurred. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    zs_emu_api_enter("cudaStreamSynchronize");
    zs_emu_stream *st = zs_emu_stream_get(stream);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_lock);
    uint64_t target = st->enq_seq;
    pthread_mutex_unlock(&g_lock);
    zs_emu_stream_wait(st, target);
    return zs_emu_ret(zs_emu_sticky(st->device));
}

/* cudaStreamQuery: cudaSuccess if all operations in the stream have
 * completed, cudaErrorNotReady if not. The Runtime API does not say whether
 * "not ready" becomes the thread's last error; the hostile reading (and
 * what the project must survive) is that it does, so code must clear it
 * (cudaGetLastError) after polling. */
cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    zs_emu_api_enter("cudaStreamQuery");
    zs_emu_stream *st = zs_emu_stream_get(stream);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    cudaError_t e = zs_emu_sticky(st->device);
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    pthread_mutex_lock(&g_lock);
    int busy = has_pending(st);
    pthread_mutex_unlock(&g_lock);
    return busy ? zs_emu_ret(cudaErrorNotReady) : cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags)
{
    zs_emu_api_enter("cudaStreamGetFlags");
    zs_emu_stream *st = zs_emu_stream_get(hStream);
    if (!st || !flags)
        return zs_emu_ret(st ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
    *flags = st->flags;
    return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
    zs_emu_api_enter("cudaStreamGetPriority");
    zs_emu_stream *st = zs_emu_stream_get(hStream);
    if (!st || !priority)
        return zs_emu_ret(st ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
    *priority = st->priority;
    return cudaSuccess;
}

typedef struct hostfn_arg {
    cudaHostFn_t fn;
    void *data;
} hostfn_arg;

static cudaError_t call_hostfn(void *p)
{
    hostfn_arg *a = p;
    a->fn(a->data);
    return cudaSuccess;
}

/* cudaLaunchHostFunc: "The function will be called after currently
 * enqueued work and will block work added after it." See run_hostfn for
 * the serialisation and zs_emu_api_enter for CUDA calls from inside. */
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    zs_emu_api_enter("cudaLaunchHostFunc");
    if (!fn)
        return zs_emu_ret(cudaErrorInvalidValue);
    zs_emu_stream *st = zs_emu_stream_get(stream);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    hostfn_arg *a = malloc(sizeof *a);
    if (!a)
        return zs_emu_ret(cudaErrorMemoryAllocation);
    a->fn = fn;
    a->data = userData;
    if (!push(st, ZS_EMU_WORK_HOSTFN, -1, call_hostfn, a, free, NULL))
        return zs_emu_ret(zs_emu_sticky(st->device));
    return cudaSuccess;
}
