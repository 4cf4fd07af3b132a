/*
 * emu_stub_nccl_rt.c - a stand-in for the emulated CUDA runtime (branch
 * emu-core), just enough for test_emu_nccl until that runtime is merged:
 * zs_emu_enqueue on a per-stream thread in order, a cudaMalloc registry
 * for zs_emu_dev_ptr, cudaStreamCreate/Synchronize/Destroy, cudaMemcpy,
 * cudaSetDevice/GetDevice. Used only by the NCCL emulator's own tests;
 * deleted once emu-core's runtime is merged. Does not: events, kernels,
 * memory protection, sticky errors beyond remembering the first.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../emu_internal.h"

struct work {
    zs_emu_work_fn fn;
    void *arg;
    void (*free_arg)(void *);
    struct work *next;
};

struct CUstream_st {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct work *head, *tail;
    int busy, stop;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc {
    char *p;
    size_t n;
} * g_allocs;
static int g_nallocs;
static _Thread_local int t_dev;
static struct CUstream_st *g_default;
static cudaError_t g_sticky = cudaSuccess;

void zs_emu_fatal(const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda-emu: %s: ", where);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

static void *stream_main(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head)
            break;
        struct work *w = s->head;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        cudaError_t e = w->fn(w->arg);
        if (w->free_arg)
            w->free_arg(w->arg);
        pthread_mutex_lock(&s->mu);
        if (e != cudaSuccess && g_sticky == cudaSuccess)
            g_sticky = e;
        s->head = w->next;
        if (!s->head)
            s->tail = NULL;
        free(w);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

cudaError_t cudaStreamCreate(cudaStream_t *ps)
{
    struct CUstream_st *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->th, NULL, stream_main, s);
    *ps = s;
    return cudaSuccess;
}

static struct CUstream_st *resolve(cudaStream_t s)
{
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread)
        return s;
    pthread_mutex_lock(&g_mu);
    if (!g_default)
        cudaStreamCreate(&g_default);
    pthread_mutex_unlock(&g_mu);
    return g_default;
}

cudaError_t zs_emu_enqueue(cudaStream_t st, zs_emu_work_fn fn, void *arg, void (*free_arg)(void *))
{
    struct CUstream_st *s = resolve(st);
    struct work *w = calloc(1, sizeof *w);
    w->fn = fn;
    w->arg = arg;
    w->free_arg = free_arg;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    struct CUstream_st *s = resolve(st);
    pthread_mutex_lock(&s->mu);
    while (s->head)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return g_sticky;
}

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    struct CUstream_st *s = st;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    pthread_mutex_lock(&g_mu);
    g_allocs = realloc(g_allocs, (size_t)(g_nallocs + 1) * sizeof *g_allocs);
    g_allocs[g_nallocs].p = malloc(n ? n : 1);
    g_allocs[g_nallocs].n = n;
    *p = g_allocs[g_nallocs++].p;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].p == p) {
            free(p);
            g_allocs[i] = g_allocs[--g_nallocs];
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

int zs_emu_dev_ptr(const void *p, size_t bytes)
{
    const char *q = p;
    int dev = -1;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nallocs; i++)
        if (q >= g_allocs[i].p && q < g_allocs[i].p + (g_allocs[i].n ? g_allocs[i].n : 1) &&
            (size_t)(g_allocs[i].p + g_allocs[i].n - q) >= bytes)
            dev = 0;
    pthread_mutex_unlock(&g_mu);
    return dev;
}

int zs_emu_current_device(void)
{
    return t_dev;
}

cudaError_t cudaSetDevice(int d)
{
    if (d != 0)
        return cudaErrorInvalidDevice; /* the stub has one device per process */
    t_dev = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = t_dev;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    memcpy(dst, src, n);
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : "cudaError";
}
