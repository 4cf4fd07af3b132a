/*
 * test_server.c - integration: 2 real zs-server processes on 127.0.0.1, a
 * model of ~10M parameters, 30 steps of seeded synthetic gradients pushed by
 * 2 client processes with disjoint partitions (each spanning both servers).
 *
 * Checks:
 *  1. After 30 steps the fp32 master, exp_avg and exp_avg_sq on the servers,
 *     and the bf16 copies the clients pulled, are bitwise equal to a
 *     single-process run of the same kernel (zs_adam_update).
 *  2. Checkpoint at step 20; step 25 pushed and speculated (the clients
 *     state the unclipped scalars with their pushes), then kill -9 server 1
 *     before the commit; restart it (it loads checkpoint 20 by itself);
 *     restore 20 everywhere; replay 21..30: still bitwise equal to the
 *     uninterrupted reference. Speculation was kept on some steps and
 *     rolled back on others (clipped, skipped) on both servers.
 *  3. Hello reports layout, steps and checkpoints as expected.
 * Steps cover fp32, bf16 and fp16 gradients, a clipped step, a skipped
 * (overflow) step, and a varying learning rate.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_rpc.h"
#include "zs_proc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define NPARAM   10000019ull /* prime: nothing lines up by accident */
#define STEPS    30
#define NWORKERS 2
#define MODEL    "synthetic-10m"

static int64_t zs_now_ms_test(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static zs_step_scalars_t scalars(uint64_t step)
{
    zs_step_scalars_t s;
    memset(&s, 0, sizeof s);
    s.step = step;
    s.grad_scale = 0.5f;
    s.clip_coef = step % 4 == 0 ? 0.75f : 1.0f;
    s.lr = 1e-3f * (float)(1 + step % 5) / 5.0f;
    s.skip = step == 7; /* an overflow step */
    s.param_dtype = ZS_DTYPE_BF16;
    return s;
}

static uint64_t part_begin(int w)
{
    return NPARAM * (uint64_t)w / NWORKERS;
}

/* ---- client process ---------------------------------------------------- */

static void child_fail(const char *what, const zs_err_t *err)
{
    fprintf(stderr, "FAIL client %d: %s: %s\n", (int)getpid(), what, err->msg);
    _exit(1);
}

/* Reads commands from `in`: 'P'+step push, 'C'+step commit+pull, 'Q' quit;
 * answers one byte on `out`. Writes its final bf16 partition to `outfile`. */
static void child_main(int w, const char *servers, int in, int out, const char *outfile)
{
    zs_client_opts_t o = {servers, NULL, NULL, 60000, 0};
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    if (zs_client_create(&o, &c, &err))
        child_fail("create", &err);
    if (zs_client_hello(c, MODEL, NPARAM, NULL, &err))
        child_fail("hello", &err);
    uint64_t b = part_begin(w), e = part_begin(w + 1);
    float *tmp = malloc((e - b) * 4);
    void *grad = malloc((e - b) * 4);
    uint16_t *pulled = malloc((e - b) * 2);
    TEST_CHECK(tmp && grad && pulled);
    for (;;) {
        char cmd;
        uint64_t step;
        if (read(in, &cmd, 1) != 1)
            _exit(2);
        if (cmd == 'Q')
            break;
        if (read(in, &step, sizeof step) != sizeof step)
            _exit(2);
        if (cmd == 'P') {
            zs_synth_grad(step, b, e, grad, tmp);
            /* The unclipped, not skipped scalars: speculated, kept on most
             * steps, rolled back on the clipped and skipped ones. */
            zs_step_scalars_t x = scalars(step);
            x.clip_coef = 1.0f;
            x.skip = 0;
            if (zs_client_push_expect(c, step, b, e, grad, zs_synth_dtype(step), &x, &err))
                child_fail("push", &err);
        } else {
            zs_step_scalars_t s = scalars(step);
            if (zs_client_commit(c, &s, &err)) /* both clients commit: idempotent */
                child_fail("commit", &err);
            uint64_t got;
            if (zs_client_pull(c, step, b, e, pulled, ZS_DTYPE_BF16, &got, &err))
                child_fail("pull", &err);
            if (got != step) {
                fprintf(stderr, "FAIL client: pulled step %llu, wanted %llu\n",
                        (unsigned long long)got, (unsigned long long)step);
                _exit(1);
            }
        }
        if (write(out, "k", 1) != 1)
            _exit(2);
    }
    FILE *f = fopen(outfile, "wb");
    TEST_CHECK(f && fwrite(pulled, 2, e - b, f) == e - b);
    fclose(f);
    zs_client_destroy(c);
    _exit(0);
}

typedef struct {
    pid_t pid;
    int to, from;
} child_t;

static void send_cmd(child_t *ch, char cmd, uint64_t step)
{
    for (int w = 0; w < NWORKERS; w++) {
        TEST_CHECK(write(ch[w].to, &cmd, 1) == 1);
        if (cmd != 'Q')
            TEST_CHECK(write(ch[w].to, &step, sizeof step) == sizeof step);
    }
    if (cmd == 'Q')
        return;
    for (int w = 0; w < NWORKERS; w++) {
        char ack;
        TEST_CHECKF(read(ch[w].from, &ack, 1) == 1 && ack == 'k', "client %d failed at %c%llu", w,
                    cmd, (unsigned long long)step);
    }
}

/* ---- reference ------------------------------------------------------------- */

typedef struct {
    float *p, *m, *v;
    uint16_t *lowp;
} ref_t;

static void reference(ref_t *r)
{
    zs_adam_hparams_t hp = zs_synth_hparams();
    r->p = malloc(NPARAM * 4);
    r->m = calloc(NPARAM, 4);
    r->v = calloc(NPARAM, 4);
    r->lowp = malloc(NPARAM * 2);
    float *tmp = malloc(NPARAM * 4);
    void *g = malloc(NPARAM * 4);
    TEST_CHECK(r->p && r->m && r->v && r->lowp && tmp && g);
    for (uint64_t i = 0; i < NPARAM; i++)
        r->p[i] = zs_synth_weight(i);
    int64_t t = 0;
    for (uint64_t s = 1; s <= STEPS; s++) {
        zs_step_scalars_t sc = scalars(s);
        if (sc.skip)
            continue;
        zs_adam_step_t st = {sc.lr, ++t, sc.grad_scale, sc.clip_coef};
        zs_synth_grad(s, 0, NPARAM, g, tmp);
        zs_adam_update(&hp, &st, r->p, r->m, r->v, g, zs_synth_dtype(s), r->lowp, ZS_DTYPE_BF16,
                       NPARAM);
    }
    free(tmp);
    free(g);
}

static void expect_equal_f32(const char *what, const float *a, const float *b, uint64_t n)
{
    uint64_t bad = 0, first = 0;
    for (uint64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0 && bad++ == 0)
            first = i;
    TEST_CHECKF(bad == 0, "%s: %llu of %llu elements differ (first %llu: %.9g vs %.9g)", what,
                (unsigned long long)bad, (unsigned long long)n, (unsigned long long)first, a[first],
                b[first]);
    printf("  %s: %llu elements bitwise equal\n", what, (unsigned long long)n);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *tmp = zs_test_tmpdir("server");
    zs_test_server_t srv[2];
    memset(srv, 0, sizeof srv);
    for (int i = 0; i < 2; i++) {
        snprintf(srv[i].data_dir, sizeof srv[i].data_dir, "%s/s%d", tmp, i);
        zs_test_server_start(&srv[i]);
    }
    char servers[256];
    zs_test_server_list(srv, 2, servers, sizeof servers);
    printf("servers: %s\n", servers);

    /* Two client processes, forked before this process touches gRPC (gRPC
     * state does not survive fork). */
    child_t ch[NWORKERS];
    char outfile[NWORKERS][300];
    for (int w = 0; w < NWORKERS; w++) {
        int a[2], b[2];
        TEST_CHECK(pipe(a) == 0 && pipe(b) == 0);
        snprintf(outfile[w], sizeof outfile[w], "%s/client%d.bf16", tmp, w);
        fflush(NULL);
        pid_t pid = fork();
        TEST_CHECK(pid >= 0);
        if (pid == 0) {
            close(a[1]);
            close(b[0]);
            child_main(w, servers, a[0], b[1], outfile[w]);
        }
        close(a[0]);
        close(b[1]);
        ch[w] = (child_t){pid, a[1], b[0]};
    }

    /* Initialize from the test process. */
    zs_client_opts_t o = {servers, NULL, NULL, 60000, 0};
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(&o, &c, &err), err);
    float *w0 = malloc(NPARAM * 4);
    TEST_CHECK(w0);
    for (uint64_t i = 0; i < NPARAM; i++)
        w0[i] = zs_synth_weight(i);
    zs_adam_hparams_t hp = zs_synth_hparams();
    TEST_OK(zs_client_init(c, MODEL, NPARAM, &hp, w0, 0, 0, &err), err);
    free(w0);

    int killed = 0;
    for (uint64_t step = 1; step <= STEPS; step++) {
        zs_server_info_t before[2];
        TEST_OK(zs_client_hello(c, MODEL, NPARAM, before, &err), err);
        send_cmd(ch, 'P', step);
        if (step == 25 && !killed) {
            /* kill -9 mid-speculation: server 1 has updated step 25's chunks
             * speculatively and no commit came. */
            zs_server_info_t now[2];
            int64_t t0 = zs_now_ms_test();
            do {
                TEST_OK(zs_client_hello(c, MODEL, NPARAM, now, &err), err);
            } while (now[1].spec_elements == before[1].spec_elements &&
                     zs_now_ms_test() - t0 < 20000);
            TEST_CHECKF(now[1].spec_elements > before[1].spec_elements,
                        "server 1 did not speculate step 25");
            killed = 1;
            zs_test_server_stop(&srv[1], SIGKILL);
            printf("step 25: pushed, server 1 speculated %llu elements; killed with SIGKILL "
                   "before the commit; restarting on %s\n",
                   (unsigned long long)(now[1].spec_elements - before[1].spec_elements),
                   srv[1].addr);
            zs_test_server_start(&srv[1]);
            zs_server_info_t info[2];
            TEST_OK(zs_client_hello(c, MODEL, NPARAM, info, &err), err);
            TEST_CHECKF(info[0].applied_step == 24 && info[1].applied_step == 20,
                        "after restart: server steps %llu, %llu (want 24, 20)",
                        (unsigned long long)info[0].applied_step,
                        (unsigned long long)info[1].applied_step);
            TEST_CHECK(info[1].ncheckpoints == 1 && info[1].checkpoints[0] == 20);
            uint64_t steps[8];
            size_t n;
            TEST_OK(zs_client_checkpoints(c, steps, 8, &n, &err), err);
            TEST_CHECK(n == 1 && steps[0] == 20);
            TEST_OK(zs_client_restore(c, 20, &err), err);
            printf("restored step 20 on both servers; replaying 21..30\n");
            step = 20;
            continue;
        }
        send_cmd(ch, 'C', step);
        if (step == 20) {
            TEST_OK(zs_client_checkpoint(c, 20, 0, &err), err);
            printf("step 20: checkpoint complete on both servers\n");
        }
    }
    send_cmd(ch, 'Q', 0);
    for (int w = 0; w < NWORKERS; w++) {
        int st;
        waitpid(ch[w].pid, &st, 0);
        TEST_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %d exited badly", w);
    }

    /* Layout and counters as the servers report them. */
    zs_server_info_t info[2];
    TEST_OK(zs_client_hello(c, MODEL, NPARAM, info, &err), err);
    for (int i = 0; i < 2; i++) {
        printf("server %d: [%llu, %llu) step %llu, Adam t %llu, in %.1f MB, out %.1f MB, "
               "optimizer %.2f GB/s\n",
               i, (unsigned long long)info[i].range_begin, (unsigned long long)info[i].range_end,
               (unsigned long long)info[i].applied_step, (unsigned long long)info[i].optimizer_step,
               info[i].bytes_in / 1e6, info[i].bytes_out / 1e6, info[i].optimizer_gbps);
        TEST_CHECK(info[i].applied_step == STEPS && info[i].optimizer_step == STEPS - 1);
        printf("server %d: speculation kept %llu steps, rolled back %llu\n", i,
               (unsigned long long)info[i].spec_hits, (unsigned long long)info[i].spec_rollbacks);
        /* Server 0 ran all 35 steps, server 1 the 10 replayed ones: the
         * clipped (4, 8, ...) and skipped (7) steps roll back. */
        TEST_CHECKF(info[i].spec_hits > 0 && info[i].spec_rollbacks > 0,
                    "server %d: speculation kept %llu, rolled back %llu", i,
                    (unsigned long long)info[i].spec_hits,
                    (unsigned long long)info[i].spec_rollbacks);
        TEST_CHECK(info[i].num_servers == 2 && info[i].server_index == (uint32_t)i);
    }
    TEST_CHECK(info[0].range_begin == 0 && info[0].range_end == info[1].range_begin &&
               info[1].range_end == NPARAM);

    /* Compare with the single-process run. */
    ref_t r;
    reference(&r);
    float *got = malloc(NPARAM * 4);
    TEST_CHECK(got);
    TEST_OK(zs_client_pull(c, STEPS, 0, NPARAM, got, ZS_DTYPE_F32, NULL, &err), err);
    expect_equal_f32("master (pull fp32)", got, r.p, NPARAM);
    TEST_OK(zs_client_get_state(c, 1, 0, NPARAM, got, &err), err);
    expect_equal_f32("exp_avg", got, r.m, NPARAM);
    TEST_OK(zs_client_get_state(c, 2, 0, NPARAM, got, &err), err);
    expect_equal_f32("exp_avg_sq", got, r.v, NPARAM);
    for (int w = 0; w < NWORKERS; w++) {
        uint64_t b = part_begin(w), e = part_begin(w + 1);
        uint16_t *bf = malloc((e - b) * 2);
        FILE *f = fopen(outfile[w], "rb");
        TEST_CHECK(f && bf && fread(bf, 2, e - b, f) == e - b);
        fclose(f);
        TEST_CHECKF(memcmp(bf, r.lowp + b, (e - b) * 2) == 0,
                    "client %d: pulled bf16 differs from the reference", w);
        printf("  client %d bf16 partition [%llu, %llu): bitwise equal\n", w, (unsigned long long)b,
               (unsigned long long)e);
        free(bf);
    }

    /* Client state stored with a checkpoint comes back with the restore. */
    const char meta[] = "loss-scaler state 0123456789";
    TEST_OK(zs_client_checkpoint_meta(c, STEPS, 0, meta, sizeof meta, &err), err);
    char back[64];
    size_t blen = 0;
    TEST_OK(zs_client_restore_meta(c, STEPS, back, sizeof back, &blen, &err), err);
    TEST_CHECK(blen == sizeof meta && memcmp(back, meta, sizeof meta) == 0);
    /* SetStep moves the counters (workers that run the optimizer themselves). */
    TEST_OK(zs_client_set_step(c, 40, 35, &err), err);
    TEST_OK(zs_client_hello(c, MODEL, NPARAM, info, &err), err);
    TEST_CHECK(info[0].applied_step == 40 && info[1].optimizer_step == 35);
    TEST_CHECK(zs_client_set_step(c, 40, 41, &err) == ZS_ERR_INVALID);
    printf("  user_meta round trip and SetStep: ok\n");

    /* A method the server does not have is answered at once, not left to the
     * deadline. */
    {
        grpc_channel *ch = zs_channel_create(srv[0].addr, NULL);
        Zeroshard__ListRequest q = ZEROSHARD__LIST_REQUEST__INIT;
        ProtobufCMessage *r = NULL;
        int64_t t0 = zs_now_ms_test();
        int rc = zs_unary(ch, "/zeroshard.Shard/NoSuchMethod", NULL, 20000, srv[0].addr, &q.base,
                          &zeroshard__list_reply__descriptor, &r, &err);
        TEST_CHECKF(rc == ZS_ERR_UNIMPLEMENTED && strstr(err.msg, "unknown method"),
                    "unknown method: rc %d: %s", rc, err.msg);
        TEST_CHECK(zs_now_ms_test() - t0 < 5000);
        grpc_channel_destroy(ch);
        printf("  unknown method: %s\n", err.msg);
    }

    zs_client_destroy(c);
    for (int i = 0; i < 2; i++)
        zs_test_server_stop(&srv[i], SIGTERM);
    printf("PASS test_server\n");
    return 0;
}
