/*
 * zs_gpt_ops_internal.h - what zs_gpt_ops.c shares with zs_gpt_mixed.c (the
 * mixed-precision entry points): its task splitter and the attention kernels
 * with the rounding of zs_mixed.h switched on. Not part of the API.
 */
#ifndef ZS_GPT_OPS_INTERNAL_H
#define ZS_GPT_OPS_INTERNAL_H

#include <stddef.h>

#include "zs_pool.h"

typedef void (*zs__range_fn)(const void *arg, size_t lo, size_t hi);

/* fn(arg, lo, hi) over [0, n) in pieces of at least `grain` items on the
 * pool (NULL: on the caller); pieces never overlap. */
void zs__op_parallel_for(zs_pool_t *pool, size_t n, size_t grain, zs__range_fn fn, const void *arg);

/* zs_op_attention_fwd; with att_r [B, NH, T, T] non-NULL, each head's
 * probabilities are rounded to dt (BF16 / F16) into att_r and out = att_r v
 * (att keeps the fp32 probabilities). qkv is read as given: the caller
 * passes it rounded. */
void zs__op_attention_fwd(zs_pool_t *pool, int dt, float *att_r, float *out, float *att,
                          const float *qkv, int B, int T, int C, int NH);

/* zs_op_attention_bwd; with att_r non-NULL, dv = round(att)^T dout (the
 * rounded probabilities go to att_r) and D is rounded to dt after the
 * softmax backward, before dq = D k and dk = D^T q. dout and qkv are read as
 * given (the caller rounds them); the softmax backward reads the fp32 att. */
void zs__op_attention_bwd(zs_pool_t *pool, int dt, float *att_r, float *dqkv, float *scratch,
                          const float *dout, const float *qkv, const float *att, int B, int T,
                          int C, int NH);

/* zs_op_attention_flash_fwd with the probabilities of each key tile rounded
 * to dt (BF16 / F16; F32: none) before p v; qkv read as given (the caller
 * rounds it). */
void zs__op_attention_flash_fwd(zs_pool_t *pool, int dt, float *out, float *lse, const float *qkv,
                                int B, int T, int C, int NH);

/* zs_op_attention_flash_bwd with p and dS rounded to dt before their
 * products; the products read qkv and dout_r as given (the caller rounds
 * them), D reads the fp32 dout and out. */
void zs__op_attention_flash_bwd(zs_pool_t *pool, int dt, float *dqkv, const float *dout,
                                const float *dout_r, const float *qkv, const float *out,
                                const float *lse, int B, int T, int C, int NH);

#endif
