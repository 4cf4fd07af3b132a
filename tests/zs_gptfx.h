/*
 * zs_gptfx.h - the GPT fixture of the model-level tests of activation
 * checkpointing, 16-bit activations and flash attention (test_gpt_ckpt.c,
 * test_gpt_act16.c, test_gpt_flash.c):
 * one GPT bound to a device with its parameters and gradients in device
 * memory, GPT-2 init perturbed so every path carries gradient, and one
 * forward + backward on deterministic tokens. Header only; a failure stops
 * the test (zs_test.h).
 */
#ifndef ZS_GPTFX_H
#define ZS_GPTFX_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zs_dev.h"
#include "zs_gpt.h"
#include "zs_test.h"

/* The activation-checkpointing modes under test. */
typedef struct {
    const char *name;
    int ckpt, cpu;
} mode_t_;
static const mode_t_ MODES[3] = {
    {"off", 0, 0}, {"checkpointing", 1, 0}, {"cpu_checkpointing", 1, 1}};

/* One bound model with device parameters and gradients (P floats each). */
typedef struct {
    zs_gpt_config_t c;
    zs_gpt_t *g;
    const zs_model_t *m;
    uint64_t P, *off; /* off: [nlayers + 1] flat offsets of the layers */
    float *w, *dw, *dgrad;
    zs_dev_t *dev;
    zs_stream_t *s;
    /* when set, fx_step copies the logits [B, T, V] here after the forward:
     * the backward writes their gradient over them */
    float *logits_out;
} fx_t;

static inline void fx_sync(const fx_t *f)
{
    zs_err_t err;
    TEST_OK(zs_dev_stream_sync(f->s, &err), err);
}

/* A model of config c for micro-batch B on dev / stream s: activations
 * act_dt, GEMMs gemm_dt (zs_gpt_set_activations / _compute), mode md,
 * debug flags, attention attn (zs_gpt_set_attention); GPT-2 init + 0.1 x
 * uniform noise, gradients zeroed. */
static inline void fx_init_attn(fx_t *f, zs_dev_t *dev, zs_stream_t *s, zs_gpt_config_t c, int B,
                                int act_dt, int gemm_dt, const mode_t_ *md, unsigned debug,
                                int attn)
{
    zs_err_t err;
    memset(f, 0, sizeof *f);
    f->c = c;
    f->dev = dev;
    f->s = s;
    TEST_OK(zs_gpt_create(&c, B, 5, &f->g, &err), err);
    TEST_OK(zs_gpt_set_threads(f->g, 2, &err), err);
    TEST_OK(zs_gpt_set_compute(f->g, gemm_dt, &err), err);
    TEST_OK(zs_gpt_set_activations(f->g, act_dt, &err), err);
    TEST_OK(zs_gpt_set_checkpointing(f->g, md->ckpt, md->cpu, &err), err);
    TEST_OK(zs_gpt_set_attention(f->g, attn, &err), err);
    zs_gpt_set_debug(f->g, debug);
    f->m = zs_gpt_model(f->g);
    f->P = zs_gpt_num_params(&c);
    f->off = calloc((size_t)f->m->nlayers + 1, sizeof *f->off);
    f->w = malloc(f->P * sizeof(float));
    TEST_CHECK(f->off && f->w);
    for (int i = 0; i < f->m->nlayers; i++)
        f->off[i + 1] = f->off[i] + f->m->nparams[i];
    for (int i = 0; i < f->m->nlayers; i++)
        TEST_OK(f->m->init_params(f->m->self, i, f->w + f->off[i], &err), err);
    uint64_t r = 0x1234567ull;
    for (uint64_t k = 0; k < f->P; k++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        f->w[k] += 0.1f * (float)((double)(r >> 11) * 0x1p-52 - 1.0);
    }
    TEST_OK(zs_gpt_bind(f->g, dev, s, &err), err);
    void *p;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, f->P * 4, &p, &err), err);
    f->dw = p;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_GRADS, f->P * 4, &p, &err), err);
    f->dgrad = p;
    TEST_OK(zs_dev_memcpy(s, f->dw, f->w, f->P * 4, &err), err);
    TEST_OK(zs_dev_memset(s, f->dgrad, 0, f->P * 4, &err), err);
    fx_sync(f);
}

/* fx_init_attn with the unfused attention. */
static inline void fx_init(fx_t *f, zs_dev_t *dev, zs_stream_t *s, zs_gpt_config_t c, int B,
                           int act_dt, int gemm_dt, const mode_t_ *md, unsigned debug)
{
    fx_init_attn(f, dev, s, c, B, act_dt, gemm_dt, md, debug, ZS_GPT_ATTN_UNFUSED);
}

static inline void fx_free(fx_t *f)
{
    zs_gpt_destroy(f->g);
    zs_dev_free(f->dev, f->dw);
    zs_dev_free(f->dev, f->dgrad);
    free(f->off), free(f->w);
}

/* Tokens of micro-batch `mb` and one forward + backward (dloss 1),
 * accumulating into dgrad; returns the loss. */
static inline double fx_step(fx_t *f, int B, int T, int mb)
{
    zs_err_t err;
    int32_t *in = malloc((size_t)B * T * 4), *tg = malloc((size_t)B * T * 4);
    TEST_CHECK(in && tg);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)((i * 7 + 3 + 11 * mb) % f->c.vocab);
        tg[i] = (int32_t)((i * 13 + 5 + i / 3 + mb) % f->c.vocab);
    }
    TEST_OK(zs_gpt_set_tokens(f->g, in, tg, B, T, &err), err);
    free(in), free(tg);
    for (int i = 0; i < f->m->nlayers; i++) {
        void *p[2] = {f->dw + f->off[i], f->dw};
        TEST_OK(f->m->forward(f->m->self, i, p, &err), err);
    }
    double loss;
    TEST_OK(f->m->loss(f->m->self, &loss, &err), err);
    if (f->logits_out)
        TEST_OK(zs_gpt_copy_logits(f->g, f->logits_out, &err), err);
    for (int i = f->m->nlayers - 1; i >= 0; i--) {
        void *p[2] = {f->dw + f->off[i], f->dw};
        float *gr[2] = {f->dgrad + f->off[i], f->dgrad};
        TEST_OK(f->m->backward(f->m->self, i, p, gr, 1.0f, &err), err);
    }
    fx_sync(f);
    return loss;
}

#endif
