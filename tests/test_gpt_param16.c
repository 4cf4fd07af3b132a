/*
 * test_gpt_param16.c - the GPT reading 16-bit parameters as the engine
 * stores them (zs_gpt_param16.c, zs_gpt_set_param_dtype, the engine's
 * set_param_dtype), on the CPU device:
 *   1. model: bf16 parameters give bitwise the loss, logits and gradients
 *      of fp32 parameters holding the same values (fp32 and bf16 GEMMs),
 *      with the whole vocabulary in one head chunk;
 *   2. model, vocabulary wider than the conversion scratch (3 head chunks):
 *      loss, logits and gradients within fp32 reordering (a chunk's GEMM is
 *      a product of another shape, which BLAS may sum in another order: on
 *      OpenBLAS's SKYLAKEX kernels it does), and the scratch the model
 *      allocates holds one chunk, not the tied embedding;
 *   3. engine W=1, bf16, stages 2 and 3: final parameters bitwise equal to
 *      the engine's fp32 views (the model without set_param_dtype), and
 *      the device holds no fp32 view at stage 2 (allocator's figures).
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

typedef struct {
    double loss;
    float *logits, *grads; /* host: [N * V], [P] */
    uint64_t scratch;      /* device scratch bytes bind allocated */
} run_t;

/* Perturbed GPT-2 init of c, rounded to bf16 values (host fp32, P). */
static float *bf16_values(const zs_gpt_config_t *c)
{
    zs_err_t err;
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(c, 1, 7, &g, &err), err);
    const zs_model_t *m = zs_gpt_model(g);
    uint64_t P = zs_gpt_num_params(c), at = 0, r = 0x9e3779b97f4a7c15ull;
    float *w = malloc(P * 4);
    TEST_CHECK(w);
    for (int i = 0; i < m->nlayers; i++) {
        TEST_OK(m->init_params(m->self, i, w + at, &err), err);
        at += m->nparams[i];
    }
    for (uint64_t k = 0; k < P; k++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        w[k] = zs_bf16_to_f32(
            zs_f32_to_bf16(w[k] + 0.1f * (float)((double)(r >> 11) * 0x1p-52 - 0.5)));
    }
    zs_gpt_destroy(g);
    return w;
}

/* One forward + backward of the model (parameters in pdt, GEMMs in
 * gemm_dt) with values w on B x ctx deterministic tokens. */
static void model_run(const zs_gpt_config_t *c, int B, int pdt, int gemm_dt, const float *w,
                      run_t *out)
{
    zs_err_t err;
    zs_gpt_t *g;
    int T = c->ctx, N = B * T, V = c->vocab;
    uint64_t P = zs_gpt_num_params(c);
    size_t esz = zs_dtype_size(pdt);
    TEST_OK(zs_gpt_create(c, B, 7, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    TEST_OK(zs_gpt_set_compute(g, gemm_dt, &err), err);
    TEST_OK(zs_gpt_set_param_dtype(g, pdt, &err), err);
    TEST_CHECK(zs_gpt_param_dtype(g) == pdt);
    zs_dev_mem_t m0, m1;
    zs_dev_mem_get(dev, &m0);
    TEST_OK(zs_gpt_bind(g, dev, stream, &err), err);
    zs_dev_mem_get(dev, &m1);
    out->scratch =
        m1.cur[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH] - m0.cur[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH];
    TEST_CHECK(zs_gpt_set_param_dtype(g, pdt, &err) == ZS_ERR_STATE); /* after bind */
    void *dp;
    float *dg;
    gptrun_buffers(dev, stream, w, P, pdt, &dp, &dg);
    int32_t *in = malloc((size_t)N * 4), *tg = malloc((size_t)N * 4);
    TEST_CHECK(in && tg);
    for (int i = 0; i < N; i++) { /* repeated ids: the embedding converts each row once */
        in[i] = (int32_t)((i * 7 + 3) % 37 * 5 % V);
        tg[i] = (int32_t)((i * 13 + 5 + i / 3) % V);
    }
    TEST_OK(zs_gpt_set_tokens(g, in, tg, B, T, &err), err);
    out->logits = malloc((size_t)N * V * 4);
    out->grads = malloc(P * 4);
    TEST_CHECK(out->logits && out->grads);
    gptrun_pass(g, stream, dp, esz, dg, &out->loss, out->logits);
    TEST_OK(zs_dev_memcpy(stream, out->grads, dg, P * 4, &err), err);
    TEST_OK(zs_dev_stream_sync(stream, &err), err);
    zs_gpt_destroy(g);
    zs_dev_free(dev, dp);
    zs_dev_free(dev, dg);
    free(in), free(tg);
}

static void run_free(run_t *r)
{
    free(r->logits), free(r->grads);
}

/* First index where a and b differ bitwise, or n. */
static uint64_t first_diff(const float *a, const float *b, uint64_t n)
{
    uint64_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], 4) == 0)
        i++;
    return i;
}

/* ---- 1 and 2: the model ---- */

/* Relative L2 distance of b from a over n elements. */
static double rel_l2(const float *a, const float *b, uint64_t n)
{
    double d2 = 0, n2 = 0;
    for (uint64_t q = 0; q < n; q++) {
        double d = (double)a[q] - b[q];
        d2 += d * d;
        n2 += (double)a[q] * a[q];
    }
    return sqrt(d2 / n2);
}

/* bf16 parameters against fp32 parameters of the same values, with fp32
 * and bf16 GEMMs. One head chunk (chunked 0): the same GEMM calls, so
 * loss, logits and gradients bitwise. Several (chunked 1): the fp32 head
 * is one GEMM over the vocabulary and the 16-bit head one per chunk of it;
 * each logit is the same C-term dot product, but BLAS may add its terms in
 * another order for a product of another shape, which moves a logit by a
 * few ulps (|d| <= 2 C u sum|x_i w_i|, u = 2^-24) and the loss and
 * gradients accordingly: held within fp32 reordering (relative L2 of the
 * logits 1e-6, of the gradients 1e-5, loss 1e-6 relative); the scratch
 * the model adds is its conversion areas (one chunk), not the tied
 * embedding. */
static void test_model(zs_gpt_config_t c, int B, int chunked)
{
    uint64_t P = zs_gpt_num_params(&c), NV = (uint64_t)B * c.ctx * c.vocab;
    float *w = bf16_values(&c);
    int gemms[2] = {ZS_DTYPE_F32, ZS_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        run_t a, b;
        model_run(&c, B, ZS_DTYPE_F32, gemms[k], w, &a);
        model_run(&c, B, ZS_DTYPE_BF16, gemms[k], w, &b);
        const char *gn = zs_dtype_name(gemms[k]);
        uint64_t i = first_diff(a.logits, b.logits, NV), j = first_diff(a.grads, b.grads, P);
        double rel = rel_l2(a.grads, b.grads, P), rl = rel_l2(a.logits, b.logits, NV);
        uint64_t same = 0;
        for (uint64_t q = 0; q < NV; q++)
            same += memcmp(&a.logits[q], &b.logits[q], 4) == 0;
        if (!chunked) { /* the same GEMM calls: bitwise on any BLAS */
            TEST_CHECKF(a.loss == b.loss, "%s GEMMs: loss %.17g vs %.17g", gn, a.loss, b.loss);
            TEST_CHECKF(i == NV, "%s GEMMs: logit %llu: %.9g vs %.9g", gn, (unsigned long long)i,
                        a.logits[i], b.logits[i]);
            TEST_CHECKF(j == P, "%s GEMMs: gradient %llu: %.9g vs %.9g", gn, (unsigned long long)j,
                        a.grads[j], b.grads[j]);
        }
        TEST_CHECKF(fabs(a.loss - b.loss) <= 1e-6 * fabs(a.loss), "%s GEMMs: loss %.17g vs %.17g",
                    gn, a.loss, b.loss);
        TEST_CHECKF(rl < 1e-6, "%s GEMMs: logits differ by %.3g (relative L2)", gn, rl);
        TEST_CHECKF(rel < 1e-5, "%s GEMMs: gradients differ by %.3g (relative L2)", gn, rel);
        printf("  %s GEMMs, V=%d%s: bf16 parameters vs fp32 parameters of the same values: loss "
               "%s, %llu of %llu logits bitwise (%.2g relative L2), gradients %s (%.2g relative "
               "L2)\n",
               gn, c.vocab, chunked ? " in 3 head chunks" : "",
               a.loss == b.loss ? "bitwise" : "within reordering", (unsigned long long)same,
               (unsigned long long)NV, rl, j == P ? "bitwise" : "within reordering", rel);
        if (chunked && k == 0) {
            /* what bf16 parameters add to the model's device scratch: the
             * small and big conversion areas and the remap ids */
            uint64_t C = (uint64_t)c.width, N = (uint64_t)B * c.ctx;
            uint64_t conv = (13 * C + 128 + 4 * C * C) * 4 + N * 4, wte = c.vocab * C * 4;
            uint64_t extra = b.scratch - a.scratch;
            TEST_CHECKF(b.scratch >= a.scratch + conv && extra <= conv + 256 && conv < wte,
                        "bf16 parameters add %lld bytes of device scratch (conversion areas "
                        "%llu, wte in fp32 %llu)",
                        (long long)(b.scratch - a.scratch), (unsigned long long)conv,
                        (unsigned long long)wte);
            printf("  bf16 parameters add %llu bytes of device scratch (wte in fp32: %llu)\n",
                   (unsigned long long)extra, (unsigned long long)wte);
        }
        run_free(&a), run_free(&b);
    }
    free(w);
}

/* ---- 3. the engine ---- */

/* Final parameters after `steps` bf16 steps at `stage`; views: the model
 * without set_param_dtype (the engine's fp32 views). *gathered: device
 * peak of ZS_MEM_GATHERED. */
static void engine_run(int stage, int views, int steps, float *out, uint64_t *gathered)
{
    zs_err_t err;
    zs_gpt_config_t c = {3, 2, 32, 16, 64};
    const int B = 2;
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, B, 11, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    TEST_OK(zs_gpt_set_compute(g, ZS_DTYPE_BF16, &err), err);
    gptrun_fixed_tokens(g, &c, B, 5);
    zs_model_t m = *zs_gpt_model(g);
    if (views)
        m.set_param_dtype = NULL;
    gptrun_t o = {dev, stage, 1, steps, 3000, "gpt-param16-test"};
    zs_dev_mem_t mm;
    gptrun_engine(&m, &o, NULL, out, &mm);
    TEST_CHECK(zs_gpt_param_dtype(g) == (views ? ZS_DTYPE_F32 : ZS_DTYPE_BF16));
    *gathered = mm.peak[ZS_SPACE_DEVICE][ZS_MEM_GATHERED];
    zs_gpt_destroy(g);
}

static void test_engine(void)
{
    zs_gpt_config_t c = {3, 2, 32, 16, 64};
    uint64_t P = zs_gpt_num_params(&c);
    float *ref = malloc(P * 4), *got = malloc(P * 4);
    TEST_CHECK(ref && got);
    for (int stage = 2; stage <= 3; stage++) {
        uint64_t gv, g16;
        engine_run(stage, 1, 4, ref, &gv);
        engine_run(stage, 0, 4, got, &g16);
        uint64_t i = first_diff(got, ref, P);
        TEST_CHECKF(i == P, "stage %d: parameter %llu is %.9g, %.9g with fp32 views", stage,
                    (unsigned long long)i, got[i], ref[i]);
        if (stage == 2)
            TEST_CHECKF(g16 == 0 && gv > 0,
                        "stage 2: device fp32 views %llu bytes (want 0), %llu with the engine's "
                        "views",
                        (unsigned long long)g16, (unsigned long long)gv);
        else
            TEST_CHECKF(g16 < gv, "stage 3: gathered peak %llu, not below %llu with fp32 views",
                        (unsigned long long)g16, (unsigned long long)gv);
        printf("  engine W=1 stage %d bf16, 4 steps: final parameters bitwise equal to fp32 "
               "views; device gathered/view peak %llu bytes (fp32 views: %llu)\n",
               stage, (unsigned long long)g16, (unsigned long long)gv);
    }
    free(ref), free(got);
}

int main(int argc, char **argv)
{
    gptrun_init(&argc, &argv, &dev, &stream);
    printf("test_gpt_param16: 1. one head chunk: bitwise\n");
    test_model((zs_gpt_config_t){2, 2, 32, 16, 64}, 2, 0);
    /* big area max(4 C^2, (B T + T) C) = 4096 floats = 128 vocabulary rows:
     * V = 300 is three chunks (128, 128, 44) */
    printf("test_gpt_param16: 2. three head chunks\n");
    test_model((zs_gpt_config_t){1, 2, 32, 8, 300}, 1, 1);
    printf("test_gpt_param16: 3. the engine at W=1\n");
    test_engine();
    gptrun_fini(dev, stream);
    printf("test_gpt_param16: OK\n");
    return 0;
}
