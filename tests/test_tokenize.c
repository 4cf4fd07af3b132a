/*
 * test_tokenize.c - the zs-tokenize executable (tools/zs_tokenize.c).
 *
 * Runs the built zs-tokenize (ZS_TOKENIZE, its path from CMake) on temporary
 * files: every byte value, UTF-8 text, several files concatenated in order,
 * atomic replacement of an existing output; reads the result back with
 * zs_data_open / zs_data_sample and checks the summary line. Also the
 * refusals: no -o, no inputs, a missing input (output untouched), empty
 * inputs, and --help.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zs_data.h"
#include "zs_test.h"

#ifndef ZS_TOKENIZE
#error "ZS_TOKENIZE (path of the zs-tokenize executable) must be defined"
#endif

static char dir[256];

static const char *tpath(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f && fwrite(b, 1, n, f) == n && fclose(f) == 0);
}

static char *slurp(const char *path)
{
    static char buf[8192];
    FILE *f = fopen(path, "rb");
    TEST_CHECK(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* Run zs-tokenize with `args` (already quoted); stdout and stderr to files. */
static int run(const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", ZS_TOKENIZE, args, tpath("stdout"),
             tpath("stderr"));
    int st = system(cmd);
    TEST_CHECK(st != -1 && WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* The whole token file as ints, via zs_data_sample with T = count - 1. */
static void expect_tokens(const char *path, const unsigned char *want, size_t n)
{
    zs_err_t err;
    zs_data_t *d;
    TEST_OK(zs_data_open(path, &d, &err), err);
    TEST_CHECK(zs_data_vocab(d) == 256);
    TEST_CHECKF(zs_data_count(d) == n, "count %llu, want %zu", (unsigned long long)zs_data_count(d),
                n);
    int T = (int)n - 1;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    TEST_CHECK(in && tg);
    TEST_OK(zs_data_sample(d, 7, T, in, tg, &err), err);
    for (int i = 0; i < T; i++) {
        TEST_CHECKF(in[i] == want[i], "token %d: %d, want byte %u", i, in[i], want[i]);
        TEST_CHECK(tg[i] == want[i + 1]);
    }
    /* Short windows anywhere match the bytes at their offset. */
    for (int64_t j = 0; j < 200; j++) {
        TEST_OK(zs_data_sample(d, j, 8, in, tg, &err), err);
        uint64_t s = zs_data_offset(d, j, 8);
        for (int i = 0; i < 8; i++)
            TEST_CHECK(in[i] == want[s + (uint64_t)i] && tg[i] == want[s + (uint64_t)i + 1]);
    }
    free(in);
    free(tg);
    zs_data_close(d);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/zs_test_tokenize.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    TEST_CHECK(mkdtemp(dir));
    char args[1024];

    /* a.txt: UTF-8 text; b.bin: every byte value 0..255 twice. */
    const char *text = "Ψ bytes, not words: ZeRO shards 16Ψ over N GPUs.\n\tÄ\r\n";
    size_t na = strlen(text);
    unsigned char bin[512];
    for (int i = 0; i < 512; i++)
        bin[i] = (unsigned char)(i & 0xff);
    write_file(tpath("a.txt"), text, na);
    write_file(tpath("b.bin"), bin, sizeof bin);
    unsigned char all[1024];
    memcpy(all, text, na);
    memcpy(all + na, bin, sizeof bin);
    size_t n = na + sizeof bin;

    snprintf(args, sizeof args, "-o '%s' '%s' '%s'", tpath("out.tok"), tpath("a.txt"),
             tpath("b.bin"));
    TEST_CHECK(run(args) == 0);
    char want[128];
    snprintf(want, sizeof want, "%zu bytes -> %zu tokens, vocab 256", n, n);
    TEST_CHECKF(strstr(slurp(tpath("stdout")), want), "stdout: %s", slurp(tpath("stdout")));
    char *err_out = slurp(tpath("stderr"));
    TEST_CHECKF(strstr(err_out, "[1/2]") && strstr(err_out, "[2/2]") && strstr(err_out, "b.bin"),
                "progress: %s", err_out);
    expect_tokens(tpath("out.tok"), all, n);
    struct stat st;
    TEST_CHECK(stat(tpath("out.tok"), &st) == 0 && st.st_size == 64 + 2 * (off_t)n);
    printf("two files, %zu bytes: ok\n", n);

    /* Order matters; the output is replaced (long option form, --quiet). */
    snprintf(args, sizeof args, "--quiet --output='%s' '%s' '%s'", tpath("out.tok"), tpath("b.bin"),
             tpath("a.txt"));
    TEST_CHECK(run(args) == 0);
    TEST_CHECK(slurp(tpath("stderr"))[0] == '\0');
    memcpy(all, bin, sizeof bin);
    memcpy(all + sizeof bin, text, na);
    expect_tokens(tpath("out.tok"), all, n);
    printf("reversed order, replaced output: ok\n");

    /* Refusals: the existing output stays as it is. */
    TEST_CHECK(run("") == 2);
    TEST_CHECK(strstr(slurp(tpath("stderr")), "-o OUT.tok is required"));
    snprintf(args, sizeof args, "-o '%s'", tpath("out.tok"));
    TEST_CHECK(run(args) == 2);
    TEST_CHECK(strstr(slurp(tpath("stderr")), "no input files"));
    snprintf(args, sizeof args, "-o '%s' '%s' '%s'", tpath("out.tok"), tpath("a.txt"),
             tpath("missing.txt"));
    TEST_CHECK(run(args) == 1);
    TEST_CHECKF(strstr(slurp(tpath("stderr")), "missing.txt: cannot open"), "%s",
                slurp(tpath("stderr")));
    snprintf(args, sizeof args, "-o '%s' '%s'", tpath("out.tok"), dir);
    TEST_CHECK(run(args) == 1);
    TEST_CHECKF(strstr(slurp(tpath("stderr")), "read error"), "%s", slurp(tpath("stderr")));
    write_file(tpath("empty.txt"), "", 0);
    snprintf(args, sizeof args, "-o '%s' '%s'", tpath("out.tok"), tpath("empty.txt"));
    TEST_CHECK(run(args) == 1);
    TEST_CHECK(strstr(slurp(tpath("stderr")), "empty"));
    expect_tokens(tpath("out.tok"), all, n);
    snprintf(args, sizeof args, "-o '%s' '%s'", tpath("never.tok"), tpath("missing.txt"));
    TEST_CHECK(run(args) == 1);
    TEST_CHECK(access(tpath("never.tok"), F_OK) != 0);
    TEST_CHECK(run("--help") == 0);
    TEST_CHECK(strstr(slurp(tpath("stdout")), "usage: zs-tokenize -o OUT.tok FILE..."));
    printf("refusals: ok\n");

    DIR *dd = opendir(dir);
    TEST_CHECK(dd);
    struct dirent *e;
    int leftovers = 0;
    while ((e = readdir(dd))) {
        if (e->d_name[0] == '.')
            continue;
        leftovers += strstr(e->d_name, ".tmp") != NULL;
        unlink(tpath(e->d_name));
    }
    closedir(dd);
    rmdir(dir);
    TEST_CHECK(leftovers == 0);
    printf("test_tokenize: all passed\n");
    return 0;
}
