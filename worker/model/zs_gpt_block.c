/*
 * zs_gpt_block.c - one transformer block's forward and backward, in four
 * parts that follow the block's parameter order, so that a split model
 * (zs_gpt_set_split) can make each part its own engine layer with its own
 * gradient bucket:
 *   part 0  ln1_w, ln1_b, qkv_w, qkv_b        LayerNorm 1, qkv projection
 *   part 1  attn_proj_w, attn_proj_b,         attention, output projection,
 *           ln2_w, ln2_b                      residual, LayerNorm 2
 *   part 2  fc_w, fc_b                        MLP up-projection, GELU
 *   part 3  fc_proj_w, fc_proj_b              MLP down-projection, residual
 * Forward runs the parts 0..3 and backward 3..0 on the same workspace
 * (zs__gpt_ws) and backward scratch (dres, dbuf, dfch, dqkv), so running
 * them in one call or in four gives the same bits: the ops, their order
 * and their inputs are the same.
 *
 * Parameters come as zs__gpt_bp_t: one pointer per part (NULL where the
 * caller has not got that part: a part reads only its own, except the
 * recompute of activation checkpointing, which needs parts 0-2), in the
 * model's parameter dtype; gradients as the fp32 base of the part's own
 * gradient. Not here: which engine layer is which part (zs_gpt_split.c),
 * checkpoints and 16-bit activations (zs_gpt_ckpt.c, zs_gpt_act16.c).
 */
#include "zs_gpt_impl.h"

size_t zs__gpt_part_start(const zs_gpt_t *g, int part)
{
    const block_off_t *o = &g->bo;
    size_t at[5] = {0, o->projw, o->fcw, o->fcpw, o->total};
    return at[part];
}

void zs__gpt_bp_whole(const zs_gpt_t *g, const void *p, zs__gpt_bp_t *bp)
{
    size_t esz = zs_dtype_size(g->pdt);
    for (int k = 0; k < 4; k++)
        bp->p[k] = (const char *)p + zs__gpt_part_start(g, k) * esz;
}

/* fp32 pointer to the n parameters at block offset off (in part `part`),
 * see zs__gpt_param; at: place in the small area, or ZS_GPT_BIG. */
static int bparam(zs_gpt_t *g, const zs__gpt_bp_t *bp, int part, size_t off, size_t n, size_t at,
                  const float **out, zs_err_t *err)
{
    if (!bp->p[part])
        return zs_err_set(err, ZS_ERR_INTERNAL, "gpt: block part %d's parameters not given", part);
    return zs__gpt_param(g, bp->p[part], off - zs__gpt_part_start(g, part), n, at, out, err);
}

/* A GEMM's weight matrix at block offset off (n elements of part `part`):
 * where the op can read the stored 16-bit weights (zs__gpt_wtwins_on),
 * they become its twin in tw and nothing is converted (*w, the ZS_GPT_BIG
 * area, is only what the op matches the twin by); otherwise bparam's fp32
 * view. */
static int bweight(zs_gpt_t *g, const zs__gpt_bp_t *bp, int part, size_t off, size_t n,
                   const float **w, zs__gpt_twins_t *tw, zs_err_t *err)
{
    if (!bp->p[part] || !zs__gpt_wtwins_on(g) || tw->n >= ZS_MIXED_TWINS_MAX)
        return bparam(g, bp, part, off, n, ZS_GPT_BIG, w, err);
    *w = zs__gpt_rows(g); /* the ZS_GPT_BIG area */
    size_t at = (off - zs__gpt_part_start(g, part)) * zs_dtype_size(g->pdt);
    tw->t[tw->n++] = (zs_mixed_twin_t){*w, (const char *)bp->p[part] + at, n};
    return ZS_OK;
}

/* A matmul's bias at block offset off (bparam's fp32 view, *b), and, where
 * the parameters are stored in the GEMMs' 16-bit type (zs__gpt_wtwins_on),
 * the stored bias as its twin: exactly *b's values, the bias of D's type
 * that a matmul writing a 16-bit output (out16_fill) adds in its GEMM. */
static int bbias(zs_gpt_t *g, const zs__gpt_bp_t *bp, int part, size_t off, size_t n, size_t at,
                 const float **b, zs__gpt_twins_t *tw, zs_err_t *err)
{
    TRY(bparam(g, bp, part, off, n, at, b, err));
    if (zs__gpt_wtwins_on(g) && tw->n < ZS_MIXED_TWINS_MAX) {
        size_t byte = (off - zs__gpt_part_start(g, part)) * zs_dtype_size(g->pdt);
        tw->t[tw->n++] = (zs_mixed_twin_t){*b, (const char *)bp->p[part] + byte, n};
    }
    return ZS_OK;
}

/* Add the home of saved tensor `which` as a fill twin of a matmul's output
 * t: the matmul writes its 16-bit output there (zs__gpt_twin_fill). Returns
 * 1 when added. */
static int out16_fill(const zs_gpt_t *g, int l, zs__gpt_twins_t *tw, const float *t, int which,
                      size_t n)
{
    if (g->debug & ZS_GPT_DEBUG_NO_OUT16)
        return 0;
    return zs__gpt_twin_fill(g, l, tw, t, which, n);
}

/* The saved tensors of block l's workspace. */
typedef struct {
    float *ln1, *qkv, *att, *atty, *res2, *ln2, *fch, *fchg;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float *lse; /* flash attention's (att is unused then) */
} ws_t;

static ws_t workspace(const zs_gpt_t *g, int l)
{
    size_t sN = g->maxN, C = (size_t)g->c.width, i = zs__gpt_ws(g, l), j = zs__gpt_stat(g, l);
    ws_t w = {g->ln1 + i * sN * C,           g->qkv + i * sN * 3 * C,  g->att + i * g->att_slice,
              g->atty + i * sN * C,          g->res2 + i * sN * C,     g->ln2 + i * sN * C,
              g->fch + i * sN * 4 * C,       g->fchg + i * sN * 4 * C, g->ln1_mean + j * sN,
              g->ln1_rstd + j * sN,          g->ln2_mean + j * sN,     g->ln2_rstd + j * sN,
              g->attn_lse + j * g->lse_slice};
    return w;
}

int zs__gpt_block_part_fwd(zs_gpt_t *g, int l, int part, const zs__gpt_bp_t *bp, const float *x,
                           float *y, zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    void *k = ops->ctx;
    zs_stream_t *s = g->stream;
    const block_off_t *o = &g->bo;
    int B = g->B, T = g->T, C = g->c.width, NH = g->c.heads, N = B * T;
    size_t sN = g->maxN, nC = (size_t)N * C, natt = (size_t)B * NH * T * T, Cz = (size_t)C;
    ws_t ws = workspace(g, l);
    const float *w, *b, *b2;
    zs__gpt_twins_t tw = {.n = 0}; /* for the GEMM-based op about to run */
    /* zs__gpt_round: with 16-bit activations each saved tensor is rounded
     * where it is stored and read rounded from then on (zs_gpt_act16.c) */
    switch (part) {
    case 0:
        TRY(bparam(g, bp, 0, o->ln1w, Cz, 0, &w, err));
        TRY(bparam(g, bp, 0, o->ln1b, Cz, Cz, &b, err));
        { /* with twins the LayerNorm writes ln1's home: no fp32 ln1 */
            int filled = zs__gpt_twin_fill(g, l, &tw, ws.ln1, ZS__GPT_LN1, nC);
            TRY(zs__gpt_twins_set(g, &tw, err));
            TRY(ops->layernorm_fwd(k, s, ws.ln1, ws.ln1_mean, ws.ln1_rstd, x, w, b, N, C, err));
            if (!filled)
                TRY(zs__gpt_round_gemm(g, l, ws.ln1, g->ln1_16, sN * C, nC, err));
        }
        TRY(bbias(g, bp, 0, o->qkvb, 3 * Cz, 2 * Cz, &b, &tw, err));
        TRY(bweight(g, bp, 0, o->qkvw, Cz * 3 * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.ln1, ZS__GPT_LN1, nC);
        { /* the unfused attention reads only qkv's home then: the GEMM writes
           * it (flash attention rounds its own tiles of the fp32 qkv) */
            int filled = !g->flash && out16_fill(g, l, &tw, ws.qkv, ZS__GPT_QKV, 3 * nC);
            TRY(zs__gpt_twins_set(g, &tw, err));
            TRY(ops->matmul_fwd(k, s, ws.qkv, ws.ln1, w, b, N, C, 3 * C, err));
            if (filled)
                return ZS_OK;
        }
        return zs__gpt_round(g, l, ws.qkv, g->qkv_16, sN * 3 * C, 3 * nC, err);
    case 1:
        if (g->flash) { /* lse stays fp32: nothing to round but the output */
            TRY(ops->attention_flash_fwd(k, s, ws.atty, ws.lse, ws.qkv, B, T, C, NH, err));
        } else {
            zs__gpt_twin_act(g, l, &tw, ws.qkv, ZS__GPT_QKV, 3 * nC);
            /* the op rounds the probabilities for its GEMM into their home */
            int filled = zs__gpt_twin_fill(g, l, &tw, ws.att, ZS__GPT_ATT, natt);
            TRY(zs__gpt_twins_set(g, &tw, err));
            TRY(ops->attention_fwd(k, s, ws.atty, ws.att, ws.qkv, B, T, C, NH, err));
            if (!filled)
                TRY(zs__gpt_round_last(g, l, ws.att, g->att_16, g->att_slice, natt, err));
        }
        TRY(zs__gpt_round_gemm(g, l, ws.atty, g->atty_16, sN * C, nC, err));
        TRY(bparam(g, bp, 1, o->projb, Cz, 0, &b, err));
        TRY(bweight(g, bp, 1, o->projw, Cz * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.atty, ZS__GPT_ATTY, nC);
        TRY(zs__gpt_twins_set(g, &tw, err));
        TRY(ops->matmul_fwd(k, s, g->proj, ws.atty, w, b, N, C, C, err));
        TRY(bparam(g, bp, 1, o->ln2w, Cz, Cz, &w, err));
        TRY(bparam(g, bp, 1, o->ln2b, Cz, 2 * Cz, &b2, err));
        {
            int filled;
            if (ops->residual_layernorm_fwd && !(g->debug & ZS_GPT_DEBUG_ACT16_UNROUNDED)) {
                /* fused: one pass, res2 rounded in it (16-bit activations) */
                void *r16 = zs__gpt_round_place(g, l, ws.res2, g->res2_16, sN * C);
                filled = zs__gpt_twin_fill(g, l, &tw, ws.ln2, ZS__GPT_LN2, nC);
                TRY(zs__gpt_twins_set(g, &tw, err));
                TRY(ops->residual_layernorm_fwd(k, s, ws.res2, r16, g->act_dt, ws.ln2, ws.ln2_mean,
                                                ws.ln2_rstd, x, g->proj, w, b2, N, C, err));
            } else {
                TRY(ops->residual_fwd(k, s, ws.res2, x, g->proj, nC, err));
                TRY(zs__gpt_round(g, l, ws.res2, g->res2_16, sN * C, nC, err));
                filled = zs__gpt_twin_fill(g, l, &tw, ws.ln2, ZS__GPT_LN2, nC);
                TRY(zs__gpt_twins_set(g, &tw, err));
                TRY(ops->layernorm_fwd(k, s, ws.ln2, ws.ln2_mean, ws.ln2_rstd, ws.res2, w, b2, N, C,
                                       err));
            }
            return filled ? ZS_OK : zs__gpt_round_gemm(g, l, ws.ln2, g->ln2_16, sN * C, nC, err);
        }
    case 2:
        TRY(bbias(g, bp, 2, o->fcb, 4 * Cz, 0, &b, &tw, err));
        TRY(bweight(g, bp, 2, o->fcw, Cz * 4 * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.ln2, ZS__GPT_LN2, nC);
        { /* GELU forward and backward read only fch's home then */
            int filled = out16_fill(g, l, &tw, ws.fch, ZS__GPT_FCH, 4 * nC);
            TRY(zs__gpt_twins_set(g, &tw, err));
            TRY(ops->matmul_fwd(k, s, ws.fch, ws.ln2, w, b, N, C, 4 * C, err));
            if (!filled)
                TRY(zs__gpt_round_gemm(g, l, ws.fch, g->fch_16, sN * 4 * C, 4 * nC, err));
        }
        { /* with twins GELU reads fch's home and writes fchg's: no fp32 pass */
            zs__gpt_twin_act(g, l, &tw, ws.fch, ZS__GPT_FCH, 4 * nC);
            int filled = zs__gpt_twin_fill(g, l, &tw, ws.fchg, ZS__GPT_FCHG, 4 * nC);
            TRY(zs__gpt_twins_set(g, &tw, err));
            TRY(ops->gelu_fwd(k, s, ws.fchg, ws.fch, 4 * nC, err));
            if (filled)
                return ZS_OK;
        }
        return zs__gpt_round_gemm(g, l, ws.fchg, g->fchg_16, sN * 4 * C, 4 * nC, err);
    case 3:
        TRY(bparam(g, bp, 3, o->fcpb, Cz, 0, &b, err));
        TRY(bweight(g, bp, 3, o->fcpw, 4 * Cz * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.fchg, ZS__GPT_FCHG, 4 * nC);
        TRY(zs__gpt_twins_set(g, &tw, err));
        TRY(ops->matmul_fwd(k, s, g->proj, ws.fchg, w, b, N, 4 * C, C, err));
        return ops->residual_fwd(k, s, y, ws.res2, g->proj, nC, err);
    }
    return zs_err_set(err, ZS_ERR_INTERNAL, "gpt: no block part %d", part);
}

int zs__gpt_block_fwd(zs_gpt_t *g, int l, const zs__gpt_bp_t *bp, const float *x, float *y,
                      int full, zs_err_t *err)
{
    /* recompute (full 0): the backward reads nothing after the GELU */
    for (int part = 0; part < (full ? 4 : 3); part++)
        TRY(zs__gpt_block_part_fwd(g, l, part, bp, x, y, err));
    return ZS_OK;
}

int zs__gpt_block_part_bwd(zs_gpt_t *g, int l, int part, const zs__gpt_bp_t *bp, float *gr,
                           zs_err_t *err)
{
    const zs_gpt_ops_t *ops = g->ops;
    void *k = ops->ctx;
    zs_stream_t *s = g->stream;
    const block_off_t *o = &g->bo;
    int B = g->B, T = g->T, C = g->c.width, NH = g->c.heads, N = B * T;
    size_t Cz = (size_t)C, base = zs__gpt_part_start(g, part), nC = (size_t)N * C;
    size_t natt = (size_t)B * NH * T * T;
    ws_t ws = workspace(g, l);
    const float *w, *x;
    zs__gpt_twins_t tw = {.n = 0}; /* for the GEMM-based op about to run */
    /* gr: the part's own gradient; G(off) its tensor at block offset off */
#define G(off) (gr + ((off)-base))
    switch (part) {
    case 3: /* dres = dL/dy on entry; y = r + h Wp + bp */
        TRY(bweight(g, bp, 3, o->fcpw, 4 * Cz * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.fchg, ZS__GPT_FCHG, 4 * nC);
        TRY(zs__gpt_twins_set(g, &tw, err));
        return ops->matmul_bwd(k, s, g->dfch, G(o->fcpw), G(o->fcpb), g->dres, ws.fchg, w, N, 4 * C,
                               C, err);
    case 2: {
        /* GELU's backward also rounds its output for the GEMMs after it into
         * dqkv (free until the attention's backward; N x 3C floats hold the
         * N x 4C 16-bit copy): no cast pass of dfch */
        void *d16 = zs__gpt_dtwins_on(g) ? (void *)g->dqkv : NULL; /* at most 3 twins per op */
        zs__gpt_twin_act(g, l, &tw, ws.fch, ZS__GPT_FCH, 4 * nC);
        if (d16)
            tw.t[tw.n++] = (zs_mixed_twin_t){g->dfch, d16, 4 * nC, 2};
        TRY(zs__gpt_twins_set(g, &tw, err));
        TRY(ops->gelu_bwd(k, s, g->dfch, ws.fch, g->dfch, (size_t)N * 4 * C, err));
        TRY(bweight(g, bp, 2, o->fcw, Cz * 4 * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.ln2, ZS__GPT_LN2, nC);
        if (d16)
            tw.t[tw.n++] = (zs_mixed_twin_t){g->dfch, d16, 4 * nC, 0};
        TRY(zs__gpt_twins_set(g, &tw, err));
        return ops->matmul_bwd(k, s, g->dbuf, G(o->fcw), G(o->fcb), g->dfch, ws.ln2, w, N, C, 4 * C,
                               err);
    }
    case 1:
        TRY(bparam(g, bp, 1, o->ln2w, Cz, 0, &w, err));
        TRY(ops->layernorm_bwd(k, s, g->dres, G(o->ln2w), G(o->ln2b), g->dbuf, ws.res2, w,
                               ws.ln2_mean, ws.ln2_rstd, N, C, err));
        /* dres = dL/dr; r = x + o Wo + bo */
        TRY(bweight(g, bp, 1, o->projw, Cz * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.atty, ZS__GPT_ATTY, nC);
        TRY(zs__gpt_twins_set(g, &tw, err));
        TRY(ops->matmul_bwd(k, s, g->dbuf, G(o->projw), G(o->projb), g->dres, ws.atty, w, N, C, C,
                            err));
        if (g->flash) /* out: the saved (16-bit activations: rounded) atty */
            return ops->attention_flash_bwd(k, s, g->dqkv, g->dbuf, ws.qkv, ws.atty, ws.lse, B, T,
                                            C, NH, err);
        zs__gpt_twin_act(g, l, &tw, ws.qkv, ZS__GPT_QKV, 3 * nC);
        zs__gpt_twin_act(g, l, &tw, ws.att, ZS__GPT_ATT, natt);
        TRY(zs__gpt_twins_set(g, &tw, err));
        return ops->attention_bwd(k, s, g->dqkv, g->datt, g->dbuf, ws.qkv, ws.att, B, T, C, NH,
                                  err);
    case 0:
        TRY(bweight(g, bp, 0, o->qkvw, Cz * 3 * Cz, &w, &tw, err));
        zs__gpt_twin_act(g, l, &tw, ws.ln1, ZS__GPT_LN1, nC);
        TRY(zs__gpt_twins_set(g, &tw, err));
        TRY(ops->matmul_bwd(k, s, g->dbuf, G(o->qkvw), G(o->qkvb), g->dqkv, ws.ln1, w, N, C, 3 * C,
                            err));
        TRY(zs__gpt_resid_in(g, l - 1, &x, err));
        TRY(bparam(g, bp, 0, o->ln1w, Cz, 0, &w, err));
        /* dres = dL/dx after it */
        return ops->layernorm_bwd(k, s, g->dres, G(o->ln1w), G(o->ln1b), g->dbuf, x, w, ws.ln1_mean,
                                  ws.ln1_rstd, N, C, err);
    }
#undef G
    return zs_err_set(err, ZS_ERR_INTERNAL, "gpt: no block part %d", part);
}

int zs__gpt_block_bwd_begin(zs_gpt_t *g, int l, const zs__gpt_bp_t *bp, zs_err_t *err)
{
    TRY(zs__gpt_ckpt_recompute(g, l, bp, err));
    return zs__gpt_act_restore(g, l, err);
}
