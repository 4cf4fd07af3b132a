/*
 * test_engine_shm.c - the shared-memory transport (docs/engine.md,
 * "Shared-memory transport") against real zs-server processes: the offload
 * staging of each worker is a memfd segment its co-located servers map, and
 * Push / Pull carry ShmRefs instead of the elements.
 *
 *  1. Equality: tests/engine_worker.c with --transport shm and with
 *     --transport tcp ends with bitwise the same parameters, stages 0-3 x W
 *     in {1, 2} x fp32/bf16/fp16 (two overflow-skipped steps), half of the
 *     runs speculating on the servers, two thirds with streamed pulls (the
 *     rest synchronous); plus stage 3 with offload_param and with a
 *     resident bucket, and one micro-batch at W = 1 in bf16 (the CPU
 *     device's cast straight into staging). --transport shm fails unless
 *     every server takes the segment, and each shm run's log names the
 *     transport of every server ("server i (addr): transport shm (socket
 *     PATH)") on every worker.
 *  2. Resume: a checkpoint written over tcp, resumed over shm (the resume's
 *     pulls land in the shared staging), ends bitwise equal to the
 *     uninterrupted tcp run.
 *  3. A server without a socket (zs-server --shm-socket off): engine_worker
 *     and zs-train with --transport shm fail naming it and why (zs-train:
 *     exit 5 and one line); --transport auto trains, and the log says
 *     server 0 is on shm and server 1 on tcp, with the reason.
 *
 * `test_engine_shm quick` runs one case of 1 and part 3 (for working on it).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_proc.h"
#include "zs_test.h"

#define MPIRUN ZS_MPIEXEC " " ZS_TEST_MPI_OPTS
#define TINY   "--layers 1 --heads 2 --width 16 --ctx 8"

static char g_tmp[200], g_servers[256];
static zs_test_server_t g_srv[2];
static int g_runs;

/* engine_worker under mpirun, np ranks, output to log; its exit code. */
static int worker(int np, const char *log, const char *args)
{
    g_runs++;
    return zs_test_sh("ZS_LOG_LEVEL=info timeout -k 10 300 " MPIRUN " -np %d %s %s > %s 2>&1", np,
                      ZS_ENGINE_WORKER, args, log);
}

static void must(int rc, const char *log, const char *what)
{
    if (rc == 0)
        return;
    fprintf(stderr, "FAIL: %s (exit %d); log %s:\n", what, rc, log);
    zs_test_sh("tail -n 40 %s >&2", log);
    exit(1);
}

/* Lines of `log` holding every one of the (up to 3, NULL-ended) strings. */
static int lines_with(const char *log, const char *a, const char *b, const char *c)
{
    FILE *f = fopen(log, "r");
    TEST_CHECKF(f != NULL, "cannot read %s", log);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c));
    fclose(f);
    return n;
}

static int same_file(const char *a, const char *b)
{
    return zs_test_sh("cmp -s %s %s", a, b) == 0;
}

/* Every one of np workers logged transport shm for both servers, and no
 * transport tcp. */
static void check_shm_log(const char *log, int np)
{
    for (int i = 0; i < 2; i++) {
        char who[256];
        snprintf(who, sizeof who, "server %d (%s): transport shm (socket ", i, g_srv[i].addr);
        int n = lines_with(log, who, NULL, NULL);
        TEST_CHECKF(n == np, "%s: %d lines '%s...', want one per worker (%d)", log, n, who, np);
    }
    TEST_CHECKF(lines_with(log, "transport tcp", NULL, NULL) == 0, "%s: a server on tcp", log);
}

/* One case: the same run over tcp and over shm; bitwise equal parameters. */
static void pair(int np, const char *name, const char *args)
{
    char out[2][300], log[2][300], a[1024];
    static const char *const tr[2] = {"tcp", "shm"};
    for (int t = 0; t < 2; t++) {
        snprintf(out[t], sizeof out[t], "%s/%s-%s.bin", g_tmp, name, tr[t]);
        snprintf(log[t], sizeof log[t], "%s/%s-%s.log", g_tmp, name, tr[t]);
        snprintf(a, sizeof a, "%s --offload 1 --servers %s --transport %s --out %s", args,
                 g_servers, tr[t], out[t]);
        must(worker(np, log[t], a), log[t], name);
    }
    check_shm_log(log[1], np);
    TEST_CHECKF(same_file(out[0], out[1]), "%s (W=%d %s): shm and tcp parameters differ", name, np,
                args);
}

static void equality(int quick)
{
    static const char *dtypes[] = {"fp32", "bf16", "fp16"};
    printf("1. --transport shm == --transport tcp, bitwise\n");
    for (int s = 0; s <= 3; s++)
        for (int W = 1; W <= 2; W++)
            for (int d = 0; d < 3; d++) {
                if (quick && !(s == 2 && W == 2 && d == 1))
                    continue;
                int spec = (s + W + d) % 2, stream = (s + W + d) % 3 != 2;
                char name[64], args[512];
                snprintf(name, sizeof name, "eq-s%d-w%d-%s", s, W, dtypes[d]);
                snprintf(args, sizeof args,
                         "--stage %d --dtype %s --steps 8 --clip 1.0 --spec %d --stream %d %s", s,
                         dtypes[d], spec, stream, d == 2 ? "--inject-nan 5 --inject-count 2" : "");
                pair(W, name, args);
                printf("  stage %d W=%d %s%s%s, %s pulls: shm == tcp, bitwise; every worker "
                       "logged both servers on shm\n",
                       s, W, dtypes[d], d == 2 ? " (2 overflows)" : "", spec ? ", speculation" : "",
                       stream ? "streamed" : "synchronous");
            }
    if (quick)
        return;
    static const char *const extra[3][3] = {
        {"s3-offload-param", "2", "--stage 3 --offload-param 1 --dtype fp32 --steps 8 --clip 1.0"},
        {"s3-persist", "2", "--stage 3 --persist 1200 --dtype bf16 --steps 8 --clip 1.0 --spec 1"},
        {"gas1-w1-bf16", "1", "--stage 2 --dtype bf16 --gas 1 --steps 8 --clip 1.0 --stream 0"},
    };
    for (int k = 0; k < 3; k++) {
        pair(atoi(extra[k][1]), extra[k][0], extra[k][2]);
        printf("  %s (W=%s): shm == tcp, bitwise\n", extra[k][0], extra[k][1]);
    }
}

/* A checkpoint written over tcp, resumed over shm. */
static void resume(void)
{
    printf("2. a tcp checkpoint resumed over shm == the uninterrupted run\n");
    char out[2][300], log[2][300], a[1024];
    const char *common = "--stage 2 --dtype bf16 --offload 1 --steps 8 --clip 1.0";
    for (int t = 0; t < 2; t++) {
        snprintf(out[t], sizeof out[t], "%s/resume-%d.bin", g_tmp, t);
        snprintf(log[t], sizeof log[t], "%s/resume-%d.log", g_tmp, t);
    }
    snprintf(a, sizeof a, "%s --servers %s --transport tcp --ckpt-every 4 --out %s", common,
             g_servers, out[0]);
    must(worker(2, log[0], a), log[0], "tcp run with checkpoints");
    snprintf(a, sizeof a, "%s --servers %s --transport shm --resume --resume-step 4 --out %s",
             common, g_servers, out[1]);
    must(worker(2, log[1], a), log[1], "resume over shm");
    TEST_CHECKF(lines_with(log[1], "resumed at step 4", NULL, NULL) >= 1, "not resumed at 4");
    check_shm_log(log[1], 2);
    TEST_CHECKF(same_file(out[0], out[1]), "resumed over shm differs from the tcp run");
    printf("  stage 2 W=2 bf16, checkpoint 4 (tcp) resumed over shm: == uninterrupted, bitwise\n");
}

/* A server without a socket: named by --transport shm, on tcp with auto. */
static void no_socket(void)
{
    printf("3. a server started with --shm-socket off\n");
    zs_test_server_t two[2];
    char list[256], log[300], a[1024];
    memset(two, 0, sizeof two);
    snprintf(two[0].data_dir, sizeof two[0].data_dir, "%s/m0", g_tmp);
    snprintf(two[1].data_dir, sizeof two[1].data_dir, "%s/m1", g_tmp);
    snprintf(two[1].extra, sizeof two[1].extra, "--shm-socket off");
    zs_test_server_start(&two[0]);
    zs_test_server_start(&two[1]);
    zs_test_server_list(two, 2, list, sizeof list);
    char who_off[256], who_on[256];
    snprintf(who_on, sizeof who_on, "server 0 (%s): transport shm (socket ", two[0].addr);
    snprintf(who_off, sizeof who_off,
             "server 1 (%s): transport tcp (the server offers no shared-memory socket",
             two[1].addr);

    /* the engine: --transport shm fails naming server 1 */
    snprintf(log, sizeof log, "%s/nosock-worker.log", g_tmp);
    snprintf(a, sizeof a,
             "--stage 2 --offload 1 --servers %s --transport shm --steps 2 --timeout-ms 5000",
             list);
    int rc = worker(1, log, a);
    TEST_CHECKF(rc != 0 && lines_with(log, "FAIL rank 0: engine create: server 1 (", two[1].addr,
                                      "--transport shm, but it stays on tcp") == 1,
                "engine_worker --transport shm: exit %d, no error naming server 1", rc);
    printf("  engine_worker --transport shm: fails naming server 1\n");

    /* zs-train --transport shm: exit 5, one line */
    char data[300];
    snprintf(data, sizeof data, "%s/corpus.tok", g_tmp);
    zs_test_tokenize(ZS_TOKENIZE, data, "$(" ZS_TEST_LICENCES " | head -n 3)");
    snprintf(log, sizeof log, "%s/nosock-train.log", g_tmp);
    rc = zs_test_sh("cd %s && ZS_LOG_LEVEL=warn " MPIRUN " -q -np 1 %s --data %s " TINY
                    " --steps 2 --servers %s --transport shm > %s 2>&1",
                    g_tmp, ZS_TRAIN, data, list, log);
    int ours = lines_with(log, "zs-train", NULL, NULL);
    int line = lines_with(log, "zs-train: rank 0: engine: server 1 (", two[1].addr,
                          "--transport shm, but it stays on tcp: the server offers no "
                          "shared-memory socket");
    if (rc != 5 || ours != 1 || line != 1)
        zs_test_sh("cat %s >&2", log);
    TEST_CHECKF(rc == 5 && ours == 1 && line == 1,
                "zs-train --transport shm: exit %d (want 5), %d zs-train lines, %d naming server 1",
                rc, ours, line);
    printf("  zs-train --transport shm: exit 5, one line naming server 1 and why\n");

    /* zs-train --transport auto: trains, the log says who got which */
    snprintf(log, sizeof log, "%s/nosock-auto.log", g_tmp);
    rc = zs_test_sh("cd %s && ZS_LOG_LEVEL=info " MPIRUN " -q -np 2 %s --data %s " TINY
                    " --steps 2 --servers %s --fresh > %s 2>&1",
                    g_tmp, ZS_TRAIN, data, list, log);
    int on = lines_with(log, who_on, NULL, NULL), off = lines_with(log, who_off, NULL, NULL);
    if (rc != 0 || on != 2 || off != 2)
        zs_test_sh("cat %s >&2", log);
    TEST_CHECKF(rc == 0 && on == 2 && off == 2,
                "zs-train --transport auto: exit %d, %d lines '%s', %d lines '%s' (want 2 each)",
                rc, on, who_on, off, who_off);
    printf("  zs-train --transport auto (2 workers): trains; each worker logs server 0 on shm, "
           "server 1 on tcp (no socket offered)\n");
    zs_test_server_stop(&two[0], SIGTERM);
    zs_test_server_stop(&two[1], SIGTERM);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("engine_shm"));
    setenv("ZS_LOG_LEVEL", "warn", 1); /* the servers; each run sets its own level */
    for (int i = 0; i < 2; i++) {
        snprintf(g_srv[i].data_dir, sizeof g_srv[i].data_dir, "%s/s%d", g_tmp, i);
        snprintf(g_srv[i].extra, sizeof g_srv[i].extra, "--keep 3");
        zs_test_server_start(&g_srv[i]);
    }
    zs_test_server_list(g_srv, 2, g_servers, sizeof g_servers);
    equality(quick);
    if (!quick)
        resume();
    no_socket();
    for (int i = 0; i < 2; i++)
        zs_test_server_stop(&g_srv[i], SIGTERM);
    printf("PASS test_engine_shm%s (%d engine_worker runs)\n", quick ? " quick" : "", g_runs);
    return 0;
}
