/*
 * zs_hash_impl.h - internal: the two forms zs_hash.c chooses between. Each
 * is compiled from xxhash.h's code, so both return XXH3_64bits_withSeed's
 * value; they differ only in the instructions (zs_hash.h says why).
 */
#ifndef ZS_HASH_IMPL_H
#define ZS_HASH_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* The piece zs_hash64_copy copies, then hashes while it is in L2. */
#define ZS__HASH_PIECE ((size_t)64 << 10)

/* The body of zs_hash64_copy, compiled in each form's file against its own
 * XXH3 functions (xxhash.h's inline ones built for AVX2 in zs_hash_avx2.c,
 * libxxhash's in zs_hash.c): copy a piece, hash it from dst while it is in
 * cache; one piece takes the one-shot form, more the streaming one (the
 * same value bit for bit). Returns from the enclosing function. */
#define ZS__HASH_COPY_BODY(dst, src, n, seed)                                                      \
    do {                                                                                           \
        if ((n) <= ZS__HASH_PIECE) {                                                               \
            memcpy((dst), (src), (n));                                                             \
            return XXH3_64bits_withSeed((dst), (n), (seed));                                       \
        }                                                                                          \
        XXH3_state_t st_;                                                                          \
        XXH3_INITSTATE(&st_); /* else reset_withSeed may keep a stale secret */                    \
        XXH3_64bits_reset_withSeed(&st_, (seed));                                                  \
        for (size_t at_ = 0; at_ < (n); at_ += ZS__HASH_PIECE) {                                   \
            size_t k_ = (n)-at_ < ZS__HASH_PIECE ? (n)-at_ : ZS__HASH_PIECE;                       \
            memcpy((char *)(dst) + at_, (const char *)(src) + at_, k_);                            \
            XXH3_64bits_update(&st_, (const char *)(dst) + at_, k_);                               \
        }                                                                                          \
        return XXH3_64bits_digest(&st_);                                                           \
    } while (0)

/* zs_hash_avx2.c, built with -mavx2: call only where the CPU has AVX2. */
uint64_t zs__hash64_avx2(const void *p, size_t n, uint64_t seed);
uint64_t zs__hash64_copy_avx2(void *dst, const void *src, size_t n, uint64_t seed);
/* zs_hash_stream_* on the XXH3_state_t at st (zs_hash.c asserts it fits) */
void zs__hash_reset_avx2(void *st, uint64_t seed);
void zs__hash_update_avx2(void *st, const void *p, size_t n);
uint64_t zs__hash_digest_avx2(const void *st);

#endif
