/*
 * test_spec_budget.c - integration: speculation under a tight --mem-budget
 * never refuses a Pull or a GetState that the same budget serves with
 * speculation off (docs/protocol.md, "Speculative updates", "Memory budget").
 *
 * Two real zs-servers hold the same 1M-element model (22 MiB of state) with
 * the same budget, the state plus 8 MiB: ON with the default --spec-window
 * (1G: room for all 16 pre-image slots, 12 MiB, were the budget not short),
 * OFF with --spec-window 0. Each step of both is pushed stating `expect`,
 * committed with those scalars, pulled (default 1 MiB chunks) and read back
 * with GetState:
 *  1. Six steps: every default Pull and GetState succeeds on both (before
 *     the fix, ON refused every one from step 1: the pre-images held 7.5 of
 *     the 8 MiB); ON speculated and kept every step, and from step 2 its
 *     pre-images leave room for a default Pull (2 MiB) while it speculates.
 *  2. Mid-speculation, a Pull with 2.5 MiB chunks waits for the step
 *     (5 MiB of buffers) and a GetState runs beside it: what OFF serves, ON
 *     serves too (it takes its pre-images back, the step commits plainly).
 *  3. Two more steps: ON still speculates (within what the calls left).
 * After every step the pulled parameters of ON and OFF are bitwise equal,
 * and at the end so are all three tensors.
 */
#define _GNU_SOURCE
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

#define NPARAM 1048576ull
#define MODEL  "spec-budget"
#define SPARE  (8ull << 20) /* budget beyond the state */
#define TMO_MS 30000
#define M(n)   "/zeroshard.Shard/" n

enum { ON = 0, OFF = 1 };
static const char *g_name[2] = {"ON", "OFF"};
static zs_test_server_t g_srv[2];
static grpc_channel *g_ch[2];
static zs_client_t *g_cl[2];
static uint64_t g_budget;

typedef struct {
    uint64_t budget, reserved, window, elements, hits;
} hello_t;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Hello to server i over a raw channel: the budget and the counters. */
static hello_t hello(grpc_channel *ch, const char *addr)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    Zeroshard__HelloReply *r = NULL;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_unary(ch, M("Hello"), NULL, TMO_MS, addr, &q.base,
                     &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, &err),
            err);
    hello_t h = {r->mem_budget, r->mem_reserved, 0, 0, 0};
    if (r->counters) {
        h.window = r->counters->spec_window_bytes;
        h.elements = r->counters->spec_elements;
        h.hits = r->counters->spec_hits;
    }
    zeroshard__hello_reply__free_unpacked(r, NULL);
    return h;
}

static hello_t hello_i(int i)
{
    return hello(g_ch[i], g_srv[i].addr);
}

/* Wait (<= 20 s) until ON has speculated more elements than `base`. */
static hello_t wait_spec(uint64_t base, const char *what)
{
    hello_t h = hello_i(ON);
    for (int k = 0; k < 400 && h.elements <= base; k++) {
        sleep_ms(50);
        h = hello_i(ON);
    }
    TEST_CHECKF(h.elements > base && h.window > 0, "%s: ON speculated nothing (window %llu)", what,
                (unsigned long long)h.window);
    return h;
}

/* The scalars every step states and commits: no clipping, no overflow. */
static zs_step_scalars_t scalars(uint64_t step)
{
    zs_step_scalars_t s = {step, 1.0f / 1024, 1.0f, 1e-3f, 0, ZS_DTYPE_NONE};
    return s;
}

/* Push step `step` to server i stating its scalars (`g` in the step's
 * dtype). */
static void push(int i, uint64_t step, const void *g)
{
    zs_err_t err;
    zs_err_clear(&err);
    zs_step_scalars_t e = scalars(step);
    TEST_OK(zs_client_push_expect(g_cl[i], step, 0, NPARAM, g, zs_synth_dtype(step), &e, &err),
            err);
}

static void commit(int i, uint64_t step)
{
    zs_err_t err;
    zs_err_clear(&err);
    zs_step_scalars_t s = scalars(step);
    TEST_OK(zs_client_commit(g_cl[i], &s, &err), err);
}

/* The training calls that end a step: a default Pull of everything and a
 * GetState of each tensor (into st). Each must succeed. */
static void end_step(int i, uint64_t step, float *p, float *st)
{
    zs_err_t err;
    zs_err_clear(&err);
    uint64_t got = 0;
    int rc = zs_client_pull(g_cl[i], step, 0, NPARAM, p, ZS_DTYPE_F32, &got, &err);
    TEST_CHECKF(rc == ZS_OK && got == step, "step %llu: %s's default Pull: %s: %s",
                (unsigned long long)step, g_name[i], zs_status_name(rc), err.msg);
    for (int t = 0; t < 3; t++) {
        rc = zs_client_get_state(g_cl[i], t, 0, NPARAM, st, &err);
        TEST_CHECKF(rc == ZS_OK, "step %llu: %s's GetState of tensor %d: %s: %s",
                    (unsigned long long)step, g_name[i], t, zs_status_name(rc), err.msg);
        TEST_CHECKF(t != 0 || memcmp(p, st, NPARAM * 4) == 0,
                    "step %llu: %s: Pull and GetState differ", (unsigned long long)step, g_name[i]);
    }
}

/* One step on both servers as the reported run did it: push stating the
 * scalars, (ON) speculation under way, commit, Pull and GetState. */
static void step_both(uint64_t step, void *g, float *tmp, float *p[2], float *st)
{
    zs_synth_grad(step, 0, NPARAM, g, tmp);
    for (int i = 0; i < 2; i++) {
        hello_t b = hello_i(i);
        push(i, step, g);
        if (i == ON) {
            hello_t h = wait_spec(b.elements, "phase 1");
            /* Rule 1: once a Pull has run, the pre-images leave its room. */
            if (step > 1)
                TEST_CHECKF(h.budget - h.reserved >= 2 * ZS_RPC_CHUNK_BYTES,
                            "step %llu: speculating, ON leaves %llu bytes free: no room for a "
                            "default Pull (%u)",
                            (unsigned long long)step, (unsigned long long)(h.budget - h.reserved),
                            2 * ZS_RPC_CHUNK_BYTES);
            printf("step %llu: ON speculating with %.2f MiB of pre-images, %.2f of %.2f MiB "
                   "reserved\n",
                   (unsigned long long)step, h.window / 1048576.0, h.reserved / 1048576.0,
                   h.budget / 1048576.0);
        }
        commit(i, step);
        end_step(i, step, p[i], st);
    }
    TEST_CHECKF(memcmp(p[ON], p[OFF], NPARAM * 4) == 0,
                "step %llu: ON's parameters differ from OFF's", (unsigned long long)step);
}

/* Start a raw Pull of step min_step with chunk_bytes cb on server i. */
static void pull_start(int i, zs_ccall_t *c, uint64_t min_step, uint32_t cb)
{
    Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
    q.min_step = min_step;
    q.count = NPARAM;
    q.dtype = ZEROSHARD__DTYPE__F32;
    q.chunk_bytes = cb;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_ccall_start(c, g_ch[i], M("Pull"), NULL, TMO_MS, g_srv[i].addr, &err), err);
    TEST_OK(zs_ccall_send(c, zs_msg_build(&q.base), &err), err);
}

/* Receive a raw Pull into dst to its end; its status (err says why). */
static int pull_finish(zs_ccall_t *c, float *dst, zs_err_t *err)
{
    uint64_t got = 0;
    int rc;
    for (;;) {
        grpc_byte_buffer *bb;
        rc = zs_ccall_recv(c, &bb, err);
        if (rc || !bb)
            break;
        Zeroshard__PullChunk *m;
        zs_frame_t fr;
        TEST_OK(zs_frame_parse(bb, &zeroshard__pull_chunk__descriptor, (ProtobufCMessage **)&m, &fr,
                               err),
                *err);
        TEST_CHECK(m->offset == got && fr.pay_len == m->count * 4 && got + m->count <= NPARAM);
        zs_frame_copy(&fr, dst + got);
        got += m->count;
        zeroshard__pull_chunk__free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
        grpc_byte_buffer_destroy(bb);
    }
    zs_ccall_destroy(c);
    if (!rc && got != NPARAM)
        rc = zs_err_set(err, ZS_ERR_INTERNAL, "pull ended after %llu elements",
                        (unsigned long long)got);
    return rc;
}

/* Phase 2: mid-speculation, a waiting Pull with 2.5 MiB chunks (5 MiB of
 * buffers) and a GetState beside it, on both servers. */
static void concurrent_calls(uint64_t step, void *g, float *tmp, float *p[2], float *st)
{
    const uint32_t cb = 5u << 19;
    zs_synth_grad(step, 0, NPARAM, g, tmp);
    zs_ccall_t c[2];
    int rc[2][2];
    zs_err_t err[2][2];
    for (int i = 0; i < 2; i++) {
        hello_t b = hello_i(i);
        push(i, step, g);
        if (i == ON) {
            b = wait_spec(b.elements, "phase 2");
            TEST_CHECKF(b.budget - b.reserved < 2ull * cb,
                        "phase 2: ON leaves %llu bytes free: the Pull would not need its "
                        "pre-images",
                        (unsigned long long)(b.budget - b.reserved));
        }
        pull_start(i, &c[i], step, cb);
        /* Until it waits with its buffers reserved (the reservation beside
         * the pre-images grew by them); a refused one never does: 10 s. */
        for (int k = 0; k < 200; k++) {
            hello_t h = hello_i(i);
            if (h.reserved - h.window >= b.reserved - b.window + 2ull * cb)
                break;
            sleep_ms(50);
        }
        zs_err_clear(&err[i][1]);
        rc[i][1] = zs_client_get_state(g_cl[i], 0, 0, NPARAM, st, &err[i][1]);
        commit(i, step);
        zs_err_clear(&err[i][0]);
        rc[i][0] = pull_finish(&c[i], p[i], &err[i][0]);
    }
    const char *call[2] = {"waiting Pull (2 x 2.5 MiB)", "GetState beside it"};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 2; i++)
            printf("phase 2: %s's %s: %s%s%s\n", g_name[i], call[k], zs_status_name(rc[i][k]),
                   rc[i][k] ? ": " : "", rc[i][k] ? err[i][k].msg : "");
        TEST_CHECKF(rc[OFF][k] != ZS_OK || rc[ON][k] == ZS_OK,
                    "phase 2: the %s: OFF serves it, ON refused it: %s", call[k], err[ON][k].msg);
        TEST_CHECKF(rc[OFF][k] == ZS_OK, "phase 2: the %s: OFF refused it: %s", call[k],
                    err[OFF][k].msg);
    }
    TEST_CHECKF(memcmp(p[ON], p[OFF], NPARAM * 4) == 0,
                "phase 2: ON's parameters differ from OFF's");
}

/* The state bytes of the model as a server counts them: Hello's
 * mem_reserved of a probe server holding only the model. */
static uint64_t probe_state_bytes(const char *dir, const zs_adam_hparams_t *hp, const float *w)
{
    zs_test_server_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.data_dir, sizeof s.data_dir, "%s/probe", dir);
    zs_test_server_start(&s);
    zs_client_opts_t o = {s.addr, NULL, NULL, TMO_MS, 0};
    zs_client_t *cl;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(&o, &cl, &err), err);
    TEST_OK(zs_client_init(cl, MODEL, NPARAM, hp, w, 0, 0, &err), err);
    grpc_channel *ch = zs_channel_create(s.addr, NULL);
    uint64_t r = hello(ch, s.addr).reserved;
    grpc_channel_destroy(ch);
    zs_client_destroy(cl);
    zs_test_server_stop(&s, SIGTERM);
    TEST_CHECK(r >= 22 * NPARAM && r < 22 * NPARAM + 65536);
    return r;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("ZS_LOG_LEVEL", "error", 0);
    const char *dir = zs_test_tmpdir("specbudget");
    zs_adam_hparams_t hp = zs_synth_hparams();
    float *w = malloc(NPARAM * 4), *tmp = malloc(NPARAM * 4), *st = malloc(NPARAM * 4);
    float *p[2] = {malloc(NPARAM * 4), malloc(NPARAM * 4)};
    void *g = malloc(NPARAM * 4);
    TEST_CHECK(w && tmp && st && p[0] && p[1] && g);
    for (uint64_t i = 0; i < NPARAM; i++)
        w[i] = zs_synth_weight(i);

    uint64_t state = probe_state_bytes(dir, &hp, w);
    g_budget = state + SPARE;
    for (int i = 0; i < 2; i++) {
        snprintf(g_srv[i].data_dir, sizeof g_srv[i].data_dir, "%s/%s", dir, g_name[i]);
        snprintf(g_srv[i].extra, sizeof g_srv[i].extra, "--mem-budget %llu%s",
                 (unsigned long long)g_budget, i == OFF ? " --spec-window 0" : "");
        zs_test_server_start(&g_srv[i]);
        zs_client_opts_t o = {g_srv[i].addr, NULL, NULL, TMO_MS, 0};
        zs_err_t err;
        zs_err_clear(&err);
        TEST_OK(zs_client_create(&o, &g_cl[i], &err), err);
        g_ch[i] = zs_channel_create(g_srv[i].addr, NULL);
        TEST_OK(zs_client_init(g_cl[i], MODEL, NPARAM, &hp, w, 0, 0, &err), err);
        TEST_CHECK(hello_i(i).budget == g_budget);
    }
    printf("ON and OFF: budget %.2f MiB = the state (%.2f MiB) + 8 MiB; ON --spec-window 1G, "
           "OFF 0\n",
           g_budget / 1048576.0, state / 1048576.0);

    uint64_t step = 1;
    for (; step <= 6; step++)
        step_both(step, g, tmp, p, st);
    hello_t h = hello_i(ON);
    TEST_CHECKF(h.hits == 6, "phase 1: ON kept %llu of 6 steps' speculation",
                (unsigned long long)h.hits);
    printf("phase 1: 6 steps, every default Pull and GetState served on both; ON kept its "
           "speculation 6 times; bitwise equal\n");

    concurrent_calls(step++, g, tmp, p, st);

    uint64_t hits = hello_i(ON).hits;
    for (int k = 0; k < 2; k++, step++)
        step_both(step, g, tmp, p, st);
    h = hello_i(ON);
    TEST_CHECKF(h.hits == hits + 2, "phase 3: ON kept %llu of 2 steps' speculation",
                (unsigned long long)(h.hits - hits));
    printf("phase 3: 2 more steps, ON speculating with %.2f MiB of pre-images\n",
           h.window / 1048576.0);

    for (int t = 0; t < 3; t++) {
        zs_err_t err;
        zs_err_clear(&err);
        TEST_OK(zs_client_get_state(g_cl[ON], t, 0, NPARAM, p[ON], &err), err);
        TEST_OK(zs_client_get_state(g_cl[OFF], t, 0, NPARAM, p[OFF], &err), err);
        TEST_CHECKF(memcmp(p[ON], p[OFF], NPARAM * 4) == 0, "tensor %d: ON differs from OFF", t);
    }
    printf("after %llu steps all three tensors of ON and OFF are bitwise equal\n",
           (unsigned long long)(step - 1));

    for (int i = 0; i < 2; i++) {
        grpc_channel_destroy(g_ch[i]);
        zs_client_destroy(g_cl[i]);
        zs_test_server_stop(&g_srv[i], SIGTERM);
    }
    free(w);
    free(tmp);
    free(st);
    free(p[0]);
    free(p[1]);
    free(g);
    printf("PASS test_spec_budget\n");
    return 0;
}
