/*
 * zs_rpc_server.c - a threaded gRPC core server: one dispatcher thread, one
 * handler thread per call (see zs_rpc.h).
 *
 * Threading model:
 *  - The dispatcher polls the server's notification queue (a NEXT queue).
 *    For every registered method it keeps SLOTS_PER_METHOD requests
 *    outstanding; when one is matched with an incoming call it re-requests
 *    and starts a handler thread for the call.
 *  - A handler thread owns its call outright: every operation goes through
 *    the call's private pluck queue, so no locking is needed per call.
 *  - At most max_calls handlers run at once; a call beyond that is refused
 *    at once with RESOURCE_EXHAUSTED.
 *  - One generic request is kept outstanding too: a call to a method that is
 *    not registered is answered UNIMPLEMENTED at once (gRPC core would
 *    otherwise leave it unanswered until the client's deadline).
 *  - Every method is registered without payload pre-reading: the handler
 *    thread checks the bearer token (if configured) from the call's
 *    metadata first, in constant time, and only then receives the request
 *    message of a unary or server-streaming call. A caller without the token
 *    never makes the server read a message body.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>

#include "zs_log.h"
#include "zs_rpc.h"

#define SLOTS_PER_METHOD 4
#define SHUTDOWN_TAG     ((void *)(intptr_t)-1)

enum { TAG_OP = 1, TAG_CLOSE };

struct zs_rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq; /* notification queue (NEXT) */
    const zs_rpc_method_t *methods;
    int nmethods;
    void **handles; /* registered method handles */
    void *ctx;
    char *auth; /* "Bearer <token>", or NULL: no token required */
    size_t auth_len;
    int port;
    int max_calls;
    uint32_t version; /* the protocol version UNIMPLEMENTED names */
    pthread_t dispatcher;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int active;                 /* running handler threads */
    _Atomic uint64_t *answered; /* (nmethods + 1) x ZS_RPC_NCODES, see zs_rpc_server_answered */
    int shutting_down;
    int shutdown_seen;
};

typedef struct slot {
    zs_rpc_server_t *srv;
    zs_scall_t call;
    int generic;               /* an unregistered method */
    grpc_call_details details; /* generic calls only */
} slot_t;

static int run_batch(zs_scall_t *c, const grpc_op *ops, size_t n)
{
    zs_err_t err;
    if (ZS_GRPC_CHECK(grpc_call_start_batch(c->call, ops, n, (void *)(intptr_t)TAG_OP, NULL),
                      &err)) {
        ZS_ERROR("%s", err.msg);
        return 0;
    }
    grpc_event ev = grpc_completion_queue_pluck(c->cq, (void *)(intptr_t)TAG_OP,
                                                gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int zs_scall_recv(zs_scall_t *c, grpc_byte_buffer **bb, zs_err_t *err)
{
    *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = bb;
    if (!run_batch(c, &op, 1)) {
        if (*bb) {
            grpc_byte_buffer_destroy(*bb);
            *bb = NULL;
        }
        return zs_err_set(err, ZS_ERR_CANCELLED, "call cancelled by the client");
    }
    return ZS_OK;
}

int zs_scall_send(zs_scall_t *c, grpc_byte_buffer *bb, zs_err_t *err)
{
    if (!bb)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory building a reply");
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->sent_initial_md) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->sent_initial_md = 1;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    int ok = run_batch(c, ops, n);
    grpc_byte_buffer_destroy(bb);
    return ok ? ZS_OK : zs_err_set(err, ZS_ERR_CANCELLED, "call cancelled by the client");
}

int zs_scall_cancelled(zs_scall_t *c)
{
    if (c->finished)
        return 0;
    if (!c->close_armed) {
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        op.data.recv_close_on_server.cancelled = &c->close_cancelled;
        zs_err_t err;
        if (ZS_GRPC_CHECK(grpc_call_start_batch(c->call, &op, 1, (void *)(intptr_t)TAG_CLOSE, NULL),
                          &err)) {
            ZS_ERROR("%s", err.msg);
            return 0;
        }
        c->close_armed = 1;
    }
    if (!c->close_done) {
        grpc_event ev = grpc_completion_queue_pluck(c->cq, (void *)(intptr_t)TAG_CLOSE,
                                                    gpr_inf_past(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            c->close_done = 1;
    }
    /* Closed before we sent a status: only the client's side can have done it. */
    return c->close_done;
}

int zs_scall_finish(zs_scall_t *c, grpc_byte_buffer *reply, int code, const char *msg)
{
    if (c->finished) {
        if (reply)
            grpc_byte_buffer_destroy(reply);
        return ZS_OK;
    }
    c->finished = 1;
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    int cancelled = 0;
    if (!c->sent_initial_md) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->sent_initial_md = 1;
    }
    if (reply && code == ZS_OK) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = reply;
    }
    grpc_slice details = grpc_slice_from_copied_string(msg ? msg : "");
    int gcode = zs_status_to_grpc(code);
    if (c->answered && gcode >= 0 && gcode < ZS_RPC_NCODES)
        atomic_fetch_add_explicit(&c->answered[gcode], 1, memory_order_relaxed);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)gcode;
    ops[n++].data.send_status_from_server.status_details = &details;
    if (!c->close_armed) { /* one RECV_CLOSE_ON_SERVER per call */
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n++].data.recv_close_on_server.cancelled = &cancelled;
    }
    int ok = run_batch(c, ops, n);
    if (c->close_armed && !c->close_done) { /* completes now that the status is out */
        grpc_completion_queue_pluck(c->cq, (void *)(intptr_t)TAG_CLOSE,
                                    gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        c->close_done = 1;
    }
    grpc_slice_unref(details);
    if (reply)
        grpc_byte_buffer_destroy(reply);
    return ok ? ZS_OK : ZS_ERR_CANCELLED;
}

/* ---- dispatcher ------------------------------------------------------- */

static void slot_free(slot_t *s)
{
    if (s->call.call)
        grpc_call_unref(s->call.call);
    if (s->call.request)
        grpc_byte_buffer_destroy(s->call.request);
    grpc_metadata_array_destroy(&s->call.request_md);
    if (s->generic)
        grpc_call_details_destroy(&s->details);
    grpc_completion_queue_shutdown(s->call.cq);
    grpc_completion_queue_destroy(s->call.cq);
    free(s);
}

static int request_slot(zs_rpc_server_t *srv, int m)
{
    slot_t *s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    s->srv = srv;
    s->call.method = m;
    s->call.answered = srv->answered + (size_t)m * ZS_RPC_NCODES;
    s->call.cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_metadata_array_init(&s->call.request_md);
    grpc_call_error e = grpc_server_request_registered_call(
        srv->server, srv->handles[m], &s->call.call, &s->call.deadline, &s->call.request_md, NULL,
        s->call.cq, srv->cq, s);
    if (e != GRPC_CALL_OK) {
        ZS_ERROR("grpc_server_request_registered_call(%s): %s", srv->methods[m].path,
                 grpc_call_error_to_string(e));
        slot_free(s);
        return -1;
    }
    return 0;
}

/* Keep one request outstanding for calls to unregistered methods. */
static int request_generic(zs_rpc_server_t *srv)
{
    slot_t *s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    s->srv = srv;
    s->generic = 1;
    s->call.method = -1;
    s->call.answered = srv->answered + (size_t)srv->nmethods * ZS_RPC_NCODES;
    s->call.cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_metadata_array_init(&s->call.request_md);
    grpc_call_details_init(&s->details);
    grpc_call_error e = grpc_server_request_call(srv->server, &s->call.call, &s->details,
                                                 &s->call.request_md, s->call.cq, srv->cq, s);
    if (e != GRPC_CALL_OK) {
        ZS_ERROR("grpc_server_request_call: %s", grpc_call_error_to_string(e));
        slot_free(s);
        return -1;
    }
    return 0;
}

/* See zs_rpc.h. Every byte of `want` is compared whatever `got` holds: the
 * time depends on want_len only, never on where a guess goes wrong. */
int zs__ct_equal(const void *want, size_t want_len, const void *got, size_t got_len)
{
    const volatile unsigned char *w = want, *g = got;
    unsigned diff = want_len != got_len;
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned)(w[i] ^ (i < got_len ? g[i] : (unsigned char)~w[i]));
    return diff == 0;
}

/* The first `authorization` header must be "Bearer <token>" (srv->auth). */
static int token_ok(zs_rpc_server_t *srv, const grpc_metadata_array *md)
{
    if (!srv->auth)
        return 1;
    for (size_t i = 0; i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        if (!grpc_slice_str_cmp(m->key, "authorization"))
            return zs__ct_equal(srv->auth, srv->auth_len, GRPC_SLICE_START_PTR(m->value),
                                GRPC_SLICE_LENGTH(m->value));
    }
    return 0;
}

static void *handler_main(void *arg)
{
    slot_t *s = arg;
    zs_rpc_server_t *srv = s->srv;
    zs_err_t err;
    zs_err_clear(&err);
    char *peer = grpc_call_get_peer(s->call.call);
    snprintf(s->call.peer, sizeof s->call.peer, "%s", peer ? peer : "?");
    gpr_free(peer);
    int rc = ZS_OK;
    if (!token_ok(srv, &s->call.request_md))
        rc = zs_err_set(&err, ZS_ERR_UNAUTH, "missing or wrong bearer token");
    else if (srv->methods[s->call.method].kind != ZS_RPC_CLIENT_STREAM)
        rc = zs_scall_recv(&s->call, &s->call.request, &err); /* NULL if none was sent */
    if (rc == ZS_OK)
        rc = srv->methods[s->call.method].fn(srv->ctx, &s->call, &err);
    if (rc != ZS_OK && rc != ZS_ERR_CANCELLED)
        ZS_WARN("refused %s from %s: %s (%s)", srv->methods[s->call.method].path, s->call.peer,
                err.msg, zs_status_name(rc));
    zs_scall_finish(&s->call, NULL, rc, err.msg);
    slot_free(s);
    pthread_mutex_lock(&srv->mu);
    srv->active--;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

static void *dispatcher_main(void *arg)
{
    zs_rpc_server_t *srv = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == SHUTDOWN_TAG) {
            pthread_mutex_lock(&srv->mu);
            srv->shutdown_seen = 1;
            pthread_cond_broadcast(&srv->cv);
            pthread_mutex_unlock(&srv->mu);
            continue;
        }
        slot_t *s = ev.tag;
        if (!ev.success) { /* request cancelled by shutdown */
            slot_free(s);
            continue;
        }
        if (s->generic) {
            char msg[300];
            snprintf(msg, sizeof msg, "unknown method %.*s (protocol version %u)",
                     (int)GRPC_SLICE_LENGTH(s->details.method),
                     (const char *)GRPC_SLICE_START_PTR(s->details.method), srv->version);
            pthread_mutex_lock(&srv->mu);
            int stopping = srv->shutting_down;
            pthread_mutex_unlock(&srv->mu);
            if (!stopping)
                request_generic(srv);
            /* The token first: the docs promise every call needs it, so a
             * caller without it learns nothing, not even which methods or
             * protocol version we speak. */
            int code = ZS_ERR_UNIMPLEMENTED;
            if (!token_ok(srv, &s->call.request_md)) {
                code = ZS_ERR_UNAUTH;
                snprintf(msg, sizeof msg, "missing or wrong bearer token");
            }
            ZS_WARN("refused: %s", msg);
            zs_scall_finish(&s->call, NULL, code, msg);
            slot_free(s);
            continue;
        }
        pthread_mutex_lock(&srv->mu);
        int stopping = srv->shutting_down;
        int over = srv->active >= srv->max_calls;
        if (!over && !stopping)
            srv->active++;
        pthread_mutex_unlock(&srv->mu);
        if (!stopping)
            request_slot(srv, s->call.method);
        if (over || stopping) {
            zs_scall_finish(&s->call, NULL, over ? ZS_ERR_BUSY : ZS_ERR_CANCELLED,
                            over ? "server busy: too many concurrent calls" : "shutting down");
            slot_free(s);
            continue;
        }
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, handler_main, s) != 0) {
            zs_scall_finish(&s->call, NULL, ZS_ERR_BUSY, "server cannot start a thread");
            slot_free(s);
            pthread_mutex_lock(&srv->mu);
            srv->active--;
            pthread_mutex_unlock(&srv->mu);
        }
        pthread_attr_destroy(&attr);
    }
    return NULL;
}

int zs_rpc_server_create(const zs_rpc_server_opts_t *opts, const zs_rpc_method_t *methods,
                         int nmethods, void *ctx, zs_rpc_server_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_rpc_server_t *srv = calloc(1, sizeof *srv);
    if (!srv)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    srv->methods = methods;
    srv->nmethods = nmethods;
    srv->ctx = ctx;
    srv->max_calls = opts->max_calls > 0 ? opts->max_calls : 64;
    srv->version = opts->protocol_version ? opts->protocol_version : ZS_PROTOCOL_VERSION;
    if (opts->token && opts->token[0]) {
        srv->auth_len = 7 + strlen(opts->token);
        srv->auth = malloc(srv->auth_len + 1);
        if (!srv->auth) { /* never serve without the token that was asked for */
            free(srv);
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        }
        snprintf(srv->auth, srv->auth_len + 1, "Bearer %s", opts->token);
    }
    srv->handles = calloc((size_t)nmethods, sizeof *srv->handles);
    srv->answered = calloc((size_t)(nmethods + 1) * ZS_RPC_NCODES, sizeof *srv->answered);
    if (!srv->handles || !srv->answered) {
        free(srv->handles);
        free(srv->answered);
        free(srv->auth);
        free(srv);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);

    grpc_arg args[1];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)ZS_RPC_MAX_MESSAGE;
    grpc_channel_args ca = {1, args};
    srv->server = grpc_server_create(&ca, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    /* No payload pre-reading: the token is checked before any body is read. */
    for (int m = 0; m < nmethods; m++)
        srv->handles[m] = grpc_server_register_method(srv->server, methods[m].path, NULL,
                                                      GRPC_SRM_PAYLOAD_NONE, 0);
    grpc_server_credentials *cr;
    if (opts->tls_cert_pem) {
        grpc_ssl_pem_key_cert_pair pair = {opts->tls_key_pem, opts->tls_cert_pem};
        cr = grpc_ssl_server_credentials_create_ex(NULL, &pair, 1,
                                                   GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
    } else {
        cr = grpc_insecure_server_credentials_create();
    }
    srv->port = grpc_server_add_http2_port(srv->server, opts->listen, cr);
    grpc_server_credentials_release(cr);
    if (srv->port <= 0) {
        int rc = zs_err_set(err, ZS_ERR_UNAVAILABLE,
                            "cannot listen on %s (address in use or not local?)", opts->listen);
        grpc_server_destroy(srv->server);
        grpc_completion_queue_shutdown(srv->cq);
        while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(srv->cq);
        free(srv->handles);
        free(srv->answered);
        free(srv->auth);
        free(srv);
        return rc;
    }
    grpc_server_start(srv->server);
    for (int m = 0; m < nmethods; m++)
        for (int k = 0; k < SLOTS_PER_METHOD; k++)
            request_slot(srv, m);
    request_generic(srv);
    pthread_create(&srv->dispatcher, NULL, dispatcher_main, srv);
    *out = srv;
    return ZS_OK;
}

int zs_rpc_server_port(const zs_rpc_server_t *srv)
{
    return srv->port;
}

void zs_rpc_server_answered(zs_rpc_server_t *srv, uint64_t *out)
{
    for (size_t i = 0; i < (size_t)(srv->nmethods + 1) * ZS_RPC_NCODES; i++)
        out[i] = atomic_load_explicit(&srv->answered[i], memory_order_relaxed);
}

int zs_rpc_server_active(zs_rpc_server_t *srv)
{
    pthread_mutex_lock(&srv->mu);
    int n = srv->active;
    pthread_mutex_unlock(&srv->mu);
    return n;
}

void zs_rpc_server_destroy(zs_rpc_server_t *srv)
{
    if (!srv)
        return;
    pthread_mutex_lock(&srv->mu);
    srv->shutting_down = 1;
    pthread_mutex_unlock(&srv->mu);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, SHUTDOWN_TAG);
    grpc_server_cancel_all_calls(srv->server);
    pthread_mutex_lock(&srv->mu);
    while (!srv->shutdown_seen || srv->active > 0)
        pthread_cond_wait(&srv->cv, &srv->mu);
    pthread_mutex_unlock(&srv->mu);
    grpc_server_destroy(srv->server);
    grpc_completion_queue_shutdown(srv->cq);
    pthread_join(srv->dispatcher, NULL);
    grpc_completion_queue_destroy(srv->cq);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cv);
    free(srv->handles);
    free(srv->answered);
    free(srv->auth);
    free(srv);
}
