/*
 * test_emu_wmma.cu - tests of the CUDA emulator's warp matrix functions
 * (nvcuda::wmma, tests/cuda_emu/emu_wmma.h and emu_wmma.cpp), compiled by
 * g++ through zs_emu_cu_sources. The kernels follow the Programming
 * Guide's example (Warp Matrix Functions, Example), not our kernels:
 *  - one 16x16x16 mma for __half and __nv_bfloat16 inputs, every
 *    row/col-major A and B, C loaded and D stored row- and col-major,
 *    against a double reference: exact small integers (relative error
 *    < 1e-6) and random values (an error bound, see check_random);
 *  - a __half accumulator; the m32n8k16 and m8n32k16 shapes; the Guide's
 *    example kernel;
 *  - a 64x64x64 GEMM tiled through shared memory, one warp per 16x16 tile;
 *  - uniform element-wise work on x[] (works under any mapping);
 *  - a layout-dependent kernel that must differ under two mapping seeds;
 *  - fragments read before being written hold NaN;
 *  - deaths: a lane exiting before the call, lanes at different calls, a
 *    lane at a __syncwarp instead, different pointers, a misaligned
 *    pointer, a bad ldm, different fill values, a type not emulated.
 * Cases that must die, or need another seed, run in child processes.
 */
#include <mma.h> /* NVIDIA's: empty under g++; emu_shim.h has nvcuda::wmma */

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "emu_test.h"

using namespace nvcuda;

#ifndef ZS_CUDA_LAUNCH /* what our code does; the shim defined it already */
#define ZS_CUDA_LAUNCH(k, g, b, sh, st, ...) k<<<g, b, sh, st>>>(__VA_ARGS__)
#endif

/* ---- Host helpers ---- */
template <class T> static T to_t(float v);
template <> __half to_t<__half>(float v)
{
    return __float2half_rn(v);
}
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> float to_t<float>(float v)
{
    return v;
}
static float to_f(__half v)
{
    return __half2float(v);
}
static float to_f(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
static float to_f(float v)
{
    return v;
}

template <class T> static T *dev_copy(const std::vector<T> &h)
{
    T *d;
    EMU_CUDA(cudaMalloc(&d, h.size() * sizeof(T)));
    EMU_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T> static std::vector<T> host_copy(const T *d, size_t n)
{
    std::vector<T> h(n);
    EMU_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

static uint64_t g_rng = 12345;
static float urand(void) /* [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* ---- One mma of any shape: D = A * B + C, as in the Guide's example.
 * A is M x K, B is K x N, both with the leading dimension of their layout;
 * C and D are M x N with ldm N (row) or M (col). ---- */
template <int M, int N, int K, class TI, class TC, class TD, class LA, class LB>
__global__ void k_mma(const TI *a, const TI *b, const TC *c, TD *d, wmma::layout_t lc,
                      wmma::layout_t ld)
{
    wmma::fragment<wmma::matrix_a, M, N, K, TI, LA> fa;
    wmma::fragment<wmma::matrix_b, M, N, K, TI, LB> fb;
    wmma::fragment<wmma::accumulator, M, N, K, TC> fc;
    wmma::fragment<wmma::accumulator, M, N, K, TD> fd;
    const bool ra = std::is_same<LA, wmma::row_major>::value;
    const bool rb = std::is_same<LB, wmma::row_major>::value;
    wmma::load_matrix_sync(fa, a, ra ? K : M);
    wmma::load_matrix_sync(fb, b, rb ? N : K);
    wmma::load_matrix_sync(fc, c, lc == wmma::mem_row_major ? N : M, lc);
    wmma::mma_sync(fd, fa, fb, fc);
    wmma::store_matrix_sync(d, fd, ld == wmma::mem_row_major ? N : M, ld);
}

/* Element (r, q) of an R x C matrix stored with layout row (or col). */
static size_t at(int r, int q, int R, int C, bool row)
{
    return row ? (size_t)r * C + q : (size_t)q * R + r;
}

/* Run one case; exact: small-integer inputs whose sums are exact in the
 * accumulator type (the result must equal the reference); else random in
 * [-1, 1) with the error bound of check below. */
template <int M, int N, int K, class TI, class TC, class TD, class LA, class LB>
static void run_mma(const char *name, bool exact, wmma::layout_t lc, wmma::layout_t ld)
{
    const bool ra = std::is_same<LA, wmma::row_major>::value;
    const bool rb = std::is_same<LB, wmma::row_major>::value;
    const bool rc = lc == wmma::mem_row_major, rd = ld == wmma::mem_row_major;
    std::vector<TI> ha(M * K), hb(K * N);
    std::vector<TC> hc(M * N);
    std::vector<double> A(M * K), B(K * N), Cd(M * N);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            float v = exact ? (float)((i * 3 + k * 5) % 7 - 3) : urand();
            TI t = to_t<TI>(v);
            ha[at(i, k, M, K, ra)] = t;
            A[i * K + k] = to_f(t);
        }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) {
            float v = exact ? (float)((k * 7 + j * 2) % 9 - 4) : urand();
            TI t = to_t<TI>(v);
            hb[at(k, j, K, N, rb)] = t;
            B[k * N + j] = to_f(t);
        }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float v = exact ? (float)((i + 2 * j) % 11 - 5) : urand();
            TC t = to_t<TC>(v);
            hc[at(i, j, M, N, rc)] = t;
            Cd[i * N + j] = to_f(t);
        }
    TI *da = dev_copy(ha), *db = dev_copy(hb);
    TC *dc = dev_copy(hc);
    TD *dd;
    EMU_CUDA(cudaMalloc(&dd, M * N * sizeof(TD)));
    ZS_CUDA_LAUNCH((k_mma<M, N, K, TI, TC, TD, LA, LB>), 1, 32, 0, 0, da, db, dc, dd, lc, ld);
    EMU_CUDA(cudaGetLastError());
    std::vector<TD> hd = host_copy(dd, M * N);
    /* Error bound for random inputs: the products are exact (11- or 8-bit
     * significands), and summing C and K products in any order with
     * rounding to unit roundoff u at each step errs by at most
     * gamma_{K+1} * (|C| + sum |a b|), gamma_n = n u / (1 - n u) (Higham,
     * Accuracy and Stability of Numerical Algorithms, 3.1). u = 2^-24 for
     * float, 2^-11 for a __half accumulator; plus the final rounding of D. */
    const double u = std::is_same<TD, __half>::value ? 1.0 / 2048 : 1.0 / 16777216;
    double gam = (K + 2) * u / (1 - (K + 2) * u);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = Cd[i * N + j], mag = std::fabs(ref);
            for (int k = 0; k < K; k++) {
                ref += A[i * K + k] * B[k * N + j];
                mag += std::fabs(A[i * K + k] * B[k * N + j]);
            }
            double got = to_f(hd[at(i, j, M, N, rd)]);
            if (exact)
                EMU_CHECK(got == ref || std::fabs(got - ref) <= 1e-6 * std::fabs(ref),
                          "%s: D[%d][%d] = %.9g, want %.9g", name, i, j, got, ref);
            else
                EMU_CHECK(std::fabs(got - ref) <= gam * mag,
                          "%s: D[%d][%d] = %.9g, want %.9g (bound %.3g)", name, i, j, got, ref,
                          gam * mag);
        }
    EMU_CUDA(cudaFree(da));
    EMU_CUDA(cudaFree(db));
    EMU_CUDA(cudaFree(dc));
    EMU_CUDA(cudaFree(dd));
}

template <class TI, class LA, class LB> static void run_layouts(const char *tname)
{
    const wmma::layout_t R = wmma::mem_row_major, C = wmma::mem_col_major;
    const wmma::layout_t pairs[4][2] = {{R, R}, {R, C}, {C, R}, {C, C}};
    char name[128];
    for (auto &p : pairs)
        for (int exact = 1; exact >= 0; exact--) {
            snprintf(name, sizeof name, "%s A %s B %s C %s D %s %s", tname,
                     std::is_same<LA, wmma::row_major>::value ? "row" : "col",
                     std::is_same<LB, wmma::row_major>::value ? "row" : "col",
                     p[0] == R ? "row" : "col", p[1] == R ? "row" : "col",
                     exact ? "exact" : "random");
            run_mma<16, 16, 16, TI, float, float, LA, LB>(name, exact, p[0], p[1]);
        }
}

static void test_mma(void)
{
    printf("m16n16k16, __half and __nv_bfloat16, A/B row/col, C/D row/col, float "
           "accumulators: exact integers and random values against a double reference\n");
    run_layouts<__half, wmma::row_major, wmma::row_major>("half");
    run_layouts<__half, wmma::row_major, wmma::col_major>("half");
    run_layouts<__half, wmma::col_major, wmma::row_major>("half");
    run_layouts<__half, wmma::col_major, wmma::col_major>("half");
    run_layouts<__nv_bfloat16, wmma::row_major, wmma::row_major>("bf16");
    run_layouts<__nv_bfloat16, wmma::row_major, wmma::col_major>("bf16");
    run_layouts<__nv_bfloat16, wmma::col_major, wmma::row_major>("bf16");
    run_layouts<__nv_bfloat16, wmma::col_major, wmma::col_major>("bf16");
    printf("__half accumulators (C and D __half, C float / D __half, C __half / D float)\n");
    const wmma::layout_t R = wmma::mem_row_major, C = wmma::mem_col_major;
    run_mma<16, 16, 16, __half, __half, __half, wmma::row_major, wmma::col_major>("hhh exact", true,
                                                                                  R, C);
    run_mma<16, 16, 16, __half, __half, __half, wmma::row_major, wmma::col_major>("hhh random",
                                                                                  false, C, R);
    run_mma<16, 16, 16, __half, float, __half, wmma::col_major, wmma::row_major>("hfh random",
                                                                                 false, R, R);
    run_mma<16, 16, 16, __half, __half, float, wmma::col_major, wmma::col_major>("hhf exact", true,
                                                                                 C, C);
    printf("m32n8k16 and m8n32k16 (bf16 and half)\n");
    run_mma<32, 8, 16, __nv_bfloat16, float, float, wmma::row_major, wmma::col_major>(
        "m32n8k16 bf16", false, R, C);
    run_mma<32, 8, 16, __half, float, float, wmma::col_major, wmma::row_major>("m32n8k16 half",
                                                                               true, C, R);
    run_mma<8, 32, 16, __nv_bfloat16, float, float, wmma::col_major, wmma::row_major>(
        "m8n32k16 bf16", true, R, R);
    run_mma<8, 32, 16, __half, float, float, wmma::row_major, wmma::row_major>("m8n32k16 half",
                                                                               false, C, C);
}

/* ---- The Guide's example (Warp Matrix Functions, Example): A col-major,
 * B row-major, C = A * B from a zero-filled float accumulator; here also a
 * __half accumulator filled from a float literal, as code writes it. ---- */
__global__ void k_example(half *a, half *b, float *c, half *ch)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::col_major> a_frag;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> b_frag;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c_frag;
    wmma::fragment<wmma::accumulator, 16, 16, 16, half> h_frag;
    wmma::fill_fragment(c_frag, 0.0f);
    wmma::fill_fragment(h_frag, 0.0f);
    wmma::load_matrix_sync(a_frag, a, 16);
    wmma::load_matrix_sync(b_frag, b, 16);
    wmma::mma_sync(c_frag, a_frag, b_frag, c_frag);
    wmma::mma_sync(h_frag, a_frag, b_frag, h_frag);
    wmma::store_matrix_sync(c, c_frag, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(ch, h_frag, 16, wmma::mem_row_major);
}

static void test_example(void)
{
    printf("the Programming Guide's example kernel (float and __half accumulators)\n");
    std::vector<half> ha(256), hb(256);
    for (int i = 0; i < 256; i++) {
        ha[i] = to_t<__half>((float)(i % 9 - 4)); /* col-major: A[i % 16][i / 16] */
        hb[i] = to_t<__half>((float)(i % 5 - 2)); /* row-major: B[i / 16][i % 16] */
    }
    half *da = dev_copy(ha), *db = dev_copy(hb), *dh;
    float *dc;
    EMU_CUDA(cudaMalloc(&dc, 256 * sizeof(float)));
    EMU_CUDA(cudaMalloc(&dh, 256 * sizeof(half)));
    ZS_CUDA_LAUNCH(k_example, 1, 32, 0, 0, da, db, dc, dh);
    std::vector<float> hc = host_copy(dc, 256);
    std::vector<half> hh = host_copy(dh, 256);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double ref = 0;
            for (int k = 0; k < 16; k++)
                ref += (double)to_f(ha[k * 16 + i]) * to_f(hb[k * 16 + j]);
            EMU_CHECK(hc[i * 16 + j] == ref && to_f(hh[i * 16 + j]) == ref,
                      "C[%d][%d] = %g / %g want %g", i, j, hc[i * 16 + j], to_f(hh[i * 16 + j]),
                      ref);
        }
    EMU_CUDA(cudaFree(da));
    EMU_CUDA(cudaFree(db));
    EMU_CUDA(cudaFree(dc));
    EMU_CUDA(cudaFree(dh));
}

/* ---- 64x64x64 GEMM, C = A * B, A row-major, B col-major (bf16), tiles
 * through shared memory: a block of 4 warps computes a 32x32 block of C,
 * warp w the 16x16 tile (w / 2, w % 2). ---- */
#define G 64
__global__ void k_gemm(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *c)
{
    __shared__ __align__(32) __nv_bfloat16 sa[32 * 16]; /* 32 rows x 16 k, row-major */
    __shared__ __align__(32) __nv_bfloat16 sb[32 * 16]; /* 16 k x 32 cols, col-major */
    int t = threadIdx.x, w = t / 32;
    int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < G; k0 += 16) {
        for (int e = t; e < 32 * 16; e += blockDim.x) {
            int r = e / 16, k = e % 16;
            sa[e] = a[(size_t)(r0 + r) * G + k0 + k];
            sb[e] = b[(size_t)(c0 + r) * G + k0 + k]; /* column r of the block, row k */
        }
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, sa + (w / 2) * 16 * 16, 16);
        wmma::load_matrix_sync(fb, sb + (w % 2) * 16 * 16, 16);
        wmma::mma_sync(acc, fa, fb, acc);
        __syncthreads();
    }
    wmma::store_matrix_sync(c + (size_t)(r0 + (w / 2) * 16) * G + c0 + (w % 2) * 16, acc, G,
                            wmma::mem_row_major);
}

static void test_gemm(void)
{
    printf("64x64x64 GEMM, bf16, shared-memory tiles, 4 warps per block, k loop\n");
    std::vector<__nv_bfloat16> ha(G * G), hb(G * G);
    std::vector<double> A(G * G), B(G * G);
    for (int i = 0; i < G * G; i++) {
        ha[i] = to_t<__nv_bfloat16>(urand());
        hb[i] = to_t<__nv_bfloat16>(urand());
        A[i] = to_f(ha[i]); /* row-major: A[i][k] = A[i * G + k] */
        B[i] = to_f(hb[i]); /* col-major: B[k][j] = B[j * G + k] */
    }
    __nv_bfloat16 *da = dev_copy(ha), *db = dev_copy(hb);
    float *dc;
    EMU_CUDA(cudaMalloc(&dc, G * G * sizeof(float)));
    ZS_CUDA_LAUNCH(k_gemm, dim3(2, 2), 128, 0, 0, da, db, dc);
    EMU_CUDA(cudaGetLastError());
    std::vector<float> hc = host_copy(dc, G * G);
    /* Four fp32 mma steps of 16 products: at most 64 roundings in a row. */
    const double gam = 66.0 / 16777216 / (1 - 66.0 / 16777216);
    for (int i = 0; i < G; i++)
        for (int j = 0; j < G; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < G; k++) {
                ref += A[i * G + k] * B[j * G + k];
                mag += std::fabs(A[i * G + k] * B[j * G + k]);
            }
            EMU_CHECK(std::fabs(hc[i * G + j] - ref) <= gam * mag, "C[%d][%d] = %.9g want %.9g", i,
                      j, hc[i * G + j], ref);
        }
    EMU_CUDA(cudaFree(da));
    EMU_CUDA(cudaFree(db));
    EMU_CUDA(cudaFree(dc));
}

/* ---- Uniform element-wise work on x[] (Description: "In the special case
 * where all threads in the warp will apply an element-wise operation
 * uniformly to all fragment elements, direct element access can be
 * implemented using ... num_elements ... x[num_elements]"). A (__half,
 * two copies of each element) is doubled, the product halved and 1
 * added: D = A * B + 1. ---- */
__global__ void k_elementwise(const __half *a, const __half *b, float *d)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    for (int i = 0; i < fa.num_elements; i++)
        fa.x[i] = __float2half_rn(2.0f * __half2float(fa.x[i]));
    wmma::fill_fragment(acc, 0.0f);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int i = 0; i < acc.num_elements; i++)
        acc.x[i] = acc.x[i] * 0.5f + 1.0f;
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

static void test_elementwise(void)
{
    printf("uniform element-wise work over x[] (scale A, scale and shift the accumulator)\n");
    std::vector<__half> ha(256), hb(256);
    for (int i = 0; i < 256; i++) {
        ha[i] = to_t<__half>((float)(i % 5 - 2));
        hb[i] = to_t<__half>((float)(i % 7 - 3));
    }
    __half *da = dev_copy(ha), *db = dev_copy(hb);
    float *dd;
    EMU_CUDA(cudaMalloc(&dd, 256 * sizeof(float)));
    ZS_CUDA_LAUNCH(k_elementwise, 1, 32, 0, 0, da, db, dd);
    std::vector<float> hd = host_copy(dd, 256);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double ref = 1;
            for (int k = 0; k < 16; k++)
                ref += (double)to_f(ha[i * 16 + k]) * to_f(hb[k * 16 + j]);
            EMU_CHECK(hd[i * 16 + j] == ref, "D[%d][%d] = %g want %g", i, j, hd[i * 16 + j], ref);
        }
    EMU_CUDA(cudaFree(da));
    EMU_CUDA(cudaFree(db));
    EMU_CUDA(cudaFree(dd));
}

/* ---- Layout-dependent code: each lane writes out its x[] of a loaded A
 * (element values 0..255). Wrong code on a GPU; here its output must
 * depend on the mapping seed. ---- */
__global__ void k_dump(const __half *a, float *out)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a, 16);
    int lane = threadIdx.x % 32;
    for (int i = 0; i < fa.num_elements; i++)
        out[lane * fa.num_elements + i] = __half2float(fa.x[i]);
}

static int child_dump(void)
{
    std::vector<__half> ha(256);
    for (int i = 0; i < 256; i++)
        ha[i] = to_t<__half>((float)i);
    __half *da = dev_copy(ha);
    float *dout;
    EMU_CUDA(cudaMalloc(&dout, 512 * sizeof(float)));
    ZS_CUDA_LAUNCH(k_dump, 1, 32, 0, 0, da, dout);
    std::vector<float> h = host_copy(dout, 512);
    /* Every element is held by exactly two slots. */
    int seen[256] = {0};
    for (float v : h) {
        EMU_CHECK(v >= 0 && v < 256 && v == (int)v, "slot value %g", v);
        seen[(int)v]++;
    }
    for (int i = 0; i < 256; i++)
        EMU_CHECK(seen[i] == 2, "element %d held by %d slots", i, seen[i]);
    printf("map");
    for (float v : h)
        printf(" %d", (int)v);
    printf("\n");
    return 0;
}

static std::string run_dump(const char *seed)
{
    const char *env[] = {seed, NULL};
    emu_child c;
    emu_run_child(&c, "dump", env);
    EMU_CHECK(c.exited && c.code == 0 && emu_has(&c, "map "), "%s: %s", seed, c.out);
    return std::string(strstr(c.out, "map "));
}

static void test_mapping(void)
{
    printf("the element mapping: a layout-dependent kernel differs under ZS_EMU_WMMA_SEED=1 "
           "and 2, and repeats under the same seed\n");
    std::string s1 = run_dump("ZS_EMU_WMMA_SEED=1"), s2 = run_dump("ZS_EMU_WMMA_SEED=2"),
                s1b = run_dump("ZS_EMU_WMMA_SEED=1");
    EMU_CHECK(s1 != s2, "the same mapping under two seeds: %s", s1.c_str());
    EMU_CHECK(s1 == s1b, "seed 1 gave two mappings");
}

/* ---- Fragments read before being written ---- */
__global__ void k_unwritten(const __half *a, float *d, float *d2)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c, never;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, a, 16);
    wmma::mma_sync(c, fa, fb, c); /* c never written */
    wmma::store_matrix_sync(d, c, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(d2, never, 16, wmma::mem_col_major);
}

static void test_poison(void)
{
    printf("fragments read before being written hold NaN\n");
    std::vector<__half> ha(256, to_t<__half>(1.0f));
    __half *da = dev_copy(ha);
    float *dd, *dd2;
    EMU_CUDA(cudaMalloc(&dd, 256 * sizeof(float)));
    EMU_CUDA(cudaMalloc(&dd2, 256 * sizeof(float)));
    ZS_CUDA_LAUNCH(k_unwritten, 1, 32, 0, 0, da, dd, dd2);
    std::vector<float> h = host_copy(dd, 256), h2 = host_copy(dd2, 256);
    for (int i = 0; i < 256; i++)
        EMU_CHECK(std::isnan(h[i]) && std::isnan(h2[i]), "element %d: %g %g", i, h[i], h2[i]);
    EMU_CUDA(cudaFree(da));
    EMU_CUDA(cudaFree(dd));
    EMU_CUDA(cudaFree(dd2));
}

/* ---- Deaths ---- */
static const int l_exit = __LINE__ + 6;
__global__ void k_exit(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    if (threadIdx.x % 32 == 5)
        return;
    wmma::load_matrix_sync(fa, a, 16);
}

static const int l_two = __LINE__ + 5; /* and + 7 */
__global__ void k_two_lines(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    if (threadIdx.x % 32 < 16)
        wmma::load_matrix_sync(fa, a, 16);
    else
        wmma::load_matrix_sync(fa, a, 16);
}

static const int l_sw = __LINE__ + 7;
__global__ void k_syncwarp(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    if (threadIdx.x % 32 == 3)
        __syncwarp();
    else
        wmma::load_matrix_sync(fa, a, 16);
}

static const int l_ptr = __LINE__ + 4;
__global__ void k_two_ptrs(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + (threadIdx.x % 32 / 16) * 256, 16);
}

static const int l_align = __LINE__ + 4;
__global__ void k_misaligned(const __half *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + 8, 16); /* 16 bytes in */
}

static const int l_ldm = __LINE__ + 5;
__global__ void k_bad_ldm(float *d)
{
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 1.0f);
    wmma::store_matrix_sync(d, acc, 18, wmma::mem_row_major); /* 72 bytes */
}

static const int l_fill = __LINE__ + 4;
__global__ void k_fill_differs(float *d)
{
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, (float)(threadIdx.x % 2));
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

static const int l_int8 = __LINE__ + 4;
__global__ void k_int8(const signed char *a)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a, 16);
}

static int child_death(const char *n)
{
    __half *a;
    EMU_CUDA(cudaMalloc(&a, 4096 * sizeof(__half)));
    if (!strcmp(n, "exit"))
        ZS_CUDA_LAUNCH(k_exit, 1, 64, 0, 0, a);
    else if (!strcmp(n, "two_lines"))
        ZS_CUDA_LAUNCH(k_two_lines, 1, 32, 0, 0, a);
    else if (!strcmp(n, "syncwarp"))
        ZS_CUDA_LAUNCH(k_syncwarp, 1, 32, 0, 0, a);
    else if (!strcmp(n, "two_ptrs"))
        ZS_CUDA_LAUNCH(k_two_ptrs, 1, 32, 0, 0, a);
    else if (!strcmp(n, "misaligned"))
        ZS_CUDA_LAUNCH(k_misaligned, 1, 32, 0, 0, a);
    else if (!strcmp(n, "bad_ldm"))
        ZS_CUDA_LAUNCH(k_bad_ldm, 1, 32, 0, 0, (float *)a);
    else if (!strcmp(n, "fill_differs"))
        ZS_CUDA_LAUNCH(k_fill_differs, 1, 32, 0, 0, (float *)a);
    else if (!strcmp(n, "int8"))
        ZS_CUDA_LAUNCH(k_int8, 1, 32, 0, 0, (const signed char *)a);
    cudaDeviceSynchronize();
    return 0;
}

static void expect_death(const char *name, int line, const char *w1, const char *w2)
{
    char at[64];
    snprintf(at, sizeof at, "test_emu_wmma.cu:%d", line);
    emu_child c;
    emu_run_child(&c, name, NULL);
    EMU_CHECK(emu_died(&c) && emu_has(&c, "cuda-emu: kernel ") && emu_has(&c, at) &&
                  emu_has(&c, w1) && emu_has(&c, w2),
              "%s: want '%s' and '%s' at %s, got: %s", name, w1, w2, at, c.out);
}

static void test_deaths(void)
{
    printf("deaths, each naming the kernel and file:line\n");
    printf("  a lane exited before load_matrix_sync\n");
    expect_death("exit", l_exit, "nvcuda::wmma::load_matrix_sync", "lane 5 (thread 5) has exited");
    printf("  lanes at load_matrix_sync on two lines\n");
    /* The first lane to resume reports: lane 0 (line l_two) or 31 (l_two + 2). */
    char other[64];
    snprintf(other, sizeof other, "test_emu_wmma.cu:%d", l_two + 2);
    expect_death("two_lines", l_two, other, "is at nvcuda::wmma::load_matrix_sync at");
    printf("  a lane at __syncwarp instead\n");
    expect_death("syncwarp", l_sw, "lane 3 (thread 3) is not at this call", "__syncwarp");
    printf("  lanes passing different pointers\n");
    expect_death("two_ptrs", l_ptr, "passes mptr", "must be the same in all lanes");
    printf("  a pointer not 256-bit aligned\n");
    expect_death("misaligned", l_align, "nvcuda::wmma::load_matrix_sync", "32-byte) aligned");
    printf("  ldm not a multiple of 16 bytes\n");
    expect_death("bad_ldm", l_ldm, "nvcuda::wmma::store_matrix_sync",
                 "ldm 18 is not a multiple of 4 for float");
    printf("  fill_fragment with a different value per lane\n");
    expect_death("fill_differs", l_fill, "nvcuda::wmma::fill_fragment", "different value");
    printf("  an integer fragment (not emulated)\n");
    expect_death("int8", l_int8, "fragment<matrix_a, 16, 16, 16, signed char, row_major>",
                 "not emulated");
}

int main(int argc, char **argv)
{
    emu_self = argv[0];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 3 && !strcmp(argv[1], "child")) {
        if (!strcmp(argv[2], "dump"))
            return child_dump();
        return child_death(argv[2]);
    }
    test_mma();
    test_example();
    test_gemm();
    test_elementwise();
    test_mapping();
    test_poison();
    test_deaths();
    printf("test_emu_wmma: all passed\n");
    return 0;
}
