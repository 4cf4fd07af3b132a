/*
 * bench_fit.c - the largest GPT (by parameters) whose training step works
 * within one device's memory with the optimizer offloaded to shard servers
 * (issue 8), by measurement: every size it reports was trained.
 *
 * For each ZeRO configuration (stage 3 with offload_param + offload_optimizer;
 * stage 2 with offload_optimizer only) and each width C of a ladder of
 * GPT-2-style shapes (heads = C / head size, fixed T, micro-batch and
 * vocabulary), it searches the number of layers L. Each try is a trial
 * (bench_fit_trial.c): a child process, fork + exec of this program with
 * --trial, so a CUDA context that ran out of memory or leaked state cannot
 * poison the next try; it starts its own zs-servers, builds model + engine
 * and runs 2 full train steps. Fits = both steps finish with a finite loss;
 * doesn't = "out of device memory" (ZS_ERR_NOMEM from the device allocator);
 * anything else stops that width's search and is reported as an error.
 *
 * The search per (stage, width): L = 1 and L = 2 first (cheap), then a
 * guess from the line through the two largest fitting trials' measured
 * peak device bytes (peak(L) is about a + b L; the guess is the largest L
 * with a + b L <= the device's memory), then the guess + 1, and bisection
 * whenever a guess was wrong. It ends when L fits and L + 1 does not (or L
 * + 1 is out of bounds: host RAM, --max-layers). Before a trial, sizes
 * whose host state would not fit in MemAvailable (the servers' 22 B/param:
 * fp32 master, Adam m and v, two gradient staging buffers and a 16-bit
 * copy; the worker's pinned parameters and staging and the fp32 initial
 * copy zs_engine_start sends; on CPU the device memory too) are refused
 * and reported, never run.
 *
 * Output: one progress line per trial, a summary line per (stage, width)
 * ("FIT-BEST ..." for scripts: held_peak is the device space's peak alone,
 * device_bytes_per_param = held_peak / params, bound = what stopped the
 * search above it: device, host-ram, time, max-layers or error), and a
 * Markdown table of the largest
 * fitting model per (stage, width) with the measured peak device memory by
 * category, host RSS of the worker and the servers, tokens/s of step 2,
 * and zs-ctl estimate's figures for the same Psi beside the measurement.
 *
 * --device cuda without a usable GPU, or in a build without CUDA/NCCL:
 * "SKIPPED: <reason>", exit 77 (as bench_gpt --device cuda).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_fit.h"
#include "zs_bench.h"
#include "zs_estimate.h"
#include "zs_gpt.h"

#if defined(ZS_WITH_CUDA) && defined(ZS_WITH_NCCL)
#include "zs_dev_cuda.h"
#endif

#ifndef ZS_SERVER_PATH
#define ZS_SERVER_PATH ""
#endif

#define GIB       1073741824.0
#define MAX_TRIES 64 /* trials per (stage, width) */

static const char *self_exe; /* /proc/self/exe, resolved once */

/* ---- command line ---------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_fit --device cpu --mem-limit BYTES [options]\n"
               "       bench_fit --device cuda [--mem-limit BYTES] [options]\n"
               "  --widths C,C,...     model widths (cpu default 128,256; cuda 4096,2048)\n"
               "  --head-size N        width / heads (default 64)\n"
               "  --batch B            micro-batch (default 1)\n"
               "  --ctx T              sequence length (default: cpu 64, cuda 1024)\n"
               "  --vocab V            vocabulary (default 50257)\n"
               "  --stages 3,2         ZeRO configurations: 3 = stage 3 + offload_param +\n"
               "                       offload_optimizer, 2 = stage 2 + offload_optimizer\n"
               "  --dtype fp32|bf16    parameter/gradient storage (default fp32)\n"
               "  --act-ckpt on|cpu|off  activation checkpointing of every block (default on;\n"
               "                       cpu: the checkpoints in pinned host memory)\n"
               "  --bucket N|auto|deepspeed  reduce_bucket_size in elements; the GPT's engine\n"
               "                       layers are split to it (zs_gpt_set_split). auto (the\n"
               "                       default): 4 C^2 + 4 C, the largest block part (the floor);\n"
               "                       deepspeed: DeepSpeed's 5e8 (no split)\n"
               "  --split on|off       split the GPT's engine layers to the bucket (default on)\n"
               "  --persist N          stage3_param_persistence_threshold (default DeepSpeed's)\n"
               "  --max-live N         stage3_max_live_parameters (default DeepSpeed's)\n"
               "  --max-layers N       upper end of the search (default 1024)\n"
               "  --time-limit S       stop searching after S seconds (default: cpu none, cuda "
               "540)\n"
               "  --host-margin F      fraction of MemAvailable a trial may plan for (0.85)\n"
               "  --server-bin PATH    zs-server (default $ZS_SERVER_BIN or the build's)\n"
               "  --servers N          shard servers per trial (default 2)\n"
               "  --server-threads N   optimizer threads per server (default CPUs / servers)\n"
               "  --threads N          worker CPU threads (default all online CPUs)\n"
               "  --trial --stage S --width C --layers L   run one trial (what the search runs)\n"
               "sizes take K, M, G suffixes (binary)\n");
}

/* "123", "64K", "800M", "12G" (binary units) -> bytes; -1 if not a size. */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0))
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1024.0, end++;
        break;
    case 'm':
    case 'M':
        mul = GIB / 1024, end++;
        break;
    case 'g':
    case 'G':
        mul = GIB, end++;
        break;
    case 't':
    case 'T':
        mul = GIB * 1024, end++;
        break;
    default:
        break;
    }
    if (*end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v * mul > 1.8e19)
        return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    for (const char *p = s; *p && n < max;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0 || v > 1 << 20)
            return -1;
        out[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return n;
}

static int parse_args(int argc, char **argv, zs__fit_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 1, o->vocab = 50257, o->head_size = 64, o->nservers = 2;
    o->max_layers = 1024, o->host_margin = 0.85, o->persist = -1, o->time_limit = -1;
    o->stages[0] = 3, o->stages[1] = 2, o->nstages = 2;
    o->act_ckpt = 1;
    o->split = 1;
    o->bucket = -1; /* auto */
    const char *env = getenv("ZS_SERVER_BIN");
    o->server_bin = env && *env ? env : ZS_SERVER_PATH;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        if (!strcmp(a, "--trial"))
            o->trial = 1, used = 0;
        else if (!v)
            return -1;
        else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda"))
                return -1;
            o->cuda = !strcmp(v, "cuda");
        } else if (!strcmp(a, "--mem-limit")) {
            if (parse_size(v, &o->mem_limit))
                return -1;
        } else if (!strcmp(a, "--widths")) {
            if ((o->nwidths = parse_list(v, o->widths, FIT_MAX_WIDTHS)) <= 0)
                return -1;
        } else if (!strcmp(a, "--stages")) {
            if ((o->nstages = parse_list(v, o->stages, 2)) <= 0)
                return -1;
            for (int k = 0; k < o->nstages; k++)
                if (o->stages[k] != 2 && o->stages[k] != 3)
                    return -1;
        } else if (!strcmp(a, "--dtype")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16"))
                return -1;
            o->bf16 = !strcmp(v, "bf16");
        } else if (!strcmp(a, "--split")) {
            if (strcmp(v, "on") && strcmp(v, "off"))
                return -1;
            o->split = !strcmp(v, "on");
        } else if (!strcmp(a, "--act-ckpt")) {
            if (strcmp(v, "on") && strcmp(v, "cpu") && strcmp(v, "off"))
                return -1;
            o->act_ckpt = !strcmp(v, "on") ? 1 : !strcmp(v, "cpu") ? 2 : 0;
        } else if (!strcmp(a, "--head-size"))
            o->head_size = atoi(v);
        else if (!strcmp(a, "--batch"))
            o->batch = atoi(v);
        else if (!strcmp(a, "--ctx"))
            o->ctx = atoi(v);
        else if (!strcmp(a, "--vocab"))
            o->vocab = atoi(v);
        else if (!strcmp(a, "--bucket"))
            o->bucket = !strcmp(v, "auto") ? -1 : !strcmp(v, "deepspeed") ? 0 : atoll(v);
        else if (!strcmp(a, "--persist"))
            o->persist = atoll(v);
        else if (!strcmp(a, "--max-live"))
            o->max_live = atoll(v);
        else if (!strcmp(a, "--max-layers"))
            o->max_layers = atoi(v);
        else if (!strcmp(a, "--time-limit"))
            o->time_limit = atof(v);
        else if (!strcmp(a, "--host-margin"))
            o->host_margin = atof(v);
        else if (!strcmp(a, "--server-bin"))
            o->server_bin = v;
        else if (!strcmp(a, "--servers"))
            o->nservers = atoi(v);
        else if (!strcmp(a, "--server-threads"))
            o->server_threads = atoi(v);
        else if (!strcmp(a, "--threads"))
            o->threads = atoi(v);
        else if (!strcmp(a, "--stage"))
            o->stage = atoi(v);
        else if (!strcmp(a, "--width"))
            o->width = atoi(v);
        else if (!strcmp(a, "--layers"))
            o->layers = atoi(v);
        else if (!strcmp(a, "--workdir"))
            o->workdir = v;
        else
            return -1;
        i += used;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1)
        ncpu = 1;
    if (!o->ctx)
        o->ctx = o->cuda ? 1024 : 64;
    if (!o->nwidths) {
        int d[2] = {o->cuda ? 4096 : 128, o->cuda ? 2048 : 256};
        memcpy(o->widths, d, sizeof d);
        o->nwidths = 2;
    }
    if (o->time_limit < 0)
        o->time_limit = o->cuda ? 540 : 0;
    if (o->threads <= 0)
        o->threads = (int)ncpu;
    if (o->server_threads <= 0)
        o->server_threads = (int)(ncpu / (o->nservers > 0 ? o->nservers : 1)) ?: 1;
    if (o->batch < 1 || o->ctx < 1 || o->vocab < 2 || o->head_size < 1 || o->nservers < 1 ||
        o->nservers > 8 || o->max_layers < 1 || !(o->host_margin > 0 && o->host_margin <= 1))
        return -1;
    for (int k = 0; k < o->nwidths; k++)
        if (o->widths[k] % o->head_size)
            return fprintf(stderr, "bench_fit: width %d is not a multiple of the head size %d\n",
                           o->widths[k], o->head_size),
                   -1;
    if (o->trial && (o->stage < 2 || o->stage > 3 || o->width < o->head_size || o->layers < 1 ||
                     o->width % o->head_size || !o->workdir))
        return -1;
    return 0;
}

/* ---- host memory ------------------------------------------------------------- */

/* MemAvailable in bytes (0 if unknown). */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Host bytes a trial of P parameters plans for: the servers' state
 * (zs_shard_state_bytes: 22 B/param), the worker's pinned parameter
 * partition (stage 3 offload_param) and offload staging (esz B/param each),
 * the fp32 copy zs_engine_start builds to Initialize the servers (4
 * B/param), 1 GiB for processes, gRPC and the CUDA context, and on the CPU
 * device the device memory (it is RAM there). */
static uint64_t host_need(const zs__fit_opts_t *o, int stage, uint64_t P)
{
    uint64_t esz = o->bf16 ? 2 : 4;
    uint64_t per = 22 + 4 + esz + (stage == 3 ? esz : 0);
    return per * P + (1ull << 30) + (o->cuda ? 0 : o->mem_limit);
}

/* ---- trials ---------------------------------------------------------------------- */

static double t_start;

static double elapsed(void)
{
    return zs_bench_now() - t_start;
}

/* Trials that crashed or could not start (main exits 1 when any did). */
static int g_broken;

/* Run one trial in a child (this program, --trial) and read its result.
 * The child is killed at `deadline` (seconds since t_start; 0: none). */
static void run_trial(const zs__fit_opts_t *o, int stage, int width, int layers, double deadline,
                      zs__fit_result_t *r)
{
    memset(r, 0, sizeof *r);
    r->layers = layers, r->width = width;
    char dir[] = "/tmp/zs-fit-XXXXXX";
    if (!mkdtemp(dir)) {
        snprintf(r->status, sizeof r->status, "error");
        snprintf(r->msg, sizeof r->msg, "mkdtemp: %s", strerror(errno));
        return;
    }
    /* the trial's command line: flag, value pairs */
    char v[20][32];
    const char *argv[48] = {self_exe, "--trial"};
    int na = 2, nv = 0;
#define ARG(flag, ...)                                                                             \
    (snprintf(v[nv], sizeof v[nv], __VA_ARGS__), argv[na++] = (flag), argv[na++] = v[nv++])
    ARG("--device", "%s", o->cuda ? "cuda" : "cpu");
    if (o->mem_limit) /* 0 is no limit, and --mem-limit refuses 0 (found on an H100) */
        ARG("--mem-limit", "%llu", (unsigned long long)o->mem_limit);
    ARG("--stage", "%d", stage);
    ARG("--width", "%d", width);
    ARG("--layers", "%d", layers);
    ARG("--head-size", "%d", o->head_size);
    ARG("--batch", "%d", o->batch);
    ARG("--ctx", "%d", o->ctx);
    ARG("--vocab", "%d", o->vocab);
    ARG("--bucket", "%lld", (long long)o->bucket);
    ARG("--persist", "%lld", (long long)o->persist);
    ARG("--max-live", "%lld", (long long)o->max_live);
    ARG("--servers", "%d", o->nservers);
    ARG("--server-threads", "%d", o->server_threads);
    ARG("--threads", "%d", o->threads);
    ARG("--dtype", "%s", o->bf16 ? "bf16" : "fp32");
    ARG("--act-ckpt", "%s", o->act_ckpt == 1 ? "on" : o->act_ckpt == 2 ? "cpu" : "off");
    ARG("--split", "%s", o->split ? "on" : "off");
#undef ARG
    argv[na++] = "--server-bin", argv[na++] = o->server_bin;
    argv[na++] = "--workdir", argv[na++] = dir;
    argv[na] = NULL;
    int fd[2];
    double t0 = zs_bench_now();
    pid_t pid = -1;
    if (pipe(fd) == 0 && (pid = fork()) == 0) {
        dup2(fd[1], 1);
        close(fd[0]), close(fd[1]);
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        execv(self_exe, (char *const *)argv);
        _exit(127);
    }
    if (pid < 0) {
        snprintf(r->status, sizeof r->status, "error");
        snprintf(r->msg, sizeof r->msg, "fork: %s", strerror(errno));
        rmdir(dir);
        return;
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[4096];
    int got = 0, timed_out = 0;
    for (;;) {
        struct pollfd p = {fd[0], POLLIN, 0};
        int ms = -1;
        if (deadline > 0) {
            double left = deadline - elapsed();
            ms = left > 0 ? (int)(left * 1000) + 1 : 0;
        }
        if (poll(&p, 1, ms) == 0) {
            kill(pid, SIGKILL);
            timed_out = 1;
            break;
        }
        if (!fgets(line, sizeof line, f))
            break;
        if (!strncmp(line, "FIT-RESULT ", 11))
            got = zs__fit_result_parse(line + 11, r) == 0;
        else
            fputs(line, stderr); /* whatever else the trial printed */
    }
    fclose(f);
    int ws = 0;
    waitpid(pid, &ws, 0);
    r->layers = layers, r->width = width;
    r->wall_s = zs_bench_now() - t0;
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_fit: could not remove %s\n", dir);
    if (timed_out) {
        snprintf(r->status, sizeof r->status, "timeout");
        snprintf(r->msg, sizeof r->msg, "killed at the --time-limit deadline");
    } else if (!got || !WIFEXITED(ws)) {
        snprintf(r->status, sizeof r->status, "crash");
        snprintf(r->msg, sizeof r->msg, "trial process ended (%s %d) without a result",
                 WIFSIGNALED(ws) ? "signal" : "exit",
                 WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
    }
}

static const char *stage_name(int stage)
{
    return stage == 3 ? "stage 3 + offload_param + offload_optimizer"
                      : "stage 2 + offload_optimizer";
}

static void progress(int stage, const zs__fit_result_t *r)
{
    printf("trial: stage %d C=%-5d L=%-4d %8.3fB params  %-9s", stage, r->width, r->layers,
           r->params / 1e9, r->status);
    if (r->held_peak)
        printf(" device peak %.3f GiB (%llu B)", r->held_peak / GIB,
               (unsigned long long)r->held_peak);
    if (r->gpu_used)
        printf(", cudaMemGetInfo used %.2f GiB", r->gpu_used / GIB);
    if (!strcmp(r->status, "fit"))
        printf(", init %.1f s (start %.1f), steps %.2f + %.2f s", r->init_s, r->start_s,
               r->step_s[0], r->step_s[1]);
    printf(" [%.1f s]", r->wall_s);
    if (r->msg[0])
        printf("\n       %s", r->msg);
    printf("\n");
    fflush(stdout);
}

/* ---- the search ---------------------------------------------------------------------- */

typedef struct {
    int stage, width;
    zs__fit_result_t best; /* largest fitting trial (status "" if none) */
    int next_layers;       /* L + 1 */
    char next[128];        /* what L + 1 did: "oom", "host RAM", ... */
    char note[160];
} row_t;

static uint64_t params_of(const zs__fit_opts_t *o, int width, int layers)
{
    zs_gpt_config_t c = {layers, width / o->head_size, width, o->ctx, o->vocab};
    return zs_gpt_num_params(&c);
}

/* Largest L <= max_layers whose host need fits in `avail` (0 if none). */
static int host_cap(const zs__fit_opts_t *o, int stage, int width, uint64_t avail)
{
    int lo = 0, hi = o->max_layers;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (host_need(o, stage, params_of(o, width, mid)) <= avail)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Search L for one (stage, width); fills row. Returns 0, or -1 when the
 * time budget ended the search. Trials: L = 1, L = 2, then up to
 * MAX_GUESSES guesses from the line through the two largest fits' peaks
 * (clamped inside the open interval), then bisection. */
#define MAX_GUESSES 3
static int search(const zs__fit_opts_t *o, int stage, int width, row_t *row)
{
    memset(row, 0, sizeof *row);
    row->stage = stage, row->width = width;
    int lo = 0, hi; /* largest L that fits; smallest L known not to (or not to try) */
    int fitL[MAX_TRIES], nfit = 0, guesses = 0;
    uint64_t fitpeak[MAX_TRIES], cap = 0, lastP = 0;
    double last_wall = 0;
    uint64_t avail = mem_available();
    uint64_t budget = (uint64_t)(o->host_margin * (double)avail);
    int hcap = host_cap(o, stage, width, budget);
    hi = hcap + 1;
    if (hcap < o->max_layers) {
        uint64_t P = params_of(o, width, hcap + 1);
        printf("host RAM: stage %d C=%d: L >= %d (%.3fB params) refused without a trial: "
               "needs ~%.1f GiB of host memory, %.0f%% of MemAvailable %.1f GiB is %.1f GiB\n",
               stage, width, hcap + 1, P / 1e9, host_need(o, stage, P) / GIB, 100 * o->host_margin,
               avail / GIB, budget / GIB);
        snprintf(row->next, sizeof row->next, "host RAM (refused, not run)");
    } else {
        snprintf(row->next, sizeof row->next, "not tried (--max-layers %d)", o->max_layers);
    }
    for (int tries = 0; hi - lo > 1 && tries < MAX_TRIES; tries++) {
        int L = lo + (hi - lo) / 2; /* bisection unless something better */
        if (lo == 0)
            L = 1;
        else if (nfit == 1)
            L = lo + 1;
        else if (guesses < MAX_GUESSES && cap && fitpeak[nfit - 1] > fitpeak[nfit - 2]) {
            double b = (double)(fitpeak[nfit - 1] - fitpeak[nfit - 2]) /
                       (double)(fitL[nfit - 1] - fitL[nfit - 2]);
            double g = fitL[nfit - 1] + ((double)cap - (double)fitpeak[nfit - 1]) / b;
            long guess = g > 1e9 ? 1000000000L : (long)floor(g);
            if (guess <= lo)
                guess = lo + 1; /* the line says lo is the last: check lo + 1 */
            L = (int)(guess < hi ? guess : hi - 1);
            guesses++;
        }
        /* the time budget: a trial of P params takes about last_wall * P / lastP */
        uint64_t P = params_of(o, width, L);
        if (o->time_limit > 0) {
            double left = o->time_limit - elapsed();
            double need = lastP ? last_wall * (P > lastP ? (double)P / (double)lastP : 1.0) : 0;
            if (left <= 0 || need > left) {
                snprintf(row->note, sizeof row->note,
                         "search cut by --time-limit %.0f s before trying L=%d (a trial of that "
                         "size would take ~%.0f s, %.0f s left)",
                         o->time_limit, L, need, left);
                goto cut;
            }
        }
        uint64_t av2 = mem_available();
        if (host_need(o, stage, P) > (uint64_t)(o->host_margin * (double)av2)) {
            printf("host RAM: stage %d C=%d L=%d refused without a trial: needs ~%.1f GiB, "
                   "MemAvailable now %.1f GiB\n",
                   stage, width, L, host_need(o, stage, P) / GIB, av2 / GIB);
            hi = L;
            snprintf(row->next, sizeof row->next, "host RAM (refused, not run)");
            continue;
        }
        zs__fit_result_t r;
        run_trial(o, stage, width, L, o->time_limit > 0 ? o->time_limit : 0, &r);
        progress(stage, &r);
        if (!strcmp(r.status, "crash") || !strcmp(r.status, "error"))
            g_broken++;
        last_wall = r.wall_s, lastP = P;
        if (!strcmp(r.status, "fit")) {
            lo = L;
            row->best = r;
            fitL[nfit] = L, fitpeak[nfit] = r.held_peak, nfit++;
            if (r.dev_cap)
                cap = r.dev_cap;
        } else if (!strcmp(r.status, "oom")) {
            hi = L;
            snprintf(row->next, sizeof row->next, "out of device memory");
        } else if (!strcmp(r.status, "timeout")) {
            snprintf(row->note, sizeof row->note, "trial L=%d killed at the --time-limit", L);
            goto cut;
        } else {
            snprintf(row->note, sizeof row->note, "L=%d: %s: %.100s", L, r.status, r.msg);
            hi = L;
            snprintf(row->next, sizeof row->next, "%s (not out of memory; see the note)", r.status);
            break;
        }
    }
    row->next_layers = hi;
    return 0;
cut: /* what lies between the largest fit and hi was not tried */
    row->next_layers = lo + 1;
    snprintf(row->next, sizeof row->next, "not tried (search cut by --time-limit)");
    return -1;
}

/* ---- output ------------------------------------------------------------------------- */

/* What stopped the search above the best fit, in one word for FIT-BEST's
 * bound=: device (L+1 ran out of device memory), host-ram (refused: the
 * host state would not fit), time (--time-limit cut the search or killed a
 * trial), max-layers, or error (a trial failed otherwise). */
static const char *bound_of(const row_t *w)
{
    if (!strcmp(w->next, "out of device memory"))
        return "device";
    if (!strncmp(w->next, "host RAM", 8))
        return "host-ram";
    if (strstr(w->next, "time-limit") || strstr(w->note, "time-limit"))
        return "time";
    if (strstr(w->next, "max-layers"))
        return "max-layers";
    return "error";
}

static void print_table(const zs__fit_opts_t *o, const char *desc, row_t *rows, int nrows)
{
    printf("\n### Largest GPT that trains on %s with the optimizer on %d zs-servers (W = 1, "
           "T = %d, micro-batch %d, V = %d, head size %d, %s)\n\n",
           desc, o->nservers, o->ctx, o->batch, o->vocab, o->head_size, o->bf16 ? "bf16" : "fp32");
    printf("| configuration | width | layers | params | device peak held (measured) | "
           "params / grads / gathered / comm / activations / scratch peaks | GPU used "
           "(driver) | worker RSS peak | servers RSS peak | tokens/s | L+1 | zs-ctl estimate "
           "(model states, 16-bit) |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nrows; i++) {
        row_t *w = &rows[i];
        const zs__fit_result_t *r = &w->best;
        printf("| %s | %d | ", stage_name(w->stage), w->width);
        if (strcmp(r->status, "fit")) {
            printf("none fits | - | - | - | - | - | - | - | L=%d: %s | - |\n", w->next_layers,
                   w->next[0] ? w->next : w->note);
            continue;
        }
        zs_estimate_t est;
        zs_err_t err;
        int have = zs_estimate(r->params, 1, 1, w->stage, 1, w->stage == 3, &est, &err) == ZS_OK;
        printf("%d | %.3fB | %.3f GiB | ", r->layers, r->params / 1e9, r->held_peak / GIB);
        int cats[6] = {ZS_MEM_PARAMS, ZS_MEM_GRADS,       ZS_MEM_GATHERED,
                       ZS_MEM_COMM,   ZS_MEM_ACTIVATIONS, ZS_MEM_SCRATCH};
        for (int k = 0; k < 6; k++)
            printf("%s%.3f", k ? " / " : "", r->peak[cats[k]] / GIB);
        printf(" GiB | ");
        if (r->gpu_used)
            printf("%.2f GiB", r->gpu_used / GIB);
        else
            printf("-");
        printf(" | %.2f GiB | %.2f GiB | %.0f | L=%d: %s | ", r->rss_hwm / GIB, r->srv_hwm / GIB,
               r->tok_s, w->next_layers, w->next[0] ? w->next : "not tried");
        if (have)
            printf("GPU %.3f GiB, host %.3f GiB |\n", est.gpu_total / GIB, est.host_total / GIB);
        else
            printf("- |\n");
    }
    printf("\nDevice peak held = the allocator's high-water mark of live (+ cached on CUDA) "
           "device bytes (zs_dev_mem); the category peaks do not add up to it (each has its own "
           "moment). RSS = VmHWM. The estimate column is tools/zs_estimate for the same Psi "
           "(16-bit params and grads, model states only: no activations, buffers or the fp32 "
           "compute copies); the measured figures are the claim.\n");
    for (int i = 0; i < nrows; i++)
        if (rows[i].note[0])
            printf("note: stage %d C=%d: %s\n", rows[i].stage, rows[i].width, rows[i].note);
}

int main(int argc, char **argv)
{
    zs__fit_opts_t o;
    if (parse_args(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    if (o.trial)
        return zs__fit_trial(&o);
    t_start = zs_bench_now();
    static char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "bench_fit: readlink /proc/self/exe: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = '\0';
    self_exe = exe;
    char desc[200];
    if (o.cuda) {
#if defined(ZS_WITH_CUDA) && defined(ZS_WITH_NCCL)
        char why[200];
        if (!zs_dev_cuda_available(why, sizeof why)) {
            printf("SKIPPED: %s\n", why);
            return 77;
        }
        snprintf(desc, sizeof desc, "one GPU (cuda:0)%s", o.mem_limit ? ", limited" : "");
        if (o.mem_limit)
            snprintf(desc, sizeof desc, "cuda:0 limited to %.2f GiB", o.mem_limit / GIB);
#else
        printf("SKIPPED: bench_fit was built without CUDA or NCCL\n");
        return 77;
#endif
    } else {
        if (!o.mem_limit) {
            fprintf(stderr, "bench_fit: --device cpu needs --mem-limit BYTES\n");
            return 2;
        }
        snprintf(desc, sizeof desc, "the CPU device limited to %llu bytes (%.2f GiB)",
                 (unsigned long long)o.mem_limit, o.mem_limit / GIB);
    }
    if (access(o.server_bin, X_OK) != 0) {
        fprintf(stderr, "bench_fit: no zs-server at \"%s\" (give --server-bin)\n", o.server_bin);
        return 2;
    }
    printf("bench_fit: %s, widths", desc);
    for (int k = 0; k < o.nwidths; k++)
        printf(" %d", o.widths[k]);
    printf(", T=%d B=%d V=%d, %s, activation checkpointing %s, %d servers x %d threads, "
           "MemAvailable %.1f GiB, time limit %s\n",
           o.ctx, o.batch, o.vocab, o.bf16 ? "bf16" : "fp32",
           o.act_ckpt == 1   ? "on"
           : o.act_ckpt == 2 ? "cpu"
                             : "off",
           o.nservers, o.server_threads, mem_available() / GIB, o.time_limit > 0 ? "set" : "none");
    fflush(stdout);
    row_t rows[2 * FIT_MAX_WIDTHS];
    int nrows = 0, cut = 0;
    /* width outer, stage inner: when the time budget cuts the search, the
     * widths done have both configurations side by side */
    for (int k = 0; k < o.nwidths && !cut; k++)
        for (int s = 0; s < o.nstages && !cut; s++) {
            row_t *w = &rows[nrows++];
            cut = search(&o, o.stages[s], o.widths[k], w) != 0;
            const zs__fit_result_t *b = &w->best;
            int fits = !strcmp(b->status, "fit");
            printf("FIT-BEST stage=%d width=%d layers=%d params=%llu held_peak=%llu next=%d "
                   "next_status=\"%s\"%s device_bytes_per_param=%.3f bound=%s\n",
                   w->stage, w->width, fits ? b->layers : 0, (unsigned long long)b->params,
                   (unsigned long long)b->held_peak, w->next_layers, w->next,
                   cut ? " (search cut)" : "",
                   fits && b->params ? (double)b->held_peak / (double)b->params : 0.0, bound_of(w));
        }
    print_table(&o, desc, rows, nrows);
    printf("\nbench_fit: %.1f s in all%s\n", elapsed(),
           cut ? "; the search was cut by --time-limit (rows after the cut are missing)" : "");
    if (g_broken) { /* a crashed trial says nothing about memory: not a result */
        printf("bench_fit: %d trial(s) crashed or could not start: the table is not a "
               "measurement\n",
               g_broken);
        return 1;
    }
    return 0;
}
