/*
 * zs_gpt_init.c - the GPT's initial parameters (zs_model_t.init_params):
 * GPT-2's initialisation (normal 0.02, residual projections 0.02/sqrt(2L),
 * biases 0, LayerNorm weights 1), each element a pure function of (seed,
 * unsplit layer, index) from a counter-based generator, so every worker
 * computes the same numbers in any thread count, and a split model's layers
 * (zs_gpt_split.c) draw exactly the numbers of their ranges of the
 * unsplit layers. Runs on the model's thread pool, in host memory.
 *
 * Not here: pretrained weights (zs_init_from_model.c wraps init_params).
 */
#include <math.h>

#include "zs_gpt_impl.h"

/* ---- initialisation: N(0, std) from a counter-based generator, so every
 * element is a pure function of (seed, layer, index) ---- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Standard normal number `i` of stream (seed, layer): Box-Muller on two
 * 53-bit uniforms in (0, 1]. */
static double normal_at(uint64_t seed, int layer, uint64_t i)
{
    uint64_t k = mix64(seed ^ mix64(0x5A5Aull + (uint64_t)layer)) ^ (i * 2);
    double u1 = ((double)(mix64(k) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(mix64(k ^ 1) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

typedef struct {
    float *p;
    uint64_t seed;
    int layer;
    size_t base; /* index of p[0] in the layer's stream */
    float std;
} init_job_t;

typedef struct {
    const init_job_t *j;
    size_t n, per;
} init_split_t;

static void init_range(void *arg, size_t task, int thread)
{
    (void)thread;
    const init_split_t *s = arg;
    size_t lo = task * s->per, hi = lo + s->per < s->n ? lo + s->per : s->n;
    for (size_t i = lo; i < hi; i++)
        s->j->p[i] =
            (float)(s->j->std * normal_at(s->j->seed, s->j->layer, (uint64_t)(s->j->base + i)));
}

static void fill_normal(zs_pool_t *pool, float *p, size_t n, uint64_t seed, int layer, size_t base,
                        float std)
{
    init_job_t j = {p, seed, layer, base, std};
    init_split_t s = {&j, n, 1 << 16};
    zs_pool_run(pool, (n + s.per - 1) / s.per, init_range, &s);
}

static void fill_const(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

/* Block l's initial values of its elements [lo, hi) into p (p[0] is
 * element lo): every tensor is whole inside one part, so a part takes the
 * tensors it holds. */
static void init_block(zs_gpt_t *g, int l, size_t lo, size_t hi, float *p)
{
    const block_off_t *o = &g->bo;
    size_t C = (size_t)g->c.width;
    float std = 0.02f, rstd = 0.02f / sqrtf(2.0f * (float)g->c.layers);
    struct {
        size_t off, n;
        int normal; /* 0: constant v; 1: N(0, v) */
        float v;
    } t[12] = {
        {o->ln1w, C, 0, 1.0f},     {o->ln1b, C, 0, 0.0f},         {o->qkvw, 3 * C * C, 1, std},
        {o->qkvb, 3 * C, 0, 0.0f}, {o->projw, C * C, 1, rstd},    {o->projb, C, 0, 0.0f},
        {o->ln2w, C, 0, 1.0f},     {o->ln2b, C, 0, 0.0f},         {o->fcw, 4 * C * C, 1, std},
        {o->fcb, 4 * C, 0, 0.0f},  {o->fcpw, 4 * C * C, 1, rstd}, {o->fcpb, C, 0, 0.0f}};
    for (int k = 0; k < 12; k++) {
        if (t[k].off < lo || t[k].off >= hi)
            continue;
        float *d = p + (t[k].off - lo);
        if (t[k].normal)
            fill_normal(g->pool, d, t[k].n, g->seed, l, t[k].off, t[k].v);
        else
            fill_const(d, t[k].n, t[k].v);
    }
}

int zs__gpt_init_params(void *self, int layer, float *p, zs_err_t *err)
{
    zs_gpt_t *g = self;
    size_t C = (size_t)g->c.width, V = (size_t)g->c.vocab, T = (size_t)g->c.ctx;
    if (layer < 0 || layer >= g->nl)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: no layer %d (model has %d)", layer, g->nl);
    const zs__gpt_layer_t *d = &g->lmap[layer];
    switch (d->kind) {
    case ZS__GL_EMB:
        fill_normal(g->pool, p, (V + T) * C, g->seed, 0, 0, 0.02f);
        break;
    case ZS__GL_WTE:
        fill_normal(g->pool, p, (size_t)d->rows * C, g->seed, 0, (size_t)d->v0 * C, 0.02f);
        break;
    case ZS__GL_WPE:
        fill_normal(g->pool, p, T * C, g->seed, 0, V * C, 0.02f);
        break;
    case ZS__GL_BLOCK:
        init_block(g, d->l, 0, g->bo.total, p);
        break;
    case ZS__GL_PART:
        init_block(g, d->l, zs__gpt_part_start(g, d->part), zs__gpt_part_start(g, d->part + 1), p);
        break;
    default: /* the head's LayerNorm */
        fill_const(p, C, 1.0f);
        fill_const(p + C, C, 0.0f);
    }
    return ZS_OK;
}
