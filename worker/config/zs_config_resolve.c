/*
 * zs_config_resolve.c - the parsed DeepSpeed configuration made final for a
 * world size, and printed.
 *
 * What it does: zs_config_resolve derives the batch sizes exactly as
 * DeepSpeed's _set_batch_related_parameters + _batch_assertion do, then
 * cross-checks the fields (stage, offload, fp16/bf16, bucket sizes,
 * scheduler, loss scaling) and fixes the training dtype; zs_config_print
 * writes every field under its DeepSpeed name, with floats in their
 * shortest round-tripping form.
 *
 * What it does not do: it reads no JSON and applies no defaults
 * (zs_config.c does), and it never changes a value the file gave, only the
 * ones DeepSpeed derives.
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
                          "zero_optimization.offload_param: device \"cpu\" needs stage 3 "
                          "(zero_optimization.stage is %d)",
                          cfg->stage);
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

static const char *tf(int b)
{
    return b ? "true" : "false";
}

/* Shortest %g form that reads back as the same float / double. */
static const char *fmt_f(float v, char *buf)
{
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, 32, "%.*g", p, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    return buf;
}

static const char *fmt_d(double v, char *buf)
{
    for (int p = 6; p <= 17; p++) {
        snprintf(buf, 32, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

/* Print every field under its DeepSpeed name; see zs_config.h. */
void zs_config_print(const zs_config_t *cfg, void *fp)
{
    FILE *f = fp;
    char b1[32], b2[32];
    fprintf(f, "train_batch_size = %lld\n", (long long)cfg->train_batch_size);
    fprintf(f, "train_micro_batch_size_per_gpu = %lld\n", (long long)cfg->micro_batch_per_gpu);
    fprintf(f, "gradient_accumulation_steps = %lld\n", (long long)cfg->gradient_accumulation_steps);
    fprintf(f, "gradient_clipping = %s%s\n", fmt_d(cfg->gradient_clipping, b1),
            cfg->gradient_clipping > 0 ? "" : " (off)");
    fprintf(f, "optimizer.type = %s%s\n",
            cfg->adam.adam_w_mode ? "AdamW (decoupled weight decay)" : "Adam (L2 weight decay)",
            cfg->optimizer_given ? "" : " (default: no optimizer section)");
    fprintf(f, "optimizer.params.lr = %s\n", fmt_f(cfg->adam.lr, b1));
    fprintf(f, "optimizer.params.betas = [%s, %s]\n", fmt_f(cfg->adam.beta1, b1),
            fmt_f(cfg->adam.beta2, b2));
    fprintf(f, "optimizer.params.eps = %s\n", fmt_f(cfg->adam.eps, b1));
    fprintf(f, "optimizer.params.weight_decay = %s\n", fmt_f(cfg->adam.weight_decay, b1));
    fprintf(f, "optimizer.params.adam_w_mode = %s\n", tf(cfg->adam.adam_w_mode));
    fprintf(f, "optimizer.params.bias_correction = %s\n", tf(cfg->adam.bias_correction));
    const zs_sched_config_t *s = &cfg->sched;
    fprintf(f, "scheduler.type = %s\n",
            s->type == ZS_SCHED_WARMUP_LR         ? "WarmupLR"
            : s->type == ZS_SCHED_WARMUP_DECAY_LR ? "WarmupDecayLR"
                                                  : "none (constant lr)");
    if (s->type != ZS_SCHED_NONE) {
        fprintf(f, "scheduler.params.warmup_min_lr = %s\n", fmt_d(s->warmup_min_lr, b1));
        fprintf(f, "scheduler.params.warmup_max_lr = %s\n", fmt_d(s->warmup_max_lr, b1));
        fprintf(f, "scheduler.params.warmup_num_steps = %lld\n", (long long)s->warmup_num_steps);
        fprintf(f, "scheduler.params.warmup_type = %s\n",
                s->warmup_type == ZS_WARMUP_LINEAR ? "linear" : "log");
        if (s->type == ZS_SCHED_WARMUP_DECAY_LR)
            fprintf(f, "scheduler.params.total_num_steps = %lld\n", (long long)s->total_num_steps);
    }
    fprintf(f, "precision = %s\n", zs_dtype_name(cfg->dtype));
    fprintf(f, "fp16.enabled = %s\n", tf(cfg->fp16.enabled));
    if (cfg->fp16.enabled) {
        if (cfg->fp16.loss_scale > 0) {
            fprintf(f, "fp16.loss_scale = %s (static)\n", fmt_d(cfg->fp16.loss_scale, b1));
        } else {
            fprintf(f, "fp16.loss_scale = 0 (dynamic)\n");
            fprintf(f, "fp16.initial_scale_power = %d\n", cfg->fp16.initial_scale_power);
            fprintf(f, "fp16.loss_scale_window = %d\n", cfg->fp16.loss_scale_window);
            fprintf(f, "fp16.hysteresis = %d\n", cfg->fp16.hysteresis);
            fprintf(f, "fp16.consecutive_hysteresis = %s\n", tf(cfg->fp16.consecutive_hysteresis));
            fprintf(f, "fp16.min_loss_scale = %s\n", fmt_d(cfg->fp16.min_loss_scale, b1));
        }
    }
    fprintf(f, "bf16.enabled = %s\n", tf(cfg->bf16_enabled));
    fprintf(f, "zero_optimization.stage = %d\n", cfg->stage);
    fprintf(f, "zero_optimization.offload_optimizer.device = %s\n",
            cfg->offload_optimizer ? "cpu" : "none");
    if (cfg->offload_optimizer)
        fprintf(f, "zero_optimization.offload_optimizer.super_offload = %s\n",
                tf(cfg->offload_speculate));
    if (cfg->offload_optimizer && cfg->offload_speculate)
        fprintf(f, "zero_optimization.offload_optimizer.speculate_every_step = %s\n",
                tf(cfg->offload_speculate_every));
    if (cfg->offload_optimizer)
        fprintf(f, "zero_optimization.offload_optimizer.stream_pulls = %s\n",
                tf(cfg->offload_stream));
    fprintf(f, "zero_optimization.offload_param.device = %s\n",
            cfg->offload_param ? "cpu" : "none");
    fprintf(f, "zero_optimization.reduce_bucket_size = %lld\n", (long long)cfg->reduce_bucket_size);
    fprintf(f, "zero_optimization.allgather_bucket_size = %lld\n",
            (long long)cfg->allgather_bucket_size);
    fprintf(f, "zero_optimization.overlap_comm = %s\n", tf(cfg->overlap_comm));
    fprintf(f, "zero_optimization.contiguous_gradients = %s\n", tf(cfg->contiguous_gradients));
    fprintf(f, "zero_optimization.reduce_scatter = %s\n", tf(cfg->reduce_scatter));
    fprintf(f, "zero_optimization.allgather_partitions = %s\n", tf(cfg->allgather_partitions));
    fprintf(f, "zero_optimization.round_robin_gradients = %s\n", tf(cfg->round_robin_gradients));
    fprintf(f, "zero_optimization.sub_group_size = %lld\n", (long long)cfg->sub_group_size);
    fprintf(f, "zero_optimization.stage3_prefetch_bucket_size = %lld\n",
            (long long)cfg->stage3_prefetch_bucket_size);
    fprintf(f, "zero_optimization.stage3_param_persistence_threshold = %lld\n",
            (long long)cfg->stage3_param_persistence_threshold);
    fprintf(f, "zero_optimization.stage3_max_live_parameters = %lld\n",
            (long long)cfg->stage3_max_live_parameters);
    fprintf(f, "zero_optimization.stage3_max_reuse_distance = %lld\n",
            (long long)cfg->stage3_max_reuse_distance);
    fprintf(f, "zero_optimization.stage3_gather_16bit_weights_on_model_save = %s\n",
            tf(cfg->stage3_gather_16bit_weights_on_model_save));
    fprintf(f, "activation_checkpointing = %s\n",
            cfg->act_ckpt ? "every GPT block (section given)" : "off (no section)");
    if (cfg->act_ckpt)
        fprintf(f, "activation_checkpointing.cpu_checkpointing = %s\n", tf(cfg->act_ckpt_cpu));
}
