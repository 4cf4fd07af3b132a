/*
 * zs_data_impl.h - the inside of zs_data_t, shared by zs_data.c (the
 * zeroshard header, sampling, writing) and zs_data_shards.c (opening: path
 * lists and globs, mapping, llm.c .bin shards). Not a public header.
 */
#ifndef ZS_DATA_IMPL_H
#define ZS_DATA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "zs_data.h"

#define ZS__DATA_PATH_SHOWN 200 /* longest path quoted in an error message */

/* One mapped file: its tokens are tokens [start, start + count) of the
 * concatenation. */
typedef struct zs__data_shard {
    char *path;
    const uint8_t *map; /* whole file */
    size_t map_len;
    const uint8_t *tok; /* first u16 token */
    uint64_t count, start;
    int llmc; /* 1: llm.c .bin shard, 0: zeroshard token file */
} zs__data_shard_t;

struct zs_data {
    char *path; /* as given to zs_data_open (a file, a list, a glob) */
    zs__data_shard_t *sh;
    int nsh;
    uint32_t vocab;
    uint64_t count;
    int has_bpe;       /* every file records bpe (version 2, the same record) */
    zs_data_bpe_t bpe; /* zs_data_bpe */
};

/* The shard holding token i (< d->count): binary search on start. */
const zs__data_shard_t *zs__data_shard_of(const zs_data_t *d, uint64_t i);

/* Validate a zeroshard token file of `size` bytes mapped at h (zs_data.c);
 * fills vocab and count, and *bpe with a version 2 file's record (*has_bpe
 * 1; 0 for version 1). */
int zs__data_check_header(const char *path, const uint8_t *h, uint64_t size, uint32_t *vocab,
                          uint64_t *count, int *has_bpe, zs_data_bpe_t *bpe, zs_err_t *err);

#endif
