/*
 * test_estimate.c - `zs-ctl estimate` (tools/zs_estimate.c).
 *
 * The seeds/003 table for 7B on 8 GPUs, exactly in bytes (stage 0: 112,
 * 1: 14 + 14 + 84/8 = 38.5, 2: 14 + 14/8 + 84/8 = 26.25, 3: 14 GB per GPU,
 * 1 GB = 1e9 bytes); the offload variants per GPU and per host; partitions
 * that do not divide evenly; parameter-count parsing and its refusals; the
 * printed formula lines; and the zs-ctl binary (ZS_CTL) dispatching
 * `estimate` without --servers. The activation estimate of a GPT (no
 * checkpointing, checkpointing, cpu_checkpointing) against the allocator's
 * measurement of the real model on the CPU device after a forward and
 * backward: the device figure within 21 x 64 bytes above the estimate (the
 * model aligns each of its 21 activation tensors to 64 bytes) and never
 * below it, the pinned figure exact.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "zs_dev.h"
#include "zs_estimate.h"
#include "zs_gpt.h"
#include "zs_test.h"

#define GB 1000000000ull

static zs_estimate_t est(uint64_t psi, int gpus, int nodes, int stage, int oo, int op)
{
    zs_estimate_t e;
    zs_err_t err;
    TEST_OK(zs_estimate(psi, gpus, nodes, stage, oo, op, &e, &err), err);
    TEST_CHECK(e.gpu_total == e.gpu_params + e.gpu_grads + e.gpu_optimizer);
    TEST_CHECK(e.host_total == e.host_optimizer + e.host_params);
    return e;
}

static void test_seed_table(void)
{
    const uint64_t psi = 7000000000ull; /* 7B */
    zs_estimate_t e;

    e = est(psi, 8, 1, 0, 0, 0); /* 14 + 14 + 84 = 112 */
    TEST_CHECK(e.gpu_params == 14 * GB && e.gpu_grads == 14 * GB && e.gpu_optimizer == 84 * GB);
    TEST_CHECK(e.gpu_total == 112 * GB && e.host_total == 0);

    e = est(psi, 8, 1, 1, 0, 0); /* 14 + 14 + 84/8 = 38.5 */
    TEST_CHECK(e.gpu_params == 14 * GB && e.gpu_grads == 14 * GB);
    TEST_CHECK(e.gpu_optimizer == 10500000000ull);
    TEST_CHECK(e.gpu_total == 38500000000ull);

    e = est(psi, 8, 1, 2, 0, 0); /* 14 + 14/8 + 84/8 = 26.25 */
    TEST_CHECK(e.gpu_params == 14 * GB && e.gpu_grads == 1750000000ull);
    TEST_CHECK(e.gpu_optimizer == 10500000000ull);
    TEST_CHECK(e.gpu_total == 26250000000ull);

    e = est(psi, 8, 1, 3, 0, 0); /* 14/8 + 14/8 + 84/8 = 14 */
    TEST_CHECK(e.gpu_params == 1750000000ull && e.gpu_grads == 1750000000ull);
    TEST_CHECK(e.gpu_total == 14 * GB && e.host_total == 0);

    /* The stage formulas in general: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N. */
    const int ns[] = {1, 2, 4, 8, 16, 64, 1000};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        uint64_t n = (uint64_t)ns[i], p = 1000ull * 64 * 125; /* divisible by every n */
        TEST_CHECK(est(p, ns[i], 1, 0, 0, 0).gpu_total == 16 * p);
        TEST_CHECK(est(p, ns[i], 1, 1, 0, 0).gpu_total == 4 * p + 12 * p / n);
        TEST_CHECK(est(p, ns[i], 1, 2, 0, 0).gpu_total == 2 * p + 14 * p / n);
        TEST_CHECK(est(p, ns[i], 1, 3, 0, 0).gpu_total == 16 * p / n);
    }
    printf("seed table (7B, 8 GPUs): 112 / 38.5 / 26.25 / 14 GB: ok\n");
}

static void test_offload(void)
{
    const uint64_t psi = 7000000000ull;
    zs_estimate_t e;

    /* offload_optimizer: the 12Ψ = 84 GB leave the GPUs for the shard servers. */
    e = est(psi, 8, 1, 1, 1, 0);
    TEST_CHECK(e.gpu_total == 28 * GB && e.gpu_optimizer == 0);
    TEST_CHECK(e.host_optimizer == 84 * GB && e.host_params == 0 && e.host_total == 84 * GB);
    e = est(psi, 8, 1, 2, 1, 0);
    TEST_CHECK(e.gpu_total == 15750000000ull && e.host_total == 84 * GB);
    e = est(psi, 8, 2, 2, 1, 0); /* two hosts, each server a half of the range */
    TEST_CHECK(e.gpu_total == 15750000000ull && e.host_optimizer == 42 * GB);
    e = est(psi, 8, 1, 3, 1, 0);
    TEST_CHECK(e.gpu_total == 3500000000ull && e.host_total == 84 * GB);
    e = est(psi, 8, 1, 0, 1, 0); /* allowed at stage 0 too (zs_config does) */
    TEST_CHECK(e.gpu_total == 28 * GB && e.host_total == 84 * GB);

    /* offload_param (stage 3): each GPU's 2Ψ/N = 1.75 GB to its host. */
    e = est(psi, 8, 1, 3, 0, 1);
    TEST_CHECK(e.gpu_params == 0 && e.gpu_total == 12250000000ull);
    TEST_CHECK(e.host_params == 14 * GB && e.host_optimizer == 0 && e.host_total == 14 * GB);
    e = est(psi, 8, 2, 3, 1, 1); /* 4 GPUs per host: 7 GB params + 42 GB optimizer */
    TEST_CHECK(e.gpu_total == 1750000000ull && e.gpu_grads == 1750000000ull);
    TEST_CHECK(e.host_params == 7 * GB && e.host_optimizer == 42 * GB);
    TEST_CHECK(e.host_total == 49 * GB);
    e = est(psi, 8, 8, 3, 1, 1); /* one GPU per host */
    TEST_CHECK(e.host_params == 1750000000ull && e.host_optimizer == 10500000000ull);

    /* Uneven: the largest partition, ceil(Ψ/N) parameters; ceil(N/n) GPUs per host. */
    e = est(10, 3, 1, 3, 0, 0);
    TEST_CHECK(e.gpu_params == 8 && e.gpu_grads == 8 && e.gpu_optimizer == 48);
    e = est(10, 3, 2, 3, 1, 1);
    TEST_CHECK(e.host_optimizer == 60 && e.host_params == 2 * 8 && e.gpu_total == 8);
    e = est(1, 1, 1, 0, 0, 0);
    TEST_CHECK(e.gpu_total == 16);
    e = est(ZS_ESTIMATE_MAX_PARAMS, 1, 1, 0, 0, 0);
    TEST_CHECK(e.gpu_total == 16 * ZS_ESTIMATE_MAX_PARAMS);
    printf("offload variants: ok\n");
}

static void test_refusals(void)
{
    zs_estimate_t e;
    zs_err_t err;
    TEST_CHECK(zs_estimate(7, 8, 1, 4, 0, 0, &e, &err) == ZS_ERR_RANGE);
    TEST_CHECK(strstr(err.msg, "--stage 4"));
    TEST_CHECK(zs_estimate(7, 8, 1, -1, 0, 0, &e, &err) == ZS_ERR_RANGE);
    TEST_CHECK(zs_estimate(7, 0, 1, 1, 0, 0, &e, &err) == ZS_ERR_RANGE);
    TEST_CHECK(strstr(err.msg, "--gpus 0"));
    TEST_CHECK(zs_estimate(7, 8, 9, 1, 0, 0, &e, &err) == ZS_ERR_RANGE);
    TEST_CHECK(strstr(err.msg, "--nodes 9"));
    TEST_CHECK(zs_estimate(7, 8, 0, 1, 0, 0, &e, &err) == ZS_ERR_RANGE);
    TEST_CHECK(zs_estimate(0, 8, 1, 1, 0, 0, &e, &err) == ZS_ERR_RANGE);
    TEST_CHECK(zs_estimate(ZS_ESTIMATE_MAX_PARAMS + 1, 8, 1, 1, 0, 0, &e, &err) == ZS_ERR_RANGE);
    for (int s = 0; s < 3; s++) {
        TEST_CHECK(zs_estimate(7, 8, 1, s, 1, 1, &e, &err) == ZS_ERR_INVALID);
        TEST_CHECK(strstr(err.msg, "--offload-param needs stage 3"));
    }
    printf("refusals: ok\n");
}

static void test_parse(void)
{
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {{"7B", 7000000000ull},
              {"7b", 7000000000ull},
              {"7G", 7000000000ull},
              {"1.5e9", 1500000000ull},
              {"125M", 125000000ull},
              {"125m", 125000000ull},
              {"350K", 350000ull},
              {"1T", 1000000000000ull},
              {"1.3B", 1300000000ull},
              {"6.7B", 6700000000ull},
              {"7000000000", 7000000000ull},
              {"1", 1},
              {"0.5K", 500},
              {"1e15", ZS_ESTIMATE_MAX_PARAMS}};
    zs_err_t err;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 0;
        TEST_OK(zs_estimate_parse_count(ok[i].s, &v, &err), err);
        TEST_CHECKF(v == ok[i].v, "%s -> %llu, want %llu", ok[i].s, (unsigned long long)v,
                    (unsigned long long)ok[i].v);
    }
    static const struct {
        const char *s, *why;
    } bad[] = {{"", "empty"},
               {"abc", "not a number"},
               {"B", "not a number"},
               {"7X", "unknown suffix \"X\""},
               {"7BB", "unknown suffix \"BB\""},
               {"0x10", "unknown suffix"},
               {"1..5", "not a number"},
               {"0.5", "not a whole number"},
               {"1.2345", "not a whole number"},
               {"0", "must be 1.."},
               {"-7B", "must be 1.."},
               {"2e15", "must be 1.."},
               {"1e400", "not a number"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 42;
        int rc = zs_estimate_parse_count(bad[i].s, &v, &err);
        TEST_CHECKF(rc != ZS_OK && v == 42, "\"%s\" accepted", bad[i].s);
        TEST_CHECKF(strstr(err.msg, bad[i].why), "\"%s\": %s", bad[i].s, err.msg);
    }
    printf("parameter counts: ok\n");
}

static char *printed(const zs_estimate_t *e, int table, uint64_t psi, int gpus, int nodes)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    TEST_CHECK(f);
    zs_err_t err;
    if (table)
        TEST_OK(zs_estimate_print_table(psi, gpus, nodes, f, &err), err);
    else
        zs_estimate_print(e, f);
    fclose(f);
    return buf;
}

static void test_print(void)
{
    static const char *const lines[] = {
        "per GPU: 2Ψ + 2Ψ + 12Ψ = 14 + 14 + 84 = 112 GB",
        "per GPU: 2Ψ + 2Ψ + 12Ψ/N = 14 + 14 + 10.5 = 38.5 GB",
        "per GPU: 2Ψ + 2Ψ/N + 12Ψ/N = 14 + 1.75 + 10.5 = 26.25 GB",
        "per GPU: 2Ψ/N + 2Ψ/N + 12Ψ/N = 1.75 + 1.75 + 10.5 = 14 GB",
    };
    for (int s = 0; s < 4; s++) {
        zs_estimate_t e = est(7000000000ull, 8, 1, s, 0, 0);
        char *out = printed(&e, 0, 0, 0, 0);
        TEST_CHECKF(strstr(out, lines[s]), "stage %d printed:\n%s", s, out);
        TEST_CHECK(strstr(out, "Ψ = 7000000000 parameters, N = 8 GPUs, n = 1 host"));
        TEST_CHECKF(strstr(out, "1 host: 0 GB (no offload)"), "%s", out);
        if (s == 2)
            TEST_CHECKF(strstr(out, "26250000000 B        26.25 GB"), "%s", out);
        free(out);
    }
    zs_estimate_t e = est(7000000000ull, 8, 2, 3, 1, 1);
    char *out = printed(&e, 0, 0, 0, 0);
    TEST_CHECKF(strstr(out, "per GPU: 2Ψ/N = 1.75 GB"), "%s", out);
    TEST_CHECKF(strstr(out, "12Ψ/n + (N/n)·2Ψ/N = 49 GB"), "%s", out);
    free(out);

    out = printed(NULL, 1, 7000000000ull, 8, 1);
    fputs(out, stdout);
    static const char *const rows[] = {"2Ψ + 2Ψ + 12Ψ",     "112.00", "38.50", "26.25", "14.00",
                                       "optimizer + param", "84.00",  "98.00"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        TEST_CHECKF(strstr(out, rows[i]), "table lacks %s", rows[i]);
    free(out);
    printf("printing: ok\n");
}

/* Run a command; returns its exit status, stdout in *out (caller frees). */
static int sh(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    TEST_CHECK(p);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char b[4096];
    size_t n;
    while ((n = fread(b, 1, sizeof b, p)) > 0)
        fwrite(b, 1, n, m);
    fclose(m);
    int st = pclose(p);
    TEST_CHECK(st != -1 && WIFEXITED(st));
    *out = buf;
    return WEXITSTATUS(st);
}

static void test_zs_ctl(void)
{
    char *out;
    TEST_CHECK(sh("'" ZS_CTL "' estimate --params 7B --gpus 8 --stage 1", &out) == 0);
    TEST_CHECKF(strstr(out, "= 14 + 14 + 10.5 = 38.5 GB"), "%s", out);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' --servers 127.0.0.1:1 estimate --params=7e9 --gpus=8 --stage=2",
                  &out) == 0);
    TEST_CHECKF(strstr(out, "26.25 GB"), "%s", out);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' estimate --params 7B --gpus 8", &out) == 0);
    TEST_CHECKF(strstr(out, "38.50") && strstr(out, "26.25"), "%s", out);
    free(out);
    TEST_CHECK(
        sh("'" ZS_CTL "' estimate --params 7B --gpus 8 --stage 2 --offload-param 2>&1", &out) == 2);
    TEST_CHECKF(strstr(out, "--offload-param needs stage 3"), "%s", out);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' estimate --params 7Q --gpus 8 2>&1", &out) == 2);
    TEST_CHECKF(strstr(out, "unknown suffix"), "%s", out);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' estimate --gpus 8 2>&1", &out) == 2);
    TEST_CHECKF(strstr(out, "--params and --gpus are required"), "%s", out);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' estimate --params 7B --gpus 8 --offload-optimizer 2>&1", &out) ==
               2);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' estimate --help", &out) == 0);
    TEST_CHECK(strstr(out, "usage: zs-ctl estimate"));
    free(out);
    /* Other subcommands still need --servers. */
    TEST_CHECK(sh("'" ZS_CTL "' status 2>&1", &out) == 2);
    TEST_CHECK(strstr(out, "usage: zs-ctl --servers"));
    free(out);
    printf("zs-ctl estimate: ok\n");
}

/* The GPT c at micro-batch B in mode (ckpt, cpu) on a fresh CPU device:
 * the allocator's activation peaks (device, pinned) over bind, a forward
 * and a backward. */
static void measure_act(zs_gpt_config_t c, int B, int ckpt, int cpu, int act16, uint64_t *dev_peak,
                        uint64_t *pin_peak)
{
    zs_err_t err;
    zs_dev_t *dev;
    zs_stream_t *s;
    TEST_OK(zs_dev_cpu_create(1, &dev, &err), err);
    TEST_OK(zs_dev_stream_create(dev, 0, "compute", &s, &err), err);
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, B, 3, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 1, &err), err);
    TEST_OK(zs_gpt_set_checkpointing(g, ckpt, cpu, &err), err);
    TEST_OK(zs_gpt_set_activations(g, act16 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32, &err), err);
    const zs_model_t *m = zs_gpt_model(g);
    uint64_t P = zs_gpt_num_params(&c), off = 0;
    float *w = malloc(P * 4);
    for (int i = 0; i < m->nlayers; i++) {
        TEST_OK(m->init_params(m->self, i, w + off, &err), err);
        off += m->nparams[i];
    }
    TEST_OK(zs_gpt_bind(g, dev, s, &err), err);
    void *dw, *dg;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, P * 4, &dw, &err), err);
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_GRADS, P * 4, &dg, &err), err);
    TEST_OK(zs_dev_memcpy(s, dw, w, P * 4, &err), err);
    TEST_OK(zs_dev_memset(s, dg, 0, P * 4, &err), err);
    int32_t *tok = malloc((size_t)B * c.ctx * 4);
    for (int i = 0; i < B * c.ctx; i++)
        tok[i] = (int32_t)((i * 7 + 1) % c.vocab);
    TEST_OK(zs_gpt_set_tokens(g, tok, tok, B, c.ctx, &err), err);
    uint64_t offs[64];
    TEST_CHECK(m->nlayers < 64);
    offs[0] = 0;
    for (int i = 0; i < m->nlayers; i++)
        offs[i + 1] = offs[i] + m->nparams[i];
    for (int i = 0; i < m->nlayers; i++) {
        void *p[2] = {(float *)dw + offs[i], dw};
        TEST_OK(m->forward(m->self, i, p, &err), err);
    }
    double loss;
    TEST_OK(m->loss(m->self, &loss, &err), err);
    for (int i = m->nlayers - 1; i >= 0; i--) {
        void *p[2] = {(float *)dw + offs[i], dw};
        float *gr[2] = {(float *)dg + offs[i], dg};
        TEST_OK(m->backward(m->self, i, p, gr, 1.0f, &err), err);
    }
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    zs_dev_mem_t mem;
    zs_dev_mem_get(dev, &mem);
    *dev_peak = mem.peak[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS];
    *pin_peak = mem.peak[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS];
    zs_gpt_destroy(g);
    zs_dev_free(dev, dw);
    zs_dev_free(dev, dg);
    zs_dev_stream_destroy(s);
    zs_dev_destroy(dev);
    free(w), free(tok);
}

static void test_activations(void)
{
    static const struct {
        zs_gpt_config_t c;
        int B;
    } shapes[] = {{{3, 2, 16, 8, 32}, 2}, {{6, 4, 64, 32, 128}, 4}, {{4, 3, 24, 13, 50}, 3}};
    static const char *names[3] = {"no checkpointing", "checkpointing", "cpu_checkpointing"};
    for (int a16 = 0; a16 < 2; a16++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            /* alignment of the model's 21 activation tensors (and 16-bit homes) */
            const uint64_t tol = (a16 ? 32 : 21) * 64;
            zs_gpt_config_t c = shapes[k].c;
            uint64_t none = 0;
            for (int mode = 0; mode < 3; mode++) {
                zs_estimate_act_t a;
                zs_err_t err;
                TEST_OK(zs_estimate_act(c.layers, c.heads, c.width, c.ctx, c.vocab, shapes[k].B,
                                        mode > 0, mode == 2, a16, &a, &err),
                        err);
                TEST_CHECK(a.gpu_total == a.gpu_checkpoints + a.gpu_blocks + a.gpu_other);
                uint64_t d, p;
                measure_act(c, shapes[k].B, mode > 0, mode == 2, a16, &d, &p);
                TEST_CHECKF(
                    d >= a.gpu_total && d - a.gpu_total <= tol && p == a.host_pinned,
                    "L=%d C=%d T=%d B=%d %s%s: measured %llu device + %llu pinned, estimated "
                    "%llu + %llu (tolerance +%llu)",
                    c.layers, c.width, c.ctx, shapes[k].B, names[mode], a16 ? " (16-bit)" : "",
                    (unsigned long long)d, (unsigned long long)p, (unsigned long long)a.gpu_total,
                    (unsigned long long)a.host_pinned, (unsigned long long)tol);
                if (mode == 0)
                    none = a.gpu_total;
                else
                    TEST_CHECK(a.gpu_total < none);
                printf("activations L=%d NH=%d C=%d T=%d V=%d B=%d, %-17s %s: estimate %8llu B "
                       "(+%llu pinned), measured %8llu B (+%llu pinned)\n",
                       c.layers, c.heads, c.width, c.ctx, c.vocab, shapes[k].B, names[mode],
                       a16 ? "bf16" : "fp32", (unsigned long long)a.gpu_total,
                       (unsigned long long)a.host_pinned, (unsigned long long)d,
                       (unsigned long long)p);
            }
        }
    /* refusals */
    zs_estimate_act_t a;
    zs_err_t err;
    TEST_CHECK(zs_estimate_act(2, 3, 16, 8, 32, 1, 0, 0, 0, &a, &err) == ZS_ERR_RANGE);
    TEST_CHECK(zs_estimate_act(2, 2, 16, 8, 32, 1, 0, 1, 0, &a, &err) == ZS_ERR_INVALID);
    /* zs-ctl prints them, marking the mode asked for; the shape stands for --params */
    char *out;
    TEST_CHECK(sh("'" ZS_CTL "' estimate --gpus 1 --stage 2 --layers 6 --heads 4 --width 64 "
                  "--ctx 32 --vocab 128 --micro-batch 4 --activation-checkpointing",
                  &out) == 0);
    TEST_CHECKF(strstr(out, "* checkpointing") && strstr(out, "889856 B") &&
                    strstr(out, "Ψ = 310272 parameters"),
                "%s", out);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' estimate --gpus 1 --stage 2 --layers 6 --heads 4 --width 64 "
                  "--ctx 32 --vocab 128 --micro-batch 4 --activation-checkpointing "
                  "--activations-16",
                  &out) == 0);
    TEST_CHECKF(strstr(out, "* checkpointing") && strstr(out, "807936 B") &&
                    strstr(out, "16-bit saved tensors"),
                "%s", out);
    free(out);
    TEST_CHECK(sh("'" ZS_CTL "' estimate --params 1M --gpus 1 --layers 6 2>&1", &out) == 2);
    TEST_CHECKF(strstr(out, "needs all of --layers"), "%s", out);
    free(out);
    printf("activations: ok\n");
}

int main(void)
{
    test_seed_table();
    test_offload();
    test_refusals();
    test_parse();
    test_print();
    test_zs_ctl();
    test_activations();
    printf("test_estimate: all passed\n");
    return 0;
}
