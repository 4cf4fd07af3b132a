/*
 * zs_pbconv.h - conversions between wire messages and the C structs they
 * carry, shared by server and client so each field is mapped in one place.
 */
#ifndef ZS_PBCONV_H
#define ZS_PBCONV_H

#include "zeroshard.pb-c.h"
#include "zs_adam.h"
#include "zs_adam_groups.h"

/* *a (initialised here) = hp. */
void zs_pb_adam_set(Zeroshard__AdamConfig *a, const zs_adam_hparams_t *hp);

/* *hp = a. */
void zs_pb_adam_get(const Zeroshard__AdamConfig *a, zs_adam_hparams_t *hp);

/* Parameter groups to the wire: *out (malloc'd array of n pointers into
 * one malloc'd block of n messages; free with zs_pb_groups_free) for a
 * `repeated GroupRange` field. n == 0: *out = NULL. ZS_ERR_NOMEM. */
int zs_pb_groups_set(const zs_group_range_t *r, size_t n, Zeroshard__GroupRange ***out);
void zs_pb_groups_free(Zeroshard__GroupRange **g);

/* Parameter groups from the wire: r[0..n) = g[0..n) (r holds
 * ZS_GROUPS_MAX_RANGES; ZS_ERR_INVALID when n is more). The ranges are not
 * checked here (zs_groups_check). */
int zs_pb_groups_get(Zeroshard__GroupRange *const *g, size_t n, zs_group_range_t *r,
                     zs_err_t *err);

#endif
