/*
 * test_emu_blaslt_epilogue.c - the emulated cuBLASLt's matmul epilogues
 * (emu_blaslt_matmul.c) against a plain double-precision CPU reference
 * written here from cublasLt.h's cublasLtEpilogue_t comments: BIAS, GELU,
 * GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU, DGELU_BGRAD, BGRADA, BGRADB (and
 * DEFAULT), every emulated type pair, NN/NT/TN/TT, batches, padded ld, aux
 * ld > rows, alpha/beta other than 1/0, both GELU forms
 * (ZS_EMU_BLAS_GELU=tanh|erf); the descriptor attributes' sizes, defaults
 * and read-back; and the refusals (NULL bias/aux, aux ld, aux stride, data
 * types, overlapping outputs, an algo of another epilogue, a less aligned
 * bias).
 *
 * Does not: run on a GPU or compare with real cuBLASLt results.
 */
#include "emu_blaslt_internal.h"
#include "zs_test.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
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

/* The reference GELU, in double, of the form the emulator is told to use. */
static int g_erf;
static double gelu_d(double x)
{
    if (g_erf)
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double dgelu_d(double x)
{
    if (g_erf)
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
    double k0 = sqrt(2.0 / M_PI), t = tanh(k0 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k0 * (1.0 + 3.0 * 0.044715 * x * x);
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

static void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v,
                     size_t n)
{
    TEST_CHECK(cublasLtMatmulDescSetAttribute(d, a, v, n) == CUBLAS_STATUS_SUCCESS);
}

static cublasLtMatmulDesc_t mdesc(int compute, int opa, int opb, uint32_t epi)
{
    cublasLtMatmulDesc_t d;
    TEST_CHECK(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    int32_t a = opa, b = opb;
    set_attr(d, CUBLASLT_MATMUL_DESC_TRANSA, &a, sizeof(a));
    set_attr(d, CUBLASLT_MATMUL_DESC_TRANSB, &b, sizeof(b));
    set_attr(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
    return d;
}

static cublasLtMatmulPreference_t mpref(void)
{
    cublasLtMatmulPreference_t p;
    TEST_CHECK(cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_SUCCESS);
    uint32_t align = 4;
    for (int i = 0; i < 4; i++)
        TEST_CHECK(
            cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i,
                                                 &align, sizeof(align)) == CUBLAS_STATUS_SUCCESS);
    return p;
}

static cublasLtHandle_t g_h;

enum {
    F_BIAS = 1,
    F_GELU = 2,
    F_AUXOUT = 4,
    F_DGELU = 8,
    F_BGRAD_D = 16,
    F_BGRADA = 32,
    F_BGRADB = 64
};

static int flags_of(uint32_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_BIAS:
        return F_BIAS;
    case CUBLASLT_EPILOGUE_GELU:
        return F_GELU;
    case CUBLASLT_EPILOGUE_GELU_AUX:
        return F_GELU | F_AUXOUT;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        return F_GELU | F_BIAS;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return F_GELU | F_AUXOUT | F_BIAS;
    case CUBLASLT_EPILOGUE_DGELU:
        return F_DGELU;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        return F_DGELU | F_BGRAD_D;
    case CUBLASLT_EPILOGUE_BGRADA:
        return F_BGRADA;
    case CUBLASLT_EPILOGUE_BGRADB:
        return F_BGRADB;
    default:
        return 0;
    }
}

typedef struct {
    uint32_t epi;
    int compute;
    uint32_t tab, tcd;
    int opa, opb;
    int64_t m, n, k;
    int batch;
    int pad;       /* added to A/B/C/D leading dimensions */
    int aux_extra; /* aux ld = round_up(m, 8) + 8 * aux_extra */
    double alpha, beta;
} ecase;

/* One epilogue GEMM, checked element by element against the double
 * reference: z = alpha * op(A) op(B) + beta * C (+ bias[i]); aux = z;
 * D = GELU(z) | z * GELU'(aux_in) | z; bias gradients as documented. */
static void run_ep(const ecase *g)
{
    int f = flags_of(g->epi);
    int64_t m = g->m, n = g->n, k = g->k;
    int64_t ar = g->opa == CUBLAS_OP_N ? m : k, ac = g->opa == CUBLAS_OP_N ? k : m;
    int64_t br = g->opb == CUBLAS_OP_N ? k : n, bc = g->opb == CUBLAS_OP_N ? n : k;
    int64_t lda = ar + g->pad, ldb = br + g->pad, ldc = m + 2 * g->pad, ldd = m + g->pad;
    int64_t sa = lda * ac + 3, sb = ldb * bc + 1, sc = ldc * n + 2, sd = ldd * n + 5;
    int64_t ldx = (m + 7) / 8 * 8 + 8 * g->aux_extra, sx = ldx * n + 8 * (g->batch > 1);
    if (ldx == 0)
        ldx = 8;
    int64_t blen = (f & F_BGRADB) ? n : m, sbias = blen + 3;
    size_t es_ab = zs_emu_lt_type_size(g->tab), es_cd = zs_emu_lt_type_size(g->tcd);
    size_t na = (size_t)(sa * g->batch), nb = (size_t)(sb * g->batch), nc = (size_t)(sc * g->batch),
           nd = (size_t)(sd * g->batch), nx = (size_t)(sx * g->batch),
           nbias = (size_t)(sbias * g->batch);
    void *hA = calloc(na, es_ab), *hB = calloc(nb, es_ab), *hC = calloc(nc, es_cd),
         *hD = calloc(nd, es_cd), *hX = calloc(nx + 1, es_cd), *hBias = calloc(nbias + 1, es_cd);
    double *rA = calloc(na, sizeof(double)), *rB = calloc(nb, sizeof(double)),
           *rC = calloc(nc, sizeof(double)), *rX = calloc(nx + 1, sizeof(double)),
           *rBias = calloc(nbias + 1, sizeof(double));
    int tf32 = g->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    for (size_t i = 0; i < na; i++)
        rA[i] =
            tf32 ? zs_emu_tf32((float)put(hA, g->tab, i, urand())) : put(hA, g->tab, i, urand());
    for (size_t i = 0; i < nb; i++)
        rB[i] =
            tf32 ? zs_emu_tf32((float)put(hB, g->tab, i, urand())) : put(hB, g->tab, i, urand());
    for (size_t i = 0; i < nc; i++)
        rC[i] = put(hC, g->tcd, i, urand());
    for (size_t i = 0; i < nd; i++)
        put(hD, g->tcd, i, 7.0);
    for (size_t i = 0; i < nx; i++) /* DGELU's input: GELU inputs over [-3, 3) */
        rX[i] = put(hX, g->tcd, i, (f & F_DGELU) ? 3.0 * urand() : 5.0);
    for (size_t i = 0; i < nbias; i++)
        rBias[i] = put(hBias, g->tcd, i, (f & F_BIAS) ? urand() : 9.0);

    void *dA = dalloc(na * es_ab), *dB = dalloc(nb * es_ab), *dC = dalloc(nc * es_cd),
         *dD = dalloc(nd * es_cd), *dX = dalloc((nx + 1) * es_cd),
         *dBias = dalloc((nbias + 1) * es_cd);
    TEST_CHECK(cudaMemcpy(dA, hA, na * es_ab, cudaMemcpyHostToDevice) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(dB, hB, nb * es_ab, cudaMemcpyHostToDevice) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(dC, hC, nc * es_cd, cudaMemcpyHostToDevice) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(dD, hD, nd * es_cd, cudaMemcpyHostToDevice) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(dX, hX, (nx + 1) * es_cd, cudaMemcpyHostToDevice) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(dBias, hBias, (nbias + 1) * es_cd, cudaMemcpyHostToDevice) ==
               cudaSuccess);

    cublasLtMatmulDesc_t desc = mdesc(g->compute, g->opa, g->opb, g->epi);
    if (f & (F_BIAS | F_BGRAD_D | F_BGRADA | F_BGRADB)) {
        set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dBias, sizeof(dBias));
        set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &sbias, sizeof(sbias));
    }
    if (f & (F_AUXOUT | F_DGELU)) {
        set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &dX, sizeof(dX));
        set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldx, sizeof(ldx));
        set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &sx, sizeof(sx));
    }
    cublasLtMatrixLayout_t lA = layout(g->tab, ar, ac, lda, g->batch, sa);
    cublasLtMatrixLayout_t lB = layout(g->tab, br, bc, ldb, g->batch, sb);
    cublasLtMatrixLayout_t lC = layout(g->tcd, m, n, ldc, g->batch, sc);
    cublasLtMatrixLayout_t lD = layout(g->tcd, m, n, ldd, g->batch, sd);
    cublasLtMatmulPreference_t pref = mpref();
    cublasLtMatmulHeuristicResult_t res;
    int got = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(g_h, desc, lA, lB, lC, lD, pref, 1, &res, &got);
    TEST_CHECKF(st == CUBLAS_STATUS_SUCCESS && got == 1, "heuristic %s", cublasLtGetStatusName(st));
    float alpha = (float)g->alpha, beta = (float)g->beta;
    st = cublasLtMatmul(g_h, desc, &alpha, dA, lA, dB, lB, &beta, dC, lC, dD, lD, &res.algo, NULL,
                        0, 0);
    TEST_CHECKF(st == CUBLAS_STATUS_SUCCESS, "epilogue %u: %s", g->epi, cublasLtGetStatusName(st));
    TEST_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    TEST_CHECK(cudaMemcpy(hD, dD, nd * es_cd, cudaMemcpyDeviceToHost) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(hX, dX, (nx + 1) * es_cd, cudaMemcpyDeviceToHost) == cudaSuccess);
    TEST_CHECK(cudaMemcpy(hBias, dBias, (nbias + 1) * es_cd, cudaMemcpyDeviceToHost) ==
               cudaSuccess);

    double out_round = g->tcd == CUDA_R_16F ? 0x1p-11 : g->tcd == CUDA_R_16BF ? 0x1p-8 : 0x1p-24;
    double out_abs = g->tcd == CUDA_R_16F ? 0x1p-24 : 0x1p-126;
    double worst = 0;
    double *bg = calloc((size_t)(m > n ? m : n) + 1, sizeof(double)),
           *bgtol = calloc((size_t)(m > n ? m : n) + 1, sizeof(double));
    char what[160];
    snprintf(what, sizeof(what),
             "epi %u compute %d types %u/%u ops %d%d m%ld n%ld k%ld batch %d %s", g->epi,
             g->compute, g->tab, g->tcd, g->opa, g->opb, (long)m, (long)n, (long)k, g->batch,
             g_erf ? "erf" : "tanh");
    for (int b = 0; b < g->batch; b++) {
        for (int64_t i = 0; i < m; i++)
            bg[i] = bgtol[i] = 0;
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
                double c = rC[b * sc + i + j * ldc];
                double z = g->alpha * s + g->beta * c;
                double zt = (double)(k + 4) * 0x1p-24 * (fabs(g->alpha) * mag + fabs(g->beta * c));
                if (f & F_BIAS) {
                    double bi = rBias[b * sbias + i]; /* per row of D */
                    z += bi;
                    zt += 0x1p-24 * (fabs(z) + fabs(bi));
                }
                double ref = z, tol = zt;
                if (f & F_AUXOUT) {
                    double x = get(hX, g->tcd, (size_t)(b * sx + i + j * ldx));
                    double xt = zt + out_round * fabs(z) + out_abs;
                    TEST_CHECKF(zs_test_close(x, z, xt, 0, &worst),
                                "%s: aux b%d (%ld,%ld) got %.9g want %.9g tol %.3g", what, b,
                                (long)i, (long)j, x, z, xt);
                }
                if (f & F_GELU) {
                    ref = gelu_d(z);
                    tol = 1.2 * zt + 4e-7 * (fabs(z) + 1.0);
                }
                if (f & F_DGELU) {
                    double gx = dgelu_d(rX[b * sx + i + j * ldx]);
                    ref = z * gx;
                    tol = zt * fabs(gx) + 4e-7 * fabs(z);
                }
                bg[i] += ref;
                bgtol[i] += tol + 0x1p-24 * (double)(j + 1) * fabs(ref);
                tol += out_round * fabs(ref) + out_abs;
                double d = get(hD, g->tcd, (size_t)(b * sd + i + j * ldd));
                TEST_CHECKF(!isnan(d) && zs_test_close(d, ref, tol, 0, &worst),
                            "%s: D b%d (%ld,%ld) got %.9g want %.9g tol %.3g", what, b, (long)i,
                            (long)j, d, ref, tol);
            }
        /* D's padding rows survive */
        if (g->pad)
            for (int64_t j = 0; j < n; j++)
                TEST_CHECK(get(hD, g->tcd, (size_t)(b * sd + m + j * ldd)) == 7.0);
        if (f & (F_BGRAD_D | F_BGRADA | F_BGRADB)) {
            for (int64_t i = 0; i < blen; i++) {
                double ref = bg[i], tol = bgtol[i];
                if (f & (F_BGRADA | F_BGRADB)) { /* sum over k of op(A)(i,:) or op(B)(:,i) */
                    double s = 0, mag = 0;
                    for (int64_t l = 0; l < k; l++) {
                        double v =
                            (f & F_BGRADA)
                                ? rA[b * sa + (g->opa == CUBLAS_OP_N ? i + l * lda : l + i * lda)]
                                : rB[b * sb + (g->opb == CUBLAS_OP_N ? l + i * ldb : i + l * ldb)];
                        s += v;
                        mag += fabs(v);
                    }
                    ref = s;
                    tol = (double)(k + 1) * 0x1p-24 * mag;
                }
                tol += out_round * fabs(ref) + out_abs;
                double got_b = get(hBias, g->tcd, (size_t)(b * sbias + i));
                TEST_CHECKF(!isnan(got_b) && zs_test_close(got_b, ref, tol, 0, &worst),
                            "%s: bias gradient b%d [%ld] got %.9g want %.9g tol %.3g", what, b,
                            (long)i, got_b, ref, tol);
            }
            /* the gap between batches' vectors is not written */
            TEST_CHECK(get(hBias, g->tcd, (size_t)blen) == 9.0);
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(lA);
    cublasLtMatrixLayoutDestroy(lB);
    cublasLtMatrixLayoutDestroy(lC);
    cublasLtMatrixLayoutDestroy(lD);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD), cudaFree(dX), cudaFree(dBias);
    free(hA), free(hB), free(hC), free(hD), free(hX), free(hBias);
    free(rA), free(rB), free(rC), free(rX), free(rBias), free(bg), free(bgtol);
}

static const uint32_t k_epis[] = {
    CUBLASLT_EPILOGUE_DEFAULT,  CUBLASLT_EPILOGUE_BIAS,        CUBLASLT_EPILOGUE_GELU,
    CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_BIAS,   CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
    CUBLASLT_EPILOGUE_DGELU,    CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,
    CUBLASLT_EPILOGUE_BGRADB,
};

static void test_combinations(void)
{
    static const struct {
        int compute;
        uint32_t tab, tcd;
    } types[] = {
        {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16F},
        {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_16BF, CUDA_R_16BF},
        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_32F},
        {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F},
    };
    static const int64_t shapes[][3] = {{13, 6, 9}, {24, 17, 33}, {1, 1, 1}, {5, 3, 0}};
    int count = 0;
    for (size_t e = 0; e < sizeof(k_epis) / sizeof(k_epis[0]); e++)
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
            for (int ops = 0; ops < 4; ops++)
                for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
                    int v = (int)(e + t + ops + s);
                    ecase g = {k_epis[e],
                               types[t].compute,
                               types[t].tab,
                               types[t].tcd,
                               (ops & 1) ? CUBLAS_OP_T : CUBLAS_OP_N,
                               (ops & 2) ? CUBLAS_OP_T : CUBLAS_OP_N,
                               shapes[s][0],
                               shapes[s][1],
                               shapes[s][2],
                               1 + 2 * (v % 2),
                               v % 3,
                               v % 2,
                               v % 3 == 0 ? 1.0 : -0.75,
                               v % 3 == 2 ? 0.0 : 0.5};
                    run_ep(&g);
                    count++;
                }
    printf("epilogue combinations (%s GELU): %d GEMMs match the double reference\n",
           g_erf ? "erf" : "tanh", count);
}

/* ---- attributes and refusals ------------------------------------------ */

static void test_attributes(void)
{
    cublasLtMatmulDesc_t d =
        mdesc(CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT);
    size_t w = 0;
    /* sizes (cublasLt.h): pointers, int64_t ld/strides, int32_t data types */
    static const struct {
        cublasLtMatmulDescAttributes_t a;
        size_t size;
    } sz[] = {
        {CUBLASLT_MATMUL_DESC_EPILOGUE, 4},
        {CUBLASLT_MATMUL_DESC_BIAS_POINTER, sizeof(void *)},
        {CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 8},
        {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, sizeof(void *)},
        {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, 8},
        {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, 8},
        {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, 4},
        {CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, 4},
    };
    for (size_t i = 0; i < sizeof(sz) / sizeof(sz[0]); i++) {
        uint64_t buf[2] = {0, 0};
        TEST_CHECK(cublasLtMatmulDescGetAttribute(d, sz[i].a, NULL, 0, &w) ==
                       CUBLAS_STATUS_SUCCESS &&
                   w == sz[i].size);
        TEST_CHECK(cublasLtMatmulDescSetAttribute(d, sz[i].a, buf, sz[i].size == 8 ? 4 : 8) ==
                   CUBLAS_STATUS_INVALID_VALUE);
        TEST_CHECK(cublasLtMatmulDescGetAttribute(d, sz[i].a, buf, sz[i].size + 1, &w) ==
                   CUBLAS_STATUS_INVALID_VALUE);
        TEST_CHECK(cublasLtMatmulDescSetAttribute(d, sz[i].a, NULL, sz[i].size) ==
                   CUBLAS_STATUS_INVALID_VALUE);
    }
    /* defaults: epilogue DEFAULT, pointers NULL, ld 0, data types -1 */
    uint32_t epi = 0;
    TEST_CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, 4, &w) ==
                   CUBLAS_STATUS_SUCCESS &&
               epi == CUBLASLT_EPILOGUE_DEFAULT && w == 4);
    void *ptr = &w;
    TEST_CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr,
                                              sizeof(ptr), &w) == CUBLAS_STATUS_SUCCESS &&
               ptr == NULL);
    int64_t ld = 1;
    TEST_CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 8,
                                              &w) == CUBLAS_STATUS_SUCCESS &&
               ld == 0);
    int32_t ty = 0;
    TEST_CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ty, 4, &w) ==
                   CUBLAS_STATUS_SUCCESS &&
               ty == -1);
    TEST_CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &ty,
                                              4, &w) == CUBLAS_STATUS_SUCCESS &&
               ty == -1);
    /* read back what was set */
    ptr = (void *)(uintptr_t)0x1000;
    set_attr(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptr, sizeof(ptr));
    ld = 64;
    set_attr(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld));
    ptr = NULL, ld = 0;
    TEST_CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptr,
                                              sizeof(ptr), &w) == CUBLAS_STATUS_SUCCESS &&
               ptr == (void *)(uintptr_t)0x1000);
    TEST_CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 8,
                                              &w) == CUBLAS_STATUS_SUCCESS &&
               ld == 64);
    cublasLtMatmulDescDestroy(d);
    printf("attributes: ok\n");
}

/* A 16 x 8 x 8 fp32 problem with every buffer, for the refusals. */
typedef struct {
    float *A, *B, *C, *D, *X, *bias;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lA, lB, lC, lD;
    cublasLtMatmulPreference_t pref;
} rig;

static void rig_init(rig *r, uint32_t epi, int batch)
{
    r->A = dalloc(4096 * 4), r->B = dalloc(4096 * 4), r->C = dalloc(4096 * 4);
    r->D = dalloc(4096 * 4), r->X = dalloc(4096 * 4), r->bias = dalloc(4096 * 4);
    r->desc = mdesc(CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_N, epi);
    r->lA = layout(CUDA_R_32F, 16, 8, 16, batch, 128);
    r->lB = layout(CUDA_R_32F, 8, 8, 8, batch, 64);
    r->lC = layout(CUDA_R_32F, 16, 8, 16, batch, 128);
    r->lD = layout(CUDA_R_32F, 16, 8, 16, batch, 128);
    r->pref = mpref();
    int64_t ld = 16, sx = 128, sb = 16;
    set_attr(r->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &r->bias, sizeof(r->bias));
    set_attr(r->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &sb, sizeof(sb));
    set_attr(r->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &r->X, sizeof(r->X));
    set_attr(r->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld));
    set_attr(r->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &sx, sizeof(sx));
}

static void rig_free(rig *r)
{
    cudaFree(r->A), cudaFree(r->B), cudaFree(r->C), cudaFree(r->D), cudaFree(r->X),
        cudaFree(r->bias);
    cublasLtMatmulDescDestroy(r->desc);
    cublasLtMatrixLayoutDestroy(r->lA);
    cublasLtMatrixLayoutDestroy(r->lB);
    cublasLtMatrixLayoutDestroy(r->lC);
    cublasLtMatrixLayoutDestroy(r->lD);
    cublasLtMatmulPreferenceDestroy(r->pref);
}

static cublasStatus_t rig_heur(rig *r, cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulHeuristicResult_t res;
    int got = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_h, r->desc, r->lA, r->lB, r->lC, r->lD,
                                                       r->pref, 1, &res, &got);
    if (algo && st == CUBLAS_STATUS_SUCCESS && got == 1)
        *algo = res.algo;
    return st;
}

static cublasStatus_t rig_mm(rig *r, const cublasLtMatmulAlgo_t *algo)
{
    float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(g_h, r->desc, &one, r->A, r->lA, r->B, r->lB, &zero, r->C, r->lC, r->D,
                          r->lD, algo, NULL, 0, 0);
}

static void test_refusals(void)
{
    rig r;
    void *null = NULL;
    int64_t v;
    cublasLtMatmulAlgo_t algo;

    /* control: every epilogue runs on the rig */
    for (size_t e = 0; e < sizeof(k_epis) / sizeof(k_epis[0]); e++) {
        rig_init(&r, k_epis[e], 1);
        TEST_CHECKF(rig_heur(&r, NULL) == CUBLAS_STATUS_SUCCESS, "epilogue %u", k_epis[e]);
        TEST_CHECKF(rig_mm(&r, NULL) == CUBLAS_STATUS_SUCCESS, "epilogue %u", k_epis[e]);
        rig_free(&r);
    }
    TEST_CHECK(cudaDeviceSynchronize() == cudaSuccess);

    /* NULL bias with a bias or bias-gradient epilogue; NULL aux with an aux
     * epilogue: the heuristic (pointers may come later) answers, the matmul
     * refuses */
    static const uint32_t need_bias[] = {
        CUBLASLT_EPILOGUE_BIAS,        CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,    CUBLASLT_EPILOGUE_BGRADB};
    for (size_t e = 0; e < sizeof(need_bias) / sizeof(need_bias[0]); e++) {
        rig_init(&r, need_bias[e], 1);
        set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &null, sizeof(null));
        TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_SUCCESS);
        TEST_CHECKF(rig_mm(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE, "epilogue %u", need_bias[e]);
        rig_free(&r);
    }
    static const uint32_t need_aux[] = {CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                        CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD};
    for (size_t e = 0; e < sizeof(need_aux) / sizeof(need_aux[0]); e++) {
        rig_init(&r, need_aux[e], 1);
        set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &null, sizeof(null));
        TEST_CHECKF(rig_mm(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE, "epilogue %u", need_aux[e]);
        rig_free(&r);
        /* aux ld: unset (0), below the rows (8 < 16), not a multiple of 8 */
        int64_t bad_ld[] = {0, 8, 20, -16};
        for (int i = 0; i < 4; i++) {
            rig_init(&r, need_aux[e], 1);
            set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &bad_ld[i], 8);
            TEST_CHECKF(rig_heur(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE, "ld %ld",
                        (long)bad_ld[i]);
            TEST_CHECKF(rig_mm(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE, "ld %ld", (long)bad_ld[i]);
            rig_free(&r);
        }
        /* the control: ld 24 (> rows, a multiple of 8) */
        rig_init(&r, need_aux[e], 1);
        v = 24;
        set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &v, 8);
        TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_SUCCESS);
        /* an aux data type other than D's */
        int32_t t16 = CUDA_R_16F;
        set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t16, 4);
        TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
        int32_t t32 = CUDA_R_32F; /* D's type, said explicitly: fine */
        set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t32, 4);
        TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_SUCCESS);
        rig_free(&r);
    }
    TEST_CHECK(cudaDeviceSynchronize() == cudaSuccess);

    /* batches: aux stride not a multiple of 8; forward aux batches that
     * overlap; a bias gradient whose batches share one vector */
    rig_init(&r, CUBLASLT_EPILOGUE_GELU_AUX, 2);
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_SUCCESS);
    v = 132;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &v, 8);
    TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    v = 64;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &v, 8);
    TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    rig_free(&r);
    rig_init(&r, CUBLASLT_EPILOGUE_DGELU, 2); /* a shared aux input is fine */
    v = 0;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &v, 8);
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_SUCCESS);
    rig_free(&r);
    rig_init(&r, CUBLASLT_EPILOGUE_BGRADA, 2);
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_SUCCESS);
    v = 0;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &v, 8);
    TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    v = -16;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &v, 8);
    TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    rig_free(&r);
    rig_init(&r, CUBLASLT_EPILOGUE_BIAS, 2); /* one bias for every batch: fine */
    v = 0;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &v, 8);
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_SUCCESS);
    rig_free(&r);
    TEST_CHECK(cudaDeviceSynchronize() == cudaSuccess);

    /* a bias data type other than D's; ReLU (not emulated); no epilogue */
    rig_init(&r, CUBLASLT_EPILOGUE_BIAS, 1);
    int32_t t16 = CUDA_R_16F;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t16, 4);
    TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_NOT_SUPPORTED);
    rig_free(&r);
    rig_init(&r, CUBLASLT_EPILOGUE_RELU_BIAS, 1);
    TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_NOT_SUPPORTED);
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_NOT_SUPPORTED);
    rig_free(&r);
    rig_init(&r, 12345u, 1);
    TEST_CHECK(rig_heur(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    rig_free(&r);

    /* an algo chosen for DEFAULT does not run GELU_BIAS */
    rig_init(&r, CUBLASLT_EPILOGUE_DEFAULT, 1);
    TEST_CHECK(rig_heur(&r, &algo) == CUBLAS_STATUS_SUCCESS);
    uint32_t epi = CUBLASLT_EPILOGUE_GELU_BIAS;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, 4);
    TEST_CHECK(rig_mm(&r, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    TEST_CHECK(rig_heur(&r, &algo) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(rig_mm(&r, &algo) == CUBLAS_STATUS_SUCCESS);
    /* the heuristic saw a 256-byte aligned bias; a 4-byte aligned one is
     * refused with that algo, accepted with a new heuristic answer */
    float *b4 = r.bias + 1;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b4, sizeof(b4));
    TEST_CHECK(rig_mm(&r, &algo) == CUBLAS_STATUS_INVALID_VALUE);
    TEST_CHECK(rig_heur(&r, &algo) == CUBLAS_STATUS_SUCCESS);
    TEST_CHECK(rig_mm(&r, &algo) == CUBLAS_STATUS_SUCCESS);
    rig_free(&r);

    /* overlaps: aux output on D, bias gradient on A, D on the bias input */
    rig_init(&r, CUBLASLT_EPILOGUE_GELU_AUX, 1);
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &r.D, sizeof(r.D));
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    rig_free(&r);
    rig_init(&r, CUBLASLT_EPILOGUE_BGRADB, 1);
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &r.A, sizeof(r.A));
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    rig_free(&r);
    rig_init(&r, CUBLASLT_EPILOGUE_BIAS, 1);
    float *inD = r.D + 16 * 3;
    set_attr(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &inD, sizeof(inD));
    TEST_CHECK(rig_mm(&r, NULL) == CUBLAS_STATUS_INVALID_VALUE);
    rig_free(&r);
    TEST_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    printf("refusals: ok\n");
}

int main(void)
{
    TEST_CHECK(cublasLtCreate(&g_h) == CUBLAS_STATUS_SUCCESS);
    unsetenv("ZS_EMU_BLAS_HEURISTIC");
    test_attributes();
    test_refusals();
    setenv("ZS_EMU_BLAS_GELU", "tanh", 1);
    g_erf = 0;
    test_combinations();
    setenv("ZS_EMU_BLAS_GELU", "erf", 1);
    g_erf = 1;
    test_combinations();
    unsetenv("ZS_EMU_BLAS_GELU"); /* the default is tanh */
    g_erf = 0;
    ecase g = {CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
               CUBLAS_COMPUTE_32F,
               CUDA_R_32F,
               CUDA_R_32F,
               CUBLAS_OP_T,
               CUBLAS_OP_N,
               40,
               12,
               20,
               2,
               1,
               2,
               1.25,
               -0.5};
    run_ep(&g);
    TEST_CHECK(cublasLtDestroy(g_h) == CUBLAS_STATUS_SUCCESS);
    printf("test_emu_blaslt_epilogue: all passed\n");
    return 0;
}
