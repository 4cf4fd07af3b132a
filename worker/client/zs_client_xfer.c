/*
 * zs_client_xfer.c - the shard client's operator calls (zs_client.h, the
 * "operator calls" part): a checkpoint's stored metadata without a Restore
 * (GetCheckpointMeta), and Initialize / SetState of one server streamed
 * from a fill callback, so zs-ctl export and reshard move any model through
 * O(chunk) memory.
 *
 * Streamed chunks are malloc'd one at a time and handed to gRPC with a
 * release callback (freed when gRPC drops them), so a chunk is never reused
 * while the transport may still read it. Does not: decide what to move
 * (tools/zs_ctl_*.c do), or keep anything between calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_client_internal.h"
#include "zs_layout.h"
#include "zs_pbconv.h"
#include "zs_rpc.h"

/* ---- GetCheckpointMeta -------------------------------------------------- */

typedef struct {
    uint64_t step;
    zs_ckpt_info_t *info; /* [S] */
    void **meta;          /* [S] malloc'd copies of each server's user_meta */
} meta_arg_t;

static int meta_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    meta_arg_t *a = argp;
    Zeroshard__CheckpointMetaRequest q = ZEROSHARD__CHECKPOINT_META_REQUEST__INIT;
    q.step = a->step;
    Zeroshard__CheckpointMeta *r;
    int rc = zs_unary(c->ch[i], "/zeroshard.Shard/GetCheckpointMeta", c->token, c->timeout_ms,
                      c->addr[i], &q.base, &zeroshard__checkpoint_meta__descriptor,
                      (ProtobufCMessage **)&r, err);
    if (rc == ZS_ERR_UNIMPLEMENTED)
        zs_err_prefix(err, "this server predates GetCheckpointMeta (upgrade zs-server): ");
    if (rc)
        return rc;
    zs_ckpt_info_t *in = &a->info[i];
    memset(in, 0, sizeof *in);
    snprintf(in->model_name, sizeof in->model_name, "%s", r->model_name ? r->model_name : "");
    in->num_params = r->num_params;
    in->num_servers = r->num_servers;
    in->server_index = r->server_index;
    in->range_begin = r->range_begin;
    in->range_end = r->range_end;
    in->applied_step = r->applied_step;
    in->optimizer_step = r->optimizer_step;
    if (r->adam)
        zs_pb_adam_get(r->adam, &in->adam);
    in->created_unix_ms = r->created_unix_ms;
    in->user_meta_len = r->user_meta.len;
    in->ngroups = r->n_groups;
    /* The reply passed the unary size limit, so the copy is bounded too. */
    if (r->user_meta.len > ZS_CLIENT_USER_META_MAX)
        rc = zs_err_set(err, ZS_ERR_INVALID, "%s: checkpoint %llu: user_meta of %zu bytes",
                        c->addr[i], (unsigned long long)a->step, r->user_meta.len);
    else if (!r->adam)
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "%s: checkpoint %llu: no hyperparameters", c->addr[i],
                        (unsigned long long)a->step);
    else if (zs_pb_groups_get(r->groups, r->n_groups, in->groups, err) ||
             zs_groups_check(in->groups, in->ngroups, in->num_params, err))
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "%s: checkpoint %llu: bad parameter groups",
                        c->addr[i], (unsigned long long)a->step);
    else if (r->user_meta.len && !(a->meta[i] = malloc(r->user_meta.len)))
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    else if (r->user_meta.len)
        memcpy(a->meta[i], r->user_meta.data, r->user_meta.len);
    zeroshard__checkpoint_meta__free_unpacked(r, NULL);
    return rc;
}

/* Every server's metadata must describe server i of S of one model at
 * `step`, with the range the layout gives. */
static int check_infos(const zs_client_t *c, uint64_t step, const zs_ckpt_info_t *in,
                       void *const *meta, zs_err_t *err)
{
    uint64_t P = in[0].num_params;
    if (P == 0 || P > ((uint64_t)1 << 44))
        return zs_err_set(err, ZS_ERR_CORRUPT, "%s: checkpoint %llu has %llu parameters",
                          c->addr[0], (unsigned long long)step, (unsigned long long)P);
    for (int i = 0; i < c->n; i++) {
        const zs_ckpt_info_t *x = &in[i];
        uint64_t b = zs_layout_begin(P, (uint32_t)c->n, (uint32_t)i);
        uint64_t e = zs_layout_begin(P, (uint32_t)c->n, (uint32_t)i + 1);
        if (x->num_servers != (uint32_t)c->n || x->server_index != (uint32_t)i)
            return zs_err_set(err, ZS_ERR_STATE,
                              "%s: checkpoint %llu is of server %u of %u, but the list names it "
                              "%d of %d (the order must match the layout)",
                              c->addr[i], (unsigned long long)step, x->server_index, x->num_servers,
                              i, c->n);
        if (x->num_params != P || strcmp(x->model_name, in[0].model_name) ||
            x->applied_step != step || x->optimizer_step != in[0].optimizer_step ||
            x->range_begin != b || x->range_end != e ||
            memcmp(&x->adam, &in[0].adam, sizeof x->adam) ||
            !zs_groups_equal(x->groups, x->ngroups, in[0].groups, in[0].ngroups) ||
            x->user_meta_len != in[0].user_meta_len ||
            (x->user_meta_len && memcmp(meta[i], meta[0], x->user_meta_len)))
            return zs_err_set(
                err, ZS_ERR_CORRUPT,
                "checkpoint %llu: %s and %s disagree (model '%s'/'%s', P %llu/%llu, "
                "step %llu, Adam t %llu/%llu, range [%llu, %llu) of [%llu, %llu), "
                "hyperparameters or engine state)",
                (unsigned long long)step, c->addr[0], c->addr[i], in[0].model_name, x->model_name,
                (unsigned long long)P, (unsigned long long)x->num_params,
                (unsigned long long)x->applied_step, (unsigned long long)in[0].optimizer_step,
                (unsigned long long)x->optimizer_step, (unsigned long long)x->range_begin,
                (unsigned long long)x->range_end, (unsigned long long)b, (unsigned long long)e);
    }
    return ZS_OK;
}

int zs_client_checkpoint_info(zs_client_t *c, uint64_t step, zs_ckpt_info_t *info, void *buf,
                              size_t cap, size_t *len, zs_err_t *err)
{
    meta_arg_t a = {step, info ? info : calloc((size_t)c->n, sizeof *info),
                    calloc((size_t)c->n, sizeof(void *))};
    int rc = a.info && a.meta ? ZS_OK : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = zs__client_fan_out(c, 0, c->n - 1, meta_one, NULL, &a, err);
    if (!rc)
        rc = check_infos(c, step, a.info, a.meta, err);
    if (!rc) {
        size_t n = a.info[0].user_meta_len;
        if (buf && n)
            memcpy(buf, a.meta[0], n < cap ? n : cap);
        if (len)
            *len = n;
        if (c->P == 0)
            c->P = a.info[0].num_params;
        else if (c->P != a.info[0].num_params)
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "checkpoint %llu has %llu parameters, the servers hold %llu",
                            (unsigned long long)step, (unsigned long long)a.info[0].num_params,
                            (unsigned long long)c->P);
    }
    for (int i = 0; a.meta && i < c->n; i++)
        free(a.meta[i]);
    free(a.meta);
    if (!info)
        free(a.info);
    return rc;
}

/* ---- streamed Initialize / SetState of one server ------------------------ */

typedef struct {
    int tensor; /* -1: Initialize, else SetState of this tensor */
    const char *model;
    const zs_adam_hparams_t *hp;
    uint64_t start_step;
    int overwrite;
    zs_client_fill_fn fill;
    void *ud;
} stream_arg_t;

/* Stream server i's whole range: each chunk is filled into a fresh buffer
 * that gRPC frees (release = free) once it no longer needs it. */
static int stream_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    const stream_arg_t *a = argp;
    int init = a->tensor < 0;
    uint64_t b = zs__client_srv_begin(c, i), e = zs__client_srv_begin(c, i + 1);
    Zeroshard__AdamConfig adam;
    Zeroshard__InitRequest iq = ZEROSHARD__INIT_REQUEST__INIT;
    int rc = init ? zs__client_negotiate(c, i, err) : ZS_OK; /* the version iq states */
    if (!rc && init && c->ngroups)
        rc = zs__client_groups_ok(c, i, "Initialize with parameter groups", err);
    if (rc)
        return rc;
    if (init)
        zs__client_init_request(c, i, a->model, a->hp, a->start_step, a->overwrite, &iq, &adam);
    zs_ccall_t call;
    rc = zs_ccall_start(&call, c->ch[i],
                        init ? "/zeroshard.Shard/Initialize" : "/zeroshard.Shard/SetState",
                        c->token, c->timeout_ms, c->addr[i], err);
    if (rc)
        return rc;
    const uint64_t per = ZS_RPC_CHUNK_BYTES / 4;
    uint64_t off = b;
    /* An empty range still sends Initialize's first message. */
    for (int first = 1; !rc && (off < e || (first && init)); first = 0) {
        uint64_t k = e - off < per ? e - off : per;
        float *buf = malloc(k ? k * 4 : 1);
        if (!buf) {
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
            break;
        }
        if (k)
            rc = a->fill(a->ud, off, k, buf, err);
        if (rc) {
            free(buf);
            break;
        }
        grpc_byte_buffer *bb;
        if (init) {
            Zeroshard__InitChunk m = ZEROSHARD__INIT_CHUNK__INIT;
            m.init = first ? &iq : NULL;
            m.offset = off;
            m.count = k;
            m.dtype = ZEROSHARD__DTYPE__F32;
            bb = zs_frame_build(&m.base, buf, k * 4, free, buf);
        } else {
            Zeroshard__StateChunk m = ZEROSHARD__STATE_CHUNK__INIT;
            m.tensor = (Zeroshard__Tensor)a->tensor;
            m.offset = off;
            m.count = k;
            bb = zs_frame_build(&m.base, buf, k * 4, free, buf);
        }
        if (!bb) {
            free(buf);
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
            break;
        }
        rc = zs_ccall_send(&call, bb, err);
        off += k;
    }
    return zs__client_stream_end(&call, rc, err);
}

int zs_client_init_server(zs_client_t *c, int i, const char *model, uint64_t P,
                          const zs_adam_hparams_t *hp, uint64_t start_step, int overwrite,
                          zs_client_fill_fn fill, void *ud, zs_err_t *err)
{
    if (P == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "model size P must be > 0");
    if (i < 0 || i >= c->n)
        return zs_err_set(err, ZS_ERR_RANGE, "server %d of %d", i, c->n);
    c->P = P;
    stream_arg_t a = {-1, model, hp, start_step, overwrite, fill, ud};
    return zs__client_fan_out(c, i, i, stream_one, NULL, &a, err);
}

int zs_client_set_state_server(zs_client_t *c, int i, int tensor, zs_client_fill_fn fill, void *ud,
                               zs_err_t *err)
{
    if (tensor < 0 || tensor > 2)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", tensor);
    if (i < 0 || i >= c->n)
        return zs_err_set(err, ZS_ERR_RANGE, "server %d of %d", i, c->n);
    if (c->P == 0)
        return zs_err_set(err, ZS_ERR_STATE, "model size unknown: call zs_client_hello first");
    if (zs__client_srv_begin(c, i) == zs__client_srv_begin(c, i + 1))
        return ZS_OK; /* nothing to set on an empty range */
    stream_arg_t a = {tensor, NULL, NULL, 0, 0, fill, ud};
    return zs__client_fan_out(c, i, i, stream_one, NULL, &a, err);
}
