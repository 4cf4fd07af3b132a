/*
 * zs_client_internal.h - what the parts of the shard client share: the
 * handle and the parallel fan-out with retries.
 *   zs_client.c       lifecycle, Hello, Initialize, Push, Commit, SetState
 *   zs_client_read.c  Pull and GetState
 *   zs_client_ckpt.c  checkpoint calls
 *   zs_client_xfer.c  the operator's calls (checkpoint metadata without a
 *                     Restore, streamed Initialize / SetState of one server)
 *   zs_client_shm.c   the shared-memory data plane (the staging segment,
 *                     its handshake at Hello, Push and Pull by ShmRef)
 * Not part of the contract (zs_client.h).
 */
#ifndef ZS_CLIENT_INTERNAL_H
#define ZS_CLIENT_INTERNAL_H

#include <grpc/grpc.h>

#include "zs_client.h"
#include "zs_rpc.h"

#define ZS__CLIENT_MAX_ADDR 256

typedef struct zs__client_shm zs__client_shm_t;
typedef struct zs__client_shm_srv zs__client_shm_srv_t;

struct zs_client {
    int n;
    char (*addr)[ZS__CLIENT_MAX_ADDR];
    grpc_channel **ch;
    char *token;
    int timeout_ms, retries;
    uint64_t P;
    /* [n] protocol version negotiated with each server at Hello or before
     * Initialize (0: not asked yet); written by that server's fan-out job */
    uint32_t *ver;
    int warned;       /* the warning about an older server was logged */
    int require_nvme; /* zs_client_opts_t.require_nvme */
    /* shared-memory data plane (zs_client_shm.c) */
    int transport;              /* zs_transport_t */
    int shm_checksums;          /* 1: XXH3 of every pushed shared chunk */
    int shm_pull_checksums;     /* 1: and of every pulled one */
    int shm_streams;            /* concurrent streams per server for one Push / Pull */
    zs__client_shm_t *shm;      /* the staging segment; NULL until zs_client_shm_staging */
    zs__client_shm_srv_t *shsv; /* [n] what each server offered and uses */
    /* parameter groups for Initialize (zs_client_set_groups) and their wire
     * form, shared read-only by the per-server Initialize jobs */
    zs_group_range_t *groups;
    size_t ngroups;
    Zeroshard__GroupRange **pb_groups;
};

/* ZS_ERR_STATE naming server i and `what` when it negotiated a protocol
 * older than parameter groups (version 3): it would ignore them and apply
 * one weight decay and lr to the whole model. */
int zs__client_groups_ok(const zs_client_t *c, int i, const char *what, zs_err_t *err);

/* One attempt of an operation on server `server`. */
typedef int (*zs__client_attempt_fn)(zs_client_t *c, int server, void *arg, zs_err_t *err);

/* Run fn on servers [first, last] in parallel, each retried on UNAVAILABLE
 * (args[i - first] is each one's argument, or `shared` for all). Returns
 * the first error, in server order. */
int zs__client_fan_out(zs_client_t *c, int first, int last, zs__client_attempt_fn fn, void **args,
                       void *shared, zs_err_t *err);

/* First element of server i's range (i == n: P). Needs P known. */
uint64_t zs__client_srv_begin(const zs_client_t *c, int i);

/* Servers owning [b, e): *first..*last. ZS_ERR_STATE before the model size
 * is known, ZS_ERR_RANGE unless b < e <= P. */
int zs__client_owners(const zs_client_t *c, uint64_t b, uint64_t e, int *first, int *last,
                      zs_err_t *err);

/* [begin, end) clipped to server i's range into [*b, *e); 0 if empty. */
int zs__client_clip(const zs_client_t *c, int i, uint64_t begin, uint64_t end, uint64_t *b,
                    uint64_t *e);

/* Initialize's request to server i of c (protocol version: the negotiated
 * one once known, else ours; model name, P =
 * c->P, server count and index, AdamW, start step, overwrite) into *q, with
 * *adam as its AdamConfig: both must outlive the stream that sends *q.
 * model is borrowed, not copied. */
void zs__client_init_request(const zs_client_t *c, int i, const char *model,
                             const zs_adam_hparams_t *hp, uint64_t start_step, int overwrite,
                             Zeroshard__InitRequest *q, Zeroshard__AdamConfig *adam);

/* Learn the protocol version server i speaks (a Hello without identity
 * check) unless it is known: before an Initialize, whose request states it.
 * Returns the Hello's status. */
int zs__client_negotiate(zs_client_t *c, int i, zs_err_t *err);

/* zs_client_shm.c. init: the options' transport and checksums, the
 * per-server records (at create); free: the segment and records. */
int zs__client_shm_init(zs_client_t *c, const zs_client_opts_t *o, zs_err_t *err);
void zs__client_shm_free(zs_client_t *c);

/* The session a Hello states: the segment's generation, 0 without one. */
uint64_t zs__client_shm_session(const zs_client_t *c);

/* After server i answered a Hello that stated zs__client_shm_session:
 * record the socket it offers (socket; "" or NULL: none) and, with a
 * segment, decide its transport: the server holds our session (session_ok)
 * -> shm; it offers a socket but does not hold the session (first contact,
 * or it restarted) -> hand the segment over and confirm it with a second
 * Hello; else tcp. Logs a change of transport. An error only with
 * transport shm, when the server does not end on shm (the reason). Runs
 * in server i's fan-out job. chunk_bytes: the reply's shm_chunk_bytes
 * (0 from an older server: 4 MiB). */
int zs__client_shm_hello(zs_client_t *c, int i, const char *socket, int session_ok,
                         uint32_t chunk_bytes, zs_err_t *err);

/* 1 when server i moves bulk data through the segment and
 * [p, p + bytes) lies in its staging area; *off = p's offset in it. */
int zs__client_shm_usable(const zs_client_t *c, int i, const void *p, size_t bytes, uint64_t *off);

/* Push [b, e) of dtype dt for `step` to server i as ShmRefs to the staging
 * at byte offset `off` (zs__client_shm_usable said yes): chunks of
 * zs__client_shm_per_message elements, an XXH3 of each chunk seeded with
 * the step when checksums are on (sums[k] for chunk k when sums is not
 * NULL, else computed here), in up to c->shm_streams concurrent streams
 * over disjoint pieces of whole chunks, `expect` (may be NULL) on each
 * stream's first. One attempt. */
int zs__client_shm_push(zs_client_t *c, int i, uint64_t step, uint64_t b, uint64_t e, zs_dtype_t dt,
                        Zeroshard__StepExpect *expect, uint64_t off, const uint64_t *sums,
                        zs_err_t *err);

/* Elements per chunk of dtype size esz pushed by reference to server i
 * (zs_client_push_msgs' cut): the shm_chunk_bytes of its last Hello, 4 MiB
 * before any or from an older server. */
uint64_t zs__client_shm_per_message(const zs_client_t *c, int i, size_t esz);

/* A pull's progress callback (zs_client_pull_each); fn NULL: none. */
typedef struct {
    zs_client_landed_fn fn;
    void *arg;
} zs__client_landed_t;

/* Pull [b, e) of dtype dt (min_step) from server i into the staging at
 * byte offset `off`, in up to c->shm_streams concurrent streams over
 * disjoint pieces: the server writes in place; each PullChunk must carry
 * no data and a ShmRef at the offset its elements belong at (and a
 * matching XXH3 when checksums are on); landed->fn (if set) is told of
 * each chunk once checked. *lo / *hi: the lowest / highest step the chunks
 * reported. One attempt. */
int zs__client_shm_pull(zs_client_t *c, int i, uint64_t min_step, uint64_t b, uint64_t e,
                        zs_dtype_t dt, uint64_t off, const zs__client_landed_t *landed,
                        uint64_t *lo, uint64_t *hi, zs_err_t *err);

/* The next message of a server stream: *m parsed with desc, its payload
 * framed in *fr (zs_frame_deinit after use); *m NULL at the stream's end
 * (rc ZS_OK) and on error. (zs_client_read.c) */
int zs__client_recv(zs_ccall_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **m,
                    zs_frame_t *fr, zs_err_t *err);

/* End server i's read stream of [b, e) (Pull, GetState) that stopped with
 * rc at element `next`: ZS_ERR_INVALID when it ended early without an
 * error; destroys the call. Returns rc or that error. (zs_client_read.c) */
int zs__client_read_end(const zs_client_t *c, int i, zs_ccall_t *call, int rc, uint64_t next,
                        uint64_t b, uint64_t e, zs_err_t *err);

/* End a client stream whose sends returned rc: take the reply (discarded)
 * and the status unless rc already failed, then destroy the call. Returns
 * rc, or the reply's / status's error. */
int zs__client_stream_end(zs_ccall_t *call, int rc, zs_err_t *err);

#endif
