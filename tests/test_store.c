/*
 * test_store.c - unit tests of the RocksDB checkpoint store (zs_store.h).
 *
 * Checks: argument validation; bitwise write/read roundtrips (n not a multiple
 * of the chunk size, exactly one chunk, one element); meta roundtrip (empty,
 * small, the 1 MiB maximum); ascending list (also with a short array); EXISTS,
 * NOTFOUND; corruption found by zs__store_corrupt_chunk, by a chunk moved to
 * another step's or tensor's key, by a truncated or missing chunk and by a
 * damaged marker, each naming tensor and chunk, while older checkpoints still
 * read; delete (space back at once); prune(keep=2); reopen keeps complete
 * checkpoints; chunks without a marker (written straight into RocksDB, as a
 * crash leaves them) are never listed and are removed by zs_store_open, and
 * so is the space of a delete that died after its synced batch. A full disk
 * (a 128 MiB tmpfs, where it can be mounted): a failed write marks the store
 * degraded, the process survives, writes and deletes are refused while the
 * disk stays full, and once there is room (less than RocksDB's own recovery
 * waits for) the next write succeeds and every checkpoint reads back; open on
 * a full disk is refused, not aborted.
 * Does not: kill processes (test_store_crash.c does) or measure speed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "zs_proc.h"
#include "zs_store.h"
#include "zs_test.h"

#define CHUNK_FLOATS (ZS_STORE_CHUNK_BYTES / sizeof(float))

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Deterministic tensor contents per (step, tensor): any bit pattern. */
static void fill(float *a, uint64_t n, uint64_t step, int t)
{
    uint32_t *u = (uint32_t *)a;
    uint64_t seed = splitmix(step * 3 + (uint64_t)t);
    for (uint64_t i = 0; i < n; i++)
        u[i] = (uint32_t)splitmix(seed + i);
}

typedef struct {
    uint64_t n;
    float *t[3];
} state_t;

static state_t make_state(uint64_t n, uint64_t step)
{
    state_t s = {n, {NULL, NULL, NULL}};
    for (int t = 0; t < 3; t++) {
        s.t[t] = malloc(n * sizeof(float));
        TEST_CHECK(s.t[t]);
        fill(s.t[t], n, step, t);
    }
    return s;
}

static void free_state(state_t *s)
{
    for (int t = 0; t < 3; t++)
        free(s->t[t]);
}

static void write_ckpt(zs_store_t *st, uint64_t step, uint64_t n, const void *meta, size_t meta_len)
{
    zs_err_t err = {0};
    state_t s = make_state(n, step);
    zs_store_ckpt_t ck = {step, n, {s.t[0], s.t[1], s.t[2]}, meta, meta_len};
    TEST_OK(zs_store_write(st, &ck, &err), err);
    free_state(&s);
}

/* Reads step back and compares it bit for bit with the regenerated contents. */
static void expect_ckpt(zs_store_t *st, uint64_t step, uint64_t n)
{
    zs_err_t err = {0};
    state_t want = make_state(n, step), got = make_state(n, step + 1000003);
    TEST_OK(zs_store_read(st, step, got.t, n, &err), err);
    for (int t = 0; t < 3; t++)
        TEST_CHECKF(memcmp(want.t[t], got.t[t], n * sizeof(float)) == 0,
                    "step %llu tensor %d differs", (unsigned long long)step, t);
    free_state(&want);
    free_state(&got);
}

static int expect_read_fails(zs_store_t *st, uint64_t step, uint64_t n, int code,
                             const char *needle)
{
    zs_err_t err = {0};
    state_t got = make_state(n, 1);
    int rc = zs_store_read(st, step, got.t, n, &err);
    free_state(&got);
    TEST_CHECKF(rc == code, "step %llu: got %s (%s), want %s", (unsigned long long)step,
                zs_status_name(rc), err.msg, zs_status_name(code));
    TEST_CHECKF(!needle || strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
    printf("  expected failure: %s\n", err.msg);
    return rc;
}

static size_t list(zs_store_t *st, uint64_t *steps, size_t max)
{
    zs_err_t err = {0};
    size_t count = 0;
    TEST_OK(zs_store_list(st, steps, max, &count, &err), err);
    return count;
}

static double g_du;
static int du_add(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    if (flag == FTW_F)
        g_du += (double)sb->st_blocks * 512.0;
    return 0;
}

/* Disk usage of a directory tree in MiB. */
static double du_mib(const char *dir)
{
    g_du = 0;
    TEST_CHECK(nftw(dir, du_add, 16, FTW_PHYS) == 0);
    return g_du / (1 << 20);
}

/* ---- raw RocksDB access, to fake what a crash or a disk leaves behind ---- */

typedef struct {
    rocksdb_t *db;
    rocksdb_options_t *o;
    rocksdb_column_family_handle_t *cf[2]; /* markers, chunks */
    rocksdb_writeoptions_t *wo;
    rocksdb_readoptions_t *ro;
} raw_t;

static raw_t raw_open(const char *dir)
{
    raw_t r = {0};
    char *e = NULL;
    const char *names[2] = {"default", "chunks"};
    r.o = rocksdb_options_create();
    const rocksdb_options_t *cfo[2] = {r.o, r.o};
    r.db = rocksdb_open_column_families(r.o, dir, 2, names, cfo, r.cf, &e);
    TEST_CHECKF(!e, "raw open: %s", e);
    r.wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(r.wo, 1);
    r.ro = rocksdb_readoptions_create();
    return r;
}

static void raw_close(raw_t *r)
{
    rocksdb_column_family_handle_destroy(r->cf[0]);
    rocksdb_column_family_handle_destroy(r->cf[1]);
    rocksdb_close(r->db);
    rocksdb_writeoptions_destroy(r->wo);
    rocksdb_readoptions_destroy(r->ro);
    rocksdb_options_destroy(r->o);
}

static char *raw_get(raw_t *r, int cf, const char *key, size_t *len)
{
    char *e = NULL;
    char *v = rocksdb_get_cf(r->db, r->ro, r->cf[cf], key, strlen(key), len, &e);
    TEST_CHECKF(!e, "raw get: %s", e);
    return v;
}

static void raw_put(raw_t *r, int cf, const char *key, const char *v, size_t len)
{
    char *e = NULL;
    rocksdb_put_cf(r->db, r->wo, r->cf[cf], key, strlen(key), v, len, &e);
    TEST_CHECKF(!e, "raw put: %s", e);
}

/* Number of chunk keys of `step` present. */
static int raw_count_chunks(raw_t *r, uint64_t step)
{
    char lo[64];
    snprintf(lo, sizeof lo, "c/%020llu/", (unsigned long long)step);
    size_t len = strlen(lo);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(r->db, r->ro, r->cf[1]);
    int k = 0;
    for (rocksdb_iter_seek(it, lo, len); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const char *key = rocksdb_iter_key(it, &klen);
        if (klen < len || memcmp(key, lo, len) != 0)
            break;
        k++;
    }
    rocksdb_iter_destroy(it);
    return k;
}

static void ckey(char *buf, uint64_t step, int t, uint64_t c)
{
    snprintf(buf, 64, "c/%020llu/%d/%010llu", (unsigned long long)step, t, (unsigned long long)c);
}

/* ---- tests --------------------------------------------------------------- */

static void test_arguments(zs_store_t *st, const char *dir)
{
    zs_err_t err = {0};
    zs_store_t *none = (zs_store_t *)1;
    float x = 1.0f, *dst[3] = {&x, &x, NULL};
    size_t count;
    TEST_CHECK(zs_store_open(NULL, &none, &err) == ZS_ERR_INVALID && none == NULL);
    TEST_CHECK(zs_store_open(dir, NULL, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_store_open("/nonexistent-dir/sub/db", &none, &err) == ZS_ERR_IO);
    printf("  open of a bad path: %s\n", err.msg);
    TEST_CHECK(strstr(err.msg, "rocksdb open at") && strstr(err.msg, "hint:"));
    TEST_CHECK(zs_store_open(dir, &none, &err) == ZS_ERR_IO); /* locked by st */
    printf("  second open: %s\n", err.msg);

    zs_store_ckpt_t ck = {1, 1, {&x, &x, &x}, "m", 1};
    TEST_CHECK(zs_store_write(NULL, &ck, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_store_write(st, NULL, &err) == ZS_ERR_INVALID);
    ck.tensors[2] = NULL;
    TEST_CHECK(zs_store_write(st, &ck, &err) == ZS_ERR_INVALID);
    ck.tensors[2] = &x;
    ck.n = 0;
    TEST_CHECK(zs_store_write(st, &ck, &err) == ZS_ERR_RANGE);
    ck.n = 1;
    ck.meta = NULL;
    TEST_CHECK(zs_store_write(st, &ck, &err) == ZS_ERR_INVALID);
    char *big = calloc(1, (1u << 20) + 1);
    ck.meta = big;
    ck.meta_len = (1u << 20) + 1;
    TEST_CHECK(zs_store_write(st, &ck, &err) == ZS_ERR_RANGE);
    free(big);
    TEST_CHECK(list(st, NULL, 0) == 0); /* nothing was written by the refusals */

    TEST_CHECK(zs_store_read(st, 1, NULL, 1, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_store_read(st, 1, dst, 1, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_store_list(st, NULL, 4, &count, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_store_list(st, NULL, 0, NULL, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_store_read_meta(st, 1, NULL, NULL, NULL, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_store_prune(st, 0, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs__store_corrupt_chunk(st, 1, 3, 0, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs__store_corrupt_chunk(st, 1, 0, 0, &err) == ZS_ERR_NOTFOUND);
    zs_store_close(NULL);
}

static void expect_meta(zs_store_t *st, uint64_t step, const void *want, size_t want_len,
                        uint64_t want_n)
{
    zs_err_t err = {0};
    void *meta = NULL;
    size_t len = 99;
    uint64_t n = 0;
    TEST_OK(zs_store_read_meta(st, step, &meta, &len, &n, &err), err);
    TEST_CHECK(meta != NULL && len == want_len && n == want_n);
    TEST_CHECK(want_len == 0 || memcmp(meta, want, want_len) == 0);
    free(meta);
}

/* ---- a full disk (a small tmpfs; skipped where it cannot be mounted) ------ */

/* The store on a 128 MiB tmpfs: a checkpoint, then the disk filled by another
 * file. A write fails with RESOURCE_EXHAUSTED (ZS_ERR_NOMEM, "No space") and
 * marks the store degraded; the process survives RocksDB's background retries
 * (6 s); a write while the disk is still full is refused without touching
 * RocksDB. Then the filler shrinks to leave 40 MiB free: less than the 64 MiB
 * RocksDB's own error recovery waits for, so only the store's recovery
 * (reopen) brings writes back. The next write succeeds, the store is healthy,
 * the checkpoints read back bitwise, and a delete works. */
static void test_disk_full(void)
{
    const char *g_mnt = zs_test_tmpfs_mount("enospc", 128);
    char dir[160], filler[160];
    if (!g_mnt) {
        printf("  SKIP: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)\n");
        return;
    }
    snprintf(dir, sizeof dir, "%s/db", g_mnt);
    snprintf(filler, sizeof filler, "%s/filler", g_mnt);
    const uint64_t n = 1u << 20; /* 12 MiB per checkpoint */
    zs_err_t err = {0};
    zs_store_t *st = NULL;
    uint64_t steps[8];
    TEST_OK(zs_store_open(dir, &st, &err), err);
    write_ckpt(st, 1, n, "a", 1);
    off_t fsize = zs_test_fill_disk(filler);
    printf("  disk full: %.0f bytes free\n", zs_test_free_mib(g_mnt) * (1 << 20));

    state_t s = make_state(n, 2);
    zs_store_ckpt_t ck = {2, n, {s.t[0], s.t[1], s.t[2]}, "b", 1};
    int rc = zs_store_write(st, &ck, &err);
    printf("  write on a full disk: %s: %s\n", zs_status_name(rc), err.msg);
    TEST_CHECK(rc == ZS_ERR_NOMEM && strstr(err.msg, "No space"));
    char why[ZS_ERR_MSG_MAX];
    TEST_CHECK(zs_store_health(st, why, sizeof why) == 1 && strstr(why, "No space"));
    /* RocksDB drops its partial table file: keep the disk full while its
     * recovery retries (every 5 s, logging each time; that logging used to
     * abort the process), then top it up again. */
    zs_test_fill_disk(filler);
    sleep(6); /* one of them (test_server_disk waits through two) */
    fsize = zs_test_fill_disk(filler);
    printf("  disk full again: %.0f bytes free\n", zs_test_free_mib(g_mnt) * (1 << 20));
    zs_err_clear(&err);
    rc = zs_store_write(st, &ck, &err);
    printf("  again, still full: %s: %s\n", zs_status_name(rc), err.msg);
    TEST_CHECK(rc == ZS_ERR_NOMEM && strstr(err.msg, "disk full: 0.0 MiB free"));
    TEST_CHECK(zs_store_delete(st, 1, &err) == ZS_ERR_NOMEM); /* refused too: nothing deleted */
    TEST_CHECK(zs_store_health(st, why, sizeof why) == 1);
    TEST_CHECK(list(st, steps, 8) == 1 && steps[0] == 1);
    expect_ckpt(st, 1, n);

    TEST_CHECK(truncate(filler, fsize - (off_t)(40 << 20)) == 0);
    printf("  filler shrunk: %.1f MiB free\n", zs_test_free_mib(g_mnt));
    zs_err_clear(&err);
    rc = zs_store_write(st, &ck, &err);
    TEST_CHECKF(rc == ZS_OK, "write after space came back: %s: %s", zs_status_name(rc), err.msg);
    TEST_CHECK(zs_store_health(st, why, sizeof why) == 0 && why[0] == '\0');
    write_ckpt(st, 3, n, "c", 1);
    TEST_CHECK(list(st, steps, 8) == 3 && steps[1] == 2 && steps[2] == 3);
    expect_ckpt(st, 1, n);
    expect_ckpt(st, 2, n);
    expect_ckpt(st, 3, n);
    TEST_OK(zs_store_delete(st, 1, &err), err);
    zs_store_close(st);
    /* RocksDB cannot open on a full disk (it aborts): refused instead. */
    fsize = zs_test_fill_disk(filler);
    zs_store_t *none = (zs_store_t *)1;
    rc = zs_store_open(dir, &none, &err);
    printf("  open on a full disk: %s: %s\n", zs_status_name(rc), err.msg);
    TEST_CHECK(rc == ZS_ERR_NOMEM && none == NULL && strstr(err.msg, "disk full"));
    TEST_CHECK(truncate(filler, fsize - (off_t)(40 << 20)) == 0);
    TEST_OK(zs_store_open(dir, &st, &err), err);
    TEST_CHECK(list(st, steps, 8) == 2 && steps[0] == 2);
    expect_ckpt(st, 2, n);
    zs_store_close(st);
    free_state(&s);
    zs_test_tmpfs_unmount();
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    char tmpl[] = "/tmp/zs_test_store.XXXXXX", dir[300];
    TEST_CHECK(mkdtemp(tmpl));
    snprintf(dir, sizeof dir, "%s/db", tmpl);
    zs_err_t err = {0};
    zs_store_t *st = NULL;
    TEST_OK(zs_store_open(dir, &st, &err), err);

    printf("arguments\n");
    test_arguments(st, dir);

    printf("roundtrips\n");
    const uint64_t n_big = 3300000; /* 12.6 chunks per tensor: last one short */
    const uint64_t n_one = CHUNK_FLOATS;
    const char meta_small[] = "{\"layout\":\"test\",\"lr\":0.001}";
    char *meta_max = malloc(1u << 20);
    TEST_CHECK(meta_max);
    for (size_t i = 0; i < (1u << 20); i++)
        meta_max[i] = (char)splitmix(i);
    write_ckpt(st, 100, n_big, meta_small, sizeof meta_small);
    write_ckpt(st, 7, 1, NULL, 0);
    write_ckpt(st, 50, n_one, meta_max, 1u << 20);
    write_ckpt(st, 1000000000000ull, 5, "x", 1);
    expect_ckpt(st, 100, n_big);
    expect_ckpt(st, 7, 1);
    expect_ckpt(st, 50, n_one);
    expect_ckpt(st, 1000000000000ull, 5);
    expect_meta(st, 100, meta_small, sizeof meta_small, n_big);
    expect_meta(st, 7, NULL, 0, 1);
    expect_meta(st, 50, meta_max, 1u << 20, n_one);

    printf("list\n");
    uint64_t steps[8];
    TEST_CHECK(list(st, steps, 8) == 4);
    TEST_CHECK(steps[0] == 7 && steps[1] == 50 && steps[2] == 100 && steps[3] == 1000000000000ull);
    steps[1] = 12345;
    TEST_CHECK(list(st, steps, 1) == 4 && steps[0] == 7 && steps[1] == 12345);

    printf("exists, notfound, wrong n\n");
    {
        float x = 0;
        zs_store_ckpt_t ck = {100, 1, {&x, &x, &x}, NULL, 0};
        TEST_CHECK(zs_store_write(st, &ck, &err) == ZS_ERR_EXISTS);
        printf("  %s\n", err.msg);
        expect_ckpt(st, 100, n_big); /* untouched by the refusal */
        void *meta;
        size_t len;
        uint64_t n;
        TEST_CHECK(zs_store_read_meta(st, 12345, &meta, &len, &n, &err) == ZS_ERR_NOTFOUND);
        TEST_CHECK(zs_store_delete(st, 12345, &err) == ZS_ERR_NOTFOUND);
        expect_read_fails(st, 12345, 1, ZS_ERR_NOTFOUND, "12345");
        expect_read_fails(st, 100, n_big - 1, ZS_ERR_INVALID, "n=3300000");
    }

    printf("corruption via the test hook\n");
    TEST_OK(zs__store_corrupt_chunk(st, 100, 1, 12, &err), err);
    expect_read_fails(st, 100, n_big, ZS_ERR_CORRUPT, "tensor exp_avg chunk 12 fails");
    expect_ckpt(st, 50, n_one); /* older checkpoint still reads fine */
    expect_ckpt(st, 7, 1);
    {
        void *meta;
        size_t len;
        uint64_t n; /* the meta of the damaged step is still intact */
        TEST_OK(zs_store_read_meta(st, 100, &meta, &len, &n, &err), err);
        free(meta);
    }
    TEST_OK(zs_store_delete(st, 100, &err), err);
    write_ckpt(st, 100, n_big, meta_small, sizeof meta_small); /* step can be rewritten */
    expect_ckpt(st, 100, n_big);
    TEST_OK(zs__store_corrupt_chunk(st, 100, 2, 0, &err), err);
    expect_read_fails(st, 100, n_big, ZS_ERR_CORRUPT, "tensor exp_avg_sq chunk 0 fails");

    printf("delete\n");
    double before = du_mib(dir);
    TEST_OK(zs_store_delete(st, 100, &err), err);
    double after = du_mib(dir); /* 3 x 12.6 MiB of chunks must be gone at once */
    printf("  store %.1f MiB before, %.1f MiB after deleting step 100\n", before, after);
    TEST_CHECK(before - after > 30.0);
    TEST_CHECK(zs_store_delete(st, 100, &err) == ZS_ERR_NOTFOUND);
    expect_read_fails(st, 100, n_big, ZS_ERR_NOTFOUND, NULL);
    TEST_CHECK(list(st, steps, 8) == 3 && steps[0] == 7 && steps[1] == 50 &&
               steps[2] == 1000000000000ull);

    printf("prune keep=2\n");
    write_ckpt(st, 60, 1000, NULL, 0);
    TEST_CHECK(list(st, steps, 8) == 4);
    TEST_OK(zs_store_prune(st, 2, &err), err);
    TEST_CHECK(list(st, steps, 8) == 2 && steps[0] == 60 && steps[1] == 1000000000000ull);
    expect_read_fails(st, 7, 1, ZS_ERR_NOTFOUND, NULL);
    expect_read_fails(st, 50, n_one, ZS_ERR_NOTFOUND, NULL);
    expect_ckpt(st, 60, 1000);
    TEST_OK(zs_store_prune(st, 2, &err), err); /* nothing to do */
    TEST_OK(zs_store_prune(st, 5, &err), err);
    TEST_CHECK(list(st, steps, 8) == 2);

    printf("reopen\n");
    write_ckpt(st, 200, n_big, meta_small, sizeof meta_small);
    write_ckpt(st, 201, 300000, NULL, 0);
    write_ckpt(st, 202, 300000, NULL, 0);
    write_ckpt(st, 203, 300000, NULL, 0);
    zs_store_close(st);
    st = NULL;
    TEST_OK(zs_store_open(dir, &st, &err), err);
    TEST_CHECK(list(st, steps, 8) == 6 && steps[0] == 60 && steps[1] == 200 && steps[4] == 203);
    expect_ckpt(st, 60, 1000);
    expect_ckpt(st, 200, n_big);
    expect_meta(st, 200, meta_small, sizeof meta_small, n_big);
    expect_ckpt(st, 1000000000000ull, 5);
    zs_store_close(st);

    printf("damage behind the store's back\n");
    {
        raw_t r = raw_open(dir);
        char k[64], k2[64];
        size_t len;
        /* Chunks with no marker, as a kill during a write leaves them. */
        ckey(k, 300, 0, 0);
        raw_put(&r, 1, k, "leftover", 8);
        ckey(k, 300, 2, 7);
        raw_put(&r, 1, k, "leftover", 8);
        ckey(k, 5, 1, 3);
        raw_put(&r, 1, k, "older leftover", 14);
        /* 201: step 200's chunk 0 of tensor 0 (same length, its own valid checksum)
         * under 201's key: only the key binding in the checksum can tell. */
        ckey(k, 200, 0, 0);
        char *v = raw_get(&r, 1, k, &len);
        TEST_CHECK(v && len == ZS_STORE_CHUNK_BYTES + 8);
        ckey(k2, 201, 0, 0);
        raw_put(&r, 1, k2, v, len); /* whole value incl. 200's checksum */
        rocksdb_free(v);
        /* 202: tensor 1's chunk 0 under tensor 2's key (identical length). */
        ckey(k, 202, 1, 0);
        v = raw_get(&r, 1, k, &len);
        ckey(k2, 202, 2, 0);
        raw_put(&r, 1, k2, v, len);
        rocksdb_free(v);
        /* 203: chunk 0 of tensor 1 truncated, chunk 1 of tensor 2 deleted. */
        ckey(k, 203, 1, 0);
        v = raw_get(&r, 1, k, &len);
        raw_put(&r, 1, k, v, len - 9);
        rocksdb_free(v);
        ckey(k, 203, 2, 1);
        char *e = NULL;
        rocksdb_delete_cf(r.db, r.wo, r.cf[1], k, strlen(k), &e);
        TEST_CHECK(!e);
        /* 60: marker header damaged. */
        v = raw_get(&r, 0, "m/00000000000000000060", &len);
        TEST_CHECK(v && len >= 48);
        v[9] ^= 1;
        raw_put(&r, 0, "m/00000000000000000060", v, len);
        rocksdb_free(v);
        TEST_CHECK(raw_count_chunks(&r, 300) == 2 && raw_count_chunks(&r, 5) == 1);
        raw_close(&r);
    }
    TEST_OK(zs_store_open(dir, &st, &err), err); /* removes 300 and 5 (logged) */
    TEST_CHECK(list(st, steps, 8) == 6);
    for (int i = 0; i < 6; i++)
        TEST_CHECK(steps[i] != 300 && steps[i] != 5);
    expect_read_fails(st, 201, 300000, ZS_ERR_CORRUPT, "tensor master chunk 0 fails");
    TEST_OK(zs_store_delete(st, 201, &err), err);
    expect_read_fails(st, 202, 300000, ZS_ERR_CORRUPT, "tensor exp_avg_sq chunk 0 fails");
    expect_read_fails(st, 203, 300000, ZS_ERR_CORRUPT, "tensor exp_avg chunk 0 has");
    expect_read_fails(st, 60, 1000, ZS_ERR_CORRUPT, "marker of step 60");
    {
        void *meta;
        size_t len;
        uint64_t n;
        TEST_CHECK(zs_store_read_meta(st, 60, &meta, &len, &n, &err) == ZS_ERR_CORRUPT);
        float x = 0;
        zs_store_ckpt_t ck = {60, 1, {&x, &x, &x}, NULL, 0};
        TEST_CHECK(zs_store_write(st, &ck, &err) == ZS_ERR_EXISTS);
        TEST_OK(zs_store_delete(st, 60, &err), err); /* a damaged one can still be deleted */
    }
    TEST_OK(zs_store_delete(st, 203, &err), err);
    TEST_OK(zs_store_delete(st, 202, &err), err);
    expect_ckpt(st, 200, n_big);
    expect_ckpt(st, 1000000000000ull, 5);
    write_ckpt(st, 300, 10, NULL, 0);
    expect_ckpt(st, 300, 10);
    TEST_CHECK(list(st, steps, 8) == 3 && steps[0] == 200 && steps[1] == 300);
    zs_store_close(st);
    {
        raw_t r = raw_open(dir);
        TEST_CHECK(raw_count_chunks(&r, 5) == 0);        /* cleaned at open */
        TEST_CHECK(raw_count_chunks(&r, 300) == 3);      /* the new step 300 only */
        TEST_CHECK(raw_count_chunks(&r, 201) == 0);      /* deleted */
        TEST_CHECK(raw_count_chunks(&r, 200) == 3 * 13); /* 12.6 chunks -> 13 per tensor */
        raw_close(&r);
    }

    printf("a delete cut short before its space came back\n");
    {
        /* What zs_store_delete's synced batch leaves if the process dies right after it. */
        raw_t r = raw_open(dir);
        rocksdb_writebatch_t *b = rocksdb_writebatch_create();
        const char *mk = "m/00000000000000000200";
        const char *lo = "c/00000000000000000200/", *hi = "c/000000000000000002000";
        rocksdb_writebatch_delete_cf(b, r.cf[0], mk, strlen(mk));
        rocksdb_writebatch_delete_range_cf(b, r.cf[1], lo, strlen(lo), hi, strlen(hi));
        char *e = NULL;
        rocksdb_write(r.db, r.wo, b, &e);
        TEST_CHECK(!e);
        rocksdb_writebatch_destroy(b);
        raw_close(&r);
    }
    before = du_mib(dir);
    TEST_OK(zs_store_open(dir, &st, &err), err);
    after = du_mib(dir);
    printf("  store %.1f MiB before open, %.1f MiB after\n", before, after);
    TEST_CHECK(before - after > 30.0);
    TEST_CHECK(list(st, steps, 8) == 2 && steps[0] == 300);
    expect_read_fails(st, 200, n_big, ZS_ERR_NOTFOUND, NULL);
    expect_ckpt(st, 300, 10);
    expect_ckpt(st, 1000000000000ull, 5);
    zs_store_close(st);

    printf("a full disk, then space again\n");
    test_disk_full();

    free(meta_max);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    TEST_CHECK(system(cmd) == 0);
    printf("test_store: all passed\n");
    return 0;
}
