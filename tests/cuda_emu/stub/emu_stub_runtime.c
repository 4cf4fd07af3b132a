/*
 * emu_stub_runtime.c - a stand-in for the emulator's runtime (branch
 * emu-core), just enough for the cuBLASLt and CUB tests: the emu_internal.h
 * contract (zs_emu_enqueue, zs_emu_dev_ptr, zs_emu_current_device,
 * zs_emu_fatal) plus cudaMalloc/cudaFree/cudaMemcpy/cudaMemset and the
 * synchronisation calls.
 *
 * Does not: emulate streams, events, kernels or devices other than 0. It is
 * linked only into tests/cuda_emu/test_emu_blaslt and test_emu_cub, never
 * into the zs_cuda_emu library; delete it once emu-core's runtime is merged.
 *
 * Enqueued work runs at once on the caller's thread, unless a test turns on
 * deferral (zs_emu_stub_defer(1)): then it waits until the next
 * cudaStreamSynchronize/cudaDeviceSynchronize, which lets a test prove that
 * arguments were captured at call time. An error returned by work is kept
 * as a sticky error, readable with zs_emu_stub_sticky().
 */
#include "emu_internal.h"
#include "emu_stub.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ALLOCS 4096
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *p;
    size_t n;
} g_allocs[MAX_ALLOCS];

typedef struct job {
    zs_emu_work_fn fn;
    void *arg;
    void (*free_arg)(void *);
    struct job *next;
} job;
static job *g_head, **g_tail = &g_head;
static int g_defer;
static cudaError_t g_sticky = cudaSuccess;

void zs_emu_stub_defer(int on)
{
    g_defer = on;
}

cudaError_t zs_emu_stub_sticky(void)
{
    cudaError_t e = g_sticky;
    g_sticky = cudaSuccess; /* tests reset it after reading */
    return e;
}

static void run(job *j)
{
    cudaError_t e = j->fn(j->arg);
    if (e != cudaSuccess && g_sticky == cudaSuccess)
        g_sticky = e;
    if (j->free_arg)
        j->free_arg(j->arg);
    free(j);
}

cudaError_t zs_emu_enqueue(cudaStream_t s, zs_emu_work_fn fn, void *arg, void (*free_arg)(void *))
{
    (void)s;
    job *j = malloc(sizeof(*j));
    if (!j) {
        if (free_arg)
            free_arg(arg);
        return cudaErrorMemoryAllocation;
    }
    j->fn = fn, j->arg = arg, j->free_arg = free_arg, j->next = NULL;
    if (!g_defer) {
        run(j);
        return cudaSuccess;
    }
    *g_tail = j;
    g_tail = &j->next;
    return cudaSuccess;
}

static void drain(void)
{
    while (g_head) {
        job *j = g_head;
        g_head = j->next;
        if (!g_head)
            g_tail = &g_head;
        run(j);
    }
}

int zs_emu_dev_ptr(const void *p, size_t bytes)
{
    const char *c = p;
    int dev = -1;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (g_allocs[i].p && c >= g_allocs[i].p && c < g_allocs[i].p + g_allocs[i].n &&
            bytes <= (size_t)(g_allocs[i].p + g_allocs[i].n - c))
            dev = 0;
    pthread_mutex_unlock(&g_mu);
    return dev;
}

int zs_emu_current_device(void)
{
    return 0;
}

void zs_emu_fatal(const char *where, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "cuda-emu: %s: ", where);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* cudaMalloc: 256-byte aligned, as the CUDA Programming Guide promises for
 * cudaMalloc ("aligned to at least 256 bytes"). */
cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return cudaErrorInvalidValue;
    size_t n = size ? (size + 255) / 256 * 256 : 256;
    char *p = aligned_alloc(256, n);
    if (!p)
        return cudaErrorMemoryAllocation;
    memset(p, 0xcd, n);
    pthread_mutex_lock(&g_mu);
    int slot = -1;
    for (int i = 0; i < MAX_ALLOCS && slot < 0; i++)
        if (!g_allocs[i].p)
            slot = i;
    if (slot >= 0) {
        g_allocs[slot].p = p;
        g_allocs[slot].n = size;
    }
    pthread_mutex_unlock(&g_mu);
    if (slot < 0) {
        free(p);
        return cudaErrorMemoryAllocation;
    }
    *devPtr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    if (!devPtr)
        return cudaSuccess;
    drain();
    int found = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (g_allocs[i].p == devPtr) {
            g_allocs[i].p = NULL;
            found = 1;
        }
    pthread_mutex_unlock(&g_mu);
    if (!found)
        return cudaErrorInvalidValue;
    free(devPtr);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    (void)kind;
    drain();
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    drain();
    memset(devPtr, value, count);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    (void)stream;
    drain();
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    drain();
    return cudaSuccess;
}
