/*
 * zs_budget.h - the server's memory budget: a byte count that every
 * allocation whose size comes from the network is reserved against before it
 * is made (a new state for Initialize or Restore, SetState buffers, pull and
 * get-state send buffers, staged-range records), so no request, and no
 * number of concurrent requests, can make the server allocate more than the
 * budget. A reservation that does not fit is refused with ZS_ERR_NOMEM
 * (gRPC RESOURCE_EXHAUSTED) and a sentence naming the budget.
 *
 * Does not: allocate or free memory itself, or see what gRPC, RocksDB or
 * the allocator hold (fixed overheads outside the budget).
 * Thread-safe: one mutex.
 */
#ifndef ZS_BUDGET_H
#define ZS_BUDGET_H

#include <pthread.h>
#include <stdint.h>

#include "zs_status.h"

typedef struct zs_budget {
    pthread_mutex_t mu;
    uint64_t limit; /* bytes */
    uint64_t used;  /* bytes reserved now */
} zs_budget_t;

/* Embed-style: set the limit (bytes, > 0). */
void zs_budget_init(zs_budget_t *b, uint64_t limit);
void zs_budget_deinit(zs_budget_t *b);

/* Reserve `bytes` for `what` ("a new state for Initialize"): ZS_OK, or
 * ZS_ERR_NOMEM with err saying how much is needed and free. 0 bytes: OK. */
int zs_budget_take(zs_budget_t *b, uint64_t bytes, const char *what, zs_err_t *err);

/* As zs_budget_take, but only if `spare` more bytes stay free beside the
 * reservation (room kept for others: speculation leaves it for the Pull and
 * GetState buffers, zs_shard_spec.c); err then says how much was kept. */
int zs_budget_take_spare(zs_budget_t *b, uint64_t bytes, uint64_t spare, const char *what,
                         zs_err_t *err);

/* Return a reservation (bytes as taken; 0 is a no-op). */
void zs_budget_give(zs_budget_t *b, uint64_t bytes);

/* Bytes reserved now, and the limit. */
void zs_budget_get(zs_budget_t *b, uint64_t *used, uint64_t *limit);

/* The default budget: 80% of the memory this process may use, the smaller
 * of physical RAM and a cgroup limit (v2 memory.max or v1
 * memory.limit_in_bytes) if one is set. *ram gets that memory (may be NULL). */
uint64_t zs_budget_default(uint64_t *ram);

/* Parse "123", "64K", "800M", "12G", "1.5T" (binary units, case-insensitive,
 * optional trailing "B" or "iB") into bytes; -1 if it is not a positive size. */
int zs_budget_parse(const char *s, uint64_t *bytes);

#endif
