/*
 * zs_data.c - token files (mmap'd, validated) and deterministic sampling.
 *
 * Format (see zs_data.h; little-endian, 64-byte header):
 *   off  0  magic "ZSTOKENS"          8 bytes
 *   off  8  version u32 = 1 or 2
 *   off 12  vocab u32, 1..65536
 *   off 16  count u64 (tokens)
 *   off 24  token_bytes u32 = 2
 *   off 28  version 1: reserved, 36 zero bytes
 *           version 2: tokenizer u32 = 1 (GPT-2 BPE), off 32 dir_bytes u32,
 *           off 36 encoder_xxh3 u64, off 44 merges_xxh3 u64, off 52 12 zero
 *   off 64  count u16 tokens, each < vocab
 *           version 2: then dir_bytes bytes, the vocabulary's folder
 * The tokens start at 64 in both versions, so the record costs a reader of
 * tokens nothing; it goes after them because a streamed writer
 * (zs_data_writer.c) knows the count only at the end anyway.
 * zs_data_open checks all of the header and that the file size is exactly
 * 64 + 2 * count (+ dir_bytes). Token values are checked lazily, per
 * sample, so opening a large file costs nothing beyond the mmap.
 *
 * Sampling rule. Sample j is the window of T+1 tokens starting at
 *   zs_data_offset(j) = splitmix64((uint64_t)j) mod (count - T)
 * where splitmix64 is the finaliser of Steele, Lea and Flood's SplitMix64
 * (x += 0x9e3779b97f4a7c15, then two xor-shift-multiply rounds and a final
 * xor-shift). There are count - T windows, starting at 0 .. count-T-1, and
 * every one of them can be drawn. The offset depends on nothing but
 * (j, count, T): no seed, no state, no process identity, so every worker of
 * every world size, and a resumed run, computes the same window for the
 * same global sample index. Windows are drawn with replacement (an
 * approximately uniform hash, not an epoch permutation); the modulo bias is
 * below (count - T) / 2^64, i.e. negligible for any real file.
 *
 * Writing goes to a temporary file next to the target (mkstemp), is
 * fsync'ed, then renamed over the target, so a reader sees either the old
 * file or the complete new one.
 */
#define _GNU_SOURCE
#include "zs_data.h"
#include "zs_data_impl.h"
#include "zs_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC          "ZSTOKENS"
#define VERSION        1u
#define VERSION_BPE    2u /* version 1 + the GPT-2 vocabulary's record */
#define TOKENIZER_GPT2 1u
#define TOKEN_BYTES    2u
#define VOCAB_MAX      65536u
#define PATH_SHOWN     ZS__DATA_PATH_SHOWN
#define WRITE_CHUNK    (1u << 16)

/* ---- little-endian helpers ------------------------------------------------ */

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Token i of the concatenation of the shards. */
static uint16_t token_at(const zs_data_t *d, uint64_t i)
{
    const zs__data_shard_t *sh = zs__data_shard_of(d, i);
    const uint8_t *p = sh->tok + 2 * (i - sh->start);
    return (uint16_t)(p[0] | p[1] << 8);
}

/* SplitMix64 finaliser: a bijection on 64-bit integers that spreads
 * consecutive inputs over the whole range. */
static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- header ---------------------------------------------------------------- */

static int io_status(int e)
{
    return e == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO;
}

/* Version 2's fields after token_bytes (zs_data.h): the tokenizer, the
 * length of the vocabulary path after the tokens and the hashes; *extra is
 * the path's length. */
static int check_v2(const char *path, const uint8_t *h, uint64_t *extra, zs_data_bpe_t *bpe,
                    zs_err_t *err)
{
    uint32_t kind = rd32(h + 28), len = rd32(h + 32);
    if (kind != TOKENIZER_GPT2)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: tokenizer %u in the header, this build knows %u "
                          "(GPT-2 BPE)",
                          PATH_SHOWN, path, kind, TOKENIZER_GPT2);
    if (len < 1 || len >= ZS_DATA_DIR_MAX)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: vocabulary path of %u bytes in the header, must be "
                          "1..%d",
                          PATH_SHOWN, path, len, ZS_DATA_DIR_MAX - 1);
    for (int i = 52; i < ZS_DATA_HEADER_BYTES; i++)
        if (h[i] != 0)
            return zs_err_set(err, ZS_ERR_CORRUPT,
                              "token file %.*s: reserved header byte at offset %d is 0x%02x, "
                              "must be zero",
                              PATH_SHOWN, path, i, h[i]);
    bpe->encoder_xxh3 = rd64(h + 36);
    bpe->merges_xxh3 = rd64(h + 44);
    *extra = len;
    return ZS_OK;
}

/* Validate the header of a zeroshard token file of `size` bytes (mapped at
 * h); fills vocab, count and a version 2 file's vocabulary record. */
int zs__data_check_header(const char *path, const uint8_t *h, uint64_t size, uint32_t *vocab,
                          uint64_t *count, int *has_bpe, zs_data_bpe_t *bpe, zs_err_t *err)
{
    *has_bpe = 0;
    if (memcmp(h, MAGIC, 8) != 0) {
        char shown[8 * 4 + 1];
        size_t o = 0;
        for (int i = 0; i < 8; i++)
            o += (size_t)snprintf(shown + o, sizeof shown - o,
                                  h[i] >= 0x20 && h[i] < 0x7f && h[i] != '\\' ? "%c" : "\\x%02x",
                                  h[i]);
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: bad magic \"%s\", expected \"" MAGIC
                          "\" (zeroshard) or int32 20240520 (llm.c .bin shard)",
                          PATH_SHOWN, path, shown);
    }
    uint32_t version = rd32(h + 8), v = rd32(h + 12), tb = rd32(h + 24);
    uint64_t n = rd64(h + 16);
    if (version != VERSION && version != VERSION_BPE)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: format version %u, this build reads versions %u and "
                          "%u",
                          PATH_SHOWN, path, version, VERSION, VERSION_BPE);
    if (v < 1 || v > VOCAB_MAX)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: vocab %u in the header, must be 1..%u", PATH_SHOWN,
                          path, v, VOCAB_MAX);
    if (tb != TOKEN_BYTES)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: token_bytes %u in the header, only %u (u16 tokens) "
                          "is supported",
                          PATH_SHOWN, path, tb, TOKEN_BYTES);
    uint64_t extra = 0; /* version 2: the vocabulary path after the tokens */
    if (version == VERSION_BPE) {
        int rc = check_v2(path, h, &extra, bpe, err);
        if (rc)
            return rc;
    } else {
        for (int i = 28; i < ZS_DATA_HEADER_BYTES; i++)
            if (h[i] != 0)
                return zs_err_set(err, ZS_ERR_CORRUPT,
                                  "token file %.*s: reserved header byte at offset %d is 0x%02x, "
                                  "must be zero",
                                  PATH_SHOWN, path, i, h[i]);
    }
    if (n > (UINT64_MAX - ZS_DATA_HEADER_BYTES - ZS_DATA_DIR_MAX) / TOKEN_BYTES ||
        size != ZS_DATA_HEADER_BYTES + TOKEN_BYTES * n + extra)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "token file %.*s: size %llu bytes disagrees with the header's count "
                          "of %llu tokens (expected %d + 2 * %llu%s bytes): truncated or "
                          "trailing data",
                          PATH_SHOWN, path, (unsigned long long)size, (unsigned long long)n,
                          ZS_DATA_HEADER_BYTES, (unsigned long long)n,
                          extra ? " + the vocabulary path's" : "");
    if (extra) {
        const uint8_t *p = h + ZS_DATA_HEADER_BYTES + TOKEN_BYTES * n;
        if (memchr(p, 0, (size_t)extra))
            return zs_err_set(err, ZS_ERR_CORRUPT,
                              "token file %.*s: the vocabulary path after the tokens holds a "
                              "NUL byte",
                              PATH_SHOWN, path);
        memcpy(bpe->dir, p, (size_t)extra);
        bpe->dir[extra] = '\0';
        *has_bpe = 1;
    }
    *vocab = v;
    *count = n;
    return ZS_OK;
}

/* ---- accessors ----------------------------------------------------------- */

/* Vocabulary size from the header. */
uint32_t zs_data_vocab(const zs_data_t *d)
{
    return d->vocab;
}

/* Number of tokens in the file. */
uint64_t zs_data_count(const zs_data_t *d)
{
    return d->count;
}

/* The recorded vocabulary (version 2), NULL if none. */
const zs_data_bpe_t *zs_data_bpe(const zs_data_t *d)
{
    return d->has_bpe ? &d->bpe : NULL;
}

/* ---- sampling ------------------------------------------------------------- */

/* Start of sample j's window: splitmix64(j) mod (count - T) (see the file
 * comment). 0 when the file holds no full window (count < T + 1) or T < 1;
 * zs_data_sample refuses those. */
uint64_t zs_data_offset(const zs_data_t *d, int64_t j, int T)
{
    if (T < 1 || d->count < (uint64_t)T + 1)
        return 0;
    return splitmix64((uint64_t)j) % (d->count - (uint64_t)T);
}

/* inputs[i] = tok[s + i], targets[i] = tok[s + i + 1], s = zs_data_offset. */
int zs_data_sample(const zs_data_t *d, int64_t j, int T, int32_t *inputs, int32_t *targets,
                   zs_err_t *err)
{
    if (!d || !inputs || !targets)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_data_sample: data, inputs and targets must not be NULL");
    if (j < 0)
        return zs_err_set(err, ZS_ERR_RANGE, "token file %.*s: sample index %lld is negative",
                          PATH_SHOWN, d->path, (long long)j);
    if (T < 1)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "token file %.*s: sequence length T = %d, must be >= 1", PATH_SHOWN,
                          d->path, T);
    if (d->count < (uint64_t)T + 1)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "token file %.*s: %llu tokens, too few for one window of T + 1 = "
                          "%lld tokens",
                          PATH_SHOWN, d->path, (unsigned long long)d->count, (long long)T + 1);
    uint64_t s = zs_data_offset(d, j, T);
    for (uint64_t i = 0; i <= (uint64_t)T; i++) {
        uint16_t t = token_at(d, s + i);
        if (t >= d->vocab)
            return zs_err_set(err, ZS_ERR_CORRUPT,
                              "token file %.*s: token %u at position %llu is >= vocab %u "
                              "(sample %lld)",
                              PATH_SHOWN, d->path, t, (unsigned long long)(s + i), d->vocab,
                              (long long)j);
        if (i < (uint64_t)T)
            inputs[i] = t;
        if (i > 0)
            targets[i - 1] = t;
    }
    return ZS_OK;
}

/* Tokens [start, start + n) as stored. */
int zs_data_read(const zs_data_t *d, uint64_t start, uint64_t n, uint32_t *out, zs_err_t *err)
{
    if (start > d->count || n > d->count - start)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "token file %.*s: tokens %llu..+%llu are outside its %llu tokens",
                          PATH_SHOWN, d->path, (unsigned long long)start, (unsigned long long)n,
                          (unsigned long long)d->count);
    for (uint64_t i = 0; i < n; i++)
        out[i] = token_at(d, start + i);
    return ZS_OK;
}

/* ---- writing -------------------------------------------------------------- */

/* fsync the directory holding path so the rename is durable (best effort). */
static void sync_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(copy);
}

/* Write header + tokens to fd; returns errno (0 on success). */
static int write_body(int fd, uint32_t vocab, const uint16_t *tokens, uint64_t count)
{
    uint8_t h[ZS_DATA_HEADER_BYTES] = {0};
    memcpy(h, MAGIC, 8);
    wr32(h + 8, VERSION);
    wr32(h + 12, vocab);
    wr64(h + 16, count);
    wr32(h + 24, TOKEN_BYTES);
    if (zs_file_write_all(fd, h, sizeof h))
        return errno;
    static const size_t chunk = WRITE_CHUNK;
    uint8_t *buf = malloc(2 * chunk);
    if (!buf)
        return ENOMEM;
    for (uint64_t i = 0; i < count;) {
        size_t n = count - i < chunk ? (size_t)(count - i) : chunk;
        for (size_t k = 0; k < n; k++) {
            buf[2 * k] = (uint8_t)tokens[i + k];
            buf[2 * k + 1] = (uint8_t)(tokens[i + k] >> 8);
        }
        if (zs_file_write_all(fd, buf, 2 * n)) {
            int e = errno;
            free(buf);
            return e;
        }
        i += n;
    }
    free(buf);
    return fsync(fd) ? errno : 0;
}

/* Validate, write to PATH.tmpXXXXXX, fsync, rename over PATH. */
int zs_data_write(const char *path, uint32_t vocab, const uint16_t *tokens, uint64_t count,
                  zs_err_t *err)
{
    if (!path || (!tokens && count > 0))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_data_write: path and tokens must not be NULL");
    if (vocab < 1 || vocab > VOCAB_MAX)
        return zs_err_set(err, ZS_ERR_RANGE, "token file %.*s: vocab %u, must be 1..%u", PATH_SHOWN,
                          path, vocab, VOCAB_MAX);
    if (count > (UINT64_MAX - ZS_DATA_HEADER_BYTES) / TOKEN_BYTES)
        return zs_err_set(err, ZS_ERR_RANGE, "token file %.*s: %llu tokens is too many", PATH_SHOWN,
                          path, (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++)
        if (tokens[i] >= vocab)
            return zs_err_set(err, ZS_ERR_RANGE,
                              "token file %.*s: token %u at position %llu is >= vocab %u; "
                              "nothing written",
                              PATH_SHOWN, path, tokens[i], (unsigned long long)i, vocab);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof ".tmpXXXXXX");
    if (!tmp)
        return zs_err_set(err, ZS_ERR_NOMEM, "token file %.*s: out of memory", PATH_SHOWN, path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmpXXXXXX", sizeof ".tmpXXXXXX");
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return zs_err_set(err, io_status(e), "token file %.*s: cannot create a temporary file: %s",
                          PATH_SHOWN, path, strerror(e));
    }
    /* mkstemp makes 0600; a token file is data others may read. (Not
     * umask-derived: reading the umask means changing it, process-wide.) */
    (void)fchmod(fd, 0644);
    int e = write_body(fd, vocab, tokens, count);
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e == 0 && rename(tmp, path) != 0)
        e = errno;
    if (e != 0) {
        unlink(tmp);
        free(tmp);
        return zs_err_set(err, e == ENOMEM ? ZS_ERR_NOMEM : ZS_ERR_IO,
                          "token file %.*s: write failed: %s; nothing written", PATH_SHOWN, path,
                          strerror(e));
    }
    free(tmp);
    sync_dir(path);
    return ZS_OK;
}
