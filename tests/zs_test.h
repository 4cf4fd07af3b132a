/*
 * zs_test.h - tiny assertion helpers shared by the tests (header only).
 *
 * Tests stop on the first failure (only main and tests may exit), printing
 * file:line and the failed expression. TEST_OK(expr) expects ZS_OK and prints
 * the zs_err_t message of the named error record when it is not.
 */
#ifndef ZS_TEST_H
#define ZS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define TEST_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define TEST_CHECKF(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* expr returns a zs status; err is a zs_err_t (not a pointer). */
#define TEST_OK(expr, err)                                                                         \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #expr, rc_,    \
                    (err).msg);                                                                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* |a - b| <= atol + rtol * |b|, tracking the worst absolute error seen. */
static inline int zs_test_close(double a, double b, double atol, double rtol, double *maxerr)
{
    double e = fabs(a - b);
    if (maxerr && e > *maxerr)
        *maxerr = e;
    return e <= atol + rtol * fabs(b);
}

/* Raw bytes to and from DIR/NAME (tensors exchanged with the Python
 * references in tests/ref): the whole file must be exactly n bytes. */
static inline void zs_test_write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    TEST_CHECKF(fp && fwrite(p, 1, n, fp) == n && fclose(fp) == 0, "write %s", path);
}

static inline void zs_test_read_file(const char *dir, const char *name, void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "rb");
    TEST_CHECKF(fp != NULL, "open %s", path);
    size_t got = fread(p, 1, n, fp);
    char extra;
    TEST_CHECKF(got == n && fread(&extra, 1, 1, fp) == 0, "%s: %zu bytes, expected %zu", path, got,
                n);
    fclose(fp);
}

/* Max and root-mean-square of |a - b| over n elements (0 for n = 0). */
static inline void zs_test_diff_stats(const float *a, const float *b, size_t n, double *max,
                                      double *rms)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        m = fmax(m, e);
        s += e * e;
    }
    *max = m;
    *rms = n ? sqrt(s / (double)n) : 0;
}

#endif
