/*
 * test_launch.c - zs-launch's supervision rules (tools/zs_launch.c), with a
 * stand-in launcher: a shell script given as --mpirun that appends its
 * command line to a file and exits with the status the test asks for, run
 * by run (FAKE_STATUS="1 1 0": the first run exits 1, the second 1, the
 * third 0). No MPI, no zs-train: what is checked is what zs-launch runs and
 * when it stops.
 *
 *   1. success at once: one run, exit 0, no --resume-auto;
 *   2. a crash (1) then success: two runs, the second with --resume-auto,
 *      exit 0; a --resume given by the user is not doubled;
 *   3. zs-train's command-line, config, data and no-GPU statuses (2, 3, 4,
 *      6): one run each, that status back, "not rerunning";
 *   4. always failing: 1 + --max-restarts runs, the last status back;
 *   5. shrinking: --np 3 --min-np 1 --shrink-after 2 runs with 3, 3, 2, 2,
 *      1, 1 workers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_proc.h"
#include "zs_test.h"

static char g_tmp[200], g_fake[300], g_calls[300];

/* zs-launch with the fake launcher, which exits with the statuses in
 * `statuses` (space-separated, one per run; the last repeats). Returns
 * zs-launch's exit status; the runs' command lines are in g_calls. */
static int launch(const char *statuses, const char *opts, const char *train_args)
{
    zs_test_sh("rm -f %s %s.n", g_calls, g_calls);
    return zs_test_sh("FAKE_STATUS='%s' FAKE_CALLS=%s %s --mpirun %s --backoff 0 %s -- zs-train %s "
                      "> %s/launch.log 2>&1",
                      statuses, g_calls, ZS_LAUNCH, g_fake, opts, train_args, g_tmp);
}

/* Line i (0-based) of g_calls into buf; 0 if there is none. */
static int call(int i, char *buf, size_t n)
{
    FILE *f = fopen(g_calls, "r");
    int k = 0, got = 0;
    while (f && fgets(buf, (int)n, f))
        if (k++ == i) {
            got = 1;
            break;
        }
    if (f)
        fclose(f);
    if (got)
        buf[strcspn(buf, "\n")] = '\0';
    return got;
}

static int ncalls(void)
{
    char line[1024];
    int n = 0;
    while (call(n, line, sizeof line))
        n++;
    return n;
}

static int log_has(const char *what)
{
    return zs_test_sh("grep -qF -- '%s' %s/launch.log", what, g_tmp) == 0;
}

int main(void)
{
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("launch"));
    snprintf(g_fake, sizeof g_fake, "%s/fake-mpirun", g_tmp);
    snprintf(g_calls, sizeof g_calls, "%s/calls", g_tmp);
    FILE *f = fopen(g_fake, "w");
    TEST_CHECK(f != NULL);
    /* run k (counted in $FAKE_CALLS.n) exits with the k-th word of
     * $FAKE_STATUS, or the last one */
    fputs("#!/bin/sh\n"
          "echo \"$*\" >> \"$FAKE_CALLS\"\n"
          "k=$(cat \"$FAKE_CALLS.n\" 2>/dev/null || echo 0)\n"
          "echo $((k + 1)) > \"$FAKE_CALLS.n\"\n"
          "set -- $FAKE_STATUS\n"
          "s=1\n"
          "i=0\n"
          "for w in \"$@\"; do s=$w; [ $i -eq \"$k\" ] && break; i=$((i + 1)); done\n"
          "exit \"$s\"\n",
          f);
    TEST_CHECK(fclose(f) == 0);
    TEST_CHECK(zs_test_sh("chmod +x %s", g_fake) == 0);
    char line[1024];

    /* 1. */
    TEST_CHECK(launch("0", "--np 2", "--data x.tok") == 0);
    TEST_CHECKF(ncalls() == 1, "success: %d runs", ncalls());
    TEST_CHECK(call(0, line, sizeof line) && !strcmp(line, "-np 2 zs-train --data x.tok"));
    printf("ok: a run that succeeds is run once: '%s'\n", line);

    /* 2. */
    TEST_CHECK(launch("1 0", "--np 2", "--data x.tok") == 0);
    TEST_CHECKF(ncalls() == 2, "crash then success: %d runs", ncalls());
    TEST_CHECK(call(1, line, sizeof line) &&
               !strcmp(line, "-np 2 zs-train --data x.tok --resume-auto"));
    TEST_CHECK(log_has("finished after 1 restart"));
    TEST_CHECK(launch("1 0", "--np 2", "--data x.tok --resume") == 0);
    TEST_CHECK(call(1, line, sizeof line) && !strcmp(line, "-np 2 zs-train --data x.tok --resume"));
    printf("ok: after a crash the rerun adds --resume-auto (not when --resume is given)\n");

    /* 3. */
    const int fatal[4] = {2, 3, 4, 6};
    for (int i = 0; i < 4; i++) {
        char st[8];
        snprintf(st, sizeof st, "%d", fatal[i]);
        int rc = launch(st, "--np 2 --max-restarts 5", "--data x.tok");
        TEST_CHECKF(rc == fatal[i] && ncalls() == 1 && log_has("not rerunning"),
                    "status %d: zs-launch exit %d after %d runs (want %d after 1, 'not "
                    "rerunning')",
                    fatal[i], rc, ncalls(), fatal[i]);
    }
    printf("ok: statuses 2, 3, 4, 6 are not rerun, and come back as zs-launch's status\n");

    /* 4. */
    int rc = launch("5", "--np 2 --max-restarts 3", "--data x.tok");
    TEST_CHECKF(rc == 5 && ncalls() == 4 && log_has("giving up after the last restart"),
                "always failing: exit %d after %d runs (want 5 after 4)", rc, ncalls());
    printf("ok: a run that keeps failing is rerun --max-restarts times, then its status\n");

    /* 5. */
    rc = launch("1", "--np 3 --min-np 1 --shrink-after 2 --max-restarts 5", "--data x.tok");
    const char *np[6] = {"-np 3 ", "-np 3 ", "-np 2 ", "-np 2 ", "-np 1 ", "-np 1 "};
    TEST_CHECKF(rc == 1 && ncalls() == 6, "shrinking: exit %d after %d runs", rc, ncalls());
    for (int i = 0; i < 6; i++)
        TEST_CHECKF(call(i, line, sizeof line) && !strncmp(line, np[i], strlen(np[i])),
                    "run %d: '%s', want it to start with '%s'", i + 1, line, np[i]);
    printf("ok: --shrink-after 2 --min-np 1 drops a worker every 2 failures: 3 3 2 2 1 1\n");
    zs_test_sh("rm -rf %s", g_tmp);
    printf("test_launch: ok\n");
    return 0;
}
