/*
 * zs_service.h - the zeroshard.Shard gRPC service over a zs_shard_t.
 *
 * Parses requests, validates sizes before touching memory, calls the shard
 * and frames replies. Every refusal is logged once by the dispatcher and
 * counted in the shard's counters.
 */
#ifndef ZS_SERVICE_H
#define ZS_SERVICE_H

#include "zs_rpc.h"
#include "zs_shard.h"

/* The method table (12 entries); handlers take the zs_shard_t as ctx. */
const zs_rpc_method_t *zs_service_methods(int *n);

#endif
