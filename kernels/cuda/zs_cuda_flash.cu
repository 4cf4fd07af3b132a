/*
 * zs_cuda_flash.cu - fused causal self-attention on CUDA, FlashAttention-2
 * style (see zs_cuda_gpt.h, zs_cuda_attention_flash_*): the [B, NH, T, T]
 * probabilities never reach global memory. The CPU twins are
 * zs_op_attention_flash_fwd / _bwd (and their _mixed forms) in
 * kernels/zs_gpt_ops.c.
 *
 * Tensor cores through the documented nvcuda::wmma API (m16n16k16, bf16 or
 * fp16 operands, fp32 accumulators): every product reads its operands
 * rounded to the mixed dtype (zs_mixed.h, "flash fwd" / "flash bwd"), the
 * softmax statistics, D and all sums are fp32. Fragments are only moved
 * between shared memory and the tensor cores (never indexed: the element
 * mapping is unspecified); every element-wise step works on shared memory.
 *
 * Blocks of 4 warps (128 threads); a tile is 64 rows (FL_BQ queries or
 * ZS_FLASH_BK keys), each warp owns 16 rows of it:
 *   forward   one block per (b, h, query tile); K / V tiles from 0 up to the
 *             diagonal (tiles past it are skipped, the diagonal one masked
 *             element-wise); S = Q K^T -> shared fp32, online softmax per
 *             row (running max m, sum l of the fp32 p), O *= exp(m_old -
 *             m_new) in shared memory, O += round(p) V; out = O / l, lse =
 *             m + log l.
 *   backward  D = rowsum(dout * out) (k_flash_bwd_dot, a stream-ordered
 *             temporary of B*NH*T floats), then two kernels, no atomics:
 *             k_flash_bwd_dkv, one block per (b, h, key tile), loops over
 *             the query tiles from the diagonal on: S^T = K Q^T, p =
 *             exp(scale S - lse), dV += round(p)^T dO, dP^T = V dO^T, dS =
 *             round(p (dP - D) scale), dK += dS^T Q; k_flash_bwd_dq, one
 *             block per (b, h, query tile), loops over the key tiles up to
 *             the diagonal recomputing S, p, dP and dS: dQ += dS K. Each
 *             output element is summed by one block in a fixed order, so
 *             the results repeat bitwise (the price: S and dP are computed
 *             twice, about 1.4x the backward's tensor-core work).
 * Rows past T are loaded as zeros and masked, never stored.
 *
 * What it does not do: fp32 operands (ZS_ERR_INVALID: the caller keeps the
 * unfused path), head sizes other than multiples of 16 up to 128, dropout,
 * non-causal attention, asynchronous copies (cp.async) or double buffering
 * of the K / V tiles, anything tuned beyond the tile shapes above.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>

#include "zs_cuda_gpt.h"
#include "zs_cuda_util.cuh"
#include "zs_math.h"

using namespace nvcuda;

#define FL_BQ        64          /* query rows per tile */
#define FL_BK        ZS_FLASH_BK /* key rows per tile (the CPU twin's) */
#define FL_WARPS     4           /* 16 rows per warp */
#define FL_THREADS   (FL_WARPS * 32)
#define FL_HS_MAX    128
#define FL_LDS       (FL_BK + 4) /* fp32 score tiles' row pitch (floats) */
#define FL_LDP       (FL_BK + 8) /* 16-bit p / dS tiles' row pitch (elements) */
#define FL_DOT_WARPS 8           /* rows (warps) per block of k_flash_bwd_dot */

#if FL_BQ != 64 || FL_BK != 64
#error "zs_cuda_flash.cu: the kernels assume 64-row tiles of 4 warps"
#endif

/* fp32 -> the 16-bit operand type's bits, nearest even (zs_math.h: the CPU
 * twin rounds with the same functions). */
template <typename E> struct fl_cvt;
template <> struct fl_cvt<__nv_bfloat16> {
    static __device__ __forceinline__ uint16_t bits(float x)
    {
        return zs_math_f32_to_bf16(x);
    }
};
template <> struct fl_cvt<__half> {
    static __device__ __forceinline__ uint16_t bits(float x)
    {
        return zs_math_f32_to_f16(x);
    }
};

template <typename E> static __device__ __forceinline__ void fl_put(E *p, float x)
{
    *reinterpret_cast<uint16_t *>(p) = fl_cvt<E>::bits(x);
}

/* Shared memory: ne 16-bit tiles of 64 x (hs + 8), ns fp32 score tiles of
 * 64 x FL_LDS, one 16-bit p tile of 64 x FL_LDP, no fp32 accumulators of
 * 64 x (hs + 4), nst arrays of 64 floats; every piece a multiple of 32
 * bytes, the base rounded up to 32 bytes (wmma pointers must be 256-bit
 * aligned; dynamic shared memory is only promised 16). */
static __host__ __device__ size_t fl_smem_bytes(int hs, int ne, int ns, int no, int nst)
{
    return 32 + (size_t)ne * 64 * (hs + 8) * 2 + (size_t)ns * 64 * FL_LDS * 4 +
           (size_t)64 * FL_LDP * 2 + (size_t)no * 64 * (hs + 4) * 4 + (size_t)nst * 64 * 4;
}

/* A cursor over the block's dynamic shared memory. */
struct fl_carve {
    unsigned char *p;
    template <typename X> __device__ X *take(size_t elems)
    {
        X *r = reinterpret_cast<X *>(p);
        p += elems * sizeof(X);
        return r;
    }
};

/* Block-wide: dst[r][c] = src[(r0 + r) * ld + c] rounded, r < 64, c < hs
 * (rows r0 + r >= T are zeros). src rows are 16-byte aligned (checked by
 * the launchers), hs a multiple of 16. */
template <typename E>
static __device__ void fl_load_tile(E *dst, int lde, const float *src, size_t ld, int r0, int T,
                                    int hs)
{
    int n4 = hs / 4;
    for (int i = threadIdx.x; i < 64 * n4; i += blockDim.x) {
        int r = i / n4, c = (i % n4) * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r0 + r < T)
            x = *reinterpret_cast<const float4 *>(src + (size_t)(r0 + r) * ld + c);
        E *d = dst + r * lde + c;
        fl_put(d, x.x);
        fl_put(d + 1, x.y);
        fl_put(d + 2, x.z);
        fl_put(d + 3, x.w);
    }
}

/* Block-wide: 64 rows of hs floats at pitch ld set to zero. */
static __device__ void fl_zero_rows(float *p, int ld, int hs)
{
    for (int i = threadIdx.x; i < 64 * hs; i += blockDim.x)
        p[(i / hs) * ld + i % hs] = 0.0f;
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fl_acc_t;

/* Warp-wide: for column blocks nt in [nt0, nt1): c[16 x 16 nt..] = a b^T with
 * a [16 x 16 k16] row-major (lda) and b [rows 16 nt.. x 16 k16] row-major
 * (ldb), i.e. b read as a col_major matrix_b; c fp32 row-major (ldc),
 * written (=). */
template <typename E>
static __device__ void fl_mm_abt(float *c, int ldc, const E *a, int lda, const E *b, int ldb,
                                 int nt0, int nt1, int k16)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> fb;
    fl_acc_t acc;
    for (int nt = nt0; nt < nt1; nt++) {
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < k16; kk++) {
            wmma::load_matrix_sync(fa, a + kk * 16, (unsigned)lda);
            wmma::load_matrix_sync(fb, b + (size_t)nt * 16 * ldb + kk * 16, (unsigned)ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + nt * 16, acc, (unsigned)ldc, wmma::mem_row_major);
    }
}

/* Warp-wide: for column blocks nt in [0, n16): c[16 x 16 nt..] += sum over
 * kk in [kk0, kk1) of a[:, 16 kk..] b[16 kk.., 16 nt..]; a row-major (lda),
 * b row-major (ldb), c fp32 row-major (ldc), accumulated (+=). */
template <typename E>
static __device__ void fl_mm_acc(float *c, int ldc, const E *a, int lda, const E *b, int ldb,
                                 int n16, int kk0, int kk1)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> fb;
    fl_acc_t acc;
    for (int nt = 0; nt < n16; nt++) {
        wmma::load_matrix_sync(acc, c + nt * 16, (unsigned)ldc, wmma::mem_row_major);
        for (int kk = kk0; kk < kk1; kk++) {
            wmma::load_matrix_sync(fa, a + kk * 16, (unsigned)lda);
            wmma::load_matrix_sync(fb, b + (size_t)kk * 16 * ldb + nt * 16, (unsigned)ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + nt * 16, acc, (unsigned)ldc, wmma::mem_row_major);
    }
}

static __device__ __forceinline__ unsigned char *fl_base(float4 *dyn)
{
    return reinterpret_cast<unsigned char *>(((uintptr_t)dyn + 31) & ~(uintptr_t)31);
}

/* Forward: grid (query tiles, NH, B), the longest rows first. */
template <typename E>
__global__ void __launch_bounds__(FL_THREADS)
    k_flash_fwd(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ qkv,
                int T, int C, int NH, float scale)
{
    extern __shared__ float4 zs_flash_smem[];
    int qt = (int)(gridDim.x - 1 - blockIdx.x), h = (int)blockIdx.y, b = (int)blockIdx.z;
    int hs = C / NH, lde = hs + 8, ldo = hs + 4, k16 = hs / 16;
    int w = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, q0 = qt * FL_BQ;
    fl_carve cv = {fl_base(zs_flash_smem)};
    E *Qs = cv.take<E>((size_t)64 * lde), *Ks = cv.take<E>((size_t)64 * lde),
      *Vs = cv.take<E>((size_t)64 * lde);
    float *Ss = cv.take<float>(64 * FL_LDS);
    E *Ps = cv.take<E>(64 * FL_LDP);
    float *Os = cv.take<float>((size_t)64 * ldo);
    float *m_s = cv.take<float>(64), *l_s = cv.take<float>(64), *a_s = cv.take<float>(64);
    size_t ld = (size_t)3 * C;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
    fl_load_tile(Qs, lde, base, ld, q0, T, hs);
    fl_zero_rows(Os, ldo, hs);
    if (threadIdx.x < 64) {
        m_s[threadIdx.x] = -INFINITY;
        l_s[threadIdx.x] = 0.0f;
    }
    float *Sw = Ss + w * 16 * FL_LDS, *Ow = Os + w * 16 * ldo;
    E *Pw = Ps + w * 16 * FL_LDP;
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * FL_BK;
        __syncthreads(); /* the previous tile's K / V reads are done */
        fl_load_tile(Ks, lde, base + C, ld, k0, T, hs);
        fl_load_tile(Vs, lde, base + 2 * C, ld, k0, T, hs);
        __syncthreads();
        /* on the diagonal, key blocks past the warp's rows are all masked */
        int nkb = kt == qt ? w + 1 : FL_BK / 16;
        fl_mm_abt(Sw, FL_LDS, Qs + w * 16 * lde, lde, Ks, lde, 0, nkb, k16);
        __syncwarp();
        for (int r = 0; r < 16; r++) {
            int row = w * 16 + r, q = q0 + row;
            float s0 = -INFINITY, s1 = -INFINITY;
            if (k0 + lane <= q)
                s0 = Sw[r * FL_LDS + lane] * scale;
            if (k0 + lane + 32 <= q)
                s1 = Sw[r * FL_LDS + lane + 32] * scale;
            float mt = zs__warp_max(fmaxf(s0, s1));
            float mo = m_s[row], mn = fmaxf(mo, mt), alpha = expf(mo - mn);
            float p0 = k0 + lane <= q ? expf(s0 - mn) : 0.0f;
            float p1 = k0 + lane + 32 <= q ? expf(s1 - mn) : 0.0f;
            fl_put(Pw + r * FL_LDP + lane, p0);
            fl_put(Pw + r * FL_LDP + lane + 32, p1);
            float ps = zs__warp_sum(p0 + p1);
            __syncwarp(); /* every lane has read m_s[row] */
            if (lane == 0) {
                m_s[row] = mn;
                l_s[row] = l_s[row] * alpha + ps;
                a_s[row] = alpha;
            }
        }
        __syncwarp();
        for (int r = 0; r < 16; r++) {
            float alpha = a_s[w * 16 + r];
            for (int c = lane; c < hs; c += 32)
                Ow[r * ldo + c] *= alpha;
        }
        __syncwarp();
        fl_mm_acc(Ow, ldo, Pw, FL_LDP, Vs, lde, k16, 0, nkb);
    }
    __syncwarp();
    for (int r = 0; r < 16; r++) {
        int row = w * 16 + r, q = q0 + row;
        if (q >= T)
            break;
        float l = l_s[row];
        float *o = out + ((size_t)b * T + q) * C + (size_t)h * hs;
        for (int c = lane; c < hs; c += 32)
            o[c] = Ow[r * ldo + c] / l;
        if (lane == 0)
            lse[((size_t)b * NH + h) * T + q] = m_s[row] + logf(l);
    }
}

/* D[(b * NH + h) * T + t] = dout[b, t, head h] . out[b, t, head h]; one warp
 * per row, a fixed butterfly. */
__global__ void __launch_bounds__(FL_DOT_WARPS * 32)
    k_flash_bwd_dot(float *__restrict__ D, const float *__restrict__ dout,
                    const float *__restrict__ out, int T, int C, int NH, size_t rows)
{
    size_t row = (size_t)blockIdx.x * FL_DOT_WARPS + (threadIdx.x >> 5);
    int lane = (int)threadIdx.x & 31, hs = C / NH;
    if (row >= rows)
        return;
    int t = (int)(row % (size_t)T), h = (int)(row / (size_t)T % (size_t)NH);
    size_t b = row / ((size_t)T * NH), off = (b * T + t) * C + (size_t)h * hs;
    float s = 0.0f;
    for (int c = lane; c < hs; c += 32)
        s = s + dout[off + c] * out[off + c];
    s = zs__warp_sum(s);
    if (lane == 0)
        D[row] = s;
}

/* dK, dV: grid (key tiles, NH, B); key tile 0 (the most query tiles) first. */
template <typename E>
__global__ void __launch_bounds__(FL_THREADS)
    k_flash_bwd_dkv(float *__restrict__ dqkv, const float *__restrict__ dout,
                    const float *__restrict__ qkv, const float *__restrict__ lse,
                    const float *__restrict__ Dg, int T, int C, int NH, float scale)
{
    extern __shared__ float4 zs_flash_smem[];
    int kt = (int)blockIdx.x, h = (int)blockIdx.y, b = (int)blockIdx.z;
    int hs = C / NH, lde = hs + 8, ldo = hs + 4, k16 = hs / 16;
    int w = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, k0 = kt * FL_BK;
    int nqt = (T + FL_BQ - 1) / FL_BQ;
    fl_carve cv = {fl_base(zs_flash_smem)};
    E *Ks = cv.take<E>((size_t)64 * lde), *Vs = cv.take<E>((size_t)64 * lde),
      *Qs = cv.take<E>((size_t)64 * lde), *dOs = cv.take<E>((size_t)64 * lde);
    float *Ss = cv.take<float>(64 * FL_LDS), *dPs = cv.take<float>(64 * FL_LDS);
    E *Ps = cv.take<E>(64 * FL_LDP);
    float *dKs = cv.take<float>((size_t)64 * ldo), *dVs = cv.take<float>((size_t)64 * ldo);
    float *lse_s = cv.take<float>(64), *D_s = cv.take<float>(64);
    size_t ld = (size_t)3 * C, hrow = ((size_t)b * NH + h) * T;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
    const float *dbase = dout + (size_t)b * T * C + (size_t)h * hs;
    fl_load_tile(Ks, lde, base + C, ld, k0, T, hs);
    fl_load_tile(Vs, lde, base + 2 * C, ld, k0, T, hs);
    fl_zero_rows(dKs, ldo, hs);
    fl_zero_rows(dVs, ldo, hs);
    float *Sw = Ss + w * 16 * FL_LDS, *dPw = dPs + w * 16 * FL_LDS;
    float *dKw = dKs + w * 16 * ldo, *dVw = dVs + w * 16 * ldo;
    E *Pw = Ps + w * 16 * FL_LDP;
    for (int qt = kt; qt < nqt; qt++) {
        int q0 = qt * FL_BQ;
        __syncthreads(); /* the previous tile's Q / dO reads are done */
        fl_load_tile(Qs, lde, base, ld, q0, T, hs);
        fl_load_tile(dOs, lde, dbase, (size_t)C, q0, T, hs);
        if (threadIdx.x < 64) {
            int q = q0 + (int)threadIdx.x;
            lse_s[threadIdx.x] = q < T ? lse[hrow + q] : 0.0f;
            D_s[threadIdx.x] = q < T ? Dg[hrow + q] : 0.0f;
        }
        __syncthreads();
        /* on the diagonal, query blocks before the warp's keys are all masked */
        int nq0 = qt == kt ? w : 0;
        fl_mm_abt(Sw, FL_LDS, Ks + w * 16 * lde, lde, Qs, lde, nq0, FL_BQ / 16, k16);
        fl_mm_abt(dPw, FL_LDS, Vs + w * 16 * lde, lde, dOs, lde, nq0, FL_BQ / 16, k16);
        __syncwarp();
        for (int r = 0; r < 16; r++) {
            int key = k0 + w * 16 + r;
            for (int e = 0; e < 2; e++) {
                int c = lane + 32 * e, q = q0 + c;
                float p = 0.0f;
                if (q < T && key <= q)
                    p = expf(Sw[r * FL_LDS + c] * scale - lse_s[c]);
                Sw[r * FL_LDS + c] = p;
                fl_put(Pw + r * FL_LDP + c, p);
            }
        }
        __syncwarp();
        fl_mm_acc(dVw, ldo, Pw, FL_LDP, dOs, lde, k16, nq0, FL_BQ / 16);
        __syncwarp(); /* p's 16-bit copy is read; dS replaces it */
        for (int r = 0; r < 16; r++) {
            int key = k0 + w * 16 + r;
            for (int e = 0; e < 2; e++) {
                int c = lane + 32 * e, q = q0 + c;
                float ds = 0.0f;
                if (q < T && key <= q)
                    ds = Sw[r * FL_LDS + c] * (dPw[r * FL_LDS + c] - D_s[c]) * scale;
                fl_put(Pw + r * FL_LDP + c, ds);
            }
        }
        __syncwarp();
        fl_mm_acc(dKw, ldo, Pw, FL_LDP, Qs, lde, k16, nq0, FL_BQ / 16);
    }
    __syncwarp();
    for (int r = 0; r < 16; r++) {
        int key = k0 + w * 16 + r;
        if (key >= T)
            break;
        float *g = dqkv + ((size_t)b * T + key) * ld + (size_t)h * hs;
        for (int c = lane; c < hs; c += 32) {
            g[C + c] = dKw[r * ldo + c];
            g[2 * C + c] = dVw[r * ldo + c];
        }
    }
}

/* dQ: grid (query tiles, NH, B), the longest rows first. */
template <typename E>
__global__ void __launch_bounds__(FL_THREADS)
    k_flash_bwd_dq(float *__restrict__ dqkv, const float *__restrict__ dout,
                   const float *__restrict__ qkv, const float *__restrict__ lse,
                   const float *__restrict__ Dg, int T, int C, int NH, float scale)
{
    extern __shared__ float4 zs_flash_smem[];
    int qt = (int)(gridDim.x - 1 - blockIdx.x), h = (int)blockIdx.y, b = (int)blockIdx.z;
    int hs = C / NH, lde = hs + 8, ldo = hs + 4, k16 = hs / 16;
    int w = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, q0 = qt * FL_BQ;
    fl_carve cv = {fl_base(zs_flash_smem)};
    E *Qs = cv.take<E>((size_t)64 * lde), *dOs = cv.take<E>((size_t)64 * lde),
      *Ks = cv.take<E>((size_t)64 * lde), *Vs = cv.take<E>((size_t)64 * lde);
    float *Ss = cv.take<float>(64 * FL_LDS), *dPs = cv.take<float>(64 * FL_LDS);
    E *Ps = cv.take<E>(64 * FL_LDP);
    float *dQs = cv.take<float>((size_t)64 * ldo);
    float *lse_s = cv.take<float>(64), *D_s = cv.take<float>(64);
    size_t ld = (size_t)3 * C, hrow = ((size_t)b * NH + h) * T;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
    fl_load_tile(Qs, lde, base, ld, q0, T, hs);
    fl_load_tile(dOs, lde, dout + (size_t)b * T * C + (size_t)h * hs, (size_t)C, q0, T, hs);
    fl_zero_rows(dQs, ldo, hs);
    if (threadIdx.x < 64) {
        int q = q0 + (int)threadIdx.x;
        lse_s[threadIdx.x] = q < T ? lse[hrow + q] : 0.0f;
        D_s[threadIdx.x] = q < T ? Dg[hrow + q] : 0.0f;
    }
    float *Sw = Ss + w * 16 * FL_LDS, *dPw = dPs + w * 16 * FL_LDS, *dQw = dQs + w * 16 * ldo;
    E *Pw = Ps + w * 16 * FL_LDP;
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * FL_BK;
        __syncthreads(); /* the previous tile's K / V reads are done */
        fl_load_tile(Ks, lde, base + C, ld, k0, T, hs);
        fl_load_tile(Vs, lde, base + 2 * C, ld, k0, T, hs);
        __syncthreads();
        int nkb = kt == qt ? w + 1 : FL_BK / 16;
        fl_mm_abt(Sw, FL_LDS, Qs + w * 16 * lde, lde, Ks, lde, 0, nkb, k16);
        fl_mm_abt(dPw, FL_LDS, dOs + w * 16 * lde, lde, Vs, lde, 0, nkb, k16);
        __syncwarp();
        for (int r = 0; r < 16; r++) {
            int row = w * 16 + r, q = q0 + row;
            for (int e = 0; e < 2; e++) {
                int c = lane + 32 * e;
                float ds = 0.0f;
                if (q < T && k0 + c <= q) {
                    float p = expf(Sw[r * FL_LDS + c] * scale - lse_s[row]);
                    ds = p * (dPw[r * FL_LDS + c] - D_s[row]) * scale;
                }
                fl_put(Pw + r * FL_LDP + c, ds);
            }
        }
        __syncwarp();
        fl_mm_acc(dQw, ldo, Pw, FL_LDP, Ks, lde, k16, 0, nkb);
    }
    __syncwarp();
    for (int r = 0; r < 16; r++) {
        int q = q0 + w * 16 + r;
        if (q >= T)
            break;
        float *g = dqkv + ((size_t)b * T + q) * ld + (size_t)h * hs;
        for (int c = lane; c < hs; c += 32)
            g[c] = dQw[r * ldo + c];
    }
}

/* Shape, dtype and alignment checks shared by both launchers; *dt the
 * operand dtype. */
static int flash_args(const char *fn, const zs_mixed_t *mx, int B, int T, int C, int NH,
                      const void *const *ptrs, int np, int *dt, zs_err_t *err)
{
    if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: bad shape B=%d T=%d C=%d NH=%d", fn, B, T, C,
                          NH);
    int hs = C / NH;
    if (hs % 16 != 0 || hs > FL_HS_MAX)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "%s: head size %d not supported (a multiple of 16 up to %d); use the "
                          "unfused attention",
                          fn, hs, FL_HS_MAX);
    if (!zs_mixed_on(mx))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "%s: needs bf16 or fp16 operands (tensor cores); use the unfused "
                          "attention for fp32",
                          fn);
    if ((long long)B * NH * T > INT32_MAX || (long long)T * 3 * C > INT32_MAX || NH > 65535 ||
        B > 65535)
        return zs_err_set(err, ZS_ERR_RANGE, "%s: shape too large B=%d T=%d C=%d NH=%d", fn, B, T,
                          C, NH);
    for (int i = 0; i < np; i++) {
        if (!ptrs[i])
            return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL buffer", fn);
        if ((uintptr_t)ptrs[i] % 16 != 0)
            return zs_err_set(err, ZS_ERR_INVALID, "%s: buffer %d not 16-byte aligned", fn, i);
    }
    *dt = mx->dt;
    return ZS_OK;
}

typedef void (*fl_fwd_fn)(float *, float *, const float *, int, int, int, float);
typedef void (*fl_bwd_fn)(float *, const float *, const float *, const float *, const float *, int,
                          int, int, float);

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_attention_flash_fwd(void *stream, const zs_mixed_t *mx, float *out,
                                           float *lse, const float *qkv, int B, int T, int C,
                                           int NH, zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    const void *ptrs[] = {out, lse, qkv};
    int dt, rc = flash_args("zs_cuda_attention_flash_fwd", mx, B, T, C, NH, ptrs, 3, &dt, err);
    if (rc != ZS_OK || B == 0 || T == 0)
        return rc;
    int hs = C / NH;
    size_t smem = fl_smem_bytes(hs, 3, 1, 1, 3);
    fl_fwd_fn k = dt == ZS_DTYPE_BF16 ? k_flash_fwd<__nv_bfloat16> : k_flash_fwd<__half>;
    ZS_CUDA_TRY(cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem),
                "zs_cuda_attention_flash_fwd: cudaFuncSetAttribute");
    dim3 grid((unsigned)((T + FL_BQ - 1) / FL_BQ), (unsigned)NH, (unsigned)B);
    ZS_CUDA_LAUNCH(k, grid, FL_THREADS, smem, cs, out, lse, qkv, T, C, NH, 1.0f / sqrtf((float)hs));
    ZS_CUDA_LAUNCHED("k_flash_fwd");
    return ZS_OK;
}

/* See zs_cuda_gpt.h. */
extern "C" int zs_cuda_attention_flash_bwd(void *stream, const zs_mixed_t *mx, float *dqkv,
                                           const float *dout, const float *qkv, const float *out,
                                           const float *lse, int B, int T, int C, int NH,
                                           zs_err_t *err)
{
    cudaStream_t cs = (cudaStream_t)stream;
    const void *ptrs[] = {dqkv, dout, qkv, out, lse};
    int dt, rc = flash_args("zs_cuda_attention_flash_bwd", mx, B, T, C, NH, ptrs, 5, &dt, err);
    if (rc != ZS_OK || B == 0 || T == 0)
        return rc;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)B * NH * T;
    size_t smem_kv = fl_smem_bytes(hs, 4, 2, 2, 2), smem_q = fl_smem_bytes(hs, 4, 2, 1, 2);
    fl_bwd_fn kkv = dt == ZS_DTYPE_BF16 ? k_flash_bwd_dkv<__nv_bfloat16> : k_flash_bwd_dkv<__half>;
    fl_bwd_fn kq = dt == ZS_DTYPE_BF16 ? k_flash_bwd_dq<__nv_bfloat16> : k_flash_bwd_dq<__half>;
    ZS_CUDA_TRY(cudaFuncSetAttribute((const void *)kkv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem_kv),
                "zs_cuda_attention_flash_bwd: cudaFuncSetAttribute");
    ZS_CUDA_TRY(cudaFuncSetAttribute((const void *)kq, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem_q),
                "zs_cuda_attention_flash_bwd: cudaFuncSetAttribute");
    float *D = NULL;
    ZS_CUDA_TRY(cudaMallocAsync((void **)&D, rows * sizeof(float), cs),
                "zs_cuda_attention_flash_bwd: cudaMallocAsync");
    unsigned nt = (unsigned)((T + FL_BQ - 1) / FL_BQ);
    dim3 grid(nt, (unsigned)NH, (unsigned)B);
    ZS_CUDA_LAUNCH(k_flash_bwd_dot, (unsigned)((rows + FL_DOT_WARPS - 1) / FL_DOT_WARPS),
                   FL_DOT_WARPS * 32, 0, cs, D, dout, out, T, C, NH, rows);
    cudaError_t e = cudaGetLastError();
    const char *what = "launch of k_flash_bwd_dot";
    if (e == cudaSuccess) {
        ZS_CUDA_LAUNCH(kkv, grid, FL_THREADS, smem_kv, cs, dqkv, dout, qkv, lse, D, T, C, NH,
                       scale);
        e = cudaGetLastError();
        what = "launch of k_flash_bwd_dkv";
    }
    if (e == cudaSuccess) {
        ZS_CUDA_LAUNCH(kq, grid, FL_THREADS, smem_q, cs, dqkv, dout, qkv, lse, D, T, C, NH, scale);
        e = cudaGetLastError();
        what = "launch of k_flash_bwd_dq";
    }
    cudaError_t ef = cudaFreeAsync(D, cs);
    if (e != cudaSuccess)
        return zs__cuda_fail(err, e, what, __FILE__, __LINE__);
    if (ef != cudaSuccess)
        return zs__cuda_fail(err, ef, "zs_cuda_attention_flash_bwd: cudaFreeAsync", __FILE__,
                             __LINE__);
    return ZS_OK;
}
