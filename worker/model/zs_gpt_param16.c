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
 * Not here: GEMMs reading 16-bit operands in place (cuBLASLt could skip
 * the conversion on CUDA; both tables convert today), gradients (always
 * fp32, the engine's slots).
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

int zs__gpt_param16_alloc(zs_gpt_t *g, zs_err_t *err)
{
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

int zs__gpt_head_gemms(zs_gpt_t *g, void *const *wdeps, int dx, zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    int C = g->c.width, V = g->c.vocab, N = g->B * g->T, r, ld = ZS_GPT_LOGITS_LD(V);
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
