/*
 * zs_proc.c - temp dirs, zs-server processes, shell commands and process
 * lookup for tests (see zs_proc.h).
 */
#define _GNU_SOURCE
#include "zs_proc.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TRACK 32

static char g_dirs[MAX_TRACK][256];
static int g_ndirs;
static pid_t g_pids[MAX_TRACK];
static int g_registered;
static pid_t g_owner; /* only the process that created them cleans up */

static void cleanup(void)
{
    if (getpid() != g_owner)
        return;
    for (int i = 0; i < MAX_TRACK; i++)
        if (g_pids[i] > 0) {
            kill(g_pids[i], SIGKILL);
            waitpid(g_pids[i], NULL, 0);
            g_pids[i] = 0;
        }
    if (getenv("ZS_TEST_KEEP")) { /* debugging a failure: keep logs and data */
        for (int i = 0; i < g_ndirs; i++)
            fprintf(stderr, "kept %s (ZS_TEST_KEEP)\n", g_dirs[i]);
        return;
    }
    for (int i = 0; i < g_ndirs; i++) {
        char cmd[8300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dirs[i]);
        if (system(cmd) != 0)
            fprintf(stderr, "warning: could not remove %s\n", g_dirs[i]);
    }
}

static void on_signal(int sig)
{
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void ensure_registered(void)
{
    if (!g_registered) {
        g_registered = 1;
        g_owner = getpid();
        atexit(cleanup);
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
    }
}

const char *zs_test_tmpdir(const char *tag)
{
    ensure_registered();
    if (g_ndirs == MAX_TRACK) {
        fprintf(stderr, "FAIL: too many temp dirs\n");
        exit(1);
    }
    char *d = g_dirs[g_ndirs];
    snprintf(d, 256, "/tmp/zs-%s-XXXXXX", tag);
    if (!mkdtemp(d)) {
        fprintf(stderr, "FAIL: mkdtemp %s: %s\n", d, strerror(errno));
        exit(1);
    }
    g_ndirs++;
    return d;
}

static void track(pid_t pid, int add)
{
    for (int i = 0; i < MAX_TRACK; i++)
        if (add ? g_pids[i] == 0 : g_pids[i] == pid) {
            g_pids[i] = add ? pid : 0;
            return;
        }
}

void zs_test_server_start(zs_test_server_t *s)
{
    ensure_registered();
    char ready[300], listen[64], bin[512];
    snprintf(ready, sizeof ready, "%s.ready", s->data_dir);
    unlink(ready);
    snprintf(listen, sizeof listen, "%s", s->addr[0] ? s->addr : "127.0.0.1:0");
    const char *env = getenv("ZS_SERVER_BIN"); /* prebuilt binaries elsewhere (tests/gpu.sh) */
    if (env && *env)
        snprintf(bin, sizeof bin, "%s", env);
    else
        snprintf(bin, sizeof bin, "%s/server/zs-server", ZS_BINARY_DIR);
    char *argv[32];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--listen";
    argv[n++] = listen;
    argv[n++] = "--data";
    argv[n++] = s->data_dir;
    argv[n++] = "--ready-file";
    argv[n++] = ready;
    argv[n++] = "--threads";
    argv[n++] = "2";
    char extra[256];
    snprintf(extra, sizeof extra, "%s", s->extra);
    for (char *tok = strtok(extra, " "); tok && n < 30; tok = strtok(NULL, " "))
        argv[n++] = tok;
    argv[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        execv(bin, argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    if (pid < 0) {
        fprintf(stderr, "FAIL: fork: %s\n", strerror(errno));
        exit(1);
    }
    track(pid, 1);
    s->pid = pid;
    for (int i = 0; i < 400; i++) { /* 20 s */
        FILE *f = fopen(ready, "r");
        if (f) {
            char line[64] = "";
            if (fgets(line, sizeof line, f))
                line[strcspn(line, "\n")] = '\0';
            fclose(f);
            if (line[0]) {
                snprintf(s->addr, sizeof s->addr, "%s", line);
                return;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            track(pid, 0);
            fprintf(stderr, "FAIL: zs-server exited during start (status %d)\n", st);
            exit(1);
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "FAIL: zs-server did not start within 20 s\n");
    exit(1);
}

void zs_test_server_stop(zs_test_server_t *s, int sig)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, sig);
    waitpid(s->pid, NULL, 0);
    track(s->pid, 0);
    s->pid = 0;
}

void zs_test_server_list(const zs_test_server_t *s, int n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "," : "", s[i].addr);
}

void zs_test_servers_up(zs_test_server_t *s, int n, const char *dir, const char *tag,
                        const char *extra, char *list, size_t cap)
{
    for (int i = 0; i < n; i++) {
        memset(&s[i], 0, sizeof s[i]);
        snprintf(s[i].data_dir, sizeof s[i].data_dir, "%s/%s%d", dir, tag, i);
        snprintf(s[i].extra, sizeof s[i].extra, "%s", extra);
        zs_test_server_start(&s[i]);
    }
    zs_test_server_list(s, n, list, cap);
}

void zs_test_servers_down(zs_test_server_t *s, int n)
{
    for (int i = 0; i < n; i++)
        zs_test_server_stop(&s[i], SIGTERM);
}

int zs_test_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

void zs_test_run_ok(const char *log, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = zs_test_sh("%s > %s 2>&1", cmd, log);
    if (rc) {
        fprintf(stderr, "FAIL: %s exited %d; log %s:\n", cmd, rc, log);
        zs_test_sh("tail -n 30 %s >&2", log);
        exit(1);
    }
}

void zs_test_tokenize(const char *tokenizer, const char *out, const char *files)
{
    const char *slash = strrchr(out, '/');
    int dirlen = slash ? (int)(slash - out) : 1;
    const char *dir = slash ? out : ".";
    if (zs_test_sh("%s -o %s %s > %.*s/tok.log 2>&1", tokenizer, out, files, dirlen, dir) != 0) {
        fprintf(stderr, "FAIL: %s -o %s %s failed; log %.*s/tok.log\n", tokenizer, out, files,
                dirlen, dir);
        exit(1);
    }
}

int zs_test_find_procs(const char *prog, const char *tag, pid_t *pids, int max)
{
    int n = 0;
    size_t plen = strlen(prog);
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d)) && n < max) {
        char path[300], cmd[4096];
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        size_t len = fread(cmd, 1, sizeof cmd - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (cmd[i] == 0)
                cmd[i] = ' ';
        cmd[len] = 0;
        if (strncmp(cmd, prog, plen) == 0 && strstr(cmd, tag))
            pids[n++] = pid;
    }
    if (d)
        closedir(d);
    return n;
}

/* ---- a small full-able disk ---------------------------------------------- */

static char g_mnt[64];

void zs_test_tmpfs_unmount(void)
{
    if (!g_mnt[0])
        return;
    char cmd[200];
    snprintf(cmd, sizeof cmd, "umount -l '%s' 2>/dev/null; rmdir '%s' 2>/dev/null", g_mnt, g_mnt);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not unmount %s\n", g_mnt);
    g_mnt[0] = '\0';
}

const char *zs_test_tmpfs_mount(const char *tag, int size_mib)
{
    static int registered;
    snprintf(g_mnt, sizeof g_mnt, "/tmp/zs-%s-XXXXXX", tag);
    if (!mkdtemp(g_mnt)) {
        g_mnt[0] = '\0';
        return NULL;
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=%dm zs-%s '%s' 2>/dev/null", size_mib, tag,
             g_mnt);
    if (system(cmd) != 0) {
        rmdir(g_mnt);
        g_mnt[0] = '\0';
        return NULL;
    }
    if (!registered++)
        atexit(zs_test_tmpfs_unmount);
    return g_mnt;
}

double zs_test_free_mib(const char *path)
{
    struct statvfs v;
    if (statvfs(path, &v) != 0) {
        perror(path);
        exit(1);
    }
    return (double)v.f_bavail * (double)v.f_frsize / (1 << 20);
}

off_t zs_test_fill_disk(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    static char block[1 << 16];
    for (size_t bs = sizeof block; bs >= 1; bs /= 2)
        while (write(fd, block, bs) > 0)
            ;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || close(fd) != 0) {
        perror(path);
        exit(1);
    }
    return sb.st_size;
}

double zs_test_csv_loss(const char *csv, int step)
{
    FILE *f = fopen(csv, "r");
    char line[512];
    double loss = NAN;
    while (f && fgets(line, sizeof line, f)) {
        int s;
        double l;
        if (sscanf(line, "%d,%lf,", &s, &l) == 2 && s == step)
            loss = l;
    }
    if (f)
        fclose(f);
    return loss;
}
