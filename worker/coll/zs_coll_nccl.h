/*
 * zs_coll_nccl.h - the zs_coll interface (zs_coll.h) on NCCL, for GPU
 * workers: creation, the MPI bootstrap on its own (for tests and logs) and
 * the NCCL error check. Plain C: no NCCL or CUDA header needed to include
 * it. Built only with CUDA and NCCL (ZS_WITH_NCCL).
 *
 * Not here: the collectives themselves (zs_coll.h's calls dispatch to
 * them), the watchdog's internals (zs_coll_nccl_internal.h).
 */
#ifndef ZS_COLL_NCCL_H
#define ZS_COLL_NCCL_H

#include "zs_coll.h"
#include "zs_dev.h"
#include "zs_status.h"

#define ZS_NCCL_ID_BYTES        128    /* NCCL_UNIQUE_ID_BYTES */
#define ZS_NCCL_DEFAULT_TIMEOUT 600000 /* ms, when timeout_ms <= 0 (PyTorch's 10 min) */

/* What the bootstrap learnt: world rank and size, the node-local rank and
 * size (MPI_Comm_split_type SHARED) and the NCCL unique id rank 0 made. */
typedef struct zs_nccl_boot {
    int rank, size;
    int local_rank, local_size;
    unsigned char id[ZS_NCCL_ID_BYTES];
} zs_nccl_boot_t;

/* The bootstrap alone, collective over MPI_COMM_WORLD: local rank, rank 0's
 * ncclGetUniqueId broadcast over MPI (with rank 0's error if it failed).
 * Needs no GPU. MPI must be initialised. */
int zs_coll_nccl_bootstrap(zs_nccl_boot_t *out, zs_err_t *err);

/* NCCL communicator over MPI_COMM_WORLD on `dev`, a CUDA device that must be
 * this rank's: cuda:<local rank> when the node shows at least local_size
 * GPUs, cuda:0 when each rank sees exactly one (CUDA_VISIBLE_DEVICES per
 * rank); two ranks on one physical GPU are refused (NCCL may hang).
 * Collective over MPI_COMM_WORLD: the bootstrap, then every rank's device
 * check, then an agreement (an MPI_Allreduce), so when any rank cannot go
 * on every rank returns an error naming the first such rank and none hangs
 * in NCCL. dev == NULL (no GPU here) goes as far as the agreement and
 * returns ZS_ERR_UNAVAILABLE "... no GPU: <CUDA's reason>". Then
 * ncclCommInitRankConfig with blocking = 0, polled until done or
 * timeout_ms (<= 0: ZS_NCCL_DEFAULT_TIMEOUT).
 *
 * timeout_ms is also the watchdog's deadline: a collective not finished
 * timeout_ms after it was enqueued (waiting for `after` counts), or an NCCL
 * asynchronous error, aborts the communicator (ncclCommAbort) with an error
 * naming the rank and the collective; zs_coll_sync returns that error at
 * once, and every later call returns ZS_ERR_STATE. MPI is used only inside
 * this call. Free with zs_coll_destroy (dev must outlive it). */
int zs_coll_nccl_create(zs_dev_t *dev, int timeout_ms, zs_coll_t **out, zs_err_t *err);

/* ---- for zeroshard's NCCL code ----------------------------------------------- */

/* ZS_OK when `code` (an ncclResult_t) is ncclSuccess; otherwise fills err
 * with "<call> at file:line on rank R (cuda:D): <NCCL's string> [<NCCL's
 * last error>] (hint: <hint>)", ZS_ERR_UNAVAILABLE for system/remote errors,
 * ZS_ERR_INVALID for invalid arguments/usage, else ZS_ERR_INTERNAL. */
int zs__nccl_check(int code, const char *call, const char *file, int line, int rank, int device,
                   const char *hint, zs_err_t *err);

/* ZS_NCCL_CHECK(err, rank, device, hint, ncclFn, args...) */
#define ZS_NCCL_CHECK(err, rank, device, hint, fn, ...)                                            \
    zs__nccl_check((int)fn(__VA_ARGS__), #fn, __FILE__, __LINE__, (rank), (device), (hint), (err))

#endif
