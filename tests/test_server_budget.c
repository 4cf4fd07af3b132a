/*
 * test_server_budget.c - integration: zs-server's memory budget (issue 9,
 * item 3) against a real server started with --mem-budget 64M holding one
 * model of P = 1M fp32 parameters (22 MiB of state, one server).
 *
 * Checks, each against Hello's mem_budget / mem_reserved (bytes) and the
 * status of the refused call; mem_reserved must come back to the installed
 * state's share (R0) after each:
 *  1. Initialize headers alone (no weights) claiming 4e8 parameters, with
 *     overwrite: RESOURCE_EXHAUSTED naming the budget; 8 concurrent ones
 *     claiming 2^24 each, held open: all refused, and the server's RSS grows
 *     by < 32 MiB (it used to allocate and zero 22 B per claimed element);
 *     an overwrite by a 2M-parameter model (44 MiB: fits the budget alone,
 *     not beside the 22 MiB installed): refused.
 *  2. Restore of a checkpoint (22 MiB beside 22 MiB): accepted.
 *  3. SetState: three streams of 3 x 4 MiB held open at once are buffered
 *     (58 MiB reserved); a fourth is refused at its second chunk; the three
 *     then apply (they write the current state back: nothing changes).
 *  4. Pulls waiting for a future step hold two 4 MiB send buffers each: five
 *     fit, the sixth is refused; after step 2 is committed the five stream
 *     their data, bitwise equal to a GetState.
 *  5. The state is bitwise what it was before the refusals (GetState).
 *  6. A stock gRPC client (4 MiB receive limit) pulls with the largest
 *     chunk_bytes: every message fits.
 * The refusals go through raw calls (zs_rpc.h); the client library does
 * the setup.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_proc.h"
#include "zs_rpc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define NPARAM 1048576ull
#define MODEL  "budget"
#define BUDGET (64ull << 20)
#define TMO_MS 30000
#define M(n)   "/zeroshard.Shard/" n

static zs_test_server_t g_srv;
static grpc_channel *g_ch;
static uint64_t g_r0; /* mem_reserved with only the model installed */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Hello's mem_budget and mem_reserved. */
static uint64_t reserved(uint64_t *budget)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    Zeroshard__HelloReply *r = NULL;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_unary(g_ch, M("Hello"), NULL, TMO_MS, g_srv.addr, &q.base,
                     &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, &err),
            err);
    uint64_t v = r->mem_reserved;
    if (budget)
        *budget = r->mem_budget;
    zeroshard__hello_reply__free_unpacked(r, NULL);
    return v;
}

/* Wait (<= 10 s) until mem_reserved equals want. */
static void expect_reserved(uint64_t want, const char *what)
{
    uint64_t got = 0;
    for (int i = 0; i < 200; i++) {
        if ((got = reserved(NULL)) == want)
            return;
        sleep_ms(50);
    }
    TEST_CHECKF(0, "%s: mem_reserved %llu, want %llu", what, (unsigned long long)got,
                (unsigned long long)want);
}

static long vm_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    TEST_CHECK(f);
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static Zeroshard__AdamConfig g_adam = ZEROSHARD__ADAM_CONFIG__INIT;

/* The first Initialize message: identity and hyperparameters, no weights. */
static grpc_byte_buffer *init_header(const char *model, uint64_t p)
{
    Zeroshard__InitRequest q = ZEROSHARD__INIT_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    q.model_name = (char *)model;
    q.num_params = p;
    q.num_servers = 1;
    q.adam = &g_adam;
    q.overwrite = 1;
    Zeroshard__InitChunk m = ZEROSHARD__INIT_CHUNK__INIT;
    m.init = &q;
    return zs_frame_build(&m.base, NULL, 0, NULL, NULL);
}

static grpc_byte_buffer *state_chunk(int tensor, const float *src)
{
    Zeroshard__StateChunk m = ZEROSHARD__STATE_CHUNK__INIT;
    m.tensor = (Zeroshard__Tensor)tensor;
    m.count = NPARAM;
    return zs_frame_build(&m.base, src, NPARAM * 4, NULL, NULL);
}

/* Receive to the end of the call; its status (with err). */
static int drain(zs_ccall_t *c, zs_err_t *err)
{
    int rc;
    for (;;) {
        grpc_byte_buffer *bb;
        rc = zs_ccall_recv(c, &bb, err);
        if (rc || !bb)
            break;
        grpc_byte_buffer_destroy(bb);
    }
    zs_ccall_destroy(c);
    return rc;
}

static int exhausted(int rc)
{
    return zs_status_to_grpc(rc) == GRPC_STATUS_RESOURCE_EXHAUSTED;
}

static void init_cases(void)
{
    zs_err_t err;
    zs_ccall_t c;
    TEST_OK(zs_ccall_start(&c, g_ch, M("Initialize"), NULL, TMO_MS, g_srv.addr, &err), err);
    int rc = zs_ccall_send(&c, init_header("huge", 400000000ull), &err);
    if (!rc)
        rc = zs_ccall_finish(&c, &err);
    zs_ccall_destroy(&c);
    printf("Initialize header claiming 4e8 parameters: %s: %s\n", zs_status_name(rc), err.msg);
    TEST_CHECK(exhausted(rc) && strstr(err.msg, "memory budget"));
    expect_reserved(g_r0, "after the 4e8 header");

    enum { K = 8 };
    zs_ccall_t cs[K];
    long rss0 = vm_rss_kib(g_srv.pid);
    for (int k = 0; k < K; k++) {
        TEST_OK(zs_ccall_start(&cs[k], g_ch, M("Initialize"), NULL, TMO_MS, g_srv.addr, &err), err);
        TEST_OK(zs_ccall_send(&cs[k], init_header("huge", 1ull << 24), &err), err);
    }
    sleep_ms(1000); /* the server has read the headers */
    long rss1 = vm_rss_kib(g_srv.pid);
    for (int k = 0; k < K; k++) {
        rc = zs_ccall_finish(&cs[k], &err);
        zs_ccall_destroy(&cs[k]);
        TEST_CHECKF(exhausted(rc), "header %d claiming 2^24: %s: %s", k, zs_status_name(rc),
                    err.msg);
    }
    printf("%d open Initialize headers claiming 2^24 each: refused; server RSS %.1f -> %.1f MiB\n",
           K, rss0 / 1024.0, rss1 / 1024.0);
    TEST_CHECK(rss1 - rss0 < 32 * 1024);
    expect_reserved(g_r0, "after the 2^24 headers");

    TEST_OK(zs_ccall_start(&c, g_ch, M("Initialize"), NULL, TMO_MS, g_srv.addr, &err), err);
    rc = zs_ccall_send(&c, init_header("two-million", 2 * NPARAM), &err);
    if (!rc)
        rc = zs_ccall_finish(&c, &err);
    zs_ccall_destroy(&c);
    printf("overwrite by a 44 MiB model beside the 22 MiB one: %s: %s\n", zs_status_name(rc),
           err.msg);
    TEST_CHECK(exhausted(rc) && strstr(err.msg, "memory budget"));
    expect_reserved(g_r0, "after the 2M overwrite");
}

static void set_state_cases(const float *const t[3])
{
    zs_err_t err;
    enum { S = 3 };
    zs_ccall_t cs[S + 1];
    uint64_t piece = NPARAM * 4 + 64; /* what the server reserves per chunk, within 64 B */
    for (int s = 0; s < S; s++) {
        TEST_OK(zs_ccall_start(&cs[s], g_ch, M("SetState"), NULL, TMO_MS, g_srv.addr, &err), err);
        for (int k = 0; k < 3; k++)
            TEST_OK(zs_ccall_send(&cs[s], state_chunk(k, t[k]), &err), err);
        /* Wait until the server buffered them (so the order is certain). */
        uint64_t got = 0;
        for (int i = 0; i < 200; i++) {
            got = reserved(NULL);
            if (got >= g_r0 + (uint64_t)(s + 1) * 3 * NPARAM * 4)
                break;
            sleep_ms(50);
        }
        TEST_CHECKF(got >= g_r0 + (uint64_t)(s + 1) * 3 * NPARAM * 4 &&
                        got <= g_r0 + (uint64_t)(s + 1) * 3 * piece,
                    "SetState %d: reserved %llu", s, (unsigned long long)got);
    }
    printf("3 SetState streams of 12 MiB open: %.1f of %.1f MiB reserved\n",
           reserved(NULL) / 1048576.0, BUDGET / 1048576.0);
    TEST_OK(zs_ccall_start(&cs[S], g_ch, M("SetState"), NULL, TMO_MS, g_srv.addr, &err), err);
    int rc = ZS_OK;
    for (int k = 0; k < 3 && !rc; k++)
        rc = zs_ccall_send(&cs[S], state_chunk(k, t[k]), &err);
    if (!rc)
        rc = zs_ccall_finish(&cs[S], &err);
    zs_ccall_destroy(&cs[S]);
    printf("a 4th SetState stream: %s: %s\n", zs_status_name(rc), err.msg);
    TEST_CHECK(exhausted(rc) && strstr(err.msg, "SetState"));
    for (int s = 0; s < S; s++)
        TEST_OK(drain(&cs[s], &err), err); /* their replies, then OK */
    expect_reserved(g_r0, "after SetState");
}

static void pull_cases(zs_client_t *cl, float *buf, float *tmp)
{
    zs_err_t err;
    enum { N = 5 };
    zs_ccall_t cs[N + 1];
    Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
    q.min_step = 2;
    q.count = NPARAM;
    q.dtype = ZEROSHARD__DTYPE__F32;
    q.chunk_bytes = ZS_RPC_MAX_PULL_CHUNK_BYTES;
    for (int i = 0; i <= N; i++) {
        TEST_OK(zs_ccall_start(&cs[i], g_ch, M("Pull"), NULL, TMO_MS, g_srv.addr, &err), err);
        TEST_OK(zs_ccall_send(&cs[i], zs_msg_build(&q.base), &err), err);
        if (i < N)
            expect_reserved(g_r0 + (uint64_t)(i + 1) * 2 * ZS_RPC_MAX_PULL_CHUNK_BYTES,
                            "waiting pulls");
    }
    int rc = drain(&cs[N], &err);
    printf("a 6th waiting Pull (2 x %u KiB buffers each): %s: %s\n",
           ZS_RPC_MAX_PULL_CHUNK_BYTES >> 10, zs_status_name(rc), err.msg);
    TEST_CHECK(exhausted(rc) && strstr(err.msg, "Pull"));
    zs_synth_grad(2, 0, NPARAM, buf, tmp);
    TEST_OK(zs_client_push(cl, 2, 0, NPARAM, buf, zs_synth_dtype(2), &err), err);
    zs_step_scalars_t s = {2, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_NONE};
    TEST_OK(zs_client_commit(cl, &s, &err), err);
    for (int i = 0; i < N; i++) { /* pull i into buf (i = 0) or tmp, compare with buf */
        float *dst = i ? tmp : buf;
        uint64_t got = 0;
        for (;;) {
            grpc_byte_buffer *bb;
            TEST_OK(zs_ccall_recv(&cs[i], &bb, &err), err);
            if (!bb)
                break;
            Zeroshard__PullChunk *m;
            zs_frame_t fr;
            TEST_OK(zs_frame_parse(bb, &zeroshard__pull_chunk__descriptor, (ProtobufCMessage **)&m,
                                   &fr, &err),
                    err);
            TEST_CHECK(m->step == 2 && m->offset == got && fr.pay_len == m->count * 4);
            zs_frame_copy(&fr, dst + got);
            got += m->count;
            zeroshard__pull_chunk__free_unpacked(m, NULL);
            zs_frame_deinit(&fr);
            grpc_byte_buffer_destroy(bb);
        }
        zs_ccall_destroy(&cs[i]);
        TEST_CHECK(got == NPARAM && (i == 0 || memcmp(buf, tmp, NPARAM * 4) == 0));
    }
    expect_reserved(g_r0, "after the pulls");
    TEST_OK(zs_client_get_state(cl, 0, 0, NPARAM, tmp, &err), err);
    TEST_CHECK(memcmp(buf, tmp, NPARAM * 4) == 0);
    printf("the %d waiting pulls streamed step 2, bitwise equal to GetState\n", N);
}

/* A stock gRPC client (a channel with gRPC's defaults: 4 MiB receive limit)
 * pulls all 1M fp32 elements with the largest chunk_bytes: every message
 * fits, and the data equals GetState. */
static void stock_client_pull(zs_client_t *cl, float *buf, float *ref)
{
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(g_srv.addr, cr, NULL);
    grpc_channel_credentials_release(cr);
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_get_state(cl, 0, 0, NPARAM, ref, &err), err);
    Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
    q.count = NPARAM;
    q.dtype = ZEROSHARD__DTYPE__F32;
    q.chunk_bytes = ZS_RPC_MAX_PULL_CHUNK_BYTES;
    zs_ccall_t c;
    TEST_OK(zs_ccall_start(&c, ch, M("Pull"), NULL, TMO_MS, g_srv.addr, &err), err);
    TEST_OK(zs_ccall_send(&c, zs_msg_build(&q.base), &err), err);
    uint64_t got = 0;
    size_t largest = 0;
    for (;;) {
        grpc_byte_buffer *bb;
        TEST_OK(zs_ccall_recv(&c, &bb, &err), err);
        if (!bb)
            break;
        size_t len = grpc_byte_buffer_length(bb);
        largest = len > largest ? len : largest;
        Zeroshard__PullChunk *m;
        zs_frame_t fr;
        TEST_OK(zs_frame_parse(bb, &zeroshard__pull_chunk__descriptor, (ProtobufCMessage **)&m, &fr,
                               &err),
                err);
        TEST_CHECK(m->offset == got && fr.pay_len == m->count * 4);
        zs_frame_copy(&fr, buf + got);
        got += m->count;
        zeroshard__pull_chunk__free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
        grpc_byte_buffer_destroy(bb);
    }
    zs_ccall_destroy(&c);
    grpc_channel_destroy(ch);
    TEST_CHECK(got == NPARAM && memcmp(buf, ref, NPARAM * 4) == 0);
    printf("a stock gRPC client pulled 4 MiB with chunk_bytes %u: largest message %zu bytes "
           "(limit 4194304)\n",
           ZS_RPC_MAX_PULL_CHUNK_BYTES, largest);
    TEST_CHECK(largest <= (4u << 20));
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("ZS_LOG_LEVEL", "error", 0);
    const char *tmp = zs_test_tmpdir("budget");
    snprintf(g_srv.data_dir, sizeof g_srv.data_dir, "%s/s0", tmp);
    snprintf(g_srv.extra, sizeof g_srv.extra, "--mem-budget 64M");
    zs_test_server_start(&g_srv);
    zs_client_opts_t o = {g_srv.addr, NULL, NULL, TMO_MS, 0};
    zs_client_t *cl;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(&o, &cl, &err), err);
    g_ch = zs_channel_create(g_srv.addr, NULL);
    zs_adam_hparams_t hp = zs_synth_hparams();
    g_adam.lr = hp.lr;
    g_adam.beta1 = hp.beta1;
    g_adam.beta2 = hp.beta2;
    g_adam.eps = hp.eps;
    g_adam.weight_decay = hp.weight_decay;

    float *buf = malloc(NPARAM * 4), *tmpf = malloc(NPARAM * 4);
    float *t[3] = {malloc(NPARAM * 4), malloc(NPARAM * 4), malloc(NPARAM * 4)};
    float *after = malloc(NPARAM * 4);
    TEST_CHECK(buf && tmpf && t[0] && t[1] && t[2] && after);
    for (uint64_t i = 0; i < NPARAM; i++)
        buf[i] = zs_synth_weight(i);
    TEST_OK(zs_client_init(cl, MODEL, NPARAM, &hp, buf, 0, 0, &err), err);
    zs_synth_grad(1, 0, NPARAM, buf, tmpf);
    TEST_OK(zs_client_push(cl, 1, 0, NPARAM, buf, zs_synth_dtype(1), &err), err);
    zs_step_scalars_t s1 = {1, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_NONE};
    TEST_OK(zs_client_commit(cl, &s1, &err), err);
    TEST_OK(zs_client_checkpoint(cl, 1, 0, &err), err);
    for (int k = 0; k < 3; k++)
        TEST_OK(zs_client_get_state(cl, k, 0, NPARAM, t[k], &err), err);
    uint64_t budget;
    g_r0 = reserved(&budget);
    printf("server %s: budget %.1f MiB, %.2f MiB reserved by the installed state\n", g_srv.addr,
           budget / 1048576.0, g_r0 / 1048576.0);
    TEST_CHECK(budget == BUDGET && g_r0 >= 22 * NPARAM && g_r0 < 22 * NPARAM + 65536);

    init_cases();
    TEST_OK(zs_client_restore(cl, 1, &err), err);
    expect_reserved(g_r0, "after Restore");
    printf("Restore (a second 22 MiB state for a moment): OK\n");
    set_state_cases((const float *const *)t);
    for (int k = 0; k < 3; k++) {
        TEST_OK(zs_client_get_state(cl, k, 0, NPARAM, after, &err), err);
        TEST_CHECKF(memcmp(after, t[k], NPARAM * 4) == 0, "tensor %d changed", k);
    }
    printf("state bitwise unchanged by the refusals\n");
    pull_cases(cl, buf, tmpf);
    stock_client_pull(cl, buf, tmpf);

    grpc_channel_destroy(g_ch);
    zs_client_destroy(cl);
    zs_test_server_stop(&g_srv, SIGTERM);
    free(buf);
    free(tmpf);
    free(after);
    for (int k = 0; k < 3; k++)
        free(t[k]);
    printf("PASS test_server_budget\n");
    return 0;
}
