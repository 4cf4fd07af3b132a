/*
 * test_gemm_split.c - zs_op_gemm gives bitwise the same result for every
 * thread count, whatever order the BLAS sums in.
 *
 * This binary brings its own cblas_sgemm, which the linker prefers to
 * OpenBLAS's for every call from zs_op_gemm: a correct GEMM whose order of
 * additions depends on the shape of the call (each dot product starts at
 * term (3 M + 5 N) mod K and wraps around), the most hostile reading of a
 * BLAS, which promises nothing about that order. OpenBLAS's SKYLAKEX
 * small-matrix kernels are a real case of it. Checks:
 *   1. the hostile GEMM is a GEMM (against a double-precision reference,
 *      all four transposes, alpha and beta);
 *   2. it is hostile: a sub-product of another shape sums in another
 *      order, so splitting one product two ways gives other bits;
 *   3. zs_op_gemm on 1, 2, 3 and 5 threads (and without a pool) is bitwise
 *      the same on shapes split by rows and by columns, large and small.
 * Part 3 fails if zs_op_gemm's blocks follow the thread count.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_ops.h"
#include "zs_pool.h"
#include "zs_test.h"

static int order_varies = 1; /* 0: the usual k = 0..K-1 order (part 2's control) */

/* Row-major GEMM only (all zs_op_gemm issues); op(A)[i, k], op(B)[k, j]. */
void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                 const enum CBLAS_TRANSPOSE tb, const blasint M, const blasint N, const blasint K,
                 const float alpha, const float *A, const blasint lda, const float *B,
                 const blasint ldb, const float beta, float *C, const blasint ldc)
{
    if (order != CblasRowMajor) {
        fprintf(stderr, "test_gemm_split: column-major GEMM not expected\n");
        exit(1);
    }
    int k0 = order_varies && K > 0 ? (int)((3 * (int64_t)M + 5 * (int64_t)N) % K) : 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int t = 0; t < K; t++) {
                int k = (k0 + t) % K;
                float a = ta == CblasTrans ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb == CblasTrans ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                acc += a * b;
            }
            float *c = &C[(size_t)i * ldc + j];
            *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
        }
}

static float *values(size_t n, uint64_t seed)
{
    float *v = malloc(n * 4);
    TEST_CHECK(v);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(seed >> 11) * 0x1p-53 - 0.5);
    }
    return v;
}

/* 1. the hostile GEMM against double precision */
static void test_is_gemm(void)
{
    const int M = 7, N = 9, K = 13;
    float *A = values(K * M, 1), *B = values(N * K, 2), *C0 = values(M * N, 3);
    float *C = malloc(M * N * 4);
    TEST_CHECK(C);
    for (int tr = 0; tr < 4; tr++) {
        int ta = tr & 1, tb = tr >> 1;
        int lda = ta ? M : K, ldb = tb ? K : N;
        memcpy(C, C0, M * N * 4);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C, N);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = 0;
                for (int k = 0; k < K; k++)
                    ref += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                           (tb ? B[j * ldb + k] : B[k * ldb + j]);
                ref = 0.5 * ref + 2.0 * C0[i * N + j];
                TEST_CHECKF(fabs(C[i * N + j] - ref) < 1e-5, "ta %d tb %d: C[%d,%d] %.9g vs %.9g",
                            ta, tb, i, j, C[i * N + j], ref);
            }
    }
    printf("  1. the shape-dependent GEMM is a GEMM (4 transposes, alpha, beta)\n");
    free(A), free(B), free(C0), free(C);
}

/* 2. a product of another shape sums in another order: C[64 x 80] whole
 * against its two halves of 40 columns */
static void test_is_hostile(void)
{
    const int M = 64, N = 80, K = 96;
    float *A = values(M * K, 4), *B = values(K * N, 5);
    float *C1 = malloc(M * N * 4), *C2 = malloc(M * N * 4);
    TEST_CHECK(C1 && C2);
    int differ[2];
    for (order_varies = 0; order_varies < 2; order_varies++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C1,
                    N);
        for (int h = 0; h < 2; h++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N / 2, K, 1.0f, A, K,
                        B + h * (N / 2), N, 0.0f, C2 + h * (N / 2), N);
        differ[order_varies] = memcmp(C1, C2, M * N * 4) != 0;
    }
    order_varies = 1;
    TEST_CHECKF(!differ[0] && differ[1], "halves vs whole: usual order %s, shape order %s",
                differ[0] ? "differs" : "same", differ[1] ? "differs" : "same");
    printf("  2. it is hostile: halves of a product give other bits than the whole\n");
    free(A), free(B), free(C1), free(C2);
}

/* 3. zs_op_gemm: every thread count, the same bits */
static void test_threads(void)
{
    static const struct {
        int ta, tb, M, N, K;
    } shapes[] = {
        {0, 0, 256, 48, 64},   /* split by rows (M > N) */
        {0, 1, 40, 1000, 72},  /* split by columns, transposed B (the head) */
        {1, 0, 72, 330, 128},  /* transposed A, a ragged last block */
        {0, 0, 2050, 33, 16},  /* many rows, few columns */
        {0, 0, 8, 8, 8},       /* small: one call */
    };
    int threads[] = {0, 1, 2, 3, 5};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int ta = shapes[s].ta, tb = shapes[s].tb, M = shapes[s].M, N = shapes[s].N,
            K = shapes[s].K;
        int lda = ta ? M : K, ldb = tb ? K : N;
        float *A = values((size_t)M * K, 10 + s), *B = values((size_t)K * N, 20 + s);
        float *C0 = values((size_t)M * N, 30 + s), *ref = malloc((size_t)M * N * 4),
              *C = malloc((size_t)M * N * 4);
        TEST_CHECK(ref && C);
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            zs_pool_t *pool = threads[t] ? zs_pool_create(threads[t]) : NULL;
            TEST_CHECK(!threads[t] || pool);
            float *out = t ? C : ref;
            memcpy(out, C0, (size_t)M * N * 4);
            zs_op_gemm(pool, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, out, N);
            if (t)
                TEST_CHECKF(memcmp(ref, C, (size_t)M * N * 4) == 0,
                            "%dx%dx%d (ta %d tb %d): %d threads differ from no pool", M, N, K, ta,
                            tb, threads[t]);
            if (pool)
                zs_pool_destroy(pool);
        }
        printf("  3. %4d x %4d x %3d (ta %d tb %d): no pool, 1, 2, 3, 5 threads bitwise equal\n", M,
               N, K, ta, tb);
        free(A), free(B), free(C0), free(ref), free(C);
    }
}

int main(void)
{
    printf("test_gemm_split: zs_op_gemm under a GEMM whose order of additions follows the shape\n");
    test_is_gemm();
    test_is_hostile();
    test_threads();
    printf("test_gemm_split: OK\n");
    return 0;
}
