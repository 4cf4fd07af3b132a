/*
 * zs_shard_push.c - gradient staging (Push) and Commit of a shard (see
 * zs_shard.h). Split from zs_shard.c (state, lifecycle, optimizer driver).
 *
 * Staging. Gradients of step S go straight from the received message into
 * staging[S & 1] (one copy) when they land on elements nobody staged or is
 * writing; which elements count as staged is a set of disjoint ranges per
 * parity (`cov`), and a Push stream adds its chunks to it only when the
 * whole stream ended well (zs_shard_push_end). A chunk that re-pushes
 * staged elements, or elements another open stream is writing (`pend`),
 * waits in a buffer (budgeted) and is copied in at that end. So a stream
 * refused half-way leaves the staged elements and their bytes exactly as
 * they were, and does not fix the step's dtype. (One case is only made
 * safe, not undone: when two open streams overlap and the one that wrote
 * first is refused after the other staged those elements, they are
 * unstaged: the server never commits bytes a refused request wrote.)
 * Commit applies only a fully covered range, and refuses while a Push of
 * that step is still open.
 *
 * The NVMe tier (sh->st.nv) stages on the drive, not in RAM: a chunk's
 * payload lands in a budgeted buffer (count * size + one gradient span)
 * and is written to the tile file's gradient region when the chunk is
 * done (zs_nvme_grad_put, without mu), before it counts as done; a write
 * that fails fails the stream (its elements are not staged). Re-pushed
 * chunks are written at the stream's end, as the RAM path copies them; a
 * write that fails there fails the stream and leaves the tiles it touched
 * holding nothing of the step, so a Commit's pass refuses them (the tier
 * then fails as for a corrupted tile) rather than use them.
 *
 * Locking: everything here runs under sh->mu except the payload copies,
 * which happen between a reserve and its done (counted in `inflight`, which
 * Commit and whole-state operations wait for).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_log.h"
#include "zs_shard_internal.h"

/* ---- staged ranges ---------------------------------------------------- */

static void ranges_clear(zs__ranges_t *r)
{
    r->n = 0;
    r->total = 0;
}

/* Insert [a, b), merging neighbours. The caller made room for one more
 * interval (ranges_room); -1 if it did not and realloc failed. */
static int ranges_add(zs__ranges_t *r, uint64_t a, uint64_t b)
{
    size_t i = 0;
    while (i < r->n && r->iv[i][1] < a)
        i++;
    size_t j = i; /* intervals [i, j) touch or overlap [a, b) */
    while (j < r->n && r->iv[j][0] <= b) {
        if (r->iv[j][0] < a)
            a = r->iv[j][0];
        if (r->iv[j][1] > b)
            b = r->iv[j][1];
        r->total -= r->iv[j][1] - r->iv[j][0];
        j++;
    }
    if (i == j) { /* pure insertion at i */
        if (r->n == r->cap) {
            size_t cap = r->cap ? 2 * r->cap : 16;
            void *p = realloc(r->iv, cap * sizeof *r->iv);
            if (!p)
                return -1;
            r->iv = p;
            r->cap = cap;
        }
        memmove(r->iv + i + 1, r->iv + i, (r->n - i) * sizeof *r->iv);
        r->n++;
    } else if (j > i + 1) {
        memmove(r->iv + i + 1, r->iv + j, (r->n - j) * sizeof *r->iv);
        r->n -= j - i - 1;
    }
    r->iv[i][0] = a;
    r->iv[i][1] = b;
    r->total += b - a;
    return 0;
}

/* Remove [a, b). Cutting an interval in two needs room for one more; -1
 * (nothing removed from that interval on) when there is none. */
static int ranges_sub(zs__ranges_t *r, uint64_t a, uint64_t b)
{
    for (size_t i = 0; i < r->n;) {
        uint64_t lo = r->iv[i][0], hi = r->iv[i][1];
        if (hi <= a || lo >= b) {
            i++;
            continue;
        }
        if (lo < a && hi > b) { /* split */
            if (r->n == r->cap)
                return -1;
            memmove(r->iv + i + 2, r->iv + i + 1, (r->n - i - 1) * sizeof *r->iv);
            r->iv[i][1] = a;
            r->iv[i + 1][0] = b;
            r->iv[i + 1][1] = hi;
            r->n++;
            r->total -= b - a;
            return 0;
        }
        r->total -= (hi < b ? hi : b) - (lo > a ? lo : a);
        if (lo < a) {
            r->iv[i][1] = a;
            i++;
        } else if (hi > b) {
            r->iv[i][0] = b;
            i++;
        } else {
            memmove(r->iv + i, r->iv + i + 1, (r->n - i - 1) * sizeof *r->iv);
            r->n--;
        }
    }
    return 0;
}

/* Take bytes a failed push wrote out of the staged set; when the records
 * cannot be cut, nothing of the step stays staged (it must be pushed again:
 * never commit bytes of a refused request). */
static void unstage(zs__ranges_t *cov, uint64_t a, uint64_t b)
{
    if (ranges_sub(cov, a, b) != 0) {
        ZS_WARN("staged-range records full: the whole step must be pushed again");
        ranges_clear(cov);
    }
}

/* Grow r to hold `need` intervals, reserving the growth against the budget
 * (*held counts what r holds): many small disjoint chunks make these
 * records grow, up to 8 B per element. */
static int ranges_room(zs_shard_t *sh, zs__ranges_t *r, size_t need, uint64_t *held, zs_err_t *err)
{
    if (need <= r->cap)
        return ZS_OK;
    size_t cap = r->cap ? r->cap : 16;
    while (cap < need)
        cap *= 2;
    uint64_t more = (uint64_t)(cap - r->cap) * sizeof *r->iv;
    int rc = zs_budget_take(&sh->budget, more, "the staged-range records of this push", err);
    if (rc)
        return rc;
    void *iv = realloc(r->iv, cap * sizeof *r->iv);
    if (!iv) {
        zs_budget_give(&sh->budget, more);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for staged-range records");
    }
    r->iv = iv;
    r->cap = cap;
    *held += more;
    return ZS_OK;
}

/* See zs_shard_internal.h. */
void zs__stage_reset(zs_shard_t *sh, int p)
{
    zs__ranges_t *r = &sh->stage[p].cov;
    free(r->iv);
    memset(r, 0, sizeof *r);
    r = &sh->stage[p].pend;
    free(r->iv);
    memset(r, 0, sizeof *r);
    zs_budget_give(&sh->budget, sh->stage[p].cov_budget + sh->stage[p].pend_budget);
    sh->stage[p].cov_budget = 0;
    sh->stage[p].pend_budget = 0;
    sh->stage[p].step = 0;
    sh->stage[p].has_dtype = 0;
    sh->stage[p].open = 0;
    sh->stage[p].gen++; /* streams still open on the old step leave it alone */
}

/* ---- one chunk: validate and reserve (mu held) -------------------------- */

/* Everything a chunk of `step` must satisfy; on ZS_OK stage[p] is set to
 * `step` (reset if it held another) and `dt` is allowed for it. */
static int chunk_check_locked(zs_shard_t *sh, uint64_t step, uint64_t offset, uint64_t count,
                              zs_dtype_t dt, zs_err_t *err)
{
    if (zs_dtype_size(dt) == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown gradient dtype %d", (int)dt);
    int rc = zs__step_check(step, "push of step", err);
    if (!rc)
        rc = zs__shard_require_init(sh, err);
    if (!rc && step != sh->applied_step + 1)
        rc = zs_err_set(err, ZS_ERR_STATE,
                        step <= sh->applied_step
                            ? "push for step %llu refused: step %llu is already committed"
                            : "push for step %llu refused: server is at step %llu and expects "
                              "the next step only",
                        (unsigned long long)step, (unsigned long long)sh->applied_step);
    if (!rc)
        rc = zs__shard_check_range(sh, offset, count, err);
    if (rc)
        return rc;
    int p = (int)(step & 1);
    if (sh->stage[p].step != step) {
        zs__stage_reset(sh, p);
        sh->stage[p].step = step;
    }
    if (sh->stage[p].has_dtype && sh->stage[p].dtype != dt)
        return zs_err_set(
            err, ZS_ERR_INVALID, "step %llu is staged in %s; a chunk in %s cannot be mixed in",
            (unsigned long long)step, zs_dtype_name(sh->stage[p].dtype), zs_dtype_name(dt));
    /* The records may grow by one interval per chunk in flight. */
    return ranges_room(sh, &sh->stage[p].cov, sh->stage[p].cov.n + sh->stage[p].inflight + 1,
                       &sh->stage[p].cov_budget, err);
}

/* A dtype fixed by pushes that all failed is forgotten (mu held). */
static void maybe_forget_dtype(zs_shard_t *sh, int p)
{
    if (sh->stage[p].cov.total == 0 && sh->stage[p].open == 0 && sh->stage[p].inflight == 0)
        sh->stage[p].has_dtype = 0;
}

/* ---- the NVMe tier's chunk buffers ----------------------------------------- */

/* A buffer for a chunk of count elements of dt (mu held): budgeted, or
 * NULL with err set. */
static zs__nvbounce_t *nvbounce_new(zs_shard_t *sh, uint64_t step, uint64_t off, uint64_t count,
                                    zs_dtype_t dt, zs_err_t *err)
{
    size_t bytes = (size_t)count * zs_dtype_size(dt);
    uint64_t budget = sizeof(zs__nvbounce_t) + bytes + ZS_NVME_GSPAN; /* + put's span */
    if (zs_budget_take(&sh->budget, budget, "a pushed chunk on its way to the NVMe tier", err))
        return NULL;
    zs__nvbounce_t *b = malloc(sizeof *b);
    if (b && !(b->data = zs_nvme_mem_alloc(bytes))) { /* unmapped at free: RSS follows */
        free(b);
        b = NULL;
    }
    if (!b) {
        zs_budget_give(&sh->budget, budget);
        zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    b->next = NULL;
    b->step = step;
    b->off = off;
    b->count = count;
    b->dt = dt;
    b->budget = budget;
    b->bytes = bytes;
    return b;
}

/* Write b's payload to the gradient region (mu not held: the chunk is in
 * flight, so its elements are staged by nobody else), then free it. */
static int nvbounce_put(zs_shard_t *sh, zs__nvbounce_t *b, int write, zs_err_t *err)
{
    int rc = ZS_OK;
    if (write)
        rc = zs_nvme_grad_put(sh->st.nv, b->step, b->dt, b->off - sh->rb, b->count, b->data, err);
    zs_budget_give(&sh->budget, b->budget);
    zs_nvme_mem_free(b->data, b->bytes);
    free(b);
    return rc;
}

/* ---- single chunks (zs_shard_push_reserve / _done) ----------------------- */

int zs_shard_push_reserve(zs_shard_t *sh, uint64_t step, uint64_t offset, uint64_t count,
                          zs_dtype_t dt, void **dst, zs_err_t *err)
{
    pthread_mutex_lock(&sh->mu);
    /* These bytes land without a stream's checks, on any element: no
     * speculation this step (tests and tools use this path, not workers). */
    zs__spec_invalidate(sh, step, 0, 0, 1);
    int rc = chunk_check_locked(sh, step, offset, count, dt, err);
    zs__nvbounce_t *nb = NULL;
    if (!rc && sh->st.nv && !(nb = nvbounce_new(sh, step, offset, count, dt, err)))
        rc = err ? err->code : ZS_ERR_NOMEM;
    if (!rc) {
        int p = (int)(step & 1);
        sh->stage[p].has_dtype = 1;
        sh->stage[p].dtype = dt;
        sh->stage[p].inflight++;
        if (nb) {
            nb->next = sh->nv_reserved;
            sh->nv_reserved = nb;
            *dst = nb->data;
        } else {
            *dst = (char *)sh->st.staging[p] + (offset - sh->rb) * zs_dtype_size(dt);
        }
    }
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

uint64_t zs_shard_push_done(zs_shard_t *sh, uint64_t step, uint64_t offset, uint64_t count, int ok)
{
    int p = (int)(step & 1);
    pthread_mutex_lock(&sh->mu);
    zs__nvbounce_t **pp = &sh->nv_reserved;
    while (*pp && !((*pp)->step == step && (*pp)->off == offset && (*pp)->count == count))
        pp = &(*pp)->next;
    zs__nvbounce_t *nb = *pp;
    if (nb) { /* the NVMe tier: stage it now (inflight still counts it) */
        *pp = nb->next;
        pthread_mutex_unlock(&sh->mu);
        zs_err_t e;
        if (nvbounce_put(sh, nb, ok, &e) != ZS_OK) {
            ZS_ERROR("push of step %llu: %s", (unsigned long long)step, e.msg);
            ok = 0;
        }
        pthread_mutex_lock(&sh->mu);
    }
    sh->stage[p].inflight--;
    if (sh->stage[p].step == step) {
        if (ok && ranges_add(&sh->stage[p].cov, offset, offset + count) != 0)
            ZS_ERROR("out of memory recording staged range; step %llu will need a re-push",
                     (unsigned long long)step);
        if (ok)
            zs__spec_covered(sh, step, sh->rb, sh->re);
        if (!ok) {
            unstage(&sh->stage[p].cov, offset, offset + count); /* its bytes are not staged */
            maybe_forget_dtype(sh, p);
        }
    }
    uint64_t total = sh->stage[p].step == step ? sh->stage[p].cov.total : 0;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    return total;
}

/* ---- Push streams ----------------------------------------------------------- */

/* A chunk that overlaps staged elements, or elements another open stream is
 * writing, waits in a buffer until its stream ends well. */
typedef struct pushbuf {
    struct pushbuf *next;
    uint64_t off, count;
    size_t bytes;
    char data[];
} pushbuf_t;

struct zs_shard_push {
    zs_shard_t *sh;
    uint64_t step; /* 0 until the first chunk */
    uint64_t gen;  /* stage[step & 1].gen then */
    int p;
    zs__ranges_t mine; /* written straight into staging (also in stage.pend) */
    uint64_t mine_budget;
    pushbuf_t *bufs; /* the others, newest first */
    size_t nbufs;
    uint64_t buf_budget;
    int cur;             /* a direct chunk reserved and not yet done */
    zs__nvbounce_t *nvb; /* the NVMe tier: that chunk's buffer */
    int io_rc;           /* the NVMe tier: a chunk failed to stage: the stream fails */
    zs_err_t io_err;
    int has_expect;     /* the worker stated the step's expected scalars */
    zs_commit_t expect; /* them (zs_shard_push_expect) */
};

/* Does [a, b) overlap r? */
static int ranges_overlap(const zs__ranges_t *r, uint64_t a, uint64_t b)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->iv[i][0] < b && r->iv[i][1] > a)
            return 1;
    return 0;
}

int zs_shard_push_begin(zs_shard_t *sh, zs_shard_push_t **out, zs_err_t *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    (*out)->sh = sh;
    return ZS_OK;
}

/* The group lrs' values: as many as the wire allows, finite, >= 0. */
static int lrs_check(const zs_commit_t *c, zs_err_t *err)
{
    if (c->nlrs > ZS_GROUPS_MAX_LRS)
        return zs_err_set(err, ZS_ERR_INVALID, "%u group learning rates, at most %d", c->nlrs,
                          ZS_GROUPS_MAX_LRS);
    for (uint32_t k = 0; k < c->nlrs; k++)
        if (!(c->lrs[k] >= 0 && isfinite(c->lrs[k])))
            return zs_err_set(err, ZS_ERR_INVALID, "group_lr[%u] %g must be finite and >= 0", k,
                              (double)c->lrs[k]);
    return ZS_OK;
}

/* See zs_shard_internal.h. */
int zs__lrs_fit(const zs_shard_t *sh, const zs_commit_t *c, zs_err_t *err)
{
    if (c->nlrs == 0)
        return ZS_OK;
    if (sh->ngroups == 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "the commit carries %u group learning rates, but this model has no "
                          "parameter groups (set them at Initialize)",
                          c->nlrs);
    uint32_t need = zs_groups_nlrs(sh->groups, sh->ngroups);
    if (c->nlrs < need)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "the commit carries %u group learning rates; the model's parameter "
                          "groups need %u (one per lr_index)",
                          c->nlrs, need);
    return ZS_OK;
}

int zs_shard_push_expect(zs_shard_push_t *ps, const zs_commit_t *e, zs_err_t *err)
{
    int rc = lrs_check(e, err);
    if (rc)
        return rc;
    if (!isfinite(e->grad_scale) || !isfinite(e->lr) || e->grad_scale < 0 || e->lr < 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "expected scalars must be finite and >= 0 (grad_scale %g, lr %g)",
                          e->grad_scale, e->lr);
    zs_dtype_t pd = e->param_dtype == ZS_DTYPE_F32 ? ZS_DTYPE_NONE : e->param_dtype;
    if (pd != ZS_DTYPE_NONE && pd != ZS_DTYPE_BF16 && pd != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown expected param_dtype %d",
                          (int)e->param_dtype);
    ps->has_expect = 1;
    ps->expect = *e;
    ps->expect.param_dtype = pd; /* as Commit reads it */
    ps->expect.clip_coef = 1.0f;
    ps->expect.skip = 0;
    return ZS_OK;
}

int zs_shard_push_chunk(zs_shard_push_t *ps, uint64_t step, uint64_t offset, uint64_t count,
                        zs_dtype_t dt, void **dst, zs_err_t *err)
{
    zs_shard_t *sh = ps->sh;
    if (ps->step && step != ps->step)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "a Push stream carries one step: this one began with step %llu, not "
                          "%llu",
                          (unsigned long long)ps->step, (unsigned long long)step);
    if (ps->io_rc) {
        if (err)
            *err = ps->io_err;
        return ps->io_rc;
    }
    pthread_mutex_lock(&sh->mu);
    int rc = chunk_check_locked(sh, step, offset, count, dt, err);
    int p = (int)(step & 1);
    if (!rc && ps->step && sh->stage[p].gen != ps->gen)
        rc = zs_err_set(err, ZS_ERR_STATE, "step %llu was committed while this push was open",
                        (unsigned long long)step);
    int direct = 0;
    if (!rc) {
        direct = !ranges_overlap(&sh->stage[p].cov, offset, offset + count) &&
                 !ranges_overlap(&sh->stage[p].pend, offset, offset + count);
        if (direct) /* both records grow by one interval at most */
            rc = ranges_room(sh, &ps->mine, ps->mine.n + 1, &ps->mine_budget, err);
        if (direct && !rc)
            rc = ranges_room(sh, &sh->stage[p].pend, sh->stage[p].pend.n + 1,
                             &sh->stage[p].pend_budget, err);
        if (direct && !rc && sh->st.nv &&
            !(ps->nvb = nvbounce_new(sh, step, offset, count, dt, err)))
            rc = err ? err->code : ZS_ERR_NOMEM;
    }
    pushbuf_t *b = NULL;
    size_t bytes = (size_t)count * zs_dtype_size(dt);
    if (!rc && !direct) {
        /* the NVMe tier also writes it through a gradient span at the end */
        rc = zs_budget_take(&sh->budget, sizeof *b + bytes + (sh->st.nv ? ZS_NVME_GSPAN : 0),
                            "a chunk that re-pushes staged elements (held until the stream ends)",
                            err);
        if (!rc && !(b = malloc(sizeof *b + bytes))) {
            zs_budget_give(&sh->budget, sizeof *b + bytes + (sh->st.nv ? ZS_NVME_GSPAN : 0));
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        }
    }
    if (!rc) {
        if (!ps->step) {
            ps->step = step;
            ps->p = p;
            ps->gen = sh->stage[p].gen;
            sh->stage[p].open++;
        }
        sh->stage[p].has_dtype = 1;
        sh->stage[p].dtype = dt;
        if (direct) {
            ranges_add(&ps->mine, offset, offset + count); /* room made above */
            ranges_add(&sh->stage[p].pend, offset, offset + count);
            sh->stage[p].inflight++;
            ps->cur = 1;
            *dst = ps->nvb ? (void *)ps->nvb->data
                           : (char *)sh->st.staging[p] + (offset - sh->rb) * zs_dtype_size(dt);
        } else {
            b->off = offset;
            b->count = count;
            b->bytes = bytes;
            b->next = ps->bufs;
            ps->bufs = b;
            ps->nbufs++;
            ps->buf_budget += sizeof *b + bytes + (sh->st.nv ? ZS_NVME_GSPAN : 0);
            *dst = b->data;
        }
    }
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

void zs_shard_push_chunk_done(zs_shard_push_t *ps)
{
    zs_shard_t *sh = ps->sh;
    if (!ps->cur)
        return;
    if (ps->nvb) { /* the NVMe tier: stage it before it counts as done */
        zs__nvbounce_t *b = ps->nvb;
        ps->nvb = NULL;
        if (nvbounce_put(sh, b, !ps->io_rc, &ps->io_err) != ZS_OK && !ps->io_rc) {
            ps->io_rc = ps->io_err.code;
            ZS_ERROR("push of step %llu: %s", (unsigned long long)ps->step, ps->io_err.msg);
        }
    }
    pthread_mutex_lock(&sh->mu);
    sh->stage[ps->p].inflight--;
    ps->cur = 0;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

int zs_shard_push_end(zs_shard_push_t *ps, int ok, uint64_t *staged, zs_err_t *err)
{
    if (!ps)
        return ZS_OK;
    zs_shard_t *sh = ps->sh;
    int rc = ZS_OK;
    *staged = 0;
    zs_shard_push_chunk_done(ps);
    if (ps->io_rc) { /* a chunk did not reach the NVMe tier: the stream fails */
        if (ok) {
            rc = ps->io_rc;
            if (err)
                *err = ps->io_err;
        }
        ok = 0;
    }
    pthread_mutex_lock(&sh->mu);
    /* Bytes that change staged elements (re-pushed chunks, and a refused
     * stream's own when another covered them meanwhile) must not change
     * under a speculated chunk; this may wait, so it comes before `live`. */
    if (ps->step) {
        for (size_t i = 0; i < ps->mine.n; i++)
            zs__spec_invalidate(sh, ps->step, ps->mine.iv[i][0], ps->mine.iv[i][1], 0);
        for (pushbuf_t *b = ps->bufs; b; b = b->next)
            zs__spec_invalidate(sh, ps->step, b->off, b->off + b->count, 0);
    }
    int p = ps->p;
    int live = ps->step && sh->stage[p].step == ps->step && sh->stage[p].gen == ps->gen;
    if (ok && ps->step && !live)
        rc = zs_err_set(err, ZS_ERR_STATE, "step %llu was committed while this push was open",
                        (unsigned long long)ps->step);
    if (live) {
        zs__ranges_t *cov = &sh->stage[p].cov, *pend = &sh->stage[p].pend;
        if (ok && !rc)
            rc = ranges_room(sh, cov, cov->n + ps->mine.n + ps->nbufs + 1, &sh->stage[p].cov_budget,
                             err);
        ranges_room(sh, pend, pend->n + ps->mine.n + 1, &sh->stage[p].pend_budget, err);
        size_t esz = zs_dtype_size(sh->stage[p].dtype);
        for (size_t i = 0; i < ps->mine.n; i++) {
            uint64_t a = ps->mine.iv[i][0], b = ps->mine.iv[i][1];
            ranges_sub(pend, a, b); /* if it cannot be cut, it only makes others buffer */
            if (ok && !rc)
                ranges_add(cov, a, b);
            else /* covered meanwhile by a stream that overlapped it: not with these bytes */
                unstage(cov, a, b);
        }
        /* Re-pushed chunks, oldest first: staged only now. */
        pushbuf_t *rev = NULL;
        while (ps->bufs) {
            pushbuf_t *b = ps->bufs;
            ps->bufs = b->next;
            b->next = rev;
            rev = b;
        }
        ps->bufs = rev;
        for (pushbuf_t *b = ps->bufs; b && ok && !rc; b = b->next) {
            if (sh->st.nv) /* the tier: written now (rare: re-pushed elements) */
                rc = zs_nvme_grad_put(sh->st.nv, ps->step, sh->stage[p].dtype, b->off - sh->rb,
                                      b->count, b->data, err);
            else
                memcpy((char *)sh->st.staging[p] + (b->off - sh->rb) * esz, b->data, b->bytes);
            if (!rc)
                ranges_add(cov, b->off, b->off + b->count);
        }
        sh->stage[p].open--;
        if (!ok || rc)
            maybe_forget_dtype(sh, p);
        if (ok && !rc && ps->has_expect)
            zs__spec_expect(sh, ps->step, &ps->expect);
        if (ok && !rc) /* chunks this stream completed, or all once scalars are known */
            zs__spec_covered(sh, ps->step, sh->rb, sh->re);
        *staged = cov->total;
        pthread_cond_broadcast(&sh->cv);
    }
    pthread_mutex_unlock(&sh->mu);
    while (ps->bufs) {
        pushbuf_t *b = ps->bufs;
        ps->bufs = b->next;
        free(b);
    }
    zs_budget_give(&sh->budget, ps->buf_budget + ps->mine_budget);
    free(ps->mine.iv);
    free(ps);
    return rc;
}

/* ---- Commit ------------------------------------------------------------------ */

static int same_commit(const zs_commit_t *a, const zs_commit_t *b)
{
    return a->step == b->step && a->grad_scale == b->grad_scale && a->clip_coef == b->clip_coef &&
           a->lr == b->lr && !a->skip == !b->skip && a->param_dtype == b->param_dtype &&
           zs__same_lrs(a, b);
}

int zs_shard_commit(zs_shard_t *sh, const zs_commit_t *c_in, uint64_t *applied,
                    uint64_t *optimizer_step, zs_err_t *err)
{
    /* F32, proto3's default for an unset param_dtype, means what NONE says:
     * no low-precision copy (pulls in fp32 read the master weights). */
    zs_commit_t cn = *c_in;
    if (cn.param_dtype == ZS_DTYPE_F32)
        cn.param_dtype = ZS_DTYPE_NONE;
    const zs_commit_t *c = &cn;
    if (!isfinite(c->grad_scale) || !isfinite(c->clip_coef) || !isfinite(c->lr) ||
        c->grad_scale < 0 || c->clip_coef < 0 || c->lr < 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "commit scalars must be finite and >= 0 (grad_scale %g, clip_coef %g, "
                          "lr %g)",
                          c->grad_scale, c->clip_coef, c->lr);
    if (c->param_dtype != ZS_DTYPE_NONE && c->param_dtype != ZS_DTYPE_BF16 &&
        c->param_dtype != ZS_DTYPE_F16 && c->param_dtype != ZS_DTYPE_F32)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown param_dtype %d", (int)c->param_dtype);
    if (zs__step_check(c->step, "commit of step", err))
        return ZS_ERR_INVALID;
    int rc = lrs_check(c, err);
    if (rc)
        return rc;
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        rc = zs__shard_require_init(sh, err);
        if (!rc)
            rc = zs__lrs_fit(sh, c, err);
        if (rc)
            break;
        if (c->step == sh->applied_step && sh->have_last_commit) {
            if (!same_commit(c, &sh->last_commit))
                rc = zs_err_set(err, ZS_ERR_STATE,
                                "step %llu was already committed with different scalars",
                                (unsigned long long)c->step);
            goto out; /* idempotent repeat: OK */
        }
        if (c->step == sh->applied_step && c->step > 0) {
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "commit of step %llu refused: it is the applied step, but it was set "
                            "by SetStep or Initialize (or restored from a checkpoint that does "
                            "not record its commit), so a repeat cannot be checked",
                            (unsigned long long)c->step);
            break;
        }
        if (c->step != sh->applied_step + 1) {
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "commit of step %llu refused: server is at step %llu and expects "
                            "step %llu",
                            (unsigned long long)c->step, (unsigned long long)sh->applied_step,
                            (unsigned long long)sh->applied_step + 1);
            break;
        }
        int p = (int)(c->step & 1);
        if (sh->job_pending || sh->opt_running || sh->ckpt_busy || sh->stage[p].inflight > 0) {
            pthread_cond_wait(&sh->cv, &sh->mu);
            continue; /* re-validate: another commit may have won */
        }
        if (sh->spec.running) { /* stop a speculative batch at its next chunk */
            zs__spec_quiesce(sh);
            continue;
        }
        if (sh->stage[p].step == c->step && sh->stage[p].open > 0) {
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "commit of step %llu refused: %d Push stream(s) of it still open; "
                            "commit once they ended",
                            (unsigned long long)c->step, sh->stage[p].open);
            break;
        }
        uint64_t staged = sh->stage[p].step == c->step ? sh->stage[p].cov.total : 0;
        if (!c->skip && staged != sh->n) {
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "commit of step %llu refused: %llu of %llu elements staged; push "
                            "the whole range [%llu, %llu) first",
                            (unsigned long long)c->step, (unsigned long long)staged,
                            (unsigned long long)sh->n, (unsigned long long)sh->rb,
                            (unsigned long long)sh->re);
            break;
        }
        /* Before the step counters move: it checks Adam's t. A skipped step
         * restores speculated chunks here; otherwise the pass keeps or
         * restores each. */
        int spec = zs__spec_commit(sh, c);
        sh->applied_step = c->step;
        sh->last_commit = *c;
        sh->have_last_commit = 1;
        if (c->skip) {
            for (size_t k = 0; k < sh->nchunks; k++)
                atomic_store(&sh->done[k], c->step);
            sh->c.steps_skipped++;
            ZS_INFO("commit: step %llu skipped (overflow)", (unsigned long long)c->step);
        } else {
            sh->optimizer_step++;
            sh->job = *c;
            sh->job_step.lr = c->lr;
            sh->job_step.t = (int64_t)sh->optimizer_step;
            sh->job_step.grad_scale = c->grad_scale;
            sh->job_step.clip_coef = c->clip_coef;
            sh->job_spec = spec;
            sh->job_pending = 1;
        }
        /* The staging of this parity is consumed by the pass. */
        zs__stage_reset(sh, p);
        pthread_cond_broadcast(&sh->cv);
        break;
    }
out:
    *applied = sh->applied_step;
    *optimizer_step = sh->optimizer_step;
    pthread_mutex_unlock(&sh->mu);
    return rc;
}
