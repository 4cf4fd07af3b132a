/*
 * zs_cast.h - conversions between fp32 and the 16-bit formats (CPU).
 *
 * Contract: fp32 -> bf16/fp16 rounds to nearest, ties to even; NaN stays NaN
 * (quiet, sign kept), +-Inf stays +-Inf, values beyond the target's range
 * become +-Inf (fp16 above 65504 after rounding), fp16 subnormals are produced
 * and read exactly. bf16/fp16 -> fp32 is exact. Results are bitwise the same
 * on every code path (scalar, F16C/AVX2, AVX-512); the SIMD path is chosen at
 * run time from CPU features.
 */
#ifndef ZS_CAST_H
#define ZS_CAST_H

#include <stddef.h>
#include <stdint.h>

#include "zs_dtype.h"

/* Scalar conversions (the reference every path matches bitwise). */
uint16_t zs_f32_to_bf16(float x);
float zs_bf16_to_f32(uint16_t h);
uint16_t zs_f32_to_f16(float x);
float zs_f16_to_f32(uint16_t h);

/* Convert n elements from src (dtype sdt) to dst (dtype ddt). Any pair of
 * F32/BF16/F16 is allowed (same dtype = memcpy). src and dst must not
 * overlap. Single-threaded. */
void zs_cast(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n);

/* Force the portable scalar path (1) or let CPU features decide (0). For
 * tests and benchmarks; not thread-safe with concurrent zs_cast calls. */
void zs_cast_force_portable(int on);

/* Which path zs_cast takes: "avx512", "avx2" or "portable". */
const char *zs_cast_path(void);

/* Force a path by name ("avx512", "avx2", "portable") or NULL for automatic.
 * Returns ZS_OK or ZS_ERR_INVALID if the name is unknown or the CPU lacks it.
 * Same caveats as zs_cast_force_portable; lets tests reach every path. */
int zs_cast_force_path(const char *name);

#endif
