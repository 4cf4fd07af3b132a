/*
 * zs_gpt.c - the reference GPT-2-style model (see zs_gpt.h): layer wiring
 * over an op table (zs_gpt_ops_table.h) on a device (zs_dev.h).
 *
 * Engine layers: 0 embeddings, 1..L blocks, L+1 final LayerNorm + tied head
 * + loss, or the finer layers of a split model (zs_gpt_split.c: the
 * embedding by vocabulary rows, each block in the four parts of
 * zs_gpt_block.c); forward_layer and backward_layer dispatch on what each
 * engine layer is. Parameters are fp32 or the engine's 16-bit dtype
 * (zs_gpt_param16.c converts them one tensor at a time); initial values
 * come from zs_gpt_init.c. The forward of every layer keeps what its backward needs (per
 * block: ln1 and its mean/rstd, qkv, attention probabilities, attention
 * output, the residual after attention, ln2 and its mean/rstd, the MLP's
 * pre-activation and GELU output); the residual stream is kept per layer.
 * The backward keeps one running gradient of the residual stream (dres) and
 * one block's worth of scratch, reused by every block. With activation
 * checkpointing (zs_gpt_ckpt.c) the forward keeps only each block's input
 * and one shared block workspace, and each block's backward first
 * recomputes the block's forward from its input (zs__gpt_ckpt_recompute).
 * With 16-bit activations (zs_gpt_act16.c) the residual slots and the saved
 * tensors are kept in bf16/fp16: each is rounded right after the op that
 * writes it (zs__gpt_round, zs__gpt_resid_store) and read back through one
 * fp32 block workspace (zs__gpt_resid_in, zs__gpt_act_restore).
 *
 * Block math (x = input residual, y = output residual):
 *   a = ln1(x); qkv = a Wqkv + bqkv; o = attn(qkv); r = x + o Wo + bo
 *   m = ln2(r); h = gelu(m Wfc + bfc); y = r + h Wp + bp
 *
 * Memory and streams: create allocates only host bookkeeping. bind (the
 * engine's first call after init_params, or zs_gpt_bind) picks the op table
 * for the device and allocates through zs_dev_alloc, all in device space:
 * one arena of activations (ZS_MEM_ACTIVATIONS: saved tensors, logits,
 * per-row losses, the token ids) and one of scratch (ZS_MEM_SCRATCH: the
 * projection output and the backward's gradients); plus pinned host staging
 * (ZS_MEM_SCRATCH) for token uploads and for the per-row losses coming back,
 * and with cpu_checkpointing the pinned checkpoints (ZS_MEM_ACTIVATIONS,
 * zs_gpt_ckpt.c). Every op, copy and memset is enqueued on the compute
 * stream given to bind, in call order; nothing is computed on the calling
 * thread, and parameters/gradients are the caller's device pointers, read
 * and written only by that queued work. Tokens are written to the pinned
 * buffer on the host and copied to the device on the stream; an event
 * recorded after that copy is waited for before the pinned buffer is written
 * again. Only loss(), zs_gpt_copy_logits and zs_gpt_set_threads wait for the
 * stream; destroy waits for an event recorded after each forward/backward
 * instead, so it may come after the stream's destruction.
 *
 * Calls must follow the engine's order: forward 0, 1, ..., L+1 on a loaded
 * batch, then backward L+1, ..., 0. Anything else is refused with
 * ZS_ERR_STATE (checked on the host at enqueue time).
 *
 * Threads (CPU device): one zs_pool of ZS_GPT_THREADS threads (environment;
 * default all online CPUs; zs_gpt_set_threads) runs every kernel from the
 * stream's thread; OpenBLAS runs single-threaded inside the pool's tasks
 * (see zs_gpt_ops.h). init_params also runs on the pool, on the caller.
 */
#include "zs_gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_impl.h"
#include "zs_gpt_ops.h"
#include "zs_gpt_ops_prof.h"

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

static int require_bound(const zs_gpt_t *g, const char *what, zs_err_t *err)
{
    if (!g->dev)
        return zs_err_set(err, ZS_ERR_STATE,
                          "gpt: %s before bind (the engine binds the model to its device; "
                          "tests call zs_gpt_bind)",
                          what);
    return ZS_OK;
}

/* The pinned staging buffer, once the upload that last read it has run. */
static int staging(zs_gpt_t *g, int32_t **out, zs_err_t *err)
{
    int rc = zs_dev_event_sync(g->tok_ev, err);
    if (rc) {
        zs_err_prefix(err, "gpt: token upload: ");
        return rc;
    }
    *out = g->tok_pin;
    return ZS_OK;
}

/* Enqueue the upload of B*T inputs and targets from the staging buffer and
 * make (B, T) the current batch. */
static int upload_tokens(zs_gpt_t *g, int B, int T, zs_err_t *err)
{
    size_t bytes = (size_t)B * T * sizeof(int32_t);
    TRY(zs_dev_memcpy(g->stream, g->inputs, g->tok_pin, bytes, err));
    TRY(zs_dev_memcpy(g->stream, g->targets, g->tok_pin + g->maxN, bytes, err));
    TRY(zs_dev_event_record(g->tok_ev, g->stream, err));
    g->B = B;
    g->T = T;
    g->have_batch = 1;
    g->have_head = 0;
    g->next_fwd = 0;
    g->next_bwd = -1;
    return ZS_OK;
}

static int load_batch(void *self, const zs_batch_ctx_t *bc, zs_err_t *err)
{
    zs_gpt_t *g = self;
    int B = bc->micro_batch, T = g->c.ctx;
    TRY(require_bound(g, "load_batch", err));
    if (B < 1 || B > g->maxB)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "gpt: micro batch %d outside 1..%d (max_batch of zs_gpt_create)", B,
                          g->maxB);
    if (g->fixed_in && B != g->fixedB)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "gpt: micro batch %d but the fixed token batch has %d sequences", B,
                          g->fixedB);
    if (!g->fixed_in && !g->data)
        return zs_err_set(err, ZS_ERR_STATE,
                          "gpt: load_batch without data: call zs_gpt_set_data (or "
                          "zs_gpt_set_fixed_tokens) before training");
    int32_t *pin;
    TRY(staging(g, &pin, err));
    if (g->fixed_in) {
        memcpy(pin, g->fixed_in, (size_t)B * T * sizeof(int32_t));
        memcpy(pin + g->maxN, g->fixed_tg, (size_t)B * T * sizeof(int32_t));
    } else {
        for (int k = 0; k < B; k++) {
            int rc = zs_data_sample(g->data, zs_batch_sample(bc, k), T, pin + (size_t)k * T,
                                    pin + g->maxN + (size_t)k * T, err);
            if (rc) {
                zs_err_prefix(err, "gpt: sample %lld: ", (long long)zs_batch_sample(bc, k));
                return rc;
            }
        }
    }
    return upload_tokens(g, B, T, err);
}

int zs_gpt_set_tokens(zs_gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                      zs_err_t *err)
{
    TRY(require_bound(g, "zs_gpt_set_tokens", err));
    if (B < 1 || B > g->maxB || T < 1 || T > g->c.ctx)
        return zs_err_set(err, ZS_ERR_RANGE, "gpt: batch %d x %d outside 1..%d x 1..%d", B, T,
                          g->maxB, g->c.ctx);
    size_t n = (size_t)B * T;
    if (check_tokens(g, inputs, n, "inputs", err) || check_tokens(g, targets, n, "targets", err))
        return err ? err->code : ZS_ERR_RANGE;
    int32_t *pin;
    TRY(staging(g, &pin, err));
    memcpy(pin, inputs, n * sizeof(int32_t));
    memcpy(pin + g->maxN, targets, n * sizeof(int32_t));
    return upload_tokens(g, B, T, err);
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

static int head_forward(zs_gpt_t *g, const void *p, void *const *wdeps, zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    void *k = ops->ctx;
    zs_stream_t *s = g->stream;
    int L = g->c.layers, C = g->c.width, V = g->c.vocab, N = g->B * g->T;
    const float *x, *w, *b;
    TRY(zs__gpt_resid_in(g, L, &x, err));
    TRY(zs__gpt_param(g, p, 0, (size_t)C, 0, &w, err));
    TRY(zs__gpt_param(g, p, (size_t)C, (size_t)C, (size_t)C, &b, err));
    TRY(ops->layernorm_fwd(k, s, g->lnf, g->lnf_mean, g->lnf_rstd, x, w, b, N, C, err));
    TRY(zs__gpt_head_gemms(g, wdeps, 0, err));
    TRY(ops->xent_fwd(k, s, g->losses, g->lse, g->logits, g->targets, N, V, ZS_GPT_LOGITS_LD(V),
                      err));
    return ZS_OK;
}

/* Record done_ev after the work a forward or backward has just enqueued
 * (also after a partial enqueue that failed), so destroy can wait for the
 * model's work without the stream, which may be gone by then. Returns rc,
 * or the record's error where rc is ZS_OK. */
static int mark(zs_gpt_t *g, int rc, zs_err_t *err)
{
    int mrc = zs_dev_event_record(g->done_ev, g->stream, rc ? NULL : err);
    return rc ? rc : mrc;
}

/* Enqueue engine layer d's forward; *done: the model layer (0: the
 * embeddings, l: block l) whose output it completed, or -1. */
static int forward_layer(zs_gpt_t *g, const zs__gpt_layer_t *d, void *const *params, int *done,
                         zs_err_t *err)
{
    const void *p = params[0];
    const float *x = NULL;
    zs__gpt_bp_t bp = {{NULL, NULL, NULL, NULL}};
    *done = -1;
    switch (d->kind) {
    case ZS__GL_EMB:
        *done = 0;
        if (g->pdt == ZS_DTYPE_F32) /* the lookup reads wte and wpe in place */
            return g->ops->embed_fwd(g->ops->ctx, g->stream, zs__gpt_resid_out(g, 0), g->inputs, p,
                                     (const float *)p + (size_t)g->c.vocab * g->c.width, g->B, g->T,
                                     g->c.width, err);
        TRY(zs__gpt_embed_begin(g, err));
        TRY(zs__gpt_embed_rows(g, p, 0, g->c.vocab, err));
        return zs__gpt_embed_finish(
            g, (const char *)p + (size_t)g->c.vocab * g->c.width * zs_dtype_size(g->pdt),
            zs__gpt_resid_out(g, 0), err);
    case ZS__GL_WTE:
        if (d->v0 == 0)
            TRY(zs__gpt_embed_begin(g, err));
        return zs__gpt_embed_rows(g, p, d->v0, d->rows, err);
    case ZS__GL_WPE:
        *done = 0;
        return zs__gpt_embed_finish(g, p, zs__gpt_resid_out(g, 0), err);
    case ZS__GL_BLOCK:
        *done = d->l;
        TRY(zs__gpt_resid_in(g, d->l - 1, &x, err));
        zs__gpt_bp_whole(g, p, &bp);
        return zs__gpt_block_fwd(g, d->l, &bp, x, zs__gpt_resid_out(g, d->l), 1, err);
    case ZS__GL_PART:
        *done = d->part == 3 ? d->l : -1;
        if (d->part < 2) /* LayerNorm 1's input, the attention residual */
            TRY(zs__gpt_resid_in(g, d->l - 1, &x, err));
        bp.p[d->part] = p;
        return zs__gpt_block_part_fwd(g, d->l, d->part, &bp, x, zs__gpt_resid_out(g, d->l), err);
    default:
        return head_forward(g, p, params + 1, err);
    }
}

static int forward(void *self, int layer, void *const *params, zs_err_t *err)
{
    zs_gpt_t *g = self;
    if (layer < 0 || layer >= g->nl)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: no layer %d (model has %d)", layer, g->nl);
    TRY(require_bound(g, "forward", err));
    if (!g->have_batch)
        return zs_err_set(err, ZS_ERR_STATE,
                          "gpt: forward without a batch (load_batch or "
                          "zs_gpt_set_tokens first)");
    if (layer != 0 && layer != g->next_fwd)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: forward of layer %d, expected layer %d", layer,
                          g->next_fwd);
    if (layer == 0)
        g->have_head = 0;
    int done, head = g->lmap[layer].kind == ZS__GL_HEAD;
    int rc = forward_layer(g, &g->lmap[layer], params, &done, err);
    if (rc == ZS_OK && done >= 0)
        rc = zs__gpt_resid_store(g, done, err);
    if (rc == ZS_OK && done >= 0)
        rc = zs__gpt_ckpt_after_fwd(g, done, err);
    TRY(mark(g, rc, err));
    g->have_head = head;
    g->logits_gone = 0;
    g->next_fwd = layer + 1;
    g->next_bwd = head ? layer : -1;
    return ZS_OK;
}

/* Mean of the per-row losses, summed in row order in double on the host
 * after the stream has run the head. */
static int loss(void *self, double *out, zs_err_t *err)
{
    zs_gpt_t *g = self;
    if (!g->have_head)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: loss before the forward of the head layer");
    int N = g->B * g->T;
    TRY(zs_dev_memcpy(g->stream, g->loss_pin, g->losses, (size_t)N * sizeof(float), err));
    int rc = zs_dev_stream_sync(g->stream, err);
    if (rc) {
        zs_err_prefix(err, "gpt: loss: ");
        return rc;
    }
    double s = 0;
    for (int n = 0; n < N; n++)
        s += g->loss_pin[n];
    *out = s / N;
    return ZS_OK;
}

int zs_gpt_copy_logits(zs_gpt_t *g, float *host_out, zs_err_t *err)
{
    if (!g->have_head)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: no logits: run the forward of every layer");
    if (g->logits_gone)
        return zs_err_set(err, ZS_ERR_STATE,
                          "gpt: no logits: the backward overwrote them with their gradient "
                          "(copy them before the backward)");
    /* rows ZS_GPT_LOGITS_LD(V) floats apart on the device: copy up to 64 of
     * them at a time into a bounded buffer (13 MB at GPT-2's vocabulary,
     * however many rows), then drop each row's padding */
    enum { ROWS = 64 };
    size_t V = (size_t)g->c.vocab, ld = ZS_GPT_LOGITS_LD(V), rows = (size_t)g->B * g->T;
    float *tmp = malloc((rows < ROWS ? rows : ROWS) * ld * sizeof(float));
    if (!tmp)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: logits: out of host memory");
    int rc = ZS_OK;
    for (size_t r0 = 0; r0 < rows && !rc; r0 += ROWS) {
        size_t k = rows - r0 < ROWS ? rows - r0 : ROWS;
        rc = zs_dev_memcpy(g->stream, tmp, g->logits + r0 * ld, k * ld * sizeof(float), err);
        if (!rc)
            rc = zs_dev_stream_sync(g->stream, err);
        for (size_t r = 0; r < k && !rc; r++)
            memcpy(host_out + (r0 + r) * V, tmp + r * ld, V * sizeof(float));
    }
    free(tmp);
    if (rc) {
        zs_err_prefix(err, "gpt: logits: ");
        return rc;
    }
    return ZS_OK;
}

/* ---- backward ---- */

/* dwte: the tied wte's gradient (unsplit), or NULL (the wte layers
 * compute it, zs__gpt_wte_bwd). */
static int head_backward(zs_gpt_t *g, const void *p, float *gr, void *const *wdeps, float *dwte,
                         float dloss, zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    void *k = ops->ctx;
    zs_stream_t *s = g->stream;
    int L = g->c.layers, C = g->c.width, V = g->c.vocab, N = g->B * g->T;
    const float *x, *w;
    TRY(zs__gpt_resid_in(g, L, &x, err));
    int ld = ZS_GPT_LOGITS_LD(V);
    size_t nd = (size_t)N * ld;
    /* With the padded head (16-bit GEMMs) and the tied wte's gradient taken
     * here (unsplit), only the two GEMMs below read the logits' gradient,
     * as their 16-bit operand A: the cross-entropy's backward writes that
     * straight into the first piece of the mixed scratch, which each GEMM
     * carves for A and, given it as A's twin, leaves alone (zs_mixed.h;
     * the dwte GEMM's A ends before the last row's padding, where its B
     * piece may start: the dX GEMM, which reads it, has run by then). No
     * fp32 gradient, no two rounding passes over it. */
    zs__gpt_twins_t tw = {.n = 0};
    g->dlogits16 = NULL;
    if (g->wte16p && dwte && zs__gpt_dtwins_on(g) && g->mixed.cap >= nd) {
        g->dlogits16 = g->mixed_arena;
        tw.t[tw.n++] = (zs_mixed_twin_t){g->dlogits, g->dlogits16, nd, 1};
    }
    TRY(zs__gpt_twins_set(g, &tw, err));
    TRY(ops->xent_bwd(k, s, g->dlogits, g->logits, g->lse, g->targets, N, V, ld, dloss / (float)N,
                      err));
    TRY(zs__gpt_head_gemms(g, wdeps, 1, err));
    if (dwte) {
        if (g->dlogits16)
            tw.t[tw.n++] = (zs_mixed_twin_t){g->dlogits, g->dlogits16, nd};
        TRY(zs__gpt_twins_set(g, &tw, err));
        TRY(ops->gemm(k, s, 1, 0, V, C, N, 1.0f, g->dlogits, ld, g->lnf, C, 1.0f, dwte, C, err));
    }
    g->dlogits16 = NULL;
    TRY(zs_dev_memset(s, g->dres, 0, (size_t)N * C * sizeof(float), err));
    TRY(zs__gpt_param(g, p, 0, (size_t)C, 0, &w, err));
    TRY(ops->layernorm_bwd(k, s, g->dres, gr, gr + C, g->dbuf, x, w, g->lnf_mean, g->lnf_rstd, N, C,
                           err));
    return ZS_OK;
}

/* Enqueue engine layer d's backward. */
static int backward_layer(zs_gpt_t *g, const zs__gpt_layer_t *d, void *const *params,
                          float *const *grads, float dloss, zs_err_t *err)
{
    const void *p = params[0];
    float *gr = grads[0];
    int V = g->c.vocab, C = g->c.width;
    zs__gpt_bp_t bp = {{NULL, NULL, NULL, NULL}};
    switch (d->kind) {
    case ZS__GL_HEAD:
        g->logits_gone = g->dlogits == g->logits;
        return head_backward(g, p, gr, params + 1, g->wte_rows ? NULL : grads[1], dloss, err);
    case ZS__GL_BLOCK:
        zs__gpt_bp_whole(g, p, &bp);
        TRY(zs__gpt_block_bwd_begin(g, d->l, &bp, err));
        for (int k = 3; k >= 0; k--)
            TRY(zs__gpt_block_part_bwd(g, d->l, k, &bp, gr + zs__gpt_part_start(g, k), err));
        return ZS_OK;
    case ZS__GL_PART:
        bp.p[d->part] = p;
        if (d->part == 3) { /* the block's first backward call; deps: parts 0-2 */
            for (int k = 0; k < 3; k++)
                bp.p[k] = params[1 + k];
            TRY(zs__gpt_block_bwd_begin(g, d->l, &bp, err));
        }
        return zs__gpt_block_part_bwd(g, d->l, d->part, &bp, gr, err);
    case ZS__GL_WPE:
        return zs__gpt_wpe_bwd(g, gr, err);
    case ZS__GL_WTE:
        return zs__gpt_wte_bwd(g, d->v0, d->rows, gr, err);
    default:
        return g->ops->embed_bwd(g->ops->ctx, g->stream, gr, gr + (size_t)V * C, g->dres, g->inputs,
                                 g->B, g->T, C, err);
    }
}

static int backward(void *self, int layer, void *const *params, float *const *grads, float dloss,
                    zs_err_t *err)
{
    zs_gpt_t *g = self;
    if (layer < 0 || layer >= g->nl)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: no layer %d (model has %d)", layer, g->nl);
    if (layer != g->next_bwd)
        return zs_err_set(err, ZS_ERR_STATE,
                          g->next_bwd < 0 ? "gpt: backward of layer %d before a full forward"
                                          : "gpt: backward of layer %d, expected layer %d",
                          layer, g->next_bwd);
    int rc = backward_layer(g, &g->lmap[layer], params, grads, dloss, err);
    TRY(mark(g, rc, err));
    g->next_bwd = layer - 1;
    return ZS_OK;
}

/* ---- device binding ---- */

/* The op table for dev's kind: the CPU's runs on g->pool; the CUDA one
 * (built with ZS_WITH_CUDA) launches kernels on the stream's GPU. */
static int ops_for_device(zs_gpt_t *g, zs_dev_t *dev, zs_gpt_ops_t **out, zs_err_t *err)
{
    int rc = ZS_ERR_INVALID;
    if (!strcmp(dev->vt->name, "cpu"))
        rc = zs_gpt_ops_cpu_create(g->pool, out, err);
#ifdef ZS_WITH_CUDA
    else if (!strcmp(dev->vt->name, "cuda"))
        rc = zs_gpt_ops_cuda_create(dev, out, err);
#endif
    else
        return zs_err_set(err, ZS_ERR_INVALID, "GPT ops for device %s are not built",
                          dev->vt->name);
    /* ZS_GPT_PROFILE=1: time every op (zs_gpt_ops_prof.c; a measuring aid) */
    const char *prof = getenv("ZS_GPT_PROFILE");
    if (rc == ZS_OK && prof && !strcmp(prof, "1"))
        rc = zs_gpt_ops_prof_wrap(*out, out, err);
    return rc;
}

/* One tensor of an arena: where its pointer goes and its size in floats
 * (4-byte elements: int32 token ids too). */
typedef struct {
    float **ptr;
    size_t n;
} slot_t;

/* One allocation of device memory for category `cat`, carved into the
 * slots in order, each rounded up to 16 floats so every tensor starts
 * 64-byte aligned. */
static int carve(zs_gpt_t *g, int cat, const slot_t *slots, size_t nslots, float **arena,
                 zs_err_t *err)
{
    size_t total = 0;
    for (size_t k = 0; k < nslots; k++)
        total += (slots[k].n + 15) / 16 * 16;
    void *mem;
    int rc = zs_dev_alloc(g->dev, ZS_SPACE_DEVICE, cat, total * sizeof(float), &mem, err);
    if (rc) {
        zs_err_prefix(err, "gpt: %zu MiB of %s: ", total * sizeof(float) >> 20,
                      zs_memcat_name(cat));
        return rc;
    }
    *arena = mem;
    float *q = mem;
    for (size_t k = 0; k < nslots; k++) {
        *slots[k].ptr = q;
        q += (slots[k].n + 15) / 16 * 16;
    }
    return ZS_OK;
}

static int alloc_buffers(zs_gpt_t *g, zs_err_t *err)
{
    size_t C = (size_t)g->c.width, V = (size_t)g->c.vocab;
    size_t N = g->maxN, NHTT = g->att_slice;
    /* per-block tensors: L slices, or one workspace with checkpointing or
     * 16-bit activations (LayerNorm statistics: L, or 1 with checkpointing);
     * residual slots: L + 1, or 2 when the checkpoints are pinned */
    int a16 = g->act_dt != ZS_DTYPE_F32;
    size_t L = g->ckpt || a16 ? 1 : (size_t)g->c.layers, Ls = g->ckpt ? 1 : (size_t)g->c.layers;
    size_t R = g->ckpt_cpu ? 2 : (size_t)g->c.layers + 1;
    /* 16-bit activations (zs_gpt_act16.c): the fp32 residual slots are one
     * slice (the view read) and the saved tensors and residual slots are
     * kept in 16-bit arrays (Lh slices, none with checkpointing; R slots); sizes
     * in floats, two 16-bit elements per float */
    size_t Lh = a16 && !g->ckpt ? (size_t)g->c.layers : 0, Rh = a16 ? R : 0;
    float *inputs, *targets, *h[9];
    /* what the backward reads (and the forward's outputs: logits, losses) */
    const slot_t act[] = {
        {&g->resid, (a16 ? 1 : R) * N * C},
        {&g->ln1, L * N * C},
        {&g->ln1_mean, Ls * N},
        {&g->ln1_rstd, Ls * N},
        {&g->qkv, L * N * 3 * C},
        {&g->att, L * NHTT},
        {&g->attn_lse, Ls * g->lse_slice},
        {&g->atty, L * N * C},
        {&g->res2, L * N * C},
        {&g->ln2, L * N * C},
        {&g->ln2_mean, Ls * N},
        {&g->ln2_rstd, Ls * N},
        {&g->fch, L * N * 4 * C},
        {&g->fchg, L * N * 4 * C},
        {&g->lnf, N * C},
        {&g->lnf_mean, N},
        {&g->lnf_rstd, N},
        {&g->logits, N * ZS_GPT_LOGITS_LD(V)},
        {&g->lse, N},
        {&g->losses, N},
        {&inputs, N},
        {&targets, N},
        {&h[0], (Rh * N * C + 1) / 2},
        {&h[1], (Lh * N * C + 1) / 2},
        {&h[2], (Lh * N * 3 * C + 1) / 2},
        {&h[3], (Lh * NHTT + 1) / 2},
        {&h[4], (Lh * N * C + 1) / 2},
        {&h[5], (Lh * N * C + 1) / 2},
        {&h[6], (Lh * N * C + 1) / 2},
        {&h[7], (Lh * N * 4 * C + 1) / 2},
        {&h[8], (Lh * N * 4 * C + 1) / 2},
    };
    /* reused within a layer or by every layer's backward */
    const slot_t scr[] = {
        {&g->proj, N * C},     {&g->dres, N * C}, {&g->dbuf, N * C},
        {&g->dqkv, N * 3 * C}, {&g->datt, NHTT},  {&g->dfch, N * 4 * C},
    };
    TRY(carve(g, ZS_MEM_ACTIVATIONS, act, sizeof act / sizeof act[0], &g->act_arena, err));
    g->inputs = (int32_t *)inputs;
    g->targets = (int32_t *)targets;
    void **h16[9] = {&g->resid16, &g->ln1_16, &g->qkv_16, &g->att_16, &g->atty_16,
                     &g->res2_16, &g->ln2_16, &g->fch_16, &g->fchg_16};
    for (int k = 0; k < 9; k++)
        *h16[k] = a16 ? (void *)h[k] : NULL;
    TRY(carve(g, ZS_MEM_SCRATCH, scr, sizeof scr / sizeof scr[0], &g->scr_arena, err));
    /* The head's gradient in place of the logits, as llm.c does: the
     * backward reads each logit once, where it writes its gradient, so no
     * second [N, ld] buffer (3.3 GB at 124M, B = 16, T = 1024). A
     * copy_logits after the backward is refused (logits_gone). */
    g->dlogits = g->logits;
    void *pin;
    TRY(zs_dev_alloc(g->dev, ZS_SPACE_PINNED, ZS_MEM_SCRATCH, 2 * N * sizeof(int32_t), &pin, err));
    g->tok_pin = pin;
    TRY(zs_dev_alloc(g->dev, ZS_SPACE_PINNED, ZS_MEM_SCRATCH, N * sizeof(float), &pin, err));
    g->loss_pin = pin;
    TRY(zs__gpt_ckpt_alloc(g, err));
    TRY(zs_dev_event_create(g->dev, &g->tok_ev, err));
    TRY(zs_dev_event_create(g->dev, &g->done_ev, err));
    return ZS_OK;
}

/* Free what bind made, once the work the model queued has run, and forget
 * the device. Waits through the model's own events, not the stream: the
 * stream's owner (the engine) may have destroyed it already (a destroyed
 * stream has run its work; the events outlive it). loss() and
 * zs_gpt_copy_logits synchronise the stream themselves. */
static void unbind(zs_gpt_t *g)
{
    if (!g->dev)
        return;
    zs_event_t *evs[2] = {g->tok_ev, g->done_ev};
    for (int i = 0; i < 2; i++)
        if (evs[i]) {
            zs_dev_event_sync(evs[i], NULL);
            zs_dev_event_destroy(evs[i]);
        }
    g->done_ev = NULL;
    zs_dev_free(g->dev, g->act_arena);
    zs_dev_free(g->dev, g->scr_arena);
    zs_dev_free(g->dev, g->mixed_arena);
    g->mixed_arena = NULL;
    zs_mixed_set(&g->mixed, NULL);
    zs_dev_free(g->dev, g->tok_pin);
    zs_dev_free(g->dev, g->loss_pin);
    zs__gpt_ckpt_free(g);
    zs__gpt_param16_free(g);
    zs_gpt_ops_destroy(g->ops);
    g->tok_ev = NULL;
    g->act_arena = g->scr_arena = NULL;
    g->tok_pin = NULL;
    g->loss_pin = NULL;
    g->ops = NULL;
    g->dev = NULL;
    g->stream = NULL;
    g->have_batch = g->have_head = 0;
    g->next_fwd = 0;
    g->next_bwd = -1;
}

/* Scratch elements for the rounded GEMM operands of the largest call of
 * each GEMM-based op the model makes (zs_mixed.h). */
static size_t mixed_need(const zs_gpt_t *g)
{
    int N = (int)g->maxN, C = g->c.width, V = g->c.vocab;
    int shapes[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* IC, OC */
    size_t need = 0, n;
#define ZS_NEED(x) (n = (x), need = n > need ? n : need)
    for (int i = 0; i < 4; i++) {
        ZS_NEED(zs_mixed_matmul_fwd_elems(N, shapes[i][0], shapes[i][1]));
        ZS_NEED(zs_mixed_matmul_bwd_elems(N, shapes[i][0], shapes[i][1]));
    }
    if (g->flash) {
        ZS_NEED(zs_mixed_flash_fwd_elems(g->maxB, g->c.ctx, C));
        ZS_NEED(zs_mixed_flash_bwd_elems(g->maxB, g->c.ctx, C));
    } else {
        ZS_NEED(zs_mixed_attention_fwd_elems(g->maxB, g->c.ctx, C, g->c.heads));
        ZS_NEED(zs_mixed_attention_bwd_elems(g->maxB, g->c.ctx, C, g->c.heads));
    }
    /* the tied head: logits = lnf wte^T, dlnf = dlogits wte (both by chunks
     * of R vocabulary rows, zs_gpt_param16.c), dwte += dlogits^T lnf */
    int R = zs__gpt_head_rows(g), ld = ZS_GPT_LOGITS_LD(V);
    ZS_NEED(zs_mixed_gemm_elems(0, 1, N, R, C, C, C));
    ZS_NEED(zs_mixed_gemm_elems(0, 0, N, C, R, ld, C));
    ZS_NEED(zs_mixed_gemm_elems(1, 0, V, C, N, ld, C));
    if (zs__gpt_head16_on(g)) { /* once over the padded vocabulary */
        ZS_NEED(zs_mixed_gemm_elems(0, 1, N, ld, C, C, C));
        ZS_NEED(zs_mixed_gemm_elems(0, 0, N, C, ld, ld, C));
    }
#undef ZS_NEED
    return need;
}

/* With bf16 / fp16 GEMMs: the scratch for the rounded operands (device
 * memory, ZS_MEM_SCRATCH, mixed_elem_bytes of the table per element),
 * handed to the op table. Nothing for fp32. */
static int alloc_mixed(zs_gpt_t *g, zs_err_t *err)
{
    if (g->gemm_dt == ZS_DTYPE_F32)
        return ZS_OK;
    size_t need = mixed_need(g), bytes = need * g->ops->mixed_elem_bytes;
    int rc = zs_dev_alloc(g->dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &g->mixed_arena, err);
    if (rc) {
        zs_err_prefix(err, "gpt: %zu MiB for %s GEMM operands: ", bytes >> 20,
                      zs_dtype_name(g->gemm_dt));
        return rc;
    }
    zs_mixed_t mx = {g->gemm_dt, g->mixed_arena, need};
    TRY(g->ops->set_mixed(g->ops->ctx, &mx, err));
    g->mixed = mx;
    return ZS_OK;
}

int zs_gpt_set_compute(zs_gpt_t *g, int gemm_dt, zs_err_t *err)
{
    if (gemm_dt != ZS_DTYPE_F32 && gemm_dt != ZS_DTYPE_BF16 && gemm_dt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: GEMM dtype %d is not fp32, bf16 or fp16",
                          gemm_dt);
    if (g->dev)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: set the compute dtype before binding");
    g->gemm_dt = gemm_dt;
    return ZS_OK;
}

int zs_gpt_compute(const zs_gpt_t *g)
{
    return g->gemm_dt;
}

int zs_gpt_set_attention(zs_gpt_t *g, int mode, zs_err_t *err)
{
    if (mode != ZS_GPT_ATTN_UNFUSED && mode != ZS_GPT_ATTN_FLASH)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: attention mode %d is not unfused or flash",
                          mode);
    if (g->dev)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: set the attention before binding");
    g->attn = mode;
    return ZS_OK;
}

int zs_gpt_attention(const zs_gpt_t *g)
{
    if (!g->dev)
        return g->attn;
    return g->flash ? ZS_GPT_ATTN_FLASH : ZS_GPT_ATTN_UNFUSED;
}

/* Whether bind runs the fused attention with `ops` (zs_gpt_set_attention),
 * and the per-block attention sizes that follow. */
static void attn_plan(zs_gpt_t *g, const zs_gpt_ops_t *ops)
{
    int hs = g->c.width / g->c.heads;
    int mixed = g->gemm_dt == ZS_DTYPE_BF16 || g->gemm_dt == ZS_DTYPE_F16;
    g->flash = g->attn == ZS_GPT_ATTN_FLASH && ops->attention_flash_fwd &&
               ops->attention_flash_bwd && ops->flash_hs_mult > 0 && hs % ops->flash_hs_mult == 0 &&
               hs <= ops->flash_hs_max && (mixed || !ops->flash_needs_mixed);
    size_t T = (size_t)g->c.ctx, NH = (size_t)g->c.heads;
    g->att_slice = g->flash ? 0 : (size_t)g->maxB * NH * T * T;
    g->lse_slice = g->flash ? (size_t)g->maxB * NH * T : 0;
}

int zs_gpt_bind(zs_gpt_t *g, zs_dev_t *dev, zs_stream_t *compute, zs_err_t *err)
{
    if (g->dev)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: already bound to a device");
    if (!dev || !compute || zs_dev_of_stream(compute) != dev)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: bind needs a device and a stream of it");
    zs_gpt_ops_t *ops;
    TRY(ops_for_device(g, dev, &ops, err));
    g->dev = dev;
    g->stream = compute;
    g->ops = ops;
    attn_plan(g, ops);
    int rc = alloc_buffers(g, err);
    if (rc == ZS_OK)
        rc = alloc_mixed(g, err);
    if (rc == ZS_OK)
        rc = zs__gpt_param16_alloc(g, err);
    if (rc) {
        unbind(g);
        return rc;
    }
    return ZS_OK;
}

static int bind(void *self, zs_dev_t *dev, zs_stream_t *compute, zs_err_t *err)
{
    return zs_gpt_bind(self, dev, compute, err);
}

static int set_param_dtype(void *self, int dt, zs_err_t *err)
{
    return zs_gpt_set_param_dtype(self, dt, err);
}

/* ---- life cycle ---- */

int zs_gpt_set_threads(zs_gpt_t *g, int n, zs_err_t *err)
{
    zs_pool_t *p = zs_pool_create(n), *old = g->pool;
    if (!p)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: cannot start %d threads", n);
    if (g->dev && (!strcmp(g->ops->name, "cpu") || !strcmp(g->ops->name, "prof:cpu"))) {
        /* queued work runs on the old pool through the old table: let it
         * finish, then make a table on the new pool (other tables do not
         * use the pool: it only runs init_params there) */
        zs_gpt_ops_t *ops = NULL;
        int rc = zs_dev_stream_sync(g->stream, err);
        g->pool = p;
        if (!rc)
            rc = ops_for_device(g, g->dev, &ops, err);
        if (!rc && zs_mixed_on(&g->mixed) && (rc = ops->set_mixed(ops->ctx, &g->mixed, err)))
            zs_gpt_ops_destroy(ops);
        if (rc) {
            g->pool = old;
            zs_pool_destroy(p);
            return rc;
        }
        zs_gpt_ops_destroy(g->ops);
        g->ops = ops;
    }
    g->pool = p;
    zs_pool_destroy(old);
    return ZS_OK;
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
    g->gemm_dt = ZS_DTYPE_F32;
    g->act_dt = ZS_DTYPE_F32;
    g->pdt = ZS_DTYPE_F32;
    g->next_bwd = -1;
    size_t C = (size_t)c->width, T = (size_t)c->ctx;
    g->bo = block_offsets(C);
    g->maxN = (size_t)max_batch * T;
    g->att_slice = (size_t)max_batch * c->heads * T * T;
    const char *env = getenv("ZS_GPT_THREADS");
    int nthreads = env ? atoi(env) : 0;
    g->pool = zs_pool_create(nthreads);
    if (!g->pool) {
        zs_gpt_destroy(g);
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: out of memory (or cannot start %d threads)",
                          nthreads);
    }
    g->model.self = g;
    g->model.init_params = zs__gpt_init_params;
    g->model.bind = bind;
    g->model.load_batch = load_batch;
    g->model.forward = forward;
    g->model.loss = loss;
    g->model.backward = backward;
    g->model.set_param_dtype = set_param_dtype;
    int rc = zs__gpt_layout(g, err); /* unsplit until zs_gpt_set_split */
    if (rc) {
        zs_gpt_destroy(g);
        return rc;
    }
    zs_op_init();
    *out = g;
    return ZS_OK;
}

void zs_gpt_profile_report(const zs_gpt_t *g, FILE *f)
{
    if (g && g->ops)
        zs_gpt_ops_prof_report(g->ops, f);
}

void zs_gpt_destroy(zs_gpt_t *g)
{
    if (!g)
        return;
    unbind(g);
    zs_pool_destroy(g->pool);
    free(g->fixed_in);
    free(g->fixed_tg);
    free(g->nparams);
    free(g->deps);
    free(g->lmap);
    free(g->dro);
    free(g->depbuf);
    free(g);
}

const zs_model_t *zs_gpt_model(zs_gpt_t *g)
{
    return &g->model;
}
