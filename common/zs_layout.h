/*
 * zs_layout.h - how the flat parameter space [0, P) is split over S servers.
 *
 * This is a pure function of (P, S, index) shared by server and client: the
 * server range layout never depends on the number of workers, which is what
 * lets a job resume with a different worker count.
 *
 * Rule: P is cut into units of ZS_LAYOUT_ALIGN elements (the last unit may be
 * short); server i owns units [floor(U*i/S), floor(U*(i+1)/S)), U = ceil(P /
 * ZS_LAYOUT_ALIGN), clipped to P. Ranges are contiguous, ascending, disjoint,
 * cover [0, P), and start on a 64-element (256-byte fp32) boundary.
 */
#ifndef ZS_LAYOUT_H
#define ZS_LAYOUT_H

#include <stdint.h>

#define ZS_LAYOUT_ALIGN 64
#define ZS_MAX_SERVERS  1024

/* First element owned by server `index` (index == S gives P). Requires
 * S >= 1 and index <= S. */
uint64_t zs_layout_begin(uint64_t P, uint32_t S, uint32_t index);

/* Server owning element `elem` (< P). */
uint32_t zs_layout_owner(uint64_t P, uint32_t S, uint64_t elem);

#endif
