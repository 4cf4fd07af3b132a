/*
 * emu_mem.c - device and pinned host memory of the CUDA emulator: the
 * allocation table, the protection window, the SIGSEGV diagnostic, copies,
 * memsets and pointer attributes.
 *
 * Protected build (default): every device allocation is its own mmap,
 * PROT_NONE while no work of its device runs, so host code reading device
 * memory faults and the handler names the allocation. Freed device and
 * pinned memory stays reserved and PROT_NONE (addresses are not reused while
 * the quarantine lasts), so a use after free faults too.
 * ASan build (-fsanitize=address): device memory is heap memory
 * (posix_memalign), so ASan's redzones catch out-of-bounds kernel accesses
 * and its quarantine catches use after free; no protection window.
 *
 * Host memory registered with cudaHostRegister is an entry of the same
 * table (A_REG): the user's own memory, never protected or freed here, but
 * page-locked for copies, memsets and pointer attributes.
 *
 * Copies and memsets are in emu_copy.c. Does not emulate: managed memory,
 * IPC, memory pools beyond cudaMallocAsync/cudaFreeAsync on the default
 * pool, cudaHostRegisterIoMemory and cudaHostRegisterReadOnly (refused).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_core.h"

#if !ZS_EMU_PROTECT
#include <sanitizer/asan_interface.h>
#endif

/* A_HOST: cudaHostAlloc / cudaMallocHost; A_REG: cudaHostRegister. */
enum { A_MALLOC, A_MALLOC_ASYNC, A_HOST, A_REG };
enum { S_EMPTY, S_LIVE, S_FREEING, S_FREED };

typedef struct alloc {
    char *base; /* what the user got */
    size_t size;
    char *map; /* protected build: the mapping, guard page included */
    size_t map_len;
    int dev, kind;
    volatile int state;
    /* A_HOST / A_REG: the flags given, and the device current when the
     * memory was allocated or registered (cudaPointerAttributes::device). */
    unsigned flags;
    int owner_dev;
    /* A_REG, ASan build: the range was free of ASan poison when registered,
     * so poison at cudaHostUnregister means it was freed meanwhile. */
    int asan_clean;
} alloc;

/* A fixed table that never moves, so the SIGSEGV handler can read it
 * without a lock. Freed entries stay (quarantine) until the table is full;
 * then the oldest freed ones are released and reused. */
#define MAX_ALLOCS (1 << 16)
static alloc g_tab[MAX_ALLOCS];
static int g_ntab;
static pthread_mutex_t g_mlock = PTHREAD_MUTEX_INITIALIZER;
static size_t g_used[ZS_EMU_MAX_DEVICES];
static int g_active[ZS_EMU_MAX_DEVICES];
static size_t g_page;

#if ZS_EMU_PROTECT /* for the SIGSEGV diagnostic */
static const char *kind_name(int k)
{
    return k == A_MALLOC         ? "cudaMalloc"
           : k == A_MALLOC_ASYNC ? "cudaMallocAsync"
           : k == A_HOST         ? "cudaHostAlloc"
                                 : "cudaHostRegister";
}
#endif

/* Device memory (as opposed to page-locked host memory). */
static int is_dev_kind(int k)
{
    return k == A_MALLOC || k == A_MALLOC_ASYNC;
}

#if ZS_EMU_PROTECT
static struct sigaction g_old_segv;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    char *a = si->si_addr;
    char msg[256];
    int n = 0;
    for (int i = 0; i < g_ntab && !n; i++) {
        alloc *x = &g_tab[i];
        if (x->state == S_EMPTY || !x->map || a < x->map || a >= x->map + x->map_len)
            continue;
        if (x->state == S_FREED)
            n = snprintf(msg, sizeof msg,
                         "cuda-emu: access to freed memory at %p (allocation of %zu bytes "
                         "from %s at %p, freed)\n",
                         (void *)a, x->size, kind_name(x->kind), (void *)x->base);
        else if (a >= x->base + x->size || a < x->base)
            n = snprintf(msg, sizeof msg,
                         "cuda-emu: out-of-bounds access at %p (allocation of %zu bytes from "
                         "%s at %p)\n",
                         (void *)a, x->size, kind_name(x->kind), (void *)x->base);
        else
            n = snprintf(msg, sizeof msg,
                         "cuda-emu: host access to device memory at %p (allocation of %zu bytes "
                         "from %s, device %d, accessed while no work of that device runs)\n",
                         (void *)a, x->size, kind_name(x->kind), x->dev);
    }
    if (!n)
        n = zs_emu_kernel_fault(a, msg, sizeof msg);
    if (n > 0)
        (void)!write(2, msg, (size_t)n);
    /* Reported, or not ours: put back the handler that was there before
     * (the default action, or the program's own crash handler) and return,
     * so the access faults again and that handler runs. */
    (void)sig;
    sigaction(SIGSEGV, &g_old_segv, NULL);
}
#endif

void zs_emu_mem_init(void)
{
    g_page = (size_t)sysconf(_SC_PAGESIZE);
#if ZS_EMU_PROTECT
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigaction(SIGSEGV, &sa, &g_old_segv);
#endif
}

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* g_mlock held. Protected build: set the access of one allocation. */
static void protect(alloc *x, int rw)
{
#if ZS_EMU_PROTECT
    if (x->map && mprotect(x->map, x->map_len - g_page, rw ? PROT_READ | PROT_WRITE : PROT_NONE))
        zs_emu_fatal("mprotect", "failed on %p", (void *)x->map);
#else
    (void)x;
    (void)rw;
#endif
}

void zs_emu_window_open(int dev)
{
    pthread_mutex_lock(&g_mlock);
    if (g_active[dev]++ == 0)
        for (int i = 0; i < g_ntab; i++)
            if (g_tab[i].dev == dev && is_dev_kind(g_tab[i].kind) &&
                (g_tab[i].state == S_LIVE || g_tab[i].state == S_FREEING))
                protect(&g_tab[i], 1);
    pthread_mutex_unlock(&g_mlock);
}

void zs_emu_window_close(int dev)
{
    pthread_mutex_lock(&g_mlock);
    if (--g_active[dev] == 0)
        for (int i = 0; i < g_ntab; i++)
            if (g_tab[i].dev == dev && is_dev_kind(g_tab[i].kind) &&
                (g_tab[i].state == S_LIVE || g_tab[i].state == S_FREEING))
                protect(&g_tab[i], 0);
    pthread_mutex_unlock(&g_mlock);
}

/* g_mlock held. Release a freed entry's memory for good. */
static void release(alloc *x)
{
#if ZS_EMU_PROTECT
    munmap(x->map, x->map_len);
#else
    free(x->base);
#endif
    memset(x, 0, sizeof *x);
}

/* g_mlock held. Mark freed: poison, then make it inaccessible. */
static void retire(alloc *x)
{
    if (is_dev_kind(x->kind) && x->dev >= 0)
        g_used[x->dev] -= x->size;
#if ZS_EMU_PROTECT
    /* Inaccessible for good; the pages go back to the system, the address
     * range stays reserved so it is not reused while in quarantine. */
    mprotect(x->map, x->map_len, PROT_NONE);
    madvise(x->map, x->map_len, MADV_DONTNEED);
    x->state = S_FREED;
#else
    memset(x->base, ZS_EMU_POISON, x->size);
    release(x); /* ASan's quarantine keeps the address from reuse */
#endif
}

/* g_mlock held. */
static alloc *slot(void)
{
    for (int i = 0; i < g_ntab; i++)
        if (g_tab[i].state == S_EMPTY)
            return &g_tab[i];
    if (g_ntab < MAX_ALLOCS)
        return &g_tab[g_ntab++];
    for (int i = 0; i < g_ntab; i++)
        if (g_tab[i].state == S_FREED) {
            release(&g_tab[i]);
            return &g_tab[i];
        }
    return NULL;
}

static cudaError_t new_alloc(void **out, size_t size, int dev, int kind, unsigned flags)
{
    pthread_mutex_lock(&g_mlock);
    if (kind != A_HOST && g_used[dev] + size > zs_emu_mem_limit()) {
        pthread_mutex_unlock(&g_mlock);
        return cudaErrorMemoryAllocation;
    }
    alloc *x = slot();
    if (!x) {
        pthread_mutex_unlock(&g_mlock);
        return cudaErrorMemoryAllocation;
    }
    size_t sz = size ? size : 1;
#if ZS_EMU_PROTECT
    /* The block ends at the guard page (256-byte aligned, the alignment
     * cudaMalloc guarantees), so an overflow past the 256-byte slack
     * faults. */
    size_t body = round_up(round_up(sz, 256), g_page);
    size_t huge = (size_t)2 << 20;
    char *m;
    if (body >= huge) {
        /* Large blocks in transparent huge pages, 2 MiB aligned: opening and
         * closing the window then changes a few page-directory entries
         * instead of every 4 KiB page table entry (about 700 times faster
         * for 1 GiB). Where THP is off the madvise fails and 4 KiB pages
         * are used. */
        body = round_up(body, huge);
        char *r = mmap(NULL, body + huge + g_page, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r == MAP_FAILED) {
            pthread_mutex_unlock(&g_mlock);
            return cudaErrorMemoryAllocation;
        }
        m = (char *)round_up((size_t)r, huge);
        if (m > r)
            munmap(r, (size_t)(m - r));
        size_t tail = (size_t)(r + body + huge + g_page - (m + body + g_page));
        if (tail)
            munmap(m + body + g_page, tail);
        madvise(m, body, MADV_HUGEPAGE);
    } else {
        m = mmap(NULL, body + g_page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                 0);
        if (m == MAP_FAILED) {
            pthread_mutex_unlock(&g_mlock);
            return cudaErrorMemoryAllocation;
        }
    }
    x->map = m;
    x->map_len = body + g_page;
    x->base = m + body - round_up(sz, 256);
    /* Fill with poison: cudaMalloc does not clear memory (CUDA Runtime API,
     * 6.11 Memory Management, cudaMalloc: "The memory is not cleared"). */
    mprotect(m, body, PROT_READ | PROT_WRITE);
    memset(x->base, ZS_EMU_POISON, sz);
    if (kind != A_HOST && g_active[dev] == 0)
        mprotect(m, body, PROT_NONE);
#else
    void *p = NULL;
    if (posix_memalign(&p, 256, sz)) {
        pthread_mutex_unlock(&g_mlock);
        return cudaErrorMemoryAllocation;
    }
    x->map = NULL;
    x->base = p;
    memset(p, ZS_EMU_POISON, sz);
#endif
    x->size = size;
    x->dev = kind == A_HOST ? -1 : dev;
    x->kind = kind;
    x->flags = flags;
    x->owner_dev = dev;
    x->state = S_LIVE;
    if (kind != A_HOST)
        g_used[dev] += size;
    *out = x->base;
    pthread_mutex_unlock(&g_mlock);
    return cudaSuccess;
}

/* g_mlock held. The entry whose user range contains p (any state). */
static alloc *find(const void *p)
{
    const char *c = p;
    for (int i = 0; i < g_ntab; i++) {
        alloc *x = &g_tab[i];
        if (x->state != S_EMPTY && c >= x->base && c < x->base + (x->size ? x->size : 1))
            return x;
    }
    return NULL;
}

int zs_emu_dev_ptr(const void *p, size_t bytes)
{
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(p);
    int r = -1;
    /* S_FREEING: cudaFreeAsync was called but stream execution has not
     * reached the free. New API calls may not name the pointer ("accessing
     * the memory from any subsequent work launched ... results in undefined
     * behavior"), but work enqueued before the free and running now on an
     * executor still may: "The allocation must not be accessed after stream
     * execution reaches the free" (found by our embedding backward, whose
     * CUB sort runs before its temporary's cudaFreeAsync on one stream). */
    int live = x && (x->state == S_LIVE ||
                     (x->state == S_FREEING && zs_emu_role() == ZS_EMU_ROLE_EXECUTOR));
    if (live && is_dev_kind(x->kind) &&
        (size_t)((const char *)p - x->base) + bytes <= x->size)
        r = x->dev;
    pthread_mutex_unlock(&g_mlock);
    return r;
}

/* ---- Allocation API (CUDA Runtime API, 6.11 Memory Management; 6.13
 * Stream Ordered Memory Allocator) ---- */

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    zs_emu_api_enter("cudaMalloc");
    if (!devPtr)
        return zs_emu_ret(cudaErrorInvalidValue);
    int dev = zs_emu_current_device();
    cudaError_t e = zs_emu_sticky(dev);
    if (e == cudaSuccess)
        e = new_alloc(devPtr, size, dev, A_MALLOC, 0);
    return zs_emu_ret(e);
}

/* cudaFree: CUDA C++ Programming Guide, 4.3 Stream-Ordered Memory
 * Allocator, Introduction: "Managing memory allocations using cudaMalloc
 * and cudaFree causes the GPU to synchronize across all executing CUDA
 * streams." So the device's work completes before the memory goes. */
cudaError_t cudaFree(void *devPtr)
{
    zs_emu_api_enter("cudaFree");
    zs_emu_hostfn_wait_idle();
    if (!devPtr)
        return cudaSuccess;
    int dev = zs_emu_current_device();
    cudaError_t e = zs_emu_sticky(dev);
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(devPtr);
    int ok = x && x->base == devPtr && is_dev_kind(x->kind) && x->state == S_LIVE;
    int xdev = ok ? x->dev : -1;
    pthread_mutex_unlock(&g_mlock);
    if (!ok)
        return zs_emu_ret(cudaErrorInvalidValue);
    zs_emu_device_wait(xdev);
    pthread_mutex_lock(&g_mlock);
    if (x->state == S_LIVE)
        retire(x);
    pthread_mutex_unlock(&g_mlock);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    zs_emu_api_enter("cudaMallocAsync");
    if (!devPtr)
        return zs_emu_ret(cudaErrorInvalidValue);
    zs_emu_stream *st = zs_emu_stream_get(hStream);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    int dev = zs_emu_stream_device(st);
    cudaError_t e = zs_emu_sticky(dev);
    if (e == cudaSuccess)
        e = new_alloc(devPtr, size, dev, A_MALLOC_ASYNC, 0);
    return zs_emu_ret(e);
}

static cudaError_t free_reached(void *p)
{
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(p);
    if (x && x->state == S_FREEING)
        retire(x);
    pthread_mutex_unlock(&g_mlock);
    return cudaSuccess;
}

/* cudaFreeAsync: "The allocation must not be accessed after stream
 * execution reaches the free. After this API returns, accessing the memory
 * from any subsequent work launched on the GPU or querying its pointer
 * attributes results in undefined behavior." Hostile reading: the pointer
 * stops being a valid device pointer (zs_emu_dev_ptr, copies, attributes)
 * at once, and the memory is poisoned and made inaccessible as soon as the
 * free is reached in stream order, so work of another stream not ordered
 * before the free faults (protected build) or reads poison / hits ASan. */
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    zs_emu_api_enter("cudaFreeAsync");
    zs_emu_stream *st = zs_emu_stream_get(hStream);
    if (!st)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    if (!devPtr)
        return cudaSuccess;
    cudaError_t e = zs_emu_sticky(zs_emu_stream_device(st));
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(devPtr);
    int ok = x && x->base == devPtr && is_dev_kind(x->kind) && x->state == S_LIVE;
    if (ok)
        x->state = S_FREEING;
    pthread_mutex_unlock(&g_mlock);
    if (!ok)
        return zs_emu_ret(cudaErrorInvalidValue);
    if (!zs_emu_stream_push(st, ZS_EMU_WORK_DEVICE, -1, free_reached, devPtr, NULL))
        return zs_emu_ret(zs_emu_sticky(zs_emu_stream_device(st)));
    return cudaSuccess;
}

/* cudaHostAlloc / cudaMallocHost: page-locked host memory, always
 * accessible from the host (and, with unified addressing, from kernels). */
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    zs_emu_api_enter("cudaHostAlloc");
    unsigned ok = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (!pHost || (flags & ~ok))
        return zs_emu_ret(cudaErrorInvalidValue);
    cudaError_t e = zs_emu_sticky(zs_emu_current_device());
    if (e == cudaSuccess)
        e = new_alloc(pHost, size, zs_emu_current_device(), A_HOST, flags);
    return zs_emu_ret(e);
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

/* cudaFreeHost: freed at once. Hostile reading: the Runtime API does not
 * promise that it waits for copies still using the buffer, so an async copy
 * still in flight faults (protected) or is an ASan use after free.
 * The pointer "must have been returned by a previous call to
 * cudaMallocHost() or cudaHostAlloc()": memory registered with
 * cudaHostRegister is refused (cudaErrorInvalidValue) and stays registered. */
cudaError_t cudaFreeHost(void *ptr)
{
    zs_emu_api_enter("cudaFreeHost");
    zs_emu_hostfn_wait_idle();
    if (!ptr)
        return cudaSuccess;
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(ptr);
    int ok = x && x->base == ptr && x->kind == A_HOST && x->state == S_LIVE;
    if (ok)
        retire(x);
    pthread_mutex_unlock(&g_mlock);
    return ok ? cudaSuccess : zs_emu_ret(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    zs_emu_api_enter("cudaMemGetInfo");
    int dev = zs_emu_current_device();
    pthread_mutex_lock(&g_mlock);
    size_t used = g_used[dev];
    pthread_mutex_unlock(&g_mlock);
    if (free_b)
        *free_b = zs_emu_mem_limit() - used;
    if (total)
        *total = zs_emu_mem_limit();
    return zs_emu_ret(zs_emu_sticky(dev));
}

/* CUDA Runtime API, 6.14 Unified Addressing, cudaPointerGetAttributes:
 * device memory: type cudaMemoryTypeDevice, hostPointer NULL; page-locked
 * host memory (cudaHostAlloc, or a range registered with cudaHostRegister:
 * "cudaMemoryTypeHost for registered host memory"): cudaMemoryTypeHost, both
 * pointers the same (unified addressing, and the emulated device has
 * cudaDevAttrCanUseHostPointerForRegisteredMem), device "the device which
 * was current when the allocation was made" (or registered: driver_types.h,
 * cudaPointerAttributes::device); anything else, freed memory and
 * unregistered ranges included (undefined after cudaFreeAsync: hostile
 * reading), cudaMemoryTypeUnregistered. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    zs_emu_api_enter("cudaPointerGetAttributes");
    if (!attr)
        return zs_emu_ret(cudaErrorInvalidValue);
    memset(attr, 0, sizeof *attr);
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(ptr);
    if (x && x->state == S_LIVE) {
        if (!is_dev_kind(x->kind)) {
            attr->type = cudaMemoryTypeHost;
            attr->device = x->owner_dev;
            attr->hostPointer = (void *)ptr;
            attr->devicePointer = (void *)ptr;
        } else {
            attr->type = cudaMemoryTypeDevice;
            attr->device = x->dev;
            attr->devicePointer = (void *)ptr;
        }
    }
    pthread_mutex_unlock(&g_mlock);
    return zs_emu_ret(zs_emu_sticky(zs_emu_current_device()));
}

/* emu_core.h. */
int zs_emu_classify(const void *p, size_t n, int *dev)
{
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(p);
    int r = ZS_EMU_P_PAGEABLE;
    *dev = -1;
    if (x) {
        size_t off = (size_t)((const char *)p - x->base);
        int fits = off + n <= x->size;
        if (x->kind == A_REG)
            /* A copy that runs past the end of a registered range also
             * touches memory that is not page-locked: pageable (the
             * category with the more hostile synchronisation). */
            r = fits ? ZS_EMU_P_PINNED : ZS_EMU_P_PAGEABLE;
        else if (x->kind == A_HOST)
            r = fits && x->state == S_LIVE ? ZS_EMU_P_PINNED : ZS_EMU_P_BAD;
        else {
            r = fits && x->state == S_LIVE ? ZS_EMU_P_DEVICE : ZS_EMU_P_BAD;
            *dev = x->dev;
        }
    }
    pthread_mutex_unlock(&g_mlock);
    return r;
}

/* ---- Registered host memory (CUDA Runtime API, 6.11 Memory Management:
 * cudaHostRegister, cudaHostUnregister, cudaHostGetFlags,
 * cudaHostGetDevicePointer) ---- */

/* How [p, p + n), widened to whole pages, is mapped in this process
 * (/proc/self/maps). */
enum { RANGE_RW, RANGE_RO, RANGE_HOLE, RANGE_UNKNOWN };
static int range_mapping(const void *p, size_t n)
{
    uintptr_t lo = (uintptr_t)p / g_page * g_page;
    uintptr_t hi = round_up((uintptr_t)p + n, g_page);
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return RANGE_UNKNOWN;
    char *line = NULL;
    size_t cap = 0;
    uintptr_t cur = lo;
    int r = RANGE_RW;
    while (cur < hi && getline(&line, &cap, f) > 0) {
        unsigned long a, b;
        char perm[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perm) != 3 || b <= cur)
            continue;
        if (a > cur)
            break; /* a hole at cur */
        if (perm[0] != 'r' || perm[1] != 'w')
            r = RANGE_RO;
        cur = b;
    }
    free(line);
    fclose(f);
    return cur < hi ? RANGE_HOLE : r;
}

/* cudaHostRegister: "Page-locks the memory range specified by ptr and size
 * ... This memory range also is added to the same tracking mechanism as
 * cudaHostAlloc() to automatically accelerate calls to functions such as
 * cudaMemcpy()": from here on the range is pinned memory for copies
 * (emu_copy.c's pinned rules), memsets and cudaPointerGetAttributes, for
 * every device (Programming Guide, Page-Locked Host Memory, Portable Memory:
 * the benefits extend to "all devices sharing the same unified address
 * space", and the emulated devices have unified addressing).
 *  - ptr NULL, size 0, a range that wraps, or a flag the header does not
 *    define: cudaErrorInvalidValue (documented return; an empty range
 *    page-locks nothing, hostile reading).
 *  - cudaHostRegisterReadOnly: "Using this flag with a current context
 *    associated with a device that does not have this attribute
 *    [cudaDevAttrHostRegisterReadOnlySupported] set will cause
 *    cudaHostRegister to error with cudaErrorNotSupported"; the emulated
 *    device reports 0. cudaHostRegisterIoMemory (memory-mapped I/O of a
 *    third-party PCIe device): not emulated, cudaErrorNotSupported (a
 *    documented return).
 *  - A range overlapping one already registered, or cudaHostAlloc memory
 *    (in "the same tracking mechanism"), even by one byte:
 *    cudaErrorHostMemoryAlreadyRegistered ("the memory range passed to
 *    cudaHostRegister() has already been registered"; hostile reading: any
 *    overlap, not only the same range).
 *  - Device memory (not host memory) or pages not mapped read-write in this
 *    process: cudaErrorInvalidValue. Read-only memory needs
 *    cudaHostRegisterReadOnly ("this flag is required in order to register
 *    memory mapped to the CPU as read-only"), which is not supported.
 * The memory is not mlock()ed: the emulator only tracks the range. */
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    zs_emu_api_enter("cudaHostRegister");
    unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped |
                     cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
    if (!ptr || !size || (flags & ~known) || (uintptr_t)ptr + size < (uintptr_t)ptr)
        return zs_emu_ret(cudaErrorInvalidValue);
    if (flags & (cudaHostRegisterIoMemory | cudaHostRegisterReadOnly))
        return zs_emu_ret(cudaErrorNotSupported);
    int dev = zs_emu_current_device();
    cudaError_t e = zs_emu_sticky(dev);
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    const char *lo = ptr, *hi = lo + size;
    pthread_mutex_lock(&g_mlock);
    for (int i = 0; i < g_ntab && e != cudaErrorHostMemoryAlreadyRegistered; i++) {
        alloc *x = &g_tab[i];
        if (x->state == S_EMPTY)
            continue;
        /* The whole mapping of device memory (slack and guard included). */
        const char *b = x->map ? x->map : x->base;
        const char *end = x->map ? x->map + x->map_len : x->base + (x->size ? x->size : 1);
        if (lo >= end || hi <= b)
            continue;
        e = !is_dev_kind(x->kind) && x->state == S_LIVE ? cudaErrorHostMemoryAlreadyRegistered
                                                        : cudaErrorInvalidValue;
    }
    if (e == cudaSuccess) {
        int m = range_mapping(ptr, size);
        if (m == RANGE_HOLE || m == RANGE_RO)
            e = cudaErrorInvalidValue;
    }
    alloc *x = e == cudaSuccess ? slot() : NULL;
    if (e == cudaSuccess && !x)
        e = cudaErrorMemoryAllocation;
    if (x) {
        memset(x, 0, sizeof *x);
        x->base = ptr;
        x->size = size;
        x->dev = -1;
        x->kind = A_REG;
        x->flags = flags;
        x->owner_dev = dev;
#if !ZS_EMU_PROTECT
        x->asan_clean = __asan_region_is_poisoned(ptr, size) == NULL;
#endif
        x->state = S_LIVE;
    }
    pthread_mutex_unlock(&g_mlock);
    return e == cudaSuccess ? e : zs_emu_ret(e);
}

/* cudaHostUnregister: "Unmaps the memory range whose base address is
 * specified by ptr, and makes it pageable again. The base address must be
 * the same one specified to cudaHostRegister()."
 *  - Not the base of a live registration (an interior pointer, cudaHostAlloc
 *    memory, pageable memory, a second unregister):
 *    cudaErrorHostMemoryNotRegistered ("does not correspond to any currently
 *    registered memory region"). NULL: cudaErrorInvalidValue.
 *  - The range is pageable at once: it does not wait for copies in flight
 *    (not promised), which then see pageable memory's rules.
 *  - A range unmapped (or, in the ASan build, freed) while registered is a
 *    zs_emu_fatal: "The memory page-locked by this function must be
 *    unregistered with cudaHostUnregister()", so it must still be there.
 *    Stricter than documented (a GPU may not notice). */
cudaError_t cudaHostUnregister(void *ptr)
{
    zs_emu_api_enter("cudaHostUnregister");
    if (!ptr)
        return zs_emu_ret(cudaErrorInvalidValue);
    cudaError_t e = zs_emu_sticky(zs_emu_current_device());
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    pthread_mutex_lock(&g_mlock);
    alloc *x = NULL;
    for (int i = 0; i < g_ntab && !x; i++)
        if (g_tab[i].kind == A_REG && g_tab[i].state == S_LIVE && g_tab[i].base == ptr)
            x = &g_tab[i];
    if (!x) {
        pthread_mutex_unlock(&g_mlock);
        return zs_emu_ret(cudaErrorHostMemoryNotRegistered);
    }
    const char *why = NULL;
    if (range_mapping(x->base, x->size) == RANGE_HOLE)
        why = "unmapped";
#if !ZS_EMU_PROTECT
    else if (x->asan_clean && __asan_region_is_poisoned(x->base, x->size))
        why = "freed";
#endif
    size_t size = x->size;
    if (!why)
        memset(x, 0, sizeof *x); /* S_EMPTY: pageable again */
    pthread_mutex_unlock(&g_mlock);
    if (why)
        zs_emu_fatal("cudaHostUnregister",
                     "the %zu bytes at %p registered with cudaHostRegister were %s while "
                     "registered (unregister before freeing)",
                     size, ptr, why);
    return cudaSuccess;
}

/* cudaHostGetFlags: "will fail if the input pointer does not reside in an
 * address range allocated by cudaHostAlloc()". Hostile reading: a range
 * registered with cudaHostRegister is not allocated by cudaHostAlloc, so it
 * is refused (cudaErrorInvalidValue) too. Passes back the flags given to
 * cudaHostAlloc (cudaMallocHost: 0). */
cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    zs_emu_api_enter("cudaHostGetFlags");
    if (!pFlags)
        return zs_emu_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(pHost);
    int ok = x && x->kind == A_HOST && x->state == S_LIVE;
    if (ok)
        *pFlags = x->flags;
    pthread_mutex_unlock(&g_mlock);
    return ok ? zs_emu_ret(zs_emu_sticky(zs_emu_current_device()))
              : zs_emu_ret(cudaErrorInvalidValue);
}

/* cudaHostGetDevicePointer: "flags ... must be set to 0 for now", else
 * cudaErrorInvalidValue; pHost must lie in pinned memory from cudaHostAlloc
 * or cudaHostRegister. The emulated devices all have
 * cudaDevAttrCanUseHostPointerForRegisteredMem, so "the device pointer
 * returned by cudaHostGetDevicePointer() will match the original pointer". */
cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    zs_emu_api_enter("cudaHostGetDevicePointer");
    if (!pDevice || flags)
        return zs_emu_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mlock);
    alloc *x = find(pHost);
    int ok = x && !is_dev_kind(x->kind) && x->state == S_LIVE;
    pthread_mutex_unlock(&g_mlock);
    if (!ok)
        return zs_emu_ret(cudaErrorInvalidValue);
    *pDevice = pHost;
    return zs_emu_ret(zs_emu_sticky(zs_emu_current_device()));
}
