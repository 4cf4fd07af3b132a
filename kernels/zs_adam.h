/*
 * zs_adam.h - fused CPU Adam/AdamW step over a chunk of fp32 state.
 *
 * One pass per element, in this order (fp32 math, exact sqrt and division,
 * no FMA contraction, so every path is bitwise equal to the portable one):
 *
 *   g  = grad[i] * grad_scale * clip_coef          grad in any dtype
 *   if (!adam_w_mode && weight_decay) g += weight_decay * p      (Adam, L2)
 *   m  = beta1 * m + (1 - beta1) * g
 *   v  = beta2 * v + (1 - beta2) * g * g
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps      (eps after bias correction)
 *   if (adam_w_mode && weight_decay) p = p * (1 - lr * weight_decay)  (AdamW)
 *   p  = p - (lr / (1 - beta1^t)) * m / denom
 *   out[i] = (pdtype) p                           if out != NULL
 *
 * With bias_correction == 0 both corrections are 1. t is the 1-based count of
 * applied (not skipped) optimizer steps. This is PyTorch's torch.optim.AdamW /
 * Adam and DeepSpeed's DeepSpeedCPUAdam (adamw_mode) semantics.
 */
#ifndef ZS_ADAM_H
#define ZS_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "zs_dtype.h"

typedef struct zs_adam_hparams {
    float lr;            /* base learning rate (a commit may override per step) */
    float beta1, beta2;  /* e.g. 0.9, 0.999 */
    float eps;           /* e.g. 1e-8 */
    float weight_decay;  /* e.g. 0.01 */
    int adam_w_mode;     /* 1: decoupled decay (AdamW); 0: L2 into the gradient (Adam) */
    int bias_correction; /* 1 (default) or 0 */
} zs_adam_hparams_t;

/* Per-step scalars of one update. */
typedef struct zs_adam_step {
    float lr;         /* learning rate of this step */
    int64_t t;        /* 1-based optimizer step for bias correction */
    float grad_scale; /* e.g. 1 / (loss_scale * W) */
    float clip_coef;  /* min(1, max_norm / global_norm), 1 when not clipping */
} zs_adam_step_t;

/* Update n elements in place: p, m, v are fp32 arrays of n; grad holds n
 * elements of dtype gdt; out (may be NULL, or pdt == ZS_DTYPE_NONE) receives p
 * converted to pdt (round to nearest even). Single-threaded; callers split
 * work across threads by chunks. */
void zs_adam_update(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p, float *m,
                    float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t pdt,
                    size_t n);

/* The same step reading the state from p0, m0, v0 and writing it to p, m, v
 * (fp32 arrays of n): bitwise what copying p0, m0, v0 over p, m, v and then
 * calling zs_adam_update gives, in one pass instead of two. Each input may
 * be its output (in place); otherwise they must not overlap. The server's
 * rollback of a speculative update runs the real step from the pre-image
 * with it (server/zs_shard_spec.c). */
void zs_adam_update_from(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, const float *p0,
                         const float *m0, const float *v0, float *p, float *m, float *v,
                         const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n);

/* The in-place step that also stores the old p, m, v to sp, sm, sv (fp32
 * arrays of n, not overlapping the state): bitwise what copying p, m, v
 * there and then calling zs_adam_update gives, in one pass. The server's
 * speculative update keeps its pre-image with it (server/zs_shard_spec.c). */
void zs_adam_update_save(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p, float *m,
                         float *v, float *sp, float *sm, float *sv, const void *grad,
                         zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t n);

/* The plain scalar loop, same contract: the reference for tests. */
void zs_adam_update_ref(const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p, float *m,
                        float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t pdt,
                        size_t n);

/* Which path zs_adam_update takes: "avx512", "avx2" or "portable". */
const char *zs_adam_path(void);

/* Force a path by name ("avx512", "avx2", "portable") or NULL for automatic.
 * Returns ZS_OK or ZS_ERR_INVALID if the CPU lacks it. For tests/benchmarks. */
int zs_adam_force_path(const char *name);

#endif
