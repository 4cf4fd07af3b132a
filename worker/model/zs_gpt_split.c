/*
 * zs_gpt_split.c - which engine layer is which part of the GPT, and the
 * embedding done row by row, so that a model can be split into engine
 * layers smaller than its natural ones (zs_gpt_set_split). The engine's
 * gradient buckets are whole engine layers, so this is what lets the
 * device hold gradient buckets of reduce_bucket_size instead of a whole
 * embedding or block (issue 16).
 *
 * Unsplit (the default): layer 0 = the embeddings (wte, wpe), 1..L = the
 * blocks, L+1 = the final LayerNorm + tied head (deps {0}).
 * Split with a cap of E elements per layer:
 *   - wte (when V*C > E) becomes layers of R = min(E / C, big area / C)
 *     vocabulary rows each, then one layer for wpe. Their forward fills the
 *     embedding rows of the batch's tokens chunk by chunk and the wpe layer
 *     finishes the lookup; their backward computes that chunk's whole
 *     gradient: the tied head's part (dlogits^T lnf for its rows, the GEMM
 *     the head does unsplit) and the lookup's scatter, in that order.
 *   - each block (when bigger than E) becomes its four parts
 *     (zs_gpt_block.c); part 3 reads parts 0-2 (deps) for the recompute
 *     of activation checkpointing.
 *   - the head reads every wte layer (deps) and writes no gradient to
 *     them (zs_model_t.deps_read_only), so no wte bucket is held from the
 *     head's backward to the embedding's.
 * The flat parameter order is the same either way (checkpoints do not
 * change), and so are the initial values (each split layer draws the
 * numbers of its range of the unsplit layer).
 *
 * Numerics: the blocks' parts run the same ops in the same order, and the
 * wte gradient adds the head's product and the scatter in the unsplit
 * order; the head's input gradient sums its vocabulary chunks in chunk
 * order (one GEMM unsplit), so a split model matches an unsplit one within
 * fp32 reordering, not bitwise.
 *
 * Not here: the block math (zs_gpt_block.c), converting 16-bit parameters
 * (zs_gpt_param16.c).
 */
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_impl.h"

/* Append engine layer d with n own parameters. */
static void add(zs_gpt_t *g, zs__gpt_layer_t d, size_t n)
{
    g->lmap[g->nl] = d;
    g->nparams[g->nl] = n;
    g->deps[g->nl] = NULL;
    g->dro[g->nl] = 0;
    g->nl++;
}

int zs__gpt_layout(zs_gpt_t *g, zs_err_t *err)
{
    int L = g->c.layers, V = g->c.vocab;
    size_t C = (size_t)g->c.width, T = (size_t)g->c.ctx, E = g->split;
    int rows = 0;
    if (E && (size_t)V * C > E) {
        size_t r = E / C, cap = zs__gpt_big_elems(g) / C;
        r = r < cap ? r : cap;
        rows = (int)(r > 0 ? r : 1);
    }
    int nwte = rows ? (V + rows - 1) / rows : 0, parts = E && g->bo.total > E;
    int nl = (nwte ? nwte + 1 : 1) + L * (parts ? 4 : 1) + 1;
    free(g->lmap), free(g->nparams), free(g->deps), free(g->dro), free(g->depbuf);
    g->lmap = calloc((size_t)nl, sizeof *g->lmap);
    g->nparams = calloc((size_t)nl, sizeof *g->nparams);
    g->deps = calloc((size_t)nl, sizeof *g->deps);
    g->dro = calloc((size_t)nl, 1);
    /* the head's deps (nwte or 1, then -1) and each part 3's (3 + 1) */
    g->depbuf = calloc((size_t)(nwte + 2) + (size_t)L * 4, sizeof *g->depbuf);
    if (!g->lmap || !g->nparams || !g->deps || !g->dro || !g->depbuf)
        return zs_err_set(err, ZS_ERR_NOMEM, "gpt: out of memory");
    g->nl = 0;
    g->wte_rows = rows;
    int *dp = g->depbuf;
    if (nwte) {
        for (int j = 0; j < nwte; j++) {
            int r = V - j * rows < rows ? V - j * rows : rows;
            add(g, (zs__gpt_layer_t){ZS__GL_WTE, 0, 0, j * rows, r}, (size_t)r * C);
        }
        add(g, (zs__gpt_layer_t){ZS__GL_WPE, 0, 0, 0, 0}, T * C);
    } else {
        add(g, (zs__gpt_layer_t){ZS__GL_EMB, 0, 0, 0, V}, ((size_t)V + T) * C);
    }
    for (int l = 1; l <= L; l++) {
        if (!parts) {
            add(g, (zs__gpt_layer_t){ZS__GL_BLOCK, l, 0, 0, 0}, g->bo.total);
            continue;
        }
        for (int k = 0; k < 4; k++)
            add(g, (zs__gpt_layer_t){ZS__GL_PART, l, k, 0, 0},
                zs__gpt_part_start(g, k + 1) - zs__gpt_part_start(g, k));
        /* part 3's recompute reads parts 0-2 */
        int me = g->nl - 1;
        for (int k = 0; k < 3; k++)
            dp[k] = me - 3 + k;
        dp[3] = -1;
        g->deps[me] = dp;
        g->dro[me] = 1;
        dp += 4;
    }
    add(g, (zs__gpt_layer_t){ZS__GL_HEAD, 0, 0, 0, 0}, 2 * C);
    for (int j = 0; j < (nwte ? nwte : 1); j++)
        dp[j] = j;
    dp[nwte ? nwte : 1] = -1;
    g->deps[g->nl - 1] = dp;
    g->dro[g->nl - 1] = nwte > 0;
    g->model.nlayers = g->nl;
    g->model.nparams = g->nparams;
    g->model.deps = (const int *const *)g->deps;
    g->model.deps_read_only = g->dro;
    return ZS_OK;
}

int zs_gpt_set_split(zs_gpt_t *g, uint64_t max_elems, zs_err_t *err)
{
    if (g->dev)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: set the layer split before binding");
    g->split = max_elems;
    return zs__gpt_layout(g, err);
}

int zs_gpt_num_layers(const zs_gpt_t *g)
{
    return g->nl;
}

/* ---- the embedding, row by row ---- */

/* Copy or convert n parameters at element offset off of p into fp32 dst. */
static int rows_in(zs_gpt_t *g, float *dst, const void *p, size_t off, size_t n, zs_err_t *err)
{
    const char *src = (const char *)p + off * zs_dtype_size(g->pdt);
    if (g->pdt == ZS_DTYPE_F32)
        return zs_dev_memcpy(g->stream, dst, src, n * sizeof(float), err);
    return zs_dev_cast(g->stream, dst, ZS_DTYPE_F32, src, g->pdt, n, err);
}

int zs__gpt_embed_begin(zs_gpt_t *g, zs_err_t *err)
{
    /* the last upload of remap_pin has run */
    TRY(zs_dev_event_sync(g->remap_ev, err));
    size_t N = (size_t)g->B * g->T, m = 0;
    for (size_t n = 0; n < N; n++) { /* tok_pin: the current batch until the next load */
        int32_t v = g->tok_pin[n];
        if (g->seen[v] < 0) {
            g->seen[v] = (int32_t)m;
            g->uniq[m++] = v;
        }
        g->remap_pin[n] = g->seen[v];
    }
    for (size_t i = 0; i < m; i++) /* forget them for the next batch */
        g->seen[g->uniq[i]] = -1;
    g->nuniq = m;
    /* the distinct ids for zs_dev_cast_rows (remap_ev, recorded after the
     * remap upload in embed_finish, also covers this upload) */
    if (m)
        TRY(zs_dev_memcpy(g->stream, g->remap + g->maxN, g->uniq, m * sizeof(int32_t), err));
    return ZS_OK;
}

int zs__gpt_embed_rows(zs_gpt_t *g, const void *wte, int v0, int rows, zs_err_t *err)
{
    /* one launch for the chunk's distinct rows (a copy or cast each was one
     * launch per row) */
    return zs_dev_cast_rows(g->stream, zs__gpt_rows(g), wte, g->pdt, g->remap + g->maxN, g->nuniq,
                            v0, v0 + rows, (size_t)g->c.width, err);
}

int zs__gpt_embed_finish(zs_gpt_t *g, const void *wpe, float *out, zs_err_t *err)
{
    size_t N = (size_t)g->B * g->T, C = (size_t)g->c.width, T = (size_t)g->c.ctx;
    const float *w = wpe;
    if (g->pdt != ZS_DTYPE_F32) {
        float *dst = zs__gpt_rows(g) + N * C;
        TRY(rows_in(g, dst, wpe, 0, T * C, err));
        w = dst;
    }
    TRY(zs_dev_memcpy(g->stream, g->remap, g->remap_pin, N * sizeof(int32_t), err));
    TRY(zs_dev_event_record(g->remap_ev, g->stream, err));
    return g->ops->embed_fwd(g->ops->ctx, g->stream, out, g->remap, zs__gpt_rows(g), w, g->B, g->T,
                             g->c.width, err);
}

int zs__gpt_wte_bwd(zs_gpt_t *g, int v0, int rows, float *gr, zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    int C = g->c.width, V = g->c.vocab, N = g->B * g->T;
    /* the tied head's part, then the lookup's scatter, as unsplit */
    TRY(ops->gemm(ops->ctx, g->stream, 1, 0, rows, C, N, 1.0f, g->dlogits + v0, ZS_GPT_LOGITS_LD(V),
                  g->lnf, C, 1.0f, gr, C, err));
    for (int n = 0; n < N; n++) {
        int32_t v = g->tok_pin[n];
        if (v >= v0 && v < v0 + rows)
            TRY(zs_dev_accumulate(g->stream, gr + (size_t)(v - v0) * C, ZS_DTYPE_F32,
                                  g->dres + (size_t)n * C, ZS_DTYPE_F32, (size_t)C, err));
    }
    return ZS_OK;
}

int zs__gpt_wpe_bwd(zs_gpt_t *g, float *gr, zs_err_t *err)
{
    size_t TC = (size_t)g->T * g->c.width;
    for (int b = 0; b < g->B; b++) /* sample order, as the unsplit scatter */
        TRY(zs_dev_accumulate(g->stream, gr, ZS_DTYPE_F32, g->dres + b * TC, ZS_DTYPE_F32, TC,
                              err));
    return ZS_OK;
}
