/*
 * zs_quant.h - qwZ's block quantization on the CPU: a partition of n
 * parameters (fp32, bf16 or fp16) packed into a record of int8 codes and
 * fp32 block scales, and records unpacked back into parameters. The
 * formulas (and the error bound, and the handling of inf/NaN) are in
 * zs_quant_math.h; the CUDA twin (cuda/zs_cuda_quant.h) writes the same
 * bytes.
 *
 * Record of n elements (zs_quant_record_bytes(n) bytes, a multiple of 4):
 *   fp32 scale[nblk]     nblk = ceil(n / ZS_QUANT_BLOCK)
 *   int8 code[n]
 *   zero padding up to a multiple of 4 bytes
 * so a record is 4-byte aligned wherever an array of records is, and about
 * n + n/1024 bytes: 0.50 of bf16, 0.25 of fp32.
 *
 * What it does not do: threads, allocation, communication.
 */
#ifndef ZS_QUANT_H
#define ZS_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "zs_dtype.h"
#include "zs_quant_math.h"

/* Blocks of a record of n elements. */
static inline size_t zs_quant_blocks(size_t n)
{
    return (n + ZS_QUANT_BLOCK - 1) / ZS_QUANT_BLOCK;
}

/* Bytes of a record of n elements (see the layout above). */
static inline size_t zs_quant_record_bytes(size_t n)
{
    return (zs_quant_blocks(n) * 4 + n + 3) & ~(size_t)3;
}

/* rec (zs_quant_record_bytes(n) bytes, 4-aligned) = the record of src (n
 * elements of dt: F32, BF16 or F16). Padding bytes are written as zero. */
void zs_quant_pack(void *rec, const void *src, zs_dtype_t dt, size_t n);

/* dst (nrec * n elements of dt) = the unpacked values of nrec consecutive
 * records of n elements each (record r at rec + r * record_bytes(n) gives
 * dst + r * n), each value rounded to dt (nearest even). */
void zs_quant_unpack(void *dst, zs_dtype_t dt, const void *rec, size_t n, size_t nrec);

/* acc[i] += the unpacked value of element i of one record of n elements,
 * in fp32 (qgZ's sums; no CUDA twin: qgZ runs on MPI workers only). */
void zs_quant_unpack_add(float *acc, const void *rec, size_t n);

#endif
