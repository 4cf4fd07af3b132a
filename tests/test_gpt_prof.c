/*
 * test_gpt_prof.c - the GPT op profiler (ZS_GPT_PROFILE=1,
 * worker/model/zs_gpt_ops_prof.c) on the CPU device: a tiny model (L=2,
 * NH=2, C=16, T=8, V=32, B=2) runs one forward, loss and backward without
 * and with profiling.
 * Checks: loss and every parameter gradient are bitwise equal (the wrapper
 * changes no result); the report names each op with the number of calls
 * the model makes (attention_fwd and _bwd once per block, layernorm_fwd
 * twice per block plus the head's, xent once each way) and a positive
 * total; without the variable the report is empty; the wrapped table still
 * follows zs_gpt_set_threads (a new pool after bind).
 * Does not: check the times themselves (bench_gpt reports them).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_dev.h"
#include "zs_gpt.h"
#include "zs_test.h"

#define L 2
#define B 2
#define T 8

typedef struct {
    double loss;
    float *grad;
    uint64_t P;
    char *report; /* malloc'd text of zs_gpt_profile_report */
} run_t;

static void run(zs_dev_t *dev, int profile, run_t *r)
{
    zs_err_t err;
    zs_err_clear(&err);
    if (profile)
        setenv("ZS_GPT_PROFILE", "1", 1);
    else
        unsetenv("ZS_GPT_PROFILE");
    zs_gpt_config_t c = {L, 2, 16, T, 32};
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, B, 7, &g, &err), err);
    const zs_model_t *m = zs_gpt_model(g);
    uint64_t P = zs_gpt_num_params(&c), off[16] = {0};
    TEST_CHECK(m->nlayers < 15);
    float *w = malloc(P * 4);
    r->grad = malloc(P * 4);
    TEST_CHECK(w && r->grad);
    for (int i = 0; i < m->nlayers; i++) {
        TEST_OK(m->init_params(m->self, i, w + off[i], &err), err);
        off[i + 1] = off[i] + m->nparams[i];
    }
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(dev, 0, "compute", &s, &err), err);
    TEST_OK(m->bind(m->self, dev, s, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err); /* a new table after bind */
    void *dw, *dg;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, P * 4, &dw, &err), err);
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_GRADS, P * 4, &dg, &err), err);
    TEST_OK(zs_dev_memcpy(s, dw, w, P * 4, &err), err);
    TEST_OK(zs_dev_memset(s, dg, 0, P * 4, &err), err);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % 32;
        tg[i] = (i * 13 + 5) % 32;
    }
    TEST_OK(zs_gpt_set_tokens(g, in, tg, B, T, &err), err);
    for (int i = 0; i < m->nlayers; i++) {
        void *p[2] = {(float *)dw + off[i], dw};
        TEST_OK(m->forward(m->self, i, p, &err), err);
    }
    TEST_OK(m->loss(m->self, &r->loss, &err), err);
    for (int i = m->nlayers - 1; i >= 0; i--) {
        void *p[2] = {(float *)dw + off[i], dw};
        float *gp[2] = {(float *)dg + off[i], dg};
        TEST_OK(m->backward(m->self, i, p, gp, 1.0f, &err), err);
    }
    TEST_OK(zs_dev_memcpy(s, r->grad, dg, P * 4, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    r->P = P;
    size_t len = 0;
    FILE *f = open_memstream(&r->report, &len);
    TEST_CHECK(f);
    zs_gpt_profile_report(g, f);
    fclose(f);
    zs_gpt_destroy(g);
    zs_dev_free(dev, dw);
    zs_dev_free(dev, dg);
    zs_dev_stream_destroy(s);
    free(w);
    unsetenv("ZS_GPT_PROFILE");
}

/* The "| op... | calls |" row of `key` (a prefix) in the report: its calls. */
static long calls_of(const char *rep, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "| %s", key);
    const char *p = strstr(rep, pat);
    if (!p)
        return -1;
    p = strchr(p + 1, '|');
    return p ? strtol(p + 1, NULL, 10) : -1;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    zs_err_t err;
    zs_err_clear(&err);
    zs_dev_t *dev;
    TEST_OK(zs_dev_cpu_create(2, &dev, &err), err);
    run_t plain, prof;
    run(dev, 0, &plain);
    run(dev, 1, &prof);
    TEST_CHECKF(plain.report[0] == 0, "a report without ZS_GPT_PROFILE: '%s'", plain.report);
    TEST_CHECKF(memcmp(&plain.loss, &prof.loss, sizeof plain.loss) == 0,
                "loss %.9g profiled, %.9g not", prof.loss, plain.loss);
    TEST_CHECKF(memcmp(plain.grad, prof.grad, plain.P * 4) == 0,
                "gradients differ with the profiler");
    printf("profiled == plain, bitwise: loss %.6f, %llu gradients\n", prof.loss,
           (unsigned long long)prof.P);
    printf("%s", prof.report);
    static const struct {
        const char *key;
        long calls;
    } want[] = {
        {"attention_fwd", L},
        {"attention_bwd", L},
        {"layernorm_fwd", L + 1}, /* ln1 per block and lnf; ln2 is fused: */
        {"residual_layernorm_fwd", L},
        {"layernorm_bwd", 2 * L + 1},
        {"xent_fwd", 1},
        {"xent_bwd", 1},
        {"embed_fwd", 1},
        {"embed_bwd", 1},
        {"gelu_fwd", L},
        {"gelu_bwd", L},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        long n = calls_of(prof.report, want[i].key);
        TEST_CHECKF(n == want[i].calls, "%s: %ld calls in the report, want %ld", want[i].key, n,
                    want[i].calls);
    }
    TEST_CHECKF(calls_of(prof.report, "matmul_fwd N=16 IC=16 OC=48") == L,
                "the qkv matmul row (N=16 IC=16 OC=48) is missing or miscounted");
    TEST_CHECK(strstr(prof.report, "total ") != NULL);
    free(plain.grad), free(prof.grad), free(plain.report), free(prof.report);
    zs_dev_destroy(dev);
    printf("PASS test_gpt_prof\n");
    return 0;
}
