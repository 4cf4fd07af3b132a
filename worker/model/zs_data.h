/*
 * zs_data.h - token files and deterministic sampling.
 *
 * Also read: llm.c .bin shards and lists of files (zs_data_open).
 *
 * File format (little-endian): a 64-byte header
 *   magic "ZSTOKENS" (8 bytes), version u32 (=1), vocab u32 (1..65536),
 *   count u64 (tokens), token_bytes u32 (2), reserved (36 bytes, zero)
 * followed by `count` u16 tokens, each < vocab.
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
int zs_data_writer_close(zs_data_writer_t *w, int commit, zs_err_t *err);

#endif
