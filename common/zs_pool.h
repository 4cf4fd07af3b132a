/*
 * zs_pool.h - a fixed pool of worker threads for data-parallel loops.
 *
 * zs_pool_run splits [0, ntasks) among the pool's threads plus the caller and
 * returns when every task is done. Tasks are claimed dynamically (atomic
 * counter), so the order of execution is unspecified: a task must not depend
 * on another. One zs_pool_run at a time per pool (calls from several threads
 * are serialised internally).
 */
#ifndef ZS_POOL_H
#define ZS_POOL_H

#include <stddef.h>

typedef struct zs_pool zs_pool_t;

/* fn(arg, task_index, thread_index); thread_index in [0, zs_pool_threads). */
typedef void (*zs_pool_fn)(void *arg, size_t task, int thread);

/* Create a pool that runs tasks on `nthreads` threads in total, counting the
 * caller of zs_pool_run (so nthreads - 1 are spawned). nthreads <= 0 means the
 * number of online CPUs. Returns NULL on failure. Free with zs_pool_destroy. */
zs_pool_t *zs_pool_create(int nthreads);

/* Join the threads and free the pool. NULL is a no-op. */
void zs_pool_destroy(zs_pool_t *pool);

/* Number of threads tasks run on (>= 1). */
int zs_pool_threads(const zs_pool_t *pool);

/* Run fn for every task in [0, ntasks); blocks until all are done. */
void zs_pool_run(zs_pool_t *pool, size_t ntasks, zs_pool_fn fn, void *arg);

#endif
