/*
 * test_loss_scale.c - fp16 loss scaling (worker/engine/zs_loss_scale.c).
 *
 * Scripted overflow sequences with scales derived by hand from DeepSpeed's
 * DynamicLossScaler.update_scale: hysteresis 2 (the first overflow keeps the
 * scale, the next halves it), window 3 (the scale doubles on the clean step
 * that follows 3 clean steps), the min_loss_scale floor and DeepSpeed's stop
 * when already at it, consecutive_hysteresis, a static scale that never
 * changes, bf16/fp32 (scale 1, never skip), and the 40-byte save/load.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zs_loss_scale.h"
#include "zs_test.h"

typedef struct ev {
    int overflow;
    int ret;      /* expected return */
    double scale; /* expected scale after the update */
    int cur_h;    /* expected hysteresis counter after the update */
} ev_t;

static void run(zs_loss_scale_t *ls, const ev_t *evs, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        int64_t it = ls->iter;
        int rc = zs_loss_scale_update(ls, evs[i].overflow);
        TEST_CHECKF(rc == evs[i].ret, "%s event %d (iter %lld, %s): returned %d want %d", what, i,
                    (long long)it, evs[i].overflow ? "overflow" : "clean", rc, evs[i].ret);
        TEST_CHECKF(ls->scale == evs[i].scale, "%s event %d (iter %lld): scale %g want %g", what, i,
                    (long long)it, ls->scale, evs[i].scale);
        TEST_CHECKF(ls->cur_hysteresis == evs[i].cur_h,
                    "%s event %d (iter %lld): hysteresis %d want %d", what, i, (long long)it,
                    ls->cur_hysteresis, evs[i].cur_h);
    }
}

static zs_fp16_config_t fp16_cfg(int power, int window, int hyst, double min, int consecutive)
{
    zs_fp16_config_t f;
    memset(&f, 0, sizeof f);
    f.enabled = 1;
    f.loss_scale = 0.0;
    f.initial_scale_power = power;
    f.loss_scale_window = window;
    f.hysteresis = hyst;
    f.min_loss_scale = min;
    f.consecutive_hysteresis = consecutive;
    return f;
}

/* 2^4 = 16, window 3, hysteresis 2, min 1 */
static const ev_t SEQ_A[] = {
    {1, 1, 16, 1}, /* iter 0: first overflow: hysteresis 2 -> 1, scale kept */
    {1, 1, 8, 1},  /* iter 1: second: halved; counter stays 1 */
    {0, 0, 8, 1},  /* iter 2: clean; 0 clean steps before it since the overflow */
    {0, 0, 8, 1},  /* iter 3: 1 */
    {0, 0, 8, 1},  /* iter 4: 2 */
    {0, 0, 16, 2}, /* iter 5: 3 clean steps before it: doubles, counter refilled */
    {0, 0, 16, 2}, /* iter 6: 4 */
    {0, 0, 16, 2}, /* iter 7: 5 */
    {0, 0, 32, 2}, /* iter 8: 6: doubles again every 3 */
    {1, 1, 32, 1}, /* iter 9: overflow, hysteresis 2 -> 1 */
    {0, 0, 32, 1}, /* iter 10: clean (no refill without consecutive_hysteresis) */
    {1, 1, 16, 1}, /* iter 11: counter is 1: halved at once */
    {1, 1, 8, 1},  /* iter 12: and again */
    {0, 0, 8, 1},  /* iter 13 */
    {0, 0, 8, 1},  /* iter 14 */
    {0, 0, 8, 1},  /* iter 15 */
    {0, 0, 16, 2}, /* iter 16: 3 clean steps before it */
};

static void test_dynamic(void)
{
    zs_fp16_config_t f = fp16_cfg(4, 3, 2, 1.0, 0);
    zs_loss_scale_t ls;
    zs_loss_scale_init(&ls, &f);
    TEST_CHECK(ls.fp16 && ls.dynamic && ls.scale == 16.0 && ls.cur_hysteresis == 2 &&
               ls.last_overflow_iter == -1 && ls.iter == 0);
    run(&ls, SEQ_A, (int)(sizeof SEQ_A / sizeof SEQ_A[0]), "A");
    TEST_CHECK(ls.iter == 17 && ls.last_overflow_iter == 12);

    /* from the start: last_overflow_iter = -1, so the first doubling comes
     * on the 4th clean step (3 clean steps before it), then every 3 */
    const ev_t start[] = {{0, 0, 16, 2}, {0, 0, 16, 2}, {0, 0, 16, 2}, {0, 0, 32, 2},
                          {0, 0, 32, 2}, {0, 0, 32, 2}, {0, 0, 64, 2}};
    zs_loss_scale_init(&ls, &f);
    run(&ls, start, 7, "start");

    /* DeepSpeed's defaults from the config: 2^16, window 1000, hysteresis 2 */
    zs_config_t cfg;
    zs_config_defaults(&cfg);
    cfg.fp16.enabled = 1;
    zs_loss_scale_init(&ls, &cfg.fp16);
    TEST_CHECK(ls.scale == 65536.0 && ls.window == 1000 && ls.hysteresis == 2 &&
               ls.min_scale == 1.0 && !ls.consecutive_hysteresis);
    for (int i = 0; i < 1000; i++)
        TEST_CHECK(zs_loss_scale_update(&ls, 0) == 0 && ls.scale == 65536.0);
    TEST_CHECK(zs_loss_scale_update(&ls, 0) == 0 && ls.scale == 131072.0); /* iter 1000 */
}

static void test_min_scale(void)
{
    /* 2^2 = 4, hysteresis 1 (every overflow halves), floor 1.5 */
    zs_fp16_config_t f = fp16_cfg(2, 100, 1, 1.5, 0);
    zs_loss_scale_t ls;
    zs_loss_scale_init(&ls, &f);
    const ev_t seq[] = {
        {1, 1, 2, 1},   /* 4 -> 2 */
        {1, 1, 1.5, 1}, /* 2 -> max(1, 1.5) */
    };
    run(&ls, seq, 2, "min");
    /* at the floor, DeepSpeed raises "Current loss scale already at minimum":
     * an error, nothing changed */
    zs_loss_scale_t before = ls;
    TEST_CHECK(zs_loss_scale_update(&ls, 1) == ZS_ERR_RANGE);
    TEST_CHECK(ls.scale == 1.5 && ls.iter == before.iter &&
               ls.last_overflow_iter == before.last_overflow_iter &&
               ls.cur_hysteresis == before.cur_hysteresis);
    /* clean steps still work from there */
    TEST_CHECK(zs_loss_scale_update(&ls, 0) == 0 && ls.scale == 1.5 && ls.iter == 3);

    /* with hysteresis 2 the floor is reached the same way, one overflow later */
    f = fp16_cfg(1, 100, 2, 1.0, 0);
    zs_loss_scale_init(&ls, &f);
    const ev_t seq2[] = {{1, 1, 2, 1}, {1, 1, 1, 1}};
    run(&ls, seq2, 2, "min2");
    TEST_CHECK(zs_loss_scale_update(&ls, 1) == ZS_ERR_RANGE && ls.scale == 1.0);
}

static void test_consecutive(void)
{
    const int pattern[] = {1, 0, 1, 1};
    /* consecutive_hysteresis: every clean step refills the counter */
    zs_fp16_config_t f = fp16_cfg(4, 1000, 2, 1.0, 1);
    zs_loss_scale_t ls;
    zs_loss_scale_init(&ls, &f);
    const ev_t cons[] = {{1, 1, 16, 1}, {0, 0, 16, 2}, {1, 1, 16, 1}, {1, 1, 8, 1}};
    for (int i = 0; i < 4; i++)
        TEST_CHECK(cons[i].overflow == pattern[i]);
    run(&ls, cons, 4, "consecutive");
    /* without it the counter stays at 1 after the first overflow */
    f = fp16_cfg(4, 1000, 2, 1.0, 0);
    zs_loss_scale_init(&ls, &f);
    const ev_t plain[] = {{1, 1, 16, 1}, {0, 0, 16, 1}, {1, 1, 8, 1}, {1, 1, 4, 1}};
    run(&ls, plain, 4, "plain");
    /* consecutive: the window doubling does not touch the counter (it was
     * refilled by the clean step already) */
    f = fp16_cfg(4, 2, 3, 1.0, 1);
    zs_loss_scale_init(&ls, &f);
    const ev_t w2[] = {{1, 1, 16, 2}, {0, 0, 16, 3}, {0, 0, 16, 3}, {0, 0, 32, 3}};
    run(&ls, w2, 4, "consecutive window");
}

static void test_static_and_off(void)
{
    zs_fp16_config_t f = fp16_cfg(16, 1000, 2, 1.0, 0);
    f.loss_scale = 1024.0;
    zs_loss_scale_t ls;
    zs_loss_scale_init(&ls, &f);
    TEST_CHECK(ls.fp16 && !ls.dynamic && ls.scale == 1024.0);
    const int pat[] = {1, 1, 1, 0, 0, 0, 0, 1, 0, 1};
    for (int k = 0; k < 50; k++) {
        int o = pat[k % 10];
        TEST_CHECK(zs_loss_scale_update(&ls, o) == o); /* overflow steps are skipped */
        TEST_CHECK(ls.scale == 1024.0);
    }
    /* bf16/fp32: scale 1, nothing skipped */
    zs_loss_scale_init(&ls, NULL);
    TEST_CHECK(!ls.fp16 && !ls.dynamic && ls.scale == 1.0);
    for (int k = 0; k < 10; k++)
        TEST_CHECK(zs_loss_scale_update(&ls, k & 1) == 0 && ls.scale == 1.0);
    f.enabled = 0;
    zs_loss_scale_init(&ls, &f);
    TEST_CHECK(!ls.fp16 && ls.scale == 1.0 && zs_loss_scale_update(&ls, 1) == 0);
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void test_save_load(void)
{
    zs_fp16_config_t f = fp16_cfg(4, 3, 2, 0.25, 1);
    zs_loss_scale_t a, b;
    zs_loss_scale_init(&a, &f);
    const int pat[] = {1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0};
    for (int i = 0; i < 11; i++)
        TEST_CHECK(zs_loss_scale_update(&a, pat[i]) >= 0);
    uint8_t buf[ZS_LOSS_SCALE_BYTES];
    memset(buf, 0xee, sizeof buf);
    zs_loss_scale_save(&a, buf);
    /* the documented layout */
    double sc;
    uint64_t bits = le64(buf);
    memcpy(&sc, &bits, 8);
    TEST_CHECK(sc == a.scale);
    bits = le64(buf + 8);
    memcpy(&sc, &bits, 8);
    TEST_CHECK(sc == 0.25);
    TEST_CHECK((int64_t)le64(buf + 16) == a.last_overflow_iter && (int64_t)le64(buf + 24) == 11);
    uint32_t w = buf[32] | buf[33] << 8 | buf[34] << 16 | (uint32_t)buf[35] << 24;
    TEST_CHECK((w & ((1u << 29) - 1)) == 3 && (w >> 29) == 7); /* consecutive, dynamic, fp16 */
    TEST_CHECK((buf[36] | buf[37] << 8) == 2 && (buf[38] | buf[39] << 8) == a.cur_hysteresis);

    memset(&b, 0, sizeof b);
    TEST_CHECK(zs_loss_scale_load(&b, buf) == ZS_OK);
    TEST_CHECK(b.scale == a.scale && b.min_scale == a.min_scale && b.window == a.window &&
               b.hysteresis == a.hysteresis && b.cur_hysteresis == a.cur_hysteresis &&
               b.last_overflow_iter == a.last_overflow_iter && b.iter == a.iter &&
               b.dynamic == a.dynamic && b.fp16 == a.fp16 &&
               b.consecutive_hysteresis == a.consecutive_hysteresis);
    /* a restored scaler continues exactly like the original */
    const int more[] = {0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0};
    for (int i = 0; i < 17; i++) {
        int ra = zs_loss_scale_update(&a, more[i]), rb = zs_loss_scale_update(&b, more[i]);
        TEST_CHECK(ra == rb && a.scale == b.scale && a.cur_hysteresis == b.cur_hysteresis &&
                   a.iter == b.iter && a.last_overflow_iter == b.last_overflow_iter);
    }
    /* static and off round-trip too */
    f.loss_scale = 512.0;
    zs_loss_scale_init(&a, &f);
    zs_loss_scale_update(&a, 1);
    zs_loss_scale_save(&a, buf);
    TEST_CHECK(zs_loss_scale_load(&b, buf) == ZS_OK && b.fp16 && !b.dynamic && b.scale == 512.0 &&
               b.iter == 1);
    zs_loss_scale_init(&a, NULL);
    zs_loss_scale_save(&a, buf);
    TEST_CHECK(zs_loss_scale_load(&b, buf) == ZS_OK && !b.fp16 && b.scale == 1.0);

    /* impossible states are refused and leave the target alone */
    f.loss_scale = 0.0;
    zs_loss_scale_init(&a, &f);
    zs_loss_scale_save(&a, buf);
    zs_loss_scale_t keep;
    memcpy(&keep, &b, sizeof b);
    uint8_t bad[ZS_LOSS_SCALE_BYTES];
    memcpy(bad, buf, sizeof bad);
    bad[38] = 3; /* cur_hysteresis 3 > hysteresis 2 */
    TEST_CHECK(zs_loss_scale_load(&b, bad) == ZS_ERR_CORRUPT);
    TEST_CHECK(memcmp(&b, &keep, sizeof b) == 0);
    memcpy(bad, buf, sizeof bad);
    bad[7] = 0x7f; /* scale -> NaN */
    bad[6] = 0xf8;
    TEST_CHECK(zs_loss_scale_load(&b, bad) == ZS_ERR_CORRUPT);
    memcpy(bad, buf, sizeof bad);
    bad[35] &= 0x7f; /* dynamic without fp16 */
    TEST_CHECK(zs_loss_scale_load(&b, bad) == ZS_ERR_CORRUPT);
    memcpy(bad, buf, sizeof bad);
    bad[32] = bad[33] = bad[34] = 0; /* window 0 */
    bad[35] &= 0xe0;
    TEST_CHECK(zs_loss_scale_load(&b, bad) == ZS_ERR_CORRUPT);
    memcpy(bad, buf, sizeof bad);
    bad[24] = 0; /* iter 0 but last overflow at iter 0 */
    bad[16] = 0;
    memset(bad + 17, 0, 7);
    TEST_CHECK(zs_loss_scale_load(&b, bad) == ZS_ERR_CORRUPT);
    TEST_CHECK(memcmp(&b, &keep, sizeof b) == 0);
}

int main(void)
{
    test_dynamic();
    test_min_scale();
    test_consecutive();
    test_static_and_off();
    test_save_load();
    printf("test_loss_scale: ok\n");
    return 0;
}
