/*
 * zs_cuda_gpt.cu - the GPT layer kernels on CUDA, fp32 (see zs_cuda_gpt.h):
 * embedding, LayerNorm, matmul, GELU, residual, bias gradient, softmax
 * cross-entropy. Attention is in zs_cuda_attn.cu, the GEMMs in
 * zs_cuda_blas.cu.
 *
 * Shapes of parallelism, all fixed by the problem size (never by timing or
 * the GPU), hence deterministic:
 *   element-wise   grid-stride loops, one thread per element
 *   rows           one warp per row (LayerNorm), one block per row (the
 *                  cross-entropy over V): each lane sums a fixed strided
 *                  subset in order, then a fixed butterfly / warp-order tree
 *   columns        two passes: pass 1 sums chunks of ZS_CUDA_COLSUM_ROWS
 *                  rows per column in row order, pass 2 sums the chunk
 *                  partials in chunk order and adds once to the gradient
 *   wte backward   stable radix sort of (token, position) pairs (CUB), then
 *                  one block per run of equal tokens adds the rows of that
 *                  token in position order: the CPU's order, no atomics
 *
 * What it does not do: bf16/fp16 activations, fused kernels beyond the
 * classifier, or any check that token ids are < V (the CPU does not either).
 */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include "zs_cuda_blas.cuh"
#include "zs_cuda_gpt.h"
#include "zs_cuda_util.cuh"
#include "zs_math.h"

#define ROW_WARPS     8 /* warps per block of the warp-per-row kernels */
#define XENT_THREADS  512
#define COL_THREADS   256
#define EMBED_THREADS 256

/* ---- small helpers -------------------------------------------------------------- */

static int bad_shape(zs_err_t *err, const char *fn, const char *what)
{
    return zs_err_set(err, ZS_ERR_INVALID, "%s: %s", fn, what);
}

/* fp32, bf16 or fp16. */
static int known_dt(int dt)
{
    return dt == ZS_DTYPE_F32 || dt == ZS_DTYPE_BF16 || dt == ZS_DTYPE_F16;
}

/* A stream-ordered temporary (freed with tmp_free on the same stream). */
static int tmp_alloc(void **p, size_t bytes, cudaStream_t cs, const char *fn, zs_err_t *err)
{
    cudaError_t e = cudaMallocAsync(p, bytes ? bytes : 1, cs);
    if (e != cudaSuccess)
        return zs__cuda_fail(err, e, fn, __FILE__, __LINE__);
    return ZS_OK;
}

/* Free the temporary and report rc's error first, else the free's. */
static int tmp_free(void *p, cudaStream_t cs, int rc, zs_err_t *err)
{
    cudaError_t e = cudaFreeAsync(p, cs);
    if (rc == ZS_OK && e != cudaSuccess)
        return zs__cuda_fail(err, e, "cudaFreeAsync", __FILE__, __LINE__);
    return rc;
}

/* The two block reductions: the warp step (butterflies) and how the warp
 * results are combined. */
struct block_sum_op {
    static __device__ __forceinline__ float warp(float x)
    {
        return zs__warp_sum(x);
    }
    static __device__ __forceinline__ float combine(float a, float b)
    {
        return a + b;
    }
};
struct block_max_op {
    static __device__ __forceinline__ float warp(float x)
    {
        return zs__warp_max(x);
    }
    static __device__ __forceinline__ float combine(float a, float b)
    {
        return fmaxf(a, b);
    }
};

/* Sum or max (OP) over the block (NT threads, a multiple of 32) in a fixed
 * order: warp butterflies, then every thread combines the warp results in
 * warp order. sh holds NT / 32 floats; the leading barrier lets callers
 * reuse it. */
template <int NT, class OP> static __device__ __forceinline__ float block_reduce(float x, float *sh)
{
    x = OP::warp(x);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = x;
    __syncthreads();
    float s = sh[0];
    for (int w = 1; w < NT / 32; w++)
        s = OP::combine(s, sh[w]);
    return s;
}

/* ---- embedding ------------------------------------------------------------------ */

__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_embed_fwd(float *__restrict__ out, const int32_t *__restrict__ tok,
                const float *__restrict__ wte, const float *__restrict__ wpe, int T, int C,
                size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        size_t r = i / (size_t)C, c = i % (size_t)C;
        out[i] = wte[(size_t)tok[r] * C + c] + wpe[(r % (size_t)T) * C + c];
    }
}

__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS) k_iota(int32_t *v, int n)
{
    ZS_CUDA_FOR(i, (size_t)n)
    {
        v[i] = (int32_t)i;
    }
}

/* Block i handles the run of equal tokens starting at sorted index i (and
 * exits if i is not a run start): dwte[tok, c] += dout[pos, c] for the run's
 * positions in increasing order (the radix sort is stable). */
__global__ void __launch_bounds__(EMBED_THREADS)
    k_embed_bwd_wte(float *__restrict__ dwte, const float *__restrict__ dout,
                    const int32_t *__restrict__ key, const int32_t *__restrict__ pos, int n, int C)
{
    int i = blockIdx.x;
    int32_t k = key[i];
    if (i > 0 && key[i - 1] == k)
        return;
    int end = i + 1;
    while (end < n && key[end] == k)
        end++;
    for (int c = threadIdx.x; c < C; c += EMBED_THREADS) {
        float acc = dwte[(size_t)k * C + c];
        for (int j = i; j < end; j++)
            acc = acc + dout[(size_t)pos[j] * C + c];
        dwte[(size_t)k * C + c] = acc;
    }
}

/* dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in order. */
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_embed_bwd_wpe(float *__restrict__ dwpe, const float *__restrict__ dout, int B, int T,
                    size_t n /* T * C */)
{
    ZS_CUDA_FOR(i, n)
    {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++)
            acc = acc + dout[(size_t)b * n + i];
        dwpe[i] = acc;
    }
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_embed_fwd(void *stream, float *out, const int32_t *tok, const float *wte,
                                 const float *wpe, int B, int T, int C, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (B < 0 || T < 0 || C < 0)
        return bad_shape(err, "zs_cuda_embed_fwd", "negative size");
    size_t n = (size_t)B * T * C;
    if (n == 0)
        return ZS_OK;
    if (!out || !tok || !wte || !wpe)
        return bad_shape(err, "zs_cuda_embed_fwd", "NULL buffer");
    ZS_CUDA_LAUNCH(k_embed_fwd, zs__cuda_blocks(n, ZS_CUDA_EW_THREADS), ZS_CUDA_EW_THREADS, 0, cs,
                   out, tok, wte, wpe, T, C, n);
    ZS_CUDA_LAUNCHED("k_embed_fwd");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_embed_bwd(void *stream, float *dwte, float *dwpe, const float *dout,
                                 const int32_t *tok, int B, int T, int C, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (B < 0 || T < 0 || C < 0 || (long long)B * T > INT32_MAX)
        return bad_shape(err, "zs_cuda_embed_bwd", "bad size");
    int n = B * T;
    if (n == 0 || C == 0)
        return ZS_OK;
    if (!dwte || !dwpe || !dout || !tok)
        return bad_shape(err, "zs_cuda_embed_bwd", "NULL buffer");

    /* temporary: sorted keys, positions in, positions out, sort scratch */
    size_t sort_bytes = 0;
    ZS_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int32_t *)NULL,
                                                (int32_t *)NULL, (const int32_t *)NULL,
                                                (int32_t *)NULL, n, 0, 32, cs),
                "zs_cuda_embed_bwd: cub::DeviceRadixSort::SortPairs (size query)");
    size_t arr = ((size_t)n * sizeof(int32_t) + 255) & ~(size_t)255;
    void *tmp = NULL;
    int rc = tmp_alloc(&tmp, 3 * arr + sort_bytes, cs, "zs_cuda_embed_bwd: cudaMallocAsync", err);
    if (rc != ZS_OK)
        return rc;
    int32_t *key = (int32_t *)tmp;
    int32_t *pos_in = (int32_t *)((char *)tmp + arr);
    int32_t *pos = (int32_t *)((char *)tmp + 2 * arr);
    void *sort_tmp = (char *)tmp + 3 * arr;

    cudaError_t e;
    ZS_CUDA_LAUNCH(k_iota, zs__cuda_blocks((size_t)n, ZS_CUDA_EW_THREADS), ZS_CUDA_EW_THREADS, 0,
                   cs, pos_in, n);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, tok, key, pos_in, pos, n, 0, 32,
                                            cs);
    if (e == cudaSuccess) {
        ZS_CUDA_LAUNCH(k_embed_bwd_wte, n, EMBED_THREADS, 0, cs, dwte, dout, key, pos, n, C);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        size_t tc = (size_t)T * C;
        ZS_CUDA_LAUNCH(k_embed_bwd_wpe, zs__cuda_blocks(tc, ZS_CUDA_EW_THREADS), ZS_CUDA_EW_THREADS,
                       0, cs, dwpe, dout, B, T, tc);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess)
        rc = zs__cuda_fail(err, e, "zs_cuda_embed_bwd (k_iota / radix sort / k_embed_bwd_*)",
                           __FILE__, __LINE__);
    return tmp_free(tmp, cs, rc, err);
}

/* ---- column sums (bias and LayerNorm parameter gradients) ------------------------ */

/* Pass 1: part_a[k, c] = sum over rows r of chunk k of term_a(r, c), in row
 * order from 0.0f; LN = 1: term_a = zs_math_ln_dw, part_b gets dout (the
 * LayerNorm bias term); LN = 0: term_a = dout (a bias gradient). */
template <int LN>
__global__ void __launch_bounds__(COL_THREADS)
    k_colsum_part(float *__restrict__ part_a, float *__restrict__ part_b,
                  const float *__restrict__ dout, const float *__restrict__ inp,
                  const float *__restrict__ mean, const float *__restrict__ rstd, int N, int C)
{
    int c = blockIdx.x * COL_THREADS + threadIdx.x;
    if (c >= C)
        return;
    int r0 = blockIdx.y * ZS_CUDA_COLSUM_ROWS, r1 = min(N, r0 + ZS_CUDA_COLSUM_ROWS);
    float a = 0.0f, b = 0.0f;
    for (int r = r0; r < r1; r++) {
        size_t i = (size_t)r * C + c;
        float d = dout[i];
        if (LN) {
            a = a + zs_math_ln_dw(inp[i], mean[r], rstd[r], d);
            b = b + d;
        } else {
            a = a + d;
        }
    }
    part_a[(size_t)blockIdx.y * C + c] = a;
    if (LN)
        part_b[(size_t)blockIdx.y * C + c] = b;
}

/* Pass 2: dst[c] += partial sums of column c in chunk order (starting from
 * chunk 0's value, so one chunk gives exactly the CPU's dst += sum). */
__global__ void __launch_bounds__(COL_THREADS)
    k_colsum_final(float *__restrict__ dst, const float *__restrict__ part, int chunks, int C)
{
    int c = blockIdx.x * COL_THREADS + threadIdx.x;
    if (c >= C)
        return;
    float s = part[c];
    for (int k = 1; k < chunks; k++)
        s = s + part[(size_t)k * C + c];
    dst[c] = dst[c] + s;
}

/* da += column sums of term a, db += of dout (LN), through a temporary of
 * chunks * C floats per output. */
static int colsum(cudaStream_t cs, int ln, float *da, float *db, const float *dout,
                  const float *inp, const float *mean, const float *rstd, int N, int C,
                  const char *fn, zs_err_t *err)
{
    int chunks = (N + ZS_CUDA_COLSUM_ROWS - 1) / ZS_CUDA_COLSUM_ROWS;
    if (chunks > 65535) /* gridDim.y */
        return zs_err_set(err, ZS_ERR_RANGE,
                          "%s: %d rows is more than the column reduction's "
                          "65535 x %d",
                          fn, N, ZS_CUDA_COLSUM_ROWS);
    size_t per = (size_t)chunks * C;
    void *tmp = NULL;
    int rc = tmp_alloc(&tmp, per * sizeof(float) * (ln ? 2 : 1), cs, fn, err);
    if (rc != ZS_OK)
        return rc;
    float *pa = (float *)tmp, *pb = ln ? pa + per : NULL;
    dim3 grid((unsigned)((C + COL_THREADS - 1) / COL_THREADS), (unsigned)chunks);
    unsigned fb = (unsigned)((C + COL_THREADS - 1) / COL_THREADS);
    cudaError_t e;
    if (ln)
        ZS_CUDA_LAUNCH(k_colsum_part<1>, grid, COL_THREADS, 0, cs, pa, pb, dout, inp, mean, rstd, N,
                       C);
    else
        ZS_CUDA_LAUNCH(k_colsum_part<0>, grid, COL_THREADS, 0, cs, pa, pb, dout, inp, mean, rstd, N,
                       C);
    e = cudaGetLastError();
    if (e == cudaSuccess) {
        ZS_CUDA_LAUNCH(k_colsum_final, fb, COL_THREADS, 0, cs, da, pa, chunks, C);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess && ln) {
        ZS_CUDA_LAUNCH(k_colsum_final, fb, COL_THREADS, 0, cs, db, pb, chunks, C);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess)
        rc = zs__cuda_fail(err, e, "launch of k_colsum_part / k_colsum_final", __FILE__, __LINE__);
    return tmp_free(tmp, cs, rc, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_bias_bwd(void *stream, float *db, const float *dout, int N, int OC,
                                zs_err_t *err)
{
    if (N < 0 || OC < 0 || N > INT32_MAX / 2)
        return bad_shape(err, "zs_cuda_bias_bwd", "bad size");
    if (N == 0 || OC == 0)
        return ZS_OK;
    if (!db || !dout)
        return bad_shape(err, "zs_cuda_bias_bwd", "NULL buffer");
    return colsum((cudaStream_t)stream, 0, db, NULL, dout, NULL, NULL, NULL, N, OC,
                  "zs_cuda_bias_bwd: cudaMallocAsync", err);
}

/* ---- LayerNorm ------------------------------------------------------------------- */

/* One warp per row: mean and biased variance in fp32 (lane-strided sums, a
 * butterfly), rstd and the outputs by zs_math.h. out may equal inp (each
 * lane reads its elements before writing them), as on the CPU. */
/* The row's LayerNorm by one warp: lane-strided sums, a butterfly; the
 * output in ODT (fp32, or rounded to a 16-bit copy). */
template <int ODT>
__device__ __forceinline__ void ln_row(void *o, float *mean, float *rstd, const float *x,
                                       const float *__restrict__ w, const float *__restrict__ b,
                                       int C, int lane)
{
    float s = 0.0f;
    for (int c = lane; c < C; c += 32)
        s = s + x[c];
    float m = zs__warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = x[c] - m;
        v = v + d * d;
    }
    v = zs__warp_sum(v) / (float)C;
    float r = zs_math_ln_rstd(v);
    for (int c = lane; c < C; c += 32)
        zs_math_store(o, ODT, (size_t)c, zs_math_ln_out(x[c], m, r, w[c], b[c]));
    if (lane == 0) {
        *mean = m;
        *rstd = r;
    }
}

template <int ODT>
__global__ void __launch_bounds__(ROW_WARPS * 32)
    k_layernorm_fwd(void *out, float *__restrict__ mean, float *__restrict__ rstd, const float *inp,
                    const float *__restrict__ w, const float *__restrict__ b, int N, int C)
{
    int row = blockIdx.x * ROW_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N)
        return;
    size_t at = (size_t)row * C;
    ln_row<ODT>((char *)out + at * (ODT == ZS_DTYPE_F32 ? 4 : 2), mean + row, rstd + row, inp + at,
                w, b, C, lane);
}

/* The residual add and the LayerNorm after it, one warp per row: each lane
 * writes res = a + b for its columns (RDT 16-bit: rounded into res16 and
 * res = that value widened, k_round's formulas), then the row's LayerNorm
 * of res as k_layernorm_fwd computes it (ln_row: the same lane order and
 * butterfly; each lane reads back only what it wrote, from cache), output
 * in ODT. So the same bits as k_residual_fwd, k_round and k_layernorm_fwd,
 * in one launch instead of two or three. */
template <int RDT, int ODT>
__global__ void __launch_bounds__(ROW_WARPS * 32)
    k_residual_layernorm_fwd(float *__restrict__ res, void *__restrict__ res16,
                             void *__restrict__ out, float *__restrict__ mean,
                             float *__restrict__ rstd, const float *__restrict__ a,
                             const float *__restrict__ b, const float *__restrict__ w,
                             const float *__restrict__ bias, int N, int C)
{
    int row = blockIdx.x * ROW_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N)
        return;
    size_t at = (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float v = a[at + c] + b[at + c];
        if (RDT != ZS_DTYPE_F32) {
            zs_math_store(res16, RDT, at + c, v);
            v = zs_math_load(res16, RDT, at + c);
        }
        res[at + c] = v;
    }
    ln_row<ODT>((char *)out + at * (ODT == ZS_DTYPE_F32 ? 4 : 2), mean + row, rstd + row, res + at,
                w, bias, C, lane);
}

/* One warp per row: dinp += (w dout - mean(dn) - n mean(dn n)) rstd. */
__global__ void __launch_bounds__(ROW_WARPS * 32)
    k_layernorm_bwd_dx(float *__restrict__ dinp, const float *__restrict__ dout,
                       const float *__restrict__ inp, const float *__restrict__ w,
                       const float *__restrict__ mean, const float *__restrict__ rstd, int N, int C)
{
    int row = blockIdx.x * ROW_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float *dx = dinp + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float dm = 0.0f, dnm = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = zs_math_ln_dnorm(w[c], d[c]);
        dm = dm + dn;
        dnm = dnm + zs_math_ln_dnorm_n(dn, x[c], m, r);
    }
    dm = zs__warp_sum(dm) / (float)C;
    dnm = zs__warp_sum(dnm) / (float)C;
    for (int c = lane; c < C; c += 32)
        dx[c] = dx[c] + zs_math_ln_dx(x[c], m, r, w[c], d[c], dm, dnm);
}

typedef void (*resln_fwd_k)(float *, void *, void *, float *, float *, const float *, const float *,
                            const float *, const float *, int, int);

/* The instance for (rdt, odt): odt fp32 or rdt's 16-bit type; NULL else. */
static resln_fwd_k resln_kernel(int rdt, int odt)
{
    if (rdt == ZS_DTYPE_F32)
        return odt == ZS_DTYPE_F32    ? k_residual_layernorm_fwd<ZS_DTYPE_F32, ZS_DTYPE_F32>
               : odt == ZS_DTYPE_BF16 ? k_residual_layernorm_fwd<ZS_DTYPE_F32, ZS_DTYPE_BF16>
               : odt == ZS_DTYPE_F16  ? k_residual_layernorm_fwd<ZS_DTYPE_F32, ZS_DTYPE_F16>
                                      : NULL;
    if (rdt == ZS_DTYPE_BF16)
        return odt == ZS_DTYPE_F32    ? k_residual_layernorm_fwd<ZS_DTYPE_BF16, ZS_DTYPE_F32>
               : odt == ZS_DTYPE_BF16 ? k_residual_layernorm_fwd<ZS_DTYPE_BF16, ZS_DTYPE_BF16>
                                      : NULL;
    if (rdt == ZS_DTYPE_F16)
        return odt == ZS_DTYPE_F32   ? k_residual_layernorm_fwd<ZS_DTYPE_F16, ZS_DTYPE_F32>
               : odt == ZS_DTYPE_F16 ? k_residual_layernorm_fwd<ZS_DTYPE_F16, ZS_DTYPE_F16>
                                     : NULL;
    return NULL;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_residual_layernorm_fwd_dt(void *stream, float *res, void *res16, int rdt,
                                                 void *out, int odt, float *mean, float *rstd,
                                                 const float *a, const float *b, const float *w,
                                                 const float *bias, int N, int C, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (N < 0 || C <= 0)
        return bad_shape(err, "zs_cuda_residual_layernorm_fwd", "bad size");
    resln_fwd_k k = resln_kernel(rdt, odt);
    if (!k)
        return bad_shape(err, "zs_cuda_residual_layernorm_fwd",
                         "dtypes: res rounded to fp32 (none), bf16 or fp16; out fp32 or res's");
    if (N == 0)
        return ZS_OK;
    if (!res || !out || !mean || !rstd || !a || !b || !w || !bias ||
        (rdt != ZS_DTYPE_F32 && !res16))
        return bad_shape(err, "zs_cuda_residual_layernorm_fwd", "NULL buffer");
    ZS_CUDA_LAUNCH(k, (N + ROW_WARPS - 1) / ROW_WARPS, ROW_WARPS * 32, 0, cs, res, res16, out, mean,
                   rstd, a, b, w, bias, N, C);
    ZS_CUDA_LAUNCHED("k_residual_layernorm_fwd");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_residual_layernorm_fwd(void *stream, float *res, float *out, float *mean,
                                              float *rstd, const float *a, const float *b,
                                              const float *w, const float *bias, int N, int C,
                                              zs_err_t *err)
{
    return zs_cuda_residual_layernorm_fwd_dt(stream, res, NULL, ZS_DTYPE_F32, out, ZS_DTYPE_F32,
                                             mean, rstd, a, b, w, bias, N, C, err);
}

typedef void (*ln_fwd_k)(void *, float *, float *, const float *, const float *, const float *, int,
                         int);

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_layernorm_fwd_dt(void *stream, void *out, int odt, float *mean, float *rstd,
                                        const float *inp, const float *w, const float *b, int N,
                                        int C, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (N < 0 || C <= 0)
        return bad_shape(err, "zs_cuda_layernorm_fwd", "bad size");
    if (!known_dt(odt))
        return bad_shape(err, "zs_cuda_layernorm_fwd", "output dtype: fp32, bf16 or fp16");
    if (N == 0)
        return ZS_OK;
    if (!out || !mean || !rstd || !inp || !w || !b)
        return bad_shape(err, "zs_cuda_layernorm_fwd", "NULL buffer");
    ln_fwd_k k = odt == ZS_DTYPE_BF16  ? k_layernorm_fwd<ZS_DTYPE_BF16>
                 : odt == ZS_DTYPE_F16 ? k_layernorm_fwd<ZS_DTYPE_F16>
                                       : k_layernorm_fwd<ZS_DTYPE_F32>;
    ZS_CUDA_LAUNCH(k, (N + ROW_WARPS - 1) / ROW_WARPS, ROW_WARPS * 32, 0, cs, out, mean, rstd, inp,
                   w, b, N, C);
    ZS_CUDA_LAUNCHED("k_layernorm_fwd");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_layernorm_fwd(void *stream, float *out, float *mean, float *rstd,
                                     const float *inp, const float *w, const float *b, int N, int C,
                                     zs_err_t *err)
{
    return zs_cuda_layernorm_fwd_dt(stream, out, ZS_DTYPE_F32, mean, rstd, inp, w, b, N, C, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_layernorm_bwd(void *stream, float *dinp, float *dw, float *db,
                                     const float *dout, const float *inp, const float *w,
                                     const float *mean, const float *rstd, int N, int C,
                                     zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (N < 0 || C <= 0 || N > INT32_MAX / 2)
        return bad_shape(err, "zs_cuda_layernorm_bwd", "bad size");
    if (N == 0)
        return ZS_OK;
    if (!dinp || !dw || !db || !dout || !inp || !w || !mean || !rstd)
        return bad_shape(err, "zs_cuda_layernorm_bwd", "NULL buffer");
    ZS_CUDA_LAUNCH(k_layernorm_bwd_dx, (N + ROW_WARPS - 1) / ROW_WARPS, ROW_WARPS * 32, 0, cs, dinp,
                   dout, inp, w, mean, rstd, N, C);
    ZS_CUDA_LAUNCHED("k_layernorm_bwd_dx");
    return colsum(cs, 1, dw, db, dout, inp, mean, rstd, N, C,
                  "zs_cuda_layernorm_bwd: cudaMallocAsync", err);
}

/* ---- matmul ---------------------------------------------------------------------- */

__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_bias_fill(float *__restrict__ out, const float *__restrict__ bias, int OC, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        out[i] = bias[i % (size_t)OC];
    }
}

/* See zs_cuda_gpt.h. As on the CPU: out = bias rows, then out = inp w + out
 * (beta 1), so the bias is added after the product. */
extern "C" int zs_cuda_matmul_fwd(void *stream, zs_cuda_blas_t *blas, float *out, const float *inp,
                                  const float *w, const float *bias, int N, int IC, int OC,
                                  zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (N < 0 || IC <= 0 || OC < 0)
        return bad_shape(err, "zs_cuda_matmul_fwd", "bad size");
    if (N == 0 || OC == 0)
        return ZS_OK;
    if (!out || !inp || !w)
        return bad_shape(err, "zs_cuda_matmul_fwd", "NULL buffer");
    if (bias) {
        size_t n = (size_t)N * OC;
        ZS_CUDA_LAUNCH(k_bias_fill, zs__cuda_blocks(n, ZS_CUDA_EW_THREADS), ZS_CUDA_EW_THREADS, 0,
                       cs, out, bias, OC, n);
        ZS_CUDA_LAUNCHED("k_bias_fill");
    }
    return zs_cuda_gemm(stream, blas, 0, 0, N, OC, IC, 1.0f, inp, IC, w, OC, bias ? 1.0f : 0.0f,
                        out, OC, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_matmul_bwd(void *stream, zs_cuda_blas_t *blas, float *dinp, float *dw,
                                  float *db, const float *dout, const float *inp, const float *w,
                                  int N, int IC, int OC, zs_err_t *err)
{
    int rc;
    if (N < 0 || IC <= 0 || OC <= 0)
        return bad_shape(err, "zs_cuda_matmul_bwd", "bad size");
    if (N == 0)
        return ZS_OK;
    if (!dw || !dout || !inp || !w)
        return bad_shape(err, "zs_cuda_matmul_bwd", "NULL buffer");
    if (dinp) {
        rc =
            zs_cuda_gemm(stream, blas, 0, 1, N, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, IC, err);
        if (rc != ZS_OK)
            return rc;
    }
    rc = zs_cuda_gemm(stream, blas, 1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC, err);
    if (rc != ZS_OK || !db)
        return rc;
    return zs_cuda_bias_bwd(stream, db, dout, N, OC, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gemm_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx, int ta,
                                  int tb, int M, int N, int K, float alpha, const float *A, int lda,
                                  const float *B, int ldb, float beta, float *C, int ldc,
                                  zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs_mixed_on(mx))
        return zs_cuda_gemm(stream, blas, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                            err);
    zs__opnd_t o;
    int rc = zs__opnd_init("zs_cuda_gemm_mixed", mx, zs_mixed_gemm_elems(ta, tb, M, N, K, lda, ldb),
                           &o, err);
    if (rc != ZS_OK || M <= 0 || N <= 0)
        return rc;
    if (!A || !B || !C || K < 0)
        return bad_shape(err, "zs_cuda_gemm_mixed", "NULL matrix or K < 0");
    size_t na = ta ? zs_mixed_extent((size_t)K, (size_t)M, (size_t)lda)
                   : zs_mixed_extent((size_t)M, (size_t)K, (size_t)lda);
    size_t nb = tb ? zs_mixed_extent((size_t)N, (size_t)K, (size_t)ldb)
                   : zs_mixed_extent((size_t)K, (size_t)N, (size_t)ldb);
    const void *ra, *rb;
    if ((rc = zs__opnd_round(cs, &o, A, na, &ra, err)) ||
        (rc = zs__opnd_round(cs, &o, B, nb, &rb, err)))
        return rc;
    return zs__cuda_gemm_batched(cs, blas, o.dt, ta, tb, M, N, K, alpha, ra, lda, 0, rb, ldb, 0,
                                 beta, C, ldc, 0, 1, err);
}

/* out[N, OC] (fp32) = ri[N, IC] rw[IC, OC] + bias on the rounded operands:
 * the bias in cuBLASLt's epilogue, else (no algorithm for it) a fill kernel
 * and beta = 1. */
static int fwd_out32(cudaStream_t cs, zs_cuda_blas_t *blas, int dt, float *out, const void *ri,
                     const void *rw, const float *bias, int N, int IC, int OC, zs_err_t *err)
{
    if (bias) { /* in the GEMM's epilogue: no fill kernel, no read of out */
        int rc = zs__cuda_gemm_bias(cs, blas, dt, N, OC, IC, ri, IC, rw, OC, bias, out,
                                    ZS_DTYPE_F32, OC, err);
        if (rc != ZS_ERR_UNIMPLEMENTED)
            return rc;
        blas->bias_fallbacks++;
        zs_err_clear(err);
        size_t n = (size_t)N * OC;
        ZS_CUDA_LAUNCH(k_bias_fill, zs__cuda_blocks(n, ZS_CUDA_EW_THREADS), ZS_CUDA_EW_THREADS, 0,
                       cs, out, bias, OC, n);
        ZS_CUDA_LAUNCHED("k_bias_fill");
    }
    return zs__cuda_gemm_batched(cs, blas, dt, 0, 0, N, OC, IC, 1.0f, ri, IC, 0, rw, OC, 0,
                                 bias ? 1.0f : 0.0f, out, OC, 0, 1, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_matmul_fwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx,
                                        float *out, const float *inp, const float *w,
                                        const float *bias, int N, int IC, int OC, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs_mixed_on(mx))
        return zs_cuda_matmul_fwd(stream, blas, out, inp, w, bias, N, IC, OC, err);
    zs__opnd_t o;
    int rc = zs__opnd_init("zs_cuda_matmul_fwd_mixed", mx, zs_mixed_matmul_fwd_elems(N, IC, OC), &o,
                           err);
    if (rc != ZS_OK)
        return rc;
    if (N < 0 || IC <= 0 || OC < 0)
        return bad_shape(err, "zs_cuda_matmul_fwd_mixed", "bad size");
    if (N == 0 || OC == 0)
        return ZS_OK;
    if (!out || !inp || !w)
        return bad_shape(err, "zs_cuda_matmul_fwd_mixed", "NULL buffer");
    const void *ri, *rw;
    if ((rc = zs__opnd_round(cs, &o, inp, (size_t)N * IC, &ri, err)) ||
        (rc = zs__opnd_round(cs, &o, w, (size_t)IC * OC, &rw, err)))
        return rc;
    size_t n = (size_t)N * OC;
    const zs_mixed_twin_t *ft = zs__opnd_twin_of(&o, out, n);
    if (!ft || !ft->fill)
        return fwd_out32(cs, blas, o.dt, out, ri, rw, bias, N, IC, OC, err);
    /* out's fill twin: the GEMM writes its 16-bit home, out is not written */
    void *h16 = (void *)(uintptr_t)ft->h16;
    const void *b16 = bias ? zs__opnd_twin(&o, bias, (size_t)OC) : NULL;
    if (!bias || b16) { /* a bias of D's type must be exact: its twin only */
        rc = zs__cuda_gemm_bias(cs, blas, o.dt, N, OC, IC, ri, IC, rw, OC, b16, h16, o.dt, OC, err);
        if (rc != ZS_ERR_UNIMPLEMENTED)
            return rc;
        zs_err_clear(err);
    }
    /* an fp32 bias (rounding it would change the sum) or no algorithm: the
     * fp32 GEMM into out, rounded into the home (out is then its scratch) */
    blas->out16_fallbacks++;
    if ((rc = fwd_out32(cs, blas, o.dt, out, ri, rw, bias, N, IC, OC, err)))
        return rc;
    return zs_cuda_cast(cs, h16, (zs_dtype_t)o.dt, out, ZS_DTYPE_F32, n, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_matmul_bwd_mixed(void *stream, zs_cuda_blas_t *blas, const zs_mixed_t *mx,
                                        float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, int N, int IC, int OC,
                                        zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    if (!zs_mixed_on(mx))
        return zs_cuda_matmul_bwd(stream, blas, dinp, dw, db, dout, inp, w, N, IC, OC, err);
    zs__opnd_t o;
    int rc = zs__opnd_init("zs_cuda_matmul_bwd_mixed", mx, zs_mixed_matmul_bwd_elems(N, IC, OC), &o,
                           err);
    if (rc != ZS_OK)
        return rc;
    if (N < 0 || IC <= 0 || OC <= 0)
        return bad_shape(err, "zs_cuda_matmul_bwd_mixed", "bad size");
    if (N == 0)
        return ZS_OK;
    if (!dw || !dout || !inp || !w)
        return bad_shape(err, "zs_cuda_matmul_bwd_mixed", "NULL buffer");
    const void *rd, *rw, *ri;
    if ((rc = zs__opnd_round(cs, &o, dout, (size_t)N * OC, &rd, err)) ||
        (rc = zs__opnd_round(cs, &o, w, (size_t)IC * OC, &rw, err)) ||
        (rc = zs__opnd_round(cs, &o, inp, (size_t)N * IC, &ri, err)))
        return rc;
    if (dinp) {
        rc = zs__cuda_gemm_batched(cs, blas, o.dt, 0, 1, N, IC, OC, 1.0f, rd, OC, 0, rw, OC, 0,
                                   0.0f, dinp, IC, 0, 1, err);
        if (rc != ZS_OK)
            return rc;
    }
    rc = zs__cuda_gemm_batched(cs, blas, o.dt, 1, 0, IC, OC, N, 1.0f, ri, IC, 0, rd, OC, 0, 1.0f,
                               dw, OC, 0, 1, err);
    if (rc != ZS_OK || !db)
        return rc;
    return zs_cuda_bias_bwd(stream, db, dout, N, OC, err); /* the fp32 dout */
}

/* ---- GELU, residual -------------------------------------------------------------- */

/* inp of dtype IDT and out of ODT (fp32, or a 16-bit copy: read widened,
 * written rounded to nearest even), so a 16-bit input gives what its fp32
 * widening gives, and a 16-bit output what rounding the fp32 one gives. */
template <int IDT, int ODT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_gelu_fwd(void *out, const void *inp, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        zs_math_store(out, ODT, i, zs_math_gelu(zs_math_load(inp, IDT, i)));
    }
}

/* dinp = gelu'(inp) dout, and with CDT bf16 / fp16 also dinp rounded to
 * CDT into dcopy (ZS_DTYPE_NONE: no copy, dcopy unused). */
template <int IDT, int CDT>
__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_gelu_bwd(float *dinp, void *__restrict__ dcopy, const void *inp, const float *dout, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        float v = zs_math_gelu_grad(zs_math_load(inp, IDT, i), dout[i]);
        dinp[i] = v;
        if (CDT != ZS_DTYPE_NONE)
            zs_math_store(dcopy, CDT, i, v);
    }
}

__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        out[i] = a[i] + b[i];
    }
}

__global__ void __launch_bounds__(ZS_CUDA_EW_THREADS)
    k_residual_bwd(float *__restrict__ da, float *__restrict__ db, const float *__restrict__ dout,
                   size_t n)
{
    ZS_CUDA_FOR(i, n)
    {
        float d = dout[i];
        da[i] = da[i] + d;
        db[i] = db[i] + d;
    }
}

/* Launch an elementwise kernel over n elements and return; EW_LAUNCH_AS
 * names it in errors (a pointer to a template instance). */
#define EW_LAUNCH_AS(name, kernel, n, ...)                                                         \
    do {                                                                                           \
        if ((n) == 0)                                                                              \
            return ZS_OK;                                                                          \
        ZS_CUDA_LAUNCH(kernel, zs__cuda_blocks((n), ZS_CUDA_EW_THREADS), ZS_CUDA_EW_THREADS, 0,    \
                       (cudaStream_t)stream, __VA_ARGS__);                                         \
        ZS_CUDA_LAUNCHED(name);                                                                    \
        return ZS_OK;                                                                              \
    } while (0)
#define EW_LAUNCH(kernel, n, ...) EW_LAUNCH_AS(#kernel, kernel, n, __VA_ARGS__)

typedef void (*gelu_fwd_k)(void *, const void *, size_t);
typedef void (*gelu_bwd_k)(float *, void *, const void *, const float *, size_t);

/* k_gelu_fwd<IDT, ODT> for one 16-bit dtype H: fp32 with fp32, or H on
 * either side or both (a pointer: the instances' commas would split the
 * launch macro's arguments). */
template <int H> static gelu_fwd_k gelu_fwd_pick(int odt, int idt)
{
    if (idt == ZS_DTYPE_F32)
        return odt == ZS_DTYPE_F32 ? k_gelu_fwd<ZS_DTYPE_F32, ZS_DTYPE_F32>
                                   : k_gelu_fwd<ZS_DTYPE_F32, H>;
    return odt == ZS_DTYPE_F32 ? k_gelu_fwd<H, ZS_DTYPE_F32> : k_gelu_fwd<H, H>;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gelu_fwd_dt(void *stream, void *out, int odt, const void *inp, int idt,
                                   size_t n, zs_err_t *err)
{
    if (n && (!out || !inp))
        return bad_shape(err, "zs_cuda_gelu_fwd", "NULL buffer");
    if (!known_dt(idt) || !known_dt(odt) ||
        (idt != ZS_DTYPE_F32 && odt != ZS_DTYPE_F32 && idt != odt))
        return bad_shape(err, "zs_cuda_gelu_fwd", "dtypes: fp32, or one 16-bit dtype");
    int h = idt != ZS_DTYPE_F32 ? idt : odt;
    gelu_fwd_k k = h == ZS_DTYPE_F16 ? gelu_fwd_pick<ZS_DTYPE_F16>(odt, idt)
                                     : gelu_fwd_pick<ZS_DTYPE_BF16>(odt, idt);
    EW_LAUNCH_AS("k_gelu_fwd", k, n, out, inp, n);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gelu_fwd(void *stream, float *out, const float *inp, size_t n, zs_err_t *err)
{
    return zs_cuda_gelu_fwd_dt(stream, out, ZS_DTYPE_F32, inp, ZS_DTYPE_F32, n, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gelu_bwd_dt(void *stream, float *dinp, const void *inp, int idt,
                                   const float *dout, size_t n, zs_err_t *err)
{
    if (n && (!dinp || !inp || !dout))
        return bad_shape(err, "zs_cuda_gelu_bwd", "NULL buffer");
    if (!known_dt(idt))
        return bad_shape(err, "zs_cuda_gelu_bwd", "dtype: fp32, bf16 or fp16");
    gelu_bwd_k k = idt == ZS_DTYPE_BF16  ? k_gelu_bwd<ZS_DTYPE_BF16, ZS_DTYPE_NONE>
                   : idt == ZS_DTYPE_F16 ? k_gelu_bwd<ZS_DTYPE_F16, ZS_DTYPE_NONE>
                                         : k_gelu_bwd<ZS_DTYPE_F32, ZS_DTYPE_NONE>;
    EW_LAUNCH_AS("k_gelu_bwd", k, n, dinp, NULL, inp, dout, n);
}

/* k_gelu_bwd<IDT, H>: the input fp32 or H, the copy H. */
template <int H> static gelu_bwd_k gelu_bwd_copy_pick(int idt)
{
    return idt == ZS_DTYPE_F32 ? k_gelu_bwd<ZS_DTYPE_F32, H> : k_gelu_bwd<H, H>;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gelu_bwd_copy(void *stream, float *dinp, void *dcopy, int cdt,
                                     const void *inp, int idt, const float *dout, size_t n,
                                     zs_err_t *err)
{
    if (!dcopy)
        return zs_cuda_gelu_bwd_dt(stream, dinp, inp, idt, dout, n, err);
    if (n && (!dinp || !inp || !dout))
        return bad_shape(err, "zs_cuda_gelu_bwd", "NULL buffer");
    if ((cdt != ZS_DTYPE_BF16 && cdt != ZS_DTYPE_F16) || (idt != ZS_DTYPE_F32 && idt != cdt))
        return bad_shape(err, "zs_cuda_gelu_bwd",
                         "dtypes: a bf16 / fp16 copy, the input fp32 or the copy's");
    gelu_bwd_k k = cdt == ZS_DTYPE_F16 ? gelu_bwd_copy_pick<ZS_DTYPE_F16>(idt)
                                       : gelu_bwd_copy_pick<ZS_DTYPE_BF16>(idt);
    EW_LAUNCH_AS("k_gelu_bwd", k, n, dinp, dcopy, inp, dout, n);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_gelu_bwd(void *stream, float *dinp, const float *inp, const float *dout,
                                size_t n, zs_err_t *err)
{
    return zs_cuda_gelu_bwd_dt(stream, dinp, inp, ZS_DTYPE_F32, dout, n, err);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_residual_fwd(void *stream, float *out, const float *a, const float *b,
                                    size_t n, zs_err_t *err)
{
    if (n && (!out || !a || !b))
        return bad_shape(err, "zs_cuda_residual_fwd", "NULL buffer");
    EW_LAUNCH(k_residual_fwd, n, out, a, b, n);
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_residual_bwd(void *stream, float *da, float *db, const float *dout, size_t n,
                                    zs_err_t *err)
{
    if (n && (!da || !db || !dout))
        return bad_shape(err, "zs_cuda_residual_bwd", "NULL buffer");
    if (n && (da == db || da == dout || db == dout))
        return bad_shape(err, "zs_cuda_residual_bwd", "da, db and dout must be distinct");
    EW_LAUNCH(k_residual_bwd, n, da, db, dout, n);
}

/* ---- softmax cross-entropy ------------------------------------------------------- */

/* One block per row: lse = max + log(sum exp(l - max)) in fp32, loss =
 * lse - l[target]; FUSED also writes dlogits (may alias logits: each
 * element is read before its own thread writes it, and the row's last
 * reads happen before the barrier inside the last block_reduce). */
template <int FUSED>
__global__ void __launch_bounds__(XENT_THREADS)
    k_xent(float *losses, float *lse_out, float *dlogits, const float *logits,
           const int32_t *targets, int V, int ld, float scale)
{
    __shared__ float sh[XENT_THREADS / 32];
    size_t row = blockIdx.x;
    const float *l = logits + row * (size_t)ld;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += XENT_THREADS)
        mx = fmaxf(mx, l[v]);
    mx = block_reduce<XENT_THREADS, block_max_op>(mx, sh);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += XENT_THREADS)
        s = s + expf(l[v] - mx);
    s = block_reduce<XENT_THREADS, block_sum_op>(s, sh);
    float lse = mx + logf(s);
    int t = targets[row];
    int ok = t >= 0 && t < V;
    if (threadIdx.x == 0) {
        lse_out[row] = lse;
        losses[row] = ok ? lse - l[t] : __int_as_float(0x7FC00000);
    }
    if (FUSED) {
        __syncthreads(); /* thread 0 has read l[t] before anyone overwrites it */
        float *d = dlogits + row * (size_t)ld;
        for (int v = threadIdx.x; v < V; v += XENT_THREADS)
            d[v] = zs_math_xent_dlogit(l[v], lse, scale, v == t);
    }
}

/* One block per row (a flat grid-stride loop needed a 64-bit division per
 * element for its row: 4.3 ms per 124M step on an H200, about 2.7x the
 * memory's time). dlogits may alias logits: each thread reads the elements
 * it writes. */
__global__ void __launch_bounds__(XENT_THREADS)
    k_xent_bwd(float *dlogits, const float *logits, const float *__restrict__ lse,
               const int32_t *__restrict__ targets, int V, int ld, float scale)
{
    size_t at = (size_t)blockIdx.x * (size_t)ld;
    float r = lse[blockIdx.x];
    int t = targets[blockIdx.x];
    for (int v = threadIdx.x; v < V; v += XENT_THREADS)
        dlogits[at + v] = zs_math_xent_dlogit(logits[at + v], r, scale, v == t);
}

/* k_xent_bwd into a 16-bit copy (ODT): each dlogit rounded to nearest
 * even, and the padding columns [V, ld) written as zeros, so the whole
 * [N, ld] operand a padded-vocabulary GEMM reads is defined. */
template <int ODT>
__global__ void __launch_bounds__(XENT_THREADS)
    k_xent_bwd16(void *__restrict__ d16, const float *__restrict__ logits,
                 const float *__restrict__ lse, const int32_t *__restrict__ targets, int V, int ld,
                 float scale)
{
    size_t at = (size_t)blockIdx.x * (size_t)ld;
    float r = lse[blockIdx.x];
    int t = targets[blockIdx.x];
    for (int v = threadIdx.x; v < ld; v += XENT_THREADS)
        zs_math_store(d16, ODT, at + v,
                      v < V ? zs_math_xent_dlogit(logits[at + v], r, scale, v == t) : 0.0f);
}

static int xent_args(const char *fn, int N, int V, int ld, const void *a, const void *b,
                     const void *c, const void *d, zs_err_t *err)
{
    if (N < 0 || V <= 0 || ld < V)
        return bad_shape(err, fn, "bad size (N < 0, V <= 0 or ld < V)");
    if (N && (!a || !b || !c || !d))
        return bad_shape(err, fn, "NULL buffer");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_xent_fwd(void *stream, float *losses, float *lse, const float *logits,
                                const int32_t *targets, int N, int V, int ld, zs_err_t *err)
{
    int rc = xent_args("zs_cuda_xent_fwd", N, V, ld, losses, lse, logits, targets, err);
    if (rc != ZS_OK || N == 0)
        return rc;
    ZS_CUDA_LAUNCH(k_xent<0>, N, XENT_THREADS, 0, (cudaStream_t)stream, losses, lse, NULL, logits,
                   targets, V, ld, 0.0f);
    ZS_CUDA_LAUNCHED("k_xent<0>");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_xent_bwd(void *stream, float *dlogits, const float *logits, const float *lse,
                                const int32_t *targets, int N, int V, int ld, float scale,
                                zs_err_t *err)
{
    int rc = xent_args("zs_cuda_xent_bwd", N, V, ld, dlogits, logits, lse, targets, err);
    if (rc != ZS_OK || N == 0)
        return rc;
    ZS_CUDA_LAUNCH(k_xent_bwd, N, XENT_THREADS, 0, (cudaStream_t)stream, dlogits, logits, lse,
                   targets, V, ld, scale);
    ZS_CUDA_LAUNCHED("k_xent_bwd");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_xent_bwd_dt(void *stream, void *dlogits, int odt, const float *logits,
                                   const float *lse, const int32_t *targets, int N, int V, int ld,
                                   float scale, zs_err_t *err)
{
    if (odt == ZS_DTYPE_F32)
        return zs_cuda_xent_bwd(stream, (float *)dlogits, logits, lse, targets, N, V, ld, scale,
                                err);
    if (odt != ZS_DTYPE_BF16 && odt != ZS_DTYPE_F16)
        return bad_shape(err, "zs_cuda_xent_bwd", "output dtype: fp32, bf16 or fp16");
    int rc = xent_args("zs_cuda_xent_bwd", N, V, ld, dlogits, logits, lse, targets, err);
    if (rc != ZS_OK || N == 0)
        return rc;
    if ((const char *)dlogits < (const char *)(logits + (size_t)N * ld) &&
        (const char *)logits < (const char *)dlogits + (size_t)N * ld * 2)
        return bad_shape(err, "zs_cuda_xent_bwd", "a 16-bit dlogits overlapping the logits");
    if (odt == ZS_DTYPE_BF16)
        ZS_CUDA_LAUNCH(k_xent_bwd16<ZS_DTYPE_BF16>, N, XENT_THREADS, 0, (cudaStream_t)stream,
                       dlogits, logits, lse, targets, V, ld, scale);
    else
        ZS_CUDA_LAUNCH(k_xent_bwd16<ZS_DTYPE_F16>, N, XENT_THREADS, 0, (cudaStream_t)stream,
                       dlogits, logits, lse, targets, V, ld, scale);
    ZS_CUDA_LAUNCHED("k_xent_bwd16");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_xent_fused(void *stream, float *losses, float *lse, float *dlogits,
                                  const float *logits, const int32_t *targets, int N, int V, int ld,
                                  float scale, zs_err_t *err)
{
    int rc = xent_args("zs_cuda_xent_fused", N, V, ld, losses, lse, logits, targets, err);
    if (rc != ZS_OK || N == 0)
        return rc;
    if (!dlogits)
        return bad_shape(err, "zs_cuda_xent_fused", "NULL dlogits");
    ZS_CUDA_LAUNCH(k_xent<1>, N, XENT_THREADS, 0, (cudaStream_t)stream, losses, lse, dlogits,
                   logits, targets, V, ld, scale);
    ZS_CUDA_LAUNCHED("k_xent<1>");
    return ZS_OK;
}
