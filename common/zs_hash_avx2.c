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
    ZS__HASH_COPY_BODY(dst, src, n, seed);
}

void zs__hash_reset_avx2(void *st, uint64_t seed)
{
    XXH3_INITSTATE((XXH3_state_t *)st);
    XXH3_64bits_reset_withSeed(st, seed);
}

void zs__hash_update_avx2(void *st, const void *p, size_t n)
{
    XXH3_64bits_update(st, p, n);
}

uint64_t zs__hash_digest_avx2(const void *st)
{
    return XXH3_64bits_digest(st);
}
