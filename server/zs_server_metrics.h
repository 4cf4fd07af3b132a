/*
 * zs_server_metrics.h - zs-server's Prometheus metrics (`--metrics
 * HOST:PORT`): every metric docs/metrics.md defines for the server, served
 * on http://HOST:PORT/metrics by common/zs_metrics.
 *
 * Nothing is counted here: at each scrape the values are copied from what
 * the shard (zs_shard_info: steps, bytes, optimizer and checkpoint totals,
 * store health, memory budget) and the RPC server (calls answered by method
 * and gRPC code, calls in flight) already count, plus the process's RSS and
 * glibc's heap figures. A scrape takes the shard's mutex as long as a Hello
 * does.
 *
 * Does not: authenticate scrapers (bind the endpoint to a trusted address).
 */
#ifndef ZS_SERVER_METRICS_H
#define ZS_SERVER_METRICS_H

#include "zs_metrics.h"
#include "zs_rpc.h"
#include "zs_shard.h"

typedef struct zs_server_metrics zs_server_metrics_t;

/* Register the server's metrics over `sh` and `srv` (methods: srv's table
 * of nmethods entries; all kept by pointer and used until
 * zs_server_metrics_destroy) and serve them on `hostport` (port 0: a free
 * one). `server_id` labels zs_server_info (copied). *out is freed with
 * zs_server_metrics_destroy. */
int zs_server_metrics_create(const char *hostport, zs_shard_t *sh, zs_rpc_server_t *srv,
                             const zs_rpc_method_t *methods, int nmethods, const char *server_id,
                             zs_server_metrics_t **out, zs_err_t *err);

/* The registry (for its address: zs_metrics_address, zs_metrics_write_address). */
zs_metrics_t *zs_server_metrics_registry(zs_server_metrics_t *sm);

/* Stop serving (waits for a scrape in progress) and free. Call before the
 * shard and the RPC server go. NULL is a no-op. */
void zs_server_metrics_destroy(zs_server_metrics_t *sm);

#endif
