/*
 * test_config.c - DeepSpeed JSON configuration (worker/config/zs_config.c).
 *
 * Loads the seed configs (seeds/000 and every JSON example of seeds/004,
 * kept in tests/fixtures/ds_*.json as printed there, minus the "..." lines)
 * and checks the values and the warnings; checks DeepSpeed's batch-size
 * derivation for every combination of given keys at W = 1, 2, 4 against
 * hand-computed results; checks that every error names the key and the
 * value, that every warning comes once by path, DeepSpeed's optimizer and
 * scheduler defaults, aliases and deprecated keys, hjson-style relaxed JSON,
 * and the printed dump. Unknown keys (top level and nested) are refused,
 * naming every one by path with the closest known key of its level (each
 * suggestion, put in place of the typo, parses); allow_unknown turns them
 * into one warning each; keys read but without effect are warned once.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_config.h"
#include "zs_test.h"
#include "zs_warntest.h"

#define FIXTURE(name) ZS_SOURCE_DIR "/tests/fixtures/" name

/* ---- warning capture ------------------------------------------------------ */

static void dump_warns(const warns_t *w)
{
    for (int i = 0; i < w->n; i++)
        fprintf(stderr, "  warning %s: %s\n", w->path[i], w->why[i]);
}

static void parse_ok(const char *json, zs_config_t *cfg, warns_t *w)
{
    zs_err_t err = {0};
    memset(w, 0, sizeof *w);
    TEST_OK(zs_config_parse(json, cfg, on_warn, w, &err), err);
}

static void load_ok(const char *path, zs_config_t *cfg, warns_t *w)
{
    zs_err_t err = {0};
    memset(w, 0, sizeof *w);
    TEST_OK(zs_config_load(path, cfg, on_warn, w, &err), err);
}

/* parse_ok / load_ok with allow_unknown: unknown keys are warnings. */
static void parse_ok_allow(const char *json, zs_config_t *cfg, warns_t *w)
{
    zs_err_t err = {0};
    zs_config_opts_t o = {on_warn, w, 1};
    memset(w, 0, sizeof *w);
    TEST_OK(zs_config_parse_opts(json, &o, cfg, &err), err);
}

static void load_ok_allow(const char *path, zs_config_t *cfg, warns_t *w)
{
    zs_err_t err = {0};
    zs_config_opts_t o = {on_warn, w, 1};
    memset(w, 0, sizeof *w);
    TEST_OK(zs_config_load_opts(path, &o, cfg, &err), err);
}

/* Parsing fails and the message holds every given substring. */
static void parse_err(const char *json, const char *s1, const char *s2, const char *s3)
{
    zs_config_t cfg;
    warns_t w = {0};
    zs_err_t err = {0};
    int rc = zs_config_parse(json, &cfg, on_warn, &w, &err);
    TEST_CHECKF(rc < 0, "parse of %s succeeded", json);
    TEST_CHECK(err.code == rc);
    const char *s[3] = {s1, s2, s3};
    for (int i = 0; i < 3; i++)
        TEST_CHECKF(!s[i] || strstr(err.msg, s[i]), "error for %s: '%s' lacks '%s'", json, err.msg,
                    s[i]);
}

/* Parsing succeeds, resolving at W fails with all given substrings. */
static void resolve_err(const char *json, int W, const char *s1, const char *s2, const char *s3)
{
    zs_config_t cfg;
    warns_t w;
    zs_err_t err = {0};
    parse_ok(json, &cfg, &w);
    int rc = zs_config_resolve(&cfg, W, &err);
    TEST_CHECKF(rc < 0, "resolve of %s at W=%d succeeded", json, W);
    const char *s[3] = {s1, s2, s3};
    for (int i = 0; i < 3; i++)
        TEST_CHECKF(!s[i] || strstr(err.msg, s[i]), "error for %s: '%s' lacks '%s'", json, err.msg,
                    s[i]);
}

static void resolve_ok(zs_config_t *cfg, int W)
{
    zs_err_t err = {0};
    TEST_OK(zs_config_resolve(cfg, W, &err), err);
}

/* ---- DeepSpeed defaults ---------------------------------------------------- */

static void test_defaults(void)
{
    zs_config_t c;
    zs_config_defaults(&c);
    TEST_CHECK(c.train_batch_size == 0 && c.micro_batch_per_gpu == 0 &&
               c.gradient_accumulation_steps == 0);
    TEST_CHECK(c.gradient_clipping == 0.0);
    TEST_CHECK(c.optimizer_given == 0);
    TEST_CHECK(c.adam.lr == 1e-3f && c.adam.beta1 == 0.9f && c.adam.beta2 == 0.999f &&
               c.adam.eps == 1e-8f && c.adam.weight_decay == 0.0f && c.adam.adam_w_mode == 1 &&
               c.adam.bias_correction == 1);
    TEST_CHECK(c.sched.type == ZS_SCHED_NONE && c.sched.warmup_min_lr == 0.0 &&
               c.sched.warmup_max_lr == 0.001 && c.sched.warmup_num_steps == 1000 &&
               c.sched.warmup_type == ZS_WARMUP_LOG);
    TEST_CHECK(c.dtype == ZS_DTYPE_F32 && !c.bf16_enabled);
    TEST_CHECK(!c.fp16.enabled && c.fp16.loss_scale == 0.0 && c.fp16.initial_scale_power == 16 &&
               c.fp16.loss_scale_window == 1000 && c.fp16.hysteresis == 2 &&
               c.fp16.min_loss_scale == 1.0 && !c.fp16.consecutive_hysteresis);
    TEST_CHECK(c.stage == 0 && !c.offload_optimizer && !c.offload_param);
    TEST_CHECK(c.offload_speculate == ZS_CFG_SPECULATE_DEFAULT);
    {
        zs_config_t s;
        warns_t ws;
        parse_ok("{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
                 "\"cpu\", \"super_offload\": false}}}",
                 &s, &ws);
        TEST_CHECK(s.offload_optimizer == 1 && s.offload_speculate == 0 && ws.n == 0);
        parse_ok("{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
                 "\"cpu\", \"super_offload\": true}}}",
                 &s, &ws);
        TEST_CHECK(s.offload_speculate == 1 && s.offload_speculate_every == 0 && ws.n == 0);
        parse_ok("{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
                 "\"cpu\", \"super_offload\": true, \"speculate_every_step\": true}}}",
                 &s, &ws);
        TEST_CHECK(s.offload_speculate == 1 && s.offload_speculate_every == 1 && ws.n == 0);
    }
    TEST_CHECK(c.reduce_bucket_size == 500000000 && c.allgather_bucket_size == 500000000);
    TEST_CHECK(c.overlap_comm == 0 && c.contiguous_gradients == 1 && c.reduce_scatter == 1 &&
               c.allgather_partitions == 1 && c.round_robin_gradients == 0);
    TEST_CHECK(c.stage3_prefetch_bucket_size == 50000000 &&
               c.stage3_param_persistence_threshold == 100000 &&
               c.stage3_max_live_parameters == 1000000000 &&
               c.stage3_max_reuse_distance == 1000000000 &&
               c.stage3_gather_16bit_weights_on_model_save == 0 && c.sub_group_size == 1000000000);
    /* an empty document gives exactly the defaults */
    zs_config_t p;
    warns_t w;
    parse_ok("{}", &p, &w);
    TEST_CHECK(w.n == 0);
    TEST_CHECK(memcmp(&p, &c, sizeof c) == 0);
}

/* ---- the seeds --------------------------------------------------------------- */

static void test_seed_000(void)
{
    zs_config_t c;
    warns_t w;
    load_ok(FIXTURE("ds_000_seed.json"), &c, &w);
    TEST_CHECK(c.train_batch_size == 32 && c.micro_batch_per_gpu == 8 &&
               c.gradient_accumulation_steps == 4);
    TEST_CHECK(c.stage == 2 && c.offload_optimizer == 1 && c.offload_param == 0);
    TEST_CHECK(c.fp16.enabled && c.dtype == ZS_DTYPE_F16 && c.fp16.loss_scale == 0.0);
    TEST_CHECK(c.overlap_comm == 0); /* stage 2: DeepSpeed's default is false */
    /* the only warning: nvme_path next to device "cpu" (the servers decide) */
    if (w.n != 1)
        dump_warns(&w);
    TEST_CHECK(w.n == 1);
    expect_warn(&w, "zero_optimization.offload_optimizer.nvme_path",
                "no effect: the state lives under each server's --nvme-path");
    /* 32 = 8 * 4 * W holds for W = 1 only, as in DeepSpeed */
    zs_config_t r = c;
    resolve_ok(&r, 1);
    TEST_CHECK(r.train_batch_size == 32 && r.micro_batch_per_gpu == 8 &&
               r.gradient_accumulation_steps == 4);
    resolve_ok(&r, 1); /* again: no change */
    TEST_CHECK(r.train_batch_size == 32 && r.micro_batch_per_gpu == 8 &&
               r.gradient_accumulation_steps == 4);
    zs_err_t err = {0};
    r = c;
    TEST_CHECK(zs_config_resolve(&r, 2, &err) == ZS_ERR_INVALID);
    TEST_CHECKF(strstr(err.msg, "train_batch_size") && strstr(err.msg, "32 != 8 * 4 * 2"), "%s",
                err.msg);
}

/* seeds/004 example 1: stage 3, fp16, AdamW with betas (0.8, 0.999). */
static void test_seed_004(void)
{
    zs_config_t c;
    warns_t w;
    zs_err_t err = {0};

    load_ok(FIXTURE("ds_004_1_zero3.json"), &c, &w);
    TEST_CHECK(w.n == 0);
    TEST_CHECK(c.stage == 3 && c.fp16.enabled && c.dtype == ZS_DTYPE_F16);
    TEST_CHECK(c.optimizer_given && c.adam.adam_w_mode == 1);
    TEST_CHECK(c.adam.lr == 0.001f && c.adam.beta1 == 0.8f && c.adam.beta2 == 0.999f &&
               c.adam.eps == 1e-8f && c.adam.weight_decay == 3e-7f && c.adam.bias_correction);
    TEST_CHECK(c.overlap_comm == 1); /* stage 3: DeepSpeed's default is true */
    TEST_CHECK(!c.offload_optimizer && !c.offload_param);
    /* no batch size in the example: DeepSpeed's error */
    TEST_CHECK(zs_config_resolve(&c, 1, &err) == ZS_ERR_INVALID);
    TEST_CHECKF(strstr(err.msg, "train_batch_size or train_micro_batch_size_per_gpu"), "%s",
                err.msg);

    load_ok(FIXTURE("ds_004_2_offload_optimizer.json"), &c, &w);
    TEST_CHECK(w.n == 0);
    TEST_CHECK(c.stage == 3 && c.offload_optimizer == 1 && c.offload_param == 0);
    TEST_CHECK(!c.optimizer_given && c.dtype == ZS_DTYPE_F32);
    c.micro_batch_per_gpu = 2;
    resolve_ok(&c, 4);
    TEST_CHECK(c.train_batch_size == 8 && c.gradient_accumulation_steps == 1);

    /* example 3 has no comma between offload_optimizer and offload_param:
     * hjson (DeepSpeed) accepts that, so do we */
    load_ok(FIXTURE("ds_004_3_offload_param.json"), &c, &w);
    TEST_CHECK(w.n == 0);
    TEST_CHECK(c.stage == 3 && c.offload_optimizer == 1 && c.offload_param == 1);
    c.micro_batch_per_gpu = 1;
    resolve_ok(&c, 2);

    /* example 4: offload_optimizer "nvme" is the servers' NVMe tier;
     * offload_param "nvme" keeps the stage-3 partitions in files under its
     * nvme_path (DeepSpeed's defaults for the buffers) */
    load_ok(FIXTURE("ds_004_4_nvme.json"), &c, &w);
    TEST_CHECK(c.offload_nvme == 1 && c.offload_param == 1 && c.offload_param_nvme == 1 &&
               strcmp(c.offload_param_nvme_path, "/nvme_data") == 0 &&
               c.offload_param_buffer_count == 5 && c.offload_param_buffer_size == 100000000 &&
               c.offload_param_max_in_cpu == 1000000000);
    parse_ok("{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
             "\"nvme\", \"nvme_path\": \"/nvme_data\"}}}",
             &c, &w);
    TEST_CHECK(c.offload_optimizer == 1 && c.offload_nvme == 1 && w.n == 1);
    expect_warn(&w, "zero_optimization.offload_optimizer.nvme_path", "no effect: ");
    parse_ok("{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
             "\"cpu\"}}}",
             &c, &w);
    TEST_CHECK(c.offload_optimizer == 1 && c.offload_nvme == 0);

    /* example 5 (MiCS), with the doc's Python `False` written `false` */
    load_ok(FIXTURE("ds_004_5_mics.json"), &c, &w);
    TEST_CHECK(c.stage == 3);
    TEST_CHECK(w.n == 0); /* MiCS is implemented: read, no warning */
    TEST_CHECK(c.mics_shard_size == 8 && c.mics_hierarchical_params_gather == 0);
    /* verbatim, `False` is not JSON (nor hjson's false): the error says where */
    parse_err("{\n    \"zero_optimization\": {\n        \"stage\": 3,\n"
              "        \"mics_shard_size\": 8,\n"
              "        \"mics_hierarchical_params_gather\": False,\n    },\n    ...\n}\n",
              "line 5", "False", NULL);
}

/* MiCS's keys: read, ranged, refused where the engine cannot apply them
 * (the engine refuses a G not dividing W: test_mics). */
static void test_mics(void)
{
    zs_config_t c;
    warns_t w;
    zs_config_defaults(&c);
    TEST_CHECK(c.mics_shard_size == -1 && c.mics_hierarchical_params_gather == 0);
    parse_ok("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
             "\"mics_shard_size\": 4, \"mics_hierarchical_params_gather\": true}}",
             &c, &w);
    TEST_CHECK(w.n == 0 && c.mics_shard_size == 4 && c.mics_hierarchical_params_gather == 1);
    resolve_ok(&c, 8);
    parse_ok("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
             "\"mics_shard_size\": 0}}",
             &c, &w);
    TEST_CHECK(w.n == 0 && c.mics_shard_size == 0); /* off, as in DeepSpeed */
    resolve_ok(&c, 8);
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"mics_shard_size\": -2}}", "mics_shard_size",
              "-2", NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"mics_shard_size\": \"8\"}}",
              "mics_shard_size", NULL, NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"mics_hierarchical_params_gather\": "
              "\"yes\"}}",
              "mics_hierarchical_params_gather", NULL, NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"mics_shard_sise\": 2}}", "mics_shard_sise",
              "mics_shard_size", NULL);
    resolve_err("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, "
                "\"mics_shard_size\": 2}}",
                4, "mics_shard_size", "stage is 2", NULL);
    resolve_err("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                "\"mics_hierarchical_params_gather\": true}}",
                4, "mics_hierarchical_params_gather", "mics_shard_size is -1", NULL);
    resolve_err("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                "\"mics_shard_size\": 2, \"zero_hpz_partition_size\": 2}}",
                4, "mics_shard_size 2", "zero_hpz_partition_size", "not combined");
    resolve_err("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                "\"mics_shard_size\": 2, \"zero_quantized_weights\": true}}",
                4, "mics_shard_size 2", "zero_quantized_weights", "not combined");
    resolve_err("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                "\"mics_shard_size\": 2, \"zero_quantized_gradients\": true}}",
                4, "mics_shard_size 2", "zero_quantized_gradients", "not combined");
}

static void test_full(void)
{
    zs_config_t c;
    warns_t w;
    /* my_custom_key is unknown: refused, then accepted with allow_unknown */
    zs_err_t err = {0};
    TEST_CHECK(zs_config_load(FIXTURE("ds_full.json"), &c, NULL, NULL, &err) == ZS_ERR_INVALID);
    TEST_CHECKF(strstr(err.msg, "ds_full.json: unknown key my_custom_key;"), "%s", err.msg);
    load_ok_allow(FIXTURE("ds_full.json"), &c, &w);
    TEST_CHECK(c.train_batch_size == 64 && c.micro_batch_per_gpu == 4 &&
               c.gradient_accumulation_steps == 4 && c.gradient_clipping == 1.0);
    /* "adam" (any case) with adam_w_mode false: L2 Adam */
    TEST_CHECK(c.optimizer_given && c.adam.adam_w_mode == 0 && c.adam.bias_correction == 0);
    TEST_CHECK(c.adam.lr == 3e-4f && c.adam.beta1 == 0.9f && c.adam.beta2 == 0.95f &&
               c.adam.eps == 1e-6f && c.adam.weight_decay == 0.1f);
    TEST_CHECK(c.sched.type == ZS_SCHED_WARMUP_DECAY_LR && c.sched.warmup_min_lr == 1e-5 &&
               c.sched.warmup_max_lr == 3e-4 && c.sched.warmup_num_steps == 100 &&
               c.sched.warmup_type == ZS_WARMUP_LINEAR && c.sched.total_num_steps == 1000);
    TEST_CHECK(c.fp16.enabled && c.fp16.loss_scale == 0.0 && c.fp16.initial_scale_power == 12 &&
               c.fp16.loss_scale_window == 500 && c.fp16.hysteresis == 3 &&
               c.fp16.consecutive_hysteresis == 1 && c.fp16.min_loss_scale == 0.5);
    TEST_CHECK(!c.bf16_enabled && c.dtype == ZS_DTYPE_F16);
    TEST_CHECK(c.stage == 3 && c.offload_optimizer && c.offload_param);
    TEST_CHECK(c.reduce_bucket_size == 200000000 && c.allgather_bucket_size == 300000000);
    TEST_CHECK(c.overlap_comm == 0 && c.contiguous_gradients == 0 && c.reduce_scatter == 0 &&
               c.allgather_partitions == 0 && c.round_robin_gradients == 1);
    TEST_CHECK(c.sub_group_size == 2000000000LL && c.stage3_prefetch_bucket_size == 45000000 &&
               c.stage3_param_persistence_threshold == 10000 &&
               c.stage3_max_live_parameters == 300000000 &&
               c.stage3_max_reuse_distance == 200000000 &&
               c.stage3_gather_16bit_weights_on_model_save == 1);
    TEST_CHECK(c.act_ckpt == 1 && c.act_ckpt_cpu == 0); /* the section given: on */
    TEST_CHECK(c.mics_shard_size == -1);                /* MiCS off, read without a warning */
    const char *notimpl[] = {"steps_per_print",
                             "wall_clock_breakdown",
                             "fp16.auto_cast",
                             "zero_optimization.offload_optimizer.ratio",
                             "zero_optimization.offload_param.pin_memory",
                             "flops_profiler",
                             "tensorboard"};
    /* read (the values above) but without effect in zeroshard */
    const char *noeffect[] = {"zero_optimization.allgather_bucket_size",
                              "zero_optimization.overlap_comm",
                              "zero_optimization.contiguous_gradients",
                              "zero_optimization.reduce_scatter",
                              "zero_optimization.allgather_partitions",
                              "zero_optimization.round_robin_gradients",
                              "zero_optimization.sub_group_size",
                              "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                              "zero_optimization.offload_optimizer.pin_memory",
                              "activation_checkpointing.partition_activations"};
    int nn = (int)(sizeof notimpl / sizeof notimpl[0]);
    int ne = (int)(sizeof noeffect / sizeof noeffect[0]);
    for (int i = 0; i < nn; i++)
        expect_warn(&w, notimpl[i], "not implemented");
    for (int i = 0; i < ne; i++)
        expect_warn(&w, noeffect[i], "no effect: ");
    expect_warn(&w, "my_custom_key", "unknown key, ignored");
    if (w.n != nn + ne + 1)
        dump_warns(&w);
    TEST_CHECK(w.n == nn + ne + 1);
    resolve_ok(&c, 4);
    TEST_CHECK(zs_config_resolve(&c, 2, &err) == ZS_ERR_INVALID);
}

static void test_hf_auto(void)
{
    zs_config_t c;
    warns_t w = {0};
    zs_err_t err = {0};
    TEST_CHECK(zs_config_load(FIXTURE("ds_hf_auto.json"), &c, on_warn, &w, &err) == ZS_ERR_INVALID);
    TEST_CHECKF(strstr(err.msg, "fp16.enabled") && strstr(err.msg, "\"auto\"") &&
                    strstr(err.msg, "Hugging Face"),
                "%s", err.msg);
    parse_err("{\"train_micro_batch_size_per_gpu\": \"auto\"}", "train_micro_batch_size_per_gpu",
              "\"auto\"", "actual value");
    parse_err("{\"gradient_clipping\": \"auto\"}", "gradient_clipping", "\"auto\"", NULL);
    parse_err("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}}",
              "optimizer.params.lr", "\"auto\"", NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"stage3_prefetch_bucket_size\": \"auto\"}}",
              "zero_optimization.stage3_prefetch_bucket_size", "\"auto\"", NULL);
    parse_err("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": "
              "\"auto\"}}}",
              "scheduler.params.warmup_max_lr", "\"auto\"", NULL);
}

static void test_relaxed(void)
{
    zs_config_t c;
    warns_t w;
    load_ok_allow(FIXTURE("ds_relaxed.json"), &c, &w);
    TEST_CHECK(c.micro_batch_per_gpu == 2 && c.gradient_accumulation_steps == 3);
    TEST_CHECK(c.stage == 1);
    TEST_CHECK(c.adam.lr == 0.0002f && c.adam.beta1 == 0.9f && c.adam.beta2 == 0.98f);
    /* the comment markers inside the key and the string stayed */
    TEST_CHECK(w.n == 1);
    expect_warn(&w, "weird//key#1", "unknown key");
    resolve_ok(&c, 2);
    TEST_CHECK(c.train_batch_size == 12);
    /* escapes in strict JSON pass through untouched (a quote or a comment
     * marker after a backslash, inside a key) */
    parse_ok_allow(
        "{\"a\\\"#b\": \"x\\\\\", \"c\\\\\": \"//\\\"/*\",\n \"d\\u0041\": [\"]\", \"}\"]}", &c,
        &w);
    TEST_CHECK(w.n == 3);
    expect_warn(&w, "a\"#b", "unknown key");
    expect_warn(&w, "c\\", "unknown key");
    expect_warn(&w, "dA", "unknown key");
    /* newline-separated array items and members, comments between */
    parse_ok("{\"zero_optimization\": {\"stage\": 2 # two\n /* c */ \"reduce_bucket_size\": 7\n}\n"
             "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.5\n 0.25]}}}",
             &c, &w);
    TEST_CHECK(c.stage == 2 && c.reduce_bucket_size == 7 && c.adam.beta1 == 0.5f &&
               c.adam.beta2 == 0.25f && w.n == 0);
    /* strict JSON mistakes stay errors */
    parse_err("{\"a\": 1 \"b\": 2}", "line 1", NULL, NULL);
    parse_err("{\n \"train_batch_size\": 8,\n \"fp16\": }\n", "line 3", NULL, NULL);
    parse_err("[1, 2]", "top level", NULL, NULL);
    parse_err("", "line 1", NULL, NULL);
    /* duplicate keys are refused, as DeepSpeed's loader does */
    parse_err("{\"train_batch_size\": 8, \"train_batch_size\": 16}", "train_batch_size",
              "duplicate", NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 1, \"stage\": 2}}", "zero_optimization.stage",
              "duplicate", NULL);
}

/* ---- batch-size derivation ------------------------------------------------- */

typedef struct bcase {
    int64_t tbs, mb, gas; /* 0 = key absent */
    int W;
    int64_t e_tbs, e_mb, e_gas; /* expected; e_tbs 0 = error */
    const char *err;            /* substring of the error */
} bcase_t;

static const bcase_t BCASES[] = {
    /* train_batch_size only: gas = 1, micro = tbs / W */
    {32, 0, 0, 1, 32, 32, 1, NULL},
    {32, 0, 0, 2, 32, 16, 1, NULL},
    {32, 0, 0, 4, 32, 8, 1, NULL},
    {30, 0, 0, 4, 0, 0, 0, "30 != 7 * 1 * 4"},
    {2, 0, 0, 4, 0, 0, 0, "train_micro_batch_size_per_gpu derived as 0"},
    /* micro only: gas = 1, tbs = micro * W */
    {0, 4, 0, 1, 4, 4, 1, NULL},
    {0, 4, 0, 2, 8, 4, 1, NULL},
    {0, 4, 0, 4, 16, 4, 1, NULL},
    /* tbs + micro: gas = tbs / micro / W */
    {32, 4, 0, 1, 32, 4, 8, NULL},
    {32, 4, 0, 2, 32, 4, 4, NULL},
    {32, 4, 0, 4, 32, 4, 2, NULL},
    {32, 6, 0, 1, 0, 0, 0, "32 != 6 * 5 * 1"},
    {32, 3, 0, 2, 0, 0, 0, "32 != 3 * 5 * 2"},
    {32, 16, 0, 4, 0, 0, 0, "gradient_accumulation_steps derived as 0"},
    /* tbs + gas: micro = tbs / W / gas */
    {32, 0, 2, 1, 32, 16, 2, NULL},
    {32, 0, 2, 2, 32, 8, 2, NULL},
    {32, 0, 2, 4, 32, 4, 2, NULL},
    {32, 0, 3, 1, 0, 0, 0, "32 != 10 * 3 * 1"},
    {32, 0, 16, 4, 0, 0, 0, "train_micro_batch_size_per_gpu derived as 0"},
    /* micro + gas: tbs = micro * gas * W */
    {0, 4, 2, 1, 8, 4, 2, NULL},
    {0, 4, 2, 2, 16, 4, 2, NULL},
    {0, 4, 2, 4, 32, 4, 2, NULL},
    /* all three: checked, never changed */
    {32, 4, 2, 4, 32, 4, 2, NULL},
    {16, 4, 2, 2, 16, 4, 2, NULL},
    {8, 4, 2, 1, 8, 4, 2, NULL},
    {32, 4, 2, 1, 0, 0, 0, "32 != 4 * 2 * 1"},
    {32, 4, 2, 2, 0, 0, 0, "32 != 4 * 2 * 2"},
    {16, 4, 2, 4, 0, 0, 0, "16 != 4 * 2 * 4"},
    /* none, or gas alone */
    {0, 0, 0, 1, 0, 0, 0, "either train_batch_size or train_micro_batch_size_per_gpu"},
    {0, 0, 0, 2, 0, 0, 0, "either train_batch_size or train_micro_batch_size_per_gpu"},
    {0, 0, 0, 4, 0, 0, 0, "either train_batch_size or train_micro_batch_size_per_gpu"},
    {0, 0, 4, 1, 0, 0, 0, "gradient_accumulation_steps alone"},
    {0, 0, 4, 2, 0, 0, 0, "gradient_accumulation_steps alone"},
    {0, 0, 4, 4, 0, 0, 0, "gradient_accumulation_steps alone"},
};

static void test_batch(void)
{
    int n = (int)(sizeof BCASES / sizeof BCASES[0]);
    for (int i = 0; i < n; i++) {
        const bcase_t *b = &BCASES[i];
        char json[256];
        int o = snprintf(json, sizeof json, "{");
        if (b->tbs)
            o += snprintf(json + o, sizeof json - o, "\"train_batch_size\": %lld,",
                          (long long)b->tbs);
        if (b->mb)
            o += snprintf(json + o, sizeof json - o, "\"train_micro_batch_size_per_gpu\": %lld,",
                          (long long)b->mb);
        if (b->gas)
            o += snprintf(json + o, sizeof json - o, "\"gradient_accumulation_steps\": %lld,",
                          (long long)b->gas);
        snprintf(json + o, sizeof json - o, "\"zero_optimization\": {\"stage\": 2}}");
        zs_config_t c;
        warns_t w;
        zs_err_t err = {0};
        parse_ok(json, &c, &w);
        int rc = zs_config_resolve(&c, b->W, &err);
        if (b->e_tbs) {
            TEST_CHECKF(rc == ZS_OK, "case %d (%s, W=%d): %s", i, json, b->W, err.msg);
            TEST_CHECKF(c.train_batch_size == b->e_tbs && c.micro_batch_per_gpu == b->e_mb &&
                            c.gradient_accumulation_steps == b->e_gas,
                        "case %d (%s, W=%d): got %lld %lld %lld", i, json, b->W,
                        (long long)c.train_batch_size, (long long)c.micro_batch_per_gpu,
                        (long long)c.gradient_accumulation_steps);
        } else {
            TEST_CHECKF(rc == ZS_ERR_INVALID, "case %d (%s, W=%d) resolved", i, json, b->W);
            TEST_CHECKF(strstr(err.msg, b->err), "case %d (%s, W=%d): '%s' lacks '%s'", i, json,
                        b->W, err.msg, b->err);
        }
    }
    /* null = not given (DeepSpeed's get_scalar_param returns None) */
    zs_config_t c;
    warns_t w;
    parse_ok("{\"train_batch_size\": null, \"train_micro_batch_size_per_gpu\": 3}", &c, &w);
    resolve_ok(&c, 2);
    TEST_CHECK(c.train_batch_size == 6 && c.gradient_accumulation_steps == 1);
    /* given values <= 0 can never pass DeepSpeed's assertions */
    parse_err("{\"train_batch_size\": 0}", "train_batch_size", "0 must be >= 1", NULL);
    parse_err("{\"gradient_accumulation_steps\": -2}", "gradient_accumulation_steps", "-2", NULL);
    parse_err("{\"train_batch_size\": \"32\"}", "train_batch_size", "expected an integer",
              "\"32\"");
    parse_err("{\"train_batch_size\": 32.5}", "train_batch_size", "32.5", NULL);
    parse_err("{\"train_batch_size\": true}", "train_batch_size", "true", NULL);
    /* an integral number in exponent form is an integer */
    parse_ok("{\"train_batch_size\": 3.2e1}", &c, &w);
    TEST_CHECK(c.train_batch_size == 32);
    zs_err_t err = {0};
    TEST_CHECK(zs_config_resolve(&c, 0, &err) == ZS_ERR_INVALID);
    TEST_CHECKF(strstr(err.msg, "world size 0"), "%s", err.msg);
}

/* ---- errors name key and value ----------------------------------------------- */

static void test_errors(void)
{
    parse_err("{\"zero_optimization\": {\"reduce_bucket_size\": -1}}",
              "zero_optimization.reduce_bucket_size", "-1", "must be >= 0");
    parse_err("{\"zero_optimization\": {\"stage3_max_live_parameters\": -5e8}}",
              "zero_optimization.stage3_max_live_parameters", "-500000000", NULL);
    parse_err("{\"zero_optimization\": {\"allgather_bucket_size\": \"5e8\"}}",
              "zero_optimization.allgather_bucket_size", "\"5e8\"", NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 4}}", "zero_optimization.stage", "4",
              "between 0 and 3");
    parse_err("{\"zero_optimization\": {\"stage\": \"3\"}}", "zero_optimization.stage", "\"3\"",
              NULL);
    parse_err("{\"zero_optimization\": {\"overlap_comm\": \"yes\"}}",
              "zero_optimization.overlap_comm", "\"yes\"", "true or false");
    parse_err("{\"zero_optimization\": {\"offload_optimizer\": \"cpu\"}}",
              "zero_optimization.offload_optimizer", "\"cpu\"", "an object");
    /* offload_param nvme: nvme_path required; the buffer keys checked */
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\"}}}",
              "zero_optimization.offload_param.device", "\"nvme\"",
              "needs zero_optimization.offload_param.nvme_path");
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
              "\"nvme_path\": \"/nvme\", \"buffer_count\": 0}}}",
              "zero_optimization.offload_param.buffer_count", "0", "between 1 and 1024");
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
              "\"nvme_path\": \"/nvme\", \"buffer_size\": 1.5}}}",
              "zero_optimization.offload_param.buffer_size", "1.5", "an integer");
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
              "\"nvme_path\": \"/nvme\", \"max_in_cpu\": -1}}}",
              "zero_optimization.offload_param.max_in_cpu", "-1", ">= 0");
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
              "\"nvme_path\": 7}}}",
              "zero_optimization.offload_param.nvme_path", "7", NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
              "\"nvme_path\": \"/nvme\", \"buffer_sise\": 8}}}",
              "buffer_sise", "unknown key", "buffer_size");
    {
        zs_config_t pc;
        warns_t pw;
        zs_err_t err = {0};
        parse_ok("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
                 "\"nvme\", \"nvme_path\": \"/nvme\", \"buffer_count\": 2, \"buffer_size\": "
                 "4096, \"max_in_cpu\": 0}}}",
                 &pc, &pw);
        TEST_CHECK(pc.offload_param == 1 && pc.offload_param_nvme == 1 && pw.n == 0 &&
                   strcmp(pc.offload_param_nvme_path, "/nvme") == 0 &&
                   pc.offload_param_buffer_count == 2 && pc.offload_param_buffer_size == 4096 &&
                   pc.offload_param_max_in_cpu == 0);
        pc.train_batch_size = 8;
        TEST_OK(zs_config_resolve(&pc, 1, &err), err);
        pc.stage = 2;
        TEST_CHECK(zs_config_resolve(&pc, 1, &err) != ZS_OK &&
                   strstr(err.msg, "device \"nvme\" needs stage 3"));
    }
    parse_err("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"gpu\"}}}",
              "zero_optimization.offload_optimizer.device", "\"gpu\"", NULL);
    parse_err("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"CPU\"}}}",
              "zero_optimization.offload_optimizer.device", "\"CPU\"", NULL);
    /* offload_optimizer.super_offload (speculation, issue 18): a bool; a
     * misspelling is refused by name; not a key of offload_param. */
    parse_err("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", "
              "\"super_offload\": \"yes\"}}}",
              "zero_optimization.offload_optimizer.super_offload", "\"yes\"", "true or false");
    parse_err("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", "
              "\"super_ofload\": false}}}",
              "super_ofload", "unknown key", NULL);
    parse_err("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", "
              "\"super_offload\": false}}}",
              "super_offload", "unknown key", NULL);
    parse_err("{\"optimizer\": {\"type\": \"Lamb\", \"params\": {\"lr\": 0.01}}}", "optimizer.type",
              "\"Lamb\"", "not implemented");
    parse_err("{\"optimizer\": {\"type\": \"SGD\"}}", "optimizer.type", "\"SGD\"", NULL);
    parse_err("{\"optimizer\": {\"params\": {\"lr\": 0.01}}}", "optimizer", "type", NULL);
    parse_err("{\"optimizer\": {\"type\": 1}}", "optimizer.type", "1", "a string");
    parse_err("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": -1}}}",
              "optimizer.params.lr", "-1", NULL);
    parse_err("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9]}}}",
              "optimizer.params.betas", "[0.9]", NULL);
    parse_err("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 1.0]}}}",
              "optimizer.params.betas", "[0.9,1]", "[0, 1)");
    parse_err("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"eps\": \"1e-8\"}}}",
              "optimizer.params.eps", "\"1e-8\"", NULL);
    parse_err("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"max_grad_norm\": 1.0}}}",
              "optimizer.params.max_grad_norm", "gradient_clipping", NULL);
    parse_err("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": true}}}",
              "optimizer.params.amsgrad", "true", NULL);
    parse_err("{\"scheduler\": {\"type\": \"OneCycle\", \"params\": {}}}", "scheduler.type",
              "\"OneCycle\"", "not implemented");
    parse_err("{\"scheduler\": {\"type\": \"warmuplr\"}}", "scheduler.type", "\"warmuplr\"", NULL);
    parse_err("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"total_num_steps\": 10}}}",
              "scheduler.params.total_num_steps", "WarmupLR", NULL);
    parse_err("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 0}}}",
              "scheduler.params.warmup_num_steps", "0", NULL);
    parse_err("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": "
              "-1}}}",
              "scheduler.params.total_num_steps", "-1", NULL);
    parse_err("{\"fp16\": {\"enabled\": true, \"loss_scale\": -1}}", "fp16.loss_scale", "-1", NULL);
    parse_err("{\"fp16\": {\"hysteresis\": 0}}", "fp16.hysteresis", "0", NULL);
    parse_err("{\"fp16\": {\"loss_scale_window\": 0}}", "fp16.loss_scale_window", "0", NULL);
    parse_err("{\"fp16\": {\"min_loss_scale\": 0}}", "fp16.min_loss_scale", "0", "> 0");
    parse_err("{\"fp16\": {\"initial_scale_power\": 16.5}}", "fp16.initial_scale_power", "16.5",
              NULL);
    parse_err("{\"fp16\": true}", "fp16", "true", "an object");
    parse_err("{\"bf16\": {\"enabled\": \"true\"}}", "bf16.enabled", "\"true\"", NULL);
    parse_err("{\"gradient_clipping\": -1}", "gradient_clipping", "-1", NULL);
    parse_err("{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": 1, "
              "\"prefetch_bucket_size\": 2}}",
              "zero_optimization.prefetch_bucket_size", "given twice",
              "stage3_prefetch_bucket_size");
    parse_err("{\"zero_optimization\": {\"cpu_offload\": true, \"offload_optimizer\": "
              "{\"device\": \"cpu\"}}}",
              "zero_optimization.cpu_offload", "offload_optimizer", NULL);

    /* cross-checks at resolve time */
    resolve_err("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": "
                "true}}",
                1, "fp16.enabled", "bf16.enabled", "cannot be simultaneously enabled");
    resolve_err(
        "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"offload_param\": "
        "{\"device\": \"cpu\"}}}",
        1, "zero_optimization.offload_param", "stage 3", "stage is 2");
    resolve_err(
        "{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
        "{\"warmup_num_steps\": 10}}}",
        1, "scheduler.params.total_num_steps", "WarmupDecayLR", NULL);
    resolve_err("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\"}}", 1,
                "total_num_steps", NULL, NULL);
    resolve_err("{\"train_batch_size\": 8, \"zero_optimization\": {\"reduce_bucket_size\": 0}}", 1,
                "reduce_bucket_size", "0", NULL);
    /* offload_param "none" is fine below stage 3 */
    zs_config_t c;
    warns_t w;
    parse_ok("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"offload_param\": "
             "{\"device\": \"none\"}}}",
             &c, &w);
    resolve_ok(&c, 1);
    /* a failed parse leaves the config untouched */
    zs_config_t before;
    memcpy(&before, &c, sizeof c);
    zs_err_t err = {0};
    TEST_CHECK(zs_config_parse("{\"train_batch_size\": 16, \"zero_optimization\": {\"stage\": 9}}",
                               &c, on_warn, &w, &err) == ZS_ERR_RANGE);
    TEST_CHECK(memcmp(&before, &c, sizeof c) == 0);
    /* a missing file names the path */
    TEST_CHECK(zs_config_load("/nonexistent/ds.json", &c, NULL, NULL, &err) == ZS_ERR_IO);
    TEST_CHECKF(strstr(err.msg, "/nonexistent/ds.json"), "%s", err.msg);
}

/* ---- warnings, once each, by path ------------------------------------------- */

static void test_warnings(void)
{
    zs_config_t c;
    warns_t w;
    parse_ok_allow(
        "{\"train_batch_size\": 8,\n"
        " \"steps_per_print\": 100, \"wall_clock_breakdown\": true,\n"
        " \"communication_data_type\": \"fp32\", \"prescale_gradients\": false,\n"
        " \"zero_allow_untested_optimizer\": true, \"elasticity\": {\"enabled\": false},\n"
        " \"tensorboard\": {\"enabled\": true}, \"flops_profiler\": {\"enabled\": true},\n"
        " \"activation_checkpointing\": {\"partition_activations\": true},\n"
        " \"traing_batch_size\": 8,\n"
        " \"optimizer\": {\"type\": \"AdamW\", \"legacy_fusion\": false, \"params\": "
        "{\"lr\": 1e-4, \"torch_adam\": true, \"foo\": 1}},\n"
        " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_type\": \"cosine\", "
        "\"last_batch_iteration\": -1}},\n"
        " \"fp16\": {\"enabled\": true, \"fp16_master_weights_and_grads\": false},\n"
        " \"bf16\": {\"immediate_grad_update\": true},\n"
        " \"zero_optimization\": {\"stage\": 3, \"stagee\": 2,\n"
        "   \"offload_optimizer\": {\"device\": \"cpu\", \"nvme_path\": \"/x\", "
        "\"buffer_count\": 4, \"pipeline_read\": false, \"pipeline_write\": false, "
        "\"fast_init\": false, \"pin_memory\": true},\n"
        "   \"offload_param\": {\"device\": \"cpu\", \"buffer_size\": 1e8, \"max_in_cpu\": "
        "1e9},\n"
        "   \"elastic_checkpoint\": false, \"zeropp_loco_param\": {}}}\n",
        &c, &w);
    const char *notimpl[] = {"steps_per_print",
                             "wall_clock_breakdown",
                             "communication_data_type",
                             "prescale_gradients",
                             "zero_allow_untested_optimizer",
                             "elasticity",
                             "tensorboard",
                             "flops_profiler",
                             "optimizer.legacy_fusion",
                             "optimizer.params.torch_adam",
                             "scheduler.params.last_batch_iteration",
                             "fp16.fp16_master_weights_and_grads",
                             "bf16.immediate_grad_update",
                             "zero_optimization.elastic_checkpoint",
                             "zero_optimization.zeropp_loco_param"};
    const char *unknown[] = {"traing_batch_size", "optimizer.params.foo",
                             "zero_optimization.stagee"};
    /* DeepSpeed's NVMe keys: the servers' tier decides (zs-server --nvme-*) */
    const char *nvme[] = {"nvme_path",      "buffer_count", "pipeline_read",
                          "pipeline_write", "fast_init",    "pin_memory"};
    int nn = (int)(sizeof notimpl / sizeof notimpl[0]), nu = 3, nv = 6 + 2;
    /* offload_param's NVMe keys with device "cpu" */
    expect_warn(&w, "zero_optimization.offload_param.buffer_size",
                "no effect: used with device \"nvme\" only");
    expect_warn(&w, "zero_optimization.offload_param.max_in_cpu",
                "no effect: used with device \"nvme\" only");
    for (int i = 0; i < nn; i++)
        expect_warn(&w, notimpl[i], "not implemented");
    for (int i = 0; i < 6; i++) {
        char k[96];
        snprintf(k, sizeof k, "zero_optimization.offload_optimizer.%s", nvme[i]);
        expect_warn(&w, k, "no effect: ");
    }
    for (int i = 0; i < nu; i++)
        expect_warn(&w, unknown[i], "unknown key");
    /* with the closest known key of the level, when one is close */
    expect_warn(&w, "traing_batch_size", "unknown key (did you mean train_batch_size?), ignored");
    expect_warn(&w, "optimizer.params.foo", "unknown key, ignored");
    expect_warn(&w, "zero_optimization.stagee",
                "unknown key (did you mean zero_optimization.stage?), ignored");
    /* DeepSpeed only warns about an unknown warmup_type and uses log */
    expect_warn(&w, "scheduler.params.warmup_type", "unknown value \"cosine\"");
    TEST_CHECK(c.sched.warmup_type == ZS_WARMUP_LOG);
    expect_warn(&w, "activation_checkpointing.partition_activations", "no effect: ");
    if (w.n != nn + nu + nv + 2)
        dump_warns(&w);
    TEST_CHECK(w.n == nn + nu + nv + 2);
    /* torch_adam with AdamW and no weight_decay: torch's default 0.01 */
    TEST_CHECK(c.adam.adam_w_mode == 1 && c.adam.weight_decay == 0.01f);
    /* WarmupLR without warmup_max_lr: the optimizer's lr (current DeepSpeed) */
    TEST_CHECK(c.sched.warmup_max_lr == 1e-4);
    TEST_CHECK(c.stage == 3 && c.offload_optimizer && c.offload_param && c.overlap_comm == 1);

    /* no callback: warnings go to the log, parsing still succeeds */
    zs_err_t err = {0};
    zs_config_opts_t quiet = {NULL, NULL, 1};
    TEST_OK(zs_config_parse_opts("{\"steps_per_print\": 1, \"nonsense\": 2}", &quiet, &c, &err),
            err);
    TEST_OK(zs_config_parse_opts("{\"steps_per_print\": 1}", NULL, &c, &err), err);

    /* deprecated forms, read as DeepSpeed reads them */
    parse_ok("{\"zero_optimization\": true}", &c, &w);
    TEST_CHECK(c.stage == 1 && w.n == 1);
    expect_warn(&w, "zero_optimization", "deprecated");
    parse_ok("{\"zero_optimization\": {\"stage\": 3, \"cpu_offload\": true, \"cpu_offload_param\": "
             "true, \"stage3_gather_fp16_weights_on_model_save\": true}}",
             &c, &w);
    TEST_CHECK(c.offload_optimizer == 1 && c.offload_param == 1 &&
               c.stage3_gather_16bit_weights_on_model_save == 1 && w.n == 3);
    expect_warn(&w, "zero_optimization.cpu_offload", "deprecated");
    expect_warn(&w, "zero_optimization.cpu_offload_param", "deprecated");
    /* deprecated and without effect: one warning that says both */
    expect_warn(&w, "zero_optimization.stage3_gather_fp16_weights_on_model_save",
                "deprecated: read as gather_16bit_weights_on_model_save; no effect: ");
    /* DeepSpeed's field names without the stage3_ prefix are aliases */
    parse_ok("{\"zero_optimization\": {\"prefetch_bucket_size\": 1e6, "
             "\"param_persistence_threshold\": 1e3, \"max_live_parameters\": 2e6, "
             "\"max_reuse_distance\": 3e6, \"gather_16bit_weights_on_model_save\": true}}",
             &c, &w);
    TEST_CHECK(w.n == 1 && c.stage3_prefetch_bucket_size == 1000000 &&
               c.stage3_param_persistence_threshold == 1000 &&
               c.stage3_max_live_parameters == 2000000 && c.stage3_max_reuse_distance == 3000000 &&
               c.stage3_gather_16bit_weights_on_model_save == 1);
    expect_warn(&w, "zero_optimization.gather_16bit_weights_on_model_save", "no effect: ");
    /* "bfloat16" is DeepSpeed's old name for "bf16", read only without it */
    parse_ok("{\"bfloat16\": {\"enabled\": true}}", &c, &w);
    TEST_CHECK(w.n == 0 && c.bf16_enabled && c.dtype == ZS_DTYPE_BF16);
    parse_ok("{\"bf16\": {\"enabled\": false}, \"bfloat16\": {\"enabled\": true}}", &c, &w);
    TEST_CHECK(!c.bf16_enabled && c.dtype == ZS_DTYPE_F32);
    expect_warn(&w, "bfloat16", "not implemented");
    /* WarmupDecayLR with total_num_steps < warmup: DeepSpeed warns */
    parse_ok("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 10, "
             "\"total_num_steps\": 5}}}",
             &c, &w);
    expect_warn(&w, "scheduler.params.total_num_steps", "5 is less than warmup_num_steps 10");
}

/* ---- unknown keys: refused with the closest known key, or allowed ------------ */

/* A typo at some level: strict parsing refuses it naming `path` and
 * suggesting `fix` (a full path, or NULL for no suggestion); the document
 * with the typo's key replaced by the suggestion's last part parses. */
typedef struct ucase {
    const char *json; /* holds "typo" once, as a key */
    const char *typo; /* the key as written */
    const char *path; /* its full path */
    const char *fix;  /* the suggested full path, NULL: none */
} ucase_t;

static const ucase_t UCASES[] = {
    {"{\"train_batch_size\": 8, \"zero_optimisation\": {\"stage\": 2}}", "zero_optimisation",
     "zero_optimisation", "zero_optimization"},
    {"{\"Train_Batch_Size\": 8}", "Train_Batch_Size", "Train_Batch_Size", "train_batch_size"},
    {"{\"traing_batch_size\": 8}", "traing_batch_size", "traing_batch_size", "train_batch_size"},
    {"{\"steps_per_prnt\": 8}", "steps_per_prnt", "steps_per_prnt", "steps_per_print"},
    {"{\"gradient_clip\": 1.0}", "gradient_clip", "gradient_clip", "gradient_clipping"},
    {"{\"zero_optimization\": {\"stagee\": 2}}", "stagee", "zero_optimization.stagee",
     "zero_optimization.stage"},
    {"{\"zero_optimization\": {\"stgae\": 2}}", "stgae", "zero_optimization.stgae",
     "zero_optimization.stage"},
    {"{\"zero_optimization\": {\"prefetch_bucket_sise\": 10}}", "prefetch_bucket_sise",
     "zero_optimization.prefetch_bucket_sise", "zero_optimization.prefetch_bucket_size"},
    {"{\"zero_optimization\": {\"stage3_max_live_parameter\": 10}}", "stage3_max_live_parameter",
     "zero_optimization.stage3_max_live_parameter", "zero_optimization.stage3_max_live_parameters"},
    {"{\"zero_optimization\": {\"overlap_com\": true}}", "overlap_com",
     "zero_optimization.overlap_com", "zero_optimization.overlap_comm"},
    {"{\"zero_optimization\": {\"offload_optimiser\": {\"device\": \"cpu\"}}}", "offload_optimiser",
     "zero_optimization.offload_optimiser", "zero_optimization.offload_optimizer"},
    {"{\"zero_optimization\": {\"elastic_checkpoints\": true}}", "elastic_checkpoints",
     "zero_optimization.elastic_checkpoints", "zero_optimization.elastic_checkpoint"},
    {"{\"zero_optimization\": {\"offload_optimizer\": {\"devcie\": \"cpu\"}}}", "devcie",
     "zero_optimization.offload_optimizer.devcie", "zero_optimization.offload_optimizer.device"},
    {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", "
     "\"pin_memroy\": true}}}",
     "pin_memroy", "zero_optimization.offload_param.pin_memroy",
     "zero_optimization.offload_param.pin_memory"},
    {"{\"optimizer\": {\"type\": \"AdamW\", \"param\": {\"lr\": 0.1}}}", "param", "optimizer.param",
     "optimizer.params"},
    {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"weight_decai\": 0.1}}}", "weight_decai",
     "optimizer.params.weight_decai", "optimizer.params.weight_decay"},
    {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"beta\": [0.9, 0.99]}}}", "beta",
     "optimizer.params.beta", "optimizer.params.betas"},
    {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"foo\": 1}}}", "foo",
     "optimizer.params.foo", NULL},
    {"{\"scheduler\": {\"type\": \"WarmupLR\", \"parms\": {}}}", "parms", "scheduler.parms",
     "scheduler.params"},
    {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_steps\": 10}}}",
     "warmup_steps", "scheduler.params.warmup_steps", "scheduler.params.warmup_num_steps"},
    {"{\"fp16\": {\"enabled\": true, \"initial_scale_pow\": 8}}", "initial_scale_pow",
     "fp16.initial_scale_pow", "fp16.initial_scale_power"},
    {"{\"bf16\": {\"enable\": true}}", "enable", "bf16.enable", "bf16.enabled"},
    {"{\"bfloat16\": {\"enable\": true}}", "enable", "bfloat16.enable", "bfloat16.enabled"},
    {"{\"nonsense\": 1}", "nonsense", "nonsense", NULL},
};

/* json with the key "from" (quoted, first occurrence) renamed to "to". */
static void rename_key(const char *json, const char *from, const char *to, char *out, size_t cap)
{
    char q[128];
    snprintf(q, sizeof q, "\"%s\"", from);
    const char *at = strstr(json, q);
    TEST_CHECK(at != NULL);
    snprintf(out, cap, "%.*s\"%s\"%s", (int)(at - json), json, to, at + strlen(q));
}

static void test_unknown(void)
{
    int n = (int)(sizeof UCASES / sizeof UCASES[0]);
    for (int i = 0; i < n; i++) {
        const ucase_t *u = &UCASES[i];
        char want[512], fixed[512];
        /* strict: refused, naming the path and the suggestion */
        if (u->fix)
            snprintf(want, sizeof want, "unknown key %s (did you mean %s?);", u->path, u->fix);
        else
            snprintf(want, sizeof want, "unknown key %s;", u->path);
        parse_err(u->json, want, "--allow-unknown-keys", NULL);
        /* allowed: one warning, with the same suggestion */
        zs_config_t c;
        warns_t w;
        parse_ok_allow(u->json, &c, &w);
        if (u->fix)
            snprintf(want, sizeof want, "unknown key (did you mean %s?), ignored", u->fix);
        else
            snprintf(want, sizeof want, "unknown key, ignored");
        expect_warn(&w, u->path, want);
        /* the suggestion is a key that parses where the typo was */
        if (u->fix) {
            const char *last = strrchr(u->fix, '.');
            rename_key(u->json, u->typo, last ? last + 1 : u->fix, fixed, sizeof fixed);
            zs_err_t err = {0};
            TEST_CHECKF(zs_config_parse(fixed, &c, NULL, NULL, &err) == ZS_OK,
                        "case %d: suggestion %s does not parse: %s (%s)", i, u->fix, err.msg,
                        fixed);
        }
    }

    /* a typo'd section is not read: allowed, the run would be at stage 0 */
    zs_config_t c;
    warns_t w;
    parse_ok_allow("{\"zero_optimisation\": {\"stage\": 3}}", &c, &w);
    TEST_CHECK(c.stage == 0 && w.n == 1);

    /* every unknown key is named in the one error, in document order */
    parse_err("{\"zero_optimisation\": {}, \"foo\": 1, \"optimizer\": {\"type\": \"Adam\", "
              "\"params\": {\"lrr\": 1}}}",
              "unknown keys zero_optimisation (did you mean zero_optimization?), foo, "
              "optimizer.params.lrr (did you mean optimizer.params.lr?);",
              NULL, NULL);
    /* ... as many as fit, then "..."; the message stays whole */
    char big[4096];
    int o = snprintf(big, sizeof big, "{");
    for (int i = 0; i < 40; i++)
        o += snprintf(big + o, sizeof big - (size_t)o, "%s\"unknown_key_number_%02d\": %d",
                      i ? ", " : "", i, i);
    snprintf(big + o, sizeof big - (size_t)o, "}");
    zs_err_t err = {0};
    TEST_CHECK(zs_config_parse(big, &c, NULL, NULL, &err) == ZS_ERR_INVALID);
    TEST_CHECKF(strstr(err.msg, "unknown keys unknown_key_number_00, unknown_key_number_01") &&
                    strstr(err.msg, ", ...; zs-train --allow-unknown-keys") &&
                    strlen(err.msg) < ZS_ERR_MSG_MAX - 1,
                "%s", err.msg);

    /* a type error is reported even after an unknown key */
    parse_err("{\"foo\": 1, \"train_batch_size\": \"8\"}", "train_batch_size", "\"8\"", NULL);
    /* inside a section zeroshard only recognises, keys are not looked at */
    parse_ok("{\"tensorboard\": {\"enabled\": true, \"anything\": 1}}", &c, &w);
    TEST_CHECK(w.n == 1);
    expect_warn(&w, "tensorboard", "not implemented");
    /* a refused parse leaves the config untouched, and warns about nothing unknown */
    zs_config_t before;
    parse_ok("{\"train_batch_size\": 8}", &c, &w);
    memcpy(&before, &c, sizeof c);
    memset(&w, 0, sizeof w);
    TEST_CHECK(zs_config_parse("{\"train_batch_size\": 16, \"zero_optimization\": {\"stage\": 3, "
                               "\"stagee\": 1}}",
                               &c, on_warn, &w, &err) == ZS_ERR_INVALID);
    TEST_CHECK(memcmp(&before, &c, sizeof c) == 0 && w.n == 0);
}

/* ---- keys read but without effect: one warning each --------------------------- */

static void test_no_effect(void)
{
    zs_config_t c;
    warns_t w;
    /* the values zeroshard acts like, given explicitly: still no effect */
    parse_ok("{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": true, "
             "\"contiguous_gradients\": true, \"reduce_scatter\": true, \"allgather_partitions\": "
             "true, \"round_robin_gradients\": false, \"sub_group_size\": 1e9, "
             "\"allgather_bucket_size\": 5e8, \"stage3_gather_16bit_weights_on_model_save\": "
             "false, \"reduce_bucket_size\": 1000, \"stage3_prefetch_bucket_size\": 10}}",
             &c, &w);
    const char *keys[] = {"overlap_comm",          "contiguous_gradients",
                          "reduce_scatter",        "allgather_partitions",
                          "round_robin_gradients", "sub_group_size",
                          "allgather_bucket_size", "stage3_gather_16bit_weights_on_model_save"};
    int nk = (int)(sizeof keys / sizeof keys[0]);
    for (int i = 0; i < nk; i++) {
        char p[128];
        snprintf(p, sizeof p, "zero_optimization.%s", keys[i]);
        expect_warn(&w, p, "no effect: ");
    }
    if (w.n != nk)
        dump_warns(&w);
    TEST_CHECK(w.n == nk); /* implemented keys (reduce_bucket_size, stage3_*) say nothing */
    /* the values are still read and checked */
    TEST_CHECK(c.overlap_comm == 1 && c.sub_group_size == 1000000000 &&
               c.allgather_bucket_size == 500000000 && c.reduce_bucket_size == 1000);
    expect_warn(&w, "zero_optimization.overlap_comm",
                "no effect: stages 2-3 always overlap the gradient reduce-scatter with backward");
    parse_err("{\"zero_optimization\": {\"overlap_comm\": 2}}", "zero_optimization.overlap_comm",
              "2", NULL);
    /* not given: nothing to say, DeepSpeed's default still applies */
    parse_ok("{\"zero_optimization\": {\"stage\": 3}}", &c, &w);
    TEST_CHECK(w.n == 0 && c.overlap_comm == 1);
}

/* ---- DeepSpeed's optimizer / scheduler / ZeRO rules -------------------------- */

static void test_semantics(void)
{
    zs_config_t c;
    warns_t w;
    /* "Adam" means AdamW unless adam_w_mode is false; "AdamW" always */
    parse_ok("{\"optimizer\": {\"type\": \"ADAM\", \"params\": {\"weight_decay\": 0.01}}}", &c, &w);
    TEST_CHECK(c.optimizer_given && c.adam.adam_w_mode == 1 && c.adam.weight_decay == 0.01f);
    parse_ok("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false}}}", &c, &w);
    TEST_CHECK(c.adam.adam_w_mode == 0);
    parse_ok("{\"optimizer\": {\"type\": \"adamw\", \"params\": {\"adam_w_mode\": false}}}", &c,
             &w);
    TEST_CHECK(c.adam.adam_w_mode == 1);
    parse_ok("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"adam_w_mode\": 0, "
             "\"bias_correction\": 0, \"amsgrad\": false}}}",
             &c, &w);
    TEST_CHECK(c.adam.adam_w_mode == 1 && c.adam.bias_correction == 0 && w.n == 0);
    /* torch_adam: torch's default weight decay only for AdamW, only if absent */
    parse_ok("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, "
             "\"weight_decay\": 0.05}}}",
             &c, &w);
    TEST_CHECK(c.adam.weight_decay == 0.05f);
    parse_ok("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": true, "
             "\"adam_w_mode\": false}}}",
             &c, &w);
    TEST_CHECK(c.adam.weight_decay == 0.0f && c.adam.adam_w_mode == 0);
    /* scheduler defaults: WarmupLR max = optimizer lr; WarmupDecayLR 0.001 */
    parse_ok("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}, "
             "\"scheduler\": {\"type\": \"WarmupLR\"}}",
             &c, &w);
    TEST_CHECK(c.sched.type == ZS_SCHED_WARMUP_LR && c.sched.warmup_max_lr == 3e-4 &&
               c.sched.warmup_min_lr == 0.0 && c.sched.warmup_num_steps == 1000 &&
               c.sched.warmup_type == ZS_WARMUP_LOG);
    parse_ok("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 5}}}", &c,
             &w);
    TEST_CHECK(c.sched.warmup_max_lr == 0.001 && c.sched.warmup_num_steps == 5);
    parse_ok("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}, \"scheduler\": "
             "{\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": 100}}}",
             &c, &w);
    TEST_CHECK(c.sched.warmup_max_lr == 0.001 && c.sched.total_num_steps == 100);
    /* overlap_comm: None -> stage == 3 */
    parse_ok("{\"zero_optimization\": {\"stage\": 3}}", &c, &w);
    TEST_CHECK(c.overlap_comm == 1);
    parse_ok("{\"zero_optimization\": {\"stage\": 3, \"overlap_comm\": false}}", &c, &w);
    TEST_CHECK(c.overlap_comm == 0);
    parse_ok("{\"zero_optimization\": {\"stage\": 1, \"overlap_comm\": true}}", &c, &w);
    TEST_CHECK(c.overlap_comm == 1);
    /* sizes as DeepSpeed writes them */
    parse_ok("{\"zero_optimization\": {\"reduce_bucket_size\": 5e8, \"allgather_bucket_size\": "
             "1.5e3, \"sub_group_size\": 1e12}}",
             &c, &w);
    TEST_CHECK(c.reduce_bucket_size == 500000000 && c.allgather_bucket_size == 1500 &&
               c.sub_group_size == 1000000000000LL);
    /* static loss scale, fp16 options */
    parse_ok("{\"fp16\": {\"enabled\": true, \"loss_scale\": 128, \"consecutive_hysteresis\": "
             "true}}",
             &c, &w);
    TEST_CHECK(c.fp16.loss_scale == 128.0 && c.fp16.consecutive_hysteresis == 1);
    /* offload_optimizer: null and "none" mean no offload */
    parse_ok(
        "{\"zero_optimization\": {\"offload_optimizer\": null, \"offload_param\": {\"device\": "
        "\"none\"}}}",
        &c, &w);
    TEST_CHECK(!c.offload_optimizer && !c.offload_param && w.n == 0);
}

static void test_print(void)
{
    zs_config_t c;
    warns_t w;
    load_ok(FIXTURE("ds_000_seed.json"), &c, &w);
    resolve_ok(&c, 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    TEST_CHECK(f != NULL);
    zs_config_print(&c, f);
    fclose(f);
    const char *want[] = {"train_batch_size = 32\n",
                          "train_micro_batch_size_per_gpu = 8\n",
                          "gradient_accumulation_steps = 4\n",
                          "precision = fp16\n",
                          "fp16.loss_scale = 0 (dynamic)\n",
                          "fp16.initial_scale_power = 16\n",
                          "zero_optimization.stage = 2\n",
                          "zero_optimization.offload_optimizer.device = cpu\n",
                          "zero_optimization.reduce_bucket_size = 500000000\n",
                          "scheduler.type = none (constant lr)\n",
                          "optimizer.params.betas = [0.9, 0.999]\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        TEST_CHECKF(strstr(buf, want[i]), "print lacks '%s':\n%s", want[i], buf);
    /* one key per line */
    for (char *p = buf; *p;) {
        char *nl = strchr(p, '\n');
        TEST_CHECK(nl != NULL);
        TEST_CHECKF(memchr(p, '=', (size_t)(nl - p)) != NULL, "line without key: %.*s",
                    (int)(nl - p), p);
        p = nl + 1;
    }
    free(buf);
}

int main(void)
{
    test_defaults();
    test_seed_000();
    test_seed_004();
    test_full();
    test_mics();
    test_hf_auto();
    test_relaxed();
    test_batch();
    test_errors();
    test_warnings();
    test_unknown();
    test_no_effect();
    test_semantics();
    test_print();
    printf("test_config: ok\n");
    return 0;
}
