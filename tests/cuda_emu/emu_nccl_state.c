/*
 * emu_nccl_state.c - the emulated NCCL's error state and queries: the
 * last error message, recording an error on a communicator (and telling
 * its peers), the checks every call taking a communicator makes, the
 * ncclInProgress draw, ncclGetLastError, ncclGetErrorString, ncclCommCount,
 * ncclCommUserRank, ncclCommCuDevice, ncclGetVersion.
 *
 * Does not: change a communicator's life (emu_nccl_comm.c).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_nccl.h"

#define EXPORT_P(ret, name, params, args) ret p##name params __attribute__((alias(#name)));

static pthread_mutex_t g_last_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_last[ZS_EMU_NCCL_MSG];

void zs_emu_nccl_set_last(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_last_mu);
    vsnprintf(g_last, sizeof g_last, fmt, ap);
    pthread_mutex_unlock(&g_last_mu);
    va_end(ap);
}

void zs_emu_nccl_fail(struct ncclComm *c, ncclResult_t rc, const char *msg)
{
    int expect = ncclSuccess;
    zs_emu_nccl_set_last("%s", msg);
    pthread_mutex_lock(&c->mu);
    if (atomic_compare_exchange_strong(&c->async_err, &expect, (int)rc)) {
        snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
        if (!atomic_load(&c->initializing) && c->seg) { /* seg is set by the init thread */
            /* Peers waiting on this rank learn why (they report
             * ncclRemoteError naming this rank). Message before state. */
            zs_emu_nccl_slot *sl = &c->seg->slot[c->rank];
            snprintf(sl->msg, sizeof sl->msg, "%s", msg);
            int ok = ZS_EMU_PEER_OK;
            atomic_compare_exchange_strong(&sl->state, &ok, ZS_EMU_PEER_FAILED);
            zs_emu_nccl_ring(c->seg);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* ZS_EMU_NCCL_INPROGRESS: "always" (every non-blocking init, group end and
 * collective returns ncclInProgress), "0" (never), or a seed (default 1):
 * about half of them do, settling after 1 to 4 polls. NCCL's docs allow
 * ncclInProgress from any call on a non-blocking communicator ("Non-blocking
 * communicators"), so the hostile reading returns it from all of them. */
int zs_emu_nccl_draw_polls(int rank)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t state;
    static int seeded;
    int polls, mode = 2; /* 0 never, 1 always, 2 seeded; read on every call */
    pthread_mutex_lock(&mu);
    const char *e = getenv("ZS_EMU_NCCL_INPROGRESS");
    if (e && strcmp(e, "always") == 0)
        mode = 1;
    else if (e && strcmp(e, "0") == 0)
        mode = 0;
    if (!seeded) {
        uint64_t seed = (e && mode == 2 && *e) ? strtoull(e, NULL, 0) : 1;
        state = (seed + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 32);
        seeded = 1;
    }
    state ^= state << 13; /* xorshift64 */
    state ^= state >> 7;
    state ^= state << 17;
    if (mode == 0)
        polls = 0;
    else if (mode == 1)
        polls = 1 + (int)(state >> 62);
    else
        polls = (state >> 63) ? 1 + (int)((state >> 40) & 3) : 0;
    pthread_mutex_unlock(&mu);
    return polls;
}

ncclResult_t zs_emu_nccl_check(struct ncclComm *c, const char *fn)
{
    if (!c) {
        zs_emu_nccl_set_last("cuda-emu nccl: %s: NULL communicator", fn);
        return ncclInvalidArgument;
    }
    if (c->magic == ZS_EMU_COMM_DEAD) {
        /* api/comms: a destroyed or aborted communicator must not be used. */
        zs_emu_nccl_set_last("cuda-emu nccl: %s: communicator (rank %d) used after "
                             "ncclCommDestroy/ncclCommAbort",
                             fn, c->rank);
        fprintf(stderr,
                "cuda-emu nccl: %s: communicator (rank %d) used after "
                "ncclCommDestroy/ncclCommAbort\n",
                fn, c->rank);
        return ncclInvalidUsage;
    }
    if (c->magic != ZS_EMU_COMM_LIVE) {
        zs_emu_nccl_set_last("cuda-emu nccl: %s: not a communicator", fn);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&c->mu);
    int pending = c->pending_polls;
    pthread_mutex_unlock(&c->mu);
    if (pending > 0) {
        /* "Non-blocking communicators": after ncclInProgress, query
         * ncclCommGetAsyncError until it is no longer ncclInProgress before
         * calling another NCCL function. */
        char m[ZS_EMU_NCCL_MSG];
        snprintf(m, sizeof m,
                 "cuda-emu nccl: %s: rank %d: called while the communicator is ncclInProgress "
                 "(settle with ncclCommGetAsyncError first)",
                 fn, c->rank);
        fprintf(stderr, "%s\n", m);
        zs_emu_nccl_fail(c, ncclInvalidUsage, m);
        return ncclInvalidUsage;
    }
    int e = atomic_load(&c->async_err);
    if (e != ncclSuccess && e != ncclInProgress) {
        /* Fault tolerance: after an error the communicator is only good for
         * ncclCommAbort; the hostile reading refuses everything else. */
        zs_emu_nccl_set_last("cuda-emu nccl: %s: rank %d: communicator has failed earlier: %s", fn,
                             c->rank, c->errmsg);
        return (ncclResult_t)e;
    }
    return ncclSuccess;
}

/* api/comms "ncclGetLastError": the last error in NCCL, possibly from an
 * earlier asynchronous operation; not cleared by the call. */
const char *ncclGetLastError(ncclComm_t comm)
{
    if (comm && comm->errmsg[0])
        return comm->errmsg;
    return g_last;
}
EXPORT_P(const char *, ncclGetLastError, (ncclComm_t comm), (comm))

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}
EXPORT_P(const char *, ncclGetErrorString, (ncclResult_t result), (result))

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    ncclResult_t rc = zs_emu_nccl_check(comm, "ncclCommCount");
    if (rc == ncclSuccess && !count)
        rc = ncclInvalidArgument;
    if (rc == ncclSuccess)
        *count = comm->nranks;
    return rc;
}
EXPORT_P(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count), (comm, count))

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t rc = zs_emu_nccl_check(comm, "ncclCommUserRank");
    if (rc == ncclSuccess && !rank)
        rc = ncclInvalidArgument;
    if (rc == ncclSuccess)
        *rank = comm->rank;
    return rc;
}
EXPORT_P(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank), (comm, rank))

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    ncclResult_t rc = zs_emu_nccl_check(comm, "ncclCommCuDevice");
    if (rc == ncclSuccess && !device)
        rc = ncclInvalidArgument;
    if (rc == ncclSuccess)
        *device = comm->dev;
    return rc;
}
EXPORT_P(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device), (comm, device))

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclGetVersion, (int *version), (version))
