/*
 * zs_gpt.c - the reference GPT-2-style model on CPU (see zs_gpt.h), built
 * from the kernels of kernels/zs_gpt_ops.h.
 *
 * Engine layers: 0 embeddings, 1..L blocks, L+1 final LayerNorm + tied head
 * + loss. The forward of every layer keeps what its backward needs (per
 * block: ln1 and its mean/rstd, qkv, attention probabilities, attention
 * output, the residual after attention, ln2 and its mean/rstd, the MLP's
 * pre-activation and GELU output); the residual stream is kept per layer.
 * The backward keeps one running gradient of the residual stream (dres) and
 * one block's worth of scratch, reused by every block.
 *
 * Block math (x = input residual, y = output residual):
 *   a = ln1(x); qkv = a Wqkv + bqkv; o = attn(qkv); r = x + o Wo + bo
 *   m = ln2(r); h = gelu(m Wfc + bfc); y = r + h Wp + bp
 *
 * Calls must follow the engine's order: forward 0, 1, ..., L+1 on a loaded
 * batch, then backward L+1, ..., 0. Anything else is refused with ZS_ERR_STATE.
 *
 * Threads: one zs_pool of ZS_GPT_THREADS threads (environment; default all
 * online CPUs; zs_gpt_set_threads) runs every kernel; OpenBLAS runs
 * single-threaded inside the pool's tasks (see zs_gpt_ops.h).
 */
#include "zs_gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_ops.h"
#include "zs_pool.h"

/* Offsets (in floats) of a block's tensors, in zs_gpt.h's order. */
typedef struct {
    size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcpw, fcpb, total;
} block_off_t;

struct zs_gpt {
    zs_gpt_config_t c;
    int maxB;
    uint64_t seed;
    zs_pool_t *pool;
    zs_model_t model;
    size_t *nparams;
    const int **deps;
    int head_deps[2];
    block_off_t bo;

    const zs_data_t *data;
    int32_t *fixed_in, *fixed_tg; /* zs_gpt_set_fixed_tokens */
    int fixedB;

    int B, T;       /* current batch */
    int have_batch; /* tokens loaded */
    int next_fwd;   /* next layer forward expects (0 .. L+2) */
    int next_bwd;   /* next layer backward expects (-1 = none) */
    double loss;
    int32_t *inputs, *targets;

    /* activations; per-block arrays hold L slices of the max size */
    size_t maxN;      /* maxB * ctx */
    size_t att_slice; /* maxB * NH * ctx * ctx */
    float *resid;     /* (L+1) slices of maxN * C */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fchg;
    float *proj;                      /* maxN * C scratch */
    float *lnf, *lnf_mean, *lnf_rstd; /* head */
    float *logits, *lse, *losses;
    /* backward scratch */
    float *dres, *dbuf, *dqkv, *datt, *dfch, *dlogits;
    float *arena;
};

uint64_t zs_gpt_num_params(const zs_gpt_config_t *c)
{
    uint64_t C = (uint64_t)c->width;
    return (uint64_t)c->vocab * C + (uint64_t)c->ctx * C +
           (uint64_t)c->layers * (12 * C * C + 13 * C) + 2 * C;
}

static block_off_t block_offsets(size_t C)
{
    block_off_t o;
    size_t p = 0;
    o.ln1w = p, p += C;
    o.ln1b = p, p += C;
    o.qkvw = p, p += C * 3 * C;
    o.qkvb = p, p += 3 * C;
    o.projw = p, p += C * C;
    o.projb = p, p += C;
    o.ln2w = p, p += C;
    o.ln2b = p, p += C;
    o.fcw = p, p += C * 4 * C;
    o.fcb = p, p += 4 * C;
    o.fcpw = p, p += 4 * C * C;
    o.fcpb = p, p += C;
    o.total = p;
    return o;
}

int zs_gpt_num_tensors(const zs_gpt_config_t *c)
{
    return 2 + 12 * c->layers + 2;
}

int zs_gpt_tensor(const zs_gpt_config_t *c, int i, zs_gpt_tensor_t *t)
{
    static const char *names[12] = {"ln1_w",       "ln1_b",       "qkv_w",     "qkv_b",
                                    "attn_proj_w", "attn_proj_b", "ln2_w",     "ln2_b",
                                    "fc_w",        "fc_b",        "fc_proj_w", "fc_proj_b"};
    uint64_t C = (uint64_t)c->width, V = (uint64_t)c->vocab, T = (uint64_t)c->ctx;
    int L = c->layers;
    if (i < 0 || i >= zs_gpt_num_tensors(c))
        return ZS_ERR_RANGE;
    memset(t, 0, sizeof *t);
    if (i < 2) {
        t->layer = 0;
        snprintf(t->name, sizeof t->name, i == 0 ? "wte" : "wpe");
        t->rows = i == 0 ? V : T;
        t->cols = C;
        t->offset = i == 0 ? 0 : V * C;
    } else if (i < 2 + 12 * L) {
        int l = (i - 2) / 12, k = (i - 2) % 12;
        block_off_t o = block_offsets(C);
        const size_t offs[12] = {o.ln1w, o.ln1b, o.qkvw, o.qkvb, o.projw, o.projb,
                                 o.ln2w, o.ln2b, o.fcw,  o.fcb,  o.fcpw,  o.fcpb};
        const uint64_t rows[12] = {1, 1, C, 1, C, 1, 1, 1, C, 1, 4 * C, 1};
        const uint64_t cols[12] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
        t->layer = 1 + l;
        snprintf(t->name, sizeof t->name, "h%d.%s", l, names[k]);
        t->rows = rows[k];
        t->cols = cols[k];
        t->offset = (V + T) * C + (uint64_t)l * o.total + offs[k];
    } else {
        int k = i - 2 - 12 * L;
        t->layer = L + 1;
        snprintf(t->name, sizeof t->name, k == 0 ? "lnf_w" : "lnf_b");
        t->rows = 1;
        t->cols = C;
        t->offset = (V + T) * C + (uint64_t)L * (12 * C * C + 13 * C) + (uint64_t)k * C;
    }
    t->numel = t->rows * t->cols;
    return ZS_OK;
}

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

static int init_params(void *self, int layer, float *p, zs_err_t *err)
{
    zs_gpt_t *g = self;
    size_t C = (size_t)g->c.width, V = (size_t)g->c.vocab, T = (size_t)g->c.ctx;
    int L = g->c.layers;
    float std = 0.02f, rstd = 0.02f / sqrtf(2.0f * (float)L);
    if (layer == 0) {
        fill_normal(g->pool, p, (V + T) * C, g->seed, 0, 0, std);
    } else if (layer <= L) {
        const block_off_t *o = &g->bo;
        fill_const(p + o->ln1w, C, 1.0f);
        fill_const(p + o->ln1b, C, 0.0f);
        fill_normal(g->pool, p + o->qkvw, 3 * C * C, g->seed, layer, o->qkvw, std);
        fill_const(p + o->qkvb, 3 * C, 0.0f);
        fill_normal(g->pool, p + o->projw, C * C, g->seed, layer, o->projw, rstd);
        fill_const(p + o->projb, C, 0.0f);
        fill_const(p + o->ln2w, C, 1.0f);
        fill_const(p + o->ln2b, C, 0.0f);
        fill_normal(g->pool, p + o->fcw, 4 * C * C, g->seed, layer, o->fcw, std);
        fill_const(p + o->fcb, 4 * C, 0.0f);
        fill_normal(g->pool, p + o->fcpw, 4 * C * C, g->seed, layer, o->fcpw, rstd);
        fill_const(p + o->fcpb, C, 0.0f);
    } else if (layer == L + 1) {
        fill_const(p, C, 1.0f);
        fill_const(p + C, C, 0.0f);
    } else {
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: no layer %d (model has %d)", layer, L + 2);
    }
    return ZS_OK;
}

/* ---- batches ---- */

static int check_tokens(const zs_gpt_t *g, const int32_t *tok, size_t n, const char *what,
                        zs_err_t *err)
{
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= g->c.vocab)
            return zs_err_set(err, ZS_ERR_RANGE, "gpt: %s[%zu] = %d outside vocab 0..%d", what, i,
                              (int)tok[i], g->c.vocab - 1);
    return ZS_OK;
}

static int load_batch(void *self, const zs_batch_ctx_t *bc, zs_err_t *err)
{
    zs_gpt_t *g = self;
    int B = bc->micro_batch, T = g->c.ctx;
    if (B < 1 || B > g->maxB)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "gpt: micro batch %d outside 1..%d (max_batch of zs_gpt_create)", B,
                          g->maxB);
    if (g->fixed_in) {
        if (B != g->fixedB)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "gpt: micro batch %d but the fixed token batch has %d sequences", B,
                              g->fixedB);
        memcpy(g->inputs, g->fixed_in, (size_t)B * T * sizeof(int32_t));
        memcpy(g->targets, g->fixed_tg, (size_t)B * T * sizeof(int32_t));
    } else if (g->data) {
        for (int k = 0; k < B; k++) {
            int rc = zs_data_sample(g->data, zs_batch_sample(bc, k), T, g->inputs + (size_t)k * T,
                                    g->targets + (size_t)k * T, err);
            if (rc)
                return zs_err_prefix(err, "gpt: sample %lld: ", (long long)zs_batch_sample(bc, k));
        }
    } else {
        return zs_err_set(err, ZS_ERR_STATE,
                          "gpt: load_batch without data: call zs_gpt_set_data (or "
                          "zs_gpt_set_fixed_tokens) before training");
    }
    g->B = B;
    g->T = T;
    g->have_batch = 1;
    g->next_fwd = 0;
    g->next_bwd = -1;
    return ZS_OK;
}

int zs_gpt_set_tokens(zs_gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                      zs_err_t *err)
{
    if (B < 1 || B > g->maxB || T < 1 || T > g->c.ctx)
        return zs_err_set(err, ZS_ERR_RANGE, "gpt: batch %d x %d outside 1..%d x 1..%d", B, T,
                          g->maxB, g->c.ctx);
    size_t n = (size_t)B * T;
    if (check_tokens(g, inputs, n, "inputs", err) || check_tokens(g, targets, n, "targets", err))
        return err ? err->code : ZS_ERR_RANGE;
    memcpy(g->inputs, inputs, n * sizeof(int32_t));
    memcpy(g->targets, targets, n * sizeof(int32_t));
    g->B = B;
    g->T = T;
    g->have_batch = 1;
    g->next_fwd = 0;
    g->next_bwd = -1;
    return ZS_OK;
}

int zs_gpt_set_fixed_tokens(zs_gpt_t *g, const int32_t *inputs, const int32_t *targets, int B,
                            zs_err_t *err)
{
    free(g->fixed_in);
    free(g->fixed_tg);
    g->fixed_in = g->fixed_tg = NULL;
    g->fixedB = 0;
    if (!inputs)
        return ZS_OK;
    size_t n = (size_t)B * g->c.ctx;
    if (B < 1 || B > g->maxB)
        return zs_err_set(err, ZS_ERR_RANGE, "gpt: fixed batch of %d outside 1..%d", B, g->maxB);
    if (check_tokens(g, inputs, n, "inputs", err) || check_tokens(g, targets, n, "targets", err))
        return err ? err->code : ZS_ERR_RANGE;
    g->fixed_in = malloc(n * sizeof(int32_t));
    g->fixed_tg = malloc(n * sizeof(int32_t));
    if (!g->fixed_in || !g->fixed_tg) {
        free(g->fixed_in);
        free(g->fixed_tg);
        g->fixed_in = g->fixed_tg = NULL;
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: fixed batch: out of memory");
    }
    memcpy(g->fixed_in, inputs, n * sizeof(int32_t));
    memcpy(g->fixed_tg, targets, n * sizeof(int32_t));
    g->fixedB = B;
    return ZS_OK;
}

int zs_gpt_set_data(zs_gpt_t *g, const zs_data_t *data, zs_err_t *err)
{
    if (data && zs_data_vocab(data) != (uint32_t)g->c.vocab)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: token file vocab %u but the model's is %d",
                          zs_data_vocab(data), g->c.vocab);
    g->data = data;
    return ZS_OK;
}

/* ---- forward ---- */

static float *layer_slice(float *base, size_t per, int l)
{
    return base + (size_t)l * per;
}

static void block_forward(zs_gpt_t *g, int l, const float *p)
{
    zs_pool_t *pool = g->pool;
    const block_off_t *o = &g->bo;
    int B = g->B, T = g->T, C = g->c.width, NH = g->c.heads, N = B * T;
    size_t sN = g->maxN, i = (size_t)l - 1;
    const float *x = layer_slice(g->resid, sN * C, l - 1);
    float *y = layer_slice(g->resid, sN * C, l);
    float *ln1 = g->ln1 + i * sN * C, *qkv = g->qkv + i * sN * 3 * C;
    float *att = g->att + i * g->att_slice, *atty = g->atty + i * sN * C;
    float *res2 = g->res2 + i * sN * C, *ln2 = g->ln2 + i * sN * C;
    float *fch = g->fch + i * sN * 4 * C, *fchg = g->fchg + i * sN * 4 * C;

    zs_op_layernorm_fwd(pool, ln1, g->ln1_mean + i * sN, g->ln1_rstd + i * sN, x, p + o->ln1w,
                        p + o->ln1b, N, C);
    zs_op_matmul_fwd(pool, qkv, ln1, p + o->qkvw, p + o->qkvb, N, C, 3 * C);
    zs_op_attention_fwd(pool, atty, att, qkv, B, T, C, NH);
    zs_op_matmul_fwd(pool, g->proj, atty, p + o->projw, p + o->projb, N, C, C);
    zs_op_residual_fwd(pool, res2, x, g->proj, (size_t)N * C);
    zs_op_layernorm_fwd(pool, ln2, g->ln2_mean + i * sN, g->ln2_rstd + i * sN, res2, p + o->ln2w,
                        p + o->ln2b, N, C);
    zs_op_matmul_fwd(pool, fch, ln2, p + o->fcw, p + o->fcb, N, C, 4 * C);
    zs_op_gelu_fwd(pool, fchg, fch, (size_t)N * 4 * C);
    zs_op_matmul_fwd(pool, g->proj, fchg, p + o->fcpw, p + o->fcpb, N, 4 * C, C);
    zs_op_residual_fwd(pool, y, res2, g->proj, (size_t)N * C);
}

static int forward(void *self, int layer, float *const *params, zs_err_t *err)
{
    zs_gpt_t *g = self;
    int L = g->c.layers, C = g->c.width, V = g->c.vocab, N = g->B * g->T;
    if (layer < 0 || layer > L + 1)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: no layer %d (model has %d)", layer, L + 2);
    if (!g->have_batch)
        return zs_err_set(err, ZS_ERR_STATE,
                          "gpt: forward without a batch (load_batch or "
                          "zs_gpt_set_tokens first)");
    if (layer != 0 && layer != g->next_fwd)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: forward of layer %d, expected layer %d", layer,
                          g->next_fwd);
    const float *p = params[0];
    if (layer == 0) {
        zs_op_embed_fwd(g->pool, g->resid, g->inputs, p, p + (size_t)V * C, g->B, g->T, C);
    } else if (layer <= L) {
        block_forward(g, layer, p);
    } else {
        const float *wte = params[1];
        const float *x = layer_slice(g->resid, g->maxN * C, L);
        zs_op_layernorm_fwd(g->pool, g->lnf, g->lnf_mean, g->lnf_rstd, x, p, p + C, N, C);
        zs_op_gemm(g->pool, 0, 1, N, V, C, 1.0f, g->lnf, C, wte, C, 0.0f, g->logits, V);
        zs_op_xent_fwd(g->pool, g->losses, g->lse, g->logits, g->targets, N, V);
        double s = 0;
        for (int n = 0; n < N; n++)
            s += g->losses[n];
        g->loss = s / N;
    }
    g->next_fwd = layer + 1;
    g->next_bwd = layer == L + 1 ? L + 1 : -1;
    return ZS_OK;
}

static double loss(void *self)
{
    return ((zs_gpt_t *)self)->loss;
}

/* ---- backward ---- */

static void block_backward(zs_gpt_t *g, int l, const float *p, float *gr)
{
    zs_pool_t *pool = g->pool;
    const block_off_t *o = &g->bo;
    int B = g->B, T = g->T, C = g->c.width, NH = g->c.heads, N = B * T;
    size_t sN = g->maxN, i = (size_t)l - 1;
    const float *x = layer_slice(g->resid, sN * C, l - 1);
    const float *ln1 = g->ln1 + i * sN * C, *qkv = g->qkv + i * sN * 3 * C;
    const float *att = g->att + i * g->att_slice, *atty = g->atty + i * sN * C;
    const float *res2 = g->res2 + i * sN * C, *ln2 = g->ln2 + i * sN * C;
    const float *fch = g->fch + i * sN * 4 * C, *fchg = g->fchg + i * sN * 4 * C;

    /* dres = dL/dy on entry; y = r + h Wp + bp */
    zs_op_matmul_bwd(pool, g->dfch, gr + o->fcpw, gr + o->fcpb, g->dres, fchg, p + o->fcpw, N,
                     4 * C, C);
    zs_op_gelu_bwd(pool, g->dfch, fch, g->dfch, (size_t)N * 4 * C);
    zs_op_matmul_bwd(pool, g->dbuf, gr + o->fcw, gr + o->fcb, g->dfch, ln2, p + o->fcw, N, C,
                     4 * C);
    zs_op_layernorm_bwd(pool, g->dres, gr + o->ln2w, gr + o->ln2b, g->dbuf, res2, p + o->ln2w,
                        g->ln2_mean + i * sN, g->ln2_rstd + i * sN, N, C);
    /* dres = dL/dr; r = x + o Wo + bo */
    zs_op_matmul_bwd(pool, g->dbuf, gr + o->projw, gr + o->projb, g->dres, atty, p + o->projw, N, C,
                     C);
    zs_op_attention_bwd(pool, g->dqkv, g->datt, g->dbuf, qkv, att, B, T, C, NH);
    zs_op_matmul_bwd(pool, g->dbuf, gr + o->qkvw, gr + o->qkvb, g->dqkv, ln1, p + o->qkvw, N, C,
                     3 * C);
    zs_op_layernorm_bwd(pool, g->dres, gr + o->ln1w, gr + o->ln1b, g->dbuf, x, p + o->ln1w,
                        g->ln1_mean + i * sN, g->ln1_rstd + i * sN, N, C);
    /* dres = dL/dx */
}

static int backward(void *self, int layer, float *const *params, float *const *grads, float dloss,
                    zs_err_t *err)
{
    zs_gpt_t *g = self;
    int L = g->c.layers, C = g->c.width, V = g->c.vocab, N = g->B * g->T;
    if (layer < 0 || layer > L + 1)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: no layer %d (model has %d)", layer, L + 2);
    if (layer != g->next_bwd)
        return zs_err_set(err, ZS_ERR_STATE,
                          g->next_bwd < 0 ? "gpt: backward of layer %d before a full forward"
                                          : "gpt: backward of layer %d, expected layer %d",
                          layer, g->next_bwd);
    const float *p = params[0];
    float *gr = grads[0];
    if (layer == L + 1) {
        const float *wte = params[1];
        float *dwte = grads[1];
        const float *x = layer_slice(g->resid, g->maxN * C, L);
        zs_op_xent_bwd(g->pool, g->dlogits, g->logits, g->lse, g->targets, N, V, dloss / (float)N);
        zs_op_gemm(g->pool, 0, 0, N, C, V, 1.0f, g->dlogits, V, wte, C, 0.0f, g->dbuf, C);
        zs_op_gemm(g->pool, 1, 0, V, C, N, 1.0f, g->dlogits, V, g->lnf, C, 1.0f, dwte, C);
        memset(g->dres, 0, (size_t)N * C * sizeof(float));
        zs_op_layernorm_bwd(g->pool, g->dres, gr, gr + C, g->dbuf, x, p, g->lnf_mean, g->lnf_rstd,
                            N, C);
    } else if (layer >= 1) {
        block_backward(g, layer, p, gr);
    } else {
        zs_op_embed_bwd(g->pool, gr, gr + (size_t)V * C, g->dres, g->inputs, g->B, g->T, C);
    }
    g->next_bwd = layer - 1;
    return ZS_OK;
}

/* ---- life cycle ---- */

static int make_pool(zs_gpt_t *g, int n, zs_err_t *err)
{
    zs_pool_t *p = zs_pool_create(n);
    if (!p)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: cannot start %d threads", n);
    zs_pool_destroy(g->pool);
    g->pool = p;
    return ZS_OK;
}

int zs_gpt_set_threads(zs_gpt_t *g, int n, zs_err_t *err)
{
    return make_pool(g, n, err);
}

int zs_gpt_create(const zs_gpt_config_t *c, int max_batch, uint64_t seed, zs_gpt_t **out,
                  zs_err_t *err)
{
    *out = NULL;
    if (c->layers < 1 || c->heads < 1 || c->width < 1 || c->ctx < 1 || c->vocab < 1 ||
        c->width % c->heads != 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "gpt: bad config layers %d heads %d width %d ctx %d vocab %d (all > 0, "
                          "width a multiple of heads)",
                          c->layers, c->heads, c->width, c->ctx, c->vocab);
    if (max_batch < 1)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: max_batch %d < 1", max_batch);
    zs_gpt_t *g = calloc(1, sizeof *g);
    if (!g)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: out of memory");
    g->c = *c;
    g->maxB = max_batch;
    g->seed = seed;
    g->next_bwd = -1;
    int L = c->layers;
    size_t C = (size_t)c->width, V = (size_t)c->vocab, T = (size_t)c->ctx;
    g->bo = block_offsets(C);
    g->nparams = calloc((size_t)L + 2, sizeof *g->nparams);
    g->deps = calloc((size_t)L + 2, sizeof *g->deps);
    const char *env = getenv("ZS_GPT_THREADS");
    if (!g->nparams || !g->deps) {
        zs_gpt_destroy(g);
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: out of memory");
    }
    int rc = make_pool(g, env ? atoi(env) : 0, err);
    if (rc) {
        zs_gpt_destroy(g);
        return rc;
    }
    g->nparams[0] = (V + T) * C;
    for (int l = 1; l <= L; l++)
        g->nparams[l] = g->bo.total;
    g->nparams[L + 1] = 2 * C;
    g->head_deps[0] = 0;
    g->head_deps[1] = -1;
    g->deps[L + 1] = g->head_deps;

    size_t N = (size_t)max_batch * T, NHTT = (size_t)max_batch * c->heads * T * T;
    g->maxN = N;
    g->att_slice = NHTT;
    /* one arena; every array a multiple of 16 floats so all start 64-byte aligned */
#define A16(x) (((x) + 15) / 16 * 16)
    size_t sizes[] = {
        A16((L + 1) * N * C), /* resid */
        A16(L * N * C),
        A16(L * N),
        A16(L * N), /* ln1, mean, rstd */
        A16(L * N * 3 * C),
        A16(L * NHTT), /* qkv, att */
        A16(L * N * C),
        A16(L * N * C), /* atty, res2 */
        A16(L * N * C),
        A16(L * N),
        A16(L * N), /* ln2, mean, rstd */
        A16(L * N * 4 * C),
        A16(L * N * 4 * C), /* fch, fchg */
        A16(N * C),         /* proj */
        A16(N * C),
        A16(N),
        A16(N), /* lnf, mean, rstd */
        A16(N * V),
        A16(N),
        A16(N), /* logits, lse, losses */
        A16(N * C),
        A16(N * C),
        A16(N * 3 * C),
        A16(NHTT),
        A16(N * 4 * C),
        A16(N * V), /* dres, dbuf, dqkv, datt, dfch, dlogits */
    };
#undef A16
    float **ptrs[] = {&g->resid, &g->ln1,    &g->ln1_mean, &g->ln1_rstd, &g->qkv,      &g->att,
                      &g->atty,  &g->res2,   &g->ln2,      &g->ln2_mean, &g->ln2_rstd, &g->fch,
                      &g->fchg,  &g->proj,   &g->lnf,      &g->lnf_mean, &g->lnf_rstd, &g->logits,
                      &g->lse,   &g->losses, &g->dres,     &g->dbuf,     &g->dqkv,     &g->datt,
                      &g->dfch,  &g->dlogits};
    size_t total = 0, n = sizeof sizes / sizeof sizes[0];
    for (size_t k = 0; k < n; k++)
        total += sizes[k];
    g->arena = aligned_alloc(64, total * sizeof(float));
    g->inputs = malloc(N * sizeof(int32_t));
    g->targets = malloc(N * sizeof(int32_t));
    if (!g->arena || !g->inputs || !g->targets) {
        zs_gpt_destroy(g);
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: out of memory for %zu MiB of activations",
                          total * sizeof(float) >> 20);
    }
    float *q = g->arena;
    for (size_t k = 0; k < n; k++) {
        *ptrs[k] = q;
        q += sizes[k];
    }

    g->model.self = g;
    g->model.nlayers = L + 2;
    g->model.nparams = g->nparams;
    g->model.deps = (const int *const *)g->deps;
    g->model.init_params = init_params;
    g->model.load_batch = load_batch;
    g->model.forward = forward;
    g->model.loss = loss;
    g->model.backward = backward;
    zs_op_init();
    *out = g;
    return ZS_OK;
}

void zs_gpt_destroy(zs_gpt_t *g)
{
    if (!g)
        return;
    zs_pool_destroy(g->pool);
    free(g->arena);
    free(g->inputs);
    free(g->targets);
    free(g->fixed_in);
    free(g->fixed_tg);
    free(g->nparams);
    free(g->deps);
    free(g);
}

const zs_model_t *zs_gpt_model(zs_gpt_t *g)
{
    return &g->model;
}

const float *zs_gpt_logits(const zs_gpt_t *g)
{
    return g->logits;
}
