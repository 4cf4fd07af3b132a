/*
 * zs_gptrun.h - two drivers the GPT tests share (header only; a failure
 * stops the test, zs_test.h):
 *   gptrun_pass    one forward + backward over every engine layer of a
 *                  bound model, each layer given its own and its deps'
 *                  parameters (any parameter dtype, any split) and
 *                  gradients (none for read-only deps);
 *   gptrun_engine  a few AdamW steps of a model through the engine at
 *                  W = 1 (in-process optimizer) with the small-bucket
 *                  config of the engine-level GPT tests;
 * and the tests' common main: MPI (serialized threads, for the engine's
 * communicator) and a CPU device with one stream (gptrun_init /
 * gptrun_fini).
 * Used by test_gpt_ckpt, test_gpt_param16, test_gpt_split, test_gpt_cuda.
 */
#ifndef ZS_GPTRUN_H
#define ZS_GPTRUN_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "zs_cast.h"
#include "zs_coll.h"
#include "zs_config.h"
#include "zs_dev.h"
#include "zs_engine.h"
#include "zs_gpt.h"
#include "zs_test.h"

/* Forward every engine layer of g (bound to a stream of dev) on the tokens
 * set last, the loss into *loss, the logits into `logits` (NULL: not
 * copied) before the head's backward, then backward every layer (dloss 1)
 * accumulating into dg. dp: the flat parameters, esz bytes each; dg: the
 * flat fp32 gradients. Waits for the stream (s). */
static inline void gptrun_pass(zs_gpt_t *g, zs_stream_t *s, void *dp, size_t esz, float *dg,
                               double *loss, float *logits)
{
    zs_err_t err;
    const zs_model_t *m = zs_gpt_model(g);
    int nl = m->nlayers;
    uint64_t *off = calloc((size_t)nl + 1, sizeof *off);
    void **p = calloc((size_t)nl + 1, sizeof *p);
    float **gr = calloc((size_t)nl + 1, sizeof *gr);
    TEST_CHECK(off && p && gr);
    for (int i = 0; i < nl; i++)
        off[i + 1] = off[i] + m->nparams[i];
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < nl; k++) {
            int i = pass == 0 ? k : nl - 1 - k, n = 0;
            int ro = m->deps_read_only && m->deps_read_only[i];
            p[0] = (char *)dp + off[i] * esz;
            gr[0] = dg + off[i];
            for (; m->deps[i] && m->deps[i][n] >= 0; n++) {
                p[1 + n] = (char *)dp + off[m->deps[i][n]] * esz;
                gr[1 + n] = ro ? NULL : dg + off[m->deps[i][n]];
            }
            if (pass == 0) {
                TEST_OK(m->forward(m->self, i, p, &err), err);
                continue;
            }
            if (k == 0) {
                TEST_OK(m->loss(m->self, loss, &err), err);
                if (logits)
                    TEST_OK(zs_gpt_copy_logits(g, logits, &err), err);
            }
            TEST_OK(m->backward(m->self, i, p, gr, 1.0f, &err), err);
        }
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    free(off), free(p), free(gr);
}

/* Device buffers for a model of P parameters on stream s of dev: *dp the
 * parameters in pdt holding the values w (host fp32, cast), *dg zeroed
 * fp32 gradients. Waits for the stream; free with zs_dev_free. */
static inline void gptrun_buffers(zs_dev_t *dev, zs_stream_t *s, const float *w, uint64_t P,
                                  int pdt, void **dp, float **dg)
{
    zs_err_t err;
    size_t esz = zs_dtype_size(pdt);
    void *host = malloc(P * esz), *g;
    TEST_CHECK(host);
    zs_cast(host, pdt, w, ZS_DTYPE_F32, P);
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, P * esz, dp, &err), err);
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_GRADS, P * 4, &g, &err), err);
    TEST_OK(zs_dev_memcpy(s, *dp, host, P * esz, &err), err);
    TEST_OK(zs_dev_memset(s, g, 0, P * 4, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    *dg = g;
    free(host);
}

/* The fixed batch of the engine runs (zs_gpt_set_fixed_tokens): B
 * sequences of ctx tokens, input i = (i * stride + 1) % vocab, target
 * (i * stride + 6) % vocab. */
static inline void gptrun_fixed_tokens(zs_gpt_t *g, const zs_gpt_config_t *c, int B, int stride)
{
    zs_err_t err;
    int n = B * c->ctx;
    int32_t *in = malloc((size_t)n * 4), *tg = malloc((size_t)n * 4);
    TEST_CHECK(in && tg);
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)((i * stride + 1) % c->vocab);
        tg[i] = (int32_t)((i * stride + 6) % c->vocab);
    }
    TEST_OK(zs_gpt_set_fixed_tokens(g, in, tg, B, &err), err);
    free(in), free(tg);
}

/* What gptrun_engine runs: `steps` steps at `stage` (bf16 or fp32
 * storage) with reduce_bucket_size `bucket`, micro-batch 2, 2 micro-batches
 * per step (train_batch_size 4), AdamW lr 3e-3, clipping 1.0, stage-3
 * budgets of a few thousand elements. */
typedef struct {
    zs_dev_t *dev;
    int stage, bf16, steps;
    long bucket;
    const char *name; /* the engine's model name */
} gptrun_t;

/* Run o's steps of model m through the engine (the device's peaks reset
 * at engine creation): the loss must fall; the parameters after start
 * into init (may be NULL) and at the end into out (P floats each), the
 * device's figures at the end into *mem. Creates and destroys its MPI
 * communicator and the engine, not the model. */
static inline void gptrun_engine(const zs_model_t *m, const gptrun_t *o, float *init, float *out,
                                 zs_dev_mem_t *mem)
{
    zs_err_t err;
    zs_coll_t *coll;
    TEST_OK(zs_coll_mpi_create(o->dev, &coll, &err), err);
    char json[640];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": 2,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003,"
             " \"weight_decay\": 0.01}}, \"gradient_clipping\": 1.0%s,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %ld,"
             " \"stage3_prefetch_bucket_size\": 3000, \"stage3_max_live_parameters\": 6000,"
             " \"stage3_param_persistence_threshold\": 10}}",
             o->bf16 ? ", \"bf16\": {\"enabled\": true}" : "", o->stage, o->bucket);
    zs_config_t cfg;
    TEST_OK(zs_config_parse(json, &cfg, NULL, NULL, &err), err);
    TEST_OK(zs_config_resolve(&cfg, 1, &err), err);
    zs_engine_opts_t eo = {&cfg, coll, NULL, NULL, o->name, 0};
    zs_engine_t *e;
    zs_dev_mem_reset_peak(o->dev);
    TEST_OK(zs_engine_create(&eo, m, &e, &err), err);
    TEST_OK(zs_engine_start(e, &err), err);
    if (init)
        TEST_OK(zs_engine_get_params(e, init, &err), err);
    double first = 0, last = 0;
    for (int s = 0; s < o->steps; s++) {
        zs_step_stats_t st;
        TEST_OK(zs_engine_step(e, &st, &err), err);
        if (s == 0)
            first = st.loss;
        last = st.loss;
    }
    TEST_CHECKF(last < first, "%s stage %d: loss %.5f -> %.5f", o->name, o->stage, first, last);
    zs_dev_mem_get(o->dev, mem);
    TEST_OK(zs_engine_get_params(e, out, &err), err);
    zs_engine_destroy(e);
    zs_coll_destroy(coll);
}

/* MPI_Init_thread (MPI_THREAD_SERIALIZED at least), a 2-thread CPU
 * device and its stream "compute". */
static inline void gptrun_init(int *argc, char ***argv, zs_dev_t **dev, zs_stream_t **stream)
{
    zs_err_t err;
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    TEST_CHECK(provided >= MPI_THREAD_SERIALIZED);
    TEST_OK(zs_dev_cpu_create(2, dev, &err), err);
    TEST_OK(zs_dev_stream_create(*dev, 0, "compute", stream, &err), err);
}

static inline void gptrun_fini(zs_dev_t *dev, zs_stream_t *stream)
{
    zs_dev_stream_destroy(stream);
    zs_dev_destroy(dev);
    MPI_Finalize();
}

#endif
