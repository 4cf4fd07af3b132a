/*
 * zs_config.h - DeepSpeed-style JSON configuration (cJSON), resolved.
 *
 * A DeepSpeed user's config file loads as it is. Keys zeroshard implements
 * are read into zs_config_t; keys it recognises but does not implement, and
 * unknown keys, are reported once each by name through the warning callback
 * (never silently misread). Errors name the key and the value.
 *
 * Batch sizes follow DeepSpeed's rules with world size W:
 *   train_batch_size = micro_batch_per_gpu * gradient_accumulation_steps * W
 * Any two given determine the third; one given alone: if train_batch_size,
 * gas = 1 and micro = tbs / W; if micro, gas = 1; if only gas, error. All
 * three given and inconsistent: error. None: error.
 */
#ifndef ZS_CONFIG_H
#define ZS_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "zs_adam.h"
#include "zs_dtype.h"
#include "zs_status.h"

typedef enum { ZS_SCHED_NONE = 0, ZS_SCHED_WARMUP_LR, ZS_SCHED_WARMUP_DECAY_LR } zs_sched_type_t;
typedef enum { ZS_WARMUP_LOG = 0, ZS_WARMUP_LINEAR = 1 } zs_warmup_type_t;

/* DeepSpeed WarmupLR / WarmupDecayLR parameters. */
typedef struct zs_sched_config {
    zs_sched_type_t type;
    double warmup_min_lr;     /* default 0 */
    double warmup_max_lr;     /* default 0.001 */
    int64_t warmup_num_steps; /* default 1000 */
    zs_warmup_type_t warmup_type; /* default log */
    int64_t total_num_steps;  /* WarmupDecayLR only (required there) */
} zs_sched_config_t;

/* fp16 dynamic/static loss scaling (DeepSpeed's keys and defaults). */
typedef struct zs_fp16_config {
    int enabled;
    double loss_scale;          /* 0 = dynamic (default 0) */
    int initial_scale_power;    /* default 16 -> 2^16 */
    int loss_scale_window;      /* default 1000 */
    int hysteresis;             /* default 2 */
    double min_loss_scale;      /* default 1 */
} zs_fp16_config_t;

typedef struct zs_config {
    /* batch sizes, resolved for the world size given to zs_config_resolve */
    int64_t train_batch_size;
    int64_t micro_batch_per_gpu;
    int64_t gradient_accumulation_steps;
    double gradient_clipping; /* 0 = off */

    /* optimizer */
    int optimizer_given;   /* 0: defaults below */
    zs_adam_hparams_t adam; /* type Adam -> adam_w_mode from params (DeepSpeed default 1), AdamW -> 1 */

    zs_sched_config_t sched;

    /* precision: params/grads stored in this dtype, computed in fp32 on CPU */
    zs_dtype_t dtype; /* F32 (default), BF16 (bf16.enabled) or F16 (fp16.enabled) */
    zs_fp16_config_t fp16;

    /* zero_optimization */
    int stage;                      /* 0..3 (default 0) */
    int offload_optimizer;          /* offload_optimizer.device == "cpu" */
    int offload_param;              /* offload_param.device == "cpu" (stage 3) */
    int64_t reduce_bucket_size;     /* elements, default 500000000 */
    int64_t allgather_bucket_size;  /* elements, default 500000000 */
    int overlap_comm;               /* default 0 (stage 3: 1) */
    int contiguous_gradients;       /* default 1 */
    int64_t stage3_prefetch_bucket_size;        /* default 50000000 */
    int64_t stage3_param_persistence_threshold; /* default 100000 */
    int64_t stage3_max_live_parameters;         /* default 1000000000 */
} zs_config_t;

/* Called once per ignored key with its JSON path ("zero_optimization.foo")
 * and why ("not implemented" or "unknown key"). */
typedef void (*zs_config_warn_fn)(void *ud, const char *path, const char *why);

/* Fill *cfg with DeepSpeed's defaults (batch sizes unset = 0). */
void zs_config_defaults(zs_config_t *cfg);

/* Parse JSON text into *cfg (on top of defaults). warn may be NULL (then
 * warnings go to the log). Batch sizes are not resolved yet. */
int zs_config_parse(const char *json, zs_config_t *cfg, zs_config_warn_fn warn, void *ud,
                    zs_err_t *err);

/* Read and parse a file. */
int zs_config_load(const char *path, zs_config_t *cfg, zs_config_warn_fn warn, void *ud,
                   zs_err_t *err);

/* Apply DeepSpeed's batch-size derivation for world size W and check the
 * rest for consistency (stage 0..3, offload_param only with stage 3, fp16
 * and bf16 not both, bucket sizes > 0, ...). */
int zs_config_resolve(zs_config_t *cfg, int world_size, zs_err_t *err);

/* Print the resolved configuration, one key per line, to f (a FILE *). */
void zs_config_print(const zs_config_t *cfg, void *f);

#endif
