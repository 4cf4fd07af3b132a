/*
 * zs_train_metrics.h - zs-train's Prometheus metrics (`--metrics HOST:PORT`
 * on rank 0): step, loss, validation loss, learning rate, loss scale, tokens per second, the
 * step-time split, memory by space and category as the device allocator
 * measures it, checkpoints and recoveries; every name is defined in
 * docs/metrics.md and served on http://HOST:PORT/metrics by common/zs_metrics.
 *
 * The training loop reports after each step; values are lock-free atomics,
 * so a scrape never waits for a step and a step never waits for a scrape.
 * Every function but create accepts NULL (metrics off) and does nothing.
 *
 * Does not: report other ranks (their figures are in rank 0's memory table
 * on stdout), authenticate scrapers.
 */
#ifndef ZS_TRAIN_METRICS_H
#define ZS_TRAIN_METRICS_H

#include "zs_engine.h"
#include "zs_metrics.h"

typedef struct zs_train_metrics zs_train_metrics_t;

/* Register the metrics and serve them on `hostport` (port 0: a free one);
 * `workers` is the world size. Free with zs_train_metrics_destroy. */
int zs_train_metrics_create(const char *hostport, int workers, zs_train_metrics_t **out,
                            zs_err_t *err);

/* The registry (for its address: zs_metrics_address, zs_metrics_write_address). */
zs_metrics_t *zs_train_metrics_registry(zs_train_metrics_t *tm);

/* Once the engine exists: P parameters, training starts after `step`. */
void zs_train_metrics_start(zs_train_metrics_t *tm, uint64_t params, uint64_t step);

/* After a step: its figures, its wall time in seconds and the tokens the
 * whole job trained in it; and this worker's memory (zs_engine_mem). */
void zs_train_metrics_step(zs_train_metrics_t *tm, const zs_step_stats_t *st, double seconds,
                           double tokens, zs_engine_t *e);

/* The validation loss evaluated after `step` (--val-data). */
void zs_train_metrics_val(zs_train_metrics_t *tm, uint64_t step, double loss);

/* A checkpoint of `step` complete on all servers. */
void zs_train_metrics_checkpoint(zs_train_metrics_t *tm, uint64_t step);

/* A recovery after a lost server rolled training back to `step`. */
void zs_train_metrics_recovered(zs_train_metrics_t *tm, uint64_t step);

/* Stop serving and free. NULL is a no-op. */
void zs_train_metrics_destroy(zs_train_metrics_t *tm);

#endif
