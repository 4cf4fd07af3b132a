/*
 * zs_cast.c - fp32 <-> bf16 / fp16 conversions on the CPU (see zs_cast.h).
 *
 * What it does: scalar reference conversions (their formulas are in zs_math.h,
 * shared with the CUDA kernels), and zs_cast() over arrays with
 * three paths chosen at run time from CPU features (__builtin_cpu_supports):
 *
 *   avx512   AVX-512F/BW: 16 elements per step (vcvtps2ph / vcvtph2ps for fp16)
 *   avx2     AVX2 + F16C: 8 elements per step
 *   portable the scalar functions in a loop
 *
 * The SIMD functions carry __attribute__((target(...))), so the library is
 * built without -mavx* flags and runs on any x86-64. Every path is bitwise
 * equal to the scalar functions (tests/test_cast.c checks all 2^16 inputs and
 * random fp32 sweeps on each path):
 *
 *   fp32 -> bf16  round to nearest even by the integer trick
 *                 (u + 0x7FFF + ((u >> 16) & 1)) >> 16; carries into the
 *                 exponent give +-Inf on overflow. NaN -> (u >> 16) | 0x0040
 *                 (quiet, sign and top payload bits kept; this is also what
 *                 vcvtneps2bf16 returns).
 *   bf16 -> fp32  h << 16, exact (a signalling NaN stays signalling).
 *   fp32 -> fp16  RNE with exact subnormals; >= 65520 -> Inf. NaN ->
 *                 sign | 0x7E00 | (mantissa >> 13), which is what F16C's
 *                 vcvtps2ph returns (quiet bit set, payload truncated).
 *   fp16 -> fp32  exact, subnormals normalised; NaN is quieted (bit 22 set)
 *                 with its payload kept, as vcvtph2ps does.
 *   fp16 <-> bf16 through fp32 (exact widening, then one rounding).
 *
 * What it does not do: threading (callers split arrays), other float formats,
 * or anything that depends on MXCSR (the integer paths ignore it; F16C uses an
 * explicit rounding immediate). Tails shorter than a vector use the scalars.
 */
#include "zs_cast.h"
#include "zs_math.h"
#include "zs_simd.h"
#include "zs_simd_cvt.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#include "zs_status.h"

enum { PATH_PORTABLE = ZS_SIMD_PORTABLE, PATH_AVX2 = ZS_SIMD_AVX2, PATH_AVX512 = ZS_SIMD_AVX512 };

/* ---------------------------------------------------------------- scalars */

/* The formulas live in zs_math.h (shared with the CUDA kernels); these are
 * their exported names. */

/* fp32 -> bf16, round to nearest even; NaN quiet with sign kept; overflow -> Inf. */
uint16_t zs_f32_to_bf16(float x)
{
    return zs_math_f32_to_bf16(x);
}

/* bf16 -> fp32, exact (the bf16 bits become the top half). */
float zs_bf16_to_f32(uint16_t h)
{
    return zs_math_bf16_to_f32(h);
}

/* fp32 -> fp16, round to nearest even, exact subnormals, >= 65520 -> Inf,
 * NaN -> quiet NaN with sign and the top 9 payload bits kept. */
uint16_t zs_f32_to_f16(float x)
{
    return zs_math_f32_to_f16(x);
}

/* fp16 -> fp32, exact; NaN is quieted (payload kept) as vcvtph2ps does. */
float zs_f16_to_f32(uint16_t h)
{
    return zs_math_f16_to_f32(h);
}

/* --------------------------------------------------------------- portable */

/* Element conversion through fp32; the one definition every tail uses. */
static inline void cast_one(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t i)
{
    zs_math_store(dst, ddt, i, zs_math_load(src, sdt, i));
}

static void cast_range(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t i,
                       size_t n)
{
    for (; i < n; i++)
        cast_one(dst, ddt, src, sdt, i);
}

/* ---------------------------------------------------------------- AVX-512 */

#define T512 __attribute__((target("avx512f,avx512bw")))

T512 static void cast_avx512(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        zs__store16(dst, ddt, i, zs__load16(src, sdt, i));
    cast_range(dst, ddt, src, sdt, i, n);
}

/* ------------------------------------------------------------ AVX2 + F16C */

#define T256 __attribute__((target("avx2,f16c")))

T256 static void cast_avx2(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        zs__store8(dst, ddt, i, zs__load8(src, sdt, i));
    cast_range(dst, ddt, src, sdt, i, n);
}

/* --------------------------------------------------------------- dispatch */

static zs_simd_choice_t forced_path = ZS_SIMD_AUTO;

static int current_path(void)
{
    return zs__simd_path(&forced_path);
}

/* See zs_cast.h: any pair of F32/BF16/F16, bitwise equal on every path. */
void zs_cast(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n)
{
    if (n == 0)
        return;
    if (ddt == sdt) {
        memcpy(dst, src, n * zs_dtype_size(sdt));
        return;
    }
    switch (current_path()) {
    case PATH_AVX512:
        cast_avx512(dst, ddt, src, sdt, n);
        break;
    case PATH_AVX2:
        cast_avx2(dst, ddt, src, sdt, n);
        break;
    default:
        cast_range(dst, ddt, src, sdt, 0, n);
        break;
    }
}

/* See zs_cast.h: 1 forces the scalar loop, 0 returns to automatic. */
void zs_cast_force_portable(int on)
{
    atomic_store_explicit(&forced_path, on ? PATH_PORTABLE : ZS_SIMD_AUTO, memory_order_relaxed);
}

/* See zs_cast.h. */
const char *zs_cast_path(void)
{
    return zs__simd_name(current_path());
}

/* See zs_cast.h: ZS_OK, or ZS_ERR_INVALID for an unknown name or missing CPU feature. */
int zs_cast_force_path(const char *name)
{
    return zs__simd_force(&forced_path, name);
}
