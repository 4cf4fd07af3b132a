/*
 * zs_adam_groups.c - parameter groups' checks and the cutting of an update
 * at range ends (zs_adam_groups.h). Does not allocate.
 */
#include "zs_adam_groups.h"

#include <math.h>
#include <string.h>

int zs_groups_check(const zs_group_range_t *r, size_t n, uint64_t P, zs_err_t *err)
{
    if (n > ZS_GROUPS_MAX_RANGES)
        return zs_err_set(err, ZS_ERR_INVALID, "%zu parameter group ranges, at most %d", n,
                          ZS_GROUPS_MAX_RANGES);
    uint64_t begin = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].end <= begin)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "parameter group range %zu ends at %llu, not after %llu: ranges "
                              "must be consecutive, ascending and non-empty",
                              i, (unsigned long long)r[i].end, (unsigned long long)begin);
        if (!(r[i].weight_decay >= 0 && isfinite(r[i].weight_decay)))
            return zs_err_set(err, ZS_ERR_INVALID,
                              "parameter group range %zu: weight_decay %g must be finite and >= 0",
                              i, (double)r[i].weight_decay);
        if (r[i].lr_index >= ZS_GROUPS_MAX_LRS)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "parameter group range %zu: lr_index %u, at most %d", i,
                              r[i].lr_index, ZS_GROUPS_MAX_LRS - 1);
        begin = r[i].end;
    }
    if (n && begin != P)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "parameter group ranges end at %llu, the model has %llu parameters",
                          (unsigned long long)begin, (unsigned long long)P);
    return ZS_OK;
}

uint32_t zs_groups_nlrs(const zs_group_range_t *r, size_t n)
{
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].lr_index + 1 > k)
            k = r[i].lr_index + 1;
    return k;
}

uint64_t zs_groups_piece(const zs_group_range_t *r, size_t n, const float *lrs, size_t nlrs,
                         const zs_adam_hparams_t *base_hp, const zs_adam_step_t *base_st,
                         uint64_t off, uint64_t len, zs_adam_hparams_t *hp, zs_adam_step_t *st)
{
    *hp = *base_hp;
    *st = *base_st;
    if (n == 0)
        return len;
    /* the first range ending after off (binary search: ranges are few, but
     * a pass asks once per 64 Ki-element chunk and per range end) */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r[mid].end > off)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo == n) /* past the model: cannot happen for checked ranges; keep the base */
        return len;
    hp->weight_decay = r[lo].weight_decay;
    if (nlrs)
        st->lr = lrs[r[lo].lr_index];
    uint64_t left = r[lo].end - off;
    return left < len ? left : len;
}

int zs_groups_equal(const zs_group_range_t *a, size_t n, const zs_group_range_t *b, size_t m)
{
    if (n != m)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (a[i].end != b[i].end || a[i].lr_index != b[i].lr_index ||
            memcmp(&a[i].weight_decay, &b[i].weight_decay, sizeof(float)))
            return 0;
    return 1;
}
