/*
 * zs_cuda_vec.cu - the engine's vector ops on CUDA (see zs_cuda_vec.h).
 *
 * Element-wise kernels are grid-stride loops instantiated per dtype pair
 * (template parameters, so the dtype tests in zs_math_load/zs_math_store fold
 * away) and call the formulas of kernels/zs_math.h, the same lines the CPU
 * twins run: a GPU result is bitwise the CPU's, whatever the grid.
 *
 * sumsq is the one reduction: a fixed shape of SUMSQ_BLOCKS x SUMSQ_THREADS
 * threads, thread k of block b summing elements b*T + k, + B*T, ... in fp64;
 * a shared-memory tree per block; a second single-block kernel summing the
 * block partials in a fixed tree and adding to acc[0]. Nothing depends on
 * timing or on the number of SMs, so the bits repeat run after run.
 *
 * What it does not do: synchronise, allocate (except sumsq's 12 KiB
 * stream-ordered temporary), or check that pointers are device memory.
 */
#include <cuda_runtime.h>

#include "zs_cuda_util.cuh"
#include "zs_cuda_vec.h"
#include "zs_math.h"

#define SUMSQ_BLOCKS  1024
#define SUMSQ_THREADS 256

/* ---- kernels --------------------------------------------------------------- */

template <int DDT, int SDT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_cast(void *__restrict__ dst, const void *__restrict__ src, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        zs_math_store(dst, DDT, i, zs_math_load(src, SDT, i));
    }
}

/* No __restrict__: dst == src is allowed (x += x, as on the CPU device). */
template <int DDT, int SDT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_accumulate(void *dst, const void *src, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        zs_math_store(dst, DDT, i, ZS_FADD(zs_math_load(dst, DDT, i), zs_math_load(src, SDT, i)));
    }
}

template <int DT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS) k_scale(void *x, float alpha, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        zs_math_store(x, DT, i, ZS_FMUL(zs_math_load(x, DT, i), alpha));
    }
}

/* h = x rounded to DT, x = h widened: the two k_cast instances' formulas
 * in one pass. */
template <int DT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_round(float *__restrict__ x, void *__restrict__ h, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        zs_math_store(h, DT, i, x[i]);
        x[i] = zs_math_load(h, DT, i);
    }
}

/* n rows of w: element i of the flat n x w output is row i / w; rows whose
 * id falls outside [lo, hi) are not written (another chunk's call). */
template <int SDT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_cast_rows(float *__restrict__ dst, const void *__restrict__ src,
                const int32_t *__restrict__ idx, size_t n, int32_t lo, int32_t hi, size_t w)
{
    ZS_CUDA_FOR(i, n * w)
    {
        size_t r = i / w;
        int32_t v = idx[r];
        if (v >= lo && v < hi)
            dst[i] = zs_math_load(src, SDT, (size_t)(v - lo) * w + (i - r * w));
    }
}

template <int GDT, int ODT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_adamw(zs_math_adam_t c, float *__restrict__ p, float *__restrict__ m, float *__restrict__ v,
            const void *__restrict__ grad, void *__restrict__ out, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        float pi = p[i], mi = m[i], vi = v[i];
        zs_math_adam_elem(&c, zs_math_load(grad, GDT, i), &pi, &mi, &vi);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (ODT != ZS_DTYPE_NONE)
            zs_math_store(out, ODT, i, pi);
    }
}

/* Pass 1: partial[b] = fp64 sum of squares of block b's elements, flag[b] =
 * 1 if any of them is inf or NaN. */
template <int DT>
__global__ void __launch_bounds__(SUMSQ_THREADS)
    k_sumsq_part(const void *__restrict__ x, size_t n, double *__restrict__ partial,
                 int *__restrict__ flag)
{
    __shared__ double sh[SUMSQ_THREADS];
    double acc = 0.0;
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * SUMSQ_THREADS + threadIdx.x; i < n;
         i += (size_t)SUMSQ_BLOCKS * SUMSQ_THREADS) {
        float f = zs_math_load(x, DT, i);
        bad |= (zs_math_f32_bits(f) & 0x7F800000u) == 0x7F800000u;
        double d = (double)f;
        acc = __dadd_rn(acc, __dmul_rn(d, d)); /* the square is exact in fp64 */
    }
    sh[threadIdx.x] = acc;
    bad = __syncthreads_or(bad);
    for (int s = SUMSQ_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sh[0];
        flag[blockIdx.x] = bad;
    }
}

/* Pass 2 (one block): acc[0] += the sum of the partials in a fixed tree;
 * acc[1] = 1.0 if any block saw a non-finite element. */
__global__ void __launch_bounds__(SUMSQ_THREADS)
    k_sumsq_final(const double *__restrict__ partial, const int *__restrict__ flag, double *acc)
{
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    int bad = 0;
    for (int b = threadIdx.x; b < SUMSQ_BLOCKS; b += SUMSQ_THREADS) {
        s = __dadd_rn(s, partial[b]);
        bad |= flag[b];
    }
    sh[threadIdx.x] = s;
    bad = __syncthreads_or(bad);
    for (int k = SUMSQ_THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + k]);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        acc[0] = __dadd_rn(acc[0], sh[0]);
        if (bad)
            acc[1] = 1.0;
    }
}

/* ---- launchers ------------------------------------------------------------- */

/* Grid and block of the element-wise launches over n elements. */
#define EW_GRID(n) zs__cuda_blocks((n), ZS_CUDA_EW_THREADS)

/* Index of a (dtype, dtype) pair for the dispatch switches. */
#define PAIR(a, b) ((a)*4 + (b))

/* The dispatch macros set the function pointer K to the instance of the
 * kernel template KERNEL for the run-time dtypes (left NULL for a pair
 * with no instance); the launcher then launches K once with
 * ZS_CUDA_LAUNCH. Every instance of a kernel has the same parameters
 * (void * buffers), so one pointer type holds them all. */
/* clang-format off */
/* The nine (dtype, dtype) cases of fp32, bf16 and fp16. */
#define ZS_PAIR_CASES(KERNEL, K)                                                                   \
    case PAIR(ZS_DTYPE_F32, ZS_DTYPE_F32):   K = KERNEL<ZS_DTYPE_F32, ZS_DTYPE_F32>; break;        \
    case PAIR(ZS_DTYPE_F32, ZS_DTYPE_BF16):  K = KERNEL<ZS_DTYPE_F32, ZS_DTYPE_BF16>; break;       \
    case PAIR(ZS_DTYPE_F32, ZS_DTYPE_F16):   K = KERNEL<ZS_DTYPE_F32, ZS_DTYPE_F16>; break;        \
    case PAIR(ZS_DTYPE_BF16, ZS_DTYPE_F32):  K = KERNEL<ZS_DTYPE_BF16, ZS_DTYPE_F32>; break;       \
    case PAIR(ZS_DTYPE_BF16, ZS_DTYPE_BF16): K = KERNEL<ZS_DTYPE_BF16, ZS_DTYPE_BF16>; break;      \
    case PAIR(ZS_DTYPE_BF16, ZS_DTYPE_F16):  K = KERNEL<ZS_DTYPE_BF16, ZS_DTYPE_F16>; break;       \
    case PAIR(ZS_DTYPE_F16, ZS_DTYPE_F32):   K = KERNEL<ZS_DTYPE_F16, ZS_DTYPE_F32>; break;        \
    case PAIR(ZS_DTYPE_F16, ZS_DTYPE_BF16):  K = KERNEL<ZS_DTYPE_F16, ZS_DTYPE_BF16>; break;       \
    case PAIR(ZS_DTYPE_F16, ZS_DTYPE_F16):   K = KERNEL<ZS_DTYPE_F16, ZS_DTYPE_F16>; break;
#define ZS_DISPATCH_PAIR(KERNEL, A, B, K)                                                          \
    switch (PAIR(A, B)) {                                                                          \
    ZS_PAIR_CASES(KERNEL, K)                                                                       \
    default: break;                                                                                \
    }
/* The pairs above plus an output dtype of NONE (AdamW without output). */
#define ZS_DISPATCH_PAIR_OPT(KERNEL, A, B, K)                                                      \
    switch (PAIR(A, B)) {                                                                          \
    ZS_PAIR_CASES(KERNEL, K)                                                                       \
    case PAIR(ZS_DTYPE_F32, ZS_DTYPE_NONE):  K = KERNEL<ZS_DTYPE_F32, ZS_DTYPE_NONE>; break;       \
    case PAIR(ZS_DTYPE_BF16, ZS_DTYPE_NONE): K = KERNEL<ZS_DTYPE_BF16, ZS_DTYPE_NONE>; break;      \
    case PAIR(ZS_DTYPE_F16, ZS_DTYPE_NONE):  K = KERNEL<ZS_DTYPE_F16, ZS_DTYPE_NONE>; break;       \
    default: break;                                                                                \
    }
#define ZS_DISPATCH_ONE(KERNEL, A, K)                                                              \
    switch (A) {                                                                                   \
    case ZS_DTYPE_F32:  K = KERNEL<ZS_DTYPE_F32>; break;                                           \
    case ZS_DTYPE_BF16: K = KERNEL<ZS_DTYPE_BF16>; break;                                          \
    case ZS_DTYPE_F16:  K = KERNEL<ZS_DTYPE_F16>; break;                                           \
    default: break;                                                                                \
    }
/* clang-format on */

static int bad_arg(zs_err_t *err, const char *fn, const char *what)
{
    return zs_err_set(err, ZS_ERR_INVALID, "%s: %s", fn, what);
}

/* n elements of 4 bytes must fit in size_t, so every byte count and offset
 * does (the CPU device's check, same status). */
static int bad_n(zs_err_t *err, const char *fn, size_t n)
{
    if (n > SIZE_MAX / 4)
        return zs_err_set(err, ZS_ERR_RANGE, "%s: %zu elements overflow the address space", fn, n);
    return ZS_OK;
}

/* See zs_cuda_vec.h. */
extern "C" int zs_cuda_cast(void *stream, void *dst, zs_dtype_t ddt, const void *src,
                            zs_dtype_t sdt, size_t n, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs__cuda_dtype_ok(ddt) || !zs__cuda_dtype_ok(sdt))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_cast: dtypes %s <- %s not supported",
                          zs_dtype_name(ddt), zs_dtype_name(sdt));
    if (bad_n(err, "zs_cuda_cast", n))
        return ZS_ERR_RANGE;
    if (n == 0)
        return ZS_OK;
    if (!dst || !src)
        return bad_arg(err, "zs_cuda_cast", "NULL buffer");
    uintptr_t d0 = (uintptr_t)dst, d1 = d0 + n * zs_dtype_size(ddt);
    uintptr_t s0 = (uintptr_t)src, s1 = s0 + n * zs_dtype_size(sdt);
    if (d0 < s1 && s0 < d1) /* refused as on the CPU device; a race on the GPU */
        return bad_arg(err, "zs_cuda_cast", "dst and src overlap");
    if (ddt == sdt) {
        /* Default, not DeviceToDevice: one side may be pinned host memory
         * (the engine's stage 3 offloaded parameters), and a kind that does
         * not match the pointers is undefined behaviour */
        ZS_CUDA_TRY(cudaMemcpyAsync(dst, src, n * zs_dtype_size(sdt), cudaMemcpyDefault, cs),
                    "zs_cuda_cast: cudaMemcpyAsync");
        return ZS_OK;
    }
    decltype(&k_cast<ZS_DTYPE_F32, ZS_DTYPE_F32>) k = NULL;
    ZS_DISPATCH_PAIR(k_cast, ddt, sdt, k)
    ZS_CUDA_LAUNCH(k, EW_GRID(n), ZS_CUDA_EW_THREADS, 0, cs, dst, src, n);
    ZS_CUDA_LAUNCHED("k_cast");
    return ZS_OK;
}

/* See zs_cuda_vec.h. */
extern "C" int zs_cuda_round(void *stream, float *x, void *h, zs_dtype_t dt, size_t n,
                             zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (dt != ZS_DTYPE_BF16 && dt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_round: dtype %s is not bf16 or fp16",
                          zs_dtype_name(dt));
    if (bad_n(err, "zs_cuda_round", n))
        return ZS_ERR_RANGE;
    if (n == 0)
        return ZS_OK;
    if (!x || !h)
        return bad_arg(err, "zs_cuda_round", "NULL buffer");
    uintptr_t x0 = (uintptr_t)x, x1 = x0 + n * 4, h0 = (uintptr_t)h, h1 = h0 + n * 2;
    if (x0 < h1 && h0 < x1) /* refused as on the CPU device; a race on the GPU */
        return bad_arg(err, "zs_cuda_round", "x and h overlap");
    decltype(&k_round<ZS_DTYPE_BF16>) k = NULL;
    ZS_DISPATCH_ONE(k_round, dt, k)
    ZS_CUDA_LAUNCH(k, EW_GRID(n), ZS_CUDA_EW_THREADS, 0, cs, x, h, n);
    ZS_CUDA_LAUNCHED("k_round");
    return ZS_OK;
}

/* See zs_cuda_vec.h. */
extern "C" int zs_cuda_cast_rows(void *stream, float *dst, const void *src, zs_dtype_t sdt,
                                 const int32_t *idx, size_t n, int32_t lo, int32_t hi, size_t w,
                                 zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs__cuda_dtype_ok(sdt))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_cast_rows: dtype %s not supported",
                          zs_dtype_name(sdt));
    if (n == 0 || w == 0 || hi <= lo)
        return ZS_OK;
    if (w > SIZE_MAX / 4 / n)
        return zs_err_set(err, ZS_ERR_RANGE, "zs_cuda_cast_rows: %zu rows of %zu overflow", n, w);
    if (!dst || !src || !idx)
        return bad_arg(err, "zs_cuda_cast_rows", "NULL buffer");
    decltype(&k_cast_rows<ZS_DTYPE_F32>) k = NULL;
    ZS_DISPATCH_ONE(k_cast_rows, sdt, k)
    ZS_CUDA_LAUNCH(k, EW_GRID(n * w), ZS_CUDA_EW_THREADS, 0, cs, dst, src, idx, n, lo, hi, w);
    ZS_CUDA_LAUNCHED("k_cast_rows");
    return ZS_OK;
}

/* See zs_cuda_vec.h. */
extern "C" int zs_cuda_accumulate(void *stream, void *dst, zs_dtype_t ddt, const void *src,
                                  zs_dtype_t sdt, size_t n, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs__cuda_dtype_ok(ddt) || !zs__cuda_dtype_ok(sdt))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_accumulate: dtypes %s += %s not supported",
                          zs_dtype_name(ddt), zs_dtype_name(sdt));
    if (bad_n(err, "zs_cuda_accumulate", n))
        return ZS_ERR_RANGE;
    if (n == 0)
        return ZS_OK;
    if (!dst || !src)
        return bad_arg(err, "zs_cuda_accumulate", "NULL buffer");
    decltype(&k_accumulate<ZS_DTYPE_F32, ZS_DTYPE_F32>) k = NULL;
    ZS_DISPATCH_PAIR(k_accumulate, ddt, sdt, k)
    ZS_CUDA_LAUNCH(k, EW_GRID(n), ZS_CUDA_EW_THREADS, 0, cs, dst, src, n);
    ZS_CUDA_LAUNCHED("k_accumulate");
    return ZS_OK;
}

/* See zs_cuda_vec.h. */
extern "C" int zs_cuda_scale(void *stream, void *x, zs_dtype_t dt, float alpha, size_t n,
                             zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs__cuda_dtype_ok(dt))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_scale: dtype %s not supported",
                          zs_dtype_name(dt));
    if (bad_n(err, "zs_cuda_scale", n))
        return ZS_ERR_RANGE;
    if (n == 0)
        return ZS_OK;
    if (!x)
        return bad_arg(err, "zs_cuda_scale", "NULL buffer");
    decltype(&k_scale<ZS_DTYPE_F32>) k = NULL;
    ZS_DISPATCH_ONE(k_scale, dt, k)
    ZS_CUDA_LAUNCH(k, EW_GRID(n), ZS_CUDA_EW_THREADS, 0, cs, x, alpha, n);
    ZS_CUDA_LAUNCHED("k_scale");
    return ZS_OK;
}

/* See zs_cuda_vec.h. */
extern "C" int zs_cuda_sumsq(void *stream, const void *x, zs_dtype_t dt, size_t n, double *acc,
                             zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs__cuda_dtype_ok(dt))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_cuda_sumsq: dtype %s not supported",
                          zs_dtype_name(dt));
    if (bad_n(err, "zs_cuda_sumsq", n))
        return ZS_ERR_RANGE;
    if (!acc)
        return bad_arg(err, "zs_cuda_sumsq", "NULL acc");
    if (n == 0)
        return ZS_OK;
    if (!x)
        return bad_arg(err, "zs_cuda_sumsq", "NULL buffer");
    void *tmp = NULL;
    size_t bytes = SUMSQ_BLOCKS * (sizeof(double) + sizeof(int));
    ZS_CUDA_TRY(cudaMallocAsync(&tmp, bytes, cs), "zs_cuda_sumsq: cudaMallocAsync");
    double *partial = (double *)tmp;
    int *flag = (int *)(partial + SUMSQ_BLOCKS);
    decltype(&k_sumsq_part<ZS_DTYPE_F32>) k = NULL;
    ZS_DISPATCH_ONE(k_sumsq_part, dt, k)
    ZS_CUDA_LAUNCH(k, SUMSQ_BLOCKS, SUMSQ_THREADS, 0, cs, x, n, partial, flag);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        ZS_CUDA_LAUNCH(k_sumsq_final, 1, SUMSQ_THREADS, 0, cs, partial, flag, acc);
        e = cudaGetLastError();
    }
    cudaError_t ef = cudaFreeAsync(tmp, cs);
    if (e != cudaSuccess)
        return zs__cuda_fail(err, e, "launch of k_sumsq_part/k_sumsq_final", __FILE__, __LINE__);
    ZS_CUDA_TRY(ef, "zs_cuda_sumsq: cudaFreeAsync");
    return ZS_OK;
}

/* See zs_cuda_vec.h. */
extern "C" int zs_cuda_adamw(void *stream, const zs_adam_hparams_t *hp, const zs_adam_step_t *st,
                             float *p, float *m, float *v, const void *grad, zs_dtype_t gdt,
                             void *out, zs_dtype_t odt, size_t n, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!hp || !st)
        return bad_arg(err, "zs_cuda_adamw", "NULL hyper-parameters or step");
    if (!out)
        odt = ZS_DTYPE_NONE;
    if (!zs__cuda_dtype_ok(gdt) || !(zs__cuda_dtype_ok(odt) || odt == ZS_DTYPE_NONE))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_cuda_adamw: grad dtype %s / output dtype %s not supported",
                          zs_dtype_name(gdt), zs_dtype_name(odt));
    if (bad_n(err, "zs_cuda_adamw", n))
        return ZS_ERR_RANGE;
    if (n == 0)
        return ZS_OK;
    if (!p || !m || !v || !grad)
        return bad_arg(err, "zs_cuda_adamw", "NULL buffer");
    zs_math_adam_t c;
    zs_math_adam_init(&c, hp, st);
    decltype(&k_adamw<ZS_DTYPE_F32, ZS_DTYPE_F32>) k = NULL;
    ZS_DISPATCH_PAIR_OPT(k_adamw, gdt, odt, k)
    ZS_CUDA_LAUNCH(k, EW_GRID(n), ZS_CUDA_EW_THREADS, 0, cs, c, p, m, v, grad, out, n);
    ZS_CUDA_LAUNCHED("k_adamw");
    return ZS_OK;
}
