/*
 * zs_data.h - token files and deterministic sampling.
 *
 * Also read: llm.c .bin shards and lists of files (zs_data_open).
 *
 * File format (little-endian): a 64-byte header
 *   magic "ZSTOKENS" (8 bytes), version u32 (1 or 2), vocab u32 (1..65536),
 *   count u64 (tokens), token_bytes u32 (2), then
 *   version 1: reserved (36 bytes, zero);
 *   version 2: tokenizer u32 (1 = GPT-2 BPE), dir_bytes u32 (1..4095),
 *     encoder_xxh3 u64, merges_xxh3 u64, reserved (12 bytes, zero)
 * followed by `count` u16 tokens, each < vocab, and in version 2 by
 * dir_bytes bytes: the vocabulary folder's path (no NUL). Version 2 is what
 * zs-tokenize --gpt2 writes (zs_data_bpe_t); every other file is version 1,
 * so builds that read only version 1 still read those.
 *
 * Sampling: sample j (a global sample index, zs_batch_sample in zs_engine.h)
 * is the window of T+1 tokens starting at zs_data_offset(j), inputs the
 * first T, targets the last T. The offset is a pure function of (j, count,
 * T), so the global batch of a step is the same for any worker count and a
 * resumed run sees exactly the batches it would have seen.
 */
#ifndef ZS_DATA_H
#define ZS_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "zs_status.h"

#define ZS_DATA_HEADER_BYTES 64

typedef struct zs_data zs_data_t;

/* Open and validate token data (mmap, read-only): one file, a comma list,
 * or a glob (matches sorted by name), each a zeroshard token file or an
 * llm.c .bin shard (magic 20240520, version 1, uint16 GPT-2 tokens, vocab
 * 50257), told apart by the magic; several are concatenated in order
 * (zs_data_shards.c). *out freed with zs_data_close. Refuses a glob with no
 * match, bad magic/version, a size that disagrees with the count
 * (truncated), files of different vocabs, and (checked lazily per sample)
 * tokens >= vocab. */
int zs_data_open(const char *path, zs_data_t **out, zs_err_t *err);
void zs_data_close(zs_data_t *d);

uint32_t zs_data_vocab(const zs_data_t *d);
uint64_t zs_data_count(const zs_data_t *d);

/* First token of sample j's window (needs count >= T + 1). */
uint64_t zs_data_offset(const zs_data_t *d, int64_t j, int T);

/* inputs[T], targets[T] of sample j. */
int zs_data_sample(const zs_data_t *d, int64_t j, int T, int32_t *inputs, int32_t *targets,
                   zs_err_t *err);

/* The GPT-2 vocabulary a token file's ids come from, as zs-tokenize --gpt2
 * records it (version 2): the folder holding encoder.json and vocab.bpe,
 * and the XXH3-64 of each file, so a reader can decode the ids without
 * being told the folder and can tell when the folder no longer holds the
 * files the ids were made with (zs_data_bpe.c). */
#define ZS_DATA_DIR_MAX 4096 /* dir's bytes, NUL included */
typedef struct zs_data_bpe {
    char dir[ZS_DATA_DIR_MAX]; /* absolute path */
    uint64_t encoder_xxh3;     /* of dir/encoder.json */
    uint64_t merges_xxh3;      /* of dir/vocab.bpe */
} zs_data_bpe_t;

/* The vocabulary recorded in d's file(s), or NULL: none recorded (version
 * 1, llm.c shards), or files of a list that record different ones. */
const zs_data_bpe_t *zs_data_bpe(const zs_data_t *d);

/* The record for folder `dir`: its absolute path and the hashes of its
 * encoder.json and vocab.bpe. ZS_ERR_NOTFOUND / ZS_ERR_IO naming the file
 * that cannot be read, ZS_ERR_RANGE for a path of ZS_DATA_DIR_MAX bytes or
 * more. */
int zs_data_bpe_of_dir(const char *dir, zs_data_bpe_t *out, zs_err_t *err);

/* Load the recorded vocabulary (zs_bpe_load on rec->dir) after checking
 * that its files still hash as recorded: ZS_ERR_NOTFOUND when the folder
 * or a file is gone, ZS_ERR_CORRUPT naming the file whose hash differs (a
 * different vocabulary now lives there). *out as zs_bpe_load's. */
struct zs_bpe;
int zs_data_bpe_load(const zs_data_bpe_t *rec, struct zs_bpe **out, zs_err_t *err);

/* Copy tokens [start, start + n) into out (as stored; not checked against
 * the vocab). ZS_ERR_RANGE if the range is not inside the file. */
int zs_data_read(const zs_data_t *d, uint64_t start, uint64_t n, uint32_t *out, zs_err_t *err);

/* Write `count` tokens (each < vocab) as a token file. */
int zs_data_write(const char *path, uint32_t vocab, const uint16_t *tokens, uint64_t count,
                  zs_err_t *err);

/* Writing a token file as a stream (zs_data_writer.c): memory stays
 * bounded whatever the count. open creates PATH.tmpXXXXXX next to PATH;
 * add appends tokens (each < vocab, else ZS_ERR_RANGE: then close without
 * commit); close with
 * commit writes the header, fsyncs and renames over PATH (a reader sees the
 * old file or the whole new one), without commit removes the temporary
 * file and leaves PATH as it was. close frees w in both cases. */
typedef struct zs_data_writer zs_data_writer_t;
int zs_data_writer_open(const char *path, uint32_t vocab, zs_data_writer_t **out, zs_err_t *err);
int zs_data_writer_add(zs_data_writer_t *w, const uint32_t *tokens, size_t n, zs_err_t *err);
uint64_t zs_data_writer_count(const zs_data_writer_t *w);
/* Record the vocabulary the tokens come from: the file is then written as
 * version 2 (see the format above). Any time before close. */
void zs_data_writer_set_bpe(zs_data_writer_t *w, const zs_data_bpe_t *rec);
int zs_data_writer_close(zs_data_writer_t *w, int commit, zs_err_t *err);

#endif
