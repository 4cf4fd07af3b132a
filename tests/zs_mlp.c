/*
 * zs_mlp.c - forward/backward of the engine's test model (see zs_mlp.h).
 * Plain loops: this model checks the engine, not speed.
 */
#include "zs_mlp.h"
#include "zs_rand.h"

#include <math.h>
#include <string.h>

static int init_params(void *self, int layer, float *p, zs_err_t *err)
{
    static const int fan_in[3] = {ZS_MLP_IN, ZS_MLP_H0, ZS_MLP_H1};
    zs_mlp_t *m = self;
    float s = 1.0f / sqrtf((float)fan_in[layer]);
    for (size_t i = 0; i < m->nparams[layer]; i++)
        p[i] = s * zs_rand_unit(100 + (uint64_t)layer, i);
    return ZS_OK;
}

void zs_mlp_load_samples(zs_mlp_t *m, int64_t first, int n)
{
    m->batch = n;
    for (int b = 0; b < n; b++)
        for (int j = 0; j < ZS_MLP_IN; j++) {
            float x = zs_rand_unit(7, (uint64_t)(first + b) * ZS_MLP_IN + (uint64_t)j);
            m->x[b][j] = x;
            m->y[b][ZS_MLP_IN - 1 - j] = 0.5f * sinf(2.0f * x);
        }
}

/* ---- engine callbacks: each enqueues the host computation on the compute
 * stream, so it runs in order with the engine's gathers and reductions ---- */

typedef struct {
    zs_mlp_t *m;
    int64_t first;
    int n, rank;
    uint64_t step;
} load_args_t;

static int load_fn(void *args, zs_err_t *err)
{
    load_args_t *a = args;
    zs_mlp_load_samples(a->m, a->first, a->n);
    a->m->cur_step = a->step;
    a->m->cur_rank = a->rank;
    return ZS_OK;
}

static int load_batch(void *self, const zs_batch_ctx_t *bc, zs_err_t *err)
{
    zs_mlp_t *m = self;
    if (bc->micro_batch > ZS_MLP_MAXB)
        return zs_err_set(err, ZS_ERR_INVALID, "micro batch %d above %d", bc->micro_batch,
                          ZS_MLP_MAXB);
    load_args_t a = {m, zs_batch_sample(bc, 0), bc->micro_batch, bc->rank, bc->step};
    return zs_dev_host_fn(m->stream, load_fn, &a, sizeof a, err);
}

static int bind(void *self, zs_dev_t *dev, zs_stream_t *compute, zs_err_t *err)
{
    zs_mlp_t *m = self;
    m->dev = dev;
    m->stream = compute;
    return ZS_OK;
}

/* out[b][o] = act(in[b] . W[:, o] + bias[o]) for W [nin, nout] row-major. */
static void dense(int B, int nin, int nout, const float *in, int ld_in, const float *W,
                  const float *bias, float *out, int ld_out, int use_tanh)
{
    for (int b = 0; b < B; b++)
        for (int o = 0; o < nout; o++) {
            float s = bias ? bias[o] : 0.0f;
            for (int i = 0; i < nin; i++)
                s += in[b * ld_in + i] * W[i * nout + o];
            out[b * ld_out + o] = use_tanh ? tanhf(s) : s;
        }
}

int zs_mlp_forward_host(zs_mlp_t *m, int layer, float *const *p, zs_err_t *err)
{
    int B = m->batch;
    switch (layer) {
    case 0:
        dense(B, ZS_MLP_IN, ZS_MLP_H0, &m->x[0][0], ZS_MLP_IN, p[0], p[0] + ZS_MLP_IN * ZS_MLP_H0,
              &m->h0[0][0], ZS_MLP_H0, 1);
        break;
    case 1:
        dense(B, ZS_MLP_H0, ZS_MLP_H1, &m->h0[0][0], ZS_MLP_H0, p[0], p[0] + ZS_MLP_H0 * ZS_MLP_H1,
              &m->h1[0][0], ZS_MLP_H1, 1);
        break;
    case 2:
        dense(B, ZS_MLP_H1, ZS_MLP_H0, &m->h1[0][0], ZS_MLP_H1, p[0], p[0] + ZS_MLP_H1 * ZS_MLP_H0,
              &m->h2[0][0], ZS_MLP_H0, 1);
        break;
    case 3: { /* out = h2 W0^T, W0 = p[1] is [IN, H0] */
        const float *W0 = p[1];
        double loss = 0;
        for (int b = 0; b < B; b++)
            for (int j = 0; j < ZS_MLP_IN; j++) {
                float s = 0;
                for (int k = 0; k < ZS_MLP_H0; k++)
                    s += m->h2[b][k] * W0[j * ZS_MLP_H0 + k];
                m->out[b][j] = s;
                double d = (double)s - m->y[b][j];
                loss += 0.5 * d * d;
            }
        m->loss = loss / B;
        break;
    }
    default:
        return zs_err_set(err, ZS_ERR_INVALID, "no layer %d", layer);
    }
    return ZS_OK;
}

/* Backward of a tanh dense layer: dout is d(loss)/d(act output); fills
 * din (may be NULL) and accumulates dW, dbias. */
static void dense_back(int B, int nin, int nout, const float *in, int ld_in, const float *act,
                       const float *W, const float *dout, float *din, float *dW, float *dbias)
{
    float dz[ZS_MLP_H1];
    for (int b = 0; b < B; b++) {
        for (int o = 0; o < nout; o++) {
            float a = act[b * nout + o];
            dz[o] = dout[b * nout + o] * (1.0f - a * a);
            dbias[o] += dz[o];
        }
        for (int i = 0; i < nin; i++) {
            float s = 0;
            for (int o = 0; o < nout; o++) {
                dW[i * nout + o] += in[b * ld_in + i] * dz[o];
                s += W[i * nout + o] * dz[o];
            }
            if (din)
                din[b * nin + i] = s;
        }
    }
}

int zs_mlp_backward_host(zs_mlp_t *m, int layer, float *const *p, float *const *g, float dloss,
                         zs_err_t *err)
{
    int B = m->batch;
    float scale = dloss / (float)B; /* d(mean loss)/d(out) = (out - y) / B */
    switch (layer) {
    case 3: {
        const float *W0 = p[1];
        float *dW0 = g[1];
        for (int b = 0; b < B; b++) {
            float dout[ZS_MLP_IN];
            for (int j = 0; j < ZS_MLP_IN; j++)
                dout[j] = scale * (m->out[b][j] - m->y[b][j]);
            for (int k = 0; k < ZS_MLP_H0; k++) {
                float s = 0;
                for (int j = 0; j < ZS_MLP_IN; j++) {
                    s += dout[j] * W0[j * ZS_MLP_H0 + k];
                    dW0[j * ZS_MLP_H0 + k] += dout[j] * m->h2[b][k];
                }
                m->d2[b][k] = s;
            }
        }
        break;
    }
    case 2:
        dense_back(B, ZS_MLP_H1, ZS_MLP_H0, &m->h1[0][0], ZS_MLP_H1, &m->h2[0][0], p[0],
                   &m->d2[0][0], &m->d1[0][0], g[0], g[0] + ZS_MLP_H1 * ZS_MLP_H0);
        break;
    case 1:
        dense_back(B, ZS_MLP_H0, ZS_MLP_H1, &m->h0[0][0], ZS_MLP_H0, &m->h1[0][0], p[0],
                   &m->d1[0][0], &m->d0[0][0], g[0], g[0] + ZS_MLP_H0 * ZS_MLP_H1);
        if (m->inject_nan_step && (int64_t)m->cur_step >= m->inject_nan_step &&
            (int64_t)m->cur_step < m->inject_nan_step + m->inject_nan_count &&
            m->cur_rank == m->inject_rank)
            g[0][3] = INFINITY; /* an fp16 overflow, as a too large loss scale gives */
        break;
    case 0:
        dense_back(B, ZS_MLP_IN, ZS_MLP_H0, &m->x[0][0], ZS_MLP_IN, &m->h0[0][0], p[0],
                   &m->d0[0][0], NULL, g[0], g[0] + ZS_MLP_IN * ZS_MLP_H0);
        break;
    default:
        return zs_err_set(err, ZS_ERR_INVALID, "no layer %d", layer);
    }
    return ZS_OK;
}

typedef struct {
    zs_mlp_t *m;
    int layer, bwd;
    float dloss;
    float *p[2], *g[2];
} layer_args_t;

static int layer_fn(void *args, zs_err_t *err)
{
    layer_args_t *a = args;
    return a->bwd ? zs_mlp_backward_host(a->m, a->layer, a->p, a->g, a->dloss, err)
                  : zs_mlp_forward_host(a->m, a->layer, a->p, err);
}

static int forward(void *self, int layer, void *const *p, zs_err_t *err)
{
    zs_mlp_t *m = self;
    layer_args_t a = {m, layer, 0, 0, {p[0], layer == 3 ? p[1] : NULL}, {NULL, NULL}};
    return zs_dev_host_fn(m->stream, layer_fn, &a, sizeof a, err);
}

static int backward(void *self, int layer, void *const *p, float *const *g, float dloss,
                    zs_err_t *err)
{
    zs_mlp_t *m = self;
    int two = layer == 3;
    layer_args_t a = {m, layer, 1, dloss, {p[0], two ? p[1] : NULL}, {g[0], two ? g[1] : NULL}};
    return zs_dev_host_fn(m->stream, layer_fn, &a, sizeof a, err);
}

static int loss(void *self, double *out, zs_err_t *err)
{
    zs_mlp_t *m = self;
    int rc = zs_dev_stream_sync(m->stream, err);
    *out = m->loss;
    return rc;
}

void zs_mlp_init(zs_mlp_t *m)
{
    memset(m, 0, sizeof *m);
    m->nparams[0] = ZS_MLP_IN * ZS_MLP_H0 + ZS_MLP_H0;
    m->nparams[1] = ZS_MLP_H0 * ZS_MLP_H1 + ZS_MLP_H1;
    m->nparams[2] = ZS_MLP_H1 * ZS_MLP_H0 + ZS_MLP_H0;
    m->nparams[3] = 0;
    m->dep3[0] = 0;
    m->dep3[1] = -1;
    m->deps[3] = m->dep3;
    m->model.self = m;
    m->model.nlayers = 4;
    m->model.nparams = m->nparams;
    m->model.deps = m->deps;
    m->model.init_params = init_params;
    m->model.bind = bind;
    m->model.load_batch = load_batch;
    m->model.forward = forward;
    m->model.loss = loss;
    m->model.backward = backward;
}
