/*
 * zs_hash_avx2.c - XXH3-64 compiled for AVX2: xxhash.h's own code in its
 * inline mode (XXH_INLINE_ALL: every function static in this file, so
 * nothing clashes with libxxhash's symbols), with XXH_VECTOR chosen from
 * -mavx2, which CMake sets for this file alone. zs_hash.c calls it only
 * after cpuid said AVX2; nothing else may.
 */
#define XXH_INLINE_ALL
#include <string.h>
#include <xxhash.h>

#include "zs_hash_impl.h"

#if !defined(__AVX2__)
#error "zs_hash_avx2.c must be compiled with -mavx2 (common/CMakeLists.txt)"
#endif

uint64_t zs__hash64_avx2(const void *p, size_t n, uint64_t seed)
{
    return XXH3_64bits_withSeed(p, n, seed);
}

uint64_t zs__hash64_copy_avx2(void *dst, const void *src, size_t n, uint64_t seed)
{
    if (n <= ZS__HASH_PIECE) { /* one piece: the one-shot form, no state */
        memcpy(dst, src, n);
        return XXH3_64bits_withSeed(dst, n, seed);
    }
    XXH3_state_t st; /* streaming gives the one-shot value bit for bit */
    XXH3_64bits_reset_withSeed(&st, seed);
    for (size_t at = 0; at < n; at += ZS__HASH_PIECE) {
        size_t k = n - at < ZS__HASH_PIECE ? n - at : ZS__HASH_PIECE;
        memcpy((char *)dst + at, (const char *)src + at, k);
        XXH3_64bits_update(&st, (const char *)dst + at, k);
    }
    return XXH3_64bits_digest(&st);
}
