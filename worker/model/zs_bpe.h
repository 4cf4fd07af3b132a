/*
 * zs_bpe.h - GPT-2's byte-level BPE: load OpenAI's encoder.json and
 * vocab.bpe, encode bytes to token ids, decode ids to bytes.
 *
 * Encoding is GPT-2's (openai/gpt-2 encoder.py, tiktoken's "gpt2"):
 *   1. pre-tokenisation with GPT-2's regex
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (PCRE2, Unicode properties; \s is Unicode White_Space as in tiktoken);
 *   2. each piece's UTF-8 bytes merged by the ranks of vocab.bpe; the
 *      byte-to-unicode map of encoder.py only translates the files' keys.
 * Text is ordinary text: "<|endoftext|>" inside it is encoded as the
 * characters it is; id 50256 is only emitted by the caller (zs_bpe_eot).
 *
 * Invalid UTF-8: a byte that is not part of a well-formed UTF-8 sequence
 * (Unicode 15, table 3-7) is a piece of its own and becomes its single-byte
 * token; the valid stretches on either side are encoded as if the text ended
 * or began there (the bad byte is a barrier to the regex, like PCRE2's
 * PCRE2_MATCH_INVALID_UTF). So every byte string encodes, and decoding gives
 * the bytes back.
 *
 * Streaming: zs_bpe_encode takes text in chunks and encodes the longest
 * prefix whose tokens cannot change with more text; the caller keeps the
 * rest and passes it again with the next chunk. The ids are the same as for
 * the whole text at once.
 *
 * Not here: reading files of text (tools/zs_tokenize.c), token files
 * (zs_data.h), special tokens other than <|endoftext|>.
 */
#ifndef ZS_BPE_H
#define ZS_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "zs_status.h"

#define ZS_BPE_GPT2_VOCAB 50257u /* 50000 merges + 256 bytes + <|endoftext|> */

typedef struct zs_bpe zs_bpe_t;

/* Load DIR/encoder.json and DIR/vocab.bpe as OpenAI released them. Refuses
 * (ZS_ERR_CORRUPT, naming the file and line or key) a file that is not what
 * GPT-2's are: a key that is not byte-to-unicode text, an id outside the
 * vocab or given twice, a missing byte token, a merge whose parts or result
 * are not in the encoder. Files larger than 64 MiB are refused before they
 * are read. *out is freed with zs_bpe_free. */
int zs_bpe_load(const char *dir, zs_bpe_t **out, zs_err_t *err);
void zs_bpe_free(zs_bpe_t *b);

/* Number of ids (max id + 1): 50257 for GPT-2. */
uint32_t zs_bpe_vocab(const zs_bpe_t *b);

/* Id of "<|endoftext|>" (50256 for GPT-2), or -1 if the encoder has none. */
int32_t zs_bpe_eot(const zs_bpe_t *b);

/* Receives encoded ids in order; returns ZS_OK or an error code, which
 * stops the encoding and is returned by zs_bpe_encode. */
typedef int (*zs_bpe_emit_fn)(void *ctx, const uint32_t *ids, size_t n);

/* Encode a prefix of text[0..n) and pass its ids to emit. With at_end, all
 * of it is encoded; without, the encoder keeps back the last pre-token
 * piece (and any incomplete UTF-8 sequence at the end), whose encoding may
 * still change with more text. *used is set to the bytes encoded; the caller
 * passes text[*used..n) again, followed by more, in the next call. Not
 * thread-safe (a per-encoder piece cache); one zs_bpe_t per thread. */
int zs_bpe_encode(zs_bpe_t *b, const uint8_t *text, size_t n, int at_end, size_t *used,
                  zs_bpe_emit_fn emit, void *ctx, zs_err_t *err);

/* The bytes of one id (not NUL-terminated, valid while b lives);
 * ZS_ERR_RANGE for an id outside the vocab. */
int zs_bpe_token_bytes(const zs_bpe_t *b, uint32_t id, const uint8_t **bytes, size_t *len,
                       zs_err_t *err);

#endif
