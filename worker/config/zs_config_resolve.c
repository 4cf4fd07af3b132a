/*
 * zs_config_resolve.c - the parsed DeepSpeed configuration made final for a
 * world size.
 *
 * What it does: zs_config_resolve derives the batch sizes exactly as
 * DeepSpeed's _set_batch_related_parameters + _batch_assertion do, then
 * cross-checks the fields (stage, offload, fp16/bf16, bucket sizes,
 * scheduler, loss scaling) and fixes the training dtype.
 *
 * What it does not do: it reads no JSON and applies no defaults
 * (zs_config.c does), and it never changes a value the file gave, only the
 * ones DeepSpeed derives; the printed table, its digest and the one-line
 * summary are zs_config_print.c's.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "zs_config.h"

/* Batch derivation exactly as DeepSpeed's _set_batch_related_parameters +
 * _batch_assertion, then the cross-checks; see zs_config.h. */
int zs_config_resolve(zs_config_t *cfg, int world_size, zs_err_t *err)
{
    if (world_size < 1)
        return zs_err_set(err, ZS_ERR_INVALID, "config: world size %d must be >= 1", world_size);
    int64_t W = world_size;
    int64_t tbs = cfg->train_batch_size, mb = cfg->micro_batch_per_gpu;
    int64_t gas = cfg->gradient_accumulation_steps;
    if (tbs < 0 || mb < 0 || gas < 0)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "config: negative batch size (train_batch_size %lld, "
                          "train_micro_batch_size_per_gpu %lld, gradient_accumulation_steps "
                          "%lld)",
                          (long long)tbs, (long long)mb, (long long)gas);
    if (tbs && mb && gas) {
        /* all given: nothing derived */
    } else if (tbs && mb) {
        gas = tbs / mb / W;
    } else if (tbs && gas) {
        mb = tbs / W / gas;
    } else if (mb && gas) {
        if (__builtin_mul_overflow(mb, gas, &tbs) || __builtin_mul_overflow(tbs, W, &tbs))
            return zs_err_set(err, ZS_ERR_RANGE, "config: train_batch_size overflows");
    } else if (tbs) {
        gas = 1;
        mb = tbs / W;
    } else if (mb) {
        if (__builtin_mul_overflow(mb, W, &tbs))
            return zs_err_set(err, ZS_ERR_RANGE, "config: train_batch_size overflows");
        gas = 1;
    } else {
        return zs_err_set(err, ZS_ERR_INVALID,
                          "config: either train_batch_size or train_micro_batch_size_per_gpu "
                          "needs to be provided (as in DeepSpeed)%s",
                          gas ? "; gradient_accumulation_steps alone is not enough" : "");
    }
    if (mb <= 0)
        return zs_err_set(
            err, ZS_ERR_INVALID,
            "config: train_micro_batch_size_per_gpu derived as %lld (train_batch_size "
            "%lld, gradient_accumulation_steps %lld, world size %lld): has to be "
            "greater than 0",
            (long long)mb, (long long)tbs, (long long)gas, (long long)W);
    if (gas <= 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "config: gradient_accumulation_steps derived as %lld (train_batch_size "
                          "%lld, train_micro_batch_size_per_gpu %lld, world size %lld): has to "
                          "be greater than 0",
                          (long long)gas, (long long)tbs, (long long)mb, (long long)W);
    int64_t prod;
    if (__builtin_mul_overflow(mb, gas, &prod) || __builtin_mul_overflow(prod, W, &prod) ||
        tbs != prod)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "config: train_batch_size is not equal to "
                          "train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
                          "world size: %lld != %lld * %lld * %lld",
                          (long long)tbs, (long long)mb, (long long)gas, (long long)W);

    if (cfg->stage < 0 || cfg->stage > 3)
        return zs_err_set(err, ZS_ERR_RANGE, "zero_optimization.stage: %d must be 0, 1, 2 or 3",
                          cfg->stage);
    if (cfg->offload_param && cfg->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.offload_param: device \"%s\" needs stage 3 "
                          "(zero_optimization.stage is %d)",
                          cfg->offload_param_nvme ? "nvme" : "cpu", cfg->stage);
    if (cfg->fp16.enabled && cfg->bf16_enabled)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "fp16.enabled and bf16.enabled are both true: bfloat16 and fp16 "
                          "modes cannot be simultaneously enabled (as in DeepSpeed)");
    if (cfg->reduce_bucket_size <= 0 || cfg->allgather_bucket_size <= 0)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "zero_optimization: reduce_bucket_size %lld and allgather_bucket_size "
                          "%lld must be > 0",
                          (long long)cfg->reduce_bucket_size,
                          (long long)cfg->allgather_bucket_size);
    if (cfg->stage3_prefetch_bucket_size < 0 || cfg->stage3_param_persistence_threshold < 0 ||
        cfg->stage3_max_live_parameters < 0 || cfg->stage3_max_reuse_distance < 0 ||
        cfg->sub_group_size < 0)
        return zs_err_set(err, ZS_ERR_RANGE, "zero_optimization: stage3 sizes must be >= 0");
    if (cfg->zero_hpz_partition_size < 1)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "zero_optimization.zero_hpz_partition_size: %lld must be >= 1",
                          (long long)cfg->zero_hpz_partition_size);
    if (cfg->zero_hpz_partition_size > 1 && cfg->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.zero_hpz_partition_size: %lld keeps a secondary "
                          "partition of stage 3's parameters (ZeRO++ hpZ), but stage is %d "
                          "(hint: stage 3, or 1)",
                          (long long)cfg->zero_hpz_partition_size, cfg->stage);
    if (cfg->zero_quantized_gradients && cfg->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.zero_quantized_gradients: quantizes stage 3's "
                          "gradient reduce-scatters (ZeRO++ qgZ), but stage is %d (hint: stage "
                          "3, or drop the key)",
                          cfg->stage);
    if (cfg->zero_quantized_weights && cfg->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.zero_quantized_weights: quantizes stage 3's "
                          "parameter all-gathers (ZeRO++ qwZ), but stage is %d (hint: stage 3, "
                          "or drop the key)",
                          cfg->stage);
    if (cfg->mics_shard_size > 0 && cfg->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.mics_shard_size: %lld partitions stage 3's "
                          "parameters within shard groups (MiCS), but stage is %d (hint: stage "
                          "3, or -1)",
                          (long long)cfg->mics_shard_size, cfg->stage);
    if (cfg->mics_hierarchical_params_gather && cfg->mics_shard_size <= 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.mics_hierarchical_params_gather: gathers MiCS's "
                          "shard groups in two hops, but mics_shard_size is %lld (off; hint: set "
                          "it, or drop the key)",
                          (long long)cfg->mics_shard_size);
    if (cfg->mics_shard_size > 0 && cfg->zero_hpz_partition_size > 1)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.mics_shard_size %lld with zero_hpz_partition_size "
                          "%lld: hpZ is not combined with MiCS here (hint: one of them)",
                          (long long)cfg->mics_shard_size, (long long)cfg->zero_hpz_partition_size);
    if (cfg->mics_shard_size > 0 && cfg->zero_quantized_gradients)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.mics_shard_size %lld with zero_quantized_gradients: "
                          "qgZ is not combined with MiCS here (hint: one of them)",
                          (long long)cfg->mics_shard_size);
    if (cfg->mics_shard_size > 0 && cfg->zero_quantized_weights)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.mics_shard_size %lld with zero_quantized_weights: "
                          "qwZ is not combined with MiCS here (hint: one of them)",
                          (long long)cfg->mics_shard_size);
    if (!(cfg->gradient_clipping >= 0.0) || !isfinite(cfg->gradient_clipping))
        return zs_err_set(err, ZS_ERR_RANGE, "gradient_clipping: %g must be >= 0",
                          cfg->gradient_clipping);
    if (cfg->sched.type != ZS_SCHED_NONE) {
        if (cfg->sched.warmup_num_steps < 1)
            return zs_err_set(err, ZS_ERR_RANGE,
                              "scheduler.params.warmup_num_steps: %lld must be a positive "
                              "integer",
                              (long long)cfg->sched.warmup_num_steps);
        if (cfg->sched.type == ZS_SCHED_WARMUP_DECAY_LR && cfg->sched.total_num_steps <= 0)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "scheduler.params.total_num_steps: required by WarmupDecayLR "
                              "(DeepSpeed has no default for it)%s",
                              cfg->sched.total_num_steps < 0 ? " and must be > 0" : "");
    }
    if (cfg->fp16.enabled && cfg->fp16.loss_scale == 0.0) {
        const zs_fp16_config_t *f = &cfg->fp16;
        if (f->loss_scale_window < 1 || f->hysteresis < 1 || f->hysteresis > 65535 ||
            f->loss_scale_window > (1 << 29) - 1 || !(f->min_loss_scale > 0.0) ||
            !isfinite(ldexp(1.0, f->initial_scale_power)))
            return zs_err_set(err, ZS_ERR_RANGE,
                              "fp16: dynamic loss scaling needs loss_scale_window >= 1 (%d), "
                              "hysteresis >= 1 (%d), min_loss_scale > 0 (%g), a finite "
                              "2^initial_scale_power (%d)",
                              f->loss_scale_window, f->hysteresis, f->min_loss_scale,
                              f->initial_scale_power);
    }
    if (cfg->fp16.enabled && (!(cfg->fp16.loss_scale >= 0.0) || !isfinite(cfg->fp16.loss_scale)))
        return zs_err_set(err, ZS_ERR_RANGE, "fp16.loss_scale: %g must be >= 0",
                          cfg->fp16.loss_scale);
    cfg->train_batch_size = tbs;
    cfg->micro_batch_per_gpu = mb;
    cfg->gradient_accumulation_steps = gas;
    cfg->dtype = cfg->fp16.enabled   ? ZS_DTYPE_F16
                 : cfg->bf16_enabled ? ZS_DTYPE_BF16
                                     : ZS_DTYPE_F32;
    return ZS_OK;
}
