/*
 * test_config_print.c - the resolved configuration as zs-train shows it
 * (worker/config/zs_config_print.c), and the configs we ship.
 *
 *  1. Shipped configs: deploy/ds_quickstart.json (the README's first
 *     command) and the ds.json of deploy/k8s/configmap.yaml load without a
 *     single warning and resolve (W = 1, 2; k8s: 8), so our own examples
 *     never ask the user to ignore a warning.
 *  2. The one-line summary (zs_config_summary): "config <16 hex>: " then
 *     exactly the keys that differ from DeepSpeed's defaults, key=value in
 *     table order (the quickstart's, spelled out); batch sizes always;
 *     defaults DeepSpeed derives (stage 3's overlap_comm, WarmupLR's
 *     warmup_max_lr = lr) left out, the same values given against them
 *     listed; notes and blanks left out (activation_checkpointing=on,
 *     betas=[0.9,0.95]).
 *  3. The digest is XXH3-64 of zs_config_print's text; the same config
 *     gives the same digest, one key changed (or another world size, which
 *     changes the derived accumulation) gives another.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "zs_config.h"
#include "zs_test.h"
#include "zs_warntest.h"

#define QUICKSTART ZS_SOURCE_DIR "/deploy/ds_quickstart.json"
#define CONFIGMAP  ZS_SOURCE_DIR "/deploy/k8s/configmap.yaml"

static void show_warns(const char *what, const warns_t *w)
{
    for (int i = 0; i < w->n; i++)
        fprintf(stderr, "  %s: warning %s: %s\n", what, w->path[i], w->why[i]);
}

/* Parse json (or load path when json is NULL) and resolve for W. */
static void load(const char *json, const char *path, int W, zs_config_t *c, warns_t *w)
{
    zs_err_t err = {0};
    memset(w, 0, sizeof *w);
    if (json)
        TEST_OK(zs_config_parse(json, c, on_warn, w, &err), err);
    else
        TEST_OK(zs_config_load(path, c, on_warn, w, &err), err);
    TEST_OK(zs_config_resolve(c, W, &err), err);
}

/* The summary's keys (what follows "config <hex>: "); checks the prefix. */
static char *keys_of(const zs_config_t *c)
{
    static char buf[4096];
    char *line = NULL;
    zs_err_t err = {0};
    TEST_OK(zs_config_summary(c, &line, &err), err);
    char want[40];
    snprintf(want, sizeof want, "config %016llx: ", (unsigned long long)zs_config_digest(c));
    TEST_CHECKF(strncmp(line, want, strlen(want)) == 0 && !strchr(line, '\n'),
                "summary '%s' does not start with '%s' (or holds a newline)", line, want);
    snprintf(buf, sizeof buf, "%s", line + strlen(want));
    free(line);
    return buf;
}

static void expect_keys(const char *json, int W, const char *want)
{
    zs_config_t c;
    warns_t w;
    load(json, NULL, W, &c, &w);
    const char *got = keys_of(&c);
    TEST_CHECKF(strcmp(got, want) == 0, "%s at W=%d:\n  summary  %s\n  expected %s", json, W, got,
                want);
}

/* 1. our examples load without a warning */
static void test_shipped(void)
{
    zs_config_t c;
    warns_t w;
    for (int W = 1; W <= 2; W++) {
        load(NULL, QUICKSTART, W, &c, &w);
        show_warns(QUICKSTART, &w);
        TEST_CHECKF(w.n == 0, "%s: %d warning(s); a shipped example must load without any",
                    QUICKSTART, w.n);
    }
    /* the ConfigMap's ds.json: the indented block after "ds.json: |" */
    FILE *f = fopen(CONFIGMAP, "r");
    TEST_CHECKF(f != NULL, "cannot read %s", CONFIGMAP);
    char line[1024], *json = calloc(1, 1 << 16);
    size_t n = 0;
    int in = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "ds.json: |")) {
            in = 1;
            continue;
        }
        if (in && (line[0] != ' ' || strstr(line, "train.sh: |")))
            break;
        if (in)
            n += (size_t)snprintf(json + n, (1 << 16) - n, "%s", line);
    }
    fclose(f);
    TEST_CHECKF(n > 0, "no ds.json block in %s", CONFIGMAP);
    load(json, NULL, 8, &c, &w);
    show_warns("configmap.yaml ds.json", &w);
    TEST_CHECKF(w.n == 0, "%s: ds.json gives %d warning(s); it must load without any", CONFIGMAP,
                w.n);
    free(json);
    printf("1. deploy/ds_quickstart.json (W=1, 2) and the k8s ConfigMap's ds.json (W=8): no "
           "warning\n");
}

/* 2. the one-line summary */
static void test_summary(void)
{
    zs_config_t c;
    warns_t w;
    load(NULL, QUICKSTART, 2, &c, &w);
    const char *got = keys_of(&c);
    const char *want =
        "train_batch_size=16 train_micro_batch_size_per_gpu=4 gradient_accumulation_steps=2 "
        "gradient_clipping=1 optimizer.lr=0.002 optimizer.betas=[0.9,0.95] "
        "optimizer.weight_decay=0.1 scheduler.type=WarmupDecayLR scheduler.warmup_max_lr=0.002 "
        "scheduler.warmup_num_steps=30 scheduler.warmup_type=linear "
        "scheduler.total_num_steps=300 zero.stage=2 zero.offload_optimizer.device=cpu "
        "zero.reduce_bucket_size=200000";
    TEST_CHECKF(strcmp(got, want) == 0, "quickstart summary:\n  %s\nexpected\n  %s", got, want);
    printf("2. quickstart (W=2): %s\n", got);
    /* nothing but the batch sizes */
    expect_keys("{\"train_batch_size\": 8}", 1,
                "train_batch_size=8 train_micro_batch_size_per_gpu=8 "
                "gradient_accumulation_steps=1");
    /* derived defaults are not listed; the same values given against them are */
    expect_keys("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3}}", 1,
                "train_batch_size=8 train_micro_batch_size_per_gpu=8 "
                "gradient_accumulation_steps=1 zero.stage=3");
    expect_keys("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                "\"overlap_comm\": false}}",
                1,
                "train_batch_size=8 train_micro_batch_size_per_gpu=8 "
                "gradient_accumulation_steps=1 zero.stage=3 zero.overlap_comm=false");
    expect_keys("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
                "{\"lr\": 3e-4}}, \"scheduler\": {\"type\": \"WarmupLR\"}}",
                1,
                "train_batch_size=8 train_micro_batch_size_per_gpu=8 "
                "gradient_accumulation_steps=1 optimizer.lr=0.0003 scheduler.type=WarmupLR");
    /* notes left out, words replaced: a value without blanks */
    expect_keys("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"loss_scale\": 128}, "
                "\"activation_checkpointing\": {\"cpu_checkpointing\": true}}",
                1,
                "train_batch_size=8 train_micro_batch_size_per_gpu=8 "
                "gradient_accumulation_steps=1 precision=fp16 fp16.enabled=true "
                "fp16.loss_scale=128 activation_checkpointing=on "
                "activation_checkpointing.cpu_checkpointing=true");
    expect_keys("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": "
                "{\"adam_w_mode\": false}}}",
                1,
                "train_batch_size=8 train_micro_batch_size_per_gpu=8 "
                "gradient_accumulation_steps=1 optimizer.type=Adam optimizer.adam_w_mode=false");
    printf("2. summaries: batch sizes always, derived defaults left out, notes and blanks left "
           "out\n");
}

/* 3. the digest */
static void test_digest(void)
{
    zs_config_t a, b;
    warns_t w;
    load(NULL, QUICKSTART, 2, &a, &w);
    uint64_t d = zs_config_digest(&a);
    load(NULL, QUICKSTART, 2, &b, &w);
    TEST_CHECK(zs_config_digest(&b) == d);
    b.reduce_bucket_size++; /* one key */
    TEST_CHECKF(zs_config_digest(&b) != d, "reduce_bucket_size changed, the digest did not");
    TEST_CHECK(strstr(keys_of(&b), " zero.reduce_bucket_size=200001"));
    load(NULL, QUICKSTART, 1, &b, &w); /* W = 1: accumulation 4 */
    TEST_CHECKF(zs_config_digest(&b) != d, "W=1 and W=2 gave the same digest");
    TEST_CHECK(strstr(keys_of(&b), " gradient_accumulation_steps=4 "));
    load(NULL, QUICKSTART, 2, &b, &w);
    b.offload_stream = 0; /* a key shown only with offload */
    TEST_CHECKF(zs_config_digest(&b) != d, "stream_pulls changed, the digest did not");
    TEST_CHECK(strstr(keys_of(&b), " zero.offload_optimizer.stream_pulls=false "));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    TEST_CHECK(f != NULL);
    zs_config_print(&a, f);
    fclose(f);
    TEST_CHECKF(d == XXH3_64bits(text, len), "digest %016llx is not XXH3-64 of the table",
                (unsigned long long)d);
    free(text);
    printf("3. digest %016llx = XXH3-64 of the table; changes with a key and with W\n",
           (unsigned long long)d);
}

int main(void)
{
    test_shipped();
    test_summary();
    test_digest();
    printf("test_config_print: ok\n");
    return 0;
}
