/*
 * zs_frame.c - bulk-message framing over gRPC byte buffers (see zs_rpc.h).
 *
 * Wire shape of a bulk message (a valid protobuf message):
 *   [fields 1..14, packed by protobuf-c][0x7A varint(len)][len raw bytes]
 * 0x7A is the key of field 15 with wire type 2 (length-delimited).
 *
 * The parser never trusts a length: every varint and every length is checked
 * against the bytes the buffer really holds before it is used.
 *
 * Memory: the first parse in a process raises glibc's trim threshold (and
 * fixes the mmap threshold) once; see tune_malloc.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "zs_rpc.h"

#define PAYLOAD_FIELD 15
#define PAYLOAD_KEY   0x7Au /* (15 << 3) | 2 */

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

typedef struct {
    void (*release)(void *);
    void *ud;
} release_t;

static void release_payload(void *p)
{
    release_t *r = p;
    if (r->release)
        r->release(r->ud);
    free(r);
}

grpc_byte_buffer *zs_frame_build(const ProtobufCMessage *meta, const void *payload, size_t len,
                                 void (*release)(void *), void *ud)
{
    size_t mlen = protobuf_c_message_get_packed_size(meta);
    grpc_slice head = grpc_slice_malloc(mlen + 11);
    uint8_t *h = GRPC_SLICE_START_PTR(head);
    size_t n = protobuf_c_message_pack(meta, h);
    grpc_slice slices[2];
    size_t ns = 1;
    if (len > 0) {
        h[n++] = PAYLOAD_KEY;
        n += put_varint(h + n, len);
        release_t *r = malloc(sizeof *r);
        if (!r) {
            grpc_slice_unref(head);
            return NULL;
        }
        r->release = release;
        r->ud = ud;
        /* The cast drops const: gRPC only reads slices it sends. */
        slices[1] = grpc_slice_new_with_user_data((void *)payload, len, release_payload, r);
        ns = 2;
    } else if (release) {
        release(ud);
    }
    slices[0] = grpc_slice_sub_no_ref(head, 0, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, ns);
    grpc_slice_unref(head);
    if (ns == 2)
        grpc_slice_unref(slices[1]);
    return bb;
}

grpc_byte_buffer *zs_msg_build(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* A read cursor over an array of slices. */
typedef struct {
    const grpc_slice *s;
    size_t ns, i, off;
    size_t left; /* bytes remaining in total */
} cursor_t;

static int cur_byte(cursor_t *c, uint8_t *b)
{
    while (c->i < c->ns && c->off == GRPC_SLICE_LENGTH(c->s[c->i])) {
        c->i++;
        c->off = 0;
    }
    if (c->left == 0 || c->i == c->ns)
        return -1;
    *b = GRPC_SLICE_START_PTR(c->s[c->i])[c->off++];
    c->left--;
    return 0;
}

static int cur_varint(cursor_t *c, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        uint8_t b;
        if (cur_byte(c, &b))
            return -1;
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1; /* more than 10 bytes */
}

/* Copy n bytes (dst may be NULL to skip). Caller checked n <= c->left. */
static void cur_take(cursor_t *c, uint8_t *dst, size_t n)
{
    c->left -= n;
    while (n > 0) {
        size_t avail = GRPC_SLICE_LENGTH(c->s[c->i]) - c->off;
        if (avail == 0) {
            c->i++;
            c->off = 0;
            continue;
        }
        size_t k = avail < n ? avail : n;
        if (dst) {
            memcpy(dst, GRPC_SLICE_START_PTR(c->s[c->i]) + c->off, k);
            dst += k;
        }
        c->off += k;
        n -= k;
    }
}

static int collect_slices(grpc_byte_buffer *bb, zs_frame_t *fr, size_t *total, zs_err_t *err)
{
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb))
        return zs_err_set(err, ZS_ERR_INVALID, "unreadable message (compressed or corrupt)");
    size_t cap = 16;
    fr->slices = malloc(cap * sizeof *fr->slices);
    if (!fr->slices) {
        grpc_byte_buffer_reader_destroy(&rd);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory reading a message");
    }
    grpc_slice s;
    *total = 0;
    while (grpc_byte_buffer_reader_next(&rd, &s)) {
        if (fr->nslices == cap) {
            grpc_slice *n = realloc(fr->slices, 2 * cap * sizeof *n);
            if (!n) {
                grpc_slice_unref(s);
                grpc_byte_buffer_reader_destroy(&rd);
                return zs_err_set(err, ZS_ERR_NOMEM, "out of memory reading a message");
            }
            fr->slices = n;
            cap *= 2;
        }
        *total += GRPC_SLICE_LENGTH(s);
        fr->slices[fr->nslices++] = s;
    }
    grpc_byte_buffer_reader_destroy(&rd);
    return ZS_OK;
}

/* A received bulk message is ~1 MiB of gRPC slices malloc'd by the thread
 * that polled the socket; freeing them after the copy leaves a free top of
 * >= 1 MiB in that thread's arena, which glibc trims at once (default
 * threshold 128 KiB: madvise(MADV_DONTNEED)), so the next message faults in
 * and zeroes the same pages again. Measured with bench_rpc (256 MiB push):
 * ~45k page faults per push and 0.5-0.6x raw TCP; with a 64 MiB threshold
 * ~10k and ~0.9-1.0x. Setting it turns off glibc's dynamic mmap threshold,
 * so that one is fixed at 8 MiB: chunk-sized buffers (<= 4 MiB) come from
 * the arenas and are reused. At most 64 MiB of free top stays per arena. */
static void tune_malloc(void)
{
    mallopt(M_MMAP_THRESHOLD, 8 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

/* Read a varint from p[*pos..len); -1 if truncated or longer than 10 bytes. */
static int get_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *pos < len; shift += 7) {
        uint8_t b = p[(*pos)++];
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Refuse string fields holding a NUL byte, in p[0..len) (a message of type
 * desc that protobuf-c already unpacked) and its nested messages: protobuf-c
 * hands strings over NUL-terminated, so "a\0b" would be read as "a" (a
 * model name equal to a prefix of another). */
static int check_strings(const uint8_t *p, size_t len, const ProtobufCMessageDescriptor *desc,
                         int depth, zs_err_t *err)
{
    size_t pos = 0;
    while (pos < len) {
        uint64_t key, v;
        if (get_varint(p, len, &pos, &key))
            return ZS_OK; /* unpack accepted it: nothing more to see here */
        unsigned wt = (unsigned)(key & 7);
        const ProtobufCFieldDescriptor *fd =
            protobuf_c_message_descriptor_get_field(desc, (unsigned)(key >> 3));
        if (wt == 0) {
            if (get_varint(p, len, &pos, &v))
                return ZS_OK;
        } else if (wt == 1 || wt == 5) {
            pos += wt == 1 ? 8 : 4;
        } else if (wt == 2) {
            if (get_varint(p, len, &pos, &v) || v > len - pos)
                return ZS_OK;
            if (fd && fd->type == PROTOBUF_C_TYPE_STRING && memchr(p + pos, 0, (size_t)v))
                return zs_err_set(err, ZS_ERR_INVALID, "field %s of %s holds a NUL byte", fd->name,
                                  desc->short_name);
            if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE && depth < 8) {
                int rc = check_strings(p + pos, (size_t)v, fd->descriptor, depth + 1, err);
                if (rc)
                    return rc;
            }
            pos += (size_t)v;
        } else {
            return ZS_OK;
        }
    }
    return ZS_OK;
}

int zs_frame_parse(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                   ProtobufCMessage **out, zs_frame_t *fr, zs_err_t *err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, tune_malloc);
    memset(fr, 0, sizeof *fr);
    *out = NULL;
    size_t total = 0;
    int rc = collect_slices(bb, fr, &total, err);
    if (rc)
        goto fail;
    cursor_t c = {fr->slices, fr->nslices, 0, 0, total};
    uint8_t *meta = malloc(ZS_RPC_MAX_META);
    if (!meta) {
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory reading a message");
        goto fail;
    }
    size_t mlen = 0;
    int have_payload = 0;
    while (c.left > 0) {
        uint64_t key, len = 0;
        if (cur_varint(&c, &key)) {
            rc = zs_err_set(err, ZS_ERR_INVALID, "malformed message: truncated field key");
            break;
        }
        uint64_t field = key >> 3, wt = key & 7;
        if (field == PAYLOAD_FIELD && wt == 2) {
            if (cur_varint(&c, &len)) {
                rc = zs_err_set(err, ZS_ERR_INVALID, "malformed message: truncated payload length");
                break;
            }
            if (len > c.left) {
                rc = zs_err_set(err, ZS_ERR_INVALID,
                                "malformed message: payload length %llu exceeds the %zu bytes "
                                "received",
                                (unsigned long long)len, c.left);
                break;
            }
            if (have_payload) {
                rc = zs_err_set(err, ZS_ERR_INVALID, "malformed message: two payload fields");
                break;
            }
            /* Normalise the position to a slice that has bytes left. */
            while (c.i < c.ns && c.off == GRPC_SLICE_LENGTH(c.s[c.i])) {
                c.i++;
                c.off = 0;
            }
            have_payload = 1;
            fr->pay_slice = c.i;
            fr->pay_off = c.off;
            fr->pay_len = (size_t)len;
            cur_take(&c, NULL, (size_t)len);
            continue;
        }
        /* Any other field: copy key and value into the meta buffer. */
        uint8_t tmp[20];
        size_t tn = put_varint(tmp, key), vlen;
        if (wt == 0) {
            uint64_t v;
            if (cur_varint(&c, &v)) {
                rc = zs_err_set(err, ZS_ERR_INVALID, "malformed message: truncated varint");
                break;
            }
            tn += put_varint(tmp + tn, v);
            vlen = 0;
        } else if (wt == 1 || wt == 5) {
            vlen = wt == 1 ? 8 : 4;
        } else if (wt == 2) {
            if (cur_varint(&c, &len) || len > c.left) {
                rc = zs_err_set(err, ZS_ERR_INVALID, "malformed message: field %llu length",
                                (unsigned long long)field);
                break;
            }
            tn += put_varint(tmp + tn, len);
            vlen = (size_t)len;
        } else {
            rc = zs_err_set(err, ZS_ERR_INVALID, "malformed message: wire type %llu",
                            (unsigned long long)wt);
            break;
        }
        if (vlen > c.left || mlen + tn + vlen > ZS_RPC_MAX_META) {
            rc = zs_err_set(err, ZS_ERR_INVALID,
                            "message header too large or truncated (limit %u bytes)",
                            ZS_RPC_MAX_META);
            break;
        }
        memcpy(meta + mlen, tmp, tn);
        mlen += tn;
        cur_take(&c, meta + mlen, vlen);
        mlen += vlen;
    }
    if (rc == ZS_OK) {
        *out = protobuf_c_message_unpack(desc, NULL, mlen, meta);
        if (!*out)
            rc = zs_err_set(err, ZS_ERR_INVALID, "malformed %s header", desc->short_name);
        else if ((rc = check_strings(meta, mlen, desc, 0, err))) {
            protobuf_c_message_free_unpacked(*out, NULL);
            *out = NULL;
        }
    }
    free(meta);
    if (rc == ZS_OK)
        return ZS_OK;
fail:
    zs_frame_deinit(fr);
    return rc;
}

void zs_frame_copy(const zs_frame_t *fr, void *dst)
{
    cursor_t c = {fr->slices, fr->nslices, fr->pay_slice, fr->pay_off, fr->pay_len};
    cur_take(&c, dst, fr->pay_len);
}

void zs_frame_deinit(zs_frame_t *fr)
{
    for (size_t i = 0; i < fr->nslices; i++)
        grpc_slice_unref(fr->slices[i]);
    free(fr->slices);
    memset(fr, 0, sizeof *fr);
}

int zs_msg_parse(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                 ProtobufCMessage **out, zs_err_t *err)
{
    *out = NULL;
    if (!bb)
        return zs_err_set(err, ZS_ERR_INVALID, "missing %s message", desc->short_name);
    size_t len = grpc_byte_buffer_length(bb);
    if (len > ZS_RPC_MAX_META)
        return zs_err_set(err, ZS_ERR_INVALID, "%s message of %zu bytes exceeds the %u limit",
                          desc->short_name, len, ZS_RPC_MAX_META);
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb))
        return zs_err_set(err, ZS_ERR_INVALID, "unreadable %s message", desc->short_name);
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    *out = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    int rc = *out ? check_strings(GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), desc, 0, err)
                  : zs_err_set(err, ZS_ERR_INVALID, "malformed %s message", desc->short_name);
    grpc_slice_unref(s);
    if (rc && *out) {
        protobuf_c_message_free_unpacked(*out, NULL);
        *out = NULL;
    }
    return rc;
}
