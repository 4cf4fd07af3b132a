/*
 * zs_strbuf.c - a growable text buffer (see zs_strbuf.h).
 */
#include "zs_strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void zs_strbuf_addf(zs_strbuf_t *b, const char *fmt, ...)
{
    /* the first try formats into what is left (or only measures, when
     * nothing is allocated yet); the second into room for the whole text */
    for (int tries = 0; tries < 2 && !b->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

void zs_strbuf_add_json_string(zs_strbuf_t *b, const char *s)
{
    zs_strbuf_addf(b, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            zs_strbuf_addf(b, "\\%c", ch);
        else if (ch < 0x20)
            zs_strbuf_addf(b, "\\u%04x", ch);
        else
            zs_strbuf_addf(b, "%c", ch);
    }
    zs_strbuf_addf(b, "\"");
}
