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

/* zs_hash_avx2.c, built with -mavx2: call only where the CPU has AVX2. */
uint64_t zs__hash64_avx2(const void *p, size_t n, uint64_t seed);
uint64_t zs__hash64_copy_avx2(void *dst, const void *src, size_t n, uint64_t seed);

#endif
