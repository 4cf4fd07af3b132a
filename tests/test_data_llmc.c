/*
 * test_data_llmc.c - llm.c .bin token shards and lists of token files
 * (worker/model/zs_data_shards.c), and zs-train on them.
 *
 * The shards are written here by the test's own writer, after llm.c's
 * dev/data/data_common.py write_datafile: 256 int32 (magic 20240520,
 * version 1, token count, zeros), then the uint16 tokens.
 *
 *  1. Three shards opened as a comma list and as a glob hold the
 *     concatenation in order (the glob sorted by name): count, vocab 50257,
 *     every token across the boundaries, and every sample window equal to
 *     that of one zeroshard token file holding the same tokens.
 *  2. Refusals, each naming the file: bad magic, version 2 and version 7,
 *     a header cut short, a truncated body, trailing bytes, a glob without
 *     a match, a list mixing vocabs (a vocab-256 zeroshard file and an llm.c
 *     shard), and a token >= 50257 when a sample reads it.
 *  3. zs-train (2 MPI workers, no servers) on the three shards and on the
 *     one zeroshard file: bitwise-equal parameters after 4 steps
 *     (--save-params); a bad shard makes zs-train exit 4 naming it.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_data.h"
#include "zs_proc.h"
#include "zs_test.h"

#define V 50257u

static char dir[256];

static const char *tpath(const char *name)
{
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* An llm.c shard: header ints h0 (magic), h1 (version), h2 (count), then
 * ntok tokens, then `extra` zero bytes; header_bytes < 1024 cuts it. */
static void write_llmc(const char *path, int32_t h0, int32_t h1, int32_t h2, const uint16_t *tok,
                       size_t ntok, size_t extra, size_t header_bytes)
{
    int32_t h[256] = {0};
    h[0] = h0;
    h[1] = h1;
    h[2] = h2;
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f);
    TEST_CHECK(fwrite(h, 1, header_bytes, f) == header_bytes); /* little-endian host */
    TEST_CHECK(fwrite(tok, 2, ntok, f) == ntok);
    for (size_t i = 0; i < extra; i++)
        TEST_CHECK(fputc(0, f) != EOF);
    TEST_CHECK(fclose(f) == 0);
}

static void expect_open_error(const char *spec, int code, const char *name, const char *what)
{
    zs_data_t *d = (zs_data_t *)1;
    zs_err_t err;
    zs_err_clear(&err);
    int rc = zs_data_open(spec, &d, &err);
    TEST_CHECKF(rc == code, "%s: rc %d (%s), want %d: %s", spec, rc, zs_status_name(rc), code,
                err.msg);
    TEST_CHECK(d == NULL);
    TEST_CHECKF(strstr(err.msg, name), "message does not name %s: %s", name, err.msg);
    TEST_CHECKF(strstr(err.msg, what), "message lacks \"%s\": %s", what, err.msg);
    printf("  refused as expected: %s\n", err.msg);
}

static uint16_t *g_tok;
static const size_t k_n[3] = {3001, 2500, 4100}, k_total = 3001 + 2500 + 4100;

static void make_tokens(void)
{
    g_tok = malloc(k_total * sizeof *g_tok);
    uint64_t x = 42;
    for (size_t i = 0; i < k_total; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        g_tok[i] = (uint16_t)((x >> 33) % V);
    }
    /* named so that the glob's name order is the list order */
    write_llmc(tpath("shard_000.bin"), 20240520, 1, (int32_t)k_n[0], g_tok, k_n[0], 0, 1024);
    write_llmc(tpath("shard_001.bin"), 20240520, 1, (int32_t)k_n[1], g_tok + k_n[0], k_n[1], 0,
               1024);
    write_llmc(tpath("shard_002.bin"), 20240520, 1, (int32_t)k_n[2], g_tok + k_n[0] + k_n[1],
               k_n[2], 0, 1024);
    zs_err_t err;
    TEST_OK(zs_data_write(tpath("same.tok"), V, g_tok, k_total, &err), err);
}

static void check_same(const char *spec)
{
    zs_err_t err;
    zs_data_t *d, *ref;
    TEST_OK(zs_data_open(spec, &d, &err), err);
    TEST_OK(zs_data_open(tpath("same.tok"), &ref, &err), err);
    TEST_CHECK(zs_data_vocab(d) == V);
    TEST_CHECKF(zs_data_count(d) == k_total, "count %llu", (unsigned long long)zs_data_count(d));
    uint32_t *all = malloc(k_total * sizeof *all);
    TEST_OK(zs_data_read(d, 0, k_total, all, &err), err);
    for (size_t i = 0; i < k_total; i++)
        TEST_CHECKF(all[i] == g_tok[i], "token %zu: %u, want %u", i, all[i], g_tok[i]);
    const int T = 64;
    int32_t in[64], tg[64], rin[64], rtg[64];
    for (int64_t j = 0; j < 2000; j++) {
        TEST_OK(zs_data_sample(d, j, T, in, tg, &err), err);
        TEST_OK(zs_data_sample(ref, j, T, rin, rtg, &err), err);
        TEST_CHECKF(memcmp(in, rin, sizeof in) == 0 && memcmp(tg, rtg, sizeof tg) == 0,
                    "sample %lld differs from the zeroshard file's", (long long)j);
    }
    free(all);
    zs_data_close(d);
    zs_data_close(ref);
    printf("1. %s: %zu tokens in order, 2000 samples equal to one zeroshard file's\n", spec,
           k_total);
}

static void check_refusals(void)
{
    printf("2. refusals\n");
    write_llmc(tpath("magic.bin"), 20240521, 1, 10, g_tok, 10, 0, 1024);
    expect_open_error(tpath("magic.bin"), ZS_ERR_CORRUPT, "magic.bin", "bad magic");
    write_llmc(tpath("v2.bin"), 20240520, 2, 10, g_tok, 10, 0, 1024);
    expect_open_error(tpath("v2.bin"), ZS_ERR_CORRUPT, "v2.bin", "version 2 (uint32");
    write_llmc(tpath("v7.bin"), 20240520, 7, 10, g_tok, 10, 0, 1024);
    expect_open_error(tpath("v7.bin"), ZS_ERR_CORRUPT, "v7.bin", "version 7");
    write_llmc(tpath("cut.bin"), 20240520, 1, 10, g_tok, 0, 0, 512);
    expect_open_error(tpath("cut.bin"), ZS_ERR_CORRUPT, "cut.bin", "shorter than the 1024-byte");
    write_llmc(tpath("trunc.bin"), 20240520, 1, 10, g_tok, 9, 0, 1024);
    expect_open_error(tpath("trunc.bin"), ZS_ERR_CORRUPT, "trunc.bin", "truncated");
    write_llmc(tpath("trail.bin"), 20240520, 1, 10, g_tok, 10, 1, 1024);
    expect_open_error(tpath("trail.bin"), ZS_ERR_CORRUPT, "trail.bin", "trailing");
    char spec[1200];
    snprintf(spec, sizeof spec, "%s", tpath("nomatch_*.bin"));
    expect_open_error(spec, ZS_ERR_NOTFOUND, "nomatch_", "no file matches");
    /* a list with a bad file: the error names that file */
    snprintf(spec, sizeof spec, "%s,%s", tpath("shard_000.bin"), tpath("trunc.bin"));
    expect_open_error(spec, ZS_ERR_CORRUPT, "trunc.bin", "truncated");
    zs_err_t err;
    uint16_t bytes[100];
    for (int i = 0; i < 100; i++)
        bytes[i] = (uint16_t)i;
    TEST_OK(zs_data_write(tpath("bytes.tok"), 256, bytes, 100, &err), err);
    snprintf(spec, sizeof spec, "%s,%s", tpath("shard_000.bin"), tpath("bytes.tok"));
    expect_open_error(spec, ZS_ERR_INVALID, "bytes.tok", "one vocabulary");
    /* a token >= 50257 fails the sample that reads it */
    uint16_t big[20];
    for (int i = 0; i < 20; i++)
        big[i] = (uint16_t)(i == 10 ? 50257 : i);
    write_llmc(tpath("big.bin"), 20240520, 1, 20, big, 20, 0, 1024);
    zs_data_t *d;
    TEST_OK(zs_data_open(tpath("big.bin"), &d, &err), err);
    int32_t in[19], tg[19];
    int rc = zs_data_sample(d, 0, 19, in, tg, &err);
    TEST_CHECKF(rc == ZS_ERR_CORRUPT && strstr(err.msg, "50257"), "rc %d: %s", rc, err.msg);
    printf("  refused as expected: %s\n", err.msg);
    zs_data_close(d);
}

/* zs-train on spec, 2 workers, no servers; final parameters to params. */
static void train(const char *spec, const char *params, const char *log)
{
    zs_test_run_ok(log,
                   "ZS_LOG_LEVEL=warn %s " ZS_TEST_MPI_OPTS " -np 2 %s --data '%s' --layers 1 "
                   "--heads 2 --width 16 --ctx 16 --steps 4 --log-every 4 --save-params %s",
                   ZS_MPIEXEC, ZS_TRAIN, spec, params);
}

static void check_train(void)
{
    char spec[1200];
    snprintf(spec, sizeof spec, "%s/shard_*.bin", dir);
    train(spec, tpath("p_llmc"), tpath("train_llmc.log"));
    train(tpath("same.tok"), tpath("p_zs"), tpath("train_zs.log"));
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", tpath("p_llmc"), tpath("p_zs")) == 0,
                "llm.c shards and the zeroshard file trained to different parameters");
    TEST_CHECK(zs_test_sh("test -s %s", tpath("p_zs")) == 0);
    printf("3. zs-train, W=2, 4 steps: llm.c shards (glob) and one zeroshard file give "
           "bitwise-equal parameters\n");
    int rc = zs_test_sh("%s " ZS_TEST_MPI_OPTS " -np 2 %s --data %s --steps 1 > %s 2>&1",
                        ZS_MPIEXEC, ZS_TRAIN, tpath("trunc.bin"), tpath("bad.log"));
    TEST_CHECKF(rc == 4 && zs_test_sh("grep -q 'trunc.bin.*truncated' %s", tpath("bad.log")) == 0,
                "a truncated shard: exit %d (want 4 naming it)", rc);
    printf("3. zs-train on a truncated shard: exit 4, naming it\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(dir, sizeof dir, "%s", zs_test_tmpdir("data-llmc"));
    make_tokens();
    char spec[1600];
    snprintf(spec, sizeof spec, "%s,%s,%s", tpath("shard_000.bin"), tpath("shard_001.bin"),
             tpath("shard_002.bin"));
    check_same(spec);
    snprintf(spec, sizeof spec, "%s/shard_00?.bin", dir);
    check_same(spec);
    check_refusals();
    check_train();
    free(g_tok);
    printf("test_data_llmc: all checks passed\n");
    return 0;
}
