/*
 * zs_data_writer.c - writing a zeroshard token file as a stream
 * (zs_data_writer_*, zs_data.h): tokens go to PATH.tmpXXXXXX through a
 * 128 KiB buffer behind a zeroed header; on commit the header gets its
 * count, the file is fsync'ed and renamed over PATH, so memory stays
 * bounded whatever the count and a reader sees the old file or the whole
 * new one (as zs_data_write). With a vocabulary record
 * (zs_data_writer_set_bpe) the file is version 2: the record's hashes go
 * into the header and its path after the tokens.
 *
 * Not here: the format's reader and the one-call writer (zs_data.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_data.h"
#include "zs_file.h"

#define SHOWN 200
#define BUF   (64u * 1024) /* tokens */

struct zs_data_writer {
    char *path, *tmp;
    int fd;
    uint32_t vocab;
    uint64_t count;
    uint8_t buf[2 * BUF];
    size_t n;          /* tokens in buf */
    int has_bpe;       /* zs_data_writer_set_bpe: written as version 2 */
    zs_data_bpe_t bpe; /* its record */
};

/* Store v little-endian at p. */
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Create PATH.tmpXXXXXX with a zeroed header (zs_data.h). */
int zs_data_writer_open(const char *path, uint32_t vocab, zs_data_writer_t **out, zs_err_t *err)
{
    *out = NULL;
    if (vocab < 1 || vocab > 65536)
        return zs_err_set(err, ZS_ERR_RANGE, "token file %.*s: vocab %u, must be 1..65536", SHOWN,
                          path, vocab);
    zs_data_writer_t *w = calloc(1, sizeof *w);
    size_t plen = strlen(path);
    if (w) {
        w->path = strdup(path);
        w->tmp = malloc(plen + sizeof ".tmpXXXXXX");
    }
    if (!w || !w->path || !w->tmp) {
        if (w) {
            free(w->path);
            free(w->tmp);
        }
        free(w);
        return zs_err_set(err, ZS_ERR_NOMEM, "token file %.*s: out of memory", SHOWN, path);
    }
    memcpy(w->tmp, path, plen);
    memcpy(w->tmp + plen, ".tmpXXXXXX", sizeof ".tmpXXXXXX");
    w->fd = mkostemp(w->tmp, O_CLOEXEC);
    uint8_t h[ZS_DATA_HEADER_BYTES] = {0}; /* the real header comes at commit */
    if (w->fd < 0 || zs_file_write_all(w->fd, h, sizeof h)) {
        int e = errno;
        if (w->fd >= 0) {
            close(w->fd);
            unlink(w->tmp);
        }
        free(w->path);
        free(w->tmp);
        free(w);
        return zs_err_set(err, e == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO,
                          "token file %.*s: cannot create a temporary file: %s", SHOWN, path,
                          strerror(e));
    }
    (void)fchmod(w->fd, 0644);
    w->vocab = vocab;
    *out = w;
    return ZS_OK;
}

/* Write the buffered tokens. */
static int flush(zs_data_writer_t *w, zs_err_t *err)
{
    if (w->n && zs_file_write_all(w->fd, w->buf, 2 * w->n))
        return zs_err_set(err, ZS_ERR_IO, "token file %.*s: write failed: %s", SHOWN, w->path,
                          strerror(errno));
    w->n = 0;
    return ZS_OK;
}

/* Append tokens, each < vocab (zs_data.h). */
int zs_data_writer_add(zs_data_writer_t *w, const uint32_t *tokens, size_t n, zs_err_t *err)
{
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] >= w->vocab)
            return zs_err_set(err, ZS_ERR_RANGE,
                              "token file %.*s: token %u at position %llu is >= vocab %u", SHOWN,
                              w->path, tokens[i], (unsigned long long)(w->count + i), w->vocab);
        if (w->n == BUF) {
            int rc = flush(w, err);
            if (rc)
                return rc;
        }
        w->buf[2 * w->n] = (uint8_t)tokens[i];
        w->buf[2 * w->n + 1] = (uint8_t)(tokens[i] >> 8);
        w->n++;
    }
    w->count += n;
    return ZS_OK;
}

/* Record the vocabulary (zs_data.h): version 2 at commit. */
void zs_data_writer_set_bpe(zs_data_writer_t *w, const zs_data_bpe_t *rec)
{
    w->bpe = *rec;
    w->has_bpe = 1;
}

/* Store v little-endian at p. */
static void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Version 2's fields and the path after the tokens (zs_data.h). */
static int write_bpe(zs_data_writer_t *w, uint8_t *h, zs_err_t *err)
{
    size_t len = strnlen(w->bpe.dir, ZS_DATA_DIR_MAX);
    if (len < 1 || len >= ZS_DATA_DIR_MAX)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "token file %.*s: the vocabulary path must be 1..%d bytes", SHOWN,
                          w->path, ZS_DATA_DIR_MAX - 1);
    wr32(h + 8, 2);
    wr32(h + 28, 1); /* GPT-2 BPE */
    wr32(h + 32, (uint32_t)len);
    wr64(h + 36, w->bpe.encoder_xxh3);
    wr64(h + 44, w->bpe.merges_xxh3);
    if (zs_file_write_all(w->fd, w->bpe.dir, len))
        return zs_err_set(err, ZS_ERR_IO, "token file %.*s: write failed: %s", SHOWN, w->path,
                          strerror(errno));
    return ZS_OK;
}

/* Tokens added so far. */
uint64_t zs_data_writer_count(const zs_data_writer_t *w)
{
    return w->count;
}

/* Commit (header, fsync, rename, sync the folder) or discard; frees w. */
int zs_data_writer_close(zs_data_writer_t *w, int commit, zs_err_t *err)
{
    if (!w)
        return ZS_OK;
    int rc = commit ? flush(w, err) : ZS_OK;
    if (commit && !rc) {
        uint8_t h[ZS_DATA_HEADER_BYTES] = {0};
        memcpy(h, "ZSTOKENS", 8);
        wr32(h + 8, 1);
        wr32(h + 12, w->vocab);
        wr32(h + 16, (uint32_t)w->count);
        wr32(h + 20, (uint32_t)(w->count >> 32));
        wr32(h + 24, 2);
        if (w->has_bpe) /* after the tokens, which flush wrote */
            rc = write_bpe(w, h, err);
        if (!rc && (pwrite(w->fd, h, sizeof h, 0) != (ssize_t)sizeof h || fsync(w->fd) != 0))
            rc = zs_err_set(err, ZS_ERR_IO, "token file %.*s: write failed: %s", SHOWN, w->path,
                            strerror(errno));
    }
    if (close(w->fd) != 0 && commit && !rc)
        rc = zs_err_set(err, ZS_ERR_IO, "token file %.*s: close failed: %s", SHOWN, w->path,
                        strerror(errno));
    if (commit && !rc && rename(w->tmp, w->path) != 0)
        rc = zs_err_set(err, ZS_ERR_IO, "token file %.*s: rename failed: %s", SHOWN, w->path,
                        strerror(errno));
    if (!commit || rc)
        unlink(w->tmp);
    else {
        char *copy = strdup(w->path); /* the rename is durable once the folder is synced */
        int dfd = copy ? open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        free(copy);
    }
    free(w->path);
    free(w->tmp);
    free(w);
    return rc;
}
