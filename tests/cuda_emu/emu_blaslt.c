/*
 * emu_blaslt.c - the emulated cuBLASLt's handle, status names and the three
 * descriptor kinds (matrix layout, matmul, preference) with their
 * Create/Init/Destroy/SetAttribute/GetAttribute, written from the cuBLAS
 * documentation's cuBLASLt API reference and the comments in NVIDIA's
 * cublasLt.h (CUDA 13), which is the declaration we compile against.
 *
 * Does not: validate a whole problem or run a GEMM (emu_blaslt_matmul.c).
 * Attributes we do not emulate are still accepted when their size is right
 * (so setting them is not an error) but any non-default value makes
 * cublasLtMatmul refuse with CUBLAS_STATUS_NOT_SUPPORTED rather than
 * silently ignore it.
 */
#include "emu_blaslt_internal.h"
#include "emu_internal.h"

#include <pthread.h>
#include <stdlib.h>

/* ---- handles ---------------------------------------------------------- */

/* Live handles. cublasLt.h: NOT_INITIALIZED "if cuBLASLt handle has not been
 * initialized"; keeping a registry lets us answer that for garbage and
 * destroyed handles without dereferencing them. */
#define ZS_EMU_LT_MAX_HANDLES 256
static pthread_mutex_t g_handles_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cublasLtContext *g_handles[ZS_EMU_LT_MAX_HANDLES];

int zs_emu_lt_handle_live(cublasLtHandle_t h)
{
    int live = 0;
    if (!h)
        return 0;
    pthread_mutex_lock(&g_handles_mu);
    for (int i = 0; i < ZS_EMU_LT_MAX_HANDLES; i++)
        if (g_handles[i] == h)
            live = 1;
    pthread_mutex_unlock(&g_handles_mu);
    return live;
}

/* cuBLAS docs, cublasLtCreate(): "The cuBLASLt library context is tied to the
 * current CUDA device. To use the library on multiple devices, one cuBLASLt
 * handle should be created for each device." We record that device; matmul
 * insists every pointer is memory of it. */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasLtContext *c = calloc(1, sizeof(*c));
    if (!c)
        return CUBLAS_STATUS_ALLOC_FAILED;
    c->magic = 0x4c74436f6e746578u;
    c->device = zs_emu_current_device();
    pthread_mutex_lock(&g_handles_mu);
    int slot = -1;
    for (int i = 0; i < ZS_EMU_LT_MAX_HANDLES && slot < 0; i++)
        if (!g_handles[i])
            slot = i;
    if (slot >= 0)
        g_handles[slot] = c;
    pthread_mutex_unlock(&g_handles_mu);
    if (slot < 0) {
        free(c);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    *lightHandle = c;
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLAS docs, cublasLtDestroy(): NOT_INITIALIZED if the handle was not
 * initialized; "the release of those resources by calling cublasLtDestroy()
 * will implicitly call cudaDeviceSynchronize()" - so we do, on the handle's
 * device (callers may rely on it: work of this handle is done afterwards).
 * Like the real one it is a CUDA call: not allowed from a host function. */
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    int found = 0;
    pthread_mutex_lock(&g_handles_mu);
    for (int i = 0; i < ZS_EMU_LT_MAX_HANDLES; i++)
        if (lightHandle && g_handles[i] == lightHandle) {
            g_handles[i] = NULL;
            found = 1;
        }
    pthread_mutex_unlock(&g_handles_mu);
    if (!found)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int cur = zs_emu_current_device();
    if (cur != lightHandle->device)
        cudaSetDevice(lightHandle->device);
    cudaDeviceSynchronize(); /* a sticky error stays for the caller's next call */
    if (cur != lightHandle->device)
        cudaSetDevice(cur);
    lightHandle->magic = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLAS docs, cublasGetStatusName()/cublasGetStatusString() (the Lt ones
 * return the same texts). */
const char *cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "error detected trying to check the license";
    }
    return "unknown error";
}

size_t cublasLtGetVersion(void)
{
    return CUBLAS_VERSION; /* cublas_api.h: cuBLASLt shares cuBLAS's version */
}

/* ---- attribute plumbing ----------------------------------------------- */

/* cublasLt.h, every *SetAttribute: INVALID_VALUE "if buf is NULL or
 * sizeInBytes doesn't match size of internal storage for selected
 * attribute". Every *GetAttribute: INVALID_VALUE "if sizeInBytes is 0 and
 * sizeWritten is NULL, or if sizeInBytes is non-zero and buf is NULL or
 * sizeInBytes doesn't match"; with sizeInBytes 0 it reports the size. */
static cublasStatus_t attr_set(void *field, size_t field_size, const void *buf, size_t size)
{
    if (!buf || size != field_size)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t attr_get(const void *field, size_t field_size, void *buf, size_t size,
                               size_t *written)
{
    if (size == 0) {
        if (!written)
            return CUBLAS_STATUS_INVALID_VALUE;
        *written = field_size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != field_size)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, field, size);
    if (written)
        *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

#define ATTR(field) &(field), sizeof(field)

/* ---- matrix layouts --------------------------------------------------- */

static zs_emu_lt_layout *layout_of(cublasLtMatrixLayout_t l)
{
    zs_emu_lt_layout *x = (zs_emu_lt_layout *)l;
    return x && x->magic == ZS_EMU_LT_LAYOUT_MAGIC ? x : NULL;
}

/* cublasLt.h, cublasLtMatrixLayoutInit: ALLOC_FAILED "if size of the
 * pre-allocated space is insufficient". ld is checked against rows when the
 * layout is used (cublasLtMatmul), as the LD attribute's doc describes a
 * requirement of use, and rows/ld may still be changed by SetAttribute. */
cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t matLayout, size_t size,
                                                 cudaDataType type, uint64_t rows, uint64_t cols,
                                                 int64_t ld)
{
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(zs_emu_lt_layout))
        return CUBLAS_STATUS_ALLOC_FAILED;
    zs_emu_lt_layout *x = (zs_emu_lt_layout *)matLayout;
    memset(matLayout, 0, size);
    x->magic = ZS_EMU_LT_LAYOUT_MAGIC;
    x->type = (uint32_t)type;
    x->order = CUBLASLT_ORDER_COL; /* cublasLt.h: ORDER "default: CUBLASLT_ORDER_COL" */
    x->rows = rows;
    x->cols = cols;
    x->ld = ld;
    x->batch = 1;  /* BATCH_COUNT "default: 1" */
    x->stride = 0; /* STRIDED_BATCH_OFFSET "default: 0" */
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatrixLayout_t l = malloc(sizeof(*l));
    if (!l)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasStatus_t st = cublasLtMatrixLayoutInit_internal(l, sizeof(*l), type, rows, cols, ld);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(l);
        return st;
    }
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    if (matLayout) {
        ((zs_emu_lt_layout *)matLayout)->magic = 0; /* a later use is refused */
        free(matLayout);
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t layout_attr(cublasLtMatrixLayout_t matLayout,
                                  cublasLtMatrixLayoutAttribute_t attr, void *out, const void *in,
                                  size_t size, size_t *written)
{
    zs_emu_lt_layout *x = layout_of(matLayout);
    if (!x)
        return CUBLAS_STATUS_INVALID_VALUE;
    void *f;
    size_t fs;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
        f = &x->type, fs = sizeof(x->type);
        break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
        f = &x->order, fs = sizeof(x->order);
        break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
        f = &x->rows, fs = sizeof(x->rows);
        break;
    case CUBLASLT_MATRIX_LAYOUT_COLS:
        f = &x->cols, fs = sizeof(x->cols);
        break;
    case CUBLASLT_MATRIX_LAYOUT_LD:
        f = &x->ld, fs = sizeof(x->ld);
        break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        f = &x->batch, fs = sizeof(x->batch);
        break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        f = &x->stride, fs = sizeof(x->stride);
        break;
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
        f = &x->plane_offset, fs = sizeof(x->plane_offset);
        break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE:
        f = &x->batch_mode, fs = sizeof(x->batch_mode);
        break;
    default:
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return in ? attr_set(f, fs, in, size) : attr_get(f, fs, out, size, written);
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    if (!buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    return layout_attr(matLayout, attr, NULL, buf, sizeInBytes, NULL);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                size_t sizeInBytes, size_t *sizeWritten)
{
    return layout_attr(matLayout, attr, buf, NULL, sizeInBytes, sizeWritten);
}

/* ---- matmul descriptors ----------------------------------------------- */

static zs_emu_lt_desc *desc_of(cublasLtMatmulDesc_t d)
{
    zs_emu_lt_desc *x = (zs_emu_lt_desc *)d;
    return x && x->magic == ZS_EMU_LT_DESC_MAGIC ? x : NULL;
}

/* Defaults from cublasLt.h's cublasLtMatmulDescAttributes_t: pointer mode
 * HOST, TRANSA/B/C N, fill mode FULL, epilogue DEFAULT. */
cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t matmulDesc, size_t size,
                                               cublasComputeType_t computeType,
                                               cudaDataType_t scaleType)
{
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(zs_emu_lt_desc))
        return CUBLAS_STATUS_ALLOC_FAILED;
    memset(matmulDesc, 0, size);
    zs_emu_lt_desc *x = (zs_emu_lt_desc *)matmulDesc;
    x->magic = ZS_EMU_LT_DESC_MAGIC;
    x->compute = computeType;
    x->scale = scaleType;
    x->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    x->transa = x->transb = x->transc = CUBLAS_OP_N;
    x->fill_mode = CUBLAS_FILL_MODE_FULL;
    x->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    /* cublasLt.h: BIAS_POINTER and EPILOGUE_AUX_POINTER "default: NULL",
     * BIAS_BATCH_STRIDE, EPILOGUE_AUX_LD and EPILOGUE_AUX_BATCH_STRIDE
     * "default: 0" (memset), BIAS_DATA_TYPE and EPILOGUE_AUX_DATA_TYPE
     * "int32_t based on cudaDataType, default: -1". */
    x->bias_type = -1;
    x->aux_type = -1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulDesc_t d = malloc(sizeof(*d));
    if (!d)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasStatus_t st = cublasLtMatmulDescInit_internal(d, sizeof(*d), computeType, scaleType);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(d);
        return st;
    }
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    if (matmulDesc) {
        ((zs_emu_lt_desc *)matmulDesc)->magic = 0;
        free(matmulDesc);
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t desc_attr(cublasLtMatmulDesc_t matmulDesc,
                                cublasLtMatmulDescAttributes_t attr, void *out, const void *in,
                                size_t size, size_t *written)
{
    zs_emu_lt_desc *x = desc_of(matmulDesc);
    if (!x)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
        return in ? attr_set(ATTR(x->compute), in, size)
                  : attr_get(ATTR(x->compute), out, size, written);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        return in ? attr_set(ATTR(x->scale), in, size)
                  : attr_get(ATTR(x->scale), out, size, written);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        return in ? attr_set(ATTR(x->pointer_mode), in, size)
                  : attr_get(ATTR(x->pointer_mode), out, size, written);
    case CUBLASLT_MATMUL_DESC_TRANSA:
        return in ? attr_set(ATTR(x->transa), in, size)
                  : attr_get(ATTR(x->transa), out, size, written);
    case CUBLASLT_MATMUL_DESC_TRANSB:
        return in ? attr_set(ATTR(x->transb), in, size)
                  : attr_get(ATTR(x->transb), out, size, written);
    case CUBLASLT_MATMUL_DESC_TRANSC:
        return in ? attr_set(ATTR(x->transc), in, size)
                  : attr_get(ATTR(x->transc), out, size, written);
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
        return in ? attr_set(ATTR(x->fill_mode), in, size)
                  : attr_get(ATTR(x->fill_mode), out, size, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        return in ? attr_set(ATTR(x->epilogue), in, size)
                  : attr_get(ATTR(x->epilogue), out, size, written);
    /* Epilogue attributes, sizes from cublasLt.h's
     * cublasLtMatmulDescAttributes_t (cuBLAS docs, same section):
     * BIAS_POINTER "const void *" / "void *"; BIAS_BATCH_STRIDE "int64_t";
     * EPILOGUE_AUX_POINTER "void *" / "const void *"; EPILOGUE_AUX_LD
     * "int64_t"; EPILOGUE_AUX_BATCH_STRIDE "int64_t"; EPILOGUE_AUX_DATA_TYPE
     * and BIAS_DATA_TYPE "int32_t based on cudaDataType". Any other size is
     * INVALID_VALUE (attr_set/attr_get). Their values are checked when the
     * descriptor is used (emu_blaslt_matmul.c), as the docs describe them as
     * requirements of the matmul. */
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return in ? attr_set(ATTR(x->bias), in, size) : attr_get(ATTR(x->bias), out, size, written);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
        return in ? attr_set(ATTR(x->bias_stride), in, size)
                  : attr_get(ATTR(x->bias_stride), out, size, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return in ? attr_set(ATTR(x->aux), in, size) : attr_get(ATTR(x->aux), out, size, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        return in ? attr_set(ATTR(x->aux_ld), in, size)
                  : attr_get(ATTR(x->aux_ld), out, size, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
        return in ? attr_set(ATTR(x->aux_stride), in, size)
                  : attr_get(ATTR(x->aux_stride), out, size, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        return in ? attr_set(ATTR(x->aux_type), in, size)
                  : attr_get(ATTR(x->aux_type), out, size, written);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return in ? attr_set(ATTR(x->bias_type), in, size)
                  : attr_get(ATTR(x->bias_type), out, size, written);
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
        /* a performance hint only: accepted and has no effect on results */
        return in ? attr_set(ATTR(x->sm_count_target), in, size)
                  : attr_get(ATTR(x->sm_count_target), out, size, written);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
        /* cublasLt.h: FP8 only; int8_t */
        return in ? attr_set(ATTR(x->fast_accum), in, size)
                  : attr_get(ATTR(x->fast_accum), out, size, written);
    default: {
        /* Pointers and other attributes of epilogues/scaling we do not
         * emulate: setting one to a nonzero value marks the descriptor, and
         * cublasLtMatmul then refuses it (NOT_SUPPORTED) instead of ignoring
         * it. All-zero bytes is every such attribute's default (NULL
         * pointer, 0 stride/ld, mode 0), so it clears the mark. */
        if (!in)
            return CUBLAS_STATUS_INVALID_VALUE;
        if (!size || size > 8)
            return CUBLAS_STATUS_INVALID_VALUE;
        if ((int)attr < 0 || (int)attr >= 64)
            return CUBLAS_STATUS_INVALID_VALUE;
        int nonzero = 0;
        for (size_t i = 0; i < size; i++)
            nonzero |= ((const unsigned char *)in)[i] != 0;
        if (nonzero)
            x->other_set |= 1ull << attr;
        else
            x->other_set &= ~(1ull << attr);
        return CUBLAS_STATUS_SUCCESS;
    }
    }
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes)
{
    if (!buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    return desc_attr(matmulDesc, attr, NULL, buf, sizeInBytes, NULL);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void *buf,
                                              size_t sizeInBytes, size_t *sizeWritten)
{
    return desc_attr(matmulDesc, attr, buf, NULL, sizeInBytes, sizeWritten);
}

/* ---- preferences ------------------------------------------------------ */

/* Defaults from cublasLt.h's cublasLtMatmulPreferenceAttributes_t: search
 * BEST_FIT, MAX_WORKSPACE_BYTES 0 ("no workspace allowed"), every
 * MIN_ALIGNMENT_*_BYTES 256, MAX_WAVES_COUNT 0, IMPL_MASK all. */
cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(zs_emu_lt_pref))
        return CUBLAS_STATUS_ALLOC_FAILED;
    memset(pref, 0, size);
    zs_emu_lt_pref *x = (zs_emu_lt_pref *)pref;
    x->magic = ZS_EMU_LT_PREF_MAGIC;
    x->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    x->max_workspace = 0;
    x->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (int i = 0; i < 4; i++)
        x->align[i] = 256;
    x->impl_mask = ~0ull;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreference_t p = malloc(sizeof(*p));
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasLtMatmulPreferenceInit_internal(p, sizeof(*p));
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    if (pref) {
        ((zs_emu_lt_pref *)pref)->magic = 0;
        free(pref);
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t pref_attr(cublasLtMatmulPreference_t pref,
                                cublasLtMatmulPreferenceAttributes_t attr, void *out,
                                const void *in, size_t size, size_t *written)
{
    zs_emu_lt_pref *x = (zs_emu_lt_pref *)pref;
    if (!x || x->magic != ZS_EMU_LT_PREF_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    void *f;
    size_t fs;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        f = &x->search_mode, fs = sizeof(x->search_mode);
        break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        f = &x->max_workspace, fs = sizeof(x->max_workspace);
        break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
        f = &x->reduction_mask, fs = sizeof(x->reduction_mask);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        f = &x->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], fs = sizeof(uint32_t);
        break;
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
        f = &x->max_waves, fs = sizeof(x->max_waves);
        break;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
        f = &x->impl_mask, fs = sizeof(x->impl_mask);
        break;
    default:
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return in ? attr_set(f, fs, in, size) : attr_get(f, fs, out, size, written);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    if (!buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    return pref_attr(pref, attr, NULL, buf, sizeInBytes, NULL);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void *buf, size_t sizeInBytes,
                                                    size_t *sizeWritten)
{
    return pref_attr(pref, attr, buf, NULL, sizeInBytes, sizeWritten);
}
