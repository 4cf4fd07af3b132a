/*
 * zs_gpt_impl.h - internal to worker/model: the GPT's state (struct zs_gpt)
 * shared by zs_gpt.c (layer wiring, binding) and zs_gpt_ckpt.c (activation
 * checkpointing: where each residual slot and block workspace lives, the
 * checkpoint copies and the recompute before a block's backward).
 *
 * Not a public header: nothing outside worker/model includes it.
 */
#ifndef ZS_GPT_IMPL_H
#define ZS_GPT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "zs_gpt.h"
#include "zs_gpt_ops_table.h"
#include "zs_mixed.h"
#include "zs_pool.h"

/* What an engine layer is (zs_gpt_split.c). */
enum { ZS__GL_EMB, ZS__GL_WTE, ZS__GL_WPE, ZS__GL_BLOCK, ZS__GL_PART, ZS__GL_HEAD };
typedef struct {
    int kind;
    int l, part;  /* BLOCK: block l (1..L); PART: part `part` (0..3) of block l */
    int v0, rows; /* WTE: vocabulary rows [v0, v0 + rows) (EMB: 0, V) */
} zs__gpt_layer_t;

/* Offsets (in floats) of a block's tensors, in zs_gpt.h's order. */
typedef struct {
    size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcpw, fcpb, total;
} block_off_t;

struct zs_gpt {
    zs_gpt_config_t c;
    int maxB;
    uint64_t seed;
    int gemm_dt; /* GEMM operand dtype (zs_gpt_set_compute); ZS_DTYPE_F32 by default */
    int attn;    /* ZS_GPT_ATTN_* asked for (zs_gpt_set_attention) */
    int flash;   /* 1: bound with the fused attention (then att_slice is 0) */
    int pdt;     /* parameter dtype forward/backward read (zs_gpt_set_param_dtype) */
    zs_pool_t *pool;
    zs_model_t model;
    block_off_t bo;
    /* engine layers (zs_gpt_split.c, zs__gpt_layout) */
    uint64_t split;        /* zs_gpt_set_split's cap (0: unsplit) */
    int nl;                /* engine layers */
    int wte_rows;          /* rows per wte layer (0: wte not split) */
    zs__gpt_layer_t *lmap; /* [nl] */
    size_t *nparams;       /* [nl] */
    const int **deps;      /* [nl] */
    unsigned char *dro;    /* [nl] zs_model_t.deps_read_only */
    int *depbuf;           /* the deps lists */

    const zs_data_t *data;
    int32_t *fixed_in, *fixed_tg; /* zs_gpt_set_fixed_tokens (host) */
    int fixedB;

    int B, T;        /* current batch */
    int have_batch;  /* tokens loaded */
    int have_head;   /* the head's forward ran on this batch: logits, losses valid */
    int logits_gone; /* the head's backward wrote dlogits over them */
    int next_fwd;    /* next layer forward expects (0 .. L+2) */
    int next_bwd;    /* next layer backward expects (-1 = none) */

    /* set by bind; NULL before */
    zs_dev_t *dev;       /* not owned */
    zs_stream_t *stream; /* compute stream, not owned */
    zs_gpt_ops_t *ops;   /* owned */
    zs_event_t *tok_ev;  /* recorded after each token upload (owned) */
    zs_event_t *done_ev; /* recorded after each forward/backward's work (owned) */
    int32_t *tok_pin;    /* pinned [2 * maxN]: inputs | targets staging */
    float *loss_pin;     /* pinned [maxN]: per-row losses read back */
    float *act_arena;    /* device, ZS_MEM_ACTIVATIONS */
    float *scr_arena;    /* device, ZS_MEM_SCRATCH */
    void *mixed_arena;   /* device, ZS_MEM_SCRATCH: rounded GEMM operands (gemm_dt != F32) */
    zs_mixed_t mixed;    /* what the op table was given (dt F32: none) */
    void *dlogits16;     /* during the head's backward: the logits' gradient as the head
                          * GEMMs' 16-bit operand (zs_gpt.c head_backward), or NULL */

    /* 16-bit parameters and the row-by-row embedding (zs_gpt_param16.c,
     * zs_gpt_split.c; allocated when pdt != ZS_DTYPE_F32 or wte is split) */
    float *pconv;         /* device, ZS_MEM_SCRATCH: small area, then big area */
    void *wte16p;         /* device, ZS_MEM_SCRATCH, gemm_dt: the tied wte, then zero rows up to
                           * ZS_GPT_LOGITS_LD(vocab) (zs__gpt_head16_on; zs_gpt_param16.c) */
    int32_t *remap;       /* device [2 maxN]: embedding ids into the converted rows, then
                             the distinct ids (uniq's copy, read by zs_dev_cast_rows) */
    int32_t *remap_pin;   /* pinned [2 maxN]: their staging */
    zs_event_t *remap_ev; /* recorded after each upload of remap_pin */
    int32_t *seen;        /* host [V]: row of a token in this batch's rows, or -1 */
    int32_t *uniq;        /* remap_pin + maxN: the batch's distinct tokens, first seen first */
    size_t nuniq;

    /* activation checkpointing (zs_gpt_ckpt.c; zs_gpt_set_checkpointing) */
    int ckpt;        /* 1: per-block checkpoints, one block workspace, recompute */
    int ckpt_cpu;    /* 1: the checkpoints live in pinned host memory */
    unsigned debug;  /* ZS_GPT_DEBUG_* (tests only) */
    float *ckpt_pin; /* pinned, ZS_MEM_ACTIVATIONS: L slices of maxN * C (ckpt_cpu) */
    void **leaks;    /* ZS_GPT_DEBUG_LEAK_CKPT: checkpoint copies nobody frees until unbind */
    size_t nleaks, capleaks;

    /* 16-bit activations (zs_gpt_act16.c; zs_gpt_set_activations). act_dt
     * ZS_DTYPE_F32: none of this. BF16 / F16: the residual slots live in
     * resid16 (act_dt elements), `resid` is one fp32 slice (the fp32 view
     * of the slot being read; outputs are written into dbuf); the
     * per-block fp32 arrays (ln1 .. fchg) are one workspace and the saved
     * tensors live in the *16 arrays (L slices; none, NULL, with
     * checkpointing); LayerNorm mean/rstd stay fp32 with L slices (1 with
     * checkpointing) */
    int act_dt;
    void *resid16;
    void *ln1_16, *qkv_16, *att_16, *atty_16, *res2_16, *ln2_16, *fch_16, *fchg_16;

    /* device tensors inside the arenas; per-block arrays hold L slices of
     * the max size (one slice with checkpointing: zs__gpt_ws) */
    size_t maxN;               /* maxB * ctx */
    size_t att_slice;          /* maxB * NH * ctx * ctx; 0 with flash */
    size_t lse_slice;          /* flash: maxB * NH * ctx (attn_lse slices as LayerNorm stats) */
    int32_t *inputs, *targets; /* [maxN] each */
    float *resid;              /* residual slots (zs__gpt_resid): (L+1) slices of maxN * C;
                                * cpu_checkpointing: 2 slices */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fchg;
    float *attn_lse;                  /* flash: [zs__gpt_stat slices][lse_slice], fp32 */
    float *lnf, *lnf_mean, *lnf_rstd; /* head */
    float *logits, *lse, *losses;
    /* scratch */
    float *proj; /* maxN * C */
    float *dres, *dbuf, *dqkv, *datt, *dfch, *dlogits;
};

/* Device pointer of residual slot k (0 .. L) with fp32 activations only
 * (16-bit: zs__gpt_slot, zs__gpt_resid_in): the output of engine layer k
 * (slot 0 the embeddings, slot l the output of block l, slot L the head's
 * input). Without cpu_checkpointing every slot has its own slice; with it
 * slot k is device slice k % 2 (the checkpoints proper are in ckpt_pin). */
float *zs__gpt_resid(const zs_gpt_t *g, int k);

/* Index of block l's (1 .. L) slice in the per-block fp32 activation
 * arrays (ln1 .. fchg): l - 1, or 0 with checkpointing or 16-bit
 * activations (one workspace shared by every block). */
size_t zs__gpt_ws(const zs_gpt_t *g, int l);

/* Index of block l's slice in the LayerNorm statistics (ln1_mean ..
 * ln2_rstd, fp32 always): l - 1, or 0 with checkpointing. */
size_t zs__gpt_stat(const zs_gpt_t *g, int l);

/* ---- 16-bit activations (zs_gpt_act16.c); with act_dt ZS_DTYPE_F32 each
 * of these is the plain fp32 behaviour (no work enqueued) ---- */

/* Bytes per element of the stored residual slots and saved tensors: 4 or 2. */
size_t zs__gpt_act_esize(const zs_gpt_t *g);

/* Stored residual slot k (0 .. L) as it is kept (act_dt elements): what
 * activation checkpointing copies to and from pinned memory. */
void *zs__gpt_slot(const zs_gpt_t *g, int k);

/* *x = an fp32 view of residual slot k for reading: the slot itself
 * (fp32), or the fp32 slice `resid` after an enqueued cast of the 16-bit slot (valid
 * until the next zs__gpt_resid_in). */
int zs__gpt_resid_in(zs_gpt_t *g, int k, const float **x, zs_err_t *err);

/* Where the forward of layer k writes its fp32 output (slot k, or dbuf,
 * backward scratch); zs__gpt_resid_store then enqueues its rounding into slot k. */
float *zs__gpt_resid_out(const zs_gpt_t *g, int k);
int zs__gpt_resid_store(zs_gpt_t *g, int k, zs_err_t *err);

/* After the forward of block l wrote the n-element fp32 tensor t (one of
 * ln1 .. fchg, in the workspace) whose 16-bit home is array a16 (g->ln1_16
 * ..): enqueue t -> 16-bit slice of block l -> t, so t holds the rounded
 * value every later reader (forward and backward) sees. */
int zs__gpt_round(zs_gpt_t *g, int l, float *t, void *a16, size_t slice, size_t n, zs_err_t *err);

/* Where zs__gpt_round puts t's 16-bit copy (block l's slice of a16, or
 * backward scratch under checkpointing), for an op that rounds t itself
 * (the fused residual + LayerNorm); NULL with fp32 activations. */
void *zs__gpt_round_place(const zs_gpt_t *g, int l, const float *t, void *a16, size_t slice);

/* zs__gpt_round for a tensor the rest of the forward does not read (the
 * attention probabilities): without checkpointing only its 16-bit home is
 * written and t keeps the unrounded values (the backward casts the home
 * back, or reads it as the op's twin), which saves a pass over t. With
 * checkpointing, exactly zs__gpt_round. */
int zs__gpt_round_last(zs_gpt_t *g, int l, float *t, void *a16, size_t slice, size_t n,
                       zs_err_t *err);

/* zs__gpt_round for a tensor only ops that take twins read in the forward
 * (ln1, ln2, the attention's output and the MLP's pre-activation and GELU
 * output: GEMMs and GELU): when they read the stored copies (twins on),
 * zs__gpt_round_last, since no op reads t in fp32 again; else
 * zs__gpt_round. */
int zs__gpt_round_gemm(zs_gpt_t *g, int l, float *t, void *a16, size_t slice, size_t n,
                       zs_err_t *err);

/* Before block l's backward without checkpointing: enqueue the casts of
 * the block's 16-bit saved tensors back into the fp32 workspace. */
int zs__gpt_act_restore(zs_gpt_t *g, int l, zs_err_t *err);

/* Block l's saved tensors, as zs__gpt_twins names them. */
enum {
    ZS__GPT_LN1,
    ZS__GPT_QKV,
    ZS__GPT_ATT,
    ZS__GPT_ATTY,
    ZS__GPT_LN2,
    ZS__GPT_FCHG,
    ZS__GPT_FCH
};

/* Twins (zs_mixed.h) for the next GEMM-based op: the fp32 operands whose
 * exact 16-bit values the model already holds, so the op reads those
 * instead of rounding the fp32 ones again (zs_gpt_ops_t.set_twins). */
typedef struct {
    zs_mixed_twin_t t[ZS_MIXED_TWINS_MAX];
    int n;
} zs__gpt_twins_t;

/* Add block l's stored 16-bit copy of saved tensor `which` as the twin of
 * the fp32 workspace tensor t (its first n elements), when the copies hold
 * exactly t's values: 16-bit activations of the GEMMs' own dtype, kept
 * (no checkpointing), a table that takes twins, no test flag against it.
 * Call right after t was rounded (forward) or restored (backward). */
void zs__gpt_twin_act(const zs_gpt_t *g, int l, zs__gpt_twins_t *tw, const float *t, int which,
                      size_t n);

/* Whether the GEMMs may read stored 16-bit parameters as their weight
 * operands (parameters of the GEMMs' own dtype, a table that takes twins). */
int zs__gpt_wtwins_on(const zs_gpt_t *g);

/* Whether an op of the backward may hand the GEMM after it the 16-bit copy
 * of a gradient it writes (GELU's backward: zs_mixed_twin_t.fill 2; the
 * cross-entropy's backward: a fill twin): 16-bit GEMMs, a table that takes
 * twins, no test flag against it. */
int zs__gpt_dtwins_on(const zs_gpt_t *g);

/* Hand tw to the op table for its next GEMM-based entry (nothing if
 * empty) and empty tw for the op after. Call right before that entry. */
int zs__gpt_twins_set(zs_gpt_t *g, zs__gpt_twins_t *tw, zs_err_t *err);

/* Add block l's 16-bit home of saved tensor `which` as a fill twin of t
 * (zs_mixed_twin_t.fill: the op about to run computes t and rounds it into
 * the home for its GEMMs) when the GEMMs read stored 16-bit activations.
 * Returns 1 when added: the caller then stores nothing itself. */
int zs__gpt_twin_fill(const zs_gpt_t *g, int l, zs__gpt_twins_t *tw, const float *t, int which,
                      size_t n);

/* ---- a block in four parts (zs_gpt_block.c) ---- */

/* A block's parameters, one pointer per part (pdt elements; NULL: not
 * given). Part k holds the block's elements [zs__gpt_part_start(k),
 * zs__gpt_part_start(k + 1)); zs__gpt_part_start(4) is the block size. */
typedef struct {
    const void *p[4];
} zs__gpt_bp_t;
size_t zs__gpt_part_start(const zs_gpt_t *g, int part);

/* bp of a whole block's parameters at p. */
void zs__gpt_bp_whole(const zs_gpt_t *g, const void *p, zs__gpt_bp_t *bp);

/* Enqueue part `part` (0..3) of block l's forward, reading residual x
 * (parts 0, 1) and writing its saved tensors into workspace zs__gpt_ws(g,
 * l); part 3 writes the output residual y. */
int zs__gpt_block_part_fwd(zs_gpt_t *g, int l, int part, const zs__gpt_bp_t *bp, const float *x,
                           float *y, zs_err_t *err);

/* Parts 0..3 (full) or 0..2 (recompute: the backward reads nothing after
 * the GELU; y is not written). */
int zs__gpt_block_fwd(zs_gpt_t *g, int l, const zs__gpt_bp_t *bp, const float *x, float *y,
                      int full, zs_err_t *err);

/* Before part 3's backward: recompute (checkpointing; needs parts 0-2) or
 * restore the 16-bit saved tensors of block l. */
int zs__gpt_block_bwd_begin(zs_gpt_t *g, int l, const zs__gpt_bp_t *bp, zs_err_t *err);

/* Enqueue part `part` of block l's backward (called 3..0): accumulates the
 * part's gradients into gr (fp32, the part's own) and carries dres. */
int zs__gpt_block_part_bwd(zs_gpt_t *g, int l, int part, const zs__gpt_bp_t *bp, float *gr,
                           zs_err_t *err);

/* After the forward of layer k (0 .. L) has been enqueued: with
 * cpu_checkpointing, enqueue the copy of residual slot k (k < L) into its
 * pinned checkpoint; with ZS_GPT_DEBUG_LEAK_CKPT, leak a copy of checkpoint
 * 0 (block 1's input) once per forward of layer 1. ZS_OK when there is
 * nothing to do. */
int zs__gpt_ckpt_after_fwd(zs_gpt_t *g, int k, zs_err_t *err);

/* Before block l's backward (checkpointing only; ZS_OK otherwise): copy its
 * pinned checkpoint into residual slot l - 1 (cpu_checkpointing) and
 * recompute the block's forward from it into the workspace, with the same
 * ops on the same inputs as the forward (so the saved tensors are bitwise
 * those of the forward). p: the block's parameters (the backward's). */
int zs__gpt_ckpt_recompute(zs_gpt_t *g, int l, const zs__gpt_bp_t *bp, zs_err_t *err);

/* Allocate the checkpoints' pinned memory (cpu_checkpointing; nothing
 * otherwise). Part of bind; zs__gpt_ckpt_free undoes it. */
int zs__gpt_ckpt_alloc(zs_gpt_t *g, zs_err_t *err);

/* Free the pinned checkpoints and the debug leaks (the model's queued work
 * must have run). */
void zs__gpt_ckpt_free(zs_gpt_t *g);

/* ---- 16-bit parameters (zs_gpt_param16.c); with pdt ZS_DTYPE_F32 each
 * of these reads the fp32 parameters in place (no work enqueued) ---- */

/* The `at` of zs__gpt_param for the big area. */
#define ZS_GPT_BIG ((size_t)-1)

/* *out = fp32 device pointer to the n parameters at element offset off of
 * p: p itself (fp32), else converted on the stream into the small area at
 * element `at` (distinct small tensors of one layer use distinct `at`) or
 * into the big area (ZS_GPT_BIG: one tensor at a time). Valid for the work
 * enqueued before the next conversion into the same place. */
int zs__gpt_param(zs_gpt_t *g, const void *p, size_t off, size_t n, size_t at, const float **out,
                  zs_err_t *err);

/* Vocabulary rows per chunk of the head's GEMMs: V with fp32 parameters or
 * when the whole wte fits the big area. */
int zs__gpt_head_rows(const zs_gpt_t *g);

/* Elements of the big area: the largest weight matrix, or the batch's
 * embedding rows plus wpe. */
size_t zs__gpt_big_elems(const zs_gpt_t *g);

/* Where the batch's embedding rows are converted (the big area). */
float *zs__gpt_rows(const zs_gpt_t *g);

/* The head's GEMMs reading the tied wte (wdeps: the head's dep pointers,
 * the one embedding layer or every wte layer), chunk by chunk, or once
 * over the padded vocabulary where zs__gpt_head16_on (see the file):
 * logits = lnf wte^T (dx 0), or dbuf = dlogits wte (dx 1). */
int zs__gpt_head_gemms(zs_gpt_t *g, void *const *wdeps, int dx, zs_err_t *err);

/* 1 when the head's GEMMs read wte16p, the tied wte in the GEMM dtype
 * padded with zero rows to ZS_GPT_LOGITS_LD(vocab): 16-bit GEMMs and a
 * table that takes twins (CUDA). Known once ops and dtypes are set. */
int zs__gpt_head16_on(const zs_gpt_t *g);

/* ---- engine layers and the row-by-row embedding (zs_gpt_split.c) ---- */

/* (Re)build lmap, nparams, deps and dro for g->split, and point the model
 * at them. */
int zs__gpt_layout(zs_gpt_t *g, zs_err_t *err);

/* Embedding forward in steps: begin (distinct tokens of the batch and the
 * remapped ids, on the host), rows (convert the rows of the tokens in
 * [v0, v0 + rows) of wte, the wte pointer holding row v0), finish (wpe,
 * upload the ids, the lookup into out). */
int zs__gpt_embed_begin(zs_gpt_t *g, zs_err_t *err);
int zs__gpt_embed_rows(zs_gpt_t *g, const void *wte, int v0, int rows, zs_err_t *err);
int zs__gpt_embed_finish(zs_gpt_t *g, const void *wpe, float *out, zs_err_t *err);

/* Backward of a wte layer (rows [v0, v0 + rows), gradient gr): the tied
 * head's dlogits^T lnf for those rows, then the lookup's scatter of dres;
 * of the wpe layer: the sum of dres over the batch. */
int zs__gpt_wte_bwd(zs_gpt_t *g, int v0, int rows, float *gr, zs_err_t *err);
int zs__gpt_wpe_bwd(zs_gpt_t *g, float *gr, zs_err_t *err);

/* The conversion scratch and the embedding's remap buffers (bind; nothing
 * with fp32 parameters); free undoes it once the queued work has run. */
int zs__gpt_param16_alloc(zs_gpt_t *g, zs_err_t *err);
void zs__gpt_param16_free(zs_gpt_t *g);

/* Engine layer `layer`'s initial values into host memory p
 * (zs_model_t.init_params; zs_gpt_init.c): its range of the unsplit
 * layer's stream, so a split model starts from the same numbers. */
int zs__gpt_init_params(void *self, int layer, float *p, zs_err_t *err);

/* Return the status of expr when it is an error (the model's files). */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

#endif
