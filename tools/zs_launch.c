/*
 * zs_launch.c - zs-launch: a supervisor for zs-train jobs, in the spirit of
 * torchrun's --max-restarts. It runs
 *
 *     MPIRUN -np W [mpirun args] ZS_TRAIN [args]
 *
 * and when that exits with an error (a worker was killed, a host lost, a
 * lost server that did not come back in time) runs it again with
 * --resume-auto added, so the job continues from the newest checkpoint
 * complete on every shard server, up to --max-restarts times. After
 * --shrink-after consecutive failures at the same world size it drops one
 * worker (down to --min-np): a host that keeps failing is left out, and the
 * servers' state, being partitioned by parameter range, resumes with any W.
 *
 *   zs-launch [--max-restarts N] [--np W] [--min-np M] [--shrink-after K]
 *             [--mpirun PATH] [--mpirun-arg ARG]... [--backoff MS]
 *             -- ZS_TRAIN [zs-train args]
 *
 * A run that exits with zs-train's command-line, configuration, data or
 * no-GPU status (2, 3, 4, 6: see zs-train --help) is not rerun: the same
 * input would fail the same way. SIGINT/SIGTERM are forwarded to mpirun and end the
 * supervision. Exit status: 0 when a run finished, else the last run's
 * status (128 + signal for a signal). Does not restart shard servers: systemd, Kubernetes, Slurm
 * or a person does that (zs-train waits for them, see --server-wait).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 256

static volatile sig_atomic_t g_stop;
static volatile pid_t g_child;

static void on_signal(int sig)
{
    g_stop = sig;
    if (g_child > 0)
        kill(g_child, sig);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-launch [--max-restarts N] [--np W] [--min-np M] [--shrink-after K]\n"
               "                 [--mpirun PATH] [--mpirun-arg ARG]... [--backoff MS]\n"
               "                 -- ZS_TRAIN [zs-train args]\n"
               "\n"
               "  --max-restarts N  reruns after a failed run (default 3)\n"
               "  --np W            workers (default 2)\n"
               "  --min-np M        fewest workers after shrinking (default: W, no shrinking)\n"
               "  --shrink-after K  consecutive failures at one size before dropping a worker\n"
               "                    (default 2)\n"
               "  --mpirun PATH     the launcher (default mpirun)\n"
               "  --mpirun-arg ARG  one extra launcher argument (repeat for more)\n"
               "  --backoff MS      pause before a rerun (default 1000)\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run argv; returns its exit status (128 + signal when killed), or 127. */
static int run(char **argv)
{
    pid_t pid = fork();
    if (pid < 0) {
        perror("zs-launch: fork");
        return 127;
    }
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "zs-launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    g_child = pid;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    g_child = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 127;
}

int main(int argc, char **argv)
{
    int max_restarts = 3, np = 2, min_np = 0, shrink_after = 2, backoff_ms = 1000;
    const char *mpirun = "mpirun";
    const char *margs[MAX_ARGS];
    int nm = 0, i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "zs-launch: %s needs a value\n", k);
            return 2;
        }
        i++;
        if (!strcmp(k, "--max-restarts"))
            max_restarts = atoi(v);
        else if (!strcmp(k, "--np"))
            np = atoi(v);
        else if (!strcmp(k, "--min-np"))
            min_np = atoi(v);
        else if (!strcmp(k, "--shrink-after"))
            shrink_after = atoi(v);
        else if (!strcmp(k, "--mpirun"))
            mpirun = v;
        else if (!strcmp(k, "--backoff"))
            backoff_ms = atoi(v);
        else if (!strcmp(k, "--mpirun-arg") && nm < MAX_ARGS / 2)
            margs[nm++] = v;
        else {
            fprintf(stderr, "zs-launch: unknown flag %s\n\n", k);
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc - 1) {
        fprintf(stderr, "zs-launch: nothing to run (put the trainer after --)\n\n");
        usage(stderr);
        return 2;
    }
    char **train = argv + i + 1;
    int ntrain = argc - i - 1;
    if (min_np <= 0 || min_np > np)
        min_np = np;
    if (max_restarts < 0 || np < 1 || shrink_after < 1 || backoff_ms < 0 ||
        ntrain + nm + 8 > MAX_ARGS) {
        fprintf(stderr, "zs-launch: bad --max-restarts, --np, --shrink-after or --backoff\n");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int status = 0, fails_here = 0;
    for (int attempt = 0; attempt <= max_restarts && !g_stop; attempt++) {
        char *cmd[MAX_ARGS + 1], npbuf[16];
        int n = 0, resume_given = 0;
        snprintf(npbuf, sizeof npbuf, "%d", np);
        cmd[n++] = (char *)mpirun;
        cmd[n++] = "-np";
        cmd[n++] = npbuf;
        for (int k = 0; k < nm; k++)
            cmd[n++] = (char *)margs[k];
        for (int k = 0; k < ntrain; k++) {
            resume_given |= !strcmp(train[k], "--resume") || !strcmp(train[k], "--resume-auto");
            cmd[n++] = train[k];
        }
        if (attempt > 0 && !resume_given)
            cmd[n++] = "--resume-auto";
        cmd[n] = NULL;
        fprintf(stderr, "zs-launch: run %d of at most %d with %d workers%s\n", attempt + 1,
                max_restarts + 1, np, attempt > 0 ? " (resuming)" : "");
        double t0 = now_s();
        status = run(cmd);
        if (status == 0) {
            if (attempt > 0)
                fprintf(stderr, "zs-launch: finished after %d restart%s\n", attempt,
                        attempt == 1 ? "" : "s");
            return 0;
        }
        fprintf(stderr, "zs-launch: run %d exited with status %d after %.1f s\n", attempt + 1,
                status, now_s() - t0);
        if ((status >= 2 && status <= 4) || status == 6) {
            fprintf(stderr,
                    "zs-launch: status %d is a command-line, configuration, data or "
                    "no-GPU error of zs-train: not rerunning\n",
                    status);
            return status;
        }
        if (++fails_here >= shrink_after && np > min_np) {
            np--;
            fails_here = 0;
            fprintf(stderr, "zs-launch: dropping to %d workers\n", np);
        }
        if (attempt < max_restarts && !g_stop)
            usleep((useconds_t)backoff_ms * 1000);
    }
    fprintf(stderr, "zs-launch: giving up%s (last status %d)\n",
            g_stop ? " on a signal" : " after the last restart", status);
    return status ? status : 1;
}
