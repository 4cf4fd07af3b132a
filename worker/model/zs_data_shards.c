/*
 * zs_data_shards.c - opening token data: one file, a comma-separated list,
 * or a glob (each list item may be one), mapped read-only and validated,
 * in either of two formats told apart by their magic:
 *   - zeroshard token files ("ZSTOKENS", zs_data.h; header checked by
 *     zs__data_check_header in zs_data.c);
 *   - llm.c .bin shards (dev/data/data_common.py write_datafile): a
 *     256 x int32 header, [0] magic 20240520, [1] version 1, [2] token
 *     count, then count uint16 GPT-2 tokens (vocab 50257). Version 2
 *     (uint32 LLaMA 3 tokens) is refused.
 * The files are concatenated in the order given (a glob's matches sorted
 * by name, as llm.c's glob does); sampling (zs_data.c) sees one token
 * stream. All files must have the same vocab; the data has a GPT-2
 * vocabulary record (zs_data_bpe) when every file has the same one.
 *
 * Not here: sampling, the zeroshard header fields, writing (zs_data.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_data_impl.h"

#define SHOWN         ZS__DATA_PATH_SHOWN
#define LLMC_MAGIC    20240520u
#define LLMC_VERSION  1u
#define LLMC_HEADER   1024u  /* 256 int32 */
#define LLMC_VOCAB    50257u /* GPT-2 */
#define MAX_SHARDS    100000
#define MAX_SPEC_LIST 4096 /* items of a comma list */

/* Little-endian u32 at p. */
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The shard holding token i: binary search on the starts. */
const zs__data_shard_t *zs__data_shard_of(const zs_data_t *d, uint64_t i)
{
    int lo = 0, hi = d->nsh - 1;
    while (lo < hi) { /* the last shard with start <= i */
        int mid = (lo + hi + 1) / 2;
        if (d->sh[mid].start <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &d->sh[lo];
}

/* Validate an llm.c shard's header; fills count. */
static int check_llmc(const char *path, const uint8_t *h, uint64_t size, uint64_t *count,
                      zs_err_t *err)
{
    if (size < LLMC_HEADER)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "llm.c shard %.*s: %llu bytes, shorter than the %u-byte header "
                          "(truncated)",
                          SHOWN, path, (unsigned long long)size, LLMC_HEADER);
    uint32_t version = rd32(h + 4);
    int32_t n = (int32_t)rd32(h + 8);
    if (version == 2)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "llm.c shard %.*s: version 2 (uint32 LLaMA 3 tokens) is not supported; "
                          "only version 1 (uint16 GPT-2 tokens)",
                          SHOWN, path);
    if (version != LLMC_VERSION)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "llm.c shard %.*s: version %u in the header, expected %u", SHOWN, path,
                          version, LLMC_VERSION);
    if (n < 0)
        return zs_err_set(err, ZS_ERR_CORRUPT, "llm.c shard %.*s: negative token count %d", SHOWN,
                          path, n);
    if (size != LLMC_HEADER + 2 * (uint64_t)n)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "llm.c shard %.*s: %s: size %llu bytes, the header's count of %d "
                          "tokens needs %u + 2 * %d bytes",
                          SHOWN, path,
                          size < LLMC_HEADER + 2 * (uint64_t)n ? "truncated" : "trailing data",
                          (unsigned long long)size, n, LLMC_HEADER, n);
    *count = (uint64_t)n;
    return ZS_OK;
}

/* Map one file and validate its header, whichever format it is; a
 * version 2 zeroshard file's vocabulary record into *bpe (*has_bpe). */
static int map_shard(const char *path, zs__data_shard_t *s, uint32_t *vocab, int *has_bpe,
                     zs_data_bpe_t *bpe, zs_err_t *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zs_err_set(err, e == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO,
                          "token file %.*s: cannot open: %s", SHOWN, path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        int reg = fstat(fd, &st) == 0;
        close(fd);
        return reg ? zs_err_set(err, ZS_ERR_INVALID, "token file %.*s: not a regular file", SHOWN,
                                path)
                   : zs_err_set(err, ZS_ERR_IO, "token file %.*s: cannot stat: %s", SHOWN, path,
                                strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        close(fd);
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: %llu bytes, shorter than any header (zeroshard: %d "
                          "bytes, llm.c: %u)",
                          SHOWN, path, (unsigned long long)size, ZS_DATA_HEADER_BYTES, LLMC_HEADER);
    }
    if (size > SIZE_MAX) {
        close(fd);
        return zs_err_set(err, ZS_ERR_RANGE, "token file %.*s: %llu bytes cannot be mapped", SHOWN,
                          path, (unsigned long long)size);
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return zs_err_set(err, ZS_ERR_IO, "token file %.*s: mmap of %llu bytes failed: %s", SHOWN,
                          path, (unsigned long long)size, strerror(e));
    const uint8_t *h = m;
    int rc;
    if (rd32(h) == LLMC_MAGIC) {
        s->llmc = 1;
        *vocab = LLMC_VOCAB;
        rc = check_llmc(path, h, size, &s->count, err);
        s->tok = h + LLMC_HEADER;
    } else if (size < ZS_DATA_HEADER_BYTES && memcmp(h, "ZSTOKENS", 8) == 0) {
        rc = zs_err_set(err, ZS_ERR_CORRUPT,
                        "token file %.*s: %llu bytes, shorter than the %d-byte header", SHOWN, path,
                        (unsigned long long)size, ZS_DATA_HEADER_BYTES);
    } else {
        rc = size < ZS_DATA_HEADER_BYTES
                 ? zs_err_set(err, ZS_ERR_CORRUPT,
                              "token file %.*s: %llu bytes, shorter than the %d-byte header", SHOWN,
                              path, (unsigned long long)size, ZS_DATA_HEADER_BYTES)
                 : zs__data_check_header(path, h, size, vocab, &s->count, has_bpe, bpe, err);
        s->tok = h + ZS_DATA_HEADER_BYTES;
    }
    if (rc != ZS_OK) {
        munmap(m, (size_t)size);
        return rc;
    }
    (void)madvise(m, (size_t)size, MADV_RANDOM); /* windows are scattered: no read-ahead */
    s->map = m;
    s->map_len = (size_t)size;
    s->path = strdup(path);
    if (!s->path) {
        munmap(m, (size_t)size);
        s->map = NULL;
        return zs_err_set(err, ZS_ERR_NOMEM, "token file %.*s: out of memory", SHOWN, path);
    }
    return ZS_OK;
}

/* Append a path to the list; paths[] grows. */
static int add_path(char ***paths, int *n, const char *p, zs_err_t *err)
{
    if (*n >= MAX_SHARDS)
        return zs_err_set(err, ZS_ERR_RANGE, "token data: more than %d files", MAX_SHARDS);
    char **np = realloc(*paths, (size_t)(*n + 1) * sizeof *np);
    if (!np)
        return zs_err_set(err, ZS_ERR_NOMEM, "token data: out of memory");
    *paths = np;
    if (!(np[*n] = strdup(p)))
        return zs_err_set(err, ZS_ERR_NOMEM, "token data: out of memory");
    (*n)++;
    return ZS_OK;
}

/* Expand spec: an existing file as it is; else a comma list whose items
 * are files or globs (matches sorted by name, none is an error). */
static int expand(const char *spec, char ***paths, int *n, zs_err_t *err)
{
    struct stat st;
    if (stat(spec, &st) == 0 || !strpbrk(spec, ",*?["))
        return add_path(paths, n, spec, err);
    char *copy = strdup(spec);
    if (!copy)
        return zs_err_set(err, ZS_ERR_NOMEM, "token data: out of memory");
    int rc = ZS_OK, items = 0;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item && rc == ZS_OK;
         item = strtok_r(NULL, ",", &save)) {
        if (++items > MAX_SPEC_LIST) {
            rc = zs_err_set(err, ZS_ERR_RANGE, "token data: more than %d items in the list",
                            MAX_SPEC_LIST);
            break;
        }
        if (!strpbrk(item, "*?[")) {
            rc = add_path(paths, n, item, err);
            continue;
        }
        glob_t g;
        int gr = glob(item, 0, NULL, &g);
        if (gr == GLOB_NOMATCH)
            rc = zs_err_set(err, ZS_ERR_NOTFOUND, "token data: no file matches %.*s", SHOWN, item);
        else if (gr != 0)
            rc = zs_err_set(err, ZS_ERR_IO, "token data: glob %.*s failed (%d)", SHOWN, item, gr);
        for (size_t i = 0; gr == 0 && i < g.gl_pathc && rc == ZS_OK; i++)
            rc = add_path(paths, n, g.gl_pathv[i], err);
        if (gr == 0)
            globfree(&g);
    }
    if (rc == ZS_OK && *n == 0)
        rc = zs_err_set(err, ZS_ERR_INVALID, "token data: \"%.*s\" names no file", SHOWN, spec);
    free(copy);
    return rc;
}

/* Open a file, a comma list or a glob of token files (zs_data.h). */
int zs_data_open(const char *path, zs_data_t **out, zs_err_t *err)
{
    if (!path || !out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_data_open: path and out must not be NULL");
    *out = NULL;
    char **paths = NULL;
    int n = 0;
    zs_data_t *d = calloc(1, sizeof *d);
    int rc = d ? expand(path, &paths, &n, err) : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (rc == ZS_OK && (!(d->sh = calloc((size_t)n, sizeof *d->sh)) || !(d->path = strdup(path))))
        rc = zs_err_set(err, ZS_ERR_NOMEM, "token data: out of memory");
    zs_data_bpe_t *bpe = rc == ZS_OK ? malloc(sizeof *bpe) : NULL; /* a shard's record */
    if (rc == ZS_OK && !bpe)
        rc = zs_err_set(err, ZS_ERR_NOMEM, "token data: out of memory");
    for (int i = 0; rc == ZS_OK && i < n; i++) {
        uint32_t vocab = 0;
        int has_bpe = 0;
        rc = map_shard(paths[i], &d->sh[i], &vocab, &has_bpe, bpe, err);
        if (rc != ZS_OK)
            break;
        /* one record for the data only when every file holds the same */
        if (i == 0 && has_bpe)
            d->bpe = *bpe;
        d->has_bpe = has_bpe && (i == 0 || (d->has_bpe && strcmp(bpe->dir, d->bpe.dir) == 0 &&
                                            bpe->encoder_xxh3 == d->bpe.encoder_xxh3 &&
                                            bpe->merges_xxh3 == d->bpe.merges_xxh3));
        d->nsh = i + 1;
        if (i > 0 && vocab != d->vocab)
            rc = zs_err_set(err, ZS_ERR_INVALID,
                            "token data: %.*s has vocab %u, %.*s before it vocab %u: the files "
                            "must share one vocabulary",
                            SHOWN, paths[i], vocab, SHOWN, paths[0], d->vocab);
        d->vocab = vocab;
        d->sh[i].start = d->count;
        d->count += d->sh[i].count;
    }
    free(bpe);
    for (int i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
    if (rc == ZS_OK && d->count == 0 && d->nsh > 1)
        rc = zs_err_set(err, ZS_ERR_INVALID, "token data %.*s: the %d files hold no token", SHOWN,
                        path, d->nsh);
    if (rc != ZS_OK) {
        zs_data_close(d);
        return rc;
    }
    *out = d;
    return ZS_OK;
}

/* Unmap every shard and free (NULL is fine). */
void zs_data_close(zs_data_t *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->nsh; i++) {
        munmap((void *)d->sh[i].map, d->sh[i].map_len);
        free(d->sh[i].path);
    }
    free(d->sh);
    free(d->path);
    free(d);
}
