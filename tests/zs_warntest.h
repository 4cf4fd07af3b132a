/*
 * zs_warntest.h - capturing the configuration's warnings in the config
 * tests (test_config.c, test_config_actckpt.c): zs_config_parse's warning
 * callback records each (path, reason) pair, and the checks ask how often a
 * path was warned and why. Header only; the tests stop on the first
 * failure (zs_test.h).
 */
#ifndef ZS_WARNTEST_H
#define ZS_WARNTEST_H

#include <stdio.h>
#include <string.h>

#include "zs_test.h"

typedef struct warns {
    int n;
    char path[64][160];
    char why[64][320];
} warns_t;

/* zs_config_parse's warning callback; ud is a warns_t. */
static inline void on_warn(void *ud, const char *path, const char *why)
{
    warns_t *w = ud;
    TEST_CHECK(w->n < 64);
    snprintf(w->path[w->n], sizeof w->path[0], "%s", path);
    snprintf(w->why[w->n], sizeof w->why[0], "%s", why);
    w->n++;
}

/* How many times `path` was warned. */
static inline int nwarn(const warns_t *w, const char *path)
{
    int k = 0;
    for (int i = 0; i < w->n; i++)
        k += strcmp(w->path[i], path) == 0;
    return k;
}

/* The path was warned exactly once, and its reason starts with `why`. */
static inline void expect_warn(const warns_t *w, const char *path, const char *why)
{
    TEST_CHECKF(nwarn(w, path) == 1, "warning for %s seen %d times", path, nwarn(w, path));
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->path[i], path) == 0)
            TEST_CHECKF(strncmp(w->why[i], why, strlen(why)) == 0, "%s: why '%s', want '%s...'",
                        path, w->why[i], why);
}

#endif
