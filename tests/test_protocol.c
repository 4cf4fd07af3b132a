/*
 * test_protocol.c - protocol versions and their negotiation
 * (docs/protocol.md, "Versions and negotiation") over the wire: old
 * clients against a new server, the new client against old servers.
 *
 * Setup: two real zs-server processes holding one server's range each of
 * their own model (P = 3 optimizer chunks and a bit): "new" speaks versions
 * 1 to 3, "old" runs with --protocol-version 1. An in-process stand-in of
 * a server from before negotiation answers Hello only, as version 1 did
 * (any stated version but 0 and 1 refused). Checks, one behaviour each:
 *   1. new server: Hello of version 1 is answered as version 1, 2 as 2,
 *      0 (not stated), 3 and 4 (a newer client) as version 3;
 *   2. new server: Initialize of version 1 is accepted, answered as 1;
 *   3. new server, a version-1 session (Push without `expect`, Commit,
 *      Pull: the messages a version-1 client sends) trains: bitwise a local
 *      AdamW step, and the server speculated on nothing;
 *   4. new server: a version-2 push with `expect` does speculate (so 3 can
 *      see speculation), and a version-1 Hello's reply still carries no
 *      spec_* counters (version 1 had none);
 *   5. old server: a version-2 Hello is answered as 1, a Push stating
 *      `expect` is refused;
 *   6. the client against the old server: one warning, version 1, no
 *      speculation; push_expect sends the plain push (the old server would
 *      refuse `expect`), and the step equals the local AdamW step;
 *   7. the client against the stand-in: its refusal of version 2 is
 *      answered by asking again without a version: version 1, one warning;
 *   8. the engine with super_offload against the old server: every step
 *      plain (spec=0), the parameters bitwise those of super_offload off,
 *      and the client's warning logged once;
 *   9. parameter groups (version 3): the old server refuses a raw
 *      Initialize carrying groups and a Commit carrying group_lr, and the
 *      client refuses to initialize it with groups (it would ignore them),
 *      naming the server and the version.
 * Does not: test TLS or tokens (test_auth), or speculation itself
 * (test_shard_spec, test_engine 5).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_proc.h"
#include "zs_rpc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define P      (3ull * 65536 + 1000)
#define TMO_MS 20000
#define M(n)   "/zeroshard.Shard/" n
#define WARNED "speaks protocol version 1 (this client 3)"

enum { NEW, OLD };
static zs_test_server_t g_srv[2];
static grpc_channel *g_ch[2];
static char g_tmp[200];
static zs_adam_hparams_t g_hp;
static float *g_w0;   /* initial weights [P] */
static float *g_grad; /* step 1's gradient [P], fp32 */
static float *g_want; /* p after step 1: local AdamW */
static const zs_step_scalars_t g_s1 = {1, 1.0f, 1.0f, 1e-3f, 0, ZS_DTYPE_NONE};

/* ---- raw calls ------------------------------------------------------------- */

/* On server s: `method` with msgs[0..n) (consumed); the last reply message
 * (if any, else NULL) into *reply. Returns the call's status. */
static int call(int s, const char *method, grpc_byte_buffer **msgs, int n, grpc_byte_buffer **reply,
                zs_err_t *err)
{
    zs_ccall_t c;
    zs_err_clear(err);
    *reply = NULL;
    int rc = zs_ccall_start(&c, g_ch[s], method, NULL, TMO_MS, g_srv[s].addr, err);
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
        if (*reply)
            grpc_byte_buffer_destroy(*reply);
        *reply = bb;
    }
    if (c.call) {
        rc = zs_ccall_finish(&c, err);
        zs_ccall_destroy(&c);
    }
    return rc;
}

/* A HelloReply from a reply buffer (consumed); the test stops if none. */
static Zeroshard__HelloReply *hello_of(grpc_byte_buffer *bb)
{
    TEST_CHECK(bb);
    Zeroshard__HelloReply *r;
    zs_err_t err;
    TEST_OK(zs_msg_parse(bb, &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, &err),
            err);
    grpc_byte_buffer_destroy(bb);
    return r;
}

/* Hello of `version` to server s; its reply (free with
 * zeroshard__hello_reply__free_unpacked). */
static Zeroshard__HelloReply *hello(int s, uint32_t version)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = version;
    grpc_byte_buffer *m = zs_msg_build(&q.base), *bb;
    zs_err_t err;
    TEST_OK(call(s, M("Hello"), &m, 1, &bb, &err), err);
    return hello_of(bb);
}

/* ---- helpers --------------------------------------------------------------- */

static zs_client_t *client(int s)
{
    zs_client_opts_t o = {g_srv[s].addr, NULL, NULL, TMO_MS, 0};
    zs_client_t *c;
    zs_err_t err;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    return c;
}

/* stderr into `path` from now until capture_end (the client's warnings). */
static int g_stderr = -1;
static void capture_begin(const char *path)
{
    fflush(stderr);
    g_stderr = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    TEST_CHECK(g_stderr >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
}

static void capture_end(void)
{
    fflush(stderr);
    TEST_CHECK(dup2(g_stderr, 2) == 2);
    close(g_stderr);
}

/* Lines of file `path` holding `needle`. */
static int lines_with(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    TEST_CHECK(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* The server's spec_elements as a version-2 Hello reports it. */
static uint64_t spec_elements(int s)
{
    Zeroshard__HelloReply *r = hello(s, 2);
    uint64_t n = r->counters ? r->counters->spec_elements : 0;
    zeroshard__hello_reply__free_unpacked(r, NULL);
    return n;
}

/* Pull [0, P) of step 1 from server s: bitwise the local AdamW step? */
static int step1_matches(zs_client_t *c)
{
    float *got = malloc(P * 4);
    TEST_CHECK(got);
    zs_err_t err;
    TEST_OK(zs_client_pull(c, 1, 0, P, got, ZS_DTYPE_F32, NULL, &err), err);
    int same = memcmp(got, g_want, P * 4) == 0;
    free(got);
    return same;
}

/* ---- 1-4: old clients, new server ------------------------------------------ */

static void old_client_hello(void)
{
    static const uint32_t stated[5] = {1, 2, 0, 3, 4}, want[5] = {1, 2, 3, 3, 3};
    for (int k = 0; k < 5; k++) {
        Zeroshard__HelloReply *r = hello(NEW, stated[k]);
        TEST_CHECKF(r->protocol_version == want[k], "Hello of version %u answered as %u, want %u",
                    stated[k], r->protocol_version, want[k]);
        zeroshard__hello_reply__free_unpacked(r, NULL);
    }
    printf("ok  1. new server: Hello of version 1 answered as 1, 2 as 2; 0, 3 and 4 as 3\n");
}

static void old_client_init(void)
{
    Zeroshard__AdamConfig a = ZEROSHARD__ADAM_CONFIG__INIT;
    a.lr = g_hp.lr;
    a.beta1 = g_hp.beta1;
    a.beta2 = g_hp.beta2;
    a.eps = g_hp.eps;
    a.weight_decay = g_hp.weight_decay;
    a.adam_w_mode = g_hp.adam_w_mode;
    a.bias_correction = g_hp.bias_correction;
    Zeroshard__InitRequest q = ZEROSHARD__INIT_REQUEST__INIT;
    q.protocol_version = 1;
    q.model_name = (char *)"protocol";
    q.num_params = P;
    q.num_servers = 1;
    q.adam = &a;
    grpc_byte_buffer *m[2], *bb;
    for (int k = 0; k < 2; k++) { /* two chunks: the first one with `init` */
        Zeroshard__InitChunk ch = ZEROSHARD__INIT_CHUNK__INIT;
        ch.init = k == 0 ? &q : NULL;
        ch.offset = k == 0 ? 0 : P / 2;
        ch.count = k == 0 ? P / 2 : P - P / 2;
        ch.dtype = ZEROSHARD__DTYPE__F32;
        m[k] = zs_frame_build(&ch.base, g_w0 + ch.offset, ch.count * 4, NULL, NULL);
    }
    zs_err_t err;
    TEST_OK(call(NEW, M("Initialize"), m, 2, &bb, &err), err);
    Zeroshard__HelloReply *r = hello_of(bb);
    TEST_CHECKF(r->protocol_version == 1 && r->initialized && r->num_params == P,
                "Initialize of version 1 answered as %u (initialized %d, P %llu)",
                r->protocol_version, r->initialized, (unsigned long long)r->num_params);
    zeroshard__hello_reply__free_unpacked(r, NULL);
    printf("ok  2. new server: Initialize of version 1 accepted, answered as 1\n");
}

static void old_client_trains(void)
{
    zs_client_t *c = client(NEW);
    zs_err_t err;
    TEST_OK(zs_client_hello(c, "protocol", P, NULL, &err), err);
    TEST_OK(zs_client_push(c, 1, 0, P, g_grad, ZS_DTYPE_F32, &err), err);
    TEST_OK(zs_client_commit(c, &g_s1, &err), err);
    TEST_CHECKF(step1_matches(c), "a version-1 session's step differs from local AdamW");
    TEST_CHECKF(spec_elements(NEW) == 0,
                "the server speculated %llu elements for a version-1 "
                "session",
                (unsigned long long)spec_elements(NEW));
    zs_client_destroy(c);
    printf("ok  3. new server: version-1 Push/Commit/Pull == local AdamW, nothing speculated\n");
}

static void new_client_speculates(void)
{
    zs_client_t *c = client(NEW);
    zs_err_t err;
    TEST_OK(zs_client_hello(c, "protocol", P, NULL, &err), err);
    TEST_CHECK(zs_client_protocol_version(c) == ZS_PROTOCOL_VERSION && zs_client_speculates(c));
    zs_step_scalars_t s2 = g_s1;
    s2.step = 2;
    TEST_OK(zs_client_push_expect(c, 2, 0, P, g_grad, ZS_DTYPE_F32, &s2, &err), err);
    /* Speculation runs between the push and the commit: wait for it. */
    uint64_t n = 0;
    for (int k = 0; k < 200 && (n = spec_elements(NEW)) == 0; k++)
        nanosleep(&(struct timespec){0, 25000000L}, NULL);
    TEST_CHECKF(n > 0, "a version-2 push with expect did not speculate");
    TEST_OK(zs_client_commit(c, &s2, &err), err);
    Zeroshard__HelloReply *r = hello(NEW, 1);
    TEST_CHECKF(r->counters && r->counters->spec_elements == 0 && r->counters->spec_hits == 0 &&
                    r->counters->spec_window_bytes == 0,
                "a version-1 Hello's reply carries spec_* counters (elements %llu)",
                (unsigned long long)(r->counters ? r->counters->spec_elements : 0));
    zeroshard__hello_reply__free_unpacked(r, NULL);
    zs_client_destroy(c);
    printf("ok  4. new server: version 2 speculated %llu elements; a version-1 reply shows none\n",
           (unsigned long long)n);
}

/* ---- 5-8: new client, old servers ------------------------------------------- */

static void old_server_raw(void)
{
    Zeroshard__HelloReply *r = hello(OLD, 2);
    TEST_CHECKF(r->protocol_version == 1, "--protocol-version 1 answered a version-2 Hello as %u",
                r->protocol_version);
    zeroshard__hello_reply__free_unpacked(r, NULL);
    Zeroshard__StepExpect ex = ZEROSHARD__STEP_EXPECT__INIT;
    ex.grad_scale = 1.0f;
    ex.lr = 1e-3f;
    Zeroshard__PushChunk ch = ZEROSHARD__PUSH_CHUNK__INIT;
    ch.step = 1;
    ch.count = 1000;
    ch.dtype = ZEROSHARD__DTYPE__F32;
    ch.expect = &ex;
    grpc_byte_buffer *m = zs_frame_build(&ch.base, g_grad, 4000, NULL, NULL), *bb;
    zs_err_t err;
    int rc = call(OLD, M("Push"), &m, 1, &bb, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "expect needs protocol version 2"),
                "old server took a Push with expect: %s (%s)", zs_status_name(rc), err.msg);
    printf("ok  5. old server: version-2 Hello answered as 1; Push with expect refused: %s\n",
           err.msg);
}

static void new_client_old_server(void)
{
    char log[300];
    snprintf(log, sizeof log, "%s/client.log", g_tmp);
    zs_client_t *c = client(OLD);
    zs_err_t err;
    capture_begin(log);
    int rc = zs_client_init(c, "protocol", P, &g_hp, g_w0, 0, 1, &err);
    if (!rc)
        rc = zs_client_hello(c, "protocol", P, NULL, &err);
    capture_end();
    TEST_OK(rc, err);
    TEST_CHECKF(lines_with(log, WARNED) == 1, "%d warnings about the old server, want 1",
                lines_with(log, WARNED));
    TEST_CHECK(zs_client_protocol_version(c) == 1 && !zs_client_speculates(c));
    /* What the engine would push with super_offload: the old server refuses
     * `expect`, so this passes only if the client left it out. */
    TEST_OK(zs_client_push_expect(c, 1, 0, P, g_grad, ZS_DTYPE_F32, &g_s1, &err), err);
    TEST_OK(zs_client_commit(c, &g_s1, &err), err);
    TEST_CHECKF(step1_matches(c), "the step on the old server differs from local AdamW");
    zs_client_destroy(c);
    printf("ok  6. client vs old server: one warning, version 1, push_expect sent plain, step == "
           "local AdamW\n");
}

/* Hello of a server from before negotiation (version 1 as released): any
 * stated version but 0 and 1 refused with its sentence. */
static int old_hello(void *ctx, zs_scall_t *sc, zs_err_t *err)
{
    (void)ctx;
    Zeroshard__HelloRequest *q;
    int rc = zs_msg_parse(sc->request, &zeroshard__hello_request__descriptor,
                          (ProtobufCMessage **)&q, err);
    if (rc)
        return rc;
    uint32_t v = q->protocol_version;
    zeroshard__hello_request__free_unpacked(q, NULL);
    if (v != 0 && v != 1)
        return zs_err_set(err, ZS_ERR_STATE, "protocol version %u not supported (server speaks 1)",
                          v);
    Zeroshard__HelloReply r = ZEROSHARD__HELLO_REPLY__INIT;
    r.protocol_version = 1;
    return zs_scall_finish(sc, zs_msg_build(&r.base), ZS_OK, "");
}

static void new_client_released_v1(void)
{
    static const zs_rpc_method_t methods[1] = {{M("Hello"), ZS_RPC_UNARY, old_hello}};
    zs_rpc_server_opts_t ro = {"127.0.0.1:0", NULL, NULL, NULL, 4, 1};
    zs_rpc_server_t *srv;
    zs_err_t err;
    TEST_OK(zs_rpc_server_create(&ro, methods, 1, NULL, &srv, &err), err);
    char addr[64], log[300];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", zs_rpc_server_port(srv));
    snprintf(log, sizeof log, "%s/released.log", g_tmp);
    zs_client_opts_t o = {addr, NULL, NULL, TMO_MS, 0};
    zs_client_t *c;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    capture_begin(log);
    int rc = zs_client_hello(c, "", 0, NULL, &err);
    capture_end();
    TEST_OK(rc, err);
    TEST_CHECKF(zs_client_protocol_version(c) == 1, "version %u with a released version-1 server",
                zs_client_protocol_version(c));
    TEST_CHECK(lines_with(log, WARNED) == 1);
    zs_client_destroy(c);
    zs_rpc_server_destroy(srv);
    printf("ok  7. client vs a released version-1 server: refusal of 2 answered by asking "
           "again; version 1, one warning\n");
}

static int same_file(const char *a, const char *b)
{
    return zs_test_sh("cmp -s '%s' '%s'", a, b) == 0;
}

static void engine_old_server(void)
{
    char out[2][300], log[2][300];
    for (int sp = 0; sp < 2; sp++) {
        snprintf(out[sp], sizeof out[sp], "%s/engine%d.bin", g_tmp, sp);
        snprintf(log[sp], sizeof log[sp], "%s/engine%d.log", g_tmp, sp);
        zs_test_run_ok(log[sp],
                       "timeout -k 10 300 %s " ZS_TEST_MPI_OPTS " -np 1 %s --stage 2 --dtype "
                       "bf16 --offload 1 --servers %s --steps 6 --spec %d --out %s",
                       ZS_MPIEXEC, ZS_ENGINE_WORKER, g_srv[OLD].addr, sp ? 2 : 0, out[sp]);
    }
    int steps = lines_with(log[1], "stat step="), plain = lines_with(log[1], " spec=0");
    TEST_CHECKF(steps == 6 && plain == 6, "super_offload vs old server: %d of %d steps plain",
                plain, steps);
    TEST_CHECKF(same_file(out[0], out[1]), "super_offload vs old server differs from plain");
    TEST_CHECKF(lines_with(log[1], WARNED) == 1, "%d warnings in %s, want 1",
                lines_with(log[1], WARNED), log[1]);
    printf("ok  8. engine with super_offload vs old server: 6 plain steps, == super_offload off, "
           "bitwise; one warning\n");
}

/* 9. parameter groups against a server that does not speak them. */
static void groups_old_server(void)
{
    Zeroshard__GroupRange g = ZEROSHARD__GROUP_RANGE__INIT, *gp = &g;
    g.end = P;
    g.weight_decay = 0.0f;
    Zeroshard__AdamConfig a = ZEROSHARD__ADAM_CONFIG__INIT;
    a.lr = g_hp.lr;
    a.beta1 = g_hp.beta1;
    a.beta2 = g_hp.beta2;
    a.eps = g_hp.eps;
    Zeroshard__InitRequest q = ZEROSHARD__INIT_REQUEST__INIT;
    q.model_name = "groups";
    q.num_params = P;
    q.num_servers = 1;
    q.adam = &a;
    q.overwrite = 1;
    q.n_groups = 1;
    q.groups = &gp;
    Zeroshard__InitChunk ch = ZEROSHARD__INIT_CHUNK__INIT;
    ch.init = &q;
    ch.count = P;
    grpc_byte_buffer *m = zs_frame_build(&ch.base, g_w0, P * 4, NULL, NULL), *bb;
    zs_err_t err;
    int rc = call(OLD, M("Initialize"), &m, 1, &bb, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "groups needs protocol version 3"),
                "old server took an Initialize with groups: %s (%s)", zs_status_name(rc), err.msg);
    float lr = 1e-3f;
    Zeroshard__CommitRequest cq = ZEROSHARD__COMMIT_REQUEST__INIT;
    cq.step = 2;
    cq.grad_scale = 1.0f;
    cq.clip_coef = 1.0f;
    cq.lr = lr;
    cq.n_group_lr = 1;
    cq.group_lr = &lr;
    m = zs_msg_build(&cq.base);
    rc = call(OLD, M("Commit"), &m, 1, &bb, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "group_lr needs protocol version 3"),
                "old server took a Commit with group_lr: %s (%s)", zs_status_name(rc), err.msg);
    zs_client_t *c = client(OLD);
    zs_group_range_t r[2] = {{1000, 0.0f, 0}, {P, 0.1f, 0}};
    TEST_OK(zs_client_set_groups(c, r, 2, &err), err);
    char log[300];
    snprintf(log, sizeof log, "%s/client-groups.log", g_tmp);
    capture_begin(log);
    rc = zs_client_init(c, "protocol", P, &g_hp, g_w0, 0, 1, &err);
    capture_end();
    TEST_CHECKF(rc == ZS_ERR_STATE && strstr(err.msg, g_srv[OLD].addr) &&
                    strstr(err.msg, "needs version 3 (parameter groups)"),
                "the client initialized an old server with groups: %s (%s)", zs_status_name(rc),
                err.msg);
    zs_client_destroy(c);
    printf("ok  9. old server: Initialize with groups and Commit with group_lr refused; the "
           "client refuses it: %s\n",
           err.msg);
}

int main(void)
{
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("protocol"));
    snprintf(g_srv[OLD].extra, sizeof g_srv[OLD].extra, "--protocol-version 1");
    for (int s = 0; s < 2; s++) {
        snprintf(g_srv[s].data_dir, sizeof g_srv[s].data_dir, "%s/s%d", g_tmp, s);
        zs_test_server_start(&g_srv[s]);
    }
    grpc_init();
    for (int s = 0; s < 2; s++)
        g_ch[s] = zs_channel_create(g_srv[s].addr, NULL);
    g_hp = zs_synth_hparams();
    g_w0 = malloc(P * 4);
    g_grad = malloc(P * 4);
    g_want = malloc(P * 4);
    float *m = calloc(P, 4), *v = calloc(P, 4);
    TEST_CHECK(g_w0 && g_grad && g_want && m && v);
    for (uint64_t i = 0; i < P; i++)
        g_w0[i] = zs_synth_weight(i);
    zs_synth_grad(1, 0, P, g_grad, g_want); /* step 1: fp32 (g_want as scratch) */
    memcpy(g_want, g_w0, P * 4);
    zs_adam_step_t st = {g_s1.lr, 1, g_s1.grad_scale, g_s1.clip_coef};
    zs_adam_update(&g_hp, &st, g_want, m, v, g_grad, ZS_DTYPE_F32, NULL, ZS_DTYPE_NONE, P);
    free(m);
    free(v);

    old_client_hello();
    old_client_init();
    old_client_trains();
    new_client_speculates();
    old_server_raw();
    new_client_old_server();
    new_client_released_v1();
    engine_old_server();
    groups_old_server();

    for (int s = 0; s < 2; s++)
        grpc_channel_destroy(g_ch[s]);
    grpc_shutdown();
    zs_test_servers_down(g_srv, 2);
    free(g_w0);
    free(g_grad);
    free(g_want);
    printf("PASS test_protocol\n");
    return 0;
}
