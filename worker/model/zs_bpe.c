/*
 * zs_bpe.c - GPT-2 BPE vocabulary: loading encoder.json (cJSON) and
 * vocab.bpe, GPT-2's byte-to-unicode map, merging one pre-token piece, and
 * decoding ids to bytes.
 *
 * Not here: the pre-tokenisation regex, UTF-8 checks and streaming
 * (zs_bpe_encode.c).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_bpe_impl.h"
#include "zs_file.h"

#define MAX_FILE_BYTES (64u << 20)
#define EOT_TEXT       "<|endoftext|>"

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves,
 * the other 68 bytes, in order, to U+0100.. . Fills uni2byte (code point ->
 * byte, -1 where none) for code points < 324. */
static void byte_unicode_inverse(int uni2byte[324])
{
    for (int i = 0; i < 324; i++)
        uni2byte[i] = -1;
    int n = 0;
    for (int byte = 0; byte < 256; byte++) {
        int printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                        (byte >= 0xAE && byte <= 0xFF);
        uni2byte[printable ? byte : 256 + n++] = byte;
    }
}

/* Translate byte-to-unicode text s[0..n) (UTF-8) into the bytes it stands
 * for, in out (room for n bytes); returns the byte count or -1 if s holds a
 * code point outside the map or malformed UTF-8. */
static long unicode_to_bytes(const int uni2byte[324], const char *s, size_t n, uint8_t *out)
{
    const uint8_t *p = (const uint8_t *)s, *end = p + n;
    long k = 0;
    while (p < end) {
        uint32_t cp;
        if (p[0] < 0x80) {
            cp = *p++;
        } else if ((p[0] & 0xE0) == 0xC0 && end - p >= 2 && (p[1] & 0xC0) == 0x80) {
            cp = (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
            p += 2;
        } else {
            return -1; /* every mapped code point is < U+0800: two bytes at most */
        }
        if (cp >= 324 || uni2byte[cp] < 0)
            return -1;
        out[k++] = (uint8_t)uni2byte[cp];
    }
    return k;
}

/* FNV-1a hash of p[0..n). */
static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The bytes -> id table used while loading: open addressing over ids. */
typedef struct bytemap {
    int64_t *slot; /* id or -1 */
    uint64_t mask;
} bytemap_t;

/* The id whose bytes are p[0..n), -1 if none. */
static int64_t bytemap_find(const zs_bpe_t *b, const bytemap_t *m, const uint8_t *p, size_t n)
{
    for (uint64_t h = fnv1a(p, n) & m->mask;; h = (h + 1) & m->mask) {
        int64_t id = m->slot[h];
        if (id < 0)
            return -1;
        if (b->len[id] == n && memcmp(b->pool + b->off[id], p, n) == 0)
            return id;
    }
}

/* Add id (its bytes must not be in m yet; m has room). */
static void bytemap_put(const zs_bpe_t *b, bytemap_t *m, uint32_t id)
{
    uint64_t h = fnv1a(b->pool + b->off[id], b->len[id]) & m->mask;
    while (m->slot[h] >= 0)
        h = (h + 1) & m->mask;
    m->slot[h] = id;
}

/* Slot of a pair key (a << 32 | b) in a table of mask + 1 slots. */
static uint64_t pair_hash(uint64_t key, uint64_t mask)
{
    return (key * 0x9E3779B97F4A7C15ull >> 20) & mask;
}

static const zs__bpe_pair_t *pair_find(const zs_bpe_t *b, uint32_t x, uint32_t y)
{
    uint64_t key = (uint64_t)x << 32 | y;
    for (uint64_t h = pair_hash(key, b->pair_mask);; h = (h + 1) & b->pair_mask) {
        const zs__bpe_pair_t *p = &b->pairs[h];
        if (p->key == key)
            return p;
        if (p->key == UINT64_MAX)
            return NULL;
    }
}

/* Read encoder.json into b's id -> bytes arrays and the bytes -> id map. */
static int load_encoder(zs_bpe_t *b, const char *path, const int uni2byte[324], bytemap_t *m,
                        zs_err_t *err)
{
    char *text = zs_file_read_text(path, MAX_FILE_BYTES, 0);
    if (!text)
        return zs_err_set(err, ZS_ERR_NOTFOUND,
                          "%s: cannot read (missing, unreadable or over 64 MiB)", path);
    cJSON *root = cJSON_Parse(text);
    size_t text_len = strlen(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zs_err_set(err, ZS_ERR_CORRUPT, "%s: not a JSON object", path);
    }
    int rc = ZS_OK;
    int n = cJSON_GetArraySize(root);
    if (n <= 256 || n > 65536) {
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "%s: %d entries; a GPT-2 encoder has 257..65536", path,
                        n);
        goto out;
    }
    b->vocab = (uint32_t)n;
    b->off = calloc((size_t)n, sizeof *b->off);
    b->len = calloc((size_t)n, sizeof *b->len);
    b->pool = malloc(text_len); /* the bytes of all keys are fewer than the JSON's */
    m->mask = 1;
    while (m->mask < (uint64_t)n * 2)
        m->mask <<= 1;
    m->slot = malloc(m->mask * sizeof *m->slot);
    m->mask -= 1;
    if (!b->off || !b->len || !b->pool || !m->slot) {
        rc = zs_err_set(err, ZS_ERR_NOMEM, "%s: out of memory for %d entries", path, n);
        goto out;
    }
    memset(m->slot, 0xff, (m->mask + 1) * sizeof *m->slot);
    uint8_t *seen = calloc((size_t)n, 1);
    if (!seen) {
        rc = zs_err_set(err, ZS_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    size_t used = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (v < 0 || v >= n || v != (double)(uint32_t)v || seen[(uint32_t)v]) {
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "%s: key \"%.40s\": id must be a unique integer in 0..%d", path,
                            e->string, n - 1);
            break;
        }
        uint32_t id = (uint32_t)v;
        seen[id] = 1;
        long k = unicode_to_bytes(uni2byte, e->string, strlen(e->string), b->pool + used);
        if (k <= 0 || used + (size_t)k > text_len) {
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "%s: key \"%.40s\" is not GPT-2 byte-to-unicode text", path, e->string);
            break;
        }
        b->off[id] = (uint32_t)used;
        b->len[id] = (uint32_t)k;
        used += (size_t)k;
        if (bytemap_find(b, m, b->pool + b->off[id], b->len[id]) >= 0) {
            rc = zs_err_set(err, ZS_ERR_CORRUPT, "%s: key \"%.40s\" repeats another key's bytes",
                            path, e->string);
            break;
        }
        bytemap_put(b, m, id);
        if (k == (long)strlen(EOT_TEXT) && memcmp(b->pool + b->off[id], EOT_TEXT, (size_t)k) == 0)
            b->eot = (int32_t)id;
    }
    free(seen);
    for (int byte = 0; rc == ZS_OK && byte < 256; byte++) {
        uint8_t c = (uint8_t)byte;
        int64_t id = bytemap_find(b, m, &c, 1);
        if (id < 0)
            rc = zs_err_set(err, ZS_ERR_CORRUPT, "%s: no token for byte 0x%02x", path, byte);
        else
            b->byte_id[byte] = (uint32_t)id;
    }
out:
    cJSON_Delete(root);
    return rc;
}

/* Read vocab.bpe's merges (rank = line order) into b->pairs. */
static int load_merges(zs_bpe_t *b, const char *path, const int uni2byte[324], const bytemap_t *m,
                       zs_err_t *err)
{
    char *text = zs_file_read_text(path, MAX_FILE_BYTES, 0);
    if (!text)
        return zs_err_set(err, ZS_ERR_NOTFOUND,
                          "%s: cannot read (missing, unreadable or over 64 MiB)", path);
    size_t nlines = 1;
    for (const char *p = text; *p; p++)
        nlines += *p == '\n';
    b->pair_mask = 1;
    while (b->pair_mask < nlines * 2)
        b->pair_mask <<= 1;
    b->pairs = malloc(b->pair_mask * sizeof *b->pairs);
    b->pair_mask -= 1;
    uint8_t *buf = malloc(strlen(text) + 1);
    if (!b->pairs || !buf) {
        free(text);
        free(buf);
        return zs_err_set(err, ZS_ERR_NOMEM, "%s: out of memory", path);
    }
    for (uint64_t i = 0; i <= b->pair_mask; i++)
        b->pairs[i].key = UINT64_MAX;
    int rc = ZS_OK;
    uint32_t rank = 0;
    size_t lineno = 0;
    for (char *line = text, *next; line && *line && rc == ZS_OK; line = next) {
        lineno++;
        next = strchr(line, '\n');
        size_t n = next ? (size_t)(next - line) : strlen(line);
        if (next)
            next++;
        if (n > 0 && line[n - 1] == '\r')
            n--;
        if (n == 0 || (lineno == 1 && strncmp(line, "#version", 8) == 0))
            continue;
        const char *sp = memchr(line, ' ', n);
        long ka = sp ? unicode_to_bytes(uni2byte, line, (size_t)(sp - line), buf) : -1;
        long kb =
            ka > 0 ? unicode_to_bytes(uni2byte, sp + 1, n - (size_t)(sp - line) - 1, buf + ka) : -1;
        int64_t ia = ka > 0 ? bytemap_find(b, m, buf, (size_t)ka) : -1;
        int64_t ib = kb > 0 ? bytemap_find(b, m, buf + ka, (size_t)kb) : -1;
        int64_t im = ia >= 0 && ib >= 0 ? bytemap_find(b, m, buf, (size_t)(ka + kb)) : -1;
        if (im < 0) {
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "%s: line %zu: \"%.*s\" is not a merge of two encoder tokens into "
                            "a third",
                            path, lineno, (int)(n < 60 ? n : 60), line);
            break;
        }
        uint64_t key = (uint64_t)ia << 32 | (uint64_t)ib;
        uint64_t h = pair_hash(key, b->pair_mask);
        while (b->pairs[h].key != UINT64_MAX && b->pairs[h].key != key)
            h = (h + 1) & b->pair_mask;
        /* a repeated merge takes its later rank, as encoder.py's dict does */
        b->pairs[h] = (zs__bpe_pair_t){.key = key, .rank = rank++, .merged = (uint32_t)im};
    }
    free(buf);
    free(text);
    return rc;
}

/* Load DIR/encoder.json and DIR/vocab.bpe (zs_bpe.h), compile the regex. */
int zs_bpe_load(const char *dir, zs_bpe_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_bpe_t *b = calloc(1, sizeof *b);
    if (!b)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    b->eot = -1;
    int uni2byte[324];
    byte_unicode_inverse(uni2byte);
    size_t dl = strlen(dir);
    char *path = malloc(dl + 32);
    bytemap_t m = {0};
    int rc = path ? ZS_OK : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (rc == ZS_OK) {
        snprintf(path, dl + 32, "%s/encoder.json", dir);
        rc = load_encoder(b, path, uni2byte, &m, err);
    }
    if (rc == ZS_OK) {
        snprintf(path, dl + 32, "%s/vocab.bpe", dir);
        rc = load_merges(b, path, uni2byte, &m, err);
    }
    free(m.slot);
    free(path);
    if (rc == ZS_OK && b->vocab <= 65536) {
        b->cache = calloc(ZS__BPE_CACHE_SLOTS, sizeof *b->cache);
        if (!b->cache)
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory for the piece cache");
    }
    if (rc == ZS_OK)
        rc = zs__bpe_regex_init(b, err);
    if (rc != ZS_OK) {
        zs_bpe_free(b);
        return rc;
    }
    *out = b;
    return ZS_OK;
}

/* Free everything (NULL is fine). */
void zs_bpe_free(zs_bpe_t *b)
{
    if (!b)
        return;
    zs__bpe_regex_free(b);
    free(b->off);
    free(b->len);
    free(b->pool);
    free(b->pairs);
    free(b->cache);
    free(b->work);
    free(b);
}

/* Number of ids. */
uint32_t zs_bpe_vocab(const zs_bpe_t *b)
{
    return b->vocab;
}

/* Id of <|endoftext|>, -1 if none. */
int32_t zs_bpe_eot(const zs_bpe_t *b)
{
    return b->eot;
}

/* The bytes of id (valid while b lives). */
int zs_bpe_token_bytes(const zs_bpe_t *b, uint32_t id, const uint8_t **bytes, size_t *len,
                       zs_err_t *err)
{
    if (id >= b->vocab)
        return zs_err_set(err, ZS_ERR_RANGE, "token id %u is outside the vocab (0..%u)", id,
                          b->vocab - 1);
    *bytes = b->pool + b->off[id];
    *len = b->len[id];
    return ZS_OK;
}

/* Merge w[0..n) in place by rank; returns the new count. rank[i] is the
 * rank of the pair (w[i], w[i+1]) (UINT32_MAX: no merge), kept up to date
 * around each merge as tiktoken's byte_pair_merge does. */
static size_t merge_ids(const zs_bpe_t *b, uint32_t *w, uint32_t *rank, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        const zs__bpe_pair_t *p = pair_find(b, w[i], w[i + 1]);
        rank[i] = p ? p->rank : UINT32_MAX;
    }
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best])
                best = i;
        if (rank[best] == UINT32_MAX)
            break;
        w[best] = pair_find(b, w[best], w[best + 1])->merged;
        memmove(w + best + 1, w + best + 2, (n - best - 2) * sizeof *w);
        if (n >= best + 3)
            memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof *rank);
        n--;
        for (size_t i = best ? best - 1 : 0; i <= best && i + 1 < n; i++) {
            const zs__bpe_pair_t *p = pair_find(b, w[i], w[i + 1]);
            rank[i] = p ? p->rank : UINT32_MAX;
        }
    }
    return n;
}

/* The heap of merge_long: candidate pairs by (rank, start of the left
 * symbol), the order merge_ids picks them in. */
typedef struct hent {
    uint32_t rank, start;
} hent_t;

/* Heap order: lower rank first, then the leftmost pair. */
static int hless(hent_t a, hent_t b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.start < b.start);
}

/* Push e onto the heap h of *n entries (room for it is the caller's). */
static void hpush(hent_t *h, size_t *n, hent_t e)
{
    size_t i = (*n)++;
    while (i > 0 && hless(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

/* Pop the least entry of a non-empty heap. */
static hent_t hpop(hent_t *h, size_t *n)
{
    hent_t top = h[0], e = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && hless(h[c + 1], h[c]))
            c++;
        if (!hless(h[c], e))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = e;
    return top;
}

#define NONE UINT32_MAX

/* merge_ids for long pieces in O(n log n): the symbols as a linked list
 * (indexed by their first byte), the candidate pairs in a heap; a popped
 * pair is used only if it is still adjacent with that rank (a pair's rank
 * names the pair, so this is exact). Same result as merge_ids: lowest rank
 * first, leftmost on ties. A run of a million spaces or letters is one
 * piece; merge_ids would take n^2. Returns the count, ids in out. */
static int merge_long(const zs_bpe_t *b, const uint8_t *piece, size_t n, uint32_t *out,
                      size_t *nout, zs_err_t *err)
{
    uint32_t *id = malloc(n * sizeof *id), *next = malloc(n * sizeof *next);
    uint32_t *prev = malloc(n * sizeof *prev);
    hent_t *h = malloc(3 * n * sizeof *h);
    size_t nh = 0, cnt = 0;
    if (!id || !next || !prev || !h) {
        free(id), free(next), free(prev), free(h);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for a piece of %zu bytes", n);
    }
    for (size_t i = 0; i < n; i++) {
        id[i] = b->byte_id[piece[i]];
        next[i] = i + 1 < n ? (uint32_t)(i + 1) : NONE;
        prev[i] = i ? (uint32_t)(i - 1) : NONE;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const zs__bpe_pair_t *p = pair_find(b, id[i], id[i + 1]);
        if (p)
            hpush(h, &nh, (hent_t){p->rank, (uint32_t)i});
    }
    while (nh > 0) {
        hent_t e = hpop(h, &nh);
        uint32_t i = e.start, j = next[i];
        if (id[i] == NONE || j == NONE)
            continue;
        const zs__bpe_pair_t *p = pair_find(b, id[i], id[j]);
        if (!p || p->rank != e.rank)
            continue; /* stale: a neighbour was merged since */
        id[i] = p->merged;
        id[j] = NONE;
        next[i] = next[j];
        if (next[j] != NONE)
            prev[next[j]] = i;
        if (prev[i] != NONE && (p = pair_find(b, id[prev[i]], id[i])))
            hpush(h, &nh, (hent_t){p->rank, prev[i]});
        if (next[i] != NONE && (p = pair_find(b, id[i], id[next[i]])))
            hpush(h, &nh, (hent_t){p->rank, i});
    }
    for (uint32_t i = 0; i != NONE; i = next[i])
        out[*nout + cnt++] = id[i];
    *nout += cnt;
    free(id), free(next), free(prev), free(h);
    return ZS_OK;
}

/* One piece to ids (zs_bpe_impl.h): the cache, the scan, or the heap for long pieces. */
int zs__bpe_piece(zs_bpe_t *b, const uint8_t *piece, size_t len, uint32_t *out, size_t *nout,
                  zs_err_t *err)
{
    if (len > ZS__BPE_LONG_PIECE)
        return merge_long(b, piece, len, out, nout, err);
    zs__bpe_slot_t *slot = NULL;
    if (b->cache && len <= ZS__BPE_CACHE_KEY) {
        slot = &b->cache[fnv1a(piece, len) & (ZS__BPE_CACHE_SLOTS - 1)];
        if (slot->klen == len && memcmp(slot->key, piece, len) == 0) {
            for (size_t i = 0; i < slot->nids; i++)
                out[(*nout)++] = slot->ids[i];
            return ZS_OK;
        }
    }
    if (len * 2 > b->work_cap) {
        size_t cap = len * 2 > 4096 ? len * 2 : 4096;
        uint32_t *w = realloc(b->work, cap * sizeof *w);
        if (!w)
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for a piece of %zu bytes", len);
        b->work = w;
        b->work_cap = cap;
    }
    uint32_t *w = b->work, *rank = b->work + len;
    for (size_t i = 0; i < len; i++)
        w[i] = b->byte_id[piece[i]];
    size_t n = merge_ids(b, w, rank, len);
    memcpy(out + *nout, w, n * sizeof *w);
    *nout += n;
    if (slot) {
        slot->klen = (uint8_t)len;
        slot->nids = (uint8_t)n;
        memcpy(slot->key, piece, len);
        for (size_t i = 0; i < n; i++)
            slot->ids[i] = (uint16_t)w[i];
    }
    return ZS_OK;
}
