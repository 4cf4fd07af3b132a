/*
 * zs_loss_scale.c - fp16 loss scaling: DeepSpeed's DynamicLossScaler
 * (update_scale with delayed_shift = hysteresis, consecutive_hysteresis,
 * scale_factor 2, scale_window, min_scale, raise_error_at_min_scale), a
 * static scale, and scale 1 for bf16/fp32; 40-byte checkpoint form.
 *
 * What it does not do: detect overflow (the caller reduces an inf/nan flag
 * over all workers and passes it in) or scale anything itself.
 */
#include "zs_loss_scale.h"

#include <math.h>
#include <string.h>

#define WINDOW_BITS  29
#define FLAG_CONSEC  (1u << 29)
#define FLAG_DYNAMIC (1u << 30)
#define FLAG_FP16    (1u << 31)
#define SCALE_FACTOR 2.0

/* Set up the scaler DeepSpeed's CreateLossScaler would build; see header. */
void zs_loss_scale_init(zs_loss_scale_t *ls, const zs_fp16_config_t *fp16)
{
    memset(ls, 0, sizeof *ls);
    ls->scale = 1.0;
    ls->min_scale = 1.0;
    ls->last_overflow_iter = -1;
    ls->iter = 0;
    if (!fp16 || !fp16->enabled)
        return; /* bf16/fp32: LossScaler(1.0), no overflow checks */
    ls->fp16 = 1;
    if (fp16->loss_scale > 0.0) { /* static */
        ls->scale = fp16->loss_scale;
        ls->min_scale = fp16->loss_scale;
        return;
    }
    ls->dynamic = 1;
    ls->scale = ldexp(1.0, fp16->initial_scale_power);
    ls->min_scale = fp16->min_loss_scale;
    ls->window = fp16->loss_scale_window;
    ls->hysteresis = fp16->hysteresis;
    ls->cur_hysteresis = fp16->hysteresis;
    ls->consecutive_hysteresis = fp16->consecutive_hysteresis ? 1 : 0;
}

/* DynamicLossScaler.update_scale, step for step; see header. */
int zs_loss_scale_update(zs_loss_scale_t *ls, int overflow)
{
    if (!ls->fp16) {
        ls->iter++;
        return 0;
    }
    if (!ls->dynamic) {
        ls->iter++;
        return overflow ? 1 : 0;
    }
    if (overflow) {
        if (ls->hysteresis == 1 || ls->cur_hysteresis == 1) {
            if (ls->scale == ls->min_scale)
                return ZS_ERR_RANGE; /* DeepSpeed: "already at minimum", run stops */
            double next = ls->scale / SCALE_FACTOR;
            ls->scale = next > ls->min_scale ? next : ls->min_scale;
        } else {
            ls->cur_hysteresis--;
        }
        ls->last_overflow_iter = ls->iter;
    } else {
        if (ls->consecutive_hysteresis)
            ls->cur_hysteresis = ls->hysteresis;
        int64_t stable = (ls->iter - ls->last_overflow_iter) - 1;
        if (stable > 0 && stable % ls->window == 0) {
            if (!ls->consecutive_hysteresis)
                ls->cur_hysteresis = ls->hysteresis;
            ls->scale *= SCALE_FACTOR;
        }
    }
    ls->iter++;
    return overflow ? 1 : 0;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_f64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    put_u64(p, v);
}

static double get_f64(const uint8_t *p)
{
    uint64_t v = get_u64(p);
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

/* Write the 40-byte little-endian form; see header. */
void zs_loss_scale_save(const zs_loss_scale_t *ls, uint8_t out[ZS_LOSS_SCALE_BYTES])
{
    uint32_t w = (uint32_t)ls->window & ((1u << WINDOW_BITS) - 1);
    if (ls->consecutive_hysteresis)
        w |= FLAG_CONSEC;
    if (ls->dynamic)
        w |= FLAG_DYNAMIC;
    if (ls->fp16)
        w |= FLAG_FP16;
    put_f64(out + 0, ls->scale);
    put_f64(out + 8, ls->min_scale);
    put_u64(out + 16, (uint64_t)ls->last_overflow_iter);
    put_u64(out + 24, (uint64_t)ls->iter);
    for (int i = 0; i < 4; i++)
        out[32 + i] = (uint8_t)(w >> (8 * i));
    out[36] = (uint8_t)(ls->hysteresis & 0xff);
    out[37] = (uint8_t)((ls->hysteresis >> 8) & 0xff);
    out[38] = (uint8_t)(ls->cur_hysteresis & 0xff);
    out[39] = (uint8_t)((ls->cur_hysteresis >> 8) & 0xff);
}

/* Read the 40-byte form back, refusing impossible states; see header. */
int zs_loss_scale_load(zs_loss_scale_t *ls, const uint8_t in[ZS_LOSS_SCALE_BYTES])
{
    zs_loss_scale_t t;
    memset(&t, 0, sizeof t);
    uint32_t w =
        (uint32_t)in[32] | (uint32_t)in[33] << 8 | (uint32_t)in[34] << 16 | (uint32_t)in[35] << 24;
    t.scale = get_f64(in + 0);
    t.min_scale = get_f64(in + 8);
    t.last_overflow_iter = (int64_t)get_u64(in + 16);
    t.iter = (int64_t)get_u64(in + 24);
    t.window = (int)(w & ((1u << WINDOW_BITS) - 1));
    t.consecutive_hysteresis = (w & FLAG_CONSEC) != 0;
    t.dynamic = (w & FLAG_DYNAMIC) != 0;
    t.fp16 = (w & FLAG_FP16) != 0;
    t.hysteresis = in[36] | in[37] << 8;
    t.cur_hysteresis = in[38] | in[39] << 8;

    int ok = isfinite(t.scale) && t.scale > 0.0 && isfinite(t.min_scale) && t.min_scale > 0.0 &&
             t.iter >= 0 && t.last_overflow_iter >= -1 && t.last_overflow_iter < t.iter;
    if (t.dynamic)
        ok = ok && t.fp16 && t.window >= 1 && t.hysteresis >= 1 && t.cur_hysteresis >= 1 &&
             t.cur_hysteresis <= t.hysteresis;
    else
        ok = ok && t.window == 0 && t.hysteresis == 0 && t.cur_hysteresis == 0 &&
             !t.consecutive_hysteresis && t.last_overflow_iter == -1 && (t.fp16 || t.scale == 1.0);
    if (!ok)
        return ZS_ERR_CORRUPT;
    *ls = t;
    return ZS_OK;
}
