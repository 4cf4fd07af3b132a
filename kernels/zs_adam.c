/*
 * zs_adam.c - fused CPU Adam/AdamW step over a chunk of fp32 state (see
 * zs_adam.h for the formula and its order of operations).
 *
 * What it does: one pass per element that reads the gradient (fp32, bf16 or
 * fp16, widened exactly), updates p, m, v (in place; from a separate copy
 * of the state, zs_adam_update_from; or in place keeping the old values,
 * zs_adam_update_save) and optionally writes p in a 16-bit or fp32 output
 * dtype. Three paths, picked at run time:
 *
 *   avx512    AVX-512F/BW, 16 elements per step
 *   avx2      AVX2 + F16C, 8 elements per step
 *   portable  scalar C
 *
 * Bitwise equality of the paths rests on four things: (1) every path does the
 * same IEEE fp32 operations in the same order (sqrt and division are
 * correctly rounded in SSE/AVX as in C); (2) no FMA: the build uses
 * -ffp-contract=off and the intrinsics use separate mul/add; (3) the per-step
 * scalars are computed once by adam_consts() (zs_math_adam_init in zs_math.h,
 * shared with the CUDA kernel, as is the portable element update) and shared
 * by all paths; (4) the grad
 * and output conversions are the bitwise-identical ones of zs_cast.c (the
 * vector helpers are repeated here so they inline; tests compare both).
 *
 * Per-step scalars (adam_consts). Float values, used as such by all paths:
 *   beta1, beta2, eps, weight_decay, grad_scale, clip_coef  as given
 *   1 - beta1, 1 - beta2   fp32 subtraction (equal to torch's double
 *                          1 - beta cast to float: the double is exact)
 *   step_size = (float)((double)lr / bc1)
 *   bc2_sqrt  = (float)sqrt(bc2)
 *   decay     = (float)(1.0 - (double)lr * (double)weight_decay)   AdamW only
 * where bc1 = 1 - pow(beta1, t), bc2 = 1 - pow(beta2, t) in double (both 1.0
 * when bias_correction is 0). This is also how torch.optim.AdamW turns its
 * Python doubles into the float scalars of its tensor ops.
 *
 * Per element, fp32:
 *   g = (grad * grad_scale) * clip_coef
 *   g = g + wd * p                                   Adam (L2) with wd != 0
 *   m = beta1 * m + (1 - beta1) * g
 *   v = beta2 * v + ((1 - beta2) * g) * g
 *   denom = sqrt(v) / bc2_sqrt + eps
 *   p = p * decay                                    AdamW with wd != 0
 *   p = p - (step_size * m) / denom
 *
 * What it does not do: threads (callers split into chunks, e.g. zs_pool),
 * amsgrad, or NaN/Inf checks (non-finite inputs propagate as IEEE says).
 * Tails shorter than a vector go through the portable element function.
 */
#include "zs_adam.h"
#include "zs_math.h"
#include "zs_simd.h"
#include "zs_simd_cvt.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_status.h"

enum { PATH_PORTABLE = ZS_SIMD_PORTABLE, PATH_AVX2 = ZS_SIMD_AVX2, PATH_AVX512 = ZS_SIMD_AVX512 };

/* The per-step scalars and the element update are zs_math.h's, shared with
 * the CUDA kernel (kernels/cuda/zs_cuda_vec.cu). */
typedef zs_math_adam_t adam_consts_t;

static void adam_consts(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, adam_consts_t *c)
{
    zs_math_adam_init(c, hp, st);
}

/* Where a step reads and writes the state: p0, m0, v0 in, p, m, v out (the
 * same arrays for an update in place); with save (sp != NULL) the old values
 * are also stored to sp, sm, sv (a speculative update's pre-image). */
typedef struct {
    const float *p0, *m0, *v0;
    float *p, *m, *v;
    float *sp, *sm, *sv;
} adam_io_t;

/* --------------------------------------------------------------- portable */

/* Elements [i, n): the portable path, and the tail of the SIMD paths. */
static inline __attribute__((always_inline)) void
adam_portable_range(const adam_consts_t *c, const adam_io_t *io, const void *grad, zs_dtype_t gdt,
                    void *out, zs_dtype_t pdt, size_t i, size_t n)
{
    for (; i < n; i++) {
        float pi = io->p0[i], mi = io->m0[i], vi = io->v0[i];
        if (io->sp)
            io->sp[i] = pi, io->sm[i] = mi, io->sv[i] = vi;
        zs_math_adam_elem(c, zs_math_load(grad, gdt, i), &pi, &mi, &vi);
        io->p[i] = pi, io->m[i] = mi, io->v[i] = vi;
        zs_math_store(out, pdt, i, pi);
    }
}

static inline __attribute__((always_inline)) void adam_portable(const adam_consts_t *c,
                                                                const adam_io_t *io,
                                                                const void *grad, zs_dtype_t gdt,
                                                                void *out, zs_dtype_t pdt, size_t n)
{
    adam_portable_range(c, io, grad, gdt, out, pdt, 0, n);
}

/* ---------------------------------------------------------------- AVX-512 */

#define T512 __attribute__((target("avx512f,avx512bw"), always_inline))

T512 static inline void adam_avx512(const adam_consts_t *c, const adam_io_t *io, const void *grad,
                                    zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n)
{
    const __m512 gs = _mm512_set1_ps(c->gscale), cc = _mm512_set1_ps(c->clip);
    const __m512 b1 = _mm512_set1_ps(c->b1), b2 = _mm512_set1_ps(c->b2);
    const __m512 omb1 = _mm512_set1_ps(c->omb1), omb2 = _mm512_set1_ps(c->omb2);
    const __m512 eps = _mm512_set1_ps(c->eps), wd = _mm512_set1_ps(c->wd);
    const __m512 ss = _mm512_set1_ps(c->step_size), bc2s = _mm512_set1_ps(c->bc2_sqrt);
    const __m512 decay = _mm512_set1_ps(c->decay);
    const float *p0 = io->p0, *m0 = io->m0, *v0 = io->v0;
    float *p = io->p, *m = io->m, *v = io->v, *sp = io->sp, *sm = io->sm, *sv = io->sv;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_mul_ps(_mm512_mul_ps(zs__load16(grad, gdt, i), gs), cc);
        __m512 pi = _mm512_loadu_ps(p0 + i), mo = _mm512_loadu_ps(m0 + i),
               vo = _mm512_loadu_ps(v0 + i);
        if (sp) {
            _mm512_storeu_ps(sp + i, pi);
            _mm512_storeu_ps(sm + i, mo);
            _mm512_storeu_ps(sv + i, vo);
        }
        if (c->l2)
            g = _mm512_add_ps(g, _mm512_mul_ps(wd, pi));
        __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, mo), _mm512_mul_ps(omb1, g));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, vo), _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2s), eps);
        if (c->decoupled)
            pi = _mm512_mul_ps(pi, decay);
        pi = _mm512_sub_ps(pi, _mm512_div_ps(_mm512_mul_ps(ss, mi), denom));
        _mm512_storeu_ps(p + i, pi);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        zs__store16(out, pdt, i, pi);
    }
    adam_portable_range(c, io, grad, gdt, out, pdt, i, n);
}

/* ------------------------------------------------------------ AVX2 + F16C */

#define T256 __attribute__((target("avx2,f16c"), always_inline))

T256 static inline void adam_avx2(const adam_consts_t *c, const adam_io_t *io, const void *grad,
                                  zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n)
{
    const __m256 gs = _mm256_set1_ps(c->gscale), cc = _mm256_set1_ps(c->clip);
    const __m256 b1 = _mm256_set1_ps(c->b1), b2 = _mm256_set1_ps(c->b2);
    const __m256 omb1 = _mm256_set1_ps(c->omb1), omb2 = _mm256_set1_ps(c->omb2);
    const __m256 eps = _mm256_set1_ps(c->eps), wd = _mm256_set1_ps(c->wd);
    const __m256 ss = _mm256_set1_ps(c->step_size), bc2s = _mm256_set1_ps(c->bc2_sqrt);
    const __m256 decay = _mm256_set1_ps(c->decay);
    const float *p0 = io->p0, *m0 = io->m0, *v0 = io->v0;
    float *p = io->p, *m = io->m, *v = io->v, *sp = io->sp, *sm = io->sm, *sv = io->sv;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_mul_ps(zs__load8(grad, gdt, i), gs), cc);
        __m256 pi = _mm256_loadu_ps(p0 + i), mo = _mm256_loadu_ps(m0 + i),
               vo = _mm256_loadu_ps(v0 + i);
        if (sp) {
            _mm256_storeu_ps(sp + i, pi);
            _mm256_storeu_ps(sm + i, mo);
            _mm256_storeu_ps(sv + i, vo);
        }
        if (c->l2)
            g = _mm256_add_ps(g, _mm256_mul_ps(wd, pi));
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, mo), _mm256_mul_ps(omb1, g));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, vo), _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2s), eps);
        if (c->decoupled)
            pi = _mm256_mul_ps(pi, decay);
        pi = _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(ss, mi), denom));
        _mm256_storeu_ps(p + i, pi);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        zs__store8(out, pdt, i, pi);
    }
    adam_portable_range(c, io, grad, gdt, out, pdt, i, n);
}

/* --------------------------------------------------------------- dispatch */

/* One specialised copy of a path's body per (grad dtype, out dtype) pair, so
 * the dtype switches in the loop fold away. KERNEL names an inline body. */
/* clang-format off */
#define ADAM_CASE(KERNEL, G, P) \
    case G * 4 + P: KERNEL(c, io, grad, G, out, P, n); break;
#define ADAM_ROW(KERNEL, G)                                                 \
    ADAM_CASE(KERNEL, G, ZS_DTYPE_F32) ADAM_CASE(KERNEL, G, ZS_DTYPE_BF16) \
    ADAM_CASE(KERNEL, G, ZS_DTYPE_F16) ADAM_CASE(KERNEL, G, ZS_DTYPE_NONE)
#define ADAM_SPECIALISE(KERNEL)                                                                 \
    switch (gdt * 4 + pdt) {                                                                    \
    ADAM_ROW(KERNEL, ZS_DTYPE_F32) ADAM_ROW(KERNEL, ZS_DTYPE_BF16) ADAM_ROW(KERNEL, ZS_DTYPE_F16) \
    default: break;                                                                             \
    }
/* clang-format on */

#define RUN_ARGS                                                                                   \
    const adam_consts_t *c, const adam_io_t *io, const void *grad, int gdt, void *out, int pdt,    \
        size_t n

static void run_portable(RUN_ARGS)
{
    ADAM_SPECIALISE(adam_portable)
}

__attribute__((target("avx512f,avx512bw"))) static void run_avx512(RUN_ARGS)
{
    ADAM_SPECIALISE(adam_avx512)
}

__attribute__((target("avx2,f16c"))) static void run_avx2(RUN_ARGS)
{
    ADAM_SPECIALISE(adam_avx2)
}

static zs_simd_choice_t forced_path = ZS_SIMD_AUTO;

static int current_path(void)
{
    return zs__simd_path(&forced_path);
}

/* Fused step over n elements on the current path. */
static void adam_run(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, const adam_io_t *io,
                     const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n)
{
    adam_consts_t c;
    if (n == 0)
        return;
    adam_consts(hp, st, &c);
    if (!out)
        pdt = ZS_DTYPE_NONE;
    switch (current_path()) {
    case PATH_AVX512:
        run_avx512(&c, io, grad, gdt, out, pdt, n);
        break;
    case PATH_AVX2:
        run_avx2(&c, io, grad, gdt, out, pdt, n);
        break;
    default:
        run_portable(&c, io, grad, gdt, out, pdt, n);
        break;
    }
}

/* See zs_adam.h. */
void zs_adam_update_from(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, const float *p0,
                         const float *m0, const float *v0, float *p, float *m, float *v,
                         const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n)
{
    adam_io_t io = {p0, m0, v0, p, m, v, NULL, NULL, NULL};
    adam_run(hp, st, &io, grad, gdt, out, pdt, n);
}

/* See zs_adam.h. */
void zs_adam_update_save(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p, float *m,
                         float *v, float *sp, float *sm, float *sv, const void *grad,
                         zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n)
{
    adam_io_t io = {p, m, v, p, m, v, sp, sm, sv};
    adam_run(hp, st, &io, grad, gdt, out, pdt, n);
}

/* See zs_adam.h: the in-place step. */
void zs_adam_update(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p, float *m,
                    float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n)
{
    zs_adam_update_from(hp, st, p, m, v, p, m, v, grad, gdt, out, pdt, n);
}

/* See zs_adam.h. The reference is written out independently of the paths
 * above: one element at a time, the header's formula line by line, with the
 * scalar conversions of zs_cast.h and the same adam_consts() scalars. */
void zs_adam_update_ref(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p, float *m,
                        float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t pdt,
                        size_t n)
{
    adam_consts_t c;
    adam_consts(hp, st, &c);
    for (size_t i = 0; i < n; i++) {
        float g;
        if (gdt == ZS_DTYPE_F32)
            g = ((const float *)grad)[i];
        else if (gdt == ZS_DTYPE_BF16)
            g = zs_bf16_to_f32(((const uint16_t *)grad)[i]);
        else
            g = zs_f16_to_f32(((const uint16_t *)grad)[i]);
        g = g * st->grad_scale;
        g = g * st->clip_coef;
        if (!hp->adam_w_mode && hp->weight_decay != 0.0f)
            g = g + hp->weight_decay * p[i];
        m[i] = hp->beta1 * m[i] + c.omb1 * g;
        v[i] = hp->beta2 * v[i] + c.omb2 * g * g;
        float denom = sqrtf(v[i]) / c.bc2_sqrt + hp->eps;
        if (hp->adam_w_mode && hp->weight_decay != 0.0f)
            p[i] = p[i] * c.decay;
        p[i] = p[i] - c.step_size * m[i] / denom;
        if (out && pdt == ZS_DTYPE_F32)
            ((float *)out)[i] = p[i];
        else if (out && pdt == ZS_DTYPE_BF16)
            ((uint16_t *)out)[i] = zs_f32_to_bf16(p[i]);
        else if (out && pdt == ZS_DTYPE_F16)
            ((uint16_t *)out)[i] = zs_f32_to_f16(p[i]);
    }
}

/* See zs_adam.h. */
const char *zs_adam_path(void)
{
    return zs__simd_name(current_path());
}

/* See zs_adam.h: ZS_OK, or ZS_ERR_INVALID for an unknown name or missing CPU feature. */
int zs_adam_force_path(const char *name)
{
    return zs__simd_force(&forced_path, name);
}
