/*
 * emu_nccl_comm.c - the emulated NCCL's communicator life: unique id,
 * init (blocking and non-blocking), finalize, destroy, abort and
 * ncclCommGetAsyncError (emu_nccl_state.c has the checks and queries).
 *
 * Does: the rules of the NCCL user guide, "Communicators" / "Creating a
 * communicator", "Non-blocking communicators" (ncclInProgress and
 * ncclCommGetAsyncError), "Fault Tolerance" / "Error handling and
 * communicator abort", and api/comms ("ncclCommFinalize",
 * "ncclCommDestroy", "ncclCommAbort", "ncclGetLastError"), each at its
 * most hostile legal reading (README.md lists them), and ncclCommSplit
 * (api/comms "ncclCommSplit"). Does not: ncclCommInitAll, ncclCommShrink
 * (refused at run time by emu_nccl_rest.c).
 *
 * A handle is never freed: after destroy or abort it stays as a tombstone
 * (magic DEAD), so any later use is reported, not undefined.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "emu_nccl.h"

#define EXPORT_P(ret, name, params, args) ret p##name params __attribute__((alias(#name)));

/* Every communicator handed out, never freed: a destroyed one is a
 * tombstone, so a later use is reported, not undefined; the list keeps
 * them reachable (no LeakSanitizer report for a deliberate tombstone). */
static struct ncclComm *g_all;
static pthread_mutex_t g_all_mu = PTHREAD_MUTEX_INITIALIZER;

void zs_emu_nccl_unref(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left == 0)
        zs_emu_nccl_detach(c); /* the struct itself stays: tombstone */
}

/* A run that crashed before every rank attached leaves its segment in
 * /dev/shm (the name is unlinked only once all attached). Its name never
 * comes back, so it can not break a later run; this only reclaims the
 * memory: segments whose id maker (the pid in the name) is dead and that
 * are older than a minute. */
static void sweep_stale(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        int pid;
        if (sscanf(e->d_name, "zs_emu_nccl_%d_", &pid) != 1 || pid <= 0)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[320];
        struct stat st;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (stat(path, &st) == 0 && now - st.st_mtime > 60) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            shm_unlink(name);
        }
    }
    closedir(d);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    static _Atomic unsigned counter;
    if (!uniqueId)
        return ncclInvalidArgument;
    sweep_stale();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(uniqueId, 0, sizeof *uniqueId);
    /* The name only: the segment is created by the first rank to init. Pid,
     * time and a counter make it unique, so a crashed run's leftover can
     * never be attached to by the next run. */
    snprintf(uniqueId->internal, 64, "/zs_emu_nccl_%d_%lld%09ld_%u", (int)getpid(),
             (long long)ts.tv_sec, ts.tv_nsec, atomic_fetch_add(&counter, 1));
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId), (uniqueId))

static void keep(struct ncclComm *c)
{
    pthread_mutex_lock(&g_all_mu);
    c->all_next = g_all;
    g_all = c;
    pthread_mutex_unlock(&g_all_mu);
}

static void *init_main(void *arg)
{
    struct ncclComm *c = arg;
    ncclResult_t rc = zs_emu_nccl_attach(c, &c->id);
    if (rc != ncclSuccess) {
        char m[ZS_EMU_NCCL_MSG];
        snprintf(m, sizeof m, "%s", ncclGetLastError(NULL));
        atomic_store(&c->initializing, 0);
        zs_emu_nccl_fail(c, rc, m);
        pthread_mutex_lock(&c->mu);
        c->pending_polls = 0; /* the error is the settled state */
        pthread_mutex_unlock(&c->mu);
    }
    atomic_store(&c->initializing, 0);
    return NULL;
}

static void join_init(struct ncclComm *c)
{
    if (c->init_thread) {
        pthread_join(c->init_th, NULL);
        c->init_thread = 0;
    }
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    int blocking = 1;
    if (!comm)
        return ncclInvalidArgument;
    *comm = NULL;
    if (nranks < 1 || nranks > ZS_EMU_NCCL_MAX_RANKS || rank < 0 || rank >= nranks) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclCommInitRank: rank %d of nranks %d", rank, nranks);
        return ncclInvalidArgument;
    }
    if (config) {
        /* nccl.h: "Not initialized config will result in NCCL error." */
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
            zs_emu_nccl_set_last("cuda-emu nccl: ncclCommInitRankConfig: config not set from "
                                 "NCCL_CONFIG_INITIALIZER");
            return ncclInvalidArgument;
        }
        if (config->blocking != NCCL_CONFIG_UNDEF_INT)
            blocking = config->blocking != 0;
    }
    if (zs_emu_nccl_group_depth() > 0) {
        /* "Group Calls": init can not be merged with other calls; the
         * emulator's rendezvous is synchronous, so a thread initialising
         * several ranks in one group is not supported either. */
        zs_emu_nccl_set_last("cuda-emu nccl: ncclCommInitRank inside ncclGroupStart/End is not "
                             "supported by the emulator");
        return ncclInvalidUsage;
    }
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return ncclSystemError;
    c->rank = rank;
    c->nranks = nranks;
    c->dev = zs_emu_current_device();
    c->blocking = blocking;
    c->refs = 1;
    c->next_seq = 1;
    c->next_cseq = 1;
    c->exec_seq = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->id = commId;
    int polls = blocking ? 0 : zs_emu_nccl_draw_polls(rank);
    if (polls > 0) {
        /* "Non-blocking communicators": init returns ncclInProgress at once
         * with a valid handle; the rendezvous goes on in the background and
         * ncclCommGetAsyncError reports ncclInProgress until it is done (and
         * then for the drawn number of polls). */
        c->magic = ZS_EMU_COMM_LIVE;
        c->pending_polls = polls;
        keep(c);
        atomic_store(&c->initializing, 1);
        if (pthread_create(&c->init_th, NULL, init_main, c) == 0) {
            c->init_thread = 1;
            *comm = c;
            return ncclInProgress;
        }
        /* No thread: do it here (the communicator stays on the list). */
        atomic_store(&c->initializing, 0);
        c->pending_polls = 0;
        ncclResult_t rc = zs_emu_nccl_attach(c, &commId);
        if (rc != ncclSuccess) {
            c->magic = ZS_EMU_COMM_DEAD;
            return rc;
        }
        *comm = c;
        return ncclSuccess;
    }
    ncclResult_t rc = zs_emu_nccl_attach(c, &commId);
    if (rc != ncclSuccess) {
        /* A failed init returns no communicator (*comm stays NULL). */
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return rc;
    }
    c->magic = ZS_EMU_COMM_LIVE;
    keep(c);
    *comm = c;
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclCommInitRankConfig,
         (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config),
         (comm, nranks, commId, rank, config))

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}
EXPORT_P(ncclResult_t, ncclCommInitRank,
         (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank),
         (comm, nranks, commId, rank))

/* Wait until every op this rank launched has finished on its stream. */
static void drain(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->inflight > 0)
        pthread_cond_wait(&c->cv, &c->mu); /* every op ends: barriers time out */
    pthread_mutex_unlock(&c->mu);
}

static ncclResult_t open_group_check(struct ncclComm *c, const char *fn)
{
    if (zs_emu_nccl_group_depth() > 0) {
        /* "Group Calls": a group must be closed by ncclGroupEnd; tearing a
         * communicator down with the group open would drop its ops. */
        char m[ZS_EMU_NCCL_MSG];
        snprintf(m, sizeof m,
                 "cuda-emu nccl: %s: rank %d: called with a group open (ncclGroupStart without "
                 "ncclGroupEnd, depth %d%s)",
                 fn, c->rank, zs_emu_nccl_group_depth(),
                 zs_emu_nccl_group_has(c) ? ", holding calls on this communicator" : "");
        fprintf(stderr, "%s\n", m);
        zs_emu_nccl_fail(c, ncclInvalidUsage, m);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* api/comms "ncclCommFinalize": flushes every uncompleted operation. A
 * non-blocking communicator may return ncclInProgress and report it until
 * the operations are done. */
ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t rc = zs_emu_nccl_check(comm, "ncclCommFinalize");
    if (rc != ncclSuccess)
        return rc;
    if ((rc = open_group_check(comm, "ncclCommFinalize")) != ncclSuccess)
        return rc;
    if (comm->finalized) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclCommFinalize called twice");
        return ncclInvalidUsage;
    }
    comm->finalized = 1;
    if (!comm->blocking) {
        pthread_mutex_lock(&comm->mu);
        int polls = zs_emu_nccl_draw_polls(comm->rank);
        if (comm->inflight > 0 && polls == 0)
            polls = 1;
        comm->pending_polls = polls;
        pthread_mutex_unlock(&comm->mu);
        if (polls > 0)
            return ncclInProgress; /* GetAsyncError waits for the drain */
    }
    drain(comm);
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm))

static void publish_end(struct ncclComm *c, int state)
{
    if (!c->seg)
        return;
    zs_emu_nccl_slot *sl = &c->seg->slot[c->rank];
    pthread_mutex_lock(&c->mu);
    atomic_store(&sl->ncolls, c->colls_done);
    pthread_mutex_unlock(&c->mu);
    int ok = ZS_EMU_PEER_OK;
    atomic_compare_exchange_strong(&sl->state, &ok, state);
    zs_emu_nccl_ring(c->seg);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    if (comm->magic == ZS_EMU_COMM_DEAD)
        return zs_emu_nccl_check(comm, "ncclCommDestroy");
    ncclResult_t rc = open_group_check(comm, "ncclCommDestroy");
    if (rc != ncclSuccess)
        return rc;
    pthread_mutex_lock(&comm->mu);
    int pending = comm->pending_polls;
    pthread_mutex_unlock(&comm->mu);
    if (pending > 0) /* also a finalize not yet settled ("Non-blocking communicators") */
        return zs_emu_nccl_check(comm, "ncclCommDestroy");
    join_init(comm); /* settled, so finished */
    /* api/comms "ncclCommDestroy": without a prior ncclCommFinalize it
     * finalizes internally, i.e. waits for the outstanding operations. */
    drain(comm);
    publish_end(comm, ZS_EMU_PEER_DESTROYED);
    comm->magic = ZS_EMU_COMM_DEAD;
    zs_emu_nccl_unref(comm);
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))

/* api/comms "ncclCommAbort": frees the communicator and stops its
 * uncompleted operations. Every waiting op returns (marked failed), the
 * peers waiting on this rank see it (ncclRemoteError), and the handle
 * becomes a tombstone. Does not wait for a peer. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    if (comm->magic == ZS_EMU_COMM_DEAD)
        return zs_emu_nccl_check(comm, "ncclCommAbort");
    atomic_store(&comm->aborted, 1);
    join_init(comm); /* its wait checks `aborted` */
    publish_end(comm, ZS_EMU_PEER_ABORTED);
    if (comm->seg)
        zs_emu_nccl_ring(comm->seg);
    pthread_mutex_lock(&comm->mu);
    pthread_cond_broadcast(&comm->cv);
    comm->pending_polls = 0;
    pthread_mutex_unlock(&comm->mu);
    zs_emu_nccl_flush_stash(comm); /* drops them: aborted */
    drain(comm);                   /* returns promptly: every wait checks `aborted` */
    comm->magic = ZS_EMU_COMM_DEAD;
    zs_emu_nccl_unref(comm);
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm))

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError)
        return ncclInvalidArgument;
    if (comm->magic != ZS_EMU_COMM_LIVE)
        return zs_emu_nccl_check(comm, "ncclCommGetAsyncError");
    if (atomic_load(&comm->initializing)) {
        *asyncError = ncclInProgress; /* the rendezvous goes on */
        return ncclSuccess;
    }
    int e = atomic_load(&comm->async_err);
    if (e != ncclSuccess) {
        *asyncError = (ncclResult_t)e;
        return ncclSuccess;
    }
    pthread_mutex_lock(&comm->mu);
    int settle = 0;
    if (comm->pending_polls > 0) {
        /* Finalize settles only once the operations drained. */
        if (!(comm->finalized && comm->inflight > 0 && comm->pending_polls == 1))
            comm->pending_polls--;
        settle = comm->pending_polls == 0;
        *asyncError = settle ? ncclSuccess : ncclInProgress;
    } else {
        *asyncError = ncclSuccess;
    }
    pthread_mutex_unlock(&comm->mu);
    if (settle && comm->nstash > 0) {
        /* A group that returned ncclInProgress launches when it settles. */
        zs_emu_nccl_flush_stash(comm);
        e = atomic_load(&comm->async_err);
        if (e != ncclSuccess)
            *asyncError = (ncclResult_t)e;
    }
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError),
         (comm, asyncError))

/* One exchange step of ncclCommSplit on the parent (host side, after a
 * drain: the executor has nothing of this communicator in flight). */
static ncclResult_t split_barrier(struct ncclComm *c, uint64_t *step, char *msg, size_t cap)
{
    return zs_emu_nccl_barrier(c, ++*step, "ncclCommSplit", msg, cap);
}

/* api/comms "ncclCommSplit" (and nccl.h): collective over every rank of
 * comm; ranks with the same color form a communicator, ordered by key
 * (ties by their rank in comm); NCCL_SPLIT_NOCOLOR gives NULL; a NULL
 * config inherits comm's (blocking or not). Done synchronously on the
 * calling thread: the parent's outstanding operations are waited for, the
 * call takes its place in the parent's collective order (a rank calling
 * another collective meanwhile is named, as for any mismatch), each
 * colour's first rank makes the new unique id and passes it through the
 * parent's staging, then each rank inits the new communicator (which may
 * answer ncclInProgress when non-blocking). */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    ncclResult_t rc = zs_emu_nccl_check(comm, "ncclCommSplit");
    if (rc != ncclSuccess)
        return rc;
    if (!newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclCommSplit: rank %d: %s", comm->rank,
                             newcomm ? "negative color" : "NULL newcomm");
        return ncclInvalidArgument;
    }
    if (zs_emu_nccl_group_depth() > 0) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclCommSplit inside ncclGroupStart/End is not "
                             "supported by the emulator");
        return ncclInvalidUsage;
    }
    *newcomm = NULL;
    struct ncclComm *c = comm;
    drain(c);
    zs_emu_nccl_seg *s = c->seg;
    int n = c->nranks, r = c->rank;
    pthread_mutex_lock(&c->mu);
    zs_emu_nccl_desc d = {.seq = c->next_seq++,
                          .cseq = c->next_cseq++,
                          .kind = ZS_EMU_NCCL_SPLIT,
                          .dtype = -1,
                          .op = -1,
                          .root = -1,
                          .count = 0};
    pthread_mutex_unlock(&c->mu);
    char msg[ZS_EMU_NCCL_MSG] = "";
    uint64_t step = c->step;
    int32_t mine[2] = {color, key}, all[ZS_EMU_NCCL_MAX_RANKS][2];
    s->slot[r].desc = d;
    memcpy(c->staging + (size_t)r * s->chunk, mine, sizeof mine);
    int newrank = 0, newn = 0, leader = -1;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    size_t idb = sizeof id.internal < s->chunk ? sizeof id.internal : s->chunk;
    if ((rc = split_barrier(c, &step, msg, sizeof msg)) != ncclSuccess)
        goto out;
    for (int k = 0; k < n; k++) {
        const zs_emu_nccl_desc *o = &s->slot[k].desc;
        if (o->cseq != d.cseq || o->kind != d.kind) {
            char b[96];
            zs_emu_nccl_describe(o, b, sizeof b);
            snprintf(msg, sizeof msg,
                     "cuda-emu nccl: collective #%llu: rank %d called CommSplit, rank %d called "
                     "%s (#%llu)",
                     (unsigned long long)d.cseq, r, k, b, (unsigned long long)o->cseq);
            rc = ncclInvalidUsage;
            goto out;
        }
        memcpy(all[k], c->staging + (size_t)k * s->chunk, sizeof all[k]);
    }
    if (color != NCCL_SPLIT_NOCOLOR)
        for (int k = 0; k < n; k++) {
            if (all[k][0] != color)
                continue;
            newn++;
            /* ordered by key, ties by the rank in comm */
            if (all[k][1] < key || (all[k][1] == key && k < r))
                newrank++;
            if (leader < 0 || all[k][1] < all[leader][1])
                leader = k;
        }
    if ((rc = split_barrier(c, &step, msg, sizeof msg)) != ncclSuccess)
        goto out; /* every rank read the colours: the staging is free */
    if (leader == r) {
        ncclGetUniqueId(&id);
        memcpy(c->staging + (size_t)r * s->chunk, id.internal, idb);
    }
    if ((rc = split_barrier(c, &step, msg, sizeof msg)) != ncclSuccess)
        goto out;
    if (leader >= 0)
        memcpy(id.internal, c->staging + (size_t)leader * s->chunk, idb);
    rc = split_barrier(c, &step, msg, sizeof msg);
out:
    c->step = step;
    pthread_mutex_lock(&c->mu);
    c->colls_done++;
    if (c->exec_seq <= d.seq)
        c->exec_seq = d.seq + 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc != ncclSuccess) {
        if (!atomic_load(&c->aborted)) {
            fprintf(stderr, "%s\n", msg);
            zs_emu_nccl_fail(c, rc, msg);
        }
        return rc;
    }
    if (color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess; /* "will therefore return a NULL communicator" */
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    if (!config) {
        inherit.blocking = c->blocking;
        config = &inherit;
    }
    return ncclCommInitRankConfig(newcomm, newn, id, newrank, config);
}
EXPORT_P(ncclResult_t, ncclCommSplit,
         (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config),
         (comm, color, key, newcomm, config))
