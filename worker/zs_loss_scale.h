/*
 * zs_loss_scale.h - fp16 loss scaling with DeepSpeed's DynamicLossScaler
 * behaviour (and a static scale when loss_scale > 0).
 *
 * Dynamic: start at 2^initial_scale_power. On an overflow step: the step is
 * skipped; if hysteresis counter > 1 it is decremented and the scale kept,
 * else the scale is halved (not below min_loss_scale) [and the counter is
 * left at 1]. After loss_scale_window consecutive steps without overflow the
 * scale doubles and the hysteresis counter is reset to `hysteresis`.
 * (The exact DeepSpeed rules are spelled out in zs_loss_scale.c and tested.)
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
    int64_t iter;       /* steps seen (overflowed or not) */
} zs_loss_scale_t;

/* Initialise from the fp16 config; for non-fp16 runs pass NULL: scale 1. */
void zs_loss_scale_init(zs_loss_scale_t *ls, const zs_fp16_config_t *fp16);

/* Record the outcome of one step (overflow = any inf/nan in any gradient on
 * any worker) and update the scale for the next step. Returns 1 if this
 * step must be skipped. */
int zs_loss_scale_update(zs_loss_scale_t *ls, int overflow);

/* Serialise to / from 40 bytes (for checkpoints). */
#define ZS_LOSS_SCALE_BYTES 40
void zs_loss_scale_save(const zs_loss_scale_t *ls, uint8_t out[ZS_LOSS_SCALE_BYTES]);
int zs_loss_scale_load(zs_loss_scale_t *ls, const uint8_t in[ZS_LOSS_SCALE_BYTES]);

#endif
