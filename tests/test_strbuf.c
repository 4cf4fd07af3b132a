/*
 * test_strbuf.c - unit tests of common/zs_strbuf (the growable text buffer
 * of the model manifest and the safetensors header).
 *
 * Covers: the first add into an empty buffer (even of no text), adds of
 * one character (every fill level), many small adds and one add far larger
 * than the capacity, each byte for byte against
 * one snprintf of the whole text; the NUL terminator; a buffer marked oom
 * adds nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_strbuf.h"
#include "zs_test.h"

int main(void)
{
    /* no text into an empty buffer: an empty string, not NULL */
    zs_strbuf_t e = {0};
    zs_strbuf_addf(&e, "%s", "");
    TEST_CHECK(!e.oom && e.p && e.len == 0 && e.p[0] == '\0');
    free(e.p);

    /* one character at a time: every fill level of every capacity, so the
     * add that exactly fills the room (no space left for the NUL) occurs */
    zs_strbuf_t c = {0};
    for (int i = 0; i < 5000; i++)
        zs_strbuf_addf(&c, "%c", 'a' + i % 26);
    TEST_CHECKF(!c.oom && c.len == 5000 && strlen(c.p) == 5000, "len %zu", c.len);
    for (int i = 0; i < 5000; i++)
        TEST_CHECKF(c.p[i] == 'a' + i % 26, "byte %d is '%c'", i, c.p[i]);
    free(c.p);

    /* many small adds: the same text as one formatting of it */
    enum { N = 20000 };
    zs_strbuf_t b = {0};
    size_t want_len = 0;
    for (int i = 0; i < N; i++) {
        zs_strbuf_addf(&b, "%s[\"t%d\",%d]", i ? "," : "", i, i * 7);
        want_len += (size_t)snprintf(NULL, 0, "%s[\"t%d\",%d]", i ? "," : "", i, i * 7);
    }
    TEST_CHECKF(!b.oom && b.len == want_len && strlen(b.p) == b.len, "len %zu, want %zu", b.len,
                want_len);
    char *want = malloc(want_len + 1), *w = want;
    for (int i = 0; i < N; i++)
        w += sprintf(w, "%s[\"t%d\",%d]", i ? "," : "", i, i * 7);
    TEST_CHECK(memcmp(b.p, want, want_len + 1) == 0);
    free(want);

    /* one add far beyond the capacity */
    size_t big = 10 * b.cap + 3;
    char *s = malloc(big + 1);
    memset(s, 'x', big);
    s[big] = '\0';
    size_t before = b.len;
    zs_strbuf_addf(&b, "<%s>", s);
    TEST_CHECK(!b.oom && b.len == before + big + 2 && b.p[before] == '<' && b.p[b.len - 1] == '>' &&
               b.p[b.len] == '\0');
    TEST_CHECK(b.cap > b.len);
    free(s);

    /* after a failure nothing more is added */
    b.oom = 1;
    size_t len = b.len;
    zs_strbuf_addf(&b, "more");
    TEST_CHECK(b.len == len && b.p[len] == '\0');
    free(b.p);

    /* a JSON string literal: quotes, backslashes and control characters
     * escaped, other bytes (UTF-8) as they are */
    zs_strbuf_t j = {0};
    zs_strbuf_add_json_string(&j, "a\"b\\c\n\x01" "d\xc3\xa9");
    TEST_CHECKF(!j.oom && strcmp(j.p, "\"a\\\"b\\\\c\\u000a\\u0001d\xc3\xa9\"") == 0, "got %s",
                j.p);
    free(j.p);
    printf("test_strbuf: %d adds, one of %zu bytes: ok; JSON string escaping: ok\n", N, big);
    return 0;
}
