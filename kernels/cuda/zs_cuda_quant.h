/*
 * zs_cuda_quant.h - ZeRO++'s block quantization on CUDA device memory: the
 * twins of zs_quant_pack and zs_quant_unpack (qwZ) and of a sum of
 * zs_quant_unpack_add calls (qgZ) (kernels/zs_quant.h), writing the same
 * bytes (the record layout of zs_quant.h, the formulas of zs_quant_math.h).
 *
 * Plain C API, as zs_cuda_vec.h: a stream is a `void *` holding a
 * cudaStream_t; each launcher checks its arguments, enqueues its kernel and
 * returns ZS_OK or a zs status with err filled. Pointers are device memory
 * of the current device; records are 4-byte aligned.
 *
 * What it does not do: synchronise, allocate, communicate.
 */
#ifndef ZS_CUDA_QUANT_H
#define ZS_CUDA_QUANT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "zs_dtype.h"
#include "zs_status.h"

/* rec (zs_quant_record_bytes(n) bytes) = the record of src (n elements of
 * dt). One CUDA block per quantization block: a shared-memory max (exact in
 * any order), then the codes. n == 0 enqueues nothing. */
int zs_cuda_quant_pack(void *stream, void *rec, const void *src, zs_dtype_t dt, size_t n,
                       zs_err_t *err);

/* dst (nrec * n elements of dt) = the unpacked values of nrec consecutive
 * records of n elements (zs_quant_unpack). */
int zs_cuda_quant_unpack(void *stream, void *dst, zs_dtype_t dt, const void *rec, size_t n,
                         size_t nrec, zs_err_t *err);

/* qgZ's dequantize-and-sum: for g < ngroup and j < n,
 *   dst[g * n + j] = ((0 + deq(rec[0][g])[j]) + deq(rec[1][g])[j]) + ...
 * over the nsrc sources in order, in fp32, where rec[s][g] is the record
 * of n elements at index s * ngroup + g (records zs_quant_record_bytes(n)
 * apart). Bitwise the CPU's memset(0) then zs_quant_unpack_add of each
 * source in order. nsrc == 0 writes zeros. */
int zs_cuda_quant_unpack_sum(void *stream, float *dst, const void *rec, size_t n, size_t nsrc,
                             size_t ngroup, zs_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
