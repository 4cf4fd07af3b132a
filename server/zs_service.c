/*
 * zs_service.c - handlers of the zeroshard.Shard methods (see zs_service.h).
 *
 * Bulk paths copy each payload exactly once: from the received gRPC slices
 * straight into the shard's arrays (push, init) or from the shard into a
 * per-call buffer that gRPC sends without another copy (pull, get-state).
 * A Push or Pull chunk with a ShmRef moves its payload through a co-located
 * worker's shared segment instead (zs_service_shm.c: one copy, no send
 * buffer).
 *
 * Versions: Hello and Initialize negotiate the protocol version (the lower
 * of the client's and the server's highest); a reply of version 1 carries
 * only version 1's fields. Does not keep protocol sessions (a shared-memory
 * session is a mapped segment, not a negotiated state): every request stands
 * alone, so a version-1 client is served as one by sending nothing of
 * version 2 (it never states PushChunk.expect, so nothing speculates).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs_dtype.h"
#include "zs_file.h"
#include "zs_log.h"
#include "zs_pbconv.h"
#include "zs_service.h"
#include "zs_service_shm.h"

/* A CheckpointRequest and a CheckpointMeta carry user_meta plus at most a
 * few hundred bytes of other fields; both must fit a unary message. */
_Static_assert(ZS_USER_META_MAX + 4096u <= ZS_RPC_MAX_META,
               "user_meta must fit a unary message with its other fields");
_Static_assert(ZS_SHARD_STEP_MAX == ZS_STEP_MAX, "one step limit for the shard and the wire");

/* Deadline of a call in zs_now_ms() milliseconds. */
static int64_t call_deadline_ms(const zs_scall_t *c)
{
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0)
        return zs_now_ms() + 24LL * 3600 * 1000;
    int64_t left = gpr_time_to_millis(gpr_time_sub(d, now));
    return zs_now_ms() + (left > 0 ? left : 0);
}

/* The highest version the handlers speak (zs_service_set_protocol_version).
 * Written once before serving, read by handler threads started after. */
static uint32_t g_version = ZS_PROTOCOL_VERSION;

int zs_service_set_protocol_version(uint32_t version, zs_err_t *err)
{
    if (version < ZS_PROTOCOL_VERSION_MIN || version > ZS_PROTOCOL_VERSION)
        return zs_err_set(err, ZS_ERR_INVALID, "protocol version %u: this server speaks %u..%u",
                          version, ZS_PROTOCOL_VERSION_MIN, ZS_PROTOCOL_VERSION);
    g_version = version;
    return ZS_OK;
}

uint32_t zs_service_protocol_version(void)
{
    return g_version;
}

/* The version a Hello or Initialize stating `stated` speaks, into *out:
 * 0 is proto3's "not stated" (a client asking which version we speak): ours;
 * else the lower of the two, so a newer client is answered with what we
 * speak and an older one is served as before (every version only adds).
 * Refused only below ZS_PROTOCOL_VERSION_MIN, a version this server can no
 * longer serve. */
static int negotiate(uint32_t stated, uint32_t *out, zs_err_t *err)
{
    *out = g_version;
    if (stated == 0)
        return ZS_OK;
    if (stated < ZS_PROTOCOL_VERSION_MIN)
        return zs_err_set(err, ZS_ERR_STATE,
                          "protocol version %u not supported (server speaks %u..%u)", stated,
                          ZS_PROTOCOL_VERSION_MIN, g_version);
    if (stated < g_version)
        *out = stated;
    return ZS_OK;
}

static int refuse(zs_shard_t *sh, int rc)
{
    if (rc != ZS_OK && rc != ZS_ERR_CANCELLED)
        zs_shard_count_refusal(sh);
    return rc;
}

/* Validate a bulk chunk's element count against its payload. */
static int check_payload(const zs_frame_t *fr, uint64_t count, zs_dtype_t dt, zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    if (esz == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown dtype %d", (int)dt);
    if (count == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "chunk with count 0");
    if (count > ZS_RPC_MAX_CHUNK_BYTES / esz)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "chunk of %llu %s elements exceeds the %u-byte limit",
                          (unsigned long long)count, zs_dtype_name(dt), ZS_RPC_MAX_CHUNK_BYTES);
    if (fr->pay_len != count * esz)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "chunk says %llu %s elements (%llu bytes) but carries %zu bytes",
                          (unsigned long long)count, zs_dtype_name(dt),
                          (unsigned long long)(count * esz), fr->pay_len);
    return ZS_OK;
}

/* ---- Hello --------------------------------------------------------------- */

/* Resident set (bytes) and glibc's heap in use / kept free. */
static void mem_stats(uint64_t *rss, uint64_t *in_use, uint64_t *kept)
{
    *rss = zs_file_self_rss();
    struct mallinfo2 mi = mallinfo2();
    *in_use = (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
    *kept = (uint64_t)mi.fordblks;
}

/* A request's parameter-group learning rates (CommitRequest.group_lr,
 * StepExpect.group_lr) into c: at most ZS_GROUPS_MAX_LRS, and only from a
 * server that speaks parameter groups (a server held below that version,
 * --protocol-version, refuses what an old server would have ignored, so
 * tests see a client that sends them to an old server). */
static int group_lrs(const float *lrs, size_t n, zs_commit_t *c, zs_err_t *err)
{
    if (n == 0)
        return ZS_OK;
    if (g_version < ZS_PROTOCOL_V_GROUPS)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "group_lr needs protocol version %u; this server speaks %u "
                          "(--protocol-version)",
                          ZS_PROTOCOL_V_GROUPS, g_version);
    if (n > ZS_GROUPS_MAX_LRS)
        return zs_err_set(err, ZS_ERR_INVALID, "%zu group learning rates, at most %d", n,
                          ZS_GROUPS_MAX_LRS);
    c->nlrs = (uint32_t)n;
    memcpy(c->lrs, lrs, n * sizeof *lrs);
    return ZS_OK;
}

/* InitRequest.groups into the Initialize being built (same version rule). */
static int init_groups(zs_shard_init_t *in, const Zeroshard__InitRequest *q, zs_err_t *err)
{
    if (g_version < ZS_PROTOCOL_V_GROUPS)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "InitRequest.groups needs protocol version %u; this server speaks %u "
                          "(--protocol-version)",
                          ZS_PROTOCOL_V_GROUPS, g_version);
    if (q->n_groups > ZS_GROUPS_MAX_RANGES)
        return zs_err_set(err, ZS_ERR_INVALID, "%zu parameter group ranges, at most %d",
                          q->n_groups, ZS_GROUPS_MAX_RANGES);
    zs_group_range_t *r = malloc(q->n_groups * sizeof *r);
    if (!r)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    int rc = zs_pb_groups_get(q->groups, q->n_groups, r, err);
    if (!rc)
        rc = zs_shard_init_groups(in, r, q->n_groups, err);
    free(r);
    return rc;
}

/* The HelloReply (also Initialize's reply) of protocol `version`: below
 * ZS_PROTOCOL_V_SPECULATION without the spec_* counters, as a server of that
 * version answered. shm_session: the HelloRequest's (0: none), for
 * shm_session_ok; the shm fields need no version (an old peer ignores
 * them). */
static grpc_byte_buffer *hello_reply(zs_shard_t *sh, uint32_t version, uint64_t shm_session,
                                     zs_err_t *err)
{
    zs_shard_info_t in;
    if (zs_shard_info(sh, &in, err))
        return NULL;
    Zeroshard__HelloReply r = ZEROSHARD__HELLO_REPLY__INIT;
    Zeroshard__AdamConfig a;
    Zeroshard__Counters c = ZEROSHARD__COUNTERS__INIT;
    r.protocol_version = version;
    r.initialized = in.initialized;
    r.model_name = in.id.model_name;
    r.num_params = in.id.num_params;
    r.num_servers = in.id.num_servers;
    r.server_index = in.id.server_index;
    r.range_begin = in.range_begin;
    r.range_end = in.range_end;
    r.applied_step = in.applied_step;
    r.optimizer_step = in.optimizer_step;
    r.n_checkpoints = in.ncheckpoints;
    r.checkpoints = in.checkpoints;
    zs_pb_adam_set(&a, &in.adam);
    r.adam = &a;
    c.bytes_in = in.counters.bytes_in;
    c.bytes_out = in.counters.bytes_out;
    c.steps_applied = in.counters.steps_applied;
    c.steps_skipped = in.counters.steps_skipped;
    c.optimizer_gbps = in.counters.optimizer_gbps;
    c.last_step_ms = in.counters.last_step_ms;
    c.refused = in.counters.refused;
    c.checkpoints_written = in.counters.checkpoints_written;
    c.checkpoint_gbps = in.counters.checkpoint_gbps;
    if (version >= ZS_PROTOCOL_V_SPECULATION) {
        c.spec_hits = in.counters.spec_hits;
        c.spec_rollbacks = in.counters.spec_rollbacks;
        c.spec_elements = in.counters.spec_elements;
        c.spec_seconds = in.counters.spec_seconds;
        c.spec_window_bytes = in.counters.spec_window_bytes;
    }
    mem_stats(&c.rss_bytes, &c.heap_in_use, &c.heap_free);
    r.counters = &c;
    r.server_id = (char *)in.server_id;
    r.mem_budget = in.mem_budget;
    r.mem_reserved = in.mem_reserved;
    r.store_degraded = in.store_degraded;
    r.store_error = in.store_error;
    r.nvme = in.nvme;
    zs__svc_shm_hello(shm_session, &r.shm_socket, &r.shm_session_ok, &r.shm_chunk_bytes);
    Zeroshard__GroupRange **groups = NULL;
    if (version >= ZS_PROTOCOL_V_GROUPS && zs_pb_groups_set(in.groups, in.ngroups, &groups)) {
        free(in.checkpoints);
        zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    r.n_groups = groups ? in.ngroups : 0;
    r.groups = groups;
    grpc_byte_buffer *bb = zs_msg_build(&r.base);
    zs_pb_groups_free(groups);
    free(in.checkpoints);
    return bb;
}

static int h_hello(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__HelloRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__hello_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    uint32_t version;
    rc = negotiate(q->protocol_version, &version, err);
    if (!rc)
        rc = zs_shard_check_identity(sh, q->model_name, q->num_params, err);
    uint64_t shm_session = q->shm_session;
    zeroshard__hello_request__free_unpacked(q, NULL);
    if (rc)
        return refuse(sh, rc);
    grpc_byte_buffer *bb = hello_reply(sh, version, shm_session, err);
    if (!bb)
        return err->code ? err->code : ZS_ERR_NOMEM;
    return zs_scall_finish(call, bb, ZS_OK, "");
}

/* ---- Initialize ------------------------------------------------------------ */

static int h_init(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    zs_shard_init_t *in = NULL;
    int rc = ZS_OK;
    uint64_t bytes = 0;
    uint32_t version = g_version;
    for (int first = 1;; first = 0) {
        grpc_byte_buffer *bb;
        rc = zs_scall_recv(call, &bb, err);
        if (rc || !bb)
            break;
        Zeroshard__InitChunk *m;
        zs_frame_t fr;
        rc = zs_frame_parse(bb, &zeroshard__init_chunk__descriptor, (ProtobufCMessage **)&m, &fr,
                            err);
        grpc_byte_buffer_destroy(bb);
        if (rc)
            break;
        if (first) {
            Zeroshard__InitRequest *q = m->init;
            if (!q)
                rc = zs_err_set(err, ZS_ERR_INVALID, "first Initialize message lacks `init`");
            if (!rc)
                rc = negotiate(q->protocol_version, &version, err);
            if (!rc && !q->adam)
                rc = zs_err_set(err, ZS_ERR_INVALID, "Initialize lacks adam hyperparameters");
            if (!rc && q->require_nvme && !zs_shard_has_nvme(sh))
                rc = zs_err_set(err, ZS_ERR_STATE,
                                "the job asks for the NVMe tier (offload_optimizer.device "
                                "\"nvme\"), but this server keeps optimizer state in RAM: "
                                "start it with --nvme-path DIR");
            else if (!rc && strlen(q->model_name) >= ZS_MODEL_NAME_MAX)
                rc = zs_err_set(err, ZS_ERR_INVALID, "model name longer than %d characters",
                                ZS_MODEL_NAME_MAX - 1);
            if (!rc) {
                zs_shard_identity_t id;
                memset(&id, 0, sizeof id);
                snprintf(id.model_name, sizeof id.model_name, "%s", q->model_name);
                id.num_params = q->num_params;
                id.num_servers = q->num_servers;
                id.server_index = q->server_index;
                zs_adam_hparams_t hp;
                zs_pb_adam_get(q->adam, &hp);
                rc = zs_shard_init_begin(sh, &id, &hp, q->start_step, q->overwrite, &in, err);
            }
            if (!rc && q->n_groups)
                rc = init_groups(in, q, err);
        } else if (m->init) {
            rc = zs_err_set(err, ZS_ERR_INVALID, "`init` allowed in the first message only");
        }
        /* A chunk that claims elements must carry them (check_payload). */
        if (!rc && (fr.pay_len > 0 || m->count > 0)) {
            if (m->dtype != ZEROSHARD__DTYPE__F32)
                rc = zs_err_set(err, ZS_ERR_INVALID, "master weights must be fp32, got %s",
                                zs_dtype_name(m->dtype));
            if (!rc)
                rc = check_payload(&fr, m->count, ZS_DTYPE_F32, err);
            float *dst;
            if (!rc)
                rc = zs_shard_init_reserve(in, m->offset, m->count, &dst, err);
            if (!rc) {
                zs_frame_copy(&fr, dst);
                bytes += fr.pay_len;
            }
        }
        zeroshard__init_chunk__free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
        if (rc)
            break;
    }
    zs_shard_count_bytes(sh, bytes, 0);
    if (rc || !in) {
        zs_shard_init_abort(in);
        if (!rc)
            rc = zs_err_set(err, ZS_ERR_INVALID, "empty Initialize stream");
        return refuse(sh, rc);
    }
    rc = zs_shard_init_end(in, err);
    if (rc)
        return refuse(sh, rc);
    grpc_byte_buffer *bb = hello_reply(sh, version, 0, err);
    return bb ? zs_scall_finish(call, bb, ZS_OK, "") : ZS_ERR_NOMEM;
}

/* ---- Push ---------------------------------------------------------------- */

static int h_push(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    uint64_t staged = 0, bytes = 0, nchunks = 0;
    zs_shard_push_t *ps;
    int rc = zs_shard_push_begin(sh, &ps, err);
    if (rc)
        return refuse(sh, rc);
    for (;;) {
        grpc_byte_buffer *bb;
        rc = zs_scall_recv(call, &bb, err);
        if (rc || !bb)
            break;
        Zeroshard__PushChunk *m;
        zs_frame_t fr;
        rc = zs_frame_parse(bb, &zeroshard__push_chunk__descriptor, (ProtobufCMessage **)&m, &fr,
                            err);
        grpc_byte_buffer_destroy(bb);
        if (rc)
            break;
        void *dst;
        /* With `shm` the payload lies in the worker's segment, not in data. */
        rc = m->shm ? zs__svc_shm_push_check(m, fr.pay_len, err)
                    : check_payload(&fr, m->count, (zs_dtype_t)m->dtype, err);
        if (!rc && m->expect) { /* stated once, before the stream's first chunk */
            if (nchunks > 0)
                rc = zs_err_set(err, ZS_ERR_INVALID,
                                "PushChunk.expect belongs to the stream's first chunk only");
            /* A server held to version 1 (--protocol-version 1) refuses what
             * no client that negotiated it sends, where a real version-1
             * server ignores the unknown field: so a test sees a client
             * that speculates against an old server. */
            else if (g_version < ZS_PROTOCOL_V_SPECULATION)
                rc = zs_err_set(err, ZS_ERR_INVALID,
                                "PushChunk.expect needs protocol version %u; this server speaks "
                                "%u (--protocol-version)",
                                ZS_PROTOCOL_V_SPECULATION, g_version);
            else {
                zs_commit_t e = {m->step, m->expect->grad_scale,
                                 1.0f,    m->expect->lr,
                                 0,       (zs_dtype_t)m->expect->param_dtype};
                rc = group_lrs(m->expect->group_lr, m->expect->n_group_lr, &e, err);
                if (!rc)
                    rc = zs_shard_push_expect(ps, &e, err);
            }
        }
        nchunks++;
        if (!rc && m->shm)
            rc = zs__svc_shm_push(ps, m, &bytes, err);
        else if (!rc)
            rc = zs_shard_push_chunk(ps, m->step, m->offset, m->count, (zs_dtype_t)m->dtype, &dst,
                                     err);
        if (!rc && !m->shm) {
            zs_frame_copy(&fr, dst);
            bytes += fr.pay_len;
            zs_shard_push_chunk_done(ps);
        }
        zeroshard__push_chunk__free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
        if (rc)
            break;
    }
    zs_shard_count_bytes(sh, bytes, 0);
    /* Staged only now, and only if the whole stream was good. */
    zs_err_t e2;
    int rc2 = zs_shard_push_end(ps, rc == ZS_OK, &staged, &e2);
    if (!rc && rc2) {
        rc = rc2;
        *err = e2;
    }
    if (rc)
        return refuse(sh, rc);
    Zeroshard__PushReply r = ZEROSHARD__PUSH_REPLY__INIT;
    r.staged_elements = staged;
    return zs_scall_finish(call, zs_msg_build(&r.base), ZS_OK, "");
}

/* ---- Commit -------------------------------------------------------------- */

static int h_commit(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__CommitRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__commit_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    zs_commit_t c = {q->step, q->grad_scale, q->clip_coef,
                     q->lr,   q->skip,       (zs_dtype_t)q->param_dtype};
    rc = group_lrs(q->group_lr, q->n_group_lr, &c, err);
    zeroshard__commit_request__free_unpacked(q, NULL);
    if (rc)
        return refuse(sh, rc);
    Zeroshard__CommitReply r = ZEROSHARD__COMMIT_REPLY__INIT;
    rc = zs_shard_commit(sh, &c, &r.applied_step, &r.optimizer_step, err);
    if (rc)
        return refuse(sh, rc);
    return zs_scall_finish(call, zs_msg_build(&r.base), ZS_OK, "");
}

/* ---- Pull and GetState: two rotating send buffers per call ----------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *buf[2];
    int busy[2]; /* gRPC still holds the buffer */
    zs_shard_t *sh;
    uint64_t reserved; /* bytes of its budget the two buffers hold */
} sendbufs_t;

typedef struct {
    sendbufs_t *sb;
    int i;
} sendref_t;

static void sendbuf_release(void *p)
{
    sendref_t *r = p;
    pthread_mutex_lock(&r->sb->mu);
    r->sb->busy[r->i] = 0;
    pthread_cond_broadcast(&r->sb->cv);
    pthread_mutex_unlock(&r->sb->mu);
    free(r);
}

/* Two send buffers of `bytes` each, reserved against the budget first
 * (`what` names the call in a refusal); speculation yields them its
 * pre-images if need be (zs_shard_reserve_call). On error nothing is held. */
static int sendbufs_init(sendbufs_t *sb, size_t bytes, zs_shard_t *sh, const char *what,
                         zs_err_t *err)
{
    memset(sb, 0, sizeof *sb);
    int rc = zs_shard_reserve_call(sh, 2 * (uint64_t)bytes, what, err);
    if (rc)
        return rc;
    sb->buf[0] = malloc(bytes);
    sb->buf[1] = malloc(bytes);
    if (!sb->buf[0] || !sb->buf[1]) {
        free(sb->buf[0]);
        free(sb->buf[1]);
        zs_shard_release_call(sh, 2 * (uint64_t)bytes);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for send buffers");
    }
    sb->sh = sh;
    sb->reserved = 2 * (uint64_t)bytes;
    pthread_mutex_init(&sb->mu, NULL);
    pthread_cond_init(&sb->cv, NULL);
    return ZS_OK;
}

/* Wait until buffer i is free again. */
static void *sendbuf_get(sendbufs_t *sb, int i)
{
    pthread_mutex_lock(&sb->mu);
    while (sb->busy[i])
        pthread_cond_wait(&sb->cv, &sb->mu);
    sb->busy[i] = 1;
    pthread_mutex_unlock(&sb->mu);
    return sb->buf[i];
}

static void sendbufs_deinit(sendbufs_t *sb)
{
    /* gRPC may release after the call ended: wait for both. */
    pthread_mutex_lock(&sb->mu);
    while (sb->busy[0] || sb->busy[1])
        pthread_cond_wait(&sb->cv, &sb->mu);
    pthread_mutex_unlock(&sb->mu);
    free(sb->buf[0]);
    free(sb->buf[1]);
    zs_shard_release_call(sb->sh, sb->reserved);
    pthread_mutex_destroy(&sb->mu);
    pthread_cond_destroy(&sb->cv);
}

/* Frame `len` bytes of buffer i and send it; the buffer stays busy until
 * gRPC releases it. */
static int send_chunk(zs_scall_t *call, sendbufs_t *sb, int i, const ProtobufCMessage *meta,
                      size_t len, zs_err_t *err)
{
    sendref_t *r = malloc(sizeof *r);
    if (!r) {
        pthread_mutex_lock(&sb->mu);
        sb->busy[i] = 0;
        pthread_mutex_unlock(&sb->mu);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    r->sb = sb;
    r->i = i;
    grpc_byte_buffer *bb = zs_frame_build(meta, sb->buf[i], len, sendbuf_release, r);
    return zs_scall_send(call, bb, err);
}

/* zs_shard_cancel_fn for a waiting pull: has its client gone away? */
static int pull_cancelled(void *call)
{
    return zs_scall_cancelled(call);
}

static int h_pull(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__PullRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__pull_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    zs_dtype_t dt = (zs_dtype_t)q->dtype;
    size_t esz = zs_dtype_size(dt);
    uint64_t off = q->offset, count = q->count, min_step = q->min_step;
    size_t cb = q->chunk_bytes ? q->chunk_bytes : ZS_RPC_CHUNK_BYTES;
    zs__shm_pull_t sp = {min_step, off, count, dt, cb, 0, ZEROSHARD__SHM_REF__INIT};
    int shm = q->shm != NULL;
    if (shm) { /* the fields, not the message: q is freed next */
        sp.ref.session = q->shm->session;
        sp.ref.byte_offset = q->shm->byte_offset;
        sp.ref.has_xxh3 = q->shm->has_xxh3;
        sp.ref.xxh3 = q->shm->xxh3;
    }
    zeroshard__pull_request__free_unpacked(q, NULL);
    if (esz == 0)
        return refuse(sh, zs_err_set(err, ZS_ERR_INVALID, "unknown pull dtype %d", (int)dt));
    if (cb < 4096 || cb > ZS_RPC_MAX_PULL_CHUNK_BYTES)
        return refuse(sh, zs_err_set(err, ZS_ERR_INVALID, "chunk_bytes %zu outside 4096..%u", cb,
                                     ZS_RPC_MAX_PULL_CHUNK_BYTES));
    rc = zs_shard_check_range(sh, off, count, err);
    if (rc)
        return refuse(sh, rc);
    if (shm) { /* written into the worker's segment: no send buffers to reserve */
        sp.deadline_ms = call_deadline_ms(call);
        return refuse(sh, zs__svc_shm_pull(sh, call, &sp, err));
    }
    sendbufs_t sb;
    rc = sendbufs_init(&sb, cb, sh, "this Pull's two send buffers", err);
    if (rc)
        return refuse(sh, rc);
    uint64_t per = cb / esz, sent = 0;
    int64_t deadline = call_deadline_ms(call);
    for (int i = 0; sent < count && !rc; i ^= 1) {
        uint64_t k = count - sent < per ? count - sent : per;
        void *buf = sendbuf_get(&sb, i);
        Zeroshard__PullChunk m = ZEROSHARD__PULL_CHUNK__INIT;
        rc = zs_shard_pull(sh, min_step, off + sent, k, dt, buf, deadline, pull_cancelled, call,
                           &m.step, err);
        if (rc) {
            pthread_mutex_lock(&sb.mu);
            sb.busy[i] = 0;
            pthread_mutex_unlock(&sb.mu);
            break;
        }
        m.offset = off + sent;
        m.count = k;
        m.dtype = (Zeroshard__DType)dt;
        rc = send_chunk(call, &sb, i, &m.base, (size_t)k * esz, err);
        sent += k;
    }
    zs_shard_count_bytes(sh, 0, sent * esz);
    if (rc == ZS_OK)
        rc = zs_scall_finish(call, NULL, ZS_OK, "");
    sendbufs_deinit(&sb);
    return refuse(sh, rc);
}

static int h_get_state(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__StateRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__state_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    zs_tensor_t t = (zs_tensor_t)q->tensor;
    uint64_t off = q->offset, count = q->count;
    zeroshard__state_request__free_unpacked(q, NULL);
    if ((unsigned)t > 2)
        return refuse(sh, zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", (int)t));
    rc = zs_shard_check_range(sh, off, count, err);
    if (rc)
        return refuse(sh, rc);
    sendbufs_t sb;
    rc = sendbufs_init(&sb, ZS_RPC_CHUNK_BYTES, sh, "this GetState's two send buffers", err);
    if (rc)
        return refuse(sh, rc);
    uint64_t per = ZS_RPC_CHUNK_BYTES / 4, sent = 0;
    for (int i = 0; sent < count && !rc; i ^= 1) {
        uint64_t k = count - sent < per ? count - sent : per;
        float *buf = sendbuf_get(&sb, i);
        Zeroshard__StateChunk m = ZEROSHARD__STATE_CHUNK__INIT;
        rc = zs_shard_get_state(sh, t, off + sent, k, buf, &m.step, err);
        if (rc) {
            pthread_mutex_lock(&sb.mu);
            sb.busy[i] = 0;
            pthread_mutex_unlock(&sb.mu);
            break;
        }
        m.tensor = (Zeroshard__Tensor)t;
        m.offset = off + sent;
        m.count = k;
        rc = send_chunk(call, &sb, i, &m.base, (size_t)k * 4, err);
        sent += k;
    }
    zs_shard_count_bytes(sh, 0, sent * 4);
    if (rc == ZS_OK)
        rc = zs_scall_finish(call, NULL, ZS_OK, "");
    sendbufs_deinit(&sb);
    return refuse(sh, rc);
}

/* ---- SetState: buffer the whole stream, apply only if all of it is valid -- */

typedef struct piece {
    struct piece *next;
    zs_tensor_t t;
    uint64_t off, count;
    float data[];
} piece_t;

static int h_set_state(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    piece_t *head = NULL, **tail = &head;
    uint64_t total = 0, limit = 0;
    int rc = ZS_OK;
    for (;;) {
        grpc_byte_buffer *bb;
        rc = zs_scall_recv(call, &bb, err);
        if (rc || !bb)
            break;
        Zeroshard__StateChunk *m;
        zs_frame_t fr;
        rc = zs_frame_parse(bb, &zeroshard__state_chunk__descriptor, (ProtobufCMessage **)&m, &fr,
                            err);
        grpc_byte_buffer_destroy(bb);
        if (rc)
            break;
        if ((unsigned)m->tensor > 2)
            rc = zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", (int)m->tensor);
        if (!rc)
            rc = check_payload(&fr, m->count, ZS_DTYPE_F32, err);
        if (!rc)
            rc = zs_shard_check_range(sh, m->offset, m->count, err);
        if (!rc && limit == 0) {
            zs_shard_info_t in;
            if (zs_shard_info(sh, &in, err) == ZS_OK) {
                limit = 3 * (in.range_end - in.range_begin);
                free(in.checkpoints);
            }
        }
        if (!rc && total + m->count > limit)
            rc = zs_err_set(err, ZS_ERR_RANGE, "SetState stream larger than 3x the range");
        piece_t *p = NULL;
        uint64_t pbytes = sizeof *p + m->count * 4;
        if (!rc)
            rc = zs_budget_take(zs_shard_budget(sh), pbytes, "this SetState chunk (buffered)", err);
        if (!rc && !(p = malloc(pbytes))) {
            zs_budget_give(zs_shard_budget(sh), pbytes);
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        }
        if (!rc) {
            p->next = NULL;
            p->t = (zs_tensor_t)m->tensor;
            p->off = m->offset;
            p->count = m->count;
            zs_frame_copy(&fr, p->data);
            *tail = p;
            tail = &p->next;
            total += m->count;
        }
        zeroshard__state_chunk__free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
        if (rc)
            break;
    }
    zs_shard_count_bytes(sh, total * 4, 0);
    for (piece_t *p = head; p && !rc; p = p->next)
        rc = zs_shard_set_state(sh, p->t, p->off, p->count, p->data, err);
    while (head) {
        piece_t *n = head->next;
        zs_budget_give(zs_shard_budget(sh), sizeof *head + head->count * 4);
        free(head);
        head = n;
    }
    if (rc)
        return refuse(sh, rc);
    Zeroshard__StateReply r = ZEROSHARD__STATE_REPLY__INIT;
    r.elements = total;
    return zs_scall_finish(call, zs_msg_build(&r.base), ZS_OK, "");
}

/* ---- checkpoints ----------------------------------------------------------- */

static grpc_byte_buffer *list_msg(zs_shard_t *sh, int which, double seconds, uint64_t step,
                                  zs_err_t *err)
{
    uint64_t *steps;
    size_t n;
    if (zs_shard_list(sh, &steps, &n, err))
        return NULL;
    grpc_byte_buffer *bb;
    if (which == 0) {
        Zeroshard__ListReply r = ZEROSHARD__LIST_REPLY__INIT;
        r.n_checkpoints = n;
        r.checkpoints = steps;
        bb = zs_msg_build(&r.base);
    } else if (which == 1) {
        Zeroshard__DeleteReply r = ZEROSHARD__DELETE_REPLY__INIT;
        r.n_checkpoints = n;
        r.checkpoints = steps;
        bb = zs_msg_build(&r.base);
    } else {
        Zeroshard__CheckpointReply r = ZEROSHARD__CHECKPOINT_REPLY__INIT;
        r.step = step;
        r.seconds = seconds;
        r.n_checkpoints = n;
        r.checkpoints = steps;
        bb = zs_msg_build(&r.base);
    }
    free(steps);
    return bb;
}

static int h_checkpoint(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__CheckpointRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__checkpoint_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    uint64_t step = q->step;
    uint32_t keep = q->keep;
    double sec;
    if (keep > 1000000)
        rc = zs_err_set(err, ZS_ERR_INVALID, "keep %u is not sensible", keep);
    else
        rc = zs_shard_checkpoint_meta(sh, step, (int)keep, q->user_meta.data, q->user_meta.len,
                                      &sec, err);
    zeroshard__checkpoint_request__free_unpacked(q, NULL);
    if (rc)
        return refuse(sh, rc);
    grpc_byte_buffer *bb = list_msg(sh, 2, sec, step, err);
    return bb ? zs_scall_finish(call, bb, ZS_OK, "") : refuse(sh, err->code);
}

static int h_list(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__ListRequest *q; /* empty, but it must be one */
    int rc = zs_msg_parse(call->request, &zeroshard__list_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    zeroshard__list_request__free_unpacked(q, NULL);
    grpc_byte_buffer *bb = list_msg(sh, 0, 0, 0, err);
    return bb ? zs_scall_finish(call, bb, ZS_OK, "") : refuse(sh, err->code);
}

static int h_restore(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__RestoreRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__restore_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    uint64_t step = q->step;
    zeroshard__restore_request__free_unpacked(q, NULL);
    rc = zs_shard_restore(sh, step, err);
    if (rc)
        return refuse(sh, rc);
    zs_shard_info_t in;
    rc = zs_shard_info(sh, &in, err);
    if (rc)
        return refuse(sh, rc);
    free(in.checkpoints);
    Zeroshard__RestoreReply r = ZEROSHARD__RESTORE_REPLY__INIT;
    r.applied_step = in.applied_step;
    r.optimizer_step = in.optimizer_step;
    size_t ulen = zs_shard_user_meta(sh, NULL, 0);
    unsigned char *um = ulen ? malloc(ulen) : NULL;
    if (um) {
        r.user_meta.len = zs_shard_user_meta(sh, um, ulen) < ulen ? 0 : ulen;
        r.user_meta.data = um;
    }
    rc = zs_scall_finish(call, zs_msg_build(&r.base), ZS_OK, "");
    free(um);
    return rc;
}

static int h_set_step(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__SetStepRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__set_step_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    uint64_t step = q->step, ostep = q->optimizer_step;
    zeroshard__set_step_request__free_unpacked(q, NULL);
    rc = zs_shard_set_step(sh, step, ostep, err);
    if (rc)
        return refuse(sh, rc);
    Zeroshard__CommitReply r = ZEROSHARD__COMMIT_REPLY__INIT;
    r.applied_step = step;
    r.optimizer_step = ostep;
    return zs_scall_finish(call, zs_msg_build(&r.base), ZS_OK, "");
}

static int h_delete(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__DeleteRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__delete_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    uint64_t step = q->step;
    uint32_t keep = q->keep;
    zeroshard__delete_request__free_unpacked(q, NULL);
    if (keep > 1000000)
        return refuse(sh, zs_err_set(err, ZS_ERR_INVALID, "keep %u is not sensible", keep));
    rc = zs_shard_delete(sh, step, (int)keep, err);
    if (rc)
        return refuse(sh, rc);
    grpc_byte_buffer *bb = list_msg(sh, 1, 0, 0, err);
    return bb ? zs_scall_finish(call, bb, ZS_OK, "") : refuse(sh, err->code);
}

/* GetCheckpointMeta: the stored metadata, re-packed after it parsed (the
 * store's blob is a CheckpointMeta). Reads the store only. */
static int h_checkpoint_meta(void *ctx, zs_scall_t *call, zs_err_t *err)
{
    zs_shard_t *sh = ctx;
    Zeroshard__CheckpointMetaRequest *q;
    int rc = zs_msg_parse(call->request, &zeroshard__checkpoint_meta_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return refuse(sh, rc);
    uint64_t step = q->step;
    zeroshard__checkpoint_meta_request__free_unpacked(q, NULL);
    void *blob;
    size_t len;
    rc = zs_shard_checkpoint_meta_get(sh, step, &blob, &len, err);
    if (rc)
        return refuse(sh, rc);
    Zeroshard__CheckpointMeta *m = zeroshard__checkpoint_meta__unpack(NULL, len, blob);
    free(blob);
    if (!m)
        return refuse(sh, zs_err_set(err, ZS_ERR_CORRUPT, "checkpoint %llu: unreadable metadata",
                                     (unsigned long long)step));
    grpc_byte_buffer *bb = zs_msg_build(&m->base);
    zeroshard__checkpoint_meta__free_unpacked(m, NULL);
    if (!bb)
        return refuse(sh, zs_err_set(err, ZS_ERR_NOMEM, "out of memory"));
    return zs_scall_finish(call, bb, ZS_OK, "");
}

static const zs_rpc_method_t g_methods[] = {
    {"/zeroshard.Shard/Hello", ZS_RPC_UNARY, h_hello},
    {"/zeroshard.Shard/Initialize", ZS_RPC_CLIENT_STREAM, h_init},
    {"/zeroshard.Shard/Push", ZS_RPC_CLIENT_STREAM, h_push},
    {"/zeroshard.Shard/Commit", ZS_RPC_UNARY, h_commit},
    {"/zeroshard.Shard/Pull", ZS_RPC_SERVER_STREAM, h_pull},
    {"/zeroshard.Shard/Checkpoint", ZS_RPC_UNARY, h_checkpoint},
    {"/zeroshard.Shard/ListCheckpoints", ZS_RPC_UNARY, h_list},
    {"/zeroshard.Shard/Restore", ZS_RPC_UNARY, h_restore},
    {"/zeroshard.Shard/DeleteCheckpoints", ZS_RPC_UNARY, h_delete},
    {"/zeroshard.Shard/GetState", ZS_RPC_SERVER_STREAM, h_get_state},
    {"/zeroshard.Shard/SetState", ZS_RPC_CLIENT_STREAM, h_set_state},
    {"/zeroshard.Shard/SetStep", ZS_RPC_UNARY, h_set_step},
    {"/zeroshard.Shard/GetCheckpointMeta", ZS_RPC_UNARY, h_checkpoint_meta},
};

const zs_rpc_method_t *zs_service_methods(int *n)
{
    *n = (int)(sizeof g_methods / sizeof g_methods[0]);
    return g_methods;
}
