/*
 * test_mics.c - MiCS (zero_optimization.mics_shard_size,
 * mics_hierarchical_params_gather) on CPU workers: tests/engine_worker.c
 * under mpirun at W = 4 (oversubscribed on 2 cores), 2 real zs-servers.
 *
 *  1. Equivalence: W = 4 with G = 2 (the partitioning of ZeRO-3 at W = 2)
 *     matches the single-process AdamW on the same global batches, fp32
 *     and bf16, optimizer in-process and on the servers (each with the
 *     tolerances of test_engine). Not bitwise against ZeRO-3 at W = 2: the
 *     gradient sums are (x0 + x1) + (x2 + x3) over 4 ranks' micro-batches
 *     here, per-rank sums of 4 micro-batches there (another order of
 *     additions), so the reference is the single-process one. Offload on
 *     and off are bitwise equal (as for every stage in test_engine).
 *     G = W is plain ZeRO-3 (bitwise). 1b: only shard group 0 pushes:
 *     over tcp the servers receive less than 1.25x what W = 2 sends
 *     them (every group pushing would double it; the servers would not
 *     notice otherwise: a repeated push overwrites).
 *  2. Breaks: the replica all-reduce skipped (ZS_ENGINE_DEBUG_MICS_NO_ALLREDUCE)
 *     fails the reference check.
 *  3. Bytes (ZS_RANKS_PER_NODE=2: 2 nodes x 2): G = 2 keeps reduce-scatter
 *     and all-gather within the node (0 bytes across), the all-reduce of
 *     the partitions crosses, less than plain ZeRO-3 crosses in all;
 *     the hierarchical gather at G = 4 halves the all-gather's bytes across
 *     nodes and matches the reference; at 4 nodes of 1 rank, G = 2 with
 *     and without hierarchy are bitwise equal.
 *  4. Memory: the allocator's params, grads and optimizer peaks at G = 2
 *     are about twice those at G = 4 (W = 4), measured, and every category
 *     stays within its formula + working set (engine_worker --mem-check).
 *  5. Resume: W = 4, G = 2 with the optimizer on the servers, checkpoint
 *     at 5; resumed at W = 2 with G = 2 and at W = 4 with G = 4 from the
 *     same servers, both match the reference after 10 steps.
 *  6. Refusals: G not dividing W, stage 2, hpZ / qwZ / qgZ beside MiCS,
 *     the hierarchical key without MiCS: clear errors naming the keys.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "zs_proc.h"
#include "zs_test.h"

#define BF16_TOL "--atol 1e-3 --rtol 5e-3"

static char g_tmp[200], g_servers[256];
static zs_test_server_t g_srv[2];
static int g_runs;

/* The worker under mpirun with np ranks and `rpn` ranks per node (0: MPI's
 * view); output to log. Returns the exit status. */
static int run(int np, int rpn, const char *log, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int run(int np, int rpn, const char *log, const char *fmt, ...)
{
    char args[1024], cmd[2048], env[64] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    if (rpn)
        snprintf(env, sizeof env, "ZS_RANKS_PER_NODE=%d ", rpn);
    snprintf(cmd, sizeof cmd, "%stimeout -k 10 300 %s %s -np %d %s %s > %s 2>&1", env, ZS_MPIEXEC,
             ZS_TEST_MPI_OPTS, np, ZS_ENGINE_WORKER, args, log);
    g_runs++;
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void must(int rc, const char *log, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "FAIL: %s (exit %d); log %s:\n", what, rc, log);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "tail -n 30 %s >&2", log);
        if (system(cmd) < 0)
            perror("system");
        exit(1);
    }
}

static void show(const char *log, const char *grep)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -E '%s' %s | sed 's/^/    /'", grep, log);
    if (system(cmd) < 0)
        perror("system");
}

/* 1 when log holds a line containing every one of the (NULL-ended) words. */
static int has_line(const char *log, ...)
{
    FILE *f = fopen(log, "r");
    char line[2048];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        va_list ap;
        va_start(ap, log);
        int all = 1;
        for (const char *w = va_arg(ap, const char *); w; w = va_arg(ap, const char *))
            all &= strstr(line, w) != NULL;
        va_end(ap);
        found = all;
    }
    if (f)
        fclose(f);
    return found;
}

static int same_file(const char *a, const char *b)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

/* From the "bytes rank=R step=S ..." line of rank `rank`, step `step`:
 * the value after "key=". */
static unsigned long long bytes_of(const char *log, int rank, int step, const char *key)
{
    FILE *f = fopen(log, "r");
    char line[2048], head[64], k[64];
    unsigned long long v = 0;
    int found = 0;
    snprintf(head, sizeof head, "bytes rank=%d step=%d ", rank, step);
    snprintf(k, sizeof k, " %s=", key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, head, strlen(head)) == 0 && strstr(line, k)) {
            v = strtoull(strstr(line, k) + strlen(k), NULL, 10);
            found = 1;
        }
    if (f)
        fclose(f);
    TEST_CHECKF(found, "%s: no bytes line for rank %d step %d", log, rank, step);
    return v;
}

static void equivalence(void)
{
    printf("1. W=4, G=2 against single-process AdamW\n");
    static const char *dtypes[2] = {"fp32", "bf16"};
    char log[300], out[2][300];
    for (int d = 0; d < 2; d++) {
        for (int off = 0; off < 2; off++) {
            snprintf(log, sizeof log, "%s/eq-%s-o%d.log", g_tmp, dtypes[d], off);
            snprintf(out[off], sizeof out[off], "%s/eq-%s-o%d.bin", g_tmp, dtypes[d], off);
            must(run(4, 0, log,
                     "--stage 3 --mics 2 --dtype %s --offload %d --servers %s --steps 10 --ref "
                     "--out %s %s",
                     dtypes[d], off, g_servers, out[off], d ? BF16_TOL : "--atol 2e-6 --rtol 1e-4"),
                 log, "MiCS run");
            printf("  %s offload %d: ", dtypes[d], off);
            fflush(stdout);
            show(log, "^maxerr");
        }
        TEST_CHECKF(same_file(out[0], out[1]), "%s: offload on and off differ", dtypes[d]);
        printf("  %s: offload on and off bitwise equal\n", dtypes[d]);
    }
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/gw-mics.bin", g_tmp);
    snprintf(b, sizeof b, "%s/gw-plain.bin", g_tmp);
    snprintf(log, sizeof log, "%s/gw-mics.log", g_tmp);
    must(run(4, 0, log, "--stage 3 --mics 4 --steps 10 --out %s", a), log, "G = W");
    snprintf(log, sizeof log, "%s/gw-plain.log", g_tmp);
    must(run(4, 0, log, "--stage 3 --steps 10 --out %s", b), log, "plain ZeRO-3");
    TEST_CHECKF(same_file(a, b), "G = W differs from plain ZeRO-3");
    printf("  G = W = 4: bitwise plain ZeRO-3\n");
}

/* The servers' bytes_in of a run (engine_worker --spec-report). */
static unsigned long long servers_in(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[512];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "servers bytes_in=", 17) == 0)
            v = strtoull(line + 17, NULL, 10);
    if (f)
        fclose(f);
    TEST_CHECKF(v > 0, "%s: no servers bytes_in line", log);
    return v;
}

static void pushes(void)
{
    printf("1b. only shard group 0 pushes: the servers receive what W=2 sends them\n");
    char lm[300], lp[300];
    snprintf(lm, sizeof lm, "%s/push-mics.log", g_tmp);
    snprintf(lp, sizeof lp, "%s/push-w2.log", g_tmp);
    must(run(4, 0, lm,
             "--stage 3 --mics 2 --offload 1 --servers %s --transport tcp --steps 6 --spec-report",
             g_servers),
         lm, "MiCS over tcp");
    must(run(2, 0, lp, "--stage 3 --offload 1 --servers %s --transport tcp --steps 6 --spec-report",
             g_servers),
         lp, "W=2 over tcp");
    unsigned long long m = servers_in(lm), p = servers_in(lp);
    printf("  bytes the servers received in 6 steps: W=4 G=2 %llu, W=2 %llu (%.2fx)\n", m, p,
           (double)m / (double)p);
    TEST_CHECKF((double)m < 1.25 * (double)p,
                "the servers got %.2fx W=2's bytes: duplicate pushes?", (double)m / (double)p);
}

static void breaks(void)
{
    printf("2. the replica all-reduce skipped must fail the reference check\n");
    char log[300];
    snprintf(log, sizeof log, "%s/break.log", g_tmp);
    int rc = run(4, 0, log, "--stage 3 --mics 2 --steps 10 --ref --debug 16");
    TEST_CHECKF(rc != 0, "a run without the replica all-reduce passed");
    printf("  failed as it should (exit %d): ", rc);
    fflush(stdout);
    show(log, "^normerr|^maxerr");
}

static void bytes(void)
{
    printf("3. bytes within and across nodes (2 nodes x 2 ranks)\n");
    char log[300], plain[300];
    snprintf(plain, sizeof plain, "%s/b-plain.log", g_tmp);
    must(run(4, 2, plain, "--stage 3 --steps 3"), plain, "plain ZeRO-3");
    snprintf(log, sizeof log, "%s/b-g2.log", g_tmp);
    must(run(4, 2, log, "--stage 3 --mics 2 --steps 3"), log, "MiCS G=2");
    unsigned long long p_in = bytes_of(plain, 0, 3, "inter"), m_in = bytes_of(log, 0, 3, "inter");
    unsigned long long m_ag = bytes_of(log, 0, 3, "all_gather_inter"),
                       m_rs = bytes_of(log, 0, 3, "reduce_scatter_inter"),
                       m_ar = bytes_of(log, 0, 3, "all_reduce_inter");
    printf("  per step, rank 0, across nodes: plain ZeRO-3 %llu, MiCS G=2 %llu (all-gather %llu, "
           "reduce-scatter %llu, all-reduce %llu)\n",
           p_in, m_in, m_ag, m_rs, m_ar);
    TEST_CHECKF(m_ag == 0 && m_rs == 0, "G=2 within a node sent gathers/reductions across nodes");
    TEST_CHECKF(m_ar > 0 && m_in < p_in, "G=2: all-reduce across nodes missing or more than plain");
    char hier[300], flat[300];
    snprintf(hier, sizeof hier, "%s/b-g4h.log", g_tmp);
    must(run(4, 2, hier, "--stage 3 --mics 4 --mics-hier 1 --steps 10 --ref"), hier,
         "MiCS G=4 hierarchical");
    unsigned long long h_ag = bytes_of(hier, 0, 3, "all_gather_inter"),
                       f_ag = bytes_of(plain, 0, 3, "all_gather_inter");
    printf("  G=4 over 2 nodes, two-hop gathers: all-gather across nodes %llu (flat %llu); ", h_ag,
           f_ag);
    fflush(stdout);
    show(hier, "^maxerr");
    TEST_CHECKF(h_ag * 2 == f_ag, "two hops should halve the gathers' bytes across nodes");
    snprintf(hier, sizeof hier, "%s/b-n4h.bin", g_tmp);
    snprintf(flat, sizeof flat, "%s/b-n4f.bin", g_tmp);
    snprintf(log, sizeof log, "%s/b-n4h.log", g_tmp);
    must(run(4, 1, log, "--stage 3 --mics 2 --mics-hier 1 --dtype bf16 --steps 6 --out %s", hier),
         log, "4 nodes, G=2, two hops");
    snprintf(log, sizeof log, "%s/b-n4f.log", g_tmp);
    must(run(4, 1, log, "--stage 3 --mics 2 --dtype bf16 --steps 6 --out %s", flat), log,
         "4 nodes, G=2, one hop");
    TEST_CHECKF(same_file(hier, flat), "two-hop gathers changed the parameters");
    printf("  4 nodes of 1, G=2, bf16: two hops bitwise one hop\n");
}

/* modelstate line of `rank`: the value after key= */
static unsigned long long state_of(const char *log, int rank, const char *key)
{
    FILE *f = fopen(log, "r");
    char line[1024], head[64], k[64];
    unsigned long long v = 0;
    snprintf(head, sizeof head, "modelstate rank=%d ", rank);
    snprintf(k, sizeof k, " %s=", key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, head, strlen(head)) == 0 && strstr(line, k))
            v = strtoull(strstr(line, k) + strlen(k), NULL, 10);
    if (f)
        fclose(f);
    TEST_CHECKF(v > 0, "%s: no modelstate %s for rank %d", log, key, rank);
    return v;
}

static void memory(void)
{
    printf("4. memory per rank (allocator's peaks), W=4: G=2 vs G=4\n");
    char l2[300], l4[300];
    snprintf(l2, sizeof l2, "%s/mem-g2.log", g_tmp);
    snprintf(l4, sizeof l4, "%s/mem-g4.log", g_tmp);
    must(run(4, 0, l2, "--stage 3 --mics 2 --steps 3 --mem-check --live 3000 --prefetch 2000"), l2,
         "G=2 memory");
    must(run(4, 0, l4, "--stage 3 --mics 4 --steps 3 --mem-check --live 3000 --prefetch 2000"), l4,
         "G=4 memory");
    static const char *cats[3] = {"params", "grads", "optimizer"};
    for (int r = 0; r < 4; r++) {
        char ok[64];
        snprintf(ok, sizeof ok, "memcheck rank=%d ok", r);
        TEST_CHECKF(has_line(l2, ok, NULL) && has_line(l4, ok, NULL), "rank %d: memory check", r);
    }
    for (int c = 0; c < 3; c++) {
        unsigned long long a = state_of(l2, 0, cats[c]), b = state_of(l4, 0, cats[c]);
        double ratio = (double)a / (double)b;
        printf("  %-9s G=2 %llu bytes, G=4 %llu bytes: %.3fx\n", cats[c], a, b, ratio);
        TEST_CHECKF(ratio > 1.8 && ratio < 2.2, "%s: G=2 / G=4 = %.3f, not about 2", cats[c],
                    ratio);
    }
}

static void resume(void)
{
    printf("5. offload W=4 G=2, checkpoint 5; resume with other W and G from the servers\n");
    char log[300];
    snprintf(log, sizeof log, "%s/res-first.log", g_tmp);
    must(run(4, 0, log, "--stage 3 --mics 2 --offload 1 --servers %s --steps 5 --ckpt-every 5",
             g_servers),
         log, "W=4 G=2 to step 5");
    static const struct {
        int W, G;
    } to[2] = {{2, 2}, {4, 4}};
    for (int i = 0; i < 2; i++) {
        snprintf(log, sizeof log, "%s/res-w%d-g%d.log", g_tmp, to[i].W, to[i].G);
        must(run(to[i].W, 0, log,
                 "--stage 3 --mics %d --offload 1 --servers %s --steps 10 --resume "
                 "--resume-step 5 --ref --atol 2e-6 --rtol 1e-4",
                 to[i].G, g_servers),
             log, "resume");
        TEST_CHECKF(has_line(log, "resumed at step 5", NULL), "did not resume at step 5");
        printf("  resumed at 5 with W=%d G=%d: ", to[i].W, to[i].G);
        fflush(stdout);
        show(log, "^maxerr");
    }
}

static void refusals(void)
{
    printf("6. refusals\n");
    static const struct {
        const char *flags, *want1, *want2;
    } c[] = {
        {"--stage 3 --mics 3", "mics_shard_size 3", "must divide the 4 workers"},
        {"--stage 2 --mics 2", "mics_shard_size", "stage is 2"},
        {"--stage 3 --mics 2 --hpz 2", "zero_hpz_partition_size", "not combined with MiCS"},
        {"--stage 3 --mics 2 --qwz 1", "zero_quantized_weights", "not combined with MiCS"},
        {"--stage 3 --mics 2 --qgz 1", "zero_quantized_gradients", "not combined with MiCS"},
        {"--stage 3 --mics-hier 1", "mics_hierarchical_params_gather", "mics_shard_size is -1"},
    };
    char log[300];
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        snprintf(log, sizeof log, "%s/refuse-%zu.log", g_tmp, i);
        int rc = run(4, 2, log, "%s --steps 1", c[i].flags);
        TEST_CHECKF(rc != 0 && has_line(log, "FAIL", c[i].want1, c[i].want2, NULL),
                    "%s: not refused with '%s ... %s' (exit %d)", c[i].flags, c[i].want1,
                    c[i].want2, rc);
        printf("  %s: refused\n", c[i].flags);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("mics"));
    for (int i = 0; i < 2; i++) {
        snprintf(g_srv[i].data_dir, sizeof g_srv[i].data_dir, "%s/s%d", g_tmp, i);
        snprintf(g_srv[i].extra, sizeof g_srv[i].extra, "--keep 3");
        zs_test_server_start(&g_srv[i]);
    }
    zs_test_server_list(g_srv, 2, g_servers, sizeof g_servers);
    setenv("ZS_LOG_LEVEL", "warn", 1);
    refusals();
    equivalence();
    pushes();
    breaks();
    bytes();
    memory();
    resume();
    for (int i = 0; i < 2; i++)
        zs_test_server_stop(&g_srv[i], SIGTERM);
    printf("PASS test_mics (%d mpirun runs)\n", g_runs);
    return 0;
}
