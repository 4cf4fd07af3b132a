/*
 * zs_hash.h - XXH3-64 of bulk bytes at the speed of the CPU it runs on: the
 * checksums of the data plane (pushed gradients, pulled parameters), of the
 * store's chunks and of the NVMe tier's tiles.
 *
 * Every function returns exactly what libxxhash's XXH3_64bits_withSeed
 * returns for the same bytes and seed (XXH3's output does not depend on the
 * instruction set that computes it), so a peer or a file hashed with either
 * verifies with the other. Why not call the library: Debian's libxxhash is
 * built for the x86-64 baseline (SSE2), about 8-17 GB/s on our hosts, where
 * the same code compiled for AVX2 (xxhash.h's inline mode, in
 * zs_hash_avx2.c) runs at 30-90 GB/s; at 200 MB a step that was half of the
 * worker core's transfer cost. The AVX2 form is chosen once, at the first
 * call, when the CPU has AVX2 (cpuid); otherwise, or with the environment
 * variable ZS_HASH=portable, the library's functions run.
 *
 * Not here: any other hash, small-key hashing (call XXH3_64bits directly:
 * the dispatch is not worth it under a few hundred bytes), keyed or
 * cryptographic integrity (XXH3 catches accidents, not attackers).
 */
#ifndef ZS_HASH_H
#define ZS_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-64 of p[0, n) with `seed` (XXH3_64bits_withSeed). p may be
 * unaligned; n may be 0 (p is then not read). */
uint64_t zs_hash64(const void *p, size_t n, uint64_t seed);

/* memcpy(dst, src, n), then return zs_hash64(dst, n, seed), in one pass over
 * memory: each 64 KiB piece is hashed from dst right after its copy, while
 * it is in the cache. Hashing dst, not src, checks the bytes that landed.
 * dst and src must not overlap. */
uint64_t zs_hash64_copy(void *dst, const void *src, size_t n, uint64_t seed);

/* A hash computed piece by piece, for a producer that writes bytes in
 * cache-sized pieces and hashes each while it is hot (the engine's staging
 * of pushed gradients): zs_hash_stream_reset(h, seed), any number of
 * zs_hash_stream_update, then zs_hash_stream_digest returns zs_hash64 of
 * the concatenated pieces with that seed (bit for bit, whatever the cuts).
 * The caller embeds the state (XXH3's, 576 bytes); it must not be copied
 * between reset and digest. */
typedef struct zs_hash_stream {
    _Alignas(64) unsigned char st[640];
} zs_hash_stream_t;

void zs_hash_stream_reset(zs_hash_stream_t *h, uint64_t seed);
void zs_hash_stream_update(zs_hash_stream_t *h, const void *p, size_t n);
uint64_t zs_hash_stream_digest(const zs_hash_stream_t *h);

/* The form in use: "avx2" or "portable" (libxxhash's build). Decides it if
 * no call has yet. */
const char *zs_hash_impl(void);

#endif
