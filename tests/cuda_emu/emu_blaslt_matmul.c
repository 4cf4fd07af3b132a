/*
 * emu_blaslt_matmul.c - the emulated cublasLtMatmulAlgoGetHeuristic and
 * cublasLtMatmul: problem validation from the descriptors (shapes, leading
 * dimensions, batches, type table), the heuristic with its test modes
 * (ZS_EMU_BLAS_HEURISTIC), pointer/alignment/workspace/in-place checks at
 * call time, and the GEMM itself, enqueued on the caller's stream and run
 * with OpenBLAS (cblas_sgemm, column-major) in fp32.
 *
 * Sources: cuBLAS documentation, cuBLASLt API reference (cublasLtMatmul(),
 * its "Datatypes Supported" table, cublasLtMatmulAlgoGetHeuristic(),
 * cublasLtMatrixLayoutAttribute_t, cublasLtMatmulPreferenceAttributes_t),
 * and the doc comments of CUDA 13's cublasLt.h. Where they allow several
 * behaviours we take the most hostile legal one and say so ("HOSTILE").
 *
 * Epilogues (DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU,
 * DGELU_BGRAD, BGRADA, BGRADB) follow cublasLt.h's cublasLtEpilogue_t and
 * cublasLtMatmulDescAttributes_t comments (the cuBLAS docs' sections of the
 * same names, https://docs.nvidia.com/cuda/cublas/#cublasltepilogue-t and
 * #cublasltmatmuldescattributes-t); see the "epilogue" sections below.
 *
 * Does not: ReLU epilogues, scale/amax pointers, row-major or other orders,
 * pointer-array batches, device-vector alpha, compute types other than 32F,
 * 32F_PEDANTIC and 32F_FAST_TF32 (all refused with NOT_SUPPORTED), complex
 * types, int8/fp8. It does not model cuBLAS's summation order.
 */
#include "emu_blaslt_internal.h"
#include "emu_internal.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* ---- problem validation ----------------------------------------------- */

static const zs_emu_lt_layout *layout_of(cublasLtMatrixLayout_t l)
{
    const zs_emu_lt_layout *x = (const zs_emu_lt_layout *)l;
    return x && x->magic == ZS_EMU_LT_LAYOUT_MAGIC ? x : NULL;
}

/* Footprint in elements of a layout over all batches: last element + 1. */
static int64_t footprint(const zs_emu_lt_layout *l)
{
    if (l->rows == 0 || l->cols == 0 || l->batch <= 0)
        return 0;
    return (int64_t)(l->batch - 1) * l->stride + (int64_t)(l->cols - 1) * l->ld + (int64_t)l->rows;
}

/* The "Datatypes Supported" table of cublasLtMatmul() (cuBLAS docs), rows
 * for real types with scale type CUDA_R_32F:
 *   CUBLAS_COMPUTE_32F / 32F_PEDANTIC: A/B 16BF -> C/D 16BF or 32F;
 *     A/B 16F -> C/D 16F or 32F; A/B 32F -> C/D 32F;
 *   CUBLAS_COMPUTE_32F_FAST_TF32 (also FAST_16F/FAST_16BF): A/B/C/D 32F.
 * (A/B and C/D type equality is checked by the caller.) HOSTILE: cuBLASLt
 * 13.1 on an H100 also runs FAST_TF32 with 16BF operands, which the table
 * does not list; we refuse it. FAST_16F/FAST_16BF, int8 and fp8 rows exist in the table but
 * are not emulated: NOT_SUPPORTED, as for a configuration the "current
 * implementation" lacks. */
static int types_ok(int compute, int scale, uint32_t ta, uint32_t tb, uint32_t tc, uint32_t td)
{
    if (scale != CUDA_R_32F)
        return 0;
    switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
        if (ta == CUDA_R_32F)
            return tc == CUDA_R_32F;
        if (ta == CUDA_R_16F || ta == CUDA_R_16BF)
            return tc == ta || tc == CUDA_R_32F;
        return 0;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
        return ta == CUDA_R_32F && tc == CUDA_R_32F;
    default:
        return 0;
    }
}

static cublasStatus_t layout_supported(const zs_emu_lt_layout *l)
{
    /* Emulator limits, refused as NOT_SUPPORTED: only column-major
     * (CUBLASLT_ORDER_COL, the default), no planar complex, strided batches
     * only (BATCH_MODE 0). cublasLt.h ROWS/COLS: "Usually only values that
     * can be expressed as int32_t are supported". */
    if (l->order != CUBLASLT_ORDER_COL || l->plane_offset != 0 || l->batch_mode != 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->rows > INT32_MAX || l->cols > INT32_MAX)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- epilogue: validation ---------------------------------------------- */

/* Which epilogues are emulated and what each does, from cublasLt.h's
 * cublasLtEpilogue_t (cuBLAS docs, cublasLtEpilogue_t):
 *   BIAS "apply (broadcasted) Bias from bias vector. Bias vector length must
 *     match matrix D rows ... Bias vector is broadcasted to all columns and
 *     added before applying final postprocessing";
 *   GELU "apply GELU point-wise transform to the results (x:=GELU(x))";
 *   GELU_AUX "outputs GELU input as a separate matrix";
 *   GELU_BIAS / GELU_AUX_BIAS "apply Bias and then GELU transform";
 *   DGELU "Apply GELU gradient to matmul output. Store GELU gradient in the
 *     output matrix" (needs the aux input);
 *   DGELU_BGRAD "Apply independently GELU and Bias gradient to matmul output.
 *     Store GELU gradient in the output matrix, and Bias gradient in the
 *     auxiliary output (see CUBLASLT_MATMUL_DESC_BIAS_POINTER)";
 *   BGRADA "The bias size corresponds to the number of rows of the matrix D.
 *     The reduction happens over the GEMM's "k" dimension";
 *   BGRADB "The bias size corresponds to the number of columns of the matrix
 *     D. The reduction happens over the GEMM's "k" dimension".
 * The ReLU epilogues exist but are not emulated: NOT_SUPPORTED. A value that
 * is no cublasLtEpilogue_t at all: INVALID_VALUE (an impossible
 * configuration). */
static cublasStatus_t epilogue_kind(uint32_t e, zs_emu_lt_problem *p)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
        break;
    case CUBLASLT_EPILOGUE_BIAS:
        p->ep_bias = 1;
        break;
    case CUBLASLT_EPILOGUE_GELU:
        p->ep_gelu = 1;
        break;
    case CUBLASLT_EPILOGUE_GELU_AUX:
        p->ep_gelu = p->ep_aux_out = 1;
        break;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        p->ep_gelu = p->ep_bias = 1;
        break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        p->ep_gelu = p->ep_aux_out = p->ep_bias = 1;
        break;
    case CUBLASLT_EPILOGUE_DGELU:
        p->ep_dgelu = 1;
        break;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        p->ep_dgelu = 1;
        p->ep_bgrad = 'D';
        break;
    case CUBLASLT_EPILOGUE_BGRADA:
        p->ep_bgrad = 'A';
        break;
    case CUBLASLT_EPILOGUE_BGRADB:
        p->ep_bgrad = 'B';
        break;
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
        return CUBLAS_STATUS_NOT_SUPPORTED; /* emulator limit */
    default:
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    p->epilogue = e;
    return CUBLAS_STATUS_SUCCESS;
}

/* The descriptor's epilogue attributes against the problem (m x n D of type
 * D->type, batch D->batch). Pointers are not required here: the heuristic may
 * be asked before they are set (cublasLtMatmul checks them). */
static cublasStatus_t epilogue_check(const zs_emu_lt_desc *d, const zs_emu_lt_layout *D, int64_t m,
                                     int64_t n, zs_emu_lt_problem *p)
{
    cublasStatus_t st = epilogue_kind(d->epilogue, p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    /* BIAS_DATA_TYPE: "Bias vector elements are the same type as the
     * elements of output matrix (Dtype)" except IMMA and fp8 kernels, which
     * are not emulated; BIAS_POINTER, bias gradient case: "Bias gradient
     * vector elements are the same type as the output elements (Ctype)".
     * -1 (the default) means that type. Another type is no documented
     * combination: NOT_SUPPORTED. */
    p->tbias = D->type;
    if (d->bias_type != -1 && (uint32_t)d->bias_type != D->type)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* EPILOGUE_AUX_DATA_TYPE: "If unset, the data type defaults to the type
     * of elements of the output matrix"; "GELU input matrix elements type is
     * the same as the type of elements of the output matrix" except fp8
     * kernels; "If set for an unsupported matrix data, scale, and compute
     * type combination, calling cublasLtMatmul() will return
     * CUBLAS_INVALID_VALUE". */
    p->taux = D->type;
    if (d->aux_type != -1 && (uint32_t)d->aux_type != D->type)
        return CUBLAS_STATUS_INVALID_VALUE;

    int64_t batch = D->batch;
    if (p->ep_bias || p->ep_bgrad) {
        /* BIAS_POINTER: "Bias vector length must match matrix D rows
         * count"; BGRADB: "The bias size corresponds to the number of
         * columns of the matrix D". BIAS_BATCH_STRIDE "Used together with
         * CUBLASLT_MATMUL_DESC_BIAS_POINTER when matrix D's
         * CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT > 1", int64_t, default 0: 0
         * broadcasts one bias to every batch. A negative stride:
         * INVALID_VALUE. HOSTILE: a bias gradient is an output, so with
         * batch > 1 its batches must not overlap (a stride below the length,
         * 0 included, would have every batch race on one vector):
         * INVALID_VALUE, as for D. */
        p->bias_len = p->ep_bgrad == 'B' ? n : m;
        p->bias_stride = d->bias_stride;
        if (p->bias_stride < 0)
            return CUBLAS_STATUS_INVALID_VALUE;
        if (p->ep_bgrad && batch > 1 && p->bias_len > 0 && p->bias_stride < p->bias_len)
            return CUBLAS_STATUS_INVALID_VALUE;
        p->ebias = p->bias_len > 0 ? (batch - 1) * p->bias_stride + p->bias_len : 0;
    }
    if (p->ep_aux_out || p->ep_dgelu) {
        /* EPILOGUE_AUX_POINTER "Requires setting CUBLASLT_MATMUL_DESC_
         * EPILOGUE_AUX_LD attribute"; EPILOGUE_AUX_LD: "GELU input matrix
         * leading dimension in elements ... Must be divisible by 8 and be no
         * less than the number of rows in the output matrix";
         * EPILOGUE_AUX_BATCH_STRIDE: "GELU input matrix batch stride in
         * elements ... Must be divisible by 8". The docs give no status for
         * breaking these: they are parameters "in an impossible
         * configuration", INVALID_VALUE (cublasLtMatmul's own wording). The
         * aux matrix is column-major like D (m x n, element (i, j) at
         * i + j * ld). The rule is stated for GELU_AUX_BIAS/DGELU_BGRAD;
         * HOSTILE: GELU_AUX and DGELU, which use the same matrix, get it
         * too. HOSTILE: forward (aux is an output) batches must not overlap
         * (stride >= (n-1)*ld + m when batch > 1); the backward input may
         * be shared (stride 0). */
        p->aux_ld = d->aux_ld;
        p->aux_stride = d->aux_stride;
        if (p->aux_ld <= 0 || p->aux_ld < m || p->aux_ld % 8 != 0)
            return CUBLAS_STATUS_INVALID_VALUE;
        if (p->aux_stride < 0 || p->aux_stride % 8 != 0)
            return CUBLAS_STATUS_INVALID_VALUE;
        if (p->ep_aux_out && batch > 1 && m > 0 && n > 0 && p->aux_stride < (n - 1) * p->aux_ld + m)
            return CUBLAS_STATUS_INVALID_VALUE;
        p->eaux = m > 0 && n > 0 ? (batch - 1) * p->aux_stride + (n - 1) * p->aux_ld + m : 0;
    }
    p->bias = d->bias;
    p->aux = d->aux;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t zs_emu_lt_check(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                               cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                               zs_emu_lt_problem *p)
{
    /* cublasLt.h, cublasLtMatmul: NOT_INITIALIZED "if cuBLASLt handle has not
     * been initialized" - checked first, before any other argument. */
    if (!zs_emu_lt_handle_live(h))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    const zs_emu_lt_desc *d = (const zs_emu_lt_desc *)desc;
    if (!d || d->magic != ZS_EMU_LT_DESC_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* cuBLAS docs, cublasLtMatmul(): "If Cdesc is omitted, this function
     * assumes it to be equal to Ddesc." */
    const zs_emu_lt_layout *A = layout_of(Adesc), *B = layout_of(Bdesc), *D = layout_of(Ddesc);
    const zs_emu_lt_layout *C = Cdesc ? layout_of(Cdesc) : D;
    /* INVALID_VALUE "if parameters are in conflict or in an impossible
     * configuration": a missing or never-initialised descriptor. */
    if (!A || !B || !C || !D)
        return CUBLAS_STATUS_INVALID_VALUE;

    /* Operations: cublasOperation_t N, T, C. For real types C (conjugate
     * transpose) is T (cuBLAS docs, cublasOperation_t). Anything else is not
     * an operation at all. */
    int ops[2] = {d->transa, d->transb};
    for (int i = 0; i < 2; i++) {
        if (ops[i] == CUBLAS_OP_C)
            ops[i] = CUBLAS_OP_T;
        if (ops[i] != CUBLAS_OP_N && ops[i] != CUBLAS_OP_T)
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    /* cublasLt.h TRANSC: "Currently only CUBLAS_OP_N is supported." The
     * rest are emulator limits: epilogue, fill mode, any attribute we accept
     * but do not model, pointer modes other than HOST/DEVICE. */
    if (d->transc != CUBLAS_OP_N || d->fill_mode != CUBLAS_FILL_MODE_FULL || d->other_set)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST &&
        d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    cublasStatus_t st;
    if ((st = layout_supported(A)) || (st = layout_supported(B)) || (st = layout_supported(C)) ||
        (st = layout_supported(D)))
        return st;
    /* A and B of different types, or C and D ("both matrices must have the
     * same data type"), are parameters in conflict: INVALID_VALUE (what
     * cuBLASLt 13.1 on an H100 returns too). A consistent combination missing
     * from the table is a configuration the implementation lacks:
     * NOT_SUPPORTED. */
    if (A->type != B->type || C->type != D->type)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!types_ok(d->compute, d->scale, A->type, B->type, C->type, D->type))
        return CUBLAS_STATUS_NOT_SUPPORTED;

    /* Shapes (cublasLt.h: D = alpha * op(A) * op(B) + beta * C): D is m x n
     * (its layout's rows x cols); op(A) is m x k, so A's layout is m x k for
     * N and k x m for T; op(B) is k x n, so B's layout is k x n for N and
     * n x k for T; C is m x n. Anything else is "in conflict":
     * INVALID_VALUE. */
    int64_t m = (int64_t)D->rows, n = (int64_t)D->cols;
    int64_t ar = ops[0] == CUBLAS_OP_N ? (int64_t)A->rows : (int64_t)A->cols;
    int64_t k = ops[0] == CUBLAS_OP_N ? (int64_t)A->cols : (int64_t)A->rows;
    int64_t br = ops[1] == CUBLAS_OP_N ? (int64_t)B->rows : (int64_t)B->cols;
    int64_t bc = ops[1] == CUBLAS_OP_N ? (int64_t)B->cols : (int64_t)B->rows;
    if (ar != m || br != k || bc != n || (int64_t)C->rows != m || (int64_t)C->cols != n)
        return CUBLAS_STATUS_INVALID_VALUE;

    /* cublasLt.h LD: "Currently only non-negative values are supported, must
     * be large enough so that matrix memory locations are not overlapping
     * (e.g. greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of
     * CUBLASLT_ORDER_COL)". The one exception is C: cuBLAS docs,
     * cublasLtMatmul(): out of place "the leading dimension of C can be 0 to
     * achieve row or column broadcast" (that C != D is checked by
     * cublasLtMatmul, where the pointers are known; in place needs
     * Cdesc == Ddesc, so ld 0 is refused there). */
    if (A->ld < 0 || (uint64_t)A->ld < A->rows || B->ld < 0 || (uint64_t)B->ld < B->rows ||
        D->ld < 0 || (uint64_t)D->ld < D->rows)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (C->ld < 0 || (C->ld != 0 && (uint64_t)C->ld < C->rows))
        return CUBLAS_STATUS_INVALID_VALUE;

    /* Batches: BATCH_COUNT "Number of matmul operations to perform in the
     * batch" - one number for one operation, so HOSTILE: all four layouts
     * must give the same count (no implied broadcast of a count-1 A or B;
     * broadcast is a stride of 0). Strides (elements) must be >= 0. */
    if (A->batch < 1 || A->batch != B->batch || A->batch != C->batch || A->batch != D->batch)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (A->stride < 0 || B->stride < 0 || C->stride < 0 || D->stride < 0)
        return CUBLAS_STATUS_INVALID_VALUE;

    memset(p, 0, sizeof(*p));
    if ((st = epilogue_check(d, D, m, n, p)) != CUBLAS_STATUS_SUCCESS)
        return st;
    p->compute = d->compute;
    p->transa = ops[0];
    p->transb = ops[1];
    p->ta = A->type;
    p->tb = B->type;
    p->tc = D->type;
    p->m = m, p->n = n, p->k = k;
    p->lda = A->ld, p->ldb = B->ld, p->ldc = C->ld, p->ldd = D->ld;
    p->sa = A->stride, p->sb = B->stride, p->sc = C->stride, p->sd = D->stride;
    p->batch = A->batch;
    p->ea = footprint(A), p->eb = footprint(B), p->ec = footprint(C), p->ed = footprint(D);
    return CUBLAS_STATUS_SUCCESS;
}

/* What an algorithm is valid for: types, ops and shapes. HOSTILE: cuBLASLt
 * has cublasLtMatmulAlgoCheck() because an algo is not valid for every
 * problem; we take the narrowest reading, an algo only runs the problem its
 * heuristic call described (its epilogue included: CUBLASLT_ALGO_CAP_
 * EPILOGUE_MASK says an algo supports only some epilogues). Leading dimensions and strides are not
 * part of it (the alignment preferences cover pointers). */
static uint64_t problem_hash(const zs_emu_lt_problem *p)
{
    int64_t v[] = {p->compute, p->transa, p->transb, p->ta,       p->tb,    p->tc,  p->m,
                   p->n,       p->k,      p->batch,  p->epilogue, p->tbias, p->taux};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        h ^= (uint64_t)v[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---- heuristic -------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static pthread_mutex_t g_heur_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_heur_seed_text[64];
static uint64_t g_heur_draws;
static atomic_ulong g_heur_refusals, g_algo_serial;

/* ZS_EMU_BLAS_HEURISTIC: does this request get an algorithm?
 *   all (default)   always;
 *   none            never;
 *   no-pedantic     never for CUBLAS_COMPUTE_32F_PEDANTIC, always otherwise;
 *   random:SEED     a coin per request, seeded (the sequence restarts when
 *                   the seed text changes), so callers' fallback paths run
 *                   on some GEMMs and not others.
 * Read at every request so a test can change it between calls. */
static int heuristic_gives(int compute)
{
    const char *e = getenv("ZS_EMU_BLAS_HEURISTIC");
    if (!e || !*e || !strcmp(e, "all"))
        return 1;
    if (!strcmp(e, "none"))
        return 0;
    if (!strcmp(e, "no-pedantic"))
        return compute != CUBLAS_COMPUTE_32F_PEDANTIC;
    if (!strncmp(e, "random:", 7)) {
        char *end;
        uint64_t seed = strtoull(e + 7, &end, 0);
        if (end == e + 7 || *end)
            zs_emu_fatal("cublasLtMatmulAlgoGetHeuristic",
                         "ZS_EMU_BLAS_HEURISTIC=%s: want random:SEED", e);
        pthread_mutex_lock(&g_heur_mu);
        if (strncmp(g_heur_seed_text, e, sizeof(g_heur_seed_text) - 1)) {
            snprintf(g_heur_seed_text, sizeof(g_heur_seed_text), "%s", e);
            g_heur_draws = 0;
        }
        uint64_t r = splitmix64(seed ^ splitmix64(++g_heur_draws));
        pthread_mutex_unlock(&g_heur_mu);
        return (int)(r >> 63);
    }
    zs_emu_fatal("cublasLtMatmulAlgoGetHeuristic",
                 "ZS_EMU_BLAS_HEURISTIC=%s: want all, none, no-pedantic or random:SEED", e);
}

/* A request the heuristic answers with no algorithm. cublasLt.h documents two
 * ways: NOT_SUPPORTED "if no heuristic function available for current
 * configuration", or SUCCESS with returnAlgoCount 0 ("the number of
 * heuristicResultsArray elements written"). HOSTILE: we alternate between
 * the two (first NOT_SUPPORTED), so a caller must handle both; either way
 * *returnAlgoCount is 0. */
static cublasStatus_t no_algorithm(int *returnAlgoCount)
{
    *returnAlgoCount = 0;
    unsigned long n = atomic_fetch_add(&g_heur_refusals, 1);
    return n % 2 == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
}

/* The algorithm the heuristic returns. HOSTILE readings of the preference
 * attributes: MIN_ALIGNMENT_x_BYTES "Selecting a smaller value will exclude
 * algorithms that can not work with matrix x that is not as strictly aligned
 * as they need" - so the algorithm chosen assumes exactly the alignment the
 * preference allowed (default 256); MAX_WORKSPACE_BYTES is the most it may
 * use, and ours needs all of it. */
/* The caller's cublasLtMatmulAlgo_t is copied in and out with memcpy: it is
 * the caller's object (copied around as a value), never accessed through our
 * struct type. */
static uint32_t ptr_align(const void *ptr)
{
    uintptr_t v = (uintptr_t)ptr;
    if (!v)
        return 256;
    uint32_t a = 1;
    while (a < 256 && v % (a * 2) == 0)
        a *= 2;
    return a;
}

static void make_algo(const zs_emu_lt_problem *p, const zs_emu_lt_pref *pref,
                      cublasLtMatmulAlgo_t *out)
{
    zs_emu_lt_algo a;
    memset(&a, 0, sizeof(a));
    a.magic = ZS_EMU_LT_ALGO_MAGIC;
    a.problem = problem_hash(p);
    a.workspace = pref->max_workspace;
    for (int i = 0; i < 4; i++)
        a.align[i] = pref->align[i] ? pref->align[i] : 1;
    a.serial = atomic_fetch_add(&g_algo_serial, 1) + 1;
    /* cublasLt.h, BIAS_POINTER and EPILOGUE_AUX_POINTER: "Routines that don't
     * dereference this pointer, like cublasLtMatmulAlgoGetHeuristic() depend
     * on its value to determine expected pointer alignment." HOSTILE: the
     * algorithm assumes the alignment the pointer had at the heuristic call
     * (its lowest set bit, at most 256; NULL then: 256, the preference
     * default), so a later, less aligned pointer is refused. */
    a.align_bias = ptr_align(p->bias);
    a.align_aux = ptr_align(p->aux);
    memset(out, 0, sizeof(*out));
    memcpy(out, &a, sizeof(a));
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount)
{
    if (!zs_emu_lt_handle_live(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    /* cublasLt.h: INVALID_VALUE "if requestedAlgoCount is less or equal to
     * zero". The preference is a required argument (no "may be NULL"). */
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    const zs_emu_lt_pref *pref = (const zs_emu_lt_pref *)preference;
    if (!pref || pref->magic != ZS_EMU_LT_PREF_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    zs_emu_lt_problem p;
    cublasStatus_t st = zs_emu_lt_check(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!heuristic_gives(p.compute))
        return no_algorithm(returnAlgoCount);
    /* HOSTILE: one result however many were requested (the count written
     * may be anything from 0 to requestedAlgoCount). */
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof(*r));
    make_algo(&p, pref, &r->algo);
    r->workspaceSize = (size_t)pref->max_workspace;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- overlap ---------------------------------------------------------- */

typedef struct {
    uintptr_t lo, hi; /* [lo, hi) */
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The column spans of a strided-batched column-major matrix. */
static span *spans_of(uintptr_t base, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                      int64_t stride, size_t es, size_t *count)
{
    size_t n = (size_t)(cols * batch);
    span *s = malloc((n ? n : 1) * sizeof(*s));
    if (!s)
        zs_emu_fatal("cublasLtMatmul", "out of memory");
    size_t i = 0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t j = 0; j < cols; j++) {
            s[i].lo = base + (uintptr_t)((b * stride + j * ld) * (int64_t)es);
            s[i].hi = s[i].lo + (uintptr_t)(rows * (int64_t)es);
            i++;
        }
    *count = n;
    return s;
}

/* Do any two elements of the two matrices (or, with y == NULL, of two
 * different columns/batches of x) share a byte? Exact, so interleaved
 * matrices (heads at a stride inside one row-major buffer) are not refused,
 * only real overlap. */
typedef struct {
    uintptr_t base;
    int64_t rows, cols, ld, batch, stride;
    size_t es;
} mat;

static int mats_overlap(const mat *x, const mat *y)
{
    if (x->rows == 0 || x->cols == 0 || (y && (y->rows == 0 || y->cols == 0)))
        return 0;
    size_t nx, ny = 0;
    span *sx = spans_of(x->base, x->rows, x->cols, x->ld, x->batch, x->stride, x->es, &nx);
    span *sy =
        y ? spans_of(y->base, y->rows, y->cols, y->ld, y->batch, y->stride, y->es, &ny) : NULL;
    int hit = 0;
    if (!y) {
        qsort(sx, nx, sizeof(span), span_cmp);
        for (size_t i = 1; i < nx && !hit; i++)
            if (sx[i].lo < sx[i - 1].hi)
                hit = 1;
    } else {
        /* x and y each may have self-overlap (C with ld 0, A with stride 0),
         * which is fine for inputs: merge each side's spans first, then
         * sweep the two sorted, disjoint lists. */
        qsort(sx, nx, sizeof(span), span_cmp);
        qsort(sy, ny, sizeof(span), span_cmp);
        size_t mx = 0, my = 0;
        for (size_t i = 0; i < nx; i++)
            if (mx && sx[i].lo <= sx[mx - 1].hi)
                sx[mx - 1].hi = sx[i].hi > sx[mx - 1].hi ? sx[i].hi : sx[mx - 1].hi;
            else
                sx[mx++] = sx[i];
        for (size_t i = 0; i < ny; i++)
            if (my && sy[i].lo <= sy[my - 1].hi)
                sy[my - 1].hi = sy[i].hi > sy[my - 1].hi ? sy[i].hi : sy[my - 1].hi;
            else
                sy[my++] = sy[i];
        size_t i = 0, j = 0;
        while (i < mx && j < my && !hit) {
            if (sx[i].lo < sy[j].hi && sy[j].lo < sx[i].hi)
                hit = 1;
            else if (sx[i].hi <= sy[j].hi)
                i++;
            else
                j++;
        }
    }
    free(sx);
    free(sy);
    return hit;
}

static int ranges_meet(uintptr_t a, size_t an, uintptr_t b, size_t bn)
{
    return an && bn && a < b + bn && b < a + an;
}

/* ---- the GEMM --------------------------------------------------------- */

typedef struct {
    zs_emu_lt_problem p;
    const void *A, *B, *C;
    void *D, *ws;
    size_t ws_bytes;
    int device;
    int device_scalars; /* CUBLASLT_POINTER_MODE_DEVICE */
    float alpha, beta;
    const float *alpha_dev, *beta_dev;
    int gelu_erf; /* ZS_EMU_BLAS_GELU=erf at the call */
} zs_emu_lt_job;

static void store_d(void *D, uint32_t t, int64_t at, float v);

/* ---- epilogue: arithmetic --------------------------------------------- */

/* Which GELU. cublasLtEpilogue_t says only "apply GELU point-wise transform
 * to the results (x:=GELU(x))" and DGELU "Apply GELU gradient"; neither the
 * cuBLAS docs nor cublasLt.h say whether it is the exact form
 * x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) or the tanh approximation
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). They differ by up to
 * ~4e-4 absolute. The emulator computes the tanh approximation by default and
 * the erf form with ZS_EMU_BLAS_GELU=erf (read at each cublasLtMatmul), so a
 * caller can be run under both: code that compares the epilogue against its
 * own GELU more tightly than the two forms differ relies on something
 * undocumented. Both are evaluated in fp32 (compute type 32F) with glibc's
 * tanhf/erff/expf. */
static int gelu_form_erf(void)
{
    const char *e = getenv("ZS_EMU_BLAS_GELU");
    if (!e || !*e || !strcmp(e, "tanh"))
        return 0;
    if (!strcmp(e, "erf"))
        return 1;
    zs_emu_fatal("cublasLtMatmul", "ZS_EMU_BLAS_GELU=%s: want tanh or erf", e);
}

#define ZS_GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define ZS_GELU_K1 0.044715f

static float gelu_f(float x, int erf_form)
{
    if (erf_form)
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    return 0.5f * x * (1.0f + tanhf(ZS_GELU_K0 * (x + ZS_GELU_K1 * x * x * x)));
}

/* d GELU(x) / dx, of the same form. */
static float dgelu_f(float x, int erf_form)
{
    if (erf_form)
        return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
               x * 0.3989422804014327f * expf(-0.5f * x * x);
    float t = tanhf(ZS_GELU_K0 * (x + ZS_GELU_K1 * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * ZS_GELU_K0 * (1.0f + 3.0f * ZS_GELU_K1 * x * x);
}

static float load_any(const void *base, uint32_t t, int64_t at)
{
    if (t == CUDA_R_16F)
        return zs_emu_h2f(((const uint16_t *)base)[at]);
    if (t == CUDA_R_16BF)
        return zs_emu_bf2f(((const uint16_t *)base)[at]);
    return ((const float *)base)[at];
}

/* BGRADA / BGRADB (cublasLtEpilogue_t): the bias gradient "based on the input
 * matrix A" (B), "The reduction happens over the GEMM's "k" dimension": for
 * BGRADA, bias[i] = sum over l < k of op(A)(i, l), i < m (D's rows); for
 * BGRADB, bias[j] = sum over l < k of op(B)(l, j), j < n (D's columns).
 * HOSTILE readings where the docs are silent: the sum is of the operand as
 * the GEMM sees it (TF32-rounded under FAST_TF32), not scaled by alpha,
 * accumulated in fp32 (compute type) in increasing l and rounded once to the
 * bias type (D's); k = 0 gives 0. D itself is the plain alpha*op(A)op(B) +
 * beta*C. */
static void bgrad_operand(const zs_emu_lt_job *j, int64_t b)
{
    const zs_emu_lt_problem *p = &j->p;
    int tf32 = p->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    size_t esa = zs_emu_lt_type_size(p->ta);
    int is_a = p->ep_bgrad == 'A';
    const char *base =
        (const char *)(is_a ? j->A : j->B) + (size_t)(b * (is_a ? p->sa : p->sb)) * esa;
    int64_t ld = is_a ? p->lda : p->ldb;
    int trans = (is_a ? p->transa : p->transb) != CUBLAS_OP_N;
    void *out = (char *)p->bias + (size_t)(b * p->bias_stride) * zs_emu_lt_type_size(p->tbias);
    for (int64_t i = 0; i < p->bias_len; i++) {
        float acc = 0.0f;
        for (int64_t l = 0; l < p->k; l++) {
            /* op(A)(i, l) or op(B)(l, i) in the stored (column-major) layout */
            int64_t at =
                is_a ? (trans ? l + i * ld : i + l * ld) : (trans ? i + l * ld : l + i * ld);
            float v = load_any(base, p->ta, at);
            acc += tf32 ? zs_emu_tf32(v) : v;
        }
        store_d(out, p->tbias, i, acc);
    }
}

/* An fp32 copy (column-major, ld = rows) of one batch of a 16-bit or TF32
 * operand. 16-bit values widen exactly; TF32 rounds each fp32 value to 10
 * mantissa bits. */
static float *widen(const void *base, uint32_t t, int64_t rows, int64_t cols, int64_t ld, int tf32)
{
    float *w = malloc((size_t)(rows * cols) * sizeof(float));
    if (!w)
        return NULL;
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++) {
            int64_t at = i + j * ld;
            float v;
            if (t == CUDA_R_16F)
                v = zs_emu_h2f(((const uint16_t *)base)[at]);
            else if (t == CUDA_R_16BF)
                v = zs_emu_bf2f(((const uint16_t *)base)[at]);
            else
                v = ((const float *)base)[at];
            w[i + j * rows] = tf32 ? zs_emu_tf32(v) : v;
        }
    return w;
}

static float load_c(const void *C, uint32_t t, int64_t at)
{
    if (t == CUDA_R_16F)
        return zs_emu_h2f(((const uint16_t *)C)[at]);
    if (t == CUDA_R_16BF)
        return zs_emu_bf2f(((const uint16_t *)C)[at]);
    return ((const float *)C)[at];
}

static void store_d(void *D, uint32_t t, int64_t at, float v)
{
    if (t == CUDA_R_16F)
        ((uint16_t *)D)[at] = zs_emu_f2h(v);
    else if (t == CUDA_R_16BF)
        ((uint16_t *)D)[at] = zs_emu_f2bf(v);
    else
        ((float *)D)[at] = v;
}

static cudaError_t run_gemm(void *arg)
{
    zs_emu_lt_job *j = arg;
    const zs_emu_lt_problem *p = &j->p;
    size_t esa = zs_emu_lt_type_size(p->ta), esc = zs_emu_lt_type_size(p->tc);

    /* Memory freed (cudaFreeAsync) between the call and now is what a GPU
     * would fault on: an illegal address, sticky for the context. */
    if ((p->ea && zs_emu_dev_ptr(j->A, (size_t)p->ea * esa) != j->device) ||
        (p->eb && zs_emu_dev_ptr(j->B, (size_t)p->eb * esa) != j->device) ||
        (p->ed && zs_emu_dev_ptr(j->D, (size_t)p->ed * esc) != j->device) ||
        (j->ws_bytes && zs_emu_dev_ptr(j->ws, j->ws_bytes) != j->device))
        return cudaErrorIllegalAddress;

    /* the epilogue's vectors and aux matrix, as for A/B/D above */
    if ((p->ebias &&
         zs_emu_dev_ptr(p->bias, (size_t)p->ebias * zs_emu_lt_type_size(p->tbias)) != j->device) ||
        (p->eaux &&
         zs_emu_dev_ptr(p->aux, (size_t)p->eaux * zs_emu_lt_type_size(p->taux)) != j->device))
        return cudaErrorIllegalAddress;

    float alpha = j->alpha, beta = j->beta;
    if (j->device_scalars) {
        /* CUBLASLT_POINTER_MODE_DEVICE: alpha/beta are read on the device
         * when the GEMM runs, i.e. in stream order. */
        if (zs_emu_dev_ptr(j->alpha_dev, 4) != j->device ||
            zs_emu_dev_ptr(j->beta_dev, 4) != j->device)
            return cudaErrorIllegalAddress;
        alpha = *j->alpha_dev;
        beta = *j->beta_dev;
    }
    int read_c = beta != 0.0f;
    if (read_c && p->ec && zs_emu_dev_ptr(j->C, (size_t)p->ec * esc) != j->device)
        return cudaErrorIllegalAddress;

    /* HOSTILE: the workspace is the algorithm's to clobber; its old
     * contents are scribbled over (all-ones bytes: NaN as fp32/fp16/bf16)
     * at the head and tail of the size the algo asked for. */
    if (j->ws_bytes) {
        size_t n = j->ws_bytes < 65536 ? j->ws_bytes : 65536;
        memset(j->ws, 0xff, n);
        memset((char *)j->ws + j->ws_bytes - n, 0xff, n);
    }

    int64_t m = p->m, n = p->n, k = p->k;
    /* BGRADA/BGRADB depend on A or B only, so they are written even when D
     * is empty; DGELU_BGRAD's sum over no columns is 0. */
    for (int64_t b = 0; b < p->batch; b++) {
        if (p->ep_bgrad == 'A' || p->ep_bgrad == 'B')
            bgrad_operand(j, b);
        else if (p->ep_bgrad == 'D' && n == 0)
            for (int64_t i = 0; i < m; i++)
                store_d((char *)p->bias +
                            (size_t)(b * p->bias_stride) * zs_emu_lt_type_size(p->tbias),
                        p->tbias, i, 0.0f);
    }
    if (m == 0 || n == 0)
        return cudaSuccess;
    int tf32 = p->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    int widen_in = p->ta != CUDA_R_32F || tf32;
    int64_t arows = p->transa == CUBLAS_OP_N ? m : k, acols = p->transa == CUBLAS_OP_N ? k : m;
    int64_t brows = p->transb == CUBLAS_OP_N ? k : n, bcols = p->transb == CUBLAS_OP_N ? n : k;
    float *t = malloc((size_t)(m * n) * sizeof(float));
    float *bgacc = malloc((size_t)m * sizeof(float));
    if (!t || !bgacc) {
        free(t);
        free(bgacc);
        return cudaErrorMemoryAllocation;
    }
    cudaError_t err = cudaSuccess;
    for (int64_t b = 0; b < p->batch && err == cudaSuccess; b++) {
        const char *ab = (const char *)j->A + (size_t)(b * p->sa) * esa;
        const char *bb = (const char *)j->B + (size_t)(b * p->sb) * esa;
        if (k == 0) {
            memset(t, 0, (size_t)(m * n) * sizeof(float));
        } else {
            const float *a32 = (const float *)ab, *b32 = (const float *)bb;
            float *wa = NULL, *wb = NULL;
            int64_t lda = p->lda, ldb = p->ldb;
            if (widen_in) {
                wa = widen(ab, p->ta, arows, acols, p->lda, tf32);
                wb = widen(bb, p->tb, brows, bcols, p->ldb, tf32);
                if (!wa || !wb) {
                    free(wa);
                    free(wb);
                    err = cudaErrorMemoryAllocation;
                    break;
                }
                a32 = wa, b32 = wb, lda = arows, ldb = brows;
            }
            /* fp32 products accumulated in fp32 (CUBLAS_COMPUTE_32F: "compute
             * and intermediate storage precisions of at least 32 bits"). */
            cblas_sgemm(CblasColMajor, p->transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                        p->transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, (blasint)m,
                        (blasint)n, (blasint)k, 1.0f, a32, (blasint)(lda > 0 ? lda : 1), b32,
                        (blasint)(ldb > 0 ? ldb : 1), 0.0f, t, (blasint)m);
            free(wa);
            free(wb);
        }
        const void *cb = (const char *)j->C + (size_t)(b * p->sc) * esc;
        void *db = (char *)j->D + (size_t)(b * p->sd) * esc;
        size_t esb = zs_emu_lt_type_size(p->tbias), esx = zs_emu_lt_type_size(p->taux);
        const void *biasb =
            p->ep_bias ? (const char *)p->bias + (size_t)(b * p->bias_stride) * esb : NULL;
        void *bgradb =
            p->ep_bgrad == 'D' ? (char *)p->bias + (size_t)(b * p->bias_stride) * esb : NULL;
        void *auxb = p->eaux ? (char *)p->aux + (size_t)(b * p->aux_stride) * esx : NULL;
        for (int64_t r = 0; r < m && bgradb; r++)
            bgacc[r] = 0.0f;
        for (int64_t c = 0; c < n; c++)
            for (int64_t r = 0; r < m; r++) {
                float v = alpha * t[r + c * m];
                /* beta == 0: C is not read at all, so NaN/garbage in C (or
                 * uninitialised D used as C) never reaches D. cuBLAS docs,
                 * cublasLtMatmul: C is an input only scaled by beta; BLAS's
                 * convention "when beta is zero, C need not be set". */
                if (read_c)
                    v += beta * load_c(cb, p->tc, r + c * p->ldc);
                /* The epilogue works on "the results", i.e. on
                 * alpha*op(A)op(B) + beta*C (nvmath-python's matmul, which
                 * wraps cublasLtMatmul, documents the whole as
                 * F(alpha a @ b + beta c), F the epilog), in fp32 (compute
                 * type), before D's rounding. BIAS: bias[r] (row r of D,
                 * broadcast over columns) "added before applying final
                 * postprocessing". */
                if (biasb)
                    v += load_any(biasb, p->tbias, r);
                /* GELU_AUX(_BIAS): aux gets "GELU input", i.e. the value
                 * after the bias, rounded to the aux type; aux element
                 * (r, c) at r + c * EPILOGUE_AUX_LD. GELU itself uses the
                 * unrounded fp32 value (HOSTILE: not specified either way;
                 * this way a 16-bit aux differs from what was activated). */
                if (p->ep_aux_out)
                    store_d(auxb, p->taux, r + c * p->aux_ld, v);
                if (p->ep_gelu)
                    v = gelu_f(v, j->gelu_erf);
                /* DGELU(_BGRAD): "Apply GELU gradient to matmul output":
                 * v * GELU'(aux), aux being the GELU input the forward pass
                 * stored (EPILOGUE_AUX_POINTER: "Input of GELU input matrix
                 * for backward pass"). */
                if (p->ep_dgelu)
                    v *= dgelu_f(load_any(auxb, p->taux, r + c * p->aux_ld), j->gelu_erf);
                /* DGELU_BGRAD's bias gradient: the bias that GELU_AUX_BIAS
                 * added before GELU has gradient sum over columns of the
                 * GELU gradient (length m, D's rows, as BIAS_POINTER's
                 * "Bias vector length must match matrix D rows count").
                 * The docs' "Apply independently" does not say otherwise.
                 * HOSTILE: summed from the fp32 values before D's rounding,
                 * in fp32, column order, rounded once to the bias type. */
                if (bgradb)
                    bgacc[r] += v;
                store_d(db, p->tc, r + c * p->ldd, v);
            }
        for (int64_t r = 0; r < m && bgradb; r++)
            store_d(bgradb, p->tbias, r, bgacc[r]);
    }
    free(t);
    free(bgacc);
    return err;
}

static int is_aligned(const void *ptr, uint32_t align)
{
    return align <= 1 || (uintptr_t)ptr % align == 0;
}

/* A pointer that is not device memory of the handle's device: on a GPU the
 * kernel would fault asynchronously (cudaErrorIllegalAddress, sticky for the
 * context), or worse read another allocation. cuBLASLt does not check it and
 * documents no status for it, so there is no error code to return; the
 * emulator stops with a diagnostic naming the matrix instead, so it can
 * never pass silently. */
static void need_dev(const char *what, const void *ptr, size_t bytes, int device)
{
    int d = zs_emu_dev_ptr(ptr, bytes);
    if (d != device)
        zs_emu_fatal("cublasLtMatmul",
                     "%s = %p (%zu bytes) is not inside one live device allocation of device %d "
                     "(the handle's device)%s",
                     what, ptr, bytes, device, d >= 0 ? ": it is memory of another device" : "");
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    zs_emu_lt_problem p;
    cublasStatus_t st = zs_emu_lt_check(lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    const zs_emu_lt_desc *desc = (const zs_emu_lt_desc *)computeDesc;
    int device = lightHandle->device;
    size_t esa = zs_emu_lt_type_size(p.ta), esc = zs_emu_lt_type_size(p.tc);

    /* INVALID_VALUE "if parameters are in conflict or in an impossible
     * configuration" (cublasLt.h): NULL scalars or matrices. HOSTILE: C
     * must be given even when beta is 0 (the docs list it as an input with
     * no exception); only its contents go unread. */
    if (!alpha || !beta || !A || !B || !C || !D)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* An epilogue that needs the bias vector (BIAS, GELU_BIAS, GELU_AUX_BIAS)
     * or writes a bias gradient (DGELU_BGRAD, BGRADA, BGRADB) with
     * BIAS_POINTER NULL, or needs the aux matrix (GELU_AUX, GELU_AUX_BIAS,
     * DGELU, DGELU_BGRAD) with EPILOGUE_AUX_POINTER NULL (default NULL,
     * cublasLt.h): the docs give no status of its own; it is a configuration
     * the epilogue cannot run in: INVALID_VALUE. (A GPU would fault on
     * address 0.) */
    if (((p.ep_bias || p.ep_bgrad) && !p.bias) || ((p.ep_aux_out || p.ep_dgelu) && !p.aux))
        return CUBLAS_STATUS_INVALID_VALUE;

    /* The algorithm: NULL means "an implicit heuristics query with default
     * search preferences" (cuBLAS docs, cublasLtMatmul(), algo) - default
     * alignment 256 and no workspace - and that implicit query can find
     * nothing too (NOT_SUPPORTED: the implementation has no algorithm). */
    zs_emu_lt_algo algo_copy;
    const zs_emu_lt_algo *al = &algo_copy;
    if (!algo) {
        if (!heuristic_gives(p.compute))
            return CUBLAS_STATUS_NOT_SUPPORTED;
        cublasLtMatmulPreferenceOpaque_t defpref;
        cublasLtMatmulPreferenceInit(&defpref);
        cublasLtMatmulAlgo_t implicit;
        make_algo(&p, (const zs_emu_lt_pref *)&defpref, &implicit);
        memcpy(&algo_copy, &implicit, sizeof(algo_copy));
    } else {
        memcpy(&algo_copy, algo, sizeof(algo_copy));
    }
    if (al->magic != ZS_EMU_LT_ALGO_MAGIC) {
        /* not an algo a heuristic gave (cuBLASLt 13.1 answers a zeroed algo
         * with NOT_SUPPORTED too) */
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (al->problem != problem_hash(&p))
        return CUBLAS_STATUS_NOT_SUPPORTED; /* see problem_hash: HOSTILE */

    /* Alignment: the algo assumes each pointer is aligned as the preference
     * promised (see make_algo). A less aligned pointer is in conflict with
     * the configured algo: INVALID_VALUE (cublasLt.h's wording; a GPU might
     * instead fault with a misaligned address). */
    if (!is_aligned(A, al->align[0]) || !is_aligned(B, al->align[1]) ||
        !is_aligned(C, al->align[2]) || !is_aligned(D, al->align[3]))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* cublasLt.h: INVALID_VALUE "when workspaceSizeInBytes is less than
     * workspace required by configured algo"; cuBLAS docs, cublasLtMatmul():
     * "The workspace pointer must be aligned to at least a multiple of 256
     * bytes". */
    /* The bias and aux pointers against the alignment the algo assumed (see
     * make_algo): INVALID_VALUE as for A-D. */
    if (((p.ep_bias || p.ep_bgrad) && !is_aligned(p.bias, al->align_bias)) ||
        ((p.ep_aux_out || p.ep_dgelu) && !is_aligned(p.aux, al->align_aux)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (workspaceSizeInBytes < al->workspace)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (al->workspace && (!workspace || (uintptr_t)workspace % 256))
        return CUBLAS_STATUS_INVALID_VALUE;

    /* In place vs out of place (cuBLAS docs, cublasLtMatmul()): "in-place
     * matrix multiplication (C == D and Cdesc == Ddesc) and out-of-place
     * matrix multiplication (C != D, both matrices must have the same data
     * type, number of rows, number of columns, batch size, and memory
     * order)". We read Cdesc == Ddesc as equal contents. HOSTILE: C != D
     * that still shares an element with D is neither, so refused; D sharing
     * an element with A or B, or two of D's own columns/batches sharing one,
     * is a write racing reads or writes: refused too. */
    const zs_emu_lt_layout *Dl = (const zs_emu_lt_layout *)Ddesc;
    const zs_emu_lt_layout *Cl = Cdesc ? (const zs_emu_lt_layout *)Cdesc : Dl;
    mat mA = {(uintptr_t)A,
              p.transa == CUBLAS_OP_N ? p.m : p.k,
              p.transa == CUBLAS_OP_N ? p.k : p.m,
              p.lda,
              p.batch,
              p.sa,
              esa};
    mat mB = {(uintptr_t)B,
              p.transb == CUBLAS_OP_N ? p.k : p.n,
              p.transb == CUBLAS_OP_N ? p.n : p.k,
              p.ldb,
              p.batch,
              p.sb,
              esa};
    mat mC = {(uintptr_t)C, p.m, p.n, p.ldc, p.batch, p.sc, esc};
    mat mD = {(uintptr_t)D, p.m, p.n, p.ldd, p.batch, p.sd, esc};
    size_t bA = (size_t)p.ea * esa, bB = (size_t)p.eb * esa, bC = (size_t)p.ec * esc,
           bD = (size_t)p.ed * esc;
    if (C == D) {
        if (Cl->type != Dl->type || Cl->rows != Dl->rows || Cl->cols != Dl->cols ||
            Cl->ld != Dl->ld || Cl->order != Dl->order || Cl->batch != Dl->batch ||
            Cl->stride != Dl->stride)
            return CUBLAS_STATUS_INVALID_VALUE;
    } else if (ranges_meet(mC.base, bC, mD.base, bD) && mats_overlap(&mC, &mD)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((ranges_meet(mA.base, bA, mD.base, bD) && mats_overlap(&mA, &mD)) ||
        (ranges_meet(mB.base, bB, mD.base, bD) && mats_overlap(&mB, &mD)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (p.batch > 1 && p.sd < (p.n - 1) * p.ldd + p.m && mats_overlap(&mD, NULL))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* HOSTILE, as for D: an epilogue output (the GELU_AUX aux matrix, a bias
     * gradient) sharing an element with any other operand, or D sharing one
     * with an epilogue input (bias vector, DGELU's aux), is a write racing
     * other reads or writes: INVALID_VALUE. */
    {
        size_t esb = zs_emu_lt_type_size(p.tbias), esx = zs_emu_lt_type_size(p.taux);
        mat mBias = {(uintptr_t)p.bias, p.bias_len, 1, p.bias_len, p.batch, p.bias_stride, esb};
        mat mAux = {(uintptr_t)p.aux, p.m, p.n, p.aux_ld, p.batch, p.aux_stride, esx};
        size_t bBias = (size_t)p.ebias * esb, bAux = (size_t)p.eaux * esx;
        const mat *all[] = {&mA, &mB, &mC, &mD};
        const size_t alln[] = {bA, bB, bC, bD};
        int clash = 0;
        for (int i = 0; i < 4; i++) {
            if (p.ep_bgrad && ranges_meet(mBias.base, bBias, all[i]->base, alln[i]) &&
                mats_overlap(&mBias, all[i]))
                clash = 1;
            if (p.ep_aux_out && ranges_meet(mAux.base, bAux, all[i]->base, alln[i]) &&
                mats_overlap(&mAux, all[i]))
                clash = 1;
        }
        if (p.ep_bias && ranges_meet(mBias.base, bBias, mD.base, bD) && mats_overlap(&mBias, &mD))
            clash = 1;
        if (p.ep_dgelu && ranges_meet(mAux.base, bAux, mD.base, bD) && mats_overlap(&mAux, &mD))
            clash = 1;
        if (p.ebias && p.eaux && ranges_meet(mBias.base, bBias, mAux.base, bAux) &&
            (p.ep_bgrad || p.ep_aux_out) && mats_overlap(&mBias, &mAux))
            clash = 1;
        if (clash)
            return CUBLAS_STATUS_INVALID_VALUE;
    }

    /* Every pointer must be device memory of the handle's device, large
     * enough for its layout (see need_dev). */
    if (bA)
        need_dev("A", A, bA, device);
    if (bB)
        need_dev("B", B, bB, device);
    if (bC)
        need_dev("C", C, bC, device);
    if (bD)
        need_dev("D", D, bD, device);
    if (al->workspace)
        need_dev("workspace", workspace, (size_t)al->workspace, device);
    if (p.ebias)
        need_dev(p.ep_bgrad ? "bias gradient (CUBLASLT_MATMUL_DESC_BIAS_POINTER)"
                            : "bias (CUBLASLT_MATMUL_DESC_BIAS_POINTER)",
                 p.bias, (size_t)p.ebias * zs_emu_lt_type_size(p.tbias), device);
    if (p.eaux)
        need_dev("aux (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, with EPILOGUE_AUX_LD)", p.aux,
                 (size_t)p.eaux * zs_emu_lt_type_size(p.taux), device);

    zs_emu_lt_job *j = calloc(1, sizeof(*j));
    if (!j)
        return CUBLAS_STATUS_ALLOC_FAILED;
    j->p = p;
    j->A = A, j->B = B, j->C = C, j->D = D;
    j->ws = workspace;
    j->ws_bytes = (size_t)al->workspace;
    j->device = device;
    j->gelu_erf = (p.ep_gelu || p.ep_dgelu) ? gelu_form_erf() : 0;
    if (desc->pointer_mode == CUBLASLT_POINTER_MODE_DEVICE) {
        need_dev("alpha (CUBLASLT_POINTER_MODE_DEVICE)", alpha, 4, device);
        need_dev("beta (CUBLASLT_POINTER_MODE_DEVICE)", beta, 4, device);
        j->device_scalars = 1;
        j->alpha_dev = alpha;
        j->beta_dev = beta;
    } else {
        /* Pointer mode HOST with device pointers: on a GPU the host would
         * read device memory (a crash, or garbage with unified addressing
         * rules aside); stop with a diagnostic. */
        if (zs_emu_dev_ptr(alpha, 0) >= 0 || zs_emu_dev_ptr(beta, 0) >= 0)
            zs_emu_fatal("cublasLtMatmul",
                         "alpha/beta are device memory but CUBLASLT_MATMUL_DESC_POINTER_MODE is "
                         "CUBLASLT_POINTER_MODE_HOST (the default)");
        /* CUBLASLT_POINTER_MODE_HOST: alpha and beta are host values read
         * now; the caller may reuse that memory as soon as we return (cuBLAS
         * docs, "Scalar Parameters": with host pointers the call reads them
         * before returning). */
        memcpy(&j->alpha, alpha, 4);
        memcpy(&j->beta, beta, 4);
    }
    cudaError_t e = zs_emu_enqueue(stream, run_gemm, j, free);
    /* EXECUTION_FAILED "if cuda reported execution error from the device":
     * the stream or its context is already broken. */
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
