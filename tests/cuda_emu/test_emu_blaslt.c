/*
 * test_emu_blaslt.c - the emulated cuBLASLt (tests/cuda_emu/emu_blaslt*.c)
 * against a naive double-precision reference and against the refusals the
 * cuBLAS documentation gives: every type / compute type / transpose / batch
 * combination we emulate, beta = 0 with NaN in C, in-place and broadcast C,
 * interleaved batches, bad shapes, leading dimensions, batch counts and
 * types, heuristic modes (ZS_EMU_BLAS_HEURISTIC), alignment and workspace
 * refusals, call-time capture of host alpha/beta, and the emulator's fatal
 * stop on a pointer that is not device memory.
 *
 * Does not: run on a GPU or compare with real cuBLAS results.
 */
#include "emu_blaslt_internal.h"
/* Work is asynchronous; a sticky error shows at the next synchronisation. */
static cudaError_t sticky(void)
{
    return cudaDeviceSynchronize();
}
#include "zs_test.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t g_rng = 0x1234567887654321ull;
static double urand(void) /* [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    TEST_CHECK(cudaMalloc(&p, bytes) == cudaSuccess);
    return p;
}

/* Store v as type t at index i; return the value actually stored. */
static double put(void *buf, uint32_t t, size_t i, double v)
{
    if (t == CUDA_R_16F) {
        ((uint16_t *)buf)[i] = zs_emu_f2h((float)v);
        return zs_emu_h2f(((uint16_t *)buf)[i]);
    }
    if (t == CUDA_R_16BF) {
        ((uint16_t *)buf)[i] = zs_emu_f2bf((float)v);
        return zs_emu_bf2f(((uint16_t *)buf)[i]);
    }
    ((float *)buf)[i] = (float)v;
    return ((float *)buf)[i];
}

static double get(const void *buf, uint32_t t, size_t i)
{
    if (t == CUDA_R_16F)
        return zs_emu_h2f(((const uint16_t *)buf)[i]);
    if (t == CUDA_R_16BF)
        return zs_emu_bf2f(((const uint16_t *)buf)[i]);
    return ((const float *)buf)[i];
}

static void fill_nan(void *buf, uint32_t t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put(buf, t, i, NAN);
}

static cublasLtMatrixLayout_t layout(uint32_t t, int64_t rows, int64_t cols, int64_t ld, int batch,
                                     int64_t stride)
{
    cublasLtMatrixLayout_t l;
    TEST_CHECK(cublasLtMatrixLayoutCreate(&l, t, (uint64_t)rows, (uint64_t)cols, ld) ==
               CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                sizeof(batch)) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)) == CUBLAS_STATUS_SUCCESS);
    return l;
}

static cublasLtMatmulDesc_t mdesc(int compute, int opa, int opb)
{
    cublasLtMatmulDesc_t d;
    TEST_CHECK(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    int32_t a = opa, b = opb;
    TEST_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &a, sizeof(a)) ==
               CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &b, sizeof(b)) ==
               CUBLAS_STATUS_SUCCESS);
    return d;
}

static cublasLtMatmulPreference_t mpref(uint64_t ws, uint32_t align)
{
    cublasLtMatmulPreference_t p;
    TEST_CHECK(cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS);
    for (int i = 0; i < 4; i++)
        TEST_CHECK(
            cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i,
                                                 &align, sizeof(align)) == CUBLAS_STATUS_SUCCESS);
    return p;
}

static cublasLtHandle_t g_h;
#define WS_BYTES (1u << 16)
static void *g_ws;

/* One GEMM of the given kind, checked element by element. */
typedef struct {
    int compute;
    uint32_t tab, tcd;
    int opa, opb;
    int64_t m, n, k;
    int batch;
    int pad; /* added to every leading dimension */
    double alpha, beta;
    int in_place; /* C == D */
    int c_ld0;    /* C broadcast: ld 0, one column */
    int nan_c;    /* fill C (and D) with NaN; needs beta == 0 */
} gcase;

static void run_case(const gcase *g)
{
    int64_t m = g->m, n = g->n, k = g->k;
    int64_t ar = g->opa == CUBLAS_OP_N ? m : k, ac = g->opa == CUBLAS_OP_N ? k : m;
    int64_t br = g->opb == CUBLAS_OP_N ? k : n, bc = g->opb == CUBLAS_OP_N ? n : k;
    int64_t lda = ar + g->pad, ldb = br + g->pad, ldd = m + g->pad;
    int64_t ldc = g->in_place ? ldd : (g->c_ld0 ? 0 : m + 2 * g->pad);
    int64_t sa = lda * ac + 3, sb = ldb * bc + 1, sd = ldd * n + 5;
    int64_t sc = g->in_place ? sd : (g->c_ld0 ? m : (m + 2 * g->pad) * n + 2);
    size_t es_ab = zs_emu_lt_type_size(g->tab), es_cd = zs_emu_lt_type_size(g->tcd);
    size_t na = (size_t)(sa * g->batch), nb = (size_t)(sb * g->batch);
    size_t nc = (size_t)(sc * g->batch), nd = (size_t)(sd * g->batch);
    void *hA = calloc(na, es_ab), *hB = calloc(nb, es_ab), *hC = calloc(nc, es_cd),
         *hD = calloc(nd, es_cd);
    double *rA = calloc(na, sizeof(double)), *rB = calloc(nb, sizeof(double)),
           *rC = calloc(nc, sizeof(double));
    int tf32 = g->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    for (size_t i = 0; i < na; i++) {
        rA[i] = put(hA, g->tab, i, urand());
        if (tf32)
            rA[i] = zs_emu_tf32((float)rA[i]);
    }
    for (size_t i = 0; i < nb; i++) {
        rB[i] = put(hB, g->tab, i, urand());
        if (tf32)
            rB[i] = zs_emu_tf32((float)rB[i]);
    }
    if (g->nan_c) {
        fill_nan(hC, g->tcd, nc);
        fill_nan(hD, g->tcd, nd);
    } else {
        for (size_t i = 0; i < nc; i++)
            rC[i] = put(hC, g->tcd, i, urand());
        for (size_t i = 0; i < nd; i++)
            put(hD, g->tcd, i, 7.0); /* D's padding must survive */
    }
    void *dA = dalloc(na * es_ab), *dB = dalloc(nb * es_ab), *dD = dalloc(nd * es_cd);
    void *dC = g->in_place ? dD : dalloc(nc * es_cd);
    TEST_CHECK(cudaMemcpy(dA, hA, na * es_ab, cudaMemcpyHostToDevice) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(dB, hB, nb * es_ab, cudaMemcpyHostToDevice) == cudaSuccess);
    if (g->in_place) {
        memcpy(hD, hC, nd * es_cd); /* same buffer: C's values are D's */
        for (size_t i = 0; i < nd; i++)
            rC[i] = g->nan_c ? NAN : get(hD, g->tcd, i);
        TEST_CHECK(cudaMemcpy(dD, hD, nd * es_cd, cudaMemcpyHostToDevice) == cudaSuccess);
    } else {
        TEST_CHECK(cudaMemcpy(dC, hC, nc * es_cd, cudaMemcpyHostToDevice) == cudaSuccess);
        TEST_CHECK(cudaMemcpy(dD, hD, nd * es_cd, cudaMemcpyHostToDevice) == cudaSuccess);
    }

    cublasLtMatmulDesc_t desc = mdesc(g->compute, g->opa, g->opb);
    cublasLtMatrixLayout_t lA = layout(g->tab, ar, ac, lda, g->batch, sa);
    cublasLtMatrixLayout_t lB = layout(g->tab, br, bc, ldb, g->batch, sb);
    cublasLtMatrixLayout_t lC = layout(g->tcd, m, n, ldc, g->batch, sc);
    cublasLtMatrixLayout_t lD = layout(g->tcd, m, n, ldd, g->batch, sd);
    cublasLtMatmulPreference_t pref = mpref(WS_BYTES, 256);
    cublasLtMatmulHeuristicResult_t res[3];
    int got = -1;
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, desc, lA, lB, lC, lD, pref, 3, res, &got) ==
               CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(got >= 1 && res[0].state == CUBLAS_STATUS_SUCCESS &&
               res[0].workspaceSize <= WS_BYTES);
    float alpha = (float)g->alpha, beta = (float)g->beta;
    cublasStatus_t st = cublasLtMatmul(g_h, desc, &alpha, dA, lA, dB, lB, &beta, dC, lC, dD, lD,
                                       &res[0].algo, g_ws, WS_BYTES, 0);
    TEST_CHECKF(st == CUBLAS_STATUS_SUCCESS, "status %s", cublasLtGetStatusName(st));
    TEST_CHECK(cudaStreamSynchronize(0) == cudaSuccess);
    TEST_CHECK(sticky() == cudaSuccess);
    TEST_CHECK(cudaMemcpy(hD, dD, nd * es_cd, cudaMemcpyDeviceToHost) == cudaSuccess);

    /* fp32 accumulation: each of k products and sums loses at most 2^-24
     * relative of the running magnitude; a 16-bit D adds one rounding. */
    double out_round = g->tcd == CUDA_R_16F ? 0x1p-11 : g->tcd == CUDA_R_16BF ? 0x1p-8 : 0x1p-24;
    double out_abs = g->tcd == CUDA_R_16F ? 0x1p-25 : 0.0;
    double worst = 0;
    for (int b = 0; b < g->batch; b++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                double s = 0, mag = 0;
                for (int64_t l = 0; l < k; l++) {
                    int64_t ai = g->opa == CUBLAS_OP_N ? i + l * lda : l + i * lda;
                    int64_t bi = g->opb == CUBLAS_OP_N ? l + j * ldb : j + l * ldb;
                    double a = rA[b * sa + ai], bb = rB[b * sb + bi];
                    s += a * bb;
                    mag += fabs(a * bb);
                }
                double ref = g->alpha * s, cmag = 0;
                if (g->beta != 0) {
                    double c = rC[b * sc + i + j * ldc];
                    ref += g->beta * c;
                    cmag = fabs(g->beta * c);
                }
                double tol = (double)(k + 3) * 0x1p-24 * (fabs(g->alpha) * mag + cmag) +
                             out_round * fabs(ref) + out_abs;
                double d = get(hD, g->tcd, (size_t)(b * sd + i + j * ldd));
                TEST_CHECKF(
                    !isnan(d) && zs_test_close(d, ref, tol, 0, &worst),
                    "compute %d types %u/%u ops %d%d m%ld n%ld k%ld batch %d b%d (%ld,%ld): "
                    "got %.9g want %.9g tol %.3g",
                    g->compute, g->tab, g->tcd, g->opa, g->opb, (long)m, (long)n, (long)k, g->batch,
                    b, (long)i, (long)j, d, ref, tol);
            }
    /* D's padding rows (ld > m) are untouched. */
    if (g->pad && !g->nan_c && !g->in_place)
        for (int64_t j = 0; j < n; j++)
            TEST_CHECK(get(hD, g->tcd, (size_t)(m + j * ldd)) == 7.0);

    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(lA);
    cublasLtMatrixLayoutDestroy(lB);
    cublasLtMatrixLayoutDestroy(lC);
    cublasLtMatrixLayoutDestroy(lD);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA);
    cudaFree(dB);
    if (!g->in_place)
        cudaFree(dC);
    cudaFree(dD);
    free(hA), free(hB), free(hC), free(hD), free(rA), free(rB), free(rC);
}

static void test_all_combinations(void)
{
    static const struct {
        int compute;
        uint32_t tab, tcd;
    } types[] = {
        {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16F},
        {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF},
        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_16F, CUDA_R_16F},
        {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_16F, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_16BF, CUDA_R_16BF},
        {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_16BF, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F},
    };
    static const int64_t shapes[][3] = {{7, 5, 9}, {33, 17, 65}, {1, 1, 1}, {4, 3, 0}};
    int count = 0;
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (int opa = 0; opa < 2; opa++)
            for (int opb = 0; opb < 2; opb++)
                for (int batch = 1; batch <= 3; batch += 2)
                    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
                        for (int v = 0; v < 4; v++) {
                            gcase g = {types[t].compute,
                                       types[t].tab,
                                       types[t].tcd,
                                       opa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       opb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       shapes[s][0],
                                       shapes[s][1],
                                       shapes[s][2],
                                       batch,
                                       (int)(s + v) % 3,
                                       1.0,
                                       0.0,
                                       0,
                                       0,
                                       0};
                            if (v == 0) { /* beta 0, NaN everywhere in C and D */
                                g.nan_c = 1;
                                g.alpha = -1.5;
                            } else if (v == 1) {
                                g.beta = 0.5;
                                g.alpha = 0.75;
                            } else if (v == 2) { /* in place */
                                g.in_place = 1;
                                g.beta = -2.0;
                            } else { /* in place, beta 0, NaN in C == D */
                                g.in_place = 1;
                                g.nan_c = 1;
                                g.alpha = 2.0;
                            }
                            run_case(&g);
                            count++;
                        }
    /* C broadcast with ld 0 (out of place only) */
    gcase g = {CUBLAS_COMPUTE_32F,
               CUDA_R_32F,
               CUDA_R_32F,
               CUBLAS_OP_N,
               CUBLAS_OP_T,
               6,
               4,
               3,
               2,
               1,
               1.0,
               1.0,
               0,
               1,
               0};
    run_case(&g);
    count++;
    printf("combinations: %d GEMMs match the double reference\n", count);
}

/* A small fixed problem for the refusal tests: D (m x n) = A (m x k) B (k x n). */
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t A, B, C, D;
    cublasLtMatmulPreference_t pref;
    float *dA, *dB, *dC, *dD;
} small;

enum { SM = 8, SN = 8, SK = 8 };

static void small_init(small *s, int compute)
{
    s->desc = mdesc(compute, CUBLAS_OP_N, CUBLAS_OP_N);
    s->A = layout(CUDA_R_32F, SM, SK, SM, 1, 0);
    s->B = layout(CUDA_R_32F, SK, SN, SK, 1, 0);
    s->C = layout(CUDA_R_32F, SM, SN, SM, 1, 0);
    s->D = layout(CUDA_R_32F, SM, SN, SM, 1, 0);
    s->pref = mpref(WS_BYTES, 256);
    s->dA = dalloc(4096);
    s->dB = dalloc(4096);
    s->dC = dalloc(4096);
    s->dD = dalloc(4096);
    float one[1024];
    for (int i = 0; i < 1024; i++)
        one[i] = 1.0f;
    cudaMemcpy(s->dA, one, 4096, cudaMemcpyHostToDevice);
    cudaMemcpy(s->dB, one, 4096, cudaMemcpyHostToDevice);
    cudaMemcpy(s->dC, one, 4096, cudaMemcpyHostToDevice);
}

static void small_free(small *s)
{
    cublasLtMatmulDescDestroy(s->desc);
    cublasLtMatrixLayoutDestroy(s->A);
    cublasLtMatrixLayoutDestroy(s->B);
    cublasLtMatrixLayoutDestroy(s->C);
    cublasLtMatrixLayoutDestroy(s->D);
    cublasLtMatmulPreferenceDestroy(s->pref);
    cudaFree(s->dA);
    cudaFree(s->dB);
    cudaFree(s->dC);
    cudaFree(s->dD);
}

static cublasStatus_t heur(small *s, cublasLtMatmulHeuristicResult_t *r, int *got)
{
    return cublasLtMatmulAlgoGetHeuristic(g_h, s->desc, s->A, s->B, s->C, s->D, s->pref, 1, r, got);
}

static cublasStatus_t mm(small *s, const cublasLtMatmulAlgo_t *algo, const void *A, const void *C,
                         void *D, void *ws, size_t wsn)
{
    float alpha = 1, beta = 1;
    return cublasLtMatmul(g_h, s->desc, &alpha, A, s->A, s->dB, s->B, &beta, C, s->C, D, s->D, algo,
                          ws, wsn, 0);
}

static void set_ld(cublasLtMatrixLayout_t l, int64_t ld)
{
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld)) ==
               CUBLAS_STATUS_SUCCESS);
}

static void set_u64(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, uint64_t v)
{
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(l, a, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS);
}

static void set_batch(cublasLtMatrixLayout_t l, int32_t b, int64_t stride)
{
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b,
                                                sizeof(b)) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)) == CUBLAS_STATUS_SUCCESS);
}

static void set_type(cublasLtMatrixLayout_t l, uint32_t t)
{
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &t, sizeof(t)) ==
               CUBLAS_STATUS_SUCCESS);
}

static void test_refusals(void)
{
    small s;
    small_init(&s, CUBLAS_COMPUTE_32F);
    cublasLtMatmulHeuristicResult_t r;
    int got;
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS && got == 1);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dD, g_ws, WS_BYTES) == CUBLAS_STATUS_SUCCESS);

    /* handles */
    float alpha = 1, beta = 0;
    TEST_CHECK(cublasLtMatmul(NULL, s.desc, &alpha, s.dA, s.A, s.dB, s.B, &beta, s.dC, s.C, s.dD,
                              s.D, &r.algo, g_ws, WS_BYTES, 0) == CUBLAS_STATUS_NOT_INITIALIZED);
    uint64_t junk[8] = {0};
    TEST_CHECK(cublasLtMatmul((cublasLtHandle_t)junk, s.desc, &alpha, s.dA, s.A, s.dB, s.B, &beta,
                              s.dC, s.C, s.dD, s.D, &r.algo, g_ws, WS_BYTES,
                              0) == CUBLAS_STATUS_NOT_INITIALIZED);
    cublasLtHandle_t dead;
    TEST_CHECK(cublasLtCreate(&dead) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtDestroy(dead) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(dead, s.desc, s.A, s.B, s.C, s.D, s.pref, 1, &r,
                                              &got) == CUBLAS_STATUS_NOT_INITIALIZED);
    TEST_CHECK(cublasLtDestroy(dead) == CUBLAS_STATUS_NOT_INITIALIZED);
    TEST_CHECK(cublasLtDestroy(NULL) == CUBLAS_STATUS_NOT_INITIALIZED);

    /* attribute sizes */
    int64_t ld64 = 8;
    int32_t ld32 = 8;
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(s.A, CUBLASLT_MATRIX_LAYOUT_LD, &ld32,
                                                sizeof(ld32)) == CUBLAS_STATUS_INVALID_VALUE);
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(s.A, CUBLASLT_MATRIX_LAYOUT_LD, NULL,
                                                sizeof(ld64)) == CUBLAS_STATUS_INVALID_VALUE);
    int64_t op64 = CUBLAS_OP_T;
    TEST_CHECK(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op64,
                                              sizeof(op64)) == CUBLAS_STATUS_INVALID_VALUE);
    uint32_t ws32 = 5;
    TEST_CHECK(cublasLtMatmulPreferenceSetAttribute(s.pref,
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws32,
                                                    sizeof(ws32)) == CUBLAS_STATUS_INVALID_VALUE);
    size_t need = 0;
    TEST_CHECK(cublasLtMatrixLayoutGetAttribute(s.A, CUBLASLT_MATRIX_LAYOUT_LD, NULL, 0, &need) ==
                   CUBLAS_STATUS_SUCCESS &&
               need == 8);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS && got == 1);

    /* requestedAlgoCount <= 0 */
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, s.desc, s.A, s.B, s.C, s.D, s.pref, 0, &r,
                                              &got) == CUBLAS_STATUS_INVALID_VALUE);

    /* shapes: A's k (cols) differs from B's k (rows) */
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_COLS, SK + 1);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_COLS, SK);
    /* A's m differs from D's rows */
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_ROWS, SM - 1);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_ROWS, SM);
    /* C's shape differs from D's */
    set_u64(s.C, CUBLASLT_MATRIX_LAYOUT_COLS, SN - 1);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    set_u64(s.C, CUBLASLT_MATRIX_LAYOUT_COLS, SN);
    /* transposing A makes an 8x8 A still fit; a 8x4 A with T needs D rows 4 */
    int32_t opt = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof(opt));
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_COLS, 4);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_COLS, SK);
    int32_t opn = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opn, sizeof(opn));
    int32_t opbad = 7;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opbad, sizeof(opbad));
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof(opn));

    /* leading dimension below the rows, for each matrix */
    cublasLtMatrixLayout_t ls[4] = {s.A, s.B, s.C, s.D};
    for (int i = 0; i < 4; i++) {
        set_ld(ls[i], 7);
        TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
        set_ld(ls[i], -8);
        TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
        set_ld(ls[i], 8);
    }

    /* batch counts must agree */
    set_batch(s.B, 2, 64);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    set_batch(s.B, 1, 0);
    set_batch(s.D, 2, 64);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE);
    set_batch(s.D, 1, 0);

    /* types */
    set_type(s.A, CUDA_R_16F);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE); /* A 16F, B 32F */
    set_type(s.B, CUDA_R_16F);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS); /* 16F x 16F -> 32F */
    set_type(s.C, CUDA_R_16BF);
    set_type(s.D, CUDA_R_16BF);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED); /* 16F -> 16BF */
    set_type(s.C, CUDA_R_16F);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_INVALID_VALUE); /* C 16F, D 16BF */
    set_type(s.D, CUDA_R_16F);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS);
    set_type(s.A, CUDA_R_32F);
    set_type(s.B, CUDA_R_32F);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED); /* 32F -> 16F */
    set_type(s.C, CUDA_R_32F);
    set_type(s.D, CUDA_R_32F);
    set_type(s.A, CUDA_R_64F);
    set_type(s.B, CUDA_R_64F);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED);
    set_type(s.A, CUDA_R_32F);
    set_type(s.B, CUDA_R_32F);
    int32_t ct = CUBLAS_COMPUTE_16F;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &ct, sizeof(ct));
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED);
    ct = CUBLAS_COMPUTE_32F_FAST_TF32;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &ct, sizeof(ct));
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS);
    set_type(s.A, CUDA_R_16BF);
    set_type(s.B, CUDA_R_16BF);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED); /* TF32 wants 32F */
    set_type(s.A, CUDA_R_32F);
    set_type(s.B, CUDA_R_32F);
    ct = CUBLAS_COMPUTE_32F;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &ct, sizeof(ct));
    int32_t sc16 = CUDA_R_16F;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &sc16, sizeof(sc16));
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED);
    int32_t sc32 = CUDA_R_32F;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &sc32, sizeof(sc32));
    /* an attribute we do not model is refused when set, accepted when reset
     * (the epilogue attributes are modelled: test_emu_blaslt_epilogue) */
    void *scale = s.dC;
    TEST_CHECK(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale,
                                              sizeof(scale)) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED);
    scale = NULL;
    TEST_CHECK(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale,
                                              sizeof(scale)) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS);
    /* an epilogue we do not emulate is refused, not ignored */
    uint32_t epi = CUBLASLT_EPILOGUE_RELU;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_NOT_SUPPORTED);
    epi = CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS && got == 1);

    /* an algo is for the problem it was chosen for */
    cublasLtMatmulHeuristicResult_t r8 = r;
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_COLS, 4);
    set_u64(s.B, CUBLASLT_MATRIX_LAYOUT_ROWS, 4);
    TEST_CHECK(mm(&s, &r8.algo, s.dA, s.dC, s.dD, g_ws, WS_BYTES) == CUBLAS_STATUS_NOT_SUPPORTED);
    set_u64(s.A, CUBLASLT_MATRIX_LAYOUT_COLS, SK);
    set_u64(s.B, CUBLASLT_MATRIX_LAYOUT_ROWS, SK);
    cublasLtMatmulAlgo_t zero_algo;
    memset(&zero_algo, 0, sizeof(zero_algo));
    TEST_CHECK(mm(&s, &zero_algo, s.dA, s.dC, s.dD, g_ws, WS_BYTES) == CUBLAS_STATUS_NOT_SUPPORTED);

    /* workspace: smaller than the algo needs, misaligned, NULL */
    TEST_CHECK(r.workspaceSize == WS_BYTES);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dD, g_ws, WS_BYTES - 1) ==
               CUBLAS_STATUS_INVALID_VALUE);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dD, (char *)g_ws + 16, WS_BYTES) ==
               CUBLAS_STATUS_INVALID_VALUE);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dD, NULL, WS_BYTES) == CUBLAS_STATUS_INVALID_VALUE);

    /* alignment: default preference 256; a pointer 4 bytes off is refused */
    TEST_CHECK(mm(&s, &r.algo, s.dA + 1, s.dC, s.dD, g_ws, WS_BYTES) ==
               CUBLAS_STATUS_INVALID_VALUE);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC + 1, s.dD + 1, g_ws, WS_BYTES) ==
               CUBLAS_STATUS_INVALID_VALUE);
    TEST_CHECK(mm(&s, NULL, s.dA + 1, s.dC, s.dD, NULL, 0) == CUBLAS_STATUS_INVALID_VALUE);
    /* ... and accepted by an algo chosen for 4-byte alignment */
    cublasLtMatmulPreference_t p4 = mpref(0, 4);
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, s.desc, s.A, s.B, s.C, s.D, p4, 1, &r, &got) ==
                   CUBLAS_STATUS_SUCCESS &&
               got == 1 && r.workspaceSize == 0);
    TEST_CHECK(mm(&s, &r.algo, s.dA + 1, s.dC + 1, s.dD + 1, NULL, 0) == CUBLAS_STATUS_SUCCESS);
    /* NULL algo: implicit heuristic with default preferences (256, no ws) */
    TEST_CHECK(mm(&s, NULL, s.dA, s.dC, s.dD, NULL, 0) == CUBLAS_STATUS_SUCCESS);

    /* in place needs Cdesc == Ddesc */
    set_ld(s.C, 9);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dD, s.dD, NULL, 0) == CUBLAS_STATUS_INVALID_VALUE);
    set_ld(s.C, 8);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dD, s.dD, NULL, 0) == CUBLAS_STATUS_SUCCESS);
    /* out of place with C and D sharing elements */
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dD + 3, s.dD, NULL, 0) == CUBLAS_STATUS_INVALID_VALUE);
    /* D sharing elements with A */
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dA + 8, NULL, 0) == CUBLAS_STATUS_INVALID_VALUE);
    /* D over C's padding rows (interleaved, disjoint): allowed */
    set_ld(s.C, 16);
    set_ld(s.D, 16);
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, s.desc, s.A, s.B, s.C, s.D, p4, 1, &r, &got) ==
               CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dC + 8, NULL, 0) == CUBLAS_STATUS_SUCCESS);
    float ones[1024];
    for (int i = 0; i < 1024; i++)
        ones[i] = 1.0f;
    cudaMemcpy(s.dC, ones, sizeof(ones), cudaMemcpyHostToDevice); /* D wrote into it */
    /* D's own batches overlapping (stride 0) */
    set_ld(s.C, 8);
    set_ld(s.D, 8);
    for (int i = 0; i < 4; i++)
        set_batch(ls[i], 2, i == 3 ? 0 : 64);
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, s.desc, s.A, s.B, s.C, s.D, p4, 1, &r, &got) ==
               CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dD, NULL, 0) == CUBLAS_STATUS_INVALID_VALUE);
    /* ... but interleaved batches (stride 8 rows, ld 16) are fine */
    set_batch(s.D, 2, 8);
    set_ld(s.D, 16);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dD, NULL, 0) == CUBLAS_STATUS_SUCCESS);
    /* A and B may be broadcast over the batch (stride 0) */
    set_batch(s.A, 2, 0);
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, s.desc, s.A, s.B, s.C, s.D, p4, 1, &r, &got) ==
               CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(mm(&s, &r.algo, s.dA, s.dC, s.dD, NULL, 0) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cudaDeviceSynchronize() == cudaSuccess && sticky() == cudaSuccess);
    float out[256];
    cudaMemcpy(out, s.dD, sizeof(out), cudaMemcpyDeviceToHost);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < SN; j++)
            for (int i = 0; i < SM; i++)
                TEST_CHECK(out[b * 8 + i + j * 16] == 9.0f); /* 8 * 1 * 1 + 1 */
    cublasLtMatmulPreferenceDestroy(p4);

    /* an uninitialised descriptor */
    cublasLtMatrixLayoutOpaque_t raw;
    memset(&raw, 0, sizeof(raw));
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, s.desc, &raw, s.B, s.C, s.D, s.pref, 1, &r,
                                              &got) == CUBLAS_STATUS_INVALID_VALUE);
    /* ... and one Init'ed in caller memory works */
    TEST_CHECK(cublasLtMatrixLayoutInit(&raw, CUDA_R_32F, SM, SK, SM) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatrixLayoutSetAttribute(&raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                &(int32_t){2}, 4) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(cublasLtMatmulAlgoGetHeuristic(g_h, s.desc, &raw, s.B, s.C, s.D, s.pref, 1, &r,
                                              &got) == CUBLAS_STATUS_SUCCESS);
    small_free(&s);
    printf("refusals: ok\n");
}

static void test_heuristic_modes(void)
{
    small s;
    small_init(&s, CUBLAS_COMPUTE_32F_PEDANTIC);
    cublasLtMatmulHeuristicResult_t r;
    int got;

    setenv("ZS_EMU_BLAS_HEURISTIC", "none", 1);
    int saw_ns = 0, saw_zero = 0;
    for (int i = 0; i < 4; i++) {
        got = 99;
        cublasStatus_t st = heur(&s, &r, &got);
        TEST_CHECK(got == 0);
        TEST_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_SUCCESS);
        saw_ns += st == CUBLAS_STATUS_NOT_SUPPORTED;
        saw_zero += st == CUBLAS_STATUS_SUCCESS;
    }
    TEST_CHECK(saw_ns == 2 && saw_zero == 2); /* both documented forms */
    TEST_CHECK(mm(&s, NULL, s.dA, s.dC, s.dD, NULL, 0) == CUBLAS_STATUS_NOT_SUPPORTED);

    setenv("ZS_EMU_BLAS_HEURISTIC", "no-pedantic", 1);
    got = 99;
    heur(&s, &r, &got);
    TEST_CHECK(got == 0);
    int32_t ct = CUBLAS_COMPUTE_32F;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &ct, sizeof(ct));
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS && got == 1);

    char seq1[65] = {0}, seq2[65] = {0};
    setenv("ZS_EMU_BLAS_HEURISTIC", "random:42", 1);
    for (int i = 0; i < 64; i++) {
        got = 99;
        heur(&s, &r, &got);
        seq1[i] = got ? '1' : '0';
    }
    setenv("ZS_EMU_BLAS_HEURISTIC", "random:7", 1);
    heur(&s, &r, &got);
    setenv("ZS_EMU_BLAS_HEURISTIC", "random:42", 1);
    for (int i = 0; i < 64; i++) {
        got = 99;
        heur(&s, &r, &got);
        seq2[i] = got ? '1' : '0';
    }
    TEST_CHECKF(!strcmp(seq1, seq2), "%s vs %s", seq1, seq2);
    TEST_CHECK(strchr(seq1, '0') && strchr(seq1, '1'));

    setenv("ZS_EMU_BLAS_HEURISTIC", "all", 1);
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS && got == 1);
    unsetenv("ZS_EMU_BLAS_HEURISTIC");
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS && got == 1);
    small_free(&s);
    printf("heuristic modes: ok (random:42 = %s)\n", seq1);
}

/* Host alpha/beta are read at the call; device ones when the work runs. The
 * workspace is scribbled. */
/* A gate: a host function that holds its (non-blocking) stream until the
 * test opens it, so work enqueued behind it provably runs after the call
 * returned and after whatever the test does in between. */
static atomic_int g_gate;

static void CUDART_CB gate_fn(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_gate))
        usleep(100);
}

static void *open_gate_later(void *arg)
{
    (void)arg;
    usleep(50000);
    atomic_store(&g_gate, 1);
    return NULL;
}

static cudaStream_t gated_stream(void)
{
    cudaStream_t st;
    TEST_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    atomic_store(&g_gate, 0);
    TEST_CHECK(cudaLaunchHostFunc(st, gate_fn, NULL) == cudaSuccess);
    return st;
}

static void test_capture(void)
{
    small s;
    small_init(&s, CUBLAS_COMPUTE_32F);
    cublasLtMatmulHeuristicResult_t r;
    int got;
    TEST_CHECK(heur(&s, &r, &got) == CUBLAS_STATUS_SUCCESS && got == 1);
    cudaMemset(g_ws, 0, WS_BYTES);
    float out[64];

    /* host pointer mode: alpha/beta read at the call */
    cudaStream_t st = gated_stream();
    float alpha = 2, beta = 0;
    TEST_CHECK(cublasLtMatmul(g_h, s.desc, &alpha, s.dA, s.A, s.dB, s.B, &beta, s.dC, s.C, s.dD,
                              s.D, &r.algo, g_ws, WS_BYTES, st) == CUBLAS_STATUS_SUCCESS);
    alpha = 100, beta = 100;
    /* not run yet: D still holds the allocation's poison, not 16 */
    cudaMemcpy(out, s.dD, sizeof(out), cudaMemcpyDeviceToHost);
    TEST_CHECK(out[0] != 16.0f);
    atomic_store(&g_gate, 1);
    TEST_CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    cudaMemcpy(out, s.dD, sizeof(out), cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++)
        TEST_CHECK(out[i] == 16.0f);
    unsigned char wsb[16];
    cudaMemcpy(wsb, g_ws, sizeof(wsb), cudaMemcpyDeviceToHost);
    TEST_CHECK(wsb[0] == 0xff && wsb[15] == 0xff); /* scribbled */

    /* device pointer mode: alpha/beta read when the GEMM runs */
    int32_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    TEST_CHECK(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm,
                                              sizeof(pm)) == CUBLAS_STATUS_SUCCESS);
    float *dab = dalloc(8);
    float ab[2] = {3, 0};
    cudaMemcpy(dab, ab, 8, cudaMemcpyHostToDevice);
    atomic_store(&g_gate, 0);
    TEST_CHECK(cudaLaunchHostFunc(st, gate_fn, NULL) == cudaSuccess);
    TEST_CHECK(cublasLtMatmul(g_h, s.desc, dab, s.dA, s.A, s.dB, s.B, dab + 1, s.dC, s.C, s.dD, s.D,
                              &r.algo, g_ws, WS_BYTES, st) == CUBLAS_STATUS_SUCCESS);
    ab[0] = 0.5f;
    ab[1] = 1.0f;
    /* before the gate opens; a pageable H2D cudaMemcpy may return before the
     * copy lands (CUDA Runtime API, "API synchronization behavior"), so
     * wait for the legacy stream, which does not wait for st */
    cudaMemcpy(dab, ab, 8, cudaMemcpyHostToDevice);
    TEST_CHECK(cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess);
    atomic_store(&g_gate, 1);
    TEST_CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    cudaMemcpy(out, s.dD, sizeof(out), cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++)
        TEST_CHECKF(out[i] == 5.0f, "%g", out[i]); /* 0.5 * 8 + 1 * 1 */

    /* cublasLtDestroy synchronises the device: a GEMM still held behind the
     * gate (opened 50 ms later by another thread) is done when it returns */
    cublasLtHandle_t h2;
    TEST_CHECK(cublasLtCreate(&h2) == CUBLAS_STATUS_SUCCESS);
    pm = CUBLASLT_POINTER_MODE_HOST;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm));
    atomic_store(&g_gate, 0);
    TEST_CHECK(cudaLaunchHostFunc(st, gate_fn, NULL) == cudaSuccess);
    alpha = 1, beta = 0;
    TEST_CHECK(cublasLtMatmul(h2, s.desc, &alpha, s.dA, s.A, s.dB, s.B, &beta, s.dC, s.C, s.dD, s.D,
                              &r.algo, g_ws, WS_BYTES, st) == CUBLAS_STATUS_SUCCESS);
    pthread_t opener;
    TEST_CHECK(pthread_create(&opener, NULL, open_gate_later, NULL) == 0);
    TEST_CHECK(cublasLtDestroy(h2) == CUBLAS_STATUS_SUCCESS);
    cudaMemcpy(out, s.dD, sizeof(out), cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++)
        TEST_CHECKF(out[i] == 8.0f, "%g", out[i]);
    pthread_join(opener, NULL);
    TEST_CHECK(cudaStreamDestroy(st) == cudaSuccess);
    cudaFree(dab);
    small_free(&s);
    printf("capture: ok\n");
}

/* A pointer that is not device memory stops the emulator (fork: the child
 * must die of SIGABRT). */
/* alpha_dev non-NULL: pass it as alpha with the default (host) pointer mode */
static void expect_fatal(small *s, const void *A, int64_t lda, const float *alpha_dev)
{
    TEST_CHECK(cudaDeviceSynchronize() == cudaSuccess); /* executors idle at fork */
    fflush(NULL);
    pid_t pid = fork();
    TEST_CHECK(pid >= 0);
    if (pid == 0) {
        TEST_CHECK(freopen("/dev/null", "w", stderr));
        float alpha = 1, beta = 0;
        set_ld(s->A, lda);
        cublasLtMatmul(g_h, s->desc, alpha_dev ? alpha_dev : &alpha, A, s->A, s->dB, s->B, &beta,
                       s->dC, s->C, s->dD, s->D, NULL, NULL, 0, 0);
        _exit(0);
    }
    int status;
    TEST_CHECK(waitpid(pid, &status, 0) == pid);
    TEST_CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %d", status);
}

/* Everything is allocated before fork: the child only makes the call that
 * must stop it (a runtime with executor threads is not safe to use in a
 * forked child). */
static void test_fatal(void)
{
    static float host[64] __attribute__((aligned(256)));
    small s;
    small_init(&s, CUBLAS_COMPUTE_32F);
    expect_fatal(&s, host, SM, NULL);           /* host memory */
    expect_fatal(&s, s.dA + 64 * 16, SM, NULL); /* one past the end of A's allocation */
    expect_fatal(&s, s.dA + 64 * 15, 16, NULL); /* A (ld 16) runs past the end */
    expect_fatal(&s, s.dA, SM, s.dC);           /* device alpha, host pointer mode */
    /* memory of another device than the handle's (ZS_EMU_DEVICES=2) */
    int ndev = 0;
    TEST_CHECK(cudaGetDeviceCount(&ndev) == cudaSuccess && ndev == 2);
    TEST_CHECK(cudaSetDevice(1) == cudaSuccess);
    float *other = dalloc(4096);
    TEST_CHECK(cudaSetDevice(0) == cudaSuccess);
    expect_fatal(&s, other, SM, NULL);
    TEST_CHECK(cudaSetDevice(1) == cudaSuccess);
    cudaFree(other);
    TEST_CHECK(cudaSetDevice(0) == cudaSuccess);
    /* the control: the last 8x8 (ld 8) that fits is accepted */
    TEST_CHECK(mm(&s, NULL, s.dA + 64 * 15, s.dC, s.dD, NULL, 0) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(sticky() == cudaSuccess);
    small_free(&s);
    printf("fatal on non-device pointers: ok\n");
}

int main(void)
{
    /* two emulated devices (emu-core's runtime reads this at its first
     * call): one test hands the handle of device 0 memory of device 1 */
    setenv("ZS_EMU_DEVICES", "2", 1);
    TEST_CHECK(
        !strcmp(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED"));
    TEST_CHECK(strlen(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0);
    TEST_CHECK(cublasLtCreate(&g_h) == CUBLAS_STATUS_SUCCESS);
    g_ws = dalloc(WS_BYTES);
    unsetenv("ZS_EMU_BLAS_HEURISTIC");
    test_refusals();
    test_heuristic_modes();
    test_capture();
    test_fatal();
    test_all_combinations();
    cudaFree(g_ws);
    TEST_CHECK(cublasLtDestroy(g_h) == CUBLAS_STATUS_SUCCESS);
    printf("test_emu_blaslt: all passed\n");
    return 0;
}
