/*
 * zs_loss_scale.h - fp16 loss scaling with DeepSpeed's DynamicLossScaler
 * behaviour (deepspeed/runtime/fp16/loss_scaler.py), and a static scale when
 * loss_scale > 0.
 *
 * Dynamic: start at 2^initial_scale_power, hysteresis counter at
 * `hysteresis` (DeepSpeed's delayed_shift), scale factor 2. For step i
 * (counted from 0, overflowed or not):
 *   overflow: the step is skipped. If hysteresis == 1 or the counter is 1,
 *     the scale is halved, not below min_loss_scale (if it already equals
 *     min_loss_scale, DeepSpeed raises "Current loss scale already at
 *     minimum": we return ZS_ERR_RANGE and change nothing); else the counter
 *     is decremented and the scale kept. last_overflow = i.
 *   no overflow: with consecutive_hysteresis the counter is refilled. If
 *     k = i - last_overflow - 1 is > 0 and a multiple of loss_scale_window,
 *     the scale doubles (and, without consecutive_hysteresis, the counter is
 *     refilled). k counts the clean steps before this one since the last
 *     overflow (or since the start, last_overflow = -1), so the scale first
 *     doubles on the (window + 1)-th clean step, then every window steps.
 * After a halving the counter stays at 1 until it is refilled, so a further
 * overflow halves again at once.
 * Static (fp16 with loss_scale > 0): the scale never changes; an overflow
 * step is still skipped (DeepSpeed's ZeRO optimizers check for overflow).
 * bf16/fp32: scale 1, never skips.
 */
#ifndef ZS_LOSS_SCALE_H
#define ZS_LOSS_SCALE_H

#include <stdint.h>

#include "zs_config.h"

typedef struct zs_loss_scale {
    int dynamic;
    double scale;
    double min_scale;
    int window;
    int hysteresis;     /* configured */
    int cur_hysteresis; /* remaining tolerance */
    int64_t last_overflow_iter;
    int64_t iter; /* steps seen (overflowed or not) */
    int fp16;     /* 0: bf16/fp32, scale 1, nothing skipped */
    int consecutive_hysteresis;
} zs_loss_scale_t;

/* Initialise from the fp16 config; for non-fp16 runs pass NULL (or a config
 * with enabled == 0): scale 1. */
void zs_loss_scale_init(zs_loss_scale_t *ls, const zs_fp16_config_t *fp16);

/* Record the outcome of one step (overflow = any inf/nan in any gradient on
 * any worker) and update the scale for the next step. Returns 1 if this
 * step must be skipped, 0 if not, or ZS_ERR_RANGE (< 0, state unchanged)
 * when an overflow finds the scale already at min_loss_scale with no
 * hysteresis left: DeepSpeed stops the run there. */
int zs_loss_scale_update(zs_loss_scale_t *ls, int overflow);

/* Serialise to / from 40 bytes (for checkpoints), little-endian:
 *   [0, 8)   scale (IEEE binary64)
 *   [8, 16)  min_scale (binary64)
 *   [16, 24) last_overflow_iter (int64)
 *   [24, 32) iter (int64)
 *   [32, 36) uint32: bits 0-28 window, bit 29 consecutive_hysteresis,
 *            bit 30 dynamic, bit 31 fp16
 *   [36, 38) hysteresis (uint16)
 *   [38, 40) cur_hysteresis (uint16)
 * Load restores everything (as DeepSpeed restores its scaler object) and
 * returns ZS_ERR_CORRUPT, leaving *ls unchanged, for an impossible state. */
#define ZS_LOSS_SCALE_BYTES 40
void zs_loss_scale_save(const zs_loss_scale_t *ls, uint8_t out[ZS_LOSS_SCALE_BYTES]);
int zs_loss_scale_load(zs_loss_scale_t *ls, const uint8_t in[ZS_LOSS_SCALE_BYTES]);

#endif
