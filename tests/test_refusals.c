/*
 * test_refusals.c - integration: every refusal zs-server makes, provoked over
 * the wire against real servers, and proof that none of them changes state
 * ("Nothing lost, nothing trusted" in docs/design.md).
 *
 * Setup: servers 0 and 1 hold model "refusals" (P = 100003, 2 servers) at
 * applied step 2 with checkpoint 2; server 2 runs with a bearer token and
 * holds nothing. Each case sends one bad request (raw zs_ccall_* calls with
 * hand-made messages, or the client library) and checks
 *   (a) the status: the gRPC code of raw calls, and the zs status it maps to;
 *   (b) the message: a key part of the server's sentence;
 *   (c) nothing changed: fp32 pull of [0, P) and GetState of all 3 tensors
 *       bitwise equal to before, Hello's applied/optimizer steps unchanged,
 *       and Hello's `refused` counter grew by the number of servers that
 *       refused (a case cannot pass without reaching the handler it aims at).
 * Methods: Hello, Initialize, Push, Commit, Pull, GetState, SetState,
 * Checkpoint, Restore, DeleteCheckpoints, SetStep (steps above ZS_STEP_MAX
 * everywhere); on server 2 a missing or wrong
 * bearer token, and requests before any model exists. Also raw-wire abuse:
 * garbage to every kind of method, a truncated chunk, an oversized header or
 * unary message, a message just below and several above the receive
 * limit, a unary call without its message; after each the server still
 * serves. Finally step 3 is pushed and committed and must equal a local
 * AdamW step on the state read at the start, bitwise: the refused pushes
 * left nothing behind. Prints "ok  <case>: <status>: <message>" per case.
 * Does not: use TLS, or call unknown methods (zs-server never answers those;
 * the caller waits for its own deadline).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_client.h"
#include "zs_proc.h"
#include "zs_rpc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define P      100003ull
#define MODEL  "refusals"
#define TOKEN  "s3cret-token"
#define M(n)   "/zeroshard.Shard/" n
#define TMO_MS 20000

static zs_test_server_t g_srv[3];
static grpc_channel *g_ch[3];
static zs_client_t *g_cl;
static uint64_t g_end0; /* server 0 owns [0, g_end0), server 1 [g_end0, P) */
static zs_adam_hparams_t g_hp;

/* ---- the state every case must leave alone -------------------------------- */

typedef struct {
    float *pull, *t[3];
    uint64_t applied[2], ostep[2], refused[2];
    int initialized2; /* server 2 (token) holds a model */
} snap_t;

static snap_t g_base;

static int hello_raw(int s, const char *token, zs_server_info_t *out, zs_err_t *err);

static void snap_alloc(snap_t *s)
{
    s->pull = malloc(P * 4);
    TEST_CHECK(s->pull);
    for (int t = 0; t < 3; t++) {
        s->t[t] = malloc(P * 4);
        TEST_CHECK(s->t[t]);
    }
}

static void snap_free(snap_t *s)
{
    free(s->pull);
    for (int t = 0; t < 3; t++)
        free(s->t[t]);
}

static void snap_take(snap_t *s)
{
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_pull(g_cl, 0, 0, P, s->pull, ZS_DTYPE_F32, NULL, &err), err);
    for (int t = 0; t < 3; t++)
        TEST_OK(zs_client_get_state(g_cl, t, 0, P, s->t[t], &err), err);
    zs_server_info_t in[2];
    TEST_OK(zs_client_hello(g_cl, MODEL, P, in, &err), err);
    for (int i = 0; i < 2; i++) {
        s->applied[i] = in[i].applied_step;
        s->ostep[i] = in[i].optimizer_step;
        s->refused[i] = in[i].refused;
    }
    zs_server_info_t i2;
    TEST_OK(hello_raw(2, TOKEN, &i2, &err), err);
    s->initialized2 = i2.initialized;
}

/* ---- names -------------------------------------------------------------------- */

static const char *grpc_name(int g)
{
    static const char *n[] = {"OK",
                              "CANCELLED",
                              "UNKNOWN",
                              "INVALID_ARGUMENT",
                              "DEADLINE_EXCEEDED",
                              "NOT_FOUND",
                              "ALREADY_EXISTS",
                              "PERMISSION_DENIED",
                              "RESOURCE_EXHAUSTED",
                              "FAILED_PRECONDITION",
                              "ABORTED",
                              "OUT_OF_RANGE",
                              "UNIMPLEMENTED",
                              "INTERNAL",
                              "UNAVAILABLE",
                              "DATA_LOSS",
                              "UNAUTHENTICATED"};
    return g >= 0 && g <= 16 ? n[g] : "?";
}

/* ---- raw calls ------------------------------------------------------------------ */

static int g_last_grpc = -1; /* gRPC status of the last raw call */

/* On server s, call `method` sending msgs[0..n) (consumed), then read replies
 * to the end of the call. Returns the call's status (zs code). */
static int raw_call(int s, const char *method, grpc_byte_buffer **msgs, int n, const char *token,
                    int timeout_ms, zs_err_t *err)
{
    zs_ccall_t c;
    zs_err_clear(err);
    g_last_grpc = -1;
    int rc = zs_ccall_start(&c, g_ch[s], method, token, timeout_ms, g_srv[s].addr, err);
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
        grpc_byte_buffer_destroy(bb);
    }
    if (c.call) {
        rc = zs_ccall_finish(&c, err); /* the status is what the server said */
        g_last_grpc = (int)c.status;
        zs_ccall_destroy(&c);
    }
    return rc;
}

static int raw1(int s, const char *method, grpc_byte_buffer *m, zs_err_t *err)
{
    return raw_call(s, method, &m, 1, NULL, TMO_MS, err);
}

static grpc_byte_buffer *raw_bytes(const void *p, size_t n)
{
    grpc_slice s = grpc_slice_from_copied_buffer(p, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* A bulk message: `meta` then a payload of `len` bytes from src (copied; NULL:
 * zeros). */
static grpc_byte_buffer *bulk(const ProtobufCMessage *meta, const void *src, size_t len)
{
    void *p = calloc(1, len ? len : 1);
    TEST_CHECK(p);
    if (src)
        memcpy(p, src, len);
    grpc_byte_buffer *bb = zs_frame_build(meta, p, len, free, p);
    TEST_CHECK(bb);
    return bb;
}

static grpc_byte_buffer *push_msg(uint64_t step, uint64_t off, uint64_t count, int dt,
                                  const void *src, size_t len)
{
    Zeroshard__PushChunk m = ZEROSHARD__PUSH_CHUNK__INIT;
    m.step = step;
    m.offset = off;
    m.count = count;
    m.dtype = (Zeroshard__DType)dt;
    return bulk(&m.base, src, len);
}

static Zeroshard__AdamConfig g_adam_pb = ZEROSHARD__ADAM_CONFIG__INIT;

static Zeroshard__InitRequest init_req(const char *model, uint64_t p, uint32_t s, uint32_t i)
{
    Zeroshard__InitRequest q = ZEROSHARD__INIT_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    q.model_name = (char *)model;
    q.num_params = p;
    q.num_servers = s;
    q.server_index = i;
    q.adam = &g_adam_pb;
    return q;
}

/* An InitChunk of master weights [off, off+count) (synthetic weights, `len`
 * bytes: count*4 unless a case wants a mismatch), with `q` if not NULL. */
static grpc_byte_buffer *init_msg(Zeroshard__InitRequest *q, uint64_t off, uint64_t count, int dt,
                                  size_t len)
{
    Zeroshard__InitChunk m = ZEROSHARD__INIT_CHUNK__INIT;
    m.init = q;
    m.offset = off;
    m.count = count;
    m.dtype = (Zeroshard__DType)dt;
    float *w = calloc(1, len + 4);
    TEST_CHECK(w);
    for (uint64_t k = 0; k < len / 4; k++)
        w[k] = zs_synth_weight(off + k);
    grpc_byte_buffer *bb = bulk(&m.base, w, len);
    free(w);
    return bb;
}

/* Every init chunk of server `s`'s whole range for model `q`, in 1 MiB
 * messages, into msgs (returns how many). */
static int init_full(Zeroshard__InitRequest *q, uint64_t b, uint64_t e, grpc_byte_buffer **msgs,
                     int max)
{
    int n = 0;
    for (uint64_t off = b; off < e; off += 262144) {
        uint64_t k = e - off < 262144 ? e - off : 262144;
        TEST_CHECK(n < max);
        msgs[n] = init_msg(n == 0 ? q : NULL, off, k, ZEROSHARD__DTYPE__F32, k * 4);
        n++;
    }
    return n;
}

static grpc_byte_buffer *commit_msg(uint64_t step, float gs, float cc, float lr, int skip, int pdt)
{
    Zeroshard__CommitRequest q = ZEROSHARD__COMMIT_REQUEST__INIT;
    q.step = step;
    q.grad_scale = gs;
    q.clip_coef = cc;
    q.lr = lr;
    q.skip = skip;
    q.param_dtype = (Zeroshard__DType)pdt;
    return zs_msg_build(&q.base);
}

static grpc_byte_buffer *pull_msg(uint64_t min_step, uint64_t off, uint64_t count, int dt,
                                  uint32_t chunk_bytes)
{
    Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
    q.min_step = min_step;
    q.offset = off;
    q.count = count;
    q.dtype = (Zeroshard__DType)dt;
    q.chunk_bytes = chunk_bytes;
    return zs_msg_build(&q.base);
}

static grpc_byte_buffer *state_req(int tensor, uint64_t off, uint64_t count)
{
    Zeroshard__StateRequest q = ZEROSHARD__STATE_REQUEST__INIT;
    q.tensor = (Zeroshard__Tensor)tensor;
    q.offset = off;
    q.count = count;
    return zs_msg_build(&q.base);
}

static grpc_byte_buffer *state_chunk(int tensor, uint64_t off, uint64_t count, const float *src,
                                     size_t len)
{
    Zeroshard__StateChunk m = ZEROSHARD__STATE_CHUNK__INIT;
    m.tensor = (Zeroshard__Tensor)tensor;
    m.offset = off;
    m.count = count;
    return bulk(&m.base, src, len);
}

static grpc_byte_buffer *hello_msg(uint32_t version, const char *model, uint64_t p)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = version;
    q.model_name = (char *)model;
    q.num_params = p;
    return zs_msg_build(&q.base);
}

static int hello_raw(int s, const char *token, zs_server_info_t *out, zs_err_t *err)
{
    zs_ccall_t c;
    int rc = zs_ccall_start(&c, g_ch[s], M("Hello"), token, TMO_MS, g_srv[s].addr, err);
    if (rc)
        return rc;
    rc = zs_ccall_send(&c, hello_msg(ZS_PROTOCOL_VERSION, "", 0), err);
    grpc_byte_buffer *bb = NULL;
    if (!rc)
        rc = zs_ccall_recv(&c, &bb, err);
    if (!rc && !bb)
        rc = zs_err_set(err, ZS_ERR_INTERNAL, "Hello without a reply");
    if (!rc) {
        Zeroshard__HelloReply *r;
        rc = zs_msg_parse(bb, &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, err);
        if (!rc) {
            memset(out, 0, sizeof *out);
            out->initialized = r->initialized;
            out->applied_step = r->applied_step;
            out->refused = r->counters ? r->counters->refused : 0;
            zeroshard__hello_reply__free_unpacked(r, NULL);
        }
    }
    if (bb)
        grpc_byte_buffer_destroy(bb);
    if (!rc)
        rc = zs_ccall_finish(&c, err);
    zs_ccall_destroy(&c);
    return rc;
}

/* ---- the check after every case ----------------------------------------------------- */

static int g_cases;

/* rc/err: what the case got; want: the zs status; needle: part of the
 * message; grpc_want: the raw gRPC status (-1: not a raw call); refusals:
 * how many of servers 0/1 counted a refusal (-1: do not check). */
static void check(const char *name, int rc, const zs_err_t *err, int want, int grpc_want,
                  const char *needle, int refusals)
{
    TEST_CHECKF(rc == want, "%s: got %s (%s), want %s", name, zs_status_name(rc), err->msg,
                zs_status_name(want));
    TEST_CHECKF(strstr(err->msg, needle), "%s: message '%s' lacks '%s'", name, err->msg, needle);
    if (grpc_want >= 0)
        TEST_CHECKF(g_last_grpc == grpc_want, "%s: gRPC status %s, want %s", name,
                    grpc_name(g_last_grpc), grpc_name(grpc_want));
    snap_t now;
    snap_alloc(&now);
    snap_take(&now);
    TEST_CHECKF(memcmp(now.pull, g_base.pull, P * 4) == 0, "%s: pulled parameters changed", name);
    static const char *tn[3] = {"master", "exp_avg", "exp_avg_sq"};
    for (int t = 0; t < 3; t++)
        TEST_CHECKF(memcmp(now.t[t], g_base.t[t], P * 4) == 0, "%s: %s changed", name, tn[t]);
    uint64_t grew = 0;
    for (int i = 0; i < 2; i++) {
        TEST_CHECKF(now.applied[i] == g_base.applied[i] && now.ostep[i] == g_base.ostep[i],
                    "%s: server %d steps moved to (%llu, %llu)", name, i,
                    (unsigned long long)now.applied[i], (unsigned long long)now.ostep[i]);
        grew += now.refused[i] - g_base.refused[i];
        g_base.refused[i] = now.refused[i];
    }
    TEST_CHECKF(refusals < 0 || grew == (uint64_t)refusals,
                "%s: servers counted %llu refusals, want %d", name, (unsigned long long)grew,
                refusals);
    TEST_CHECKF(now.initialized2 == g_base.initialized2, "%s: token server state changed", name);
    snap_free(&now);
    g_cases++;
    printf("ok  %s: %s: %s\n", name,
           grpc_want >= 0 ? grpc_name(g_last_grpc) : grpc_name(zs_status_to_grpc(rc)), err->msg);
}

#define G_INVALID   3
#define G_DEADLINE  4
#define G_NOTFOUND  5
#define G_EXISTS    6
#define G_EXHAUSTED 8
#define G_PRECOND   9
#define G_RANGE     11
#define G_UNAUTH    16

/* ---- cases ------------------------------------------------------------------------ */

static void hello_cases(void)
{
    zs_err_t err;
    /* Versions 1 and 3 are negotiated, not refused: tests/test_protocol.c. */
    int rc = raw1(0, M("Hello"), hello_msg(0, "", 0), &err);
    check("Hello: no protocol version (proto3's 0) is accepted", rc, &err, ZS_OK, 0, "", 0);
    /* A name with a NUL byte (protobuf-c would stop at it: "refusals"). */
    static const char nul_hello[] = "\x08\x01\x12\x0crefusals\0evi";
    rc = raw1(0, M("Hello"), raw_bytes(nul_hello, sizeof nul_hello - 1), &err);
    check("Hello: model name 'refusals\\0evi'", rc, &err, ZS_ERR_INVALID, G_INVALID, "NUL byte", 1);
    rc = zs_client_hello(g_cl, "other-model", P, NULL, &err);
    check("Hello: model name mismatch", rc, &err, ZS_ERR_STATE, -1,
          "holds model 'refusals', not 'other-model'", 2);
    rc = zs_client_hello(g_cl, MODEL, P - 1, NULL, &err);
    check("Hello: P mismatch", rc, &err, ZS_ERR_STATE, -1, "holds 100003 parameters of", 2);
}

static void init_cases(void)
{
    zs_err_t err;
    grpc_byte_buffer *m[8];
    Zeroshard__InitRequest q;
    int rc;

    q = init_req("other-model", P, 2, 0);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: a different model without overwrite", rc, &err, ZS_ERR_EXISTS, G_EXISTS,
          "already holds model 'refusals'", 1);
    q = init_req(MODEL, P + 64, 2, 0);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: same name, different P, no overwrite", rc, &err, ZS_ERR_EXISTS, G_EXISTS,
          "set overwrite to replace it", 1);
    q = init_req(MODEL, P, 2, 2);
    q.overwrite = 1;
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: server_index 2 of 2 servers", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "server_index 2 must be below num_servers 2", 1);
    q = init_req(MODEL, 0, 2, 0);
    q.overwrite = 1;
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: P = 0", rc, &err, ZS_ERR_INVALID, G_INVALID, "num_params 0", 1);
    q = init_req(MODEL, P, 0, 0);
    q.overwrite = 1;
    m[0] = init_msg(&q, 0, 0, ZEROSHARD__DTYPE__F32, 0);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: 0 servers", rc, &err, ZS_ERR_INVALID, G_INVALID, "num_servers 0", 1);
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    q = init_req(longname, P, 2, 0);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: model name of 199 characters", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "model name longer than 127", 1);
    /* InitChunk{init: InitRequest{version, name "refusals\0evil", P, S 2}}, by hand:
     * protobuf-c cannot pack a string with a NUL. */
    uint8_t ib[64];
    size_t in = 0;
    static const char nm[] = "refusals\0evil";
    ib[in++] = 0x0A; /* InitChunk.init */
    size_t lenpos = in++;
    ib[in++] = 0x08; /* protocol_version */
    ib[in++] = ZS_PROTOCOL_VERSION;
    ib[in++] = 0x12; /* model_name */
    ib[in++] = (uint8_t)(sizeof nm - 1);
    memcpy(ib + in, nm, sizeof nm - 1);
    in += sizeof nm - 1;
    ib[in++] = 0x18; /* num_params 100003 = 0x186A3 */
    ib[in++] = 0xA3;
    ib[in++] = 0x8D;
    ib[in++] = 0x06;
    ib[in++] = 0x20; /* num_servers 2 */
    ib[in++] = 2;
    ib[lenpos] = (uint8_t)(in - lenpos - 1);
    m[0] = raw_bytes(ib, in);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: model name 'refusals\\0evil'", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "NUL byte", 1);
    q = init_req(MODEL, P, 2, 0);
    q.adam = NULL;
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: no adam hyperparameters", rc, &err, ZS_ERR_INVALID, G_INVALID, "lacks adam",
          1);
    Zeroshard__AdamConfig bad = g_adam_pb;
    bad.beta2 = 1.5f;
    q = init_req(MODEL, P, 2, 0);
    q.adam = &bad;
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: beta2 = 1.5", rc, &err, ZS_ERR_INVALID, G_INVALID, "betas", 1);
    m[0] = init_msg(NULL, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: first message lacks init", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "first Initialize message lacks `init`", 1);
    rc = raw_call(0, M("Initialize"), m, 0, NULL, TMO_MS, &err);
    check("Initialize: empty stream", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "empty Initialize stream", 1);

    /* The same model (so init_begin accepts) with bad chunks. */
    q = init_req(MODEL, P, 2, 0);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__BF16, 2000);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: bf16 master weights", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "master weights must be fp32, got bf16", 1);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    m[1] = init_msg(NULL, 1064, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 2, NULL, TMO_MS, &err);
    check("Initialize: gap in offsets", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "contiguous: expected offset 1000, got 1064", 1);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    m[1] = init_msg(NULL, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 2, NULL, TMO_MS, &err);
    check("Initialize: a chunk sent twice", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "contiguous: expected offset 1000, got 0", 1);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    m[1] = init_msg(NULL, 1000, g_end0, ZEROSHARD__DTYPE__F32, g_end0 * 4);
    rc = raw_call(0, M("Initialize"), m, 2, NULL, TMO_MS, &err);
    check("Initialize: a chunk beyond the server's range", rc, &err, ZS_ERR_RANGE, G_RANGE,
          "outside this server's range", 1);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 3999);
    rc = raw_call(0, M("Initialize"), m, 1, NULL, TMO_MS, &err);
    check("Initialize: payload of 3999 bytes for 1000 fp32", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "carries 3999 bytes", 1);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    m[1] = init_msg(&q, 1000, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 2, NULL, TMO_MS, &err);
    check("Initialize: init repeated in a later message", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "first message only", 1);
    m[0] = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    m[1] = init_msg(NULL, 1000, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), m, 2, NULL, TMO_MS, &err);
    check("Initialize: stream ended early", rc, &err, ZS_ERR_STATE, G_PRECOND,
          "ended at element 2000", 1);

    /* A complete, valid stream plus one chunk that claims elements but
     * carries none: must be refused, not skipped (it would re-initialise). */
    grpc_byte_buffer *all[8];
    int n = init_full(&q, 0, g_end0, all, 7);
    all[n++] = init_msg(NULL, g_end0, 10, ZEROSHARD__DTYPE__F32, 0);
    rc = raw_call(0, M("Initialize"), all, n, NULL, TMO_MS, &err);
    check("Initialize: a chunk with count 10 and no payload", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "carries 0 bytes", 1);
}

static void push_cases(const void *g3, uint64_t pushed)
{
    zs_err_t err;
    grpc_byte_buffer *m[2];
    int rc;
    rc = raw1(0, M("Push"), push_msg(2, 0, 10, ZS_DTYPE_F32, NULL, 40), &err);
    check("Push: step in the past", rc, &err, ZS_ERR_STATE, G_PRECOND,
          "step 2 is already committed", 1);
    rc = raw1(0, M("Push"), push_msg(4, 0, 10, ZS_DTYPE_F32, NULL, 40), &err);
    check("Push: step in the future", rc, &err, ZS_ERR_STATE, G_PRECOND,
          "expects the next step only", 1);
    rc = raw1(0, M("Push"), push_msg(3, g_end0, 10, ZS_DTYPE_F32, NULL, 40), &err);
    check("Push: range of the other server", rc, &err, ZS_ERR_RANGE, G_RANGE,
          "outside this server's range", 1);
    rc = raw1(0, M("Push"), push_msg(3, g_end0 - 5, 10, ZS_DTYPE_F32, NULL, 40), &err);
    check("Push: range straddling the server's end", rc, &err, ZS_ERR_RANGE, G_RANGE,
          "outside this server's range", 1);
    rc = raw1(1, M("Push"), push_msg(3, P, 1, ZS_DTYPE_F32, NULL, 4), &err);
    check("Push: offset P", rc, &err, ZS_ERR_RANGE, G_RANGE, "outside", 1);
    rc = raw1(0, M("Push"), push_msg(3, 0, 0, ZS_DTYPE_F32, NULL, 0), &err);
    check("Push: count 0", rc, &err, ZS_ERR_INVALID, G_INVALID, "count 0", 1);
    rc = raw1(0, M("Push"), push_msg(3, 0, 10, ZS_DTYPE_F32, NULL, 36), &err);
    check("Push: payload 36 bytes for 10 fp32", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "carries 36 bytes", 1);
    rc = raw1(0, M("Push"), push_msg(3, 0, 10, ZS_DTYPE_BF16, NULL, 40), &err);
    check("Push: payload 40 bytes for 10 bf16", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "carries 40 bytes", 1);
    rc = raw1(0, M("Push"), push_msg(3, 0, 10, ZS_DTYPE_NONE, NULL, 20), &err);
    check("Push: dtype NONE", rc, &err, ZS_ERR_INVALID, G_INVALID, "unknown dtype 3", 1);
    rc = raw1(0, M("Push"), push_msg(3, 0, 10, 9, NULL, 20), &err);
    check("Push: dtype 9", rc, &err, ZS_ERR_INVALID, G_INVALID, "unknown dtype 9", 1);
    size_t big = ZS_RPC_MAX_CHUNK_BYTES + 4;
    rc = raw1(0, M("Push"), push_msg(3, 0, big / 4, ZS_DTYPE_F32, NULL, big), &err);
    check("Push: chunk of 4 MiB + 4 bytes", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "exceeds the 4194304-byte limit", 1);
    /* A valid fp16 chunk, then one out of range: refused, and the fp16 chunk
     * neither stays staged nor fixes step 3's dtype (the bf16 push below is
     * accepted; commit_cases sees only its elements staged). */
    m[0] = push_msg(3, pushed, 10, ZS_DTYPE_F16, NULL, 20);
    m[1] = push_msg(3, g_end0, 10, ZS_DTYPE_F16, NULL, 20);
    rc = raw_call(0, M("Push"), m, 2, NULL, TMO_MS, &err);
    check("Push: a valid fp16 chunk, then one out of range", rc, &err, ZS_ERR_RANGE, G_RANGE,
          "outside this server's range", 1);
    /* Stage [0, pushed) of step 3 in bf16: accepted. */
    m[0] = push_msg(3, 0, pushed, ZS_DTYPE_BF16, g3, pushed * 2);
    rc = raw_call(0, M("Push"), m, 1, NULL, TMO_MS, &err);
    check("Push: bf16 [0, 1000) of step 3 after the refused fp16 stream (accepted)", rc, &err,
          ZS_OK, 0, "", 0);
    /* A re-push of [0, pushed) with zeros, then an fp32 chunk: refused, and
     * the staged g3 of [0, pushed) is left as it was (final_step does not
     * push it again). */
    m[0] = push_msg(3, 0, pushed, ZS_DTYPE_BF16, NULL, pushed * 2);
    m[1] = push_msg(3, pushed, 10, ZS_DTYPE_F32, NULL, 40);
    rc = raw_call(0, M("Push"), m, 2, NULL, TMO_MS, &err);
    check("Push: dtype mixed within a step (after re-pushing staged elements)", rc, &err,
          ZS_ERR_INVALID, G_INVALID, "step 3 is staged in bf16; a chunk in fp32 cannot be mixed in",
          1);
    rc = raw1(0, M("Push"), push_msg(3, pushed, 10, ZS_DTYPE_F16, NULL, 20), &err);
    check("Push: fp16 into a step staged in bf16", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "cannot be mixed in", 1);
}

static void commit_cases(const zs_step_scalars_t *s2, uint64_t pushed)
{
    zs_err_t err;
    int rc;
    char needle[96];
    snprintf(needle, sizeof needle, "%llu of %llu elements staged", (unsigned long long)pushed,
             (unsigned long long)g_end0);
    rc = raw1(0, M("Commit"), commit_msg(3, 1, 1, 1e-3f, 0, ZS_DTYPE_BF16), &err);
    check("Commit: incomplete staging", rc, &err, ZS_ERR_STATE, G_PRECOND, needle, 1);
    rc = raw1(1, M("Commit"), commit_msg(3, 1, 1, 1e-3f, 0, ZS_DTYPE_BF16), &err);
    check("Commit: nothing staged", rc, &err, ZS_ERR_STATE, G_PRECOND, "0 of 50019 elements staged",
          1);
    rc = raw1(0, M("Commit"), commit_msg(5, 1, 1, 1e-3f, 0, ZS_DTYPE_BF16), &err);
    check("Commit: wrong step", rc, &err, ZS_ERR_STATE, G_PRECOND,
          "server is at step 2 and expects step 3", 1);
    rc = raw1(0, M("Commit"), commit_msg(3, NAN, 1, 1e-3f, 0, ZS_DTYPE_BF16), &err);
    check("Commit: NaN grad_scale", rc, &err, ZS_ERR_INVALID, G_INVALID, "finite and >= 0", 1);
    rc = raw1(0, M("Commit"), commit_msg(3, 1, 1, -1e-3f, 1, ZS_DTYPE_BF16), &err);
    check("Commit: negative lr (even with skip)", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "finite and >= 0", 1);
    rc = raw1(0, M("Commit"), commit_msg(3, 1, -INFINITY, 1e-3f, 0, ZS_DTYPE_BF16), &err);
    check("Commit: -inf clip_coef", rc, &err, ZS_ERR_INVALID, G_INVALID, "finite", 1);
    rc = raw1(0, M("Commit"), commit_msg(3, 1, 1, 1e-3f, 0, 9), &err);
    check("Commit: param_dtype 9", rc, &err, ZS_ERR_INVALID, G_INVALID, "unknown param_dtype 9", 1);
    rc = raw1(0, M("Commit"), commit_msg(3, 1, 1, 1e-3f, 0, ZS_DTYPE_F32), &err);
    check("Commit: param_dtype F32 (proto3's default) means no copy: only the staging is missing",
          rc, &err, ZS_ERR_STATE, G_PRECOND, "elements staged", 1);
    zs_step_scalars_t d = *s2;
    d.lr *= 0.5f;
    rc = zs_client_commit(g_cl, &d, &err);
    check("Commit: step 2 again with a different lr", rc, &err, ZS_ERR_STATE, -1,
          "step 2 was already committed with different scalars", 2);
    zs_err_clear(&err);
    rc = zs_client_commit(g_cl, s2, &err);
    check("Commit: step 2 again with the same scalars (idempotent, OK)", rc, &err, ZS_OK, -1, "",
          0);
}

static void read_cases(void)
{
    zs_err_t err;
    int rc;
    rc = raw1(0, M("Pull"), pull_msg(0, 0, 10, ZS_DTYPE_NONE, 0), &err);
    check("Pull: dtype NONE", rc, &err, ZS_ERR_INVALID, G_INVALID, "unknown pull dtype 3", 1);
    rc = raw1(0, M("Pull"), pull_msg(0, 0, 10, 5, 0), &err);
    check("Pull: dtype 5", rc, &err, ZS_ERR_INVALID, G_INVALID, "unknown pull dtype 5", 1);
    rc = raw1(0, M("Pull"), pull_msg(0, g_end0 - 1, 2, ZS_DTYPE_F32, 0), &err);
    check("Pull: out of range", rc, &err, ZS_ERR_RANGE, G_RANGE, "outside this server's range", 1);
    rc = raw1(1, M("Pull"), pull_msg(0, 0, 10, ZS_DTYPE_BF16, 0), &err);
    check("Pull: server 0's range from server 1", rc, &err, ZS_ERR_RANGE, G_RANGE, "outside", 1);
    rc = raw1(0, M("Pull"), pull_msg(0, 0, 0, ZS_DTYPE_F32, 0), &err);
    check("Pull: count 0", rc, &err, ZS_ERR_INVALID, G_INVALID, "count 0", 1);
    rc = raw1(0, M("Pull"), pull_msg(0, 0, 10, ZS_DTYPE_F32, 4095), &err);
    check("Pull: chunk_bytes 4095", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "chunk_bytes 4095 outside 4096..", 1);
    rc =
        raw1(0, M("Pull"), pull_msg(0, 0, 10, ZS_DTYPE_F32, ZS_RPC_MAX_PULL_CHUNK_BYTES + 1), &err);
    check("Pull: chunk_bytes above 4 MiB - 4 KiB", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "chunk_bytes 4190209 outside 4096..4190208", 1);
    grpc_byte_buffer *m = pull_msg(9, 0, 10, ZS_DTYPE_F32, 0);
    rc = raw_call(0, M("Pull"), &m, 1, NULL, 700, &err);
    check("Pull: a step never committed", rc, &err, ZS_ERR_TIMEOUT, G_DEADLINE, "deadline", -1);

    rc = raw1(0, M("GetState"), state_req(3, 0, 10), &err);
    check("GetState: tensor 3", rc, &err, ZS_ERR_INVALID, G_INVALID, "unknown tensor 3", 1);
    rc = raw1(0, M("GetState"), state_req(1, g_end0, 10), &err);
    check("GetState: out of range", rc, &err, ZS_ERR_RANGE, G_RANGE, "outside", 1);
    rc = raw1(1, M("GetState"), state_req(2, P - 1, 2), &err);
    check("GetState: past P", rc, &err, ZS_ERR_RANGE, G_RANGE, "outside", 1);
    rc = raw1(0, M("GetState"), state_req(0, 5, 0), &err);
    check("GetState: count 0", rc, &err, ZS_ERR_INVALID, G_INVALID, "count 0", 1);
}

static void set_state_cases(void)
{
    zs_err_t err;
    grpc_byte_buffer *m[5];
    int rc;
    float *ones = malloc(g_end0 * 4);
    TEST_CHECK(ones);
    for (uint64_t i = 0; i < g_end0; i++)
        ones[i] = 1.0f;
    m[0] = state_chunk(3, 0, 10, ones, 40);
    rc = raw_call(0, M("SetState"), m, 1, NULL, TMO_MS, &err);
    check("SetState: tensor 3", rc, &err, ZS_ERR_INVALID, G_INVALID, "unknown tensor 3", 1);
    m[0] = state_chunk(0, g_end0 - 5, 10, ones, 40);
    rc = raw_call(0, M("SetState"), m, 1, NULL, TMO_MS, &err);
    check("SetState: out of range", rc, &err, ZS_ERR_RANGE, G_RANGE, "outside", 1);
    m[0] = state_chunk(0, 0, 10, ones, 44);
    rc = raw_call(0, M("SetState"), m, 1, NULL, TMO_MS, &err);
    check("SetState: payload 44 bytes for 10 fp32", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "carries 44 bytes", 1);
    m[0] = state_chunk(1, 0, 0, ones, 0);
    rc = raw_call(0, M("SetState"), m, 1, NULL, TMO_MS, &err);
    check("SetState: count 0", rc, &err, ZS_ERR_INVALID, G_INVALID, "count 0", 1);
    /* Valid chunks first: none may be applied when a later one is bad. */
    m[0] = state_chunk(0, 0, 1000, ones, 4000);
    m[1] = state_chunk(1, 0, 1000, ones, 4000);
    m[2] = state_chunk(2, 0, 1000, ones, 4000);
    m[3] = state_chunk(2, g_end0, 1000, ones, 4000);
    rc = raw_call(0, M("SetState"), m, 4, NULL, TMO_MS, &err);
    check("SetState: 3 valid chunks, then one out of range", rc, &err, ZS_ERR_RANGE, G_RANGE,
          "outside", 1);
    for (int k = 0; k < 4; k++)
        m[k] = state_chunk(k % 3, 0, g_end0, ones, g_end0 * 4);
    rc = raw_call(0, M("SetState"), m, 4, NULL, TMO_MS, &err);
    check("SetState: stream above 3x the range", rc, &err, ZS_ERR_RANGE, G_RANGE,
          "larger than 3x the range", 1);
    free(ones);
}

static void checkpoint_cases(void)
{
    zs_err_t err;
    int rc = zs_client_checkpoint(g_cl, 1, 0, &err);
    check("Checkpoint: step 1 while at step 2", rc, &err, ZS_ERR_STATE, -1,
          "checkpoint of step 1 refused: server is at step 2", 2);
    rc = zs_client_checkpoint(g_cl, 3, 0, &err);
    check("Checkpoint: step 3 while at step 2", rc, &err, ZS_ERR_STATE, -1, "server is at step 2",
          2);
    Zeroshard__CheckpointRequest cq = ZEROSHARD__CHECKPOINT_REQUEST__INIT;
    cq.step = 2;
    cq.keep = 2000000;
    rc = raw1(0, M("Checkpoint"), zs_msg_build(&cq.base), &err);
    check("Checkpoint: keep 2000000", rc, &err, ZS_ERR_INVALID, G_INVALID, "not sensible", 1);
    rc = zs_client_restore(g_cl, 7, &err);
    check("Restore: a missing step", rc, &err, ZS_ERR_NOTFOUND, -1, "step 7", 2);
    Zeroshard__RestoreRequest rq = ZEROSHARD__RESTORE_REQUEST__INIT;
    rc = raw1(1, M("Restore"), zs_msg_build(&rq.base), &err);
    check("Restore: step 0", rc, &err, ZS_ERR_NOTFOUND, G_NOTFOUND, "step 0", 1);
    rc = zs_client_delete(g_cl, 0, 0, &err);
    check("Delete: keep 0", rc, &err, ZS_ERR_INVALID, -1, "keep must be >= 1", 2);
    rc = zs_client_delete(g_cl, 7, 0, &err);
    check("Delete: a missing step", rc, &err, ZS_ERR_NOTFOUND, -1, "step 7", 2);
    Zeroshard__DeleteRequest dq = ZEROSHARD__DELETE_REQUEST__INIT;
    dq.keep = 3000000;
    rc = raw1(0, M("DeleteCheckpoints"), zs_msg_build(&dq.base), &err);
    check("Delete: keep 3000000", rc, &err, ZS_ERR_INVALID, G_INVALID, "not sensible", 1);
    uint64_t steps[4];
    size_t n;
    TEST_OK(zs_client_checkpoints(g_cl, steps, 4, &n, &err), err);
    TEST_CHECKF(n == 1 && steps[0] == 2, "checkpoints changed: %zu", n);
}

static grpc_byte_buffer *set_step_msg(uint64_t step, uint64_t ostep)
{
    Zeroshard__SetStepRequest q = ZEROSHARD__SET_STEP_REQUEST__INIT;
    q.step = step;
    q.optimizer_step = ostep;
    return zs_msg_build(&q.base);
}

/* Steps beyond ZS_STEP_MAX anywhere: refused before they can wrap. */
static void step_bound_cases(void)
{
    zs_err_t err;
    int rc = raw1(0, M("SetStep"), set_step_msg(UINT64_MAX, 0), &err);
    check("SetStep: step 2^64-1", rc, &err, ZS_ERR_INVALID, G_INVALID, "above the largest step", 1);
    rc = raw1(1, M("SetStep"), set_step_msg(ZS_STEP_MAX + 1, ZS_STEP_MAX), &err);
    check("SetStep: ZS_STEP_MAX + 1", rc, &err, ZS_ERR_INVALID, G_INVALID, "above the largest step",
          1);
    rc = raw1(0, M("SetStep"), set_step_msg(5, 6), &err);
    check("SetStep: optimizer_step above step", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "optimizer_step 6 above step 5", 1);
    rc = raw1(0, M("Push"), push_msg(UINT64_MAX, 0, 10, ZS_DTYPE_F32, NULL, 40), &err);
    check("Push: step 2^64-1", rc, &err, ZS_ERR_INVALID, G_INVALID, "above the largest step", 1);
    rc = raw1(0, M("Commit"), commit_msg(UINT64_MAX, 1, 1, 1e-3f, 1, ZS_DTYPE_NONE), &err);
    check("Commit: step 2^64-1 (skip)", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "above the largest step", 1);
    rc = raw1(1, M("Pull"), pull_msg(UINT64_MAX, g_end0, 10, ZS_DTYPE_F32, 0), &err);
    check("Pull: min_step 2^64-1", rc, &err, ZS_ERR_INVALID, G_INVALID, "above the largest step",
          1);
    Zeroshard__InitRequest q = init_req(MODEL, P, 2, 0);
    q.start_step = UINT64_MAX;
    grpc_byte_buffer *m = init_msg(&q, 0, 1000, ZEROSHARD__DTYPE__F32, 4000);
    rc = raw_call(0, M("Initialize"), &m, 1, NULL, TMO_MS, &err);
    check("Initialize: start_step 2^64-1", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "above the largest step", 1);
}

/* Server 2 requires a token and holds no model. */
static void token_cases(void)
{
    zs_err_t err;
    zs_server_info_t in;
    int rc = hello_raw(2, NULL, &in, &err);
    check("token server: Hello without a token", rc, &err, ZS_ERR_UNAUTH, -1,
          "missing or wrong bearer token", 0);
    rc = hello_raw(2, "wrong", &in, &err);
    check("token server: Hello with a wrong token", rc, &err, ZS_ERR_UNAUTH, -1,
          "missing or wrong bearer token", 0);
    Zeroshard__InitRequest q = init_req(MODEL, P, 1, 0);
    grpc_byte_buffer *all[8];
    int n = init_full(&q, 0, P, all, 8);
    rc = raw_call(2, M("Initialize"), all, n, "s3cret-token-", TMO_MS, &err);
    check("token server: full Initialize with a wrong token", rc, &err, ZS_ERR_UNAUTH, G_UNAUTH,
          "missing or wrong bearer token", 0);
    grpc_byte_buffer *m = push_msg(1, 0, 10, ZS_DTYPE_F32, NULL, 40);
    rc = raw_call(2, M("Push"), &m, 1, TOKEN, TMO_MS, &err);
    check("token server: Push before Initialize", rc, &err, ZS_ERR_STATE, G_PRECOND, "no model", 0);
    m = commit_msg(1, 1, 1, 1e-3f, 1, ZS_DTYPE_NONE);
    rc = raw_call(2, M("Commit"), &m, 1, TOKEN, TMO_MS, &err);
    check("token server: Commit (skip) before Initialize", rc, &err, ZS_ERR_STATE, G_PRECOND,
          "no model", 0);
    m = pull_msg(0, 0, 10, ZS_DTYPE_F32, 0);
    rc = raw_call(2, M("Pull"), &m, 1, TOKEN, TMO_MS, &err);
    check("token server: Pull before Initialize", rc, &err, ZS_ERR_STATE, G_PRECOND, "no model", 0);
    m = state_req(0, 0, 10);
    rc = raw_call(2, M("GetState"), &m, 1, TOKEN, TMO_MS, &err);
    check("token server: GetState before Initialize", rc, &err, ZS_ERR_STATE, G_PRECOND, "no model",
          0);
    Zeroshard__CheckpointRequest cq = ZEROSHARD__CHECKPOINT_REQUEST__INIT;
    m = zs_msg_build(&cq.base);
    rc = raw_call(2, M("Checkpoint"), &m, 1, TOKEN, TMO_MS, &err);
    check("token server: Checkpoint before Initialize", rc, &err, ZS_ERR_STATE, G_PRECOND,
          "nothing to checkpoint", 0);
    TEST_OK(hello_raw(2, TOKEN, &in, &err), err);
    TEST_CHECK(!in.initialized && in.refused >= 5); /* the five above reached handlers */
}

static void wire_cases(void)
{
    zs_err_t err;
    grpc_byte_buffer *m;
    int rc;
    static const uint8_t garbage[] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x00};
    rc = raw1(0, M("Push"), raw_bytes(garbage, sizeof garbage), &err);
    check("wire: garbage to Push", rc, &err, ZS_ERR_INVALID, G_INVALID, "malformed message", 1);
    rc = raw1(0, M("Hello"), raw_bytes(garbage, sizeof garbage), &err);
    check("wire: garbage to Hello", rc, &err, ZS_ERR_INVALID, G_INVALID, "malformed HelloRequest",
          1);
    rc = raw1(1, M("Commit"), raw_bytes(garbage, sizeof garbage), &err);
    check("wire: garbage to Commit", rc, &err, ZS_ERR_INVALID, G_INVALID, "malformed CommitRequest",
          1);
    rc = raw1(0, M("SetState"), raw_bytes(garbage, sizeof garbage), &err);
    check("wire: garbage to SetState", rc, &err, ZS_ERR_INVALID, G_INVALID, "malformed", 1);
    rc = raw1(0, M("Initialize"), raw_bytes(garbage, sizeof garbage), &err);
    check("wire: garbage to Initialize", rc, &err, ZS_ERR_INVALID, G_INVALID, "malformed", 1);
    rc = raw1(0, M("ListCheckpoints"), raw_bytes(garbage, sizeof garbage), &err);
    check("wire: garbage to ListCheckpoints", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "malformed ListRequest", 1);
    rc = raw_call(0, M("Commit"), NULL, 0, NULL, TMO_MS, &err);
    check("wire: unary Commit without a message", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "missing CommitRequest", 1);

    /* A push chunk whose payload length says 4000 bytes; 3000 are there. */
    uint8_t trunc[64 + 3000];
    size_t n = 0;
    trunc[n++] = 0x08; /* step 3 */
    trunc[n++] = 3;
    trunc[n++] = 0x18; /* count 1000 */
    trunc[n++] = 0xE8;
    trunc[n++] = 0x07;
    trunc[n++] = 0x7A; /* field 15, length 4000 */
    trunc[n++] = 0xA0;
    trunc[n++] = 0x1F;
    memset(trunc + n, 0, 3000);
    rc = raw1(0, M("Push"), raw_bytes(trunc, n + 3000), &err);
    check("wire: truncated chunk (payload length 4000, 3000 present)", rc, &err, ZS_ERR_INVALID,
          G_INVALID, "payload length 4000 exceeds the 3000 bytes", 1);

    /* A valid push chunk header plus an unknown 70000-byte field. */
    size_t hl = 70000;
    uint8_t *h = malloc(hl + 64);
    TEST_CHECK(h);
    n = 0;
    h[n++] = 0x08;
    h[n++] = 3;
    h[n++] = 0x52; /* field 10, wire type 2, length 70000 */
    h[n++] = (uint8_t)(0x80 | (hl & 0x7F));
    h[n++] = (uint8_t)(0x80 | ((hl >> 7) & 0x7F));
    h[n++] = (uint8_t)(hl >> 14);
    memset(h + n, 'h', hl);
    n += hl;
    rc = raw1(0, M("Push"), raw_bytes(h, n), &err);
    check("wire: Push header of 70 KB", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "header too large or truncated (limit 65536 bytes)", 1);
    h[0] = 0x08; /* the same bytes parse as a CommitRequest with an unknown field */
    rc = raw1(0, M("Commit"), raw_bytes(h, n), &err);
    check("wire: unary Commit of 70 KB", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "exceeds the 65536 limit", 1);
    free(h);

    /* Just below the receive limit (a 4 MiB chunk + 64 KiB header + 16
     * bytes): gRPC delivers it, the server
     * refuses the chunk size without allocating anything for it. */
    size_t len = ZS_RPC_MAX_MESSAGE - 64;
    m = push_msg(3, 0, len / 4, ZS_DTYPE_F32, NULL, len);
    TEST_CHECK(grpc_byte_buffer_length(m) < ZS_RPC_MAX_MESSAGE);
    rc = raw1(0, M("Push"), m, &err);
    check("wire: Push of the receive limit - 64 bytes", rc, &err, ZS_ERR_INVALID, G_INVALID,
          "exceeds the 4194304-byte limit", 1);
    /* Above it: gRPC itself refuses before any handler reads it. */
    len = ZS_RPC_MAX_MESSAGE + 1024;
    m = push_msg(3, 0, len / 4, ZS_DTYPE_F32, NULL, len);
    rc = raw1(0, M("Push"), m, &err);
    check("wire: Push of the receive limit + 1 KiB", rc, &err, ZS_ERR_BUSY, G_EXHAUSTED,
          "larger than max", -1);
    m = state_chunk(0, 0, len / 4, NULL, len);
    rc = raw1(1, M("SetState"), m, &err);
    check("wire: SetState of the receive limit + 1 KiB", rc, &err, ZS_ERR_BUSY, G_EXHAUSTED,
          "larger than max", -1);
    /* A unary request above the limit, more times than the server keeps
     * requests outstanding per method: each is refused and Hello still works
     * (check() calls it). */
    char *name = malloc(len);
    TEST_CHECK(name);
    memset(name, 'n', len - 1);
    name[len - 1] = '\0';
    for (int k = 0; k < 6; k++) {
        rc = raw1(k % 2, M("Hello"), hello_msg(ZS_PROTOCOL_VERSION, name, 0), &err);
        TEST_CHECKF(rc == ZS_ERR_BUSY && g_last_grpc == G_EXHAUSTED, "big Hello %d: %s", k,
                    err.msg);
    }
    free(name);
    check("wire: 6 unary Hellos of the receive limit + 1 KiB", rc, &err, ZS_ERR_BUSY, G_EXHAUSTED,
          "larger than max", -1);
}

/* Step 3 after all that: the rest of g3 pushed (push_cases staged [0,
 * pushed) and the refused pushes must have left it alone), then it must
 * equal one AdamW step on the state read at the start, bitwise, in fp32 and
 * in the bf16 copy. */
static void final_step(const void *g3, uint64_t pushed)
{
    zs_err_t err;
    TEST_OK(zs_client_push(g_cl, 3, pushed, P, (const uint16_t *)g3 + pushed, ZS_DTYPE_BF16, &err),
            err);
    zs_step_scalars_t s = {3, 0.5f, 1.0f, 2e-3f, 0, ZS_DTYPE_BF16};
    TEST_OK(zs_client_commit(g_cl, &s, &err), err);
    uint16_t *lowp = malloc(P * 2), *got = malloc(P * 2);
    TEST_CHECK(lowp && got);
    zs_adam_step_t st = {s.lr, (int64_t)g_base.ostep[0] + 1, s.grad_scale, s.clip_coef};
    zs_adam_update(&g_hp, &st, g_base.t[0], g_base.t[1], g_base.t[2], g3, ZS_DTYPE_BF16, lowp,
                   ZS_DTYPE_BF16, P);
    uint64_t step;
    TEST_OK(zs_client_pull(g_cl, 3, 0, P, got, ZS_DTYPE_BF16, &step, &err), err);
    TEST_CHECK(step == 3 && memcmp(got, lowp, P * 2) == 0);
    snap_t now;
    snap_alloc(&now);
    snap_take(&now);
    TEST_CHECK(memcmp(now.pull, g_base.t[0], P * 4) == 0);
    for (int t = 0; t < 3; t++)
        TEST_CHECKF(memcmp(now.t[t], g_base.t[t], P * 4) == 0, "step 3: tensor %d differs", t);
    TEST_CHECK(now.applied[0] == 3 && now.applied[1] == 3 && now.ostep[0] == 3);
    snap_free(&now);
    free(lowp);
    free(got);
    printf("ok  step 3 after every refusal: bitwise equal to a local AdamW step (fp32 and "
           "bf16)\n");
}

static void *grads(uint64_t step, zs_dtype_t dt)
{
    float *tmp = malloc(P * 4);
    void *g = malloc(P * 4);
    TEST_CHECK(tmp && g);
    for (uint64_t i = 0; i < P; i++)
        tmp[i] = 0.5f * zs_rand_unit(step, i) + 0.01f * (float)step;
    zs_cast(g, dt, tmp, ZS_DTYPE_F32, P);
    free(tmp);
    return g;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    /* Servers first: gRPC state does not survive fork. Their WARN line per
     * refusal would drown this test's own lines (ZS_LOG_LEVEL overrides). */
    setenv("ZS_LOG_LEVEL", "error", 0);
    const char *tmp = zs_test_tmpdir("refusals");
    char tokfile[300];
    snprintf(tokfile, sizeof tokfile, "%.200s/token", tmp);
    FILE *f = fopen(tokfile, "w");
    TEST_CHECK(f && fprintf(f, "%s\n", TOKEN) > 0 && fclose(f) == 0);
    for (int i = 0; i < 3; i++) {
        snprintf(g_srv[i].data_dir, sizeof g_srv[i].data_dir, "%.200s/s%d", tmp, i);
        if (i == 2)
            snprintf(g_srv[i].extra, sizeof g_srv[i].extra, "--token-file %.220s", tokfile);
        zs_test_server_start(&g_srv[i]);
    }
    char servers[256];
    zs_test_server_list(g_srv, 2, servers, sizeof servers);
    printf("servers: %s (model), %s (token, empty)\n", servers, g_srv[2].addr);

    zs_client_opts_t o = {servers, NULL, NULL, TMO_MS, 0}; /* retries UNAVAILABLE only */
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(&o, &g_cl, &err), err);
    for (int i = 0; i < 3; i++) {
        g_ch[i] = zs_channel_create(g_srv[i].addr, NULL);
        /* Raw calls fail fast while a channel is still connecting (slow
         * machines, valgrind): wait until each server answers. */
        zs_server_info_t in;
        int rc = ZS_ERR_UNAVAILABLE;
        for (int k = 0; k < 300 && rc == ZS_ERR_UNAVAILABLE; k++) {
            rc = hello_raw(i, TOKEN, &in, &err);
            if (rc == ZS_ERR_UNAVAILABLE)
                nanosleep(&(struct timespec){0, 100000000L}, NULL);
        }
        TEST_OK(rc, err);
    }

    g_hp = zs_synth_hparams();
    g_adam_pb.lr = g_hp.lr;
    g_adam_pb.beta1 = g_hp.beta1;
    g_adam_pb.beta2 = g_hp.beta2;
    g_adam_pb.eps = g_hp.eps;
    g_adam_pb.weight_decay = g_hp.weight_decay;
    g_adam_pb.adam_w_mode = g_hp.adam_w_mode;
    g_adam_pb.bias_correction = g_hp.bias_correction;

    /* Model at step 2 with checkpoint 2. */
    float *w0 = malloc(P * 4);
    TEST_CHECK(w0);
    for (uint64_t i = 0; i < P; i++)
        w0[i] = zs_synth_weight(i);
    TEST_OK(zs_client_init(g_cl, MODEL, P, &g_hp, w0, 0, 0, &err), err);
    free(w0);
    zs_step_scalars_t s2 = {2, 0.5f, 0.8f, 1e-3f, 0, ZS_DTYPE_BF16};
    for (uint64_t step = 1; step <= 2; step++) {
        zs_dtype_t dt = step == 1 ? ZS_DTYPE_F32 : ZS_DTYPE_F16;
        void *g = grads(step, dt);
        TEST_OK(zs_client_push(g_cl, step, 0, P, g, dt, &err), err);
        free(g);
        zs_step_scalars_t s = s2;
        s.step = step;
        s.lr = step == 1 ? 2e-3f : 1e-3f;
        TEST_OK(zs_client_commit(g_cl, &s, &err), err);
    }
    TEST_OK(zs_client_checkpoint(g_cl, 2, 0, &err), err);
    zs_server_info_t in[2];
    TEST_OK(zs_client_hello(g_cl, MODEL, P, in, &err), err);
    g_end0 = in[0].range_end;
    TEST_CHECK(in[1].range_begin == g_end0 && in[1].range_end == P && P - g_end0 == 50019);
    snap_alloc(&g_base);
    snap_take(&g_base);
    TEST_CHECK(g_base.applied[0] == 2 && g_base.ostep[1] == 2 && !g_base.initialized2);

    void *g3 = grads(3, ZS_DTYPE_BF16);
    uint64_t pushed = 1000;
    hello_cases();
    init_cases();
    push_cases(g3, pushed);
    commit_cases(&s2, pushed);
    read_cases();
    set_state_cases();
    checkpoint_cases();
    step_bound_cases();
    token_cases();
    wire_cases();
    printf("%d cases: state unchanged after each\n", g_cases);
    final_step(g3, pushed);
    free(g3);

    for (int i = 0; i < 3; i++)
        grpc_channel_destroy(g_ch[i]);
    zs_client_destroy(g_cl);
    snap_free(&g_base);
    for (int i = 0; i < 3; i++)
        zs_test_server_stop(&g_srv[i], SIGTERM);
    printf("PASS test_refusals\n");
    return 0;
}
