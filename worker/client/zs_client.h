/*
 * zs_client.h - the shard client: how a worker talks to S shard servers.
 *
 * A client knows the ordered list of servers and, once it has the model size
 * P (from zs_client_init or zs_client_hello), maps any flat range [a, b) onto
 * the servers that own it (zs_layout.h). Operations that touch several
 * servers run on all of them in parallel, one thread each. Every call has a
 * deadline; a server that is UNAVAILABLE is retried with exponential backoff
 * (every operation is idempotent on the server, so a retry is safe). Errors
 * carry the server's address and its own message.
 *
 * Does not: decide when to push or commit (the engine does), or cache state.
 */
#ifndef ZS_CLIENT_H
#define ZS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "zs_adam.h"
#include "zs_adam_groups.h"
#include "zs_dtype.h"
#include "zs_status.h"

typedef struct zs_client zs_client_t;

/* How bulk data (Push, Pull) travels to a server. */
typedef enum {
    ZS_TRANSPORT_AUTO = 0, /* shared memory with every server that proves it shares our host */
    ZS_TRANSPORT_SHM = 1,  /* shared memory with every server, else an error naming it */
    ZS_TRANSPORT_TCP = 2,  /* gRPC messages only */
} zs_transport_t;

#define ZS_CLIENT_SHM_STREAMS_DEFAULT 8
#define ZS_CLIENT_SHM_STREAMS_MAX     16

typedef struct zs_client_opts {
    const char *servers;    /* "host:port,host:port": order = server index */
    const char *token;      /* bearer token or NULL */
    const char *tls_ca_pem; /* PEM text of the CA for TLS, or NULL (plaintext) */
    int timeout_ms;         /* deadline of each call (default 120000) */
    int retries;            /* extra attempts on UNAVAILABLE (0: default 8; < 0: none) */
    /* Shared-memory data plane (zs_client_shm_staging, docs/engine.md). */
    int transport; /* zs_transport_t; 0: auto */
    /* XXH3 of shared chunks, seeded with the step, checked by their reader:
     * 0 (the default), pushed chunks (the server checks what it copies: a
     * stale or foreign segment never reads as a new step); 1, pulled
     * chunks too (the server hashes what it wrote, the worker checks it,
     * catching a worker that breaks the segment's ownership rule); -1,
     * none. 0 takes $ZS_SHM_CHECKSUMS (push, both, off) when it is set. */
    int shm_checksums;
    /* Concurrent streams per server for one Push or Pull over shared memory
     * (1 to ZS_CLIENT_SHM_STREAMS_MAX; 0: $ZS_SHM_STREAMS, else half the
     * CPUs the creating thread may run on, at least 1 and at most
     * ZS_CLIENT_SHM_STREAMS_DEFAULT): the checksums and the servers' copies
     * of a large range then run on that many cores. */
    int shm_streams;
    /* offload_optimizer.device "nvme": every server must keep its state in
     * its NVMe tier (zs-server --nvme-path); Hello and Initialize refuse a
     * server that does not, naming it. */
    int require_nvme;
} zs_client_opts_t;

#define ZS_CLIENT_MAX_CKPTS 64

/* What one server says about itself (HelloReply). */
typedef struct zs_server_info {
    int initialized;
    char model_name[128];
    uint64_t num_params;
    uint32_t num_servers, server_index;
    uint64_t range_begin, range_end;
    uint64_t applied_step, optimizer_step;
    uint64_t checkpoints[ZS_CLIENT_MAX_CKPTS]; /* newest last; at most 64 */
    size_t ncheckpoints;
    zs_adam_hparams_t adam;
    uint64_t bytes_in, bytes_out, steps_applied, steps_skipped, refused;
    double optimizer_gbps, last_step_ms, checkpoint_gbps;
    int store_degraded;                         /* the checkpoint store failed (e.g. a full disk) */
    char store_error[160];                      /* ... and why */
    uint64_t mem_budget, mem_reserved;          /* --mem-budget and what is reserved (bytes) */
    uint64_t rss_bytes, heap_in_use, heap_free; /* the server process's memory (bytes) */
    /* Speculative updates (Counters.spec_*): kept, rolled back, elements. */
    uint64_t spec_hits, spec_rollbacks, spec_elements;
    char shm_socket[108]; /* its shared-memory socket ("": none offered) */
    int nvme;             /* its state lives in its NVMe tier (--nvme-path) */
    /* The parameter groups its model was initialized with (protocol
     * version 3; 0: none). */
    size_t ngroups;
    zs_group_range_t groups[ZS_GROUPS_MAX_RANGES];
} zs_server_info_t;

/* Scalars of one commit (see CommitRequest in proto/zeroshard.proto). */
typedef struct zs_step_scalars {
    uint64_t step;
    float grad_scale, clip_coef, lr;
    int skip;
    zs_dtype_t param_dtype; /* ZS_DTYPE_NONE, BF16 or F16 */
    /* The parameter groups' learning rates (zs_client_set_groups): lrs[k]
     * for the ranges with lr_index k, nlrs of them (at least one per
     * lr_index); nlrs == 0: every range takes lr. Caller's memory. */
    uint32_t nlrs;
    const float *lrs;
} zs_step_scalars_t;

/* Parse opts->servers and open one channel per server (no I/O yet; calls
 * grpc_init). *out freed with zs_client_destroy. */
int zs_client_create(const zs_client_opts_t *opts, zs_client_t **out, zs_err_t *err);

/* Close channels, free (grpc_shutdown). NULL is a no-op. */
void zs_client_destroy(zs_client_t *c);

/* Number of servers S. */
int zs_client_nservers(const zs_client_t *c);

/* Model size the client maps ranges with (0 until init/hello learned it). */
uint64_t zs_client_num_params(const zs_client_t *c);

/* Address of server i (as given). */
const char *zs_client_server(const zs_client_t *c, int i);

/* Hello to every server. model/P may be empty/0 (no identity check). Fills
 * info[0..S) if not NULL. Learns P if servers agree on one, and the
 * protocol version each server speaks: a server older than this client
 * (version 1) is used without speculative updates, with one warning per
 * client (docs/protocol.md, "Versions and negotiation"). */
int zs_client_hello(zs_client_t *c, const char *model, uint64_t P, zs_server_info_t *info,
                    zs_err_t *err);

/* The protocol version this client speaks with its servers: the lowest one
 * negotiated at Hello or Initialize; this build's (ZS_PROTOCOL_VERSION) while
 * no server has been asked. Speculative updates need 2. */
uint32_t zs_client_protocol_version(const zs_client_t *c);

/* 1 when that version has speculative updates (zs_client_push_expect's
 * `expect` reaches every server), 0 when some server is older. */
int zs_client_speculates(const zs_client_t *c);

/* The parameter groups the next Initialize (zs_client_init,
 * zs_client_init_server) gives the servers: ranges of the flat space with
 * their own weight decay and lr index (zs_adam_groups.h; checked against
 * P at Initialize). n == 0: none (the default). Copied. Servers that speak
 * a protocol older than version 3 are refused at Initialize rather than
 * given a model without its groups. ZS_ERR_INVALID, ZS_ERR_NOMEM. */
int zs_client_set_groups(zs_client_t *c, const zs_group_range_t *r, size_t n, zs_err_t *err);

/* Initialize every server with its range of `master` (P fp32 values) and the
 * hyperparameters. overwrite: replace a different model already held. */
int zs_client_init(zs_client_t *c, const char *model, uint64_t P, const zs_adam_hparams_t *hp,
                   const float *master, uint64_t start_step, int overwrite, zs_err_t *err);

/* Stage gradients grad[0 .. end-begin) of dtype dt for `step` on the servers
 * owning [begin, end). */
int zs_client_push(zs_client_t *c, uint64_t step, uint64_t begin, uint64_t end, const void *grad,
                   zs_dtype_t dt, zs_err_t *err);

/* As zs_client_push, stating the scalars the worker expects to commit
 * `step` with (expect->grad_scale, lr, param_dtype; clip coefficient 1 and
 * no skip implied; expect->step, clip_coef and skip are not sent): servers
 * may then apply the step speculatively as its chunks are fully staged,
 * and a Commit with other scalars rolls it back (docs/protocol.md). expect
 * NULL, or a server that negotiated a version without speculation
 * (zs_client_protocol_version): as zs_client_push to that server. */
int zs_client_push_expect(zs_client_t *c, uint64_t step, uint64_t begin, uint64_t end,
                          const void *grad, zs_dtype_t dt, const zs_step_scalars_t *expect,
                          zs_err_t *err);

/* ---- push checksums computed where the staging is written ---------------
 * Pushes through the shared staging carry an XXH3 per message (16 MiB at
 * most: the server's HelloReply.shm_chunk_bytes), which the server checks. A caller that writes the
 * staging itself in cache-sized pieces (the engine on the CPU device) can hash each piece while it
 * is hot instead of leaving a second pass over cold memory to the push: zs_client_push_msgs says
 * where the messages fall, and zs_client_push_sums hands their checksums over. */

/* A message: elements [begin, begin + count) of the flat space. */
typedef struct zs_client_msg {
    uint64_t begin, count;
} zs_client_msg_t;

/* 1 when a push through the shared staging carries checksums: a staging
 * exists (zs_client_shm_staging) and the option shm_checksums does not
 * turn them off. 0: sums are not wanted (zs_client_push_sums ignores
 * them). */
int zs_client_push_sums_wanted(const zs_client_t *c);

/* The messages a push of [begin, end) in dtype dt is cut into: per server
 * owning part of it, in server order, pieces of shm_chunk_bytes /
 * sizeof(dt) elements from the first element it owns (the last shorter),
 * shm_chunk_bytes being what the server's last Hello said (16 MiB; 4 MiB
 * before a Hello or from an older server). The cut does not depend on the
 * transport: ask after zs_client_shm_staging. Writes the first min(*n, max)
 * to m (m may be NULL with max 0); *n gets the count. ZS_ERR_RANGE and
 * ZS_ERR_STATE as a push of that range, ZS_ERR_INVALID for the dtype. */
int zs_client_push_msgs(const zs_client_t *c, uint64_t begin, uint64_t end, zs_dtype_t dt,
                        zs_client_msg_t *m, int max, int *n, zs_err_t *err);

/* As zs_client_push_expect, with sums[j] = zs_hash64 of message j's bytes
 * (zs_client_push_msgs' j-th, count x sizeof(dt) bytes of grad) seeded
 * with `step`: the servers on the shared staging get these instead of a
 * checksum computed here; the others, and a push with sums == NULL, are
 * zs_client_push_expect's. ZS_ERR_INVALID when nsums is not the message
 * count. Nothing here checks the sums: a wrong one is refused by the
 * server (ZS_ERR_CORRUPT), as a chunk that changed after hashing. */
int zs_client_push_sums(zs_client_t *c, uint64_t step, uint64_t begin, uint64_t end,
                        const void *grad, zs_dtype_t dt, const zs_step_scalars_t *expect,
                        const uint64_t *sums, int nsums, zs_err_t *err);

/* Commit s->step on every server. */
int zs_client_commit(zs_client_t *c, const zs_step_scalars_t *s, zs_err_t *err);

/* Fetch parameters [begin, end) as dtype dt into dst once every server has
 * reached min_step. *step_out (may be NULL) gets the lowest step seen. */
int zs_client_pull(zs_client_t *c, uint64_t min_step, uint64_t begin, uint64_t end, void *dst,
                   zs_dtype_t dt, uint64_t *step_out, zs_err_t *err);

/* Told that elements [begin, end) of the flat space are in a pull's dst
 * (zs_client_pull_each). */
typedef void (*zs_client_landed_fn)(void *arg, uint64_t begin, uint64_t end);

/* As zs_client_pull, calling landed(arg, b, e) as each chunk of the
 * answer is in dst (checked, and its checksum verified where asked), so a
 * caller can use the first elements while the rest arrive. Why: one call
 * over a long range costs one call's fixed cost (gRPC, the doorbells'
 * wakeups) where a call per piece costs it per piece. The calls may come
 * from several threads at once (one per server, or per stream over shared
 * memory), each server's in ascending order; the ranges are disjoint, and
 * cover [begin, end) when the pull succeeds. On failure some ranges may
 * have been reported and others not: the caller treats dst as garbage.
 * landed NULL: zs_client_pull. */
int zs_client_pull_each(zs_client_t *c, uint64_t min_step, uint64_t begin, uint64_t end, void *dst,
                        zs_dtype_t dt, zs_client_landed_fn landed, void *arg, zs_err_t *err);

/* Concurrent streams a pull from one server uses: the shm_streams option
 * when some server moves its bulk data through the shared staging, 1
 * otherwise (one gRPC stream per server). */
int zs_client_pull_streams(const zs_client_t *c);

/* Checkpoint `step` on every server; returns when all have it durably.
 * keep: newest checkpoints kept (0: each server's default). */
int zs_client_checkpoint(zs_client_t *c, uint64_t step, int keep, zs_err_t *err);

/* As zs_client_checkpoint, storing `meta` (<= ZS_CLIENT_USER_META_MAX bytes,
 * opaque) with it on
 * every server; zs_client_restore_meta gives it back. */
int zs_client_checkpoint_meta(zs_client_t *c, uint64_t step, int keep, const void *meta, size_t len,
                              zs_err_t *err);

/* Restore `step` everywhere; copies server 0's stored meta into buf (up to
 * cap bytes) and its length into *len (may be NULL). Fails if the servers'
 * metas differ. */
int zs_client_restore_meta(zs_client_t *c, uint64_t step, void *buf, size_t cap, size_t *len,
                           zs_err_t *err);

/* Set every server's applied step and Adam t (workers that run the
 * optimizer themselves, before SetState + Checkpoint). */
int zs_client_set_step(zs_client_t *c, uint64_t step, uint64_t optimizer_step, zs_err_t *err);

/* Steps complete on every server (a checkpoint counts only then),
 * ascending, into steps[0..max); *n = how many. */
int zs_client_checkpoints(zs_client_t *c, uint64_t *steps, size_t max, size_t *n, zs_err_t *err);

/* Restore checkpoint `step` on every server. */
int zs_client_restore(zs_client_t *c, uint64_t step, zs_err_t *err);

/* Delete checkpoint `step` everywhere, or (step 0) keep the newest `keep`. */
int zs_client_delete(zs_client_t *c, uint64_t step, int keep, zs_err_t *err);

/* Delete every checkpoint each server lists, complete on all or not (a
 * fresh run: nothing of an earlier run may be mixed into its restores). */
int zs_client_delete_all(zs_client_t *c, zs_err_t *err);

/* fp32 state tensor (0 master, 1 exp_avg, 2 exp_avg_sq) of [begin, end). */
int zs_client_get_state(zs_client_t *c, int tensor, uint64_t begin, uint64_t end, float *dst,
                        zs_err_t *err);
int zs_client_set_state(zs_client_t *c, int tensor, uint64_t begin, uint64_t end, const float *src,
                        zs_err_t *err);

/* As zs_client_get_state; *step_lo / *step_hi (may be NULL) get the lowest
 * and highest applied step the servers reported for the chunks read (equal
 * when no step was applied while reading). */
int zs_client_get_state_step(zs_client_t *c, int tensor, uint64_t begin, uint64_t end, float *dst,
                             uint64_t *step_lo, uint64_t *step_hi, zs_err_t *err);

/* ---- shared-memory data plane (zs_client_shm.c) ---------------------- */

/* "auto", "shm", "tcp" ("?" otherwise); and back: -1 for another name. */
const char *zs_transport_name(int t);
int zs_transport_parse(const char *name);

/* The worker's staging in shared memory: create once a sealed memfd segment
 * (common/zs_shm.h) whose gradient payload area holds `bytes`, hand it to
 * every server whose Hello offers a shared-memory socket (zs_shm_connect
 * with our bearer token, the server running as our euid), then confirm it
 * with a Hello stating the session: only a server whose reply says it holds
 * the session (shm_session_ok, the proof that the socket and the gRPC
 * address reach one process) moves bulk data through it. *base: the
 * staging area (page-aligned, `bytes` and more, zero-filled), valid until
 * zs_client_destroy. Logs one line per server: "server i (addr): transport
 * shm (socket PATH)" or "transport tcp (why)". Afterwards a Push whose
 * source, or a Pull whose destination, lies inside [*base, *base + bytes)
 * sends a ShmRef instead of the elements to the servers on shm (data is
 * read and written in place: nothing copied), in pushed chunks of up to
 * the server's shm_chunk_bytes (16 MiB) and pulled ones of 4 MiB;
 * each later Hello (a restarted server: the recovery path) hands the same
 * segment over again. A second call returns the same area if `bytes` fits.
 * ZS_ERR_UNAVAILABLE with the reason when transport is tcp, no server offers
 * a socket, or none accepted the segment (auto: use ordinary pinned
 * memory); with transport shm, any server not on shm is an error naming it
 * and why. Hello's own errors. */
int zs_client_shm_staging(zs_client_t *c, size_t bytes, void **base, zs_err_t *err);

/* The transport server i uses for bulk data now: ZS_TRANSPORT_SHM or
 * ZS_TRANSPORT_TCP; why (may be NULL) gets the reason in words ("socket
 * PATH", "the server offers no shared-memory socket", ...; "" when not
 * asked). */
int zs_client_transport(const zs_client_t *c, int i, const char **why);

/* ---- operator calls (zs_client_xfer.c): zs-ctl export and reshard ---- */

/* Largest user_meta a checkpoint carries: the server's ZS_USER_META_MAX
 * (server/zs_shard.h). Both fit a unary message with the other fields. */
#define ZS_CLIENT_USER_META_MAX (60u << 10)

/* What one server stored with a checkpoint (the proto's CheckpointMeta). */
typedef struct zs_ckpt_info {
    char model_name[128];
    uint64_t num_params;
    uint32_t num_servers, server_index;
    uint64_t range_begin, range_end;
    uint64_t applied_step, optimizer_step;
    zs_adam_hparams_t adam;
    uint64_t created_unix_ms;
    size_t user_meta_len;
    size_t ngroups; /* the checkpoint's parameter groups (version 3; 0: none) */
    zs_group_range_t groups[ZS_GROUPS_MAX_RANGES];
} zs_ckpt_info_t;

/* GetCheckpointMeta of complete checkpoint `step` on every server: read
 * from the servers' stores, so their live state does not change (no
 * Restore). Fills info[0..S) (may be NULL), copies the user_meta into buf
 * (up to cap bytes; *len = its full length, may be NULL) and learns P.
 * Refused unless every server's metadata fits the client's layout (server
 * i of S, the range zs_layout gives for P, step = `step`) and the servers
 * agree on model, P, Adam t, hyperparameters and user_meta
 * (ZS_ERR_CORRUPT). A server without the method: ZS_ERR_UNIMPLEMENTED. */
int zs_client_checkpoint_info(zs_client_t *c, uint64_t step, zs_ckpt_info_t *info, void *buf,
                              size_t cap, size_t *len, zs_err_t *err);

/* Where a streamed write gets its data: fill dst[0..count) with the fp32
 * values of global elements [offset, offset + count). Called in ascending,
 * contiguous order over the server's range; a retried stream (the server
 * was UNAVAILABLE) starts again at the range's first element. Returns a
 * zs status (err filled). */
typedef int (*zs_client_fill_fn)(void *ud, uint64_t offset, uint64_t count, float *dst,
                                 zs_err_t *err);

/* Initialize server i alone (of S = zs_client_nservers for P parameters)
 * with its whole range of master weights from `fill`, chunk by chunk: the
 * client holds one chunk (ZS_RPC_CHUNK_BYTES) at a time, whatever the
 * range. Sets the client's P. start_step / overwrite as zs_client_init. */
int zs_client_init_server(zs_client_t *c, int i, const char *model, uint64_t P,
                          const zs_adam_hparams_t *hp, uint64_t start_step, int overwrite,
                          zs_client_fill_fn fill, void *ud, zs_err_t *err);

/* SetState of `tensor` (0..2) over server i's whole range from `fill`,
 * streamed as zs_client_init_server (the server applies it only when the
 * whole stream arrived). Needs P known. */
int zs_client_set_state_server(zs_client_t *c, int i, int tensor, zs_client_fill_fn fill, void *ud,
                               zs_err_t *err);

#endif
