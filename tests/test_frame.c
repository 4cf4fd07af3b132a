/*
 * test_frame.c - unit tests of the bulk framing in proto/zs_frame.c.
 *
 * Checks:
 *  1. zs_frame_build -> bytes -> the same bytes re-sliced at every awkward
 *     boundary (every single split point, every pair of split points in the
 *     header, key and length varint of field 15, runs of 1..7-byte slices,
 *     random slices with empty ones between) -> zs_frame_parse gives the same
 *     header fields and zs_frame_copy the same payload. Payload lengths cross
 *     the 1/2/3-byte varint boundaries; headers hold multi-byte varints and
 *     a nested message (InitChunk.init).
 *  2. A payload-less message (no field 15 at all); the release callback runs
 *     exactly once, also when there is no payload.
 *  3. The built message IS protobuf: protobuf-c unpacks all of it, field 15
 *     included.
 *  4. zs_frame_parse refuses with ZS_ERR_INVALID (and leaves *out NULL and the
 *     frame empty): garbage, truncated key / varint / fixed64 / length, a
 *     payload length above the bytes present, two payload fields, a header
 *     above ZS_RPC_MAX_META (one byte over the limit; at the limit is fine),
 *     wire types 3/4/6/7, a wrong wire type for a known field.
 *  5. zs_msg_parse: roundtrip, garbage, oversized, missing message.
 *  6. zs__ct_equal, the token comparison: same bytes and length only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_rpc.h"
#include "zs_test.h"

/* ---- byte buffer helpers ------------------------------------------------ */

/* The whole content of a byte buffer as one malloc'd array. */
static uint8_t *flatten(grpc_byte_buffer *bb, size_t *len)
{
    grpc_byte_buffer_reader rd;
    TEST_CHECK(grpc_byte_buffer_reader_init(&rd, bb));
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    *len = GRPC_SLICE_LENGTH(s);
    uint8_t *p = malloc(*len ? *len : 1);
    TEST_CHECK(p);
    memcpy(p, GRPC_SLICE_START_PTR(s), *len);
    grpc_slice_unref(s);
    return p;
}

/* A byte buffer of b[0..n) cut at the ascending points cuts[0..ncuts) (which
 * may repeat, giving empty slices). */
static grpc_byte_buffer *sliced(const uint8_t *b, size_t n, const size_t *cuts, size_t ncuts)
{
    grpc_slice *s = malloc((ncuts + 1) * sizeof *s);
    TEST_CHECK(s);
    size_t prev = 0, ns = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        TEST_CHECK(end >= prev && end <= n);
        s[ns++] = grpc_slice_from_copied_buffer((const char *)b + prev, end - prev);
        prev = end;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, ns);
    for (size_t i = 0; i < ns; i++)
        grpc_slice_unref(s[i]);
    free(s);
    return bb;
}

static grpc_byte_buffer *whole(const uint8_t *b, size_t n)
{
    return sliced(b, n, NULL, 0);
}

static uint64_t g_rng = 0x243F6A8885A308D3ull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* ---- round trips -------------------------------------------------------- */

static int g_poison; /* its address marks a pointer the parser must reset */

static void count_release(void *ud)
{
    (*(int *)ud)++;
}

/* Parse bb as a PushChunk and compare with the expected header and payload. */
static void expect_push(grpc_byte_buffer *bb, const Zeroshard__PushChunk *want, const uint8_t *pay,
                        size_t len, const char *how)
{
    Zeroshard__PushChunk *m;
    zs_frame_t fr;
    zs_err_t err;
    zs_err_clear(&err);
    int rc =
        zs_frame_parse(bb, &zeroshard__push_chunk__descriptor, (ProtobufCMessage **)&m, &fr, &err);
    TEST_CHECKF(rc == ZS_OK, "%s: parse failed: %s", how, err.msg);
    TEST_CHECKF(m->step == want->step && m->offset == want->offset && m->count == want->count &&
                    m->dtype == want->dtype,
                "%s: header differs", how);
    TEST_CHECKF(m->data.len == 0, "%s: field 15 leaked into the unpacked header", how);
    TEST_CHECKF(fr.pay_len == len, "%s: payload %zu bytes, want %zu", how, fr.pay_len, len);
    uint8_t *got = malloc(len + 1);
    TEST_CHECK(got);
    got[len] = 0xEE; /* guard: copy writes exactly len bytes */
    zs_frame_copy(&fr, got);
    TEST_CHECKF(len == 0 || memcmp(got, pay, len) == 0, "%s: payload differs", how);
    TEST_CHECKF(got[len] == 0xEE, "%s: copy wrote past the payload", how);
    free(got);
    zeroshard__push_chunk__free_unpacked(m, NULL);
    zs_frame_deinit(&fr);
    TEST_CHECK(fr.slices == NULL && fr.nslices == 0 && fr.pay_len == 0);
}

static void roundtrip_push(size_t len, int exhaustive)
{
    uint8_t *pay = malloc(len ? len : 1);
    TEST_CHECK(pay);
    for (size_t i = 0; i < len; i++)
        pay[i] = (uint8_t)rnd();
    Zeroshard__PushChunk m = ZEROSHARD__PUSH_CHUNK__INIT;
    m.step = 0x1234567890ull; /* multi-byte varints in the header */
    m.offset = UINT64_MAX - 5;
    m.count = len / 2 + 300;
    m.dtype = ZEROSHARD__DTYPE__BF16;
    int released = 0;
    grpc_byte_buffer *bb = zs_frame_build(&m.base, pay, len, count_release, &released);
    TEST_CHECK(bb);
    if (len == 0)
        TEST_CHECKF(released == 1, "payload-less build must release at once (%d)", released);
    size_t n;
    uint8_t *b = flatten(bb, &n);
    size_t hlen = protobuf_c_message_get_packed_size(&m.base);
    size_t vl = len < 128 ? 1 : len < 16384 ? 2 : len < 2097152 ? 3 : 4;
    TEST_CHECKF(n == hlen + (len ? 1 + vl + len : 0), "built %zu bytes for %zu + %zu", n, hlen,
                len);
    if (len)
        TEST_CHECK(b[hlen] == 0x7A);
    expect_push(bb, &m, pay, len, "as built");
    grpc_byte_buffer_destroy(bb);
    TEST_CHECKF(released == 1, "release ran %d times", released);

    /* 3: protobuf-c reads the whole message, payload included. */
    Zeroshard__PushChunk *u = zeroshard__push_chunk__unpack(NULL, n, b);
    TEST_CHECK(u);
    TEST_CHECK(u->step == m.step && u->offset == m.offset && u->count == m.count &&
               u->dtype == m.dtype);
    TEST_CHECK(u->data.len == len && (len == 0 || memcmp(u->data.data, pay, len) == 0));
    zeroshard__push_chunk__free_unpacked(u, NULL);

    char how[96];
    size_t cut[4];
    /* Every single split point (whole message when small, else the first and
     * last 64 bytes and the header region). */
    for (size_t i = 0; i <= n; i++) {
        if (!exhaustive && i > hlen + 8 && i + 64 < n)
            continue;
        cut[0] = i;
        snprintf(how, sizeof how, "len %zu split at %zu", len, i);
        grpc_byte_buffer *s = sliced(b, n, cut, 1);
        expect_push(s, &m, pay, len, how);
        grpc_byte_buffer_destroy(s);
    }
    /* Every pair (and triple with an empty slice) of split points inside the
     * header, the key and the length varint of field 15 and the payload's
     * first byte. */
    size_t lim = hlen + 1 + vl + 1 < n ? hlen + 1 + vl + 1 : n;
    for (size_t i = 0; i <= lim; i++)
        for (size_t j = i; j <= lim; j++) {
            cut[0] = i;
            cut[1] = j;
            cut[2] = j;
            snprintf(how, sizeof how, "len %zu split at %zu,%zu,%zu", len, i, j, j);
            grpc_byte_buffer *s = sliced(b, n, cut, 3);
            expect_push(s, &m, pay, len, how);
            grpc_byte_buffer_destroy(s);
        }
    /* Runs of k-byte slices, k = 1..7, at every phase. */
    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    TEST_CHECK(cuts);
    for (size_t k = 1; k <= 7; k++)
        for (size_t ph = 0; ph < k; ph++) {
            size_t nc = 0;
            for (size_t p = ph ? ph : k; p < n; p += k)
                cuts[nc++] = p;
            snprintf(how, sizeof how, "len %zu in %zu-byte slices, phase %zu", len, k, ph);
            grpc_byte_buffer *s = sliced(b, n, cuts, nc);
            expect_push(s, &m, pay, len, how);
            grpc_byte_buffer_destroy(s);
        }
    /* Random slices of 0..7 bytes (0: an empty slice). */
    for (int rep = 0; rep < 20; rep++) {
        size_t nc = 0;
        for (size_t p = rnd() % 8; p < n && nc < n; p += rnd() % 8)
            cuts[nc++] = p;
        snprintf(how, sizeof how, "len %zu in random slices #%d", len, rep);
        grpc_byte_buffer *s = sliced(b, n, cuts, nc);
        expect_push(s, &m, pay, len, how);
        grpc_byte_buffer_destroy(s);
    }
    free(cuts);
    free(b);
    free(pay);
}

/* InitChunk: a nested message (wire type 2) before the payload, and a header
 * that unpacks to the same values from 1-byte slices. */
static void roundtrip_init(void)
{
    Zeroshard__AdamConfig a = ZEROSHARD__ADAM_CONFIG__INIT;
    a.lr = 1e-3f;
    a.beta1 = 0.9f;
    a.beta2 = 0.999f;
    a.eps = 1e-8f;
    a.weight_decay = 0.01f;
    a.adam_w_mode = 1;
    Zeroshard__InitRequest q = ZEROSHARD__INIT_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    q.model_name = "gpt2-é-125m"; /* UTF-8 */
    q.num_params = 124439808;
    q.num_servers = 3;
    q.server_index = 2;
    q.adam = &a;
    q.start_step = 17;
    Zeroshard__InitChunk m = ZEROSHARD__INIT_CHUNK__INIT;
    m.init = &q;
    m.offset = 82959872;
    m.count = 333;
    float pay[333];
    for (int i = 0; i < 333; i++)
        pay[i] = (float)i * 0.25f - 7.0f;
    grpc_byte_buffer *bb = zs_frame_build(&m.base, pay, sizeof pay, NULL, NULL);
    size_t n;
    uint8_t *b = flatten(bb, &n);
    grpc_byte_buffer_destroy(bb);
    size_t *cuts = malloc(n * sizeof *cuts);
    TEST_CHECK(cuts);
    for (size_t i = 0; i + 1 < n; i++)
        cuts[i] = i + 1;
    for (int mode = 0; mode < 2; mode++) {
        grpc_byte_buffer *s = mode ? sliced(b, n, cuts, n - 1) : whole(b, n);
        Zeroshard__InitChunk *u;
        zs_frame_t fr;
        zs_err_t err;
        TEST_OK(zs_frame_parse(s, &zeroshard__init_chunk__descriptor, (ProtobufCMessage **)&u, &fr,
                               &err),
                err);
        grpc_byte_buffer_destroy(s);
        TEST_CHECK(u->init && u->init->adam);
        TEST_CHECK(strcmp(u->init->model_name, q.model_name) == 0);
        TEST_CHECK(u->init->num_params == q.num_params && u->init->num_servers == 3 &&
                   u->init->server_index == 2 && u->init->start_step == 17);
        TEST_CHECK(u->init->adam->lr == a.lr && u->init->adam->beta2 == a.beta2 &&
                   u->init->adam->adam_w_mode);
        TEST_CHECK(u->offset == m.offset && u->count == m.count && u->data.len == 0);
        TEST_CHECK(fr.pay_len == sizeof pay);
        float got[333];
        zs_frame_copy(&fr, got);
        TEST_CHECK(memcmp(got, pay, sizeof pay) == 0);
        zeroshard__init_chunk__free_unpacked(u, NULL);
        zs_frame_deinit(&fr);
    }
    free(cuts);
    free(b);
}

/* ---- refusals ----------------------------------------------------------- */

/* Parse b[0..n) (whole, then in 1-byte slices) as a PushChunk; expect
 * ZS_ERR_INVALID with `needle` in the message. */
static void expect_refused(const char *what, const uint8_t *b, size_t n, const char *needle)
{
    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    TEST_CHECK(cuts);
    for (size_t i = 0; i + 1 < n; i++)
        cuts[i] = i + 1;
    for (int mode = 0; mode < 2; mode++) {
        grpc_byte_buffer *bb = mode && n > 1 ? sliced(b, n, cuts, n - 1) : whole(b, n);
        ProtobufCMessage *m = (ProtobufCMessage *)&g_poison; /* poison */
        zs_frame_t fr;
        memset(&fr, 0x5A, sizeof fr);
        zs_err_t err;
        zs_err_clear(&err);
        int rc = zs_frame_parse(bb, &zeroshard__push_chunk__descriptor, &m, &fr, &err);
        grpc_byte_buffer_destroy(bb);
        TEST_CHECKF(rc == ZS_ERR_INVALID, "%s: got %s (%s), want ZS_ERR_INVALID", what,
                    zs_status_name(rc), err.msg);
        TEST_CHECKF(err.code == ZS_ERR_INVALID && strstr(err.msg, needle),
                    "%s: message '%s' lacks '%s'", what, err.msg, needle);
        TEST_CHECKF(m == NULL, "%s: *out not NULL after a refusal", what);
        TEST_CHECKF(fr.slices == NULL && fr.nslices == 0 && fr.pay_len == 0,
                    "%s: frame not reset after a refusal", what);
        if (mode == 0)
            printf("ok  %s: %s: %s\n", what, zs_status_name(rc), err.msg);
    }
    free(cuts);
}

/* Key bytes of (field, wire type). */
static size_t key(uint8_t *p, unsigned field, unsigned wt)
{
    uint32_t k = field << 3 | wt;
    size_t n = 0;
    while (k >= 0x80) {
        p[n++] = (uint8_t)(k | 0x80);
        k >>= 7;
    }
    p[n++] = (uint8_t)k;
    return n;
}

static size_t varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* A PushChunk with an unknown bytes field 10 of `flen` bytes, plus a 4-byte
 * payload; returns the total length. */
static size_t big_header(uint8_t *b, size_t flen)
{
    size_t n = 0;
    b[n++] = 0x08; /* step = 1 */
    b[n++] = 0x01;
    n += key(b + n, 10, 2);
    n += varint(b + n, flen);
    memset(b + n, 'h', flen);
    n += flen;
    b[n++] = 0x7A;
    b[n++] = 4;
    memcpy(b + n, "\x01\x02\x03\x04", 4);
    return n + 4;
}

static void refusals(void)
{
    static const uint8_t garbage[] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    expect_refused("garbage (endless varint key)", garbage, sizeof garbage, "malformed");
    static const uint8_t key_trunc[] = {0x08, 0x01, 0x80};
    expect_refused("truncated field key", key_trunc, sizeof key_trunc, "truncated field key");
    static const uint8_t var_trunc[] = {0x08, 0x80, 0x80};
    expect_refused("truncated varint", var_trunc, sizeof var_trunc, "truncated varint");
    static const uint8_t fix_trunc[] = {0x08, 0x01, 0x09, 1, 2, 3};
    expect_refused("truncated fixed64", fix_trunc, sizeof fix_trunc, "truncated");
    static const uint8_t len_trunc[] = {0x08, 0x01, 0x52, 0x05, 'a', 'b'};
    expect_refused("field 10 length above the bytes present", len_trunc, sizeof len_trunc,
                   "field 10 length");
    static const uint8_t pay_long[] = {0x08, 0x01, 0x7A, 0x0A, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    expect_refused("payload length above the bytes present", pay_long, sizeof pay_long,
                   "payload length 10 exceeds the 9 bytes");
    static const uint8_t pay_huge[] = {0x7A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                       0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x00};
    expect_refused("payload length 2^64-1", pay_huge, sizeof pay_huge, "payload length");
    static const uint8_t pay_lentrunc[] = {0x08, 0x01, 0x7A, 0x80};
    expect_refused("payload length varint truncated", pay_lentrunc, sizeof pay_lentrunc,
                   "truncated payload length");
    static const uint8_t two[] = {0x7A, 0x01, 0xAA, 0x08, 0x01, 0x7A, 0x01, 0xBB};
    expect_refused("two payload fields", two, sizeof two, "two payload fields");
    for (unsigned wt = 3; wt <= 7; wt++) {
        if (wt == 5)
            continue;
        uint8_t b[8] = {0x08, 0x01};
        size_t n = 2 + key(b + 2, 4, wt);
        b[n++] = 0x00;
        b[n++] = 0x00;
        char what[64], needle[32];
        snprintf(what, sizeof what, "unknown wire type %u", wt);
        snprintf(needle, sizeof needle, "wire type %u", wt);
        expect_refused(what, b, n, needle);
    }
    static const uint8_t wrong_wt[] = {0x0A, 0x01, 0x00}; /* step as bytes */
    expect_refused("known field with the wrong wire type", wrong_wt, sizeof wrong_wt,
                   "malformed PushChunk header");
    static const uint8_t pay_varint[] = {0x78, 0x05}; /* field 15 as a varint */
    expect_refused("field 15 as a varint", pay_varint, sizeof pay_varint,
                   "malformed PushChunk header");

    /* Header size limit: key (1) + length varint (3) + value; exactly
     * ZS_RPC_MAX_META bytes of header is accepted, one more is refused. */
    uint8_t *b = malloc(2 * ZS_RPC_MAX_META);
    TEST_CHECK(b);
    size_t at_limit = ZS_RPC_MAX_META - 2 - 1 - 3; /* step field takes 2 bytes */
    size_t n = big_header(b, at_limit);
    {
        grpc_byte_buffer *bb = whole(b, n);
        Zeroshard__PushChunk *m;
        zs_frame_t fr;
        zs_err_t err;
        TEST_OK(zs_frame_parse(bb, &zeroshard__push_chunk__descriptor, (ProtobufCMessage **)&m, &fr,
                               &err),
                err);
        TEST_CHECK(m->step == 1 && fr.pay_len == 4);
        zeroshard__push_chunk__free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
        grpc_byte_buffer_destroy(bb);
        printf("ok  header of exactly %u bytes accepted\n", ZS_RPC_MAX_META);
    }
    n = big_header(b, at_limit + 1);
    expect_refused("header one byte above ZS_RPC_MAX_META", b, n, "header too large");
    /* Two unknown fields that only together pass the limit. */
    n = 0;
    for (int k = 0; k < 2; k++) {
        n += key(b + n, 10 + k, 2);
        n += varint(b + n, 40000);
        memset(b + n, 'x', 40000);
        n += 40000;
    }
    expect_refused("two header fields summing above ZS_RPC_MAX_META", b, n, "header too large");
    free(b);

    /* An empty message is a valid, empty PushChunk. */
    grpc_byte_buffer *bb = whole((const uint8_t *)"", 0);
    Zeroshard__PushChunk *m;
    zs_frame_t fr;
    zs_err_t err;
    TEST_OK(
        zs_frame_parse(bb, &zeroshard__push_chunk__descriptor, (ProtobufCMessage **)&m, &fr, &err),
        err);
    TEST_CHECK(m->step == 0 && m->count == 0 && fr.pay_len == 0);
    zeroshard__push_chunk__free_unpacked(m, NULL);
    zs_frame_deinit(&fr);
    grpc_byte_buffer_destroy(bb);
}

static void msg_parse(void)
{
    zs_err_t err;
    zs_err_clear(&err);
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = 1;
    q.model_name = "m";
    q.num_params = 1ull << 40;
    grpc_byte_buffer *bb = zs_msg_build(&q.base);
    Zeroshard__HelloRequest *u;
    TEST_OK(zs_msg_parse(bb, &zeroshard__hello_request__descriptor, (ProtobufCMessage **)&u, &err),
            err);
    TEST_CHECK(u->protocol_version == 1 && strcmp(u->model_name, "m") == 0 &&
               u->num_params == 1ull << 40);
    zeroshard__hello_request__free_unpacked(u, NULL);
    grpc_byte_buffer_destroy(bb);

    static const uint8_t garbage[] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    bb = whole(garbage, sizeof garbage);
    u = (Zeroshard__HelloRequest *)&g_poison;
    int rc = zs_msg_parse(bb, &zeroshard__hello_request__descriptor, (ProtobufCMessage **)&u, &err);
    grpc_byte_buffer_destroy(bb);
    TEST_CHECK(rc == ZS_ERR_INVALID && u == NULL && strstr(err.msg, "malformed HelloRequest"));
    printf("ok  zs_msg_parse garbage: %s: %s\n", zs_status_name(rc), err.msg);

    /* A string with a NUL byte: refused, top level and nested (InitChunk
     * {init {model_name}}), not read as its prefix; a NUL in bytes is fine. */
    static const uint8_t nul_name[] = {0x08, 0x01, 0x12, 0x03, 'a', 0x00, 'b'};
    bb = whole(nul_name, sizeof nul_name);
    u = (Zeroshard__HelloRequest *)&g_poison;
    rc = zs_msg_parse(bb, &zeroshard__hello_request__descriptor, (ProtobufCMessage **)&u, &err);
    grpc_byte_buffer_destroy(bb);
    TEST_CHECK(rc == ZS_ERR_INVALID && u == NULL && strstr(err.msg, "model_name") &&
               strstr(err.msg, "NUL byte"));
    printf("ok  zs_msg_parse name 'a\\0b': %s: %s\n", zs_status_name(rc), err.msg);
    static const uint8_t nul_nested[] = {0x0A, 0x07, 0x08, 0x01, 0x12, 0x03, 'a', 0x00, 'b'};
    zs_frame_t fr;
    Zeroshard__InitChunk *ic = (Zeroshard__InitChunk *)&g_poison;
    bb = whole(nul_nested, sizeof nul_nested);
    rc =
        zs_frame_parse(bb, &zeroshard__init_chunk__descriptor, (ProtobufCMessage **)&ic, &fr, &err);
    grpc_byte_buffer_destroy(bb);
    TEST_CHECK(rc == ZS_ERR_INVALID && ic == NULL && strstr(err.msg, "InitRequest"));
    printf("ok  zs_frame_parse nested name 'a\\0b': %s: %s\n", zs_status_name(rc), err.msg);
    static const uint8_t nul_bytes[] = {0x1A, 0x03, 'a', 0x00, 'b'}; /* user_meta */
    bb = whole(nul_bytes, sizeof nul_bytes);
    Zeroshard__CheckpointRequest *cq;
    TEST_OK(zs_msg_parse(bb, &zeroshard__checkpoint_request__descriptor, (ProtobufCMessage **)&cq,
                         &err),
            err);
    TEST_CHECK(cq->user_meta.len == 3 && cq->user_meta.data[1] == 0);
    zeroshard__checkpoint_request__free_unpacked(cq, NULL);
    grpc_byte_buffer_destroy(bb);

    /* A valid HelloRequest of exactly ZS_RPC_MAX_META bytes parses; one byte
     * more is refused before anything is unpacked. */
    for (size_t total = ZS_RPC_MAX_META; total <= ZS_RPC_MAX_META + 1; total++) {
        uint8_t *b = malloc(total);
        TEST_CHECK(b);
        size_t n = key(b, 2, 2);
        n += varint(b + n, total - 4);
        TEST_CHECK(n == 4);
        memset(b + n, 'a', total - n);
        bb = sliced(b, total, (size_t[]){1, 2, 3, 1000}, 4);
        free(b);
        u = (Zeroshard__HelloRequest *)&g_poison;
        rc = zs_msg_parse(bb, &zeroshard__hello_request__descriptor, (ProtobufCMessage **)&u, &err);
        grpc_byte_buffer_destroy(bb);
        if (total == ZS_RPC_MAX_META) {
            TEST_OK(rc, err);
            TEST_CHECK(strlen(u->model_name) == total - 4);
            zeroshard__hello_request__free_unpacked(u, NULL);
        } else {
            TEST_CHECKF(rc == ZS_ERR_INVALID && u == NULL && strstr(err.msg, "exceeds"), "%s",
                        err.msg);
            printf("ok  zs_msg_parse oversized: %s: %s\n", zs_status_name(rc), err.msg);
        }
    }

    u = (Zeroshard__HelloRequest *)&g_poison;
    rc = zs_msg_parse(NULL, &zeroshard__hello_request__descriptor, (ProtobufCMessage **)&u, &err);
    TEST_CHECK(rc == ZS_ERR_INVALID && u == NULL && strstr(err.msg, "missing"));
    printf("ok  zs_msg_parse missing message: %s: %s\n", zs_status_name(rc), err.msg);
}

/* zs__ct_equal (the bearer token check): equal only for the same bytes and
 * the same length; prefixes, extensions and a difference in the last byte
 * are not. (Its time depends on the expected length only, by construction:
 * no branch on the data; that is not measured here.) */
static void ct_equal(void)
{
    const char *w = "Bearer s3cret";
    size_t n = strlen(w);
    TEST_CHECK(zs__ct_equal(w, n, "Bearer s3cret", n));
    TEST_CHECK(!zs__ct_equal(w, n, "Bearer s3cre", n - 1));
    TEST_CHECK(!zs__ct_equal(w, n, "Bearer s3cretX", n + 1));
    TEST_CHECK(!zs__ct_equal(w, n, "Bearer s3creu", n));
    TEST_CHECK(!zs__ct_equal(w, n, "bearer s3cret", n));
    TEST_CHECK(!zs__ct_equal(w, n, "", 0));
    TEST_CHECK(!zs__ct_equal("", 0, "x", 1));
    TEST_CHECK(zs__ct_equal("", 0, "", 0));
    char nul[] = "Bearer s3cret";
    nul[12] = '\0'; /* a NUL where 't' was: compared as a byte, not as an end */
    TEST_CHECK(!zs__ct_equal(w, n, nul, n));
    printf("ok  zs__ct_equal: same bytes and length only\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    grpc_init();
    static const size_t lens[] = {0, 1, 7, 127, 128, 300, 16383, 16384, 70001};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        roundtrip_push(lens[i], lens[i] <= 2048);
        printf("ok  roundtrip: payload of %zu bytes, all slicings\n", lens[i]);
    }
    roundtrip_init();
    printf("ok  roundtrip: InitChunk with nested init, 1-byte slices\n");
    refusals();
    msg_parse();
    ct_equal();
    grpc_shutdown();
    printf("PASS test_frame\n");
    return 0;
}
