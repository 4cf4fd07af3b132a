/*
 * zs_config_unknown.c - unknown keys of a DeepSpeed config: the closest
 * known key by edit distance ("did you mean zero_optimization?"), and the
 * refusal (or, with allow_unknown, the warning) that names both.
 *
 * Closeness is the case-insensitive edit distance (with transpositions), or
 * for names that differ by whole '_'-separated words ("warmup_steps",
 * "warmup_num_steps") 1 + the number of extra words, whichever is smaller.
 *
 * A typo such as "zero_optimisation" would otherwise train at stage 0, so an
 * unknown key is an error unless the caller allows it. The parse goes on
 * after the first unknown key to name the others in the same message;
 * zs__cfg_unknown_finish turns the list into the error at the end.
 *
 * What it does not do: it knows no DeepSpeed key (zs_config.c passes the
 * keys known at each level, aliases and not-implemented keys included), and
 * it never suggests a key of another level.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "zs_config_internal.h"

#define NEAR_MAX 80 /* longest key compared; longer keys get no suggestion */

static int fold(int ch)
{
    return (ch >= 'A' && ch <= 'Z') ? ch + 32 : ch;
}

/* Optimal string alignment distance (Levenshtein plus adjacent
 * transpositions), ASCII case-insensitive; INT_MAX if either string is
 * longer than NEAR_MAX bytes. */
static int edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > NEAR_MAX || m > NEAR_MAX)
        return INT_MAX;
    int rows[3][NEAR_MAX + 1]; /* rows i-2, i-1, i at (i+1)%3, (i+2)%3, i%3 */
    for (size_t j = 0; j <= m; j++)
        rows[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int *cur = rows[i % 3], *prev = rows[(i - 1) % 3], *pp = rows[(i + 1) % 3];
        cur[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int cost = fold(a[i - 1]) != fold(b[j - 1]);
            int d = prev[j] + 1;
            if (cur[j - 1] + 1 < d)
                d = cur[j - 1] + 1;
            if (prev[j - 1] + cost < d)
                d = prev[j - 1] + cost;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) &&
                fold(a[i - 2]) == fold(b[j - 1]) && pp[j - 2] + 1 < d)
                d = pp[j - 2] + 1;
            cur[j] = d;
        }
    }
    return rows[n % 3][m];
}

#define WORDS_MAX 12 /* '_'-separated words compared per name */

typedef struct word {
    const char *p;
    size_t n;
} word_t;

/* Split name at '_' into at most WORDS_MAX non-empty words; -1 if more. */
static int split_words(const char *name, word_t *w)
{
    int k = 0;
    for (const char *p = name; *p;) {
        size_t n = strcspn(p, "_");
        if (n) {
            if (k == WORDS_MAX)
                return -1;
            w[k++] = (word_t){p, n};
        }
        p += n;
        if (*p == '_')
            p++;
    }
    return k;
}

/* Whether word a is among b[0..nb), ASCII case-insensitively. */
static int word_in(word_t a, const word_t *b, int nb)
{
    for (int j = 0; j < nb; j++) {
        if (b[j].n != a.n)
            continue;
        size_t i = 0;
        while (i < a.n && fold(a.p[i]) == fold(b[j].p[i]))
            i++;
        if (i == a.n)
            return 1;
    }
    return 0;
}

/* A second measure for names that differ by whole words: when every word
 * of one name is a word of the other ("warmup_steps" in
 * "warmup_num_steps"), 1 + the number of extra words; else INT_MAX. Edit
 * distance alone would prefer "warmup_type" there. */
static int word_distance(const char *a, const char *b)
{
    word_t wa[WORDS_MAX], wb[WORDS_MAX];
    int na = split_words(a, wa), nb = split_words(b, wb);
    if (na <= 0 || nb <= 0)
        return INT_MAX;
    if (na > nb) {
        word_t t[WORDS_MAX];
        memcpy(t, wa, sizeof t);
        memcpy(wa, wb, sizeof wa);
        memcpy(wb, t, sizeof wb);
        int tn = na;
        na = nb;
        nb = tn;
    }
    for (int i = 0; i < na; i++)
        if (!word_in(wa[i], wb, nb))
            return INT_MAX;
    return 1 + (nb - na);
}

/* Start a search for the known key closest to key. */
void zs__cfg_near_init(cfg_near_t *n, const char *key)
{
    n->key = key;
    n->best = NULL;
    n->dist = INT_MAX;
}

/* Consider one known key: kept if it is closer than the best so far (the
 * first of equals wins) and within a third of the longer name's length (at
 * least 1 edit), so that "foo" suggests nothing rather than "eps". Closeness
 * is the edit distance, or the word distance when that is smaller. */
void zs__cfg_near_add(cfg_near_t *n, const char *cand)
{
    int d = edit_distance(n->key, cand), wd = word_distance(n->key, cand);
    if (wd < d)
        d = wd;
    size_t lk = strlen(n->key), lc = strlen(cand);
    int limit = (int)((lk > lc ? lk : lc) / 3);
    if (limit < 1)
        limit = 1;
    if (d <= limit && d < n->dist) {
        n->dist = d;
        n->best = cand;
    }
}

/* zs__cfg_near_add for each key of a NULL-terminated list (list may be NULL). */
void zs__cfg_near_add_list(cfg_near_t *n, const char *const *list)
{
    for (; list && *list; list++)
        zs__cfg_near_add(n, *list);
}

/* Append ", item" (just "item" first) to c->unknown; an item that does not
 * fit (room for ", ..." is always kept) ends the list with ", ..." once. */
static void unknown_append(pctx_t *c, const char *item)
{
    static const char more[] = ", ...";
    size_t used = strlen(c->unknown), room = sizeof c->unknown - sizeof more - used;
    if (c->unknown_full)
        return;
    size_t need = (used ? 2 : 0) + strlen(item);
    if (need < room) {
        snprintf(c->unknown + used, room, "%s%s", used ? ", " : "", item);
    } else {
        const char *m = used ? more : more + 2; /* a first item too long: just "..." */
        memcpy(c->unknown + used, m, strlen(m) + 1);
        c->unknown_full = 1;
    }
}

/* The unknown key parent.key, with the suggestion n found (n may be NULL):
 * with c->allow_unknown a warning "unknown key (did you mean P?), ignored"
 * once, else recorded for zs__cfg_unknown_finish. Returns ZS_OK. */
int zs__cfg_unknown(pctx_t *c, const char *parent, const char *key, const cfg_near_t *n)
{
    char p[PATH_MAX_LEN], s[PATH_MAX_LEN], item[2 * PATH_MAX_LEN + 32];
    zs__cfg_path_join(p, parent, key);
    s[0] = '\0';
    if (n && n->best)
        zs__cfg_path_join(s, parent, n->best);
    if (c->allow_unknown) {
        if (s[0])
            snprintf(item, sizeof item, "unknown key (did you mean %s?), ignored", s);
        else
            snprintf(item, sizeof item, "unknown key, ignored");
        zs__cfg_warn_once(c, p, item);
        return ZS_OK;
    }
    if (s[0])
        snprintf(item, sizeof item, "%s (did you mean %s?)", p, s);
    else
        snprintf(item, sizeof item, "%s", p);
    unknown_append(c, item);
    c->nunknown++;
    return ZS_OK;
}

/* zs__cfg_unknown with the closest key among two NULL-terminated lists
 * (known2 may be NULL). */
int zs__cfg_unknown_in(pctx_t *c, const char *parent, const char *key, const char *const *known,
                       const char *const *known2)
{
    cfg_near_t n;
    zs__cfg_near_init(&n, key);
    zs__cfg_near_add_list(&n, known);
    zs__cfg_near_add_list(&n, known2);
    return zs__cfg_unknown(c, parent, key, &n);
}

/* ZS_ERR_INVALID naming every unknown key recorded (as many as fit), or
 * ZS_OK if there was none. */
int zs__cfg_unknown_finish(pctx_t *c)
{
    if (c->nunknown == 0)
        return ZS_OK;
    return zs_err_set(c->err, ZS_ERR_INVALID,
                      "unknown key%s %s; zs-train --allow-unknown-keys lets unknown keys "
                      "through with a warning",
                      c->nunknown > 1 ? "s" : "", c->unknown);
}
