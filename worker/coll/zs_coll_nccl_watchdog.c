/*
 * zs_coll_nccl_watchdog.c - what keeps a hung or failed peer from hanging a
 * GPU job forever (NCCL has no per-collective timeout).
 *
 * Every collective is tracked: an event recorded right after it on the
 * communicator's stream, its enqueue time and its name, in a ring of
 * ZS_NCCL_RING slots. A watchdog thread, while anything is outstanding,
 * every min(100 ms, timeout/10) retires finished collectives (event
 * queries), checks the age of the oldest one against the deadline and polls
 * ncclCommGetAsyncError. Past the deadline, or on an asynchronous NCCL
 * error, it fails the communicator: the error (naming rank, device and
 * collective) is recorded, the stream is aborted (zs_coll_sync returns the
 * error at once instead of waiting) and ncclCommAbort ends NCCL's kernels.
 * From then on every call refuses with ZS_ERR_STATE. The waits here
 * (barrier, destroy, a full ring) run the same check themselves, so they
 * end at the deadline too.
 *
 * The deadline counts from enqueue: a collective waiting for `after` work
 * counts that wait, as PyTorch's NCCL watchdog does. Choose the timeout
 * above the longest compute a collective can wait for.
 *
 * Not here: the collectives (zs_coll_nccl.c); recovery (a broken
 * communicator is not rebuilt: end the job, restart from the servers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_coll_nccl_internal.h"
#include "zs_dev_cuda.h"

#define HINT_PEER                                                                                  \
    "see the other ranks' logs; all ranks must call the same collectives in the same order"

uint64_t zs__nccl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int zs__nccl_check(int code, const char *call, const char *file, int line, int rank, int device,
                   const char *hint, zs_err_t *err)
{
    if (code == (int)ncclSuccess)
        return ZS_OK;
    ncclResult_t r = (ncclResult_t)code;
    int zc = ZS_ERR_INTERNAL;
    if (r == ncclSystemError || r == ncclRemoteError)
        zc = ZS_ERR_UNAVAILABLE;
    else if (r == ncclInvalidArgument || r == ncclInvalidUsage)
        zc = ZS_ERR_INVALID;
    else if (r == ncclInProgress)
        zc = ZS_ERR_TIMEOUT;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    const char *last = ncclGetLastError(NULL);
    return zs_err_set(err, zc, "%s at %s:%d on rank %d (cuda:%d): %s [%.100s] (hint: %s)", call,
                      base, line, rank, device, ncclGetErrorString(r), last ? last : "",
                      hint ? hint : "none");
}

/* 1 with *e = the error that broke the communicator, else 0. */
static int broken_error(zs__coll_nccl_t *c, zs_err_t *e)
{
    pthread_mutex_lock(&c->mu);
    int broken = c->broken;
    *e = c->broken_err;
    pthread_mutex_unlock(&c->mu);
    return broken;
}

int zs__nccl_refuse(zs__coll_nccl_t *c, const char *what, zs_err_t *err)
{
    zs_err_t e;
    if (!broken_error(c, &e))
        return ZS_OK;
    return zs_err_set(err, ZS_ERR_STATE,
                      "NCCL %s refused: the communicator was aborted: %.240s; end the job", what,
                      e.msg);
}

void zs__nccl_fail(zs__coll_nccl_t *c, const zs_err_t *e)
{
    pthread_mutex_lock(&c->mu);
    int first = !c->broken;
    if (first) {
        c->broken = 1;
        c->broken_err = *e;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (!first)
        return;
    /* first end every wait on the stream, then the abort (which may block
     * until the stream's queued work has drained) */
    zs__dev_cuda_stream_abort(c->base.stream, e);
    pthread_mutex_lock(&c->nccl_mu);
    if (c->comm) {
        cudaSetDevice(c->device);
        ncclCommAbort(c->comm); /* nothing more to report: we are failing */
        c->comm = NULL;
    }
    pthread_mutex_unlock(&c->nccl_mu);
}

ncclResult_t zs__nccl_settle(zs__coll_nccl_t *c)
{
    uint64_t end = zs__nccl_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    ncclResult_t st = ncclInProgress;
    while (c->comm) {
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
        if (r != ncclSuccess)
            return r;
        if (st != ncclInProgress || zs__nccl_now_ns() > end)
            return st;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return ncclInvalidUsage; /* aborted under us: not reached with nccl_mu held */
}

/* One round of the watchdog's checks. Returns 1 with *fire set when the
 * communicator must be failed. */
static int check_once(zs__coll_nccl_t *c, zs_err_t *fire)
{
    char what[sizeof c->ring[0].what] = "no collective";
    uint64_t seq = 0;
    pthread_mutex_lock(&c->mu);
    if (c->broken) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    while (c->n > 0) {
        zs__nccl_op_t *op = &c->ring[c->head];
        cudaError_t q = cudaEventQuery(op->ev);
        if (q == cudaErrorNotReady) {
            /* recorded as this thread's last error: a later launch check on
             * this thread would report it as its own failure */
            (void)cudaGetLastError();
            break;
        }
        if (q != cudaSuccess) {
            zs__cuda_check(q, "cudaEventQuery", __FILE__, __LINE__, c->device,
                           "a kernel on this GPU failed", fire);
            zs_err_prefix(fire, "NCCL %s on rank %d: ", op->what, c->base.rank);
            pthread_mutex_unlock(&c->mu);
            return 1;
        }
        snprintf(c->last_what, sizeof c->last_what, "%s", op->what);
        c->last_seq = op->seq;
        c->head = (c->head + 1) % ZS_NCCL_RING;
        c->n--;
    }
    /* an async error seen after every op retired belongs to the newest one
     * (ops of a communicator complete in order) */
    if (c->n == 0 && c->last_seq) {
        snprintf(what, sizeof what, "%s", c->last_what);
        seq = c->last_seq;
    }
    if (c->n > 0) {
        zs__nccl_op_t *op = &c->ring[c->head];
        uint64_t age_ms = (zs__nccl_now_ns() - op->t0_ns) / 1000000ull;
        snprintf(what, sizeof what, "%s", op->what);
        seq = op->seq;
        if (age_ms > (uint64_t)c->timeout_ms) {
            zs_err_set(fire, ZS_ERR_TIMEOUT,
                       "NCCL %s on rank %d (cuda:%d) did not finish in %d ms (collective #%llu, "
                       "%zu outstanding): peer lost or hung? (hint: %s)",
                       what, c->base.rank, c->device, c->timeout_ms, (unsigned long long)seq, c->n,
                       HINT_PEER);
            pthread_mutex_unlock(&c->mu);
            return 1;
        }
    }
    pthread_mutex_unlock(&c->mu);

    ncclResult_t r = ncclSuccess, st = ncclSuccess;
    pthread_mutex_lock(&c->nccl_mu);
    if (c->comm)
        r = ncclCommGetAsyncError(c->comm, &st);
    pthread_mutex_unlock(&c->nccl_mu);
    if (r == ncclSuccess && (st == ncclSuccess || st == ncclInProgress))
        return 0;
    zs__nccl_check(r != ncclSuccess ? r : st, "ncclCommGetAsyncError", __FILE__, __LINE__,
                   c->base.rank, c->device, HINT_PEER, fire);
    zs_err_prefix(fire, "NCCL async error during %s (#%llu): ", what, (unsigned long long)seq);
    return 1;
}

static void *watchdog_main(void *arg)
{
    zs__coll_nccl_t *c = arg;
    cudaSetDevice(c->device);
    long interval_ms = c->timeout_ms / 10;
    if (interval_ms > 100)
        interval_ms = 100;
    if (interval_ms < 1)
        interval_ms = 1;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (c->n == 0 || c->broken) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        pthread_mutex_unlock(&c->mu);
        zs_err_t fire;
        if (check_once(c, &fire))
            zs__nccl_fail(c, &fire);
        pthread_mutex_lock(&c->mu);
        if (c->stop || c->n == 0 || c->broken)
            continue;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += interval_ms * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&c->cv, &c->mu, &until);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int zs__nccl_watchdog_start(zs__coll_nccl_t *c, zs_err_t *err)
{
    if (pthread_create(&c->wd, NULL, watchdog_main, c) != 0)
        return zs_err_set(err, ZS_ERR_INTERNAL, "zs_coll_nccl_create: cannot start the watchdog");
    c->wd_started = 1;
    return ZS_OK;
}

void zs__nccl_watchdog_stop(zs__coll_nccl_t *c)
{
    if (!c->wd_started)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->wd, NULL);
    c->wd_started = 0;
}

/* Poll check_once until `done(c)` or the communicator broke. */
static int wait_until(zs__coll_nccl_t *c, size_t max_outstanding, const char *what, zs_err_t *err)
{
    for (long i = 0;; i++) {
        zs_err_t fire;
        if (check_once(c, &fire))
            zs__nccl_fail(c, &fire);
        int rc = zs__nccl_refuse(c, what, err);
        if (rc)
            return rc;
        pthread_mutex_lock(&c->mu);
        size_t n = c->n;
        pthread_mutex_unlock(&c->mu);
        if (n <= max_outstanding)
            return ZS_OK;
        struct timespec ts = {0, i < 100 ? 20000 : 200000};
        nanosleep(&ts, NULL);
    }
}

int zs__nccl_track(zs__coll_nccl_t *c, const char *what, zs_err_t *err)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    if (n >= ZS_NCCL_RING) {
        int rc = wait_until(c, ZS_NCCL_RING - 1, what, err);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&c->mu);
    zs__nccl_op_t *op = &c->ring[(c->head + c->n) % ZS_NCCL_RING];
    int rc = ZS_OK;
    if (!op->ev)
        rc = ZS_CUDA_CHECK(err, c->device, "out of GPU resources?", cudaEventCreateWithFlags,
                           &op->ev, cudaEventDisableTiming);
    if (rc == ZS_OK)
        rc = ZS_CUDA_CHECK(err, c->device, "a kernel on this GPU failed", cudaEventRecord, op->ev,
                           c->cs);
    if (rc == ZS_OK) {
        op->t0_ns = zs__nccl_now_ns();
        op->seq = ++c->seq;
        snprintf(op->what, sizeof op->what, "%s", what);
        c->n++;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int zs__nccl_sync_check(zs_coll_t *zc, zs_err_t *err)
{
    zs__coll_nccl_t *c = (zs__coll_nccl_t *)zc;
    zs_err_t fire;
    if (check_once(c, &fire))
        zs__nccl_fail(c, &fire);
    zs_err_t e;
    if (!broken_error(c, &e))
        return ZS_OK;
    if (err)
        *err = e;
    return e.code != ZS_OK ? e.code : ZS_ERR_STATE;
}

int zs__nccl_wait_all(zs__coll_nccl_t *c, zs_err_t *err)
{
    return wait_until(c, 0, "wait", err);
}

void zs__nccl_ring_deinit(zs__coll_nccl_t *c)
{
    for (size_t i = 0; i < ZS_NCCL_RING; i++) {
        if (c->ring[i].ev)
            cudaEventDestroy(c->ring[i].ev);
        c->ring[i].ev = NULL;
    }
    c->n = 0;
}
