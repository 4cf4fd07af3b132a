/*
 * emu_nccl.h - internals shared by the emulated NCCL's sources
 * (emu_nccl_*.c): the shared-memory segment that the ranks of one
 * communicator rendezvous in, the communicator object, and the helpers the
 * API files call. Not a public API: nccl.h is the public one.
 *
 * Does: describe the segment layout and the communicator's life (refcount,
 * tombstone). Does not: know about streams beyond zs_emu_enqueue
 * (emu_internal.h) or about MPI (the callers' thread level is theirs).
 */
#ifndef ZS_EMU_NCCL_H
#define ZS_EMU_NCCL_H

#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "emu_internal.h"

#define ZS_EMU_NCCL_MAX_RANKS 64
#define ZS_EMU_NCCL_MSG       512

/* What one rank's call was: compared across ranks before any data moves
 * (the mismatch check; real NCCL would hang instead). */
enum zs_emu_nccl_kind {
    ZS_EMU_NCCL_ALLREDUCE = 1,
    ZS_EMU_NCCL_REDUCESCATTER,
    ZS_EMU_NCCL_ALLGATHER,
    ZS_EMU_NCCL_BROADCAST,
    ZS_EMU_NCCL_REDUCE,
    ZS_EMU_NCCL_SEND,  /* one ncclSend as recorded (root = peer); folded into a P2P batch */
    ZS_EMU_NCCL_RECV,  /* one ncclRecv as recorded (root = peer) */
    ZS_EMU_NCCL_P2P,   /* the sends and receives of one group on one communicator */
    ZS_EMU_NCCL_SPLIT, /* ncclCommSplit: collective on the parent (emu_nccl_comm.c) */
};

typedef struct {
    uint64_t seq;  /* op number on this communicator, from 1 (this rank's call order) */
    uint64_t cseq; /* collective number, from 1: what ranks match on (0 for P2P) */
    int32_t kind, dtype, op, root;
    uint64_t count; /* the count argument as the caller passed it */
} zs_emu_nccl_desc;

/* One side of a point-to-point message as published in the segment: the
 * m-th send from rank i to rank j (or the m-th receive on j from i).
 * m is stored last (its store publishes count and dtype). */
typedef struct {
    _Atomic uint64_t m;
    uint64_t count;
    int32_t dtype, pad;
} zs_emu_nccl_p2pdesc;

/* A rank's state as its peers see it in the segment. */
enum { ZS_EMU_PEER_OK = 0, ZS_EMU_PEER_FAILED, ZS_EMU_PEER_ABORTED, ZS_EMU_PEER_DESTROYED };

typedef struct {
    _Atomic int32_t pid;       /* 0 until the rank attached */
    _Atomic int32_t state;     /* ZS_EMU_PEER_* */
    _Atomic uint64_t arrive;   /* last barrier step this rank reached */
    _Atomic uint64_t ncolls;   /* collectives it completed (for DESTROYED) */
    zs_emu_nccl_desc desc;     /* its current collective */
    char msg[ZS_EMU_NCCL_MSG]; /* why it FAILED (written before state) */
    /* Point-to-point (emu_nccl_p2p.c), per peer k: the send to k and the
     * receive from k in progress, slices of this rank's staging posted to k
     * (its slice k of the staging) and slices consumed from k. */
    zs_emu_nccl_p2pdesc sdesc[ZS_EMU_NCCL_MAX_RANKS];
    zs_emu_nccl_p2pdesc rdesc[ZS_EMU_NCCL_MAX_RANKS];
    _Atomic uint64_t posted[ZS_EMU_NCCL_MAX_RANKS];
    _Atomic uint64_t acked[ZS_EMU_NCCL_MAX_RANKS];
} zs_emu_nccl_slot;

/* The segment: header, nranks slots, then nranks staging areas of chunk
 * bytes each. Only atomics and plain data: no pthread objects, so a rank
 * killed at any point leaves nothing locked (waits are futexes on bell). */
typedef struct {
    _Atomic uint32_t magic;   /* ZS_EMU_NCCL_MAGIC once the creator set it up */
    _Atomic uint32_t bell;    /* futex word: bumped and woken on every change */
    _Atomic int32_t attached; /* ranks attached so far */
    _Atomic int32_t printed;  /* the mismatch message was printed by someone */
    int32_t nranks;
    uint64_t chunk;          /* staging bytes per rank */
    uint64_t total;          /* segment bytes */
    zs_emu_nccl_slot slot[]; /* nranks of them, then the staging */
} zs_emu_nccl_seg;

#define ZS_EMU_NCCL_MAGIC 0x7a73e0ccu
#define ZS_EMU_COMM_LIVE  0x6c697665u
#define ZS_EMU_COMM_DEAD  0x64656164u

struct ncclComm {
    uint32_t magic; /* LIVE, or DEAD after destroy/abort: the handle stays a tombstone */
    int rank, nranks, dev, blocking;
    zs_emu_nccl_seg *seg;
    unsigned char *staging; /* nranks * seg->chunk bytes inside seg */
    size_t map_bytes;
    char name[64];

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                                  /* the user's handle + every launched/stashed op */
    int inflight;                              /* ops enqueued and not yet finished */
    uint64_t next_seq;                         /* seq of the next op launched */
    uint64_t next_cseq;                        /* cseq of the next collective launched */
    uint64_t colls_done;                       /* collectives run (executor side; for DESTROYED) */
    uint64_t p2p_sent[ZS_EMU_NCCL_MAX_RANKS];  /* messages sent to each peer (executor side) */
    uint64_t p2p_recvd[ZS_EMU_NCCL_MAX_RANKS]; /* messages received from each peer */
    uint64_t exec_seq;                         /* seq of the next op allowed to run */
    uint64_t step;                             /* barrier steps done by this rank (executor side) */
    _Atomic int aborted;
    _Atomic int async_err; /* ncclResult_t, first error wins */
    int pending_polls;     /* ncclInProgress left to report */
    void *stash;           /* ops of a group that returned ncclInProgress */
    int nstash, capstash;
    int finalized;
    ncclUniqueId id;
    pthread_t init_th;        /* a non-blocking init's rendezvous */
    int init_thread;          /* init_th was started and not joined */
    _Atomic int initializing; /* the rendezvous has not finished */
    char errmsg[ZS_EMU_NCCL_MSG];
    struct ncclComm *all_next; /* every communicator ever made (tombstones stay reachable) */
};

/* One collective call, as recorded in a group or launched on a stream. */
typedef struct {
    struct ncclComm *comm;
    zs_emu_nccl_desc d;
    const void *send; /* NULL where unused (Broadcast non-root) */
    void *recv;       /* NULL where unused (Reduce non-root) */
    size_t sbytes, rbytes;
    cudaStream_t stream;
    struct zs_emu_nccl_p2p *p2p; /* kind P2P: its sends and receives (owned by the op) */
} zs_emu_nccl_op;

/* --- emu_nccl_shm.c --- */
ncclResult_t zs_emu_nccl_attach(struct ncclComm *c, const ncclUniqueId *id);
void zs_emu_nccl_detach(struct ncclComm *c);
void zs_emu_nccl_ring(zs_emu_nccl_seg *s);
/* Wait until every rank reached barrier step `step` (after announcing it).
 * Returns ncclSuccess, or an error with msg filled: abort, a peer dead,
 * failed, aborted or destroyed, the timeout. what names the collective. */
ncclResult_t zs_emu_nccl_barrier(struct ncclComm *c, uint64_t step, const char *what, char *msg,
                                 size_t cap);
double zs_emu_nccl_timeout_s(void);
/* Sleep until the segment's bell moves from seen (or 20 ms pass). */
void zs_emu_nccl_wait_bell(zs_emu_nccl_seg *s, uint32_t seen);
/* Is rank k unable to make progress any more (failed, aborted, destroyed,
 * its process dead)? Returns 0, or an ncclResult_t error with msg filled
 * ("<what>: rank k ..."), as the barrier words it. */
ncclResult_t zs_emu_nccl_peer_gone(struct ncclComm *c, int k, const char *what, char *msg,
                                   size_t cap);

/* --- emu_nccl_comm.c --- */
/* Record an error on the communicator (first wins), tell the peers, keep
 * the message for ncclGetLastError; print it unless quiet. */
void zs_emu_nccl_fail(struct ncclComm *c, ncclResult_t rc, const char *msg);
void zs_emu_nccl_set_last(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The checks every call taking a communicator makes: live handle, settled
 * ncclInProgress, no earlier error. fn names the API call. */
ncclResult_t zs_emu_nccl_check(struct ncclComm *c, const char *fn);
void zs_emu_nccl_unref(struct ncclComm *c);
/* Draw whether a non-blocking call returns ncclInProgress, and for how many
 * polls of ncclCommGetAsyncError. 0: settle now. */
int zs_emu_nccl_draw_polls(int rank);

/* --- emu_nccl_exec.c --- */
/* Enqueue one op on its stream (assigns its seq in call order). */
ncclResult_t zs_emu_nccl_launch(zs_emu_nccl_op *op);
void zs_emu_nccl_describe(const zs_emu_nccl_desc *d, char *buf, size_t cap);

/* --- emu_nccl_group.c --- */
int zs_emu_nccl_group_depth(void);
int zs_emu_nccl_group_has(struct ncclComm *c);
/* A call refused inside the open group: the group launches nothing. */
void zs_emu_nccl_group_error(ncclResult_t rc);

/* A refused call (emu_nccl_coll.c): prints the message, fails the
 * communicator (README "Hostile readings": its peers would otherwise wait
 * for work this rank never launches) and the open group, which launches
 * nothing. Returns rc. */
ncclResult_t zs_emu_nccl_refuse(struct ncclComm *c, ncclResult_t rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Record op in the calling thread's open group (takes a reference). */
void zs_emu_nccl_group_add(const zs_emu_nccl_op *op);
/* Launch ops (a closed group, or one call); may hold them back and
 * answer ncclInProgress on a non-blocking communicator. */
ncclResult_t zs_emu_nccl_launch_group(zs_emu_nccl_op *ops, int n);
/* Launch (or, after an abort or error, drop) the ops held back by an
 * ncclInProgress group. */
void zs_emu_nccl_flush_stash(struct ncclComm *c);

/* --- emu_nccl_p2p.c --- */
/* Fold the SEND/RECV ops of ops[0..n) into one P2P op per communicator
 * (at the position of its first), in place; *n shrinks. Refuses (and
 * fails the communicator) what the emulator cannot run: p2p of one
 * communicator on several streams in a group, a send to self without its
 * receive in the same group, overlapping receive buffers. */
ncclResult_t zs_emu_nccl_p2p_fold(zs_emu_nccl_op *ops, int *n);
/* Run a P2P op on the executor (call order already held). */
ncclResult_t zs_emu_nccl_p2p_run(struct ncclComm *c, zs_emu_nccl_op *op, char *msg, size_t cap);
/* Are its buffers still device memory of the communicator's device? */
int zs_emu_nccl_p2p_live(struct ncclComm *c, const zs_emu_nccl_op *op, char *msg, size_t cap);
/* Fill its receive buffers with 0xff (after an error). */
void zs_emu_nccl_p2p_poison(const zs_emu_nccl_op *op, int dev);
/* Free op->p2p (an op dropped or finished). */
void zs_emu_nccl_p2p_free(zs_emu_nccl_op *op);

/* --- emu_nccl_reduce.c --- */
size_t zs_emu_nccl_dtype_size(ncclDataType_t t); /* 0: refused */
const char *zs_emu_nccl_dtype_name(int t);
const char *zs_emu_nccl_op_name(int op);
int zs_emu_nccl_op_ok(ncclRedOp_t op);
/* dst[i] = reduce over k in 0..n-1 of src[k][i], left to right. */
void zs_emu_nccl_reduce(void *dst, const void *const *src, int n, size_t count, int dtype, int op);

#endif
