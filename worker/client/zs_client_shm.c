/*
 * zs_client_shm.c - the shard client's shared-memory data plane (zs_client.h,
 * "shared-memory data plane"): a worker on the same host as a server keeps
 * its staging in a sealed memfd segment (common/zs_shm.h), hands the fd to
 * the server over its Unix socket (common/zs_shm_sock.h), and Push / Pull
 * then name elements in it (ShmRef: session, byte offset, optional XXH3)
 * instead of carrying them: the gRPC message is the doorbell, the server
 * reads the gradients and writes the parameters in place.
 *
 * The segment is created once per client, for the staging's bytes: a range
 * of ceil(bytes / 4) "elements" in chunks whose stride is exactly chunk
 * elements x 4 bytes (a multiple of 1024 elements), so the GRAD payload area
 * is one contiguous run of at least `bytes`. That area is the staging; the
 * PARAM area of zs_shm's layout is not used and its pages are given back
 * right after creation (zs_shm_create reserves the whole segment; a punched
 * hole keeps the size the server checks, and costs nothing until touched).
 *
 * Which server uses it is decided at every Hello (hello_call in zs_client.c
 * states the session = the segment's generation): a server that holds the
 * session is on shm; one that offers a socket but does not hold it (first
 * contact, or it restarted since) gets the fd again over its socket, and a
 * second Hello must then confirm the session, which proves the socket and
 * the gRPC address reach one process; anything else is tcp, with the
 * reason logged. So the engine's recovery (a Hello on every worker once a
 * lost server is back) re-attaches a restarted server with the same fd.
 *
 * Threads: a server's record is written by that server's fan-out job (the
 * Hello), read by the push / pull jobs (`on` is atomic); the handshakes of
 * several servers run one at a time (zs_shm_connect registers the server
 * as the segment's watched peer, which must run alone).
 */
#define _GNU_SOURCE /* fallocate */
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_client_internal.h"
#include "zs_hash.h"
#include "zs_log.h"
#include "zs_shm.h"
#include "zs_shm_sock.h"

#define SOCK_MAX 108 /* sun_path */
#define WHY_MAX  240

struct zs__client_shm {
    zs_shm_t *seg;
    char *base;         /* the staging area: the segment's GRAD payload area */
    size_t bytes;       /* what the caller asked for (the area may be larger) */
    uint64_t session;   /* the segment's generation */
    pthread_mutex_t mu; /* one handshake at a time */
};

struct zs__client_shm_srv {
    char sock[SOCK_MAX];  /* the socket its last Hello offered ("": none) */
    atomic_int on;        /* it holds our session: bulk data by ShmRef */
    char why[WHY_MAX];    /* the reason for its transport, as logged */
    int logged;           /* 0: nothing logged yet; 1 shm; 2 tcp (with `why`) */
    uint32_t chunk_bytes; /* largest pushed reference it takes (its last Hello) */
};

static const char *const k_names[] = {"auto", "shm", "tcp"};

const char *zs_transport_name(int t)
{
    return t >= 0 && t < 3 ? k_names[t] : "?";
}

int zs_transport_parse(const char *name)
{
    for (int t = 0; name && t < 3; t++)
        if (!strcmp(name, k_names[t]))
            return t;
    return -1;
}

int zs__client_shm_init(zs_client_t *c, const zs_client_opts_t *o, zs_err_t *err)
{
    if (o->transport < ZS_TRANSPORT_AUTO || o->transport > ZS_TRANSPORT_TCP)
        return zs_err_set(err, ZS_ERR_INVALID, "transport %d: want auto (0), shm (1) or tcp (2)",
                          o->transport);
    c->transport = o->transport;
    int sums = o->shm_checksums;
    const char *senv = getenv("ZS_SHM_CHECKSUMS");
    if (sums == 0 && senv && *senv) {
        sums = !strcmp(senv, "push")   ? 0
               : !strcmp(senv, "both") ? 1
               : !strcmp(senv, "off")  ? -1
                                       : 2;
        if (sums == 2)
            return zs_err_set(err, ZS_ERR_INVALID, "ZS_SHM_CHECKSUMS=%s: want push, both or off",
                              senv);
    }
    c->shm_checksums = sums >= 0;     /* pushes: the server checks each chunk */
    c->shm_pull_checksums = sums > 0; /* pulls: the server hashes, we check */
    int k = o->shm_streams;
    const char *env = getenv("ZS_SHM_STREAMS");
    if (k == 0 && env && *env)
        k = atoi(env);
    if (k == 0) { /* half the cores this thread may run on, 1 to the default */
        cpu_set_t cs;
        int ncpu = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 2;
        k = ncpu / 2 < 1                               ? 1
            : ncpu / 2 > ZS_CLIENT_SHM_STREAMS_DEFAULT ? ZS_CLIENT_SHM_STREAMS_DEFAULT
                                                       : ncpu / 2;
    }
    if (k < 1 || k > ZS_CLIENT_SHM_STREAMS_MAX)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "shm_streams %d (ZS_SHM_STREAMS %s): want 1 to %d concurrent streams per "
                          "server",
                          k, env && *env ? env : "unset", ZS_CLIENT_SHM_STREAMS_MAX);
    c->shm_streams = k;
    c->shsv = calloc((size_t)c->n, sizeof *c->shsv);
    return c->shsv ? ZS_OK : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
}

static void segment_free(zs__client_shm_t *s)
{
    if (!s)
        return;
    zs_shm_destroy(s->seg);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void zs__client_shm_free(zs_client_t *c)
{
    segment_free(c->shm);
    c->shm = NULL;
    free(c->shsv);
    c->shsv = NULL;
}

uint64_t zs__client_shm_session(const zs_client_t *c)
{
    return c->shm ? c->shm->session : 0;
}

int zs_client_transport(const zs_client_t *c, int i, const char **why)
{
    if (i < 0 || i >= c->n) {
        if (why)
            *why = "no such server";
        return ZS_TRANSPORT_TCP;
    }
    const zs__client_shm_srv_t *v = &c->shsv[i];
    int on = atomic_load(&v->on);
    if (why)
        *why = v->why;
    return on ? ZS_TRANSPORT_SHM : ZS_TRANSPORT_TCP;
}

int zs_client_pull_streams(const zs_client_t *c)
{
    for (int i = 0; i < c->n; i++)
        if (zs_client_transport(c, i, NULL) == ZS_TRANSPORT_SHM)
            return c->shm_streams;
    return 1;
}

/* Record server i's transport and log it when it changed: one line per
 * server and outcome ("server i (addr): transport shm (socket PATH)" or
 * "transport tcp (why)"). A socket that was offered and failed is a
 * warning; no socket offered (another host, --shm-socket off) is news. */
static void set_transport(zs_client_t *c, int i, int on, int warn, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void set_transport(zs_client_t *c, int i, int on, int warn, const char *fmt, ...)
{
    zs__client_shm_srv_t *v = &c->shsv[i];
    char why[WHY_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    atomic_store(&v->on, on);
    int state = on ? 1 : 2;
    if (v->logged == state && !strcmp(v->why, why))
        return;
    v->logged = state;
    snprintf(v->why, sizeof v->why, "%s", why);
    if (warn)
        ZS_WARN("server %d (%s): transport %s (%s)", i, c->addr[i], on ? "shm" : "tcp", why);
    else
        ZS_INFO("server %d (%s): transport %s (%s)", i, c->addr[i], on ? "shm" : "tcp", why);
}

/* A Hello to server i stating our session: does it hold it? */
static int session_hello(zs_client_t *c, int i, int *ok, zs_err_t *err)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = c->ver[i] ? c->ver[i] : ZS_PROTOCOL_VERSION;
    q.model_name = "";
    q.shm_session = c->shm->session;
    Zeroshard__HelloReply *r;
    int rc = zs_unary(c->ch[i], "/zeroshard.Shard/Hello", c->token, c->timeout_ms, c->addr[i],
                      &q.base, &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, err);
    if (rc)
        return rc;
    *ok = r->shm_session_ok;
    zeroshard__hello_reply__free_unpacked(r, NULL);
    return ZS_OK;
}

/* Hand the segment to server i over its socket (token = ours, the server
 * must run as our euid), then confirm with a Hello: ZS_OK with *ok = 1
 * when the server holds the session; else the failure's status. One Hello
 * decides: zs-server makes a Hello about a session it has just accepted
 * wait until its listener has entered it (server/zs_shm_sessions.c), so a
 * "no" means the socket and the gRPC address are different processes. */
static int attach(zs_client_t *c, int i, int *ok, zs_err_t *err)
{
    zs__client_shm_srv_t *v = &c->shsv[i];
    zs_shm_client_opts_t so = {.path = v->sock,
                               .token = c->token,
                               .token_len = c->token ? strlen(c->token) : 0,
                               .timeout_ms = c->timeout_ms < 5000 ? c->timeout_ms : 5000};
    pthread_mutex_lock(&c->shm->mu);
    int rc = zs_shm_connect(&so, c->shm->seg, NULL, err);
    pthread_mutex_unlock(&c->shm->mu);
    *ok = 0;
    return rc ? rc : session_hello(c, i, ok, err);
}

int zs__client_shm_hello(zs_client_t *c, int i, const char *socket, int session_ok,
                         uint32_t chunk_bytes, zs_err_t *err)
{
    zs__client_shm_srv_t *v = &c->shsv[i];
    snprintf(v->sock, sizeof v->sock, "%s", socket ? socket : "");
    /* 0 (an older server) or anything outside what we would send: a `data`
     * chunk's limit */
    v->chunk_bytes =
        chunk_bytes >= ZS_RPC_MAX_CHUNK_BYTES && chunk_bytes <= ZS_RPC_MAX_SHM_CHUNK_BYTES
            ? chunk_bytes
            : ZS_RPC_MAX_CHUNK_BYTES;
    if (!c->shm) /* no shared staging: nothing to decide */
        return ZS_OK;
    if (session_ok) {
        set_transport(c, i, 1, 0, "socket %s", v->sock);
        return ZS_OK;
    }
    int was = atomic_load(&v->on), rc = ZS_OK, ok = 0;
    zs_err_t why = {0, ""};
    if (!v->sock[0]) {
        rc = zs_err_set(&why, ZS_ERR_STATE,
                        "the server offers no shared-memory socket (another host, or zs-server "
                        "--shm-socket off)");
        set_transport(c, i, 0, 0, "%s", why.msg);
    } else if ((rc = attach(c, i, &ok, &why)) != ZS_OK) {
        set_transport(c, i, 0, 1, "socket %s: %s", v->sock, why.msg);
    } else if (!ok) {
        rc = zs_err_set(&why, ZS_ERR_STATE,
                        "socket %s took the segment, but %s does not hold its session: they "
                        "are different server processes",
                        v->sock, c->addr[i]);
        set_transport(c, i, 0, 1, "%s", why.msg);
    } else {
        if (was) /* it restarted: the same fd again */
            ZS_INFO("server %d (%s): shared staging handed over again (socket %s)", i, c->addr[i],
                    v->sock);
        set_transport(c, i, 1, 0, "socket %s", v->sock);
        return ZS_OK;
    }
    if (c->transport != ZS_TRANSPORT_SHM)
        return ZS_OK;
    /* UNAVAILABLE (nobody listens yet, the server went away) is retried */
    return zs_err_set(err, rc, "server %d (%s): --transport shm, but it stays on tcp: %s", i,
                      c->addr[i], v->why);
}

/* zs_shm_create reserves the PARAM payload area too (fallocate of the
 * whole segment); the staging lives in the GRAD area alone, so give those
 * pages back. The segment keeps its size (the server compares it with the
 * header), the seals allow it (no F_SEAL_WRITE), and a page touched later
 * is allocated then. Failure only costs memory: logged. */
static void punch_param_area(zs_shm_t *seg)
{
    const zs_shm_header_t *h = zs_shm_header(seg);
    if (h->total_bytes > h->param_off &&
        fallocate(zs_shm_fd(seg), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)h->param_off,
                  (off_t)(h->total_bytes - h->param_off)) != 0)
        ZS_WARN("shared staging: could not release the unused %llu bytes of the segment",
                (unsigned long long)(h->total_bytes - h->param_off));
}

/* Create the segment: ceil(bytes / 4) elements in chunks of a multiple of
 * 1024 elements (stride = elements x 4 exactly), at most
 * ZS_SHM_MAX_CHUNK_ELEMS each, so the GRAD area is contiguous and at least
 * `bytes` long. */
static int segment_new(size_t bytes, zs__client_shm_t **out, zs_err_t *err)
{
    uint64_t n = ((uint64_t)bytes + 3) / 4;
    uint64_t ch = (n + 1023) / 1024 * 1024;
    if (ch > ZS_SHM_MAX_CHUNK_ELEMS)
        ch = ZS_SHM_MAX_CHUNK_ELEMS;
    zs__client_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    int rc = zs_shm_create(0, n, (uint32_t)ch, &s->seg, err);
    if (rc) {
        segment_free(s);
        return rc;
    }
    const zs_shm_header_t *h = zs_shm_header(s->seg);
    if (h->param_off - h->grad_off < bytes) { /* the geometry above makes this impossible */
        segment_free(s);
        return zs_err_set(err, ZS_ERR_INTERNAL, "shared staging: %llu bytes of area for %zu",
                          (unsigned long long)(h->param_off - h->grad_off), bytes);
    }
    punch_param_area(s->seg);
    s->base = zs_shm_payload(s->seg, ZS_SHM_GRAD, 0);
    s->bytes = bytes;
    s->session = h->generation;
    *out = s;
    return ZS_OK;
}

int zs_client_shm_staging(zs_client_t *c, size_t bytes, void **base, zs_err_t *err)
{
    *base = NULL;
    if (c->shm) {
        if (bytes > c->shm->bytes)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "shared staging exists with %zu bytes, %zu asked", c->shm->bytes,
                              bytes);
        *base = c->shm->base;
        return ZS_OK;
    }
    if (c->transport == ZS_TRANSPORT_TCP)
        return zs_err_set(err, ZS_ERR_UNAVAILABLE, "transport tcp: no shared staging");
    if (bytes == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "shared staging of 0 bytes");
    /* Which servers offer a socket (no identity check: any model). */
    int rc = zs_client_hello(c, NULL, 0, NULL, err);
    if (rc)
        return rc;
    int offered = 0;
    for (int i = 0; i < c->n; i++)
        offered += c->shsv[i].sock[0] != 0;
    if (!offered) {
        for (int i = 0; i < c->n; i++)
            set_transport(c, i, 0, 0,
                          "the server offers no shared-memory socket (another host, or "
                          "zs-server --shm-socket off)");
        if (c->transport == ZS_TRANSPORT_SHM)
            return zs_err_set(err, ZS_ERR_STATE,
                              "server 0 (%s): --transport shm, but it stays on tcp: %s", c->addr[0],
                              c->shsv[0].why);
        return zs_err_set(err, ZS_ERR_UNAVAILABLE, "no server offers a shared-memory socket");
    }
    rc = segment_new(bytes, &c->shm, err);
    if (rc)
        return rc;
    /* Hand it over: each Hello states the session, which no server holds
     * yet, so zs__client_shm_hello attaches every server offering a
     * socket (and, with transport shm, fails for any other). */
    rc = zs_client_hello(c, NULL, 0, NULL, err);
    int on = 0;
    for (int i = 0; i < c->n; i++)
        on += atomic_load(&c->shsv[i].on);
    if (!rc && !on)
        rc = zs_err_set(err, ZS_ERR_UNAVAILABLE, "no server took the shared staging (see above)");
    if (rc) {
        segment_free(c->shm);
        c->shm = NULL;
        for (int i = 0; i < c->n; i++)
            atomic_store(&c->shsv[i].on, 0);
        return rc;
    }
    *base = c->shm->base;
    return ZS_OK;
}

int zs__client_shm_usable(const zs_client_t *c, int i, const void *p, size_t bytes, uint64_t *off)
{
    const zs__client_shm_t *s = c->shm;
    const char *q = p;
    if (!s || !atomic_load(&c->shsv[i].on) || q < s->base || q > s->base + s->bytes ||
        bytes > (size_t)(s->base + s->bytes - q))
        return 0;
    *off = (uint64_t)(q - s->base);
    return 1;
}

/* ---- Push and Pull by reference ----------------------------------------- */

/* Elements of dtype size esz per message pushed by reference to server i:
 * the shm_chunk_bytes of its last Hello (16 MiB), or the 4 MiB a chunk
 * that carries its data may hold before a Hello (the message itself is a
 * few dozen bytes either way). */
static uint64_t per_message(const zs_client_t *c, int i, size_t esz)
{
    uint32_t b = c->shsv[i].chunk_bytes;
    return (b ? b : ZS_RPC_MAX_CHUNK_BYTES) / esz;
}

uint64_t zs__client_shm_per_message(const zs_client_t *c, int i, size_t esz)
{
    return per_message(c, i, esz);
}

int zs_client_push_sums_wanted(const zs_client_t *c)
{
    return c->shm && c->shm_checksums;
}

/* One Push stream of [b, e) by reference (zs__client_shm_push's pieces). */
static int push_stream(zs_client_t *c, int i, uint64_t step, uint64_t b, uint64_t e, zs_dtype_t dt,
                       Zeroshard__StepExpect *expect, uint64_t off, const uint64_t *sums,
                       zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    zs_ccall_t call;
    int rc = zs_ccall_start(&call, c->ch[i], "/zeroshard.Shard/Push", c->token, c->timeout_ms,
                            c->addr[i], err);
    if (rc)
        return rc;
    uint64_t per = per_message(c, i, esz);
    for (uint64_t at = b; !rc && at < e; at += per) {
        uint64_t k = e - at < per ? e - at : per, o = off + (at - b) * esz;
        Zeroshard__ShmRef ref = ZEROSHARD__SHM_REF__INIT;
        ref.session = c->shm->session;
        ref.byte_offset = o;
        ref.has_xxh3 = c->shm_checksums;
        if (ref.has_xxh3) /* seeded with the step: a stale chunk does not verify */
            ref.xxh3 = sums ? sums[(at - b) / per] /* hashed where it was written */
                            : zs_hash64(c->shm->base + o, (size_t)(k * esz), step);
        Zeroshard__PushChunk m = ZEROSHARD__PUSH_CHUNK__INIT;
        m.step = step;
        m.offset = at;
        m.count = k;
        m.dtype = (Zeroshard__DType)dt;
        m.expect = at == b ? expect : NULL; /* the stream's first chunk only */
        m.shm = &ref;
        grpc_byte_buffer *bb = zs_msg_build(&m.base);
        rc = bb ? zs_ccall_send(&call, bb, err) : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    return zs__client_stream_end(&call, rc, err);
}

/* One PullChunk of a shared pull: no data, a ShmRef of our session at the
 * offset its elements belong at, the next piece asked for, a matching
 * checksum when asked for. */
static int check_chunk(const zs_client_t *c, int i, const Zeroshard__PullChunk *p,
                       const zs_frame_t *fr, uint64_t next, uint64_t e, zs_dtype_t dt,
                       uint64_t want_off, zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    const Zeroshard__ShmRef *r = p->shm;
    if (p->offset != next || p->count == 0 || p->count > e - next || (int)p->dtype != (int)dt ||
        fr->pay_len != 0 || !r || r->session != c->shm->session || r->byte_offset != want_off)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "%s: unexpected shared chunk [%llu, +%llu) %s, %zu bytes of data, at "
                          "byte %llu of session %llx (wanted offset %llu at byte %llu of %llx)",
                          c->addr[i], (unsigned long long)p->offset, (unsigned long long)p->count,
                          zs_dtype_name((int)p->dtype), fr->pay_len,
                          (unsigned long long)(r ? r->byte_offset : 0),
                          (unsigned long long)(r ? r->session : 0), (unsigned long long)next,
                          (unsigned long long)want_off, (unsigned long long)c->shm->session);
    if (!c->shm_pull_checksums)
        return ZS_OK;
    uint64_t h = zs_hash64(c->shm->base + want_off, (size_t)(p->count * esz), p->step);
    if (!r->has_xxh3 || r->xxh3 != h)
        return zs_err_set(err, ZS_ERR_CORRUPT, "%s: shared chunk [%llu, +%llu) of step %llu: %s",
                          c->addr[i], (unsigned long long)p->offset, (unsigned long long)p->count,
                          (unsigned long long)p->step,
                          r->has_xxh3 ? "checksum mismatch" : "no checksum (asked for one)");
    return ZS_OK;
}

/* One Pull stream of [b, e) by reference (zs__client_shm_pull's pieces). */
static int pull_stream(zs_client_t *c, int i, uint64_t min_step, uint64_t b, uint64_t e,
                       zs_dtype_t dt, uint64_t off, const zs__client_landed_t *landed, uint64_t *lo,
                       uint64_t *hi, zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    zs_ccall_t call;
    int rc = zs_ccall_start(&call, c->ch[i], "/zeroshard.Shard/Pull", c->token, c->timeout_ms,
                            c->addr[i], err);
    if (rc)
        return rc;
    Zeroshard__ShmRef ref = ZEROSHARD__SHM_REF__INIT;
    ref.session = c->shm->session;
    ref.byte_offset = off;
    ref.has_xxh3 = c->shm_pull_checksums; /* ask for each chunk's checksum */
    Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
    q.min_step = min_step;
    q.offset = b;
    q.count = e - b;
    q.dtype = (Zeroshard__DType)dt;
    q.chunk_bytes = ZS_RPC_MAX_PULL_CHUNK_BYTES; /* fewer messages: nothing is carried */
    q.shm = &ref;
    rc = zs_ccall_send(&call, zs_msg_build(&q.base), err);
    uint64_t next = b;
    *lo = UINT64_MAX;
    *hi = 0;
    while (!rc) {
        ProtobufCMessage *m;
        zs_frame_t fr;
        rc = zs__client_recv(&call, &zeroshard__pull_chunk__descriptor, &m, &fr, err);
        if (rc || !m)
            break;
        const Zeroshard__PullChunk *p = (const Zeroshard__PullChunk *)m;
        rc = check_chunk(c, i, p, &fr, next, e, dt, off + (next - b) * esz, err);
        if (!rc) { /* the elements are in place: nothing to copy */
            if (landed && landed->fn)
                landed->fn(landed->arg, next, next + p->count);
            next += p->count;
            *lo = p->step < *lo ? p->step : *lo;
            *hi = p->step > *hi ? p->step : *hi;
        }
        protobuf_c_message_free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
    }
    return zs__client_read_end(c, i, &call, rc, next, b, e, err);
}

/* ---- several streams per server ------------------------------------------ */

/* Why: a layer's segment usually lies in one server's range, so a Push or a
 * Pull of it is one stream, and one stream is a serial chain per chunk:
 * XXH3 here, the doorbell, the server's copy and XXH3 (push) or its copy
 * into the segment and XXH3 (pull), our check. On the first H200 run that
 * chain moved 1.2-2 GB/s per server while the host copies at 64 GB/s.
 * Cutting the range into up to `shm_streams` pieces of whole messages,
 * each its own call on its own thread here and its own handler thread on
 * the server, spreads that work over cores. The pieces are disjoint, so
 * the server stages and serves exactly what one stream would have. */
typedef struct {
    zs_client_t *c;
    int i, pull;
    uint64_t step, b, e, off;
    zs_dtype_t dt;
    Zeroshard__StepExpect *expect;
    const uint64_t *sums;              /* push: the piece's first chunk's checksum, or NULL */
    const zs__client_landed_t *landed; /* pull: progress, or NULL */
    uint64_t lo, hi;
    int rc;
    zs_err_t err;
    pthread_t th;
    int started;
} piece_t;

static void *piece_main(void *arg)
{
    piece_t *p = arg;
    zs_err_clear(&p->err);
    p->rc = p->pull ? pull_stream(p->c, p->i, p->step, p->b, p->e, p->dt, p->off, p->landed, &p->lo,
                                  &p->hi, &p->err)
                    : push_stream(p->c, p->i, p->step, p->b, p->e, p->dt, p->expect, p->off,
                                  p->sums, &p->err);
    return NULL;
}

/* Run [b, e) as up to c->shm_streams pieces, each a multiple of `unit`
 * elements (one message) but the last; pieces after the first run on
 * threads of their own. Returns the first error in range order. */
static int run_pieces(zs_client_t *c, int i, int pull, uint64_t step, uint64_t b, uint64_t e,
                      zs_dtype_t dt, Zeroshard__StepExpect *expect, uint64_t off, uint64_t unit,
                      const uint64_t *sums, const zs__client_landed_t *landed, uint64_t *lo,
                      uint64_t *hi, zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    uint64_t units = (e - b + unit - 1) / unit;
    int k = units < (uint64_t)c->shm_streams ? (int)units : c->shm_streams;
    if (k < 1)
        k = 1;
    uint64_t per = (units + (uint64_t)k - 1) / (uint64_t)k * unit;
    piece_t pc[ZS_CLIENT_SHM_STREAMS_MAX];
    int n = 0;
    for (uint64_t at = b; at < e || n == 0; at += per) {
        uint64_t pe = e - at < per ? e : at + per;
        pc[n] = (piece_t){.c = c,
                          .i = i,
                          .pull = pull,
                          .step = step,
                          .b = at,
                          .e = pe,
                          .off = off + (at - b) * esz,
                          .dt = dt,
                          .expect = expect,
                          .sums = sums ? sums + (at - b) / unit : NULL,
                          .landed = landed,
                          .lo = UINT64_MAX};
        n++;
        if (pe == e)
            break;
    }
    for (int j = 1; j < n; j++)
        pc[j].started = pthread_create(&pc[j].th, NULL, piece_main, &pc[j]) == 0;
    piece_main(&pc[0]);
    int rc = ZS_OK;
    for (int j = 0; j < n; j++) {
        if (j > 0 && pc[j].started)
            pthread_join(pc[j].th, NULL);
        else if (j > 0) /* no thread to be had: run it here */
            piece_main(&pc[j]);
        if (pc[j].rc && !rc) {
            rc = pc[j].rc;
            if (err)
                *err = pc[j].err;
        }
        if (pull) {
            *lo = pc[j].lo < *lo ? pc[j].lo : *lo;
            *hi = pc[j].hi > *hi ? pc[j].hi : *hi;
        }
    }
    return rc;
}

int zs__client_shm_push(zs_client_t *c, int i, uint64_t step, uint64_t b, uint64_t e, zs_dtype_t dt,
                        Zeroshard__StepExpect *expect, uint64_t off, const uint64_t *sums,
                        zs_err_t *err)
{
    return run_pieces(c, i, 0, step, b, e, dt, expect, off, per_message(c, i, zs_dtype_size(dt)),
                      sums, NULL, NULL, NULL, err);
}

int zs__client_shm_pull(zs_client_t *c, int i, uint64_t min_step, uint64_t b, uint64_t e,
                        zs_dtype_t dt, uint64_t off, const zs__client_landed_t *landed,
                        uint64_t *lo, uint64_t *hi, zs_err_t *err)
{
    *lo = UINT64_MAX;
    *hi = 0;
    return run_pieces(c, i, 1, min_step, b, e, dt, NULL, off,
                      ZS_RPC_MAX_PULL_CHUNK_BYTES / zs_dtype_size(dt), NULL, landed, lo, hi, err);
}
