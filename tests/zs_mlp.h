/*
 * zs_mlp.h - the engine's test model: a small MLP autoencoder with uneven
 * layer sizes and a tied output layer, plus deterministic synthetic data.
 *
 *   layer 0: h0 = tanh(x W0 + b0)        x: [B, IN], W0: [IN, H0]
 *   layer 1: h1 = tanh(h0 W1 + b1)       W1: [H0, H1]
 *   layer 2: h2 = tanh(h1 W2 + b2)       W2: [H1, H0]
 *   layer 3: out = h2 W0^T               no own parameters: reads layer 0's
 *                                        W0 (the "external parameter" case)
 *   loss = mean over samples of 0.5 * sum_j (out_j - y_j)^2
 * Sample s (global index) has x = U(-1,1)^IN from its index and
 * y = 0.5 * sin(2 x) reversed. Sizes are uneven on purpose (IN 37, H0 29,
 * H1 53: 4258 parameters) so buckets and partitions get padding.
 */
#ifndef ZS_MLP_H
#define ZS_MLP_H

#include "zs_engine.h"

#define ZS_MLP_IN   37
#define ZS_MLP_H0   29
#define ZS_MLP_H1   53
#define ZS_MLP_MAXB 64

typedef struct zs_mlp {
    zs_model_t model;
    size_t nparams[4];
    int dep3[2];
    const int *deps[4];
    int batch; /* samples in the current micro-batch */
    float x[ZS_MLP_MAXB][ZS_MLP_IN], y[ZS_MLP_MAXB][ZS_MLP_IN];
    float h0[ZS_MLP_MAXB][ZS_MLP_H0], h1[ZS_MLP_MAXB][ZS_MLP_H1], h2[ZS_MLP_MAXB][ZS_MLP_H0];
    float out[ZS_MLP_MAXB][ZS_MLP_IN];
    /* backward scratch: gradient w.r.t. each layer's output */
    float d2[ZS_MLP_MAXB][ZS_MLP_H0], d1[ZS_MLP_MAXB][ZS_MLP_H1], d0[ZS_MLP_MAXB][ZS_MLP_H0];
    double loss;
    int64_t inject_nan_step; /* put an inf into layer 1's gradient from this step (0: never) */
    int inject_nan_count;    /* ... for this many steps */
    int inject_rank;
    uint64_t cur_step;
    int cur_rank;
    zs_dev_t *dev;       /* from bind: the engine's device */
    zs_stream_t *stream; /* ... and compute stream */
} zs_mlp_t;

/* Set up the model (embeds its zs_model_t in m->model). */
void zs_mlp_init(zs_mlp_t *m);

/* The layers computed right away on the calling thread, on host pointers
 * (the single-process reference uses these; the engine's callbacks enqueue
 * them on the compute stream). Activations live in m (tiny fixed arrays,
 * not counted by the device allocator). */
int zs_mlp_forward_host(zs_mlp_t *m, int layer, float *const *p, zs_err_t *err);
int zs_mlp_backward_host(zs_mlp_t *m, int layer, float *const *p, float *const *g, float dloss,
                         zs_err_t *err);

/* Load explicit samples [first, first + n) as the current batch. */
void zs_mlp_load_samples(zs_mlp_t *m, int64_t first, int n);

#endif
