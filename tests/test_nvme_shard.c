/*
 * test_nvme_shard.c - the NVMe tier of the shard (zs-server --nvme-path;
 * server/zs_nvme.h, zs_shard_nvme.c), driven directly (no gRPC) beside a
 * RAM shard fed the same calls.
 *
 * The shards are server 1 of 2 for P = 700001 (350000 elements: 5 tiles and
 * a short one, the range not starting at 0), 2 optimizer threads, and an
 * NVMe depth of 4 so the pass wraps its buffers many times.
 *
 *  1. Equality: 9 steps cycling gradient dtypes fp32/bf16/fp16 and pull
 *     dtypes fp32/bf16/fp16, with a clipped and a skipped step: every pull
 *     (whole range, and one across a tile boundary) and p, m, v after every
 *     step are bitwise those of the RAM shard. SetState across a tile
 *     boundary, then a step: still equal.
 *  2. Checkpoints: a checkpoint of the NVMe shard, two more steps, Restore:
 *     == the RAM shard's state at the checkpoint, bitwise; reopening the
 *     directories (a new shard: the old tile file is removed, the state
 *     rebuilt from RocksDB) gives it again, and a step after it equals the
 *     RAM shard's.
 *  3. Memory: with a budget below the RAM state (22 B/element) but above
 *     the NVMe one (2 B/element + buffers), Initialize is refused in RAM
 *     and accepted with the tier; mem_reserved stays within the budget.
 *     Then a state of 12 B/element = 4x its budget (--mem-budget 3
 *     B/element) is initialized, pushed in 1M-element chunks (16 M
 *     elements), committed and pulled within that budget, and again at 8x
 *     (1.5 B/element: no room for the 16-bit copy, pulls cast the tiles'
 *     master weights; the same bits as the first), and the process's resident memory
 *     (VmRSS, the kernel's count, not the budget's formula) grows by less
 *     than the budget + 8 MiB (what the budget does not see: arenas,
 *     stacks): gradients are staged on the drive, not in RAM. The tier's
 *     totals (read, written, gradient bytes, passes) match the I/O made.
 *  4. Refusals: a directory on tmpfs (/dev/shm) is refused naming tmpfs,
 *     and accepted with nvme_buffered; a second shard on the same directory
 *     is refused (ALREADY_EXISTS, "in use by another zs-server").
 *  5. A corrupted tile (a byte of exp_avg of tile 2 flipped in both slots):
 *     the next step fails, its pull fails naming the tile and the checksum
 *     (never updated with it), GetState and Checkpoint are refused; a restart
 *     resumes from the newest checkpoint, bitwise. Then a staged gradient
 *     span corrupted on the drive between Push and Commit: the pass fails
 *     naming the tile's staged gradient and its checksum, and a restart
 *     resumes bitwise again.
 *  6. Speculation (spec_window 1 GiB on the NVMe shard, none on the RAM
 *     one): pushes stating the expected scalars; once every chunk is
 *     speculated (written aside on the drive), Commit keeps it (steps 1, 2,
 *     4, 6), rolls it back (step 3 clips), restores it (step 5 is skipped),
 *     or a GetState cancels it first (step 6: it reads the committed state):
 *     pulls and p, m, v bitwise the RAM shard's after every step, and the
 *     counters show the kept and rolled-back steps.
 *  9. Staging on the drive (after 5): pushes through streams in chunks
 *     that cut tiles (merged on the drive), a refused stream over staged
 *     elements, and a re-push of staged elements with other values (staged
 *     at the stream's end); then steps pushed by two threads at once, each
 *     a stream of every other 10007-element chunk (tiles shared, merged
 *     under the tile's lock): pulls and p, m, v bitwise the RAM shard's.
 *  8. Without io_uring (ZS_NVME_TEST_NO_URING=1: the synchronous pass of a
 *     container that refuses io_uring), with speculation: 4 steps, one
 *     clipped, bitwise the RAM shard's.
 *  7. Disk full, on a 32 MiB ext4 mounted from a loop device (needs root
 *     and losetup; skipped, saying why, without): a state that does not
 *     fit is refused at Initialize (RESOURCE_EXHAUSTED, "no room"), the
 *     installed state and step stay bitwise as they were, and training
 *     goes on.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "zs_cast.h"
#include "zs_layout.h"
#include "zs_log.h"
#include "zs_proc.h"
#include "zs_shard_internal.h" /* sh->st.nv: to corrupt a tile */
#include "zs_synth.h"
#include "zs_test.h"

#define P     700001ull
#define S     2u
#define INDEX 1u
#define MODEL "nvme-model"

static uint64_t g_rb, g_re, g_n;
static zs_adam_hparams_t g_hp;
static char g_tmp[256];

static uint64_t g_spec_window; /* for the next open_shard */

static zs_shard_t *open_shard(const char *tag, int nvme, uint64_t budget, int buffered,
                              const char *nvme_dir, int *rc_out, zs_err_t *err)
{
    char data[400], nv[400];
    snprintf(data, sizeof data, "%s/%s-data", g_tmp, tag);
    snprintf(nv, sizeof nv, "%s", nvme_dir ? nvme_dir : "");
    if (!nvme_dir)
        snprintf(nv, sizeof nv, "%s/%s-nvme", g_tmp, tag);
    zs_shard_opts_t o = {data, 2, 3, tag, budget, g_spec_window, nvme ? nv : NULL, buffered, 4};
    zs_shard_t *sh = NULL;
    zs_err_clear(err);
    int rc = zs_shard_create(&o, &sh, err);
    if (rc_out)
        *rc_out = rc;
    else
        TEST_OK(rc, *err);
    return sh;
}

/* Initialize as server `index` of `ns` for `np` parameters. */
static int init_as(zs_shard_t *sh, uint64_t np, uint32_t ns, uint32_t index, zs_err_t *err)
{
    zs_shard_identity_t id = {MODEL, np, ns, index};
    zs_shard_init_t *in;
    int rc = zs_shard_init_begin(sh, &id, &g_hp, 0, 0, &in, err);
    if (rc)
        return rc;
    uint64_t rb = zs_layout_begin(np, ns, index), re = zs_layout_begin(np, ns, index + 1);
    /* chunks of 100000 elements: tiles are filled across calls */
    for (uint64_t o = rb; o < re; o += 100000) {
        uint64_t k = re - o < 100000 ? re - o : 100000;
        float *dst;
        rc = zs_shard_init_reserve(in, o, k, &dst, err);
        if (rc) {
            zs_shard_init_abort(in);
            return rc;
        }
        for (uint64_t i = 0; i < k; i++)
            dst[i] = zs_synth_weight(o + i);
    }
    return zs_shard_init_end(in, err);
}

static int init(zs_shard_t *sh, zs_err_t *err)
{
    return init_as(sh, P, S, INDEX, err);
}

static void push(zs_shard_t *sh, uint64_t step)
{
    zs_err_t err;
    float *tmp = malloc(g_n * 4);
    void *dst;
    TEST_CHECK(tmp);
    TEST_OK(zs_shard_push_reserve(sh, step, g_rb, g_n, zs_synth_dtype(step), &dst, &err), err);
    zs_synth_grad(step, g_rb, g_re, dst, tmp);
    zs_shard_push_done(sh, step, g_rb, g_n, 1);
    free(tmp);
}

static const zs_dtype_t pdts[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};

static zs_commit_t commit_of(uint64_t step)
{
    zs_commit_t c = {step, 0.5f, step == 4 ? 0.25f : 1.0f, 1e-3f, step == 6, pdts[step % 3]};
    return c;
}

static int step_shard(zs_shard_t *sh, uint64_t step, zs_err_t *err)
{
    push(sh, step);
    zs_commit_t c = commit_of(step);
    uint64_t a, o;
    return zs_shard_commit(sh, &c, &a, &o, err);
}

/* Pull [off, off+cnt) at min_step in dt into a malloc'd buffer. */
static void *pull(zs_shard_t *sh, uint64_t step, uint64_t off, uint64_t cnt, zs_dtype_t dt, int *rc,
                  zs_err_t *err)
{
    void *b = malloc(cnt * 4);
    uint64_t got;
    TEST_CHECK(b);
    *rc = zs_shard_pull(sh, step, off, cnt, dt, b, zs_now_ms() + 20000, NULL, NULL, &got, err);
    return b;
}

static void same_pull(zs_shard_t *a, zs_shard_t *b, uint64_t step, uint64_t off, uint64_t cnt,
                      zs_dtype_t dt, const char *what)
{
    zs_err_t e1, e2;
    int r1, r2;
    void *x = pull(a, step, off, cnt, dt, &r1, &e1), *y = pull(b, step, off, cnt, dt, &r2, &e2);
    TEST_OK(r1, e1);
    TEST_OK(r2, e2);
    TEST_CHECKF(memcmp(x, y, cnt * zs_dtype_size(dt)) == 0, "%s: %s pull of step %llu differs",
                what, zs_dtype_name(dt), (unsigned long long)step);
    free(x);
    free(y);
}

static void same_state(zs_shard_t *a, zs_shard_t *b, const char *what)
{
    zs_err_t err;
    float *x = malloc(g_n * 4), *y = malloc(g_n * 4);
    TEST_CHECK(x && y);
    for (int t = 0; t < 3; t++) {
        uint64_t s1, s2;
        TEST_OK(zs_shard_get_state(a, (zs_tensor_t)t, g_rb, g_n, x, &s1, &err), err);
        TEST_OK(zs_shard_get_state(b, (zs_tensor_t)t, g_rb, g_n, y, &s2, &err), err);
        size_t i = 0;
        while (i < g_n && memcmp(&x[i], &y[i], 4) == 0)
            i++;
        TEST_CHECKF(i == g_n && s1 == s2,
                    "%s: tensor %d differs at %zu (%.9g vs %.9g), steps %llu %llu", what, t, i,
                    i < g_n ? x[i] : 0.0, i < g_n ? y[i] : 0.0, (unsigned long long)s1,
                    (unsigned long long)s2);
    }
    free(x);
    free(y);
}

static void equality(zs_shard_t *ram, zs_shard_t *nv)
{
    zs_err_t err;
    printf("1. NVMe tier == RAM, bitwise\n");
    same_state(ram, nv, "after Initialize");
    same_pull(ram, nv, 0, g_rb, g_n, ZS_DTYPE_BF16, "after Initialize");
    for (uint64_t s = 1; s <= 9; s++) {
        TEST_OK(step_shard(ram, s, &err), err);
        TEST_OK(step_shard(nv, s, &err), err);
        for (int d = 0; d < 3; d++) {
            same_pull(ram, nv, s, g_rb, g_n, pdts[d], "whole range");
            same_pull(ram, nv, s, g_rb + ZS_OPT_CHUNK - 100, 300, pdts[d], "across a tile");
        }
        same_state(ram, nv, "after a step");
    }
    printf("  9 steps (grads fp32/bf16/fp16, pulls fp32/bf16/fp16, a clipped and a skipped "
           "step): pulls and p, m, v bitwise equal\n");
    float *src = malloc(1000 * 4);
    TEST_CHECK(src);
    for (int i = 0; i < 1000; i++)
        src[i] = 0.001f * (float)i;
    uint64_t off = g_rb + 2 * ZS_OPT_CHUNK - 500;
    for (int t = 0; t < 3; t += 2) {
        TEST_OK(zs_shard_set_state(ram, (zs_tensor_t)t, off, 1000, src, &err), err);
        TEST_OK(zs_shard_set_state(nv, (zs_tensor_t)t, off, 1000, src, &err), err);
    }
    free(src);
    same_state(ram, nv, "after SetState across a tile");
    TEST_OK(step_shard(ram, 10, &err), err);
    TEST_OK(step_shard(nv, 10, &err), err);
    same_state(ram, nv, "a step after SetState");
    printf("  SetState across a tile boundary, then a step: bitwise equal\n");
}

static void checkpoints(zs_shard_t *ram, zs_shard_t **nvp)
{
    zs_err_t err;
    double sec;
    zs_shard_t *nv = *nvp;
    printf("2. checkpoints of the NVMe tier\n");
    TEST_OK(zs_shard_checkpoint(ram, 10, 0, &sec, &err), err);
    TEST_OK(zs_shard_checkpoint(nv, 10, 0, &sec, &err), err);
    printf("  checkpoint of %llu elements from the tiles: %.3f s\n", (unsigned long long)g_n, sec);
    TEST_OK(step_shard(nv, 11, &err), err);
    TEST_OK(step_shard(nv, 12, &err), err);
    TEST_OK(zs_shard_restore(nv, 10, &err), err);
    same_state(ram, nv, "Restore of checkpoint 10");
    printf("  two more steps, Restore 10: == RAM at 10, bitwise\n");
    zs_shard_destroy(nv);
    nv = *nvp = open_shard("n", 1, 0, 0, NULL, NULL, &err);
    same_state(ram, nv, "reopened");
    TEST_OK(step_shard(ram, 11, &err), err);
    TEST_OK(step_shard(nv, 11, &err), err);
    same_state(ram, nv, "a step after reopening");
    same_pull(ram, nv, 11, g_rb, g_n, pdts[11 % 3], "after reopening");
    printf("  reopened (state rebuilt from RocksDB into a new tile file): == RAM, and a step "
           "after it\n");
}

/* Resident memory of this process now (VmRSS), bytes. */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %" SCNu64, &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

#define BIG_N 16000000ull /* 16 M elements: 192 MB of p, m, v */

/* A state of BIG_N elements trained one step within `budget` (its 16-bit
 * copy in RAM iff `lowp`), staged on the drive; returns its bf16 pull of
 * the whole range (malloc'd). */
static uint16_t *big_state(const char *tag, uint64_t budget, int lowp)
{
    const uint64_t n = BIG_N, chunk = 1000000;
    zs_err_t err;
    /* the test's buffers, touched before the baseline: not counted */
    float *tmp = malloc(chunk * 4);
    uint16_t *g = malloc(n * 2);
    TEST_CHECK(g && tmp);
    memset(g, 0xff, n * 2); /* not 0: malloc + memset 0 may become calloc, untouched */
    memset(tmp, 0xff, chunk * 4);
    uint64_t rss0 = rss_bytes();
    zs_shard_t *sh = open_shard(tag, 1, budget, 0, NULL, NULL, &err);
    TEST_OK(init_as(sh, n, 1, 0, &err), err);
    for (uint64_t o = 0; o < n; o += chunk) {
        void *dst;
        TEST_OK(zs_shard_push_reserve(sh, 1, o, chunk, ZS_DTYPE_F32, &dst, &err), err);
        zs_synth_grad(1, o, o + chunk, dst, tmp);
        zs_shard_push_done(sh, 1, o, chunk, 1);
    }
    zs_commit_t c = {1, 1.0f, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
    uint64_t a, os;
    TEST_OK(zs_shard_commit(sh, &c, &a, &os, &err), err);
    uint64_t got;
    TEST_OK(
        zs_shard_pull(sh, 1, 0, n, ZS_DTYPE_BF16, g, zs_now_ms() + 60000, NULL, NULL, &got, &err),
        err);
    zs_shard_info_t in;
    for (int i = 0; i < 600; i++) { /* the pass ends after the pull's chunks landed */
        TEST_OK(zs_shard_info(sh, &in, &err), err);
        free(in.checkpoints);
        if (in.counters.nvme_passes > 0)
            break;
        usleep(50000);
    }
    /* The tier's totals (zs-server --metrics): every chunk wrote the
     * gradient spans of the tiles it touches (fp32: 4 B/element, padded to
     * 4 KiB); one pass read every tile slot and gradient span. */
    const zs_shard_counters_t *k = &in.counters;
    uint64_t gw = 0, ntiles = (n + ZS_NVME_TILE - 1) / ZS_NVME_TILE;
    for (uint64_t o = 0; o < n; o += chunk)
        for (uint64_t t = o / ZS_NVME_TILE; t <= (o + chunk - 1) / ZS_NVME_TILE; t++) {
            uint64_t len =
                (n - t * ZS_NVME_TILE < ZS_NVME_TILE ? n - t * ZS_NVME_TILE : ZS_NVME_TILE) * 4;
            gw += (len + ZS_NVME_ALIGN - 1) / ZS_NVME_ALIGN * ZS_NVME_ALIGN;
        }
    TEST_CHECKF(k->nvme_grad_written_bytes == gw && k->nvme_passes == 1 &&
                    k->nvme_pass_seconds > 0 &&
                    k->nvme_read_bytes >= ntiles * ZS_NVME_SLOT + n * 4 &&
                    k->nvme_written_bytes >= gw + 2 * ntiles * ZS_NVME_SLOT,
                "%s: tier totals: gradients written %llu (want %llu), passes %llu, %.3f s, read "
                "%llu, written %llu",
                tag, (unsigned long long)k->nvme_grad_written_bytes, (unsigned long long)gw,
                (unsigned long long)k->nvme_passes, k->nvme_pass_seconds,
                (unsigned long long)k->nvme_read_bytes, (unsigned long long)k->nvme_written_bytes);
    printf("  tier totals: %.1f MB read, %.1f MB written (%.1f MB of it gradients), 1 pass of "
           "%.3f s (%.3f s waiting for I/O)\n",
           k->nvme_read_bytes / 1e6, k->nvme_written_bytes / 1e6, k->nvme_grad_written_bytes / 1e6,
           k->nvme_pass_seconds, k->nvme_io_wait_seconds);
    uint64_t grew = rss_bytes() - rss0;
    /* The budget does not see the allocator's arenas, threads' stacks or
     * RocksDB (zs_budget.h): 8 MiB for them. Staging in RAM would be 128 MB. */
    TEST_CHECKF(in.mem_reserved <= budget && grew < budget + (8u << 20) &&
                    (in.mem_state >= 2 * n) == !!lowp,
                "%s: reserved %llu, resident memory grew %llu, budget %llu, state %llu (16-bit "
                "copy in RAM: want %d)",
                tag, (unsigned long long)in.mem_reserved, (unsigned long long)grew,
                (unsigned long long)budget, (unsigned long long)in.mem_state, lowp);
    printf("  state %.0f MB = %.1fx a budget of %.0f MB (16-bit copy %s): initialized, pushed, "
           "committed, pulled; %.1f MB reserved, resident memory grew %.1f MB\n",
           12.0 * (double)n / 1e6, 12.0 * (double)n / (double)budget, budget / 1e6,
           lowp ? "in RAM" : "none: pulls read the tiles", in.mem_reserved / 1e6, grew / 1e6);
    free(tmp);
    zs_shard_destroy(sh);
    return g;
}

/* 4x the budget with the 16-bit copy in RAM; 8x without it (pulls cast
 * the master weights read from the tiles): the same pulled bits. */
static void four_x(void)
{
    uint16_t *a = big_state("m4", 3 * BIG_N, 1);
    uint16_t *b = big_state("m8", 3 * BIG_N / 2, 0);
    TEST_CHECKF(memcmp(a, b, BIG_N * 2) == 0, "pulls with and without the 16-bit copy differ");
    printf("  bf16 pulls with and without the 16-bit copy: bitwise equal\n");
    free(a);
    free(b);
}

static void memory(void)
{
    printf("3. memory budget\n");
    const uint64_t n = 3000000;                    /* one server: 3 M elements */
    uint64_t budget = zs_shard_state_bytes(n) - n; /* below RAM's 22 B/element */
    zs_err_t err;
    zs_shard_t *r = open_shard("mr", 0, budget, 0, NULL, NULL, &err);
    int rc = init_as(r, n, 1, 0, &err);
    TEST_CHECKF(rc == ZS_ERR_NOMEM, "RAM init within %llu bytes: %d %s", (unsigned long long)budget,
                rc, err.msg);
    zs_shard_destroy(r);
    zs_shard_t *nv = open_shard("mn", 1, budget, 0, NULL, NULL, &err);
    TEST_OK(init_as(nv, n, 1, 0, &err), err);
    zs_shard_info_t in;
    TEST_OK(zs_shard_info(nv, &in, &err), err);
    free(in.checkpoints);
    TEST_CHECKF(in.nvme && in.mem_reserved <= budget && in.mem_state < 11 * n,
                "nvme %d, reserved %llu of %llu, state %llu", in.nvme,
                (unsigned long long)in.mem_reserved, (unsigned long long)budget,
                (unsigned long long)in.mem_state);
    printf("  budget %.1f MB (RAM state needs %.1f MB): RAM refused; NVMe holds %.1f MB of "
           "state (%.1f B/element), %.1f MB reserved in all\n",
           budget / 1e6, zs_shard_state_bytes(n) / 1e6, in.mem_state / 1e6,
           (double)in.mem_state / (double)n, in.mem_reserved / 1e6);
    zs_shard_destroy(nv);
    four_x();
}

static void refusals(void)
{
    zs_err_t err;
    int rc;
    printf("4. refusals\n");
    char shm[300];
    snprintf(shm, sizeof shm, "/dev/shm/zs-nvme-test-%ld", (long)getpid());
    zs_shard_t *t = open_shard("t1", 1, 0, 0, shm, &rc, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && !t && strstr(err.msg, "tmpfs") &&
                    strstr(err.msg, "--nvme-buffered"),
                "tmpfs: %d %s", rc, err.msg);
    printf("  tmpfs refused: %s\n", err.msg);
    t = open_shard("t2", 1, 0, 1, shm, NULL, &err);
    TEST_OK(init(t, &err), err);
    TEST_OK(step_shard(t, 1, &err), err);
    printf("  tmpfs with nvme_buffered: accepted, trains\n");
    zs_shard_t *u = open_shard("t3", 1, 0, 1, shm, &rc, &err);
    TEST_CHECKF(rc == ZS_ERR_EXISTS && !u && strstr(err.msg, "in use by another zs-server"),
                "second shard on one dir: %d %s", rc, err.msg);
    printf("  second server on the same directory refused: %s\n", err.msg);
    zs_shard_destroy(t);
    zs_test_sh("rm -rf %s", shm);
}

static void corrupt(zs_shard_t *ram, zs_shard_t **nvp)
{
    zs_err_t err;
    int rc;
    zs_shard_t *nv = *nvp;
    printf("5. a corrupted tile\n");
    double sec;
    TEST_OK(zs_shard_checkpoint(ram, 11, 0, &sec, &err), err);
    TEST_OK(zs_shard_checkpoint(nv, 11, 0, &sec, &err), err);
    TEST_OK(zs__nvme_corrupt(nv->st.nv, 2, 1, &err), err);
    TEST_OK(step_shard(nv, 12, &err), err); /* accepted; the pass fails */
    free(pull(nv, 12, g_rb, g_n, ZS_DTYPE_BF16, &rc, &err));
    TEST_CHECKF(rc == ZS_ERR_IO && strstr(err.msg, "tile 2") && strstr(err.msg, "exp_avg fails") &&
                    strstr(err.msg, "XXH3"),
                "pull after a corrupted tile: %d %s", rc, err.msg);
    printf("  step 12's pull refused: %s\n", err.msg);
    float one;
    uint64_t s;
    rc = zs_shard_get_state(nv, ZS_TENSOR_MASTER, g_rb, 1, &one, &s, &err);
    TEST_CHECKF(rc == ZS_ERR_IO, "GetState after a failed pass: %d %s", rc, err.msg);
    rc = zs_shard_checkpoint(nv, 12, 0, &sec, &err);
    TEST_CHECKF(rc == ZS_ERR_IO && strstr(err.msg, "checkpoint refused"),
                "checkpoint after a failed pass: %d %s", rc, err.msg);
    printf("  GetState and Checkpoint refused\n");
    zs_shard_destroy(nv);
    nv = *nvp = open_shard("n", 1, 0, 0, NULL, NULL, &err);
    same_state(ram, nv, "restarted after a corrupted tile");
    printf("  restart: resumes from checkpoint 11, bitwise\n");
    /* A staged gradient corrupted on the drive between Push and Commit. */
    push(nv, 12);
    TEST_OK(zs__nvme_grad_corrupt(nv->st.nv, 3, 0, &err), err);
    zs_commit_t c = commit_of(12);
    uint64_t a, o;
    TEST_OK(zs_shard_commit(nv, &c, &a, &o, &err), err); /* accepted; the pass fails */
    free(pull(nv, 12, g_rb, g_n, ZS_DTYPE_BF16, &rc, &err));
    TEST_CHECKF(rc == ZS_ERR_IO && strstr(err.msg, "tile 3") &&
                    strstr(err.msg, "staged gradient of step 12 fails its XXH3"),
                "pull after a corrupted staged gradient: %d %s", rc, err.msg);
    printf("  a staged gradient corrupted before Commit: %s\n", err.msg);
    zs_shard_destroy(nv);
    nv = *nvp = open_shard("n", 1, 0, 0, NULL, NULL, &err);
    same_state(ram, nv, "restarted after a corrupted staged gradient");
    printf("  restart: resumes from checkpoint 11, bitwise\n");
}

/* Push step s through a stream stating the expected scalars e. */
static void push_expect(zs_shard_t *sh, uint64_t step, const zs_commit_t *e)
{
    zs_err_t err;
    zs_shard_push_t *ps;
    float *tmp = malloc(g_n * 4);
    void *dst;
    uint64_t staged;
    TEST_CHECK(tmp);
    TEST_OK(zs_shard_push_begin(sh, &ps, &err), err);
    TEST_OK(zs_shard_push_expect(ps, e, &err), err);
    TEST_OK(zs_shard_push_chunk(ps, step, g_rb, g_n, zs_synth_dtype(step), &dst, &err), err);
    zs_synth_grad(step, g_rb, g_re, dst, tmp);
    zs_shard_push_chunk_done(ps);
    TEST_OK(zs_shard_push_end(ps, 1, &staged, &err), err);
    free(tmp);
}

/* Push [a, a + cnt) of step's gradient (its values shifted by `shift`
 * elements) through one stream in chunks of `chunk` elements; ok = 0: the
 * stream fails at its end. */
static void push_stream(zs_shard_t *sh, uint64_t step, uint64_t a, uint64_t cnt, uint64_t shift,
                        uint64_t chunk, int ok)
{
    zs_err_t err;
    zs_shard_push_t *ps;
    zs_dtype_t dt = zs_synth_dtype(step);
    size_t esz = zs_dtype_size(dt);
    unsigned char *g = malloc((g_n + shift) * 4);
    float *tmp = malloc((g_n + shift) * 4);
    uint64_t staged;
    TEST_CHECK(g && tmp);
    zs_synth_grad(step, g_rb, g_re + shift, g, tmp);
    TEST_OK(zs_shard_push_begin(sh, &ps, &err), err);
    for (uint64_t o = a; o < a + cnt; o += chunk) {
        uint64_t k = a + cnt - o < chunk ? a + cnt - o : chunk;
        void *dst;
        TEST_OK(zs_shard_push_chunk(ps, step, o, k, dt, &dst, &err), err);
        memcpy(dst, g + (o - g_rb + shift) * esz, k * esz);
        zs_shard_push_chunk_done(ps);
    }
    int rc = zs_shard_push_end(ps, ok, &staged, &err);
    TEST_CHECKF(ok ? rc == ZS_OK : 1, "push_end: %d %s", rc, err.msg);
    free(g);
    free(tmp);
}

/* Two threads, each a stream pushing every other chunk of `step` (chunks
 * of 10007 elements: most tiles are shared by both threads' chunks, merged
 * on the drive under the tile's lock). */
typedef struct {
    zs_shard_t *sh;
    uint64_t step;
    int half;
    const unsigned char *g;
} half_push_t;

static void *half_push(void *arg)
{
    half_push_t *h = arg;
    zs_err_t err;
    zs_shard_push_t *ps;
    zs_dtype_t dt = zs_synth_dtype(h->step);
    size_t esz = zs_dtype_size(dt);
    const uint64_t chunk = 10007;
    uint64_t staged;
    TEST_OK(zs_shard_push_begin(h->sh, &ps, &err), err);
    for (uint64_t o = g_rb + (uint64_t)h->half * chunk; o < g_re; o += 2 * chunk) {
        uint64_t k = g_re - o < chunk ? g_re - o : chunk;
        void *dst;
        TEST_OK(zs_shard_push_chunk(ps, h->step, o, k, dt, &dst, &err), err);
        memcpy(dst, h->g + (o - g_rb) * esz, k * esz);
        zs_shard_push_chunk_done(ps);
    }
    TEST_OK(zs_shard_push_end(ps, 1, &staged, &err), err);
    return NULL;
}

static void push_two_threads(zs_shard_t *sh, uint64_t step)
{
    unsigned char *g = malloc(g_n * 4);
    float *tmp = malloc(g_n * 4);
    TEST_CHECK(g && tmp);
    zs_synth_grad(step, g_rb, g_re, g, tmp);
    half_push_t h[2] = {{sh, step, 0, g}, {sh, step, 1, g}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        TEST_CHECK(pthread_create(&t[i], NULL, half_push, &h[i]) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    free(g);
    free(tmp);
}

/* Staging on the drive: chunks that cut tiles, re-pushed and refused
 * streams, two streams at once sharing tiles, as the RAM shard stages
 * them. */
static void streams(zs_shard_t *ram, zs_shard_t *nv)
{
    printf("9. staging on the drive: streams\n");
    zs_shard_t *sh[2] = {ram, nv};
    for (uint64_t step = 12; step <= 13; step++) {
        for (int i = 0; i < 2; i++) {
            /* chunks of 100003 elements: most cut a tile, merged on the drive */
            push_stream(sh[i], step, g_rb, g_n, 0, 100003, 1);
            /* a refused stream over staged elements changes nothing */
            push_stream(sh[i], step, g_rb + 300000, 10000, 7, 4096, 0);
            /* a re-push of staged elements (other values), staged at its end */
            push_stream(sh[i], step, g_rb + 70000, 130000, 5, 30001, 1);
            zs_err_t err;
            zs_commit_t c = commit_of(step);
            uint64_t a, o;
            TEST_OK(zs_shard_commit(sh[i], &c, &a, &o, &err), err);
        }
        same_pull(ram, nv, step, g_rb, g_n, ZS_DTYPE_BF16, "streams");
    }
    for (uint64_t step = 14; step <= 16; step++) {
        for (int i = 0; i < 2; i++) {
            push_two_threads(sh[i], step);
            zs_err_t err;
            zs_commit_t c = commit_of(step);
            uint64_t a, o;
            TEST_OK(zs_shard_commit(sh[i], &c, &a, &o, &err), err);
        }
        same_pull(ram, nv, step, g_rb, g_n, ZS_DTYPE_BF16, "two streams");
    }
    same_state(ram, nv, "streams");
    printf("  2 steps of streams with chunks cutting tiles, a refused stream and a re-push, 3 "
           "of two streams at once sharing tiles: bitwise = RAM\n");
}

static zs_shard_counters_t counters(zs_shard_t *sh)
{
    zs_err_t err;
    zs_shard_info_t in;
    TEST_OK(zs_shard_info(sh, &in, &err), err);
    free(in.checkpoints);
    return in.counters;
}

static void speculation(void)
{
    printf("6. speculation in the NVMe tier\n");
    zs_err_t err;
    g_spec_window = 1ull << 30;
    zs_shard_t *sn = open_shard("sn", 1, 0, 0, NULL, NULL, &err);
    g_spec_window = 0;
    zs_shard_t *sr = open_shard("sr", 0, 0, 0, NULL, NULL, &err);
    TEST_OK(init(sn, &err), err);
    TEST_OK(init(sr, &err), err);
    for (uint64_t s = 1; s <= 6; s++) {
        zs_commit_t e = {s, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
        zs_commit_t c = e;
        if (s == 3)
            c.clip_coef = 0.25f; /* rolled back */
        if (s == 5)
            c.skip = 1; /* restored */
        uint64_t before = counters(sn).spec_elements, a, o;
        push_expect(sn, s, &e);
        push(sr, s);
        for (int i = 0; i < 500 && counters(sn).spec_elements < before + g_n; i++) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        TEST_CHECKF(counters(sn).spec_elements == before + g_n,
                    "step %llu: %llu of %llu elements speculated", (unsigned long long)s,
                    (unsigned long long)(counters(sn).spec_elements - before),
                    (unsigned long long)g_n);
        if (s == 6) /* a wholesale reader cancels: it sees the committed state */
            same_state(sr, sn, "GetState while step 6 is speculated");
        TEST_OK(zs_shard_commit(sn, &c, &a, &o, &err), err);
        TEST_OK(zs_shard_commit(sr, &c, &a, &o, &err), err);
        same_pull(sr, sn, s, g_rb, g_n, ZS_DTYPE_BF16, "speculation");
        same_pull(sr, sn, s, g_rb, g_n, ZS_DTYPE_F32, "speculation");
        same_state(sr, sn, "speculation");
    }
    zs_shard_counters_t k = counters(sn);
    TEST_CHECKF(k.spec_hits == 3 && k.spec_rollbacks == 3,
                "spec_hits %llu (want 3: steps 1, 2, 4), spec_rollbacks %llu (want 3: steps 3, "
                "5, 6)",
                (unsigned long long)k.spec_hits, (unsigned long long)k.spec_rollbacks);
    printf("  6 steps, every chunk speculated before Commit: kept 3, rolled back 1 (clip), "
           "restored 1 (skip), cancelled 1 (GetState): bitwise = RAM without speculation\n");
    zs_shard_destroy(sn);
    zs_shard_destroy(sr);
}

static void no_uring(void)
{
    printf("8. without io_uring (synchronous pass)\n");
    zs_err_t err;
    setenv("ZS_NVME_TEST_NO_URING", "1", 1);
    g_spec_window = 1ull << 30;
    zs_shard_t *sn = open_shard("un", 1, 0, 0, NULL, NULL, &err);
    g_spec_window = 0;
    unsetenv("ZS_NVME_TEST_NO_URING");
    zs_shard_t *sr = open_shard("ur", 0, 0, 0, NULL, NULL, &err);
    TEST_OK(init(sn, &err), err);
    TEST_OK(init(sr, &err), err);
    for (uint64_t s = 1; s <= 4; s++) {
        zs_commit_t e = {s, 0.5f, 1.0f, 1e-3f, 0, ZS_DTYPE_F16}, c = e;
        if (s == 2)
            c.clip_coef = 0.5f;
        uint64_t a, o;
        uint64_t before = counters(sn).spec_elements;
        if (s % 2)
            push_expect(sn, s, &e);
        else
            push(sn, s);
        for (int i = 0; s % 2 && i < 500 && counters(sn).spec_elements < before + g_n; i++) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        TEST_CHECK(s % 2 == 0 || counters(sn).spec_elements == before + g_n);
        push(sr, s);
        TEST_OK(zs_shard_commit(sn, &c, &a, &o, &err), err);
        TEST_OK(zs_shard_commit(sr, &c, &a, &o, &err), err);
        same_pull(sr, sn, s, g_rb, g_n, ZS_DTYPE_F16, "without io_uring");
        same_state(sr, sn, "without io_uring");
    }
    printf("  4 steps (speculation on odd steps, step 2 clipped): bitwise = RAM\n");
    zs_shard_destroy(sn);
    zs_shard_destroy(sr);
}

static char g_mnt[300];

static void unmount_loop(void)
{
    if (g_mnt[0] && umount(g_mnt) != 0)
        fprintf(stderr, "warning: could not unmount %s\n", g_mnt);
    g_mnt[0] = 0;
}

static void disk_full(void)
{
    printf("7. disk full (a loop-mounted ext4 of 32 MiB)\n");
    char img[300];
    snprintf(img, sizeof img, "%s/disk.img", g_tmp);
    snprintf(g_mnt, sizeof g_mnt, "%s/disk", g_tmp);
    if (geteuid() != 0 ||
        zs_test_sh("truncate -s 32M %s && mkfs.ext4 -q -F %s >/dev/null 2>&1 && mkdir -p %s && "
                   "mount -o loop %s %s 2>/dev/null",
                   img, img, g_mnt, img, g_mnt) != 0) {
        printf("  SKIP: cannot mount a loop device here (needs root, losetup and mkfs.ext4)\n");
        g_mnt[0] = 0;
        return;
    }
    atexit(unmount_loop);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/tiles", g_mnt);
    zs_err_t err;
    zs_shard_t *a = open_shard("full", 1, 0, 0, dir, NULL, &err);
    zs_shard_t *r = open_shard("full-ram", 0, 0, 0, NULL, NULL, &err);
    TEST_OK(init(a, &err), err); /* 6 tiles: 9.5 MB */
    TEST_OK(init(r, &err), err);
    TEST_OK(step_shard(a, 1, &err), err);
    TEST_OK(step_shard(r, 1, &err), err);
    /* 3 M elements on one server: 46 tiles, 73 MB */
    zs_shard_identity_t id = {"too-big", 3000000, 1, 0};
    zs_shard_init_t *in;
    int rc = zs_shard_init_begin(a, &id, &g_hp, 0, 1, &in, &err);
    TEST_CHECKF(rc == ZS_ERR_NOMEM && strstr(err.msg, "no room"), "a state beyond the disk: %d %s",
                rc, err.msg);
    printf("  Initialize beyond the disk refused: %s\n", err.msg);
    same_state(r, a, "after a refused Initialize");
    TEST_OK(step_shard(a, 2, &err), err);
    TEST_OK(step_shard(r, 2, &err), err);
    same_state(r, a, "a step after it");
    printf("  state and step unchanged, bitwise; the next step trains\n");
    zs_shard_destroy(a);
    zs_shard_destroy(r);
    unmount_loop();
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    zs_log_set_level(ZS_LOG_WARN);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("nvme_shard"));
    g_rb = zs_layout_begin(P, S, INDEX);
    g_re = zs_layout_begin(P, S, INDEX + 1);
    g_n = g_re - g_rb;
    g_hp = zs_synth_hparams();
    zs_err_t err;
    zs_shard_t *ram = open_shard("r", 0, 0, 0, NULL, NULL, &err);
    zs_shard_t *nv = open_shard("n", 1, 0, 0, NULL, NULL, &err);
    TEST_OK(init(ram, &err), err);
    TEST_OK(init(nv, &err), err);
    equality(ram, nv);
    checkpoints(ram, &nv);
    memory();
    refusals();
    corrupt(ram, &nv);
    streams(ram, nv);
    speculation();
    disk_full();
    no_uring();
    zs_shard_destroy(nv);
    zs_shard_destroy(ram);
    printf("PASS test_nvme_shard\n");
    return 0;
}
