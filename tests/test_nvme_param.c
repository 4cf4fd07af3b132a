/*
 * test_nvme_param.c - offload_param.device "nvme" (ZeRO-Infinity's
 * parameter offload, worker/engine/zs_engine_nvme.c, docs/nvme.md): the
 * stage-3 parameter partitions in a file per worker rank.
 *
 *  1. Equality: nvme_param_worker (CPU device, MPI workers) on two real
 *     zs-servers (offload_optimizer cpu) with offload_param "nvme"
 *     (max_in_cpu 0: every layer in the file; one buffer) gives bitwise the
 *     losses and final parameters of offload_param "cpu", at W = 1 and 2,
 *     fp32 and bf16.
 *  2. Memory, from the allocator's table (category params, peak over all
 *     spaces, printed by each rank): with nvme it is at most buffer_count
 *     buffers of buffer_size elements (4 KiB blocks), and below the peak
 *     the same rank's partition had in the cpu run.
 *  3. Also equal: part of the partition in host memory (max_in_cpu) with
 *     three buffers and pulls that are not streamed; the engine's own
 *     AdamW (no servers); a resume from a checkpoint.
 *  4. Refusals at engine create naming the cause: nvme_path missing, not a
 *     directory, not writable; buffer_size below a layer's part (nvme
 *     without nvme_path: tests/test_config.c).
 *  No parameter file is left behind.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_proc.h"
#include "zs_test.h"

#define MPIRUN ZS_MPIEXEC " " ZS_TEST_MPI_OPTS
#define BSIZE  1600 /* elements: the MLP's largest layer is 1590 */

static char g_tmp[200], g_list[256], g_nv[300];
static int g_runs;

static int worker(int np, const char *log, const char *args)
{
    g_runs++;
    return zs_test_sh("ZS_LOG_LEVEL=info timeout -k 10 120 " MPIRUN " -np %d %s %s > %s 2>&1", np,
                      ZS_NVME_PARAM_WORKER, args, log);
}

static void must(int rc, const char *log, const char *what)
{
    if (rc == 0)
        return;
    fprintf(stderr, "FAIL: %s (exit %d); log %s:\n", what, rc, log);
    zs_test_sh("tail -n 30 %s >&2", log);
    exit(1);
}

/* The allocator's params peak of `rank` as printed in log (-1: none). */
static long long params_peak(const char *log, int rank)
{
    FILE *f = fopen(log, "r");
    char line[512];
    long long v = -1;
    while (f && fgets(line, sizeof line, f)) {
        int r;
        long long p;
        if (sscanf(line, "params-mem rank=%d peak=%lld", &r, &p) == 2 && r == rank)
            v = p;
    }
    if (f)
        fclose(f);
    return v;
}

/* Same loss lines (bits, at least 6 of them) and final parameters in both
 * runs (log and bin files A.log, A.bin, B.log, B.bin). */
static void same(const char *tag, const char *a, const char *b)
{
    TEST_CHECKF(zs_test_sh("grep '^loss ' %s.log > %s.loss; grep '^loss ' %s.log > %s.loss; "
                           "test $(wc -l < %s.loss) -ge 6 && cmp -s %s.loss %s.loss",
                           a, a, b, b, a, a, b) == 0,
                "%s: losses differ (%s.loss vs %s.loss)", tag, a, b);
    TEST_CHECKF(zs_test_sh("cmp -s %s.bin %s.bin", a, b) == 0,
                "%s: final parameters differ (%s.bin vs %s.bin)", tag, a, b);
}

static void no_files_left(void)
{
    TEST_CHECKF(zs_test_sh("test -z \"$(ls -A %s)\"", g_nv) == 0,
                "parameter files left behind in %s", g_nv);
}

static void equality(void)
{
    static const char *dts[] = {"fp32", "bf16"};
    char args[1024], ref[300], nv[300], log[320];
    for (int W = 1; W <= 2; W++)
        for (int d = 0; d < 2; d++) {
            snprintf(ref, sizeof ref, "%s/cpu-w%d-%s", g_tmp, W, dts[d]);
            snprintf(nv, sizeof nv, "%s/nvme-w%d-%s", g_tmp, W, dts[d]);
            snprintf(args, sizeof args, "--servers %s --dtype %s --out %s.bin", g_list, dts[d],
                     ref);
            snprintf(log, sizeof log, "%s.log", ref);
            must(worker(W, log, args), log, "offload_param cpu");
            snprintf(args, sizeof args,
                     "--servers %s --dtype %s --out %s.bin --nvme %s --max-in-cpu 0 "
                     "--buffer-count 1 --buffer-size %d",
                     g_list, dts[d], nv, g_nv, BSIZE);
            snprintf(log, sizeof log, "%s.log", nv);
            must(worker(W, log, args), log, "offload_param nvme");
            TEST_CHECKF(zs_test_sh("grep -q 'offload_param nvme: .* in %s' %s", g_nv, log) == 0,
                        "%s: the engine did not report its parameter files", log);
            char tag[64];
            snprintf(tag, sizeof tag, "W=%d %s", W, dts[d]);
            same(tag, ref, nv);
            /* 2. the allocator's figures */
            long long esz = d ? 2 : 4, bound = (BSIZE * esz + 4095) / 4096 * 4096;
            for (int r = 0; r < W; r++) {
                char rl[320];
                snprintf(rl, sizeof rl, "%s.log", ref);
                long long pc = params_peak(rl, r), pn = params_peak(log, r);
                TEST_CHECKF(pc > 0 && pn > 0, "%s rank %d: no params-mem line", tag, r);
                TEST_CHECKF(pn <= bound,
                            "%s rank %d: params in host memory %lld bytes > one buffer of %d "
                            "elements (%lld bytes)",
                            tag, r, pn, BSIZE, bound);
                TEST_CHECKF(pn < pc,
                            "%s rank %d: params in host memory %lld bytes with nvme, not below "
                            "the partition's %lld bytes with cpu",
                            tag, r, pn, pc);
                printf("  %s rank %d: params (allocator peak) cpu %lld bytes, nvme %lld bytes "
                       "(one buffer)\n",
                       tag, r, pc, pn);
            }
            no_files_left();
        }
    printf("1-2. offload_param nvme == cpu bitwise (W 1, 2; fp32, bf16); params in host memory "
           "within the buffers\n");
}

static void variants(void)
{
    char args[1024], a[300], b[300], log[320];
    /* part in host memory, three buffers, pulls not streamed */
    snprintf(a, sizeof a, "%s/nvme-mix", g_tmp);
    snprintf(args, sizeof args,
             "--servers %s --dtype bf16 --stream 0 --out %s.bin --nvme %s --max-in-cpu 1200 "
             "--buffer-count 3 --buffer-size %d",
             g_list, a, g_nv, BSIZE);
    snprintf(log, sizeof log, "%s.log", a);
    must(worker(2, log, args), log, "offload_param nvme, max_in_cpu 1200, stream_pulls off");
    snprintf(b, sizeof b, "%s/cpu-w2-bf16", g_tmp);
    same("max_in_cpu 1200, 3 buffers, stream_pulls off", b, a);
    no_files_left();
    /* the engine's own AdamW (no servers) */
    snprintf(b, sizeof b, "%s/cpu-local", g_tmp);
    snprintf(args, sizeof args, "--dtype bf16 --out %s.bin", b);
    snprintf(log, sizeof log, "%s.log", b);
    must(worker(2, log, args), log, "offload_param cpu, in-process optimizer");
    snprintf(a, sizeof a, "%s/nvme-local", g_tmp);
    snprintf(args, sizeof args,
             "--dtype bf16 --out %s.bin --nvme %s --max-in-cpu 0 --buffer-count 2 "
             "--buffer-size %d",
             a, g_nv, BSIZE);
    snprintf(log, sizeof log, "%s.log", a);
    must(worker(2, log, args), log, "offload_param nvme, in-process optimizer");
    same("in-process optimizer", b, a);
    /* resume: 6 steps with a checkpoint at 3, then resume at 3 to 6 */
    snprintf(a, sizeof a, "%s/nvme-resume", g_tmp);
    snprintf(args, sizeof args,
             "--servers %s --dtype bf16 --resume --out %s.bin --nvme %s --max-in-cpu 0 "
             "--buffer-count 2 --buffer-size %d",
             g_list, a, g_nv, BSIZE);
    snprintf(b, sizeof b, "%s/nvme-ckpt", g_tmp);
    char args0[1024], log0[320];
    snprintf(args0, sizeof args0,
             "--servers %s --dtype bf16 --ckpt-every 3 --steps 3 --out %s.bin --nvme %s "
             "--max-in-cpu 0 --buffer-count 2 --buffer-size %d",
             g_list, b, g_nv, BSIZE);
    snprintf(log0, sizeof log0, "%s.log", b);
    must(worker(2, log0, args0), log0, "offload_param nvme, 3 steps and a checkpoint");
    snprintf(log, sizeof log, "%s.log", a);
    must(worker(2, log, args), log, "offload_param nvme, resume");
    TEST_CHECKF(zs_test_sh("grep -q 'resumed at step 3' %s", log) == 0, "no resume at 3 in %s",
                log);
    snprintf(b, sizeof b, "%s/cpu-w2-bf16", g_tmp);
    TEST_CHECKF(zs_test_sh("cmp -s %s.bin %s.bin", b, a) == 0,
                "resume with offload_param nvme: final parameters differ from the cpu run");
    TEST_CHECKF(zs_test_sh("grep -E '^loss step=[456] ' %s.log > %s.l456; grep '^loss ' %s > "
                           "%s.loss; test $(wc -l < %s.loss) -eq 3 && cmp -s %s.l456 %s.loss",
                           b, a, log, a, a, a, a) == 0,
                "resume with offload_param nvme: losses of steps 4-6 differ from the cpu run");
    no_files_left();
    printf("3. also bitwise: max_in_cpu 1200 with 3 buffers and unstreamed pulls; in-process "
           "AdamW; resume from a checkpoint\n");
}

/* An engine that must not create: exit != 0 and a message with `want`. */
static void refused(const char *what, const char *args, const char *want)
{
    char log[320], a[1024];
    snprintf(log, sizeof log, "%s/refused.log", g_tmp);
    snprintf(a, sizeof a, "--servers %s --steps 1 %s", g_list, args);
    int rc = worker(1, log, a);
    TEST_CHECKF(rc != 0, "%s: the worker ran (log %s)", what, log);
    TEST_CHECKF(zs_test_sh("grep -q '^FAIL.*%s' %s", want, log) == 0,
                "%s: no error naming '%s' in %s", what, want, log);
    zs_test_sh("grep -m1 '^FAIL' %s | sed 's/^/    /'", log);
}

static void refusals(void)
{
    char a[1024], path[320];
    snprintf(path, sizeof path, "%s/no-such-dir", g_tmp);
    snprintf(a, sizeof a, "--nvme %s", path);
    refused("a missing nvme_path", a, path);
    snprintf(path, sizeof path, "%s/a-file", g_tmp);
    zs_test_sh("echo x > %s", path);
    snprintf(a, sizeof a, "--nvme %s", path);
    refused("nvme_path a file", a, "not a directory");
    if (geteuid() == 0) { /* root writes anywhere but /proc */
        snprintf(path, sizeof path, "/proc/1");
    } else {
        snprintf(path, sizeof path, "%s/read-only", g_tmp);
        TEST_CHECK(mkdir(path, 0555) == 0);
    }
    snprintf(a, sizeof a, "--nvme %s", path);
    refused("a read-only nvme_path", a, path);
    snprintf(a, sizeof a, "--nvme %s --max-in-cpu 0 --buffer-size 1000", g_nv);
    refused("buffer_size below a layer's part", a, "buffer_size: 1000 elements");
    no_files_left();
    printf("4. refusals name the path or key\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("nvme_param"));
    snprintf(g_nv, sizeof g_nv, "%s/params", g_tmp);
    TEST_CHECK(mkdir(g_nv, 0700) == 0);
    setenv("ZS_LOG_LEVEL", "warn", 1);
    zs_test_server_t srv[2];
    zs_test_servers_up(srv, 2, g_tmp, "srv", "--keep 2", g_list, sizeof g_list);
    equality();
    variants();
    refusals();
    zs_test_servers_down(srv, 2);
    printf("PASS test_nvme_param (%d worker runs)\n", g_runs);
    return 0;
}
