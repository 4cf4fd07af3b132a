/*
 * zs_rand.h - stateless pseudo-random numbers for deterministic synthetic
 * data and initialisation: the value of index i under seed s is a pure
 * function, so every process computes the same numbers in any order.
 * Header only. Not for cryptography.
 */
#ifndef ZS_RAND_H
#define ZS_RAND_H

#include <stdint.h>

/* SplitMix64's output function of x + golden gamma. */
static inline uint64_t zs_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Uniform in [-1, 1) for (seed, i), from the top 53 bits. */
static inline float zs_rand_unit(uint64_t seed, uint64_t i)
{
    return (float)((double)(zs_mix64(seed * 0x100000001B3ull ^ i) >> 11) * 0x1p-52 - 1.0);
}

#endif
