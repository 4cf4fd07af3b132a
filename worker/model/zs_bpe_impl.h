/*
 * zs_bpe_impl.h - the inside of zs_bpe_t, shared by zs_bpe.c (vocabulary,
 * merges, decoding, merging one piece) and zs_bpe_encode.c
 * (pre-tokenisation, UTF-8, streaming). Not a public header: nothing outside
 * those two files includes it.
 */
#ifndef ZS_BPE_IMPL_H
#define ZS_BPE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "zs_bpe.h"

#define ZS__BPE_CACHE_SLOTS 65536 /* direct-mapped piece cache */
#define ZS__BPE_CACHE_KEY   24    /* pieces up to this many bytes are cached */
#ifndef ZS__BPE_LONG_PIECE
#define ZS__BPE_LONG_PIECE 256 /* longer pieces merge with a heap (O(n log n)) */
#endif

/* One slot of the piece cache: a short piece's bytes and its ids (a piece
 * of k bytes has at most k ids). */
typedef struct zs__bpe_slot {
    uint8_t klen, nids; /* klen 0: empty */
    uint8_t key[ZS__BPE_CACHE_KEY];
    uint16_t ids[ZS__BPE_CACHE_KEY];
} zs__bpe_slot_t;

/* A merge: the pair (a, b) of ids, its rank in vocab.bpe, its result. */
typedef struct zs__bpe_pair {
    uint64_t key; /* a << 32 | b; UINT64_MAX: empty */
    uint32_t rank, merged;
} zs__bpe_pair_t;

struct zs_bpe {
    uint32_t vocab; /* max id + 1 */
    int32_t eot;    /* id of <|endoftext|>, -1 if none */
    uint32_t *off;  /* bytes of id i: pool[off[i] .. off[i] + len[i]) */
    uint32_t *len;
    uint8_t *pool;
    uint32_t byte_id[256]; /* id of the one-byte token of each byte */
    zs__bpe_pair_t *pairs; /* open addressing, pair_mask + 1 slots */
    uint64_t pair_mask;
    zs__bpe_slot_t *cache; /* ZS__BPE_CACHE_SLOTS slots */
    void *re;              /* pcre2_code_8 * */
    void *md;              /* pcre2_match_data_8 * */
    uint32_t *work;        /* scratch ids of the piece being merged */
    size_t work_cap;
};

/* Merge one piece's bytes into ids (GPT-2's bpe(): lowest rank first,
 * leftmost on ties) and append them to out[*nout..]; out has room for len
 * ids (a piece of len bytes never has more). Uses and fills the cache. */
int zs__bpe_piece(zs_bpe_t *b, const uint8_t *piece, size_t len, uint32_t *out, size_t *nout,
                  zs_err_t *err);

/* Compile GPT-2's pre-tokenisation regex into b->re / b->md (zs_bpe_encode.c);
 * freed by zs__bpe_regex_free. */
int zs__bpe_regex_init(zs_bpe_t *b, zs_err_t *err);
void zs__bpe_regex_free(zs_bpe_t *b);

#endif
