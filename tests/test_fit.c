/*
 * test_fit.c - bench_fit (bench/bench_fit.c) is honest: on the CPU device
 * with a small device memory limit and tiny GPT widths, for both
 * configurations (stage 3 + offload_param, stage 2):
 *   - the search ends on "L fits, L + 1 is out of device memory";
 *   - rerunning the reported largest trial (bench_fit --trial, a fresh
 *     process and fresh zs-servers) trains: exit 0, status fit, finite
 *     losses, measured device peak within the limit;
 *   - rerunning L + 1 fails with the device's out-of-memory error naming
 *     the limit (exit 10, status oom), not with another error;
 *   - a host RAM budget too small for any size refuses every size without
 *     running a trial;
 *   - --device cuda is SKIPPED (77) where no GPU is usable, or (on a GPU
 *     machine) ends at a 1-second --time-limit with its table;
 *   - stage 3 + offload_param + cpu_checkpointing: the device peak at 2L
 *     layers is within 10% of the one at L (depth is the host's problem).
 * Does not: run a GPU trial, or check speed figures.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zs_test.h"

#define LIMIT "8388608" /* 8 MiB of device memory */

static char out[1 << 20];

/* Run a shell command; its stdout + stderr into out; returns the exit status. */
static int run(const char *cmd)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    TEST_CHECK(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static const char *common_args(void)
{
    static char a[1024];
    snprintf(a, sizeof a,
             "--device cpu --mem-limit " LIMIT " --vocab 256 --ctx 32 --threads 1 "
             "--server-threads 1 --persist 0 --max-live 20000 --max-layers 40 --bucket deepspeed "
             "--server-bin %s",
             ZS_BINARY_DIR "/server/zs-server");
    return a;
}

/* One trial by hand, as the search runs it; returns its exit status and
 * leaves its FIT-RESULT line's fields in the given pointers. */
static int trial_x(int stage, int width, int layers, const char *extra, char *status,
                   unsigned long long *held, double *loss1, double *loss2, char *msg, size_t msgn)
{
    char dir[] = "/tmp/zs-test-fit-XXXXXX", cmd[2048];
    TEST_CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd,
             "%s/bench/bench_fit --trial %s --stage %d --width %d --layers %d "
             "--workdir %s %s",
             ZS_BINARY_DIR, common_args(), stage, width, layers, dir, extra);
    int rc = run(cmd);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    TEST_CHECK(system(rm) == 0);
    const char *r = strstr(out, "FIT-RESULT ");
    TEST_CHECKF(r != NULL, "no FIT-RESULT line from: %s\n%s", cmd, out);
    TEST_CHECK(sscanf(r, "FIT-RESULT status=%15s", status) == 1);
    const char *h = strstr(r, " held_peak="), *l1 = strstr(r, " loss1="),
               *l2 = strstr(r, " loss2=");
    const char *m = strstr(r, " msg=");
    TEST_CHECK(h && l1 && l2 && m);
    *held = strtoull(h + 11, NULL, 10);
    *loss1 = strtod(l1 + 7, NULL);
    *loss2 = strtod(l2 + 7, NULL);
    snprintf(msg, msgn, "%s", m + 5);
    msg[strcspn(msg, "\n")] = '\0';
    printf("  trial stage %d C=%d L=%d: exit %d, %s, device peak %llu of " LIMIT " bytes%s%s\n",
           stage, width, layers, rc, status, *held, msg[0] ? ": " : "", msg);
    return rc;
}

static int trial(int stage, int width, int layers, char *status, unsigned long long *held,
                 double *loss1, double *loss2, char *msg, size_t msgn)
{
    return trial_x(stage, width, layers, "", status, held, loss1, loss2, msg, msgn);
}

/* Stage 3 + offload_param + offload_optimizer with the checkpoints in
 * pinned memory (--act-ckpt cpu) and a reduce bucket of 250000 elements:
 * the device holds the live/prefetch/bucket budgets, one layer's working
 * set and the head, so its peak at 2L layers is within 10% of the peak at
 * L (issue 16). At DeepSpeed's default reduce_bucket_size the bucket is the
 * whole model here and the peak grew x1.55 from L=4 to 8 (C=64): the check
 * fails. With the checkpoints on the device (--act-ckpt on) they grow with
 * depth: shown, not bounded. */
static void depth(void)
{
    const int L = 6, C = 128; /* P > 1M: the 4 MiB init chunk is full at both depths */
    unsigned long long held[2][2];
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < 2; k++) {
            char st[16], msg[512];
            double l1, l2;
            int rc =
                trial_x(3, C, L << k,
                        mode ? "--bucket 250000 --act-ckpt on" : "--bucket 250000 --act-ckpt cpu",
                        st, &held[mode][k], &l1, &l2, msg, sizeof msg);
            TEST_CHECKF(rc == 0 && !strcmp(st, "fit"), "stage 3 L=%d: %s %s", L << k, st, msg);
        }
    double g = (double)held[0][1] / (double)held[0][0];
    printf("stage 3 + offload_param, cpu_checkpointing: device peak %llu B at L=%d, %llu B at "
           "L=%d (x%.3f); checkpoints on the device: %llu -> %llu B\n",
           held[0][0], L, held[0][1], 2 * L, g, held[1][0], held[1][1]);
    TEST_CHECKF(g <= 1.10, "stage 3: the device peak grew x%.3f from L=%d to L=%d (bound 1.10)", g,
                L, 2 * L);
}

/* bench_fit's default bucket (auto: 4C^2 + 4C, the GPT split to it) holds
 * less device memory than the same bucket without the split (gradient
 * buckets of whole blocks and the whole embedding) and than DeepSpeed's
 * (the model is one bucket, the fp32 gradient slot a whole fp32 gradient):
 * stage 2, bf16, the same L. (The search above passes --bucket deepspeed,
 * whose answer is bound by the device within --max-layers; at auto stage
 * 3 is not.) */
static void split_floor(void)
{
    char st[16], msg[512];
    unsigned long long ha, hn, hd;
    double l1, l2;
    int rc = trial_x(2, 64, 8, "--dtype bf16 --bucket auto", st, &ha, &l1, &l2, msg, sizeof msg);
    TEST_CHECKF(rc == 0 && !strcmp(st, "fit") && isfinite(l2), "auto bucket: exit %d, %s %s", rc,
                st, msg);
    rc = trial_x(2, 64, 8, "--dtype bf16 --bucket auto --split off", st, &hn, &l1, &l2, msg,
                 sizeof msg);
    TEST_CHECKF(rc == 0 && !strcmp(st, "fit"), "auto bucket, no split: exit %d, %s %s", rc, st,
                msg);
    rc = trial_x(2, 64, 8, "--dtype bf16 --bucket deepspeed", st, &hd, &l1, &l2, msg, sizeof msg);
    TEST_CHECKF(rc == 0 && !strcmp(st, "fit"), "deepspeed bucket: exit %d, %s %s", rc, st, msg);
    TEST_CHECKF(ha < hn * 0.95 && hn < hd,
                "stage 2 bf16 L=8: device peak %llu with the split bucket, %llu without the "
                "split, %llu at DeepSpeed's bucket",
                ha, hn, hd);
    printf("split floor: stage 2 bf16 C=64 L=8 device peak %llu bytes at --bucket auto, %llu "
           "without the split, %llu at deepspeed\n",
           ha, hn, hd);
}

int main(void)
{
    char cmd[2048];
    /* the search */
    snprintf(cmd, sizeof cmd, "%s/bench/bench_fit %s --widths 64", ZS_BINARY_DIR, common_args());
    int rc = run(cmd);
    printf("%s", out);
    TEST_CHECKF(rc == 0, "bench_fit exited %d", rc);
    TEST_CHECK(strstr(out, "| stage 3 + offload_param + offload_optimizer | 64 |") != NULL);
    TEST_CHECK(strstr(out, "| stage 2 + offload_optimizer | 64 |") != NULL);
    int found = 0;
    static char search_out[sizeof out];
    memcpy(search_out, out, sizeof out);
    for (const char *p = search_out; (p = strstr(p, "FIT-BEST ")); p++) {
        int stage, width, layers, next;
        char next_status[64] = "";
        TEST_CHECK(sscanf(p,
                          "FIT-BEST stage=%d width=%d layers=%d params=%*u held_peak=%*u "
                          "next=%d next_status=\"%63[^\"]\"",
                          &stage, &width, &layers, &next, next_status) == 5);
        printf("search: stage %d C=%d: largest L=%d, L+1=%d: %s\n", stage, width, layers, next,
               next_status);
        /* device bytes per parameter and what bounded the answer (issue 16) */
        const char *eol = strchr(p, '\n'), *bpp = strstr(p, "device_bytes_per_param=");
        double dbpp = 0;
        char bound[16] = "";
        TEST_CHECKF(bpp && (!eol || bpp < eol) &&
                        sscanf(bpp, "device_bytes_per_param=%lf bound=%15s", &dbpp, bound) == 2 &&
                        dbpp > 0 && !strcmp(bound, "device"),
                    "FIT-BEST must give device_bytes_per_param > 0 and bound=device (stage %d)",
                    stage);
        TEST_CHECKF(layers >= 1 && next == layers + 1 &&
                        !strcmp(next_status, "out of device memory"),
                    "the search must end on a fit and an out-of-memory at L+1 (stage %d)", stage);
        char st[16], msg[512];
        unsigned long long held;
        double l1, l2;
        /* the reported largest model really trains within the limit */
        rc = trial(stage, width, layers, st, &held, &l1, &l2, msg, sizeof msg);
        TEST_CHECKF(rc == 0 && !strcmp(st, "fit"), "L=%d must fit: exit %d, %s %s", layers, rc, st,
                    msg);
        TEST_CHECK(held > 0 && held <= strtoull(LIMIT, NULL, 10));
        TEST_CHECK(isfinite(l1) && isfinite(l2));
        /* and the next size up runs out of device memory, not into another error */
        rc = trial(stage, width, layers + 1, st, &held, &l1, &l2, msg, sizeof msg);
        TEST_CHECKF(rc == 10 && !strcmp(st, "oom"), "L=%d must be out of memory: exit %d, %s %s",
                    layers + 1, rc, st, msg);
        TEST_CHECK(strstr(msg, "ZS_ERR_NOMEM") && strstr(msg, "out of device memory") &&
                   strstr(msg, "the device memory limit is " LIMIT " bytes"));
        TEST_CHECK(held <= strtoull(LIMIT, NULL, 10));
        found++;
    }
    TEST_CHECKF(found == 2, "%d FIT-BEST lines, 2 expected", found);

    /* a host budget that no size fits: refused, no trial run */
    snprintf(cmd, sizeof cmd, "%s/bench/bench_fit %s --widths 64 --stages 3 --host-margin 1e-9",
             ZS_BINARY_DIR, common_args());
    rc = run(cmd);
    TEST_CHECKF(rc == 0 && strstr(out, "refused without a trial") && !strstr(out, "trial: stage") &&
                    strstr(out, "FIT-BEST stage=3 width=64 layers=0") &&
                    strstr(out, "host RAM (refused, not run)") && strstr(out, "bound=host-ram"),
                "host RAM refusal: exit %d\n%s", rc, out);
    printf("host RAM refusal: ok\n");

    /* --device cuda: skipped without a GPU; cut by the time limit with one */
    snprintf(cmd, sizeof cmd,
             "%s/bench/bench_fit --device cuda --widths 64 --vocab 256 --ctx 32 --time-limit 1 "
             "--server-bin %s",
             ZS_BINARY_DIR, ZS_BINARY_DIR "/server/zs-server");
    rc = run(cmd);
    TEST_CHECKF((rc == 77 && strstr(out, "SKIPPED: ")) || (rc == 0 && strstr(out, "### Largest")),
                "--device cuda: exit %d\n%s", rc, out);
    printf("--device cuda: exit %d (%s)\n", rc, rc == 77 ? "skipped, no GPU" : "ran");
    depth();
    split_floor();
    printf("test_fit: all ok\n");
    return 0;
}
