/*
 * zs_sched.h - learning-rate schedules with DeepSpeed's semantics.
 *
 * WarmupLR: for step s (0-based count of optimizer steps taken so far),
 *   s < warmup_num_steps: min + (max - min) * gamma(s), where gamma is
 *     log:    log(s + 1) / log(warmup_num_steps)
 *     linear: s / warmup_num_steps
 *   else: max.
 * WarmupDecayLR: as WarmupLR during warmup, then
 *   max * max(0, (total - s) / (total - warmup))   (DeepSpeed's decay).
 * NONE: the optimizer's lr.
 * Pure functions: no state beyond the step number, so a resumed run gets
 * the same learning rates.
 */
#ifndef ZS_SCHED_H
#define ZS_SCHED_H

#include <stdint.h>

#include "zs_config.h"

/* Learning rate for 0-based scheduler step s; base_lr used when NONE. */
double zs_sched_lr(const zs_sched_config_t *sc, double base_lr, int64_t s);

#endif
