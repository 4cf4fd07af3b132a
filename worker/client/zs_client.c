/*
 * zs_client.c - shard client over gRPC core (see zs_client.h).
 *
 * Per operation: one thread per involved server runs `attempt()` up to
 * 1 + retries times while the result is UNAVAILABLE, sleeping 100 ms, 200
 * ms, ... (capped at 2 s) between attempts. Bulk data is framed with
 * zs_frame_build over the caller's memory (no copy on send) and copied once
 * on receive, or, to a server sharing the worker's staging segment, named
 * by a ShmRef instead (zs_client_shm.c: no copy at all).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_client_internal.h"
#include "zs_layout.h"
#include "zs_log.h"
#include "zs_pbconv.h"
#include "zs_rpc.h"

#define MAX_ADDR ZS__CLIENT_MAX_ADDR

#define M(name) "/zeroshard.Shard/" name

/* ---- parallel fan-out with retries ------------------------------------- */

typedef int (*attempt_fn)(zs_client_t *c, int server, void *arg, zs_err_t *err);

typedef struct {
    zs_client_t *c;
    int server;
    attempt_fn fn;
    void *arg;
    int rc;
    zs_err_t err;
    pthread_t th;
} job_t;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *job_main(void *p)
{
    job_t *j = p;
    int backoff = 100;
    for (int a = 0;; a++) {
        zs_err_clear(&j->err);
        j->rc = j->fn(j->c, j->server, j->arg, &j->err);
        if (j->rc != ZS_ERR_UNAVAILABLE)
            break;
        if (a >= j->c->retries) {
            if (a > 0)
                zs_err_prefix(&j->err, "after %d attempts: ", a + 1);
            break;
        }
        sleep_ms(backoff);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    return NULL;
}

/* Run fn on servers [first, last] in parallel (args[i - first] is each one's
 * argument, or `shared` for all). Returns the first error, in server order. */
static int fan_out(zs_client_t *c, int first, int last, attempt_fn fn, void **args, void *shared,
                   zs_err_t *err)
{
    int n = last - first + 1;
    if (n <= 0)
        return ZS_OK;
    job_t *jobs = calloc((size_t)n, sizeof *jobs);
    if (!jobs)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        jobs[i] = (job_t){c, first + i, fn, args ? args[i] : shared, 0, {0, ""}, 0};
        if (n == 1 || pthread_create(&jobs[i].th, NULL, job_main, &jobs[i]) != 0) {
            job_main(&jobs[i]);
            jobs[i].th = 0;
        }
    }
    int rc = ZS_OK;
    for (int i = 0; i < n; i++) {
        if (jobs[i].th)
            pthread_join(jobs[i].th, NULL);
        if (jobs[i].rc && !rc) {
            rc = jobs[i].rc;
            if (err)
                *err = jobs[i].err;
        }
    }
    free(jobs);
    return rc;
}

int zs__client_fan_out(zs_client_t *c, int first, int last, zs__client_attempt_fn fn, void **args,
                       void *shared, zs_err_t *err)
{
    return fan_out(c, first, last, fn, args, shared, err);
}

/* ---- lifecycle ------------------------------------------------------------- */

int zs_client_create(const zs_client_opts_t *o, zs_client_t **out, zs_err_t *err)
{
    *out = NULL;
    if (!o->servers || !o->servers[0])
        return zs_err_set(err, ZS_ERR_INVALID, "no servers given (expected host:port,...)");
    zs_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    int n = 1;
    for (const char *p = o->servers; *p; p++)
        n += *p == ',';
    if (n > ZS_MAX_SERVERS) {
        free(c);
        return zs_err_set(err, ZS_ERR_INVALID, "%d servers: at most %d", n, ZS_MAX_SERVERS);
    }
    c->addr = calloc((size_t)n, sizeof *c->addr);
    c->ch = calloc((size_t)n, sizeof *c->ch);
    c->ver = calloc((size_t)n, sizeof *c->ver);
    if (!c->addr || !c->ch || !c->ver) {
        free(c->addr);
        free(c->ch);
        free(c->ver);
        free(c);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    const char *p = o->servers;
    for (int i = 0; i < n; i++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= MAX_ADDR || !memchr(p, ':', len)) {
            int rc = zs_err_set(err, ZS_ERR_INVALID, "bad server address '%.*s' (want host:port)",
                                (int)(len > 64 ? 64 : len), p);
            free(c->addr);
            free(c->ch);
            free(c->ver);
            free(c);
            return rc;
        }
        memcpy(c->addr[i], p, len);
        p = e ? e + 1 : p + len;
    }
    grpc_init();
    c->n = n;
    for (int i = 0; i < n; i++)
        c->ch[i] = zs_channel_create(c->addr[i], o->tls_ca_pem);
    c->token = o->token ? strdup(o->token) : NULL;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 120000;
    c->retries = o->retries > 0 ? o->retries : (o->retries == 0 ? 8 : 0);
    c->require_nvme = o->require_nvme;
    int rc = zs__client_shm_init(c, o, err);
    if (rc) {
        zs_client_destroy(c);
        return rc;
    }
    *out = c;
    return ZS_OK;
}

void zs_client_destroy(zs_client_t *c)
{
    if (!c)
        return;
    zs__client_shm_free(c);
    for (int i = 0; i < c->n; i++)
        grpc_channel_destroy(c->ch[i]);
    free(c->ch);
    free(c->addr);
    free(c->ver);
    free(c->token);
    free(c->groups);
    zs_pb_groups_free(c->pb_groups);
    free(c);
    grpc_shutdown();
}

int zs_client_nservers(const zs_client_t *c)
{
    return c->n;
}

uint64_t zs_client_num_params(const zs_client_t *c)
{
    return c->P;
}

const char *zs_client_server(const zs_client_t *c, int i)
{
    return i >= 0 && i < c->n ? c->addr[i] : "?";
}

static uint64_t srv_begin(const zs_client_t *c, int i)
{
    return zs_layout_begin(c->P, (uint32_t)c->n, (uint32_t)i);
}

uint64_t zs__client_srv_begin(const zs_client_t *c, int i)
{
    return srv_begin(c, i);
}

/* Servers owning [b, e): first..last. Requires P known and b < e <= P. */
static int owners(const zs_client_t *c, uint64_t b, uint64_t e, int *first, int *last,
                  zs_err_t *err)
{
    if (c->P == 0)
        return zs_err_set(err, ZS_ERR_STATE, "model size unknown: call zs_client_hello or init");
    if (b >= e || e > c->P)
        return zs_err_set(err, ZS_ERR_RANGE, "range [%llu, %llu) outside [0, %llu)",
                          (unsigned long long)b, (unsigned long long)e, (unsigned long long)c->P);
    *first = (int)zs_layout_owner(c->P, (uint32_t)c->n, b);
    *last = (int)zs_layout_owner(c->P, (uint32_t)c->n, e - 1);
    return ZS_OK;
}

int zs__client_owners(const zs_client_t *c, uint64_t b, uint64_t e, int *first, int *last,
                      zs_err_t *err)
{
    return owners(c, b, e, first, last, err);
}

/* ---- Hello ------------------------------------------------------------------ */

typedef struct {
    const char *model;
    uint64_t P;
    zs_server_info_t *info;
} hello_arg_t;

static void info_from_pb(const Zeroshard__HelloReply *r, zs_server_info_t *in)
{
    memset(in, 0, sizeof *in);
    in->initialized = r->initialized;
    snprintf(in->model_name, sizeof in->model_name, "%s", r->model_name ? r->model_name : "");
    in->num_params = r->num_params;
    in->num_servers = r->num_servers;
    in->server_index = r->server_index;
    in->range_begin = r->range_begin;
    in->range_end = r->range_end;
    in->applied_step = r->applied_step;
    in->optimizer_step = r->optimizer_step;
    size_t k = r->n_checkpoints, skip = k > ZS_CLIENT_MAX_CKPTS ? k - ZS_CLIENT_MAX_CKPTS : 0;
    for (size_t i = skip; i < k; i++)
        in->checkpoints[in->ncheckpoints++] = r->checkpoints[i];
    if (r->adam)
        zs_pb_adam_get(r->adam, &in->adam);
    if (r->counters) {
        in->bytes_in = r->counters->bytes_in;
        in->bytes_out = r->counters->bytes_out;
        in->steps_applied = r->counters->steps_applied;
        in->steps_skipped = r->counters->steps_skipped;
        in->refused = r->counters->refused;
        in->optimizer_gbps = r->counters->optimizer_gbps;
        in->last_step_ms = r->counters->last_step_ms;
        in->checkpoint_gbps = r->counters->checkpoint_gbps;
        in->rss_bytes = r->counters->rss_bytes;
        in->heap_in_use = r->counters->heap_in_use;
        in->heap_free = r->counters->heap_free;
        in->spec_hits = r->counters->spec_hits;
        in->spec_rollbacks = r->counters->spec_rollbacks;
        in->spec_elements = r->counters->spec_elements;
    }
    in->store_degraded = r->store_degraded;
    snprintf(in->store_error, sizeof in->store_error, "%s", r->store_error ? r->store_error : "");
    in->mem_budget = r->mem_budget;
    in->mem_reserved = r->mem_reserved;
    snprintf(in->shm_socket, sizeof in->shm_socket, "%s", r->shm_socket ? r->shm_socket : "");
    in->nvme = r->nvme;
    if (zs_pb_groups_get(r->groups, r->n_groups, in->groups, NULL) == ZS_OK)
        in->ngroups = r->n_groups; /* more than a server keeps: reported as none */
}

/* Hello to server i stating our version; the reply's info into *in and the
 * version it answered into c->ver[i] (the lower of ours and its own). A
 * server from before negotiation (version 1 as released) refuses any
 * version but its own with "protocol version 2 not supported (server speaks
 * 1)": asked again without a version (0, which every version answers), its
 * reply says which it speaks. A server that answers that way with a version
 * not below ours cannot serve this client: its refusal stands. */
static int hello_call(zs_client_t *c, int i, const char *model, uint64_t P, zs_server_info_t *in,
                      zs_err_t *err)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    q.model_name = (char *)(model ? model : "");
    q.num_params = P;
    q.shm_session = zs__client_shm_session(c); /* 0: no shared staging */
    Zeroshard__HelloReply *r;
    int rc = zs_unary(c->ch[i], M("Hello"), c->token, c->timeout_ms, c->addr[i], &q.base,
                      &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, err);
    zs_err_t refusal = {0, ""};
    if (rc == ZS_ERR_STATE && strstr(err->msg, " not supported (server speaks ")) {
        refusal = *err;
        q.protocol_version = 0;
        rc = zs_unary(c->ch[i], M("Hello"), c->token, c->timeout_ms, c->addr[i], &q.base,
                      &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, err);
    }
    if (rc)
        return rc;
    uint32_t v = r->protocol_version;
    info_from_pb(r, in);
    char sock[sizeof in->shm_socket];
    snprintf(sock, sizeof sock, "%s", r->shm_socket ? r->shm_socket : "");
    int session_ok = r->shm_session_ok, nvme = r->nvme;
    uint32_t shm_chunk = r->shm_chunk_bytes;
    zeroshard__hello_reply__free_unpacked(r, NULL);
    if (refusal.code && v >= ZS_PROTOCOL_VERSION) {
        *err = refusal;
        return refusal.code;
    }
    if (c->require_nvme && !nvme) /* an old server leaves nvme unset: refused too */
        return zs_err_set(err, ZS_ERR_STATE,
                          "server %d (%s): offload_optimizer.device \"nvme\" asks for its NVMe "
                          "tier, but it keeps optimizer state in RAM (start it with --nvme-path "
                          "DIR)",
                          i, c->addr[i]);
    /* 0 is no version a server answers with; read it as the first one. */
    c->ver[i] = v == 0 ? 1 : v < ZS_PROTOCOL_VERSION ? v : ZS_PROTOCOL_VERSION;
    return zs__client_shm_hello(c, i, sock, session_ok, shm_chunk, err);
}

/* See zs_client_internal.h. */
int zs__client_negotiate(zs_client_t *c, int i, zs_err_t *err)
{
    zs_server_info_t tmp;
    return c->ver[i] ? ZS_OK : hello_call(c, i, NULL, 0, &tmp, err);
}

/* Once per client, after a Hello or Initialize of every server: warn when a
 * server negotiated a version below ours, saying what is off with it. Runs
 * on the caller's thread (the fan-out has ended), so `warned` needs no
 * lock. */
static void warn_older(zs_client_t *c)
{
    for (int i = 0; i < c->n && !c->warned; i++)
        if (c->ver[i] && c->ver[i] < ZS_PROTOCOL_VERSION) {
            c->warned = 1;
            ZS_WARN("%s speaks protocol version %u (this client %u): running without "
                    "speculative updates (super_offload) on it",
                    c->addr[i], c->ver[i], ZS_PROTOCOL_VERSION);
        }
}

uint32_t zs_client_protocol_version(const zs_client_t *c)
{
    uint32_t v = ZS_PROTOCOL_VERSION;
    for (int i = 0; i < c->n; i++)
        if (c->ver[i] && c->ver[i] < v)
            v = c->ver[i];
    return v;
}

int zs_client_speculates(const zs_client_t *c)
{
    return zs_client_protocol_version(c) >= ZS_PROTOCOL_V_SPECULATION;
}

static int hello_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    hello_arg_t *a = argp;
    zs_server_info_t tmp, *in = a->info ? &a->info[i] : &tmp;
    int rc = hello_call(c, i, a->model, a->P, in, err);
    if (rc)
        return rc;
    if (in->initialized && (in->num_servers != (uint32_t)c->n || in->server_index != (uint32_t)i))
        return zs_err_set(err, ZS_ERR_STATE,
                          "%s: is server %u of %u, but the client lists it as %d of %d (the "
                          "--servers order must match the layout)",
                          c->addr[i], in->server_index, in->num_servers, i, c->n);
    return ZS_OK;
}

int zs_client_hello(zs_client_t *c, const char *model, uint64_t P, zs_server_info_t *info,
                    zs_err_t *err)
{
    zs_server_info_t *tmp = info ? info : calloc((size_t)c->n, sizeof *tmp);
    if (!tmp)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    hello_arg_t a = {model, P, tmp};
    int rc = fan_out(c, 0, c->n - 1, hello_one, NULL, &a, err);
    warn_older(c);
    if (rc == ZS_OK && tmp[0].initialized) {
        for (int i = 1; i < c->n; i++)
            if (tmp[i].initialized && tmp[i].num_params != tmp[0].num_params)
                rc = zs_err_set(err, ZS_ERR_STATE,
                                "servers disagree on the model size: %s has %llu, %s has %llu",
                                c->addr[0], (unsigned long long)tmp[0].num_params, c->addr[i],
                                (unsigned long long)tmp[i].num_params);
        if (rc == ZS_OK)
            c->P = tmp[0].num_params;
    } else if (rc == ZS_OK && P) {
        c->P = P;
    }
    if (!info)
        free(tmp);
    return rc;
}

/* ---- Initialize ------------------------------------------------------------- */

/* ---- client streams of bulk chunks (Initialize, Push, SetState) ----------- */

typedef union {
    Zeroshard__InitChunk init;
    Zeroshard__PushChunk push;
    Zeroshard__StateChunk state;
} chunk_msg_t;

/* Build in *m the header of the chunk holding elements [off, off + k);
 * `first` marks the stream's first message. Returns &m->...base. */
typedef const ProtobufCMessage *(*chunk_fn)(const void *arg, chunk_msg_t *m, uint64_t off,
                                            uint64_t k, int first);

/* Stream elements [b, e) of esz bytes each, starting at src (element b), to
 * server i as `method` chunks of ZS_RPC_CHUNK_BYTES, then take the reply and
 * the status. With `always`, an empty range still sends one (empty) chunk. */
static int send_stream(zs_client_t *c, int i, const char *method, uint64_t b, uint64_t e,
                       size_t esz, const void *src, int always, chunk_fn fn, const void *arg,
                       zs_err_t *err)
{
    zs_ccall_t call;
    int rc = zs_ccall_start(&call, c->ch[i], method, c->token, c->timeout_ms, c->addr[i], err);
    if (rc)
        return rc;
    uint64_t per = ZS_RPC_CHUNK_BYTES / esz, off = b;
    for (int first = 1; !rc && (off < e || (first && always)); first = 0) {
        uint64_t k = e - off < per ? e - off : per;
        chunk_msg_t m;
        const ProtobufCMessage *meta = fn(arg, &m, off, k, first);
        const char *p = (const char *)src + (off - b) * esz;
        rc = zs_ccall_send(&call, zs_frame_build(meta, p, k * esz, NULL, NULL), err);
        off += k;
    }
    return zs__client_stream_end(&call, rc, err);
}

/* See zs_client_internal.h. */
int zs__client_stream_end(zs_ccall_t *call, int rc, zs_err_t *err)
{
    grpc_byte_buffer *bb = NULL;
    if (!rc)
        rc = zs_ccall_recv(call, &bb, err);
    if (bb)
        grpc_byte_buffer_destroy(bb);
    if (!rc)
        rc = zs_ccall_finish(call, err);
    zs_ccall_destroy(call);
    return rc;
}

/* [begin, end) clipped to server i's range into [*b, *e); 0 if empty. */
static int clip(const zs_client_t *c, int i, uint64_t begin, uint64_t end, uint64_t *b, uint64_t *e)
{
    *b = srv_begin(c, i);
    *e = srv_begin(c, i + 1);
    if (*b < begin)
        *b = begin;
    if (*e > end)
        *e = end;
    return *b < *e;
}

int zs__client_clip(const zs_client_t *c, int i, uint64_t begin, uint64_t end, uint64_t *b,
                    uint64_t *e)
{
    return clip(c, i, begin, end, b, e);
}

/* ---- Initialize -------------------------------------------------------------- */

/* See zs_client_internal.h. */
void zs__client_init_request(const zs_client_t *c, int i, const char *model,
                             const zs_adam_hparams_t *hp, uint64_t start_step, int overwrite,
                             Zeroshard__InitRequest *q, Zeroshard__AdamConfig *adam)
{
    zs_pb_adam_set(adam, hp);
    zeroshard__init_request__init(q);
    q->protocol_version = c->ver[i] ? c->ver[i] : ZS_PROTOCOL_VERSION;
    q->model_name = (char *)model;
    q->num_params = c->P;
    q->num_servers = (uint32_t)c->n;
    q->server_index = (uint32_t)i;
    q->adam = adam;
    q->start_step = start_step;
    q->overwrite = overwrite;
    q->require_nvme = c->require_nvme;
    q->n_groups = c->ngroups;
    q->groups = c->pb_groups;
}

int zs_client_set_groups(zs_client_t *c, const zs_group_range_t *r, size_t n, zs_err_t *err)
{
    /* P is checked at Initialize (the servers check it too) */
    int rc = zs_groups_check(r, n, n ? r[n - 1].end : 0, err);
    if (rc)
        return rc;
    zs_group_range_t *g = NULL;
    Zeroshard__GroupRange **pb = NULL;
    if (n && (!(g = malloc(n * sizeof *g)) || zs_pb_groups_set(r, n, &pb))) {
        free(g);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu parameter group ranges", n);
    }
    if (n)
        memcpy(g, r, n * sizeof *g);
    free(c->groups);
    zs_pb_groups_free(c->pb_groups);
    c->groups = g;
    c->ngroups = n;
    c->pb_groups = pb;
    return ZS_OK;
}

/* See zs_client_internal.h. */
int zs__client_groups_ok(const zs_client_t *c, int i, const char *what, zs_err_t *err)
{
    if (c->ver[i] && c->ver[i] < ZS_PROTOCOL_V_GROUPS)
        return zs_err_set(err, ZS_ERR_STATE,
                          "server %s speaks protocol version %u; %s needs version %u (parameter "
                          "groups): upgrade the server",
                          c->addr[i], c->ver[i], what, ZS_PROTOCOL_V_GROUPS);
    return ZS_OK;
}

typedef struct {
    Zeroshard__InitRequest q;
    Zeroshard__AdamConfig adam;
} init_arg_t;

static const ProtobufCMessage *init_chunk(const void *arg, chunk_msg_t *m, uint64_t off, uint64_t k,
                                          int first)
{
    zeroshard__init_chunk__init(&m->init);
    m->init.init = first ? (Zeroshard__InitRequest *)&((const init_arg_t *)arg)->q : NULL;
    m->init.offset = off;
    m->init.count = k;
    m->init.dtype = ZEROSHARD__DTYPE__F32;
    return &m->init.base;
}

typedef struct {
    const char *model;
    const zs_adam_hparams_t *hp;
    const float *master;
    uint64_t start_step;
    int overwrite;
} init_in_t;

static int init_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    const init_in_t *a = argp;
    int rc = zs__client_negotiate(c, i, err);
    if (!rc && c->ngroups)
        rc = zs__client_groups_ok(c, i, "Initialize with parameter groups", err);
    if (rc)
        return rc;
    init_arg_t ia;
    zs__client_init_request(c, i, a->model, a->hp, a->start_step, a->overwrite, &ia.q, &ia.adam);
    uint64_t b = srv_begin(c, i), e = srv_begin(c, i + 1);
    /* An empty range still sends the init message. */
    return send_stream(c, i, M("Initialize"), b, e, 4, a->master + b, 1, init_chunk, &ia, err);
}

int zs_client_init(zs_client_t *c, const char *model, uint64_t P, const zs_adam_hparams_t *hp,
                   const float *master, uint64_t start_step, int overwrite, zs_err_t *err)
{
    if (P == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "model size P must be > 0");
    if (c->ngroups && c->groups[c->ngroups - 1].end != P)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "the parameter groups end at %llu, the model has %llu parameters",
                          (unsigned long long)c->groups[c->ngroups - 1].end, (unsigned long long)P);
    c->P = P;
    init_in_t a = {model, hp, master, start_step, overwrite};
    int rc = fan_out(c, 0, c->n - 1, init_one, NULL, &a, err);
    warn_older(c);
    return rc;
}

/* ---- Push --------------------------------------------------------------------- */

typedef struct {
    uint64_t step, begin, end;
    const void *grad;
    zs_dtype_t dt;
    Zeroshard__StepExpect *expect; /* NULL: none */
    const uint64_t *sums;          /* zs_client_push_sums' checksums, or NULL */
} push_arg_t;

static const ProtobufCMessage *push_chunk(const void *arg, chunk_msg_t *m, uint64_t off, uint64_t k,
                                          int first)
{
    const push_arg_t *a = arg;
    zeroshard__push_chunk__init(&m->push);
    m->push.step = a->step;
    m->push.offset = off;
    m->push.count = k;
    m->push.dtype = (Zeroshard__DType)a->dt;
    m->push.expect = first ? a->expect : NULL; /* the stream's first chunk only */
    return &m->push.base;
}

/* Messages server i's part of a push of [begin, end) is cut into over the
 * shared staging (zs_client_push_msgs' cut), elements of esz bytes. */
static uint64_t msgs_of(const zs_client_t *c, int i, uint64_t begin, uint64_t end, size_t esz)
{
    uint64_t b, e, per = zs__client_shm_per_message(c, i, esz);
    return clip(c, i, begin, end, &b, &e) ? (e - b + per - 1) / per : 0;
}

static int push_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    const push_arg_t *a = argp;
    uint64_t b, e;
    if (!clip(c, i, a->begin, a->end, &b, &e))
        return ZS_OK;
    size_t esz = zs_dtype_size(a->dt);
    const char *src = (const char *)a->grad + (b - a->begin) * esz;
    /* A server that negotiated a version without `expect` gets the plain
     * push it knows (an old one would ignore the field, and speculate on
     * nothing). */
    push_arg_t plain = *a;
    if (c->ver[i] && (c->ver[i] < ZS_PROTOCOL_V_SPECULATION ||
                      (a->expect && a->expect->n_group_lr && c->ver[i] < ZS_PROTOCOL_V_GROUPS)))
        plain.expect = NULL;
    uint64_t at;
    if (zs__client_shm_usable(c, i, src, (e - b) * esz, &at)) { /* in the shared staging */
        const uint64_t *sums = a->sums;
        if (sums) /* skip the messages of the servers before this one */
            for (int j = (int)zs_layout_owner(c->P, (uint32_t)c->n, a->begin); j < i; j++)
                sums += msgs_of(c, j, a->begin, a->end, esz);
        return zs__client_shm_push(c, i, a->step, b, e, a->dt, plain.expect, at, sums, err);
    }
    return send_stream(c, i, M("Push"), b, e, esz, src, 0, push_chunk, &plain, err);
}

int zs_client_push(zs_client_t *c, uint64_t step, uint64_t begin, uint64_t end, const void *grad,
                   zs_dtype_t dt, zs_err_t *err)
{
    return zs_client_push_expect(c, step, begin, end, grad, dt, NULL, err);
}

int zs_client_push_expect(zs_client_t *c, uint64_t step, uint64_t begin, uint64_t end,
                          const void *grad, zs_dtype_t dt, const zs_step_scalars_t *expect,
                          zs_err_t *err)
{
    return zs_client_push_sums(c, step, begin, end, grad, dt, expect, NULL, 0, err);
}

int zs_client_push_msgs(const zs_client_t *c, uint64_t begin, uint64_t end, zs_dtype_t dt,
                        zs_client_msg_t *m, int max, int *n, zs_err_t *err)
{
    *n = 0;
    size_t esz = zs_dtype_size(dt);
    if (esz == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown dtype %d", (int)dt);
    int f, l;
    int rc = owners(c, begin, end, &f, &l, err);
    if (rc)
        return rc;
    for (int i = f; i <= l; i++) {
        uint64_t b, e, per = zs__client_shm_per_message(c, i, esz);
        if (!clip(c, i, begin, end, &b, &e))
            continue;
        for (uint64_t at = b; at < e; at += per, ++*n)
            if (*n < max)
                m[*n] = (zs_client_msg_t){at, e - at < per ? e - at : per};
    }
    return ZS_OK;
}

int zs_client_push_sums(zs_client_t *c, uint64_t step, uint64_t begin, uint64_t end,
                        const void *grad, zs_dtype_t dt, const zs_step_scalars_t *expect,
                        const uint64_t *sums, int nsums, zs_err_t *err)
{
    if (zs_dtype_size(dt) == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown dtype %d", (int)dt);
    int f, l;
    int rc = owners(c, begin, end, &f, &l, err);
    if (rc)
        return rc;
    if (sums) {
        uint64_t want = 0;
        for (int i = f; i <= l; i++)
            want += msgs_of(c, i, begin, end, zs_dtype_size(dt));
        if ((uint64_t)nsums != want)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "push [%llu, %llu): %d checksums for %llu messages",
                              (unsigned long long)begin, (unsigned long long)end, nsums,
                              (unsigned long long)want);
        if (!zs_client_push_sums_wanted(c))
            sums = NULL;
    }
    Zeroshard__StepExpect ex = ZEROSHARD__STEP_EXPECT__INIT;
    push_arg_t a = {step, begin, end, grad, dt, NULL, sums};
    if (expect) {
        ex.grad_scale = expect->grad_scale;
        ex.lr = expect->lr;
        ex.param_dtype = (Zeroshard__DType)expect->param_dtype;
        ex.n_group_lr = expect->nlrs;
        ex.group_lr = (float *)expect->lrs;
        a.expect = &ex;
    }
    return fan_out(c, f, l, push_one, NULL, &a, err);
}

/* ---- Commit ---------------------------------------------------------------------- */

static int commit_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    const zs_step_scalars_t *s = argp;
    Zeroshard__CommitRequest q = ZEROSHARD__COMMIT_REQUEST__INIT;
    q.step = s->step;
    q.grad_scale = s->grad_scale;
    q.clip_coef = s->clip_coef;
    q.lr = s->lr;
    q.skip = s->skip;
    q.param_dtype = (Zeroshard__DType)s->param_dtype;
    q.n_group_lr = s->nlrs;
    q.group_lr = (float *)s->lrs;
    if (s->nlrs) {
        int rc = zs__client_groups_ok(c, i, "a commit with group learning rates", err);
        if (rc)
            return rc;
    }
    Zeroshard__CommitReply *r;
    int rc = zs_unary(c->ch[i], M("Commit"), c->token, c->timeout_ms, c->addr[i], &q.base,
                      &zeroshard__commit_reply__descriptor, (ProtobufCMessage **)&r, err);
    if (rc == ZS_OK)
        zeroshard__commit_reply__free_unpacked(r, NULL);
    return rc;
}

int zs_client_commit(zs_client_t *c, const zs_step_scalars_t *s, zs_err_t *err)
{
    return fan_out(c, 0, c->n - 1, commit_one, NULL, (void *)s, err);
}

/* ---- SetState --------------------------------------------------------------------- */

typedef struct {
    int tensor;
    uint64_t begin, end;
    const float *src;
} set_arg_t;

static const ProtobufCMessage *set_chunk(const void *arg, chunk_msg_t *m, uint64_t off, uint64_t k,
                                         int first)
{
    zeroshard__state_chunk__init(&m->state);
    m->state.tensor = (Zeroshard__Tensor)((const set_arg_t *)arg)->tensor;
    m->state.offset = off;
    m->state.count = k;
    return &m->state.base;
}

static int set_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    const set_arg_t *a = argp;
    uint64_t b, e;
    if (!clip(c, i, a->begin, a->end, &b, &e))
        return ZS_OK;
    return send_stream(c, i, M("SetState"), b, e, 4, a->src + (b - a->begin), 0, set_chunk, a, err);
}

int zs_client_set_state(zs_client_t *c, int tensor, uint64_t begin, uint64_t end, const float *src,
                        zs_err_t *err)
{
    if (tensor < 0 || tensor > 2)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", tensor);
    int f, l;
    int rc = owners(c, begin, end, &f, &l, err);
    if (rc)
        return rc;
    set_arg_t a = {tensor, begin, end, src};
    return fan_out(c, f, l, set_one, NULL, &a, err);
}
