/*
 * zs_init_from.h - pretrained GPT-2 weights in: a Hugging Face GPT-2
 * safetensors file or an llm.c checkpoint, as the initial parameters of the
 * reference GPT (zs_gpt.h) for `zs-train --init-from F`.
 *
 * Formats, told apart by their first bytes:
 *   - safetensors (8-byte little-endian header length, JSON header, data):
 *     the tensors of GPT2LMHeadModel / GPT2Model, named
 *     "transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...,
 *     or without the "transformer." prefix (GPT2Model's own files); what
 *     `zs-ctl export` writes, so export -> init-from is bitwise. F32, BF16
 *     and F16 tensors are read (widened to fp32). Ignored: lm_head.weight
 *     (tied to wte), the attention mask buffers (.attn.bias,
 *     .attn.masked_bias), and the Adam moments of `export --optimizer`
 *     (.exp_avg, .exp_avg_sq): the optimizer starts fresh. Any other name,
 *     a missing tensor or a shape that does not fit the others is refused.
 *     Conv1D weights are [in, out], like ours: nothing is transposed.
 *   - llm.c checkpoints (gpt2_124M.bin of train_gpt2.py / write_model): a
 *     256 x int32 header (magic 20240326, version 3 = fp32 or 5 = bf16,
 *     max_seq_len, vocab_size, num_layers, num_heads, channels,
 *     padded_vocab_size), then the 16 parameter arrays in llm.c's order,
 *     matrices [out, in] (transposed here); wte's padded rows beyond
 *     vocab_size are dropped.
 * The shape (layers, width, positions, vocab; heads where the file says:
 * llm.c's header, the model metadata of our export) comes from the file.
 *
 * Not here: the model (zs_gpt.c), the command line (zs_train_main.c).
 */
#ifndef ZS_INIT_FROM_H
#define ZS_INIT_FROM_H

#include <stdint.h>

#include "zs_engine.h"
#include "zs_gpt.h"
#include "zs_status.h"

typedef struct zs_init_from zs_init_from_t;

/* Open and validate a weights file (mapped read-only; sizes checked against
 * the file before anything is allocated from them). *out freed with
 * zs_init_from_free. ZS_ERR_NOTFOUND/ZS_ERR_IO if it cannot be read,
 * ZS_ERR_CORRUPT (naming the file and the problem) if it is not one of the
 * two formats or does not hold a whole GPT-2. */
int zs_init_from_load(const char *path, zs_init_from_t **out, zs_err_t *err);
void zs_init_from_free(zs_init_from_t *f);

/* The file's shape: layers, width, ctx (positions of wpe), vocab; heads 0
 * when the file does not say. */
zs_gpt_config_t zs_init_from_shape(const zs_init_from_t *f);

/* The GPT-2 vocabulary our export's metadata names (the training data's
 * record, zs_gpt_manifest_bpe), NULL when the file names none (llm.c
 * checkpoints, other safetensors). Load it with zs_data_bpe_load. */
const zs_data_bpe_t *zs_init_from_bpe(const zs_init_from_t *f);

/* "safetensors" or "llm.c". */
const char *zs_init_from_format(const zs_init_from_t *f);

/* Settle the model config *c for this file: layers, width and vocab are
 * the file's (a value the user gave, given_* != 0, that differs is
 * ZS_ERR_INVALID naming both); ctx is the file's positions unless the user
 * gave a smaller one (then wpe's first ctx rows are used); heads is the
 * file's, else the user's, else width / 64 (GPT-2's head size) when that
 * divides. data_vocab must equal the file's vocab. */
int zs_init_from_settle(const zs_init_from_t *f, zs_gpt_config_t *c, int given_layers,
                        int given_width, int given_heads, int given_ctx, uint32_t data_vocab,
                        zs_err_t *err);

/* Tensor i of config c (zs_gpt_tensor order) as fp32 [rows, cols] into
 * out (numel floats). c must have been settled for f. */
int zs_init_from_tensor(const zs_init_from_t *f, const zs_gpt_config_t *c, int i, float *out,
                        zs_err_t *err);

/* A model that is `inner` (the GPT of config c) except that init_params
 * copies the file's weights (zs_init_from_model.c). The returned model
 * lives in f: keep f until the engine is destroyed. */
const zs_model_t *zs_init_from_wrap(zs_init_from_t *f, const zs_gpt_config_t *c,
                                    const zs_model_t *inner);

#endif
