/*
 * zs_shard_spec.c - speculative updates: AdamW applied to the chunks of
 * step S as soon as they are fully staged, before Commit, with the scalars
 * the worker expects (zs_shard.h, "Speculation").
 *
 * Model. A Push stream may state the step's expected scalars (grad_scale,
 * lr, param_dtype; clip coefficient 1 and no skip are implied). Once they
 * are known, every optimizer chunk that the staged ranges cover whole is
 * queued; the speculation thread (and its own pool) takes the queued chunks
 * in batches whenever no commit pass is pending or running (at normal
 * priority: at nice 10 a commit waited 11-19 ms for the starved thread to
 * notice it, bench/RESULTS.md). For each block of a chunk it applies the
 * update in place and, in the same pass, stores the old p, m and v into the
 * chunk's pre-image slot (12 B/element, zs_adam_update_save; and writes the
 * low-precision copy); a commit stops a
 * batch between blocks, and a chunk stopped part-way is put back. done[c]
 * does not move: pulls of the committed step read the pre-image
 * (zs__spec_committed_master).
 *
 * Commit compares its scalars bit for bit with the expected ones (and
 * Adam's t). Equal: the pass keeps each speculated chunk as it is (the same
 * kernel, inputs and order gave it, so it is bitwise the plain update).
 * Different (clipping, another loss scale, a skipped step): the pass
 * applies the real update to each chunk from its pre-image
 * (zs_adam_update_from: bitwise a restore and the update, in one pass); a
 * skipped step restores at once. Chunks not speculated take the plain path.
 *
 * Memory. Pre-image slots are allocated on first use up to the window
 * (zs_shard_opts_t.spec_window, bytes), each reserved against the shard's
 * budget; beyond the window, or when the budget refuses, the remaining
 * chunks wait for Commit. Slots stay allocated (and reserved) until the
 * state is replaced, so steady state allocates nothing.
 *
 * Speculation is an optimisation, so it never starves the calls that end a
 * step (the Pull and GetState send buffers, zs_shard_reserve_call):
 *   1. a slot is taken only if the budget keeps free beside it what those
 *      buffers have held at once at their peak (call_peak) and do not hold
 *      now, so steady training leaves its own Pull's room;
 *   2. a call whose buffers do not fit anyway takes every slot back (the
 *      step's speculation is cancelled, a commit pass using slots is waited
 *      for) and is refused only if they still do not fit: exactly when a
 *      shard without speculation would refuse it.
 * Rule 1 alone cannot promise that (the first Pull, a burst of concurrent
 * ones); rule 2 alone would free and reallocate the slots every step.
 *
 * Safety. Whatever reads or replaces the state wholesale (checkpoints,
 * GetState, SetState, SetStep, Restore, Initialize) cancels speculation
 * first: the pre-images go back, so a checkpoint never holds a speculative
 * state and a crash loses only uncommitted work. Staged bytes that change
 * under a queued or speculated chunk (a re-push, a refused stream) stop
 * speculation for the step; the commit then rolls back.
 *
 * The NVMe tier (zs_shard_nvme.c) keeps its pre-images on the drive: a
 * speculated tile is written aside and the current slot stays the
 * committed one, so its "slots" are bookkeeping only (no RAM, no budget,
 * no window: every chunk may speculate), restoring is marking the 16-bit
 * copy stale, and keeping is the pass flipping the tile.
 *
 * Does not: decide whether a worker states scalars (the client does), or
 * touch staging bookkeeping (zs_shard_push.c).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_log.h"
#include "zs_shard_internal.h"

#define SLOT_FLOATS ((size_t)3 * ZS_OPT_CHUNK)
#define SLOT_BYTES  ((uint64_t)SLOT_FLOATS * 4)

/* Elements of chunk c. */
static uint64_t chunk_len(const zs_shard_t *sh, size_t c)
{
    uint64_t a = (uint64_t)c * ZS_OPT_CHUNK;
    return sh->n - a < ZS_OPT_CHUNK ? sh->n - a : ZS_OPT_CHUNK;
}

void zs__spec_free(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    for (size_t i = 0; i < s->nslots; i++)
        free(s->slots[i]);
    zs_budget_give(&sh->budget, s->budget);
    free((void *)s->st);
    free(s->slot);
    free(s->job_slot);
    free(s->batch);
    free(s->slots);
    free(s->free_slots);
    uint64_t window = s->window;
    memset(s, 0, sizeof *s);
    s->window = window;
}

int zs__spec_resize(zs_shard_t *sh, size_t nchunks)
{
    zs__spec_free(sh);
    zs__spec_t *s = &sh->spec;
    uint64_t max = sh->nvme ? nchunks : s->window / SLOT_BYTES; /* NVMe: pre-images on the drive */
    s->maxslots = (size_t)(max < nchunks ? max : nchunks);
    size_t a = nchunks ? nchunks : 1, m = s->maxslots ? s->maxslots : 1;
    s->st = calloc(a, sizeof *s->st);
    s->slot = calloc(a, sizeof *s->slot);
    s->job_slot = malloc(a * sizeof *s->job_slot);
    s->batch = calloc(a, sizeof *s->batch);
    s->slots = calloc(m, sizeof *s->slots);
    s->free_slots = calloc(m, sizeof *s->free_slots);
    if (!s->st || !s->slot || !s->job_slot || !s->batch || !s->slots || !s->free_slots) {
        zs__spec_free(sh); /* maxslots 0: nothing is ever speculated */
        return ZS_ERR_NOMEM;
    }
    for (size_t c = 0; c < a; c++)
        s->job_slot[c] = -1;
    return ZS_OK;
}

/* Forget the step's speculation bookkeeping (mu held; nothing APPLIED or
 * RUN any more). */
static void spec_reset(zs_shard_t *sh, uint64_t step)
{
    zs__spec_t *s = &sh->spec;
    for (size_t c = 0; c < sh->nchunks && s->queued; c++)
        if (s->st[c] == ZS__SPEC_QUEUED) {
            s->st[c] = ZS__SPEC_NONE;
            s->queued--;
        }
    s->step = step;
    s->invalid = 0;
    s->abort = 0;
    s->full = 0;
    s->queued = 0;
    s->applied = 0;
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

void zs__spec_expect(zs_shard_t *sh, uint64_t step, const zs_commit_t *expect)
{
    zs__spec_t *s = &sh->spec;
    if (s->maxslots == 0 || step != sh->applied_step + 1)
        return;
    if (zs__lrs_fit(sh, expect, NULL) != ZS_OK) { /* its Commit will be refused too */
        if (s->step == step)
            s->invalid = 1;
        return;
    }
    if (s->step != step) {
        spec_reset(sh, step);
        s->expect = *expect;
        s->expect.step = step;
        s->adam.lr = expect->lr;
        s->adam.t = (int64_t)sh->optimizer_step + 1;
        s->adam.grad_scale = expect->grad_scale;
        s->adam.clip_coef = 1.0f;
        return;
    }
    if (!same_bits(s->expect.grad_scale, expect->grad_scale) ||
        !same_bits(s->expect.lr, expect->lr) || s->expect.param_dtype != expect->param_dtype ||
        !zs__same_lrs(&s->expect, expect)) {
        if (!s->invalid)
            ZS_WARN("push: step %llu: Push streams state different expected scalars "
                    "(grad_scale %g / %g, lr %g / %g): no more speculation this step",
                    (unsigned long long)step, s->expect.grad_scale, expect->grad_scale,
                    s->expect.lr, expect->lr);
        s->invalid = 1;
    }
}

/* Is global [a, b) inside one staged interval of parity p? */
static int covered(const zs__ranges_t *r, uint64_t a, uint64_t b)
{
    size_t lo = 0, hi = r->n; /* first interval with iv[0] > a */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->iv[mid][0] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && r->iv[lo - 1][1] >= b;
}

void zs__spec_covered(zs_shard_t *sh, uint64_t step, uint64_t a, uint64_t b)
{
    zs__spec_t *s = &sh->spec;
    if (s->step != step || s->invalid || s->maxslots == 0 || b <= a)
        return;
    int p = (int)(step & 1);
    if (sh->stage[p].step != step)
        return;
    size_t c0 = (size_t)((a - sh->rb) / ZS_OPT_CHUNK),
           c1 = (size_t)((b - sh->rb - 1) / ZS_OPT_CHUNK);
    size_t added = 0;
    for (size_t c = c0; c <= c1 && c < sh->nchunks; c++) {
        if (s->st[c] != ZS__SPEC_NONE)
            continue;
        uint64_t ca = sh->rb + (uint64_t)c * ZS_OPT_CHUNK;
        if (covered(&sh->stage[p].cov, ca, ca + chunk_len(sh, c))) {
            s->st[c] = ZS__SPEC_QUEUED;
            s->queued++;
            added++;
        }
    }
    if (added)
        pthread_cond_broadcast(&sh->cv);
}

void zs__spec_quiesce(zs_shard_t *sh)
{
    while (sh->spec.running) {
        sh->spec.abort = 1;
        pthread_cond_wait(&sh->cv, &sh->mu);
    }
}

void zs__spec_invalidate(zs_shard_t *sh, uint64_t step, uint64_t a, uint64_t b, int always)
{
    zs__spec_t *s = &sh->spec;
    if (s->maxslots == 0 || step != sh->applied_step + 1)
        return;
    if (s->step != step) {
        if (always) { /* no expectation yet: none may come this step */
            spec_reset(sh, step);
            s->invalid = 1;
        }
        return;
    }
    int hit = always;
    if (!hit && b > a && a >= sh->rb) {
        size_t c0 = (size_t)((a - sh->rb) / ZS_OPT_CHUNK);
        size_t c1 = (size_t)((b - sh->rb - 1) / ZS_OPT_CHUNK);
        for (size_t c = c0; c <= c1 && c < sh->nchunks && !hit; c++)
            hit = s->st[c] != ZS__SPEC_NONE;
    }
    if (!hit)
        return;
    if (!s->invalid)
        ZS_INFO("push: step %llu: staged bytes under speculated chunks changed; the commit "
                "rolls them back",
                (unsigned long long)step);
    s->invalid = 1;
    zs__spec_quiesce(sh); /* nothing reads staging while it changes */
}

int zs__spec_ready(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    return s->step != 0 && s->step == sh->applied_step + 1 && !s->invalid && !s->abort &&
           !sh->ckpt_busy && !sh->stopping && sh->initialized && !sh->job_pending &&
           !sh->opt_running && s->queued > 0 &&
           (s->nfree > 0 || (s->nslots < s->maxslots && !s->full));
}

void *zs__spec_main(void *arg)
{
    zs_shard_t *sh = arg;
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->stopping && !zs__spec_ready(sh))
            pthread_cond_wait(&sh->cv, &sh->mu);
        if (sh->stopping)
            break;
        zs__spec_run_batch(sh);
    }
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

/* A free pre-image slot, allocating one within the window and the budget;
 * -1 when there is none (mu held). */
static int32_t take_slot(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    if (s->nfree > 0)
        return s->free_slots[--s->nfree];
    if (s->nslots >= s->maxslots || s->full)
        return -1;
    if (sh->nvme) { /* the pre-image is the tile's current slot */
        s->slots[s->nslots] = NULL;
        return (int32_t)s->nslots++;
    }
    zs_err_t err;
    /* Rule 1 (top of file): room for the call buffers at their peak. */
    uint64_t spare = sh->call_peak - sh->call_bytes;
    if (zs_budget_take_spare(&sh->budget, SLOT_BYTES, spare, "a speculation pre-image", &err) !=
        ZS_OK) {
        ZS_WARN("speculation: %s; the rest of step %llu waits for its commit", err.msg,
                (unsigned long long)s->step);
        s->full = 1;
        return -1;
    }
    float *m = aligned_alloc(64, SLOT_BYTES);
    if (!m) {
        zs_budget_give(&sh->budget, SLOT_BYTES);
        s->full = 1;
        return -1;
    }
    s->budget += SLOT_BYTES;
    s->slots[s->nslots] = m;
    return (int32_t)s->nslots++;
}

typedef struct {
    zs_shard_t *sh;
    zs_adam_step_t adam;
    zs_dtype_t gdt, pdt;
    const void *grad;
} batch_t;

/* Elements per step of a speculative chunk between two looks at `abort`:
 * a commit waits for at most this much work per speculation thread. */
#define SPEC_BLOCK 8192u

static void spec_chunk(void *arg, size_t i, int thread)
{
    (void)thread;
    batch_t *bt = arg;
    zs_shard_t *sh = bt->sh;
    zs__spec_t *s = &sh->spec;
    size_t c = s->batch[i];
    if (atomic_load(&s->abort))
        return;      /* stays RUN: back to the plain path */
    if (sh->st.nv) { /* the tier: one tile read, updated and written aside */
        zs_err_t err;
        if (zs__nvme_spec_chunk(sh, c, &bt->adam, s->expect.lrs, s->expect.nlrs, s->step, bt->gdt,
                                bt->pdt, &err) == ZS_OK)
            s->st[c] = ZS__SPEC_APPLIED; /* else it stays RUN: the plain path */
        else
            ZS_WARN("speculation: chunk %zu: %s; it waits for Commit", c, err.msg);
        return;
    }
    uint64_t a = (uint64_t)c * ZS_OPT_CHUNK, k = chunk_len(sh, c);
    float *pre = s->slots[s->slot[c]];
    size_t gsz = zs_dtype_size(bt->gdt);
    pthread_mutex_lock(&sh->chunk_mu[c]);
    uint64_t done = 0;
    while (done < k) {
        if (done > 0 && atomic_load(&s->abort))
            break;
        uint64_t o = done, n = k - done < SPEC_BLOCK ? k - done : SPEC_BLOCK;
        /* the update, with p, m, v's old values into the pre-image */
        zs__shard_adam_save(
            sh, &bt->adam, s->expect.lrs, s->expect.nlrs, a + o, sh->st.t[0] + a + o,
            sh->st.t[1] + a + o, sh->st.t[2] + a + o, pre + o, pre + ZS_OPT_CHUNK + o,
            pre + 2 * ZS_OPT_CHUNK + o, (const char *)bt->grad + (a + o) * gsz, bt->gdt,
            bt->pdt == ZS_DTYPE_NONE ? NULL : sh->st.lowp + a + o, bt->pdt, (size_t)n);
        done += n;
    }
    if (done == k) {
        s->st[c] = ZS__SPEC_APPLIED;
    } else { /* aborted part-way: undo the blocks done; stays RUN */
        memcpy(sh->st.t[0] + a, pre, done * 4);
        memcpy(sh->st.t[1] + a, pre + ZS_OPT_CHUNK, done * 4);
        memcpy(sh->st.t[2] + a, pre + 2 * ZS_OPT_CHUNK, done * 4);
        if (bt->pdt != ZS_DTYPE_NONE)
            sh->lowp_ok[c] = 0; /* partly overwritten: pulls cast the master */
    }
    pthread_mutex_unlock(&sh->chunk_mu[c]);
}

void zs__spec_run_batch(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    s->nbatch = 0;
    for (size_t c = 0; c < sh->nchunks && s->queued > 0; c++) {
        if (s->st[c] != ZS__SPEC_QUEUED)
            continue;
        int32_t slot = take_slot(sh);
        if (slot < 0)
            break;
        s->slot[c] = slot;
        s->st[c] = ZS__SPEC_RUN;
        s->queued--;
        s->batch[s->nbatch++] = c;
    }
    if (s->nbatch == 0)
        return;
    int p = (int)(s->step & 1);
    batch_t bt = {sh, s->adam, sh->stage[p].dtype, s->expect.param_dtype, sh->st.staging[p]};
    s->running = 1;
    pthread_mutex_unlock(&sh->mu);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    zs_pool_run(sh->spec_pool, s->nbatch, spec_chunk, &bt);
    clock_gettime(CLOCK_MONOTONIC, &t1);

    pthread_mutex_lock(&sh->mu);
    uint64_t elems = 0;
    for (size_t i = 0; i < s->nbatch; i++) {
        size_t c = s->batch[i];
        if (s->st[c] == ZS__SPEC_APPLIED) {
            s->applied++;
            elems += chunk_len(sh, c);
        } else { /* aborted before it ran */
            s->st[c] = ZS__SPEC_NONE;
            s->free_slots[s->nfree++] = s->slot[c];
        }
    }
    s->nbatch = 0;
    s->running = 0;
    sh->c.spec_elements += elems;
    sh->c.spec_seconds +=
        (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    pthread_cond_broadcast(&sh->cv);
}

/* Put chunk c back to its pre-image (chunk_mu held). */
static void restore_chunk(zs_shard_t *sh, size_t c, const float *pre)
{
    if (sh->st.nv) { /* the tier: the current slot is the pre-image already */
        sh->lowp_ok[c] = 0;
        return;
    }
    uint64_t a = (uint64_t)c * ZS_OPT_CHUNK, k = chunk_len(sh, c);
    memcpy(sh->st.t[0] + a, pre, k * 4);
    memcpy(sh->st.t[1] + a, pre + ZS_OPT_CHUNK, k * 4);
    memcpy(sh->st.t[2] + a, pre + 2 * ZS_OPT_CHUNK, k * 4);
    sh->lowp_ok[c] = 0; /* the update overwrote it; pulls cast the master */
}

/* Restore every APPLIED chunk (mu held, no batch running). Returns how many. */
static size_t restore_applied(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    size_t n = 0;
    for (size_t c = 0; c < sh->nchunks && s->applied > 0; c++) {
        if (s->st[c] != ZS__SPEC_APPLIED)
            continue;
        pthread_mutex_lock(&sh->chunk_mu[c]);
        restore_chunk(sh, c, s->slots[s->slot[c]]);
        s->st[c] = ZS__SPEC_NONE;
        pthread_mutex_unlock(&sh->chunk_mu[c]);
        s->free_slots[s->nfree++] = s->slot[c];
        s->applied--;
        n++;
    }
    return n;
}

void zs__spec_cancel(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    zs__spec_quiesce(sh);
    if (s->step == 0)
        return;
    size_t n = restore_applied(sh);
    uint64_t step = s->step;
    spec_reset(sh, step);
    s->invalid = 1;
    if (n) {
        sh->c.spec_rollbacks++;
        ZS_INFO("speculation: step %llu cancelled before its commit (%zu chunks restored)",
                (unsigned long long)step, n);
    }
}

int zs__spec_commit(zs_shard_t *sh, const zs_commit_t *c)
{
    zs__spec_t *s = &sh->spec;
    int mode = ZS__JOB_PLAIN;
    if (s->step == c->step && s->applied > 0) {
        int match = !s->invalid && !c->skip && same_bits(c->grad_scale, s->expect.grad_scale) &&
                    same_bits(c->clip_coef, 1.0f) && same_bits(c->lr, s->expect.lr) &&
                    c->param_dtype == s->expect.param_dtype && zs__same_lrs(c, &s->expect) &&
                    s->adam.t == (int64_t)sh->optimizer_step + 1;
        size_t n = s->applied;
        if (c->skip) {
            restore_applied(sh);
        } else {
            for (size_t k = 0; k < sh->nchunks; k++) {
                if (s->st[k] != ZS__SPEC_APPLIED)
                    continue;
                pthread_mutex_lock(&sh->chunk_mu[k]);
                s->job_slot[k] = s->slot[k];
                s->st[k] = ZS__SPEC_NONE;
                pthread_mutex_unlock(&sh->chunk_mu[k]);
            }
            s->applied = 0;
            mode = match ? ZS__JOB_KEEP : ZS__JOB_ROLLBACK;
        }
        if (match)
            sh->c.spec_hits++;
        else
            sh->c.spec_rollbacks++;
        ZS_INFO("speculation: step %llu: %zu of %zu chunks %s", (unsigned long long)c->step, n,
                sh->nchunks, match ? "kept" : "rolled back");
    }
    spec_reset(sh, 0);
    return mode;
}

int zs__spec_pass_chunk(zs_shard_t *sh, size_t c, int mode, const float **from)
{
    zs__spec_t *s = &sh->spec;
    int32_t slot = s->job_slot[c];
    *from = NULL;
    if (slot < 0)
        return 0;
    s->job_slot[c] = -1;
    if (mode == ZS__JOB_KEEP)
        return 1;
    /* Rolled back: the real update reads the pre-image instead of the
     * speculated state, one pass instead of a restore and a pass (the slot
     * stays ours until zs__spec_pass_end). */
    *from = s->slots[slot];
    return 0;
}

void zs__spec_pass_end(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    /* Only the pass held slots: no batch runs while a pass is pending or
     * running (zs__spec_ready), and the commit gave it every APPLIED one. */
    if (s->applied == 0 && !s->running) {
        s->nfree = s->nslots;
        for (size_t i = 0; i < s->nslots; i++)
            s->free_slots[i] = (int32_t)i;
    }
}

const float *zs__spec_committed_master(zs_shard_t *sh, size_t c)
{
    zs__spec_t *s = &sh->spec;
    if (s->st && s->st[c] == ZS__SPEC_APPLIED)
        return s->slots[s->slot[c]];
    if (s->job_slot && s->job_slot[c] >= 0)
        return s->slots[s->job_slot[c]];
    return NULL;
}

/* Free every pre-image slot and return its budget (mu held, every slot
 * free: no batch, no pass, nothing APPLIED). Returns the bytes freed. */
static uint64_t release_slots(zs_shard_t *sh)
{
    zs__spec_t *s = &sh->spec;
    for (size_t i = 0; i < s->nslots; i++) {
        free(s->slots[i]);
        s->slots[i] = NULL;
    }
    uint64_t bytes = s->budget;
    zs_budget_give(&sh->budget, bytes);
    s->budget = 0;
    s->nslots = 0;
    s->nfree = 0;
    return bytes;
}

/* Rule 2 (top of file): take every slot back for a call whose buffers did
 * not fit (mu held; may wait on cv). Returns 1 if the caller should try its
 * reservation again (slots were freed, here or by another call meanwhile),
 * 0 if speculation holds none it can give. */
static int spec_yield(zs_shard_t *sh, const char *what)
{
    zs__spec_t *s = &sh->spec;
    if (s->budget == 0)
        return 0;
    while (s->budget > 0) {
        if (sh->job_pending || sh->opt_running) {
            /* The commit pass reads kept or rolled-back chunks' pre-images
             * until it ends (zs__spec_pass_end frees them): one pass. */
            pthread_cond_wait(&sh->cv, &sh->mu);
            continue;
        }
        if (s->running || s->applied > 0) {
            /* Stop the batch and restore the speculated chunks: the step
             * speculates no more, its chunks wait for Commit as plain ones
             * (bitwise the same state either way). May wait: look again. */
            zs__spec_cancel(sh);
            continue;
        }
        if (s->nfree != s->nslots)
            return 0; /* a slot in use by nobody we can wait for: never spin */
        size_t n = s->nslots;
        uint64_t bytes = release_slots(sh);
        ZS_INFO("speculation: %zu pre-image slots (%.1f MiB) given back for %s", n,
                (double)bytes / (1 << 20), what);
    }
    return 1;
}

int zs_shard_reserve_call(zs_shard_t *sh, uint64_t bytes, const char *what, zs_err_t *err)
{
    pthread_mutex_lock(&sh->mu);
    int rc;
    for (;;) {
        /* Under mu: the speculation thread takes slots under mu too, so
         * what spec_yield freed is still free here. */
        rc = zs_budget_take(&sh->budget, bytes, what, err);
        if (rc != ZS_ERR_NOMEM || !spec_yield(sh, what))
            break;
    }
    if (rc == ZS_OK) {
        sh->call_bytes += bytes;
        if (sh->call_bytes > sh->call_peak)
            sh->call_peak = sh->call_bytes;
    }
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

void zs_shard_release_call(zs_shard_t *sh, uint64_t bytes)
{
    pthread_mutex_lock(&sh->mu);
    sh->call_bytes = bytes <= sh->call_bytes ? sh->call_bytes - bytes : 0;
    zs_budget_give(&sh->budget, bytes);
    pthread_mutex_unlock(&sh->mu);
}
