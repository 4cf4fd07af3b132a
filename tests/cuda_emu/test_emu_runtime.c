/*
 * test_emu_runtime.c - tests of the CUDA emulator's runtime (tests/cuda_emu/):
 * devices, stream order, events across streams, the single host-function
 * thread, "not ready" as last error, the legacy default stream, the
 * pageable/pinned copy rules, cudaHostRegister/cudaHostUnregister,
 * cudaFreeAsync poisoning, the memory limit, sticky errors, and (in child
 * processes) the deaths: a CUDA call from a host function, a host read of
 * device memory (protected build), a use after cudaFreeAsync, registered
 * memory unmapped or freed before cudaHostUnregister. Kernels are tested by
 * test_emu_kernel.cu.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>

#include "emu_internal.h"
#include "emu_test.h"

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#else
#define ASAN_BUILD 0
#endif

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Stream work (runs on an executor, not on the host-function thread).
 * Checks that something did NOT happen yet give it 400 ms: the machine
 * running the tests may be loaded. */
typedef struct slow {
    int ms;
    atomic_int *flag;
} slow;
static cudaError_t slow_fn(void *p)
{
    slow *s = p;
    sleep_ms(s->ms);
    atomic_store(s->flag, 1);
    return cudaSuccess;
}
static void enqueue_slow(cudaStream_t st, int ms, atomic_int *flag)
{
    slow *s = malloc(sizeof *s);
    s->ms = ms;
    s->flag = flag;
    atomic_store(flag, 0);
    EMU_CUDA(zs_emu_enqueue(st, slow_fn, s, free));
}

static void test_devices(void)
{
    printf("devices: count, properties, PCI bus id\n");
    int n = -1;
    EMU_CUDA(cudaGetDeviceCount(&n));
    EMU_CHECK(n == 1, "count %d", n);
    struct cudaDeviceProp p;
    EMU_CUDA(cudaGetDeviceProperties(&p, 0));
    EMU_CHECK(!strcmp(p.name, "zeroshard CUDA emulator") && p.major == 9 && p.minor == 0 &&
                  p.warpSize == 32 && p.totalGlobalMem == (size_t)4096 << 20,
              "props %s %d.%d", p.name, p.major, p.minor);
    EMU_CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice, "set device 1");
    EMU_CHECK(cudaGetLastError() == cudaErrorInvalidDevice, "last error");
    int lo, hi;
    EMU_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    EMU_CHECK(lo == 0 && hi < 0, "range %d %d", lo, hi);
    emu_child c;
    const char *env[] = {"ZS_EMU_DEVICES=3", "CUDA_VISIBLE_DEVICES=2,0", NULL};
    emu_run_child(&c, "devices", env);
    EMU_CHECK(c.exited && c.code == 0 && emu_has(&c, "count 2 bus0 00000000:12:00.0"), "child: %s",
              c.out);
    const char *env2[] = {"ZS_EMU_DEVICES=3", NULL};
    emu_run_child(&c, "devices", env2);
    EMU_CHECK(c.exited && c.code == 0 && emu_has(&c, "count 3 bus0 00000000:10:00.0"), "child: %s",
              c.out);
}

static int child_devices(void)
{
    int n;
    char bus[32];
    EMU_CUDA(cudaGetDeviceCount(&n));
    EMU_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    printf("count %d bus0 %s\n", n, bus);
    return 0;
}

static void test_two_devices(void)
{
    printf("two devices: per-thread current device, per-device memory, cross-device copy\n");
    emu_child c;
    const char *env[] = {"ZS_EMU_DEVICES=2", "ZS_EMU_MEM_MB=16", NULL};
    emu_run_child(&c, "two_devices", env);
    EMU_CHECK(c.exited && c.code == 0, "child: %s", c.out);
}

static int child_two_devices(void)
{
    int *a, *b, h[256], dev = -1;
    for (int i = 0; i < 256; i++)
        h[i] = i * 7;
    EMU_CUDA(cudaMalloc((void **)&a, sizeof h));
    EMU_CUDA(cudaSetDevice(1));
    EMU_CUDA(cudaGetDevice(&dev));
    EMU_CHECK(dev == 1, "device %d", dev);
    EMU_CUDA(cudaMalloc((void **)&b, sizeof h));
    EMU_CHECK(zs_emu_dev_ptr(a, 4) == 0 && zs_emu_dev_ptr(b, 4) == 1, "devices of pointers");
    struct cudaPointerAttributes at;
    EMU_CUDA(cudaPointerGetAttributes(&at, a));
    EMU_CHECK(at.device == 0, "attr device %d", at.device);
    /* The memory limit is per device: 12 MiB fits on each. */
    void *big0, *big1;
    EMU_CUDA(cudaMalloc(&big1, 12 << 20));
    EMU_CUDA(cudaSetDevice(0));
    EMU_CUDA(cudaMalloc(&big0, 12 << 20));
    EMU_CUDA(cudaMemcpy(a, h, sizeof h, cudaMemcpyHostToDevice));
    cudaStream_t s1;
    EMU_CUDA(cudaSetDevice(1));
    EMU_CUDA(cudaStreamCreate(&s1));
    EMU_CUDA(cudaDeviceSynchronize());
    EMU_CUDA(cudaSetDevice(0));
    EMU_CUDA(cudaDeviceSynchronize());
    /* Device 1's stream copies device 0's memory into its own. */
    EMU_CUDA(cudaMemcpyAsync(b, a, sizeof h, cudaMemcpyDeviceToDevice, s1));
    EMU_CUDA(cudaStreamSynchronize(s1));
    memset(h, 0, sizeof h);
    EMU_CUDA(cudaMemcpy(h, b, sizeof h, cudaMemcpyDefault));
    EMU_CHECK(h[255] == 255 * 7, "cross-device copy %d", h[255]);
    /* cudaPointerAttributes::device of registered or cudaHostAlloc memory:
     * "the device which was current when the memory was allocated or
     * registered", not the current one. */
    void *ph;
    EMU_CUDA(cudaSetDevice(1));
    EMU_CUDA(cudaHostRegister(h, sizeof h, 0));
    EMU_CUDA(cudaMallocHost(&ph, 64));
    EMU_CUDA(cudaSetDevice(0));
    EMU_CUDA(cudaPointerGetAttributes(&at, h));
    EMU_CHECK(at.type == cudaMemoryTypeHost && at.device == 1, "registered on 1: device %d",
              at.device);
    EMU_CUDA(cudaPointerGetAttributes(&at, ph));
    EMU_CHECK(at.type == cudaMemoryTypeHost && at.device == 1, "allocated on 1: device %d",
              at.device);
    EMU_CUDA(cudaHostUnregister(h));
    EMU_CUDA(cudaFreeHost(ph));
    return 0;
}

static int g_log[200], g_nlog;
static void log_fn(void *p)
{
    g_log[g_nlog++] = (int)(intptr_t)p;
}

static void test_stream_order(void)
{
    printf("stream order: 100 host functions and copies in one stream run in order\n");
    cudaStream_t s;
    EMU_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d;
    int h = 0;
    EMU_CUDA(cudaMalloc((void **)&d, sizeof(int)));
    g_nlog = 0;
    for (int i = 0; i < 100; i++)
        EMU_CUDA(cudaLaunchHostFunc(s, log_fn, (void *)(intptr_t)i));
    EMU_CUDA(cudaMemsetAsync(d, 0, sizeof(int), s));
    EMU_CUDA(cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, s));
    EMU_CUDA(cudaStreamSynchronize(s));
    EMU_CHECK(g_nlog == 100, "ran %d", g_nlog);
    for (int i = 0; i < 100; i++)
        EMU_CHECK(g_log[i] == i, "log[%d] = %d", i, g_log[i]);
    EMU_CHECK(h == 0, "memset then copy: %d", h);
    EMU_CUDA(cudaFree(d));
    EMU_CUDA(cudaStreamDestroy(s));
}

static atomic_int g_flag, g_seen;
static void read_flag_fn(void *p)
{
    (void)p;
    atomic_store(&g_seen, atomic_load(&g_flag) ? 1 : 2);
}

static void test_event_wait(void)
{
    printf("events: a wait across streams orders work; re-recording captures the new point\n");
    cudaStream_t a, b;
    cudaEvent_t ev;
    EMU_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    EMU_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    EMU_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    EMU_CHECK(cudaEventQuery(ev) == cudaSuccess, "never recorded event is complete");
    enqueue_slow(a, 100, &g_flag);
    EMU_CUDA(cudaEventRecord(ev, a));
    EMU_CUDA(cudaStreamWaitEvent(b, ev, 0));
    atomic_store(&g_seen, 0);
    EMU_CUDA(cudaLaunchHostFunc(b, read_flag_fn, NULL));
    EMU_CUDA(cudaStreamSynchronize(b));
    EMU_CHECK(atomic_load(&g_seen) == 1, "b ran before a's work: %d", atomic_load(&g_seen));
    /* A wait issued before a re-record keeps the old capture: b must not
     * wait for a's second slow item. */
    EMU_CUDA(cudaStreamWaitEvent(b, ev, 0));
    enqueue_slow(a, 400, &g_flag);
    EMU_CUDA(cudaEventRecord(ev, a));
    atomic_store(&g_seen, 0);
    EMU_CUDA(cudaLaunchHostFunc(b, read_flag_fn, NULL));
    EMU_CUDA(cudaStreamSynchronize(b));
    EMU_CHECK(atomic_load(&g_seen) == 2, "b waited for the later record");
    EMU_CHECK(cudaEventQuery(ev) == cudaErrorNotReady, "re-recorded event pending");
    (void)cudaGetLastError();
    EMU_CUDA(cudaEventSynchronize(ev));
    EMU_CHECK(atomic_load(&g_flag) == 1, "synchronize waited for the new capture");
    EMU_CUDA(cudaEventDestroy(ev));
    EMU_CUDA(cudaStreamDestroy(a));
    EMU_CUDA(cudaStreamDestroy(b));
}

static atomic_int g_active, g_max_active;
static pthread_t g_hf_thread[8];
static atomic_int g_nhf;
static void overlap_fn(void *p)
{
    (void)p;
    int a = atomic_fetch_add(&g_active, 1) + 1;
    if (a > atomic_load(&g_max_active))
        atomic_store(&g_max_active, a);
    g_hf_thread[atomic_fetch_add(&g_nhf, 1)] = pthread_self();
    sleep_ms(30);
    atomic_fetch_sub(&g_active, 1);
}

static void test_hostfn_serial(void)
{
    printf("host functions: of 4 independent streams, never two at once, all on one thread\n");
    cudaStream_t s[4];
    atomic_store(&g_nhf, 0);
    for (int i = 0; i < 4; i++)
        EMU_CUDA(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    for (int i = 0; i < 4; i++)
        EMU_CUDA(cudaLaunchHostFunc(s[i], overlap_fn, NULL));
    EMU_CUDA(cudaDeviceSynchronize());
    EMU_CHECK(atomic_load(&g_max_active) == 1, "max concurrent %d", atomic_load(&g_max_active));
    EMU_CHECK(atomic_load(&g_nhf) == 4, "ran %d", atomic_load(&g_nhf));
    for (int i = 1; i < 4; i++)
        EMU_CHECK(pthread_equal(g_hf_thread[i], g_hf_thread[0]), "thread %d differs", i);
    for (int i = 0; i < 4; i++)
        EMU_CUDA(cudaStreamDestroy(s[i]));
}

static void test_not_ready(void)
{
    printf("not ready: cudaStreamQuery/cudaEventQuery record it as the last error\n");
    cudaStream_t s;
    cudaEvent_t ev;
    atomic_int f;
    EMU_CUDA(cudaStreamCreate(&s));
    EMU_CUDA(cudaEventCreate(&ev));
    EMU_CHECK(cudaGetLastError() == cudaSuccess, "clean");
    enqueue_slow(s, 400, &f);
    EMU_CUDA(cudaEventRecord(ev, s));
    EMU_CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "stream busy");
    EMU_CHECK(cudaPeekAtLastError() == cudaErrorNotReady, "peek keeps it");
    EMU_CHECK(cudaGetLastError() == cudaErrorNotReady, "last error is not ready");
    EMU_CHECK(cudaGetLastError() == cudaSuccess, "reset");
    EMU_CHECK(cudaEventQuery(ev) == cudaErrorNotReady, "event busy");
    EMU_CHECK(cudaGetLastError() == cudaErrorNotReady, "last error is not ready (event)");
    EMU_CUDA(cudaEventSynchronize(ev));
    EMU_CUDA(cudaStreamQuery(s));
    EMU_CUDA(cudaEventQuery(ev));
    EMU_CHECK(cudaGetLastError() == cudaSuccess, "clean after completion");
    EMU_CUDA(cudaEventDestroy(ev));
    EMU_CUDA(cudaStreamDestroy(s));
}

static void test_legacy(void)
{
    printf("legacy stream: waits for blocking streams (and the per-thread stream), not for "
           "non-blocking ones\n");
    cudaStream_t blk, nb;
    cudaEvent_t ev;
    atomic_int f1, f2;
    EMU_CUDA(cudaStreamCreate(&blk));
    EMU_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    EMU_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    enqueue_slow(blk, 100, &f1);
    EMU_CUDA(cudaEventRecord(ev, 0));
    EMU_CUDA(cudaEventSynchronize(ev));
    EMU_CHECK(atomic_load(&f1) == 1, "legacy work ran before the blocking stream's work");
    enqueue_slow(nb, 400, &f2);
    EMU_CUDA(cudaEventRecord(ev, cudaStreamLegacy));
    EMU_CUDA(cudaEventSynchronize(ev));
    EMU_CHECK(atomic_load(&f2) == 0, "legacy work waited for a non-blocking stream");
    /* ...and a blocking stream waits for earlier legacy work. */
    enqueue_slow(0, 100, &f1);
    EMU_CUDA(cudaEventRecord(ev, blk));
    EMU_CUDA(cudaEventSynchronize(ev));
    EMU_CHECK(atomic_load(&f1) == 1, "blocking stream ran before earlier legacy work");
    /* The per-thread default stream is a blocking stream too (3. Stream
     * synchronization behavior). */
    enqueue_slow(cudaStreamPerThread, 100, &f1);
    EMU_CUDA(cudaEventRecord(ev, 0));
    EMU_CUDA(cudaEventSynchronize(ev));
    EMU_CHECK(atomic_load(&f1) == 1, "legacy work ran before the per-thread stream's work");
    EMU_CUDA(cudaDeviceSynchronize());
    EMU_CHECK(atomic_load(&f2) == 1, "device synchronize waits for all streams");
    EMU_CUDA(cudaEventDestroy(ev));
    EMU_CUDA(cudaStreamDestroy(blk));
    EMU_CUDA(cudaStreamDestroy(nb));
}

static void test_copies(void)
{
    printf("copies: API synchronization behavior for pageable and pinned memory\n");
    enum { N = 1024 };
    int *d, *pinned, pageable[N], out[N];
    atomic_int f;
    EMU_CUDA(cudaMalloc((void **)&d, N * sizeof(int)));
    EMU_CUDA(cudaMallocHost((void **)&pinned, N * sizeof(int)));
    struct cudaPointerAttributes at;
    EMU_CUDA(cudaPointerGetAttributes(&at, d + 5));
    EMU_CHECK(at.type == cudaMemoryTypeDevice && at.device == 0, "device attrs");
    EMU_CUDA(cudaPointerGetAttributes(&at, pinned));
    EMU_CHECK(at.type == cudaMemoryTypeHost, "pinned attrs");
    EMU_CUDA(cudaPointerGetAttributes(&at, pageable));
    EMU_CHECK(at.type == cudaMemoryTypeUnregistered, "pageable attrs");
    EMU_CHECK(zs_emu_dev_ptr(d, N * sizeof(int)) == 0 && zs_emu_dev_ptr(d, N * 4 + 1) == -1 &&
                  zs_emu_dev_ptr(pinned, 4) == -1,
              "zs_emu_dev_ptr");

    /* Pageable H2D: returns once staged, before the copy is done. */
    for (int i = 0; i < N; i++)
        pageable[i] = i;
    enqueue_slow(0, 400, &f);
    EMU_CUDA(cudaMemcpy(d, pageable, sizeof pageable, cudaMemcpyHostToDevice));
    EMU_CHECK(atomic_load(&f) == 0, "pageable H2D cudaMemcpy waited for the stream");
    pageable[7] = -1; /* staged already: must not reach the device */
    /* D2H: returns only once complete. */
    EMU_CUDA(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    EMU_CHECK(atomic_load(&f) == 1, "D2H cudaMemcpy returned early");
    EMU_CHECK(out[7] == 7 && out[N - 1] == N - 1, "staged H2D copy: %d", out[7]);

    /* Pinned H2D: synchronous. */
    for (int i = 0; i < N; i++)
        pinned[i] = 2 * i;
    enqueue_slow(0, 100, &f);
    EMU_CUDA(cudaMemcpy(d, pinned, N * sizeof(int), cudaMemcpyDefault));
    EMU_CHECK(atomic_load(&f) == 1, "pinned H2D cudaMemcpy returned early");

    /* D2D: no host synchronisation. */
    int *d2;
    EMU_CUDA(cudaMalloc((void **)&d2, N * sizeof(int)));
    enqueue_slow(0, 400, &f);
    EMU_CUDA(cudaMemcpy(d2, d, N * sizeof(int), cudaMemcpyDeviceToDevice));
    EMU_CHECK(atomic_load(&f) == 0, "D2D cudaMemcpy waited");

    /* Async with pageable memory: fully asynchronous (hostile reading):
     * the source is read when the stream gets there. */
    cudaStream_t s;
    EMU_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < N; i++)
        pageable[i] = 3 * i;
    enqueue_slow(s, 400, &f);
    EMU_CUDA(cudaMemcpyAsync(d, pageable, sizeof pageable, cudaMemcpyHostToDevice, s));
    EMU_CHECK(atomic_load(&f) == 0, "async pageable H2D blocked");
    pageable[9] = -9;
    memset(out, 0, sizeof out);
    EMU_CUDA(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, s));
    EMU_CHECK(out[9] == 0, "async pageable D2H completed before return");
    EMU_CUDA(cudaStreamSynchronize(s));
    EMU_CHECK(out[9] == -9 && out[10] == 30, "async pageable source read late: %d", out[9]);

    /* cudaMemset on device memory is asynchronous. */
    enqueue_slow(0, 400, &f);
    EMU_CUDA(cudaMemset(d, 0, N * sizeof(int)));
    EMU_CHECK(atomic_load(&f) == 0, "cudaMemset waited");
    EMU_CUDA(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    EMU_CHECK(out[0] == 0 && out[N - 1] == 0, "memset");

    /* Errors: out of range device copy, bad direction enum. */
    EMU_CHECK(cudaMemcpy(out, d + 1, N * sizeof(int), cudaMemcpyDeviceToHost) ==
                  cudaErrorInvalidValue,
              "overrun of a device allocation");
    EMU_CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error");
    EMU_CUDA(cudaStreamDestroy(s));
    EMU_CUDA(cudaFree(d));
    EMU_CUDA(cudaFree(d2));
    EMU_CUDA(cudaFreeHost(pinned));
    EMU_CHECK(cudaFree(d) == cudaErrorInvalidValue, "double free");
    (void)cudaGetLastError();
}

/* Expect call == err, and err as the thread's last error (reset). */
#define EMU_EXPECT(call, err, what)                                                                \
    do {                                                                                           \
        cudaError_t got_ = (call);                                                                 \
        EMU_CHECK(got_ == (err), "%s: %s returned %s", what, #call, cudaGetErrorName(got_));       \
        EMU_CHECK(cudaGetLastError() == (err), "%s: last error", what);                            \
    } while (0)

static void test_host_register(void)
{
    printf("cudaHostRegister/cudaHostUnregister: pinned while registered, the documented "
           "errors\n");
    enum { PG = 4096, NPG = 4 };
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    EMU_CHECK(page == PG, "page size %zu", page);
    /* The device reports what cudaHostRegister's documentation asks about:
     * cudaDevAttrHostRegisterSupported ("supported only on ... devices that
     * have a non-zero value"), no cudaDevAttrHostRegisterReadOnlySupported,
     * cudaDevAttrCanUseHostPointerForRegisteredMem. */
    struct cudaDeviceProp prop;
    EMU_CUDA(cudaGetDeviceProperties(&prop, 0));
    EMU_CHECK(prop.hostRegisterSupported == 1 && prop.hostRegisterReadOnlySupported == 0 &&
                  prop.canUseHostPointerForRegisteredMem == 1 &&
                  prop.pageableMemoryAccessUsesHostPageTables == 0,
              "register properties");

    char *buf = mmap(NULL, NPG * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EMU_CHECK(buf != MAP_FAILED, "mmap");
    /* Runtime API, Memory Management, cudaHostRegister returns
     * cudaErrorInvalidValue: NULL, an empty range, an undefined flag. */
    EMU_EXPECT(cudaHostRegister(NULL, PG, 0), cudaErrorInvalidValue, "NULL");
    EMU_EXPECT(cudaHostRegister(buf, 0, 0), cudaErrorInvalidValue, "size 0");
    EMU_EXPECT(cudaHostRegister(buf, PG, 0x100), cudaErrorInvalidValue, "undefined flag");
    /* cudaHostRegisterReadOnly on a device without
     * cudaDevAttrHostRegisterReadOnlySupported: "will cause cudaHostRegister
     * to error with cudaErrorNotSupported". cudaHostRegisterIoMemory: not
     * emulated, cudaErrorNotSupported (a documented return). */
    EMU_EXPECT(cudaHostRegister(buf, PG, cudaHostRegisterReadOnly), cudaErrorNotSupported,
               "read-only flag");
    EMU_EXPECT(cudaHostRegister(buf, PG, cudaHostRegisterIoMemory), cudaErrorNotSupported,
               "I/O memory flag");

    /* Register pages 1-2 of 4. */
    char *reg = buf + PG;
    size_t rn = 2 * PG;
    struct cudaPointerAttributes at;
    EMU_CUDA(cudaPointerGetAttributes(&at, reg));
    EMU_CHECK(at.type == cudaMemoryTypeUnregistered, "attrs before registering");
    EMU_CUDA(cudaHostRegister(reg, rn, cudaHostRegisterDefault));
    /* cudaPointerGetAttributes: "cudaMemoryTypeHost for registered host
     * memory"; device: the one current when registered; both pointers the
     * same (cudaDevAttrCanUseHostPointerForRegisteredMem). */
    EMU_CUDA(cudaPointerGetAttributes(&at, reg + 100));
    EMU_CHECK(at.type == cudaMemoryTypeHost && at.device == 0 && at.hostPointer == reg + 100 &&
                  at.devicePointer == reg + 100,
              "registered attrs: type %d device %d", (int)at.type, at.device);
    EMU_CUDA(cudaPointerGetAttributes(&at, buf));
    EMU_CHECK(at.type == cudaMemoryTypeUnregistered, "page before the registration");
    EMU_CUDA(cudaPointerGetAttributes(&at, reg + rn));
    EMU_CHECK(at.type == cudaMemoryTypeUnregistered, "page after the registration");
    /* cudaHostGetDevicePointer: the host pointer ("will match the original
     * pointer" when every device has the attribute); flags "must be 0". */
    void *dp = NULL;
    EMU_CUDA(cudaHostGetDevicePointer(&dp, reg + 8, 0));
    EMU_CHECK(dp == reg + 8, "device pointer %p", dp);
    EMU_EXPECT(cudaHostGetDevicePointer(&dp, reg, 1), cudaErrorInvalidValue, "flags 1");
    EMU_EXPECT(cudaHostGetDevicePointer(&dp, buf, 0), cudaErrorInvalidValue, "pageable");
    /* cudaHostGetFlags "will fail if the input pointer does not reside in an
     * address range allocated by cudaHostAlloc()" (hostile: registered
     * memory too); cudaHostAlloc memory gives back its flags. */
    unsigned fl = 99;
    EMU_EXPECT(cudaHostGetFlags(&fl, reg), cudaErrorInvalidValue, "flags of registered memory");
    char *pinned;
    EMU_CUDA(cudaHostAlloc((void **)&pinned, 1000, cudaHostAllocPortable | cudaHostAllocMapped));
    EMU_CUDA(cudaHostGetFlags(&fl, pinned + 10));
    EMU_CHECK(fl == (cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc flags %u", fl);

    /* cudaErrorHostMemoryAlreadyRegistered: "the memory range passed to
     * cudaHostRegister() has already been registered": the same range, one
     * overlapping by a page, one inside, and cudaHostAlloc memory (same
     * tracking mechanism). */
    EMU_EXPECT(cudaHostRegister(reg, rn, 0), cudaErrorHostMemoryAlreadyRegistered, "same range");
    EMU_EXPECT(cudaHostRegister(buf, 2 * PG, 0), cudaErrorHostMemoryAlreadyRegistered,
               "overlap from below");
    EMU_EXPECT(cudaHostRegister(reg + rn - 1, PG, 0), cudaErrorHostMemoryAlreadyRegistered,
               "overlap by one byte");
    EMU_EXPECT(cudaHostRegister(reg + 64, 64, cudaHostRegisterPortable),
               cudaErrorHostMemoryAlreadyRegistered, "inside");
    EMU_EXPECT(cudaHostRegister(pinned, 1000, 0), cudaErrorHostMemoryAlreadyRegistered,
               "cudaHostAlloc memory");
    /* The neighbouring pages are still free to register. */
    EMU_CUDA(cudaHostRegister(buf, PG, cudaHostRegisterPortable | cudaHostRegisterMapped));
    EMU_CUDA(cudaHostUnregister(buf));

    /* Not host memory, or not mapped read-write: cudaErrorInvalidValue
     * (read-only memory needs cudaHostRegisterReadOnly, unsupported). */
    int *d;
    EMU_CUDA(cudaMalloc((void **)&d, 4096));
    EMU_EXPECT(cudaHostRegister(d, 4096, 0), cudaErrorInvalidValue, "device memory");
    char *ro = mmap(NULL, 2 * PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EMU_CHECK(ro != MAP_FAILED, "mmap ro");
    EMU_EXPECT(cudaHostRegister(ro, PG, 0), cudaErrorInvalidValue, "read-only memory");
    munmap(ro + PG, PG);
    EMU_CHECK(mprotect(ro, PG, PROT_READ | PROT_WRITE) == 0, "mprotect");
    EMU_EXPECT(cudaHostRegister(ro, 2 * PG, 0), cudaErrorInvalidValue, "partly unmapped");
    EMU_CUDA(cudaHostRegister(ro, PG, 0));
    EMU_CUDA(cudaHostUnregister(ro));
    munmap(ro, PG);

    /* Pinned for copies and memsets (API synchronization behavior): pinned
     * H2D cudaMemcpy is synchronous, pageable H2D returns once staged. */
    int *src = (int *)reg;
    int n = (int)(rn / sizeof(int)), out[16];
    atomic_int f;
    for (int i = 0; i < n; i++)
        src[i] = i;
    enqueue_slow(0, 100, &f);
    EMU_CUDA(cudaMemcpy(d, src, 4096, cudaMemcpyHostToDevice));
    EMU_CHECK(atomic_load(&f) == 1, "registered H2D cudaMemcpy returned before the copy");
    /* A copy running past the registration's end touches pageable memory:
     * staged, returns early. */
    enqueue_slow(0, 400, &f);
    EMU_CUDA(cudaMemcpy(d, reg + rn - 2048, 4096, cudaMemcpyHostToDevice));
    EMU_CHECK(atomic_load(&f) == 0, "straddling H2D cudaMemcpy waited (pinned?)");
    EMU_CUDA(cudaDeviceSynchronize());
    /* Memset: "asynchronous ... except when the target memory is pinned host
     * memory": done on return; pageable memory is no target. */
    EMU_CUDA(cudaMemset(reg, 7, 64));
    EMU_CHECK(reg[0] == 7 && reg[63] == 7 && reg[64] != 7, "memset of registered memory");
    /* cudaMemcpyAsync from a device to registered memory: fully
     * asynchronous. */
    cudaStream_t s;
    EMU_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    EMU_CUDA(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    enqueue_slow(s, 400, &f);
    EMU_CUDA(cudaMemcpyAsync(reg + 1024, d, 64, cudaMemcpyDeviceToHost, s));
    EMU_CHECK(atomic_load(&f) == 0 && src[256] == 256 && out[0] != 256,
              "async D2H into registered memory was synchronous");
    EMU_CUDA(cudaStreamSynchronize(s));
    EMU_CHECK(src[256] == out[0] && src[271] == out[15], "async D2H result %d", src[256]);
    EMU_CUDA(cudaStreamDestroy(s));

    /* cudaHostUnregister: "The base address must be the same one specified
     * to cudaHostRegister()"; otherwise cudaErrorHostMemoryNotRegistered
     * ("does not correspond to any currently registered memory region"). */
    EMU_EXPECT(cudaHostUnregister(reg + PG), cudaErrorHostMemoryNotRegistered, "interior pointer");
    EMU_EXPECT(cudaHostUnregister(buf), cudaErrorHostMemoryNotRegistered, "never registered");
    EMU_EXPECT(cudaHostUnregister(pinned), cudaErrorHostMemoryNotRegistered, "cudaHostAlloc");
    EMU_EXPECT(cudaHostUnregister(NULL), cudaErrorInvalidValue, "NULL");
    /* cudaFreeHost: the pointer "must have been returned by ... cudaMallocHost()
     * or cudaHostAlloc()". */
    EMU_EXPECT(cudaFreeHost(reg), cudaErrorInvalidValue, "cudaFreeHost of registered memory");
    EMU_CUDA(cudaHostUnregister(reg));
    EMU_EXPECT(cudaHostUnregister(reg), cudaErrorHostMemoryNotRegistered, "second unregister");

    /* "makes it pageable again": attributes, copies and memsets follow. */
    EMU_CUDA(cudaPointerGetAttributes(&at, reg));
    EMU_CHECK(at.type == cudaMemoryTypeUnregistered, "attrs after unregistering");
    enqueue_slow(0, 400, &f);
    EMU_CUDA(cudaMemcpy(d, src, 4096, cudaMemcpyHostToDevice));
    EMU_CHECK(atomic_load(&f) == 0, "H2D from unregistered memory waited (still pinned?)");
    EMU_CUDA(cudaDeviceSynchronize());
    EMU_EXPECT(cudaMemset(reg, 0, 64), cudaErrorInvalidValue, "memset of unregistered memory");
    /* ...and it can be registered again. */
    EMU_CUDA(cudaHostRegister(reg, rn, 0));
    EMU_CUDA(cudaHostUnregister(reg));

    EMU_CUDA(cudaFree(d));
    EMU_CUDA(cudaFreeHost(pinned));
    munmap(buf, NPG * PG);

    /* Unmapping (or, under ASan, freeing) registered memory before
     * cudaHostUnregister ("must be unregistered with cudaHostUnregister()")
     * dies at the unregister. */
    emu_child c;
    emu_run_child(&c, "unmap_registered", NULL);
    EMU_CHECK(emu_died(&c) && emu_has(&c, "cuda-emu: cudaHostUnregister:") &&
                  emu_has(&c, "were unmapped while registered"),
              "child: %s", c.out);
    if (ASAN_BUILD) {
        emu_run_child(&c, "free_registered", NULL);
        EMU_CHECK(emu_died(&c) && emu_has(&c, "cuda-emu: cudaHostUnregister:") &&
                      emu_has(&c, "were freed while registered"),
                  "child: %s", c.out);
    }
}

static int child_unmap_registered(void)
{
    char *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EMU_CHECK(p != MAP_FAILED, "mmap");
    EMU_CUDA(cudaHostRegister(p, 8192, 0));
    munmap(p, 8192);
    cudaHostUnregister(p);
    return 0;
}

static int child_free_registered(void)
{
    char *p = malloc(1000);
    EMU_CUDA(cudaHostRegister(p, 1000, 0));
    volatile uintptr_t a = (uintptr_t)p; /* no -Wuse-after-free: on purpose */
    free(p);
    cudaHostUnregister((void *)a);
    return 0;
}

static void test_free_async(void)
{
    printf("cudaFreeAsync: invalid at once, poisoned when reached; use after it dies\n");
    cudaStream_t s;
    EMU_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *p;
    size_t fr0, fr1, tot;
    EMU_CUDA(cudaMemGetInfo(&fr0, &tot));
    EMU_CUDA(cudaMallocAsync((void **)&p, 1 << 20, s));
    EMU_CHECK(zs_emu_dev_ptr(p, 1 << 20) == 0, "live");
    EMU_CUDA(cudaMemsetAsync(p, 0, 1 << 20, s));
    EMU_CUDA(cudaFreeAsync(p, s));
    EMU_CHECK(zs_emu_dev_ptr(p, 4) == -1, "still valid after cudaFreeAsync");
    EMU_CUDA(cudaStreamSynchronize(s));
    EMU_CUDA(cudaMemGetInfo(&fr1, &tot));
    EMU_CHECK(fr1 == fr0, "memory returned: %zu vs %zu", fr1, fr0);
    if (!ASAN_BUILD) {
        /* Protected build: freed allocations stay known (quarantine). Under
         * ASan the copy would be ASan's use-after-free report instead. */
        float h;
        EMU_CHECK(cudaMemcpy(&h, p, 4, cudaMemcpyDefault) == cudaErrorInvalidValue,
                  "copy from freed device memory");
        (void)cudaGetLastError();
    }
    EMU_CUDA(cudaStreamDestroy(s));
    emu_child c;
    emu_run_child(&c, "use_after_free_async", NULL);
    EMU_CHECK(!(c.exited && c.code == 0), "use after free passed: %s", c.out);
    EMU_CHECK(ASAN_BUILD ? emu_has(&c, "use-after-free") : emu_has(&c, "access to freed memory"),
              "message: %s", c.out);
}

static cudaError_t read_fn(void *p)
{
    volatile float *f = p;
    return f[0] == 0.0f ? cudaSuccess : cudaErrorUnknown;
}

static int child_use_after_free_async(void)
{
    float *p;
    EMU_CUDA(cudaMallocAsync((void **)&p, 4096, 0));
    EMU_CUDA(cudaMemsetAsync(p, 0, 4096, 0));
    EMU_CUDA(cudaFreeAsync(p, 0));
    EMU_CUDA(cudaDeviceSynchronize());
    /* Work not ordered before the free: reads freed memory. */
    EMU_CUDA(zs_emu_enqueue(0, read_fn, p, NULL));
    EMU_CUDA(cudaDeviceSynchronize());
    return 0;
}

static void test_mem_limit(void)
{
    printf("memory limit: ZS_EMU_MEM_MB=64 -> cudaErrorMemoryAllocation\n");
    emu_child c;
    const char *env[] = {"ZS_EMU_MEM_MB=64", NULL};
    emu_run_child(&c, "mem_limit", env);
    EMU_CHECK(c.exited && c.code == 0, "child: %s", c.out);
}

static int child_mem_limit(void)
{
    void *a, *b;
    size_t fr, tot;
    EMU_CUDA(cudaMalloc(&a, 48 << 20));
    EMU_CUDA(cudaMemGetInfo(&fr, &tot));
    EMU_CHECK(tot == 64 << 20 && fr == 16 << 20, "info %zu %zu", fr, tot);
    EMU_CHECK(cudaMalloc(&b, 32 << 20) == cudaErrorMemoryAllocation, "over the limit");
    EMU_CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error");
    EMU_CUDA(cudaFree(a));
    EMU_CUDA(cudaMalloc(&b, 32 << 20));
    return 0;
}

static cudaError_t fail_fn(void *p)
{
    (void)p;
    return cudaErrorIllegalAddress;
}

static void test_sticky(void)
{
    printf("sticky error: poisons the context, every later call returns it\n");
    emu_child c;
    emu_run_child(&c, "sticky", NULL);
    EMU_CHECK(c.exited && c.code == 0, "child: %s", c.out);
}

static int child_sticky(void)
{
    void *p;
    EMU_CUDA(zs_emu_enqueue(0, fail_fn, NULL, NULL));
    EMU_CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress, "sync");
    EMU_CHECK(cudaMalloc(&p, 16) == cudaErrorIllegalAddress, "malloc");
    EMU_CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "get last error");
    EMU_CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "not reset");
    cudaStream_t s;
    EMU_CHECK(cudaStreamCreate(&s) == cudaErrorIllegalAddress, "stream create");
    EMU_CHECK(zs_emu_enqueue(0, fail_fn, NULL, NULL) == cudaErrorIllegalAddress, "enqueue");
    EMU_CHECK(!strcmp(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress"),
              "name");
    return 0;
}

static void call_cuda_fn(void *p)
{
    (void)p;
    void *x;
    cudaMalloc(&x, 16);
}

static void test_hostfn_cuda_call(void)
{
    printf("host function calling cudaMalloc dies naming the call\n");
    emu_child c;
    emu_run_child(&c, "hostfn_cuda", NULL);
    EMU_CHECK(emu_died(&c) && emu_has(&c, "cuda-emu: cudaMalloc:") &&
                  emu_has(&c, "inside a host function"),
              "child: %s", c.out);
}

static int child_hostfn_cuda(void)
{
    EMU_CUDA(cudaLaunchHostFunc(0, call_cuda_fn, NULL));
    cudaDeviceSynchronize();
    return 0;
}

static void test_protected(void)
{
    emu_child c;
    if (ASAN_BUILD) {
        printf("protected mode: skipped (ASan build: device memory is heap memory)\n");
        return;
    }
    printf("protected mode: a host read of device memory dies with the allocation named\n");
    emu_run_child(&c, "host_read", NULL);
    EMU_CHECK(emu_died(&c) && emu_has(&c, "cuda-emu: host access to device memory at") &&
                  emu_has(&c, "allocation of 4096 bytes from cudaMalloc"),
              "child: %s", c.out);
}

static int child_host_read(void)
{
    float *p;
    EMU_CUDA(cudaMalloc((void **)&p, 4096));
    /* Back-to-back work keeps the window open; the synchronize must still
     * return with it closed. */
    for (int i = 0; i < 20; i++)
        EMU_CUDA(cudaMemset(p, i, 4096));
    EMU_CUDA(cudaStreamSynchronize(0));
    volatile float *v = p;
    printf("read %f\n", v[10]);
    return 0;
}

int main(int argc, char **argv)
{
    emu_self = argv[0];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 3 && !strcmp(argv[1], "child")) {
        const char *n = argv[2];
        if (!strcmp(n, "devices"))
            return child_devices();
        if (!strcmp(n, "two_devices"))
            return child_two_devices();
        if (!strcmp(n, "use_after_free_async"))
            return child_use_after_free_async();
        if (!strcmp(n, "mem_limit"))
            return child_mem_limit();
        if (!strcmp(n, "sticky"))
            return child_sticky();
        if (!strcmp(n, "hostfn_cuda"))
            return child_hostfn_cuda();
        if (!strcmp(n, "host_read"))
            return child_host_read();
        if (!strcmp(n, "unmap_registered"))
            return child_unmap_registered();
        if (!strcmp(n, "free_registered"))
            return child_free_registered();
        return 2;
    }
    test_devices();
    test_two_devices();
    test_stream_order();
    test_event_wait();
    test_hostfn_serial();
    test_not_ready();
    test_legacy();
    test_copies();
    test_host_register();
    test_free_async();
    test_mem_limit();
    test_sticky();
    test_hostfn_cuda_call();
    test_protected();
    printf("test_emu_runtime: all passed\n");
    return 0;
}
