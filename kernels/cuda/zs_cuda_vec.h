/*
 * zs_cuda_vec.h - the engine's vector ops on CUDA device memory: casts,
 * accumulate, scale, sum of squares with a non-finite flag, fused AdamW.
 *
 * Plain C API (usable from C files; no CUDA types in the signatures): a
 * stream is a `void *` holding a cudaStream_t (NULL = the legacy default
 * stream). Every launcher checks its arguments, enqueues its kernel(s) on the
 * stream, checks cudaGetLastError and returns ZS_OK or a negative zs status
 * with err filled: the kernel name, file:line, the CUDA error string and a
 * hint. A launcher returns when the work is enqueued; errors that happen
 * while the kernel runs surface at the next synchronisation, as with any
 * CUDA launch. n == 0 enqueues nothing and returns ZS_OK; n above
 * SIZE_MAX / 4 is ZS_ERR_RANGE (as on the CPU device).
 *
 * Semantics are those of the CPU twins in worker/dev/zs_dev.h (zs_dev_cast,
 * ...), element by element with the formulas of kernels/zs_math.h, so for
 * cast, accumulate, scale and adamw a GPU result is bitwise equal to the CPU
 * one. sumsq is a deterministic fixed-shape reduction (same bits on every run
 * on the same GPU model and launch shape, whatever the timing), equal to the
 * CPU sum up to fp64 summation order.
 *
 * Pointers: all data pointers are device memory of the current device
 * (cudaSetDevice), which must be the stream's, or pinned host memory
 * (cudaHostAlloc: device-accessible under unified addressing, slowly); hp
 * and st are host memory (read before the call returns). Arrays must not overlap unless said so.
 */
#ifndef ZS_CUDA_VEC_H
#define ZS_CUDA_VEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* our C headers declare C functions (zs_err_set, ...) */
#endif

#include "zs_adam.h"
#include "zs_dtype.h"
#include "zs_status.h"

/* dst (ddt) = src (sdt), n elements; any pair of F32/BF16/F16, rounding to
 * nearest even (zs_cast.h); same dtype is a device-to-device copy. dst and
 * src must not overlap (refused with ZS_ERR_INVALID, as on the CPU). */
int zs_cuda_cast(void *stream, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n,
                 zs_err_t *err);

/* zs_dev_round (zs_dev.h) on device memory: h (dt, bf16 or fp16) = x
 * rounded, x = h widened, in one launch; bitwise the two casts. */
int zs_cuda_round(void *stream, float *x, void *h, zs_dtype_t dt, size_t n, zs_err_t *err);

/* zs_dev_cast_rows (zs_dev.h) on device memory: row i of dst (w fp32) =
 * row idx[i] - lo of src (sdt, exact), for the ids in [lo, hi). One
 * launch for all n rows. */
int zs_cuda_cast_rows(void *stream, float *dst, const void *src, zs_dtype_t sdt, const int32_t *idx,
                      size_t n, int32_t lo, int32_t hi, size_t w, zs_err_t *err);

/* dst (ddt) += src (sdt): the fp32 sum of the widened values, rounded once
 * to ddt. dst == src is allowed (x += x, as on the CPU device); any other
 * overlap is the caller's problem. */
int zs_cuda_accumulate(void *stream, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                       size_t n, zs_err_t *err);

/* x (dt) *= alpha: fp32 product of the widened value, rounded once to dt. */
int zs_cuda_scale(void *stream, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err);

/* acc: 2 doubles of device memory. acc[0] += sum of x^2 (each square exact
 * in fp64, summed in fp64 by a fixed-shape two-pass reduction: same bits
 * every run); acc[1] = 1.0 if any element is inf or NaN, else unchanged.
 * Uses a small stream-ordered temporary (cudaMallocAsync / cudaFreeAsync,
 * 12 KiB) from the device's default memory pool. */
int zs_cuda_sumsq(void *stream, const void *x, zs_dtype_t dt, size_t n, double *acc, zs_err_t *err);

/* zs_adam_update (zs_adam.h) on device memory: p, m, v fp32 [n] updated in
 * place; grad [n] of gdt; out [n] of odt receives p rounded (out NULL or
 * odt ZS_DTYPE_NONE: no output). The per-step scalars are computed on the
 * host exactly as the CPU does (zs_math_adam_init), so results are bitwise
 * the CPU's. */
int zs_cuda_adamw(void *stream, const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p,
                  float *m, float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t odt,
                  size_t n, zs_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
