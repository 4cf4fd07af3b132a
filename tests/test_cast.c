/*
 * test_cast.c - tests of kernels/zs_cast.c.
 *
 * Verifies: (1) all 65536 bf16 and fp16 inputs widen to the value an
 * independent double computation gives and round-trip back to themselves
 * (NaNs to their quiet form); (2) fp32 -> bf16/fp16 agrees with an independent
 * reference (rint() on the value scaled to the target's unit in the last
 * place, in double) on boundaries, ties, subnormals, overflow and a random
 * sweep of bit patterns and values; (3) NaN/Inf handling; (4) every zs_cast
 * path the CPU has (avx512, avx2, portable) is bitwise equal to the scalar
 * functions for all six dtype pairs, odd lengths, unaligned starts and the
 * exhaustive 16-bit inputs.
 *
 * Does not test speed (bench/) or threads (zs_cast is single-threaded).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_status.h"
#include "zs_test.h"

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* ----------------------------------------------- independent references */

/* Value of a fp16 bit pattern, computed in double from the IEEE definition. */
static double f16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* Round finite x to a format with `mbits` stored mantissa bits, minimum
 * normal exponent emin and largest finite value maxf, ties to even, in
 * double: scale to units in the last place, rint (default mode = RNE), scale
 * back. Independent of the bit tricks under test. Returns +-Inf on overflow. */
static double round_ref(float x, int mbits, int emin, double maxf)
{
    double a = fabs((double)x);
    double r = 0.0;
    if (a != 0.0) {
        int e;
        frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) -> exponent e - 1 */
        e -= 1;
        if (e < emin)
            e = emin;
        double ulp = ldexp(1.0, e - mbits);
        r = rint(a / ulp) * ulp; /* a / ulp is exact: power-of-two scaling */
        if (r > maxf)
            r = INFINITY;
    }
    return signbit(x) ? -r : r;
}

static double bf16_ref(float x)
{
    return round_ref(x, 7, -126, ldexp(255.0, 120)); /* max bf16 = 0x7F7F */
}

static double f16_ref(float x)
{
    return round_ref(x, 10, -14, 65504.0);
}

/* Check one fp32 input against both references (value and sign of zero). */
static void check_round(float x)
{
    uint32_t u = f32_bits(x);
    if (isnan(x)) {
        TEST_CHECKF(zs_f32_to_bf16(x) == ((u >> 16) | 0x40), "bf16 NaN %08x", u);
        TEST_CHECKF(zs_f32_to_f16(x) == (((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)),
                    "f16 NaN %08x", u);
        return;
    }
    double b = bf16_ref(x), h = f16_ref(x);
    float bg = zs_bf16_to_f32(zs_f32_to_bf16(x));
    float hg = zs_f16_to_f32(zs_f32_to_f16(x));
    TEST_CHECKF((double)bg == b && !signbit(bg) == !signbit(b), "bf16(%08x): got %a want %a", u,
                (double)bg, b);
    TEST_CHECKF((double)hg == h && !signbit(hg) == !signbit(h), "f16(%08x): got %a want %a", u,
                (double)hg, h);
}

/* ------------------------------------------------------------- the tests */

static void test_exhaustive_16bit(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        /* bf16: the bits are the top half of the fp32 */
        float fb = zs_bf16_to_f32((uint16_t)h);
        TEST_CHECKF(f32_bits(fb) == h << 16, "bf16 %04x widened to %08x", h, f32_bits(fb));
        uint16_t back = zs_f32_to_bf16(fb);
        int bnan = (h & 0x7F80) == 0x7F80 && (h & 0x7F);
        TEST_CHECKF(back == (bnan ? (h | 0x40) : h), "bf16 %04x round trip %04x", h, back);

        /* fp16: value from the IEEE definition; NaN quieted, payload kept */
        float fh = zs_f16_to_f32((uint16_t)h);
        double want = f16_value((uint16_t)h);
        int hnan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        if (hnan) {
            uint32_t w = ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13);
            TEST_CHECKF(f32_bits(fh) == w, "f16 NaN %04x -> %08x", h, f32_bits(fh));
        } else {
            TEST_CHECKF((double)fh == want && !signbit(fh) == !signbit(want), "f16 %04x -> %a", h,
                        (double)fh);
        }
        back = zs_f32_to_f16(fh);
        TEST_CHECKF(back == (hnan ? (h | 0x200) : h), "f16 %04x round trip %04x", h, back);
    }
}

static void test_boundaries(void)
{
    static const struct {
        uint32_t in;
        uint16_t bf16, f16;
    } cases[] = {
        {0x00000000, 0x0000, 0x0000}, /* +0 */
        {0x80000000, 0x8000, 0x8000}, /* -0 */
        {0x3F800000, 0x3F80, 0x3C00}, /* 1 */
        {0x3F808000, 0x3F80, 0x3C04}, /* bf16 tie, even stays down */
        {0x3F818000, 0x3F82, 0x3C0C}, /* bf16 tie, odd goes up */
        {0x3F808001, 0x3F81, 0x3C04}, /* just above the bf16 tie */
        {0x3F801000, 0x3F80, 0x3C00}, /* f16 tie 1 + 2^-11, even stays down */
        {0x3F803000, 0x3F80, 0x3C02}, /* f16 tie 1 + 3*2^-11, odd goes up */
        {0x3F801001, 0x3F80, 0x3C01}, /* just above the f16 tie */
        {0x477FE000, 0x4780, 0x7BFF}, /* 65504, the largest fp16 */
        {0x477FEFFF, 0x4780, 0x7BFF}, /* just below 65520 */
        {0x477FF000, 0x4780, 0x7C00}, /* 65520: tie, rounds to Inf */
        {0xC77FF000, 0xC780, 0xFC00}, /* -65520 */
        {0x7F7FFFFF, 0x7F80, 0x7C00}, /* FLT_MAX: bf16 overflows to Inf */
        {0x7F7F7FFF, 0x7F7F, 0x7C00}, /* below the bf16 overflow tie */
        {0x7F7F8000, 0x7F80, 0x7C00}, /* bf16 tie with odd 0x7F7F: Inf */
        {0x7F800000, 0x7F80, 0x7C00}, /* +Inf */
        {0xFF800000, 0xFF80, 0xFC00}, /* -Inf */
        {0x38800000, 0x3880, 0x0400}, /* 2^-14, smallest normal fp16 */
        {0x387FC000, 0x3880, 0x03FF}, /* largest fp16 subnormal */
        {0x387FE000, 0x3880, 0x0400}, /* subnormal tie with odd 0x3FF: up to normal */
        {0x33800000, 0x3380, 0x0001}, /* 2^-24, smallest fp16 subnormal */
        {0x33000000, 0x3300, 0x0000}, /* 2^-25: tie, goes to even 0 */
        {0x33000001, 0x3300, 0x0001}, /* just above 2^-25 */
        {0x33C00000, 0x33C0, 0x0002}, /* 3 * 2^-25: tie, odd 1 goes to 2 */
        {0xB3C00000, 0xB3C0, 0x8002}, /* negative subnormal tie */
        {0x32FFFFFF, 0x3300, 0x0000}, /* below 2^-25 */
        {0x00000001, 0x0000, 0x0000}, /* fp32 subnormal */
        {0x00400000, 0x0040, 0x0000}, /* fp32 subnormal stays in bf16 */
        {0x007FFFFF, 0x0080, 0x0000}, /* largest fp32 subnormal rounds to FLT_MIN */
        {0x7F800001, 0x7FC0, 0x7E00}, /* signalling NaN: quieted */
        {0xFF800001, 0xFFC0, 0xFE00}, /* negative signalling NaN */
        {0x7FC00000, 0x7FC0, 0x7E00}, /* quiet NaN */
        {0xFFFFFFFF, 0xFFFF, 0xFFFF}, /* NaN with full payload */
        {0x7F80FFFF, 0x7FC0, 0x7E07}, /* payload only in the low bits */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x = bits_f32(cases[i].in);
        TEST_CHECKF(zs_f32_to_bf16(x) == cases[i].bf16, "bf16(%08x) = %04x want %04x", cases[i].in,
                    zs_f32_to_bf16(x), cases[i].bf16);
        TEST_CHECKF(zs_f32_to_f16(x) == cases[i].f16, "f16(%08x) = %04x want %04x", cases[i].in,
                    zs_f32_to_f16(x), cases[i].f16);
        check_round(x);
    }
}

static void test_random_scalar(void)
{
    for (int i = 0; i < 2000000; i++)
        check_round(bits_f32(rnd32())); /* any pattern */
    for (int i = 0; i < 1000000; i++) {
        /* values inside and around the fp16 range, subnormals included */
        int e = (int)(rnd32() % 48) - 30;
        float x = ldexpf((float)(rnd32() & 0xFFFFFF) / 16777216.0f, e);
        check_round(rnd32() & 1 ? -x : x);
        /* exact ties for both formats: midpoints between neighbours */
        uint32_t t = (rnd32() & 0xFFFF0000u) | 0x8000u;
        check_round(bits_f32(t));
        t = (rnd32() & 0xFFFFE000u) | 0x1000u;
        check_round(bits_f32(t));
    }
}

/* Fill n elements of dtype dt with random bits biased to interesting values. */
static void fill_random(void *buf, zs_dtype_t dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rnd32();
        if (dt == ZS_DTYPE_F32) {
            if (r % 4 == 0) /* around the fp16 range: subnormals to overflow */
                r = (r & 0x80000000u) | (0x30000000u + (r & 0x1FFFFFFFu)); /* 2^-31..2^33 */
            else if (r % 4 == 1)                                           /* exact ties */
                r = (r & 0xFFFF0000u) | ((r & 2) ? 0x8000u : 0u) | ((r & 4) ? 0x1000u : 0u);
            ((uint32_t *)buf)[i] = r;
        } else {
            ((uint16_t *)buf)[i] = (uint16_t)r;
        }
    }
}

/* Scalar expectation for one element of any pair (through exact fp32). */
static uint32_t expect_elem(const void *src, zs_dtype_t sdt, zs_dtype_t ddt, size_t i)
{
    float x = sdt == ZS_DTYPE_F32    ? ((const float *)src)[i]
              : sdt == ZS_DTYPE_BF16 ? zs_bf16_to_f32(((const uint16_t *)src)[i])
                                     : zs_f16_to_f32(((const uint16_t *)src)[i]);
    return ddt == ZS_DTYPE_F32    ? f32_bits(x)
           : ddt == ZS_DTYPE_BF16 ? zs_f32_to_bf16(x)
                                  : zs_f32_to_f16(x);
}

static uint32_t get_elem(const void *buf, zs_dtype_t dt, size_t i)
{
    return dt == ZS_DTYPE_F32 ? ((const uint32_t *)buf)[i] : ((const uint16_t *)buf)[i];
}

static void check_array(const char *path, zs_dtype_t ddt, zs_dtype_t sdt, const void *src, size_t n,
                        size_t off)
{
    static uint8_t dst[4 * 70000 + 64];
    size_t ds = zs_dtype_size(ddt);
    memset(dst, 0xA5, sizeof dst);
    zs_cast(dst + off * ds, ddt, src, sdt, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t want = sdt == ddt ? get_elem(src, sdt, i) : expect_elem(src, sdt, ddt, i);
        uint32_t got = get_elem(dst + off * ds, ddt, i);
        TEST_CHECKF(got == want, "path %s %s->%s n=%zu i=%zu: got %x want %x", path,
                    zs_dtype_name(sdt), zs_dtype_name(ddt), n, i, got, want);
    }
    /* nothing written past the end (0xA5 guard bytes untouched) */
    for (size_t b = (off + n) * ds; b < (off + n) * ds + 32; b++)
        TEST_CHECKF(dst[b] == 0xA5, "path %s wrote past n=%zu", path, n);
}

static void test_paths(void)
{
    static const char *paths[] = {"avx512", "avx2", "portable"};
    static uint8_t src[4 * 70000 + 64];
    int tested = 0;
    TEST_CHECK(zs_cast_force_path("no-such-path") == ZS_ERR_INVALID);
    for (int pi = 0; pi < 3; pi++) {
        if (zs_cast_force_path(paths[pi]) != ZS_OK) {
            printf("path %s: not supported by this CPU, skipped\n", paths[pi]);
            continue;
        }
        TEST_CHECK(strcmp(zs_cast_path(), paths[pi]) == 0);
        tested++;
        for (int s = 0; s < 3; s++) {
            for (int d = 0; d < 3; d++) {
                /* lengths: every tail 0..70, odd large, and all 65536 16-bit values */
                for (size_t n = 0; n <= 70; n++) {
                    size_t off = n % 3; /* unaligned starts of src and dst */
                    fill_random(src, (zs_dtype_t)s, n + off);
                    check_array(paths[pi], (zs_dtype_t)d, (zs_dtype_t)s,
                                src + off * zs_dtype_size(s), n, off);
                }
                fill_random(src, (zs_dtype_t)s, 65539);
                check_array(paths[pi], (zs_dtype_t)d, (zs_dtype_t)s, src, 65537, 1);
                if (s != ZS_DTYPE_F32) {
                    for (uint32_t h = 0; h < 65536; h++)
                        ((uint16_t *)src)[h] = (uint16_t)h;
                    check_array(paths[pi], (zs_dtype_t)d, (zs_dtype_t)s, src, 65536, 0);
                }
            }
        }
    }
    zs_cast_force_portable(1);
    TEST_CHECK(strcmp(zs_cast_path(), "portable") == 0);
    zs_cast_force_portable(0);
    TEST_CHECK(zs_cast_force_path(NULL) == ZS_OK);
    printf("zs_cast automatic path: %s; %d paths tested bitwise\n", zs_cast_path(), tested);
    TEST_CHECK(tested >= 1);
}

int main(void)
{
    test_exhaustive_16bit();
    test_boundaries();
    test_random_scalar();
    test_paths();
    printf("test_cast: OK\n");
    return 0;
}
