/*
 * zs_adam_groups.h - parameter groups: ranges of the flat parameter space
 * with their own weight decay and learning rate, as torch.optim's param
 * groups (protocol version 3, GroupRange in proto/zeroshard.proto;
 * docs/protocol.md, "Parameter groups").
 *
 * A model's ranges are consecutive and cover [0, P): range i is
 * [end of range i-1 (0 for i = 0), end). Its weight_decay replaces the
 * hyperparameters' one; its lr is lrs[lr_index] of the step (the step's one
 * lr when the step carries none). No ranges at all means one group: the
 * hyperparameters' weight_decay and the step's lr everywhere.
 *
 * The servers (server/zs_shard*.c) and the engine's own optimizer
 * (worker/engine) cut every AdamW call at range ends with zs_groups_piece,
 * so an element's update is bitwise what one call with its range's
 * scalars gives. Does not: run the update, or decide the ranges (the
 * engine's zs_engine_opts_t.decay and zeroshard.torch do).
 */
#ifndef ZS_ADAM_GROUPS_H
#define ZS_ADAM_GROUPS_H

#include <stddef.h>
#include <stdint.h>

#include "zs_adam.h"
#include "zs_status.h"

#define ZS_GROUPS_MAX_RANGES 1024 /* ranges per model: ~20 wire bytes each */
#define ZS_GROUPS_MAX_LRS    256  /* learning rates per step (lr_index < this) */

typedef struct zs_group_range {
    uint64_t end;       /* exclusive end of the range in the flat space */
    float weight_decay; /* finite, >= 0 */
    uint32_t lr_index;  /* its lr among the step's lrs */
} zs_group_range_t;

/* ZS_OK if r[0..n) are valid ranges of a model of P elements: n <= max,
 * ends strictly ascending with the last == P, weight decays finite and
 * >= 0, lr indexes < ZS_GROUPS_MAX_LRS. n == 0 is valid (no groups). Else
 * ZS_ERR_INVALID naming the first bad range. */
int zs_groups_check(const zs_group_range_t *r, size_t n, uint64_t P, zs_err_t *err);

/* The number of learning rates a step must carry for these ranges: one
 * more than the largest lr_index; 0 when n == 0. */
uint32_t zs_groups_nlrs(const zs_group_range_t *r, size_t n);

/* The piece of [off, off + len) (len > 0) inside one range, from off: its
 * length (>= 1). *hp and *st get base_hp and base_st with that range's
 * weight_decay and lr (lrs[lr_index]; base_st->lr when nlrs == 0). With
 * n == 0 the piece is all of len with the base scalars. r must pass
 * zs_groups_check and nlrs must be 0 or >= zs_groups_nlrs. */
uint64_t zs_groups_piece(const zs_group_range_t *r, size_t n, const float *lrs, size_t nlrs,
                         const zs_adam_hparams_t *base_hp, const zs_adam_step_t *base_st,
                         uint64_t off, uint64_t len, zs_adam_hparams_t *hp, zs_adam_step_t *st);

/* 1 if a[0..n) and b[0..m) are the same ranges (bitwise weight decays). */
int zs_groups_equal(const zs_group_range_t *a, size_t n, const zs_group_range_t *b, size_t m);

#endif
