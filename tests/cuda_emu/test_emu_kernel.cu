/*
 * test_emu_kernel.cu - tests of the CUDA emulator's kernel side
 * (tests/cuda_emu/), compiled by g++ through zs_emu_cu_sources: a block
 * reduction with __syncthreads under the forward, reverse and random
 * schedules, the same reduction without one barrier going wrong under some
 * schedule, a divergent barrier and a partial-mask shuffle dying with
 * file:line, launch-configuration errors, dynamic and static shared memory
 * (poisoned per block), warp shuffles and votes, atomics, argument passing.
 * Cases that need another schedule or must die run in child processes.
 */
#include <cmath>
#include <cstdint>
#include <ctime>
#include <unistd.h>

#include "emu_test.h"

#ifndef ZS_CUDA_LAUNCH /* what our code does; the shim defined it already */
#define ZS_CUDA_LAUNCH(k, g, b, sh, st, ...) k<<<g, b, sh, st>>>(__VA_ARGS__)
#endif

/* ---- Block reduction, with and without the barrier inside the tree ---- */
template <bool Barrier> __global__ void k_reduce(const float *x, float *out, int n)
{
    __shared__ float s[256];
    int t = threadIdx.x;
    float v = 0.f;
    for (int i = blockIdx.x * 256 + t; i < n; i += gridDim.x * 256)
        v += x[i];
    s[t] = v;
    __syncthreads();
    for (int k = 128; k > 0; k >>= 1) {
        if (t < k)
            s[t] += s[t + k];
        if (Barrier || k > 32)
            __syncthreads();
    }
    if (t == 0)
        out[blockIdx.x] = s[0];
}

static double run_reduce(bool barrier)
{
    const int n = 1 << 14, blocks = 8;
    float *x, *o, h[n], r[blocks];
    double want = 0;
    for (int i = 0; i < n; i++) {
        h[i] = (float)(i % 97);
        want += h[i];
    }
    EMU_CUDA(cudaMalloc(&x, sizeof h));
    EMU_CUDA(cudaMalloc(&o, sizeof r));
    EMU_CUDA(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice));
    if (barrier)
        ZS_CUDA_LAUNCH(k_reduce<true>, blocks, 256, 0, 0, x, o, n);
    else
        ZS_CUDA_LAUNCH(k_reduce<false>, blocks, 256, 0, 0, x, o, n);
    EMU_CUDA(cudaGetLastError());
    EMU_CUDA(cudaMemcpy(r, o, sizeof r, cudaMemcpyDeviceToHost));
    double got = 0;
    for (int b = 0; b < blocks; b++)
        got += r[b];
    EMU_CUDA(cudaFree(x));
    EMU_CUDA(cudaFree(o));
    return got - want;
}

static const char *const schedules[] = {"ZS_EMU_SCHEDULE=forward", "ZS_EMU_SCHEDULE=reverse",
                                        "ZS_EMU_SCHEDULE=random:1", "ZS_EMU_SCHEDULE=random:7",
                                        NULL};

static void test_reduce(void)
{
    printf("reduction with __syncthreads: exact under forward, reverse, random:1, random:7\n");
    for (int i = 0; schedules[i]; i++) {
        const char *env[] = {schedules[i], NULL};
        emu_child c;
        emu_run_child(&c, "reduce", env);
        EMU_CHECK(c.exited && c.code == 0 && emu_has(&c, "diff 0\n"), "%s: %s", schedules[i],
                  c.out);
    }
    printf("reduction without the warp-level barriers: wrong under at least one schedule\n");
    int wrong = 0;
    for (int i = 0; schedules[i]; i++) {
        const char *env[] = {schedules[i], NULL};
        emu_child c;
        emu_run_child(&c, "reduce_nobar", env);
        EMU_CHECK(c.exited && c.code == 0, "%s: %s", schedules[i], c.out);
        if (!emu_has(&c, "diff 0\n"))
            wrong++;
        printf("  %s: %s", schedules[i], c.out);
    }
    EMU_CHECK(wrong > 0, "the missing barrier went unnoticed under every schedule");
}

/* ---- Deaths ---- */
static const int k_div_line = __LINE__ + 4;
__global__ void k_divergent(int *o)
{
    if (threadIdx.x < 16)
        __syncthreads();
    o[threadIdx.x] = 1;
}

static const int k_shfl_line = __LINE__ + 6;
__global__ void k_partial_shfl(float *o)
{
    float v = (float)threadIdx.x;
    if (threadIdx.x % 32 >= 16)
        return;
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    o[threadIdx.x] = v;
}

static const int k_bar2_line = __LINE__ + 7;
__global__ void k_two_barriers(int *o)
{
    if (threadIdx.x < 32) {
        o[threadIdx.x] = 1;
        __syncthreads();
    } else {
        __syncthreads();
    }
}

/* Out of bounds by one element and a runaway recursion. */
__global__ void k_oob(const float *x, float *o, int n)
{
    o[threadIdx.x] = x[n + threadIdx.x];
}

__global__ void k_dyn_oob(int n)
{
    extern __shared__ float buf[];
    buf[n + threadIdx.x] = 1.0f;
}

__device__ __noinline__ int deep(int n)
{
    volatile char buf[4096];
    buf[0] = (char)n;
    return n == 0 ? 0 : deep(n - 1) + buf[0];
}
__global__ void k_deep(int *o)
{
    o[threadIdx.x] = deep(1 << 20);
}

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#else
#define ASAN_BUILD 0
#endif

static void expect_death(const char *name, const char *what, int line)
{
    char at[64];
    snprintf(at, sizeof at, "test_emu_kernel.cu:%d", line);
    emu_child c;
    emu_run_child(&c, name, NULL);
    EMU_CHECK(emu_died(&c) && emu_has(&c, "cuda-emu: kernel ") && emu_has(&c, what) &&
                  emu_has(&c, at),
              "%s: want '%s' at %s, got: %s", name, what, at, c.out);
}

static void test_deaths(void)
{
    printf("divergent __syncthreads (half the block exits) dies with file:line\n");
    expect_death("divergent", "barrier divergence", k_div_line);
    printf("__syncthreads on two different lines dies with file:line\n");
    expect_death("two_barriers", "barrier divergence", k_bar2_line);
    printf("full-mask shuffle with exited lanes dies with file:line\n");
    expect_death("partial_shfl", "has exited", k_shfl_line);
    printf("kernel reading one element past a cudaMalloc block dies (%s)\n",
           ASAN_BUILD ? "ASan" : "guard page");
    emu_child c;
    emu_run_child(&c, "oob", NULL);
    EMU_CHECK(emu_died(&c), "oob passed: %s", c.out);
    EMU_CHECK(emu_has(&c, ASAN_BUILD ? "heap-buffer-overflow" : "cuda-emu: out-of-bounds access"),
              "oob: %s", c.out);
    printf("kernel writing past its dynamic shared memory dies (%s)\n",
           ASAN_BUILD ? "ASan" : "guard page");
    emu_run_child(&c, "dyn_oob", NULL);
    EMU_CHECK(emu_died(&c), "dyn_oob passed: %s", c.out);
    EMU_CHECK(emu_has(&c, ASAN_BUILD ? "heap-buffer-overflow"
                                     : "access past the end of dynamic shared memory"),
              "dyn_oob: %s", c.out);
    printf("kernel thread overflowing its fiber stack dies with a message\n");
    emu_run_child(&c, "deep", NULL);
    EMU_CHECK(emu_has(&c, ASAN_BUILD ? "stack-overflow" : "stack overflow in a kernel thread"),
              "deep: %s", c.out);
}

static int child_death(const char *n)
{
    int *o;
    EMU_CUDA(cudaMalloc(&o, (!strcmp(n, "oob") ? 256 : 1024) * sizeof(int)));
    if (!strcmp(n, "divergent"))
        ZS_CUDA_LAUNCH(k_divergent, 1, 64, 0, 0, o);
    else if (!strcmp(n, "oob"))
        ZS_CUDA_LAUNCH(k_oob, 1, 1, 0, 0, (const float *)o, (float *)o, 256);
    else if (!strcmp(n, "dyn_oob"))
        ZS_CUDA_LAUNCH(k_dyn_oob, 1, 1, 1024, 0, 256);
    else if (!strcmp(n, "deep"))
        ZS_CUDA_LAUNCH(k_deep, 1, 2, 0, 0, o);
    else if (!strcmp(n, "two_barriers"))
        ZS_CUDA_LAUNCH(k_two_barriers, 1, 64, 0, 0, o);
    else
        ZS_CUDA_LAUNCH(k_partial_shfl, 1, 64, 0, 0, (float *)o);
    cudaDeviceSynchronize();
    return 0;
}

/* ---- Launch configuration ---- */
__global__ void k_mark(int *o)
{
    o[0] = 42;
}

static void test_config(void)
{
    printf("launch configuration errors: nothing runs, last error "
           "cudaErrorInvalidConfiguration\n");
    int *o, h;
    EMU_CUDA(cudaMalloc(&o, sizeof(int)));
    EMU_CUDA(cudaMemset(o, 0, sizeof(int)));
    struct {
        dim3 g, b;
        size_t sh;
    } bad[] = {{dim3(1), dim3(1025), 0},        {dim3(1), dim3(32, 32, 2), 0},
               {dim3(1), dim3(1, 1, 65), 0},    {dim3(1, 65536), dim3(1), 0},
               {dim3(1, 1, 65536), dim3(1), 0}, {dim3(0), dim3(1), 0},
               {dim3(1), dim3(0), 0},           {dim3(1), dim3(32), (48 << 10) + 1}};
    for (auto &c : bad) {
        ZS_CUDA_LAUNCH(k_mark, c.g, c.b, c.sh, 0, o);
        EMU_CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration,
                  "grid (%u,%u,%u) block (%u,%u,%u) shmem %zu", c.g.x, c.g.y, c.g.z, c.b.x, c.b.y,
                  c.b.z, c.sh);
        EMU_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "get");
        EMU_CHECK(cudaGetLastError() == cudaSuccess, "reset");
    }
    EMU_CUDA(cudaMemcpy(&h, o, sizeof h, cudaMemcpyDeviceToHost));
    EMU_CHECK(h == 0, "an invalid launch ran");
    ZS_CUDA_LAUNCH(k_mark, dim3(1, 65535), dim3(1024), 48 << 10, 0, o);
    EMU_CUDA(cudaGetLastError());
    cudaStream_t bogus = (cudaStream_t)&h;
    ZS_CUDA_LAUNCH(k_mark, 1, 1, 0, bogus, o);
    EMU_CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle, "bad stream");
    EMU_CUDA(cudaMemcpy(&h, o, sizeof h, cudaMemcpyDeviceToHost));
    EMU_CHECK(h == 42, "the largest valid launch ran: %d", h);
    EMU_CUDA(cudaFree(o));
    printf("launch into a stream of another device: cudaErrorInvalidResourceHandle\n");
    const char *env[] = {"ZS_EMU_DEVICES=2", NULL};
    emu_child c;
    emu_run_child(&c, "wrong_device", env);
    EMU_CHECK(c.exited && c.code == 0, "child: %s", c.out);
}

static int child_wrong_device(void)
{
    int *o;
    cudaStream_t s1;
    EMU_CUDA(cudaMalloc(&o, sizeof(int)));
    EMU_CUDA(cudaSetDevice(1));
    EMU_CUDA(cudaStreamCreate(&s1));
    EMU_CUDA(cudaSetDevice(0));
    ZS_CUDA_LAUNCH(k_mark, 1, 1, 0, s1, o);
    EMU_CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle, "launch on device 1's stream");
    return 0;
}

/* ---- Shared memory ---- */
__global__ void k_dyn(float *o, int n)
{
    extern __shared__ float dyn[];
    int t = threadIdx.x;
    /* Thread 0 checks the poison before anyone writes (forward order). */
    int poisoned = 0;
    if (t == 0)
        for (int i = 0; i < n; i++)
            poisoned += std::isnan(dyn[i]);
    __syncthreads();
    for (int i = t; i < n; i += blockDim.x)
        dyn[i] = (float)(i + blockIdx.x);
    __syncthreads();
    float s = 0;
    for (int i = 0; i < n; i++)
        s += dyn[i];
    if (t == 0) {
        o[2 * blockIdx.x] = s;
        o[2 * blockIdx.x + 1] = (float)poisoned;
    }
}

__global__ void k_static_poison(float *o)
{
    __shared__ float cell[4];
    __syncthreads();
    if (threadIdx.x == 0) {
        o[blockIdx.x] = cell[blockIdx.x % 4]; /* read before any write: poison */
        cell[0] = cell[1] = cell[2] = cell[3] = 1.0f;
    }
}

static void test_shared(void)
{
    printf("dynamic shared memory: per block, poisoned (NaN) before each block\n");
    const int n = 1000, blocks = 3;
    float *o, h[2 * blocks];
    EMU_CUDA(cudaMalloc(&o, sizeof h));
    ZS_CUDA_LAUNCH(k_dyn, blocks, 128, n * sizeof(float), 0, o, n);
    EMU_CUDA(cudaGetLastError());
    EMU_CUDA(cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost));
    for (int b = 0; b < blocks; b++) {
        float want = (float)(n * (n - 1) / 2 + n * b);
        EMU_CHECK(h[2 * b] == want, "block %d sum %f want %f", b, h[2 * b], want);
        EMU_CHECK(h[2 * b + 1] == n, "block %d: %f poisoned words of %d", b, h[2 * b + 1], n);
    }
    printf("dynamic shared memory above 48 KiB: refused until cudaFuncSetAttribute raises it\n");
    const int big = 16384; /* 64 KiB */
    ZS_CUDA_LAUNCH(k_dyn, 1, 128, big * sizeof(float), 0, o, big);
    EMU_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "64 KiB without opt-in");
    EMU_CHECK(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 << 10) ==
                  cudaErrorInvalidValue,
              "above the 227 KiB opt-in limit");
    EMU_CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error");
    EMU_CUDA(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10));
    ZS_CUDA_LAUNCH(k_dyn, 1, 128, big * sizeof(float), 0, o, big);
    EMU_CUDA(cudaGetLastError());
    EMU_CUDA(cudaMemcpy(h, o, 2 * sizeof(float), cudaMemcpyDeviceToHost));
    /* fp32 sum of 0..16383 rounds: compare loosely; the poison count is exact. */
    EMU_CHECK(std::fabs(h[0] / ((double)big * (big - 1) / 2) - 1) < 1e-3 && h[1] == big,
              "64 KiB: sum %f poisoned %f", h[0], h[1]);
    printf("static shared memory: poisoned again for each block\n");
    ZS_CUDA_LAUNCH(k_static_poison, 4, 32, 0, 0, o);
    EMU_CUDA(cudaMemcpy(h, o, 4 * sizeof(float), cudaMemcpyDeviceToHost));
    for (int b = 0; b < 4; b++)
        EMU_CHECK(std::isnan(h[b]), "block %d read %f, not poison", b, h[b]);
    EMU_CUDA(cudaFree(o));
}

/* ---- Warp operations, atomics, arguments ---- */
__global__ void k_warp(int *o)
{
    int t = threadIdx.x, lane = t % 32;
    int v = lane;
    for (int d = 16; d > 0; d >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, d);
    int total = __shfl_sync(0xffffffffu, v, 0); /* 496 */
    unsigned b = __ballot_sync(0xffffffffu, lane % 3 == 0);
    int any = __any_sync(0xffffffffu, lane == 31);
    int all = __all_sync(0xffffffffu, lane < 31);
    int up = __shfl_up_sync(0xffffffffu, lane, 1, 16); /* within 16-lane groups */
    double dx = __shfl_xor_sync(0xffffffffu, (double)lane, 5);
    long long ll = __shfl_sync(0xffffffffu, (long long)lane << 40, 31);
    int cnt = __syncthreads_count(lane < 8);
    if (lane < 16) {
        /* A partial mask naming only lanes that take part is fine. */
        int h = __shfl_xor_sync(0x0000ffffu, lane, 8);
        __syncwarp(0x0000ffffu);
        o[t * 8 + 7] = h;
    } else {
        o[t * 8 + 7] = lane ^ 8;
    }
    o[t * 8 + 0] = total;
    o[t * 8 + 1] = (int)b;
    o[t * 8 + 2] = any * 2 + all;
    o[t * 8 + 3] = up;
    o[t * 8 + 4] = (int)dx;
    o[t * 8 + 5] = (int)(ll >> 40);
    o[t * 8 + 6] = cnt;
}

__global__ void k_atomic(float *f, int *i, unsigned long long *u, double *d, int *mx)
{
    atomicAdd(f, 0.5f);
    atomicAdd(i, 1);
    atomicAdd(u, 2ull);
    atomicAdd(d, 0.25);
    atomicMax(mx, (int)(blockIdx.x * blockDim.x + threadIdx.x));
}

struct args {
    int a[4];
};
__global__ void k_args(const float *maybe_null, struct args s, int *o)
{
    if (threadIdx.x == 0) {
        o[0] = maybe_null == nullptr;
        o[1] = s.a[0] + s.a[3];
    }
    s.a[0] = 99; /* each thread's own copy */
}

static void test_warp_atomics_args(void)
{
    printf("warp shuffles/votes, __syncthreads_count, atomics, NULL and struct arguments\n");
    int *o, h[64 * 8];
    EMU_CUDA(cudaMalloc(&o, sizeof h));
    ZS_CUDA_LAUNCH(k_warp, 1, 64, 0, 0, o);
    EMU_CUDA(cudaGetLastError());
    EMU_CUDA(cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost));
    for (int t = 0; t < 64; t++) {
        int lane = t % 32, *r = h + t * 8;
        EMU_CHECK(r[0] == 496, "thread %d sum %d", t, r[0]);
        EMU_CHECK((unsigned)r[1] == 0x49249249u, "ballot %08x", (unsigned)r[1]);
        EMU_CHECK(r[2] == 2, "any/all %d", r[2]);
        EMU_CHECK(r[3] == (lane % 16 == 0 ? lane : lane - 1), "up lane %d: %d", lane, r[3]);
        EMU_CHECK(r[4] == (lane ^ 5), "xor double lane %d: %d", lane, r[4]);
        EMU_CHECK(r[5] == 31, "long long %d", r[5]);
        EMU_CHECK(r[6] == 16, "count %d", r[6]);
        EMU_CHECK(r[7] == (lane ^ 8), "partial mask lane %d: %d", lane, r[7]);
    }
    float *f;
    int *i, *mx;
    unsigned long long *u;
    double *d;
    EMU_CUDA(cudaMalloc(&f, 4));
    EMU_CUDA(cudaMalloc(&i, 4));
    EMU_CUDA(cudaMalloc(&u, 8));
    EMU_CUDA(cudaMalloc(&d, 8));
    EMU_CUDA(cudaMalloc(&mx, 4));
    EMU_CUDA(cudaMemset(f, 0, 4));
    EMU_CUDA(cudaMemset(i, 0, 4));
    EMU_CUDA(cudaMemset(u, 0, 8));
    EMU_CUDA(cudaMemset(d, 0, 8));
    EMU_CUDA(cudaMemset(mx, 0, 4));
    /* cudaMemset is asynchronous on the legacy stream, and non-blocking
     * streams do not wait for it (this test raced here at first). */
    EMU_CUDA(cudaDeviceSynchronize());
    /* Two streams at once: the atomics are real atomics. */
    cudaStream_t s1, s2;
    EMU_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    EMU_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    ZS_CUDA_LAUNCH(k_atomic, 16, 128, 0, s1, f, i, u, d, mx);
    ZS_CUDA_LAUNCH(k_atomic, 16, 128, 0, s2, f, i, u, d, mx);
    EMU_CUDA(cudaDeviceSynchronize());
    float hf;
    int hi, hm;
    unsigned long long hu;
    double hd;
    EMU_CUDA(cudaMemcpy(&hf, f, 4, cudaMemcpyDeviceToHost));
    EMU_CUDA(cudaMemcpy(&hi, i, 4, cudaMemcpyDeviceToHost));
    EMU_CUDA(cudaMemcpy(&hu, u, 8, cudaMemcpyDeviceToHost));
    EMU_CUDA(cudaMemcpy(&hd, d, 8, cudaMemcpyDeviceToHost));
    EMU_CUDA(cudaMemcpy(&hm, mx, 4, cudaMemcpyDeviceToHost));
    EMU_CHECK(hf == 2048.0f && hi == 4096 && hu == 8192 && hd == 1024.0 && hm == 2047,
              "atomics %f %d %llu %f %d", hf, hi, hu, hd, hm);
    struct args a = {{1, 2, 3, 4}};
    ZS_CUDA_LAUNCH(k_args, 1, 4, 0, s1, NULL, a, o);
    a.a[0] = 1000; /* after the launch: the kernel has its own copy */
    EMU_CUDA(cudaStreamSynchronize(s1));
    EMU_CUDA(cudaMemcpy(h, o, 2 * sizeof(int), cudaMemcpyDeviceToHost));
    EMU_CHECK(h[0] == 1 && h[1] == 5, "args %d %d", h[0], h[1]);
    EMU_CUDA(cudaStreamDestroy(s1));
    EMU_CUDA(cudaStreamDestroy(s2));
    EMU_CUDA(cudaFree(f));
    EMU_CUDA(cudaFree(i));
    EMU_CUDA(cudaFree(u));
    EMU_CUDA(cudaFree(d));
    EMU_CUDA(cudaFree(mx));
    EMU_CUDA(cudaFree(o));
}

__global__ void k_set_one(int *o)
{
    *o = 1;
}

static void CUDART_CB sleep_300ms(void *unused)
{
    (void)unused;
    usleep(300000);
}

/* As measured on an H100 (emu_stream.c, zs_emu_hostfn_wait_idle): a launch
 * on stream b waits while a host function runs on stream a. */
static void test_launch_waits_for_hostfn(void)
{
    printf("a kernel launch waits while a host function of another stream runs\n");
    cudaStream_t a, b;
    int *o;
    EMU_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    EMU_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    EMU_CUDA(cudaMalloc(&o, sizeof *o));
    EMU_CUDA(cudaLaunchHostFunc(a, sleep_300ms, NULL));
    usleep(50000); /* the host function has started */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ZS_CUDA_LAUNCH(k_set_one, 1, 1, 0, b, o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    EMU_CUDA(cudaGetLastError());
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    EMU_CHECK(dt >= 0.2, "the launch returned after %.3f s, while the host function slept", dt);
    EMU_CUDA(cudaStreamSynchronize(a));
    EMU_CUDA(cudaStreamSynchronize(b));
    EMU_CUDA(cudaFree(o));
    EMU_CUDA(cudaStreamDestroy(a));
    EMU_CUDA(cudaStreamDestroy(b));
}

int main(int argc, char **argv)
{
    emu_self = argv[0];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 3 && !strcmp(argv[1], "child")) {
        const char *n = argv[2];
        if (!strcmp(n, "reduce") || !strcmp(n, "reduce_nobar")) {
            printf("diff %g\n", run_reduce(!strcmp(n, "reduce")));
            return 0;
        }
        if (!strcmp(n, "wrong_device"))
            return child_wrong_device();
        return child_death(n);
    }
    test_reduce();
    test_deaths();
    test_config();
    test_shared();
    test_warp_atomics_args();
    test_launch_waits_for_hostfn();
    printf("test_emu_kernel: all passed\n");
    return 0;
}
