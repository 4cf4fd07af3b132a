/*
 * zs_shard_ckpt.c - checkpoint, restore, list and delete for a shard, over
 * the RocksDB store (zs_store.h). The checkpoint's metadata (identity,
 * layout, hyperparameters, steps) is the proto's CheckpointMeta message.
 *
 * Restore reads into fresh arrays and swaps them in only after every chunk
 * verified, so a corrupt checkpoint never changes the live state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_log.h"
#include "zs_shard_internal.h"
#include "zeroshard.pb-c.h"
#include "zs_pbconv.h"

#define META_FORMAT 1

/* The store's complete checkpoints into a malloc'd array (store_mu held). */
static int store_list_locked(zs_shard_t *sh, uint64_t **steps, size_t *n, zs_err_t *err)
{
    *steps = malloc(ZS_STORE_MAX_CKPTS * sizeof **steps);
    *n = 0;
    if (!*steps)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    size_t count;
    int rc = zs_store_list(sh->store, *steps, ZS_STORE_MAX_CKPTS, &count, err);
    if (rc) {
        free(*steps);
        *steps = NULL;
        return rc;
    }
    *n = count < ZS_STORE_MAX_CKPTS ? count : ZS_STORE_MAX_CKPTS;
    return ZS_OK;
}

/* With store_mu held, after the store may have changed: publish its
 * checkpoint list and health for Hello and ListCheckpoints (takes mu; the
 * lock order is store_mu, then mu). A list that cannot be read (a store
 * closed after a failed reopen) leaves the last one published. */
static void note_store(zs_shard_t *sh)
{
    char why[ZS_ERR_MSG_MAX];
    int bad = zs_store_health(sh->store, why, sizeof why);
    uint64_t *steps = NULL;
    size_t n = 0;
    zs_err_t e;
    int listed = store_list_locked(sh, &steps, &n, &e) == ZS_OK;
    if (!listed)
        ZS_WARN("cannot list checkpoints: %s", e.msg);
    pthread_mutex_lock(&sh->mu);
    sh->store_degraded = bad;
    memcpy(sh->store_error, why, sizeof why);
    if (listed) {
        free(sh->ckpts);
        sh->ckpts = steps;
        sh->nckpts = n;
        steps = NULL;
    }
    pthread_mutex_unlock(&sh->mu);
    free(steps);
}

/* See zs_shard.h: the published list, never the store itself, so a
 * checkpoint being written (store_mu held for seconds) does not hold up
 * Hello or ListCheckpoints. */
int zs_shard_list(zs_shard_t *sh, uint64_t **steps, size_t *n, zs_err_t *err)
{
    pthread_mutex_lock(&sh->mu);
    size_t k = sh->nckpts;
    *steps = malloc((k ? k : 1) * sizeof **steps);
    if (*steps && k)
        memcpy(*steps, sh->ckpts, k * sizeof **steps);
    pthread_mutex_unlock(&sh->mu);
    *n = *steps ? k : 0;
    return *steps ? ZS_OK : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
}

int zs_shard_checkpoint(zs_shard_t *sh, uint64_t step, int keep, double *seconds, zs_err_t *err)
{
    return zs_shard_checkpoint_meta(sh, step, keep, NULL, 0, seconds, err);
}

/* Remember a copy of the checkpoint's client state (mu held). */
static void keep_user_meta(zs_shard_t *sh, const void *p, size_t n)
{
    unsigned char *copy = n ? malloc(n) : NULL;
    if (n && !copy)
        n = 0;
    if (n)
        memcpy(copy, p, n);
    free(sh->user_meta);
    sh->user_meta = copy;
    sh->user_meta_len = n;
}

size_t zs_shard_user_meta(zs_shard_t *sh, void *buf, size_t cap)
{
    pthread_mutex_lock(&sh->mu);
    size_t n = sh->user_meta_len;
    if (buf && n)
        memcpy(buf, sh->user_meta, n < cap ? n : cap);
    pthread_mutex_unlock(&sh->mu);
    return n;
}

int zs_shard_checkpoint_meta(zs_shard_t *sh, uint64_t step, int keep, const void *user_meta,
                             size_t user_meta_len, double *seconds, zs_err_t *err)
{
    *seconds = 0;
    if (user_meta_len > ZS_USER_META_MAX)
        return zs_err_set(err, ZS_ERR_INVALID, "user_meta of %zu bytes exceeds %u", user_meta_len,
                          ZS_USER_META_MAX);
    pthread_mutex_lock(&sh->mu);
    int rc = ZS_OK;
    /* Only committed state is written: speculative updates are undone (and
     * none starts while ckpt_busy). */
    while (!sh->stopping && (sh->job_pending || sh->opt_running || sh->ckpt_busy ||
                             sh->spec.running || sh->spec.applied)) {
        if (sh->job_pending || sh->opt_running || sh->ckpt_busy)
            pthread_cond_wait(&sh->cv, &sh->mu);
        else
            zs__spec_cancel(sh);
    }
    if (sh->stopping)
        rc = zs_err_set(err, ZS_ERR_CANCELLED, "server shutting down");
    else if (sh->tier_failed) /* the state is no longer one step */
        rc = zs_err_set(err, ZS_ERR_IO, "checkpoint refused: %s", sh->tier_error);
    else if (!sh->initialized)
        rc = zs_err_set(err, ZS_ERR_STATE, "nothing to checkpoint: server holds no model");
    else if (step != sh->applied_step)
        rc =
            zs_err_set(err, ZS_ERR_STATE, "checkpoint of step %llu refused: server is at step %llu",
                       (unsigned long long)step, (unsigned long long)sh->applied_step);
    if (rc) {
        pthread_mutex_unlock(&sh->mu);
        return rc;
    }
    sh->ckpt_busy = 1; /* commits wait; pulls may still read */
    Zeroshard__CheckpointMeta m = ZEROSHARD__CHECKPOINT_META__INIT;
    Zeroshard__AdamConfig a;
    zs_pb_adam_set(&a, &sh->hp);
    m.format_version = META_FORMAT;
    m.model_name = sh->id.model_name;
    m.num_params = sh->id.num_params;
    m.num_servers = sh->id.num_servers;
    m.server_index = sh->id.server_index;
    m.range_begin = sh->rb;
    m.range_end = sh->re;
    m.applied_step = sh->applied_step;
    m.optimizer_step = sh->optimizer_step;
    m.adam = &a;
    m.user_meta.data = (uint8_t *)user_meta;
    m.user_meta.len = user_meta_len;
    m.run_id = sh->run_id;
    Zeroshard__CommitRequest lc = ZEROSHARD__COMMIT_REQUEST__INIT;
    if (sh->have_last_commit && sh->last_commit.step == sh->applied_step) {
        lc.step = sh->last_commit.step;
        lc.grad_scale = sh->last_commit.grad_scale;
        lc.clip_coef = sh->last_commit.clip_coef;
        lc.lr = sh->last_commit.lr;
        lc.skip = sh->last_commit.skip;
        lc.param_dtype = (Zeroshard__DType)sh->last_commit.param_dtype;
        lc.n_group_lr = sh->last_commit.nlrs;
        lc.group_lr = sh->last_commit.lrs;
        m.last_commit = &lc;
    }
    Zeroshard__GroupRange **groups = NULL;
    if (zs_pb_groups_set(sh->groups, sh->ngroups, &groups) != ZS_OK) {
        sh->ckpt_busy = 0;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    m.n_groups = sh->ngroups;
    m.groups = groups;
    uint64_t run_id = sh->run_id;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    m.created_unix_ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
    uint8_t *meta = malloc(zeroshard__checkpoint_meta__get_packed_size(&m));
    size_t mlen = meta ? zeroshard__checkpoint_meta__pack(&m, meta) : 0;
    zs_pb_groups_free(groups);
    if (!meta) {
        sh->ckpt_busy = 0;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    zs_store_ckpt_t ck = {step, sh->n, {sh->st.t[0], sh->st.t[1], sh->st.t[2]}, meta, mlen};
    if (sh->st.nv) { /* the NVMe tier: the store reads the tiles chunk by chunk */
        ck.fill = zs__nvme_ckpt_fill;
        ck.fill_ud = sh->st.nv;
    }
    pthread_mutex_unlock(&sh->mu);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_mutex_lock(&sh->store_mu);
    rc = zs_store_write(sh->store, &ck, err);
    if (rc == ZS_ERR_EXISTS) {
        /* Same step of the same run: a retry, already durable. Same step of
         * an older run (re-initialised in this data dir): replace it. */
        void *old = NULL;
        size_t olen = 0;
        uint64_t on;
        Zeroshard__CheckpointMeta *om = NULL;
        if (zs_store_read_meta(sh->store, step, &old, &olen, &on, NULL) == ZS_OK)
            om = zeroshard__checkpoint_meta__unpack(NULL, olen, old);
        int same_run = om && om->run_id == run_id;
        if (om)
            zeroshard__checkpoint_meta__free_unpacked(om, NULL);
        free(old);
        if (same_run) {
            rc = ZS_OK;
        } else {
            ZS_INFO("checkpoint: step %llu exists from an earlier run; replacing it",
                    (unsigned long long)step);
            rc = zs_store_delete(sh->store, step, err);
            if (rc == ZS_OK)
                rc = zs_store_write(sh->store, &ck, err);
        }
    }
    if (rc == ZS_OK) {
        zs_err_t perr;
        if (zs_store_prune(sh->store, keep > 0 ? keep : sh->keep, &perr))
            ZS_WARN("checkpoint %llu written, but pruning old ones failed: %s",
                    (unsigned long long)step, perr.msg);
    }
    note_store(sh);
    pthread_mutex_unlock(&sh->store_mu);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);

    free(meta);
    pthread_mutex_lock(&sh->mu);
    sh->ckpt_busy = 0;
    if (rc == ZS_OK) {
        keep_user_meta(sh, user_meta, user_meta_len);
        sh->c.checkpoints_written++;
        sh->c.checkpoint_gbps = *seconds > 0 ? 12.0 * (double)sh->n / *seconds / 1e9 : 0;
        sh->c.checkpoint_seconds += *seconds;
        sh->c.checkpoint_bytes += 12 * sh->n;
        sh->c.last_checkpoint_seconds = *seconds;
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        sh->c.last_checkpoint_time = (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec;
        ZS_INFO("checkpoint: step %llu durable, %.1f MB in %.3f s (%.2f GB/s)",
                (unsigned long long)step, 12.0 * (double)sh->n / 1e6, *seconds,
                sh->c.checkpoint_gbps);
    }
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

/* Read checkpoint `step` into a new state; install only if it verifies and
 * (when `check_id`) belongs to the model the shard holds. */
static int restore_step(zs_shard_t *sh, uint64_t step, int check_id, zs_err_t *err)
{
    void *meta = NULL;
    size_t mlen;
    uint64_t n;
    pthread_mutex_lock(&sh->store_mu);
    int rc = zs_store_read_meta(sh->store, step, &meta, &mlen, &n, err);
    pthread_mutex_unlock(&sh->store_mu);
    if (rc)
        return rc;
    Zeroshard__CheckpointMeta *m = zeroshard__checkpoint_meta__unpack(NULL, mlen, meta);
    free(meta);
    if (!m || m->format_version != META_FORMAT || !m->adam)
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "checkpoint %llu: unreadable metadata",
                        (unsigned long long)step);
    zs_shard_identity_t id;
    memset(&id, 0, sizeof id);
    zs_adam_hparams_t hp;
    uint64_t rb = 0, re = 0;
    if (!rc) {
        snprintf(id.model_name, sizeof id.model_name, "%s", m->model_name);
        id.num_params = m->num_params;
        id.num_servers = m->num_servers;
        id.server_index = m->server_index;
        zs_pb_adam_get(m->adam, &hp);
        rc = zs__identity_check(&id, &rb, &re, err);
        if (!rc && (re - rb != n || rb != m->range_begin || re != m->range_end))
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "checkpoint %llu: layout [%llu, %llu) disagrees with its %llu "
                            "elements",
                            (unsigned long long)step, (unsigned long long)m->range_begin,
                            (unsigned long long)m->range_end, (unsigned long long)n);
    }
    uint64_t applied = m ? m->applied_step : 0, ostep = m ? m->optimizer_step : 0;
    if (!rc && (applied > ZS_SHARD_STEP_MAX || ostep > applied))
        rc = zs_err_set(err, ZS_ERR_CORRUPT,
                        "checkpoint %llu: steps (%llu, Adam t %llu) outside 0 <= t <= step <= "
                        "%llu",
                        (unsigned long long)step, (unsigned long long)applied,
                        (unsigned long long)ostep, (unsigned long long)ZS_SHARD_STEP_MAX);
    uint64_t run_id = m ? m->run_id : 0;
    zs_commit_t lc = {0};
    int have_lc = m && m->last_commit && m->last_commit->step == applied;
    if (have_lc)
        lc = (zs_commit_t){m->last_commit->step,      m->last_commit->grad_scale,
                           m->last_commit->clip_coef, m->last_commit->lr,
                           m->last_commit->skip,      (zs_dtype_t)m->last_commit->param_dtype};
    if (have_lc && m->last_commit->n_group_lr <= ZS_GROUPS_MAX_LRS) {
        lc.nlrs = (uint32_t)m->last_commit->n_group_lr;
        if (lc.nlrs) /* group_lr is NULL when there are none */
            memcpy(lc.lrs, m->last_commit->group_lr, lc.nlrs * sizeof(float));
    } else if (have_lc) {
        have_lc = 0; /* not a commit this server could have accepted */
    }
    /* The parameter groups, as Initialize set them (checked against P). */
    size_t ngr = m ? m->n_groups : 0;
    zs_group_range_t *gr = ngr ? malloc(ngr * sizeof *gr) : NULL;
    if (!rc && ngr && !gr)
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu parameter group ranges", ngr);
    zs_err_t ge;
    if (!rc && ngr &&
        (zs_pb_groups_get(m->groups, ngr, gr, &ge) || zs_groups_check(gr, ngr, id.num_params, &ge)))
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "checkpoint %llu: parameter groups: %s",
                        (unsigned long long)step, ge.msg);
    size_t umlen = m && m->user_meta.len <= ZS_USER_META_MAX ? m->user_meta.len : 0;
    unsigned char *um = umlen ? malloc(umlen) : NULL;
    if (um)
        memcpy(um, m->user_meta.data, umlen);
    else
        umlen = 0;
    if (m)
        zeroshard__checkpoint_meta__free_unpacked(m, NULL);
    if (rc) {
        free(um);
        free(gr);
        return rc;
    }
    if (check_id) {
        pthread_mutex_lock(&sh->mu);
        if (sh->initialized &&
            (strcmp(sh->id.model_name, id.model_name) || sh->id.num_params != id.num_params ||
             sh->id.num_servers != id.num_servers || sh->id.server_index != id.server_index))
            rc =
                zs_err_set(err, ZS_ERR_STATE,
                           "checkpoint %llu is of model '%s' (server %u of %u), but this "
                           "server holds '%s' (server %u of %u)",
                           (unsigned long long)step, id.model_name, id.server_index, id.num_servers,
                           sh->id.model_name, sh->id.server_index, sh->id.num_servers);
        pthread_mutex_unlock(&sh->mu);
        if (rc) {
            free(um);
            free(gr);
            return rc;
        }
    }
    /* Both states exist until the swap: the new one must fit beside the old. */
    uint64_t bytes;
    int lowp;
    char what[96];
    snprintf(what, sizeof what, "a new state of %llu elements for Restore", (unsigned long long)n);
    rc = zs__state_reserve(sh, n, what, &bytes, &lowp, err);
    if (rc) {
        free(um);
        free(gr);
        return rc;
    }
    zs__state_t st;
    if (zs__state_alloc_tier(sh, &st, n, lowp, err)) {
        free(um);
        free(gr);
        zs_budget_give(&sh->budget, bytes);
        return err ? err->code : ZS_ERR_NOMEM;
    }
    if (st.nv) { /* the NVMe tier: chunk by chunk into its tiles */
        rc = zs__nvme_restore(sh, step, n, &st, err);
    } else {
        float *const dst[3] = {st.t[0], st.t[1], st.t[2]};
        pthread_mutex_lock(&sh->store_mu);
        rc = zs_store_read(sh->store, step, dst, n, err);
        pthread_mutex_unlock(&sh->store_mu);
    }
    if (rc) {
        zs__state_free(&st);
        zs_budget_give(&sh->budget, bytes);
        free(um);
        free(gr);
        return rc;
    }
    pthread_mutex_lock(&sh->mu);
    zs__shard_wait_idle(sh);
    rc = zs__shard_install(sh, &id, &hp, gr, ngr, &st, applied, ostep, err);
    free(gr);
    if (rc == ZS_OK) { /* the new state's reservation replaces the old one's */
        zs_budget_give(&sh->budget, sh->budget_live);
        sh->budget_live = bytes;
        bytes = 0;
    }
    if (rc == ZS_OK) {
        sh->run_id = run_id;  /* continuing that run: re-checkpoints are retries */
        sh->last_commit = lc; /* a repeated Commit of this step is recognised */
        sh->have_last_commit = have_lc;
        free(sh->user_meta);
        sh->user_meta = um;
        sh->user_meta_len = umlen;
        um = NULL;
    }
    pthread_mutex_unlock(&sh->mu);
    zs_budget_give(&sh->budget, bytes);
    free(um);
    zs__state_free(&st);
    if (rc == ZS_OK)
        ZS_INFO("restore: step %llu (Adam t=%llu) of model '%s', server %u of %u, [%llu, %llu)",
                (unsigned long long)applied, (unsigned long long)ostep, id.model_name,
                id.server_index, id.num_servers, (unsigned long long)rb, (unsigned long long)re);
    return rc;
}

int zs_shard_restore(zs_shard_t *sh, uint64_t step, zs_err_t *err)
{
    pthread_mutex_lock(&sh->mu);
    int stopping = sh->stopping;
    pthread_mutex_unlock(&sh->mu);
    if (stopping)
        return zs_err_set(err, ZS_ERR_CANCELLED, "server shutting down");
    return restore_step(sh, step, 1, err);
}

int zs__shard_load_newest(zs_shard_t *sh, zs_err_t *err)
{
    uint64_t *steps;
    size_t n;
    pthread_mutex_lock(&sh->store_mu);
    int rc = store_list_locked(sh, &steps, &n, err);
    if (rc == ZS_OK)
        note_store(sh);
    pthread_mutex_unlock(&sh->store_mu);
    if (rc)
        return rc;
    for (size_t i = n; i-- > 0;) {
        zs_err_t e;
        zs_err_clear(&e);
        if (restore_step(sh, steps[i], 0, &e) == ZS_OK)
            break;
        ZS_ERROR("checkpoint %llu cannot be loaded: %s; trying an older one",
                 (unsigned long long)steps[i], e.msg);
    }
    if (n == 0)
        ZS_INFO("no checkpoint in %s: waiting for Initialize", sh->data_dir);
    else if (!sh->initialized)
        ZS_ERROR("none of the %zu checkpoints in %s loads: waiting for Initialize or Restore", n,
                 sh->data_dir);
    free(steps);
    return ZS_OK;
}

int zs_shard_checkpoint_meta_get(zs_shard_t *sh, uint64_t step, void **meta, size_t *len,
                                 zs_err_t *err)
{
    uint64_t n;
    *meta = NULL;
    *len = 0;
    pthread_mutex_lock(&sh->store_mu);
    int rc = zs_store_read_meta(sh->store, step, meta, len, &n, err);
    pthread_mutex_unlock(&sh->store_mu);
    if (rc)
        return rc;
    Zeroshard__CheckpointMeta *m = zeroshard__checkpoint_meta__unpack(NULL, *len, *meta);
    if (!m || m->format_version != META_FORMAT || m->applied_step != step ||
        m->range_end - m->range_begin != n)
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "checkpoint %llu: unreadable metadata",
                        (unsigned long long)step);
    if (m)
        zeroshard__checkpoint_meta__free_unpacked(m, NULL);
    if (rc) {
        free(*meta);
        *meta = NULL;
        *len = 0;
    }
    return rc;
}

int zs_shard_delete(zs_shard_t *sh, uint64_t step, int keep, zs_err_t *err)
{
    if (step == 0 && keep < 1)
        return zs_err_set(err, ZS_ERR_INVALID, "keep must be >= 1 (got %d)", keep);
    pthread_mutex_lock(&sh->store_mu);
    int rc = step ? zs_store_delete(sh->store, step, err) : zs_store_prune(sh->store, keep, err);
    note_store(sh);
    pthread_mutex_unlock(&sh->store_mu);
    if (rc == ZS_OK)
        ZS_INFO(step ? "delete: checkpoint %llu removed" : "delete: kept newest %llu",
                step ? (unsigned long long)step : (unsigned long long)keep);
    return rc;
}

int zs_shard_set_step(zs_shard_t *sh, uint64_t step, uint64_t optimizer_step, zs_err_t *err)
{
    int rc0 = zs__step_check(step, "set-step to", err);
    if (rc0)
        return rc0;
    if (optimizer_step > step)
        return zs_err_set(err, ZS_ERR_INVALID, "optimizer_step %llu above step %llu",
                          (unsigned long long)optimizer_step, (unsigned long long)step);
    pthread_mutex_lock(&sh->mu);
    int rc = ZS_OK;
    if (sh->stopping)
        rc = zs_err_set(err, ZS_ERR_CANCELLED, "server shutting down");
    else if (!sh->initialized)
        rc = zs_err_set(err, ZS_ERR_STATE,
                        "server holds no model yet: call Initialize or Restore first");
    if (!rc) {
        zs__shard_wait_idle(sh);
        sh->applied_step = step;
        sh->optimizer_step = optimizer_step;
        for (size_t c = 0; c < sh->nchunks; c++)
            atomic_store(&sh->done[c], step);
        zs__stage_reset(sh, 0);
        zs__stage_reset(sh, 1);
        sh->have_last_commit = 0;
        pthread_cond_broadcast(&sh->cv);
    }
    pthread_mutex_unlock(&sh->mu);
    if (!rc)
        ZS_INFO("set-step: step %llu, Adam t=%llu (optimizer runs in the workers)",
                (unsigned long long)step, (unsigned long long)optimizer_step);
    return rc;
}
