/*
 * test_data.c - token files and deterministic sampling (worker/model/zs_data.c).
 *
 * Round trip through zs_data_write / zs_data_open / zs_data_sample; every
 * validation error of zs_data_open on a crafted bad file (code, file name
 * and problem in the message); writer refusals and atomic replacement; the
 * sampling rule: known answers of the documented SplitMix64 formula, same j
 * -> same window across opens and across processes, windows within bounds
 * and spread over every start position, the count == T + 1 edge and the
 * count < T + 1 refusal. Version 2 (the GPT-2 vocabulary record of
 * zs-tokenize --gpt2): written by the streaming writer, read back (tokens
 * and record), version 1 files unchanged, lists keep a record only when
 * every file has the same one, a cut or NUL-holding path refused, and the
 * recorded vocabulary loads only while its files hash as recorded.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zs_bpe.h"
#include "zs_data.h"
#include "zs_test.h"
#include "zs_vocabtest.h"

static char dir[256];

static const char *tpath(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* ---- crafting files ------------------------------------------------------- */

typedef struct hdr {
    char magic[8];
    uint32_t version, vocab;
    uint64_t count;
    uint32_t token_bytes;
    uint8_t reserved[36];
} hdr_t;

static hdr_t good_hdr(uint32_t vocab, uint64_t count)
{
    hdr_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "ZSTOKENS", 8);
    h.version = 1;
    h.vocab = vocab;
    h.count = count;
    h.token_bytes = 2;
    return h;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

/* Write header h, then ntok u16 tokens (little-endian), then `extra` bytes. */
static void craft(const char *path, const hdr_t *h, const uint16_t *tok, size_t ntok, size_t extra)
{
    uint8_t b[64];
    memcpy(b, h->magic, 8);
    put32(b + 8, h->version);
    put32(b + 12, h->vocab);
    put32(b + 16, (uint32_t)h->count);
    put32(b + 20, (uint32_t)(h->count >> 32));
    put32(b + 24, h->token_bytes);
    memcpy(b + 28, h->reserved, 36);
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f);
    TEST_CHECK(fwrite(b, 1, 64, f) == 64);
    for (size_t i = 0; i < ntok; i++) {
        uint8_t t[2] = {(uint8_t)tok[i], (uint8_t)(tok[i] >> 8)};
        TEST_CHECK(fwrite(t, 1, 2, f) == 2);
    }
    for (size_t i = 0; i < extra; i++)
        TEST_CHECK(fputc(0, f) != EOF);
    TEST_CHECK(fclose(f) == 0);
}

/* zs_data_open(path) must fail with `code`, naming the file and `what`. */
static void expect_open_error(const char *path, int code, const char *what)
{
    zs_data_t *d = (zs_data_t *)1;
    zs_err_t err;
    zs_err_clear(&err);
    int rc = zs_data_open(path, &d, &err);
    TEST_CHECKF(rc == code, "%s: rc %d (%s), want %d: %s", path, rc, zs_status_name(rc), code,
                err.msg);
    TEST_CHECKF(err.code == code, "err.code %d", err.code);
    TEST_CHECK(d == NULL);
    TEST_CHECKF(strstr(err.msg, path) != NULL, "message does not name the file: %s", err.msg);
    TEST_CHECKF(strstr(err.msg, what) != NULL, "message lacks \"%s\": %s", what, err.msg);
    printf("  refused as expected: %s\n", err.msg);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_roundtrip(void)
{
    enum { N = 100003 };
    uint16_t *tok = malloc(N * sizeof *tok);
    TEST_CHECK(tok);
    for (uint32_t i = 0; i < N; i++)
        tok[i] = (uint16_t)((i * 2654435761u) % 50257);
    zs_err_t err;
    const char *p = tpath("rt.tok");
    TEST_OK(zs_data_write(p, 50257, tok, N, &err), err);
    struct stat st;
    TEST_CHECK(stat(p, &st) == 0);
    TEST_CHECK(st.st_size == 64 + 2 * (off_t)N);
    TEST_CHECK((st.st_mode & 0777) == 0644);

    /* The header bytes are exactly the documented layout. */
    uint8_t h[64];
    FILE *f = fopen(p, "rb");
    TEST_CHECK(f && fread(h, 1, 64, f) == 64);
    uint8_t t0[2];
    TEST_CHECK(fread(t0, 1, 2, f) == 2);
    fclose(f);
    TEST_CHECK(memcmp(h, "ZSTOKENS", 8) == 0);
    TEST_CHECK(h[8] == 1 && h[9] == 0 && h[10] == 0 && h[11] == 0);
    TEST_CHECK(h[12] == (50257 & 0xff) && h[13] == (50257 >> 8) && h[14] == 0 && h[15] == 0);
    TEST_CHECK(h[16] == (N & 0xff) && h[17] == ((N >> 8) & 0xff) && h[18] == (N >> 16));
    for (int i = 19; i < 24; i++)
        TEST_CHECK(h[i] == 0);
    TEST_CHECK(h[24] == 2 && h[25] == 0 && h[26] == 0 && h[27] == 0);
    for (int i = 28; i < 64; i++)
        TEST_CHECK(h[i] == 0);
    TEST_CHECK(t0[0] == (tok[0] & 0xff) && t0[1] == tok[0] >> 8);

    zs_data_t *d;
    TEST_OK(zs_data_open(p, &d, &err), err);
    TEST_CHECK(zs_data_vocab(d) == 50257);
    TEST_CHECK(zs_data_count(d) == N);
    int32_t in[256], tg[256];
    for (int64_t j = 0; j < 2000; j++) {
        int T = 1 + (int)(j % 256);
        TEST_OK(zs_data_sample(d, j, T, in, tg, &err), err);
        uint64_t s = zs_data_offset(d, j, T);
        TEST_CHECK(s + (uint64_t)T < N);
        for (int i = 0; i < T; i++) {
            TEST_CHECK(in[i] == tok[s + (uint64_t)i]);
            TEST_CHECK(tg[i] == tok[s + (uint64_t)i + 1]);
        }
    }
    zs_data_close(d);
    zs_data_close(NULL);
    free(tok);
    printf("roundtrip: ok\n");
}

static void test_open_errors(void)
{
    uint16_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    hdr_t h;

    expect_open_error(tpath("missing.tok"), ZS_ERR_NOTFOUND, "cannot open");
    expect_open_error(dir, ZS_ERR_INVALID, "not a regular file");

    FILE *f = fopen(tpath("short.tok"), "wb");
    TEST_CHECK(f && fwrite("ZSTOKENS\1\0\0\0", 1, 12, f) == 12);
    fclose(f);
    expect_open_error(tpath("short.tok"), ZS_ERR_CORRUPT, "shorter than the 64-byte header");

    f = fopen(tpath("empty.tok"), "wb");
    TEST_CHECK(f);
    fclose(f);
    expect_open_error(tpath("empty.tok"), ZS_ERR_CORRUPT, "0 bytes, shorter");

    h = good_hdr(256, 8);
    memcpy(h.magic, "ZSTOKENX", 8);
    craft(tpath("magic.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("magic.tok"), ZS_ERR_CORRUPT, "bad magic \"ZSTOKENX\"");

    h = good_hdr(256, 8);
    memcpy(h.magic, "\x89PNG\r\n\x1a\n", 8);
    craft(tpath("png.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("png.tok"), ZS_ERR_CORRUPT, "bad magic \"\\x89PNG\\x0d");

    h = good_hdr(256, 8);
    h.version = 3;
    craft(tpath("version.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("version.tok"), ZS_ERR_CORRUPT, "format version 3");

    h = good_hdr(256, 8); /* version 2 needs a tokenizer it knows */
    h.version = 2;
    craft(tpath("v2kind.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("v2kind.tok"), ZS_ERR_CORRUPT, "tokenizer 0 in the header");

    h = good_hdr(0, 8);
    craft(tpath("vocab0.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("vocab0.tok"), ZS_ERR_CORRUPT, "vocab 0 in the header");

    h = good_hdr(65537, 8);
    craft(tpath("vocabbig.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("vocabbig.tok"), ZS_ERR_CORRUPT, "vocab 65537 in the header");

    h = good_hdr(256, 4);
    h.token_bytes = 4;
    craft(tpath("tb.tok"), &h, tok, 8, 0); /* 4 x 4 bytes: size would fit token_bytes 4 */
    expect_open_error(tpath("tb.tok"), ZS_ERR_CORRUPT, "token_bytes 4");

    h = good_hdr(256, 8);
    h.reserved[35] = 7;
    craft(tpath("reserved.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("reserved.tok"), ZS_ERR_CORRUPT, "offset 63 is 0x07");

    h = good_hdr(256, 8);
    craft(tpath("trunc.tok"), &h, tok, 7, 1); /* 15 token bytes instead of 16 */
    expect_open_error(tpath("trunc.tok"), ZS_ERR_CORRUPT,
                      "size 79 bytes disagrees with the header's count of 8 tokens");

    craft(tpath("trailing.tok"), &h, tok, 8, 1);
    expect_open_error(tpath("trailing.tok"), ZS_ERR_CORRUPT, "size 81 bytes");

    h = good_hdr(256, UINT64_MAX / 2); /* 64 + 2 * count overflows */
    craft(tpath("overflow.tok"), &h, tok, 8, 0);
    expect_open_error(tpath("overflow.tok"), ZS_ERR_CORRUPT, "truncated or trailing data");

    /* The vocab bounds themselves are fine. */
    zs_err_t err;
    zs_data_t *d;
    h = good_hdr(65536, 8);
    craft(tpath("vocabmax.tok"), &h, tok, 8, 0);
    TEST_OK(zs_data_open(tpath("vocabmax.tok"), &d, &err), err);
    TEST_CHECK(zs_data_vocab(d) == 65536);
    zs_data_close(d);
    h = good_hdr(1, 0);
    craft(tpath("vocab1.tok"), &h, tok, 0, 0);
    TEST_OK(zs_data_open(tpath("vocab1.tok"), &d, &err), err);
    TEST_CHECK(zs_data_vocab(d) == 1 && zs_data_count(d) == 0);
    zs_data_close(d);
    printf("open errors: ok\n");
}

static void test_sample_errors(void)
{
    zs_err_t err;
    zs_data_t *d;
    int32_t in[64], tg[64];

    /* A token >= vocab, crafted behind the writer's back: found per sample. */
    uint16_t tok[9] = {0, 1, 2, 3, 4, 5, 6, 7, 9};
    hdr_t h = good_hdr(9, 9);
    craft(tpath("badtok.tok"), &h, tok, 9, 0);
    TEST_OK(zs_data_open(tpath("badtok.tok"), &d, &err), err);
    TEST_CHECK(zs_data_sample(d, 0, 8, in, tg, &err) == ZS_ERR_CORRUPT);
    TEST_CHECKF(strstr(err.msg, tpath("badtok.tok")) &&
                    strstr(err.msg, "token 9 at position 8 is >= vocab 9"),
                "%s", err.msg);
    printf("  refused as expected: %s\n", err.msg);
    /* Windows that avoid the bad token are fine: T = 4 has 5 starts, 0..4. */
    for (int64_t j = 0; j < 100; j++) {
        int rc = zs_data_sample(d, j, 4, in, tg, &err);
        uint64_t s = zs_data_offset(d, j, 4);
        TEST_CHECKF(rc == (s + 4 >= 8 ? ZS_ERR_CORRUPT : ZS_OK), "j %lld s %llu rc %d",
                    (long long)j, (unsigned long long)s, rc);
    }

    /* count < T + 1 refused; bad T, j and NULLs refused. */
    TEST_CHECK(zs_data_sample(d, 0, 9, in, tg, &err) == ZS_ERR_RANGE);
    TEST_CHECKF(strstr(err.msg, "9 tokens, too few for one window of T + 1 = 10"), "%s", err.msg);
    TEST_CHECK(strstr(err.msg, tpath("badtok.tok")));
    printf("  refused as expected: %s\n", err.msg);
    TEST_CHECK(zs_data_offset(d, 0, 9) == 0);
    TEST_CHECK(zs_data_sample(d, 0, 0, in, tg, &err) == ZS_ERR_RANGE);
    TEST_CHECK(strstr(err.msg, "T = 0"));
    TEST_CHECK(zs_data_sample(d, -1, 4, in, tg, &err) == ZS_ERR_RANGE);
    TEST_CHECK(strstr(err.msg, "sample index -1 is negative"));
    TEST_CHECK(zs_data_sample(d, 0, 4, NULL, tg, &err) == ZS_ERR_INVALID);
    zs_data_close(d);

    /* An empty file opens, but holds no window. */
    TEST_OK(zs_data_open(tpath("vocab1.tok"), &d, &err), err);
    TEST_CHECK(zs_data_sample(d, 0, 1, in, tg, &err) == ZS_ERR_RANGE);
    zs_data_close(d);
    printf("sample errors: ok\n");
}

static int count_files(void)
{
    DIR *dd = opendir(dir);
    TEST_CHECK(dd);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        n += e->d_name[0] != '.';
    closedir(dd);
    return n;
}

static void test_write(void)
{
    zs_err_t err;
    zs_data_t *d;
    uint16_t a[4] = {1, 2, 3, 4}, b[6] = {9, 8, 7, 6, 5, 65535};
    const char *p = tpath("w.tok");
    int before = count_files();

    /* Refusals leave nothing behind. */
    TEST_CHECK(zs_data_write(p, 4, a, 4, &err) == ZS_ERR_RANGE);
    TEST_CHECKF(strstr(err.msg, p) && strstr(err.msg, "token 4 at position 3 is >= vocab 4"), "%s",
                err.msg);
    TEST_CHECK(zs_data_write(p, 0, a, 4, &err) == ZS_ERR_RANGE);
    TEST_CHECK(strstr(err.msg, "vocab 0, must be 1..65536"));
    TEST_CHECK(zs_data_write(p, 65537, a, 4, &err) == ZS_ERR_RANGE);
    TEST_CHECK(zs_data_write(p, 10, NULL, 4, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_data_write(tpath("nodir/x.tok"), 10, a, 4, &err) == ZS_ERR_NOTFOUND);
    TEST_CHECK(strstr(err.msg, "nodir/x.tok") && strstr(err.msg, "temporary file"));
    TEST_CHECK(count_files() == before);

    /* Write, then replace: the reader sees the new file, no temporaries remain. */
    TEST_OK(zs_data_write(p, 5, a, 4, &err), err);
    TEST_CHECK(count_files() == before + 1);
    zs_data_t *old;
    TEST_OK(zs_data_open(p, &old, &err), err);
    TEST_OK(zs_data_write(p, 65536, b, 6, &err), err);
    TEST_CHECK(count_files() == before + 1);
    TEST_OK(zs_data_open(p, &d, &err), err);
    TEST_CHECK(zs_data_vocab(d) == 65536 && zs_data_count(d) == 6);
    int32_t in[5], tg[5];
    TEST_OK(zs_data_sample(d, 12345, 5, in, tg, &err), err);
    for (int i = 0; i < 5; i++)
        TEST_CHECK(in[i] == b[i] && tg[i] == b[i + 1]);
    TEST_CHECK(tg[4] == 65535);
    /* A reader of the old file keeps its (unlinked) mapping intact. */
    TEST_CHECK(zs_data_vocab(old) == 5 && zs_data_count(old) == 4);
    TEST_OK(zs_data_sample(old, 0, 3, in, tg, &err), err);
    TEST_CHECK(in[0] == 1 && tg[2] == 4);
    zs_data_close(old);
    zs_data_close(d);
    printf("write: ok\n");
}

/* The documented rule, independently: SplitMix64 finaliser mod (count - T). */
static uint64_t ref_offset(int64_t j, uint64_t count, int T)
{
    uint64_t x = (uint64_t)j + 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x % (count - (uint64_t)T);
}

static void test_determinism(void)
{
    zs_err_t err;
    enum { N = 5000, T = 16, J = 4000 };
    uint16_t *tok = malloc(N * sizeof *tok);
    TEST_CHECK(tok);
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i % 256);
    const char *p = tpath("det.tok");
    TEST_OK(zs_data_write(p, 256, tok, N, &err), err);
    zs_data_t *d, *d2;
    TEST_OK(zs_data_open(p, &d, &err), err);
    TEST_OK(zs_data_open(p, &d2, &err), err);

    /* Known answers: the published SplitMix64 outputs for seed 0 (first two). */
    uint64_t m = N - T;
    TEST_CHECK(zs_data_offset(d, 0, T) == 0xe220a8397b1dcdafull % m);
    TEST_CHECK(zs_data_offset(d, (int64_t)0x9e3779b97f4a7c15ull, T) == 0x6e789e6aa1b965f4ull % m);

    /* Same j -> same window (any open, any order); matches the rule. */
    uint64_t *off = malloc(J * sizeof *off);
    TEST_CHECK(off);
    for (int64_t j = J - 1; j >= 0; j--)
        off[j] = zs_data_offset(d2, j, T);
    int32_t in[T], tg[T], in2[T], tg2[T];
    for (int64_t j = 0; j < J; j++) {
        TEST_CHECK(zs_data_offset(d, j, T) == off[j]);
        TEST_CHECK(off[j] == ref_offset(j, N, T));
        TEST_OK(zs_data_sample(d, j, T, in, tg, &err), err);
        TEST_OK(zs_data_sample(d2, j, T, in2, tg2, &err), err);
        TEST_CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0);
        TEST_CHECK(in[0] == (int32_t)(off[j] % 256));
    }
    int64_t big = INT64_MAX;
    TEST_CHECK(zs_data_offset(d, big, T) == ref_offset(big, N, T));

    /* Different processes agree: a child computes the offsets and sends them. */
    int fds[2];
    TEST_CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    TEST_CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        zs_data_t *c;
        zs_err_t e;
        if (zs_data_open(p, &c, &e) != ZS_OK)
            _exit(3);
        for (int64_t j = 0; j < J; j++) {
            uint64_t o = zs_data_offset(c, j, T);
            if (write(fds[1], &o, sizeof o) != (ssize_t)sizeof o)
                _exit(4);
        }
        zs_data_close(c);
        _exit(0);
    }
    close(fds[1]);
    FILE *r = fdopen(fds[0], "rb");
    TEST_CHECK(r);
    uint64_t *child = malloc(J * sizeof *child);
    TEST_CHECK(child && fread(child, sizeof *child, J, r) == J);
    fclose(r);
    int status;
    TEST_CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    TEST_CHECK(memcmp(child, off, J * sizeof *off) == 0);

    /* Consecutive j are spread over the file, not clustered. */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int j = 0; j < 64; j++) {
        lo = off[j] < lo ? off[j] : lo;
        hi = off[j] > hi ? off[j] : hi;
    }
    TEST_CHECKF(hi - lo > (N - T) / 2, "first 64 windows within [%llu, %llu]",
                (unsigned long long)lo, (unsigned long long)hi);
    free(child);
    free(off);
    zs_data_close(d);
    zs_data_close(d2);
    free(tok);
    printf("determinism: ok\n");
}

static void test_bounds_and_spread(void)
{
    zs_err_t err;
    enum { N = 1040, T = 40, STARTS = N - T, DRAWS = 200000 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)i;
    const char *p = tpath("spread.tok");
    TEST_OK(zs_data_write(p, N, tok, N, &err), err);
    zs_data_t *d;
    TEST_OK(zs_data_open(p, &d, &err), err);
    static int hits[STARTS];
    int32_t in[T], tg[T];
    for (int64_t j = 0; j < DRAWS; j++) {
        uint64_t s = zs_data_offset(d, j, T);
        TEST_CHECKF(s < STARTS, "j %lld: offset %llu, last valid %d", (long long)j,
                    (unsigned long long)s, STARTS - 1);
        hits[s]++;
        if (j % 97 == 0) {
            TEST_OK(zs_data_sample(d, j, T, in, tg, &err), err);
            TEST_CHECK(in[0] == (int32_t)s && tg[T - 1] == (int32_t)s + T);
        }
    }
    /* Every start, first and last included, is drawn about DRAWS/STARTS times. */
    int mn = DRAWS, mx = 0;
    for (int s = 0; s < STARTS; s++) {
        mn = hits[s] < mn ? hits[s] : mn;
        mx = hits[s] > mx ? hits[s] : mx;
    }
    TEST_CHECKF(mn >= 120 && mx <= 290, "hits per start in [%d, %d], expected ~200", mn, mx);
    TEST_CHECK(hits[0] > 0 && hits[STARTS - 1] > 0);

    /* Other T on the same file stay in bounds too. */
    for (int t = 1; t <= N - 1; t += 37)
        for (int64_t j = 0; j < 500; j++)
            TEST_CHECK(zs_data_offset(d, j * 7919, t) + (uint64_t)t < N);
    zs_data_close(d);
    printf("bounds and spread: ok (hits per start %d..%d)\n", mn, mx);
}

static void test_edge_count(void)
{
    zs_err_t err;
    enum { T = 32 };
    uint16_t tok[T + 1];
    for (int i = 0; i <= T; i++)
        tok[i] = (uint16_t)(100 + i);
    const char *p = tpath("edge.tok");
    TEST_OK(zs_data_write(p, 200, tok, T + 1, &err), err);
    zs_data_t *d;
    TEST_OK(zs_data_open(p, &d, &err), err);
    int32_t in[T + 1], tg[T + 1];
    for (int64_t j = 0; j < 1000; j += 3) {
        TEST_CHECK(zs_data_offset(d, j, T) == 0);
        TEST_OK(zs_data_sample(d, j, T, in, tg, &err), err);
        for (int i = 0; i < T; i++)
            TEST_CHECK(in[i] == 100 + i && tg[i] == 101 + i);
    }
    /* count == T: one token short. */
    TEST_CHECK(zs_data_sample(d, 0, T + 1, in, tg, &err) == ZS_ERR_RANGE);
    TEST_CHECKF(strstr(err.msg, "33 tokens, too few for one window of T + 1 = 34"), "%s", err.msg);
    zs_data_close(d);
    printf("count == T + 1 edge: ok\n");
}

/* ---- the GPT-2 vocabulary record (version 2, zs_data_bpe.c) -------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* Write tokens with the streaming writer, recording rec if not NULL. */
static void write_stream(const char *path, const uint32_t *tok, size_t n, const zs_data_bpe_t *rec)
{
    zs_err_t err;
    zs_data_writer_t *w;
    TEST_OK(zs_data_writer_open(path, 258, &w, &err), err);
    if (rec)
        zs_data_writer_set_bpe(w, rec);
    TEST_OK(zs_data_writer_add(w, tok, n, &err), err);
    TEST_OK(zs_data_writer_close(w, 1, &err), err);
}

/* Version 2 round trip, version 1 unchanged, lists, refusals, and loading
 * the recorded vocabulary only while its files hash as recorded. */
static void test_bpe_record(void)
{
    zs_err_t err;
    zs_data_t *d;
    zs_test_write_vocab(tpath("v"));
    static zs_data_bpe_t rec, other;
    TEST_OK(zs_data_bpe_of_dir(tpath("v"), &rec, &err), err);
    char *abs = realpath(tpath("v"), NULL);
    TEST_CHECKF(strcmp(rec.dir, abs) == 0, "recorded %s, expected the absolute %s", rec.dir, abs);
    free(abs);
    uint32_t tok[5] = {97, 256, 98, 257, 10};
    write_stream(tpath("v2.tok"), tok, 5, &rec);
    write_stream(tpath("v1.tok"), tok, 5, NULL);
    /* version 2: tokens at 64 as in version 1, the path after them */
    FILE *f = fopen(tpath("v2.tok"), "rb");
    uint8_t h[64];
    TEST_CHECK(f && fread(h, 1, 64, f) == 64);
    fclose(f);
    struct stat st;
    TEST_CHECK(stat(tpath("v2.tok"), &st) == 0);
    TEST_CHECKF(h[8] == 2 && h[28] == 1 && (size_t)st.st_size == 64 + 10 + strlen(rec.dir),
                "version %u, tokenizer %u, %lld bytes", h[8], h[28], (long long)st.st_size);
    TEST_OK(zs_data_open(tpath("v2.tok"), &d, &err), err);
    const zs_data_bpe_t *got = zs_data_bpe(d);
    uint32_t back[5];
    TEST_OK(zs_data_read(d, 0, 5, back, &err), err);
    TEST_CHECK(got && strcmp(got->dir, rec.dir) == 0 && got->encoder_xxh3 == rec.encoder_xxh3 &&
               got->merges_xxh3 == rec.merges_xxh3 && zs_data_count(d) == 5 &&
               zs_data_vocab(d) == 258 && memcmp(back, tok, sizeof tok) == 0);
    struct zs_bpe *bpe;
    TEST_OK(zs_data_bpe_load(got, &bpe, &err), err);
    zs_bpe_free(bpe);
    zs_data_close(d);
    TEST_OK(zs_data_open(tpath("v1.tok"), &d, &err), err); /* no record: version 1 as before */
    TEST_CHECK(!zs_data_bpe(d));
    zs_data_close(d);
    f = fopen(tpath("v1.tok"), "rb");
    TEST_CHECK(f && fread(h, 1, 64, f) == 64 && h[8] == 1);
    fclose(f);
    /* lists: a record only when every file has the same one */
    char list[1200];
    snprintf(list, sizeof list, "%s,%s", tpath("v2.tok"), tpath("v2.tok"));
    TEST_OK(zs_data_open(list, &d, &err), err);
    TEST_CHECK(zs_data_bpe(d) && zs_data_count(d) == 10);
    zs_data_close(d);
    snprintf(list, sizeof list, "%s,%s", tpath("v2.tok"), tpath("v1.tok"));
    TEST_OK(zs_data_open(list, &d, &err), err);
    TEST_CHECK(!zs_data_bpe(d));
    zs_data_close(d);
    other = rec;
    other.merges_xxh3 ^= 1;
    write_stream(tpath("v2b.tok"), tok, 5, &other);
    snprintf(list, sizeof list, "%s,%s", tpath("v2.tok"), tpath("v2b.tok"));
    TEST_OK(zs_data_open(list, &d, &err), err);
    TEST_CHECK(!zs_data_bpe(d));
    zs_data_close(d);
    /* refusals: a path cut short, a NUL in it */
    f = fopen(tpath("v2.tok"), "rb");
    static uint8_t whole[8192];
    size_t n = fread(whole, 1, sizeof whole, f);
    fclose(f);
    f = fopen(tpath("v2cut.tok"), "wb");
    TEST_CHECK(f && fwrite(whole, 1, n - 1, f) == n - 1 && fclose(f) == 0);
    expect_open_error(tpath("v2cut.tok"), ZS_ERR_CORRUPT, "the vocabulary path's");
    whole[n - 2] = 0;
    f = fopen(tpath("v2nul.tok"), "wb");
    TEST_CHECK(f && fwrite(whole, 1, n, f) == n && fclose(f) == 0);
    expect_open_error(tpath("v2nul.tok"), ZS_ERR_CORRUPT, "holds a NUL byte");
    /* the folder changed: refused, naming the file; gone: not found */
    write_text(tpath("v/vocab.bpe"), "#version: 0.2\n");
    TEST_CHECK(zs_data_bpe_load(&rec, &bpe, &err) == ZS_ERR_CORRUPT);
    TEST_CHECKF(strstr(err.msg, "/vocab.bpe is not the file the tokens were made with"), "%s",
                err.msg);
    write_text(tpath("v/vocab.bpe"), "#version: 0.2\na b\n");
    write_text(tpath("v/encoder.json"), "{}");
    TEST_CHECK(zs_data_bpe_load(&rec, &bpe, &err) == ZS_ERR_CORRUPT);
    TEST_CHECKF(strstr(err.msg, "/encoder.json is not the file"), "%s", err.msg);
    unlink(tpath("v/encoder.json"));
    unlink(tpath("v/vocab.bpe"));
    rmdir(tpath("v"));
    TEST_CHECK(zs_data_bpe_load(&rec, &bpe, &err) == ZS_ERR_NOTFOUND);
    printf("vocabulary record (version 2): ok\n");
}

static void rm_dir(void)
{
    DIR *dd = opendir(dir);
    if (!dd)
        return;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (e->d_name[0] != '.')
            unlink(tpath(e->d_name));
    closedir(dd);
    rmdir(dir);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/zs_test_data.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    TEST_CHECK(mkdtemp(dir));
    test_roundtrip();
    test_open_errors();
    test_sample_errors();
    test_write();
    test_determinism();
    test_bounds_and_spread();
    test_edge_count();
    test_bpe_record();
    rm_dir();
    printf("test_data: all passed\n");
    return 0;
}
