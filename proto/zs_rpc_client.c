/*
 * zs_rpc_client.c - blocking client calls over gRPC core (see zs_rpc.h).
 *
 * Each call has a private pluck completion queue. RECV_STATUS_ON_CLIENT is
 * armed at the start under its own tag, so a server that refuses a stream
 * half-way is reported with its own status and message instead of a bare
 * "send failed". RECV_INITIAL_METADATA is armed at the start too: measured
 * with gRPC 1.51, a client stream whose connection dies (server killed and
 * restarted) while it only has sends in flight is never failed and hangs
 * until its deadline; with a receive pending it fails at once with
 * UNAVAILABLE, which the shard client retries.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_rpc.h"

enum { TAG_START = 1, TAG_STATUS, TAG_SEND, TAG_RECV, TAG_CLOSE, TAG_INITMD };

int zs__grpc_check(grpc_call_error e, const char *what, const char *file, int line, zs_err_t *err)
{
    if (e == GRPC_CALL_OK)
        return ZS_OK;
    return zs_err_set(err, ZS_ERR_INTERNAL,
                      "gRPC %.60s at %s:%d: %s (hint: one batch per op type in flight, and "
                      "only on a live call)",
                      what, file, line, grpc_call_error_to_string(e));
}

gpr_timespec zs_deadline_ms(int64_t ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Wait for `tag` on the call's queue. gRPC 1.51 can leave a call's pick
 * queued on a channel that dropped to IDLE when the server went away (e.g.
 * restarted): nothing asks it to reconnect until the deadline. So we wait in
 * 250 ms slices and, between them, ask an IDLE channel to connect. */
static grpc_event pluck(zs_ccall_t *c, intptr_t tag)
{
    for (;;) {
        grpc_event ev = grpc_completion_queue_pluck(c->cq, (void *)tag, zs_deadline_ms(250), NULL);
        if (ev.type != GRPC_QUEUE_TIMEOUT)
            return ev;
        if (c->ch && grpc_channel_check_connectivity_state(c->ch, 0) == GRPC_CHANNEL_IDLE)
            grpc_channel_check_connectivity_state(c->ch, 1);
    }
}

/* Run one batch and wait for it: 1 when it completed successfully, 0 when
 * it completed unsuccessfully (the call ended), or a negative zs status with
 * err set when it could not start. */
static int run_batch(zs_ccall_t *c, const grpc_op *ops, size_t n, intptr_t tag, zs_err_t *err)
{
    int rc = ZS_GRPC_CHECK(grpc_call_start_batch(c->call, ops, n, (void *)tag, NULL), err);
    if (rc)
        return rc;
    grpc_event ev = pluck(c, tag);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static int status_to_err(zs_ccall_t *c, zs_err_t *err)
{
    if (c->status == GRPC_STATUS_OK)
        return ZS_OK;
    int code = zs_status_from_grpc((int)c->status);
    size_t dl = GRPC_SLICE_LENGTH(c->details);
    return zs_err_set(err, code, "%s: %.*s%s", c->peer ? c->peer : "server",
                      (int)(dl > 240 ? 240 : dl), (const char *)GRPC_SLICE_START_PTR(c->details),
                      c->status == GRPC_STATUS_DEADLINE_EXCEEDED ? " (deadline passed)" : "");
}

/* Pluck the armed status (blocking until the call ends). */
static int wait_status(zs_ccall_t *c, zs_err_t *err)
{
    if (c->status_pending) {
        pluck(c, TAG_STATUS);
        c->status_pending = 0;
    }
    return status_to_err(c, err);
}

/* Why the ops are bundled: every batch is a wait on the call's queue, and
 * each wait costs the calling thread a sleep and a wakeup by gRPC's poller.
 * The initial metadata therefore goes out with the first message (or the
 * half-close), and the half-close with the first receive: a client stream
 * of n messages waits n + 2 times instead of n + 4 (measured on the shm data
 * plane, whose Push and Pull carry no bytes: about 17 calls a step). */

/* The initial metadata op, added to the next batch while it is pending. */
static size_t add_initial_md(zs_ccall_t *c, grpc_op *ops)
{
    if (!c->md_pending)
        return 0;
    memset(ops, 0, sizeof *ops);
    ops->op = GRPC_OP_SEND_INITIAL_METADATA;
    ops->data.send_initial_metadata.count = (size_t)c->nmd;
    ops->data.send_initial_metadata.metadata = c->nmd ? &c->auth : NULL;
    return 1;
}

/* A batch that carried the initial metadata failed: the call never started
 * (server down, address wrong, refused at once). The server's status, or
 * ZS_ERR_UNAVAILABLE, with the hint the first batch of a call gets. */
static int start_failed(zs_ccall_t *c, zs_err_t *err)
{
    int rc = wait_status(c, err);
    if (rc == ZS_OK)
        rc = zs_err_set(err, ZS_ERR_UNAVAILABLE, "%s: call ended before it started", c->peer);
    if (rc == ZS_ERR_UNAVAILABLE)
        zs_err_prefix(err,
                      "unreachable (cannot start %s; server down or address wrong?): ", c->method);
    return rc;
}

int zs_ccall_start(zs_ccall_t *c, grpc_channel *ch, const char *method, const char *token,
                   int timeout_ms, const char *peer, zs_err_t *err)
{
    memset(c, 0, sizeof *c);
    c->peer = peer;
    c->method = method;
    c->ch = ch;
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_static_string(method);
    c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, m, NULL,
                                       zs_deadline_ms(timeout_ms), NULL);
    if (!c->call) {
        zs_ccall_destroy(c);
        return zs_err_set(err, ZS_ERR_INTERNAL, "%s: cannot create call %s", peer, method);
    }
    grpc_metadata_array_init(&c->initial_md);
    grpc_metadata_array_init(&c->trailing_md);
    c->details = grpc_empty_slice();
    if (token && token[0]) {
        char v[512];
        snprintf(v, sizeof v, "Bearer %s", token);
        c->auth.key = grpc_slice_from_static_string("authorization");
        c->auth.value = grpc_slice_from_copied_string(v);
        c->nmd = 1;
    }
    /* Arm the receives first: if the connection cannot be made, the status
     * then carries gRPC's reason (refused, TLS handshake...). */
    grpc_op st;
    memset(&st, 0, sizeof st);
    st.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    st.data.recv_status_on_client.trailing_metadata = &c->trailing_md;
    st.data.recv_status_on_client.status = &c->status;
    st.data.recv_status_on_client.status_details = &c->details;
    int rc = ZS_GRPC_CHECK(
        grpc_call_start_batch(c->call, &st, 1, (void *)(intptr_t)TAG_STATUS, NULL), err);
    if (rc) {
        zs_ccall_destroy(c);
        return rc;
    }
    c->status_pending = 1;
    grpc_op im;
    memset(&im, 0, sizeof im);
    im.op = GRPC_OP_RECV_INITIAL_METADATA;
    im.data.recv_initial_metadata.recv_initial_metadata = &c->initial_md;
    rc = ZS_GRPC_CHECK(grpc_call_start_batch(c->call, &im, 1, (void *)(intptr_t)TAG_INITMD, NULL),
                       err);
    if (rc) {
        zs_ccall_destroy(c);
        return rc;
    }
    c->initmd_pending = 1;
    c->md_pending = 1; /* sent with the first batch */
    return ZS_OK;
}

int zs_ccall_send(zs_ccall_t *c, grpc_byte_buffer *bb, zs_err_t *err)
{
    if (!bb)
        return zs_err_set(err, ZS_ERR_NOMEM, "%s: out of memory building a message", c->peer);
    grpc_op ops[2];
    size_t n = add_initial_md(c, ops);
    int first = n == 1;
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    int ok = run_batch(c, ops, n + 1, TAG_SEND, err);
    c->md_pending = 0;
    grpc_byte_buffer_destroy(bb);
    if (ok == 1)
        return ZS_OK;
    if (ok < 0)
        return ok;
    if (first)
        return start_failed(c, err);
    /* The server ended the call (refusal) or the connection broke. */
    int rc = wait_status(c, err);
    if (rc == ZS_OK)
        rc = zs_err_set(err, ZS_ERR_INTERNAL, "%s: server closed the stream early", c->peer);
    return rc;
}

/* Half-close, with the initial metadata if still pending: ZS_OK, or the
 * call's status (it ended: refused, unreachable, broken) in err. */
static int half_close(zs_ccall_t *c, zs_err_t *err)
{
    if (c->closed)
        return ZS_OK;
    c->closed = 1;
    grpc_op ops[2];
    size_t n = add_initial_md(c, ops);
    int first = n == 1;
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    int ok = run_batch(c, ops, n + 1, TAG_CLOSE, err);
    c->md_pending = 0;
    if (ok == 1)
        return ZS_OK;
    if (ok < 0)
        return ok;
    int rc = first ? start_failed(c, err) : wait_status(c, err);
    return rc ?: zs_err_set(err, ZS_ERR_UNAVAILABLE, "%s: stream broke", c->peer);
}

int zs_ccall_recv(zs_ccall_t *c, grpc_byte_buffer **bb, zs_err_t *err)
{
    *bb = NULL;
    grpc_op ops[3];
    size_t n = 0;
    int closing = !c->closed, first = 0;
    if (closing) { /* the half-close rides with the receive */
        n = add_initial_md(c, ops);
        first = n == 1;
        memset(&ops[n], 0, sizeof ops[n]);
        ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        c->closed = 1;
    }
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = bb;
    int ok = run_batch(c, ops, n + 1, TAG_RECV, err);
    c->md_pending = 0;
    if (ok == 1 && *bb)
        return ZS_OK;
    if (ok < 0)
        return ok;
    if (*bb) {
        grpc_byte_buffer_destroy(*bb);
        *bb = NULL;
    }
    if (ok == 0 && first)
        return start_failed(c, err);
    int rc = wait_status(c, err);
    if (ok == 0 && closing && rc == ZS_OK) /* the half-close failed: not an ordinary end */
        rc = zs_err_set(err, ZS_ERR_UNAVAILABLE, "%s: stream broke", c->peer);
    return rc;
}

int zs_ccall_finish(zs_ccall_t *c, zs_err_t *err)
{
    int rc = half_close(c, err); /* a failed one has reported the status */
    return rc ? rc : wait_status(c, err);
}

void zs_ccall_destroy(zs_ccall_t *c)
{
    if (c->call) {
        if (c->status_pending || c->initmd_pending)
            grpc_call_cancel(c->call, NULL);
        if (c->status_pending) {
            pluck(c, TAG_STATUS);
            c->status_pending = 0;
        }
        if (c->initmd_pending) {
            pluck(c, TAG_INITMD);
            c->initmd_pending = 0;
        }
        grpc_call_unref(c->call);
        c->call = NULL;
        grpc_metadata_array_destroy(&c->initial_md);
        grpc_metadata_array_destroy(&c->trailing_md);
        grpc_slice_unref(c->details);
        if (c->nmd) {
            grpc_slice_unref(c->auth.value);
            c->nmd = 0;
        }
    }
    if (c->cq) {
        grpc_completion_queue_shutdown(c->cq);
        grpc_completion_queue_destroy(c->cq);
        c->cq = NULL;
    }
}

int zs_unary(grpc_channel *ch, const char *method, const char *token, int timeout_ms,
             const char *peer, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply, zs_err_t *err)
{
    zs_ccall_t c;
    *reply = NULL;
    int rc = zs_ccall_start(&c, ch, method, token, timeout_ms, peer, err);
    if (rc)
        return rc;
    rc = zs_ccall_send(&c, zs_msg_build(req), err);
    grpc_byte_buffer *bb = NULL;
    if (rc == ZS_OK)
        rc = zs_ccall_recv(&c, &bb, err);
    if (rc == ZS_OK && !bb)
        rc = zs_err_set(err, ZS_ERR_INTERNAL, "%s: %s returned no reply", peer, method);
    if (rc == ZS_OK) {
        rc = zs_msg_parse(bb, reply_desc, reply, err);
        grpc_byte_buffer_destroy(bb);
        if (rc == ZS_OK)
            rc = zs_ccall_finish(&c, err);
        if (rc && *reply) {
            protobuf_c_message_free_unpacked(*reply, NULL);
            *reply = NULL;
        }
    }
    zs_ccall_destroy(&c);
    return rc;
}

grpc_channel *zs_channel_create(const char *target, const char *ca_pem)
{
    /* Reconnect quickly: a restarted shard server must be reachable within
     * the client's retry window (gRPC's default backoff grows to 120 s).
     * GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is gRPC's MIN_CONNECT_TIMEOUT, the
     * time one connection attempt is given (doc/connection-backoff.md): at
     * 100 ms a handshake with a busy server (8 concurrent 32 MiB uploads on
     * 2 cores) timed out again and again ("connection attempt timed out
     * before receiving SETTINGS frame"). A refused connection still fails at
     * once; the retries still start 100 ms apart. */
    static const struct {
        const char *key;
        int value;
    } kv[] = {
        {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)ZS_RPC_MAX_MESSAGE},
        {GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1},
        {GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100},
        {GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000},
        {GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000},
    };
    grpc_arg args[5];
    memset(args, 0, sizeof args);
    for (int i = 0; i < 5; i++) {
        args[i].type = GRPC_ARG_INTEGER;
        args[i].key = (char *)kv[i].key;
        args[i].value.integer = kv[i].value;
    }
    grpc_channel_args ca = {5, args};
    grpc_channel_credentials *cr = ca_pem ? grpc_ssl_credentials_create(ca_pem, NULL, NULL, NULL)
                                          : grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, cr, &ca);
    grpc_channel_credentials_release(cr);
    return ch;
}
