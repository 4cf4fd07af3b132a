/*
 * zs_pbconv.h - conversions between wire messages and the C structs they
 * carry, shared by server and client so each field is mapped in one place.
 */
#ifndef ZS_PBCONV_H
#define ZS_PBCONV_H

#include "zeroshard.pb-c.h"
#include "zs_adam.h"

/* *a (initialised here) = hp. */
void zs_pb_adam_set(Zeroshard__AdamConfig *a, const zs_adam_hparams_t *hp);

/* *hp = a. */
void zs_pb_adam_get(const Zeroshard__AdamConfig *a, zs_adam_hparams_t *hp);

#endif
