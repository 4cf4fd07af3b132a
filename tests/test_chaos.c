/*
 * test_chaos.c - a training run that survives kill -9s of servers and
 * workers, and ends where an undisturbed run ends.
 *
 *  1. Reference: zs-train, 2 shard servers, 2 MPI workers, a small GPT,
 *     200 steps with a checkpoint every 10; final parameters saved.
 *  1b. The same job without a launcher, one server killed after step 15 and
 *     restarted: zs-train must recover by itself and end bitwise equal.
 *  1c. 1b with both servers on their NVMe tier (zs-server --nvme-path,
 *     offload_optimizer.device "nvme"): the kill -9 lands while the killed
 *     server's state is in its tile files; its restart on the same
 *     directory rebuilds from the newest complete checkpoint, and the run
 *     ends bitwise equal to the reference (RAM servers).
 *  2. Chaos: the same job under zs-launch (--max-restarts), while this test
 *     sends 20 kill -9s at random times (fixed seed) to a random shard
 *     server (restarted on its address after a random pause: the role of
 *     systemd or Kubernetes) or a random zs-train worker (mpirun ends, the
 *     launcher reruns the job with --resume-auto). A lost server is waited
 *     for and recovered from inside zs-train (zs_engine_recover).
 *  1b, 1c and 2 run with speculative updates on the servers (super_offload),
 *  the reference without: the kills land mid-speculation too. The
 *  reference moves its bytes over TCP, 1b, 1c and 2 over the shared-memory
 *  data plane (--transport shm), so a worker or server killed mid-step over
 *  shm recovers bitwise onto the TCP run.
 *  The job must finish by itself, with final parameters bitwise equal to
 *  the reference, the CSV listing each step once, and the newest checkpoint
 *  complete on both servers never going backwards (sampled after each kill:
 *  no complete checkpoint is lost).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zs_proc.h"
#include "zs_test.h"

#define KILLS 20
#define STEPS 200

static char g_tmp[200], g_data[300];

/* Two fresh servers (data dirs g_tmp/TAG0, TAG1, --keep 2); list into `list`. */
static void start_servers(zs_test_server_t *srv, const char *tag, char *list, size_t n)
{
    zs_test_servers_up(srv, 2, g_tmp, tag, "--keep 2", list, n);
}

/* zs-train's embedded default config with speculative updates on the
 * servers (offload_optimizer.super_offload, issue 18): the disturbed runs
 * use it, the reference does not, so the kills also land mid-speculation
 * and the result must still equal plain commits bitwise. */
static char g_spec_config[300], g_nvme_config[300];

/* nvme: offload_optimizer.device "nvme" (every server must have its NVMe
 * tier), else "cpu". */
static void write_spec_config(char *path, size_t n, int nvme)
{
    snprintf(path, n, "%s/%s.json", g_tmp, nvme ? "nvme" : "spec");
    FILE *f = fopen(path, "w");
    TEST_CHECK(f);
    fprintf(f,
            "{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 4,"
            " \"gradient_clipping\": 1.0,"
            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001,"
            " \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.1}},"
            " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,"
            " \"warmup_max_lr\": 0.001, \"warmup_num_steps\": 20, \"warmup_type\": \"linear\"}},"
            " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"%s\","
            " \"super_offload\": true}}}\n",
            nvme ? "nvme" : "cpu");
    TEST_CHECK(fclose(f) == 0);
}

/* The zs-train arguments the runs share; spec: 1 with g_spec_config, 2 with
 * g_nvme_config. The reference (spec 0) moves its bytes over TCP, the
 * disturbed runs over shared memory (--transport shm: refused unless every
 * server takes the segment, again after each restart), so the kills also
 * show shm == tcp, bitwise. */
static void train_args(char *buf, size_t n, const char *servers, const char *params,
                       const char *csv, int spec)
{
    snprintf(buf, n,
             "%s --data %s --servers %s --layers 2 --heads 4 --width 64 --ctx 64 --steps %d "
             "--ckpt-every 10 --log-every 50 --server-timeout 10 --server-wait 60 "
             "--max-recoveries 40 --save-params %s --csv %s --transport %s%s%s",
             ZS_TRAIN, g_data, servers, STEPS, params, csv, spec ? "shm" : "tcp",
             spec ? " --config " : "",
             spec == 2 ? g_nvme_config
             : spec    ? g_spec_config
                       : "");
}

/* pid of a random zs-train process of this test (its args name `tag`), or
 * 0 when none runs (the launcher is between runs). */
static pid_t random_worker(const char *tag, unsigned *seed)
{
    pid_t found[16];
    int n = zs_test_find_procs(ZS_TRAIN, tag, found, 16);
    return n ? found[rand_r(seed) % n] : 0;
}

/* Newest checkpoint complete on both servers (0: none or unreachable). */
static unsigned long long newest_complete(const char *servers)
{
    char cmd[600], line[512];
    snprintf(cmd, sizeof cmd, "%s --servers %s checkpoints 2>/dev/null", ZS_CTL, servers);
    FILE *p = popen(cmd, "r");
    unsigned long long newest = 0;
    while (p && fgets(line, sizeof line, p)) {
        char *colon = strchr(line, ':');
        for (char *t = colon ? strtok(colon + 1, " \n") : NULL; t; t = strtok(NULL, " \n"))
            newest = strtoull(t, NULL, 10);
    }
    if (p)
        pclose(p);
    return newest;
}

static int csv_rows_unique(const char *path, int *rows)
{
    FILE *f = fopen(path, "r");
    char line[512];
    static char seen[STEPS + 1];
    memset(seen, 0, sizeof seen);
    int ok = f != NULL, n = 0;
    while (f && fgets(line, sizeof line, f)) {
        long s = strtol(line, NULL, 10);
        if (s < 1)
            continue; /* header */
        if (s > STEPS || seen[s])
            ok = 0;
        else
            seen[s] = 1;
        n++;
    }
    if (f)
        fclose(f);
    *rows = n;
    return ok;
}

/* 1b / 1c: the job without a launcher, server 1 killed (kill -9) once the
 * CSV shows step 15 and restarted 1 s later on the same address (and, nvme,
 * the same --nvme-path): zs-train must recover by itself and end bitwise
 * equal to the reference. nvme: both servers keep the optimizer state on
 * their NVMe tier, and the config asks for it (offload_optimizer.device
 * "nvme"), so a restarted server without the tier would be refused. */
static void lost_server(const char *tag, int nvme, const char *ref_bin)
{
    zs_test_server_t one[2];
    char servers[256], args[2048], bin[300], csv[300], olog[300], cmd1[4096];
    if (nvme) {
        for (int i = 0; i < 2; i++) {
            memset(&one[i], 0, sizeof one[i]);
            snprintf(one[i].data_dir, sizeof one[i].data_dir, "%s/%s%d", g_tmp, tag, i);
            snprintf(one[i].extra, sizeof one[i].extra, "--keep 2 --nvme-path %s/%s%d-tiles", g_tmp,
                     tag, i);
            zs_test_server_start(&one[i]);
        }
        zs_test_server_list(one, 2, servers, sizeof servers);
    } else {
        start_servers(one, tag, servers, sizeof servers);
    }
    snprintf(bin, sizeof bin, "%s/%s.bin", g_tmp, tag);
    snprintf(csv, sizeof csv, "%s/%s.csv", g_tmp, tag);
    snprintf(olog, sizeof olog, "%s/%s.log", g_tmp, tag);
    train_args(args, sizeof args, servers, bin, csv, nvme ? 2 : 1);
    snprintf(cmd1, sizeof cmd1, "exec %s " ZS_TEST_MPI_OPTS " -np 2 %s > %s 2>&1", ZS_MPIEXEC, args,
             olog);
    time_t t0 = time(NULL);
    pid_t job = fork();
    TEST_CHECK(job >= 0);
    if (job == 0) {
        execl("/bin/sh", "sh", "-c", cmd1, (char *)NULL);
        _exit(127);
    }
    int rows = 0; /* after checkpoint 10: the kill lands in training */
    for (int i = 0; i < 600 && rows < 15; i++) {
        usleep(50000);
        csv_rows_unique(csv, &rows);
    }
    TEST_CHECKF(rows >= 15, "zs-train did not reach step 15 (see %s)", olog);
    zs_test_server_stop(&one[1], SIGKILL);
    usleep(1000000);
    zs_test_server_start(&one[1]);
    int st1;
    TEST_CHECK(waitpid(job, &st1, 0) == job);
    TEST_CHECKF(WIFEXITED(st1) && WEXITSTATUS(st1) == 0,
                "zs-train did not survive a lost %sserver by itself (status %d), see %s",
                nvme ? "NVMe-tier " : "", st1, olog);
    TEST_CHECKF(zs_test_sh("grep -q 'recovered: rolled back to step' %s", olog) == 0,
                "no in-job recovery logged in %s", olog);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", ref_bin, bin) == 0,
                "after one in-job recovery%s the parameters differ from the undisturbed run",
                nvme ? " of an NVMe-tier server" : "");
    printf("1%s. %sserver killed at step >= %d, restarted 1 s later: zs-train recovered by "
           "itself, parameters bitwise equal (%ld s)\n",
           nvme ? "c" : "b", nvme ? "NVMe-tier (--nvme-path) " : "", rows, (long)(time(NULL) - t0));
    zs_test_servers_down(one, 2);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("chaos"));
    snprintf(g_data, sizeof g_data, "%s/corpus.tok", g_tmp);
    zs_test_tokenize(ZS_TOKENIZE, g_data, "$(" ZS_TEST_LICENCES ")");
    setenv("ZS_LOG_LEVEL", "warn", 1);
    write_spec_config(g_spec_config, sizeof g_spec_config, 0);
    write_spec_config(g_nvme_config, sizeof g_nvme_config, 1);

    /* 1. the undisturbed run */
    zs_test_server_t ref[2];
    char servers[256], args[2048], ref_bin[300], ref_csv[300];
    start_servers(ref, "ref", servers, sizeof servers);
    snprintf(ref_bin, sizeof ref_bin, "%s/ref.bin", g_tmp);
    snprintf(ref_csv, sizeof ref_csv, "%s/ref.csv", g_tmp);
    train_args(args, sizeof args, servers, ref_bin, ref_csv, 0);
    time_t t0 = time(NULL);
    int rc =
        zs_test_sh("%s " ZS_TEST_MPI_OPTS " -np 2 %s > %s/ref.log 2>&1", ZS_MPIEXEC, args, g_tmp);
    TEST_CHECKF(rc == 0, "reference run failed (exit %d), see %s/ref.log", rc, g_tmp);
    printf("1. reference: %d steps, 2 servers, 2 workers in %ld s\n", STEPS,
           (long)(time(NULL) - t0));
    zs_test_servers_down(ref, 2);

    /* 1b. one server lost mid-run, no launcher: zs-train alone must recover
     * (zs-launch would otherwise hide a broken recovery behind reruns) */
    lost_server("one", 0, ref_bin);
    /* 1c. the same with both servers on their NVMe tier (--nvme-path): the
     * killed server's tile files are left behind mid-step, its restart
     * rebuilds from the newest complete checkpoint */
    lost_server("nvme", 1, ref_bin);

    /* 2. the same job under kill -9s */
    zs_test_server_t srv[2];
    char chaos_bin[300], chaos_csv[300], log[300];
    start_servers(srv, "chaos", servers, sizeof servers);
    snprintf(chaos_bin, sizeof chaos_bin, "%s/chaos.bin", g_tmp);
    snprintf(chaos_csv, sizeof chaos_csv, "%s/chaos.csv", g_tmp);
    snprintf(log, sizeof log, "%s/chaos.log", g_tmp);
    train_args(args, sizeof args, servers, chaos_bin, chaos_csv, 1);
    char cmd[4096];
    snprintf(
        cmd, sizeof cmd,
        "ZS_LOG_LEVEL=info exec %s --max-restarts %d --np 2 --backoff 200 --mpirun %s --mpirun-arg "
        "--allow-run-as-root --mpirun-arg --oversubscribe --mpirun-arg --bind-to "
        "--mpirun-arg none -- %s > %s 2>&1",
        ZS_LAUNCH, KILLS + 10, ZS_MPIEXEC, args, log);
    pid_t launcher = fork();
    TEST_CHECK(launcher >= 0);
    if (launcher == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    unsigned seed = 20261123u;
    int kills = 0, server_kills = 0, worker_kills = 0, done = 0, status = 0;
    unsigned long long newest = 0;
    t0 = time(NULL);
    while (kills < KILLS && !done) {
        usleep((useconds_t)(300000 + rand_r(&seed) % 900000)); /* 0.3 .. 1.2 s */
        if (waitpid(launcher, &status, WNOHANG) == launcher) {
            done = 1;
            break;
        }
        pid_t w = rand_r(&seed) % 2 ? random_worker(chaos_csv, &seed) : 0;
        if (w > 0) {
            kill(w, SIGKILL);
            worker_kills++;
            printf("  kill %2d: worker pid %d\n", kills + 1, (int)w);
        } else {
            int i = (int)(rand_r(&seed) % 2);
            zs_test_server_stop(&srv[i], SIGKILL);
            usleep((useconds_t)(200000 + rand_r(&seed) % 1300000)); /* back after 0.2 .. 1.5 s */
            zs_test_server_start(&srv[i]);
            server_kills++;
            printf("  kill %2d: server %s (restarted)\n", kills + 1, srv[i].addr);
        }
        kills++;
        unsigned long long now = newest_complete(servers);
        if (now) {
            TEST_CHECKF(now >= newest,
                        "the newest complete checkpoint went back from %llu to %llu: lost", newest,
                        now);
            newest = now;
        }
    }
    if (!done)
        while (waitpid(launcher, &status, 0) < 0)
            ;
    long secs = (long)(time(NULL) - t0);
    zs_test_sh("grep -E 'zs-launch|recovered|recovering' %s | sed 's/^/    /' | tail -n 12", log);
    TEST_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the job did not finish by itself (status %d), see %s", status, log);
    printf("2. %d kill -9s (%d servers, %d workers); the job finished by itself in %ld s\n", kills,
           server_kills, worker_kills, secs);
    TEST_CHECKF(kills == KILLS, "the job finished before all %d kills (%d sent): too fast to test",
                KILLS, kills);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", ref_bin, chaos_bin) == 0,
                "final parameters differ from the undisturbed run");
    printf("   final parameters bitwise equal to the undisturbed run\n");
    int rows = 0;
    TEST_CHECKF(csv_rows_unique(chaos_csv, &rows) && rows == STEPS,
                "the CSV must list each of %d steps once (%d rows)", STEPS, rows);
    unsigned long long last = newest_complete(servers);
    TEST_CHECKF(last == STEPS, "newest complete checkpoint at the end is %llu, not %d", last,
                STEPS);
    printf("   CSV lists each step once; newest complete checkpoint never went back (%llu)\n",
           last);
    zs_test_servers_down(srv, 2);
    printf("PASS test_chaos\n");
    return 0;
}
