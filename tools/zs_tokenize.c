/*
 * zs_tokenize.c - zs-tokenize: text files to a zeroshard token file.
 *
 *   zs-tokenize -o OUT.tok FILE...
 *
 * Byte-level tokenizer: vocab 256, token = byte value, so any file
 * (UTF-8 text or not) is encoded losslessly and nothing needs training.
 * The files are concatenated in the order given, with nothing between
 * them. The output is written atomically (zs_data_write: temporary file,
 * fsync, rename) in the format of worker/model/zs_data.h. One progress line per
 * input goes to stderr, the summary "N bytes -> N tokens, vocab 256" to
 * stdout.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_data.h"

#define VOCAB 256u

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-tokenize -o OUT.tok FILE...\n"
               "  Byte-level tokenizer (vocab 256, token = byte value): concatenates the\n"
               "  FILEs and writes them as one zeroshard token file (docs/data.md).\n"
               "  -o, --output OUT.tok  the token file to write (replaced atomically)\n"
               "  -q, --quiet           no progress lines\n"
               "  -h, --help            this text\n"
               "  example: zs-tokenize -o licenses.tok /usr/share/common-licenses/*\n");
}

typedef struct tokbuf {
    uint16_t *t;
    uint64_t n, cap;
} tokbuf_t;

static int grow(tokbuf_t *b, uint64_t need)
{
    if (need <= b->cap)
        return 0;
    uint64_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < need)
        cap *= 2;
    if (cap > SIZE_MAX / sizeof *b->t)
        return -1;
    uint16_t *t = realloc(b->t, (size_t)cap * sizeof *t);
    if (!t)
        return -1;
    b->t = t;
    b->cap = cap;
    return 0;
}

/* Append the bytes of one file as tokens; returns bytes read or -1. */
static int64_t add_file(tokbuf_t *b, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "zs-tokenize: %s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    unsigned char buf[1 << 16];
    int64_t total = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (grow(b, b->n + n)) {
            fprintf(stderr, "zs-tokenize: %s: out of memory at %llu tokens\n", path,
                    (unsigned long long)b->n);
            fclose(f);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            b->t[b->n + i] = buf[i];
        b->n += n;
        total += (int64_t)n;
    }
    int bad = ferror(f);
    int e = errno;
    fclose(f);
    if (bad) {
        fprintf(stderr, "zs-tokenize: %s: read error: %s\n", path, strerror(e));
        return -1;
    }
    return total;
}

/* zs-tokenize entry point: 0 on success, 1 on an I/O error, 2 on usage. */
int main(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, 0, 'o'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *out = NULL;
    int quiet = 0, ch;
    while ((ch = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        switch (ch) {
        case 'o':
            out = optarg;
            break;
        case 'q':
            quiet = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!out || optind >= argc) {
        fprintf(stderr, "zs-tokenize: %s\n", !out ? "-o OUT.tok is required" : "no input files");
        usage(stderr);
        return 2;
    }
    tokbuf_t b = {0};
    int nfiles = argc - optind;
    for (int i = 0; i < nfiles; i++) {
        const char *path = argv[optind + i];
        int64_t n = add_file(&b, path);
        if (n < 0) {
            free(b.t);
            return 1;
        }
        if (!quiet)
            fprintf(stderr, "zs-tokenize: [%d/%d] %s: %lld bytes (%llu tokens so far)\n", i + 1,
                    nfiles, path, (long long)n, (unsigned long long)b.n);
    }
    if (b.n == 0) {
        fprintf(stderr, "zs-tokenize: the input files are empty; nothing written to %s\n", out);
        free(b.t);
        return 1;
    }
    zs_err_t err;
    if (zs_data_write(out, VOCAB, b.t, b.n, &err) != ZS_OK) {
        fprintf(stderr, "zs-tokenize: %s\n", err.msg);
        free(b.t);
        return 1;
    }
    printf("%llu bytes -> %llu tokens, vocab %u: %s\n", (unsigned long long)b.n,
           (unsigned long long)b.n, VOCAB, out);
    free(b.t);
    return 0;
}
