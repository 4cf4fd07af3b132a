/*
 * zs_client_ckpt.c - the shard client's checkpoint calls (zs_client.h):
 * Checkpoint, ListCheckpoints, Restore, SetStep and DeleteCheckpoints on
 * every server at once, through the client's parallel fan-out with retries
 * (zs_client.c). A checkpoint step counts only where every server lists it.
 *
 * What it does not do: move tensors (zs_client.c, zs_client_xfer.c), or
 * decide which step to resume from (the engine does).
 */
#include <stdlib.h>
#include <string.h>

#include "zs_client_internal.h"
#include "zs_rpc.h"

#define M(name) "/zeroshard.Shard/" name

/* ---- checkpoints ---------------------------------------------------------------------- */

typedef struct {
    uint64_t step;
    int keep;
    uint64_t (*lists)[ZS_CLIENT_MAX_CKPTS];
    size_t *nlists;
    const void *meta; /* Checkpoint: user meta to store */
    size_t meta_len;
    void *out; /* Restore: per-server copies of the stored meta */
    size_t *out_len;
    size_t cap;
    uint64_t ostep; /* SetStep */
} ckpt_arg_t;

static void keep_list(ckpt_arg_t *a, int i, const uint64_t *steps, size_t n)
{
    if (!a->lists)
        return;
    size_t skip = n > ZS_CLIENT_MAX_CKPTS ? n - ZS_CLIENT_MAX_CKPTS : 0;
    a->nlists[i] = 0;
    for (size_t k = skip; k < n; k++)
        a->lists[i][a->nlists[i]++] = steps[k];
}

static int ckpt_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    ckpt_arg_t *a = argp;
    Zeroshard__CheckpointRequest q = ZEROSHARD__CHECKPOINT_REQUEST__INIT;
    q.step = a->step;
    q.keep = (uint32_t)a->keep;
    q.user_meta.data = (uint8_t *)a->meta;
    q.user_meta.len = a->meta_len;
    Zeroshard__CheckpointReply *r;
    int rc = zs_unary(c->ch[i], M("Checkpoint"), c->token, c->timeout_ms, c->addr[i], &q.base,
                      &zeroshard__checkpoint_reply__descriptor, (ProtobufCMessage **)&r, err);
    if (rc == ZS_OK)
        zeroshard__checkpoint_reply__free_unpacked(r, NULL);
    return rc;
}

int zs_client_checkpoint(zs_client_t *c, uint64_t step, int keep, zs_err_t *err)
{
    return zs_client_checkpoint_meta(c, step, keep, NULL, 0, err);
}

int zs_client_checkpoint_meta(zs_client_t *c, uint64_t step, int keep, const void *meta, size_t len,
                              zs_err_t *err)
{
    ckpt_arg_t a = {.step = step, .keep = keep, .meta = meta, .meta_len = len};
    return zs__client_fan_out(c, 0, c->n - 1, ckpt_one, NULL, &a, err);
}

/* ListCheckpoints of server i into *r (freed with
 * zeroshard__list_reply__free_unpacked). */
static int list_reply(zs_client_t *c, int i, Zeroshard__ListReply **r, zs_err_t *err)
{
    Zeroshard__ListRequest q = ZEROSHARD__LIST_REQUEST__INIT;
    return zs_unary(c->ch[i], M("ListCheckpoints"), c->token, c->timeout_ms, c->addr[i], &q.base,
                    &zeroshard__list_reply__descriptor, (ProtobufCMessage **)r, err);
}

static int list_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    ckpt_arg_t *a = argp;
    Zeroshard__ListReply *r;
    int rc = list_reply(c, i, &r, err);
    if (rc)
        return rc;
    keep_list(a, i, r->checkpoints, r->n_checkpoints);
    zeroshard__list_reply__free_unpacked(r, NULL);
    return ZS_OK;
}

int zs_client_checkpoints(zs_client_t *c, uint64_t *steps, size_t max, size_t *n, zs_err_t *err)
{
    *n = 0;
    ckpt_arg_t a = {.lists = calloc((size_t)c->n, sizeof *a.lists),
                    .nlists = calloc((size_t)c->n, sizeof *a.nlists)};
    if (!a.lists || !a.nlists) {
        free(a.lists);
        free(a.nlists);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    int rc = zs__client_fan_out(c, 0, c->n - 1, list_one, NULL, &a, err);
    /* A step counts only if every server lists it. */
    for (size_t k = 0; rc == ZS_OK && k < a.nlists[0]; k++) {
        uint64_t s = a.lists[0][k];
        int all = 1;
        for (int i = 1; i < c->n && all; i++) {
            int found = 0;
            for (size_t j = 0; j < a.nlists[i] && !found; j++)
                found = a.lists[i][j] == s;
            all = found;
        }
        if (all) {
            if (*n < max)
                steps[*n] = s;
            (*n)++;
        }
    }
    free(a.lists);
    free(a.nlists);
    return rc;
}

static int restore_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    ckpt_arg_t *a = argp;
    Zeroshard__RestoreRequest q = ZEROSHARD__RESTORE_REQUEST__INIT;
    q.step = a->step;
    Zeroshard__RestoreReply *r;
    int rc = zs_unary(c->ch[i], M("Restore"), c->token, c->timeout_ms, c->addr[i], &q.base,
                      &zeroshard__restore_reply__descriptor, (ProtobufCMessage **)&r, err);
    if (rc)
        return rc;
    if (a->out) {
        size_t n = r->user_meta.len < a->cap ? r->user_meta.len : a->cap;
        memcpy((char *)a->out + (size_t)i * a->cap, r->user_meta.data, n);
        a->out_len[i] = r->user_meta.len;
    }
    zeroshard__restore_reply__free_unpacked(r, NULL);
    return ZS_OK;
}

int zs_client_restore(zs_client_t *c, uint64_t step, zs_err_t *err)
{
    return zs_client_restore_meta(c, step, NULL, 0, NULL, err);
}

int zs_client_restore_meta(zs_client_t *c, uint64_t step, void *buf, size_t cap, size_t *len,
                           zs_err_t *err)
{
    ckpt_arg_t a = {.step = step};
    if (buf) {
        a.cap = cap;
        a.out = calloc((size_t)c->n, cap ? cap : 1);
        a.out_len = calloc((size_t)c->n, sizeof *a.out_len);
        if (!a.out || !a.out_len) {
            free(a.out);
            free(a.out_len);
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        }
    }
    int rc = zs__client_fan_out(c, 0, c->n - 1, restore_one, NULL, &a, err);
    if (rc == ZS_OK && buf) {
        for (int i = 1; i < c->n && rc == ZS_OK; i++)
            if (a.out_len[i] != a.out_len[0] || memcmp((char *)a.out + (size_t)i * cap, a.out,
                                                       a.out_len[0] < cap ? a.out_len[0] : cap))
                rc = zs_err_set(err, ZS_ERR_CORRUPT,
                                "checkpoint %llu: %s and %s stored different client state",
                                (unsigned long long)step, c->addr[0], c->addr[i]);
        if (rc == ZS_OK) {
            memcpy(buf, a.out, a.out_len[0] < cap ? a.out_len[0] : cap);
            if (len)
                *len = a.out_len[0];
        }
    }
    free(a.out);
    free(a.out_len);
    return rc;
}

static int set_step_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    ckpt_arg_t *a = argp;
    Zeroshard__SetStepRequest q = ZEROSHARD__SET_STEP_REQUEST__INIT;
    q.step = a->step;
    q.optimizer_step = a->ostep;
    Zeroshard__CommitReply *r;
    int rc = zs_unary(c->ch[i], M("SetStep"), c->token, c->timeout_ms, c->addr[i], &q.base,
                      &zeroshard__commit_reply__descriptor, (ProtobufCMessage **)&r, err);
    if (rc == ZS_OK)
        zeroshard__commit_reply__free_unpacked(r, NULL);
    return rc;
}

int zs_client_set_step(zs_client_t *c, uint64_t step, uint64_t optimizer_step, zs_err_t *err)
{
    ckpt_arg_t a = {.step = step, .ostep = optimizer_step};
    return zs__client_fan_out(c, 0, c->n - 1, set_step_one, NULL, &a, err);
}

static int delete_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    ckpt_arg_t *a = argp;
    Zeroshard__DeleteRequest q = ZEROSHARD__DELETE_REQUEST__INIT;
    q.step = a->step;
    q.keep = (uint32_t)a->keep;
    Zeroshard__DeleteReply *r;
    int rc = zs_unary(c->ch[i], M("DeleteCheckpoints"), c->token, c->timeout_ms, c->addr[i],
                      &q.base, &zeroshard__delete_reply__descriptor, (ProtobufCMessage **)&r, err);
    if (rc == ZS_OK)
        zeroshard__delete_reply__free_unpacked(r, NULL);
    return rc;
}

int zs_client_delete(zs_client_t *c, uint64_t step, int keep, zs_err_t *err)
{
    ckpt_arg_t a = {.step = step, .keep = keep};
    return zs__client_fan_out(c, 0, c->n - 1, delete_one, NULL, &a, err);
}

/* Server i: list its checkpoints (complete or not elsewhere), delete each. */
static int delete_all_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    Zeroshard__ListReply *r;
    int rc = list_reply(c, i, &r, err);
    if (rc)
        return rc;
    for (size_t k = 0; k < r->n_checkpoints && rc == ZS_OK; k++) {
        ckpt_arg_t a = {.step = r->checkpoints[k]};
        rc = delete_one(c, i, &a, err);
    }
    zeroshard__list_reply__free_unpacked(r, NULL);
    return rc;
}

int zs_client_delete_all(zs_client_t *c, zs_err_t *err)
{
    return zs__client_fan_out(c, 0, c->n - 1, delete_all_one, NULL, NULL, err);
}
