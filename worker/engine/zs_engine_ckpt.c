/*
 * zs_engine_ckpt.c - the engine and the shard servers outside the step:
 * fresh start (Initialize the servers), checkpoint, and resume with any
 * world size.
 *
 * Checkpoints always live on the servers. With offload the servers already
 * hold the optimizer state; without it every worker first writes its
 * partition of master / exp_avg / exp_avg_sq with SetState (after rank 0
 * sets the servers' step counters). The engine's own state (Adam t, loss
 * scaler) travels as the checkpoint's user_meta, followed by the model
 * manifest when the caller gave one (zs_engine_opts_t.manifest):
 *
 *   "ZSE1" | step u64 | Adam t u64 | loss scaler (ZS_LOSS_SCALE_BYTES)
 *   [ | manifest length u32 | manifest bytes ]          all little-endian
 *
 * Checkpoints written before manifests existed end after the loss scaler
 * and still resume. Because the servers keep state by parameter range, a
 * resume with another W just maps the new partitions onto the same ranges.
 */
#include <stdlib.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_engine_internal.h"
#include "zs_log.h"

#define META_MAGIC 0x3145535au                       /* "ZSE1" */
#define META_BYTES (4 + 8 + 8 + ZS_LOSS_SCALE_BYTES) /* the fixed part */

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int zs__eng_set_manifest(zs_engine_t *e, const char *manifest, zs_err_t *err)
{
    if (!manifest)
        return ZS_OK;
    size_t n = strlen(manifest);
    if (META_BYTES + 4 + n > ZS_CLIENT_USER_META_MAX) {
        if (e->wrank == 0)
            ZS_WARN("model manifest of %zu bytes does not fit a checkpoint's %u bytes of client "
                    "state: checkpoints carry none (zs-ctl export will refuse them)",
                    n, ZS_CLIENT_USER_META_MAX);
        return ZS_OK;
    }
    if (!(e->manifest = strdup(manifest)))
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    return ZS_OK;
}

int zs_engine_meta_parse(const void *meta, size_t len, zs_engine_ckpt_meta_t *out, zs_err_t *err)
{
    const uint8_t *p = meta;
    memset(out, 0, sizeof *out);
    uint32_t magic = len >= 4 ? get32(p) : 0;
    size_t mlen = len >= META_BYTES + 4 ? get32(p + META_BYTES) : 0;
    if (magic != META_MAGIC || len < META_BYTES ||
        (len > META_BYTES && (len < META_BYTES + 4 || len - META_BYTES - 4 != mlen)))
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "not written by the zeroshard engine (%zu bytes of client state, not "
                          "the engine's layout)",
                          len);
    out->step = get64(p + 4);
    out->adam_t = get64(p + 12);
    if (mlen) {
        out->manifest = (const char *)p + META_BYTES + 4;
        out->manifest_len = mlen;
    }
    return ZS_OK;
}

static int need_servers(zs_engine_t *e, const char *what, zs_err_t *err)
{
    return e->client ? ZS_OK
                     : zs_err_set(err, ZS_ERR_STATE, "%s needs shard servers (--servers)", what);
}

int zs_engine_start(zs_engine_t *e, zs_err_t *err)
{
    e->step = 0;
    e->t = 0;
    if (!e->client)
        return ZS_OK;
    int rc = ZS_OK;
    if (e->wrank == 0) {
        float *w = malloc((e->P ? e->P : 1) * 4);
        if (!w)
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        for (int i = 0; i < e->nlayers && !rc; i++)
            if (e->m.nparams[i])
                rc = e->m.init_params(e->m.self, i, w + e->layer_off[i], err);
        if (!rc)
            rc = zs_client_init(e->client, e->model_name, e->P, &e->cfg.adam, w, 0, 1, err);
        /* A new run: no checkpoint of an earlier one may be restored into it
         * (a restarted server would load one; a step both runs wrote could
         * be complete from two runs). */
        if (!rc)
            rc = zs_client_delete_all(e->client, err);
        free(w);
    }
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    rc = zs_client_hello(e->client, e->model_name, e->P, NULL, err);
    return zs__eng_agree(e, rc, err);
}

/* The three state tensors of bucket b's slice that this worker owns: where
 * they live locally, and their flat range. */
static void slice(zs_engine_t *e, const zs__seg_t *b, uint64_t *lo, uint64_t *hi, uint64_t *local)
{
    *lo = b->off + b->vb;
    *hi = b->off + b->ve;
    *local = e->stage == 0 ? b->pbase + b->vb : b->qbase;
}

/* The optimizer state is device memory: each slice goes through a pinned
 * buffer of one partition (fp32). to_servers: SetState; else GetState into
 * the device state (resume). */
static int move_state(zs_engine_t *e, int to_servers, zs_err_t *err)
{
    size_t bytes = (size_t)(e->max_seg_pad / (uint64_t)e->W) * 4;
    float *pin = NULL;
    int rc = zs__eng_alloc(e, ZS_SPACE_PINNED, ZS_MEM_COMM, bytes, (void **)&pin,
                           "optimizer state transfer", err);
    float *t[3] = {e->master, e->exp_avg, e->exp_avg_sq};
    for (int k = 0; k < e->ns && !rc; k++) {
        uint64_t lo, hi, at;
        slice(e, &e->s[k], &lo, &hi, &at);
        for (int x = 0; x < 3 && !rc && hi > lo; x++) {
            size_t nb = (size_t)(hi - lo) * 4;
            if (to_servers) {
                rc = zs_dev_memcpy(e->compute, pin, t[x] + at, nb, err);
                if (!rc)
                    rc = zs_dev_stream_sync(e->compute, err);
                if (!rc)
                    rc = zs_client_set_state(e->client, x, lo, hi, pin, err);
            } else {
                rc = zs_client_get_state(e->client, x, lo, hi, pin, err);
                if (!rc)
                    rc = zs_dev_memcpy(e->compute, t[x] + at, pin, nb, err);
                if (!rc) /* pin is refilled next */
                    rc = zs_dev_stream_sync(e->compute, err);
            }
        }
    }
    if (!rc)
        rc = zs_dev_stream_sync(e->compute, err);
    zs_dev_free(e->dev, pin);
    return rc;
}

/* MiCS: shard group 0 only (the others hold the same partitions). */
static int upload_state(zs_engine_t *e, zs_err_t *err)
{
    return e->rgroup == 0 ? move_state(e, 1, err) : ZS_OK;
}

static int checkpoint(zs_engine_t *e, zs_err_t *err)
{
    ZS_ENG_TRY(need_servers(e, "checkpoint", err));
    size_t mlen = e->manifest ? strlen(e->manifest) : 0;
    size_t len = META_BYTES + (e->manifest ? 4 + mlen : 0);
    uint8_t *meta = malloc(len);
    int rc = meta ? ZS_OK : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (meta) {
        put32(meta, META_MAGIC);
        put64(meta + 4, e->step);
        put64(meta + 12, e->t);
        zs_loss_scale_save(&e->ls, meta + 20);
        if (e->manifest) {
            put32(meta + META_BYTES, (uint32_t)mlen);
            memcpy(meta + META_BYTES + 4, e->manifest, mlen);
        }
    }
    rc = zs__eng_agree(e, rc, err);
    if (!rc && !e->offload) {
        if (e->wrank == 0)
            rc = zs_client_set_step(e->client, e->step, e->t, err);
        rc = zs__eng_agree(e, rc, err);
        if (!rc)
            rc = zs__eng_agree(e, upload_state(e, err), err);
    }
    if (!rc) {
        if (e->wrank == 0)
            rc = zs_client_checkpoint_meta(e->client, e->step, 0, meta, len, err);
        rc = zs__eng_agree(e, rc, err);
    }
    free(meta);
    return rc;
}

int zs_engine_newest_checkpoint(zs_engine_t *e, uint64_t *step, zs_err_t *err)
{
    *step = 0;
    ZS_ENG_TRY(need_servers(e, "listing checkpoints", err));
    uint64_t steps[ZS_CLIENT_MAX_CKPTS];
    size_t n = 0;
    int rc = e->wrank == 0 ? zs_client_checkpoints(e->client, steps, ZS_CLIENT_MAX_CKPTS, &n, err)
                           : ZS_OK;
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    /* rank 0's answer to every rank, in 16-bit pieces (exact in fp32) */
    uint64_t v = n ? steps[(n < ZS_CLIENT_MAX_CKPTS ? n : ZS_CLIENT_MAX_CKPTS) - 1] : 0;
    float w[4] = {(float)(v & 0xffff), (float)((v >> 16) & 0xffff), (float)((v >> 32) & 0xffff),
                  (float)(v >> 48)};
    ZS_ENG_TRY(zs_coll_broadcast_host(e->coll, w, 4, ZS_DTYPE_F32, 0, err));
    *step = (uint64_t)w[0] | (uint64_t)w[1] << 16 | (uint64_t)w[2] << 32 | (uint64_t)w[3] << 48;
    return ZS_OK;
}

int zs_engine_checkpoint(zs_engine_t *e, zs_err_t *err)
{
    /* the step's streamed pulls first: one client call at a time */
    int rc = zs__eng_pull_finish(e, 1, err);
    if (!rc) /* the delayed update lands: the next step reads the saved parameters */
        rc = zs__eng_delay_land(e, err);
    if (!rc)
        rc = checkpoint(e, err);
    if (rc)
        e->last_rc = rc;
    return rc;
}

/* After a Restore of checkpoint `step`: the servers now hold its parameter
 * groups, which must be this engine's (the same weight decay per element);
 * a run started with other ones (zs-train --decay) is refused. */
static int check_groups(zs_engine_t *e, uint64_t step, zs_err_t *err)
{
    int S = zs_client_nservers(e->client);
    zs_server_info_t *in = calloc((size_t)S, sizeof *in);
    if (!in)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    int rc = zs_client_hello(e->client, e->model_name, e->P, in, err);
    for (int i = 0; i < S && !rc; i++)
        if (!zs_groups_equal(in[i].groups, in[i].ngroups, e->groups, e->ngroups))
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "checkpoint %llu was written with %zu weight-decay ranges (server "
                            "%s), this run asks for %zu: resume with the weight-decay setting "
                            "it was trained with (zs-train --decay)",
                            (unsigned long long)step, in[i].ngroups, zs_client_server(e->client, i),
                            e->ngroups);
    free(in);
    return rc;
}

int zs_engine_resume(zs_engine_t *e, uint64_t want, uint64_t *step_out, zs_err_t *err)
{
    ZS_ENG_TRY(need_servers(e, "resume", err));
    zs__eng_pull_drain(e); /* the resumed parameters replace them */
    zs__eng_delay_forget(e);
    /* Rank 0 picks the checkpoint and restores it; everyone gets its meta. */
    float msg[1 + (META_BYTES + 3) / 4];
    memset(msg, 0, sizeof msg);
    int rc = ZS_OK;
    if (e->wrank == 0) {
        uint64_t steps[ZS_CLIENT_MAX_CKPTS];
        size_t n = 0, len = 0;
        rc = zs_client_hello(e->client, e->model_name, e->P, NULL, err);
        if (!rc)
            rc = zs_client_checkpoints(e->client, steps, ZS_CLIENT_MAX_CKPTS, &n, err);
        uint64_t step = 0;
        if (!rc && n == 0)
            rc = zs_err_set(err, ZS_ERR_NOTFOUND,
                            "no checkpoint is complete on every server: nothing to resume");
        if (!rc) {
            step = steps[(n < ZS_CLIENT_MAX_CKPTS ? n : ZS_CLIENT_MAX_CKPTS) - 1];
            if (want) {
                int found = 0;
                for (size_t i = 0; i < n && i < ZS_CLIENT_MAX_CKPTS; i++)
                    found |= steps[i] == want;
                if (!found)
                    rc = zs_err_set(err, ZS_ERR_NOTFOUND,
                                    "checkpoint %llu is not complete on every server",
                                    (unsigned long long)want);
                step = want;
            }
        }
        /* The fixed part is what the workers need; a manifest after it is
         * for tools only. */
        uint8_t *meta = rc ? NULL : malloc(ZS_CLIENT_USER_META_MAX);
        if (!rc && !meta)
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        if (!rc)
            rc = zs_client_restore_meta(e->client, step, meta, ZS_CLIENT_USER_META_MAX, &len, err);
        zs_engine_ckpt_meta_t cm;
        if (!rc && len > ZS_CLIENT_USER_META_MAX)
            rc = zs_err_set(err, ZS_ERR_CORRUPT, "checkpoint %llu: %zu bytes of client state",
                            (unsigned long long)step, len);
        if (!rc)
            rc = check_groups(e, step, err);
        if (!rc && (zs_engine_meta_parse(meta, len, &cm, err) || cm.step != step))
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "checkpoint %llu was not written by the zeroshard engine (no engine "
                            "state stored with it)",
                            (unsigned long long)step);
        if (!rc) {
            msg[0] = 1.0f;
            memcpy(&msg[1], meta, META_BYTES);
        }
        free(meta);
    }
    /* "Nothing to resume" is an answer every worker must get alike (a caller
     * may then start fresh), not a failure of rank 0. */
    float code = (float)rc;
    ZS_ENG_TRY(zs_coll_broadcast_host(e->coll, &code, 1, ZS_DTYPE_F32, 0, err));
    if ((int)code == ZS_ERR_NOTFOUND)
        return e->wrank == 0 ? rc
                             : zs_err_set(err, ZS_ERR_NOTFOUND,
                                          "no checkpoint is complete on every server (rank 0)");
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    ZS_ENG_TRY(zs_coll_broadcast_host(e->coll, msg, sizeof msg / 4, ZS_DTYPE_F32, 0, err));
    const uint8_t *meta = (const uint8_t *)&msg[1];
    uint64_t step = get64(meta + 4), t = get64(meta + 12);
    rc = zs_loss_scale_load(&e->ls, meta + 20);
    if (rc)
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "checkpoint %llu: bad loss-scaler state",
                        (unsigned long long)step);
    if (!rc && e->wrank != 0)
        rc = zs_client_hello(e->client, e->model_name, e->P, NULL, err);
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));

    /* Pull this worker's partition back: parameters (offload) or the
     * optimizer state, from which the parameters are cast. */
    if (e->offload) {
        int direct = e->stage == 3 && e->offload_param && !e->pnv;
        for (int k = 0; k < e->ns && !rc; k++) {
            zs__seg_t *s = &e->s[k];
            if (s->ve <= s->vb)
                continue;
            void *dst = direct ? zs__eng_param_part(e, s) : zs__at(e, e->staging, s->qbase);
            rc = zs_client_pull(e->client, step, s->off + s->vb, s->off + s->ve, dst, e->dt, NULL,
                                err);
            if (!rc && !direct)
                rc = zs__eng_param_set(e, s, dst, err);
        }
        if (!rc)
            rc = zs_dev_stream_sync(e->copy, err);
    } else {
        rc = move_state(e, 0, err);
        for (int k = 0; k < e->ns && !rc; k++) {
            zs__seg_t *s = &e->s[k];
            uint64_t lo, hi, at;
            slice(e, s, &lo, &hi, &at);
            void *p = NULL; /* offload_param nvme: cast into the part, then write it */
            if (hi > lo && e->pnv)
                rc = zs__pnv_begin(e, s, 0, &p, err);
            if (hi > lo && !rc)
                rc = zs_dev_cast(e->compute, p ? p : zs__eng_param_part(e, s), e->dt,
                                 e->master + at, ZS_DTYPE_F32, hi - lo, err);
            if (hi > lo && p && !rc)
                rc = zs_dev_stream_sync(e->compute, err);
            if (hi > lo && p && !rc)
                rc = zs__pnv_end(e, s, p, 1, NULL, err);
        }
        if (!rc)
            rc = zs_dev_stream_sync(e->compute, err);
    }
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    /* Stage 0 without offload keeps the whole optimizer state everywhere, and
     * its parameters (which it never all-gathers) come from the full master. */
    if (e->stage == 0 && !e->offload) {
        float *t3[3] = {e->master, e->exp_avg, e->exp_avg_sq};
        for (int k = 0; k < e->ns && !rc; k++) {
            zs__seg_t *s = &e->s[k];
            for (int x = 0; x < 3 && !rc && s->n; x++)
                rc = zs_coll_all_gather(e->pc, t3[x] + s->pbase, s->part, ZS_DTYPE_F32,
                                        x == 0 && k == 0 ? e->compute : NULL, NULL, err);
        }
        if (!rc)
            rc = zs_coll_sync(e->coll, err);
        for (int k = 0; k < e->ns && !rc; k++) {
            zs__seg_t *s = &e->s[k];
            if (s->n)
                rc = zs_dev_cast(e->compute, zs__at(e, e->params, s->pbase), e->dt,
                                 e->master + s->pbase, ZS_DTYPE_F32, s->n, err);
        }
        if (!rc)
            rc = zs_dev_stream_sync(e->compute, err);
    }
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    e->step = step;
    e->t = t;
    ZS_ENG_TRY(zs__eng_after_update(e, err));
    if (step_out)
        *step_out = step;
    if (e->wrank == 0)
        ZS_INFO("resumed at step %llu (Adam t=%llu, loss scale %g) with %d workers",
                (unsigned long long)step, (unsigned long long)t, e->ls.scale, e->Wd);
    return ZS_OK;
}
