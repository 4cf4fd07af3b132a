/*
 * zs_proc.h - process helpers for integration tests: temp dirs that are
 * removed at exit, and real zs-server processes on 127.0.0.1 with ports
 * picked free at run time.
 *
 * Every server started here dies with the test (PR_SET_PDEATHSIG) and is
 * also killed by an atexit handler; every temp dir is removed at exit.
 */
#ifndef ZS_PROC_H
#define ZS_PROC_H

#include <sys/types.h>

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

#endif
