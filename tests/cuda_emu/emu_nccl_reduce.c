/*
 * emu_nccl_reduce.c - the arithmetic of the emulated NCCL: data type sizes
 * and names, and the element-wise reduction of nranks contributions in a
 * fixed rank order.
 *
 * Does: ncclFloat32, ncclFloat16, ncclBfloat16 (and ncclFloat64, trivial);
 * ops ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg. Does not:
 * ncclRedOpCreatePreMulSum ops (refused with ncclInvalidArgument by the
 * caller), integer or fp8 types (refused likewise).
 *
 * ncclAvg: the docs define it as the average; the emulator computes the
 * sum as above (same order and rounding), then divides once by nranks and
 * rounds to the type. (Real NCCL may pre-scale each input instead; callers
 * must not count on either bit pattern across implementations.)
 *
 * Order and rounding (documented in README.md): the result is
 * ((v0 op v1) op v2) op ... in rank order, every time, so results are
 * reproducible bit for bit. 16-bit types are rounded back to their type
 * after EVERY step (each step computed exactly in fp32, then rounded to
 * nearest even), not accumulated in fp32 and rounded once: NCCL's docs
 * promise no accumulation precision, and its ring/tree kernels reduce two
 * values of the buffer's type per hop, so a caller must not count on fp32
 * accumulation. This is the hostile reading (most rounding). fp32 adds in
 * fp32 (no wider accumulator).
 *
 * NaN: max/min propagate a NaN (the docs say nothing; fmaxf would drop it,
 * and callers must not count on NaNs vanishing).
 */
#include <math.h>
#include <string.h>

#include "emu_nccl.h"

size_t zs_emu_nccl_dtype_size(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat32:
        return 4;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

const char *zs_emu_nccl_dtype_name(int t)
{
    switch (t) {
    case ncclFloat32:
        return "float32";
    case ncclFloat16:
        return "float16";
    case ncclBfloat16:
        return "bfloat16";
    case ncclFloat64:
        return "float64";
    /* Named for point-to-point messages, which move any type (reductions
     * still refuse these through zs_emu_nccl_dtype_size). */
    case ncclInt8:
        return "int8";
    case ncclUint8:
        return "uint8";
    case ncclInt32:
        return "int32";
    case ncclUint32:
        return "uint32";
    case ncclInt64:
        return "int64";
    case ncclUint64:
        return "uint64";
    case ncclFloat8e4m3:
        return "float8e4m3";
    case ncclFloat8e5m2:
        return "float8e5m2";
    default:
        return "unsupported-type";
    }
}

const char *zs_emu_nccl_op_name(int op)
{
    switch (op) {
    case ncclSum:
        return "sum";
    case ncclProd:
        return "prod";
    case ncclMax:
        return "max";
    case ncclMin:
        return "min";
    case ncclAvg:
        return "avg";
    default:
        return "unsupported-op";
    }
}

int zs_emu_nccl_op_ok(ncclRedOp_t op)
{
    return op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin || op == ncclAvg;
}

static float bf16_to_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, keep sign */
    u += 0x7fffu + ((u >> 16) & 1u);         /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float h_to_f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    float f;
    if (exp == 0x1f) {
        uint32_t u = sign | 0x7f800000u | (man << 13);
        memcpy(&f, &u, 4);
        return f;
    }
    if (exp == 0) {
        f = ldexpf((float)man, -24); /* subnormal (or zero) */
        return sign ? -f : f;
    }
    uint32_t u = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f_to_h(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00u;
    if (a >= 65520.0f) /* rounds to infinity (max finite 65504) */
        return sign | 0x7c00u;
    if (a < 6.103515625e-05f) {                /* subnormal range: units of 2^-24 */
        float q = nearbyintf(a * 16777216.0f); /* default rounding: nearest even */
        return sign | (uint16_t)q;
    }
    memcpy(&u, &a, 4);
    uint32_t exp = (u >> 23) - 112, man = u & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13), rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* carries into the exponent correctly */
    return sign | (uint16_t)h;
}

static double apply(double a, double b, int op)
{
    switch (op) {
    case ncclAvg: /* summed step by step, divided at the end */
    case ncclSum:
        return a + b;
    case ncclProd:
        return a * b;
    case ncclMax:
        return (isnan(a) || isnan(b)) ? NAN : (a > b ? a : b);
    default: /* ncclMin */
        return (isnan(a) || isnan(b)) ? NAN : (a < b ? a : b);
    }
}

static float applyf(float a, float b, int op)
{
    switch (op) {
    case ncclAvg:
    case ncclSum:
        return a + b;
    case ncclProd:
        return a * b;
    case ncclMax:
        return (isnan(a) || isnan(b)) ? NAN : (a > b ? a : b);
    default:
        return (isnan(a) || isnan(b)) ? NAN : (a < b ? a : b);
    }
}

void zs_emu_nccl_reduce(void *dst, const void *const *src, int n, size_t count, int dtype, int op)
{
    for (size_t i = 0; i < count; i++) {
        switch (dtype) {
        case ncclFloat32: {
            float v = ((const float *)src[0])[i];
            for (int k = 1; k < n; k++)
                v = applyf(v, ((const float *)src[k])[i], op);
            if (op == ncclAvg)
                v /= (float)n;
            ((float *)dst)[i] = v;
            break;
        }
        case ncclFloat64: {
            double v = ((const double *)src[0])[i];
            for (int k = 1; k < n; k++)
                v = apply(v, ((const double *)src[k])[i], op);
            if (op == ncclAvg)
                v /= n;
            ((double *)dst)[i] = v;
            break;
        }
        case ncclFloat16: {
            uint16_t v = ((const uint16_t *)src[0])[i];
            for (int k = 1; k < n; k++) /* one rounding per step, see above */
                v = f_to_h(applyf(h_to_f(v), h_to_f(((const uint16_t *)src[k])[i]), op));
            if (op == ncclAvg)
                v = f_to_h(h_to_f(v) / (float)n);
            ((uint16_t *)dst)[i] = v;
            break;
        }
        case ncclBfloat16: {
            uint16_t v = ((const uint16_t *)src[0])[i];
            for (int k = 1; k < n; k++)
                v = f_to_bf16(applyf(bf16_to_f(v), bf16_to_f(((const uint16_t *)src[k])[i]), op));
            if (op == ncclAvg)
                v = f_to_bf16(bf16_to_f(v) / (float)n);
            ((uint16_t *)dst)[i] = v;
            break;
        }
        }
    }
}
