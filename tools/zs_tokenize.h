/*
 * zs_tokenize.h - the parts of zs-tokenize: the GPT-2 BPE mode and the
 * readers (--print, --decode) live in zs_tokenize_gpt2.c; main, the options
 * and the byte-level mode in zs_tokenize.c. Each returns the exit status
 * (0 ok, 1 failure with a message on stderr).
 */
#ifndef ZS_TOKENIZE_H
#define ZS_TOKENIZE_H

#include <stdint.h>

/* A growing array of u16 tokens (the whole output is held in memory). */
typedef struct zs__tokbuf {
    uint16_t *t;
    uint64_t n, cap;
} zs__tokbuf_t;

/* Make room for `need` tokens in all; 0 or -1 (out of memory). */
int zs__tokbuf_grow(zs__tokbuf_t *b, uint64_t need);

/* Encode files[0..nfiles) with the GPT-2 BPE of DIR (encoder.json,
 * vocab.bpe), streaming each file in chunks, with <|endoftext|> between
 * files when eot_between; write OUT atomically. Progress on stderr unless
 * quiet, the summary on stdout. */
int zs__tokenize_gpt2(const char *dir, char *const *files, int nfiles, int eot_between, int quiet,
                      const char *out);

/* Print the ids of a token file, one per line, on stdout. */
int zs__tokenize_print(const char *path);

/* Write the bytes of a token file's ids, decoded with DIR's GPT-2 vocab, to
 * stdout. */
int zs__tokenize_decode(const char *dir, const char *path);

#endif
