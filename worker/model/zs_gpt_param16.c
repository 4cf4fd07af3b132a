/*
 * zs_gpt_param16.c - the GPT reading its parameters in the engine's 16-bit
 * storage dtype (zs_gpt_set_param_dtype, which the engine calls through
 * zs_model_t.set_param_dtype), so that no fp32 copy or view of the model
 * exists on the device (issue 16).
 *
 * The op table reads fp32, so each tensor is converted (zs_dev_cast, on the
 * compute stream) just before the ops that read it, into a bounded fp32
 * scratch allocated at bind (device, ZS_MEM_SCRATCH, so the engine counts
 * it as the model's):
 *   small  a layer's LayerNorm weights and biases (13 C floats for a block,
 *          2 C for the head)
 *   big    one weight matrix at a time (qkv_w, attn_proj_w, fc_w,
 *          fc_proj_w: at most 4 C^2), one chunk of head_rows vocabulary
 *          rows of the tied wte for the head's GEMMs, or the embedding rows
 *          of the batch plus wpe
 * The conversion is exact (every bf16 / fp16 value is an fp32 value), so
 * the ops see what an fp32 view would hold, and with GEMMs in the same
 * 16-bit dtype their rounding of the weights changes nothing.
 *
 * The head's GEMMs go chunk by chunk over the vocabulary: the logits column
 * block by column block (each logit the same dot product as one GEMM), and
 * the head's input gradient as a sum of the chunks' products in chunk order.
 * That sum differs from one GEMM over the whole vocabulary by the order of
 * fp32 additions, so results change only where V > head_rows (a vocabulary
 * wider than the big area).
 *
 * The embedding reads only the rows of the batch's tokens: each distinct
 * token's row is converted once (distinct ids found on the host from the
 * staged tokens, in first-seen order) and the lookup reads the converted
 * rows through remapped ids (uploaded like the tokens). The distinct ids
 * are uploaded too, and one zs_dev_cast_rows per wte chunk converts their
 * rows: one launch, where a cast per distinct token cost ~14,000 launches
 * (~60 ms) per 124M step on an H200.
 *
 * Stream order makes reuse safe: every conversion is enqueued on the
 * compute stream after the ops that read the previous contents.
 *
 * On CUDA with 16-bit GEMMs (zs__gpt_head16_on) the head's GEMMs do not
 * go by chunks: wte is cast, chunk by chunk, into wte16p, a copy in the
 * GEMM dtype whose rows V .. ZS_GPT_LOGITS_LD(V) are zeros, and each GEMM
 * runs once over the padded vocabulary, reading that copy as its operand's
 * twin (zs_mixed_twin_t, keyed by the copy's own address). With V = 50257
 * cuBLASLt ran those GEMMs at about 94 TFLOP/s on an H200 against 250-320
 * for the blocks' (bench/RESULTS.md); llm.c pads its vocabulary the same
 * way. The padded logits are exact zeros (zero rows), so their gradients
 * in place (dlogits == logits, never written by xent_bwd) are zeros too,
 * and the padded terms of dlnf = dlogits wte add nothing. The cast rounds
 * as the GEMM's own operand rounding would (nearest even), so each logit is
 * the same dot product; dlnf sums the whole vocabulary in one GEMM.
 *
 * Not here: gradients (always fp32, the engine's slots).
 */
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_impl.h"

/* Elements of the small area: a block's LayerNorm weights and biases. */
static size_t small_elems(const zs_gpt_t *g)
{
    return 13 * (size_t)g->c.width + 8 * 16; /* 8 tensors, each padded to 16 */
}

size_t zs__gpt_big_elems(const zs_gpt_t *g)
{
    size_t C = (size_t)g->c.width, T = (size_t)g->c.ctx;
    size_t n = 4 * C * C, emb = (g->maxN + T) * C;
    return n > emb ? n : emb;
}

int zs__gpt_head_rows(const zs_gpt_t *g)
{
    size_t V = (size_t)g->c.vocab, rows = zs__gpt_big_elems(g) / (size_t)g->c.width;
    if (g->wte_rows)
        return g->wte_rows;
    if (g->pdt == ZS_DTYPE_F32 || rows >= V)
        return (int)V;
    return (int)(rows > 0 ? rows : 1);
}

float *zs__gpt_rows(const zs_gpt_t *g)
{
    return g->pconv + small_elems(g);
}

int zs_gpt_set_param_dtype(zs_gpt_t *g, int dt, zs_err_t *err)
{
    if (dt != ZS_DTYPE_F32 && dt != ZS_DTYPE_BF16 && dt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: parameter dtype %d is not fp32, bf16 or fp16",
                          dt);
    if (g->dev)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: set the parameter dtype before binding");
    g->pdt = dt;
    return ZS_OK;
}

int zs_gpt_param_dtype(const zs_gpt_t *g)
{
    return g->pdt;
}

int zs__gpt_head16_on(const zs_gpt_t *g)
{
    return g->ops && g->ops->set_twins && g->gemm_dt != ZS_DTYPE_F32;
}

int zs__gpt_param16_alloc(zs_gpt_t *g, zs_err_t *err)
{
    if (zs__gpt_head16_on(g)) { /* rows V .. Vp stay zero: only rows < V are ever cast */
        size_t bytes = (size_t)ZS_GPT_LOGITS_LD(g->c.vocab) * (size_t)g->c.width *
                       zs_dtype_size((zs_dtype_t)g->gemm_dt);
        int rc = zs_dev_alloc(g->dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &g->wte16p, err);
        if (rc) {
            zs_err_prefix(err, "gpt: %zu MiB for the padded 16-bit head: ", bytes >> 20);
            return rc;
        }
        TRY(zs_dev_memset(g->stream, g->wte16p, 0, bytes, err));
    }
    if (g->pdt == ZS_DTYPE_F32 && !g->wte_rows)
        return ZS_OK;
    size_t bytes = (small_elems(g) + zs__gpt_big_elems(g)) * sizeof(float);
    int rc = zs_dev_alloc(g->dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, (void **)&g->pconv, err);
    if (rc) {
        zs_err_prefix(err, "gpt: %zu MiB to read 16-bit parameters: ", bytes >> 20);
        return rc;
    }
    size_t N = g->maxN; /* remap and its staging: N remapped ids, then <= N distinct ids */
    TRY(zs_dev_alloc(g->dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 2 * N * sizeof(int32_t),
                     (void **)&g->remap, err));
    TRY(zs_dev_alloc(g->dev, ZS_SPACE_PINNED, ZS_MEM_SCRATCH, 2 * N * sizeof(int32_t),
                     (void **)&g->remap_pin, err));
    TRY(zs_dev_event_create(g->dev, &g->remap_ev, err));
    g->uniq = g->remap_pin + N;
    g->seen = malloc((size_t)g->c.vocab * sizeof *g->seen);
    if (!g->seen)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: out of memory");
    for (int v = 0; v < g->c.vocab; v++)
        g->seen[v] = -1;
    return ZS_OK;
}

void zs__gpt_param16_free(zs_gpt_t *g)
{
    if (g->remap_ev) {
        zs_dev_event_sync(g->remap_ev, NULL);
        zs_dev_event_destroy(g->remap_ev);
    }
    zs_dev_free(g->dev, g->pconv);
    zs_dev_free(g->dev, g->wte16p);
    g->wte16p = NULL;
    zs_dev_free(g->dev, g->remap);
    zs_dev_free(g->dev, g->remap_pin);
    free(g->seen);
    g->uniq = NULL;
    g->pconv = NULL;
    g->remap = g->remap_pin = NULL;
    g->remap_ev = NULL;
    g->seen = NULL;
}

/* Convert n elements at element offset `off` of p into fp32 at dst. */
static int convert(zs_gpt_t *g, float *dst, const void *p, size_t off, size_t n, zs_err_t *err)
{
    const char *src = (const char *)p + off * zs_dtype_size(g->pdt);
    return zs_dev_cast(g->stream, dst, ZS_DTYPE_F32, src, g->pdt, n, err);
}

int zs__gpt_param(zs_gpt_t *g, const void *p, size_t off, size_t n, size_t at, const float **out,
                  zs_err_t *err)
{
    if (g->pdt == ZS_DTYPE_F32) {
        *out = (const float *)p + off;
        return ZS_OK;
    }
    float *dst = at == ZS_GPT_BIG ? g->pconv + small_elems(g) : g->pconv + at;
    if (at != ZS_GPT_BIG && at + n > small_elems(g))
        return zs_err_set(err, ZS_ERR_INTERNAL, "gpt: small parameter area overflow (%zu + %zu)",
                          at, n);
    TRY(convert(g, dst, p, off, n, err));
    *out = dst;
    return ZS_OK;
}

/* Vocabulary rows [v0, v0 + *r) of the tied wte: the wte layer holding
 * v0 (split) or rows of the one embedding layer's (unsplit), pdt elements. */
static const void *wte_chunk(const zs_gpt_t *g, void *const *wdeps, int v0, int *r)
{
    int V = g->c.vocab, R = zs__gpt_head_rows(g);
    *r = V - v0 < R ? V - v0 : R;
    if (g->wte_rows)
        return wdeps[v0 / R];
    return (const char *)wdeps[0] + (size_t)v0 * g->c.width * zs_dtype_size(g->pdt);
}

/* The head's GEMMs once over the padded vocabulary (see the file). wte16p
 * is cast again for every call: the forward's and the backward's may see
 * other parameters (a later step, or another micro-batch's gathered ones),
 * and the cast is one pass over V x C 16-bit elements. */
static int head_gemms_padded(zs_gpt_t *g, void *const *wdeps, int dx, zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    int C = g->c.width, V = g->c.vocab, N = g->B * g->T, r, ld = ZS_GPT_LOGITS_LD(V);
    zs_dtype_t dt = (zs_dtype_t)g->gemm_dt;
    for (int v0 = 0; v0 < V; v0 += r) {
        const void *wte = wte_chunk(g, wdeps, v0, &r);
        char *dst = (char *)g->wte16p + (size_t)v0 * C * zs_dtype_size(dt);
        TRY(zs_dev_cast(g->stream, dst, dt, wte, (zs_dtype_t)g->pdt, (size_t)r * C, err));
    }
    /* a twin with no fp32 tensor behind it: the key is the copy itself, and
     * only a table that takes twins (zs__gpt_head16_on) is given it */
    const float *key = (const float *)g->wte16p;
    zs__gpt_twins_t tw = {.n = 1};
    tw.t[0] = (zs_mixed_twin_t){key, g->wte16p, (size_t)ld * C};
    if (dx && g->dlogits16) /* the logits' gradient, already 16-bit (head_backward) */
        tw.t[tw.n++] = (zs_mixed_twin_t){g->dlogits, g->dlogits16, (size_t)N * ld};
    TRY(zs__gpt_twins_set(g, &tw, err));
    if (dx) /* dbuf = dlogits[:, 0 : ld] wte16p */
        return ops->gemm(ops->ctx, g->stream, 0, 0, N, C, ld, 1.0f, g->dlogits, ld, key, C, 0.0f,
                         g->dbuf, C, err);
    return ops->gemm(ops->ctx, g->stream, 0, 1, N, ld, C, 1.0f, g->lnf, C, key, C, 0.0f, g->logits,
                     ld, err); /* logits[:, 0 : ld] = lnf wte16p^T */
}

int zs__gpt_head_gemms(zs_gpt_t *g, void *const *wdeps, int dx, zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    int C = g->c.width, V = g->c.vocab, N = g->B * g->T, r, ld = ZS_GPT_LOGITS_LD(V);
    if (g->wte16p)
        return head_gemms_padded(g, wdeps, dx, err);
    for (int v0 = 0; v0 < V; v0 += r) {
        const void *wte = wte_chunk(g, wdeps, v0, &r);
        const float *w;
        TRY(zs__gpt_param(g, wte, 0, (size_t)r * C, ZS_GPT_BIG, &w, err));
        if (dx) /* dbuf (+)= dlogits[:, v0 : v0 + r] w */
            TRY(ops->gemm(ops->ctx, g->stream, 0, 0, N, C, r, 1.0f, g->dlogits + v0, ld, w, C,
                          v0 ? 1.0f : 0.0f, g->dbuf, C, err));
        else /* logits[:, v0 : v0 + r] = lnf w^T */
            TRY(ops->gemm(ops->ctx, g->stream, 0, 1, N, r, C, 1.0f, g->lnf, C, w, C, 0.0f,
                          g->logits + v0, ld, err));
    }
    return ZS_OK;
}
