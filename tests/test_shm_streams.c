/*
 * test_shm_streams.c - integration: one Push or Pull over shared memory cut
 * into several concurrent streams per server (zs_client_opts_t.shm_streams,
 * docs/protocol.md "Shared-memory data plane") moves exactly what one
 * stream and what tcp move.
 *
 * Setup: two real zs-servers (shm sockets on), P = 37,748,831 parameters
 * (an odd count: each server's range is about 2.25 pushed messages of bf16
 * and 4.5 of fp32 at the servers' 16 MiB, so pieces end off message
 * boundaries and mid-range), the
 * same initial weights for every run (overwrite).
 * Runs: tcp; shm with 1, 3 and 16 streams per server (16 is more than a
 * range has messages: one piece per message), with the default checksums
 * (pushes); 3 streams checking pulls too; 2 streams without checksums; 3
 * streams with the push checksums computed by the caller (zs_client_push_msgs
 * and zs_client_push_sums, as the engine does), each step first refused
 * once for a wrong sum and once for a missing one. Each run does 3 steps with
 * the synthetic gradients of zs_synth.h (bf16, fp32, fp16 on the wire),
 * pushed from and pulled into the client's shared staging, every Pull in
 * bf16 then the last one also in fp32, and stating `expect` on the pushes
 * so the servers speculate on the pieces as they land.
 * Checks: every shm run has both servers on shm; each pull reports the
 * step it asked for; the pulled bf16 and fp32 parameters and GetState of
 * master, exp_avg and exp_avg_sq equal the tcp run's bitwise. The fp32
 * pull once more through zs_client_pull_each: its reports tile the range
 * once, and each reported range is in dst, right, when it is reported.
 * Does not: time anything (bench/bench_spec.sh does).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_client.h"
#include "zs_hash.h"
#include "zs_proc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define MODEL  "shm-streams"
#define NPARAM 37748831ull
#define STEPS  3

static zs_test_server_t g_srv[2];
static char g_list[256];

typedef struct {
    unsigned char *bf16, *f32; /* the last step's pulls */
    float *state[3];           /* master, exp_avg, exp_avg_sq */
} result_t;

/* Push [0, NPARAM) of `stg` with checksums computed here, as the engine
 * does where it writes the staging (zs_client_push_msgs, then
 * zs_client_push_sums); the message list must tile the range in order, 4
 * MiB at most each. flip: corrupt the last sum; short_by: hand over fewer
 * sums than messages. Returns the push's status. */
static int push_summed(zs_client_t *c, uint64_t step, const void *stg, zs_dtype_t dt,
                       const zs_step_scalars_t *s, int flip, int short_by, zs_err_t *err)
{
    int n = 0;
    TEST_OK(zs_client_push_msgs(c, 0, NPARAM, dt, NULL, 0, &n, err), *err);
    zs_client_msg_t *m = malloc((size_t)n * sizeof *m);
    uint64_t *h = malloc((size_t)n * sizeof *h);
    TEST_CHECK(m && h && n > 2);
    TEST_OK(zs_client_push_msgs(c, 0, NPARAM, dt, m, n, &n, err), *err);
    size_t esz = zs_dtype_size(dt);
    uint64_t next = 0;
    for (int j = 0; j < n; j++) {
        TEST_CHECKF(m[j].begin == next && m[j].count >= 1 && m[j].count * esz <= (16u << 20),
                    "message %d: [%llu, +%llu) after %llu", j, (unsigned long long)m[j].begin,
                    (unsigned long long)m[j].count, (unsigned long long)next);
        next += m[j].count;
        h[j] = zs_hash64((const char *)stg + m[j].begin * esz, m[j].count * esz, step);
    }
    TEST_CHECKF(next == NPARAM, "the messages end at %llu", (unsigned long long)next);
    TEST_CHECKF(m[0].count * esz == (16u << 20),
                "the first message has %llu bytes (want the "
                "servers' shm_chunk_bytes, 16 MiB)",
                (unsigned long long)(m[0].count * esz));
    if (flip)
        h[n - 1] ^= 1;
    int rc = zs_client_push_sums(c, step, 0, NPARAM, stg, dt, s, h, n - short_by, err);
    free(m);
    free(h);
    return rc;
}

/* sums: the options' shm_checksums, or 2: the default, with the push
 * checksums computed by this test (push_summed), after two refused pushes:
 * one sum wrong, one sum short. */
/* zs_client_pull_each's report, checked as it comes (from the client's
 * threads): each range lies in [0, NPARAM), was not reported before, and
 * its elements are in dst already, equal to the plain pull's `want`. */
typedef struct {
    const float *dst, *want;
    unsigned char *seen; /* [NPARAM] */
    _Atomic uint64_t total;
    _Atomic int bad, calls;
} landed_t;

static void on_landed(void *arg, uint64_t b, uint64_t e)
{
    landed_t *l = arg;
    atomic_fetch_add(&l->calls, 1);
    if (b >= e || e > NPARAM) {
        atomic_store(&l->bad, 1);
        return;
    }
    for (uint64_t x = b; x < e; x++)
        if (l->seen[x]++ || memcmp(&l->dst[x], &l->want[x], 4) != 0)
            atomic_store(&l->bad, 1);
    atomic_fetch_add(&l->total, e - b);
}

/* The fp32 pull again, into a zeroed dst, through zs_client_pull_each. */
static void pull_each_check(zs_client_t *c, void *dst, const unsigned char *want, const char *what)
{
    zs_err_t err;
    zs_err_clear(&err);
    landed_t l = {dst, (const float *)want, calloc(NPARAM, 1), 0, 0, 0};
    TEST_CHECK(l.seen);
    memset(dst, 0, NPARAM * 4);
    TEST_OK(zs_client_pull_each(c, STEPS, 0, NPARAM, dst, ZS_DTYPE_F32, on_landed, &l, &err), err);
    TEST_CHECKF(!atomic_load(&l.bad) && atomic_load(&l.total) == NPARAM,
                "%s: pull_each reported %llu of %llu elements in %d calls (bad %d)", what,
                (unsigned long long)atomic_load(&l.total), NPARAM, atomic_load(&l.calls),
                atomic_load(&l.bad));
    TEST_CHECKF(memcmp(dst, want, NPARAM * 4) == 0, "%s: pull_each's data differs", what);
    free(l.seen);
}

static void run(int transport, int streams, int sums, result_t *r)
{
    zs_err_t err;
    zs_err_clear(&err);
    zs_client_opts_t o = {g_list, NULL, NULL, 120000, 0};
    o.transport = transport;
    o.shm_streams = streams;
    o.shm_checksums = sums == 2 ? 0 : sums;
    zs_client_t *c;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    float *w = malloc(NPARAM * 4);
    TEST_CHECK(w);
    for (uint64_t i = 0; i < NPARAM; i++)
        w[i] = zs_synth_weight(i);
    zs_adam_hparams_t hp = zs_synth_hparams();
    TEST_OK(zs_client_init(c, MODEL, NPARAM, &hp, w, 0, 1, &err), err);
    void *stg = w; /* tcp: ordinary memory */
    if (transport == ZS_TRANSPORT_SHM) {
        TEST_OK(zs_client_shm_staging(c, NPARAM * 4, &stg, &err), err);
        for (int i = 0; i < 2; i++)
            TEST_CHECKF(zs_client_transport(c, i, NULL) == ZS_TRANSPORT_SHM,
                        "server %d is not on shm", i);
    }
    float *tmp = malloc(NPARAM * 4);
    TEST_CHECK(tmp);
    for (uint64_t step = 1; step <= STEPS; step++) {
        zs_dtype_t gd = zs_synth_dtype(step);
        zs_synth_grad(step, 0, NPARAM, stg, tmp);
        zs_step_scalars_t s = {step, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
        if (sums == 2) {
            int rc = push_summed(c, step, stg, gd, &s, 1, 0, &err);
            TEST_CHECKF(rc != ZS_OK && strstr(err.msg, "checksum mismatch"),
                        "a wrong checksum: rc %d '%s'", rc, err.msg);
            rc = push_summed(c, step, stg, gd, &s, 0, 1, &err);
            TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "checksums for"),
                        "a missing checksum: rc %d '%s'", rc, err.msg);
            TEST_OK(push_summed(c, step, stg, gd, &s, 0, 0, &err), err);
        } else {
            TEST_OK(zs_client_push_expect(c, step, 0, NPARAM, stg, gd, &s, &err), err);
        }
        TEST_OK(zs_client_commit(c, &s, &err), err);
        uint64_t got = 0;
        TEST_OK(zs_client_pull(c, step, 0, NPARAM, stg, ZS_DTYPE_BF16, &got, &err), err);
        TEST_CHECKF(got == step, "bf16 pull of step %llu reports step %llu",
                    (unsigned long long)step, (unsigned long long)got);
    }
    r->bf16 = malloc(NPARAM * 2);
    r->f32 = malloc(NPARAM * 4);
    TEST_CHECK(r->bf16 && r->f32);
    memcpy(r->bf16, stg, NPARAM * 2);
    uint64_t got = 0;
    TEST_OK(zs_client_pull(c, STEPS, 0, NPARAM, stg, ZS_DTYPE_F32, &got, &err), err);
    TEST_CHECK(got == STEPS);
    memcpy(r->f32, stg, NPARAM * 4);
    pull_each_check(c, stg, r->f32, transport == ZS_TRANSPORT_SHM ? "shm" : "tcp");
    for (int t = 0; t < 3; t++) {
        r->state[t] = malloc(NPARAM * 4);
        TEST_CHECK(r->state[t]);
        TEST_OK(zs_client_get_state(c, t, 0, NPARAM, r->state[t], &err), err);
    }
    zs_client_destroy(c);
    free(tmp);
    free(w);
}

static void same(const result_t *a, const result_t *b, const char *what)
{
    TEST_CHECKF(memcmp(a->bf16, b->bf16, NPARAM * 2) == 0, "%s: bf16 pull differs from tcp", what);
    TEST_CHECKF(memcmp(a->f32, b->f32, NPARAM * 4) == 0, "%s: fp32 pull differs from tcp", what);
    static const char *const names[3] = {"master", "exp_avg", "exp_avg_sq"};
    for (int t = 0; t < 3; t++)
        TEST_CHECKF(memcmp(a->state[t], b->state[t], NPARAM * 4) == 0, "%s: %s differs from tcp",
                    what, names[t]);
}

static void drop(result_t *r)
{
    free(r->bf16);
    free(r->f32);
    for (int t = 0; t < 3; t++)
        free(r->state[t]);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("ZS_LOG_LEVEL", "warn", 0);
    unsetenv("ZS_SHM_STREAMS"); /* the options decide here */
    unsetenv("ZS_SHM_CHECKSUMS");
    const char *tmp = zs_test_tmpdir("shm_streams");
    for (int i = 0; i < 2; i++) {
        snprintf(g_srv[i].data_dir, sizeof g_srv[i].data_dir, "%s/s%d", tmp, i);
        zs_test_server_start(&g_srv[i]);
    }
    zs_test_server_list(g_srv, 2, g_list, sizeof g_list);
    result_t ref;
    run(ZS_TRANSPORT_TCP, 0, 0, &ref);
    printf("tcp: %d steps of %llu parameters (bf16, fp32, fp16 gradients)\n", STEPS,
           (unsigned long long)NPARAM);
    /* streams per server; checksums: 0 pushes (the default), 1 both ways,
     * -1 none */
    static const int streams[] = {1, 3, 16, 3, 2, 3}, sums[] = {0, 0, 0, 1, -1, 2};
    static const char *const sname[] = {"no checksums", "pushes checked",
                                        "pushes and pulls checked",
                                        "pushes checked with the caller's sums"};
    for (int k = 0; k < 6; k++) {
        result_t r;
        char what[96];
        snprintf(what, sizeof what, "shm, %d stream(s) per server, %s", streams[k],
                 sname[sums[k] + 1]);
        run(ZS_TRANSPORT_SHM, streams[k], sums[k], &r);
        same(&r, &ref, what);
        drop(&r);
        printf("%s: pulls (bf16, fp32) and master / exp_avg / exp_avg_sq == tcp, bitwise\n", what);
    }
    /* the option's bounds */
    zs_client_opts_t o = {g_list, NULL, NULL, 1000, 0};
    o.shm_streams = ZS_CLIENT_SHM_STREAMS_MAX + 1;
    zs_client_t *c = NULL;
    zs_err_t err;
    zs_err_clear(&err);
    int rc = zs_client_create(&o, &c, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "shm_streams"),
                "shm_streams %d: rc %d '%s'", o.shm_streams, rc, err.msg);
    printf("shm_streams %d refused: %s\n", o.shm_streams, err.msg);
    drop(&ref);
    for (int i = 0; i < 2; i++)
        zs_test_server_stop(&g_srv[i], SIGTERM);
    printf("PASS test_shm_streams\n");
    return 0;
}
