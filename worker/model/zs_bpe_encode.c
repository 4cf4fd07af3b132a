/*
 * zs_bpe_encode.c - GPT-2 encoding of text: UTF-8 segmentation (invalid
 * bytes become single-byte tokens), GPT-2's pre-tokenisation regex with
 * PCRE2 (JIT when available), and streaming over chunks (zs_bpe_encode).
 *
 * Not here: the vocabulary, the merges and decoding (zs_bpe.c).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "zs_bpe_impl.h"

/* Unicode White_Space, tiktoken's \s (Rust regex): not PCRE2's UCP \s,
 * which adds U+180E. */
#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"                         \
    "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+"
                                   "| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";

#define OUT_BATCH 4096 /* ids handed to emit at a time */

int zs__bpe_regex_init(zs_bpe_t *b, zs_err_t *err)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return zs_err_set(err, ZS_ERR_INTERNAL, "GPT-2 regex does not compile at %zu: %s",
                          (size_t)eo, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter if no JIT */
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) {
        pcre2_code_free(re);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for regex match data");
    }
    b->re = re;
    b->md = md;
    return ZS_OK;
}

/* Free the regex and its match data (NULL fields are fine). */
void zs__bpe_regex_free(zs_bpe_t *b)
{
    pcre2_match_data_free(b->md);
    pcre2_code_free(b->re);
    b->re = b->md = NULL;
}

/* Length of the well-formed UTF-8 sequence at p[0..n) (Unicode table 3-7):
 * 1..4; 0 if p[0] starts no well-formed sequence; -1 if p[0..n) is a proper
 * prefix of one (more bytes could complete it). */
static int utf8_len(const uint8_t *p, size_t n)
{
    uint8_t c = p[0];
    if (c < 0x80)
        return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return -1;
        if (p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xBF))
            return 0;
    }
    return len;
}

typedef struct sink {
    zs_bpe_emit_fn emit;
    void *ctx;
    uint32_t *ids; /* the caller's OUT_BATCH array, or malloc'd when heap */
    size_t n, cap;
    int heap;
} sink_t;

/* Hand the buffered ids to emit; its status. */
static int sink_flush(sink_t *s)
{
    int rc = s->n ? s->emit(s->ctx, s->ids, s->n) : ZS_OK;
    s->n = 0;
    return rc;
}

/* Make room for `need` more ids (a piece of `need` bytes). */
static int sink_room(sink_t *s, size_t need, zs_err_t *err)
{
    if (s->n + need <= s->cap)
        return ZS_OK;
    int rc = sink_flush(s);
    if (rc != ZS_OK)
        return zs_err_set(err, rc, "the token consumer stopped the encoding (%d)", rc);
    if (need > s->cap) {
        uint32_t *ids = realloc(s->heap ? s->ids : NULL, need * sizeof *ids);
        if (!ids)
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu ids", need);
        s->ids = ids;
        s->heap = 1;
        s->cap = need;
    }
    return ZS_OK;
}

/* Merge one piece and buffer its ids. */
static int emit_piece(zs_bpe_t *b, sink_t *s, const uint8_t *p, size_t len, zs_err_t *err)
{
    int rc = sink_room(s, len, err);
    return rc != ZS_OK ? rc : zs__bpe_piece(b, p, len, s->ids, &s->n, err);
}

/* Encode the valid UTF-8 segment seg[0..n) piece by piece. With `last`
 * (the segment touches the end of the text and more may follow), the final
 * piece is kept back: *kept is set to its offset (n if none is kept). */
static int encode_segment(zs_bpe_t *b, sink_t *s, const uint8_t *seg, size_t n, int last,
                          size_t *kept, zs_err_t *err)
{
    pcre2_code *re = b->re;
    pcre2_match_data *md = b->md;
    size_t pos = 0;
    *kept = n;
    while (pos < n) {
        int m = pcre2_match(re, seg, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m < 0)
            return m == PCRE2_ERROR_NOMATCH
                       ? zs_err_set(err, ZS_ERR_INTERNAL,
                                    "GPT-2 regex matched nothing at byte %zu of a segment", pos)
                       : zs_err_set(err, ZS_ERR_INTERNAL, "PCRE2 match error %d", m);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], e = ov[1];
        if (a != pos || e <= a) /* every character is matched by some branch */
            return zs_err_set(err, ZS_ERR_INTERNAL, "GPT-2 regex skipped bytes %zu..%zu", pos, a);
        if (last && e == n) {
            *kept = a;
            return ZS_OK;
        }
        int rc = emit_piece(b, s, seg + a, e - a, err);
        if (rc != ZS_OK)
            return rc;
        pos = e;
    }
    return ZS_OK;
}

/* Encode a prefix of text (zs_bpe.h): valid UTF-8 stretches through the regex, bad bytes as byte
 * tokens, the last piece kept back unless at_end. */
int zs_bpe_encode(zs_bpe_t *b, const uint8_t *text, size_t n, int at_end, size_t *used,
                  zs_bpe_emit_fn emit, void *ctx, zs_err_t *err)
{
    uint32_t stack_ids[OUT_BATCH];
    sink_t s = {.emit = emit, .ctx = ctx, .ids = stack_ids, .cap = OUT_BATCH};
    int rc = ZS_OK;
    size_t i = 0, done = 0;
    *used = 0;
    while (i < n && rc == ZS_OK) {
        /* the valid stretch text[i..j) */
        size_t j = i;
        int l = 0;
        while (j < n && (l = utf8_len(text + j, n - j)) > 0)
            j += (size_t)l;
        int incomplete = j < n && l < 0 && !at_end; /* a sequence cut by the chunk's end */
        if (j > i) {
            size_t kept;
            rc = encode_segment(b, &s, text + i, j - i, !at_end && (j == n || incomplete), &kept,
                                err);
            done = i + kept;
            if (rc != ZS_OK || kept < j - i)
                break;
        }
        if (j < n && incomplete)
            break;
        if (j < n) { /* text[j] starts no well-formed sequence: one byte token */
            rc = sink_room(&s, 1, err);
            if (rc == ZS_OK)
                s.ids[s.n++] = b->byte_id[text[j]];
            j++;
        }
        i = done = j;
    }
    if (rc == ZS_OK) {
        rc = sink_flush(&s);
        if (rc != ZS_OK)
            zs_err_set(err, rc, "the token consumer stopped the encoding (%d)", rc);
    }
    if (s.heap)
        free(s.ids);
    if (rc == ZS_OK)
        *used = done;
    return rc;
}
