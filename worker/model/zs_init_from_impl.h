/*
 * zs_init_from_impl.h - the inside of zs_init_from_t, shared by
 * zs_init_from.c (reading the files) and zs_init_from_model.c (the model
 * wrapper). Not a public header.
 */
#ifndef ZS_INIT_FROM_IMPL_H
#define ZS_INIT_FROM_IMPL_H

#include <stdint.h>

#include "zs_init_from.h"

/* Where one of our tensors is in the mapped file: element (r, c) of a
 * [rows, cols] tensor is at p[r * cols + c], or at p[c * rows + r] when
 * transposed (llm.c's [out, in] matrices); dt F32, BF16 or F16. Only the
 * first rows of wte and wpe may be used (llm.c's padded vocab, --ctx). */
typedef struct zs__init_src {
    const uint8_t *p;
    int dt;
    uint64_t rows, cols;
    int transposed;
} zs__init_src_t;

struct zs_init_from {
    const uint8_t *map;
    uint64_t len;
    char format[16];
    zs_gpt_config_t shape; /* the file's; heads 0 if it does not say */
    int has_bpe;           /* our export's metadata names a GPT-2 vocabulary */
    zs_data_bpe_t bpe;     /* that one (zs_init_from_bpe) */
    zs__init_src_t *src;   /* [zs_gpt_num_tensors(&shape)] */
    /* the wrapped model (zs_init_from_wrap) */
    zs_model_t model, inner;
    zs_gpt_config_t cfg;
};

#endif
