/*
 * zs_hash.c - zs_hash.h: the choice between the AVX2 form (zs_hash_avx2.c)
 * and libxxhash's build, and the portable form itself.
 *
 * The choice is made once (pthread_once) from cpuid and ZS_HASH; a build
 * for another architecture than x86-64 has only the portable form.
 */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "zs_hash.h"
#include "zs_hash_impl.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_avx2; /* 1: the AVX2 form */

static void choose(void)
{
#if defined(ZS_HASH_AVX2)
    const char *e = getenv("ZS_HASH");
    int portable = e && !strcmp(e, "portable");
    __builtin_cpu_init();
    g_avx2 = !portable && __builtin_cpu_supports("avx2");
#endif
}

static uint64_t copy_portable(void *dst, const void *src, size_t n, uint64_t seed)
{
    ZS__HASH_COPY_BODY(dst, src, n, seed);
}

uint64_t zs_hash64(const void *p, size_t n, uint64_t seed)
{
    pthread_once(&g_once, choose);
#if defined(ZS_HASH_AVX2)
    if (g_avx2)
        return zs__hash64_avx2(p, n, seed);
#endif
    return XXH3_64bits_withSeed(p, n, seed);
}

uint64_t zs_hash64_copy(void *dst, const void *src, size_t n, uint64_t seed)
{
    pthread_once(&g_once, choose);
#if defined(ZS_HASH_AVX2)
    if (g_avx2)
        return zs__hash64_copy_avx2(dst, src, n, seed);
#endif
    return copy_portable(dst, src, n, seed);
}

const char *zs_hash_impl(void)
{
    pthread_once(&g_once, choose);
    return g_avx2 ? "avx2" : "portable";
}
