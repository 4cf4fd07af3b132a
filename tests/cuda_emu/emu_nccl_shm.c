/*
 * emu_nccl_shm.c - the rendezvous of the emulated NCCL's ranks: the POSIX
 * shared-memory segment the unique id names, attaching to it, and the one
 * wait every exchange is built from (a barrier on a step number).
 *
 * Does: create-or-attach (whoever initialises first creates), unlink the
 * name as soon as every rank attached (so a crashed run leaves nothing the
 * next run could trip on: names are unique anyway), wait with futexes on a
 * word in the segment with a short timeout, so every wait re-checks abort,
 * peer liveness (kill(pid, 0) and /proc state, so a killed rank that is a
 * zombie counts as dead) and the overall timeout. Does not: move data
 * (emu_nccl_coll.c) or hold any lock across processes: a rank killed at any
 * instruction can not leave a peer blocked on a lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "emu_nccl.h"

/* ZS_EMU_NCCL_TIMEOUT (seconds, default 600): the longest any wait for a
 * live peer lasts. Real NCCL waits forever; the emulator must never hang a
 * test run, and a slow emulated rank may take minutes between collectives. */
double zs_emu_nccl_timeout_s(void)
{
    const char *e = getenv("ZS_EMU_NCCL_TIMEOUT");
    double t = e ? atof(e) : 0;
    return t > 0 ? t : 600.0;
}

/* ZS_EMU_NCCL_CHUNK (bytes, default 1 MiB): staging per rank; collectives
 * larger than that run in chunks (tests set it small to cover chunking).
 * Small enough that many communicators fit /dev/shm. */
static uint64_t chunk_bytes(void)
{
    const char *e = getenv("ZS_EMU_NCCL_CHUNK");
    long long v = e ? atoll(e) : 0;
    if (v < 64)
        v = 1 << 20;
    return (uint64_t)v & ~(uint64_t)63; /* whole elements of every type */
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void zs_emu_nccl_ring(zs_emu_nccl_seg *s)
{
    atomic_fetch_add(&s->bell, 1);
    syscall(SYS_futex, &s->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void wait_bell(zs_emu_nccl_seg *s, uint32_t seen)
{
    struct timespec ts = {0, 20 * 1000 * 1000}; /* re-check liveness every 20 ms */
    syscall(SYS_futex, &s->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* Is pid gone? kill(pid, 0) fails with ESRCH once it is reaped; before
 * that a killed process is a zombie ('Z') that kill() still finds. */
static int pid_dead(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may contain spaces */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

ncclResult_t zs_emu_nccl_attach(struct ncclComm *c, const ncclUniqueId *id)
{
    char msg[ZS_EMU_NCCL_MSG];
    memcpy(c->name, id->internal, sizeof c->name);
    c->name[sizeof c->name - 1] = 0;
    if (c->name[0] != '/' || strncmp(c->name, "/zs_emu_nccl_", 13) != 0) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclCommInitRank: the unique id was not made by "
                             "ncclGetUniqueId (not broadcast to this rank?)");
        return ncclInvalidArgument;
    }
    uint64_t chunk = chunk_bytes();
    size_t hdr = sizeof(zs_emu_nccl_seg) + (size_t)c->nranks * sizeof(zs_emu_nccl_slot);
    hdr = (hdr + 63) & ~(size_t)63;
    size_t total = hdr + (size_t)c->nranks * chunk;
    int creator = 1;
    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        creator = 0;
        fd = shm_open(c->name, O_RDWR, 0600);
    }
    if (fd < 0) {
        /* ENOENT: every rank attached and the name is gone: a rank too many
         * or an id used twice. */
        zs_emu_nccl_set_last("cuda-emu nccl: rank %d: shm_open(%s): %s (id reused after every "
                             "rank attached, or more ranks than nranks?)",
                             c->rank, c->name, strerror(errno));
        return errno == ENOENT ? ncclInvalidUsage : ncclSystemError;
    }
    double deadline = now_s() + zs_emu_nccl_timeout_s();
    if (creator) {
        /* Allocate now: a full /dev/shm is an init error here, not a
         * SIGBUS in the middle of a collective later. */
        int fe = posix_fallocate(fd, 0, (off_t)total);
        if (fe == EINVAL || fe == EOPNOTSUPP)
            fe = ftruncate(fd, (off_t)total) == 0 ? 0 : errno;
        if (fe != 0) {
            zs_emu_nccl_set_last("cuda-emu nccl: allocating %zu bytes for %s in /dev/shm: %s",
                                 total, c->name, strerror(fe));
            close(fd);
            shm_unlink(c->name);
            return ncclSystemError;
        }
    } else {
        /* The creator may not have sized or set it up yet. */
        struct stat st;
        for (;;) {
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(zs_emu_nccl_seg))
                break;
            if (now_s() > deadline) {
                zs_emu_nccl_set_last("cuda-emu nccl: %s never set up", c->name);
                close(fd);
                return ncclSystemError;
            }
            usleep(1000);
        }
        total = (size_t)st.st_size;
    }
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        zs_emu_nccl_set_last("cuda-emu nccl: mmap(%s): %s", c->name, strerror(errno));
        return ncclSystemError;
    }
    zs_emu_nccl_seg *s = p;
    c->seg = s;
    c->map_bytes = total;
    if (creator) {
        s->nranks = c->nranks;
        s->chunk = chunk;
        s->total = total;
        atomic_store(&s->magic, ZS_EMU_NCCL_MAGIC); /* publishes the fields above */
    } else {
        while (atomic_load(&s->magic) != ZS_EMU_NCCL_MAGIC) {
            if (now_s() > deadline) {
                snprintf(msg, sizeof msg, "cuda-emu nccl: %s never set up", c->name);
                goto fail;
            }
            usleep(1000);
        }
        if (s->nranks != c->nranks) {
            snprintf(msg, sizeof msg,
                     "cuda-emu nccl: ncclCommInitRank: rank %d passed nranks %d, the rank that "
                     "created the communicator passed %d",
                     c->rank, c->nranks, s->nranks);
            goto usage;
        }
    }
    hdr = sizeof(zs_emu_nccl_seg) + (size_t)c->nranks * sizeof(zs_emu_nccl_slot);
    hdr = (hdr + 63) & ~(size_t)63;
    c->staging = (unsigned char *)p + hdr;
    int32_t zero = 0;
    if (!atomic_compare_exchange_strong(&s->slot[c->rank].pid, &zero, (int32_t)getpid())) {
        snprintf(msg, sizeof msg,
                 "cuda-emu nccl: ncclCommInitRank: rank %d initialised twice on one id (pid %d "
                 "and pid %d)",
                 c->rank, (int)zero, (int)getpid());
        goto usage;
    }
    if (atomic_fetch_add(&s->attached, 1) + 1 == c->nranks)
        shm_unlink(c->name); /* all here: the name is no longer needed */
    zs_emu_nccl_ring(s);
    /* Wait for all ranks (ncclCommInitRank is collective). */
    ncclResult_t rc;
    int mystate = ZS_EMU_PEER_FAILED;
    for (;;) {
        uint32_t seen = atomic_load(&s->bell);
        if (atomic_load(&s->attached) >= c->nranks)
            return ncclSuccess;
        if (atomic_load(&c->aborted)) { /* a non-blocking init, aborted */
            snprintf(msg, sizeof msg, "cuda-emu nccl: ncclCommInitRank: rank %d: aborted", c->rank);
            rc = ncclInvalidUsage;
            mystate = ZS_EMU_PEER_ABORTED;
            goto leave;
        }
        for (int k = 0; k < c->nranks; k++) {
            pid_t pk = atomic_load(&s->slot[k].pid);
            int st = atomic_load(&s->slot[k].state);
            /* Re-read `attached` before blaming k: k may have attached,
             * returned and failed since this loop's first check. */
            if (atomic_load(&s->attached) >= c->nranks)
                return ncclSuccess;
            if (pk && st != ZS_EMU_PEER_OK) {
                snprintf(msg, sizeof msg,
                         "cuda-emu nccl: ncclCommInitRank: rank %d gave up (%s) before every "
                         "rank attached",
                         k, st == ZS_EMU_PEER_ABORTED ? "ncclCommAbort" : "failed");
                rc = ncclRemoteError;
                goto leave;
            }
            if (pk && pid_dead(pk)) {
                snprintf(msg, sizeof msg,
                         "cuda-emu nccl: ncclCommInitRank: rank %d (pid %d) died before every "
                         "rank attached",
                         k, (int)pk);
                rc = ncclRemoteError;
                goto leave;
            }
        }
        if (now_s() > deadline) {
            snprintf(msg, sizeof msg,
                     "cuda-emu nccl: ncclCommInitRank: rank %d: only %d of %d ranks attached "
                     "within %.0f s (ZS_EMU_NCCL_TIMEOUT)",
                     c->rank, (int)atomic_load(&s->attached), c->nranks, zs_emu_nccl_timeout_s());
            rc = ncclSystemError;
            goto leave;
        }
        wait_bell(s, seen);
    }
leave:
    /* Tell the ranks still attaching, and let no one else attach. */
    atomic_store(&s->slot[c->rank].state, mystate);
    zs_emu_nccl_ring(s);
    shm_unlink(c->name);
    zs_emu_nccl_set_last("%s", msg);
    munmap(p, total);
    c->seg = NULL;
    return rc;
usage:
    zs_emu_nccl_set_last("%s", msg);
    fprintf(stderr, "%s\n", msg);
    munmap(p, total);
    c->seg = NULL;
    return ncclInvalidUsage;
fail:
    zs_emu_nccl_set_last("%s", msg);
    munmap(p, total);
    c->seg = NULL;
    return ncclSystemError;
}

void zs_emu_nccl_detach(struct ncclComm *c)
{
    if (!c->seg)
        return;
    munmap(c->seg, c->map_bytes);
    c->seg = NULL;
    c->staging = NULL;
}

ncclResult_t zs_emu_nccl_barrier(struct ncclComm *c, uint64_t step, const char *what, char *msg,
                                 size_t cap)
{
    zs_emu_nccl_seg *s = c->seg;
    atomic_store(&s->slot[c->rank].arrive, step);
    zs_emu_nccl_ring(s);
    double t0 = now_s(), limit = zs_emu_nccl_timeout_s();
    for (;;) {
        uint32_t seen = atomic_load(&s->bell);
        if (atomic_load(&c->aborted)) {
            snprintf(msg, cap, "cuda-emu nccl: %s: rank %d: ncclCommAbort released the wait", what,
                     c->rank);
            return ncclInvalidUsage; /* the caller's own doing; not reported as async */
        }
        int all = 1;
        for (int k = 0; k < c->nranks; k++) {
            if (atomic_load(&s->slot[k].arrive) >= step)
                continue;
            zs_emu_nccl_slot *sl = &s->slot[k];
            all = 0;
            int st = atomic_load(&sl->state);
            int dead = st == ZS_EMU_PEER_OK && pid_dead(atomic_load(&sl->pid));
            if (st == ZS_EMU_PEER_OK && !dead)
                continue;
            if (dead) /* it may have failed just before exiting: its last word */
                st = atomic_load(&sl->state);
            /* k may have reached `step` and then failed, been destroyed or
             * exited since the first read: its state changes after its
             * arrival, so a second read of the arrival tells. */
            if (atomic_load(&sl->arrive) >= step)
                continue; /* all stays 0: the next round sees it arrived */
            if (st == ZS_EMU_PEER_FAILED) {
                snprintf(msg, cap, "cuda-emu nccl: %s: rank %d failed: %s", what, k, sl->msg);
                return ncclRemoteError;
            }
            if (st == ZS_EMU_PEER_ABORTED) {
                snprintf(msg, cap, "cuda-emu nccl: %s: rank %d called ncclCommAbort", what, k);
                return ncclRemoteError;
            }
            if (st == ZS_EMU_PEER_DESTROYED) {
                snprintf(msg, cap,
                         "cuda-emu nccl: %s: rank %d destroyed the communicator after %llu "
                         "collectives (a collective skipped on rank %d?)",
                         what, k, (unsigned long long)atomic_load(&sl->ncolls), k);
                return ncclInvalidUsage;
            }
            snprintf(msg, cap, "cuda-emu nccl: %s: rank %d (pid %d) died", what, k,
                     (int)atomic_load(&sl->pid));
            return ncclRemoteError;
        }
        if (all)
            return ncclSuccess;
        if (now_s() - t0 > limit) {
            snprintf(msg, cap,
                     "cuda-emu nccl: %s: rank %d waited %.0f s for its peers (ZS_EMU_NCCL_TIMEOUT; "
                     "real NCCL would hang here)",
                     what, c->rank, limit);
            return ncclSystemError;
        }
        wait_bell(s, seen);
    }
}

void zs_emu_nccl_wait_bell(zs_emu_nccl_seg *s, uint32_t seen)
{
    wait_bell(s, seen);
}

ncclResult_t zs_emu_nccl_peer_gone(struct ncclComm *c, int k, const char *what, char *msg,
                                   size_t cap)
{
    zs_emu_nccl_slot *sl = &c->seg->slot[k];
    int st = atomic_load(&sl->state);
    if (st == ZS_EMU_PEER_OK) {
        if (!pid_dead(atomic_load(&sl->pid)))
            return ncclSuccess;
        /* A process writes its state before it exits: re-read it, so a
         * peer that failed (or aborted) and then exited is named for that,
         * not as a death. */
        st = atomic_load(&sl->state);
    }
    if (st == ZS_EMU_PEER_FAILED) {
        snprintf(msg, cap, "cuda-emu nccl: %s: rank %d failed: %s", what, k, sl->msg);
        return ncclRemoteError;
    }
    if (st == ZS_EMU_PEER_ABORTED) {
        snprintf(msg, cap, "cuda-emu nccl: %s: rank %d called ncclCommAbort", what, k);
        return ncclRemoteError;
    }
    if (st == ZS_EMU_PEER_DESTROYED) {
        snprintf(msg, cap,
                 "cuda-emu nccl: %s: rank %d destroyed the communicator after %llu collectives "
                 "(its matching send/recv never posted?)",
                 what, k, (unsigned long long)atomic_load(&sl->ncolls));
        return ncclInvalidUsage;
    }
    snprintf(msg, cap, "cuda-emu nccl: %s: rank %d (pid %d) died", what, k,
             (int)atomic_load(&sl->pid));
    return ncclRemoteError;
}
