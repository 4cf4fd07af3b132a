/*
 * test_gpt_split.c - the GPT split into engine layers smaller than its
 * natural ones (zs_gpt_set_split, zs_gpt_split.c, zs_gpt_block.c), on the
 * CPU device:
 *   1. layout: layer counts and sizes, flat order (sizes add up), the
 *      head's deps read-only, same initial values as unsplit;
 *   2. model: forward + backward of the split model against the unsplit
 *      one (fp32 and bf16 parameters): loss, logits and gradients within
 *      fp32 reordering (the split head's GEMMs go by vocabulary chunk:
 *      products of other shapes, which BLAS may sum in another order);
 *      with checkpointing the split model is bitwise equal to itself
 *      without;
 *   3. engine W=1 at stages 0-3, fp32 and bf16: final parameters within
 *      reordering of the unsplit run, and the gradient slots the engine
 *      holds (allocator) shrink to the cap instead of the embedding.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_coll.h"
#include "zs_config.h"
#include "zs_dev.h"
#include "zs_engine.h"
#include "zs_gpt.h"
#include "zs_gptrun.h"
#include "zs_test.h"

static zs_dev_t *dev;
static zs_stream_t *stream;

/* 2 blocks, C 32, T 16, V 300: wte 9600 elements, a block 12704 */
static const zs_gpt_config_t CFG = {2, 2, 32, 16, 300};
#define CAP 2048 /* elements per engine layer: 64 vocabulary rows, blocks in parts */

/* ---- 1. layout ---- */

static void test_layout(void)
{
    zs_err_t err;
    zs_gpt_t *a, *b;
    TEST_OK(zs_gpt_create(&CFG, 2, 3, &a, &err), err);
    TEST_OK(zs_gpt_create(&CFG, 2, 3, &b, &err), err);
    TEST_OK(zs_gpt_set_split(b, CAP, &err), err);
    const zs_model_t *ma = zs_gpt_model(a), *mb = zs_gpt_model(b);
    int L = CFG.layers, nwte = (CFG.vocab + 63) / 64;
    TEST_CHECKF(ma->nlayers == L + 2 && zs_gpt_num_layers(a) == L + 2, "unsplit: %d layers",
                ma->nlayers);
    TEST_CHECKF(mb->nlayers == nwte + 1 + 4 * L + 1, "split: %d layers, want %d", mb->nlayers,
                nwte + 1 + 4 * L + 1);
    uint64_t P = zs_gpt_num_params(&CFG), sa = 0, sb = 0;
    for (int i = 0; i < ma->nlayers; i++)
        sa += ma->nparams[i];
    for (int i = 0; i < mb->nlayers; i++) {
        sb += mb->nparams[i];
        /* every layer within the cap except a block part wider than it */
        TEST_CHECKF(mb->nparams[i] <= 4 * 32 * 32 + 4 * 32, "layer %d has %zu", i, mb->nparams[i]);
    }
    TEST_CHECKF(sa == P && sb == P, "parameters %llu / %llu, want %llu", (unsigned long long)sa,
                (unsigned long long)sb, (unsigned long long)P);
    int head = mb->nlayers - 1, n = 0;
    while (mb->deps[head][n] >= 0) {
        TEST_CHECK(mb->deps[head][n] == n);
        n++;
    }
    TEST_CHECKF(n == nwte && mb->deps_read_only && mb->deps_read_only[head],
                "head deps %d (want the %d wte layers, read-only)", n, nwte);
    /* the same initial numbers at the same flat offsets */
    float *wa = malloc(P * 4), *wb = malloc(P * 4);
    TEST_CHECK(wa && wb);
    uint64_t at = 0;
    for (int i = 0; i < ma->nlayers; at += ma->nparams[i], i++)
        TEST_OK(ma->init_params(ma->self, i, wa + at, &err), err);
    at = 0;
    for (int i = 0; i < mb->nlayers; at += mb->nparams[i], i++)
        TEST_OK(mb->init_params(mb->self, i, wb + at, &err), err);
    TEST_CHECK(memcmp(wa, wb, P * 4) == 0);
    printf("  split at %d elements: %d engine layers (unsplit %d), same sizes in flat order, same "
           "initial values; head reads %d wte layers without writing their gradients\n",
           CAP, mb->nlayers, ma->nlayers, nwte);
    TEST_CHECK(zs_gpt_set_split(b, 0, &err) == ZS_OK && zs_gpt_model(b)->nlayers == L + 2);
    free(wa), free(wb);
    zs_gpt_destroy(a);
    zs_gpt_destroy(b);
}

/* ---- 2. the model ---- */

typedef struct {
    double loss;
    float *logits, *grads;
} run_t;

/* One forward + backward over every engine layer of the model (split at
 * cap, parameters in pdt holding the values w, checkpointing ckpt). */
static void model_run(uint64_t cap, int pdt, int ckpt, const float *w, run_t *out)
{
    zs_err_t err;
    zs_gpt_t *g;
    const int B = 2;
    int T = CFG.ctx, N = B * T, V = CFG.vocab;
    uint64_t P = zs_gpt_num_params(&CFG);
    size_t esz = zs_dtype_size(pdt);
    TEST_OK(zs_gpt_create(&CFG, B, 3, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    TEST_OK(zs_gpt_set_param_dtype(g, pdt, &err), err);
    TEST_OK(zs_gpt_set_checkpointing(g, ckpt, 0, &err), err);
    TEST_OK(zs_gpt_set_split(g, cap, &err), err);
    TEST_OK(zs_gpt_bind(g, dev, stream, &err), err);
    void *dp;
    float *dg;
    gptrun_buffers(dev, stream, w, P, pdt, &dp, &dg);
    int32_t in[2 * 16], tg[2 * 16];
    for (int i = 0; i < N; i++) { /* ids across every wte layer, some repeated */
        in[i] = (int32_t)((i * 37 + 11) % V);
        tg[i] = (int32_t)((i * 53 + 7 + i / 3) % V);
    }
    in[5] = in[9];
    TEST_OK(zs_gpt_set_tokens(g, in, tg, B, T, &err), err);
    out->logits = malloc((size_t)N * V * 4);
    TEST_CHECK(out->logits);
    gptrun_pass(g, stream, dp, esz, dg, &out->loss, out->logits);
    out->grads = malloc(P * 4);
    TEST_CHECK(out->grads);
    TEST_OK(zs_dev_memcpy(stream, out->grads, dg, P * 4, &err), err);
    TEST_OK(zs_dev_stream_sync(stream, &err), err);
    zs_gpt_destroy(g);
    zs_dev_free(dev, dp);
    zs_dev_free(dev, dg);
}

static uint64_t first_diff(const float *a, const float *b, uint64_t n)
{
    uint64_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], 4) == 0)
        i++;
    return i;
}

static double rel_l2(const float *a, const float *b, uint64_t n)
{
    double d2 = 0, n2 = 0;
    for (uint64_t k = 0; k < n; k++) {
        double d = (double)a[k] - b[k];
        d2 += d * d;
        n2 += (double)a[k] * a[k];
    }
    return sqrt(d2 / n2);
}

static void test_model(void)
{
    zs_err_t err;
    uint64_t P = zs_gpt_num_params(&CFG), NV = 2ull * CFG.ctx * CFG.vocab;
    /* perturbed GPT-2 init, bf16-exact so fp32 and bf16 parameters agree */
    zs_gpt_t *g0;
    TEST_OK(zs_gpt_create(&CFG, 2, 3, &g0, &err), err);
    const zs_model_t *m0 = zs_gpt_model(g0);
    float *w = malloc(P * 4);
    TEST_CHECK(w);
    uint64_t at = 0, r = 77;
    for (int i = 0; i < m0->nlayers; at += m0->nparams[i], i++)
        TEST_OK(m0->init_params(m0->self, i, w + at, &err), err);
    for (uint64_t k = 0; k < P; k++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        w[k] = zs_bf16_to_f32(
            zs_f32_to_bf16(w[k] + 0.1f * (float)((double)(r >> 11) * 0x1p-52 - 0.5)));
    }
    zs_gpt_destroy(g0);
    int pdts[2] = {ZS_DTYPE_F32, ZS_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        run_t a, b, c;
        model_run(0, pdts[k], 0, w, &a);
        model_run(CAP, pdts[k], 0, w, &b);
        model_run(CAP, pdts[k], 1, w, &c);
        const char *pn = zs_dtype_name(pdts[k]);
        /* the logits by vocabulary chunk: each the same dot product, but
         * BLAS may order a GEMM's additions by its shape */
        double rl = rel_l2(a.logits, b.logits, NV);
        TEST_CHECKF(rl < 1e-6, "%s: logits %.3g (relative L2) from unsplit", pn, rl);
        TEST_CHECKF(fabs(a.loss - b.loss) <= 1e-6 * fabs(a.loss),
                    "%s: loss %.17g split, %.17g unsplit", pn, b.loss, a.loss);
        double rel = rel_l2(a.grads, b.grads, P);
        TEST_CHECKF(rel < 1e-5, "%s: gradients %.3g (relative L2) from unsplit", pn, rel);
        /* the wte's gradient (head product + scatter) is computed by the wte
         * layers: it must be there, not zero (a head that dropped it) */
        double rw = rel_l2(a.grads, b.grads, (uint64_t)CFG.vocab * CFG.width);
        TEST_CHECKF(rw < 1e-5, "%s: wte gradient %.3g from unsplit", pn, rw);
        uint64_t j = first_diff(b.grads, c.grads, P);
        TEST_CHECKF(j == P && b.loss == c.loss,
                    "%s: split with checkpointing: gradient %llu %.9g, %.9g without", pn,
                    (unsigned long long)j, c.grads[j], b.grads[j]);
        printf("  %s parameters: split vs unsplit: logits %.2g, gradients %.2g, wte gradient "
               "%.2g (relative L2); checkpointing on the split model bitwise\n",
               pn, rl, rel, rw);
        free(a.logits), free(a.grads), free(b.logits), free(b.grads), free(c.logits), free(c.grads);
    }
    free(w);
}

/* ---- 3. the engine ---- */

/* Final parameters of 3 steps at `stage` (bf16 or fp32), split at cap;
 * *slots: the device scratch peak (gradient slots and the model's). */
static void engine_run(int stage, int bf16, uint64_t cap, float *init, float *out,
                       uint64_t *scratch)
{
    zs_err_t err;
    const int B = 2;
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&CFG, B, 11, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    TEST_OK(zs_gpt_set_checkpointing(g, 1, 0, &err), err);
    TEST_OK(zs_gpt_set_split(g, cap, &err), err);
    gptrun_fixed_tokens(g, &CFG, B, 37);
    gptrun_t o = {dev, stage, bf16, 3, CAP, "gpt-split-test"};
    zs_dev_mem_t mm;
    gptrun_engine(zs_gpt_model(g), &o, init, out, &mm);
    *scratch = mm.peak[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH];
    zs_gpt_destroy(g);
}

static void test_engine(void)
{
    uint64_t P = zs_gpt_num_params(&CFG);
    float *ref = malloc(P * 4), *got = malloc(P * 4), *init = malloc(P * 4);
    TEST_CHECK(ref && got && init);
    for (int run = 0; run < 6; run++) {
        int stage = run < 4 ? run : run - 2, bf16 = run >= 4;
        uint64_t s0, s1;
        engine_run(stage, bf16, 0, init, ref, &s0);
        engine_run(stage, bf16, CAP, NULL, got, &s1);
        /* 3 AdamW steps: gradients reordered by a few ulps move the
         * updates of elements whose gradient is near 0 the most (Adam
         * normalises it): the difference against the whole update, and
         * (bf16) a stored value may round the other way */
        double d2 = 0, u2 = 0;
        for (uint64_t k = 0; k < P; k++) {
            double d = (double)got[k] - ref[k], u = (double)ref[k] - init[k];
            d2 += d * d;
            u2 += u * u;
        }
        double d = sqrt(d2 / u2), tol = bf16 ? 1e-3 : 1e-4;
        TEST_CHECKF(d <= tol, "stage %d %s: ||split - unsplit|| / ||update|| %.3g > %.3g", stage,
                    bf16 ? "bf16" : "fp32", d, tol);
        TEST_CHECKF(s1 < s0, "stage %d %s: device scratch peak %llu split, %llu unsplit", stage,
                    bf16 ? "bf16" : "fp32", (unsigned long long)s1, (unsigned long long)s0);
        printf("  engine W=1 stage %d %s, 3 steps: ||split - unsplit|| / ||update|| %.2g; device "
               "scratch peak %llu bytes (unsplit %llu)\n",
               stage, bf16 ? "bf16" : "fp32", d, (unsigned long long)s1, (unsigned long long)s0);
    }
    free(ref), free(got), free(init);
}

int main(int argc, char **argv)
{
    gptrun_init(&argc, &argv, &dev, &stream);
    printf("test_gpt_split: 1. layout\n");
    test_layout();
    printf("test_gpt_split: 2. the model against unsplit\n");
    test_model();
    printf("test_gpt_split: 3. the engine at W=1\n");
    test_engine();
    gptrun_fini(dev, stream);
    printf("test_gpt_split: OK\n");
    return 0;
}
