/*
 * zs_synth.h - deterministic synthetic training data for server tests: any
 * process can compute the initial weights and the gradient of any element at
 * any step, so several client processes and a single-process reference see
 * the same numbers. Header only.
 */
#ifndef ZS_SYNTH_H
#define ZS_SYNTH_H

#include <stdint.h>

#include "zs_adam.h"
#include "zs_cast.h"
#include "zs_rand.h"

static inline float zs_synth_weight(uint64_t i)
{
    return 0.05f * zs_rand_unit(0xC0FFEE, i);
}

/* Gradient dtype of a step: the wire carries all three kinds. */
static inline zs_dtype_t zs_synth_dtype(uint64_t step)
{
    return step % 3 == 0 ? ZS_DTYPE_BF16 : step % 3 == 1 ? ZS_DTYPE_F32 : ZS_DTYPE_F16;
}

/* Gradients of elements [b, e) at `step` in that step's dtype, into dst;
 * tmp holds e - b floats. */
static inline void zs_synth_grad(uint64_t step, uint64_t b, uint64_t e, void *dst, float *tmp)
{
    for (uint64_t i = b; i < e; i++)
        tmp[i - b] = 0.5f * zs_rand_unit(step, i) + 0.01f * (float)(step % 7);
    zs_cast(dst, zs_synth_dtype(step), tmp, ZS_DTYPE_F32, (size_t)(e - b));
}

static inline zs_adam_hparams_t zs_synth_hparams(void)
{
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    return hp;
}

#endif
