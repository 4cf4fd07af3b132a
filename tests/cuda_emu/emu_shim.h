/*
 * emu_shim.h - force-included (-include emu_shim.h) when g++ compiles a .cu
 * file as C++17 for the CUDA emulator (tests/cuda_emu/). Turns CUDA C++
 * device code into host C++ that runs each block's threads as fibers.
 *
 * Provides: the decorators, __shared__ (block-shared: one block's fibers
 * share one OS thread, so thread_local storage is block-shared), dynamic
 * shared memory (through emu_rewrite.cmake's rewrite of
 * `extern __shared__ T name[];`), the built-in variables, barriers, warp
 * shuffles/votes, atomics, a few device math intrinsics, min/max,
 * ZS_CUDA_LAUNCH, and the warp matrix functions (nvcuda::wmma, through
 * emu_wmma.h, which also keeps NVIDIA's <mma.h> out). NVIDIA's own headers
 * come first, so every CUDA type, enum and host declaration is theirs.
 *
 * Does not provide: textures, surfaces, cooperative groups, grid sync,
 * __constant__ semantics beyond a global, inline PTX, clocks, printf
 * ordering, the exact bits of __expf/__logf and friends.
 */
#ifndef ZS_EMU_SHIM_H
#define ZS_EMU_SHIM_H

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define ZS_CUDA_EMU 1

/* ---- Decorators (CUDA C++ Programming Guide, Function Execution Space
 * Specifiers; Variable Memory Space Specifiers). NVIDIA's host_defines.h
 * makes some of them empty for a host compiler; __shared__ must not be. */
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __shared__
#undef __constant__
#undef __managed__
#undef __restrict__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__    __attribute__((noinline))
#define __launch_bounds__(...)
#define __constant__
#define __managed__
#define __restrict__ __restrict
/* Block-shared: thread_local at block scope has static storage, and one
 * block's threads run as fibers on one executor thread. Poisoned per block
 * by the note emu_rewrite.cmake adds after each declaration. */
#define __shared__ thread_local
#define ZS_EMU_SHARED_NOTE(name)                                                                   \
    [[maybe_unused]] const int zs_emu_sn_##name = zs_emu_shared_note(&(name), sizeof(name))

/* ---- Runtime side, implemented in emu_fiber.cpp and emu_launch.cpp ---- */
struct zs_emu_tview {
    uint3 tid;     /* threadIdx */
    unsigned lane; /* linear index % 32 */
};
extern __thread zs_emu_tview *zs_emu_tv;
extern __thread uint3 zs_emu_bid, zs_emu_bdim, zs_emu_gdim;

#include "emu_kernel_api.h"

/* ---- Built-in variables (CUDA C++ Programming Guide, Built-in
 * Variables): per fiber. */
#define threadIdx (zs_emu_tv->tid)
#define blockIdx  zs_emu_bid
#define blockDim  zs_emu_bdim
#define gridDim   zs_emu_gdim
#define warpSize  32

/* ---- Synchronisation (CUDA C++ Programming Guide, Synchronization
 * Functions). Macros, so a divergence is reported at the caller's
 * file:line. */
enum { ZS_EMU_BAR_PLAIN, ZS_EMU_BAR_COUNT, ZS_EMU_BAR_AND, ZS_EMU_BAR_OR };
#define __syncthreads()        zs_emu_syncthreads(__FILE__, __LINE__)
#define __syncthreads_count(p) zs_emu_syncthreads_op(ZS_EMU_BAR_COUNT, !!(p), __FILE__, __LINE__)
#define __syncthreads_and(p)   zs_emu_syncthreads_op(ZS_EMU_BAR_AND, !!(p), __FILE__, __LINE__)
#define __syncthreads_or(p)    zs_emu_syncthreads_op(ZS_EMU_BAR_OR, !!(p), __FILE__, __LINE__)
/* __syncwarp(mask = full): an object-like macro naming a call site, so
 * both forms work without variadic-macro extensions. */
struct zs_emu_syncwarp_at {
    const char *f;
    int l;
    void operator()(unsigned mask = 0xffffffffu) const
    {
        zs_emu_syncwarp(mask, f, l);
    }
};
#define __syncwarp                                                                                 \
    zs_emu_syncwarp_at                                                                             \
    {                                                                                              \
        __FILE__, __LINE__                                                                         \
    }
/* Memory fences: fibers of a block share one OS thread, and blocks of one
 * launch run one after another, so a compiler barrier is enough there;
 * other streams' kernels run on other OS threads: a full fence. */
#define __threadfence()        __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block()  __atomic_signal_fence(__ATOMIC_SEQ_CST)
#define __threadfence_system() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* ---- Warp shuffle and vote (CUDA C++ Programming Guide, Warp Shuffle
 * Functions; Warp Vote Functions). Any trivially copyable T up to 8
 * bytes. */
enum { ZS_EMU_W_SYNC, ZS_EMU_W_IDX, ZS_EMU_W_UP, ZS_EMU_W_DOWN, ZS_EMU_W_XOR, ZS_EMU_W_BALLOT };
template <class T>
static inline T zs_emu_shfl_(int op, unsigned mask, T v, int arg, int width, const char *f, int l)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle type");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    b = zs_emu_warp_op(op, mask, b, arg, width, f, l);
    T r;
    std::memcpy(&r, &b, sizeof(T));
    return r;
}
/* Object-like macros naming the call site; the call operator takes the
 * intrinsic's own parameters (width defaults to warpSize). */
struct zs_emu_shfl_at {
    int op;
    const char *f;
    int l;
    template <class T> T operator()(unsigned mask, T v, int arg, int width = 32) const
    {
        return zs_emu_shfl_(op, mask, v, arg, width, f, l);
    }
};
#define __shfl_sync                                                                                \
    zs_emu_shfl_at                                                                                 \
    {                                                                                              \
        ZS_EMU_W_IDX, __FILE__, __LINE__                                                           \
    }
#define __shfl_up_sync                                                                             \
    zs_emu_shfl_at                                                                                 \
    {                                                                                              \
        ZS_EMU_W_UP, __FILE__, __LINE__                                                            \
    }
#define __shfl_down_sync                                                                           \
    zs_emu_shfl_at                                                                                 \
    {                                                                                              \
        ZS_EMU_W_DOWN, __FILE__, __LINE__                                                          \
    }
#define __shfl_xor_sync                                                                            \
    zs_emu_shfl_at                                                                                 \
    {                                                                                              \
        ZS_EMU_W_XOR, __FILE__, __LINE__                                                           \
    }
enum { ZS_EMU_VOTE_BALLOT, ZS_EMU_VOTE_ANY, ZS_EMU_VOTE_ALL };
struct zs_emu_vote_at {
    int kind;
    const char *f;
    int l;
    unsigned operator()(unsigned mask, int pred) const
    {
        unsigned b = (unsigned)zs_emu_warp_op(ZS_EMU_W_BALLOT, mask, pred != 0, 0, 32, f, l);
        return kind == ZS_EMU_VOTE_BALLOT ? b : kind == ZS_EMU_VOTE_ANY ? b != 0u : b == mask;
    }
};
#define __ballot_sync                                                                              \
    zs_emu_vote_at                                                                                 \
    {                                                                                              \
        ZS_EMU_VOTE_BALLOT, __FILE__, __LINE__                                                     \
    }
#define __any_sync                                                                                 \
    zs_emu_vote_at                                                                                 \
    {                                                                                              \
        ZS_EMU_VOTE_ANY, __FILE__, __LINE__                                                        \
    }
#define __all_sync                                                                                 \
    zs_emu_vote_at                                                                                 \
    {                                                                                              \
        ZS_EMU_VOTE_ALL, __FILE__, __LINE__                                                        \
    }
#define __activemask() 0xffffffffu

/* ---- Atomics (CUDA C++ Programming Guide, Atomic Functions). Kernels of
 * different streams run on different OS threads: real atomics. */
template <class T> using zs_emu_nd_ = typename std::common_type<T>::type; /* not deduced */
template <class T> static inline T atomicAdd(T *p, zs_emu_nd_<T> v)
{
    if constexpr (std::is_floating_point<T>::value) {
        /* CAS on the bits: the __atomic builtins take integers only. */
        using U = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
        U *q = reinterpret_cast<U *>(p);
        U old = __atomic_load_n(q, __ATOMIC_RELAXED), nw;
        T o, n;
        do {
            std::memcpy(&o, &old, sizeof o);
            n = o + v;
            std::memcpy(&nw, &n, sizeof n);
        } while (
            !__atomic_compare_exchange_n(q, &old, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
        return o;
    } else {
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    }
}
template <class T> static inline T atomicSub(T *p, zs_emu_nd_<T> v)
{
    return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T atomicExch(T *p, zs_emu_nd_<T> v)
{
    if constexpr (std::is_floating_point<T>::value) {
        using U = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
        U b, r;
        std::memcpy(&b, &v, sizeof b);
        r = __atomic_exchange_n(reinterpret_cast<U *>(p), b, __ATOMIC_SEQ_CST);
        T o;
        std::memcpy(&o, &r, sizeof o);
        return o;
    } else {
        return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
    }
}
template <class T> static inline T atomicCAS(T *p, zs_emu_nd_<T> cmp, zs_emu_nd_<T> v)
{
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
template <class T> static inline T atomicMax(T *p, zs_emu_nd_<T> v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v &&
           !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T> static inline T atomicMin(T *p, zs_emu_nd_<T> v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old &&
           !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T> static inline T atomicAnd(T *p, zs_emu_nd_<T> v)
{
    return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T atomicOr(T *p, zs_emu_nd_<T> v)
{
    return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}

/* ---- Math (CUDA C++ Programming Guide, Intrinsic Functions; CUDA Math
 * API). The kernels are compiled with -ffp-contract=off, so the _rn forms
 * are one IEEE operation each, round to nearest even. */
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fsub_rn(float a, float b)
{
    return a - b;
}
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
static inline float __fsqrt_rn(float a)
{
    return std::sqrt(a);
}
static inline float __fmaf_rn(float a, float b, float c)
{
    return std::fma(a, b, c);
}
static inline double __dadd_rn(double a, double b)
{
    return a + b;
}
static inline double __dmul_rn(double a, double b)
{
    return a * b;
}
static inline float __int_as_float(int x)
{
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
static inline int __float_as_int(float x)
{
    int i;
    std::memcpy(&i, &x, 4);
    return i;
}
static inline float __uint_as_float(unsigned x)
{
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
static inline unsigned __float_as_uint(float x)
{
    unsigned i;
    std::memcpy(&i, &x, 4);
    return i;
}
/* __expf/__logf are approximations on a GPU whose bits the emulator cannot
 * reproduce; glibc's are used. Results depending on them need a
 * tolerance. Macros: glibc declares its own __expf/__logf. */
static inline float zs_emu_expf_(float x)
{
    return std::exp(x);
}
static inline float zs_emu_logf_(float x)
{
    return std::log(x);
}
#define __expf(x) zs_emu_expf_(x)
#define __logf(x) zs_emu_logf_(x)
/* __fdividef: "for 2^126 < |y| < 2^128, __fdividef(x,y) delivers 0" and
 * an infinite x gives NaN in that range (Programming Guide, Intrinsic
 * Functions): emulated, the hostile corner included. */
static inline float __fdividef(float x, float y)
{
    float ay = std::fabs(y);
    if (ay > 0x1p126f && ay < INFINITY)
        return std::isinf(x) ? NAN : 0.0f * x;
    return x / y;
}
static inline float rsqrtf(float x)
{
    return 1.0f / std::sqrt(x);
}
static inline double rsqrt(double x)
{
    return 1.0 / std::sqrt(x);
}

/* A few more intrinsics kernels commonly use (CUDA Math API, Integer
 * Intrinsics; Type Casting Intrinsics; Single Precision Intrinsics). */
template <class T> static inline T __ldg(const T *p)
{
    return *p;
}
static inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}
static inline int __popcll(unsigned long long x)
{
    return __builtin_popcountll(x);
}
static inline int __clz(int x)
{
    return x ? __builtin_clz((unsigned)x) : 32;
}
static inline int __clzll(long long x)
{
    return x ? __builtin_clzll((unsigned long long)x) : 64;
}
static inline int __ffs(int x)
{
    return __builtin_ffs(x);
}
static inline int __ffsll(long long x)
{
    return __builtin_ffsll(x);
}
static inline unsigned __brev(unsigned x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
    return (x >> 16) | (x << 16);
}
/* __saturatef: clamps to [0, 1]; NaN gives 0. */
static inline float __saturatef(float x)
{
    return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f;
}
static inline int __float2int_rn(float x)
{
    return (int)std::nearbyint(x);
}
static inline int __float2int_rz(float x)
{
    return (int)x;
}
static inline float __int2float_rn(int x)
{
    return (float)x;
}
static inline float __frcp_rn(float x)
{
    return 1.0f / x;
}
static inline double __drcp_rn(double x)
{
    return 1.0 / x;
}
/* Approximate on a GPU; glibc's here (bits differ: use a tolerance). */
static inline float zs_emu_sinf_(float x)
{
    return std::sin(x);
}
static inline float zs_emu_cosf_(float x)
{
    return std::cos(x);
}
static inline float zs_emu_powf_(float x, float y)
{
    return std::pow(x, y);
}
#define __sinf(x)    zs_emu_sinf_(x)
#define __cosf(x)    zs_emu_cosf_(x)
#define __powf(x, y) zs_emu_powf_(x, y)

/* min/max overloads of the CUDA Math API (device min/max for the integer
 * and floating types); mixed int/unsigned picks unsigned as CUDA does. */
static inline int min(int a, int b)
{
    return a < b ? a : b;
}
static inline int max(int a, int b)
{
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b)
{
    return a > b ? a : b;
}
static inline unsigned min(int a, unsigned b)
{
    return min((unsigned)a, b);
}
static inline unsigned min(unsigned a, int b)
{
    return min(a, (unsigned)b);
}
static inline unsigned max(int a, unsigned b)
{
    return max((unsigned)a, b);
}
static inline unsigned max(unsigned a, int b)
{
    return max(a, (unsigned)b);
}
static inline long long min(long long a, long long b)
{
    return a < b ? a : b;
}
static inline long long max(long long a, long long b)
{
    return a > b ? a : b;
}
static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b)
{
    return a > b ? a : b;
}
static inline long min(long a, long b)
{
    return a < b ? a : b;
}
static inline long max(long a, long b)
{
    return a > b ? a : b;
}
static inline unsigned long min(unsigned long a, unsigned long b)
{
    return a < b ? a : b;
}
static inline unsigned long max(unsigned long a, unsigned long b)
{
    return a > b ? a : b;
}
static inline float min(float a, float b)
{
    return std::fmin(a, b);
}
static inline float max(float a, float b)
{
    return std::fmax(a, b);
}
static inline double min(double a, double b)
{
    return std::fmin(a, b);
}
static inline double max(double a, double b)
{
    return std::fmax(a, b);
}

/* ---- The launch. Under nvcc our code defines ZS_CUDA_LAUNCH as the
 * chevrons; here it takes the kernel's own parameter types, so NULL and 0
 * convert as they would in a call, and copies the arguments at launch time
 * (CUDA C++ Programming Guide, Execution Configuration: arguments are
 * evaluated and passed by value when the launch is issued). */
template <class... P> struct zs_emu_closure {
    void (*k)(P...);
    std::tuple<typename std::decay<P>::type...> args;
};
template <class... P> static void zs_emu_closure_run(void *c)
{
    auto *cl = static_cast<zs_emu_closure<P...> *>(c);
    /* std::apply passes each argument as an lvalue: each thread gets its own
     * by-value copy of the parameters, as on a GPU. */
    std::apply(cl->k, cl->args);
}
template <class... P> static void zs_emu_closure_free(void *c)
{
    delete static_cast<zs_emu_closure<P...> *>(c);
}
/* The launcher object's call operator has exactly the kernel's parameter
 * types, so the arguments convert at the call site: a NULL or 0 passed for
 * a pointer is a null pointer, not a long (a variadic template would
 * deduce). */
template <class... P> struct zs_emu_launcher {
    void (*k)(P...);
    const char *name, *file;
    int line;
    dim3 grid, block;
    size_t shmem;
    cudaStream_t s;
    void operator()(P... args) const
    {
        auto *c = new zs_emu_closure<P...>{k, std::tuple<typename std::decay<P>::type...>(args...)};
        zs_emu_launch(reinterpret_cast<const void *>(k), name, file, line, grid, block, shmem, s,
                      zs_emu_closure_run<P...>, c, zs_emu_closure_free<P...>);
    }
};
template <class... P>
static inline zs_emu_launcher<P...> zs_emu_launcher_(void (*k)(P...), const char *name,
                                                     const char *file, int line, dim3 grid,
                                                     dim3 block, size_t shmem, cudaStream_t s)
{
    return zs_emu_launcher<P...>{k, name, file, line, grid, block, shmem, s};
}
/* cuda_runtime.h's kernel-pointer overload of cudaFuncSetAttribute is for
 * nvcc only; the same for g++ (implemented in emu_launch.cpp). */
template <class... P>
static inline cudaError_t cudaFuncSetAttribute(void (*k)(P...), enum cudaFuncAttribute attr,
                                               int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(k), attr, value);
}
#define ZS_CUDA_LAUNCH_KERNEL(kernel, grid, block, shmem, stream, ...)                             \
    zs_emu_launcher_(kernel, #kernel, __FILE__, __LINE__, grid, block, shmem, stream)(__VA_ARGS__)
/* The emulator's own tests launch with this; our kernels' zs_cuda_util.cuh
 * replaces it with a counted launch around ZS_CUDA_LAUNCH_KERNEL. */
#define ZS_CUDA_LAUNCH(kernel, grid, block, shmem, stream, ...)                                    \
    ZS_CUDA_LAUNCH_KERNEL(kernel, grid, block, shmem, stream, __VA_ARGS__)

/* ---- Warp matrix functions (CUDA C++ Programming Guide, Warp Matrix
 * Functions): nvcuda::wmma, emulated in emu_wmma.cpp. */
#include "emu_wmma.h"

#endif
