/*
 * zs_vocabtest.h - a small GPT-2-style vocabulary for tests that need
 * encoder.json and vocab.bpe but not OpenAI's 50257 tokens (test_data.c,
 * test_train_vocab.c): the 256 byte tokens under GPT-2's byte-to-unicode
 * keys, "ab" (256) and <|endoftext|> (257), one merge "a b". zs_bpe_load
 * reads it as it reads GPT-2's. Header only.
 */
#ifndef ZS_VOCABTEST_H
#define ZS_VOCABTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "zs_test.h"

/* Create folder `dir` (if missing) with the vocabulary's two files. */
static inline void zs_test_write_vocab(const char *dir)
{
    char *enc = malloc(1 << 16), path[1024];
    TEST_CHECK(enc != NULL);
    size_t n = (size_t)sprintf(enc, "{");
    for (int c = 0, k = 0; c < 256; c++) { /* encoder.py's bytes_to_unicode */
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        n += (size_t)sprintf(enc + n, "\"\\u%04x\": %d, ", printable ? c : 256 + k++, c);
    }
    sprintf(enc + n, "\"ab\": 256, \"<|endoftext|>\": 257}");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    FILE *f = fopen(path, "wb");
    TEST_CHECKF(f && fputs(enc, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    f = fopen(path, "wb");
    TEST_CHECKF(f && fputs("#version: 0.2\na b\n", f) >= 0 && fclose(f) == 0, "cannot write %s",
                path);
    free(enc);
}

#endif
