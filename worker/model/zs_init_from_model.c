/*
 * zs_init_from_model.c - the GPT with pretrained weights as its initial
 * parameters (zs_init_from_wrap): every callback is the inner model's,
 * except init_params, which converts the file's values of that engine
 * layer's flat range (zs_init_from_tensor) into the layer's host buffer. Every worker
 * reads the same file, so every worker gets the same numbers, as the
 * engine requires.
 *
 * Not here: reading the files (zs_init_from.c).
 */
#include <stdlib.h>
#include <string.h>

#include "zs_init_from_impl.h"

/* The wrapper behind a model's self. */
static zs_init_from_t *F(void *self)
{
    return self;
}

/* The file's values of engine layer `layer`'s flat range [lo, hi) (the
 * inner model's layer sizes in order, so a split model's layers work too):
 * each tensor inside the range is converted in place; one that straddles
 * it (a split embedding's vocabulary rows) through a buffer of the whole
 * tensor. */
static int init_params(void *self, int layer, float *params, zs_err_t *err)
{
    zs_init_from_t *f = F(self);
    uint64_t lo = 0;
    for (int i = 0; i < layer; i++)
        lo += f->inner.nparams[i];
    uint64_t hi = lo + f->inner.nparams[layer];
    for (int i = 0; i < zs_gpt_num_tensors(&f->cfg); i++) {
        zs_gpt_tensor_t t;
        zs_gpt_tensor(&f->cfg, i, &t);
        uint64_t a = t.offset, b = t.offset + t.numel;
        if (b <= lo || a >= hi)
            continue;
        if (a >= lo && b <= hi) {
            int rc = zs_init_from_tensor(f, &f->cfg, i, params + (a - lo), err);
            if (rc != ZS_OK)
                return rc;
            continue;
        }
        float *tmp = malloc(t.numel * sizeof *tmp);
        if (!tmp)
            return zs_err_set(err, ZS_ERR_NOMEM, "init-from: out of memory for %s", t.name);
        int rc = zs_init_from_tensor(f, &f->cfg, i, tmp, err);
        uint64_t x = a > lo ? a : lo, y = b < hi ? b : hi;
        if (rc == ZS_OK)
            memcpy(params + (x - lo), tmp + (x - a), (y - x) * sizeof *tmp);
        free(tmp);
        if (rc != ZS_OK)
            return rc;
    }
    return ZS_OK;
}

/* The inner model's bind. */
static int bind(void *self, zs_dev_t *dev, zs_stream_t *compute, zs_err_t *err)
{
    return F(self)->inner.bind(F(self)->inner.self, dev, compute, err);
}

/* The inner model's load_batch. */
static int load_batch(void *self, const zs_batch_ctx_t *b, zs_err_t *err)
{
    return F(self)->inner.load_batch(F(self)->inner.self, b, err);
}

/* The inner model's forward. */
static int forward(void *self, int layer, void *const *params, zs_err_t *err)
{
    return F(self)->inner.forward(F(self)->inner.self, layer, params, err);
}

/* The inner model's loss. */
static int loss(void *self, double *l, zs_err_t *err)
{
    return F(self)->inner.loss(F(self)->inner.self, l, err);
}

/* The inner model's backward. */
static int backward(void *self, int layer, void *const *params, float *const *grads, float dloss,
                    zs_err_t *err)
{
    return F(self)->inner.backward(F(self)->inner.self, layer, params, grads, dloss, err);
}

/* The inner model's set_param_dtype. */
static int set_param_dtype(void *self, int dt, zs_err_t *err)
{
    return F(self)->inner.set_param_dtype(F(self)->inner.self, dt, err);
}

/* The inner model with init_params from the file (zs_init_from.h). */
const zs_model_t *zs_init_from_wrap(zs_init_from_t *f, const zs_gpt_config_t *c,
                                    const zs_model_t *inner)
{
    f->cfg = *c;
    f->inner = *inner;
    f->model = *inner;
    f->model.self = f;
    f->model.init_params = init_params;
    f->model.bind = inner->bind ? bind : NULL;
    f->model.load_batch = inner->load_batch ? load_batch : NULL;
    f->model.set_param_dtype = inner->set_param_dtype ? set_param_dtype : NULL;
    f->model.forward = forward;
    f->model.loss = inner->loss ? loss : NULL;
    f->model.backward = backward;
    return &f->model;
}
