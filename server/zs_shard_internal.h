/*
 * zs_shard_internal.h - the shard's struct, shared by zs_shard.c (state,
 * push/commit/pull, optimizer driver) and zs_shard_ckpt.c (checkpoints).
 * Not a public header.
 */
#ifndef ZS_SHARD_INTERNAL_H
#define ZS_SHARD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "zs_nvme.h"
#include "zs_pool.h"
#include "zs_shard.h"
#include "zs_store.h"

/* Disjoint, sorted half-open intervals of staged elements. */
typedef struct zs__ranges {
    uint64_t (*iv)[2];
    size_t n, cap;
    uint64_t total; /* sum of lengths */
} zs__ranges_t;

/* The arrays of one state: swapped as a whole by init and restore. */
typedef struct zs__state {
    float *t[3];         /* master, exp_avg, exp_avg_sq: n each; NULL in the NVMe tier */
    zs_nvme_state_t *nv; /* the NVMe tier's tile file holding them instead, or NULL */
    void *staging[2];    /* 4 B * n each, indexed by step parity; NULL in the NVMe tier (its
                          * gradient region holds them) */
    uint16_t *lowp;      /* n */
} zs__state_t;

/* Speculation (zs_shard_spec.c): per-chunk states. */
enum { ZS__SPEC_NONE = 0, ZS__SPEC_QUEUED, ZS__SPEC_RUN, ZS__SPEC_APPLIED };

/* The speculative updates of step spec.step = applied_step + 1 (see
 * zs_shard_spec.c for the model). Under sh->mu except where noted. */
typedef struct zs__spec {
    uint64_t step;       /* step the expected scalars are for; 0: none */
    zs_commit_t expect;  /* grad_scale, lr, param_dtype; clip 1 and no skip implied */
    zs_adam_step_t adam; /* the update they give: t = optimizer_step + 1 */
    int invalid;         /* scalars disagreed, staged bytes changed, or cancelled: no more
                          * chunks this step; the commit rolls the applied ones back */
    _Atomic int abort;   /* the running batch stops taking chunks (a commit is waiting) */
    int running;         /* a batch is applying chunks without mu */
    int full;            /* the window's budget was refused: the rest waits for Commit */
    size_t queued, applied;
    _Atomic unsigned char *st; /* per chunk ZS__SPEC_*; to and from APPLIED under chunk_mu
                                * too (pulls read it holding only chunk_mu) */
    int32_t *slot;             /* per chunk: its pre-image slot while RUN or APPLIED */
    int32_t *job_slot;         /* per chunk: pre-image the running commit pass keeps or restores
                                * (-1: none); written under chunk_mu */
    size_t *batch;             /* chunk indices of the running batch */
    size_t nbatch;
    float **slots; /* pre-images, 3 * ZS_OPT_CHUNK floats each: p, m, v */
    size_t nslots, maxslots;
    int32_t *free_slots;
    size_t nfree;
    uint64_t window; /* bytes of pre-images allowed (zs_shard_opts_t.spec_window) */
    uint64_t budget; /* bytes of sh->budget the slots hold */
} zs__spec_t;

/* The NVMe tier's staging of a pushed chunk (zs_shard_push.c): a budgeted
 * RAM buffer the payload lands in, written to the tile file's gradient
 * region (zs_nvme_grad_put) when the chunk is done. */
typedef struct zs__nvbounce {
    struct zs__nvbounce *next;
    uint64_t step, off, count; /* global elements */
    zs_dtype_t dt;
    uint64_t budget;     /* bytes of sh->budget it holds */
    unsigned char *data; /* count * size bytes (zs_nvme_mem_alloc) */
    size_t bytes;
} zs__nvbounce_t;

struct zs_shard {
    char *data_dir, *server_id;
    int keep;
    zs_store_t *store;
    pthread_mutex_t store_mu; /* the store is single-caller */
    zs_pool_t *pool;

    pthread_mutex_t mu; /* everything below unless noted */
    pthread_cond_t cv;  /* any change a waiter may want */
    int initialized, stopping;
    zs_shard_identity_t id;
    uint64_t rb, re, n;
    zs_adam_hparams_t hp;
    /* Parameter groups (zs_adam_groups.h), global ranges; NULL/0: none.
     * Replaced only by zs__shard_install (shard idle), so passes read them
     * without mu. */
    zs_group_range_t *groups;
    size_t ngroups;
    uint64_t applied_step, optimizer_step;
    zs__state_t st;

    size_t nchunks;
    pthread_mutex_t *chunk_mu; /* held while a chunk is updated or read */
    _Atomic uint64_t *done;    /* step each chunk reflects (written under chunk_mu) */
    unsigned char *lowp_ok;    /* 1 + dtype of lowp if it matches master, else 0 (chunk_mu) */
    zs_dtype_t lowp_dtype;

    struct {
        uint64_t step;
        int has_dtype;
        zs_dtype_t dtype;
        int inflight;         /* reserved chunks not yet done */
        int open;             /* Push streams of this step that wrote a chunk and have not ended */
        uint64_t gen;         /* bumped at every reset: streams of an older step leave it alone */
        zs__ranges_t cov;     /* elements staged (by pushes that ended well) */
        zs__ranges_t pend;    /* elements open streams are writing into staging */
        uint64_t cov_budget;  /* bytes of budget cov.iv holds */
        uint64_t pend_budget; /* and pend.iv */
    } stage[2];

    zs_commit_t last_commit; /* for idempotent re-commits */
    int have_last_commit;

    /* optimizer driver */
    pthread_t opt_thread;
    pthread_t spec_thread; /* speculative batches (zs__spec_main) */
    int spec_thread_ok;
    zs_pool_t *spec_pool; /* its threads */
    int job_pending, opt_running;
    zs_commit_t job;
    zs_adam_step_t job_step;
    int ckpt_busy; /* a checkpoint is reading the state */
    int readers;   /* pulls/gets copying without mu held */

    uint64_t *ckpts; /* complete checkpoints, ascending, as of the last store change */
    size_t nckpts;
    int store_degraded;               /* copy of zs_store_health after each store write */
    char store_error[ZS_ERR_MSG_MAX]; /* its message */

    uint64_t run_id;          /* new at every Initialize; restored with a checkpoint */
    unsigned char *user_meta; /* of the checkpoint last written or restored */
    size_t user_meta_len;

    zs_shard_counters_t c; /* under mu, but for the three below */
    /* Counted per chunk and per refusal by service threads: atomics, no mu. */
    _Atomic uint64_t bytes_in, bytes_out, refused;

    zs__spec_t spec; /* speculative updates (zs_shard_spec.c) */
    int job_spec;    /* the pending/running pass: ZS__JOB_PLAIN, _KEEP or _ROLLBACK */

    /* The NVMe tier (zs_shard_nvme.c), or NULL: p, m, v in RAM. */
    zs_nvme_t *nvme;
    uint64_t nvme_budget; /* bytes of budget its buffers hold */
    /* A pass of the NVMe tier failed (I/O, checksum): the state is no
     * longer one step; every call is refused with tier_error until restart,
     * which resumes from the newest checkpoint. Under mu. */
    int tier_failed;
    char tier_error[ZS_ERR_MSG_MAX];

    zs__nvbounce_t *nv_reserved; /* zs_shard_push_reserve's buffers in the NVMe tier (mu) */

    zs_budget_t budget;   /* own lock; see zs_shard.h, "Memory" */
    uint64_t budget_live; /* bytes of it the installed state holds */
    /* Pull and GetState send buffers (zs_shard_reserve_call), bytes of the
     * budget: held now, and the most held at once since the shard was
     * created. Speculation leaves call_peak - call_bytes free. */
    uint64_t call_bytes, call_peak;
};

/* Empty staging parity p (mu held; no chunk of it in flight): no step, no
 * dtype, no ranges (their budget returned); Push streams still open on it
 * are cut loose (zs_shard_push.c). */
void zs__stage_reset(zs_shard_t *sh, int p);

/* Wait (mu held) until nothing reads or rewrites the state wholesale. */
void zs__shard_wait_idle(zs_shard_t *sh);

/* Allocate arrays for n elements / free them. */
int zs__state_alloc(zs__state_t *s, uint64_t n);
void zs__state_free(zs__state_t *s);

/* A state of n elements in the shard's tier: its arrays (or tile file),
 * and the bytes of budget it holds while installed or built (with the
 * 16-bit copy). */
int zs__state_alloc_tier(zs_shard_t *sh, zs__state_t *s, uint64_t n, int lowp, zs_err_t *err);
uint64_t zs__state_bytes(const zs_shard_t *sh, uint64_t n);

/* Reserve the budget for a new state of n elements (`what` names it in a
 * refusal): zs__state_bytes, or, in the NVMe tier when that does not fit,
 * the same without the 16-bit copy (*lowp = 0: pulls then cast the master
 * weights read from the tiles, the same bits). *bytes: what was taken. */
int zs__state_reserve(zs_shard_t *sh, uint64_t n, const char *what, uint64_t *bytes, int *lowp,
                      zs_err_t *err);

/* ---- the NVMe tier (zs_shard_nvme.c) ---- */

/* The commit pass over the tile file (from opt_main, mu not held): the
 * update of every tile with the same kernel and spans as the RAM pass.
 * A failure marks the shard failed (tier_failed) and is logged. */
int zs__nvme_pass_run(zs_shard_t *sh, uint64_t step, zs_dtype_t gdt, zs_dtype_t pdt, int spec,
                      zs_err_t *err);

/* A speculative update of chunk c (spec_chunk's work in the tier): read
 * the tile and its staged gradient of `step` (in gdt), update it with
 * `adam`, write it aside (not current: the
 * current slot is the pre-image); the chunk's 16-bit copy is marked stale.
 * Takes chunk_mu[c]. On error nothing is current that was not. */
int zs__nvme_spec_chunk(zs_shard_t *sh, size_t c, const zs_adam_step_t *adam, const float *lrs,
                        uint32_t nlrs, uint64_t step, zs_dtype_t gdt, zs_dtype_t pdt,
                        zs_err_t *err);

/* Master weights [s, e) (shard-relative, inside chunk c) cast to dt into
 * out, read from the tile file (chunk_mu[c] held). */
int zs__nvme_pull_master(zs_shard_t *sh, size_t c, uint64_t s, uint64_t e, zs_dtype_t dt, void *out,
                         zs_nvme_buf_t *b, zs_err_t *err);

/* GetState / SetState of tensor t, [a, a + count) shard-relative (shard
 * idle, mu held). */
int zs__nvme_get(zs_shard_t *sh, int t, uint64_t a, uint64_t count, float *dst, zs_err_t *err);
int zs__nvme_set(zs_shard_t *sh, int t, uint64_t a, uint64_t count, const float *src,
                 zs_err_t *err);

/* Writing a state's tiles in order: p, m, v from arrays (NULL: zeros). */
typedef struct zs__nvme_fill {
    zs_nvme_state_t *s;
    zs_nvme_buf_t b;
    uint64_t next; /* elements placed so far */
} zs__nvme_fill_t;
int zs__nvme_fill_begin(zs__nvme_fill_t *f, zs_nvme_state_t *s, zs_err_t *err);
int zs__nvme_fill_add(zs__nvme_fill_t *f, const float *const src[3], uint64_t count, zs_err_t *err);
void zs__nvme_fill_end(zs__nvme_fill_t *f);

/* The store's fill callback for a checkpoint of an NVMe state (ud: the
 * zs_nvme_state_t). */
int zs__nvme_ckpt_fill(void *ud, int t, uint64_t off, void *dst, size_t len, zs_err_t *err);

/* Read checkpoint `step` (n elements) from the store into the tiles of st. */
int zs__nvme_restore(zs_shard_t *sh, uint64_t step, uint64_t n, zs__state_t *st, zs_err_t *err);

/* ZS_OK if a commit's (or an expectation's) group lrs fit the shard's
 * parameter groups (mu held): none, or one per lr_index of them. */
int zs__lrs_fit(const zs_shard_t *sh, const zs_commit_t *c, zs_err_t *err);

/* 1 if two commits carry bitwise the same parameter groups' lrs. */
static inline int zs__same_lrs(const zs_commit_t *a, const zs_commit_t *b)
{
    return a->nlrs == b->nlrs && memcmp(a->lrs, b->lrs, a->nlrs * sizeof(float)) == 0;
}

/* Install a new state (mu held, shard idle): frees the old arrays, sizes the
 * chunk tables, marks every chunk as holding `step`, takes a copy of the
 * parameter groups (n == 0: none; checked against id's P). */
int zs__shard_install(zs_shard_t *sh, const zs_shard_identity_t *id, const zs_adam_hparams_t *hp,
                      const zs_group_range_t *groups, size_t ngroups, zs__state_t *st,
                      uint64_t step, uint64_t optimizer_step, zs_err_t *err);

/* The update of the range's local elements [a, a + k) (pointers address
 * element a), cut at the parameter groups' range ends: each piece runs
 * zs_adam_update_from (zs__shard_adam_save: zs_adam_update_save, keeping
 * the pre-image in sp, sm, sv) with its range's weight_decay and its lr
 * from lrs[0..nlrs) (nlrs == 0: st->lr). Bitwise one call per piece. */
void zs__shard_adam_from(const zs_shard_t *sh, const zs_adam_step_t *st, const float *lrs,
                         uint32_t nlrs, uint64_t a, const float *p0, const float *m0,
                         const float *v0, float *p, float *m, float *v, const void *grad,
                         zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t k);
void zs__shard_adam_save(const zs_shard_t *sh, const zs_adam_step_t *st, const float *lrs,
                         uint32_t nlrs, uint64_t a, float *p, float *m, float *v, float *sp,
                         float *sm, float *sv, const void *grad, zs_dtype_t gdt, void *out,
                         zs_dtype_t pdt, size_t k);

/* ZS_ERR_INVALID ("<what> <step> is above the largest step") when step >
 * ZS_SHARD_STEP_MAX. */
int zs__step_check(uint64_t step, const char *what, zs_err_t *err);

/* Validate an identity (sizes, index) and compute its range. */
int zs__identity_check(const zs_shard_identity_t *id, uint64_t *rb, uint64_t *re, zs_err_t *err);

/* With mu held: ZS_ERR_CANCELLED when stopping, ZS_ERR_STATE without a
 * model; and a range [offset, offset+count) inside the owned range. */
int zs__shard_require_init(zs_shard_t *sh, zs_err_t *err);
int zs__shard_check_range(zs_shard_t *sh, uint64_t offset, uint64_t count, zs_err_t *err);

/* Load the newest loadable checkpoint at start (zs_shard_ckpt.c). */
int zs__shard_load_newest(zs_shard_t *sh, zs_err_t *err);

/* ---- speculation (zs_shard_spec.c) ---- */

enum { ZS__JOB_PLAIN = 0, ZS__JOB_KEEP, ZS__JOB_ROLLBACK };

/* One optimizer pass over the range (RAM: zs_shard.c; NVMe tier:
 * zs_shard_nvme.c): the step, the staged gradient and its dtype, the
 * 16-bit output dtype, and what to do with speculated chunks (ZS__JOB_*). */
typedef struct {
    zs_shard_t *sh;
    uint64_t step;
    zs_dtype_t gdt, pdt;
    const void *grad;
    int spec;
} zs__opt_pass_t;

/* Size the per-chunk tables for nchunks (mu held, shard idle, nothing
 * speculated); frees the pre-image slots and returns their budget. */
int zs__spec_resize(zs_shard_t *sh, size_t nchunks);
void zs__spec_free(zs_shard_t *sh);

/* Expected scalars of `step` stated by a Push stream that ended well
 * (mu held): the first statement sets them; one that disagrees stops
 * speculation for the step. */
void zs__spec_expect(zs_shard_t *sh, uint64_t step, const zs_commit_t *expect);

/* Queue for speculation the chunks of [a, b) (global elements) that the
 * staged ranges of `step` now cover whole (mu held). */
void zs__spec_covered(zs_shard_t *sh, uint64_t step, uint64_t a, uint64_t b);

/* Staged bytes of `step` in [a, b) are about to change or be unstaged (mu
 * held; may wait on cv): if a chunk there is queued or speculated (or
 * `always`), no more speculation this step, and a running batch is waited
 * for so nothing reads staging while it changes. */
void zs__spec_invalidate(zs_shard_t *sh, uint64_t step, uint64_t a, uint64_t b, int always);

/* Is a batch ready to run (mu held)? Never while a commit pass is pending
 * or running. zs__spec_run_batch runs one (mu held; released while it
 * applies). */
int zs__spec_ready(zs_shard_t *sh);
void zs__spec_run_batch(zs_shard_t *sh);

/* The speculation thread: runs batches on its own pool when ready, until
 * the shard stops. */
void *zs__spec_main(void *arg);

/* Stop a running batch and wait for it (mu held). */
void zs__spec_quiesce(zs_shard_t *sh);

/* Undo every speculative update now (mu held, no pass running): the state
 * is the committed one again, and nothing more is speculated this step. */
void zs__spec_cancel(zs_shard_t *sh);

/* At the commit of c (mu held, no pass or batch running): how the pass
 * treats the chunks applied speculatively (ZS__JOB_*), their pre-images
 * handed to it (job_slot); queued ones go back to the plain path. A skipped
 * step restores them here. */
int zs__spec_commit(zs_shard_t *sh, const zs_commit_t *c);

/* A pass chunk's speculative part (chunk_mu held): 1 if the chunk is done
 * (kept), 0 if the real update must still run, reading p, m, v from *from
 * (the pre-image: p at *from, m at *from + ZS_OPT_CHUNK, v at
 * *from + 2 ZS_OPT_CHUNK, valid until zs__spec_pass_end) or, when *from is
 * NULL (nothing speculated), from the state itself. */
int zs__spec_pass_chunk(zs_shard_t *sh, size_t c, int mode, const float **from);

/* After a commit pass (mu held): its pre-image slots are free again. */
void zs__spec_pass_end(zs_shard_t *sh);

/* The fp32 master weights a reader of chunk c must see (chunk_mu held):
 * the pre-image while c holds an uncommitted update, else NULL. */
const float *zs__spec_committed_master(zs_shard_t *sh, size_t c);

#endif
