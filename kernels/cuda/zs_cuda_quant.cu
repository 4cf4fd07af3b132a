/*
 * zs_cuda_quant.cu - qwZ's block quantization on CUDA (zs_cuda_quant.h),
 * the twin of kernels/zs_quant.c: the same record bytes.
 *
 * Pack: one CUDA block of QUANT_THREADS threads per quantization block
 * (ZS_QUANT_BLOCK elements): each thread takes the max of |x| over the
 * finite elements it strides over, a shared-memory tree takes the block's
 * max (a max is exact, so the order does not matter), thread 0 stores the
 * scale, and every thread writes its elements' codes. Unpack is a
 * grid-stride loop over nrec * n elements; so is qgZ's unpack-sum, each
 * thread adding its element's sources in order. The formulas are
 * zs_quant_math.h's (ZS_FDIV, ZS_FMUL: the __f*_rn intrinsics here, plain
 * operators on the CPU), so the bytes are the CPU twin's.
 *
 * What it does not do: synchronise, allocate.
 */
#include <cuda_runtime.h>

#include "zs_cuda_quant.h"
#include "zs_cuda_util.cuh"
#include "zs_quant_math.h"

#define QUANT_THREADS 256

static inline __host__ __device__ size_t nblocks(size_t n)
{
    return (n + ZS_QUANT_BLOCK - 1) / ZS_QUANT_BLOCK;
}

static inline __host__ __device__ size_t record_bytes(size_t n)
{
    return (nblocks(n) * 4 + n + 3) & ~(size_t)3;
}

template <int DT>
__global__ void __launch_bounds__(QUANT_THREADS)
    k_quant_pack(char *__restrict__ rec, const void *__restrict__ src, size_t n)
{
    __shared__ float sh[QUANT_THREADS];
    size_t nblk = nblocks(n), b = blockIdx.x;
    size_t lo = b * ZS_QUANT_BLOCK, hi = lo + ZS_QUANT_BLOCK < n ? lo + ZS_QUANT_BLOCK : n;
    float amax = 0.0f;
    for (size_t i = lo + threadIdx.x; i < hi; i += QUANT_THREADS)
        amax = fmaxf(amax, zs_quant_absfinite(zs_math_load(src, DT, i)));
    sh[threadIdx.x] = amax;
    __syncthreads();
    for (int s = QUANT_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float scale = zs_quant_scale(sh[0]);
    int8_t *code = (int8_t *)(rec + nblk * 4);
    if (threadIdx.x == 0) {
        ((float *)rec)[b] = scale;
        if (b == nblk - 1) /* the record's zero padding */
            for (size_t i = nblk * 4 + n; i < record_bytes(n); i++)
                rec[i] = 0;
    }
    for (size_t i = lo + threadIdx.x; i < hi; i += QUANT_THREADS)
        code[i] = zs_quant_q(zs_math_load(src, DT, i), scale);
}

template <int DT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_quant_unpack(void *__restrict__ dst, const char *__restrict__ rec, size_t n, size_t nrec)
{
    size_t nblk = nblocks(n), bytes = record_bytes(n);
    ZS_CUDA_FOR(i, n * nrec)
    {
        size_t r = i / n, j = i - r * n;
        const char *base = rec + r * bytes;
        float scale = ((const float *)base)[j / ZS_QUANT_BLOCK];
        zs_math_store(dst, DT, i, zs_quant_deq(((const int8_t *)(base + nblk * 4))[j], scale));
    }
}

__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_quant_unpack_sum(float *__restrict__ dst, const char *__restrict__ rec, size_t n, size_t nsrc,
                       size_t ngroup)
{
    size_t nblk = nblocks(n), bytes = record_bytes(n);
    ZS_CUDA_FOR(i, n * ngroup)
    {
        size_t g = i / n, j = i - g * n;
        float acc = 0.0f;
        for (size_t s = 0; s < nsrc; s++) {
            const char *base = rec + (s * ngroup + g) * bytes;
            float scale = ((const float *)base)[j / ZS_QUANT_BLOCK];
            acc = ZS_FADD(acc, zs_quant_deq(((const int8_t *)(base + nblk * 4))[j], scale));
        }
        dst[i] = acc;
    }
}

/* Refuse a call that cannot run: dtype, overflow of mult * n, a NULL
 * buffer, a misaligned record (b). */
static int check(zs_err_t *err, const char *what, zs_dtype_t dt, const void *a, const void *b,
                 size_t n, size_t mult)
{
    if (!zs__cuda_dtype_ok(dt))
        return zs_err_set(err, ZS_ERR_INVALID, "%s: dtype %s not supported", what,
                          zs_dtype_name(dt));
    if (mult && n > SIZE_MAX / 8 / mult)
        return zs_err_set(err, ZS_ERR_RANGE, "%s: %zu x %zu elements overflow", what, mult, n);
    if (n && mult && (!a || !b))
        return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL buffer", what);
    if (((uintptr_t)b & 3) != 0) /* b is the record */
        return zs_err_set(err, ZS_ERR_INVALID, "%s: record not 4-byte aligned", what);
    return ZS_OK;
}

/* See zs_cuda_quant.h. */
extern "C" int zs_cuda_quant_pack(void *stream, void *rec, const void *src, zs_dtype_t dt, size_t n,
                                  zs_err_t *err)
{
    if (check(err, "zs_cuda_quant_pack", dt, src, rec, n, 1))
        return err ? err->code : ZS_ERR_INVALID;
    if (n == 0)
        return ZS_OK;
    decltype(&k_quant_pack<ZS_DTYPE_F32>) k = NULL;
    switch (dt) {
    case ZS_DTYPE_F32:
        k = k_quant_pack<ZS_DTYPE_F32>;
        break;
    case ZS_DTYPE_BF16:
        k = k_quant_pack<ZS_DTYPE_BF16>;
        break;
    default:
        k = k_quant_pack<ZS_DTYPE_F16>;
        break;
    }
    ZS_CUDA_LAUNCH(k, (unsigned)nblocks(n), QUANT_THREADS, 0, (cudaStream_t)stream, (char *)rec,
                   src, n);
    ZS_CUDA_LAUNCHED("k_quant_pack");
    return ZS_OK;
}

/* See zs_cuda_quant.h. */
extern "C" int zs_cuda_quant_unpack(void *stream, void *dst, zs_dtype_t dt, const void *rec,
                                    size_t n, size_t nrec, zs_err_t *err)
{
    if (check(err, "zs_cuda_quant_unpack", dt, dst, rec, n, nrec))
        return err ? err->code : ZS_ERR_INVALID;
    if (n == 0 || nrec == 0)
        return ZS_OK;
    decltype(&k_quant_unpack<ZS_DTYPE_F32>) k = NULL;
    switch (dt) {
    case ZS_DTYPE_F32:
        k = k_quant_unpack<ZS_DTYPE_F32>;
        break;
    case ZS_DTYPE_BF16:
        k = k_quant_unpack<ZS_DTYPE_BF16>;
        break;
    default:
        k = k_quant_unpack<ZS_DTYPE_F16>;
        break;
    }
    ZS_CUDA_LAUNCH(k, zs__cuda_blocks(n * nrec, ZS_CUDA_EW_THREADS), ZS_CUDA_EW_THREADS, 0,
                   (cudaStream_t)stream, dst, (const char *)rec, n, nrec);
    ZS_CUDA_LAUNCHED("k_quant_unpack");
    return ZS_OK;
}

/* See zs_cuda_quant.h. */
extern "C" int zs_cuda_quant_unpack_sum(void *stream, float *dst, const void *rec, size_t n,
                                        size_t nsrc, size_t ngroup, zs_err_t *err)
{
    size_t mult = ngroup > nsrc ? ngroup : nsrc;
    if (check(err, "zs_cuda_quant_unpack_sum", ZS_DTYPE_F32, dst, nsrc ? rec : dst, n, mult))
        return err ? err->code : ZS_ERR_INVALID;
    if (n == 0 || ngroup == 0)
        return ZS_OK;
    if (nsrc > SIZE_MAX / ngroup || nsrc * ngroup > SIZE_MAX / record_bytes(n))
        return zs_err_set(err, ZS_ERR_RANGE, "zs_cuda_quant_unpack_sum: %zu x %zu records overflow",
                          nsrc, ngroup);
    ZS_CUDA_LAUNCH(k_quant_unpack_sum, zs__cuda_blocks(n * ngroup, ZS_CUDA_EW_THREADS),
                   ZS_CUDA_EW_THREADS, 0, (cudaStream_t)stream, dst, (const char *)rec, n, nsrc,
                   ngroup);
    ZS_CUDA_LAUNCHED("k_quant_unpack_sum");
    return ZS_OK;
}
