/*
 * zs_config_print.c - the resolved configuration as text: the table
 * (zs_config_print, one "key = value" line per field under its DeepSpeed
 * name), its digest (zs_config_digest: XXH3-64 of the table's text) and the
 * one-line summary (zs_config_summary: the digest and the keys whose value
 * is not the default, "key=value", for zs-train's start-up line).
 *
 * Every line comes from one list (collect): the table writes it, the
 * summary compares it with the same list made from DeepSpeed's defaults,
 * so the two cannot disagree about a key. Floats are written in their
 * shortest round-tripping form.
 *
 * What it does not do: parse, apply defaults or resolve (zs_config.c,
 * zs_config_resolve.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "zs_config.h"
#include "zs_strbuf.h"

#define MAX_LINES 64 /* lines of the table; about 45 when every section is on */

/* One line of the table: "key = value note". brief is the summary's value
 * where the value has words in it (else the value without its blanks). */
typedef struct line {
    char key[72], value[48], note[64];
    const char *brief;
} line_t;

typedef struct lines {
    line_t l[MAX_LINES];
    int n;
} lines_t;

static void put(lines_t *ls, const char *key, const char *value, const char *note,
                const char *brief)
{
    if (ls->n == MAX_LINES) /* a new field beyond the bound: caught by test_config */
        return;
    line_t *l = &ls->l[ls->n++];
    snprintf(l->key, sizeof l->key, "%s", key);
    snprintf(l->value, sizeof l->value, "%s", value);
    snprintf(l->note, sizeof l->note, "%s", note ? note : "");
    l->brief = brief;
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

static const char *fmt_i(long long v, char *buf)
{
    snprintf(buf, 32, "%lld", v);
    return buf;
}

/* Every line of cfg's table, in table order. all: also the lines the table
 * shows only when their section is on (the defaults' list, which the
 * summary compares with, needs a value for each key a table may show). */
static void collect(const zs_config_t *cfg, int all, lines_t *ls)
{
    char b[32], b2[32], v[80];
    ls->n = 0;
    put(ls, "train_batch_size", fmt_i(cfg->train_batch_size, b), NULL, NULL);
    put(ls, "train_micro_batch_size_per_gpu", fmt_i(cfg->micro_batch_per_gpu, b), NULL, NULL);
    put(ls, "gradient_accumulation_steps", fmt_i(cfg->gradient_accumulation_steps, b), NULL, NULL);
    put(ls, "gradient_clipping", fmt_d(cfg->gradient_clipping, b),
        cfg->gradient_clipping > 0 ? NULL : "(off)", NULL);
    put(ls, "optimizer.type", cfg->adam.adam_w_mode ? "AdamW" : "Adam",
        cfg->adam.adam_w_mode
            ? (cfg->optimizer_given ? "(decoupled weight decay)"
                                    : "(decoupled weight decay) (default: no optimizer section)")
            : (cfg->optimizer_given ? "(L2 weight decay)"
                                    : "(L2 weight decay) (default: no optimizer section)"),
        NULL);
    put(ls, "optimizer.params.lr", fmt_f(cfg->adam.lr, b), NULL, NULL);
    snprintf(v, sizeof v, "[%s, %s]", fmt_f(cfg->adam.beta1, b), fmt_f(cfg->adam.beta2, b2));
    put(ls, "optimizer.params.betas", v, NULL, NULL);
    put(ls, "optimizer.params.eps", fmt_f(cfg->adam.eps, b), NULL, NULL);
    put(ls, "optimizer.params.weight_decay", fmt_f(cfg->adam.weight_decay, b), NULL, NULL);
    put(ls, "optimizer.params.adam_w_mode", tf(cfg->adam.adam_w_mode), NULL, NULL);
    put(ls, "optimizer.params.bias_correction", tf(cfg->adam.bias_correction), NULL, NULL);
    const zs_sched_config_t *s = &cfg->sched;
    put(ls, "scheduler.type",
        s->type == ZS_SCHED_WARMUP_LR         ? "WarmupLR"
        : s->type == ZS_SCHED_WARMUP_DECAY_LR ? "WarmupDecayLR"
                                              : "none",
        s->type == ZS_SCHED_NONE ? "(constant lr)" : NULL, NULL);
    if (all || s->type != ZS_SCHED_NONE) {
        put(ls, "scheduler.params.warmup_min_lr", fmt_d(s->warmup_min_lr, b), NULL, NULL);
        put(ls, "scheduler.params.warmup_max_lr", fmt_d(s->warmup_max_lr, b), NULL, NULL);
        put(ls, "scheduler.params.warmup_num_steps", fmt_i(s->warmup_num_steps, b), NULL, NULL);
        put(ls, "scheduler.params.warmup_type",
            s->warmup_type == ZS_WARMUP_LINEAR ? "linear" : "log", NULL, NULL);
    }
    if (all || s->type == ZS_SCHED_WARMUP_DECAY_LR)
        put(ls, "scheduler.params.total_num_steps", fmt_i(s->total_num_steps, b), NULL, NULL);
    put(ls, "precision", zs_dtype_name(cfg->dtype), NULL, NULL);
    put(ls, "fp16.enabled", tf(cfg->fp16.enabled), NULL, NULL);
    const zs_fp16_config_t *h = &cfg->fp16;
    if (all || h->enabled)
        put(ls, "fp16.loss_scale", fmt_d(h->loss_scale, b),
            h->loss_scale > 0 ? "(static)" : "(dynamic)", NULL);
    if (all || (h->enabled && !(h->loss_scale > 0))) {
        put(ls, "fp16.initial_scale_power", fmt_i(h->initial_scale_power, b), NULL, NULL);
        put(ls, "fp16.loss_scale_window", fmt_i(h->loss_scale_window, b), NULL, NULL);
        put(ls, "fp16.hysteresis", fmt_i(h->hysteresis, b), NULL, NULL);
        put(ls, "fp16.consecutive_hysteresis", tf(h->consecutive_hysteresis), NULL, NULL);
        put(ls, "fp16.min_loss_scale", fmt_d(h->min_loss_scale, b), NULL, NULL);
    }
    put(ls, "bf16.enabled", tf(cfg->bf16_enabled), NULL, NULL);
    put(ls, "zero_optimization.stage", fmt_i(cfg->stage, b), NULL, NULL);
    put(ls, "zero_optimization.offload_optimizer.device", cfg->offload_optimizer ? "cpu" : "none",
        NULL, NULL);
    if (all || cfg->offload_optimizer)
        put(ls, "zero_optimization.offload_optimizer.super_offload", tf(cfg->offload_speculate),
            NULL, NULL);
    if (all || (cfg->offload_optimizer && cfg->offload_speculate))
        put(ls, "zero_optimization.offload_optimizer.speculate_every_step",
            tf(cfg->offload_speculate_every), NULL, NULL);
    if (all || cfg->offload_optimizer)
        put(ls, "zero_optimization.offload_optimizer.stream_pulls", tf(cfg->offload_stream), NULL,
            NULL);
    if (all || cfg->offload_delay_after >= 0)
        put(ls, "zero_optimization.offload_optimizer.delayed_update_after",
            fmt_i(cfg->offload_delay_after, b), NULL, NULL);
    put(ls, "zero_optimization.offload_param.device",
        cfg->offload_param_nvme ? "nvme"
        : cfg->offload_param    ? "cpu"
                                : "none",
        NULL, NULL);
    if (all || cfg->offload_param_nvme) {
        put(ls, "zero_optimization.offload_param.nvme_path", cfg->offload_param_nvme_path, NULL,
            NULL);
        put(ls, "zero_optimization.offload_param.buffer_count",
            fmt_i(cfg->offload_param_buffer_count, b), NULL, NULL);
        put(ls, "zero_optimization.offload_param.buffer_size",
            fmt_i(cfg->offload_param_buffer_size, b), NULL, NULL);
        put(ls, "zero_optimization.offload_param.max_in_cpu",
            fmt_i(cfg->offload_param_max_in_cpu, b), NULL, NULL);
    }
    put(ls, "zero_optimization.reduce_bucket_size", fmt_i(cfg->reduce_bucket_size, b), NULL, NULL);
    put(ls, "zero_optimization.allgather_bucket_size", fmt_i(cfg->allgather_bucket_size, b), NULL,
        NULL);
    put(ls, "zero_optimization.overlap_comm", tf(cfg->overlap_comm), NULL, NULL);
    put(ls, "zero_optimization.contiguous_gradients", tf(cfg->contiguous_gradients), NULL, NULL);
    put(ls, "zero_optimization.reduce_scatter", tf(cfg->reduce_scatter), NULL, NULL);
    put(ls, "zero_optimization.allgather_partitions", tf(cfg->allgather_partitions), NULL, NULL);
    put(ls, "zero_optimization.round_robin_gradients", tf(cfg->round_robin_gradients), NULL, NULL);
    put(ls, "zero_optimization.sub_group_size", fmt_i(cfg->sub_group_size, b), NULL, NULL);
    put(ls, "zero_optimization.stage3_prefetch_bucket_size",
        fmt_i(cfg->stage3_prefetch_bucket_size, b), NULL, NULL);
    put(ls, "zero_optimization.stage3_param_persistence_threshold",
        fmt_i(cfg->stage3_param_persistence_threshold, b), NULL, NULL);
    put(ls, "zero_optimization.stage3_max_live_parameters",
        fmt_i(cfg->stage3_max_live_parameters, b), NULL, NULL);
    put(ls, "zero_optimization.stage3_max_reuse_distance", fmt_i(cfg->stage3_max_reuse_distance, b),
        NULL, NULL);
    put(ls, "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        tf(cfg->stage3_gather_16bit_weights_on_model_save), NULL, NULL);
    put(ls, "zero_optimization.zero_hpz_partition_size", fmt_i(cfg->zero_hpz_partition_size, b),
        cfg->zero_hpz_partition_size > 1 ? "secondary partition within the node" : NULL, NULL);
    put(ls, "zero_optimization.zero_quantized_gradients", tf(cfg->zero_quantized_gradients),
        cfg->zero_quantized_gradients ? "int8 records, within the node then across" : NULL, NULL);
    put(ls, "zero_optimization.zero_quantized_weights", tf(cfg->zero_quantized_weights),
        cfg->zero_quantized_weights ? "int8 blocks of 4096, fp32 scales" : NULL, NULL);
    put(ls, "zero_optimization.mics_shard_size", fmt_i(cfg->mics_shard_size, b),
        cfg->mics_shard_size > 0 ? "MiCS: partitioned within groups of this many ranks" : NULL,
        NULL);
    put(ls, "zero_optimization.mics_hierarchical_params_gather",
        tf(cfg->mics_hierarchical_params_gather),
        cfg->mics_hierarchical_params_gather ? "two hops where a group spans nodes" : NULL, NULL);
    put(ls, "activation_checkpointing", cfg->act_ckpt ? "every GPT block" : "off",
        cfg->act_ckpt ? "(section given)" : "(no section)", cfg->act_ckpt ? "on" : "off");
    if (all || cfg->act_ckpt)
        put(ls, "activation_checkpointing.cpu_checkpointing", tf(cfg->act_ckpt_cpu), NULL, NULL);
}

/* The table's text into b. */
static void table(const zs_config_t *cfg, zs_strbuf_t *b)
{
    lines_t ls;
    collect(cfg, 0, &ls);
    for (int i = 0; i < ls.n; i++)
        zs_strbuf_addf(b, "%s = %s%s%s\n", ls.l[i].key, ls.l[i].value, *ls.l[i].note ? " " : "",
                       ls.l[i].note);
}

/* Print every field under its DeepSpeed name; see zs_config.h. */
void zs_config_print(const zs_config_t *cfg, void *f)
{
    zs_strbuf_t b = {0};
    table(cfg, &b);
    if (b.p)
        fputs(b.p, (FILE *)f);
    free(b.p);
}

/* XXH3-64 of the table; see zs_config.h. */
uint64_t zs_config_digest(const zs_config_t *cfg)
{
    zs_strbuf_t b = {0};
    table(cfg, &b);
    uint64_t h = XXH3_64bits(b.p ? b.p : "", b.len);
    free(b.p);
    return h;
}

/* The defaults cfg is compared with: DeepSpeed's, plus the defaults
 * DeepSpeed derives from other keys (overlap_comm from the stage,
 * WarmupLR's warmup_max_lr from the optimizer's lr), so a key the file
 * left alone is never listed. */
static void reference(const zs_config_t *cfg, zs_config_t *ref)
{
    char b[32];
    zs_config_defaults(ref);
    ref->overlap_comm = cfg->stage == 3;
    ref->sched.warmup_max_lr =
        cfg->sched.type == ZS_SCHED_WARMUP_LR ? strtod(fmt_f(cfg->adam.lr, b), NULL) : 0.001;
}

/* Append key=value in the summary's spelling: "zero_optimization." is
 * "zero.", a ".params." level is left out, the value loses its blanks. */
static void add_brief(zs_strbuf_t *b, const line_t *l)
{
    const char *k = l->key, *p;
    char key[72];
    if (strncmp(k, "zero_optimization.", 18) == 0)
        snprintf(key, sizeof key, "zero.%s", k + 18);
    else if ((p = strstr(k, ".params.")) != NULL)
        snprintf(key, sizeof key, "%.*s.%s", (int)(p - k), k, p + 8);
    else
        snprintf(key, sizeof key, "%s", k);
    zs_strbuf_addf(b, " %s=", key);
    if (l->brief) {
        zs_strbuf_addf(b, "%s", l->brief);
        return;
    }
    for (const char *s = l->value; *s; s++)
        if (*s != ' ')
            zs_strbuf_addf(b, "%c", *s);
}

/* The one-line summary; see zs_config.h. */
int zs_config_summary(const zs_config_t *cfg, char **out, zs_err_t *err)
{
    zs_config_t ref;
    reference(cfg, &ref);
    lines_t *mine = malloc(sizeof *mine), *def = malloc(sizeof *def);
    zs_strbuf_t b = {0};
    *out = NULL;
    if (!mine || !def) {
        free(mine);
        free(def);
        return zs_err_set(err, ZS_ERR_NOMEM, "config summary: out of memory");
    }
    collect(cfg, 0, mine);
    collect(&ref, 1, def);
    zs_strbuf_addf(&b, "config %016llx:", (unsigned long long)zs_config_digest(cfg));
    int listed = 0;
    for (int i = 0; i < mine->n; i++) {
        const line_t *l = &mine->l[i], *d = NULL;
        for (int j = 0; j < def->n && !d; j++)
            if (strcmp(def->l[j].key, l->key) == 0)
                d = &def->l[j];
        if (d && strcmp(d->value, l->value) == 0)
            continue;
        add_brief(&b, l);
        listed++;
    }
    if (!listed)
        zs_strbuf_addf(&b, " (all defaults)");
    free(mine);
    free(def);
    if (b.oom) {
        free(b.p);
        return zs_err_set(err, ZS_ERR_NOMEM, "config summary: out of memory");
    }
    *out = b.p;
    return ZS_OK;
}
