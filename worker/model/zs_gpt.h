/*
 * zs_gpt.h - the reference GPT-2-style model as a zs_model_t for the
 * engine: token + position embedding, pre-LayerNorm blocks with causal
 * multi-head self-attention and a GELU (tanh approximation) MLP, final
 * LayerNorm, LM head tied to the token embedding, mean cross-entropy loss.
 * Same math as GPT-2 / llm.c's train_gpt2.c.
 *
 * Engine layers (zs_engine.h): 0 = embeddings (wte [V, C], wpe [T, C]);
 * 1..L = blocks; L+1 = final LayerNorm + tied head (deps {0}) + loss.
 * Parameter order inside a block: ln1_w, ln1_b [C]; qkv_w [C, 3C], qkv_b
 * [3C]; attn_proj_w [C, C], attn_proj_b [C]; ln2_w, ln2_b [C]; fc_w
 * [C, 4C], fc_b [4C]; fc_proj_w [4C, C], fc_proj_b [C]. Weights are stored
 * [in, out] row-major (y = x W + b). Initialisation: GPT-2's (normal 0.02,
 * residual projections 0.02/sqrt(2L), biases 0, LayerNorm 1/0) from a seed,
 * into host memory (init_params).
 *
 * Device: the model runs on the device it is bound to (model->bind or
 * zs_gpt_bind: a zs_dev_t and its compute stream). Binding picks the op
 * table of that device kind (zs_gpt_ops_table.h: CPU, or CUDA in builds
 * with ZS_WITH_CUDA) and allocates activations and scratch in device memory
 * (counted as ZS_MEM_ACTIVATIONS / ZS_MEM_SCRATCH) plus pinned staging for
 * tokens and losses (and, with cpu_checkpointing, the pinned checkpoints:
 * ZS_MEM_ACTIVATIONS; see zs_gpt_set_checkpointing). forward/backward take
 * device parameter pointers (fp32, or the dtype of zs_gpt_set_param_dtype)
 * and only ENQUEUE work on the compute stream; loss()
 * and zs_gpt_copy_logits wait for it. On the CPU device the kernels run on
 * a thread pool (BLAS for the GEMMs) from the stream's thread.
 *
 * Batches come from a zs_data_t (zs_gpt_set_data) through the engine's
 * load_batch, or directly with zs_gpt_set_tokens (tests); both need a bound
 * model.
 */
#ifndef ZS_GPT_H
#define ZS_GPT_H

#include <stdint.h>
#include <stdio.h>

#include "zs_adam_groups.h"
#include "zs_data.h"
#include "zs_engine.h"

typedef struct zs_gpt_config {
    int layers; /* L */
    int heads;  /* NH; width % heads == 0 */
    int width;  /* C */
    int ctx;    /* T: maximum (and training) sequence length */
    int vocab;  /* V */
} zs_gpt_config_t;

typedef struct zs_gpt zs_gpt_t;

/* Parameters of the whole model (the tied head adds none). */
uint64_t zs_gpt_num_params(const zs_gpt_config_t *c);

/* Model for micro-batches of up to max_batch sequences; parameters are
 * initialised from `seed` by the engine through init_params. Allocates no
 * tensors yet (bind does). *out freed with zs_gpt_destroy, which waits for
 * the work the model queued (through its own events, so the compute stream
 * may already be destroyed, as the engine does) and frees its device
 * memory: destroy the model before its device. */
int zs_gpt_create(const zs_gpt_config_t *c, int max_batch, uint64_t seed, zs_gpt_t **out,
                  zs_err_t *err);
void zs_gpt_destroy(zs_gpt_t *g);

/* With ZS_GPT_PROFILE=1 in the environment at bind, every op of the model
 * is timed with its stream waited for (worker/model/zs_gpt_ops_prof.c; a
 * measuring aid that serialises the ops), and destroy prints the rows to
 * stderr. This prints the rows so far to f; nothing when profiling is off
 * or the model is not bound. */
void zs_gpt_profile_report(const zs_gpt_t *g, FILE *f);

/* The engine-facing model (owned by g). */
const zs_model_t *zs_gpt_model(zs_gpt_t *g);

/* Bind to `dev` with compute stream `compute` (a stream of dev; neither
 * owned): what model->bind calls. Chooses the op table for dev (ZS_ERR_INVALID
 * "GPT ops for device X are not built" for a device without one) and
 * allocates every activation and scratch buffer with zs_dev_alloc. Once
 * only (ZS_ERR_STATE after). */
int zs_gpt_bind(zs_gpt_t *g, zs_dev_t *dev, zs_stream_t *compute, zs_err_t *err);

/* GEMM precision (kernels/zs_mixed.h): ZS_DTYPE_F32 (the default: fp32
 * GEMMs, no TF32), or ZS_DTYPE_BF16 / ZS_DTYPE_F16: every GEMM reads its
 * operands rounded to that dtype and accumulates in fp32 (tensor cores on
 * CUDA; the CPU rounds the same operands and runs sgemm, so the two agree
 * up to the order of fp32 additions); everything else stays fp32. Before
 * bind only (ZS_ERR_STATE after); bind then allocates the rounding scratch
 * (ZS_MEM_SCRATCH). */
int zs_gpt_set_compute(zs_gpt_t *g, int gemm_dt, zs_err_t *err);

/* The GEMM dtype set by zs_gpt_set_compute. */
int zs_gpt_compute(const zs_gpt_t *g);

/* Attention implementation. ZS_GPT_ATTN_UNFUSED (the default): the
 * probabilities [B, NH, T, T] are computed, kept per block for the backward
 * and counted in the activations. ZS_GPT_ATTN_FLASH: the op table's fused
 * attention (attention_flash_*: FlashAttention-2 style on CUDA, its CPU twin
 * on the CPU device), which keeps only lse [B, NH, T] (fp32, also with
 * 16-bit activations) and recomputes the probabilities in the backward.
 * Flash is used only where bind finds it possible: the table has it, the
 * head size fits it (CUDA: a multiple of 16 up to 128) and, on CUDA, the
 * GEMM dtype is bf16 / fp16 (zs_gpt_set_compute); otherwise the model runs
 * unfused (zs_gpt_attention says which). Results differ from unfused by
 * rounding (the fused probabilities are rounded per key tile against a
 * running max). Before bind only (ZS_ERR_STATE after); other modes
 * ZS_ERR_INVALID. */
/* Row stride of the logits and their gradient, in floats: the vocabulary
 * rounded up to a multiple of 64 (50257 -> 50304, as llm.c pads it), so
 * every row of the head's GEMMs starts 256-byte aligned. cuBLASLt's fast
 * kernels want aligned rows: on an H200 the three head GEMMs of GPT-2
 * 124M (B=16) took 35 ms of a 140 ms step with rows of 50257 floats
 * (bench/RESULTS.md). The padding is never read. */
#define ZS_GPT_LOGITS_LD(V) ((((V) + 63) / 64) * 64)

#define ZS_GPT_ATTN_UNFUSED 0
#define ZS_GPT_ATTN_FLASH   1
int zs_gpt_set_attention(zs_gpt_t *g, int mode, zs_err_t *err);

/* What the bound model runs (ZS_GPT_ATTN_*); before bind, what was asked. */
int zs_gpt_attention(const zs_gpt_t *g);

/* Activation checkpointing (zs_gpt_ckpt.c; DeepSpeed's
 * activation_checkpointing section). enabled: the forward keeps only each
 * block's input (its checkpoint) and one block's workspace; the backward of
 * a block recomputes its forward from the checkpoint first. Results are
 * bitwise those without it. cpu: the checkpoints live in pinned host memory
 * (cpu_checkpointing; needs enabled, else ZS_ERR_INVALID) and are copied on
 * the compute stream. Before bind only (ZS_ERR_STATE after). */
int zs_gpt_set_checkpointing(zs_gpt_t *g, int enabled, int cpu, zs_err_t *err);

/* 1 when checkpointing is on; *cpu (may be NULL) gets cpu_checkpointing. */
int zs_gpt_checkpointing(const zs_gpt_t *g, int *cpu);

/* Activation precision (zs_gpt_act16.c): ZS_DTYPE_F32 (the default), or
 * ZS_DTYPE_BF16 / ZS_DTYPE_F16: what the forward keeps for the backward
 * (the residual stream between blocks, i.e. the checkpoints of activation
 * checkpointing, and each block's LayerNorm outputs, qkv, attention
 * probabilities and output, residual after attention, MLP pre-activation
 * and GELU output) is stored in that dtype. Each is rounded (nearest even)
 * where it is stored, and the rest of the forward, the backward and a
 * checkpoint recompute all read the rounded value. Ops compute in fp32;
 * LayerNorm mean/rstd, softmax, the head's LayerNorm output, logits, the
 * loss and every gradient stay fp32. Independent of the GEMM precision
 * (zs_gpt_set_compute). Checkpointing stays bitwise equal to no
 * checkpointing. Before bind only (ZS_ERR_STATE after); ZS_ERR_INVALID for
 * another dtype. */
int zs_gpt_set_activations(zs_gpt_t *g, int act_dt, zs_err_t *err);

/* The activation dtype set by zs_gpt_set_activations. */
int zs_gpt_activations(const zs_gpt_t *g);

/* Parameter precision (zs_gpt_param16.c): ZS_DTYPE_F32 (the default:
 * forward and backward get fp32 parameters), or ZS_DTYPE_BF16 /
 * ZS_DTYPE_F16: they get parameters in that dtype, as the engine stores
 * them, and convert each tensor just before use into a bounded fp32
 * scratch (ZS_MEM_SCRATCH, allocated at bind: one weight matrix or one
 * chunk of vocabulary rows of the tied head at a time, plus the layer's
 * LayerNorm weights and biases), so no fp32 copy of the model is needed.
 * Results equal those of fp32 views of the same 16-bit values bitwise,
 * except that a vocabulary wider than the scratch sums the head's input
 * gradient chunk by chunk (on CUDA with 16-bit GEMMs the head's GEMMs run
 * once, over a zero-padded 16-bit copy of wte). The engine sets it through
 * zs_model_t.set_param_dtype. Before bind only (ZS_ERR_STATE after);
 * ZS_ERR_INVALID for another dtype. */
int zs_gpt_set_param_dtype(zs_gpt_t *g, int dt, zs_err_t *err);

/* The parameter dtype set by zs_gpt_set_param_dtype. */
int zs_gpt_param_dtype(const zs_gpt_t *g);

/* Engine layers no larger than max_elems parameters where the model can
 * split (zs_gpt_split.c): the token embedding into layers of whole
 * vocabulary rows (then one layer for wpe), each block into its four
 * parts (LayerNorm 1 + qkv; attention projection + LayerNorm 2; MLP up;
 * MLP down). 0 (the default): the natural layers (embeddings, L blocks,
 * head). The engine's gradient buckets are whole engine layers, so this is
 * what lets them be smaller than a block or the embedding; zs-train sets
 * it to reduce_bucket_size with --split-layers. Same flat parameter order
 * and initial values; results within fp32 reordering of the unsplit model
 * (the head's input gradient is summed by vocabulary chunk). A split
 * model computes the head's gradient in place of the logits (one [B, T, V]
 * fp32 buffer less): zs_gpt_copy_logits after its backward is refused
 * (ZS_ERR_STATE). Call before
 * the engine reads the model (zs_gpt_model's nlayers, nparams and deps
 * change) and before bind (ZS_ERR_STATE after). */
int zs_gpt_set_split(zs_gpt_t *g, uint64_t max_elems, zs_err_t *err);

/* Engine layers of the model as split now (L + 2 unsplit). */
int zs_gpt_num_layers(const zs_gpt_t *g);

/* Test-only debug flags (ZS_GPT_DEBUG_*). ZS_GPT_DEBUG_LEAK_CKPT: every forward of block 1
 * allocates a copy of its checkpoint (device, ZS_MEM_ACTIVATIONS) that is
 * freed only at unbind, as a checkpoint never freed would be: the memory
 * tests must catch it. */
#define ZS_GPT_DEBUG_LEAK_CKPT 1u
/* ZS_GPT_DEBUG_ACT16_UNROUNDED (16-bit activations only): a saved tensor
 * is stored rounded but the forward's workspace keeps the unrounded value,
 * so with checkpointing the backward reads unrounded values where without
 * it reads rounded ones: the bitwise tests must catch it. */
#define ZS_GPT_DEBUG_ACT16_UNROUNDED 2u
/* ZS_GPT_DEBUG_NO_TWINS: the GEMMs round their 16-bit activation operands
 * again instead of reading the stored 16-bit copies (zs__gpt_twins): the
 * bitwise test of the two ways. */
#define ZS_GPT_DEBUG_NO_TWINS 4u
/* ZS_GPT_DEBUG_NO_OUT16: the qkv and MLP up-projection matmuls write fp32
 * outputs that the model rounds into their 16-bit homes, instead of writing
 * the homes in their GEMMs: the test of the 16-bit GEMM outputs. */
#define ZS_GPT_DEBUG_NO_OUT16 8u
void zs_gpt_set_debug(zs_gpt_t *g, unsigned flags);

/* The activation memory bind allocates for a model of config c and
 * max_batch, with or without checkpointing (and cpu_checkpointing), in
 * bytes: device and pinned are exact (ZS_MEM_ACTIVATIONS per space);
 * checkpoints (L x B x T x C floats, pinned with cpu, else in device),
 * blocks (the per-block saved tensors: L workspaces, or one with
 * checkpointing) and other (embedding output slots that are not
 * checkpoints, the head's LayerNorm, logits, losses, token ids) break it
 * down: device = [checkpoints] + blocks + other. */
typedef struct zs_gpt_act_bytes {
    uint64_t device, pinned;
    uint64_t checkpoints, blocks, other;
} zs_gpt_act_bytes_t;
void zs_gpt_act_bytes(const zs_gpt_config_t *c, int max_batch, int ckpt, int cpu,
                      zs_gpt_act_bytes_t *out);

/* The same for activations kept in act_dt (zs_gpt_set_activations): with
 * bf16 / fp16 the checkpoints are 2-byte elements, blocks holds the 16-bit
 * saved tensors plus one fp32 block workspace and the fp32 LayerNorm
 * statistics, and other includes one fp32 residual slice.
 * zs_gpt_act_bytes is this with ZS_DTYPE_F32. */
void zs_gpt_act_bytes_dt(const zs_gpt_config_t *c, int max_batch, int ckpt, int cpu, int act_dt,
                         zs_gpt_act_bytes_t *out);

/* The same with the attention implementation bind will use (flash: no
 * [B, NH, T, T] probabilities, lse [B, NH, T] per block instead; see
 * zs_gpt_set_attention). zs_gpt_act_bytes_dt is this with
 * ZS_GPT_ATTN_UNFUSED. */
void zs_gpt_act_bytes_attn(const zs_gpt_config_t *c, int max_batch, int ckpt, int cpu, int act_dt,
                           int attn, zs_gpt_act_bytes_t *out);

/* Use `data` for load_batch (not owned; vocab must match). */
int zs_gpt_set_data(zs_gpt_t *g, const zs_data_t *data, zs_err_t *err);

/* Set the current batch directly: inputs/targets [B, T] token ids in host
 * memory (copied before return; their upload is enqueued on the compute
 * stream). Needs a bound model. */
int zs_gpt_set_tokens(zs_gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                      zs_err_t *err);

/* Copy the logits [B, T, V] of the last full forward into host_out (B*T*V
 * floats of host memory) and wait for the compute stream. ZS_ERR_STATE
 * before the head's forward on the current batch; a queued error of the
 * stream is returned. */
int zs_gpt_copy_logits(zs_gpt_t *g, float *host_out, zs_err_t *err);

/* A fixed batch for load_batch: inputs/targets [B, ctx]; every micro-batch
 * then uses these tokens (B must equal the engine's micro batch) instead of
 * the data. For tests and benchmarks; inputs == NULL clears it. */
int zs_gpt_set_fixed_tokens(zs_gpt_t *g, const int32_t *inputs, const int32_t *targets, int B,
                            zs_err_t *err);

/* Run the kernels on n threads (n <= 0: all online CPUs). The default is
 * $ZS_GPT_THREADS, else all online CPUs. When bound to the CPU device,
 * waits for the compute stream first (and returns its error, if any); on
 * CUDA the threads only run init_params. */
int zs_gpt_set_threads(zs_gpt_t *g, int n, zs_err_t *err);

/* One parameter tensor in the flat buffer of all layers in order (layer 0's
 * parameters first, then each layer's right after the previous one's). */
typedef struct zs_gpt_tensor {
    char name[32];   /* "wte", "wpe", "h0.ln1_w" .. "h{L-1}.fc_proj_b", "lnf_w", "lnf_b" */
    int layer;       /* engine layer that owns it */
    uint64_t offset; /* in floats from the start of the flat buffer */
    uint64_t rows, cols, numel;
} zs_gpt_tensor_t;

/* Number of parameter tensors: 2 + 12 L + 2. */
int zs_gpt_num_tensors(const zs_gpt_config_t *c);

/* Tensor i (0 .. zs_gpt_num_tensors - 1) in flat-buffer order. */
int zs_gpt_tensor(const zs_gpt_config_t *c, int i, zs_gpt_tensor_t *t);

/* Which parameters take weight decay (zs_gpt_decay.c; zs-train --decay). */
typedef enum {
    ZS_GPT_DECAY_ALL = 0, /* every parameter */
    ZS_GPT_DECAY_2D,      /* 2-D tensors: embeddings and matmul weights (nanoGPT, llm.c) */
    ZS_GPT_DECAY_MATMUL,  /* the blocks' matmul weights: not biases, norms, embeddings */
} zs_gpt_decay_t;

/* "all", "2d" or "matmul" into *out; ZS_ERR_INVALID otherwise. */
int zs_gpt_decay_parse(const char *s, zs_gpt_decay_t *out);

/* The parameter groups of mode (kernels/zs_adam_groups.h): consecutive
 * ranges of the flat buffer with weight_decay on the decayed tensors and 0
 * on the others, lr index 0. *out malloc'd (caller frees); mode ALL: none
 * (*out NULL, *n 0). ZS_ERR_RANGE past ZS_GROUPS_MAX_RANGES ranges. */
int zs_gpt_decay_groups(const zs_gpt_config_t *c, zs_gpt_decay_t mode, float weight_decay,
                        zs_group_range_t **out, size_t *n, zs_err_t *err);

/* The model manifest for zs_engine_opts_t.manifest (zs_gpt_manifest.c):
 * JSON naming every parameter tensor as Hugging Face's GPT-2 does
 * (transformer.wte.weight, transformer.h.0.attn.c_attn.weight [C, 3C], ...,
 * transformer.ln_f.bias; the LM head is tied to wte and not listed), with
 * its shape and flat offset, the storage dtype (F32), the model `name`
 * (NULL: "zs-gpt") and the config. *out is malloc'd (caller frees). */
int zs_gpt_manifest(const zs_gpt_config_t *c, const char *name, char **out, zs_err_t *err);

/* zs_gpt_manifest with the GPT-2 vocabulary the training data records
 * (bpe; NULL: none) in the model object as "tokenizer": {"type":
 * "gpt2-bpe", "vocab_dir", "encoder_xxh3", "merges_xxh3" (16 hex digits)}:
 * zs-ctl export carries the model object into its metadata, and
 * zs-generate decodes with it (zs_init_from_bpe). */
int zs_gpt_manifest_bpe(const zs_gpt_config_t *c, const char *name, const zs_data_bpe_t *bpe,
                        char **out, zs_err_t *err);

#endif
