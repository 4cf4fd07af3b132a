/*
 * zs_layout.c - the server-range function of zs_layout.h.
 */
#include "zs_layout.h"

uint64_t zs_layout_begin(uint64_t P, uint32_t S, uint32_t index)
{
    uint64_t units = (P + ZS_LAYOUT_ALIGN - 1) / ZS_LAYOUT_ALIGN;
    /* units * index fits in 64 bits: units < 2^58 for any realistic P and
     * index <= ZS_MAX_SERVERS (2^10). */
    uint64_t b = (units * index / S) * ZS_LAYOUT_ALIGN;
    return b < P ? b : P;
}

uint32_t zs_layout_owner(uint64_t P, uint32_t S, uint64_t elem)
{
    /* Binary search: begin() is monotone in index. */
    uint32_t lo = 0, hi = S; /* invariant: begin(lo) <= elem < begin(hi) */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (zs_layout_begin(P, S, mid) <= elem)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}
