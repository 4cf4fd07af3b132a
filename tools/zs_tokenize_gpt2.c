/*
 * zs_tokenize_gpt2.c - zs-tokenize's GPT-2 mode (--gpt2 DIR: byte-level BPE
 * of worker/model/zs_bpe.h, streamed: text read in 1 MiB chunks, tokens
 * written as they come through zs_data_writer, so memory does not grow with
 * the input; a progress line every 64 MiB; the summary gives the peak
 * memory; the file records DIR and its files' hashes: zs_data_bpe_t), and
 * the readers --print (ids, one per line) and --decode DIR (the text).
 *
 * Not here: option parsing and the byte-level mode (zs_tokenize.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_bpe.h"
#include "zs_data.h"
#include "zs_tokenize.h"

#define CHUNK    (1u << 20)
#define PROGRESS (64ull << 20) /* bytes between progress lines */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The output: the stream writer and its last error. */
typedef struct sink {
    zs_data_writer_t *w;
    zs_err_t err;
} sink_t;

/* zs_bpe_emit_fn: append ids to the output file. */
static int collect(void *ctx, const uint32_t *ids, size_t n)
{
    sink_t *o = ctx;
    return zs_data_writer_add(o->w, ids, n, &o->err);
}

/* Peak resident memory of this process in MiB (VmHWM), 0 if unknown. */
static double peak_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lf kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb / 1024;
}

/* Stream one file through the encoder; returns its size in bytes or -1. */
static long long encode_file(zs_bpe_t *bpe, const char *path, sink_t *b, int quiet)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "zs-tokenize: %s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    /* buf holds the text kept back by the encoder followed by a new chunk */
    size_t cap = 2 * CHUNK, have = 0;
    uint8_t *buf = malloc(cap);
    long long total = 0, next_report = PROGRESS;
    double t0 = now_s();
    int rc = buf ? ZS_OK : ZS_ERR_NOMEM;
    zs_err_t err = {0};
    if (!buf)
        snprintf(err.msg, sizeof err.msg, "out of memory");
    while (rc == ZS_OK) {
        if (cap - have < CHUNK) { /* a very long piece is still kept back */
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                rc = zs_err_set(&err, ZS_ERR_NOMEM, "out of memory for a %zu-byte piece", have);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + have, 1, CHUNK, f);
        if (n == 0 && ferror(f)) {
            rc = zs_err_set(&err, ZS_ERR_IO, "read error: %s", strerror(errno));
            break;
        }
        have += n;
        total += (long long)n;
        int at_end = n == 0;
        size_t used = 0;
        rc = zs_bpe_encode(bpe, buf, have, at_end, &used, collect, b, &err);
        if (rc != ZS_OK) {
            if (b->err.code)
                err = b->err; /* the writer's own message */
            break;
        }
        memmove(buf, buf + used, have - used);
        have -= used;
        if (!quiet && total >= next_report) {
            double dt = now_s() - t0;
            fprintf(stderr, "zs-tokenize: %s: %lld MiB, %llu tokens so far, %.1f MB/s\n", path,
                    total >> 20, (unsigned long long)zs_data_writer_count(b->w),
                    dt > 0 ? total / dt / 1e6 : 0.0);
            next_report += PROGRESS;
        }
        if (at_end)
            break;
    }
    free(buf);
    fclose(f);
    if (rc != ZS_OK) {
        fprintf(stderr, "zs-tokenize: %s: %s\n", path, err.msg);
        return -1;
    }
    return total;
}

/* zs-tokenize --gpt2 (zs_tokenize.h). */
int zs__tokenize_gpt2(const char *dir, char *const *files, int nfiles, int eot_between, int quiet,
                      const char *out)
{
    zs_err_t err;
    zs_bpe_t *bpe;
    if (zs_bpe_load(dir, &bpe, &err) != ZS_OK) {
        fprintf(stderr, "zs-tokenize: --gpt2 %s: %s\n", dir, err.msg);
        return 1;
    }
    if (eot_between && zs_bpe_eot(bpe) < 0) {
        fprintf(stderr, "zs-tokenize: --gpt2 %s: the encoder has no <|endoftext|>\n", dir);
        zs_bpe_free(bpe);
        return 1;
    }
    /* the file records DIR (absolute) and its files' hashes, so zs-train
     * and zs-generate decode its ids without being told DIR */
    zs_data_bpe_t *rec = malloc(sizeof *rec);
    if (!rec || zs_data_bpe_of_dir(dir, rec, &err) != ZS_OK) {
        fprintf(stderr, "zs-tokenize: --gpt2 %s: %s\n", dir, rec ? err.msg : "out of memory");
        free(rec);
        zs_bpe_free(bpe);
        return 1;
    }
    sink_t b = {0};
    if (zs_data_writer_open(out, zs_bpe_vocab(bpe), &b.w, &err) != ZS_OK) {
        fprintf(stderr, "zs-tokenize: %s\n", err.msg);
        free(rec);
        zs_bpe_free(bpe);
        return 1;
    }
    zs_data_writer_set_bpe(b.w, rec);
    long long bytes = 0;
    double t0 = now_s();
    int status = 0;
    for (int i = 0; i < nfiles && status == 0; i++) {
        if (eot_between && i > 0) {
            uint32_t eot = (uint32_t)zs_bpe_eot(bpe);
            if (collect(&b, &eot, 1) != ZS_OK) {
                fprintf(stderr, "zs-tokenize: %s\n", b.err.msg);
                status = 1;
                break;
            }
        }
        long long n = encode_file(bpe, files[i], &b, quiet);
        if (n < 0) {
            status = 1;
            break;
        }
        bytes += n;
        if (!quiet)
            fprintf(stderr, "zs-tokenize: [%d/%d] %s: %lld bytes (%llu tokens so far)\n", i + 1,
                    nfiles, files[i], n, (unsigned long long)zs_data_writer_count(b.w));
    }
    uint64_t count = zs_data_writer_count(b.w);
    if (status == 0 && count == 0) {
        fprintf(stderr, "zs-tokenize: the input files are empty; nothing written to %s\n", out);
        status = 1;
    }
    /* without commit the temporary file goes and OUT stays as it was */
    if (zs_data_writer_close(b.w, status == 0, &err) != ZS_OK) {
        fprintf(stderr, "zs-tokenize: %s\n", err.msg);
        status = 1;
    }
    if (status == 0) {
        double dt = now_s() - t0;
        printf("%lld bytes -> %llu tokens, vocab %u (GPT-2 BPE), %.1f MB/s, peak memory %.0f "
               "MiB: %s (vocabulary %s recorded)\n",
               bytes, (unsigned long long)count, zs_bpe_vocab(bpe), dt > 0 ? bytes / dt / 1e6 : 0.0,
               peak_mib(), out, rec->dir);
    }
    free(rec);
    zs_bpe_free(bpe);
    return status;
}

/* Call fn on the file's ids in blocks; 0 or 1 (message printed). */
static int each_block(const char *path, int (*fn)(void *, const uint32_t *, size_t), void *ctx)
{
    zs_err_t err;
    zs_data_t *d;
    if (zs_data_open(path, &d, &err) != ZS_OK) {
        fprintf(stderr, "zs-tokenize: %s\n", err.msg);
        return 1;
    }
    static uint32_t ids[1 << 16];
    uint64_t count = zs_data_count(d);
    int status = 0;
    for (uint64_t i = 0; i < count && status == 0; i += 1 << 16) {
        size_t n = count - i < (1 << 16) ? (size_t)(count - i) : (1 << 16);
        if (zs_data_read(d, i, n, ids, &err) != ZS_OK) {
            fprintf(stderr, "zs-tokenize: %s\n", err.msg);
            status = 1;
        } else {
            status = fn(ctx, ids, n);
        }
    }
    zs_data_close(d);
    if (status == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "zs-tokenize: write to stdout failed: %s\n", strerror(errno));
        status = 1;
    }
    return status;
}

/* Print ids, one per line. */
static int print_ids(void *ctx, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (printf("%u\n", ids[i]) < 0)
            return 1;
    return 0;
}

/* zs-tokenize --print (zs_tokenize.h). */
int zs__tokenize_print(const char *path)
{
    return each_block(path, print_ids, NULL);
}

/* Write the bytes of ids with the GPT-2 vocab in ctx. */
static int decode_ids(void *ctx, const uint32_t *ids, size_t n)
{
    const zs_bpe_t *bpe = ctx;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p;
        size_t len;
        zs_err_t err;
        if (zs_bpe_token_bytes(bpe, ids[i], &p, &len, &err) != ZS_OK) {
            fprintf(stderr, "zs-tokenize: --decode: %s\n", err.msg);
            return 1;
        }
        if (fwrite(p, 1, len, stdout) != len)
            return 1;
    }
    return 0;
}

/* zs-tokenize --decode (zs_tokenize.h). */
int zs__tokenize_decode(const char *dir, const char *path)
{
    zs_err_t err;
    zs_bpe_t *bpe;
    if (zs_bpe_load(dir, &bpe, &err) != ZS_OK) {
        fprintf(stderr, "zs-tokenize: --decode %s: %s\n", dir, err.msg);
        return 1;
    }
    int status = each_block(path, decode_ids, bpe);
    zs_bpe_free(bpe);
    return status;
}
