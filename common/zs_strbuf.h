/*
 * zs_strbuf.h - a growable text buffer for building JSON and other text of
 * unknown length with printf formats (the model manifest, the safetensors
 * header). Not thread-safe; escaping only where asked
 * (zs_strbuf_add_json_string); otherwise the caller formats what it adds.
 */
#ifndef ZS_STRBUF_H
#define ZS_STRBUF_H

#include <stddef.h>

/* Start from {0}. p is NUL-terminated once anything was added; the owner
 * frees p with free(). oom: an allocation failed (or a format was
 * invalid), and nothing more is added. */
typedef struct zs_strbuf {
    char *p;
    size_t len, cap;
    int oom;
} zs_strbuf_t;

/* Append the printf-formatted text, growing p as needed; on failure set
 * b->oom and leave the text as it was. */
void zs_strbuf_addf(zs_strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append s as a JSON string literal: in quotes, with '"' and '\\' escaped
 * by a backslash and control characters (< 0x20) as \u00XX; other bytes
 * (UTF-8 included) as they are. */
void zs_strbuf_add_json_string(zs_strbuf_t *b, const char *s);

#endif
