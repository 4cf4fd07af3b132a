/*
 * zs_quant_math.h - the per-element formulas of qwZ's block quantization
 * (symmetric int8, one fp32 scale per block), shared by the CPU twin
 * (zs_quant.c) and the CUDA kernels (cuda/zs_cuda_quant.cu); header only,
 * C and CUDA C++ (ZS_HD and ZS_FDIV/ZS_FMUL from zs_math.h).
 *
 * The format (ZS_QUANT_BLOCK elements per block):
 *   scale  = amax / 127, amax = the largest |x| over the block's finite
 *            elements (0 when there are none)
 *   q(x)   = -128 when x is inf or NaN (a reserved code);
 *            0 when scale is 0 (an all-zero block is sent exactly);
 *            else rint(x / scale) clamped to [-127, 127]
 *   x'(q)  = NaN for q = -128, else q * scale
 * Bound: for finite x, |x' - x| <= scale / 2 (+ the float rounding of the
 * division and product, below 2^-21 * amax), so each block's error is
 * relative to its own largest finite element: one huge value in a block
 * makes the block's small values coarse, and no other block. A non-finite
 * parameter comes back NaN (inf included): it stays non-finite, and the
 * block's finite elements keep the bound.
 *
 * What it does not do: loops, the maximum over a block (each kernel's
 * business: a max is exact in any order), memory layout (zs_quant.h).
 */
#ifndef ZS_QUANT_MATH_H
#define ZS_QUANT_MATH_H

#include "zs_math.h"

/* Elements per quantization block. DeepSpeed's qwZ quantizer aims at groups
 * below 8000 elements and calls 4K the optimal size; a fixed power of two
 * keeps a block inside one partition and the record layout simple. */
#define ZS_QUANT_BLOCK 4096

/* The reserved int8 code of a non-finite element. */
#define ZS_QUANT_NONFINITE (-128)

/* |x| when x is finite, else 0 (what the block's amax is taken over). */
static inline ZS_HD float zs_quant_absfinite(float x)
{
    return isfinite(x) ? fabsf(x) : 0.0f;
}

/* The block's scale from its amax. */
static inline ZS_HD float zs_quant_scale(float amax)
{
    return ZS_FDIV(amax, 127.0f);
}

/* One element's int8 code under `scale`. */
static inline ZS_HD int8_t zs_quant_q(float x, float scale)
{
    if (!isfinite(x))
        return (int8_t)ZS_QUANT_NONFINITE;
    if (scale == 0.0f)
        return 0;
    float r = rintf(ZS_FDIV(x, scale));
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    return (int8_t)r;
}

/* One element back from its code and its block's scale. */
static inline ZS_HD float zs_quant_deq(int8_t q, float scale)
{
    if (q == ZS_QUANT_NONFINITE)
        return zs_math_bits_f32(0x7FC00000u); /* the canonical quiet NaN */
    return ZS_FMUL((float)q, scale);
}

#endif
