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

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((zs_hash_stream_t *)0)->st) &&
                   _Alignof(XXH3_state_t) <= 64,
               "zs_hash_stream_t cannot hold XXH3_state_t");

void zs_hash_stream_reset(zs_hash_stream_t *h, uint64_t seed)
{
    pthread_once(&g_once, choose);
#if defined(ZS_HASH_AVX2)
    if (g_avx2) {
        zs__hash_reset_avx2(h->st, seed);
        return;
    }
#endif
    XXH3_state_t *st = (XXH3_state_t *)h->st;
    XXH3_INITSTATE(st); /* reset_withSeed keeps the secret when the seed matches */
    XXH3_64bits_reset_withSeed(st, seed);
}

void zs_hash_stream_update(zs_hash_stream_t *h, const void *p, size_t n)
{
#if defined(ZS_HASH_AVX2)
    if (g_avx2) {
        zs__hash_update_avx2(h->st, p, n);
        return;
    }
#endif
    XXH3_64bits_update((XXH3_state_t *)h->st, p, n);
}

uint64_t zs_hash_stream_digest(const zs_hash_stream_t *h)
{
#if defined(ZS_HASH_AVX2)
    if (g_avx2)
        return zs__hash_digest_avx2(h->st);
#endif
    return XXH3_64bits_digest((const XXH3_state_t *)h->st);
}

const char *zs_hash_impl(void)
{
    pthread_once(&g_once, choose);
    return g_avx2 ? "avx2" : "portable";
}
