/*
 * test_gpt_ckpt.c - activation checkpointing of the GPT
 * (zs_gpt_set_checkpointing, worker/model/zs_gpt_ckpt.c) on the CPU
 * device, fp32:
 *
 *   1. bitwise: with L = 3 blocks, the loss, the logits and every parameter
 *      gradient (two micro-batches accumulated) with checkpointing, and with
 *      cpu_checkpointing, are bitwise those without, with fp32 GEMMs and
 *      with bf16 GEMMs (--gemm bf16); the mode is refused after bind;
 *   2. memory: the allocator's activation figures after bind and their
 *      peak after forward + backward equal zs_gpt_act_bytes, are within
 *      checkpoints + one block's workspace + the embedding/head tensors
 *      (computed here from the shapes), and are below the figure without
 *      checkpointing; cpu_checkpointing moves the checkpoints to pinned
 *      memory; a model with ZS_GPT_DEBUG_LEAK_CKPT (a checkpoint copy
 *      never freed) fails that check (ZS_TEST_CKPT_BREAK=1 runs the leaking
 *      model through the normal check instead, which must then fail the
 *      test: "a check must be able to fail");
 *   3. the ZeRO engine at W = 1 (MPI initialised here), stages 0-3 (fp32)
 *      and 2-3 (bf16 parameters), no servers: the final parameters of a
 *      few AdamW steps with checkpointing (and cpu_checkpointing) are
 *      bitwise those without, and the run's activation peak is the
 *      model's figure (zs_gpt_act_bytes).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_dev.h"
#include "zs_engine.h"
#include "zs_gpt.h"
#include "zs_gptfx.h"
#include "zs_gptrun.h"
#include "zs_test.h"

static zs_dev_t *dev;
static zs_stream_t *stream;
/* GEMM precision of the models fx_init makes (zs_gpt_set_compute) */
static int gemm_dt = ZS_DTYPE_F32;

static void sync_stream(void)
{
    zs_err_t err;
    TEST_OK(zs_dev_stream_sync(stream, &err), err);
}

/* ---- 1. bitwise ---- */

static void test_bitwise(void)
{
    zs_err_t err;
    zs_gpt_config_t c = {3, 2, 16, 8, 32};
    const int B = 2, T = 7; /* T < ctx: slices of the max size */
    float *grad[3], *logits[3];
    double loss[3][2];
    size_t nlog = (size_t)B * T * c.vocab;
    uint64_t P = zs_gpt_num_params(&c);
    for (int k = 0; k < 3; k++) {
        fx_t f;
        fx_init(&f, dev, stream, c, B, ZS_DTYPE_F32, gemm_dt, &MODES[k], 0);
        loss[k][0] = fx_step(&f, B, T, 0);
        logits[k] = malloc(nlog * 4);
        f.logits_out = logits[k]; /* the second micro-batch's */
        loss[k][1] = fx_step(&f, B, T, 1); /* accumulates into the same gradients */
        grad[k] = malloc(P * 4);
        TEST_OK(zs_dev_memcpy(stream, grad[k], f.dgrad, P * 4, &err), err);
        sync_stream();
        fx_free(&f);
    }
    for (int k = 1; k < 3; k++) {
        TEST_CHECKF(memcmp(loss[k], loss[0], sizeof loss[0]) == 0,
                    "%s: loss %.9g %.9g vs %.9g %.9g", MODES[k].name, loss[k][0], loss[k][1],
                    loss[0][0], loss[0][1]);
        TEST_CHECKF(memcmp(logits[k], logits[0], nlog * 4) == 0, "%s: logits differ",
                    MODES[k].name);
        int nt = zs_gpt_num_tensors(&c);
        for (int ti = 0; ti < nt; ti++) {
            zs_gpt_tensor_t t;
            TEST_OK(zs_gpt_tensor(&c, ti, &t), err);
            TEST_CHECKF(memcmp(grad[k] + t.offset, grad[0] + t.offset, t.numel * 4) == 0,
                        "%s: gradient of %s differs from the run without checkpointing",
                        MODES[k].name, t.name);
        }
        printf("  %-17s L=%d, %s GEMMs: loss %.7f, %.7f, logits and all %d gradient tensors "
               "bitwise equal to no checkpointing\n",
               MODES[k].name, c.layers, zs_dtype_name(gemm_dt), loss[k][0], loss[k][1], nt);
    }
    for (int k = 0; k < 3; k++)
        free(grad[k]), free(logits[k]);
}

/* the mode is set before bind only; cpu_checkpointing needs checkpointing */
static void test_refusals(void)
{
    zs_err_t err;
    zs_gpt_config_t c = {2, 2, 16, 8, 32};
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, 1, 1, &g, &err), err);
    int cpu = -1;
    TEST_CHECK(zs_gpt_checkpointing(g, &cpu) == 0 && cpu == 0);
    TEST_CHECK(zs_gpt_set_checkpointing(g, 0, 1, &err) == ZS_ERR_INVALID);
    TEST_OK(zs_gpt_set_checkpointing(g, 1, 1, &err), err);
    TEST_CHECK(zs_gpt_checkpointing(g, &cpu) == 1 && cpu == 1);
    TEST_OK(zs_gpt_bind(g, dev, stream, &err), err);
    int rc = zs_gpt_set_checkpointing(g, 0, 0, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE && strstr(err.msg, "before binding"), "rc %d '%s'", rc, err.msg);
    zs_gpt_destroy(g);
    printf("  refused: cpu_checkpointing without checkpointing; a change after bind (%s)\n",
           err.msg);
}

/* ---- 2. memory ---- */

/* Activation bytes (device) of checkpoints + one block's workspace + the
 * embedding/head/loss tensors, from the shapes: the formula of the issue,
 * with 64 bytes of alignment per tensor (21 tensors). cpu: checkpoints
 * pinned, two residual slices on the device instead. */
static uint64_t formula_device(const zs_gpt_config_t *c, int B, int cpu)
{
    uint64_t L = (uint64_t)c->layers, C = (uint64_t)c->width, V = (uint64_t)c->vocab;
    uint64_t N = (uint64_t)B * (uint64_t)c->ctx, NH = (uint64_t)c->heads, T = (uint64_t)c->ctx;
    uint64_t ckpts = cpu ? 2 * N * C : L * N * C;
    /* ln1, atty, res2, ln2 [N, C]; qkv [N, 3C]; fch, fchg [N, 4C]; 4 x [N]
     * LayerNorm statistics; att [B, NH, T, T] */
    uint64_t block = N * (4 * C + 3 * C + 8 * C + 4) + (uint64_t)B * NH * T * T;
    /* head input [N, C]; lnf [N, C] + stats; logits [N, V]; lse, losses,
     * inputs, targets [N] */
    uint64_t head = N * C + N * C + 2 * N + N * V + 4 * N;
    return (ckpts + block + head) * 4 + 21 * 64;
}

/* Measured activation peak (device) of `f` over `steps` forward+backward
 * passes against the formula; returns 0 when within it, else prints why. */
static int act_within(fx_t *f, int B, int steps, const mode_t_ *md, uint64_t *peak_dev,
                      uint64_t *peak_pin)
{
    zs_dev_mem_reset_peak(dev);
    for (int s = 0; s < steps; s++)
        fx_step(f, B, f->c.ctx, s);
    zs_dev_mem_t m;
    zs_dev_mem_get(dev, &m);
    *peak_dev = m.peak[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS];
    *peak_pin = m.peak[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS];
    zs_gpt_act_bytes_t ab;
    zs_gpt_act_bytes(&f->c, B, md->ckpt, md->cpu, &ab);
    uint64_t lim = md->ckpt ? formula_device(&f->c, B, md->cpu) : ab.device;
    if (*peak_dev > lim || *peak_dev != ab.device || *peak_pin != ab.pinned) {
        printf("  %s: activation peak device %llu pinned %llu; zs_gpt_act_bytes device %llu pinned "
               "%llu; formula (checkpoints + one block + embedding/head) %llu\n",
               md->name, (unsigned long long)*peak_dev, (unsigned long long)*peak_pin,
               (unsigned long long)ab.device, (unsigned long long)ab.pinned,
               (unsigned long long)lim);
        return 1;
    }
    return 0;
}

static void test_memory(void)
{
    zs_gpt_config_t c = {6, 4, 64, 32, 128};
    const int B = 4;
    uint64_t peak[3][2];
    const char *brk = getenv("ZS_TEST_CKPT_BREAK");
    for (int k = 0; k < 3; k++) {
        fx_t f;
        zs_dev_mem_t m0, m1;
        zs_dev_mem_get(dev, &m0);
        /* the break: the leaking model through the normal check */
        fx_init(&f, dev, stream, c, B, ZS_DTYPE_F32, gemm_dt, &MODES[k],
                brk && k == 1 ? ZS_GPT_DEBUG_LEAK_CKPT : 0);
        zs_dev_mem_get(dev, &m1);
        zs_gpt_act_bytes_t ab;
        zs_gpt_act_bytes(&c, B, MODES[k].ckpt, MODES[k].cpu, &ab);
        uint64_t bd = m1.cur[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS] -
                      m0.cur[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS];
        uint64_t bp = m1.cur[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS] -
                      m0.cur[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS];
        TEST_CHECKF(bd == ab.device && bp == ab.pinned,
                    "%s: bind allocated %llu device + %llu pinned activation bytes, "
                    "zs_gpt_act_bytes says %llu + %llu",
                    MODES[k].name, (unsigned long long)bd, (unsigned long long)bp,
                    (unsigned long long)ab.device, (unsigned long long)ab.pinned);
        int bad = act_within(&f, B, 3, &MODES[k], &peak[k][0], &peak[k][1]);
        TEST_CHECKF(!bad, "%s: activation memory above its formula (a checkpoint not freed?)",
                    MODES[k].name);
        printf("  %-17s L=%d C=%d T=%d B=%d V=%d: activation peak device %.3f MB, pinned %.3f MB "
               "(checkpoints %.3f MB, blocks %.3f MB, other %.3f MB)\n",
               MODES[k].name, c.layers, c.width, c.ctx, B, c.vocab, peak[k][0] / 1e6,
               peak[k][1] / 1e6, ab.checkpoints / 1e6, ab.blocks / 1e6, ab.other / 1e6);
        fx_free(&f);
    }
    TEST_CHECKF(peak[1][0] < peak[0][0] && peak[2][0] < peak[1][0],
                "device activation peaks off %llu, checkpointing %llu, cpu %llu: not decreasing",
                (unsigned long long)peak[0][0], (unsigned long long)peak[1][0],
                (unsigned long long)peak[2][0]);
    TEST_CHECK(peak[0][1] == 0 && peak[1][1] == 0 && peak[2][1] > 0);
    printf("  checkpointing: device activations %.2fx of no checkpointing (cpu_checkpointing "
           "%.2fx)\n",
           (double)peak[1][0] / (double)peak[0][0], (double)peak[2][0] / (double)peak[0][0]);

    /* a checkpoint never freed must fail the check */
    for (int k = 1; k < 3; k++) {
        fx_t f;
        uint64_t pd, pp;
        fx_init(&f, dev, stream, c, B, ZS_DTYPE_F32, gemm_dt, &MODES[k], ZS_GPT_DEBUG_LEAK_CKPT);
        int bad = act_within(&f, B, 3, &MODES[k], &pd, &pp);
        TEST_CHECKF(bad, "%s: a leaked checkpoint passed the memory check (peak %llu)",
                    MODES[k].name, (unsigned long long)pd);
        printf("  %s with a checkpoint leaked on purpose: the check fails, as it must\n",
               MODES[k].name);
        fx_free(&f);
    }
}

/* ---- 3. the engine at W = 1 ---- */

/* Final parameters of `steps` AdamW steps at `stage` in mode md. *act_peak:
 * the device activation peak of the run. */
static void engine_run(int stage, int bf16, const mode_t_ *md, int steps, float *out,
                       uint64_t *act_peak)
{
    zs_err_t err;
    zs_gpt_config_t c = {3, 2, 32, 16, 64};
    const int B = 2;
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, B, 11, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    TEST_OK(zs_gpt_set_checkpointing(g, md->ckpt, md->cpu, &err), err);
    gptrun_fixed_tokens(g, &c, B, 5);
    gptrun_t o = {dev, stage, bf16, steps, 3000, "gpt-ckpt-test"};
    zs_dev_mem_t m;
    gptrun_engine(zs_gpt_model(g), &o, NULL, out, &m);
    *act_peak = m.peak[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS];
    zs_gpt_destroy(g);
    zs_gpt_act_bytes_t ab;
    zs_gpt_act_bytes(&c, B, md->ckpt, md->cpu, &ab);
    TEST_CHECKF(*act_peak == ab.device,
                "stage %d %s: engine run's activation peak %llu, model's "
                "figure %llu",
                stage, md->name, (unsigned long long)*act_peak, (unsigned long long)ab.device);
}

static void test_engine(void)
{
    zs_gpt_config_t c = {3, 2, 32, 16, 64};
    uint64_t P = zs_gpt_num_params(&c);
    float *ref = malloc(P * 4), *got = malloc(P * 4);
    const int steps = 4;
    for (int run = 0; run < 6; run++) {
        /* fp32 at stages 0-3, then bf16 at stages 2 and 3 */
        int stage = run < 4 ? run : run - 2, bf16 = run >= 4;
        uint64_t peak0, peak;
        engine_run(stage, bf16, &MODES[0], steps, ref, &peak0);
        for (int k = 1; k < 3; k++) {
            engine_run(stage, bf16, &MODES[k], steps, got, &peak);
            uint64_t i = 0;
            while (i < P && memcmp(&got[i], &ref[i], 4) == 0)
                i++;
            TEST_CHECKF(i == P,
                        "stage %d %s %s: parameter %llu is %.9g, %.9g without "
                        "checkpointing",
                        stage, bf16 ? "bf16" : "fp32", MODES[k].name, (unsigned long long)i, got[i],
                        ref[i]);
            TEST_CHECK(peak < peak0);
            printf("  engine W=1 stage %d %s, %d steps, %s: final parameters bitwise equal; "
                   "device activation peak %llu vs %llu bytes\n",
                   stage, bf16 ? "bf16" : "fp32", steps, MODES[k].name, (unsigned long long)peak,
                   (unsigned long long)peak0);
        }
    }
    free(ref), free(got);
}

int main(int argc, char **argv)
{
    gptrun_init(&argc, &argv, &dev, &stream);
    printf("test_gpt_ckpt: 1. bitwise equal to no checkpointing\n");
    test_refusals();
    test_bitwise();
    gemm_dt = ZS_DTYPE_BF16; /* what a GPU computes: the recompute rounds the same operands */
    test_bitwise();
    gemm_dt = ZS_DTYPE_F32;
    printf("test_gpt_ckpt: 2. activation memory\n");
    test_memory();
    printf("test_gpt_ckpt: 3. the engine at W=1\n");
    test_engine();
    gptrun_fini(dev, stream);
    printf("test_gpt_ckpt: OK\n");
    return 0;
}
