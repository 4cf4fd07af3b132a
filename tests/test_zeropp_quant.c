/*
 * test_zeropp_quant.c - qwZ's block quantization on the CPU (kernels/
 * zs_quant.{c,h}, zs_quant_math.h): the record layout, the error bound of
 * every block (|x' - x| <= scale/2 + float rounding, scale = amax/127 over
 * the block's finite elements), an all-zero block sent exactly, a block
 * holding one huge value (its own block coarse, the others untouched),
 * inf and NaN coming back NaN without harming their block's finite
 * elements, unpacking several records at once (a gather's layout), and
 * unpack_add (qgZ's fp32 sums), in fp32, bf16 and fp16.
 *
 * What it does not test: the CUDA twin (test_zeropp_quant_cuda.c), the
 * quantized all-gather (test_coll_zeropp.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_quant.h"
#include "zs_test.h"

static uint64_t rng = 88172645463325252ull;

static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Element i of an array of dt widened to float. */
static float at(const void *p, zs_dtype_t dt, size_t i)
{
    float f;
    zs_cast(&f, ZS_DTYPE_F32, (const char *)p + i * zs_dtype_size(dt), dt, 1);
    return f;
}

/* Pack src (n of dt), unpack into fp32 and into dt, and hold every element
 * to the bound of its block; returns the worst |err| / scale seen. */
static double check_roundtrip(const void *src, zs_dtype_t dt, size_t n)
{
    size_t bytes = zs_quant_record_bytes(n), nblk = zs_quant_blocks(n);
    TEST_CHECK(bytes % 4 == 0 && bytes >= nblk * 4 + n && bytes < nblk * 4 + n + 4);
    unsigned char *rec = malloc(bytes + 8);
    float *out = malloc((n ? n : 1) * sizeof(float));
    void *out16 = malloc((n ? n : 1) * 4);
    TEST_CHECK(rec && out && out16);
    memset(rec, 0xAB, bytes + 8);
    zs_quant_pack(rec, src, dt, n);
    TEST_CHECKF(rec[bytes] == 0xAB, "pack wrote past its record");
    for (size_t i = nblk * 4 + n; i < bytes; i++)
        TEST_CHECKF(rec[i] == 0, "padding byte %zu not zero", i);
    zs_quant_unpack(out, ZS_DTYPE_F32, rec, n, 1);
    zs_quant_unpack(out16, dt, rec, n, 1);
    double worst = 0;
    for (size_t b = 0; b < nblk; b++) {
        size_t lo = b * ZS_QUANT_BLOCK, hi = lo + ZS_QUANT_BLOCK < n ? lo + ZS_QUANT_BLOCK : n;
        float amax = 0;
        for (size_t i = lo; i < hi; i++) {
            float x = at(src, dt, i);
            if (isfinite(x) && fabsf(x) > amax)
                amax = fabsf(x);
        }
        float scale;
        memcpy(&scale, rec + 4 * b, 4);
        TEST_CHECKF(scale == amax / 127.0f, "block %zu: scale %g, amax/127 %g", b, scale,
                    amax / 127.0f);
        double bound = 0.5 * scale + amax * 0x1p-21 + 1e-38;
        for (size_t i = lo; i < hi; i++) {
            float x = at(src, dt, i), y = out[i];
            if (!isfinite(x)) {
                TEST_CHECKF(isnan(y), "element %zu: %g came back %g, not NaN", i, x, y);
                TEST_CHECK(isnan(at(out16, dt, i)));
                continue;
            }
            double e = fabs((double)y - x);
            TEST_CHECKF(e <= bound, "element %zu of block %zu: %g -> %g, error %g > bound %g", i, b,
                        x, y, e, bound);
            if (scale > 0 && e / scale > worst)
                worst = e / scale;
            /* the dt output is the fp32 value rounded once */
            float r;
            zs_cast(&r, ZS_DTYPE_F32, (char *)out16 + i * zs_dtype_size(dt), dt, 1);
            float want;
            unsigned char tmp[4];
            zs_cast(tmp, dt, &y, ZS_DTYPE_F32, 1);
            zs_cast(&want, ZS_DTYPE_F32, tmp, dt, 1);
            TEST_CHECK(memcmp(&r, &want, 4) == 0);
        }
    }
    free(rec);
    free(out);
    free(out16);
    return worst;
}

/* n elements of dt from floats. */
static void *make(const float *f, zs_dtype_t dt, size_t n)
{
    void *p = malloc((n ? n : 1) * 4);
    TEST_CHECK(p);
    zs_cast(p, dt, f, ZS_DTYPE_F32, n);
    return p;
}

int main(void)
{
    static const zs_dtype_t DTS[] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};
    /* layout */
    TEST_CHECK(zs_quant_record_bytes(0) == 0);
    TEST_CHECK(zs_quant_record_bytes(1) == 8);
    TEST_CHECK(zs_quant_record_bytes(ZS_QUANT_BLOCK) == 4 + ZS_QUANT_BLOCK);
    TEST_CHECK(zs_quant_record_bytes(ZS_QUANT_BLOCK + 1) == 8 + ZS_QUANT_BLOCK + 4);
    for (int d = 0; d < 3; d++) {
        zs_dtype_t dt = DTS[d];
        size_t sizes[] = {1, 7, ZS_QUANT_BLOCK, ZS_QUANT_BLOCK + 3, 3 * ZS_QUANT_BLOCK + 1001};
        double worst = 0;
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s];
            float *f = malloc(n * 4);
            TEST_CHECK(f);
            /* random values of very different magnitudes per block */
            for (size_t i = 0; i < n; i++)
                f[i] =
                    (float)((urand() * 2 - 1) * pow(10.0, (double)((i / ZS_QUANT_BLOCK) % 4) - 2));
            void *x = make(f, dt, n);
            double w = check_roundtrip(x, dt, n);
            worst = w > worst ? w : worst;
            free(x);
            free(f);
        }
        /* rint: the worst error of random data reaches almost half a step */
        TEST_CHECKF(worst > 0.45 && worst <= 0.5 + 1e-4, "%s: worst error %g steps",
                    zs_dtype_name(dt), worst);

        /* an all-zero block (between two non-zero ones) comes back exactly 0 */
        size_t n = 3 * ZS_QUANT_BLOCK;
        float *f = calloc(n, 4);
        TEST_CHECK(f);
        for (size_t i = 0; i < ZS_QUANT_BLOCK; i++)
            f[i] = f[2 * ZS_QUANT_BLOCK + i] = (float)(urand() - 0.5);
        void *x = make(f, dt, n);
        check_roundtrip(x, dt, n);
        unsigned char *rec = malloc(zs_quant_record_bytes(n));
        float *out = malloc(n * 4);
        TEST_CHECK(rec && out);
        zs_quant_pack(rec, x, dt, n);
        zs_quant_unpack(out, ZS_DTYPE_F32, rec, n, 1);
        for (size_t i = ZS_QUANT_BLOCK; i < 2 * ZS_QUANT_BLOCK; i++)
            TEST_CHECKF(out[i] == 0.0f && !signbit(out[i]), "zero block element %zu: %g", i,
                        out[i]);
        free(x);

        /* one huge value: its block's small values go to 0, the next block
         * keeps its own precision */
        float huge = dt == ZS_DTYPE_F16 ? 60000.0f : 1e30f;
        for (size_t i = 0; i < n; i++)
            f[i] = (float)(1e-3 * (urand() - 0.5));
        f[17] = huge;
        x = make(f, dt, n);
        check_roundtrip(x, dt, n);
        zs_quant_pack(rec, x, dt, n);
        zs_quant_unpack(out, ZS_DTYPE_F32, rec, n, 1);
        TEST_CHECKF(fabsf(out[17] - at(x, dt, 17)) <= at(x, dt, 17) / 254.0f, "huge value %g -> %g",
                    at(x, dt, 17), out[17]);
        TEST_CHECK(out[18] == 0.0f);
        double e2 = 0;
        for (size_t i = ZS_QUANT_BLOCK; i < 2 * ZS_QUANT_BLOCK; i++)
            e2 = fmax(e2, fabs(out[i] - at(x, dt, i)));
        TEST_CHECKF(e2 < 5e-6, "the block after the huge value lost precision: %g", e2);
        free(x);

        /* inf, -inf and NaN: NaN back; the block's finite values keep the
         * bound of their own amax (check_roundtrip) */
        for (size_t i = 0; i < n; i++)
            f[i] = (float)(urand() - 0.5);
        f[5] = INFINITY;
        f[6] = -INFINITY;
        f[7] = NAN;
        x = make(f, dt, n);
        double w = check_roundtrip(x, dt, n);
        TEST_CHECK(w <= 0.5 + 1e-4);
        zs_quant_pack(rec, x, dt, n);
        float s0;
        memcpy(&s0, rec, 4);
        TEST_CHECKF(isfinite(s0) && s0 <= 0.5f / 127.0f * 1.0001f, "scale %g over non-finite", s0);
        free(x);

        /* several records unpacked at once land at r * n */
        size_t nr = 3, m = ZS_QUANT_BLOCK + 5, rb = zs_quant_record_bytes(m);
        unsigned char *recs = malloc(nr * rb);
        float *src = malloc(nr * m * 4), *all = malloc(nr * m * 4), *one = malloc(m * 4);
        TEST_CHECK(recs && src && all && one);
        for (size_t i = 0; i < nr * m; i++)
            src[i] = (float)(urand() * (1 + i / m));
        void *xs = make(src, dt, nr * m);
        for (size_t r = 0; r < nr; r++)
            zs_quant_pack(recs + r * rb, (char *)xs + r * m * zs_dtype_size(dt), dt, m);
        zs_quant_unpack(all, ZS_DTYPE_F32, recs, m, nr);
        for (size_t r = 0; r < nr; r++) {
            zs_quant_unpack(one, ZS_DTYPE_F32, recs + r * rb, m, 1);
            TEST_CHECK(memcmp(one, all + r * m, m * 4) == 0);
        }
        free(xs);
        free(recs);
        free(src);
        free(all);
        free(one);
        free(rec);
        free(out);
        free(f);
        /* unpack_add adds exactly the unpacked fp32 values */
        {
            size_t m2 = ZS_QUANT_BLOCK + 9;
            float *src2 = malloc(m2 * 4), *acc = malloc(m2 * 4), *one2 = malloc(m2 * 4);
            unsigned char *rec2 = malloc(zs_quant_record_bytes(m2));
            TEST_CHECK(src2 && acc && one2 && rec2);
            for (size_t i = 0; i < m2; i++) {
                src2[i] = (float)(urand() - 0.5);
                acc[i] = (float)urand();
            }
            void *x2 = make(src2, dt, m2);
            zs_quant_pack(rec2, x2, dt, m2);
            zs_quant_unpack(one2, ZS_DTYPE_F32, rec2, m2, 1);
            for (size_t i = 0; i < m2; i++)
                one2[i] += acc[i];
            zs_quant_unpack_add(acc, rec2, m2);
            TEST_CHECKF(memcmp(acc, one2, m2 * 4) == 0, "%s: unpack_add != acc + unpack",
                        zs_dtype_name(dt));
            free(x2), free(src2), free(acc), free(one2), free(rec2);
        }
        printf("%s: quantize/dequantize within half a step per block (worst %.4f), zero, huge, "
               "inf/NaN blocks ok\n",
               zs_dtype_name(dt), worst);
    }
    printf("test_zeropp_quant: ok\n");
    return 0;
}
