/*
 * zs_gpt_ckpt.c - activation checkpointing for the GPT (zs_gpt.h,
 * zs_gpt_set_checkpointing): DeepSpeed's activation_checkpointing with one
 * checkpoint per transformer block.
 *
 * Without checkpointing the forward keeps every block's internals (ln1,
 * qkv, attention probabilities, ..., the GELU output: zs_gpt.c) for the
 * backward, L slices of each. With it:
 *   - forward keeps only each block's input (its checkpoint, residual slot
 *     l - 1) and writes the block's internals into ONE workspace shared by
 *     every block (zs__gpt_ws is 0 for all), overwritten by the next block;
 *   - backward of block l first recomputes block l's forward from its
 *     checkpoint into that workspace (zs__gpt_ckpt_recompute: the same op
 *     table entries, on the same inputs and parameters, as the forward, up
 *     to the GELU, the last tensor the backward reads), then runs the
 *     block's backward. The ops are deterministic, so the recomputed
 *     tensors, the gradients and a whole training run are bitwise those
 *     without checkpointing (tests/test_gpt_ckpt.c).
 * Activation memory: L checkpoints of B x T x C floats + one block's
 * workspace + the embedding/head/loss tensors (zs_gpt_act_bytes), instead
 * of L workspaces.
 *
 * cpu_checkpointing: the L checkpoints live in pinned host memory (one
 * contiguous zs_dev_alloc, ZS_SPACE_PINNED, ZS_MEM_ACTIVATIONS) and the
 * device keeps two residual slices (slot k in slice k % 2). After the
 * forward of layer k < L its output is copied device -> pinned, and before
 * block l's recompute its checkpoint is copied pinned -> device, both as
 * async copies on the compute stream, so stream order alone makes each
 * copy see the data it needs and each slice's next writer wait for it.
 *
 * Works at the zs_gpt.c level (over the op table), so the CPU and CUDA
 * ops both get it. Not here: the block's ops themselves (zs_gpt.c), the
 * config keys (worker/config/zs_config_actckpt.c).
 */
#include <stdlib.h>
#include <string.h>

#include "zs_gpt_impl.h"

/* Set the mode before bind (zs_gpt.h). */
int zs_gpt_set_checkpointing(zs_gpt_t *g, int enabled, int cpu, zs_err_t *err)
{
    if (g->dev)
        return zs_err_set(err, ZS_ERR_STATE, "gpt: set activation checkpointing before binding");
    if (cpu && !enabled)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "gpt: cpu_checkpointing needs activation checkpointing on");
    g->ckpt = enabled ? 1 : 0;
    g->ckpt_cpu = cpu ? 1 : 0;
    return ZS_OK;
}

/* The mode set by zs_gpt_set_checkpointing (zs_gpt.h). */
int zs_gpt_checkpointing(const zs_gpt_t *g, int *cpu)
{
    if (cpu)
        *cpu = g->ckpt_cpu;
    return g->ckpt;
}

/* Test-only debug flags (zs_gpt.h). */
void zs_gpt_set_debug(zs_gpt_t *g, unsigned flags)
{
    g->debug = flags;
}

float *zs__gpt_resid(const zs_gpt_t *g, int k)
{
    size_t slice = g->maxN * (size_t)g->c.width;
    return g->resid + (size_t)(g->ckpt_cpu ? k % 2 : k) * slice;
}

size_t zs__gpt_ws(const zs_gpt_t *g, int l)
{
    return g->ckpt || g->act_dt != ZS_DTYPE_F32 ? 0 : (size_t)l - 1;
}

size_t zs__gpt_stat(const zs_gpt_t *g, int l)
{
    return g->ckpt ? 0 : (size_t)l - 1;
}

/* Bytes of one checkpoint of the current batch (act_dt elements). */
static size_t ckpt_bytes(const zs_gpt_t *g)
{
    return (size_t)g->B * g->T * (size_t)g->c.width * zs__gpt_act_esize(g);
}

/* Pinned checkpoint k (0 .. L-1): block k+1's input (act_dt elements). */
static void *pinned_ckpt(const zs_gpt_t *g, int k)
{
    return (char *)g->ckpt_pin + (size_t)k * g->maxN * (size_t)g->c.width * zs__gpt_act_esize(g);
}

/* ZS_GPT_DEBUG_LEAK_CKPT: a copy of checkpoint 0 in freshly allocated
 * device activations that stays allocated until unbind, as a checkpoint
 * the model forgot to free would. */
static int debug_leak(zs_gpt_t *g, zs_err_t *err)
{
    size_t bytes = ckpt_bytes(g);
    if (g->nleaks == g->capleaks) {
        size_t cap = g->capleaks ? 2 * g->capleaks : 16;
        void **nl = realloc(g->leaks, cap * sizeof *nl);
        if (!nl)
            return zs_err_set(err, ZS_ERR_NOMEM, "gpt: debug leak: out of memory");
        g->leaks = nl;
        g->capleaks = cap;
    }
    void *mem;
    TRY(zs_dev_alloc(g->dev, ZS_SPACE_DEVICE, ZS_MEM_ACTIVATIONS, bytes, &mem, err));
    g->leaks[g->nleaks++] = mem;
    return zs_dev_memcpy(g->stream, mem, zs__gpt_slot(g, 0), bytes, err);
}

int zs__gpt_ckpt_after_fwd(zs_gpt_t *g, int k, zs_err_t *err)
{
    int L = g->c.layers;
    if (g->ckpt_cpu && k < L)
        TRY(zs_dev_memcpy(g->stream, pinned_ckpt(g, k), zs__gpt_slot(g, k), ckpt_bytes(g), err));
    if ((g->debug & ZS_GPT_DEBUG_LEAK_CKPT) && k == 1)
        TRY(debug_leak(g, err));
    return ZS_OK;
}

int zs__gpt_ckpt_recompute(zs_gpt_t *g, int l, const zs__gpt_bp_t *bp, zs_err_t *err)
{
    if (!g->ckpt)
        return ZS_OK;
    if (g->ckpt_cpu)
        TRY(zs_dev_memcpy(g->stream, zs__gpt_slot(g, l - 1), pinned_ckpt(g, l - 1), ckpt_bytes(g),
                          err));
    const float *x;
    TRY(zs__gpt_resid_in(g, l - 1, &x, err));
    return zs__gpt_block_fwd(g, l, bp, x, NULL, 0, err);
}

int zs__gpt_ckpt_alloc(zs_gpt_t *g, zs_err_t *err)
{
    if (!g->ckpt_cpu)
        return ZS_OK;
    size_t bytes = (size_t)g->c.layers * g->maxN * (size_t)g->c.width * zs__gpt_act_esize(g);
    void *mem;
    int rc = zs_dev_alloc(g->dev, ZS_SPACE_PINNED, ZS_MEM_ACTIVATIONS, bytes, &mem, err);
    if (rc) {
        zs_err_prefix(err, "gpt: %zu MiB of pinned checkpoints: ", bytes >> 20);
        return rc;
    }
    g->ckpt_pin = mem;
    return ZS_OK;
}

void zs__gpt_ckpt_free(zs_gpt_t *g)
{
    if (g->ckpt_pin)
        zs_dev_free(g->dev, g->ckpt_pin);
    g->ckpt_pin = NULL;
    for (size_t i = 0; i < g->nleaks; i++)
        zs_dev_free(g->dev, g->leaks[i]);
    free(g->leaks);
    g->leaks = NULL;
    g->nleaks = g->capleaks = 0;
}

/* Floats of a slot of n elements in an arena (zs_gpt.c's carve: 16-float
 * alignment). */
static uint64_t r16(uint64_t n)
{
    return (n + 15) / 16 * 16;
}

/* Floats holding n 16-bit elements. */
static uint64_t h2(uint64_t n)
{
    return (n + 1) / 2;
}

/* What bind allocates for activations (zs_gpt.h). */
void zs_gpt_act_bytes(const zs_gpt_config_t *c, int max_batch, int ckpt, int cpu,
                      zs_gpt_act_bytes_t *out)
{
    zs_gpt_act_bytes_dt(c, max_batch, ckpt, cpu, ZS_DTYPE_F32, out);
}

/* The same with activations in act_dt (zs_gpt.h, zs_gpt_act16.c). */
void zs_gpt_act_bytes_dt(const zs_gpt_config_t *c, int max_batch, int ckpt, int cpu, int act_dt,
                         zs_gpt_act_bytes_t *out)
{
    zs_gpt_act_bytes_attn(c, max_batch, ckpt, cpu, act_dt, ZS_GPT_ATTN_UNFUSED, out);
}

/* The same with the attention implementation (zs_gpt.h); flash as bind
 * resolves it (the caller asks for flash only where bind will use it). */
void zs_gpt_act_bytes_attn(const zs_gpt_config_t *c, int max_batch, int ckpt, int cpu, int act_dt,
                           int attn, zs_gpt_act_bytes_t *out)
{
    uint64_t L = (uint64_t)c->layers, C = (uint64_t)c->width, V = (uint64_t)c->vocab;
    uint64_t N = (uint64_t)max_batch * (uint64_t)c->ctx;
    int flash = attn == ZS_GPT_ATTN_FLASH;
    uint64_t NHT = (uint64_t)max_batch * (uint64_t)c->heads * (uint64_t)c->ctx;
    uint64_t NHTT = flash ? 0 : NHT * (uint64_t)c->ctx, NHTl = flash ? NHT : 0;
    cpu = ckpt && cpu;
    int a16 = act_dt != ZS_DTYPE_F32;
    uint64_t es = a16 ? 2 : 4;
    /* fp32 per-block tensors: L slices, or one workspace (checkpointing or
     * 16-bit activations); LayerNorm statistics: L, or 1 (checkpointing);
     * 16-bit saved tensors (a16): L slices, or none (checkpointing) */
    uint64_t nb = ckpt || a16 ? 1 : L, ns = ckpt ? 1 : L, nh = a16 && !ckpt ? L : 0;
    uint64_t R = cpu ? 2 : L + 1;
    /* per-block slots, in zs_gpt.c's order: ln1, mean, rstd, qkv, att, lse
     * (flash; slices as the statistics), atty, res2, ln2, mean, rstd, fch,
     * fchg */
    uint64_t block = r16(nb * N * C) + 2 * r16(ns * N) + r16(nb * N * 3 * C) + r16(nb * NHTT) +
                     r16(ns * NHTl) + r16(nb * N * C) * 3 + 2 * r16(ns * N) +
                     2 * r16(nb * N * 4 * C);
    /* their 16-bit homes, two elements per float: ln1, qkv, att, atty, res2,
     * ln2, fch, fchg */
    block += r16(h2(nh * N * C)) + r16(h2(nh * N * 3 * C)) + r16(h2(nh * NHTT)) +
             3 * r16(h2(nh * N * C)) + 2 * r16(h2(nh * N * 4 * C));
    uint64_t head =
        r16(N * C) + 2 * r16(N) + r16(N * ZS_GPT_LOGITS_LD(V)) + 2 * r16(N) + 2 * r16(N);
    /* residual slots: fp32, or one fp32 slice + the slots in 16 bits */
    uint64_t resid = a16 ? r16(N * C) + r16(h2(R * N * C)) : r16(R * N * C);
    memset(out, 0, sizeof *out);
    out->checkpoints = L * N * C * es;
    out->blocks = block * 4;
    out->device = (resid + block + head) * 4;
    out->pinned = cpu ? out->checkpoints : 0;
    /* the rest: the residual slots that are not checkpoints and the head */
    out->other = out->device - (cpu ? 0 : out->checkpoints) - out->blocks;
}
