/*
 * test_shm_server.c - integration: zs-server's shared-memory data plane
 * (docs/protocol.md, "Shared-memory data plane") against real servers.
 *
 * Setup: server A (default --shm-socket auto, a bearer token) and server B
 * (--shm-socket off, no token) hold the same model (P = 3 optimizer chunks
 * and a bit, one server's range each). This process is the worker: it makes
 * a zs_shm segment and hands it to A over A's socket (zs_shm_connect); raw
 * gRPC calls (proto/zs_rpc_client.c) push and pull, A by ShmRef, B by data.
 * Checks:
 *   hand-over   a foreign uid is refused (the socket's mode, then the uid
 *               check with the mode widened; skipped when not root), a wrong
 *               token is refused, the 65th session is refused while 64 live,
 *               each of those held by a Hello sent right after its hand-over
 *               (the server answers the handshake before it enters the
 *               session: a lookup waits for that);
 *   hello       A names its socket (absolute) and takes references of
 *               16 MiB (shm_chunk_bytes), B neither; shm_session_ok for
 *               the handed-over session, not for 0 or another id;
 *   steps       three steps (fp32, bf16 with `expect` and checksums both
 *               ways, fp16 after the refusals): A's pulls by ShmRef and B's
 *               by data are bitwise equal, fp32 and bf16, each PullChunk
 *               saying where it wrote (and its XXH3 when asked);
 *   refusals    unknown session, data and shm both, a reference outside the
 *               staging area or off an element boundary, more than 16 MiB,
 *               a checksum mismatch (after a good chunk in the same stream),
 *               a step out of sequence, pulls to an unknown session or past
 *               the area: the status and its sentence, and A's state
 *               unchanged (fp32 pull, GetState of m and v, applied step,
 *               and nothing staged: Commit says 0 of P elements);
 *   replace     handing the same segment over again keeps it usable;
 *   peer death  a worker killed with -9 ends a Pull waiting on its session
 *               (UNAVAILABLE) and its session (Hello: not ok) within 2 s;
 *   budget      server C (--mem-budget 5M: its state and less than two
 *               1 MiB send buffers; the same segment handed to it too)
 *               refuses a Pull by data and serves one by reference;
 *   cleanup     the socket file is gone after SIGTERM.
 * Does not: use worker/client (another engineer's), TLS, or the segment's
 * chunk table (the server uses only its staging area).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "zs_proc.h"
#include "zs_rpc.h"
#include "zs_shm_sock.h"
#include "zs_synth.h"
#include "zs_test.h"

#define P      (3ull * 65536 + 1000)
#define CH     65536u /* elements per pushed chunk and per segment chunk */
#define TOKEN  "shm-test-token"
#define M(n)   "/zeroshard.Shard/" n
#define TMO_MS 20000
#define NOBODY 65534

enum { A, B, C };
static zs_test_server_t g_srv[3];
static grpc_channel *g_ch[3];
static const char *g_tok[3] = {TOKEN, NULL, NULL};
static char g_sock[PATH_MAX]; /* A's socket: realpath(data)/shm.sock */
static zs_shm_t *g_seg;       /* this process's segment, handed to A */
static uint64_t g_sess;
static unsigned char *g_stg; /* its staging area (the GRAD payload area) */
static uint64_t g_stg_bytes;
static int g_last_grpc;

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

/* ---- raw calls --------------------------------------------------------------- */

typedef void (*sink_fn)(void *ud, grpc_byte_buffer *bb);

/* On server s: `method` with msgs[0..n) (consumed); every reply message to
 * sink (may be NULL). Returns the call's status; g_last_grpc its gRPC code. */
static int call(int s, const char *method, grpc_byte_buffer **msgs, int n, sink_fn sink, void *ud,
                zs_err_t *err)
{
    zs_ccall_t c;
    zs_err_clear(err);
    g_last_grpc = -1;
    int rc = zs_ccall_start(&c, g_ch[s], method, g_tok[s], TMO_MS, g_srv[s].addr, err);
    int i = 0;
    for (; i < n && !rc; i++)
        rc = zs_ccall_send(&c, msgs[i], err);
    for (; i < n; i++)
        grpc_byte_buffer_destroy(msgs[i]);
    while (!rc) {
        grpc_byte_buffer *bb;
        rc = zs_ccall_recv(&c, &bb, err);
        if (rc || !bb)
            break;
        if (sink)
            sink(ud, bb);
        grpc_byte_buffer_destroy(bb);
    }
    if (c.call) {
        rc = zs_ccall_finish(&c, err);
        g_last_grpc = (int)c.status;
        zs_ccall_destroy(&c);
    }
    return rc;
}

static void keep_hello(void *ud, grpc_byte_buffer *bb)
{
    zs_err_t err;
    TEST_OK(zs_msg_parse(bb, &zeroshard__hello_reply__descriptor, ud, &err), err);
}

/* Hello to server s stating shm_session; its reply (caller frees). */
static Zeroshard__HelloReply *hello(int s, uint64_t session)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.shm_session = session;
    grpc_byte_buffer *m = zs_msg_build(&q.base);
    Zeroshard__HelloReply *r = NULL;
    zs_err_t err;
    TEST_OK(call(s, M("Hello"), &m, 1, keep_hello, &r, &err), err);
    TEST_CHECK(r);
    return r;
}

/* Open server s's channel and wait until it answers (raw calls fail fast
 * while a channel is still connecting). */
static void wait_serving(int s)
{
    g_ch[s] = zs_channel_create(g_srv[s].addr, NULL);
    int rc = ZS_ERR_UNAVAILABLE;
    zs_err_t err;
    for (int k = 0; k < 300 && rc == ZS_ERR_UNAVAILABLE; k++) {
        Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
        rc =
            call(s, M("Hello"), (grpc_byte_buffer *[]){zs_msg_build(&q.base)}, 1, NULL, NULL, &err);
        if (rc == ZS_ERR_UNAVAILABLE)
            sleep_ms(100);
    }
    TEST_OK(rc, err);
}

static int session_ok(int s, uint64_t session)
{
    Zeroshard__HelloReply *r = hello(s, session);
    int ok = r->shm_session_ok;
    zeroshard__hello_reply__free_unpacked(r, NULL);
    return ok;
}

/* A bulk message: meta, then len bytes copied from src (len 0: no data). */
static grpc_byte_buffer *bulk(const ProtobufCMessage *meta, const void *src, size_t len)
{
    if (!len)
        return zs_msg_build(meta);
    void *p = malloc(len);
    TEST_CHECK(p);
    memcpy(p, src, len);
    grpc_byte_buffer *bb = zs_frame_build(meta, p, len, free, p);
    TEST_CHECK(bb);
    return bb;
}

static void initialize(int s)
{
    zs_adam_hparams_t hp = zs_synth_hparams();
    Zeroshard__AdamConfig a = ZEROSHARD__ADAM_CONFIG__INIT;
    a.lr = hp.lr;
    a.beta1 = hp.beta1;
    a.beta2 = hp.beta2;
    a.eps = hp.eps;
    a.weight_decay = hp.weight_decay;
    a.adam_w_mode = hp.adam_w_mode;
    a.bias_correction = hp.bias_correction;
    Zeroshard__InitRequest q = ZEROSHARD__INIT_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    q.model_name = "shm";
    q.num_params = P;
    q.num_servers = 1;
    q.adam = &a;
    grpc_byte_buffer *msgs[8];
    float *w = malloc(CH * 4);
    TEST_CHECK(w);
    int n = 0;
    for (uint64_t off = 0; off < P; off += CH, n++) {
        uint64_t k = P - off < CH ? P - off : CH;
        for (uint64_t i = 0; i < k; i++)
            w[i] = zs_synth_weight(off + i);
        Zeroshard__InitChunk m = ZEROSHARD__INIT_CHUNK__INIT;
        m.init = n == 0 ? &q : NULL;
        m.offset = off;
        m.count = k;
        msgs[n] = bulk(&m.base, w, k * 4);
    }
    free(w);
    zs_err_t err;
    TEST_OK(call(s, M("Initialize"), msgs, n, NULL, NULL, &err), err);
}

/* ---- push, commit, pull --------------------------------------------------------- */

/* One PushChunk of step `step`: count elements of dt at element `off`, by
 * data from src (src != NULL) and/or by reference (ref != NULL). */
static grpc_byte_buffer *push_msg(uint64_t step, uint64_t off, uint64_t count, zs_dtype_t dt,
                                  const void *src, const Zeroshard__ShmRef *ref,
                                  const Zeroshard__StepExpect *expect)
{
    Zeroshard__PushChunk m = ZEROSHARD__PUSH_CHUNK__INIT;
    m.step = step;
    m.offset = off;
    m.count = count;
    m.dtype = (Zeroshard__DType)dt;
    m.shm = (Zeroshard__ShmRef *)ref;
    m.expect = (Zeroshard__StepExpect *)expect;
    return bulk(&m.base, src, src ? count * zs_dtype_size(dt) : 0);
}

/* A reference to staging bytes [at, at + len) of the segment, with their
 * XXH3 seeded with `step` when sum. */
static Zeroshard__ShmRef ref_at(uint64_t at, size_t len, uint64_t step, int sum)
{
    Zeroshard__ShmRef r = ZEROSHARD__SHM_REF__INIT;
    r.session = g_sess;
    r.byte_offset = at;
    r.has_xxh3 = sum;
    if (sum)
        r.xxh3 = XXH3_64bits_withSeed(g_stg + at, len, step);
    return r;
}

/* Push the whole range of g (dt) for `step`: to A by reference (g copied
 * into staging at byte 0 first; checksums when sum), to B by data. */
static void push_both(uint64_t step, const void *g, zs_dtype_t dt, int sum,
                      const Zeroshard__StepExpect *expect)
{
    size_t esz = zs_dtype_size(dt);
    memcpy(g_stg, g, P * esz);
    for (int s = A; s <= B; s++) {
        grpc_byte_buffer *msgs[8];
        int n = 0;
        for (uint64_t off = 0; off < P; off += CH, n++) {
            uint64_t k = P - off < CH ? P - off : CH;
            const Zeroshard__StepExpect *e = n == 0 ? expect : NULL;
            Zeroshard__ShmRef r = ref_at(off * esz, k * esz, step, sum);
            msgs[n] = s == A ? push_msg(step, off, k, dt, NULL, &r, e)
                             : push_msg(step, off, k, dt, (const char *)g + off * esz, NULL, e);
        }
        zs_err_t err;
        TEST_OK(call(s, M("Push"), msgs, n, NULL, NULL, &err), err);
    }
}

static grpc_byte_buffer *commit_msg(uint64_t step, zs_dtype_t pdt)
{
    Zeroshard__CommitRequest q = ZEROSHARD__COMMIT_REQUEST__INIT;
    q.step = step;
    q.grad_scale = 1.0f;
    q.clip_coef = 1.0f;
    q.lr = 1e-3f;
    q.param_dtype = (Zeroshard__DType)pdt;
    return zs_msg_build(&q.base);
}

/* What a Pull's chunks delivered: data into dst; references checked
 * against the request's. */
typedef struct {
    unsigned char *dst; /* data chunks land at (offset - off0) * esz */
    uint64_t off0;
    size_t esz;
    const Zeroshard__ShmRef *want; /* the request's (NULL: a data pull) */
    int nchunks;
    uint64_t elems;
} pull_sink_t;

static void pull_chunk(void *ud, grpc_byte_buffer *bb)
{
    pull_sink_t *ps = ud;
    Zeroshard__PullChunk *m;
    zs_frame_t fr;
    zs_err_t err;
    TEST_OK(
        zs_frame_parse(bb, &zeroshard__pull_chunk__descriptor, (ProtobufCMessage **)&m, &fr, &err),
        err);
    TEST_CHECK(m->offset >= ps->off0 && m->count > 0);
    size_t len = m->count * ps->esz, at = (m->offset - ps->off0) * ps->esz;
    if (!ps->want) {
        TEST_CHECKF(!m->shm && fr.pay_len == len, "data pull chunk: %zu bytes, shm %p", fr.pay_len,
                    (void *)m->shm);
        zs_frame_copy(&fr, ps->dst + at);
    } else {
        const Zeroshard__ShmRef *r = m->shm;
        TEST_CHECKF(r && fr.pay_len == 0, "shm pull chunk without shm or with %zu data bytes",
                    fr.pay_len);
        TEST_CHECKF(r->session == ps->want->session && r->byte_offset == ps->want->byte_offset + at,
                    "PullChunk.shm says session %llx offset %llu, want %llx %llu",
                    (unsigned long long)r->session, (unsigned long long)r->byte_offset,
                    (unsigned long long)ps->want->session,
                    (unsigned long long)(ps->want->byte_offset + at));
        TEST_CHECK(!r->has_xxh3 == !ps->want->has_xxh3);
        if (r->has_xxh3)
            TEST_CHECKF(r->xxh3 == XXH3_64bits_withSeed(g_stg + r->byte_offset, len, m->step),
                        "PullChunk at %llu: xxh3 differs from the written bytes'",
                        (unsigned long long)m->offset);
    }
    ps->nchunks++;
    ps->elems += m->count;
    zeroshard__pull_chunk__free_unpacked(m, NULL);
    zs_frame_deinit(&fr);
}

static grpc_byte_buffer *pull_msg(uint64_t min_step, uint64_t off, uint64_t count, zs_dtype_t dt,
                                  uint32_t chunk_bytes, const Zeroshard__ShmRef *ref)
{
    Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
    q.min_step = min_step;
    q.offset = off;
    q.count = count;
    q.dtype = (Zeroshard__DType)dt;
    q.chunk_bytes = chunk_bytes;
    q.shm = (Zeroshard__ShmRef *)ref;
    return zs_msg_build(&q.base);
}

/* Pull [0, P) in dt from server s by data into out. */
static void pull_data(int s, uint64_t min_step, zs_dtype_t dt, void *out)
{
    pull_sink_t ps = {out, 0, zs_dtype_size(dt), NULL, 0, 0};
    zs_err_t err;
    TEST_OK(call(s, M("Pull"), (grpc_byte_buffer *[]){pull_msg(min_step, 0, P, dt, 0, NULL)}, 1,
                 pull_chunk, &ps, &err),
            err);
    TEST_CHECK(ps.elems == P);
}

/* Pull [0, P) in dt from server s into staging byte `at` in chunks of cb
 * bytes (0: the server's default, 1 MiB). */
static void pull_shm(int s, uint64_t min_step, zs_dtype_t dt, uint64_t at, int sum, uint32_t cb)
{
    Zeroshard__ShmRef r = ZEROSHARD__SHM_REF__INIT;
    r.session = g_sess;
    r.byte_offset = at;
    r.has_xxh3 = sum;
    memset(g_stg + at, 0xA5, P * zs_dtype_size(dt)); /* nothing left from before */
    pull_sink_t ps = {NULL, 0, zs_dtype_size(dt), &r, 0, 0};
    zs_err_t err;
    TEST_OK(call(s, M("Pull"), (grpc_byte_buffer *[]){pull_msg(min_step, 0, P, dt, cb, &r)}, 1,
                 pull_chunk, &ps, &err),
            err);
    uint64_t per = cb ? cb : 1u << 20;
    TEST_CHECK(ps.elems == P && ps.nchunks == (int)((P * zs_dtype_size(dt) + per - 1) / per));
}

/* A's pulls by reference (fp32 and bf16, at two offsets) equal B's by
 * data, bitwise. */
static void compare_pulls(uint64_t step, int sum)
{
    static const zs_dtype_t dts[2] = {ZS_DTYPE_F32, ZS_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        size_t len = P * zs_dtype_size(dts[i]);
        uint64_t at = i == 0 ? 0 : 8192;
        void *b = malloc(len);
        TEST_CHECK(b);
        pull_data(B, step, dts[i], b);
        pull_shm(A, step, dts[i], at, sum, CH * 4);
        TEST_CHECKF(memcmp(g_stg + at, b, len) == 0,
                    "step %llu: %s pulled by reference differs from the pull by data",
                    (unsigned long long)step, zs_dtype_name(dts[i]));
        free(b);
    }
}

static void step_both(uint64_t step, zs_dtype_t dt, int sum, const Zeroshard__StepExpect *e,
                      zs_dtype_t pdt)
{
    float *tmp = malloc(P * 4);
    void *g = malloc(P * 4);
    TEST_CHECK(tmp && g);
    for (uint64_t i = 0; i < P; i++)
        tmp[i] = 0.5f * zs_rand_unit(step, i) + 0.01f * (float)step;
    zs_cast(g, dt, tmp, ZS_DTYPE_F32, P);
    push_both(step, g, dt, sum, e);
    zs_err_t err;
    for (int s = A; s <= B; s++)
        TEST_OK(call(s, M("Commit"), (grpc_byte_buffer *[]){commit_msg(step, pdt)}, 1, NULL, NULL,
                     &err),
                err);
    compare_pulls(step, sum);
    printf("ok  step %llu (%s gradients%s%s): pulls by reference equal pulls by data, fp32 and "
           "bf16\n",
           (unsigned long long)step, zs_dtype_name(dt), sum ? ", checksums both ways" : "",
           e ? ", speculated" : "");
    free(tmp);
    free(g);
}

/* ---- refusals: status, sentence, and A's state unchanged ------------------------ */

typedef struct {
    float *p, *m, *v;
    uint64_t applied, refused;
} snap_t;

static snap_t g_before;

static void state_chunk(void *ud, grpc_byte_buffer *bb)
{
    Zeroshard__StateChunk *m;
    zs_frame_t fr;
    zs_err_t err;
    TEST_OK(
        zs_frame_parse(bb, &zeroshard__state_chunk__descriptor, (ProtobufCMessage **)&m, &fr, &err),
        err);
    TEST_CHECK(m->offset + m->count <= P && fr.pay_len == m->count * 4);
    zs_frame_copy(&fr, (float *)ud + m->offset);
    zeroshard__state_chunk__free_unpacked(m, NULL);
    zs_frame_deinit(&fr);
}

static void snap_take(snap_t *s)
{
    s->p = malloc(P * 4);
    s->m = malloc(P * 4);
    s->v = malloc(P * 4);
    TEST_CHECK(s->p && s->m && s->v);
    pull_data(A, 0, ZS_DTYPE_F32, s->p);
    for (int t = 1; t <= 2; t++) {
        Zeroshard__StateRequest q = ZEROSHARD__STATE_REQUEST__INIT;
        q.tensor = (Zeroshard__Tensor)t;
        q.count = P;
        zs_err_t err;
        TEST_OK(call(A, M("GetState"), (grpc_byte_buffer *[]){zs_msg_build(&q.base)}, 1,
                     state_chunk, t == 1 ? s->m : s->v, &err),
                err);
    }
    Zeroshard__HelloReply *r = hello(A, 0);
    s->applied = r->applied_step;
    s->refused = r->counters->refused;
    zeroshard__hello_reply__free_unpacked(r, NULL);
}

static void snap_free(snap_t *s)
{
    free(s->p);
    free(s->m);
    free(s->v);
}

#define G_INVALID   3
#define G_EXHAUSTED 8
#define G_PRECOND   9
#define G_RANGE     11
#define G_UNAVAIL   14
#define G_DATALOSS  15

/* The case's call gave gRPC status `want` with `needle` in its sentence;
 * A's state is as before (and nothing is staged for the next step: its
 * Commit finds 0 elements, a refusal counted too); A counted 1 + 1. */
static void check(const char *name, int rc, const zs_err_t *err, int want, const char *needle)
{
    TEST_CHECKF(rc != ZS_OK && g_last_grpc == want, "%s: gRPC status %d (%s), want %d", name,
                g_last_grpc, err->msg, want);
    TEST_CHECKF(strstr(err->msg, needle), "%s: '%s' lacks '%s'", name, err->msg, needle);
    char said[ZS_ERR_MSG_MAX];
    snprintf(said, sizeof said, "%s", err->msg);
    int got = g_last_grpc;
    zs_err_t e2;
    uint64_t next = g_before.applied + 1;
    int rc2 = call(A, M("Commit"), (grpc_byte_buffer *[]){commit_msg(next, ZS_DTYPE_NONE)}, 1, NULL,
                   NULL, &e2);
    TEST_CHECKF(rc2 == ZS_ERR_STATE && strstr(e2.msg, " 0 of "),
                "%s: Commit after it: %s (want: 0 of %llu elements staged)", name, e2.msg,
                (unsigned long long)P);
    snap_t now;
    snap_take(&now);
    TEST_CHECKF(memcmp(now.p, g_before.p, P * 4) == 0, "%s: parameters changed", name);
    TEST_CHECKF(memcmp(now.m, g_before.m, P * 4) == 0 && memcmp(now.v, g_before.v, P * 4) == 0,
                "%s: moments changed", name);
    TEST_CHECKF(now.applied == g_before.applied, "%s: applied step moved", name);
    TEST_CHECKF(now.refused == g_before.refused + 2, "%s: A counted %llu refusals, want 2", name,
                (unsigned long long)(now.refused - g_before.refused));
    g_before.refused = now.refused;
    snap_free(&now);
    printf("ok  refused: %s: %d: %s\n", name, got, said);
}

/* A Push stream to A: a good reference chunk of step `next` first (when
 * lead), then `bad`. */
static int push_a(int lead, grpc_byte_buffer *bad, zs_err_t *err)
{
    grpc_byte_buffer *msgs[2];
    int n = 0;
    uint64_t next = g_before.applied + 1;
    if (lead) {
        Zeroshard__ShmRef r = ref_at(0, CH * 2, next, 1);
        msgs[n++] = push_msg(next, 0, CH, ZS_DTYPE_F16, NULL, &r, NULL);
    }
    msgs[n++] = bad;
    return call(A, M("Push"), msgs, n, NULL, NULL, err);
}

static void refusal_cases(void)
{
    snap_take(&g_before);
    uint64_t next = g_before.applied + 1;
    size_t esz = 2; /* fp16 */
    zs_err_t err;
    Zeroshard__ShmRef r = ref_at(CH * esz, CH * esz, next, 1);
    int rc;

    r.session = g_sess ^ 1;
    rc = push_a(1, push_msg(next, CH, CH, ZS_DTYPE_F16, NULL, &r, NULL), &err);
    check("unknown session", rc, &err, G_PRECOND, "unknown shared-memory session");
    r.session = g_sess;

    rc = push_a(1, push_msg(next, CH, CH, ZS_DTYPE_F16, g_stg, &r, NULL), &err);
    check("data and shm both", rc, &err, G_INVALID, "both `data`");

    Zeroshard__ShmRef far = r;
    far.byte_offset = g_stg_bytes - CH; /* half of the chunk's 128 KiB beyond the end */
    rc = push_a(1, push_msg(next, CH, CH, ZS_DTYPE_F16, NULL, &far, NULL), &err);
    check("reference past the staging area", rc, &err, G_RANGE, "outside the");
    far.byte_offset = UINT64_MAX - 1; /* offset + length wraps */
    rc = push_a(1, push_msg(next, CH, CH, ZS_DTYPE_F16, NULL, &far, NULL), &err);
    check("reference wrapping around", rc, &err, G_RANGE, "outside the");
    far.byte_offset = CH * esz + 1;
    rc = push_a(1, push_msg(next, CH, CH, ZS_DTYPE_F16, NULL, &far, NULL), &err);
    check("reference off an element boundary", rc, &err, G_INVALID, "not a multiple");
    rc = push_a(1, push_msg(next, 0, (16u << 20) / 2 + 1, ZS_DTYPE_F16, NULL, &r, NULL), &err);
    check("reference above 16 MiB", rc, &err, G_INVALID, "exceeds the 16777216-byte limit");

    Zeroshard__ShmRef bad = r;
    bad.xxh3 ^= 1;
    rc = push_a(1, push_msg(next, CH, CH, ZS_DTYPE_F16, NULL, &bad, NULL), &err);
    check("checksum mismatch", rc, &err, G_DATALOSS, "checksum mismatch");

    Zeroshard__ShmRef late = ref_at(0, CH * esz, next + 2, 1);
    rc = push_a(0, push_msg(next + 2, 0, CH, ZS_DTYPE_F16, NULL, &late, NULL), &err);
    check("step out of sequence", rc, &err, G_PRECOND, "server is at step");

    Zeroshard__ShmRef pr = ref_at(0, 0, 0, 0);
    pr.session = g_sess ^ 1;
    rc = call(A, M("Pull"), (grpc_byte_buffer *[]){pull_msg(0, 0, P, ZS_DTYPE_F32, 0, &pr)}, 1,
              NULL, NULL, &err);
    check("pull to an unknown session", rc, &err, G_PRECOND, "unknown shared-memory session");
    pr.session = g_sess;
    pr.byte_offset = g_stg_bytes - P * 4 + 4;
    rc = call(A, M("Pull"), (grpc_byte_buffer *[]){pull_msg(0, 0, P, ZS_DTYPE_F32, 0, &pr)}, 1,
              NULL, NULL, &err);
    check("pull past the staging area", rc, &err, G_RANGE, "outside the");
    snap_free(&g_before);
}

/* ---- hand-overs from other processes (forked before gRPC starts) ----------------- */

#define SESSIONS_MAX 64 /* zs-server's table (server/zs_shm_sessions.h) */

typedef struct {
    int rc, accepted;
    uint64_t gen;
    char msg[ZS_ERR_MSG_MAX];
} child_res_t;

enum { AS_NOBODY, FILL_TABLE, LINGER };

/* Hand a new segment of n elements to A's socket (as the server's uid 0
 * when `foreign`: the worker then checks for a server of another uid). */
static int hand_over(zs_shm_t **seg, uint64_t n, const char *token, int foreign, zs_err_t *err)
{
    int rc = zs_shm_create(0, n, n < CH ? (uint32_t)n : CH, seg, err);
    if (rc)
        return rc;
    zs_shm_client_opts_t o = {.path = g_sock,
                              .token = token,
                              .token_len = token ? strlen(token) : 0,
                              .check_server_uid = foreign,
                              .server_uid = 0,
                              .timeout_ms = 5000};
    return zs_shm_connect(&o, *seg, NULL, err);
}

/* A worker process: AS_NOBODY hands a segment over as uid 65534,
 * FILL_TABLE hands tiny ones over until refused (r.accepted of them, each
 * checked by a Hello at once),
 * LINGER hands one of P elements over, reports it and sleeps until killed. */
static pid_t spawn(int kind, int *rd)
{
    int p[2];
    TEST_CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t pid = fork();
    TEST_CHECK(pid >= 0);
    if (pid > 0) {
        close(p[1]);
        *rd = p[0];
        return pid;
    }
    close(p[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failing test leaves no worker behind */
    child_res_t r;
    memset(&r, 0, sizeof r);
    zs_err_t e;
    zs_err_clear(&e);
    zs_shm_t *seg = NULL;
    if (kind == AS_NOBODY) {
        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
            r.rc = zs_err_set(&e, ZS_ERR_IO, "setuid: %s", strerror(errno));
        else
            r.rc = hand_over(&seg, 64, TOKEN, 1, &e);
    } else if (kind == FILL_TABLE) {
        /* gRPC of its own (the parent has none yet): each session must be
         * held by the Hello right after its hand-over, although the server
         * answers the handshake before its listener enters the session. */
        grpc_init();
        wait_serving(A);
        while (r.rc == ZS_OK && r.accepted <= SESSIONS_MAX) {
            r.rc = hand_over(&seg, 64, TOKEN, 0, &e); /* kept mapped until exit */
            if (r.rc == ZS_OK && !session_ok(A, zs_shm_header(seg)->generation))
                r.rc = zs_err_set(&e, ZS_ERR_STATE, "session %d not held by the next Hello",
                                  r.accepted + 1);
            r.accepted += r.rc == ZS_OK;
        }
    } else {
        r.rc = hand_over(&seg, P, TOKEN, 0, &e);
        r.gen = seg ? zs_shm_header(seg)->generation : 0;
    }
    snprintf(r.msg, sizeof r.msg, "%s", e.msg);
    ssize_t n = write(p[1], &r, sizeof r);
    if (kind == LINGER)
        for (;;)
            pause();
    _exit(n == (ssize_t)sizeof r ? 0 : 3);
}

static child_res_t result_of(int rd)
{
    child_res_t r;
    memset(&r, 0, sizeof r);
    TEST_CHECK(read(rd, &r, sizeof r) == (ssize_t)sizeof r);
    close(rd);
    return r;
}

static child_res_t run_child(int kind)
{
    int rd;
    pid_t pid = spawn(kind, &rd);
    child_res_t r = result_of(rd);
    int st;
    TEST_CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return r;
}

static void handover_cases(const char *tmp)
{
    if (geteuid() != 0) {
        printf("skip foreign uid: not root, cannot setuid a child to %d\n", NOBODY);
    } else {
        /* Gate 1, the socket's mode (0600): uid 65534 cannot connect (the
         * temp dir opened to 0711 so that only the socket's mode counts). */
        TEST_CHECK(chmod(tmp, 0711) == 0);
        child_res_t r = run_child(AS_NOBODY);
        TEST_CHECKF(r.rc == ZS_ERR_UNAUTH && strstr(r.msg, "admits its owner only"), "%d %s", r.rc,
                    r.msg);
        /* Gate 2, the server's uid check, with the mode widened. */
        TEST_CHECK(chmod(g_sock, 0666) == 0);
        r = run_child(AS_NOBODY);
        TEST_CHECKF(r.rc == ZS_ERR_UNAUTH && strstr(r.msg, "peer uid 65534 is not allowed"),
                    "%d %s", r.rc, r.msg);
        TEST_CHECK(chmod(g_sock, 0600) == 0 && chmod(tmp, 0700) == 0);
        printf("ok  hand-over: a foreign uid is refused (socket mode, then uid): %s\n", r.msg);
    }
    zs_shm_t *seg = NULL;
    zs_err_t e;
    int rc = hand_over(&seg, 64, "wrong-token", 0, &e);
    TEST_CHECKF(rc == ZS_ERR_UNAUTH && strstr(e.msg, "wrong or missing bearer token"), "%d %s", rc,
                e.msg);
    zs_shm_destroy(seg);
    printf("ok  hand-over: a wrong token is refused: %s\n", e.msg);
    child_res_t r = run_child(FILL_TABLE);
    TEST_CHECKF(r.accepted == SESSIONS_MAX && r.rc == ZS_ERR_BUSY &&
                    strstr(r.msg, "holds 64 shared-memory sessions"),
                "accepted %d, then %d %s", r.accepted, r.rc, r.msg);
    printf("ok  hand-over: %d sessions, each held by the Hello right after it; the next "
           "refused: %s\n",
           r.accepted, r.msg);
}

/* A worker killed with -9: a Pull waiting on its session ends (UNAVAILABLE)
 * and the session with it, within 2 s. */
static void peer_death(pid_t child, uint64_t gen, uint64_t applied)
{
    TEST_CHECK(session_ok(A, gen));
    Zeroshard__ShmRef r = ZEROSHARD__SHM_REF__INIT;
    r.session = gen;
    zs_ccall_t c;
    zs_err_t err;
    TEST_OK(zs_ccall_start(&c, g_ch[A], M("Pull"), TOKEN, TMO_MS, g_srv[A].addr, &err), err);
    TEST_OK(zs_ccall_send(&c, pull_msg(applied + 1, 0, P, ZS_DTYPE_F32, 0, &r), &err), err);
    sleep_ms(300); /* the Pull waits for a step nobody commits */
    TEST_CHECK(kill(child, SIGKILL) == 0 && waitpid(child, NULL, 0) == child);
    int64_t t0 = now_ms();
    grpc_byte_buffer *bb = NULL;
    int rc = zs_ccall_recv(&c, &bb, &err);
    TEST_CHECK(bb == NULL);
    if (c.call) {
        rc = zs_ccall_finish(&c, &err);
        g_last_grpc = (int)c.status;
        zs_ccall_destroy(&c);
    }
    int64_t ended = now_ms() - t0;
    TEST_CHECKF(rc != ZS_OK && g_last_grpc == G_UNAVAIL && strstr(err.msg, "exited"),
                "the Pull on a dead worker's session: %d %s", g_last_grpc, err.msg);
    TEST_CHECKF(ended < 2000, "the Pull ended %lld ms after the kill", (long long)ended);
    int64_t t1 = now_ms();
    while (session_ok(A, gen)) {
        TEST_CHECKF(now_ms() - t1 < 2000, "session still ok 2 s after its worker was killed");
        sleep_ms(50);
    }
    printf("ok  kill -9 of a worker: its Pull ended in %lld ms (%s), its session in %lld ms\n",
           (long long)ended, err.msg, (long long)(now_ms() - t1));
}

/* Server C's budget (5M: its state, 4.2 MiB, and less than a default
 * Pull's two 1 MiB send buffers) refuses a Pull by data, and serves one by
 * reference, which needs no buffers; the same segment serves C and A. */
static void budget_case(void)
{
    initialize(C);
    float *w = malloc(P * 4);
    TEST_CHECK(w);
    pull_sink_t ps = {(unsigned char *)w, 0, 4, NULL, 0, 0};
    zs_err_t err;
    int rc = call(C, M("Pull"), (grpc_byte_buffer *[]){pull_msg(0, 0, P, ZS_DTYPE_F32, 0, NULL)}, 1,
                  pull_chunk, &ps, &err);
    TEST_CHECKF(rc != ZS_OK && g_last_grpc == G_EXHAUSTED && strstr(err.msg, "memory budget"),
                "C's Pull by data: %d %s (want RESOURCE_EXHAUSTED)", rc, err.msg);
    pull_shm(C, 0, ZS_DTYPE_F32, 0, 1, 0);
    for (uint64_t i = 0; i < P; i++)
        w[i] = zs_synth_weight(i);
    TEST_CHECK(memcmp(g_stg, w, P * 4) == 0);
    free(w);
    printf("ok  --mem-budget 5M: a Pull by data is refused (%s), by reference served\n", err.msg);
}

/* ---- main ------------------------------------------------------------------------- */

static void hello_cases(void)
{
    Zeroshard__HelloReply *r = hello(A, g_sess);
    TEST_CHECKF(strcmp(r->shm_socket, g_sock) == 0 && r->shm_session_ok,
                "A's Hello: socket '%s' (want %s), session ok %d", r->shm_socket, g_sock,
                r->shm_session_ok);
    TEST_CHECKF(r->shm_chunk_bytes == (16u << 20), "A's Hello: shm_chunk_bytes %u",
                r->shm_chunk_bytes);
    zeroshard__hello_reply__free_unpacked(r, NULL);
    TEST_CHECK(!session_ok(A, 0) && !session_ok(A, g_sess ^ 1));
    r = hello(B, g_sess);
    TEST_CHECKF(r->shm_socket[0] == '\0' && !r->shm_session_ok && r->shm_chunk_bytes == 0,
                "B (--shm-socket off) Hello: socket '%s', session ok %d, shm_chunk_bytes %u",
                r->shm_socket, r->shm_session_ok, r->shm_chunk_bytes);
    zeroshard__hello_reply__free_unpacked(r, NULL);
    char bsock[300];
    snprintf(bsock, sizeof bsock, "%s/shm.sock", g_srv[B].data_dir);
    TEST_CHECK(access(bsock, F_OK) != 0);
    printf("ok  hello: A offers %s and knows the session; B (off) offers none\n", g_sock);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("ZS_LOG_LEVEL", "error", 0); /* no WARN line per refusal from the servers */
    const char *tmp = zs_test_tmpdir("shms");
    char tokfile[300];
    snprintf(tokfile, sizeof tokfile, "%.200s/token", tmp);
    FILE *f = fopen(tokfile, "w");
    TEST_CHECK(f && fprintf(f, "%s\n", TOKEN) > 0 && fclose(f) == 0);
    for (int s = A; s <= C; s++) {
        snprintf(g_srv[s].data_dir, sizeof g_srv[s].data_dir, "%.200s/%c", tmp, "abc"[s]);
        snprintf(g_srv[s].extra, sizeof g_srv[s].extra, "%s%.220s",
                 s == A   ? "--token-file "
                 : s == B ? "--shm-socket off"
                          : "--mem-budget 5M --spec-window 0",
                 s == A ? tokfile : "");
        zs_test_server_start(&g_srv[s]);
    }
    char real[PATH_MAX];
    TEST_CHECK(realpath(g_srv[A].data_dir, real));
    snprintf(g_sock, sizeof g_sock, "%.4000s/shm.sock", real);
    struct stat st;
    TEST_CHECKF(stat(g_sock, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600,
                "%s: not a 0600 socket", g_sock);

    /* Every fork before gRPC starts in this process. */
    handover_cases(tmp);
    int rd;
    pid_t lingering = spawn(LINGER, &rd);
    child_res_t lr = result_of(rd);
    TEST_CHECKF(lr.rc == ZS_OK && lr.gen, "lingering worker: %s", lr.msg);
    zs_err_t err;
    TEST_OK(hand_over(&g_seg, P, TOKEN, 0, &err), err);
    g_sess = zs_shm_header(g_seg)->generation;
    g_stg = zs_shm_payload(g_seg, ZS_SHM_GRAD, 0);
    g_stg_bytes = zs_shm_header(g_seg)->param_off - zs_shm_header(g_seg)->grad_off;
    TEST_CHECK(g_stg && g_stg_bytes >= P * 4);
    TEST_CHECK(realpath(g_srv[C].data_dir, real));
    char csock[PATH_MAX];
    snprintf(csock, sizeof csock, "%.4000s/shm.sock", real);
    TEST_OK(zs_shm_connect(&(zs_shm_client_opts_t){.path = csock}, g_seg, NULL, &err), err);

    grpc_init();
    for (int s = A; s <= C; s++)
        wait_serving(s);
    hello_cases();
    initialize(A);
    initialize(B);
    step_both(1, ZS_DTYPE_F32, 0, NULL, ZS_DTYPE_NONE);
    Zeroshard__StepExpect e = ZEROSHARD__STEP_EXPECT__INIT;
    e.grad_scale = 1.0f;
    e.lr = 1e-3f;
    e.param_dtype = ZEROSHARD__DTYPE__BF16;
    step_both(2, ZS_DTYPE_BF16, 1, &e, ZS_DTYPE_BF16);

    /* The same segment handed over again replaces its session. */
    TEST_OK(zs_shm_connect(
                &(zs_shm_client_opts_t){.path = g_sock, .token = TOKEN, .token_len = strlen(TOKEN)},
                g_seg, NULL, &err),
            err);
    TEST_CHECK(session_ok(A, g_sess));
    printf("ok  the same session handed over again: replaced, still usable\n");

    refusal_cases();
    step_both(3, ZS_DTYPE_F16, 1, NULL, ZS_DTYPE_NONE); /* the refused pushes left nothing */
    peer_death(lingering, lr.gen, 3);
    budget_case();

    for (int s = A; s <= C; s++)
        grpc_channel_destroy(g_ch[s]);
    TEST_CHECK(stat(g_sock, &st) == 0);
    zs_test_server_stop(&g_srv[A], SIGTERM);
    zs_test_server_stop(&g_srv[B], SIGTERM);
    zs_test_server_stop(&g_srv[C], SIGTERM);
    TEST_CHECKF(stat(g_sock, &st) != 0 && errno == ENOENT, "%s still there after SIGTERM", g_sock);
    printf("ok  the socket file is removed when the server stops (SIGTERM)\n");
    zs_shm_destroy(g_seg);
    grpc_shutdown();
    printf("PASS test_shm_server\n");
    return 0;
}
