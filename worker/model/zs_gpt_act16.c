/*
 * zs_gpt_act16.c - 16-bit activations for the GPT (zs_gpt.h,
 * zs_gpt_set_activations): what the forward keeps for the backward, and
 * the checkpoints of activation checkpointing, stored in bf16 or fp16.
 *
 * Design: a tensor is rounded to 16 bits where it is stored, and every
 * later reader (the rest of the forward, the backward, a checkpoint
 * recompute) reads the rounded value, so forward and backward see the same
 * numbers. Compute inside each op stays fp32: the op table is unchanged.
 *   - residual slots (the block inputs, i.e. the checkpoints) are kept in
 *     16 bits (resid16). A layer writes its fp32 output into dbuf (backward
 *     scratch, free during a forward) and zs__gpt_resid_store rounds it
 *     into its slot; a reader gets an fp32 view by one cast into `resid`,
 *     one fp32 slice (zs__gpt_resid_in).
 *   - a block's saved tensors (ln1, qkv, attention probabilities, attention
 *     output, the residual after attention, ln2, the MLP pre-activation and
 *     GELU output) are computed into ONE fp32 workspace and rounded right
 *     after the op that writes them (fp32 -> 16-bit slice of the block ->
 *     fp32 back: zs__gpt_round), so the next op of the forward reads the
 *     rounded value; the attention probabilities, which the forward does
 *     not read again, only to 16 bits (zs__gpt_round_last), and so are
 *     the tensors only GEMMs read when those read the 16-bit copies
 *     (zs__gpt_round_gemm: ln1, ln2, the GELU output, the attention's
 *     output). The backward
 *     of block l casts the block's slices back into the workspace first
 *     (zs__gpt_act_restore), except those its ops read only as 16-bit
 *     twins (CUDA, GEMMs in the activations' dtype). With checkpointing
 *     nothing but the checkpoints is kept: the rounding goes through
 *     backward scratch (datt, dfch), the recompute rounds exactly as the
 *     forward did, and the workspace already holds the rounded values.
 *   - fp32 always: LayerNorm mean/rstd (L slices, or 1 with
 *     checkpointing), softmax inside the attention op, the head's LayerNorm
 *     output, logits, lse, losses; and every gradient.
 * Conversions are the device's cast op (zs_dev_cast, round to nearest
 * even), enqueued on the compute stream, so the CPU and CUDA devices both
 * get it. Activation bytes: zs_gpt_act_bytes_dt (zs_gpt_ckpt.c).
 */
#include <stdint.h>

#include "zs_gpt_impl.h"

/* Set the activation dtype before bind (zs_gpt.h). */
int zs_gpt_set_activations(zs_gpt_t *g, int act_dt, zs_err_t *err)
{
    if (act_dt != ZS_DTYPE_F32 && act_dt != ZS_DTYPE_BF16 && act_dt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "gpt: activation dtype %d is not fp32, bf16 or fp16",
                          act_dt);
    if (g->dev)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: set the activation dtype before binding");
    g->act_dt = act_dt;
    return ZS_OK;
}

/* The activation dtype (zs_gpt.h). */
int zs_gpt_activations(const zs_gpt_t *g)
{
    return g->act_dt;
}

size_t zs__gpt_act_esize(const zs_gpt_t *g)
{
    return zs_dtype_size((zs_dtype_t)g->act_dt);
}

/* Element `i` of a 16-bit array. */
static void *at16(void *base, size_t i)
{
    return (uint16_t *)base + i;
}

void *zs__gpt_slot(const zs_gpt_t *g, int k)
{
    if (g->act_dt == ZS_DTYPE_F32)
        return zs__gpt_resid(g, k);
    size_t slice = g->maxN * (size_t)g->c.width;
    return at16(g->resid16, (size_t)(g->ckpt_cpu ? k % 2 : k) * slice);
}

int zs__gpt_resid_in(zs_gpt_t *g, int k, const float **x, zs_err_t *err)
{
    if (g->act_dt == ZS_DTYPE_F32) {
        *x = zs__gpt_resid(g, k);
        return ZS_OK;
    }
    size_t n = (size_t)g->B * g->T * (size_t)g->c.width;
    TRY(zs_dev_cast(g->stream, g->resid, ZS_DTYPE_F32, zs__gpt_slot(g, k), (zs_dtype_t)g->act_dt, n,
                    err));
    *x = g->resid;
    return ZS_OK;
}

float *zs__gpt_resid_out(const zs_gpt_t *g, int k)
{
    if (g->act_dt == ZS_DTYPE_F32)
        return zs__gpt_resid(g, k);
    return g->dbuf; /* backward scratch, free during a forward */
}

int zs__gpt_resid_store(zs_gpt_t *g, int k, zs_err_t *err)
{
    if (g->act_dt == ZS_DTYPE_F32)
        return ZS_OK;
    size_t n = (size_t)g->B * g->T * (size_t)g->c.width;
    return zs_dev_cast(g->stream, zs__gpt_slot(g, k), (zs_dtype_t)g->act_dt,
                       zs__gpt_resid_out(g, k), ZS_DTYPE_F32, n, err);
}

/* Block l's slice of a 16-bit array of L per-block slices of `slice`
 * elements (no checkpointing). */
static void *slice16(void *a16, size_t slice, int l)
{
    return at16(a16, ((size_t)l - 1) * slice);
}

void *zs__gpt_round_place(const zs_gpt_t *g, int l, const float *t, void *a16, size_t slice)
{
    if (g->act_dt == ZS_DTYPE_F32)
        return NULL;
    /* with checkpointing nothing is kept in 16 bits: round through backward
     * scratch that is free during a forward and a recompute (datt holds the
     * probabilities' NHTT, dfch N*4C floats = twice the largest other) */
    return !g->ckpt ? slice16(a16, slice, l) : t == g->att ? (void *)g->datt : (void *)g->dfch;
}

int zs__gpt_round(zs_gpt_t *g, int l, float *t, void *a16, size_t slice, size_t n, zs_err_t *err)
{
    if (g->act_dt == ZS_DTYPE_F32)
        return ZS_OK;
    zs_dtype_t dt = (zs_dtype_t)g->act_dt;
    void *h = zs__gpt_round_place(g, l, t, a16, slice);
    if (g->debug & ZS_GPT_DEBUG_ACT16_UNROUNDED) /* the test's break: t stays unrounded */
        return zs_dev_cast(g->stream, h, dt, t, ZS_DTYPE_F32, n, err);
    return zs_dev_round(g->stream, t, h, dt, n, err); /* h = rounded t, t = h: one launch */
}

int zs__gpt_round_last(zs_gpt_t *g, int l, float *t, void *a16, size_t slice, size_t n,
                       zs_err_t *err)
{
    if (g->act_dt == ZS_DTYPE_F32 || g->ckpt)
        return zs__gpt_round(g, l, t, a16, slice, n, err);
    return zs_dev_cast(g->stream, slice16(a16, slice, l), (zs_dtype_t)g->act_dt, t, ZS_DTYPE_F32, n,
                       err);
}

/* Whether the GEMMs read the stored 16-bit activations (zs__gpt_twins). */
static int twins_on(const zs_gpt_t *g)
{
    return g->ops->set_twins && g->act_dt != ZS_DTYPE_F32 && g->act_dt == g->gemm_dt && !g->ckpt &&
           !(g->debug & (ZS_GPT_DEBUG_ACT16_UNROUNDED | ZS_GPT_DEBUG_NO_TWINS));
}

int zs__gpt_round_gemm(zs_gpt_t *g, int l, float *t, void *a16, size_t slice, size_t n,
                       zs_err_t *err)
{
    return twins_on(g) ? zs__gpt_round_last(g, l, t, a16, slice, n, err)
                       : zs__gpt_round(g, l, t, a16, slice, n, err);
}

int zs__gpt_act_restore(zs_gpt_t *g, int l, zs_err_t *err)
{
    if (g->act_dt == ZS_DTYPE_F32 || g->ckpt)
        return ZS_OK;
    zs_dtype_t dt = (zs_dtype_t)g->act_dt;
    size_t sN = g->maxN, C = (size_t)g->c.width, N = (size_t)g->B * g->T;
    size_t natt = g->flash ? 0 : (size_t)g->B * g->c.heads * g->T * g->T;
    /* fp32 workspace tensor, its 16-bit array, slice and live elements */
    struct {
        float *t;
        void *a16;
        size_t slice, n;
    } ts[] = {
        {g->ln1, g->ln1_16, sN * C, N * C},         {g->qkv, g->qkv_16, sN * 3 * C, N * 3 * C},
        {g->att, g->att_16, g->att_slice, natt},    {g->atty, g->atty_16, sN * C, N * C},
        {g->res2, g->res2_16, sN * C, N * C},       {g->ln2, g->ln2_16, sN * C, N * C},
        {g->fch, g->fch_16, sN * 4 * C, N * 4 * C}, {g->fchg, g->fchg_16, sN * 4 * C, N * 4 * C},
    };
    /* With twins the backward's GEMMs read ln1, ln2 and fchg, and with the
     * unfused attention qkv, att and atty, from their homes, and nothing
     * else reads them in fp32 (the unfused attention's softmax backward
     * reads att's twin too; the fused attention's backward reads qkv and
     * atty in fp32: it rounds its own tiles, and D = rowsum(dout * out));
     * the GELU backward reads fch's twin; res2 (LayerNorm backward) is read
     * in fp32 whatever the GEMMs do. */
    int tw = twins_on(g);
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        float *t = ts[i].t;
        if (tw && (t == g->ln1 || t == g->ln2 || t == g->fchg || t == g->fch ||
                   (!g->flash && (t == g->qkv || t == g->att || t == g->atty))))
            continue;
        TRY(zs_dev_cast(g->stream, t, ZS_DTYPE_F32, slice16(ts[i].a16, ts[i].slice, l), dt, ts[i].n,
                        err));
    }
    return ZS_OK;
}

/* Block l's 16-bit home of saved tensor `which` (zs_gpt_impl.h). */
static const void *home(const zs_gpt_t *g, int l, int which)
{
    size_t sN = g->maxN, C = (size_t)g->c.width;
    switch (which) {
    case ZS__GPT_LN1:
        return slice16(g->ln1_16, sN * C, l);
    case ZS__GPT_QKV:
        return slice16(g->qkv_16, sN * 3 * C, l);
    case ZS__GPT_ATT:
        return slice16(g->att_16, g->att_slice, l);
    case ZS__GPT_ATTY:
        return slice16(g->atty_16, sN * C, l);
    case ZS__GPT_LN2:
        return slice16(g->ln2_16, sN * C, l);
    case ZS__GPT_FCH:
        return slice16(g->fch_16, sN * 4 * C, l);
    default:
        return slice16(g->fchg_16, sN * 4 * C, l);
    }
}

void zs__gpt_twin_act(const zs_gpt_t *g, int l, zs__gpt_twins_t *tw, const float *t, int which,
                      size_t n)
{
    if (twins_on(g) && tw->n < ZS_MIXED_TWINS_MAX)
        tw->t[tw->n++] = (zs_mixed_twin_t){t, home(g, l, which), n};
}

int zs__gpt_twin_fill(const zs_gpt_t *g, int l, zs__gpt_twins_t *tw, const float *t, int which,
                      size_t n)
{
    if (!twins_on(g) || tw->n >= ZS_MIXED_TWINS_MAX)
        return 0;
    tw->t[tw->n++] = (zs_mixed_twin_t){t, home(g, l, which), n, 1};
    return 1;
}

int zs__gpt_dtwins_on(const zs_gpt_t *g)
{
    return g->ops->set_twins && g->gemm_dt != ZS_DTYPE_F32 && !(g->debug & ZS_GPT_DEBUG_NO_TWINS);
}

int zs__gpt_wtwins_on(const zs_gpt_t *g)
{
    return g->ops->set_twins && g->gemm_dt != ZS_DTYPE_F32 && g->pdt == g->gemm_dt &&
           !(g->debug & ZS_GPT_DEBUG_NO_TWINS);
}

int zs__gpt_twins_set(zs_gpt_t *g, zs__gpt_twins_t *tw, zs_err_t *err)
{
    int n = tw->n;
    tw->n = 0; /* one op's: the next op starts from none */
    return n ? g->ops->set_twins(g->ops->ctx, tw->t, n, err) : ZS_OK;
}
