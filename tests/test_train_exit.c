/*
 * test_train_exit.c - how zs-train fails before training (issue 9, strict
 * config), with 2 MPI workers on 127.0.0.1 and no servers:
 *
 *  1. A config typo ("zero_optimisation"): one line, from rank 0, naming
 *     the key and the closest known one; no MPI_Abort report; mpirun exits
 *     with 3 (config). Without mpirun's -q, Open MPI adds its own notice
 *     about the non-zero exit; zs-train still prints one line.
 *  2. A config inconsistent with W = 2 (3), a missing --data file (4), a bad
 *     option (2): one line each, with its code; --help prints the exit codes
 *     once.
 *  3. A config readable on rank 0 only (MPMD, two working directories):
 *     rank 1 reports it, once, and every rank exits with 3.
 *  4. --allow-unknown-keys: the run trains (exit 0); the unknown key and
 *     each key read without effect are named once: not once per rank, and
 *     not again by the engine.
 *  5. --device without a GPU (CUDA_VISIBLE_DEVICES="" hides any, so this
 *     runs alike on a GPU machine): --device cuda is one line from rank 0
 *     saying why (CUDA's "no GPU" reason, or a build without CUDA/NCCL)
 *     and exit 6 on every rank; --device auto falls back to the CPU, says
 *     why on its device line, and trains; --device tpu is a command-line
 *     error (2).
 *  6. --gemm: the device line names the GEMM precision (fp32 by default on
 *     the CPU); --gemm bf16, and fp16 with an fp16 config, train; --gemm
 *     fp8 is a command-line error (2).
 *
 * mpirun runs with -q so that the log holds only what zs-train printed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "zs_proc.h"
#include "zs_test.h"

#define MPIRUN ZS_MPIEXEC " " ZS_TEST_MPI_OPTS
#define TINY   "--layers 1 --heads 2 --width 16 --ctx 8"

static char g_tmp[200], g_data[300], g_log[300];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    TEST_CHECKF(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

/* `mpirun -q -np 2 zs-train ARGS` (MPIRUN_OPTS before -np), all output to
 * g_log; returns the exit code. */
static int train(const char *mpirun_opts, const char *args)
{
    return zs_test_sh("cd %s && ZS_LOG_LEVEL=warn " MPIRUN " %s -np 2 %s %s > %s 2>&1", g_tmp,
                      mpirun_opts, ZS_TRAIN, args, g_log);
}

/* Lines of g_log holding `has` (all lines if NULL) and starting with `start`
 * (any if NULL), and not holding `hasnt` (if not NULL). */
static int count_lines(const char *has, const char *start, const char *hasnt)
{
    FILE *f = fopen(g_log, "r");
    TEST_CHECK(f != NULL);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '\n')
            continue;
        n += (!has || strstr(line, has)) && (!start || strncmp(line, start, strlen(start)) == 0) &&
             (!hasnt || !strstr(line, hasnt));
    }
    fclose(f);
    return n;
}

static void show_log(void)
{
    fprintf(stderr, "---- %s:\n", g_log);
    zs_test_sh("cat %s >&2", g_log);
    fprintf(stderr, "----\n");
}

/* The run exited with `code` and printed exactly one line, starting with
 * `start` and holding `has`. */
static void expect_one_line(int rc, int code, const char *start, const char *has, const char *what)
{
    int lines = count_lines(NULL, NULL, NULL), match = count_lines(has, start, NULL);
    if (rc != code || lines != 1 || match != 1)
        show_log();
    TEST_CHECKF(rc == code, "%s: exit code %d, want %d", what, rc, code);
    TEST_CHECKF(lines == 1 && match == 1,
                "%s: %d lines, %d of them '%s...%s' (want exactly one line, that one)", what, lines,
                match, start, has);
    printf("ok: %s: exit %d, one line\n", what, rc);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("train_exit"));
    snprintf(g_data, sizeof g_data, "%s/corpus.tok", g_tmp);
    snprintf(g_log, sizeof g_log, "%s/run.log", g_tmp);
    zs_test_tokenize(ZS_TOKENIZE, g_data, "$(" ZS_TEST_LICENCES " | head -n 3)");
    char path[400], args[1024];

    /* 1. a typo: exit 3, one line from rank 0, no MPI_Abort report */
    snprintf(path, sizeof path, "%s/bad.json", g_tmp);
    write_file(path, "{\"train_batch_size\": 8, \"zero_optimisation\": {\"stage\": 2}}\n");
    snprintf(args, sizeof args, "--config bad.json --data %s " TINY " --steps 1", g_data);
    int rc = train("-q", args);
    expect_one_line(rc, 3, "zs-train: config error: bad.json: ",
                    "unknown key zero_optimisation (did you mean zero_optimization?)",
                    "config typo");
    /* without -q, mpirun adds its own notice; zs-train's line is still one */
    rc = train("", args);
    int ours = count_lines(NULL, "zs-train", NULL), aborts = count_lines("MPI_ABORT", NULL, NULL);
    if (rc != 3 || ours != 1 || aborts != 0)
        show_log();
    TEST_CHECKF(rc == 3 && ours == 1 && aborts == 0,
                "without -q: exit %d, %d zs-train lines, %d MPI_ABORT lines", rc, ours, aborts);
    printf("ok: config typo without -q: exit 3, one zs-train line, no MPI_ABORT\n");

    /* 2. the other preflight failures */
    snprintf(path, sizeof path, "%s/w2.json", g_tmp);
    write_file(path, "{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 4}\n");
    snprintf(args, sizeof args, "--config w2.json --data %s " TINY, g_data);
    expect_one_line(train("-q", args), 3, "zs-train: config error: ", "30 != 4 * 3 * 2",
                    "batch sizes inconsistent with W=2");
    snprintf(args, sizeof args, "--data %s/none.tok " TINY, g_tmp);
    expect_one_line(train("-q", args), 4, "zs-train: data error: ", "none.tok", "missing data");
    snprintf(args, sizeof args, "--data %s --stpes 3", g_data);
    expect_one_line(train("-q", args), 2, "zs-train: bad option ", "--stpes", "bad option");
    rc = train("-q", "--help");
    int codes = count_lines("exit codes: 0 done", NULL, NULL);
    if (rc != 0 || codes != 1)
        show_log();
    TEST_CHECKF(rc == 0 && codes == 1, "--help: exit %d, exit codes listed %d times", rc, codes);
    printf("ok: --help lists the exit codes once\n");

    /* 3. only rank 1 cannot read the config: it says so, everyone exits 3 */
    zs_test_sh("mkdir -p %s/a %s/b", g_tmp, g_tmp);
    snprintf(path, sizeof path, "%s/a/ds.json", g_tmp);
    write_file(path, "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 4}\n");
    snprintf(args, sizeof args, "--config ds.json --data %s " TINY " --steps 1", g_data);
    rc = zs_test_sh("cd %s && ZS_LOG_LEVEL=warn " MPIRUN
                    " -q -np 1 --wdir %s/a %s %s : -np 1 --wdir %s/b "
                    "%s %s > %s 2>&1",
                    g_tmp, g_tmp, ZS_TRAIN, args, g_tmp, ZS_TRAIN, args, g_log);
    expect_one_line(rc, 3, "zs-train: rank 1: config error: ", "ds.json: No such file",
                    "config missing on rank 1 only");

    /* 4. allowed: trains; each warning once (2 ranks; config module only) */
    snprintf(path, sizeof path, "%s/allow.json", g_tmp);
    write_file(path, "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 4,\n"
                     " \"zero_optimisation\": {\"stage\": 3},\n"
                     " \"zero_optimization\": {\"stage\": 2, \"overlap_comm\": false,\n"
                     "   \"allgather_bucket_size\": 1000, \"sub_group_size\": 100}}\n");
    snprintf(args, sizeof args,
             "--config allow.json --allow-unknown-keys --data %s " TINY " --steps 1", g_data);
    rc = train("-q", args);
    /* the resolved config's line ("config <digest>: ... zero.sub_group_size=100")
     * names the keys too: not counted */
    int unk = count_lines("zero_optimisation", NULL, NULL);
    int unk_warn = count_lines("zero_optimisation: unknown key (did you mean zero_optimization?), "
                               "ignored",
                               "zs-train: warning: config key ", NULL);
    int overlap = count_lines("overlap_comm", "zs-train: warning: ", NULL);
    int agb = count_lines("allgather_bucket_size", "zs-train: warning: ", NULL);
    int sgs = count_lines("sub_group_size", "zs-train: warning: ", NULL);
    int noeff =
        count_lines(": no effect: ", "zs-train: warning: config key zero_optimization.", NULL);
    int done = count_lines("done: steps 1..1", NULL, NULL);
    if (rc != 0 || unk != 1 || unk_warn != 1 || overlap != 1 || agb != 1 || sgs != 1 ||
        noeff != 3 || done != 1)
        show_log();
    TEST_CHECKF(rc == 0 && done == 1, "--allow-unknown-keys: exit %d, 'done' %d times", rc, done);
    TEST_CHECKF(unk == 1 && unk_warn == 1, "unknown key named %d times, warned %d times (want 1)",
                unk, unk_warn);
    TEST_CHECKF(overlap == 1 && agb == 1 && sgs == 1 && noeff == 3,
                "overlap_comm %d, allgather_bucket_size %d, sub_group_size %d lines, %d 'no "
                "effect' warnings (want 1, 1, 1, 3)",
                overlap, agb, sgs, noeff);
    printf("ok: --allow-unknown-keys trains; unknown key and 3 no-effect keys warned once each\n");

    /* 5. no GPU: cuda refused once with exit 6, auto falls back and trains */
    setenv("CUDA_VISIBLE_DEVICES", "", 1); /* inherited by mpirun and the ranks */
    snprintf(args, sizeof args, "--device cuda --data %s " TINY " --steps 1", g_data);
    rc = train("-q", args);
    int nogpu =
        count_lines("no GPU: ", "zs-train: device error: --device cuda: ", NULL) +
        count_lines("zs-train was built without ", "zs-train: device error: --device cuda: ", NULL);
    expect_one_line(rc, 6, "zs-train: device error: --device cuda: ", "(hint: --device cpu",
                    "--device cuda without a GPU");
    TEST_CHECKF(nogpu == 1, "the line should give the reason (no GPU: ... or built without ...)");
    snprintf(args, sizeof args, "--device auto --data %s " TINY " --steps 1", g_data);
    rc = train("-q", args);
    int fell = count_lines("(--device auto: ", "device: cpu ", NULL);
    done = count_lines("done: steps 1..1", NULL, NULL);
    if (rc != 0 || fell != 1 || done != 1)
        show_log();
    TEST_CHECKF(rc == 0 && fell == 1 && done == 1,
                "--device auto without a GPU: exit %d, %d 'device: cpu ... (--device auto: why)' "
                "lines, 'done' %d times (want 0, 1, 1)",
                rc, fell, done);
    printf("ok: --device auto without a GPU trains on the CPU and says why\n");
    snprintf(args, sizeof args, "--device tpu --data %s " TINY, g_data);
    expect_one_line(train("-q", args), 2, "zs-train: --device must be auto, cpu or cuda", "",
                    "--device tpu");
    unsetenv("CUDA_VISIBLE_DEVICES");

    /* 6. --gemm: fp32 GEMMs by default on the CPU; bf16 / fp16 when asked
     * (an fp16 config trains with loss scaling and fp16 GEMM operands);
     * anything else is a command-line error */
    snprintf(args, sizeof args, "--device cpu --data %s " TINY " --steps 2", g_data);
    rc = train("-q", args);
    TEST_CHECKF(rc == 0 && count_lines("; GEMMs fp32", "device: cpu ", NULL) == 1,
                "default --gemm on the CPU: exit %d, want 0 and 'GEMMs fp32' on the device line",
                rc);
    snprintf(path, sizeof path, "%s/fp16.json", g_tmp);
    write_file(path, "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 4,"
                     " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 12}}\n");
    const char *gm[2] = {"bf16", "fp16"};
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "--device cpu --gemm %s %s --data %s " TINY " --steps 4", gm[k],
                 k ? "--config fp16.json" : "", g_data);
        rc = train("-q", args);
        char want[64];
        snprintf(want, sizeof want, "; GEMMs %s operands, fp32 accumulation", gm[k]);
        int said = count_lines(want, "device: cpu ", NULL);
        done = count_lines("done: steps 1..4", NULL, NULL);
        if (rc != 0 || said != 1 || done != 1)
            show_log();
        TEST_CHECKF(rc == 0 && said == 1 && done == 1,
                    "--gemm %s: exit %d, device line %d, done %d (want 0, 1, 1)", gm[k], rc, said,
                    done);
        printf("ok: --gemm %s trains on the CPU and says so%s\n", gm[k],
               k ? " (fp16 config, loss scaling)" : "");
    }
    /* --activations: auto stores the fp16 config's activations in fp16
     * (the run above), anything but auto/fp32/bf16/fp16 is refused */
    TEST_CHECKF(count_lines("; activations fp16", "device: cpu ", NULL) == 1,
                "the fp16 config's run should say 'activations fp16' on the device line");
    printf("ok: --activations auto with an fp16 config: activations fp16\n");
    snprintf(args, sizeof args, "--gemm fp8 --data %s " TINY, g_data);
    expect_one_line(train("-q", args), 2, "zs-train: --gemm must be auto, fp32, bf16 or fp16", "",
                    "--gemm fp8");
    snprintf(args, sizeof args, "--activations fp8 --data %s " TINY, g_data);
    expect_one_line(train("-q", args), 2,
                    "zs-train: --activations must be auto, fp32, bf16 or fp16", "",
                    "--activations fp8");
    printf("test_train_exit: ok\n");
    return 0;
}
