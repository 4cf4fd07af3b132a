/*
 * zs_dtypetest.h - element access for tests that fill and read buffers of
 * any of our dtypes through host memory (the NCCL tests' pinned staging):
 * st() stores a float rounded to the dtype (nearest even, zs_cast.h), ld()
 * reads one back as a float. Header only.
 */
#ifndef ZS_DTYPETEST_H
#define ZS_DTYPETEST_H

#include <stddef.h>
#include <stdint.h>

#include "zs_cast.h"
#include "zs_dtype.h"

/* Element i of p (dtype dt) = x rounded to dt. */
static inline void st(zs_dtype_t dt, void *p, size_t i, float x)
{
    if (dt == ZS_DTYPE_F32)
        ((float *)p)[i] = x;
    else
        ((uint16_t *)p)[i] = dt == ZS_DTYPE_BF16 ? zs_f32_to_bf16(x) : zs_f32_to_f16(x);
}

/* Element i of p (dtype dt) as a float. */
static inline float ld(zs_dtype_t dt, const void *p, size_t i)
{
    if (dt == ZS_DTYPE_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == ZS_DTYPE_BF16 ? zs_bf16_to_f32(h) : zs_f16_to_f32(h);
}

#endif
