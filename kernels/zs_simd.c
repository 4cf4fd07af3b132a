/*
 * zs_simd.c - run-time choice of SIMD paths (see zs_simd.h).
 */
#include "zs_simd.h"

#include <string.h>

#include "zs_status.h"

static const char *const k_names[ZS_SIMD_NPATHS] = {"portable", "avx2", "avx512"};

int zs__simd_cpu_has(int path)
{
    __builtin_cpu_init();
    switch (path) {
    case ZS_SIMD_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    case ZS_SIMD_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    default:
        return 1;
    }
}

int zs__simd_path(zs_simd_choice_t *choice)
{
    int f = atomic_load_explicit(choice, memory_order_relaxed);
    if (f >= 0)
        return f;
    return zs__simd_cpu_has(ZS_SIMD_AVX512) ? ZS_SIMD_AVX512
           : zs__simd_cpu_has(ZS_SIMD_AVX2) ? ZS_SIMD_AVX2
                                            : ZS_SIMD_PORTABLE;
}

const char *zs__simd_name(int path)
{
    return path >= 0 && path < ZS_SIMD_NPATHS ? k_names[path] : "?";
}

int zs__simd_force(zs_simd_choice_t *choice, const char *name)
{
    if (!name) {
        atomic_store_explicit(choice, ZS_SIMD_AUTO, memory_order_relaxed);
        return ZS_OK;
    }
    for (int p = 0; p < ZS_SIMD_NPATHS; p++)
        if (strcmp(name, k_names[p]) == 0) {
            if (!zs__simd_cpu_has(p))
                return ZS_ERR_INVALID;
            atomic_store_explicit(choice, p, memory_order_relaxed);
            return ZS_OK;
        }
    return ZS_ERR_INVALID;
}
