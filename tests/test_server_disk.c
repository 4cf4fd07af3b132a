/*
 * test_server_disk.c - integration: a zs-server whose data dir fills up,
 * then has room again (issue 9, item 1).
 *
 * Setup: a 128 MiB tmpfs (skipped, with a SKIPPED line and exit 77, where it
 * cannot be mounted: needs root and CAP_SYS_ADMIN), one real zs-server on it,
 * P = 1M fp32 parameters (12 MiB per checkpoint). Step 1, checkpoint 1.
 * Then the disk is filled by another file and:
 *  - step 2 is pushed and committed (the state lives in memory), and
 *    Checkpoint 2 fails with RESOURCE_EXHAUSTED naming "No space";
 *  - Hello answers and says store_degraded with that message, the
 *    checkpoint list is still {1}, and the server is still alive 11 s later
 *    (RocksDB's background retries logged into a full disk used to abort it);
 *  - Checkpoint 2 again, disk still full: RESOURCE_EXHAUSTED "disk full";
 *  - the filler shrinks to leave 40 MiB free (less than the 64 MiB RocksDB's
 *    own recovery waits for): Checkpoint 2 now succeeds, Hello is healthy,
 *    the list is {1, 2}, DeleteCheckpoints 1 works;
 *  - a graceful restart resumes from checkpoint 2, whose GetState equals the
 *    state before the restart bitwise.
 * Does not: test disks that fail in other ways (EIO).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_proc.h"
#include "zs_rpc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define NPARAM 1048576ull
#define MODEL  "disk-full"
#define TMO_MS 30000

/* Hello's store fields, read with a raw call (the client library's
 * zs_server_info_t does not carry them). */
static void hello_store(grpc_channel *ch, const char *addr, int *degraded, char *why, size_t cap)
{
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    Zeroshard__HelloReply *r = NULL;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_unary(ch, "/zeroshard.Shard/Hello", NULL, TMO_MS, addr, &q.base,
                     &zeroshard__hello_reply__descriptor, (ProtobufCMessage **)&r, &err),
            err);
    *degraded = r->store_degraded;
    snprintf(why, cap, "%s", r->store_error ? r->store_error : "");
    zeroshard__hello_reply__free_unpacked(r, NULL);
}

static void run_step(zs_client_t *c, uint64_t step, void *grad, float *tmp)
{
    zs_err_t err;
    zs_err_clear(&err);
    zs_synth_grad(step, 0, NPARAM, grad, tmp);
    TEST_OK(zs_client_push(c, step, 0, NPARAM, grad, zs_synth_dtype(step), &err), err);
    zs_step_scalars_t s = {step, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
    TEST_OK(zs_client_commit(c, &s, &err), err);
}

static void expect_list(zs_client_t *c, size_t n, uint64_t a, uint64_t b)
{
    uint64_t steps[8];
    size_t got = 0;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_checkpoints(c, steps, 8, &got, &err), err);
    TEST_CHECKF(got == n && (n < 1 || steps[0] == a) && (n < 2 || steps[1] == b),
                "checkpoints: %zu listed, want %zu", got, n);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *g_mnt = zs_test_tmpfs_mount("srvdisk", 128);
    char filler[160];
    if (!g_mnt) {
        printf("SKIPPED test_server_disk: cannot mount a tmpfs here (needs root and "
               "CAP_SYS_ADMIN)\n");
        return 77;
    }
    snprintf(filler, sizeof filler, "%s/filler", g_mnt);

    zs_test_server_t srv;
    memset(&srv, 0, sizeof srv);
    snprintf(srv.data_dir, sizeof srv.data_dir, "%s/s0", g_mnt);
    zs_test_server_start(&srv);
    zs_client_opts_t o = {srv.addr, NULL, NULL, TMO_MS, 0};
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(&o, &c, &err), err);
    grpc_channel *ch = zs_channel_create(srv.addr, NULL);
    float *buf = malloc(NPARAM * 4), *tmp = malloc(NPARAM * 4), *before = malloc(NPARAM * 4);
    TEST_CHECK(buf && tmp && before);
    for (uint64_t i = 0; i < NPARAM; i++)
        buf[i] = zs_synth_weight(i);
    zs_adam_hparams_t hp = zs_synth_hparams();
    TEST_OK(zs_client_init(c, MODEL, NPARAM, &hp, buf, 0, 0, &err), err);
    run_step(c, 1, buf, tmp);
    TEST_OK(zs_client_checkpoint(c, 1, 0, &err), err);
    int degraded;
    char why[ZS_ERR_MSG_MAX];
    hello_store(ch, srv.addr, &degraded, why, sizeof why);
    TEST_CHECK(!degraded && why[0] == '\0');

    off_t fsize = zs_test_fill_disk(filler);
    printf("disk full: %.1f MiB free\n", zs_test_free_mib(g_mnt));
    run_step(c, 2, buf, tmp);
    int rc = zs_client_checkpoint(c, 2, 0, &err);
    printf("checkpoint 2 on a full disk: %s: %s\n", zs_status_name(rc), err.msg);
    TEST_CHECK(zs_status_to_grpc(rc) == GRPC_STATUS_RESOURCE_EXHAUSTED &&
               strstr(err.msg, "No space"));
    hello_store(ch, srv.addr, &degraded, why, sizeof why);
    printf("Hello: store_degraded %d: %s\n", degraded, why);
    TEST_CHECK(degraded && strstr(why, "No space"));
    expect_list(c, 1, 1, 0);
    zs_test_fill_disk(filler); /* RocksDB dropped its partial table file */
    sleep(11);                 /* two of RocksDB's 5 s recovery attempts, logged */
    fsize = zs_test_fill_disk(filler);
    zs_err_clear(&err);
    rc = zs_client_checkpoint(c, 2, 0, &err);
    printf("again, disk still full: %s: %s\n", zs_status_name(rc), err.msg);
    TEST_CHECK(zs_status_to_grpc(rc) == GRPC_STATUS_RESOURCE_EXHAUSTED &&
               strstr(err.msg, "disk full"));
    hello_store(ch, srv.addr, &degraded, why, sizeof why);
    TEST_CHECK(degraded);

    TEST_CHECK(truncate(filler, fsize - (off_t)(40 << 20)) == 0);
    printf("filler shrunk: %.1f MiB free\n", zs_test_free_mib(g_mnt));
    zs_err_clear(&err);
    TEST_OK(zs_client_checkpoint(c, 2, 0, &err), err);
    hello_store(ch, srv.addr, &degraded, why, sizeof why);
    TEST_CHECKF(!degraded && why[0] == '\0', "still degraded: %s", why);
    expect_list(c, 2, 1, 2);
    TEST_OK(zs_client_delete(c, 1, 0, &err), err);
    expect_list(c, 1, 2, 0);
    printf("checkpoint 2 written once there was room; store healthy again\n");

    TEST_OK(zs_client_get_state(c, 0, 0, NPARAM, before, &err), err);
    zs_test_server_stop(&srv, SIGTERM);
    zs_test_server_start(&srv);
    zs_server_info_t in;
    TEST_OK(zs_client_hello(c, MODEL, NPARAM, &in, &err), err);
    TEST_CHECK(in.applied_step == 2);
    TEST_OK(zs_client_get_state(c, 0, 0, NPARAM, buf, &err), err);
    TEST_CHECK(memcmp(buf, before, NPARAM * 4) == 0);
    printf("restart resumed from checkpoint 2, bitwise\n");

    grpc_channel_destroy(ch);
    zs_client_destroy(c);
    zs_test_server_stop(&srv, SIGTERM);
    free(buf);
    free(tmp);
    free(before);
    zs_test_tmpfs_unmount();
    printf("PASS test_server_disk\n");
    return 0;
}
