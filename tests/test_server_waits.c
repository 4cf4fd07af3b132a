/*
 * test_server_waits.c - integration: what waits on a zs-server, and what
 * must not (issue 9, items 4 and 6), on a real zs-server started with
 * --max-calls 8 and the store's test hook ZS_STORE_TEST_MARKER_DELAY_MS=3000
 * (every checkpoint write holds 3 s before its marker), holding a small
 * model at step 1.
 *
 * Checks:
 *  1. 8 Pulls waiting for step 99 with a far deadline take every call slot:
 *     a Hello is refused RESOURCE_EXHAUSTED (the slots are really held).
 *     The client cancels them: within 2 s a Hello is served again.
 *  2. A child process starts 8 such Pulls and is killed (SIGKILL: its
 *     connection drops without a cancel): within 2 s a Hello is served.
 *  3. Deadlines: a Pull with a 500 ms deadline ends DEADLINE_EXCEEDED in
 *     under 2 s; a Pull waiting for step 2 is answered once step 2 is
 *     committed, with that step's data.
 *  4. While Checkpoint 2 is being written (3 s), Hello and ListCheckpoints
 *     answer within 1 s and list only checkpoint 1; once it returned they
 *     list 1 and 2.
 * The child is forked before this process starts gRPC (gRPC state does not
 * survive fork) and waits on a pipe.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
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

#define NPARAM 100003ull
#define MODEL  "cancel"
#define SLOTS  8
#define FAR_MS (24 * 3600 * 1000) /* a deadline that never comes in this test */
#define M(n)   "/zeroshard.Shard/" n

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static grpc_byte_buffer *pull_req(uint64_t min_step)
{
    Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
    q.min_step = min_step;
    q.count = 1000;
    q.dtype = ZEROSHARD__DTYPE__F32;
    return zs_msg_build(&q.base);
}

/* Start n Pulls of step 99 on ch; they wait on the server. */
static void start_pulls(grpc_channel *ch, const char *addr, zs_ccall_t *cs, int n)
{
    zs_err_t err;
    zs_err_clear(&err);
    for (int i = 0; i < n; i++) {
        TEST_OK(zs_ccall_start(&cs[i], ch, M("Pull"), NULL, FAR_MS, addr, &err), err);
        TEST_OK(zs_ccall_send(&cs[i], pull_req(99), &err), err);
    }
}

static int hello(grpc_channel *ch, const char *addr, zs_err_t *err)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    ProtobufCMessage *r = NULL;
    int rc = zs_unary(ch, M("Hello"), NULL, 5000, addr, &q.base,
                      &zeroshard__hello_reply__descriptor, &r, err);
    if (r)
        protobuf_c_message_free_unpacked(r, NULL);
    return rc;
}

/* Hello until it is served; seconds it took (fails after `max_s`). */
static double wait_served(grpc_channel *ch, const char *addr, double max_s, const char *what)
{
    zs_err_t err;
    double t0 = now_s();
    int rc;
    while ((rc = hello(ch, addr, &err)) != ZS_OK && now_s() - t0 < max_s) {
        struct timespec ts = {0, 50000000L};
        nanosleep(&ts, NULL);
    }
    TEST_CHECKF(rc == ZS_OK, "%s: Hello still refused after %.1f s: %s", what, max_s, err.msg);
    return now_s() - t0;
}

/* Hello is refused for lack of call slots: the Pulls hold them all. Waits
 * 0.5 s first: a Hello that reached the server before the last Pull would
 * take that Pull's slot (and the Pull would be refused). */
static void expect_busy(grpc_channel *ch, const char *addr)
{
    zs_err_t err;
    int rc = ZS_OK;
    struct timespec settle = {0, 500000000L};
    nanosleep(&settle, NULL);
    for (int i = 0; i < 100; i++) { /* until the server has taken all of them */
        if ((rc = hello(ch, addr, &err)) == ZS_ERR_BUSY)
            break;
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
    TEST_CHECKF(rc == ZS_ERR_BUSY, "Hello with %d Pulls waiting: %s (%s)", SLOTS,
                zs_status_name(rc), err.msg);
}

/* Checkpoint 2 through the client library (a thread: it takes 3 s). */
typedef struct {
    zs_client_t *cl;
    int rc;
    volatile int done;
} ckpt_t;

static void *ckpt_thread(void *p)
{
    ckpt_t *k = p;
    zs_err_t err;
    zs_err_clear(&err);
    k->rc = zs_client_checkpoint(k->cl, 2, 0, &err);
    k->done = 1;
    return NULL;
}

/* ListCheckpoints (raw); the steps into out[0..8), their number returned. */
static size_t list(grpc_channel *ch, const char *addr, uint64_t *out)
{
    Zeroshard__ListRequest q = ZEROSHARD__LIST_REQUEST__INIT;
    Zeroshard__ListReply *r = NULL;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_unary(ch, M("ListCheckpoints"), NULL, 10000, addr, &q.base,
                     &zeroshard__list_reply__descriptor, (ProtobufCMessage **)&r, &err),
            err);
    size_t n = r->n_checkpoints < 8 ? r->n_checkpoints : 8;
    memcpy(out, r->checkpoints, n * sizeof *out);
    zeroshard__list_reply__free_unpacked(r, NULL);
    return n;
}

/* The child: on 'g' from `in`, start SLOTS waiting Pulls, write 'r' to `out`,
 * and wait to be killed. */
static void child_main(int in, int out, const char *addr)
{
    char cmd;
    if (read(in, &cmd, 1) != 1)
        _exit(1);
    grpc_init();
    grpc_channel *ch = zs_channel_create(addr, NULL);
    zs_ccall_t cs[SLOTS];
    start_pulls(ch, addr, cs, SLOTS);
    if (write(out, "r", 1) != 1)
        _exit(1);
    for (;;)
        pause();
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("ZS_LOG_LEVEL", "error", 0);
    const char *tmp = zs_test_tmpdir("waits");
    setenv("ZS_STORE_TEST_MARKER_DELAY_MS", "3000", 1); /* for the server */
    zs_test_server_t srv;
    memset(&srv, 0, sizeof srv);
    snprintf(srv.data_dir, sizeof srv.data_dir, "%s/s0", tmp);
    snprintf(srv.extra, sizeof srv.extra, "--max-calls %d", SLOTS);
    zs_test_server_start(&srv);

    int to[2], from[2];
    TEST_CHECK(pipe2(to, O_CLOEXEC) == 0 && pipe2(from, O_CLOEXEC) == 0);
    fflush(NULL);
    pid_t child = fork();
    TEST_CHECK(child >= 0);
    if (child == 0) {
        close(to[1]);
        close(from[0]);
        child_main(to[0], from[1], srv.addr);
    }
    close(to[0]);
    close(from[1]);

    zs_client_opts_t o = {srv.addr, NULL, NULL, 20000, 0};
    zs_client_t *cl;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(&o, &cl, &err), err);
    grpc_channel *ch = zs_channel_create(srv.addr, NULL);
    float *buf = malloc(NPARAM * 4), *tmpf = malloc(NPARAM * 4);
    TEST_CHECK(buf && tmpf);
    for (uint64_t i = 0; i < NPARAM; i++)
        buf[i] = zs_synth_weight(i);
    zs_adam_hparams_t hp = zs_synth_hparams();
    TEST_OK(zs_client_init(cl, MODEL, NPARAM, &hp, buf, 0, 0, &err), err);
    zs_synth_grad(1, 0, NPARAM, buf, tmpf);
    TEST_OK(zs_client_push(cl, 1, 0, NPARAM, buf, zs_synth_dtype(1), &err), err);
    zs_step_scalars_t s = {1, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_NONE};
    TEST_OK(zs_client_commit(cl, &s, &err), err);
    TEST_OK(zs_client_checkpoint(cl, 1, 0, &err), err);

    /* 1. Cancelled by the client. */
    zs_ccall_t cs[SLOTS];
    start_pulls(ch, srv.addr, cs, SLOTS);
    expect_busy(ch, srv.addr);
    for (int i = 0; i < SLOTS; i++)
        zs_ccall_destroy(&cs[i]); /* cancels a call still running */
    double dt = wait_served(ch, srv.addr, 2.0, "after cancelling the Pulls");
    printf("%d waiting Pulls held every slot; cancelled, Hello served again after %.2f s\n", SLOTS,
           dt);
    struct timespec settle = {0, 500000000L}; /* and the other seven slots free too */
    nanosleep(&settle, NULL);

    /* 2. The client process dies. */
    TEST_CHECK(write(to[1], "g", 1) == 1);
    char c;
    TEST_CHECK(read(from[0], &c, 1) == 1 && c == 'r');
    expect_busy(ch, srv.addr);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    dt = wait_served(ch, srv.addr, 2.0, "after the pulling process died");
    printf("%d waiting Pulls of a process killed with SIGKILL: Hello served again after %.2f s\n",
           SLOTS, dt);

    /* 3. Deadlines. */
    zs_ccall_t d;
    TEST_OK(zs_ccall_start(&d, ch, M("Pull"), NULL, 500, srv.addr, &err), err);
    double t0 = now_s();
    int rc = zs_ccall_send(&d, pull_req(99), &err);
    grpc_byte_buffer *bb = NULL;
    if (!rc)
        rc = zs_ccall_recv(&d, &bb, &err);
    zs_ccall_destroy(&d);
    dt = now_s() - t0;
    printf("a Pull with a 500 ms deadline: %s after %.2f s: %s\n", zs_status_name(rc), dt, err.msg);
    TEST_CHECK(rc == ZS_ERR_TIMEOUT && !bb && dt < 2.0);
    TEST_OK(zs_ccall_start(&d, ch, M("Pull"), NULL, 20000, srv.addr, &err), err);
    TEST_OK(zs_ccall_send(&d, pull_req(2), &err), err);
    zs_synth_grad(2, 0, NPARAM, buf, tmpf);
    TEST_OK(zs_client_push(cl, 2, 0, NPARAM, buf, zs_synth_dtype(2), &err), err);
    s.step = 2;
    TEST_OK(zs_client_commit(cl, &s, &err), err);
    TEST_OK(zs_ccall_recv(&d, &bb, &err), err);
    TEST_CHECK(bb);
    Zeroshard__PullChunk *m;
    zs_frame_t fr;
    TEST_OK(
        zs_frame_parse(bb, &zeroshard__pull_chunk__descriptor, (ProtobufCMessage **)&m, &fr, &err),
        err);
    TEST_CHECK(m->step == 2 && m->count == 1000 && fr.pay_len == 4000);
    zs_frame_copy(&fr, tmpf);
    zeroshard__pull_chunk__free_unpacked(m, NULL);
    zs_frame_deinit(&fr);
    grpc_byte_buffer_destroy(bb);
    TEST_OK(zs_ccall_recv(&d, &bb, &err), err);
    TEST_CHECK(!bb);
    zs_ccall_destroy(&d);
    TEST_OK(zs_client_get_state(cl, 0, 0, 1000, buf, &err), err);
    TEST_CHECK(memcmp(buf, tmpf, 4000) == 0);
    printf("a Pull waiting for step 2: answered when step 2 was committed, with its data\n");

    /* 4. Status while a checkpoint is written. */
    ckpt_t k = {cl, -1, 0};
    pthread_t th;
    TEST_CHECK(pthread_create(&th, NULL, ckpt_thread, &k) == 0);
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL); /* it is inside the write now (3 s) */
    t0 = now_s();
    rc = hello(ch, srv.addr, &err);
    double th_s = now_s() - t0;
    uint64_t steps[8];
    t0 = now_s();
    size_t n = list(ch, srv.addr, steps);
    double tl_s = now_s() - t0;
    int during = !k.done;
    printf("during checkpoint 2: Hello %s in %.3f s, ListCheckpoints in %.3f s: %zu listed\n",
           zs_status_name(rc), th_s, tl_s, n);
    TEST_CHECK(rc == ZS_OK && during && th_s < 1.0 && tl_s < 1.0);
    TEST_CHECK(n == 1 && steps[0] == 1);
    pthread_join(th, NULL);
    TEST_CHECK(k.rc == ZS_OK);
    n = list(ch, srv.addr, steps);
    TEST_CHECK(n == 2 && steps[0] == 1 && steps[1] == 2);
    printf("after it: 1 and 2 listed\n");

    grpc_channel_destroy(ch);
    zs_client_destroy(cl);
    zs_test_server_stop(&srv, SIGTERM);
    free(buf);
    free(tmpf);
    printf("PASS test_server_waits\n");
    return 0;
}
