/*
 * zs_config.h - DeepSpeed-style JSON configuration (cJSON), resolved.
 *
 * A DeepSpeed user's config file loads as it is. Like DeepSpeed (which reads
 * files with hjson), comments (#, //, slash-star), trailing commas and
 * members separated by a newline without a comma are accepted; duplicate
 * keys are an error. Keys zeroshard implements are read into zs_config_t.
 * Keys it recognises but does not implement ("not implemented"), and keys it
 * reads but that change nothing in zeroshard ("no effect": overlap_comm,
 * contiguous_gradients, reduce_scatter, allgather_partitions,
 * round_robin_gradients, sub_group_size, allgather_bucket_size,
 * stage3_gather_16bit_weights_on_model_save), are reported once each by path
 * through the warning callback (never silently misread). Unknown keys, at
 * the top level and inside every section zeroshard reads, are an error that
 * names each by path and the closest known key of its level ("unknown key
 * zero_optimisation (did you mean zero_optimization?)"), unless
 * zs_config_opts_t.allow_unknown lets them through with one warning each.
 * Errors name the key and the value. "auto" (a Hugging Face Trainer
 * placeholder) is an error: the file must hold the real value.
 *
 * Batch sizes follow DeepSpeed's _set_batch_related_parameters and
 * _batch_assertion (runtime/config.py) with world size W:
 *   train_batch_size = micro_batch_per_gpu * gradient_accumulation_steps * W
 * tbs + micro: gas = tbs / micro / W; tbs + gas: micro = tbs / W / gas
 * (integer division, then checked); micro + gas: tbs = micro * gas * W;
 * tbs alone: gas = 1, micro = tbs / W; micro alone: gas = 1, tbs = micro * W;
 * gas alone or none: error. Then all three must be > 0 and satisfy the
 * equation exactly, else error (so all three given and inconsistent, or a
 * tbs not divisible as required, is an error).
 */
#ifndef ZS_CONFIG_H
#define ZS_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "zs_adam.h"
#include "zs_dtype.h"
#include "zs_status.h"

/* offload_optimizer.super_offload when the file does not say: off. On a
 * shared 2-core VM with the worker and the server on a core each the worker
 * waits for the transfer, not for the servers' AdamW: the speculative step
 * was within noise of the plain one, and the pre-images cost the servers up
 * to 12 B/element (bench/RESULTS.md, "Speculative updates"); turn it on
 * where the servers' AdamW is what the workers wait for. */
#define ZS_CFG_SPECULATE_DEFAULT 0

typedef enum { ZS_SCHED_NONE = 0, ZS_SCHED_WARMUP_LR, ZS_SCHED_WARMUP_DECAY_LR } zs_sched_type_t;
typedef enum { ZS_WARMUP_LOG = 0, ZS_WARMUP_LINEAR = 1 } zs_warmup_type_t;

/* DeepSpeed WarmupLR / WarmupDecayLR parameters. */
typedef struct zs_sched_config {
    zs_sched_type_t type;
    double warmup_min_lr;         /* default 0 */
    double warmup_max_lr;         /* default: WarmupLR the optimizer's lr, WarmupDecayLR 0.001 */
    int64_t warmup_num_steps;     /* default 1000 (DeepSpeed uses max(2, this)) */
    zs_warmup_type_t warmup_type; /* default log */
    int64_t total_num_steps;      /* WarmupDecayLR only (required there) */
} zs_sched_config_t;

/* fp16 dynamic/static loss scaling (DeepSpeed's keys and defaults). */
typedef struct zs_fp16_config {
    int enabled;
    double loss_scale;          /* 0 = dynamic (default 0) */
    int initial_scale_power;    /* default 16 -> 2^16 */
    int loss_scale_window;      /* default 1000 */
    int hysteresis;             /* default 2 */
    double min_loss_scale;      /* default 1 */
    int consecutive_hysteresis; /* default 0: refill hysteresis on every clean step if 1 */
} zs_fp16_config_t;

typedef struct zs_config {
    /* batch sizes, resolved for the world size given to zs_config_resolve */
    int64_t train_batch_size;
    int64_t micro_batch_per_gpu;
    int64_t gradient_accumulation_steps;
    double gradient_clipping; /* 0 = off */

    /* optimizer */
    int optimizer_given; /* 0: defaults below */
    /* type Adam -> adam_w_mode from params (DeepSpeed default 1), AdamW -> 1 */
    zs_adam_hparams_t adam;

    zs_sched_config_t sched;

    /* precision: params/grads stored in this dtype; layers compute on fp32
     * copies (GEMM operand precision: zs-train --gemm, zs_gpt_set_compute) */
    zs_dtype_t dtype; /* F32 (default), BF16 (bf16.enabled) or F16 (fp16.enabled) */
    zs_fp16_config_t fp16;

    /* zero_optimization */
    int stage;                   /* 0..3 (default 0) */
    int offload_optimizer;       /* offload_optimizer.device == "cpu" or "nvme" */
    int offload_nvme;            /* offload_optimizer.device == "nvme": every server must keep
                                  * the state in its NVMe tier (zs-server --nvme-path) */
    int offload_speculate;       /* offload_optimizer.super_offload: servers update speculatively
                                  * before the step's norm and overflow are known (default
                                  * ZS_CFG_SPECULATE_DEFAULT; docs/engine.md) */
    int offload_speculate_every; /* offload_optimizer.speculate_every_step (default 0): also
                                  * speculate on the step after one whose real scalars
                                  * differed from the expected ones (clipping, overflow); off,
                                  * such a step runs plain (it would most likely roll back) */
    int offload_stream;          /* offload_optimizer.stream_pulls (default 1): pull updated
                                  * parameters in the background while the next step's
                                  * forward lands them layer by layer (stage 3: gather by
                                  * gather) */
    int64_t offload_delay_after; /* offload_optimizer.delayed_update_after (default -1: off):
                                  * from the update of step N + 1 on, each update reaches the
                                  * device one step late, so that the servers' AdamW overlaps
                                  * the next step (ZeRO-Offload's one-step delayed parameter
                                  * update; stages 1-2; docs/engine.md) */
    int offload_param;           /* offload_param.device == "cpu" or "nvme" (stage 3) */
    /* offload_param.device == "nvme" (ZeRO-Infinity's parameter offload,
     * docs/nvme.md): the stage-3 partitions of 16-bit parameters live in a
     * file per worker rank under offload_param_nvme_path, read through
     * offload_param_buffer_count buffers of offload_param_buffer_size
     * elements each; the first offload_param_max_in_cpu elements of the
     * partition (whole layers) stay in host memory. */
    int offload_param_nvme;
    char offload_param_nvme_path[512];   /* offload_param.nvme_path (required with nvme) */
    int64_t offload_param_buffer_count;  /* offload_param.buffer_count (DeepSpeed default 5) */
    int64_t offload_param_buffer_size;   /* offload_param.buffer_size, elements (default 1e8) */
    int64_t offload_param_max_in_cpu;    /* offload_param.max_in_cpu, elements (default 1e9) */
    int64_t reduce_bucket_size;          /* elements, default 500000000 */
    int64_t allgather_bucket_size;       /* elements, default 500000000 */
    int overlap_comm;                    /* default 0 (stage 3: 1) */
    int contiguous_gradients;            /* default 1 */
    int64_t stage3_prefetch_bucket_size; /* default 50000000 */
    int64_t stage3_param_persistence_threshold;    /* default 100000 */
    int64_t stage3_max_live_parameters;            /* default 1000000000 */
    int64_t stage3_max_reuse_distance;             /* default 1000000000 */
    int stage3_gather_16bit_weights_on_model_save; /* default 0 */
    int reduce_scatter;                            /* default 1 (0: all-reduce gradients) */
    int allgather_partitions;                      /* default 1 */
    int round_robin_gradients;                     /* default 0 */
    int64_t sub_group_size;                        /* default 1000000000 */
    int bf16_enabled;                              /* bf16.enabled (kept to refuse fp16 + bf16) */
    int zero_quantized_weights;      /* qwZ (default 0): stage 3's parameter all-gathers send int8
                                      * blocks with fp32 scales (zs_coll_all_gather_q8); stage 3 only */
    int zero_quantized_gradients;    /* qgZ (default 0): stage 3's gradient reduce-scatters send
                                      * int8 records in two hops (zs_coll_reduce_scatter_q8) */
    int64_t zero_hpz_partition_size; /* hpZ (default 1: off): > 1 keeps a secondary partition
                                      * over this many ranks, which must be the ranks per node
                                      * (checked by the engine); stage 3 only */
    int64_t mics_shard_size;         /* MiCS (default -1: off; 0 is off too, as in DeepSpeed): G > 0
                                      * partitions within shard groups of G consecutive ranks and
                                      * replicates across W / G groups (G must divide W, checked by
                                      * the engine; G = W is plain ZeRO-3); stage 3 only */
    int mics_hierarchical_params_gather; /* MiCS (default 0): a shard group spanning nodes
                                          * gathers in two hops (across nodes, then within
                                          * the node); no effect within a node */

    /* activation_checkpointing (zs_config_actckpt.c): the section given
     * means the GPT checkpoints every block (zs_gpt_set_checkpointing) */
    int act_ckpt;     /* section present (default 0) */
    int act_ckpt_cpu; /* cpu_checkpointing: checkpoints in pinned host memory (default 0) */
} zs_config_t;

/* Called once per path with its JSON path ("zero_optimization.foo") and
 * why: "not implemented", "no effect", "deprecated" or (allow_unknown only)
 * "unknown key", followed by a detail (": ...", or for unknown keys " (did
 * you mean P?), ignored" / ", ignored"). Also called (path of the value)
 * for values DeepSpeed itself only warns about (an unknown warmup_type, a
 * total_num_steps below warmup_num_steps). Warnings of a parse that then
 * fails have been delivered already. */
typedef void (*zs_config_warn_fn)(void *ud, const char *path, const char *why);

/* How to parse. Zero-initialised = strict, warnings to the log. */
typedef struct zs_config_opts {
    zs_config_warn_fn warn; /* may be NULL: warnings go to the log (ZS_WARN) */
    void *ud;               /* passed to warn */
    int allow_unknown;      /* 1: unknown keys are warned about and ignored, not refused */
} zs_config_opts_t;

/* Fill *cfg with DeepSpeed's defaults (batch sizes unset = 0). */
void zs_config_defaults(zs_config_t *cfg);

/* Parse JSON text into *cfg: *cfg is first reset to zs_config_defaults,
 * then the keys given are applied; on error *cfg is left unchanged. opts may
 * be NULL (strict, warnings to the log). Batch sizes are not resolved yet.
 * An unknown key is ZS_ERR_INVALID unless opts->allow_unknown. */
int zs_config_parse_opts(const char *json, const zs_config_opts_t *opts, zs_config_t *cfg,
                         zs_err_t *err);

/* Read and parse a file (errors are prefixed with its path). */
int zs_config_load_opts(const char *path, const zs_config_opts_t *opts, zs_config_t *cfg,
                        zs_err_t *err);

/* zs_config_parse_opts / zs_config_load_opts with {warn, ud, allow_unknown
 * 0}: unknown keys refused; warn may be NULL (then warnings go to the log). */
int zs_config_parse(const char *json, zs_config_t *cfg, zs_config_warn_fn warn, void *ud,
                    zs_err_t *err);
int zs_config_load(const char *path, zs_config_t *cfg, zs_config_warn_fn warn, void *ud,
                   zs_err_t *err);

/* Apply DeepSpeed's batch-size derivation for world size W and check the
 * rest for consistency (stage 0..3, offload_param only with stage 3, fp16
 * and bf16 not both, bucket sizes > 0, WarmupDecayLR with total_num_steps,
 * ...). Works on a freshly parsed config (batch sizes 0 = not given); calling
 * it again with the same W is a no-op. */
int zs_config_resolve(zs_config_t *cfg, int world_size, zs_err_t *err);

/* Print the resolved configuration to f (a FILE *): one "key = value" line
 * per field under its DeepSpeed name (a note in parentheses may follow the
 * value: "(off)", "(dynamic)"), every field whatever the file gave
 * (zs_config_print.c). */
void zs_config_print(const zs_config_t *cfg, void *f);

/* XXH3-64 of zs_config_print's text: equal tables, equal digests; a key
 * whose resolved value changes changes it. */
uint64_t zs_config_digest(const zs_config_t *cfg);

/* One line, without a newline, for a program's start-up log: the digest
 * (16 hex digits) and the keys whose resolved value differs from
 * DeepSpeed's default (including the defaults DeepSpeed derives: stage 3's
 * overlap_comm, WarmupLR's warmup_max_lr = lr), in table order, as
 * key=value with the value's blanks and notes left out, "zero_optimization."
 * written "zero." and a ".params." level left out:
 *   "config 5d1c0e6a9b2f4c83: train_batch_size=16 ... zero.stage=2"
 * The batch sizes have no default and are always listed. *out is malloc'd
 * (the caller frees); ZS_ERR_NOMEM. */
int zs_config_summary(const zs_config_t *cfg, char **out, zs_err_t *err);

#endif
