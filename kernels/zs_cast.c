/*
 * zs_cast.c - fp32 <-> bf16 / fp16 conversions on the CPU (see zs_cast.h).
 *
 * What it does: scalar reference conversions, and zs_cast() over arrays with
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
#include "zs_simd.h"
#include "zs_simd_cvt.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#include "zs_status.h"

enum { PATH_PORTABLE = ZS_SIMD_PORTABLE, PATH_AVX2 = ZS_SIMD_AVX2, PATH_AVX512 = ZS_SIMD_AVX512 };

static inline uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---------------------------------------------------------------- scalars */

/* fp32 -> bf16, round to nearest even; NaN quiet with sign kept; overflow -> Inf. */
uint16_t zs_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact (the bf16 bits become the top half). */
float zs_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

/* fp32 -> fp16, round to nearest even, exact subnormals, >= 65520 -> Inf,
 * NaN -> quiet NaN with sign and the top 9 payload bits kept. */
uint16_t zs_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;

    if (a > 0x7F800000u) /* NaN */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 (and Inf): rounds past 65504 */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* >= 2^-14: normal fp16, rebias 127 -> 15 */
        uint32_t r = a - (112u << 23);
        return (uint16_t)(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
    }
    /* Subnormal fp16 (or zero): value = m * 2^(e-150), unit = 2^-24, so the
     * result is m >> (126 - e) rounded to nearest even. Below 2^-25 it is 0;
     * exactly 2^-25 is a tie that goes to the even 0. */
    uint32_t e = a >> 23;
    if (e < 102)
        return sign;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u)))
        r++; /* may carry to 0x400, the smallest normal: the right encoding */
    return (uint16_t)(sign | r);
}

/* fp16 -> fp32, exact; NaN is quieted (payload kept) as vcvtph2ps does. */
float zs_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;

    if (e == 0x1F) /* Inf or NaN */
        return bits_f32(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));
    if (e != 0)
        return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0)
        return bits_f32(sign);
    /* Subnormal: m * 2^-24; normalise so the leading 1 sits at bit 10. */
    uint32_t exp = 113; /* biased fp32 exponent of 2^-14 */
    while (!(m & 0x400u)) {
        m <<= 1;
        exp--;
    }
    return bits_f32(sign | (exp << 23) | ((m & 0x3FFu) << 13));
}

/* --------------------------------------------------------------- portable */

/* Element conversion through fp32; the one definition every tail uses. */
static inline void cast_one(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t i)
{
    float x;
    switch (sdt) {
    case ZS_DTYPE_F32:
        x = ((const float *)src)[i];
        break;
    case ZS_DTYPE_BF16:
        x = zs_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    default:
        x = zs_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    }
    switch (ddt) {
    case ZS_DTYPE_F32:
        ((float *)dst)[i] = x;
        break;
    case ZS_DTYPE_BF16:
        ((uint16_t *)dst)[i] = zs_f32_to_bf16(x);
        break;
    default:
        ((uint16_t *)dst)[i] = zs_f32_to_f16(x);
        break;
    }
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
