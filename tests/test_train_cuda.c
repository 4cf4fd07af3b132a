/*
 * test_train_cuda.c - the ZeRO engine on one GPU, through zs-train
 * --device cuda (CUDA device, NCCL communicator of one rank, the GPT's CUDA
 * op table), against zs-train --device cpu on the same data and config,
 * with 2 real zs-server processes on 127.0.0.1 (tests/zs_proc.h):
 *
 *  1. Stages 0-3 (or those $ZS_TEST_TRAIN_CUDA_STAGES names, e.g. "13") x
 *     offload off/on, fp32, W = 1, 10 steps of a small GPT
 *     (L=2 NH=4 C=64 T=32, byte vocabulary; 4 x 2 micro-batches per step,
 *     clipping at 1.0): per-step losses of CUDA and CPU within LOSS_TOL
 *     (step 1 within 1e-5 rel), and the final parameters close in the
 *     sense AdamW allows: ||p_cuda - p_cpu|| <= PARAM_REL ||p_cpu -
 *     p_init|| over all but the key biases (zs_gpttest_rel_update_diff in
 *     zs_gpttest.h: an element whose gradient is at rounding level moves
 *     +-lr either way, so element-wise bounds say little; the norm of the
 *     difference relative to the norm of the update does). The CUDA runs
 *     also print the device line and the cudaMemGetInfo table.
 *     On CUDA, offload on and off give bitwise equal parameters at each
 *     stage (the servers' CPU AdamW and zs_cuda_adamw are the same formula,
 *     bitwise, per zs_cuda_vec.h; as test_engine holds on CPU).
 *  2. Kill and resume on the GPU: stage 2 + offload, checkpoints every 10
 *     steps of 100 ($ZS_TEST_TRAIN_CUDA_KR_STEPS, at least 30); zs-train is killed with SIGKILL
 * once the CSV shows step 15, then rerun with --resume: its final parameters are bitwise those of
 * an undisturbed run. (If the kill comes after the run finished, it says so and runs the
 * stop-after-step-20-and-resume variant instead.)
 *
 *  With ZS_TEST_TRAIN_CUDA_NP=W (W > 1) every run has W ranks with a GPU
 *  each (the CUDA emulator runs W = 2 and 4): parts 1 and 3 (unless
 *  ZS_TEST_TRAIN_CUDA_BF16=0) at W against
 *  the CPU engine at W, then part 4 instead of part 2:
 *  4. Elastic resume: zs-launch --np W --min-np W-1 --shrink-after 1, one
 *     zs-train rank SIGKILLed after step 12 of 30 (checkpoints every 10);
 *     the launcher reruns on W-1 GPUs from the newest checkpoint. Final
 *     parameters bitwise equal to the same schedule undisturbed on the GPUs
 *     (W ranks to that checkpoint, then W-1 resume), and within PARAM_REL
 *     of that schedule on the CPU. (zs-launch: ZS_LAUNCH_BIN or the build's.)
 *
 *  3. bf16 parameters and GEMMs (stage 2 + offload): the GPU run against the
 *     CPU with the same rounding (--gemm bf16) and with fp32 GEMMs
 *     (bf16_run says what is held).
 *
 *  With ZS_TEST_TRAIN_CUDA_PART=shm, only:
 *  5. The shared-memory transport on the GPU: stage 2 + offload, bf16, 10
 *     steps with --transport shm (the staging segment registered with the
 *     device, cudaHostRegister) and with --transport tcp: final parameters
 *     bitwise equal, and the shm run's log names transport shm for both
 *     servers.
 *
 *  With ZS_TEST_TRAIN_CUDA_PART=flash, only:
 *  6. The fused attention (--attention flash): the stages of
 *     ZS_TEST_TRAIN_CUDA_STAGES, bf16, the GPU against the CPU engine with
 *     the same rounding (flash_run says what is held), at W =
 *     ZS_TEST_TRAIN_CUDA_NP.
 *
 *  With ZS_TEST_TRAIN_CUDA_PART=dpu, only:
 *  7. The delayed parameter update (delayed_update_after 2), stage 2,
 *     bf16: offload == in process bitwise on the GPU, the GPU against the
 *     CPU engine with the same delay (delayed_run says what is held).
 *
 * Without a usable GPU it prints "SKIPPED: <reason>" and exits 77 (ctest
 * SKIP_RETURN_CODE), never a pass. ZS_TEST_TRAIN_CUDA_SIDE=cpu (by hand, not
 * in ctest) runs the "CUDA" side with --device cpu: a self-check of this
 * harness where no GPU is; it says so. Prebuilt binaries away from the build
 * tree (tests/gpu.sh on a lent GPU machine) are named by ZS_TRAIN_BIN,
 * ZS_MPIEXEC_BIN and ZS_SERVER_BIN (zs_proc.c); the token file is written
 * here (zs_data_write), so no text corpus is needed.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zs_data.h"
#include "zs_dev_cuda.h"
#include "zs_gpt.h"
#include "zs_gpttest.h"
#include "zs_proc.h"
#include "zs_test.h"

#define STEPS     10
#define LOSS_TOL  5e-5 /* as test_gpt_cuda's steps 2..10 */
#define PARAM_REL 1e-2 /* as test_gpt_cuda's */
#define SHAPE     "--layers 2 --heads 4 --width 64 --ctx 32"
#define MPI_OPTS  ZS_TEST_MPI_OPTS " -q"

static const zs_gpt_config_t k_shape = {2, 4, 64, 32, 256};

static char g_tmp[200], g_data[300], g_servers[256];
static const char *g_train, *g_mpirun;
static int g_np = 1;               /* ranks (GPUs) of every run: $ZS_TEST_TRAIN_CUDA_NP */
static const char *g_gpu = "cuda"; /* "cpu" in the harness self-check */

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

/* A byte-level token file of pseudo-English (deterministic). */
static void write_data(void)
{
    static const char *words[] = {"the ",   "shard ", "server ",   "holds ", "a ",     "range ",
                                  "of ",    "fp32 ",  "weights ",  "and ",   "adam ",  "moments, ",
                                  "while ", "each ",  "worker ",   "runs ",  "its ",   "forward ",
                                  "pass. ", "zero ",  "partition", "s ",     "grads. "};
    const size_t n = 200000, nw = sizeof words / sizeof *words;
    uint16_t *tok = malloc(n * sizeof *tok);
    TEST_CHECK(tok);
    uint64_t x = 88172645463325252ull;
    size_t k = 0;
    while (k < n) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        for (const char *w = words[x % nw]; *w && k < n; w++)
            tok[k++] = (uint16_t)(unsigned char)*w;
    }
    zs_err_t err;
    TEST_OK(zs_data_write(g_data, 256, tok, n, &err), err);
    free(tok);
}

/* The test's DeepSpeed config; `extra` ("" or e.g. "\"bf16\": {...},")
 * goes in at the top level. */
static void write_config_x(const char *path, int stage, int offload, const char *extra)
{
    FILE *f = fopen(path, "w");
    TEST_CHECK(f);
    fprintf(f,
            "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": %d, %s\n"
            " \"gradient_clipping\": 1.0,\n"
            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"weight_decay\": "
            "0.1}},\n"
            " \"zero_optimization\": {\"stage\": %d, \"offload_optimizer\": {\"device\": \"%s\"},\n"
            "   \"reduce_bucket_size\": 20000, \"stage3_param_persistence_threshold\": 1000}}\n",
            g_np > 2 ? 2 : 4, extra, stage, offload ? "cpu" : "none");
    TEST_CHECK(fclose(f) == 0);
}

static void write_config(const char *path, int stage, int offload)
{
    write_config_x(path, stage, offload, "");
}

/* The zs-train command line (without redirections). */
static void train_cmd(char *buf, size_t n, const char *device, const char *args)
{
    snprintf(buf, n,
             "ZS_LOG_LEVEL=warn %s " MPI_OPTS " -np %d %s --device %s --data %s " SHAPE " %s",
             g_mpirun, g_np, g_train, device, g_data, args);
}

/* Run zs-train to the end; the log goes to `log`. Exits the test on failure. */
static void train(const char *device, const char *log, const char *args)
{
    char cmd[4096];
    train_cmd(cmd, sizeof cmd, device, args);
    zs_test_run_ok(log, "%s", cmd);
}

static int log_has(const char *log, const char *what)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "grep -qF -- '%s' %s", what, log);
    return system(cmd) == 0;
}

/* Losses of steps 1..STEPS from a zs-train CSV (NAN where absent). */
static void csv_losses(const char *csv, double *loss, int n)
{
    for (int i = 0; i < n; i++)
        loss[i] = NAN;
    FILE *f = fopen(csv, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        int s;
        double l;
        if (sscanf(line, "%d,%lf,", &s, &l) == 2 && s >= 1 && s <= n)
            loss[s - 1] = l;
    }
    if (f)
        fclose(f);
}

/* Highest step listed in a CSV (0 if none or unreadable). */
static int csv_last_step(const char *csv)
{
    FILE *f = fopen(csv, "r");
    char line[512];
    int last = 0;
    while (f && fgets(line, sizeof line, f)) {
        int s = atoi(line);
        if (s > last)
            last = s;
    }
    if (f)
        fclose(f);
    return last;
}

static float *read_params(const char *path, uint64_t P)
{
    float *w = malloc(P * sizeof *w);
    FILE *f = fopen(path, "rb");
    TEST_CHECKF(w && f && fread(w, sizeof *w, P, f) == P && fgetc(f) == EOF, "%s: not %llu floats",
                path, (unsigned long long)P);
    fclose(f);
    return w;
}

/* ---- 1. stages x offload, CUDA vs CPU ---- */

static void stages(void)
{
    uint64_t P = zs_gpt_num_params(&k_shape);
    float *w0 = zs_gpttest_init_weights(k_shape, 1337); /* zs-train's default --seed */
    /* ZS_TEST_TRAIN_CUDA_STAGES: the stages to run, as digits (default
     * "0123"); the emulated W = 4 run takes "13" (W = 1 and 2 run all four,
     * and each emulated step at W = 4 costs four processes) */
    const char *only = getenv("ZS_TEST_TRAIN_CUDA_STAGES");
    printf("1. zs-train, W=%d, %d steps, " SHAPE " (%llu parameters): CUDA vs CPU, stages %s\n",
           g_np, STEPS, (unsigned long long)P, only && *only ? only : "0123");
    for (int stage = 0; stage <= 3; stage++) {
        if (only && *only && !strchr(only, '0' + stage))
            continue;
        float *off_params[2] = {NULL, NULL};
        for (int offload = 0; offload <= 1; offload++) {
            char cfg[300], args[2048], log[2][300], csv[2][300], bin[2][300];
            snprintf(cfg, sizeof cfg, "%s/s%d-o%d.json", g_tmp, stage, offload);
            write_config(cfg, stage, offload);
            const char *dev[2] = {g_gpu, "cpu"};
            double loss[2][STEPS];
            float *p[2];
            for (int d = 0; d < 2; d++) {
                snprintf(log[d], sizeof log[d], "%s/s%d-o%d-%s.log", g_tmp, stage, offload, dev[d]);
                snprintf(csv[d], sizeof csv[d], "%s/s%d-o%d-%s.csv", g_tmp, stage, offload, dev[d]);
                snprintf(bin[d], sizeof bin[d], "%s/s%d-o%d-%s.bin", g_tmp, stage, offload, dev[d]);
                snprintf(args, sizeof args,
                         "--config %s --servers %s --steps %d --log-every %d --csv %s "
                         "--save-params %s",
                         cfg, g_servers, STEPS, STEPS, csv[d], bin[d]);
                train(dev[d], log[d], args);
                csv_losses(csv[d], loss[d], STEPS);
                p[d] = read_params(bin[d], P);
            }
            TEST_CHECKF(
                strcmp(g_gpu, "cuda") || (log_has(log[0], "device: cuda:") &&
                                          log_has(log[0], "device memory (cudaMemGetInfo") &&
                                          log_has(log[0], "  rank 0: used ")),
                "the CUDA run should name its GPU and print cudaMemGetInfo (log %s)", log[0]);
            double ldiff = 0;
            for (int s = 0; s < STEPS; s++) {
                TEST_CHECKF(!isnan(loss[0][s]) && !isnan(loss[1][s]), "step %d missing (%s, %s)",
                            s + 1, csv[0], csv[1]);
                double d = fabs(loss[0][s] - loss[1][s]);
                if (s == 0)
                    TEST_CHECKF(d <= 1e-5 * fabs(loss[1][0]) + 1e-6,
                                "step 1 loss: cuda %.8g cpu %.8g", loss[0][0], loss[1][0]);
                ldiff = fmax(ldiff, d);
            }
            double pmax = 0, rel = zs_gpttest_rel_update_diff(&k_shape, w0, p[0], p[1]);
            for (uint64_t k = 0; k < P; k++)
                pmax = fmax(pmax, fabs((double)p[0][k] - p[1][k]));
            printf("   stage %d offload %-3s: loss %.4f -> %.4f, max |loss diff| %.3g; params "
                   "||cuda - cpu|| / ||update|| %.3g (max abs %.3g)\n",
                   stage, offload ? "on" : "off", loss[0][0], loss[0][STEPS - 1], ldiff, rel, pmax);
            TEST_CHECKF(ldiff <= LOSS_TOL, "stage %d offload %d: losses differ by %.3g > %.1g",
                        stage, offload, ldiff, LOSS_TOL);
            TEST_CHECKF(rel <= PARAM_REL, "stage %d offload %d: parameter difference %.3g > %.1g",
                        stage, offload, rel, PARAM_REL);
            TEST_CHECKF(loss[0][STEPS - 1] < loss[0][0], "the loss should fall (%.4f -> %.4f)",
                        loss[0][0], loss[0][STEPS - 1]);
            off_params[offload] = p[0];
            free(p[1]);
        }
        uint64_t ndiff = 0;
        for (uint64_t k = 0; k < P; k++)
            ndiff += memcmp(&off_params[0][k], &off_params[1][k], sizeof(float)) != 0;
        printf("   stage %d on CUDA: offload on vs off: %llu of %llu parameters differ\n", stage,
               (unsigned long long)ndiff, (unsigned long long)P);
        TEST_CHECKF(ndiff == 0, "stage %d: offload on and off should be bitwise equal on CUDA",
                    stage);
        free(off_params[0]), free(off_params[1]);
    }
    free(w0);
}

/* ---- 3. bf16: parameters and GEMMs ---- */

/* bf16 config, stage 2 + offload: zs-train --device cuda (--gemm auto: bf16
 * GEMMs on the GPU) against --device cpu --gemm bf16 (the CPU twin of the
 * same rounding) and --device cpu --gemm fp32. Step 1 from the GPT-2 init:
 * CUDA at least 4x closer to the CPU with the same rounding than to fp32
 * GEMMs (test_gpt.c measured ~1e5x for that init against torch); all steps
 * within BF16_LOSS_TOL of the same-rounding CPU run (each side rounds its
 * own fp32 intermediates, so they drift apart slowly); the loss falls.
 * All three runs store bf16 activations (--activations auto: the config's
 * dtype); on the emulator (2026-11-25) step 1 gave 0 vs 7.6e-05 and steps
 * 1..10 within 6.2e-05; not yet run on a GPU with 16-bit activations. */
#define BF16_LOSS_TOL 5e-3

static void bf16_run(void)
{
    char cfg[300], args[2048], log[3][300], csv[3][300];
    snprintf(cfg, sizeof cfg, "%s/bf16.json", g_tmp);
    write_config_x(cfg, 2, 1, "\"bf16\": {\"enabled\": true},");
    const char *dev[3] = {g_gpu, "cpu", "cpu"}, *gemm[3] = {"auto", "bf16", "fp32"};
    double loss[3][STEPS];
    for (int d = 0; d < 3; d++) {
        snprintf(log[d], sizeof log[d], "%s/bf16-%d.log", g_tmp, d);
        snprintf(csv[d], sizeof csv[d], "%s/bf16-%d.csv", g_tmp, d);
        snprintf(args, sizeof args,
                 "--config %s --servers %s --steps %d --log-every %d --csv %s --gemm %s --fresh",
                 cfg, g_servers, STEPS, STEPS, csv[d],
                 d == 0 && strcmp(g_gpu, "cuda") ? "bf16" : gemm[d]);
        train(dev[d], log[d], args);
        csv_losses(csv[d], loss[d], STEPS);
    }
    TEST_CHECKF(log_has(log[0], "GEMMs bf16 operands"), "the GPU run should use bf16 GEMMs (%s)",
                log[0]);
    TEST_CHECKF(log_has(log[2], "GEMMs fp32"), "--gemm fp32 should say fp32 GEMMs (%s)", log[2]);
    double same = fabs(loss[0][0] - loss[1][0]), f32 = fabs(loss[0][0] - loss[2][0]), worst = 0;
    for (int s = 0; s < STEPS; s++) {
        TEST_CHECKF(!isnan(loss[0][s]) && !isnan(loss[1][s]), "step %d missing", s + 1);
        worst = fmax(worst, fabs(loss[0][s] - loss[1][s]));
    }
    printf("3. bf16 params + GEMMs, stage 2 + offload: loss %.4f -> %.4f; step 1 |cuda - cpu "
           "bf16 GEMMs| %.3g, |cuda - cpu fp32 GEMMs| %.3g; steps 1..%d max |cuda - cpu bf16| "
           "%.3g (tolerance %.0e)\n",
           loss[0][0], loss[0][STEPS - 1], same, f32, STEPS, worst, BF16_LOSS_TOL);
    /* 1.5, not more: the tensor cores sum the 16-bit products in their own
     * order and rounding, which moves values across 16-bit ties (see
     * test_gpt_cuda's mixed_step); on an H100 (2026-11-25) the step-1
     * losses gave 4e-06 vs 8e-06 (the CSV holds 6 decimals). A GPU that
     * skipped the bf16 rounding would be closer to the fp32 run. */
    TEST_CHECKF(same * 1.5 <= f32, "step 1: cuda is not closer to the same rounding (%.3g vs %.3g)",
                same, f32);
    TEST_CHECKF(worst <= BF16_LOSS_TOL, "bf16 losses differ by %.3g", worst);
    TEST_CHECKF(loss[0][STEPS - 1] < loss[0][0], "the loss should fall");
}

/* ---- 6. fused attention ---- */

/* The stages of ZS_TEST_TRAIN_CUDA_STAGES (default all four), bf16 config
 * with offload at stages 1-3: zs-train --device cuda --attention flash (bf16
 * GEMMs, the fused CUDA kernels) against --device cpu --gemm bf16
 * --attention flash (the CPU twin with the same rounding points), both at
 * W = g_np: the GPU run must say it runs flash, every step's loss within
 * BF16_LOSS_TOL and step 1 within FLASH_STEP1 of the CPU's, and the loss
 * falls. On the emulator (2026-11-28, W = 1 and 2) step 1 differed by at
 * most 1e-06 (the CSV's 6 decimals) and steps 1..10 by at most 4e-05. */
#define FLASH_STEP1 2e-4

static void flash_run(void)
{
    const char *only = getenv("ZS_TEST_TRAIN_CUDA_STAGES");
    printf("6. zs-train --attention flash, W=%d, %d steps, bf16: CUDA vs CPU, stages %s\n", g_np,
           STEPS, only && *only ? only : "0123");
    for (int stage = 0; stage <= 3; stage++) {
        if (only && *only && !strchr(only, '0' + stage))
            continue;
        char cfg[300], args[2048], log[2][300], csv[2][300];
        snprintf(cfg, sizeof cfg, "%s/flash-s%d.json", g_tmp, stage);
        write_config_x(cfg, stage, stage > 0, "\"bf16\": {\"enabled\": true},");
        const char *dev[2] = {g_gpu, "cpu"};
        double loss[2][STEPS];
        for (int d = 0; d < 2; d++) {
            snprintf(log[d], sizeof log[d], "%s/flash-s%d-%d.log", g_tmp, stage, d);
            snprintf(csv[d], sizeof csv[d], "%s/flash-s%d-%d.csv", g_tmp, stage, d);
            snprintf(args, sizeof args,
                     "--config %s --servers %s --steps %d --log-every %d --csv %s --gemm %s "
                     "--attention flash --fresh",
                     cfg, g_servers, STEPS, STEPS, csv[d], d ? "bf16" : "auto");
            train(dev[d], log[d], args);
            csv_losses(csv[d], loss[d], STEPS);
        }
        TEST_CHECKF(log_has(log[0], "attention flash") && log_has(log[1], "attention flash"),
                    "stage %d: both runs should run the fused attention (%s, %s)", stage, log[0],
                    log[1]);
        double worst = 0;
        for (int s = 0; s < STEPS; s++) {
            TEST_CHECKF(!isnan(loss[0][s]) && !isnan(loss[1][s]), "stage %d: step %d missing",
                        stage, s + 1);
            worst = fmax(worst, fabs(loss[0][s] - loss[1][s]));
        }
        double first = fabs(loss[0][0] - loss[1][0]);
        printf("   stage %d: loss %.4f -> %.4f; step 1 |cuda - cpu| %.3g, steps 1..%d max %.3g\n",
               stage, loss[0][0], loss[0][STEPS - 1], first, STEPS, worst);
        TEST_CHECKF(first <= FLASH_STEP1, "stage %d: step 1 losses differ by %.3g", stage, first);
        TEST_CHECKF(worst <= BF16_LOSS_TOL, "stage %d: losses differ by %.3g", stage, worst);
        TEST_CHECKF(loss[0][STEPS - 1] < loss[0][0], "stage %d: the loss should fall", stage);
    }
}

/* ---- 2. kill -9 and resume ---- */

/* pid of a zs-train process whose command line holds `tag`, or 0. */
static pid_t find_train(const char *tag)
{
    pid_t pid;
    return zs_test_find_procs(g_train, tag, &pid, 1) ? pid : 0;
}

/* Two fresh servers (empty data dirs named after `tag`, --keep 3) into
 * srv, their list into `list`. */
static void servers_up(const char *tag, zs_test_server_t *srv, char *list, size_t n)
{
    zs_test_servers_up(srv, 2, g_tmp, tag, "--keep 3", list, n);
}

/* Each run on servers of its own: a fresh start does not drop the
 * checkpoints an earlier run left, and resume takes the newest. */
static void kill_resume(void)
{
    zs_test_server_t srv[2];
    char servers[256];
    servers_up("kr-ref", srv, servers, sizeof servers);
    char cfg[300], args[2048], log[300], csv[300], ref[300], got[300], cmd[4096];
    snprintf(cfg, sizeof cfg, "%s/kr.json", g_tmp);
    write_config(cfg, 2, 1);
    /* ZS_TEST_TRAIN_CUDA_KR_STEPS (at least 30, default 100): fewer steps
     * where a step is slow (the CUDA emulator's ctest entry runs 40) */
    const char *kr = getenv("ZS_TEST_TRAIN_CUDA_KR_STEPS");
    const int steps = kr && atoi(kr) >= 30 ? atoi(kr) : 100;

    /* the undisturbed run (fresh start, checkpoints as the other) */
    snprintf(log, sizeof log, "%s/kr-ref.log", g_tmp);
    snprintf(ref, sizeof ref, "%s/kr-ref.bin", g_tmp);
    snprintf(csv, sizeof csv, "%s/kr-ref.csv", g_tmp);
    snprintf(args, sizeof args,
             "--config %s --servers %s --steps %d --ckpt-every 10 --log-every 10 --csv %s "
             "--save-params %s",
             cfg, servers, steps, csv, ref);
    train(g_gpu, log, args);
    zs_test_servers_down(srv, 2);

    /* the same job, killed once the CSV shows step 15 */
    servers_up("kr-a", srv, servers, sizeof servers);
    snprintf(log, sizeof log, "%s/kr-killed.log", g_tmp);
    snprintf(got, sizeof got, "%s/kr-got.bin", g_tmp);
    snprintf(csv, sizeof csv, "%s/kr-killed.csv", g_tmp);
    snprintf(args, sizeof args,
             "--config %s --servers %s --steps %d --ckpt-every 10 --log-every 10 --csv %s "
             "--save-params %s",
             cfg, servers, steps, csv, got);
    train_cmd(cmd, sizeof cmd, g_gpu, args);
    char full[4500];
    snprintf(full, sizeof full, "%s > %s 2>&1", cmd, log);
    pid_t job = fork();
    TEST_CHECK(job >= 0);
    if (job == 0) {
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    int status = 0, killed = 0, exited = 0;
    for (int i = 0; i < 120000 && !killed && !exited; i++) { /* 5 ms polls, 10 min */
        if (waitpid(job, &status, WNOHANG) == job) {
            exited = 1;
            break;
        }
        if (csv_last_step(csv) >= 15) {
            pid_t w = find_train(csv);
            if (w > 0 && kill(w, SIGKILL) == 0)
                killed = csv_last_step(csv);
        }
        usleep(5000);
    }
    if (!exited)
        TEST_CHECK(waitpid(job, &status, 0) == job);
    if (killed && !log_has(log, "done: steps")) {
        printf("2. kill -9: zs-train killed after step %d of %d (CSV), mpirun exit %d\n", killed,
               steps, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        TEST_CHECKF(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "the killed run should fail");
    } else {
        /* too fast to kill in time: stop after step 20 and resume instead */
        printf("2. the run finished before the kill could land: stop after step 20 and resume "
               "instead\n");
        zs_test_servers_down(srv, 2);
        servers_up("kr-b", srv, servers, sizeof servers);
        snprintf(args, sizeof args,
                 "--config %s --servers %s --steps 20 --ckpt-every 10 --log-every 10 --csv %s", cfg,
                 servers, csv);
        train(g_gpu, log, args);
    }
    snprintf(log, sizeof log, "%s/kr-resumed.log", g_tmp);
    snprintf(args, sizeof args,
             "--config %s --servers %s --steps %d --ckpt-every 10 --log-every 10 --resume --csv "
             "%s --save-params %s",
             cfg, servers, steps, csv, got);
    train(g_gpu, log, args);
    TEST_CHECKF(log_has(log, "resumed from checkpoint 10") ||
                    log_has(log, "resumed from checkpoint 20"),
                "the rerun should resume from checkpoint 10 or 20 (log %s)", log);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", ref, got) == 0,
                "resumed run's final parameters differ from the undisturbed run's (%s, %s)", ref,
                got);
    printf("   resumed on the GPU: final parameters bitwise equal to the undisturbed run\n");
    zs_test_servers_down(srv, 2);
}

/* ---- 4. several GPUs: kill -9 of one worker, zs-launch resumes on fewer ---- */

#define EL_STEPS 30 /* checkpoints every 10; the kill lands after step 12 */

/* stage 2 + offload with a batch both W and W-1 divide (W = 2: 8 = 2 x 2 x
 * 2 and 1 x 2 x 4; W = 4: 12 = 4 x 1 x 3 and 3 x 1 x 4) */
static void write_elastic_config(const char *path)
{
    FILE *f = fopen(path, "w");
    TEST_CHECK(f);
    fprintf(f,
            "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d,\n"
            " \"gradient_clipping\": 1.0,\n"
            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"weight_decay\": "
            "0.1}},\n"
            " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"},\n"
            "   \"reduce_bucket_size\": 20000}}\n",
            g_np == 4 ? 12 : 8, g_np == 4 ? 1 : 2);
    TEST_CHECK(fclose(f) == 0);
}

/* zs-train on `np` ranks of `device` (g_np is what train() uses). */
static void train_np(int np, const char *device, const char *log, const char *args)
{
    int keep = g_np;
    g_np = np;
    train(device, log, args);
    g_np = keep;
}

/* The undisturbed schedule of a resumed job: W ranks to checkpoint `ck`,
 * then W-1 ranks resume from it to the end; final parameters to `out`. */
static void elastic_reference(const char *device, const char *cfg, int ck, const char *out)
{
    zs_test_server_t srv[2];
    char servers[256], tag[32], log[300], args[2048];
    snprintf(tag, sizeof tag, "el-%s", device);
    servers_up(tag, srv, servers, sizeof servers);
    snprintf(log, sizeof log, "%s/el-%s-a.log", g_tmp, device);
    snprintf(args, sizeof args,
             "--config %s --servers %s --steps %d --ckpt-every 10 --log-every 10", cfg, servers,
             ck);
    train_np(g_np, device, log, args);
    snprintf(log, sizeof log, "%s/el-%s-b.log", g_tmp, device);
    snprintf(args, sizeof args,
             "--config %s --servers %s --steps %d --ckpt-every 10 --log-every 10 --resume "
             "--save-params %s",
             cfg, servers, EL_STEPS, out);
    train_np(g_np - 1, device, log, args);
    TEST_CHECKF(log_has(log, "resumed from checkpoint"), "the reference did not resume (%s)", log);
    zs_test_servers_down(srv, 2);
}

/* zs-launch --np W --min-np W-1 --shrink-after 1 runs the job on W GPUs;
 * one zs-train rank is SIGKILLed after step 12; the launcher reruns it on
 * W-1 GPUs with --resume-auto. Its final parameters must be bitwise those of
 * the same schedule run undisturbed on the GPUs (W ranks to the checkpoint
 * it resumed from, then W-1), as the CPU path's are (test_chaos); and close
 * to that schedule on the CPU (part 1's bounds). */
static void elastic(void)
{
    uint64_t P = zs_gpt_num_params(&k_shape);
    char cfg[300], log[300], csv[300], got[300], ref[300], cpu[300], args[2048], cmd[4096];
    snprintf(cfg, sizeof cfg, "%s/elastic.json", g_tmp);
    write_elastic_config(cfg);
    snprintf(log, sizeof log, "%s/el-launch.log", g_tmp);
    snprintf(csv, sizeof csv, "%s/el-launch.csv", g_tmp);
    snprintf(got, sizeof got, "%s/el-got.bin", g_tmp);
    zs_test_server_t srv[2];
    char servers[256];
    servers_up("el-launch", srv, servers, sizeof servers);
    snprintf(args, sizeof args,
             "%s --device %s --data %s " SHAPE " --config %s --servers %s --steps %d "
             "--ckpt-every 10 --log-every 10 --csv %s --save-params %s",
             g_train, g_gpu, g_data, cfg, servers, EL_STEPS, csv, got);
    snprintf(cmd, sizeof cmd,
             "ZS_LOG_LEVEL=warn exec %s --np %d --min-np %d --shrink-after 1 --max-restarts 2 "
             "--backoff 200 --mpirun %s --mpirun-arg --allow-run-as-root --mpirun-arg "
             "--oversubscribe --mpirun-arg --bind-to --mpirun-arg none --mpirun-arg -q -- %s "
             "> %s 2>&1",
             env_or("ZS_LAUNCH_BIN", ZS_LAUNCH), g_np, g_np - 1, g_mpirun, args, log);
    pid_t job = fork();
    TEST_CHECK(job >= 0);
    if (job == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0, killed = 0, exited = 0;
    for (int i = 0; i < 120000 && !exited; i++) { /* 5 ms polls, 10 min */
        if (waitpid(job, &status, WNOHANG) == job) {
            exited = 1;
            break;
        }
        if (!killed && csv_last_step(csv) >= 12) {
            pid_t w = find_train(csv);
            if (w > 0 && kill(w, SIGKILL) == 0)
                killed = csv_last_step(csv);
        }
        usleep(5000);
    }
    if (!exited) {
        kill(job, SIGTERM);
        waitpid(job, &status, 0);
    }
    zs_test_servers_down(srv, 2);
    TEST_CHECKF(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "zs-launch did not finish the job (log %s)", log);
    TEST_CHECKF(killed, "the job finished before the kill could land (log %s)", log);
    char shrink[64];
    snprintf(shrink, sizeof shrink, "with %d workers", g_np - 1);
    TEST_CHECKF(log_has(log, shrink), "zs-launch should rerun %s (log %s)", shrink, log);
    int ck = log_has(log, "resumed from checkpoint 20")   ? 20
             : log_has(log, "resumed from checkpoint 10") ? 10
                                                          : 0;
    TEST_CHECKF(ck, "the rerun should resume from checkpoint 10 or 20 (log %s)", log);
    printf("4. W=%d: one zs-train rank killed after step %d; zs-launch reran on %d GPU(s), "
           "resumed from checkpoint %d\n",
           g_np, killed, g_np - 1, ck);

    snprintf(ref, sizeof ref, "%s/el-ref.bin", g_tmp);
    elastic_reference(g_gpu, cfg, ck, ref);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", ref, got) == 0,
                "the resumed job's parameters differ from the undisturbed W=%d -> %d schedule "
                "(%s, %s)",
                g_np, g_np - 1, got, ref);
    snprintf(cpu, sizeof cpu, "%s/el-cpu.bin", g_tmp);
    elastic_reference("cpu", cfg, ck, cpu);
    float *w0 = zs_gpttest_init_weights(k_shape, 1337);
    float *pg = read_params(got, P), *pc = read_params(cpu, P);
    double rel = zs_gpttest_rel_update_diff(&k_shape, w0, pg, pc);
    printf("   bitwise equal to W=%d to step %d then W=%d on the GPUs undisturbed; vs the same "
           "schedule on the CPU: ||cuda - cpu|| / ||update|| %.3g\n",
           g_np, ck, g_np - 1, rel);
    TEST_CHECKF(rel <= PARAM_REL, "elastic: parameter difference to the CPU %.3g > %.1g", rel,
                PARAM_REL);
    free(w0), free(pg), free(pc);
}

/* ---- 5. the shared-memory transport on the GPU ---- */

static void transport_run(void)
{
    uint64_t P = zs_gpt_num_params(&k_shape);
    char cfg[300], log[2][300], bin[2][300], cmd[4096];
    static const char *tr[2] = {"shm", "tcp"};
    float *p[2];
    snprintf(cfg, sizeof cfg, "%s/transport.json", g_tmp);
    write_config_x(cfg, 2, 1, "\"bf16\": {\"enabled\": true},");
    printf("5. zs-train --device %s, stage 2 + offload, bf16, %d steps: --transport shm vs tcp\n",
           g_gpu, STEPS);
    for (int t = 0; t < 2; t++) {
        snprintf(log[t], sizeof log[t], "%s/transport-%s.log", g_tmp, tr[t]);
        snprintf(bin[t], sizeof bin[t], "%s/transport-%s.bin", g_tmp, tr[t]);
        snprintf(cmd, sizeof cmd,
                 "ZS_LOG_LEVEL=info %s " MPI_OPTS " -np %d %s --device %s --data %s " SHAPE
                 " --config %s --servers %s --steps %d --log-every %d --save-params %s"
                 " --transport %s --fresh",
                 g_mpirun, g_np, g_train, g_gpu, g_data, cfg, g_servers, STEPS, STEPS, bin[t],
                 tr[t]);
        zs_test_run_ok(log[t], "%s", cmd);
        p[t] = read_params(bin[t], P);
    }
    TEST_CHECKF(log_has(log[0], "server 0 (") && log_has(log[0], "): transport shm (socket"),
                "the shm run should log transport shm for its servers (log %s)", log[0]);
    TEST_CHECKF(log_has(log[1], "transport tcp"), "the tcp run should log transport tcp (log %s)",
                log[1]);
    uint64_t ndiff = 0;
    for (uint64_t k = 0; k < P; k++)
        ndiff += memcmp(&p[0][k], &p[1][k], sizeof(float)) != 0;
    printf("   shm vs tcp on %s: %llu of %llu parameters differ\n", g_gpu,
           (unsigned long long)ndiff, (unsigned long long)P);
    TEST_CHECKF(ndiff == 0, "--transport shm and tcp should give bitwise equal parameters");
    free(p[0]), free(p[1]);
}

/* ---- 7. the delayed parameter update ---- */

/* Stage 2, bf16, offload_optimizer.delayed_update_after 2 at W = g_np:
 * on the GPU, the servers' AdamW (offload) and the in-process CUDA AdamW
 * delayed the same way give bitwise equal parameters (as part 1 holds
 * without the delay); the GPU against the CPU engine with the same rounding
 * and the same delay: every step's loss within BF16_LOSS_TOL; and the
 * delay shows (the parameters differ from the GPU run without it). */
static void delayed_run(void)
{
    uint64_t P = zs_gpt_num_params(&k_shape);
    char cfg[3][300], log[4][300], bin[4][300], csv[4][300], args[2048];
    /* runs: 0 GPU offload, 1 GPU in process, 2 CPU offload (--gemm bf16), 3 GPU offload no delay */
    static const int off[4] = {1, 0, 1, 1}, cf[4] = {0, 1, 0, 2};
    for (int c = 0; c < 3; c++) {
        snprintf(cfg[c], sizeof cfg[c], "%s/dpu-%d.json", g_tmp, c);
        FILE *f = fopen(cfg[c], "w");
        TEST_CHECK(f);
        fprintf(f,
                "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": %d,"
                " \"bf16\": {\"enabled\": true}, \"gradient_clipping\": 1.0,"
                " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001,"
                " \"weight_decay\": 0.1}},"
                " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 20000,"
                " \"offload_optimizer\": {\"device\": \"%s\"%s}}}\n",
                g_np > 2 ? 2 : 4, c == 1 ? "none" : "cpu",
                c < 2 ? ", \"delayed_update_after\": 2" : "");
        TEST_CHECK(fclose(f) == 0);
    }
    printf("7. zs-train --device %s, stage 2, bf16, W = %d, %d steps: the delayed parameter "
           "update after step 2\n",
           g_gpu, g_np, STEPS);
    double loss[4][STEPS];
    float *p[4];
    for (int r = 0; r < 4; r++) {
        snprintf(log[r], sizeof log[r], "%s/dpu-%d.log", g_tmp, r);
        snprintf(bin[r], sizeof bin[r], "%s/dpu-%d.bin", g_tmp, r);
        snprintf(csv[r], sizeof csv[r], "%s/dpu-%d.csv", g_tmp, r);
        snprintf(args, sizeof args,
                 "--config %s %s%s --steps %d --log-every %d --csv %s --save-params %s --fresh%s",
                 cfg[cf[r]], off[r] ? "--servers " : "", off[r] ? g_servers : "", STEPS, STEPS,
                 csv[r], bin[r], r == 2 ? " --gemm bf16" : "");
        train(r == 2 ? "cpu" : g_gpu, log[r], args);
        csv_losses(csv[r], loss[r], STEPS);
        p[r] = read_params(bin[r], P);
    }
    uint64_t ndiff = 0, nplain = 0;
    for (uint64_t k = 0; k < P; k++) {
        ndiff += memcmp(&p[0][k], &p[1][k], sizeof(float)) != 0;
        nplain += memcmp(&p[0][k], &p[3][k], sizeof(float)) != 0;
    }
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        TEST_CHECKF(!isnan(loss[0][s]) && !isnan(loss[2][s]), "step %d missing", s + 1);
        worst = fmax(worst, fabs(loss[0][s] - loss[2][s]));
    }
    printf("   offload vs in process on %s: %llu of %llu parameters differ; without the delay "
           "%llu differ; steps 1..%d max |%s - cpu| loss %.3g (tolerance %.0e)\n",
           g_gpu, (unsigned long long)ndiff, (unsigned long long)P, (unsigned long long)nplain,
           STEPS, g_gpu, worst, BF16_LOSS_TOL);
    TEST_CHECKF(ndiff == 0, "the delayed update: offload and in process should be bitwise equal");
    TEST_CHECKF(nplain > 0, "the delayed update changed nothing on %s", g_gpu);
    TEST_CHECKF(worst <= BF16_LOSS_TOL, "the delayed update: %s and cpu losses differ by %.3g",
                g_gpu, worst);
    for (int r = 0; r < 4; r++)
        free(p[r]);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("ZS_LOG_LEVEL", "warn", 1); /* the servers' per-step lines */
    char why[200];
    const char *side = getenv("ZS_TEST_TRAIN_CUDA_SIDE");
    if (side && !strcmp(side, "cpu")) {
        g_gpu = "cpu";
        printf("ZS_TEST_TRAIN_CUDA_SIDE=cpu: harness self-check, the 'cuda' runs use --device cpu "
               "(NOT a GPU test)\n");
    } else if (!zs_dev_cuda_available(why, sizeof why)) {
        printf("SKIPPED: %s\n", why);
        return 77;
    }
    /* ZS_TEST_TRAIN_CUDA_NP=W: W ranks, one GPU each (part 1 only) */
    const char *np = getenv("ZS_TEST_TRAIN_CUDA_NP");
    g_np = np && atoi(np) > 1 ? atoi(np) : 1;
    g_train = env_or("ZS_TRAIN_BIN", ZS_TRAIN);
    g_mpirun = env_or("ZS_MPIEXEC_BIN", ZS_MPIEXEC);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("train-cuda"));
    snprintf(g_data, sizeof g_data, "%s/corpus.tok", g_tmp);
    write_data();
    zs_test_server_t srv[2];
    servers_up("st", srv, g_servers, sizeof g_servers);
    const char *part = getenv("ZS_TEST_TRAIN_CUDA_PART");
    if (part && !strcmp(part, "shm")) {
        transport_run();
        zs_test_servers_down(srv, 2);
        printf("test_train_cuda: ok (part 5, the shared-memory transport)\n");
        return 0;
    }
    if (part && !strcmp(part, "dpu")) {
        delayed_run();
        zs_test_servers_down(srv, 2);
        printf("test_train_cuda: ok (part 7, the delayed parameter update)\n");
        return 0;
    }
    if (part && !strcmp(part, "flash")) {
        flash_run();
        zs_test_servers_down(srv, 2);
        printf("test_train_cuda: ok (part 6, the fused attention)\n");
        return 0;
    }
    stages();
    if (g_np > 1) { /* several GPUs: parts 1, 3 and 4 (kill + resume at W = 1 is part 2) */
        const char *b16 = getenv("ZS_TEST_TRAIN_CUDA_BF16"); /* "0": part 3 left out */
        if (!b16 || strcmp(b16, "0"))
            bf16_run();
        else
            printf("3. bf16: left out (ZS_TEST_TRAIN_CUDA_BF16=0; it runs at W = 1 and 2)\n");
        zs_test_servers_down(srv, 2);
        elastic();
        printf("test_train_cuda: ok (W = %d: parts 1, 3, 4)\n", g_np);
        return 0;
    }
    bf16_run();
    zs_test_servers_down(srv, 2);
    kill_resume();
    printf(strcmp(g_gpu, "cuda") ? "test_train_cuda: harness self-check ok (no GPU was used)\n"
                                 : "test_train_cuda: ok\n");
    return 0;
}
