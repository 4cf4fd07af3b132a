/*
 * zs_tokenize.c - zs-tokenize: text files to a zeroshard token file.
 *
 *   zs-tokenize -o OUT.tok FILE...
 *   zs-tokenize --gpt2 DIR [--eot-between-files] -o OUT.tok FILE...
 *   zs-tokenize --print F.tok | --decode DIR F.tok
 *
 * This file: options, and the byte-level tokenizer (the default): vocab 256, token = byte value, so
 * any file (UTF-8 text or not) is encoded losslessly and nothing needs training. The files are
 * concatenated in the order given, with nothing between them. The output is written atomically
 * (zs_data_write: temporary file, fsync, rename) in the format of worker/model/zs_data.h. One
 * progress line per input goes to stderr, the summary "N bytes -> N tokens, vocab 256" to stdout.
 * The GPT-2 BPE mode and the readers are in zs_tokenize_gpt2.c.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_data.h"
#include "zs_tokenize.h"

#define VOCAB 256u

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-tokenize -o OUT.tok FILE...\n"
               "       zs-tokenize --gpt2 DIR [--eot-between-files] -o OUT.tok FILE...\n"
               "       zs-tokenize --print F.tok\n"
               "       zs-tokenize --decode DIR F.tok\n"
               "  Concatenates the FILEs and writes them as one zeroshard token file\n"
               "  (docs/data.md). Default: byte-level (vocab 256, token = byte value).\n"
               "  --gpt2 DIR            GPT-2 byte-level BPE (vocab 50257); DIR holds OpenAI's\n"
               "                        encoder.json and vocab.bpe\n"
               "  --eot-between-files   with --gpt2: <|endoftext|> (50256) between files\n"
               "  -o, --output OUT.tok  the token file to write (replaced atomically)\n"
               "  -q, --quiet           no progress lines\n"
               "  --print F.tok         print the ids of F.tok, one per line\n"
               "  --decode DIR F.tok    print the text of F.tok, decoded with DIR's GPT-2 vocab\n"
               "  -h, --help            this text\n"
               "  example: zs-tokenize -o licenses.tok /usr/share/common-licenses/*\n");
}

typedef zs__tokbuf_t tokbuf_t;

int zs__tokbuf_grow(tokbuf_t *b, uint64_t need)
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
        if (zs__tokbuf_grow(b, b->n + n)) {
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
    enum { OPT_GPT2 = 256, OPT_EOT, OPT_PRINT, OPT_DECODE };
    static const struct option opts[] = {{"output", required_argument, 0, 'o'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {"gpt2", required_argument, 0, OPT_GPT2},
                                         {"eot-between-files", no_argument, 0, OPT_EOT},
                                         {"print", no_argument, 0, OPT_PRINT},
                                         {"decode", required_argument, 0, OPT_DECODE},
                                         {0, 0, 0, 0}};
    const char *out = NULL, *gpt2 = NULL, *decode = NULL;
    int quiet = 0, eot = 0, print = 0, ch;
    while ((ch = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        switch (ch) {
        case OPT_GPT2:
            gpt2 = optarg;
            break;
        case OPT_EOT:
            eot = 1;
            break;
        case OPT_PRINT:
            print = 1;
            break;
        case OPT_DECODE:
            decode = optarg;
            break;
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
    if (print || decode) {
        if (print && decode) {
            fprintf(stderr, "zs-tokenize: --print and --decode exclude each other\n");
            return 2;
        }
        if (out || gpt2 || eot || optind + 1 != argc) {
            fprintf(stderr, "zs-tokenize: --%s takes one token file and no other option\n",
                    print ? "print" : "decode");
            usage(stderr);
            return 2;
        }
        return print ? zs__tokenize_print(argv[optind]) : zs__tokenize_decode(decode, argv[optind]);
    }
    if (eot && !gpt2) {
        fprintf(stderr, "zs-tokenize: --eot-between-files needs --gpt2 DIR (the byte-level "
                        "vocab has no <|endoftext|>)\n");
        return 2;
    }
    if (!out || optind >= argc) {
        fprintf(stderr, "zs-tokenize: %s\n", !out ? "-o OUT.tok is required" : "no input files");
        usage(stderr);
        return 2;
    }
    int nfiles = argc - optind;
    if (gpt2)
        return zs__tokenize_gpt2(gpt2, argv + optind, nfiles, eot, quiet, out);
    tokbuf_t b = {0};
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
