/*
 * zs_shard.h - the state one shard server holds for its range of the flat
 * parameter space, and every operation on it. Knows nothing about gRPC: the
 * service layer (zs_service.c) parses and frames; this layer validates and
 * mutates, so it can be tested directly.
 *
 * State for the owned range [rb, re), n = re - rb elements:
 *   master, exp_avg, exp_avg_sq   fp32[n] each          12 B/element
 *   staging[2]                    gradients of steps S and S+1 (any dtype,
 *                                 up to 4 B/element each)          8 B/element
 *   lowp                          bf16/fp16 copy of master for pulls 2 B/element
 *
 * Steps. applied_step is the last committed training step; optimizer_step
 * (Adam's t) counts the committed steps that were not skipped. Pushes go to
 * step applied_step + 1. A commit is accepted at once (applied_step moves)
 * and the optimizer runs chunk by chunk on a pool of threads; a pull waits
 * per chunk until that chunk holds the step it asked for, so the first
 * chunks stream back while later ones are still being updated.
 *
 * Concurrency. Many service threads call in at once. One mutex guards the
 * step bookkeeping and staging coverage; each optimizer chunk has its own
 * lock so pulls never read a half-updated chunk. Operations that replace or
 * snapshot the whole state (commit, checkpoint, restore, init, set-state)
 * first wait until no optimizer pass and no checkpoint is running.
 *
 * Memory. Every allocation whose size a request decides is reserved against
 * the shard's budget first (zs_budget.h): the installed state (22 B/element
 * and the chunk tables) while it is installed, a new state while an
 * Initialize or Restore builds it (so replacing a model needs room for two),
 * and the staged-range records; the service layer reserves its per-call
 * buffers (SetState, Pull, GetState) against the same budget
 * (zs_shard_budget). A reservation that does not fit is refused with
 * ZS_ERR_NOMEM (RESOURCE_EXHAUSTED) before anything is allocated.
 *
 * Speculation (zs_shard_spec.c). When a Push stream states the scalars the
 * worker expects for its step (zs_shard_push_expect), a speculation thread
 * updates every chunk fully staged for that step before Commit arrives,
 * keeping a pre-image (p, m, v: 12 B/element) of what it overwrote. A Commit
 * with bitwise the expected scalars keeps those updates; any other (clipping,
 * another loss scale, a skipped step) restores the pre-images and applies
 * the real step, so the state after Commit is bitwise the plain one either
 * way. Until Commit, readers see the committed state: pulls read the
 * pre-images, and checkpoints, GetState, SetState, SetStep, Restore and
 * Initialize cancel speculation first. Pre-images are bounded by
 * opts.spec_window and reserved against the budget; chunks beyond wait for
 * Commit. They use only budget the training calls leave: a slot is taken
 * only if as much stays free as Pull and GetState buffers have held at
 * once, and those calls take slots back rather than be refused
 * (zs_shard_reserve_call).
 *
 * Every refusal returns a zs status with a sentence in err and leaves the
 * state as it was.
 */
#ifndef ZS_SHARD_H
#define ZS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "zs_adam.h"
#include "zs_adam_groups.h"
#include "zs_budget.h"
#include "zs_dtype.h"
#include "zs_status.h"

#define ZS_MODEL_NAME_MAX 128
#define ZS_MAX_PARAMS     (1ull << 44) /* 17.6 T elements: far beyond any real model */
#define ZS_OPT_CHUNK      (1u << 16)   /* elements per optimizer chunk (256 KiB fp32) */
/* Bytes of opaque client state per checkpoint (the engine's state and the
 * model manifest). 60 KiB: with the rest of a CheckpointRequest or a
 * CheckpointMeta (a few hundred bytes) it stays within a unary message's
 * limit, ZS_RPC_MAX_META (asserted in zs_service.c). */
#define ZS_USER_META_MAX (60u << 10)
/* The largest step the shard takes anywhere (= ZS_STEP_MAX of the protocol,
 * zs_rpc.h; zs_service.c checks they agree): step + 1 never wraps and Adam's
 * t fits an int64. */
#define ZS_SHARD_STEP_MAX ((1ull << 53) - 1)

typedef enum { ZS_TENSOR_MASTER = 0, ZS_TENSOR_EXP_AVG = 1, ZS_TENSOR_EXP_AVG_SQ = 2 } zs_tensor_t;

typedef struct zs_shard zs_shard_t;

typedef struct zs_shard_opts {
    const char *data_dir;  /* RocksDB directory (created if missing) */
    int threads;           /* optimizer threads; <= 0: all CPUs */
    int keep;              /* checkpoints kept after each new one (>= 1; default 2) */
    const char *server_id; /* shown in Hello, e.g. the listen address */
    uint64_t mem_budget;   /* bytes (zs_budget.h); 0: zs_budget_default() */
    uint64_t spec_window;  /* bytes of speculation pre-images (12 B/element); 0: no
                            * speculation. zs-server's default: ZS_SPEC_WINDOW_DEFAULT */
    /* The NVMe tier (zs_shard_nvme.c): p, m, v in tile files under this
     * directory instead of RAM; NULL: in RAM. Speculation keeps its
     * pre-images on the drive there: spec_window only switches it on. */
    const char *nvme_path;
    int nvme_buffered; /* no O_DIRECT (and tmpfs allowed) */
    int nvme_depth;    /* tiles in flight in a pass; <= 0: ZS_NVME_DEPTH_DEFAULT */
} zs_shard_opts_t;

/* zs-server's default pre-image window: 1 GiB, about 89 M elements. */
#define ZS_SPEC_WINDOW_DEFAULT (1ull << 30)

/* Who the shard is: fixed by Initialize or by the checkpoint it resumed. */
typedef struct zs_shard_identity {
    char model_name[ZS_MODEL_NAME_MAX];
    uint64_t num_params;  /* P */
    uint32_t num_servers; /* S */
    uint32_t server_index;
} zs_shard_identity_t;

typedef struct zs_shard_counters {
    uint64_t bytes_in, bytes_out, steps_applied, steps_skipped, refused, checkpoints_written;
    double optimizer_gbps, last_step_ms, checkpoint_gbps;
    /* Totals since start, for rates (zs-server --metrics): optimizer passes
     * (seconds; state bytes they streamed, 28 B/element/step) and checkpoint
     * writes (seconds; state bytes written, 12 B/element). */
    double optimizer_seconds, checkpoint_seconds;
    uint64_t optimizer_bytes, checkpoint_bytes;
    double last_checkpoint_seconds; /* duration of the newest write */
    double last_checkpoint_time;    /* Unix seconds it became durable; 0: none since start */
    /* Speculation: commits that kept the speculative update, steps whose
     * speculative updates were rolled back (by a commit with other scalars,
     * a skipped step, or a cancel), elements updated speculatively, seconds
     * spent on it, pre-image bytes held (reserved against the budget). */
    uint64_t spec_hits, spec_rollbacks, spec_elements;
    double spec_seconds;
    uint64_t spec_window_bytes;
    /* The NVMe tier (0 without one): zs_nvme_totals_t's figures. */
    uint64_t nvme_read_bytes, nvme_written_bytes, nvme_grad_written_bytes, nvme_passes;
    double nvme_pass_seconds, nvme_io_wait_seconds;
} zs_shard_counters_t;

/* A snapshot for Hello / status. */
typedef struct zs_shard_info {
    int initialized;
    zs_shard_identity_t id;
    uint64_t range_begin, range_end;
    uint64_t applied_step, optimizer_step;
    zs_adam_hparams_t adam;
    zs_shard_counters_t counters;
    uint64_t *checkpoints; /* ascending; malloc'd, caller frees */
    size_t ncheckpoints;
    const char *server_id;
    uint64_t mem_budget, mem_reserved; /* bytes: the budget and what is reserved now */
    uint64_t mem_state;                /* bytes of mem_reserved the installed state holds */
    int nvme;                          /* p, m, v live in the NVMe tier (--nvme-path) */
    int store_degraded;                /* the store's last write failed (zs_store.h) */
    char store_error[ZS_ERR_MSG_MAX];  /* why, when degraded; else "" */
    size_t ngroups;                    /* parameter groups set at Initialize (0: none) */
    zs_group_range_t groups[ZS_GROUPS_MAX_RANGES];
} zs_shard_info_t;

/* Per-step scalars sent with a commit. */
typedef struct zs_commit {
    uint64_t step;
    float grad_scale, clip_coef, lr;
    int skip;
    zs_dtype_t param_dtype; /* low-precision copy to produce; ZS_DTYPE_NONE or F32: none */
    /* The parameter groups' learning rates (protocol version 3): lrs[k] for
     * ranges with lr_index k; nlrs == 0: every range takes lr. */
    uint32_t nlrs;
    float lrs[ZS_GROUPS_MAX_LRS];
} zs_commit_t;

/* Open the store in opts->data_dir and, if it holds checkpoints, load the
 * newest complete one that verifies (falling back to older ones, logged).
 * *out is freed with zs_shard_destroy. */
int zs_shard_create(const zs_shard_opts_t *opts, zs_shard_t **out, zs_err_t *err);

/* Wake every waiter with ZS_ERR_CANCELLED and refuse new waits. Call before
 * stopping the RPC server so no handler stays blocked. */
void zs_shard_shutdown(zs_shard_t *sh);

/* Wait for the optimizer, stop its thread, close the store, free. */
void zs_shard_destroy(zs_shard_t *sh);

/* Fill *info (caller frees info->checkpoints). */
int zs_shard_info(zs_shard_t *sh, zs_shard_info_t *info, zs_err_t *err);

/* Refuse (FAILED_PRECONDITION) when the shard holds a different model. An
 * empty name or zero P is not checked. */
int zs_shard_check_identity(zs_shard_t *sh, const char *model_name, uint64_t num_params,
                            zs_err_t *err);

/* ---- Initialize: a new state built aside, swapped in when complete ---- */

typedef struct zs_shard_init zs_shard_init_t;

/* Validate identity and layout, reserve the new state against the budget
 * (ZS_ERR_NOMEM when it does not fit beside the installed one) and allocate
 * it; nothing is touched (zeroed) until zs_shard_init_end, so an open stream
 * costs address space, not memory. If the shard holds a different model,
 * ZS_ERR_EXISTS unless overwrite; with overwrite every other check still
 * runs first. */
int zs_shard_init_begin(zs_shard_t *sh, const zs_shard_identity_t *id, const zs_adam_hparams_t *hp,
                        uint64_t start_step, int overwrite, zs_shard_init_t **out, zs_err_t *err);

/* The parameter groups of the new state (zs_adam_groups.h; before
 * zs_shard_init_end; none by default): checked against the model's P
 * (ZS_ERR_INVALID), copied. */
int zs_shard_init_groups(zs_shard_init_t *in, const zs_group_range_t *r, size_t n, zs_err_t *err);

/* Where `count` fp32 master weights starting at global element `offset` go.
 * Chunks must arrive in order: offset equals the end of the previous one. */
int zs_shard_init_reserve(zs_shard_init_t *in, uint64_t offset, uint64_t count, float **dst,
                          zs_err_t *err);

/* Swap the new state in if the whole range arrived; frees `in` either way. */
int zs_shard_init_end(zs_shard_init_t *in, zs_err_t *err);

/* Drop an unfinished init (NULL is a no-op). */
void zs_shard_init_abort(zs_shard_init_t *in);

/* ---- Push: stage gradients for step applied_step + 1 ----------------- */

/* A single chunk, written straight into staging (for tests and tools; the
 * service uses the stream API below, which is what keeps a refused request
 * from changing staged bytes). Validate a chunk and return where its count
 * elements of dtype `dt` go. On ZS_OK the caller must call zs_shard_push_done
 * once (commit of this step waits for it). */
int zs_shard_push_reserve(zs_shard_t *sh, uint64_t step, uint64_t offset, uint64_t count,
                          zs_dtype_t dt, void **dst, zs_err_t *err);

/* End a reserved chunk: if ok, record [offset, offset+count) as staged for
 * `step`; if not, unstage it (its bytes were written). Returns the elements
 * of the range staged for that step so far. */
uint64_t zs_shard_push_done(zs_shard_t *sh, uint64_t step, uint64_t offset, uint64_t count, int ok);

/* A Push stream: its chunks count as staged only if it ends well. A stream
 * refused half-way leaves the staged elements and their bytes as they were
 * (chunks that re-push staged elements wait in a buffer until the end) and
 * does not fix the step's dtype. One step per stream. See zs_shard_push.c. */
typedef struct zs_shard_push zs_shard_push_t;

/* Start a stream; *out is freed by zs_shard_push_end. */
int zs_shard_push_begin(zs_shard_t *sh, zs_shard_push_t **out, zs_err_t *err);

/* Validate a chunk as zs_shard_push_reserve does and return where its
 * payload goes; then copy it and call zs_shard_push_chunk_done. */
int zs_shard_push_chunk(zs_shard_push_t *ps, uint64_t step, uint64_t offset, uint64_t count,
                        zs_dtype_t dt, void **dst, zs_err_t *err);
void zs_shard_push_chunk_done(zs_shard_push_t *ps);

/* End the stream: ok, stage what it wrote (*staged: the step's staged
 * elements so far); not ok (a refused chunk, a broken call), unstage it.
 * Frees ps (NULL is a no-op). ZS_ERR_STATE if its step was committed while
 * it was open (nothing staged then). */
int zs_shard_push_end(zs_shard_push_t *ps, int ok, uint64_t *staged, zs_err_t *err);

/* State the scalars the worker expects Commit of the stream's step to carry
 * (grad_scale, lr, param_dtype of e; clip coefficient 1, no skip): once the
 * stream ends well, chunks fully staged for the step may be updated
 * speculatively (see "Speculation" above). Call before any chunk; refused
 * (ZS_ERR_INVALID) for non-finite or negative scalars or an unknown dtype. */
int zs_shard_push_expect(zs_shard_push_t *ps, const zs_commit_t *e, zs_err_t *err);

/* ---- Commit ------------------------------------------------------------ */

/* Accept step c->step and start the optimizer on it (asynchronous). Same
 * step and scalars again: OK, nothing done. Refused (ZS_ERR_STATE) while
 * a Push stream of that step is open. Fills the resulting steps. */
int zs_shard_commit(zs_shard_t *sh, const zs_commit_t *c, uint64_t *applied,
                    uint64_t *optimizer_step, zs_err_t *err);

/* ---- Pull / get / set ------------------------------------------------- */

/* Validate a read of [offset, offset+count) (ZS_ERR_RANGE / ZS_ERR_STATE). */
int zs_shard_check_range(zs_shard_t *sh, uint64_t offset, uint64_t count, zs_err_t *err);

/* Polled while a pull waits: nonzero means its caller has gone away. */
typedef int (*zs_shard_cancel_fn)(void *ud);

/* Copy parameters [offset, offset+count) converted to `dt` into dst once
 * every element holds step >= min_step; waits up to deadline_ms (absolute,
 * CLOCK_MONOTONIC milliseconds: ZS_ERR_TIMEOUT) and, when cancel is not
 * NULL, polls cancel(ud) every 100 ms while waiting (ZS_ERR_CANCELLED once
 * it says so). *step gets the step the data reflects. */
int zs_shard_pull(zs_shard_t *sh, uint64_t min_step, uint64_t offset, uint64_t count, zs_dtype_t dt,
                  void *dst, int64_t deadline_ms, zs_shard_cancel_fn cancel, void *ud,
                  uint64_t *step, zs_err_t *err);

/* Copy fp32 state `t` of [offset, offset+count) into dst (after any running
 * optimizer pass finished). */
int zs_shard_get_state(zs_shard_t *sh, zs_tensor_t t, uint64_t offset, uint64_t count, float *dst,
                       uint64_t *step, zs_err_t *err);

/* Overwrite fp32 state `t` of [offset, offset+count) from src. */
int zs_shard_set_state(zs_shard_t *sh, zs_tensor_t t, uint64_t offset, uint64_t count,
                       const float *src, zs_err_t *err);

/* ---- Checkpoints (zs_shard_ckpt.c) ------------------------------------ */

/* Durably write checkpoint `step` (== applied_step), then keep the newest
 * `keep` (0: the shard's default). Idempotent for an existing step. */
int zs_shard_checkpoint(zs_shard_t *sh, uint64_t step, int keep, double *seconds, zs_err_t *err);

/* As zs_shard_checkpoint, storing `user_meta` (<= ZS_USER_META_MAX bytes,
 * opaque) with the checkpoint. */
int zs_shard_checkpoint_meta(zs_shard_t *sh, uint64_t step, int keep, const void *user_meta,
                             size_t user_meta_len, double *seconds, zs_err_t *err);

/* Load complete checkpoint `step`; the state changes only if it verifies. */
int zs_shard_restore(zs_shard_t *sh, uint64_t step, zs_err_t *err);

/* The user_meta of the checkpoint last written or restored: copies up to
 * cap bytes into buf, returns the full length. */
size_t zs_shard_user_meta(zs_shard_t *sh, void *buf, size_t cap);

/* The stored metadata of complete checkpoint `step` (a packed CheckpointMeta
 * of the proto, checked to unpack), read from the store without loading the
 * checkpoint: the live state does not change. *meta is malloc'd (caller
 * frees), *len its size. ZS_ERR_NOTFOUND if there is no such checkpoint,
 * ZS_ERR_CORRUPT if its metadata does not parse. */
int zs_shard_checkpoint_meta_get(zs_shard_t *sh, uint64_t step, void **meta, size_t *len,
                                 zs_err_t *err);

/* Set applied_step / optimizer_step (optimizer_step <= step) and drop staged
 * gradients; for workers that run the optimizer themselves. */
int zs_shard_set_step(zs_shard_t *sh, uint64_t step, uint64_t optimizer_step, zs_err_t *err);

/* Complete checkpoints, ascending (malloc'd; caller frees *steps), as the
 * shard last saw them after a change of the store: answered without waiting
 * for a checkpoint being written. */
int zs_shard_list(zs_shard_t *sh, uint64_t **steps, size_t *n, zs_err_t *err);

/* Delete checkpoint `step`, or if step == 0 keep the newest `keep`. */
int zs_shard_delete(zs_shard_t *sh, uint64_t step, int keep, zs_err_t *err);

/* The shard's memory budget, for the service layer's per-call buffers. */
zs_budget_t *zs_shard_budget(zs_shard_t *sh);

/* Reserve `bytes` of the budget for the send buffers of a Pull or GetState
 * (`what` names them in a refusal), the calls that end a step: speculation
 * yields to them (zs_shard_spec.c). If they do not fit while pre-image
 * slots are held, the slots are taken back first: a running speculative
 * batch is stopped, speculated chunks are restored (they wait for Commit as
 * plain ones), a commit pass that uses slots is waited for, and every slot
 * is freed. ZS_ERR_NOMEM only when the buffers do not fit with no slot
 * held, as with no speculation. Return them with zs_shard_release_call. */
int zs_shard_reserve_call(zs_shard_t *sh, uint64_t bytes, const char *what, zs_err_t *err);

/* Give back `bytes` that zs_shard_reserve_call reserved. */
void zs_shard_release_call(zs_shard_t *sh, uint64_t bytes);

/* Bytes of budget a state of n elements holds while installed or built: its
 * arrays (22 B/element) and its chunk tables. */
uint64_t zs_shard_state_bytes(uint64_t n);

/* 1 if p, m, v live in the NVMe tier (zs_shard_opts_t.nvme_path). */
int zs_shard_has_nvme(const zs_shard_t *sh);

/* Count a refused request (the service layer calls this). */
void zs_shard_count_refusal(zs_shard_t *sh);

/* Add to the byte counters (the service layer calls this). */
void zs_shard_count_bytes(zs_shard_t *sh, uint64_t in, uint64_t out);

/* Milliseconds on CLOCK_MONOTONIC (the clock deadlines use). */
int64_t zs_now_ms(void);

#endif
