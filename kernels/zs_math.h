/*
 * zs_math.h - per-element and per-row formulas shared by the CPU kernels and
 * the CUDA kernels (header only, C and CUDA C++).
 *
 * Every function is `static inline ZS_HD`: ZS_HD is `__host__ __device__`
 * under nvcc and empty for a C compiler, so the CPU code (zs_cast.c,
 * zs_adam.c, zs_gpt_ops.c) and the kernels in kernels/cuda/ compile the same
 * lines. CI runs the CPU side every time (tests/test_math.c), which is what
 * lets GPU code that no CI machine can run still be checked.
 *
 * Bitwise agreement between CPU and GPU rests on:
 *   - integer-only conversions (bf16/fp16 round to nearest even, NaN rules
 *     of zs_cast.h), identical on both sides by construction;
 *   - float arithmetic written through ZS_FMUL/ZS_FADD/ZS_FSUB/ZS_FDIV/
 *     ZS_FSQRT: on the device the __f*_rn intrinsics, which are never
 *     contracted into FMA and round to nearest; on the host plain operators,
 *     which the C build keeps separate with -ffp-contract=off. So the AdamW
 *     element update, the LayerNorm element formulas and GELU's polynomial are
 *     the same IEEE operations in the same order on both sides.
 *   - expf: the CUDA and glibc expf are both accurate to ~1 ulp but not the
 *     same function, so GELU and everything with an exp agree to a tolerance,
 *     not bitwise.
 *
 * What it does not do: loops, reductions over rows (the summation order is
 * each kernel's business), threads, or anything with memory beyond the
 * element pointers it is given. The host-only zs_math_adam_init computes the
 * per-step AdamW scalars in double, once per call, for both sides.
 */
#ifndef ZS_MATH_H
#define ZS_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" { /* C declarations (zs_adam_update, ...) keep C linkage under nvcc */
#endif
#include "zs_adam.h"
#include "zs_dtype.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define ZS_HD __host__ __device__
#else
#define ZS_HD
#endif

/* Separately rounded fp32 operations (see the header comment). */
#ifdef __CUDA_ARCH__
#define ZS_FMUL(a, b) __fmul_rn((a), (b))
#define ZS_FADD(a, b) __fadd_rn((a), (b))
#define ZS_FSUB(a, b) __fsub_rn((a), (b))
#define ZS_FDIV(a, b) __fdiv_rn((a), (b))
#define ZS_FSQRT(a)   __fsqrt_rn(a)
#else
#define ZS_FMUL(a, b) ((a) * (b))
#define ZS_FADD(a, b) ((a) + (b))
#define ZS_FSUB(a, b) ((a) - (b))
#define ZS_FDIV(a, b) ((a) / (b))
#define ZS_FSQRT(a)   sqrtf(a)
#endif

/* LayerNorm epsilon (GPT-2), biased variance. */
#define ZS_LN_EPS 1e-5f

/* GELU tanh approximation constants: sqrt(2 / pi) and the cubic coefficient. */
#define ZS_GELU_S 0.7978845608028654f
#define ZS_GELU_C 0.044715f

/* ---- bit casts ----------------------------------------------------------- */

static inline ZS_HD uint32_t zs_math_f32_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

static inline ZS_HD float zs_math_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* ---- fp32 <-> bf16 / fp16 (the contract of zs_cast.h) ---------------------- */

/* fp32 -> bf16, round to nearest even by the integer trick; a carry into the
 * exponent gives +-Inf on overflow. NaN -> (u >> 16) | 0x0040: quiet, sign
 * and top payload bits kept (what vcvtneps2bf16 returns). */
static inline ZS_HD uint16_t zs_math_f32_to_bf16(float x)
{
    uint32_t u = zs_math_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact (the bf16 bits become the top half; a signalling NaN
 * stays signalling). */
static inline ZS_HD float zs_math_bf16_to_f32(uint16_t h)
{
    return zs_math_bits_f32((uint32_t)h << 16);
}

/* fp32 -> fp16, round to nearest even, exact subnormals, >= 65520 -> Inf,
 * NaN -> sign | 0x7E00 | (mantissa >> 13): quiet, top 9 payload bits kept
 * (what F16C's vcvtps2ph returns). */
static inline ZS_HD uint16_t zs_math_f32_to_f16(float x)
{
    uint32_t u = zs_math_f32_bits(x);
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

/* fp16 -> fp32, exact; subnormals normalised; NaN is quieted (bit 22 set)
 * with its payload kept, as vcvtph2ps does. */
static inline ZS_HD float zs_math_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;

    if (e == 0x1F) /* Inf or NaN */
        return zs_math_bits_f32(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));
    if (e != 0)
        return zs_math_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0)
        return zs_math_bits_f32(sign);
    /* Subnormal: m * 2^-24; normalise so the leading 1 sits at bit 10. */
    uint32_t exp = 113; /* biased fp32 exponent of 2^-14 */
    while (!(m & 0x400u)) {
        m <<= 1;
        exp--;
    }
    return zs_math_bits_f32(sign | (exp << 23) | ((m & 0x3FFu) << 13));
}

/* Element i of an array of dtype dt (F32, BF16 or F16), widened exactly. */
static inline ZS_HD float zs_math_load(const void *p, int dt, size_t i)
{
    if (dt == ZS_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == ZS_DTYPE_BF16)
        return zs_math_bf16_to_f32(((const uint16_t *)p)[i]);
    return zs_math_f16_to_f32(((const uint16_t *)p)[i]);
}

/* Store x into element i of an array of dtype dt, rounded to nearest even;
 * ZS_DTYPE_NONE (or any other value) stores nothing. */
static inline ZS_HD void zs_math_store(void *p, int dt, size_t i, float x)
{
    if (dt == ZS_DTYPE_F32)
        ((float *)p)[i] = x;
    else if (dt == ZS_DTYPE_BF16)
        ((uint16_t *)p)[i] = zs_math_f32_to_bf16(x);
    else if (dt == ZS_DTYPE_F16)
        ((uint16_t *)p)[i] = zs_math_f32_to_f16(x);
}

/* ---- AdamW element update (the formula of zs_adam.h) ------------------------ */

/* The per-step scalars, computed once on the host and used by every path:
 * CPU portable, CPU SIMD, CUDA (passed to the kernel by value). */
typedef struct zs_math_adam {
    float gscale, clip; /* grad_scale, clip_coef */
    float b1, b2;       /* beta1, beta2 */
    float omb1, omb2;   /* 1 - beta1, 1 - beta2 (fp32) */
    float eps, wd;      /* eps, weight_decay */
    float step_size;    /* (float)(lr / bc1) */
    float bc2_sqrt;     /* (float)sqrt(bc2) */
    float decay;        /* (float)(1 - lr * wd) */
    int l2;             /* Adam with weight decay: g += wd * p */
    int decoupled;      /* AdamW with weight decay: p *= decay */
} zs_math_adam_t;

/* Fill c from the hyper-parameters and the step (host only; double math):
 * bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (1 without bias correction),
 * step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2),
 * decay = (float)(1 - lr * wd). This is also how torch.optim.AdamW turns
 * its Python doubles into the float scalars of its tensor ops. */
static inline void zs_math_adam_init(zs_math_adam_t *c, const zs_adam_hparams_t *hp,
                                     const zs_adam_step_t *st)
{
    double bc1 = 1.0, bc2 = 1.0;
    if (hp->bias_correction) {
        bc1 = 1.0 - pow((double)hp->beta1, (double)st->t);
        bc2 = 1.0 - pow((double)hp->beta2, (double)st->t);
    }
    c->gscale = st->grad_scale;
    c->clip = st->clip_coef;
    c->b1 = hp->beta1;
    c->b2 = hp->beta2;
    c->omb1 = 1.0f - hp->beta1;
    c->omb2 = 1.0f - hp->beta2;
    c->eps = hp->eps;
    c->wd = hp->weight_decay;
    c->step_size = (float)((double)st->lr / bc1);
    c->bc2_sqrt = (float)sqrt(bc2);
    double decay = 1.0 - (double)st->lr * (double)hp->weight_decay;
    c->decay = (float)decay;
    c->l2 = !hp->adam_w_mode && hp->weight_decay != 0.0f;
    c->decoupled = hp->adam_w_mode && hp->weight_decay != 0.0f;
}

/* One element: g is the gradient widened to fp32 (not yet scaled); *p, *m,
 * *v are updated. The exact operation order of zs_adam.h:
 *   g = (g * gscale) * clip;  g = g + wd * p            (Adam L2)
 *   m = b1 * m + omb1 * g;    v = b2 * v + (omb2 * g) * g
 *   denom = sqrt(v) / bc2_sqrt + eps
 *   p = p * decay (AdamW);    p = p - (step_size * m) / denom */
static inline ZS_HD void zs_math_adam_elem(const zs_math_adam_t *c, float g, float *p, float *m,
                                           float *v)
{
    float pi = *p;
    g = ZS_FMUL(ZS_FMUL(g, c->gscale), c->clip);
    if (c->l2)
        g = ZS_FADD(g, ZS_FMUL(c->wd, pi));
    float mi = ZS_FADD(ZS_FMUL(c->b1, *m), ZS_FMUL(c->omb1, g));
    float vi = ZS_FADD(ZS_FMUL(c->b2, *v), ZS_FMUL(ZS_FMUL(c->omb2, g), g));
    float denom = ZS_FADD(ZS_FDIV(ZS_FSQRT(vi), c->bc2_sqrt), c->eps);
    if (c->decoupled)
        pi = ZS_FMUL(pi, c->decay);
    pi = ZS_FSUB(pi, ZS_FDIV(ZS_FMUL(c->step_size, mi), denom));
    *p = pi;
    *m = mi;
    *v = vi;
}

/* ---- GELU, tanh approximation ---------------------------------------------- */

/* 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as
 * x * sigmoid(2u) = x / (1 + exp(-2u)): one exp, and no cancellation in
 * 1 + tanh(u) for negative u. */
static inline ZS_HD float zs_math_gelu(float x)
{
    float x3 = ZS_FMUL(ZS_FMUL(ZS_FMUL(ZS_GELU_C, x), x), x);
    float u = ZS_FMUL(ZS_GELU_S, ZS_FADD(x, x3));
    return ZS_FDIV(x, ZS_FADD(1.0f, expf(ZS_FMUL(-2.0f, u))));
}

/* dout * d/dx gelu(x). With s = sigmoid(2u):
 * d/dx 0.5 x (1 + tanh u) = s + 2 x s (1 - s) u',
 * u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2). */
static inline ZS_HD float zs_math_gelu_grad(float x, float dout)
{
    float x3 = ZS_FMUL(ZS_FMUL(ZS_FMUL(ZS_GELU_C, x), x), x);
    float u = ZS_FMUL(ZS_GELU_S, ZS_FADD(x, x3));
    float s = ZS_FDIV(1.0f, ZS_FADD(1.0f, expf(ZS_FMUL(-2.0f, u))));
    float du = ZS_FMUL(ZS_GELU_S, ZS_FADD(1.0f, ZS_FMUL(ZS_FMUL(ZS_FMUL(3.0f, ZS_GELU_C), x), x)));
    float t = ZS_FMUL(ZS_FMUL(ZS_FMUL(ZS_FMUL(2.0f, x), s), ZS_FSUB(1.0f, s)), du);
    return ZS_FMUL(ZS_FADD(s, t), dout);
}

/* ---- LayerNorm element formulas (row sums are each kernel's own) ------------ */

/* rstd = 1 / sqrt(var + eps) from the biased variance of a row. */
static inline ZS_HD float zs_math_ln_rstd(float var)
{
    return ZS_FDIV(1.0f, ZS_FSQRT(ZS_FADD(var, ZS_LN_EPS)));
}

/* Forward output: (x - mean) * rstd * w + b. */
static inline ZS_HD float zs_math_ln_out(float x, float mean, float rstd, float w, float b)
{
    return ZS_FADD(ZS_FMUL(ZS_FMUL(ZS_FSUB(x, mean), rstd), w), b);
}

/* Backward, the per-element terms of the two row sums: dn = w * dout is
 * summed into dmean, dn * (x - mean) * rstd into dnmean. */
static inline ZS_HD float zs_math_ln_dnorm(float w, float dout)
{
    return ZS_FMUL(w, dout);
}

static inline ZS_HD float zs_math_ln_dnorm_n(float dn, float x, float mean, float rstd)
{
    return ZS_FMUL(ZS_FMUL(dn, ZS_FSUB(x, mean)), rstd);
}

/* Backward, the input gradient of one element given the row means dmean =
 * sum(dn) / C and dnmean = sum(dn * n) / C:
 * dx = (w * dout - dmean - n * dnmean) * rstd, n = (x - mean) * rstd. */
static inline ZS_HD float zs_math_ln_dx(float x, float mean, float rstd, float w, float dout,
                                        float dmean, float dnmean)
{
    float n = ZS_FMUL(ZS_FSUB(x, mean), rstd);
    return ZS_FMUL(ZS_FSUB(ZS_FSUB(ZS_FMUL(w, dout), dmean), ZS_FMUL(n, dnmean)), rstd);
}

/* Backward, the weight-gradient term of one element: (x - mean) * rstd * dout
 * (the bias-gradient term is dout itself). */
static inline ZS_HD float zs_math_ln_dw(float x, float mean, float rstd, float dout)
{
    return ZS_FMUL(ZS_FMUL(ZS_FSUB(x, mean), rstd), dout);
}

/* ---- softmax cross-entropy ------------------------------------------------ */

/* dlogit of one element: scale * (exp(logit - lse) - [is target]). The
 * target's subtraction is a second rounding, as in the CPU kernel. */
static inline ZS_HD float zs_math_xent_dlogit(float logit, float lse, float scale, int is_target)
{
    float d = ZS_FMUL(scale, expf(ZS_FSUB(logit, lse)));
    return is_target ? ZS_FSUB(d, scale) : d;
}

#endif
