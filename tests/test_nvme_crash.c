/*
 * test_nvme_crash.c - kill -9 of a zs-server whose state is in its NVMe
 * tier (--nvme-path), mid-update and mid-checkpoint, against real server
 * processes on 127.0.0.1; a RAM server fed the same calls is the reference.
 *
 * One server each, P = 1000003 (16 tiles, the last short), 2 optimizer
 * threads; the NVMe server runs with ZS_NVME_TEST_TILE_DELAY_MS=150 (each
 * tile's update then waits, so a pass takes about 1.2 s) and
 * ZS_STORE_TEST_MARKER_DELAY_MS=2000 (a checkpoint's data is durable 2 s
 * before its marker).
 *
 *  1. Steps 1-2 (fp32 then bf16 gradients), checkpoint 2 on both. Step 3
 *     committed; while the NVMe server's pass is running (Hello: applied 3,
 *     2 passes completed) it is killed (SIGKILL). Restarted on the same
 *     directories it resumes at step 2 (the dead server's tile file is
 *     removed, the state rebuilt from RocksDB): p, m, v == the RAM server's
 *     at step 2, bitwise. Step 3 again: == RAM at 3, bitwise.
 *  2. Checkpoint 3 requested, the server killed while its marker waits:
 *     restarted, it resumes at 2 again, bitwise; step 3 again, == RAM.
 *  3. Both keep training (steps 4-5, fp16 gradients, bf16 pulls): pulls and
 *     state bitwise equal.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_proc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define P     1000003ull
#define MODEL "nvme-crash"

static zs_test_server_t g_ram, g_nv;
static zs_client_t *g_cr, *g_cn;
static float *g_state_at[8][3]; /* the RAM server's p, m, v after step s */

static zs_client_t *client(zs_test_server_t *s)
{
    zs_client_opts_t o = {0};
    o.servers = s->addr;
    o.timeout_ms = 30000;
    o.retries = -1; /* a killed server is an error at once, not retried */
    zs_client_t *c;
    zs_err_t err;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    return c;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Push step s's synthetic gradients and commit (pulls in bf16). */
static void step(zs_client_t *c, uint64_t s)
{
    zs_err_t err;
    float *tmp = malloc(P * 4);
    void *g = malloc(P * 4);
    TEST_CHECK(tmp && g);
    zs_synth_grad(s, 0, P, g, tmp);
    TEST_OK(zs_client_push(c, s, 0, P, g, zs_synth_dtype(s), &err), err);
    zs_step_scalars_t sc = {s, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
    TEST_OK(zs_client_commit(c, &sc, &err), err);
    free(tmp);
    free(g);
}

static void get_state(zs_client_t *c, float *dst[3])
{
    zs_err_t err;
    for (int t = 0; t < 3; t++)
        TEST_OK(zs_client_get_state(c, t, 0, P, dst[t], &err), err);
}

/* The RAM server's state after step s, kept. */
static void keep_ram(uint64_t s)
{
    for (int t = 0; t < 3; t++) {
        g_state_at[s][t] = malloc(P * 4);
        TEST_CHECK(g_state_at[s][t]);
    }
    get_state(g_cr, g_state_at[s]);
}

/* The NVMe server's state must be the RAM server's after step s. */
static void expect_at(uint64_t s, const char *what)
{
    float *got[3];
    for (int t = 0; t < 3; t++)
        TEST_CHECK((got[t] = malloc(P * 4)) != NULL);
    get_state(g_cn, got);
    for (int t = 0; t < 3; t++) {
        size_t i = 0;
        while (i < P && memcmp(&got[t][i], &g_state_at[s][t][i], 4) == 0)
            i++;
        TEST_CHECKF(i == P, "%s: tensor %d element %zu is %.9g, RAM at step %llu has %.9g", what, t,
                    i, i < P ? got[t][i] : 0.0, (unsigned long long)s,
                    i < P ? g_state_at[s][t][i] : 0.0);
        free(got[t]);
    }
    zs_server_info_t in;
    zs_err_t err;
    TEST_OK(zs_client_hello(g_cn, MODEL, P, &in, &err), err);
    TEST_CHECKF(in.applied_step == s && in.nvme, "%s: applied %llu (want %llu), nvme %d", what,
                (unsigned long long)in.applied_step, (unsigned long long)s, in.nvme);
}

static void restart_nvme(void)
{
    zs_client_destroy(g_cn);
    zs_test_server_start(&g_nv);
    g_cn = client(&g_nv);
    zs_err_t err;
    TEST_OK(zs_client_hello(g_cn, MODEL, P, NULL, &err), err); /* learns P */
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *tmp = zs_test_tmpdir("nvme_crash");
    setenv("ZS_LOG_LEVEL", "warn", 1);
    snprintf(g_ram.data_dir, sizeof g_ram.data_dir, "%s/ram", tmp);
    snprintf(g_nv.data_dir, sizeof g_nv.data_dir, "%s/nv", tmp);
    snprintf(g_nv.extra, sizeof g_nv.extra, "--nvme-path %s/nv-tiles --nvme-buffers 6", tmp);
    zs_test_server_start(&g_ram);
    setenv("ZS_NVME_TEST_TILE_DELAY_MS", "150", 1);
    setenv("ZS_STORE_TEST_MARKER_DELAY_MS", "2000", 1);
    zs_test_server_start(&g_nv);
    g_cr = client(&g_ram);
    g_cn = client(&g_nv);

    zs_err_t err;
    zs_adam_hparams_t hp = zs_synth_hparams();
    float *w = malloc(P * 4);
    TEST_CHECK(w);
    for (uint64_t i = 0; i < P; i++)
        w[i] = zs_synth_weight(i);
    TEST_OK(zs_client_init(g_cr, MODEL, P, &hp, w, 0, 0, &err), err);
    TEST_OK(zs_client_init(g_cn, MODEL, P, &hp, w, 0, 0, &err), err);
    free(w);
    keep_ram(0);
    expect_at(0, "after Initialize");

    printf("1. kill -9 mid-update\n");
    for (uint64_t s = 1; s <= 2; s++) {
        step(g_cr, s);
        step(g_cn, s);
        keep_ram(s);
        expect_at(s, "a step");
    }
    TEST_OK(zs_client_checkpoint(g_cr, 2, 0, &err), err);
    TEST_OK(zs_client_checkpoint(g_cn, 2, 0, &err), err);
    step(g_cr, 3);
    keep_ram(3);
    step(g_cn, 3);
    sleep_ms(500);
    zs_server_info_t in;
    TEST_OK(zs_client_hello(g_cn, MODEL, P, &in, &err), err);
    TEST_CHECKF(in.applied_step == 3 && in.steps_applied == 2,
                "not mid-update: applied %llu, passes done %llu",
                (unsigned long long)in.applied_step, (unsigned long long)in.steps_applied);
    zs_test_server_stop(&g_nv, SIGKILL);
    restart_nvme();
    expect_at(2, "restarted after kill -9 mid-update");
    printf("  killed in step 3's pass (applied 3, 2 passes done); restarted: resumes at 2, "
           "p, m, v == RAM at 2, bitwise\n");
    step(g_cn, 3);
    expect_at(3, "step 3 again");
    printf("  step 3 again: == RAM at 3, bitwise\n");

    printf("2. kill -9 mid-checkpoint\n");
    /* The checkpoint call blocks while the marker waits: kill from a child. */
    pid_t k = fork();
    if (k == 0) {
        sleep_ms(1200);
        kill(g_nv.pid, SIGKILL);
        _exit(0);
    }
    int rc = zs_client_checkpoint(g_cn, 3, 0, &err);
    TEST_CHECKF(rc != ZS_OK, "checkpoint 3 completed before the kill");
    waitpid(k, NULL, 0);
    zs_test_server_stop(&g_nv, SIGKILL);
    restart_nvme();
    expect_at(2, "restarted after kill -9 mid-checkpoint");
    printf("  killed while checkpoint 3's marker waited (%s); restarted: resumes at 2, bitwise\n",
           zs_status_name(rc));
    step(g_cn, 3);
    expect_at(3, "step 3 once more");

    printf("3. training on\n");
    for (uint64_t s = 4; s <= 5; s++) {
        step(g_cr, s);
        step(g_cn, s);
        keep_ram(s);
        expect_at(s, "training on");
        uint16_t *a = malloc(P * 2), *b = malloc(P * 2);
        uint64_t sa, sb;
        TEST_CHECK(a && b);
        TEST_OK(zs_client_pull(g_cr, s, 0, P, a, ZS_DTYPE_BF16, &sa, &err), err);
        TEST_OK(zs_client_pull(g_cn, s, 0, P, b, ZS_DTYPE_BF16, &sb, &err), err);
        TEST_CHECKF(memcmp(a, b, P * 2) == 0 && sa == sb, "bf16 pull of step %llu differs",
                    (unsigned long long)s);
        free(a);
        free(b);
    }
    printf("  steps 4-5: pulls and p, m, v == RAM, bitwise\n");
    zs_client_destroy(g_cn);
    zs_client_destroy(g_cr);
    zs_test_server_stop(&g_nv, SIGTERM);
    zs_test_server_stop(&g_ram, SIGTERM);
    printf("PASS test_nvme_crash\n");
    return 0;
}
