/*
 * test_coll.h - what the two halves of test_coll share: test_coll.c (the
 * collectives' results: exact values, layouts, split paths, special values,
 * determinism, isolation, lifetime, main) and test_coll_stream.c (stream
 * ordering with `after` and `done`, sticky errors, the host helpers,
 * refusals). Buffers are CPU device memory, which is host memory: the tests
 * fill and read it directly, only while no stream work uses it.
 */
#ifndef TEST_COLL_H
#define TEST_COLL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include "zs_coll.h"
#include "zs_mpitest.h"

extern int g_size; /* g_rank: zs_mpitest.h */
extern zs_dev_t *g_dev;

/* expr (using the error record e_) must fail with code `want` and a message
 * mentioning `needle`. */
#define REFUSED(expr, want, needle)                                                                \
    do {                                                                                           \
        zs_err_t e_;                                                                               \
        zs_err_clear(&e_);                                                                         \
        int rc_ = (expr);                                                                          \
        CHECK(rc_ == (want) && e_.code == (want) && strstr(e_.msg, (needle)),                      \
              "expected %s mentioning '%s', got %d (%s): %s", zs_status_name(want), (needle), rc_, \
              zs_status_name(rc_), e_.msg);                                                        \
    } while (0)

static const zs_dtype_t DTYPES[] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};

void sleep_ms(int ms);

/* A device buffer with guard zones on both sides (ZS_MEM_SCRATCH). */
#define GUARD      16   /* elements on each side of every buffer */
#define GUARD_BYTE 0xA5 /* also the initial garbage: a finite number in every dtype */

typedef struct {
    unsigned char *base; /* the allocation: guard, n elements, guard */
    void *p;             /* the n elements */
    size_t n;
    zs_dtype_t dt;
} dbuf_t;

dbuf_t dbuf_new(size_t n, zs_dtype_t dt);
/* Checks that the guard zones are untouched, then frees. */
void dbuf_free(dbuf_t *b, const char *what);

/* Element i of b (dtype dt) as a float, and back (rounded to nearest even). */
void put(void *b, zs_dtype_t dt, size_t i, float v);
float get(const void *b, zs_dtype_t dt, size_t i);

/* Integer data of rank r at index i, exact in sums over 4 ranks in dt. */
float val(zs_dtype_t dt, int r, size_t i);
float sum_over_ranks(zs_dtype_t dt, size_t i);
float max_over_ranks(zs_dtype_t dt, size_t i);
void expect_eq(const void *b, zs_dtype_t dt, size_t i, float want, const char *what, size_t n);

typedef enum { K_AR_SUM, K_AR_MAX, K_RS, K_AG, K_BC } kind_t;

/* One collective on val() data, enqueued, then checked exactly. */
void run_one(zs_coll_t *c, kind_t kind, zs_dtype_t dt, size_t n, int root);

/* test_coll_stream.c */
void test_after(zs_coll_t *c);
void test_done(zs_coll_t *c);
void test_sticky(zs_coll_t *c);
void test_host(zs_coll_t *c);
void test_errors(zs_coll_t *c);
void test_group(zs_coll_t *c);

#endif
