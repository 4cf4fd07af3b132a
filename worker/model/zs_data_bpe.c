/*
 * zs_data_bpe.c - the GPT-2 vocabulary a token file records (zs_data.h,
 * zs_data_bpe_t; format version 2): making the record for a folder
 * (zs-tokenize --gpt2) and loading the vocabulary it names (zs-train's
 * samples, zs-generate), refused when the folder's files no longer hash as
 * recorded.
 *
 * Why hashes and not just the path: a folder is moved, replaced or shared
 * by another vocabulary, and ids decoded with the wrong encoder.json are
 * plausible-looking garbage; XXH3-64 of both files (about 1.5 MB, a few ms)
 * makes that an error naming the file instead.
 *
 * Not here: the format's reader and writers (zs_data.c, zs_data_writer.c),
 * the BPE itself (zs_bpe*.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "zs_bpe.h"
#include "zs_data.h"

#define SHOWN 200 /* longest path quoted in a message */

/* XXH3-64 of dir/name, streamed. */
static int hash_file(const char *dir, const char *name, uint64_t *out, zs_err_t *err)
{
    char path[ZS_DATA_DIR_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return zs_err_set(err, e == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%.*s: cannot open: %s",
                          SHOWN, path, strerror(e));
    }
    XXH3_state_t *st = XXH3_createState();
    unsigned char *buf = malloc(1 << 16);
    int rc = st && buf ? ZS_OK : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (!rc)
        XXH3_64bits_reset(st);
    size_t n;
    while (!rc && (n = fread(buf, 1, 1 << 16, f)) > 0)
        XXH3_64bits_update(st, buf, n);
    if (!rc && ferror(f))
        rc = zs_err_set(err, ZS_ERR_IO, "%.*s: read error", SHOWN, path);
    if (!rc)
        *out = XXH3_64bits_digest(st);
    fclose(f);
    free(buf);
    XXH3_freeState(st);
    return rc;
}

/* The record for a folder (zs_data.h). */
int zs_data_bpe_of_dir(const char *dir, zs_data_bpe_t *out, zs_err_t *err)
{
    char *abs = realpath(dir, NULL); /* readers may run in another directory */
    if (!abs) {
        int e = errno;
        return zs_err_set(err, e == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%.*s: %s", SHOWN, dir,
                          strerror(e));
    }
    size_t len = strlen(abs);
    int rc = len < ZS_DATA_DIR_MAX
                 ? ZS_OK
                 : zs_err_set(err, ZS_ERR_RANGE, "%.*s...: a path of %zu bytes, at most %d", SHOWN,
                              abs, len, ZS_DATA_DIR_MAX - 1);
    if (!rc) {
        memcpy(out->dir, abs, len + 1);
        rc = hash_file(abs, "encoder.json", &out->encoder_xxh3, err);
    }
    if (!rc)
        rc = hash_file(abs, "vocab.bpe", &out->merges_xxh3, err);
    free(abs);
    return rc;
}

/* Check the recorded hashes, then load (zs_data.h). */
int zs_data_bpe_load(const zs_data_bpe_t *rec, struct zs_bpe **out, zs_err_t *err)
{
    *out = NULL;
    zs_data_bpe_t now;
    int rc = zs_data_bpe_of_dir(rec->dir, &now, err);
    if (rc)
        return rc;
    const char *which = now.encoder_xxh3 != rec->encoder_xxh3 ? "encoder.json"
                        : now.merges_xxh3 != rec->merges_xxh3 ? "vocab.bpe"
                                                              : NULL;
    if (which)
        return zs_err_set(
            err, ZS_ERR_CORRUPT,
            "%.*s/%s is not the file the tokens were made with (XXH3-64 %016llx, "
            "recorded %016llx)",
            SHOWN, rec->dir, which,
            (unsigned long long)(which[0] == 'e' ? now.encoder_xxh3 : now.merges_xxh3),
            (unsigned long long)(which[0] == 'e' ? rec->encoder_xxh3 : rec->merges_xxh3));
    return zs_bpe_load(rec->dir, out, err);
}
