/*
 * zs_gpt_eval.h - a forward-only GPT for evaluation: zs-train's
 * validation loss (--val-data) and samples (--sample-every), and
 * zs-generate's text from a weights file.
 *
 * It is a second GPT of the training config on a CPU device of its own,
 * fed the full fp32 parameters (zs-train: zs_engine_get_params; zs-generate:
 * zs_init_from_tensor), forward only. So it
 * works the same whatever the stage, the device or the precision of the
 * training (it is the fp32 CPU reference model: on a GPU run it is slow but
 * exact), and it does not touch the engine's buffers. Cost: P floats of
 * host memory for the parameters, P floats on its device, the activations
 * of one micro-batch.
 *
 * Validation slice: the first N tokens of the validation data (all of it
 * if fewer), cut into windows of T + 1 tokens that start every T tokens
 * (inputs the first T, targets the last T, as llm.c's validation loader),
 * window w evaluated by rank w mod W. The caller sums loss * positions and
 * positions over the ranks (MPI_Allreduce) for the mean.
 *
 * Samples: a prompt (GPT-2 BPE with --vocab-dir, bytes for vocab 256)
 * continued token by token, each from the logits at the last position
 * (top-k, temperature, seeded; temperature 0 is greedy), printed decoded.
 *
 * Not here: the command lines, MPI (zs_train_main.c, tools/zs_generate.c).
 */
#ifndef ZS_GPT_EVAL_H
#define ZS_GPT_EVAL_H

#include <stdint.h>

#include <stdio.h>

#include "zs_bpe.h"
#include "zs_data.h"
#include "zs_gpt.h"
#include "zs_status.h"

typedef struct zs_gpt_eval zs_gpt_eval_t;

/* An evaluator for config c with micro-batches of up to max_batch
 * sequences, on its own CPU device. */
int zs_gpt_eval_create(const zs_gpt_config_t *c, int max_batch, zs_gpt_eval_t **out, zs_err_t *err);
void zs_gpt_eval_destroy(zs_gpt_eval_t *ev);

/* Use these parameters (P = zs_gpt_num_params(c) floats, host; copied). */
int zs_gpt_eval_set_params(zs_gpt_eval_t *ev, const float *params, zs_err_t *err);

/* This rank's share of the validation slice of `ntokens` tokens of val:
 * *sum = sum over its windows of the mean loss * T, *positions = its
 * windows * T. ZS_ERR_RANGE if the slice holds no window (fewer than
 * T + 1 tokens), ZS_ERR_CORRUPT for a token >= vocab. */
int zs_gpt_eval_loss(zs_gpt_eval_t *ev, const zs_data_t *val, uint64_t ntokens, int rank, int W,
                     double *sum, uint64_t *positions, zs_err_t *err);

/* Sampling options: top_k 0 = the whole vocab; temperature 0 = greedy
 * (argmax, lowest id on ties). */
typedef struct zs_gpt_sample_opts {
    int top_k;
    double temperature;
    uint64_t seed;
} zs_gpt_sample_opts_t;

/* Continue tok[0..*n) (at least one token) up to `until` tokens (at most
 * the context T; tokens beyond it are not generated): each new token from
 * the logits at the last position of a full forward. */
int zs_gpt_eval_generate(zs_gpt_eval_t *ev, int32_t *tok, int *n, int until,
                         const zs_gpt_sample_opts_t *o, zs_err_t *err);

/* The ids of a prompt: GPT-2 BPE with bpe (may be NULL), else the bytes
 * when vocab is 256; text NULL: <|endoftext|> (bpe) or "\n" (bytes) or id
 * 0. At most max ids. */
int zs_gpt_eval_prompt(const zs_gpt_config_t *c, zs_bpe_t *bpe, const char *text, int32_t *tok,
                       int *n, int max, zs_err_t *err);

/* Print ids as text: decoded with bpe, as bytes for vocab 256, else as
 * numbers. */
void zs_gpt_eval_print(FILE *f, const zs_bpe_t *bpe, int vocab, const int32_t *tok, int n);

#endif
