/*
 * zs_simd_cvt.h - vector loads and stores of fp32 / bf16 / fp16 data, shared
 * by the SIMD paths of zs_cast.c and zs_adam.c (internal, header only).
 *
 * Every conversion gives the same bits as the scalar reference in zs_cast.c:
 * bf16 rounds to nearest even with NaN kept quiet (sign and top payload
 * kept); fp16 uses F16C with an explicit round-to-nearest immediate. The
 * functions carry their own target attributes, so they compile into a file
 * built for plain x86-64 and inline into callers with the same target.
 */
#ifndef ZS_SIMD_CVT_H
#define ZS_SIMD_CVT_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "zs_dtype.h"

#define ZS__T512 __attribute__((target("avx512f,avx512bw"), always_inline))
#define ZS__T256 __attribute__((target("avx2,f16c"), always_inline))

/* ---- AVX-512: 16 lanes ---------------------------------------------------- */

ZS__T512 static inline __m512 zs__bf16x16_to_f32(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ZS__T512 static inline __m256i zs__f32x16_to_bf16(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    r = _mm512_srli_epi32(r, 16);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, q));
}

/* 16 elements of src (dtype dt) from index i, as fp32. */
ZS__T512 static inline __m512 zs__load16(const void *src, zs_dtype_t dt, size_t i)
{
    const __m256i *h = (const __m256i *)((const uint16_t *)src + i);
    switch (dt) {
    case ZS_DTYPE_F32:
        return _mm512_loadu_ps((const float *)src + i);
    case ZS_DTYPE_BF16:
        return zs__bf16x16_to_f32(_mm256_loadu_si256(h));
    default:
        return _mm512_cvtph_ps(_mm256_loadu_si256(h));
    }
}

/* Store 16 fp32 lanes into dst (dtype dt) at index i; ZS_DTYPE_NONE stores
 * nothing. */
ZS__T512 static inline void zs__store16(void *dst, zs_dtype_t dt, size_t i, __m512 x)
{
    /* dst + i only where a store happens: dst is NULL for ZS_DTYPE_NONE */
    switch (dt) {
    case ZS_DTYPE_F32:
        _mm512_storeu_ps((float *)dst + i, x);
        break;
    case ZS_DTYPE_BF16:
        _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i), zs__f32x16_to_bf16(x));
        break;
    case ZS_DTYPE_F16:
        _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i),
                            _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    default:
        break;
    }
}

/* ---- AVX2 + F16C: 8 lanes ----------------------------------------------------- */

ZS__T256 static inline __m256 zs__bf16x8_to_f32(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ZS__T256 static inline __m128i zs__f32x8_to_bf16(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    r = _mm256_srli_epi32(r, 16);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)); /* a >= 0: signed ok */
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* Every lane is <= 0xFFFF, so the unsigned saturating pack is exact. */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* 8 elements of src (dtype dt) from index i, as fp32. */
ZS__T256 static inline __m256 zs__load8(const void *src, zs_dtype_t dt, size_t i)
{
    const __m128i *h = (const __m128i *)((const uint16_t *)src + i);
    switch (dt) {
    case ZS_DTYPE_F32:
        return _mm256_loadu_ps((const float *)src + i);
    case ZS_DTYPE_BF16:
        return zs__bf16x8_to_f32(_mm_loadu_si128(h));
    default:
        return _mm256_cvtph_ps(_mm_loadu_si128(h));
    }
}

/* Store 8 fp32 lanes into dst (dtype dt) at index i; ZS_DTYPE_NONE stores
 * nothing. */
ZS__T256 static inline void zs__store8(void *dst, zs_dtype_t dt, size_t i, __m256 x)
{
    /* dst + i only where a store happens: dst is NULL for ZS_DTYPE_NONE */
    switch (dt) {
    case ZS_DTYPE_F32:
        _mm256_storeu_ps((float *)dst + i, x);
        break;
    case ZS_DTYPE_BF16:
        _mm_storeu_si128((__m128i *)((uint16_t *)dst + i), zs__f32x8_to_bf16(x));
        break;
    case ZS_DTYPE_F16:
        _mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    default:
        break;
    }
}

#endif
