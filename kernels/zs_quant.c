/*
 * zs_quant.c - the CPU twin of qwZ's block quantization (zs_quant.h): one
 * pass for each block's amax, one for its codes; unpacking element by
 * element. The formulas are zs_quant_math.h's, so the CUDA kernels write
 * the same bytes.
 *
 * What it does not do: threads or SIMD (a partition is a few MB at most per
 * layer; the CPU engine's all-gather dominates), allocation.
 */
#include <string.h>

#include "zs_quant.h"

void zs_quant_pack(void *rec, const void *src, zs_dtype_t dt, size_t n)
{
    size_t nblk = zs_quant_blocks(n), bytes = zs_quant_record_bytes(n);
    float *scale = rec;
    int8_t *code = (int8_t *)((char *)rec + nblk * 4);
    for (size_t b = 0; b < nblk; b++) {
        size_t lo = b * ZS_QUANT_BLOCK, hi = lo + ZS_QUANT_BLOCK < n ? lo + ZS_QUANT_BLOCK : n;
        float amax = 0.0f;
        for (size_t i = lo; i < hi; i++) {
            float a = zs_quant_absfinite(zs_math_load(src, dt, i));
            amax = a > amax ? a : amax;
        }
        float s = zs_quant_scale(amax);
        memcpy(scale + b, &s, sizeof s); /* rec is 4-aligned; memcpy keeps it plain */
        for (size_t i = lo; i < hi; i++)
            code[i] = zs_quant_q(zs_math_load(src, dt, i), s);
    }
    memset(code + n, 0, bytes - nblk * 4 - n);
}

void zs_quant_unpack_add(float *acc, const void *rec, size_t n)
{
    size_t nblk = zs_quant_blocks(n);
    const int8_t *code = (const int8_t *)((const char *)rec + nblk * 4);
    for (size_t i = 0; i < n; i++) {
        float s;
        memcpy(&s, (const char *)rec + (i / ZS_QUANT_BLOCK) * 4, sizeof s);
        acc[i] += zs_quant_deq(code[i], s);
    }
}

void zs_quant_unpack(void *dst, zs_dtype_t dt, const void *rec, size_t n, size_t nrec)
{
    size_t nblk = zs_quant_blocks(n), bytes = zs_quant_record_bytes(n);
    for (size_t r = 0; r < nrec; r++) {
        const char *base = (const char *)rec + r * bytes;
        const int8_t *code = (const int8_t *)(base + nblk * 4);
        for (size_t i = 0; i < n; i++) {
            float s;
            memcpy(&s, base + (i / ZS_QUANT_BLOCK) * 4, sizeof s);
            zs_math_store(dst, dt, r * n + i, zs_quant_deq(code[i], s));
        }
    }
}
