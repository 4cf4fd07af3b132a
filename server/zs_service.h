/*
 * zs_service.h - the zeroshard.Shard gRPC service over a zs_shard_t.
 *
 * Parses requests, validates sizes before touching memory, calls the shard
 * and frames replies. Push and Pull chunks may move their payload through a
 * co-located worker's shared segment instead (zs_service_shm.c). Every
 * refusal is logged once by the dispatcher and counted in the shard's
 * counters.
 */
#ifndef ZS_SERVICE_H
#define ZS_SERVICE_H

#include "zs_rpc.h"
#include "zs_shard.h"
#include "zs_shm_sessions.h"

/* The method table (13 entries); handlers take the zs_shard_t as ctx. */
const zs_rpc_method_t *zs_service_methods(int *n);

/* The highest protocol version this process's handlers speak (default
 * ZS_PROTOCOL_VERSION; zs-server --protocol-version). Below
 * ZS_PROTOCOL_V_SPECULATION a Push stating `expect` is refused, as a
 * client that negotiated that version never sends it. Set it before
 * serving: handlers read it without a lock. ZS_ERR_INVALID outside
 * [ZS_PROTOCOL_VERSION_MIN, ZS_PROTOCOL_VERSION]. */
int zs_service_set_protocol_version(uint32_t version, zs_err_t *err);

/* The version zs_service_set_protocol_version set. */
uint32_t zs_service_protocol_version(void);

/* The shared-memory sessions Hello advertises and Push/Pull chunks with a
 * ShmRef use (zs_service_shm.c); NULL (the default): none, such chunks are
 * refused as of an unknown session. Set before serving; clear it only once
 * the RPC server has stopped, before zs_shm_sessions_stop. */
void zs_service_set_shm(zs_shm_sessions_t *s);

#endif
