/*
 * zs_proc.h - process helpers for integration tests: temp dirs that are
 * removed at exit, real zs-server processes on 127.0.0.1 with ports picked
 * free at run time, shell commands (zs-tokenize, zs-train under mpirun)
 * and finding a test's own processes by command line.
 *
 * Every server started here dies with the test (PR_SET_PDEATHSIG) and is
 * also killed by an atexit handler; every temp dir is removed at exit.
 * Helpers that cannot do their job stop the test (exit 1) with a FAIL line.
 */
#ifndef ZS_PROC_H
#define ZS_PROC_H

#include <stddef.h>
#include <sys/types.h>

/* mpirun options every integration test passes (root in containers, more
 * ranks than cores, no pinning on a shared machine). */
#define ZS_TEST_MPI_OPTS "--allow-run-as-root --oversubscribe --bind-to none"

/* A shell command printing the demo corpus: every file of
 * /usr/share/common-licenses, sorted (use inside "$(...)"). */
#define ZS_TEST_LICENCES "find /usr/share/common-licenses -maxdepth 1 -type f | sort"

typedef struct zs_test_server {
    pid_t pid;
    char addr[64]; /* "127.0.0.1:PORT" once started */
    char data_dir[256];
    char extra[256]; /* extra flags, space-separated (e.g. "--keep 3") */
} zs_test_server_t;

/* mkdtemp("/tmp/zs-<tag>-XXXXXX"); removed (rm -rf) at exit unless ZS_TEST_KEEP
 * is set in the environment. Returns a static
 * copy owned by the harness. Exits the test on failure. */
const char *zs_test_tmpdir(const char *tag);

/* Start zs-server on s->addr if set (restart on the same port), else on
 * 127.0.0.1:0, with --data s->data_dir; waits until it serves (<= 20 s).
 * The binary is $ZS_SERVER_BIN when set (prebuilt binaries run away from
 * their build tree, tests/gpu.sh), else the build tree's. Exits the test
 * on failure. */
void zs_test_server_start(zs_test_server_t *s);

/* Send `sig` and reap. SIGKILL: immediate; SIGTERM: graceful (waits). */
void zs_test_server_stop(zs_test_server_t *s, int sig);

/* "a,b,..." from n servers into buf. */
void zs_test_server_list(const zs_test_server_t *s, int n, char *buf, size_t len);

/* Start n fresh servers with empty data dirs DIR/TAG0 .. DIR/TAG<n-1> and
 * the extra flags `extra` (e.g. "--keep 3"); their list into list. */
void zs_test_servers_up(zs_test_server_t *s, int n, const char *dir, const char *tag,
                        const char *extra, char *list, size_t cap);

/* Stop n servers with SIGTERM (graceful) and reap them. */
void zs_test_servers_down(zs_test_server_t *s, int n);

/* Run the printf-formatted command with /bin/sh (system()); returns its
 * exit code, 128 when it did not exit normally. At most 4095 bytes. */
int zs_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run the printf-formatted command with its stdout and stderr to `log`;
 * when it exits non-zero print "FAIL: <command> exited <code>" and the
 * log's last 30 lines, and stop the test. */
void zs_test_run_ok(const char *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* `tokenizer -o out FILES` (FILES: shell words, e.g.
 * "$(" ZS_TEST_LICENCES ")"), its output to tok.log beside `out`; stops the
 * test when it fails. */
void zs_test_tokenize(const char *tokenizer, const char *out, const char *files);

/* Up to max pids (into pids) of the processes whose command line (argv
 * joined by spaces) begins with `prog` and holds `tag`; returns how many. */
int zs_test_find_procs(const char *prog, const char *tag, pid_t *pids, int max);

/* A tmpfs of size_mib MiB on a fresh /tmp/zs-<tag>-XXXXXX (needs root and
 * CAP_SYS_ADMIN), unmounted at exit or by zs_test_tmpfs_unmount. Returns
 * its path (static, owned by the harness) or NULL where it cannot be
 * mounted: the caller skips, saying so. One at a time. */
const char *zs_test_tmpfs_mount(const char *tag, int size_mib);
void zs_test_tmpfs_unmount(void);

/* Free MiB of the file system holding path (exits the test on failure). */
double zs_test_free_mib(const char *path);

/* Append to path until the disk is full, down to the last byte (a few free
 * KiB would take RocksDB's log lines); returns the file's size in bytes. */
off_t zs_test_fill_disk(const char *path);

/* Loss of `step` from a zs-train CSV (its first two columns: step, loss);
 * NAN if the step is absent or the file unreadable. */
double zs_test_csv_loss(const char *csv, int step);

#endif
