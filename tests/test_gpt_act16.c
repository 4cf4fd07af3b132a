/*
 * test_gpt_act16.c - 16-bit activations of the GPT (zs_gpt_set_activations,
 * worker/model/zs_gpt_act16.c) on the CPU device:
 *
 *   1. refusals: a dtype other than fp32/bf16/fp16, a change after bind;
 *   2. memory: the activation bytes bind allocates (allocator,
 *      ZS_MEM_ACTIVATIONS, device and pinned) equal zs_gpt_act_bytes_dt and
 *      stay the peak over forward + backward, per mode (no checkpointing,
 *      checkpointing, cpu_checkpointing) and dtype; bf16 takes at most
 *      ACT16_MAX_RATIO of fp32's device bytes without checkpointing, fewer
 *      with checkpointing (no more with cpu_checkpointing, where pinned
 *      halves), and its checkpoints are half of fp32's;
 *   3. tolerance: one forward + backward (two micro-batches accumulated)
 *      with bf16 and with fp16 activations against fp32 activations, fp32
 *      and bf16 GEMMs: the loss and every parameter gradient within the
 *      bounds below (relative L2 error per tensor, relative loss error);
 *   4. bitwise: with 16-bit activations, checkpointing and
 *      cpu_checkpointing give bitwise the loss, logits and gradients of no
 *      checkpointing (the recompute from the 16-bit checkpoint rounds as
 *      the forward did). ZS_TEST_ACT16_BREAK=1 runs part 4 with
 *      ZS_GPT_DEBUG_ACT16_UNROUNDED (the forward keeps unrounded values
 *      where it stores rounded ones), which must fail it;
 *   5. against PyTorch (tests/ref/gpt_torch.py with its activation dtype:
 *      the same tensors rounded at the same points, straight-through
 *      gradients), fp32 GEMMs: the model is TORCH_MIN_RATIO times closer
 *      (RMS, logits and gradients) to torch rounding as it does than to
 *      torch with fp32 activations, and its loss within TORCH_LOSS_TOL of
 *      torch's. python3 with torch is a required test dependency, as for
 *      test_gpt.
 *
 * Tolerances (part 3; measured figures in docs/engine.md "Precision"):
 * rounding a saved tensor to bf16 is a relative error of at most 2^-9
 * (fp16: 2^-12) per element. Measured at L=4 C=64 T=32 B=4 V=128, fp32
 * GEMMs: loss 5.4e-5 relative (bf16), 4.1e-7 (fp16); worst gradient tensor
 * relative L2 6.7e-3 (bf16), 8.3e-4 (fp16). With bf16 GEMMs the operands
 * are rounded to bf16 anyway and both 16-bit formats land at the bf16
 * level (1.9e-4 / 4.3e-5 loss, 1.1e-2 / 9.3e-3 gradients; fp16 values are
 * rounded a second time, to bf16, in the GEMM), the size of what bf16 GEMMs
 * alone change against fp32 GEMMs (printed). The bounds LOSS_TOL on
 * |dloss|/loss and GRAD_TOL on the worst tensor's ||g16 - g32|| / ||g32||
 * are 3-25x those figures (more where the figure is tiny).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_dev.h"
#include "zs_gpt.h"
#include "zs_gptfx.h"
#include "zs_test.h"

/* [GEMM fp32, bf16][activations bf16, fp16] */
static const double LOSS_TOL[2][2] = {{5e-4, 1e-5}, {1e-3, 1e-3}};
static const double GRAD_TOL[2][2] = {{3e-2, 4e-3}, {5e-2, 5e-2}};
/* 16-bit device activations / fp32 ones without checkpointing (part 2):
 * half of every saved tensor plus one fp32 block workspace and the fp32
 * head (0.675 at part 2's shape, L = 6) */
#define ACT16_MAX_RATIO 0.7
/* part 5: how much closer (RMS) the model is to torch rounding the same
 * tensors than to torch with fp32 activations, [bf16, fp16]. Two fp32
 * implementations differ by an ulp here and there, and a value near a
 * 16-bit tie then rounds to the other neighbour (as with 16-bit GEMMs in
 * test_gpt): that floor shrinks like the square root of the format's
 * spacing, the difference from fp32 activations like the spacing itself,
 * so fp16 separates less. Measured (L=2 C=64 T=48 B=4 V=97): bf16 10.9x
 * logits / 14.4x gradients, fp16 2.0x / 2.2x. */
static const double TORCH_MIN_RATIO[2] = {4.0, 1.3};
/* |loss - torch's loss with the same rounding|; measured 3.2e-6 (bf16),
 * 1.0e-5 (fp16) */
#define TORCH_LOSS_TOL 1e-4

static zs_dev_t *dev;
static zs_stream_t *stream;

static void sync_stream(void)
{
    zs_err_t err;
    TEST_OK(zs_dev_stream_sync(stream, &err), err);
}

/* Two micro-batches (B x T) accumulated: losses into loss[2], the
 * gradients (malloc'd, P floats) and logits of the second into *grad and
 * *logits (either may be NULL). */
static void run(zs_gpt_config_t c, int B, int T, int act_dt, int gemm_dt, const mode_t_ *md,
                unsigned debug, double loss[2], float **grad, float **logits)
{
    zs_err_t err;
    fx_t f;
    fx_init(&f, dev, stream, c, B, act_dt, gemm_dt, md, debug);
    loss[0] = fx_step(&f, B, T, 0);
    if (logits) /* the second micro-batch's, before its backward overwrites them */
        f.logits_out = *logits = malloc((size_t)B * T * c.vocab * 4);
    loss[1] = fx_step(&f, B, T, 1);
    if (grad) {
        *grad = malloc(f.P * 4);
        TEST_OK(zs_dev_memcpy(stream, *grad, f.dgrad, f.P * 4, &err), err);
    }
    sync_stream();
    fx_free(&f);
}

/* ---- 1. refusals ---- */

static void test_refusals(void)
{
    zs_err_t err;
    zs_gpt_config_t c = {2, 2, 16, 8, 32};
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, 1, 1, &g, &err), err);
    TEST_CHECK(zs_gpt_activations(g) == ZS_DTYPE_F32);
    TEST_CHECK(zs_gpt_set_activations(g, ZS_DTYPE_NONE, &err) == ZS_ERR_INVALID);
    TEST_OK(zs_gpt_set_activations(g, ZS_DTYPE_F16, &err), err);
    TEST_CHECK(zs_gpt_activations(g) == ZS_DTYPE_F16);
    TEST_OK(zs_gpt_bind(g, dev, stream, &err), err);
    int rc = zs_gpt_set_activations(g, ZS_DTYPE_F32, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE && strstr(err.msg, "before binding"), "rc %d '%s'", rc, err.msg);
    zs_gpt_destroy(g);
    printf("  refused: dtype none; a change after bind (%s)\n", err.msg);
}

/* ---- 2. memory ---- */

static void test_memory(void)
{
    zs_gpt_config_t c = {6, 4, 64, 32, 128};
    const int B = 4;
    const int dts[2] = {ZS_DTYPE_F32, ZS_DTYPE_BF16};
    uint64_t dbytes[2][3], ckbytes[2][3], pbytes[2][3];
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            fx_t f;
            zs_dev_mem_t m0, m1, m2;
            zs_dev_mem_get(dev, &m0);
            fx_init(&f, dev, stream, c, B, dts[d], ZS_DTYPE_F32, &MODES[k], 0);
            zs_dev_mem_get(dev, &m1);
            zs_gpt_act_bytes_t ab;
            zs_gpt_act_bytes_dt(&c, B, MODES[k].ckpt, MODES[k].cpu, dts[d], &ab);
            uint64_t bd = m1.cur[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS] -
                          m0.cur[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS];
            uint64_t bp = m1.cur[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS] -
                          m0.cur[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS];
            TEST_CHECKF(bd == ab.device && bp == ab.pinned,
                        "%s %s: bind allocated %llu device + %llu pinned activation bytes, "
                        "zs_gpt_act_bytes_dt says %llu + %llu",
                        zs_dtype_name(dts[d]), MODES[k].name, (unsigned long long)bd,
                        (unsigned long long)bp, (unsigned long long)ab.device,
                        (unsigned long long)ab.pinned);
            zs_dev_mem_reset_peak(dev);
            for (int s = 0; s < 2; s++)
                fx_step(&f, B, c.ctx, s);
            zs_dev_mem_get(dev, &m2);
            TEST_CHECKF(m2.peak[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS] == ab.device &&
                            m2.peak[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS] == ab.pinned,
                        "%s %s: activation peak %llu + %llu pinned over two steps, bind's %llu + "
                        "%llu",
                        zs_dtype_name(dts[d]), MODES[k].name,
                        (unsigned long long)m2.peak[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS],
                        (unsigned long long)m2.peak[ZS_SPACE_PINNED][ZS_MEM_ACTIVATIONS],
                        (unsigned long long)ab.device, (unsigned long long)ab.pinned);
            dbytes[d][k] = ab.device;
            ckbytes[d][k] = ab.checkpoints;
            pbytes[d][k] = ab.pinned;
            printf("  %s %-17s L=%d C=%d T=%d B=%d V=%d: activations device %.3f MB pinned "
                   "%.3f MB (checkpoints %.3f MB, blocks %.3f MB, other %.3f MB)\n",
                   zs_dtype_name(dts[d]), MODES[k].name, c.layers, c.width, c.ctx, B, c.vocab,
                   ab.device / 1e6, ab.pinned / 1e6, ab.checkpoints / 1e6, ab.blocks / 1e6,
                   ab.other / 1e6);
            fx_free(&f);
        }
    for (int k = 0; k < 3; k++) {
        double r = (double)dbytes[1][k] / (double)dbytes[0][k];
        printf("  %-17s bf16 / fp32 device activation bytes: %.3f\n", MODES[k].name, r);
        /* cpu_checkpointing: the device's two residual slices are one fp32
         * view + two 16-bit slots, as many bytes as two fp32 slots */
        TEST_CHECKF(k == 2 ? dbytes[1][k] <= dbytes[0][k] : dbytes[1][k] < dbytes[0][k],
                    "%s: bf16 device activations %llu not below fp32's %llu", MODES[k].name,
                    (unsigned long long)dbytes[1][k], (unsigned long long)dbytes[0][k]);
        TEST_CHECK(2 * ckbytes[1][k] == ckbytes[0][k]);
        TEST_CHECK(k < 2 || 2 * pbytes[1][k] == pbytes[0][k]);
    }
    /* for scale (computed, not allocated): GPT-2 124M's shape */
    zs_gpt_config_t c2 = {12, 12, 768, 1024, 50257};
    for (int k = 0; k < 3; k++) {
        zs_gpt_act_bytes_t a32, a16;
        zs_gpt_act_bytes_dt(&c2, 1, MODES[k].ckpt, MODES[k].cpu, ZS_DTYPE_F32, &a32);
        zs_gpt_act_bytes_dt(&c2, 1, MODES[k].ckpt, MODES[k].cpu, ZS_DTYPE_BF16, &a16);
        printf("  GPT-2 124M shape (L=12 C=768 T=1024 B=1 V=50257), %-17s: device %.3f GB -> "
               "%.3f GB (%.3fx), pinned %.3f GB -> %.3f GB (zs_gpt_act_bytes_dt)\n",
               MODES[k].name, a32.device / 1e9, a16.device / 1e9,
               (double)a16.device / (double)a32.device, a32.pinned / 1e9, a16.pinned / 1e9);
    }
    double r0 = (double)dbytes[1][0] / (double)dbytes[0][0];
    TEST_CHECKF(r0 <= ACT16_MAX_RATIO, "no checkpointing: bf16 / fp32 activation bytes %.3f > %.2f",
                r0, ACT16_MAX_RATIO);
}

/* ---- 3. tolerance against fp32 activations ---- */

/* Worst relative L2 error over the gradient tensors of config c, its
 * tensor's name into worst. */
static double grad_err(const zs_gpt_config_t *c, const float *g, const float *ref, char *worst)
{
    zs_err_t err;
    double mx = 0;
    for (int ti = 0; ti < zs_gpt_num_tensors(c); ti++) {
        zs_gpt_tensor_t t;
        TEST_OK(zs_gpt_tensor(c, ti, &t), err);
        double d2 = 0, r2 = 0;
        for (uint64_t i = 0; i < t.numel; i++) {
            double a = g[t.offset + i], b = ref[t.offset + i];
            TEST_CHECKF(isfinite(a), "gradient of %s[%llu] is %g", t.name, (unsigned long long)i,
                        a);
            d2 += (a - b) * (a - b);
            r2 += b * b;
        }
        double e = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
        if (e > mx) {
            mx = e;
            snprintf(worst, 32, "%s", t.name);
        }
    }
    return mx;
}

static void test_tolerance(void)
{
    zs_gpt_config_t c = {4, 4, 64, 32, 128};
    const int B = 4, T = 32;
    const int gemms[2] = {ZS_DTYPE_F32, ZS_DTYPE_BF16};
    const int acts[2] = {ZS_DTYPE_BF16, ZS_DTYPE_F16};
    double lf32[2];
    float *gf32 = NULL;
    for (int gi = 0; gi < 2; gi++) {
        const double *ltol = LOSS_TOL[gi], *gtol = GRAD_TOL[gi];
        double lref[2];
        float *gref;
        run(c, B, T, ZS_DTYPE_F32, gemms[gi], &MODES[0], 0, lref, &gref, NULL);
        if (gi == 0) {
            memcpy(lf32, lref, sizeof lf32);
            gf32 = malloc(zs_gpt_num_params(&c) * 4);
            memcpy(gf32, gref, zs_gpt_num_params(&c) * 4);
        } else {
            /* for scale: what bf16 GEMMs alone change */
            char worst[32] = "";
            printf("  (for scale: bf16 GEMMs vs fp32 GEMMs, fp32 activations: loss relative "
                   "%.2e, gradients worst relative L2 %.2e in %s)\n",
                   fabs(lref[1] - lf32[1]) / lf32[1], grad_err(&c, gref, gf32, worst), worst);
        }
        for (int ai = 0; ai < 2; ai++) {
            double l[2];
            float *g;
            char worst[32] = "";
            run(c, B, T, acts[ai], gemms[gi], &MODES[0], 0, l, &g, NULL);
            double le = fmax(fabs(l[0] - lref[0]) / lref[0], fabs(l[1] - lref[1]) / lref[1]);
            double ge = grad_err(&c, g, gref, worst);
            printf("  %s GEMMs, %s activations vs fp32 activations (L=%d C=%d T=%d B=%d): "
                   "loss %.7f vs %.7f, relative %.2e (bound %.0e); gradients worst relative L2 "
                   "%.2e in %s (bound %.0e)\n",
                   zs_dtype_name(gemms[gi]), zs_dtype_name(acts[ai]), c.layers, c.width, T, B, l[1],
                   lref[1], le, ltol[ai], ge, worst, gtol[ai]);
            TEST_CHECKF(le <= ltol[ai], "%s GEMMs, %s activations: loss relative error %.3e > %.0e",
                        zs_dtype_name(gemms[gi]), zs_dtype_name(acts[ai]), le, ltol[ai]);
            TEST_CHECKF(ge <= gtol[ai],
                        "%s GEMMs, %s activations: gradient of %s relative error %.3e > %.0e",
                        zs_dtype_name(gemms[gi]), zs_dtype_name(acts[ai]), worst, ge, gtol[ai]);
            TEST_CHECKF(le > 0 && ge > 0, "%s activations changed nothing: not in effect",
                        zs_dtype_name(acts[ai]));
            free(g);
        }
        free(gref);
    }
    free(gf32);
}

/* ---- 4. checkpointing bitwise ---- */

static void test_bitwise(int act_dt, int gemm_dt, unsigned debug)
{
    zs_gpt_config_t c = {3, 2, 16, 8, 32};
    const int B = 2, T = 7; /* T < ctx: slices of the max size */
    float *grad[3], *logits[3];
    double loss[3][2];
    size_t nlog = (size_t)B * T * c.vocab;
    for (int k = 0; k < 3; k++)
        run(c, B, T, act_dt, gemm_dt, &MODES[k], debug, loss[k], &grad[k], &logits[k]);
    int nt = zs_gpt_num_tensors(&c);
    for (int k = 1; k < 3; k++) {
        TEST_CHECKF(memcmp(loss[k], loss[0], sizeof loss[0]) == 0,
                    "%s activations, %s: loss %.9g %.9g vs %.9g %.9g without checkpointing",
                    zs_dtype_name(act_dt), MODES[k].name, loss[k][0], loss[k][1], loss[0][0],
                    loss[0][1]);
        TEST_CHECKF(memcmp(logits[k], logits[0], nlog * 4) == 0,
                    "%s activations, %s: logits differ", zs_dtype_name(act_dt), MODES[k].name);
        for (int ti = 0; ti < nt; ti++) {
            zs_err_t err;
            zs_gpt_tensor_t t;
            TEST_OK(zs_gpt_tensor(&c, ti, &t), err);
            TEST_CHECKF(memcmp(grad[k] + t.offset, grad[0] + t.offset, t.numel * 4) == 0,
                        "%s activations, %s: gradient of %s differs from the run without "
                        "checkpointing",
                        zs_dtype_name(act_dt), MODES[k].name, t.name);
        }
        printf("  %s activations, %s GEMMs, %-17s: loss %.7f, %.7f, logits and all %d gradient "
               "tensors bitwise equal to no checkpointing\n",
               zs_dtype_name(act_dt), zs_dtype_name(gemm_dt), MODES[k].name, loss[k][0], loss[k][1],
               nt);
    }
    for (int k = 0; k < 3; k++)
        free(grad[k]), free(logits[k]);
}

/* ---- 5. against PyTorch ---- */

/* torch's loss, logits and gradients for f's weights, micro-batch 0's
 * tokens (fx_step) and activation dtype `act`, fp32 GEMMs. */
static void torch_ref(const fx_t *f, int B, int T, const char *act, double *loss, float *logits,
                      float *grad)
{
    char dir[] = "/tmp/zs_test_act16_XXXXXX";
    TEST_CHECK(mkdtemp(dir) != NULL);
    char cfg[128];
    int n = snprintf(cfg, sizeof cfg, "%d %d %d %d %d %d %d\n", f->c.layers, f->c.heads, f->c.width,
                     f->c.ctx, f->c.vocab, B, T);
    zs_test_write_file(dir, "config.txt", cfg, (size_t)n);
    zs_test_write_file(dir, "params.bin", f->w, f->P * sizeof(float));
    int32_t *tok = malloc(2 * (size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((i * 7 + 3) % f->c.vocab);
        tok[B * T + i] = (int32_t)((i * 13 + 5 + i / 3) % f->c.vocab);
    }
    zs_test_write_file(dir, "tokens.bin", tok, 2 * (size_t)B * T * sizeof(int32_t));
    free(tok);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/gpt_torch.py %s fp32 %s", ZS_PYTHON, ZS_SOURCE_DIR,
             dir, act);
    int rc = system(cmd);
    TEST_CHECKF(rc == 0, "%s failed (%d); torch missing? run deploy/install-deps.sh", cmd, rc);
    zs_test_read_file(dir, "logits.bin", logits, (size_t)B * T * f->c.vocab * sizeof(float));
    zs_test_read_file(dir, "loss.bin", loss, sizeof *loss);
    zs_test_read_file(dir, "grads.bin", grad, f->P * sizeof(float));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TEST_CHECK(system(cmd) == 0);
}

static void test_torch(int act_dt)
{
    zs_err_t err;
    zs_gpt_config_t c = {2, 4, 64, 64, 97};
    const int B = 4, T = 48;
    fx_t f;
    fx_init(&f, dev, stream, c, B, act_dt, ZS_DTYPE_F32, &MODES[0], 0);
    size_t nlog = (size_t)B * T * c.vocab;
    float *lg = malloc(nlog * 4), *gr = malloc(f.P * 4);
    f.logits_out = lg;
    double loss = fx_step(&f, B, T, 0);
    float *tl[2] = {malloc(nlog * 4), malloc(nlog * 4)},
          *tg[2] = {malloc(f.P * 4), malloc(f.P * 4)};
    double tloss[2];
    TEST_OK(zs_dev_memcpy(stream, gr, f.dgrad, f.P * 4, &err), err);
    sync_stream();
    torch_ref(&f, B, T, zs_dtype_name(act_dt), &tloss[0], tl[0], tg[0]);
    torch_ref(&f, B, T, "fp32", &tloss[1], tl[1], tg[1]);
    double lmax, lrms, pmax, prms, gmax, grms, qmax, qrms;
    zs_test_diff_stats(lg, tl[0], nlog, &lmax, &lrms);
    zs_test_diff_stats(lg, tl[1], nlog, &pmax, &prms);
    zs_test_diff_stats(gr, tg[0], f.P, &gmax, &grms);
    zs_test_diff_stats(gr, tg[1], f.P, &qmax, &qrms);
    double ratio = TORCH_MIN_RATIO[act_dt == ZS_DTYPE_F16];
    double le = fabs(loss - tloss[0]);
    printf("  %s activations, fp32 GEMMs, L=%d NH=%d C=%d V=%d B=%d T=%d: loss zs %.7f torch "
           "same rounding %.7f (diff %.3g) torch fp32 activations %.7f\n",
           zs_dtype_name(act_dt), c.layers, c.heads, c.width, c.vocab, B, T, loss, tloss[0], le,
           tloss[1]);
    printf("    logits    vs same rounding: max %.3g rms %.3g | vs fp32 activations: max %.3g "
           "rms %.3g (%.1fx)\n",
           lmax, lrms, pmax, prms, prms / fmax(lrms, 1e-30));
    printf("    gradients vs same rounding: max %.3g rms %.3g | vs fp32 activations: max %.3g "
           "rms %.3g (%.1fx; bound %.1fx)\n",
           gmax, grms, qmax, qrms, qrms / fmax(grms, 1e-30), ratio);
    TEST_CHECKF(lrms * ratio <= prms,
                "logits: rms %.3g from torch rounding the same, %.3g from fp32 activations", lrms,
                prms);
    TEST_CHECKF(grms * ratio <= qrms,
                "gradients: rms %.3g from torch rounding the same, %.3g from fp32 activations",
                grms, qrms);
    TEST_CHECKF(le <= TORCH_LOSS_TOL, "loss %.8g vs torch %.8g", loss, tloss[0]);
    for (int k = 0; k < 2; k++)
        free(tl[k]), free(tg[k]);
    free(lg), free(gr);
    fx_free(&f);
}

int main(void)
{
    zs_err_t err;
    TEST_OK(zs_dev_cpu_create(2, &dev, &err), err);
    TEST_OK(zs_dev_stream_create(dev, 0, "compute", &stream, &err), err);
    printf("test_gpt_act16: 1. refusals\n");
    test_refusals();
    printf("test_gpt_act16: 2. activation memory\n");
    test_memory();
    printf("test_gpt_act16: 3. against fp32 activations\n");
    test_tolerance();
    printf("test_gpt_act16: 4. checkpointing bitwise equal to none\n");
    const char *brk = getenv("ZS_TEST_ACT16_BREAK");
    unsigned debug = brk && atoi(brk) ? ZS_GPT_DEBUG_ACT16_UNROUNDED : 0;
    if (debug)
        printf("  ZS_TEST_ACT16_BREAK: the forward keeps unrounded values; part 4 must fail\n");
    test_bitwise(ZS_DTYPE_BF16, ZS_DTYPE_F32, debug);
    test_bitwise(ZS_DTYPE_F16, ZS_DTYPE_F32, debug);
    test_bitwise(ZS_DTYPE_BF16, ZS_DTYPE_BF16, debug);
    printf("test_gpt_act16: 5. against PyTorch\n");
    test_torch(ZS_DTYPE_BF16);
    test_torch(ZS_DTYPE_F16);
    zs_dev_stream_destroy(stream);
    zs_dev_destroy(dev);
    printf("test_gpt_act16: OK\n");
    return 0;
}
