/*
 * zs_sched.h - learning-rate schedules with DeepSpeed's semantics
 * (deepspeed/runtime/lr_schedules.py, as the engine drives them).
 *
 * s is the number of optimizer steps applied before the one being taken
 * (0 for the first; fp16 overflow-skipped steps do not count, since
 * DeepSpeed does not step the scheduler on them). DeepSpeed creates the
 * schedule with last_batch_iteration = -1 and calls scheduler.step() after
 * every applied optimizer step, so step s runs with DeepSpeed's get_lr() at
 * i = s - 1:
 *   i < 0 (s = 0): warmup_min_lr
 *   N = max(2, warmup_num_steps)
 *   i < N: min + (max - min) * gamma(i), where gamma is
 *     log:    (1 / log(N)) * log(i + 1)
 *     linear: i / N
 *   WarmupLR, i >= N: min + (max - min) * 1  (= max)
 *   WarmupDecayLR, i >= N: min + (max - min) * max(0, (T - i) / max(1, T - N))
 *     with T = total_num_steps: a linear decay to warmup_min_lr (not to 0),
 *     reached at i = T and kept after.
 * So the first two steps both run at warmup_min_lr, and max is first reached
 * at s = N + 1 (linear) or s = N (log, up to rounding).
 * NONE: the optimizer's lr (base_lr).
 * Pure functions: no state beyond the step number, so a resumed run gets
 * the same learning rates.
 */
#ifndef ZS_SCHED_H
#define ZS_SCHED_H

#include <stdint.h>

#include "zs_config.h"

/* Learning rate of the optimizer step taken after s applied steps (s >= 0);
 * base_lr when sc is NULL or its type is NONE. Bitwise DeepSpeed's value. */
double zs_sched_lr(const zs_sched_config_t *sc, double base_lr, int64_t s);

#endif
