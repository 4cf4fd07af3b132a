/*
 * zs_config.c - DeepSpeed JSON configuration: the key tables, the section
 * parsers, DeepSpeed's defaults and whole-document rules, parse and load.
 *
 * What the configuration (this file, zs_config_json.c, zs_config_unknown.c,
 * zs_config_resolve.c) does: reads a DeepSpeed config file as DeepSpeed
 * would (relaxed JSON as hjson reads it: comments, trailing commas,
 * newline-separated members; duplicate keys refused), applies DeepSpeed's
 * defaults and its rules (batch-size derivation, optimizer Adam/AdamW
 * selection, scheduler defaults, ZeRO aliases and deprecated keys,
 * overlap_comm default by stage), and reports once, by path, every key it
 * recognises but does not implement ("not implemented") and every key it
 * reads but that changes nothing in zeroshard ("no effect": overlap_comm,
 * contiguous_gradients, ...; the engine does not warn about them again).
 * Unknown keys, at every level it reads, are an error naming each and the
 * closest known key of its level ("did you mean ...?"), unless the caller
 * allows them (then one warning each). DeepSpeed itself refuses unknown keys
 * inside zero_optimization, fp16 and bf16 (pydantic, extra=forbid); a
 * top-level typo there is silently ignored and can train at stage 0, so we
 * refuse it too.
 *
 * What it does not do: it never silently ignores a key, never guesses a
 * value ("auto" is refused), and does not implement the features whose keys
 * it only recognises (NVMe offload, monitors,
 * other optimizers and schedules, ...); it does not look inside the
 * sections of those features.
 *
 * The activation_checkpointing section is read by zs_config_actckpt.c,
 * zero_optimization's offload_optimizer and offload_param by
 * zs_config_offload.c.
 * This file does not read single values, warn, find duplicate keys or relax
 * JSON (zs_config_json.c), compute suggestions or word the unknown-key error
 * (zs_config_unknown.c), nor derive batch sizes, cross-check or print
 * (zs_config_resolve.c).
 */
#include "zs_config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "zs_config_internal.h"

#define FILE_MAX (16u << 20)

/* What the document said, beyond the fields of zs_config_t, needed to apply
 * DeepSpeed's rules once everything is read. */
typedef struct pstate {
    int opt_adamw_type;  /* optimizer.type is AdamW */
    int adam_w_mode;     /* optimizer.params.adam_w_mode (default 1) */
    int torch_adam;      /* optimizer.params.torch_adam */
    int wd_given;        /* optimizer.params.weight_decay given */
    double lr;           /* optimizer lr as a double (default 1e-3) */
    int max_lr_given;    /* scheduler.params.warmup_max_lr given */
    int total_given;     /* scheduler.params.total_num_steps given */
    int overlap_given;   /* zero_optimization.overlap_comm given */
    int offload_opt_key; /* zero_optimization.offload_optimizer given */
    int offload_par_key; /* zero_optimization.offload_param given */
    int fp16_given;      /* fp16 section given */
} pstate_t;

/* ---- sections ------------------------------------------------------------ */

/* Keys each section reads (beyond its *_NOT_IMPLEMENTED list): what an
 * unknown key is compared with for "did you mean". The parsers below match
 * the same names; test_config checks that every suggestion parses. */
static const char *const TOP_KEYS[] = {"train_batch_size",
                                       "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps",
                                       "gradient_clipping",
                                       "optimizer",
                                       "scheduler",
                                       "fp16",
                                       "bf16",
                                       "bfloat16",
                                       "zero_optimization",
                                       "activation_checkpointing",
                                       NULL};
static const char *const OPT_KEYS[] = {"type", "params", "legacy_fusion", NULL};
static const char *const ADAM_KEYS[] = {"lr",
                                        "betas",
                                        "eps",
                                        "weight_decay",
                                        "adam_w_mode",
                                        "bias_correction",
                                        "torch_adam",
                                        "amsgrad",
                                        "max_grad_norm",
                                        NULL};
static const char *const SCHED_KEYS[] = {"type", "params", NULL};
static const char *const SCHED_PARAM_KEYS[] = {"warmup_min_lr",
                                               "warmup_max_lr",
                                               "warmup_num_steps",
                                               "warmup_type",
                                               "total_num_steps",
                                               "last_batch_iteration",
                                               NULL};
static const char *const FP16_KEYS[] = {"enabled",           "loss_scale", "initial_scale_power",
                                        "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                                        "min_loss_scale",    NULL};
static const char *const BF16_KEYS[] = {"enabled", NULL};
/* zero_optimization keys besides ZFIELDS (below) */
static const char *const ZERO_KEYS[] = {"stage",       "offload_optimizer", "offload_param",
                                        "cpu_offload", "cpu_offload_param", NULL};

/* Recognised top-level keys that zeroshard does not implement. */
static const char *const TOP_NOT_IMPLEMENTED[] = {"steps_per_print",
                                                  "wall_clock_breakdown",
                                                  "memory_breakdown",
                                                  "dump_state",
                                                  "disable_allgather",
                                                  "communication_data_type",
                                                  "seq_parallel_comm_data_type",
                                                  "prescale_gradients",
                                                  "gradient_predivide_factor",
                                                  "gradient_allreduce_op",
                                                  "sparse_gradients",
                                                  "sparse_attention",
                                                  "flops_profiler",
                                                  "tensorboard",
                                                  "wandb",
                                                  "csv_monitor",
                                                  "comet",
                                                  "comms_logger",
                                                  "autotuning",
                                                  "elasticity",
                                                  "zero_allow_untested_optimizer",
                                                  "zero_force_ds_cpu_optimizer",
                                                  "amp",
                                                  "torch_autocast",
                                                  "compression_training",
                                                  "quantize_training",
                                                  "eigenvalue",
                                                  "progressive_layer_drop",
                                                  "curriculum_learning",
                                                  "data_efficiency",
                                                  "checkpoint",
                                                  "data_types",
                                                  "aio",
                                                  "dataloader_drop_last",
                                                  "nebula",
                                                  "datastates",
                                                  "pipeline",
                                                  "hybrid_engine",
                                                  "graph_harvesting",
                                                  "vocabulary_size",
                                                  "use_data_before_expert_parallelism",
                                                  "weight_quantization",
                                                  "compile",
                                                  "timers",
                                                  "tensor_parallel",
                                                  "expert_parallel",
                                                  "sequence_parallel_size",
                                                  "managed_gradient_accumulation",
                                                  "log_level",
                                                  "allgather_size",
                                                  NULL};

static const char *const ZERO_NOT_IMPLEMENTED[] = {"load_from_fp32_weights",
                                                   "elastic_checkpoint",
                                                   "use_multi_rank_bucket_allreduce",
                                                   "zenflow",
                                                   "cpu_offload_use_pin_memory",
                                                   "stage3_model_persistence_threshold",
                                                   "model_persistence_threshold",
                                                   "stage3_module_granularity_threshold",
                                                   "module_granularity_threshold",
                                                   "stage3_use_all_reduce_for_fetch_params",
                                                   "use_all_reduce_for_fetch_params",
                                                   "stage3_allgather_sequential",
                                                   "allgather_sequential",
                                                   "stage3_partition_stream_chunk_size",
                                                   "partition_stream_chunk_size",
                                                   "ignore_unused_parameters",
                                                   "legacy_stage1",
                                                   "zero_quantized_nontrainable_weights",
                                                   "zeropp_loco_param",
                                                   "memory_efficient_linear",
                                                   "pipeline_loading_checkpoint",
                                                   "override_module_apply",
                                                   "log_trace_cache_warnings",
                                                   "enable_sanity_checks",
                                                   "save_muon_momentum_buffer_in_memory",
                                                   "leaf_module",
                                                   NULL};

static const char *const FP16_NOT_IMPLEMENTED[] = {"auto_cast", "fp16_master_weights_and_grads",
                                                   "fused_mode", NULL};

static const char *const BF16_NOT_IMPLEMENTED[] = {"immediate_grad_update", "check_grad_overflow",
                                                   "bf16_master_weights_and_grads",
                                                   "bf16_optimizer_states", NULL};

/* optimizer.params keys that DeepSpeed's Adam classes take but we ignore. */
static const char *const ADAM_NOT_IMPLEMENTED[] = {"set_grad_none", "fp32_optimizer_states", NULL};

static int parse_batch(pctx_t *c, const cJSON *v, const char *path, int64_t *out)
{
    if (cJSON_IsNull(v)) { /* DeepSpeed: None = not given */
        *out = 0;
        return ZS_OK;
    }
    /* DeepSpeed's _batch_assertion refuses anything <= 0 once derived; a
     * given value is never changed by the derivation, so refuse it here. */
    return zs__cfg_get_int(c, v, path, 1, INT64_MAX / 4, out);
}

static int parse_optimizer(pctx_t *c, const cJSON *o, zs_config_t *cfg, pstate_t *st)
{
    int rc = zs__cfg_expect_object(c, o, "optimizer");
    if (rc != ZS_OK)
        return rc;
    const cJSON *type = NULL, *params = NULL;
    for (const cJSON *it = o->child; it; it = it->next) {
        if (strcmp(it->string, "type") == 0)
            type = it;
        else if (strcmp(it->string, "params") == 0)
            params = it;
        else if (strcmp(it->string, "legacy_fusion") == 0)
            zs__cfg_warn_key(c, "optimizer", it->string, "not implemented");
        else
            zs__cfg_unknown_in(c, "optimizer", it->string, OPT_KEYS, NULL);
    }
    if (!type)
        return zs_err_set(c->err, ZS_ERR_INVALID,
                          "optimizer: no \"type\" (zeroshard implements \"Adam\" and \"AdamW\")");
    const char *tname = "";
    if ((rc = zs__cfg_get_string(c, type, "optimizer.type", &tname)) != ZS_OK)
        return rc;
    if (zs__cfg_ci_equal(tname, "adam"))
        st->opt_adamw_type = 0;
    else if (zs__cfg_ci_equal(tname, "adamw"))
        st->opt_adamw_type = 1;
    else
        return zs_err_set(c->err, ZS_ERR_INVALID,
                          "optimizer.type: \"%.64s\" is not implemented (zeroshard implements "
                          "\"Adam\" and \"AdamW\", case-insensitive as in DeepSpeed)",
                          tname);
    cfg->optimizer_given = 1;
    if (!params || cJSON_IsNull(params))
        return ZS_OK;
    if ((rc = zs__cfg_expect_object(c, params, "optimizer.params")) != ZS_OK)
        return rc;
    for (const cJSON *it = params->child; it; it = it->next) {
        char p[PATH_MAX_LEN];
        const char *k = it->string;
        double d = 0.0;
        zs__cfg_path_join(p, "optimizer.params", k);
        if (strcmp(k, "lr") == 0) {
            if ((rc = zs__cfg_get_num_min(c, it, p, 0.0, 0, &d)) != ZS_OK)
                return rc;
            st->lr = d;
            cfg->adam.lr = (float)d;
        } else if (strcmp(k, "betas") == 0) {
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
                return zs__cfg_err_type(c, it, p, "[beta1, beta2]");
            double b[2] = {0.0, 0.0};
            for (int j = 0; j < 2; j++) {
                const cJSON *e = cJSON_GetArrayItem(it, j);
                if ((rc = zs__cfg_get_num(c, e, p, &b[j])) != ZS_OK)
                    return rc;
                if (!(b[j] >= 0.0 && b[j] < 1.0))
                    return zs__cfg_err_value(c, it, p, "must both be in [0, 1)");
            }
            cfg->adam.beta1 = (float)b[0];
            cfg->adam.beta2 = (float)b[1];
        } else if (strcmp(k, "eps") == 0) {
            if ((rc = zs__cfg_get_num_min(c, it, p, 0.0, 0, &d)) != ZS_OK)
                return rc;
            cfg->adam.eps = (float)d;
        } else if (strcmp(k, "weight_decay") == 0) {
            if ((rc = zs__cfg_get_num_min(c, it, p, 0.0, 0, &d)) != ZS_OK)
                return rc;
            cfg->adam.weight_decay = (float)d;
            st->wd_given = 1;
        } else if (strcmp(k, "adam_w_mode") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &st->adam_w_mode)) != ZS_OK)
                return rc;
        } else if (strcmp(k, "bias_correction") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &cfg->adam.bias_correction)) != ZS_OK)
                return rc;
        } else if (strcmp(k, "torch_adam") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &st->torch_adam)) != ZS_OK)
                return rc;
            zs__cfg_warn_once(c, p,
                              "not implemented: zeroshard's CPU Adam kernel runs (the same math as "
                              "torch.optim); torch's default weight_decay (AdamW 0.01) applies if "
                              "weight_decay is not given");
        } else if (strcmp(k, "amsgrad") == 0) {
            int a = 0;
            if ((rc = zs__cfg_get_bool(c, it, p, &a)) != ZS_OK)
                return rc;
            if (a)
                return zs_err_set(c->err, ZS_ERR_INVALID,
                                  "%s: true is not implemented (neither does DeepSpeed's "
                                  "FusedAdam/CPU Adam implement AMSGrad)",
                                  p);
        } else if (strcmp(k, "max_grad_norm") == 0) {
            return zs_err_set(c->err, ZS_ERR_INVALID,
                              "%s: not supported as an optimizer parameter (DeepSpeed refuses "
                              "it too): use the top-level \"gradient_clipping\"",
                              p);
        } else if (zs__cfg_in_list(k, ADAM_NOT_IMPLEMENTED)) {
            zs__cfg_warn_once(c, p, "not implemented");
        } else {
            zs__cfg_unknown_in(c, "optimizer.params", k, ADAM_KEYS, ADAM_NOT_IMPLEMENTED);
        }
    }
    return ZS_OK;
}

static int parse_scheduler(pctx_t *c, const cJSON *o, zs_config_t *cfg, pstate_t *st)
{
    int rc = zs__cfg_expect_object(c, o, "scheduler");
    if (rc != ZS_OK)
        return rc;
    const cJSON *type = NULL, *params = NULL;
    for (const cJSON *it = o->child; it; it = it->next) {
        if (strcmp(it->string, "type") == 0)
            type = it;
        else if (strcmp(it->string, "params") == 0)
            params = it;
        else
            zs__cfg_unknown_in(c, "scheduler", it->string, SCHED_KEYS, NULL);
    }
    if (!type)
        return zs_err_set(c->err, ZS_ERR_INVALID,
                          "scheduler: no \"type\" (zeroshard implements \"WarmupLR\" and "
                          "\"WarmupDecayLR\")");
    const char *tname = "";
    if ((rc = zs__cfg_get_string(c, type, "scheduler.type", &tname)) != ZS_OK)
        return rc;
    /* DeepSpeed looks the class up by exact name (getattr). */
    if (strcmp(tname, "WarmupLR") == 0)
        cfg->sched.type = ZS_SCHED_WARMUP_LR;
    else if (strcmp(tname, "WarmupDecayLR") == 0)
        cfg->sched.type = ZS_SCHED_WARMUP_DECAY_LR;
    else
        return zs_err_set(c->err, ZS_ERR_INVALID,
                          "scheduler.type: \"%.64s\" is not implemented (zeroshard implements "
                          "\"WarmupLR\" and \"WarmupDecayLR\", spelled exactly so)",
                          tname);
    if (!params || cJSON_IsNull(params))
        return ZS_OK;
    if ((rc = zs__cfg_expect_object(c, params, "scheduler.params")) != ZS_OK)
        return rc;
    for (const cJSON *it = params->child; it; it = it->next) {
        char p[PATH_MAX_LEN];
        const char *k = it->string;
        zs__cfg_path_join(p, "scheduler.params", k);
        if (strcmp(k, "warmup_min_lr") == 0) {
            if ((rc = zs__cfg_get_num(c, it, p, &cfg->sched.warmup_min_lr)) != ZS_OK)
                return rc;
        } else if (strcmp(k, "warmup_max_lr") == 0) {
            if ((rc = zs__cfg_get_num(c, it, p, &cfg->sched.warmup_max_lr)) != ZS_OK)
                return rc;
            st->max_lr_given = 1;
        } else if (strcmp(k, "warmup_num_steps") == 0) {
            /* DeepSpeed: "warmup_num_steps must be a positive integer" */
            if ((rc = zs__cfg_get_int(c, it, p, 1, INT64_MAX / 4, &cfg->sched.warmup_num_steps)) !=
                ZS_OK)
                return rc;
        } else if (strcmp(k, "warmup_type") == 0) {
            const char *w = "";
            if ((rc = zs__cfg_get_string(c, it, p, &w)) != ZS_OK)
                return rc;
            if (strcmp(w, "log") == 0) {
                cfg->sched.warmup_type = ZS_WARMUP_LOG;
            } else if (strcmp(w, "linear") == 0) {
                cfg->sched.warmup_type = ZS_WARMUP_LINEAR;
            } else {
                /* DeepSpeed warns and falls back to log; so do we, loudly. */
                cfg->sched.warmup_type = ZS_WARMUP_LOG;
                char why[160];
                snprintf(why, sizeof why,
                         "unknown value \"%.40s\": using \"log\", as DeepSpeed does "
                         "(valid: \"log\", \"linear\")",
                         w);
                zs__cfg_warn_once(c, p, why);
            }
        } else if (strcmp(k, "total_num_steps") == 0) {
            if (cfg->sched.type != ZS_SCHED_WARMUP_DECAY_LR)
                return zs_err_set(c->err, ZS_ERR_INVALID,
                                  "%s: WarmupLR takes no total_num_steps (DeepSpeed raises "
                                  "TypeError); use \"WarmupDecayLR\" for a decay",
                                  p);
            if ((rc = zs__cfg_get_int(c, it, p, 1, INT64_MAX / 4, &cfg->sched.total_num_steps)) !=
                ZS_OK)
                return rc;
            st->total_given = 1;
        } else if (strcmp(k, "last_batch_iteration") == 0) {
            zs__cfg_warn_once(
                c, p,
                "not implemented: the schedule position comes from the optimizer step "
                "count");
        } else {
            zs__cfg_unknown_in(c, "scheduler.params", k, SCHED_PARAM_KEYS, NULL);
        }
    }
    return ZS_OK;
}

static int parse_fp16(pctx_t *c, const cJSON *o, zs_config_t *cfg)
{
    int rc = zs__cfg_expect_object(c, o, "fp16");
    if (rc != ZS_OK)
        return rc;
    zs_fp16_config_t *f = &cfg->fp16;
    for (const cJSON *it = o->child; it; it = it->next) {
        char p[PATH_MAX_LEN];
        const char *k = it->string;
        zs__cfg_path_join(p, "fp16", k);
        if (strcmp(k, "enabled") == 0) {
            rc = zs__cfg_get_bool(c, it, p, &f->enabled);
        } else if (strcmp(k, "loss_scale") == 0) {
            rc = zs__cfg_get_num_min(c, it, p, 0.0, 0, &f->loss_scale);
        } else if (strcmp(k, "initial_scale_power") == 0) {
            rc = zs__cfg_get_int32(c, it, p, -1000, 1000, &f->initial_scale_power);
        } else if (strcmp(k, "loss_scale_window") == 0) {
            /* positive (DeepSpeed validate_positive_int); the checkpoint
             * format (zs_loss_scale.h) keeps 29 bits */
            rc = zs__cfg_get_int32(c, it, p, 1, (1 << 29) - 1, &f->loss_scale_window);
        } else if (strcmp(k, "hysteresis") == 0) {
            rc = zs__cfg_get_int32(c, it, p, 1, 65535, &f->hysteresis);
        } else if (strcmp(k, "consecutive_hysteresis") == 0) {
            rc = zs__cfg_get_bool(c, it, p, &f->consecutive_hysteresis);
        } else if (strcmp(k, "min_loss_scale") == 0) {
            rc = zs__cfg_get_num_min(c, it, p, 0.0, 1, &f->min_loss_scale);
        } else if (zs__cfg_in_list(k, FP16_NOT_IMPLEMENTED)) {
            zs__cfg_warn_once(c, p, "not implemented");
        } else {
            zs__cfg_unknown_in(c, "fp16", k, FP16_KEYS, FP16_NOT_IMPLEMENTED);
        }
        if (rc != ZS_OK)
            return rc;
    }
    return ZS_OK;
}

static int parse_bf16(pctx_t *c, const cJSON *o, const char *name, zs_config_t *cfg)
{
    int rc = zs__cfg_expect_object(c, o, name);
    if (rc != ZS_OK)
        return rc;
    for (const cJSON *it = o->child; it; it = it->next) {
        char p[PATH_MAX_LEN];
        zs__cfg_path_join(p, name, it->string);
        if (strcmp(it->string, "enabled") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &cfg->bf16_enabled)) != ZS_OK)
                return rc;
        } else if (zs__cfg_in_list(it->string, BF16_NOT_IMPLEMENTED)) {
            zs__cfg_warn_once(c, p, "not implemented");
        } else {
            zs__cfg_unknown_in(c, name, it->string, BF16_KEYS, BF16_NOT_IMPLEMENTED);
        }
    }
    return ZS_OK;
}

/* Why a zero_optimization key that is read (type-checked, printed) changes
 * nothing in zeroshard: the engine does one thing whatever the value says.
 * Each is warned about once when the file gives it ("no effect: ..."); the
 * engine does not warn about them again. */
#define NE_OVERLAP                                                                                 \
    "no effect: stages 2-3 always overlap the gradient reduce-scatter with backward, stages "      \
    "0-1 always reduce after the last micro-batch"
#define NE_CONTIGUOUS "no effect: gradients are always contiguous per bucket"
#define NE_REDUCE_SCATTER                                                                          \
    "no effect: stages 2-3 always reduce-scatter gradients, stages 0-1 always all-reduce them"
#define NE_ALLGATHER_PARTITIONS "no effect: updated partitions are always all-gathered"
#define NE_ROUND_ROBIN          "no effect: gradient partitions are always pushed in bucket order"
#define NE_SUB_GROUP            "no effect: the optimizer runs per segment partition"
#define NE_ALLGATHER_BUCKET                                                                        \
    "no effect: stages 1-2 all-gather per gradient bucket (reduce_bucket_size)"
#define NE_GATHER_16BIT "no effect: checkpoints keep the fp32 master weights on the servers"

/* zero_optimization fields with their DeepSpeed aliases. */
enum { ZF_SIZE, ZF_BOOL, ZF_SHARD }; /* ZF_SHARD: -1 (off) or a count */
typedef struct zfield {
    const char *names[3]; /* canonical first; NULL-terminated */
    int kind;
    size_t off;
    const char *no_effect; /* NULL: implemented; else why the value changes nothing */
} zfield_t;

static const zfield_t ZFIELDS[] = {
    {{"reduce_bucket_size", NULL, NULL}, ZF_SIZE, offsetof(zs_config_t, reduce_bucket_size), NULL},
    {{"allgather_bucket_size", NULL, NULL},
     ZF_SIZE,
     offsetof(zs_config_t, allgather_bucket_size),
     NE_ALLGATHER_BUCKET},
    {{"overlap_comm", NULL, NULL}, ZF_BOOL, offsetof(zs_config_t, overlap_comm), NE_OVERLAP},
    {{"contiguous_gradients", NULL, NULL},
     ZF_BOOL,
     offsetof(zs_config_t, contiguous_gradients),
     NE_CONTIGUOUS},
    {{"reduce_scatter", NULL, NULL},
     ZF_BOOL,
     offsetof(zs_config_t, reduce_scatter),
     NE_REDUCE_SCATTER},
    {{"allgather_partitions", NULL, NULL},
     ZF_BOOL,
     offsetof(zs_config_t, allgather_partitions),
     NE_ALLGATHER_PARTITIONS},
    {{"round_robin_gradients", NULL, NULL},
     ZF_BOOL,
     offsetof(zs_config_t, round_robin_gradients),
     NE_ROUND_ROBIN},
    {{"sub_group_size", NULL, NULL}, ZF_SIZE, offsetof(zs_config_t, sub_group_size), NE_SUB_GROUP},
    {{"zero_quantized_gradients", NULL, NULL},
     ZF_BOOL,
     offsetof(zs_config_t, zero_quantized_gradients),
     NULL},
    {{"zero_hpz_partition_size", NULL, NULL},
     ZF_SIZE,
     offsetof(zs_config_t, zero_hpz_partition_size),
     NULL},
    {{"zero_quantized_weights", NULL, NULL},
     ZF_BOOL,
     offsetof(zs_config_t, zero_quantized_weights),
     NULL},
    {{"mics_shard_size", NULL, NULL}, ZF_SHARD, offsetof(zs_config_t, mics_shard_size), NULL},
    {{"mics_hierarchical_params_gather", NULL, NULL},
     ZF_BOOL,
     offsetof(zs_config_t, mics_hierarchical_params_gather),
     NULL},
    {{"stage3_prefetch_bucket_size", "prefetch_bucket_size", NULL},
     ZF_SIZE,
     offsetof(zs_config_t, stage3_prefetch_bucket_size),
     NULL},
    {{"stage3_param_persistence_threshold", "param_persistence_threshold", NULL},
     ZF_SIZE,
     offsetof(zs_config_t, stage3_param_persistence_threshold),
     NULL},
    {{"stage3_max_live_parameters", "max_live_parameters", NULL},
     ZF_SIZE,
     offsetof(zs_config_t, stage3_max_live_parameters),
     NULL},
    {{"stage3_max_reuse_distance", "max_reuse_distance", NULL},
     ZF_SIZE,
     offsetof(zs_config_t, stage3_max_reuse_distance),
     NULL},
    {{"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
      "stage3_gather_fp16_weights_on_model_save"},
     ZF_BOOL,
     offsetof(zs_config_t, stage3_gather_16bit_weights_on_model_save),
     NE_GATHER_16BIT},
};
#define NZFIELDS (sizeof ZFIELDS / sizeof ZFIELDS[0])

static int parse_zero(pctx_t *c, const cJSON *o, zs_config_t *cfg, pstate_t *st)
{
    if (cJSON_IsBool(o)) {
        /* DeepSpeed's deprecated form: true = stage 1, false = stage 0 */
        cfg->stage = cJSON_IsTrue(o) ? 1 : 0;
        zs__cfg_warn_once(c, "zero_optimization",
                          "deprecated: a boolean means stage 1 (true) or 0 (false); use "
                          "{\"stage\": N}");
        return ZS_OK;
    }
    int rc = zs__cfg_expect_object(c, o, "zero_optimization");
    if (rc != ZS_OK)
        return rc;
    const char *seen[NZFIELDS] = {0};
    int cpu_offload = -1, cpu_offload_param = -1;
    for (const cJSON *it = o->child; it; it = it->next) {
        char p[PATH_MAX_LEN];
        const char *k = it->string;
        zs__cfg_path_join(p, "zero_optimization", k);
        if (strcmp(k, "stage") == 0) {
            if ((rc = zs__cfg_get_int32(c, it, p, 0, 3, &cfg->stage)) != ZS_OK)
                return rc;
            continue;
        }
        if (strcmp(k, "offload_optimizer") == 0) {
            st->offload_opt_key = 1;
            if ((rc = zs__cfg_parse_offload(c, it, p, 0, cfg)) != ZS_OK)
                return rc;
            continue;
        }
        if (strcmp(k, "offload_param") == 0) {
            st->offload_par_key = 1;
            if ((rc = zs__cfg_parse_offload(c, it, p, 1, cfg)) != ZS_OK)
                return rc;
            continue;
        }
        if (strcmp(k, "cpu_offload") == 0 || strcmp(k, "cpu_offload_param") == 0) {
            int b = 0;
            if ((rc = zs__cfg_get_bool(c, it, p, &b)) != ZS_OK)
                return rc;
            if (strcmp(k, "cpu_offload") == 0) {
                cpu_offload = b;
                zs__cfg_warn_once(c, p,
                                  "deprecated: read as offload_optimizer.device = \"cpu\" if true");
            } else {
                cpu_offload_param = b;
                zs__cfg_warn_once(c, p,
                                  "deprecated: read as offload_param.device = \"cpu\" if true");
            }
            continue;
        }
        size_t f;
        int alias = -1;
        for (f = 0; f < NZFIELDS; f++) {
            for (int a = 0; a < 3 && ZFIELDS[f].names[a]; a++)
                if (strcmp(k, ZFIELDS[f].names[a]) == 0)
                    alias = a;
            if (alias >= 0)
                break;
        }
        if (alias >= 0) {
            if (seen[f])
                return zs_err_set(c->err, ZS_ERR_INVALID,
                                  "%s: given twice, also as zero_optimization.%s", p, seen[f]);
            seen[f] = k;
            void *dst = (char *)cfg + ZFIELDS[f].off;
            if (ZFIELDS[f].kind == ZF_SIZE)
                rc = zs__cfg_get_int(c, it, p, 0, INT64_MAX / 4, (int64_t *)dst);
            else if (ZFIELDS[f].kind == ZF_SHARD)
                rc = zs__cfg_get_int(c, it, p, -1, INT32_MAX, (int64_t *)dst);
            else
                rc = zs__cfg_get_bool(c, it, p, (int *)dst);
            if (rc != ZS_OK)
                return rc;
            /* one warning per path: a deprecated spelling says both things */
            if (alias == 2) {
                char why[256];
                snprintf(why, sizeof why,
                         "deprecated: read as gather_16bit_weights_on_model_save%s%s",
                         ZFIELDS[f].no_effect ? "; " : "",
                         ZFIELDS[f].no_effect ? ZFIELDS[f].no_effect : "");
                zs__cfg_warn_once(c, p, why);
            } else if (ZFIELDS[f].no_effect) {
                zs__cfg_warn_once(c, p, ZFIELDS[f].no_effect);
            }
            if (ZFIELDS[f].off == offsetof(zs_config_t, overlap_comm))
                st->overlap_given = 1;
            continue;
        }
        if (zs__cfg_in_list(k, ZERO_NOT_IMPLEMENTED)) {
            zs__cfg_warn_once(c, p, "not implemented");
        } else {
            cfg_near_t n;
            zs__cfg_near_init(&n, k);
            zs__cfg_near_add_list(&n, ZERO_KEYS);
            for (size_t z = 0; z < NZFIELDS; z++)
                for (int a = 0; a < 3 && ZFIELDS[z].names[a]; a++)
                    zs__cfg_near_add(&n, ZFIELDS[z].names[a]);
            zs__cfg_near_add_list(&n, ZERO_NOT_IMPLEMENTED);
            zs__cfg_unknown(c, "zero_optimization", k, &n);
        }
    }
    /* deprecated switches: DeepSpeed refuses them next to their replacement */
    if (cpu_offload >= 0) {
        if (st->offload_opt_key)
            return zs_err_set(c->err, ZS_ERR_INVALID,
                              "zero_optimization.cpu_offload: deprecated, and given together "
                              "with its replacement zero_optimization.offload_optimizer");
        cfg->offload_optimizer = cpu_offload;
    }
    if (cpu_offload_param >= 0) {
        if (st->offload_par_key)
            return zs_err_set(c->err, ZS_ERR_INVALID,
                              "zero_optimization.cpu_offload_param: deprecated, and given "
                              "together with its replacement zero_optimization.offload_param");
        cfg->offload_param = cpu_offload_param;
    }
    return ZS_OK;
}

static int parse_root(pctx_t *c, const cJSON *root, zs_config_t *cfg, pstate_t *st)
{
    int rc = ZS_OK;
    const cJSON *bf16 = cJSON_GetObjectItemCaseSensitive(root, "bf16");
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *k = it->string;
        if (strcmp(k, "train_batch_size") == 0) {
            rc = parse_batch(c, it, k, &cfg->train_batch_size);
        } else if (strcmp(k, "train_micro_batch_size_per_gpu") == 0) {
            rc = parse_batch(c, it, k, &cfg->micro_batch_per_gpu);
        } else if (strcmp(k, "gradient_accumulation_steps") == 0) {
            rc = parse_batch(c, it, k, &cfg->gradient_accumulation_steps);
        } else if (strcmp(k, "gradient_clipping") == 0) {
            rc = zs__cfg_get_num_min(c, it, k, 0.0, 0, &cfg->gradient_clipping);
        } else if (strcmp(k, "optimizer") == 0) {
            rc = parse_optimizer(c, it, cfg, st);
        } else if (strcmp(k, "scheduler") == 0) {
            rc = parse_scheduler(c, it, cfg, st);
        } else if (strcmp(k, "fp16") == 0) {
            st->fp16_given = 1;
            rc = parse_fp16(c, it, cfg);
        } else if (strcmp(k, "bf16") == 0) {
            rc = parse_bf16(c, it, k, cfg);
        } else if (strcmp(k, "bfloat16") == 0) {
            /* DeepSpeed's old name, read only when "bf16" is absent */
            if (bf16)
                zs__cfg_warn_once(c, k,
                                  "not implemented: ignored because \"bf16\" is given (as in "
                                  "DeepSpeed)");
            else
                rc = parse_bf16(c, it, k, cfg);
        } else if (strcmp(k, "zero_optimization") == 0) {
            rc = parse_zero(c, it, cfg, st);
        } else if (strcmp(k, "activation_checkpointing") == 0) {
            rc = zs__cfg_parse_actckpt(c, it, cfg);
        } else if (zs__cfg_in_list(k, TOP_NOT_IMPLEMENTED)) {
            zs__cfg_warn_once(c, k, "not implemented");
        } else {
            rc = zs__cfg_unknown_in(c, "", k, TOP_KEYS, TOP_NOT_IMPLEMENTED);
        }
        if (rc != ZS_OK)
            return rc;
    }
    return ZS_OK;
}

/* DeepSpeed's rules that need the whole document. */
static void finish(pctx_t *c, zs_config_t *cfg, pstate_t *st)
{
    /* engine._configure_basic_optimizer: "Adam" gives AdamW unless
     * adam_w_mode is false; "AdamW" always AdamW. */
    cfg->adam.adam_w_mode = (st->opt_adamw_type || st->adam_w_mode) ? 1 : 0;
    if (st->torch_adam && cfg->adam.adam_w_mode && !st->wd_given)
        cfg->adam.weight_decay = 0.01f; /* torch.optim.AdamW's default */
    /* WarmupLR: warmup_max_lr defaults to the optimizer's lr (current
     * lr_schedules.py; older releases used 0.001); WarmupDecayLR passes its
     * own default 0.001. */
    if (!st->max_lr_given)
        cfg->sched.warmup_max_lr = cfg->sched.type == ZS_SCHED_WARMUP_LR ? st->lr : 0.001;
    if (cfg->sched.type == ZS_SCHED_WARMUP_DECAY_LR && st->total_given) {
        int64_t n = cfg->sched.warmup_num_steps < 2 ? 2 : cfg->sched.warmup_num_steps;
        if (cfg->sched.total_num_steps < n) {
            char why[160];
            snprintf(why, sizeof why,
                     "%lld is less than warmup_num_steps %lld: the lr drops to warmup_min_lr "
                     "after warmup (as in DeepSpeed)",
                     (long long)cfg->sched.total_num_steps, (long long)n);
            zs__cfg_warn_once(c, "scheduler.params.total_num_steps", why);
        }
    }
    /* zero/config.py overlap_comm_valid: None -> stage == 3 */
    if (!st->overlap_given)
        cfg->overlap_comm = cfg->stage == 3;
    cfg->dtype = cfg->fp16.enabled   ? ZS_DTYPE_F16
                 : cfg->bf16_enabled ? ZS_DTYPE_BF16
                                     : ZS_DTYPE_F32;
}

/* ---- public API ---------------------------------------------------------- */

/* DeepSpeed's defaults (FusedAdam/DeepSpeedCPUAdam for the optimizer). */
void zs_config_defaults(zs_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->gradient_clipping = 0.0;
    cfg->optimizer_given = 0;
    cfg->adam.lr = 1e-3f;
    cfg->adam.beta1 = 0.9f;
    cfg->adam.beta2 = 0.999f;
    cfg->adam.eps = 1e-8f;
    cfg->adam.weight_decay = 0.0f;
    cfg->adam.adam_w_mode = 1;
    cfg->adam.bias_correction = 1;
    cfg->sched.type = ZS_SCHED_NONE;
    cfg->sched.warmup_min_lr = 0.0;
    cfg->sched.warmup_max_lr = 0.001;
    cfg->sched.warmup_num_steps = 1000;
    cfg->sched.warmup_type = ZS_WARMUP_LOG;
    cfg->sched.total_num_steps = 0;
    cfg->dtype = ZS_DTYPE_F32;
    cfg->fp16.enabled = 0;
    cfg->fp16.loss_scale = 0.0;
    cfg->fp16.initial_scale_power = 16;
    cfg->fp16.loss_scale_window = 1000;
    cfg->fp16.hysteresis = 2;
    cfg->fp16.min_loss_scale = 1.0;
    cfg->fp16.consecutive_hysteresis = 0;
    cfg->stage = 0;
    cfg->offload_optimizer = 0;
    cfg->offload_speculate = ZS_CFG_SPECULATE_DEFAULT;
    cfg->offload_stream = 1;
    cfg->offload_delay_after = -1;
    cfg->offload_param = 0;
    cfg->offload_param_nvme = 0;
    cfg->offload_param_buffer_count = 5;        /* DeepSpeed's defaults */
    cfg->offload_param_buffer_size = 100000000; /* elements */
    cfg->offload_param_max_in_cpu = 1000000000; /* elements */
    cfg->reduce_bucket_size = 500000000;
    cfg->allgather_bucket_size = 500000000;
    cfg->overlap_comm = 0;
    cfg->contiguous_gradients = 1;
    cfg->stage3_prefetch_bucket_size = 50000000;
    cfg->stage3_param_persistence_threshold = 100000;
    cfg->stage3_max_live_parameters = 1000000000;
    cfg->stage3_max_reuse_distance = 1000000000;
    cfg->stage3_gather_16bit_weights_on_model_save = 0;
    cfg->reduce_scatter = 1;
    cfg->allgather_partitions = 1;
    cfg->round_robin_gradients = 0;
    cfg->sub_group_size = 1000000000;
    cfg->bf16_enabled = 0;
    cfg->zero_quantized_weights = 0;
    cfg->zero_hpz_partition_size = 1;
    cfg->zero_quantized_gradients = 0;
    cfg->mics_shard_size = -1;
    cfg->mics_hierarchical_params_gather = 0;
    cfg->act_ckpt = 0;
    cfg->act_ckpt_cpu = 0;
}

/* Parse a DeepSpeed config text; see zs_config.h. */
int zs_config_parse(const char *json, zs_config_t *cfg, zs_config_warn_fn warn, void *ud,
                    zs_err_t *err)
{
    zs_config_opts_t o = {warn, ud, 0};
    return zs_config_parse_opts(json, &o, cfg, err);
}

/* Parse a DeepSpeed config text under the given options; see zs_config.h. */
int zs_config_parse_opts(const char *json, const zs_config_opts_t *opts, zs_config_t *cfg,
                         zs_err_t *err)
{
    if (!json || !cfg)
        return zs_err_set(err, ZS_ERR_INVALID, "config: no text or no config to fill");
    pctx_t *c = calloc(1, sizeof *c);
    char *text = zs__cfg_relax_json(json);
    if (!c || !text) {
        free(c);
        free(text);
        return zs_err_set(err, ZS_ERR_NOMEM, "config: out of memory");
    }
    if (opts) {
        c->warn = opts->warn;
        c->ud = opts->ud;
        c->allow_unknown = opts->allow_unknown;
    }
    c->err = err;
    int rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        int line = 1, col = 1;
        const char *at = end ? end : text;
        for (const char *q = text; q < at && *q; q++) {
            if (*q == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        char near[24];
        size_t k = 0;
        for (; k < sizeof near - 1 && at[k] && at[k] != '\n'; k++)
            near[k] = at[k];
        near[k] = '\0';
        rc = zs_err_set(err, ZS_ERR_INVALID,
                        "config: not valid JSON at line %d, column %d, near '%s'", line, col, near);
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        rc = zs_err_set(err, ZS_ERR_INVALID, "config: the top level must be a JSON object");
        goto out;
    }
    if ((rc = zs__cfg_check_duplicates(c, root, "")) != ZS_OK)
        goto out;
    zs_config_t tmp;
    zs_config_defaults(&tmp);
    pstate_t st = {.adam_w_mode = 1, .lr = 1e-3};
    if ((rc = parse_root(c, root, &tmp, &st)) != ZS_OK)
        goto out;
    if ((rc = zs__cfg_unknown_finish(c)) != ZS_OK)
        goto out;
    finish(c, &tmp, &st);
    memcpy(cfg, &tmp, sizeof tmp);
    rc = ZS_OK;
out:
    cJSON_Delete(root);
    free(text);
    free(c);
    return rc;
}

/* Read a file and parse it; see zs_config.h. */
int zs_config_load(const char *path, zs_config_t *cfg, zs_config_warn_fn warn, void *ud,
                   zs_err_t *err)
{
    zs_config_opts_t o = {warn, ud, 0};
    return zs_config_load_opts(path, &o, cfg, err);
}

/* Read a file and parse it under the given options; see zs_config.h. */
int zs_config_load_opts(const char *path, const zs_config_opts_t *opts, zs_config_t *cfg,
                        zs_err_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zs_err_set(err, ZS_ERR_IO, "config %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    int rc = ZS_OK;
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) {
            if (ferror(f))
                rc = zs_err_set(err, ZS_ERR_IO, "config %s: read error", path);
            break;
        }
        if (cap >= FILE_MAX) {
            rc = zs_err_set(err, ZS_ERR_RANGE, "config %s: larger than %u bytes", path, FILE_MAX);
            break;
        }
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
        }
    }
    fclose(f);
    if (!buf)
        return zs_err_set(err, ZS_ERR_NOMEM, "config %s: out of memory", path);
    if (rc == ZS_OK) {
        buf[n] = '\0';
        if (strlen(buf) != n)
            rc = zs_err_set(err, ZS_ERR_INVALID, "config %s: contains a NUL byte", path);
        else if ((rc = zs_config_parse_opts(buf, opts, cfg, err)) != ZS_OK)
            zs_err_prefix(err, "%s: ", path);
    }
    free(buf);
    return rc;
}
