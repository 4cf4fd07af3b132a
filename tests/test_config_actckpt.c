/*
 * test_config_actckpt.c - DeepSpeed's "activation_checkpointing" section
 * (worker/config/zs_config_actckpt.c): the section given turns the GPT's
 * checkpointing on, cpu_checkpointing is read, each key without effect
 * (partition_activations, contiguous_memory_optimization,
 * number_checkpoints, synchronize_checkpoint_boundary, profile) is warned
 * once by path whatever its value, values are type-checked, a typo inside
 * the section or in its name is refused with the closest key, and the
 * printed dump shows the setting. One check per behaviour.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_config.h"
#include "zs_test.h"
#include "zs_warntest.h"

static void parse_ok(const char *json, zs_config_t *cfg, warns_t *w)
{
    zs_err_t err = {0};
    memset(w, 0, sizeof *w);
    TEST_OK(zs_config_parse(json, cfg, on_warn, w, &err), err);
}

/* parse fails (ZS_ERR_INVALID or ZS_ERR_RANGE); the message holds s1 and s2 (s2 may be NULL) */
static void parse_err(const char *json, const char *s1, const char *s2)
{
    zs_config_t cfg;
    warns_t w = {0};
    zs_err_t err = {0};
    int rc = zs_config_parse(json, &cfg, on_warn, &w, &err);
    TEST_CHECKF(rc < 0, "parse of %s: rc %d", json, rc);
    TEST_CHECKF(strstr(err.msg, s1) && (!s2 || strstr(err.msg, s2)), "error for %s: '%s'", json,
                err.msg);
    printf("  refused: %s\n", err.msg);
}

/* no section: off; an empty section: on, silently */
static void test_presence(void)
{
    zs_config_t c;
    warns_t w;
    parse_ok("{\"train_batch_size\": 4}", &c, &w);
    TEST_CHECK(c.act_ckpt == 0 && c.act_ckpt_cpu == 0 && w.n == 0);
    parse_ok("{\"train_batch_size\": 4, \"activation_checkpointing\": {}}", &c, &w);
    TEST_CHECK(c.act_ckpt == 1 && c.act_ckpt_cpu == 0 && w.n == 0);
    parse_ok("{\"train_batch_size\": 4, \"activation_checkpointing\": null}", &c, &w);
    TEST_CHECK(c.act_ckpt == 0 && w.n == 0);
}

/* cpu_checkpointing read, true and false, no warning */
static void test_cpu(void)
{
    zs_config_t c;
    warns_t w;
    parse_ok("{\"activation_checkpointing\": {\"cpu_checkpointing\": true}}", &c, &w);
    TEST_CHECK(c.act_ckpt == 1 && c.act_ckpt_cpu == 1 && w.n == 0);
    parse_ok("{\"activation_checkpointing\": {\"cpu_checkpointing\": false}}", &c, &w);
    TEST_CHECK(c.act_ckpt == 1 && c.act_ckpt_cpu == 0 && w.n == 0);
}

/* every key without effect: warned once, whatever its value */
static void test_no_effect(void)
{
    zs_config_t c;
    warns_t w;
    const char *json[2] = {
        "{\"activation_checkpointing\": {\"partition_activations\": true, "
        "\"cpu_checkpointing\": true, \"contiguous_memory_optimization\": true, "
        "\"number_checkpoints\": 4, \"synchronize_checkpoint_boundary\": true, "
        "\"profile\": true}}",
        "{\"activation_checkpointing\": {\"partition_activations\": false, "
        "\"contiguous_memory_optimization\": false, \"number_checkpoints\": "
        "null, \"synchronize_checkpoint_boundary\": false, \"profile\": false}}"};
    const char *keys[5] = {"partition_activations", "contiguous_memory_optimization",
                           "number_checkpoints", "synchronize_checkpoint_boundary", "profile"};
    for (int j = 0; j < 2; j++) {
        parse_ok(json[j], &c, &w);
        TEST_CHECK(c.act_ckpt == 1 && c.act_ckpt_cpu == (j == 0));
        for (int i = 0; i < 5; i++) {
            char p[128];
            snprintf(p, sizeof p, "activation_checkpointing.%s", keys[i]);
            expect_warn(&w, p, "no effect: ");
        }
        TEST_CHECKF(w.n == 5, "%d warnings", w.n);
    }
    expect_warn(&w, "activation_checkpointing.contiguous_memory_optimization",
                "no effect: the checkpoints are one contiguous allocation already");
    for (int i = 0; i < w.n; i++)
        printf("  warned once: %s: %s\n", w.path[i], w.why[i]);
}

/* values are checked */
static void test_values(void)
{
    parse_err("{\"activation_checkpointing\": {\"cpu_checkpointing\": 2}}",
              "activation_checkpointing.cpu_checkpointing", NULL);
    parse_err("{\"activation_checkpointing\": {\"number_checkpoints\": 0}}",
              "activation_checkpointing.number_checkpoints", NULL);
    parse_err("{\"activation_checkpointing\": {\"profile\": \"yes\"}}",
              "activation_checkpointing.profile", NULL);
    parse_err("{\"activation_checkpointing\": true}", "activation_checkpointing", NULL);
}

/* a typo is refused, with the closest key */
static void test_typo(void)
{
    parse_err("{\"activation_checkpointing\": {\"cpu_checkpionting\": true}}",
              "unknown key activation_checkpointing.cpu_checkpionting",
              "did you mean activation_checkpointing.cpu_checkpointing?");
    parse_err("{\"activation_checkpointing\": {\"partition_activation\": true}}",
              "unknown key activation_checkpointing.partition_activation",
              "did you mean activation_checkpointing.partition_activations?");
    parse_err("{\"activation_checkpionting\": {}}", "unknown key activation_checkpionting",
              "did you mean activation_checkpointing?");
}

/* the dump says what was configured */
static void test_print(void)
{
    zs_config_t c;
    warns_t w;
    zs_err_t err = {0};
    parse_ok("{\"train_batch_size\": 4, \"activation_checkpointing\": {\"cpu_checkpointing\": "
             "true}}",
             &c, &w);
    TEST_OK(zs_config_resolve(&c, 1, &err), err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    TEST_CHECK(f != NULL);
    zs_config_print(&c, f);
    fclose(f);
    TEST_CHECKF(strstr(buf, "activation_checkpointing = every GPT block") &&
                    strstr(buf, "activation_checkpointing.cpu_checkpointing = true\n"),
                "%s", buf);
    free(buf);
}

int main(void)
{
    test_presence();
    test_cpu();
    test_no_effect();
    test_values();
    test_typo();
    test_print();
    printf("test_config_actckpt: OK\n");
    return 0;
}
