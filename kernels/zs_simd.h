/*
 * zs_simd.h - which SIMD code path a kernel runs, chosen at run time from
 * CPU features, with a per-kernel override for tests and benchmarks.
 * Shared by zs_cast.c and zs_adam.c (each keeps its own zs_simd_choice_t,
 * so forcing one kernel's path does not change the other's).
 */
#ifndef ZS_SIMD_H
#define ZS_SIMD_H

#include <stdatomic.h>

enum { ZS_SIMD_PORTABLE = 0, ZS_SIMD_AVX2 = 1, ZS_SIMD_AVX512 = 2, ZS_SIMD_NPATHS = 3 };

/* A kernel's forced path (-1: automatic). Initialise with ZS_SIMD_AUTO. */
typedef atomic_int zs_simd_choice_t;
#define ZS_SIMD_AUTO (-1)

/* 1 if this CPU can run `path` (AVX-512: F+BW; AVX2: AVX2+F16C). */
int zs__simd_cpu_has(int path);

/* The forced path if any, else the best path this CPU has. */
int zs__simd_path(zs_simd_choice_t *choice);

/* "portable", "avx2" or "avx512". */
const char *zs__simd_name(int path);

/* Force `name` (NULL: back to automatic). ZS_OK, or ZS_ERR_INVALID for an
 * unknown name or a path the CPU lacks. */
int zs__simd_force(zs_simd_choice_t *choice, const char *name);

#endif
