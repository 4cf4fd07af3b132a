/*
 * test_hash.c - zs_hash.h: the chosen XXH3 form returns libxxhash's
 * XXH3_64bits_withSeed bit for bit, for every length class of XXH3 (0,
 * 1-3, 4-8, 9-16, 17-128, 129-240, then stripes, blocks and the last
 * partial stripe), at every misalignment, with several seeds; the copying
 * form copies exactly and hashes the same; the streamed form (any cuts, a
 * stale state) hashes the same; and the form in use is the AVX2 one
 * wherever the CPU has AVX2 (unless ZS_HASH=portable, which ctest runs as
 * test_hash_portable), so the fast path cannot silently go away.
 *
 *   test_hash [lengths|big|copy|stream|impl]   (no argument: all)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t's seed field, for t_stream */
#include <xxhash.h>

#include "zs_hash.h"
#include "zs_rand.h"
#include "zs_test.h"

#define MAXLEN 2200 /* two 1 KiB blocks and a partial one */

static unsigned char *random_bytes(size_t n, uint64_t seed)
{
    unsigned char *p = malloc(n + 64);
    TEST_CHECK(p != NULL);
    for (size_t i = 0; i < n + 64; i++)
        p[i] = (unsigned char)zs_mix64(seed ^ (i * 0x9E37ull));
    return p;
}

static const uint64_t k_seeds[] = {0, 1, 7, 0x123456789abcdefull, UINT64_MAX};

static void t_lengths(void)
{
    unsigned char *buf = random_bytes(MAXLEN + 8, 11);
    for (size_t n = 0; n <= MAXLEN; n++)
        for (size_t mis = 0; mis < 8; mis += (n < 300 ? 1 : 3))
            for (size_t s = 0; s < sizeof k_seeds / sizeof *k_seeds; s++) {
                uint64_t want = XXH3_64bits_withSeed(buf + mis, n, k_seeds[s]);
                uint64_t got = zs_hash64(buf + mis, n, k_seeds[s]);
                TEST_CHECKF(got == want, "n %zu, offset %zu, seed %llx: %016llx, libxxhash %016llx",
                            n, mis, (unsigned long long)k_seeds[s], (unsigned long long)got,
                            (unsigned long long)want);
            }
    free(buf);
}

static void t_big(void)
{
    /* around the copy's 64 KiB piece and the data plane's 4 MiB messages */
    size_t ns[] = {65535, 65536, 65537, 3 * 65536 + 5, 4u << 20, (4u << 20) + 17, 10000019};
    size_t maxn = 10000019;
    unsigned char *buf = random_bytes(maxn + 8, 12);
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
        for (size_t mis = 0; mis < 8; mis += 5) {
            uint64_t seed = zs_mix64(i);
            uint64_t want = XXH3_64bits_withSeed(buf + mis, ns[i], seed);
            TEST_CHECKF(zs_hash64(buf + mis, ns[i], seed) == want, "n %zu, offset %zu", ns[i], mis);
        }
    free(buf);
}

static void t_copy(void)
{
    size_t ns[] = {0, 1, 240, 241, 65536, 65537, 200003, (4u << 20) + 3};
    size_t maxn = (4u << 20) + 3;
    unsigned char *src = random_bytes(maxn + 8, 13), *dst = malloc(maxn + 16);
    TEST_CHECK(dst != NULL);
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
        for (size_t mis = 0; mis < 4; mis += 3) {
            size_t n = ns[i];
            memset(dst, 0xA5, maxn + 16);
            uint64_t h = zs_hash64_copy(dst + 1 + mis, src + mis, n, 99 + i);
            TEST_CHECKF(memcmp(dst + 1 + mis, src + mis, n) == 0, "n %zu: copy differs", n);
            TEST_CHECKF(dst[mis] == 0xA5 && dst[1 + mis + n] == 0xA5, "n %zu: wrote outside", n);
            TEST_CHECKF(h == XXH3_64bits_withSeed(src + mis, n, 99 + i), "n %zu: hash differs", n);
        }
    free(src);
    free(dst);
}

/* The streamed form equals the one-shot one for any cuts, and a state
 * left over from earlier use (garbage, its seed field equal to the new
 * seed: XXH3's reset would then keep the stale secret) is reset for real. */
static void t_stream(void)
{
    size_t maxn = (4u << 20) + 77;
    unsigned char *buf = random_bytes(maxn, 14);
    uint64_t r = 5;
    for (int trial = 0; trial < 60; trial++) {
        size_t n = trial < 20 ? (size_t)trial * 37 : (size_t)(zs_mix64(r++) % maxn);
        uint64_t seed = trial % 3 ? zs_mix64(r++) : (uint64_t)trial;
        zs_hash_stream_t h;
        memset(&h, 0x5A, sizeof h);
        ((XXH3_state_t *)h.st)->seed = seed; /* a stale state of the same seed */
        ((XXH3_state_t *)h.st)->extSecret = NULL;
        zs_hash_stream_reset(&h, seed);
        for (size_t at = 0; at < n;) {
            size_t k = (size_t)(zs_mix64(r++) % (trial & 1 ? 300 : 200000)) + 1;
            k = k < n - at ? k : n - at;
            zs_hash_stream_update(&h, buf + at, k);
            at += k;
        }
        uint64_t want = XXH3_64bits_withSeed(buf, n, seed);
        TEST_CHECKF(zs_hash_stream_digest(&h) == want, "trial %d: n %zu, seed %llx", trial, n,
                    (unsigned long long)seed);
    }
    free(buf);
}

static void t_impl(void)
{
    const char *e = getenv("ZS_HASH");
    int portable = e && !strcmp(e, "portable");
    const char *impl = zs_hash_impl();
    printf("zs_hash: %s form\n", impl);
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2");
    const char *want = portable || !avx2 ? "portable" : "avx2";
    TEST_CHECKF(!strcmp(impl, want), "form %s, expected %s (cpu avx2 %d, ZS_HASH %s)", impl, want,
                avx2, e ? e : "unset");
#else
    TEST_CHECK(!strcmp(impl, "portable"));
#endif
}

int main(int argc, char **argv)
{
    struct {
        const char *name;
        void (*fn)(void);
    } t[] = {{"lengths", t_lengths},
             {"big", t_big},
             {"copy", t_copy},
             {"stream", t_stream},
             {"impl", t_impl}};
    int ran = 0;
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (argc < 2 || !strcmp(argv[1], t[i].name)) {
            t[i].fn();
            printf("ok %s\n", t[i].name);
            ran++;
        }
    TEST_CHECKF(ran > 0, "no test named %s", argc > 1 ? argv[1] : "");
    return 0;
}
