/*
 * zs_sched.c - DeepSpeed's WarmupLR and WarmupDecayLR as pure functions of
 * the optimizer step count (deepspeed/runtime/lr_schedules.py).
 *
 * What it does: returns, bit for bit, the learning rate DeepSpeed's engine
 * gives the optimizer for a step: the schedule object starts at
 * last_batch_iteration = -1 (get_lr() then returns warmup_min_lr), and the
 * engine calls scheduler.step() after each applied optimizer step (not after
 * an fp16 overflow-skipped one), so step s + 1 (s applied steps before it)
 * runs with get_lr() at last_batch_iteration = s - 1. The arithmetic is
 * DeepSpeed's, in the same order, in double precision.
 *
 * What it does not do: no other schedules (OneCycle, LRRangeTest,
 * WarmupCosineLR), no per-parameter-group lists, no state.
 */
#include "zs_sched.h"

#include <math.h>

/* DeepSpeed's WarmupLR._get_gamma / WarmupDecayLR._get_gamma for
 * last_batch_iteration it >= 0, with warmup_num_steps already max(2, n). */
static double gamma_at(const zs_sched_config_t *sc, int64_t it, int64_t n)
{
    if (it < n) {
        if (sc->warmup_type == ZS_WARMUP_LINEAR)
            return (double)it / (double)n;
        /* self.inverse_log_warm_up * math.log(it + 1), the inverse computed
         * once as 1.0 / math.log(n) (the same rounding steps) */
        double inverse_log_warm_up = 1.0 / log((double)n);
        return inverse_log_warm_up * log((double)(it + 1));
    }
    if (sc->type == ZS_SCHED_WARMUP_LR)
        return 1.0;
    /* max(0.0, float(total - it) / float(max(1.0, total - n))) */
    double span = (double)(sc->total_num_steps - n);
    if (span < 1.0)
        span = 1.0;
    double g = (double)(sc->total_num_steps - it) / span;
    return g > 0.0 ? g : 0.0;
}

/* Learning rate for 0-based optimizer step s; see zs_sched.h. */
double zs_sched_lr(const zs_sched_config_t *sc, double base_lr, int64_t s)
{
    if (!sc || (sc->type != ZS_SCHED_WARMUP_LR && sc->type != ZS_SCHED_WARMUP_DECAY_LR))
        return base_lr;
    int64_t it = s - 1; /* DeepSpeed's last_batch_iteration for this step */
    if (it < 0)
        return sc->warmup_min_lr; /* get_lr() before the first scheduler.step() */
    int64_t n = sc->warmup_num_steps < 2 ? 2 : sc->warmup_num_steps; /* max(2, n) */
    double delta = sc->warmup_max_lr - sc->warmup_min_lr;
    return sc->warmup_min_lr + delta * gamma_at(sc, it, n);
}
