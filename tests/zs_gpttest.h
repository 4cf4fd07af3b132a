/*
 * zs_gpttest.h - GPT helpers shared by the GPU tests that hold a CUDA run
 * of the model to a CPU run (test_gpt_cuda.c, test_train_cuda.c): the
 * model's initial weights, and the parameter difference that AdamW allows.
 * Header only; like all test code it stops the test on failure.
 */
#ifndef ZS_GPTTEST_H
#define ZS_GPTTEST_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "zs_gpt.h"
#include "zs_test.h"

/* The flat initial parameters of config c for `seed` (init_params of every
 * layer: what the engine starts from). zs_gpt_num_params(&c) floats;
 * caller frees with free(). */
static inline float *zs_gpttest_init_weights(zs_gpt_config_t c, uint64_t seed)
{
    zs_err_t err;
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, 1, seed, &g, &err), err);
    const zs_model_t *m = zs_gpt_model(g);
    uint64_t P = zs_gpt_num_params(&c), off = 0;
    float *w = malloc(P * sizeof *w);
    TEST_CHECK(w);
    for (int i = 0; i < m->nlayers; i++) {
        TEST_OK(m->init_params(m->self, i, w + off, &err), err);
        off += m->nparams[i];
    }
    zs_gpt_destroy(g);
    return w;
}

/* ||a - b|| / ||b - w0|| over every parameter except the attention's key
 * biases (h*.qkv_b[C..2C)): adding a constant to a key bias adds the same
 * number to every score of a query row, which softmax ignores, so their
 * gradient is zero in exact arithmetic and rounding noise in fp32; AdamW
 * turns that noise into steps of +-lr whose signs differ between two
 * summation orders. Every other element moves with its gradient. a, b and
 * w0 hold zs_gpt_num_params(c) floats; INFINITY when b did not move. */
static inline double zs_gpttest_rel_update_diff(const zs_gpt_config_t *c, const float *w0,
                                                const float *a, const float *b)
{
    uint64_t P = zs_gpt_num_params(c), C = (uint64_t)c->width;
    double dd = 0, du = 0;
    for (uint64_t k = 0; k < P; k++) {
        double d = (double)a[k] - b[k], u = (double)b[k] - w0[k];
        dd += d * d;
        du += u * u;
    }
    for (int l = 0; l < c->layers; l++) {
        zs_gpt_tensor_t t;
        if (zs_gpt_tensor(c, 2 + 12 * l + 3, &t) != ZS_OK)
            continue;
        for (uint64_t k = t.offset + C; k < t.offset + 2 * C; k++) {
            double d = (double)a[k] - b[k], u = (double)b[k] - w0[k];
            dd -= d * d;
            du -= u * u;
        }
    }
    return du > 0 ? sqrt(fmax(dd, 0) / du) : INFINITY;
}

#endif
