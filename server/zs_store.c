/*
 * zs_store.c - the checkpoint store of zs_store.h on an embedded RocksDB 7.8
 * (Debian's build, C API rocksdb/c.h).
 *
 * What it does. Two column families:
 *   "default"  markers  m/<step %020llu>                              -> header + meta blob
 *   "chunks"   data     c/<step %020llu>/<tensor 0..2>/<chunk %010llu> -> bytes + XXH3-64
 * Zero-padded decimal keys sort like the numbers, so every step owns one
 * contiguous key range [c/<step>/, c/<step>0) ('0' follows '/' in ASCII).
 * A chunk value is the raw bytes (ZS_STORE_CHUNK_BYTES, the last one short)
 * followed by an 8-byte little-endian XXH3-64 seeded with (step, tensor,
 * chunk, length), so a value under the wrong key fails its check too.
 * A marker is a fixed 48-byte little-endian header (magic, version, n, chunk
 * bytes, meta length, XXH3 of the meta, XXH3 of the header seeded with the
 * step) followed by the meta blob.
 *
 * Write order: chunks with the WAL off, rocksdb_flush(wait=1) of the chunk
 * family (SSTs and MANIFEST synced), then the marker with sync=1 (WAL on).
 * Markers live in their own family so that a chunk SST only ever holds one
 * step's keys: whole files can then be dropped when a step is deleted, and
 * the range tombstone of a delete never overlaps the steps that are kept.
 * Deleting is one synced batch (marker delete + range delete); space comes
 * back through rocksdb_delete_file_in_range (L1+ files) and compact_range
 * (the rest). zs_store_open range-deletes and reclaims every chunk key range
 * between complete steps that holds anything: chunks of a write killed before
 * its marker, or the files of a delete killed before its space came back.
 *
 * What it does not do: no threads that outlive a call (zs_store_read runs 4
 * readers and joins them; RocksDB runs two background jobs), no compression
 * (fp32 state does not compress), no locking (one caller at a time, as
 * zs_store.h says), no meaning for the meta blob. It never exits or aborts;
 * every failure comes back as a zs status + message.
 *
 * Split: this file has open/close, cleanup, list, delete, prune and the
 * corruption hook; zs_store_io.c writes and reads checkpoints;
 * zs_store_recover.c marks the store degraded after a failed write and
 * reopens it once there is room again; zs_store_internal.h holds what they
 * share.
 *
 * Test hook: ZS_STORE_TEST_MARKER_DELAY_MS=<ms> in the environment makes
 * zs_store_write log a WARN line and sleep that long between the durable
 * chunks and the marker, so crash tests can kill a writer at that moment.
 */
#include "zs_store_internal.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "zs_log.h"

const char *const zs__tensor_name[3] = {"master", "exp_avg", "exp_avg_sq"};

/* ---- errors and keys ---------------------------------------------------- */

/* See zs_store_internal.h. */
int zs__rocks_fail(char **errstr, zs_err_t *err, const char *op, const char *file, int line,
                   const char *hint)
{
    const char *base = strrchr(file, '/');
    int code = strncmp(*errstr, "Corruption", 10) == 0 ? ZS_ERR_CORRUPT : ZS_ERR_IO;
    if (strstr(*errstr, "No space left") || strstr(*errstr, "NoSpace")) { /* ENOSPC, EDQUOT */
        code = ZS_ERR_NOMEM; /* RESOURCE_EXHAUSTED: gRPC's code for a full file system */
        hint = "the disk is full: free space; the store recovers on the next write";
    }
    zs_err_set(err, code, "rocksdb %s at %s:%d: %s (hint: %s)", op, base ? base + 1 : file, line,
               *errstr, hint);
    rocksdb_free(*errstr);
    *errstr = NULL;
    return code;
}

/* See zs_store_internal.h. */
size_t zs__marker_key(char *buf, uint64_t step)
{
    return (size_t)snprintf(buf, ZS__KEY_MAX, "m/%020llu", (unsigned long long)step);
}

/* See zs_store_internal.h. */
size_t zs__chunk_key(char *buf, uint64_t step, int t, uint64_t c)
{
    return (size_t)snprintf(buf, ZS__KEY_MAX, "c/%020llu/%d/%010llu", (unsigned long long)step, t,
                            (unsigned long long)c);
}

/* See zs_store_internal.h. */
size_t zs__step_range(uint64_t step, char *lo, char *hi)
{
    size_t len = (size_t)snprintf(lo, ZS__KEY_MAX, "c/%020llu/", (unsigned long long)step);
    memcpy(hi, lo, len + 1);
    hi[len - 1] = '0';
    return len;
}

/* Step of a key "<prefix>/<20 digits>..."; -1 if it is not one. */
static int parse_step(const char *key, size_t len, char prefix, uint64_t *step)
{
    if (len < MARKER_KEYLEN || key[0] != prefix || key[1] != '/')
        return -1;
    uint64_t v = 0;
    for (int i = 2; i < MARKER_KEYLEN; i++) {
        unsigned d = (unsigned)(key[i] - '0');
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (prefix == 'm' ? len != MARKER_KEYLEN : key[MARKER_KEYLEN] != '/')
        return -1;
    *step = v;
    return 0;
}

/* ---- markers, deletes ---------------------------------------------------- */

/* See zs_store_internal.h. */
int zs__load_marker(zs_store_t *st, uint64_t step, zs__marker_t *m, rocksdb_pinnableslice_t **pin,
                    const unsigned char **meta, zs_err_t *err)
{
    if (!st->db)
        return zs__store_closed(st, err);
    char key[ZS__KEY_MAX], *e = NULL;
    size_t klen = zs__marker_key(key, step), vlen = 0;
    rocksdb_pinnableslice_t *p =
        rocksdb_get_pinned_cf(st->db, st->ro, st->cf[CF_META], key, klen, &e);
    int rc = ZS_ROCKS_CHECK(e, err, "get marker", "is the store directory readable?");
    if (rc)
        return rc;
    if (!p)
        return zs_err_set(err, ZS_ERR_NOTFOUND, "store %s: no complete checkpoint of step %llu",
                          st->dir, (unsigned long long)step);
    const unsigned char *v = (const unsigned char *)rocksdb_pinnableslice_value(p, &vlen);
    rc = ZS_OK;
    if (vlen < HDR_BYTES || zs__get_le32(v) != HDR_MAGIC)
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "store %s: marker of step %llu: bad size or magic",
                        st->dir, (unsigned long long)step);
    else if (zs__get_le64(v + 40) != XXH3_64bits_withSeed(v, 40, step))
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "store %s: marker of step %llu: header checksum",
                        st->dir, (unsigned long long)step);
    else if (zs__get_le32(v + 4) != HDR_VERSION || zs__get_le32(v + 16) != ZS_STORE_CHUNK_BYTES)
        rc = zs_err_set(err, ZS_ERR_CORRUPT,
                        "store %s: step %llu has format v%u with %u-byte chunks; this build "
                        "reads v%u with %u-byte chunks",
                        st->dir, (unsigned long long)step, zs__get_le32(v + 4),
                        zs__get_le32(v + 16), HDR_VERSION, ZS_STORE_CHUNK_BYTES);
    else if (zs__get_le64(v + 24) != vlen - HDR_BYTES || zs__get_le64(v + 24) > META_MAX ||
             zs__get_le64(v + 8) == 0 || zs__get_le64(v + 8) > N_MAX)
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "store %s: marker of step %llu: bad n or meta length",
                        st->dir, (unsigned long long)step);
    if (rc) {
        rocksdb_pinnableslice_destroy(p);
        return rc;
    }
    m->n = zs__get_le64(v + 8);
    m->chunk_bytes = zs__get_le32(v + 16);
    m->meta_len = zs__get_le64(v + 24);
    m->meta_sum = zs__get_le64(v + 32);
    if (meta)
        *meta = v + HDR_BYTES;
    if (pin)
        *pin = p;
    else
        rocksdb_pinnableslice_destroy(p);
    return ZS_OK;
}

/* rocksdb_delete_file_in_range on the chunk family: drops the L1+ files that
 * lie wholly inside [lo, hi), metadata only. Failures are logged. */
static void drop_files(zs_store_t *st, const char *lo, size_t lolen, const char *hi, size_t hilen)
{
    char *e = NULL;
    rocksdb_delete_file_in_range_cf(st->db, st->cf[CF_DATA], lo, lolen, hi, hilen, &e);
    if (e) {
        ZS_WARN("store %s: delete_file_in_range [%.*s, %.*s): %s (space comes back at the next "
                "open)",
                st->dir, (int)lolen, lo, (int)hilen, hi, e);
        rocksdb_free(e);
    }
}

/* Give back the space of chunk keys [lo, hi), whose deletion is already
 * durable: drop the (settled, L1) files wholly inside the range; settle, which
 * flushes the range tombstone and moves or compacts what is left in L0; drop
 * again, which takes the tombstone file itself. Auto compaction is off for the
 * chunk family, so no background job moves files under these calls. Failures
 * lose no data and are logged, not returned. */
static void reclaim_keys(zs_store_t *st, const char *lo, size_t lolen, const char *hi, size_t hilen)
{
    drop_files(st, lo, lolen, hi, hilen);
    zs__settle(st, lo, lolen, hi, hilen);
    drop_files(st, lo, lolen, hi, hilen);
}

/* See zs_store_internal.h. */
void zs__settle(zs_store_t *st, const char *lo, size_t lolen, const char *hi, size_t hilen)
{
    rocksdb_compact_range_cf(st->db, st->cf[CF_DATA], lo, lolen, hi, hilen);
}

/* See zs_store_internal.h. */
void zs__reclaim(zs_store_t *st, uint64_t first, uint64_t last)
{
    char lo[ZS__KEY_MAX], hi[ZS__KEY_MAX], tmp[ZS__KEY_MAX];
    size_t lolen = zs__step_range(first, lo, tmp);
    size_t hilen = zs__step_range(last, tmp, hi);
    reclaim_keys(st, lo, lolen, hi, hilen);
}

/* See zs_store_internal.h. */
int zs__delete_steps(zs_store_t *st, const uint64_t *steps, size_t k, zs_err_t *err)
{
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    for (size_t i = 0; i < k; i++) {
        char key[ZS__KEY_MAX], lo[ZS__KEY_MAX], hi[ZS__KEY_MAX];
        size_t klen = zs__marker_key(key, steps[i]);
        size_t len = zs__step_range(steps[i], lo, hi);
        rocksdb_writebatch_delete_cf(b, st->cf[CF_META], key, klen);
        rocksdb_writebatch_delete_range_cf(b, st->cf[CF_DATA], lo, len, hi, len);
    }
    char *e = NULL;
    rocksdb_write(st->db, st->wo_sync, b, &e);
    rocksdb_writebatch_destroy(b);
    return ZS_ROCKS_CHECK(e, err, "write delete batch", "disk full or read-only?");
}

/* ---- open / close -------------------------------------------------------- */

/* Logs each step in [lo, hi) that has chunks but no marker; returns how many
 * (or <0 on error). Reads one chunk block per step (seek, then skip the step). */
static int log_incomplete(zs_store_t *st, const char *lo, size_t lolen, const char *hi,
                          size_t hilen, zs_err_t *err)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_readoptions_set_iterate_upper_bound(ro, hi, hilen);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, ro, st->cf[CF_DATA]);
    int found = 0;
    char *e = NULL;
    for (rocksdb_iter_seek(it, lo, lolen); rocksdb_iter_valid(it);) {
        size_t klen;
        const char *key = rocksdb_iter_key(it, &klen);
        uint64_t step;
        if (parse_step(key, klen, 'c', &step)) {
            ZS_WARN("store %s: removing unexpected chunk key '%.*s'", st->dir,
                    (int)(klen < ZS__KEY_MAX ? klen : ZS__KEY_MAX), key);
            rocksdb_iter_next(it);
            continue;
        }
        char slo[ZS__KEY_MAX], shi[ZS__KEY_MAX];
        size_t len = zs__step_range(step, slo, shi);
        const char *los[1] = {slo}, *his[1] = {shi};
        size_t lens[1] = {len};
        uint64_t bytes = 0;
        rocksdb_approximate_sizes_cf(st->db, st->cf[CF_DATA], 1, los, lens, his, lens, &bytes, &e);
        if (e) { /* only for the log line */
            rocksdb_free(e);
            e = NULL;
        }
        ZS_INFO("store %s: removing incomplete checkpoint of step %llu (~%.1f MiB of chunks, no "
                "marker: left by a crash or a failed write)",
                st->dir, (unsigned long long)step, (double)bytes / (1 << 20));
        found++;
        rocksdb_iter_seek(it, shi, len);
    }
    rocksdb_iter_get_error(it, &e);
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    int rc = ZS_ROCKS_CHECK(e, err, "scan chunks at open", "is the store directory readable?");
    return rc ? rc : found;
}

/* Chunk keys belong only to steps with a marker. Every gap between those
 * steps ("c/" .. first, between neighbours, last .. "c0") that holds visible
 * chunks (a write killed before its marker) or table files (also a delete
 * killed before its space came back) gets one range delete, all in one
 * synced batch, and is then reclaimed. Nothing of a complete step is ever
 * inside a gap, so its files can be dropped without reading them. */
static int cleanup_incomplete(zs_store_t *st, zs_err_t *err)
{
    size_t k = 0, again = 0;
    int rc = zs_store_list(st, NULL, 0, &k, err);
    if (rc)
        return rc;
    uint64_t *steps = malloc((k ? k : 1) * sizeof *steps);
    char(*gap)[2][ZS__KEY_MAX] = malloc((k + 1) * sizeof *gap);
    size_t *gaplen = malloc((k + 1) * 2 * sizeof *gaplen);
    bool *dirty = calloc(k + 1, sizeof *dirty);
    if (!steps || !gap || !gaplen || !dirty)
        rc = zs_err_set(err, ZS_ERR_NOMEM, "store %s: out of memory in cleanup", st->dir);
    if (rc == ZS_OK)
        rc = zs_store_list(st, steps, k, &again, err);
    if (rc == ZS_OK && again != k)
        rc = zs_err_set(err, ZS_ERR_INTERNAL, "store %s: marker list changed at open", st->dir);

    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    size_t ndirty = 0;
    for (size_t i = 0; rc == ZS_OK && i <= k; i++) {
        char tmp[ZS__KEY_MAX];
        char *lo = gap[i][0], *hi = gap[i][1];
        size_t *lolen = &gaplen[2 * i], *hilen = &gaplen[2 * i + 1];
        if (i == 0) {
            memcpy(lo, "c/", 3);
            *lolen = 2;
        } else {
            *lolen = zs__step_range(steps[i - 1], tmp, lo);
        }
        if (i == k) {
            memcpy(hi, "c0", 3);
            *hilen = 2;
        } else {
            *hilen = zs__step_range(steps[i], hi, tmp);
        }
        int found = log_incomplete(st, lo, *lolen, hi, *hilen, err);
        if (found < 0) {
            rc = found;
            break;
        }
        const char *los[1] = {lo}, *his[1] = {hi};
        uint64_t bytes = 0;
        char *e = NULL;
        rocksdb_approximate_sizes_cf(st->db, st->cf[CF_DATA], 1, los, lolen, his, hilen, &bytes,
                                     &e);
        if (e) { /* a size is only a hint here */
            rocksdb_free(e);
            bytes = 0;
        }
        if (found == 0 && bytes >= ZS_STORE_CHUNK_BYTES)
            ZS_INFO("store %s: reclaiming up to ~%.1f MiB of table files in [%s, %s) (deleted "
                    "chunks: a delete or cleanup was cut short)",
                    st->dir, (double)bytes / (1 << 20), lo, hi);
        if (found > 0 || bytes > 0) {
            rocksdb_writebatch_delete_range_cf(b, st->cf[CF_DATA], lo, *lolen, hi, *hilen);
            dirty[i] = true;
            ndirty++;
        }
    }
    if (rc == ZS_OK && ndirty > 0) {
        /* Files wholly inside a gap hold nothing of a complete step: drop them
         * unread. Then settle what a killed write left in L0 (disjoint files: a
         * trivial move) so the tombstones below never force a real compaction. */
        for (size_t i = 0; i <= k; i++)
            if (dirty[i])
                drop_files(st, gap[i][0], gaplen[2 * i], gap[i][1], gaplen[2 * i + 1]);
        char *l0 =
            rocksdb_property_value_cf(st->db, st->cf[CF_DATA], "rocksdb.num-files-at-level0");
        if (l0 && atoi(l0) > 0)
            zs__settle(st, "c/", 2, "c0", 2);
        rocksdb_free(l0);
        char *e = NULL;
        rocksdb_write(st->db, st->wo_sync, b, &e);
        rc = ZS_ROCKS_CHECK(e, err, "write cleanup batch", "disk full or read-only?");
        for (size_t i = 0; rc == ZS_OK && i <= k; i++)
            if (dirty[i])
                reclaim_keys(st, gap[i][0], gaplen[2 * i], gap[i][1], gaplen[2 * i + 1]);
    }
    rocksdb_writebatch_destroy(b);
    free(steps);
    free(gap);
    free(gaplen);
    free(dirty);
    return rc;
}

static void set_options(zs_store_t *st)
{
    /* DB-wide, and the marker family: small, WAL'd, compacted as RocksDB likes. */
    rocksdb_options_t *o = st->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(o, 1);
    rocksdb_options_set_create_missing_column_families(o, 1);
    rocksdb_options_set_compression(o, rocksdb_no_compression);
    rocksdb_options_set_max_background_jobs(o, 2);
    rocksdb_options_set_bytes_per_sync(o, 1u << 20);
    rocksdb_options_set_max_total_wal_size(o, 64u << 20); /* markers alone never fill a memtable */
    rocksdb_options_set_write_buffer_size(o, 4u << 20);
    /* Default fadvise(RANDOM) turns kernel readahead off: restores ran at a third of the
     * raw cold read speed with it. mmap reads: a pinned get then points into the
     * mapped file, no 1 MiB heap block per chunk (whose page faults and zeroing
     * held a freshly started process to ~3 GB/s warm; ~9 GB/s mapped). See
     * docs/storage.md. */
    rocksdb_options_set_advise_random_on_open(o, 0);
    rocksdb_options_set_allow_mmap_reads(o, 1);
    rocksdb_options_set_keep_log_file_num(o, 4);
    rocksdb_options_set_max_log_file_size(o, 4u << 20);
    /* RocksDB's LOG gets its header only. Debian's RocksDB 7.8 has assertions
     * compiled in: once a write to the LOG file failed (ENOSPC), its next line
     * aborts the process (WritableFileWriter::AssertFalseAndGetStatusForPrevError).
     * Measured: on a full disk the process died within seconds, from RocksDB's own
     * retry messages. Our errors carry RocksDB's message instead (docs/storage.md). */
    rocksdb_options_set_info_log_level(o, 5 /* HEADER_LEVEL */);
    st->bbo = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_checksum(st->bbo, 4); /* kXXH3: crc32c is software here */
    rocksdb_options_set_block_based_table_factory(o, st->bbo);

    /* Chunk family: 64 MiB memtables, 3 of them so writes overlap flushes (with 4,
     * RocksDB throttles writers to 16 MB/s once 3 wait for flush; with 3 it just
     * pauses until one is flushed), 64 MiB files, and no automatic compaction:
     * files only move when this code says so (zs__settle), which keeps every SST
     * to one step and makes deletes metadata-only. */
    rocksdb_options_t *d = st->data_opts = rocksdb_options_create_copy(o);
    rocksdb_options_set_write_buffer_size(d, 64u << 20);
    rocksdb_options_set_max_write_buffer_number(d, 3);
    rocksdb_options_set_target_file_size_base(d, 64u << 20);
    rocksdb_options_set_disable_auto_compactions(d, 1);

    st->wo_nowal = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(st->wo_nowal, 1);
    st->wo_sync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(st->wo_sync, 1);
    st->ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(st->ro, 1);
    /* Chunk gets skip RocksDB's block checksum: every chunk carries its own
     * XXH3 over the same bytes plus their identity, checked on every read, so
     * a second hash pass only cost warm restores time (docs/storage.md). Index
     * blocks are still verified when a table is opened, markers on every read. */
    st->ro_chunk = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(st->ro_chunk, 0);
    rocksdb_readoptions_set_fill_cache(st->ro_chunk, 0);
    st->fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(st->fo, 1);
}

/* See zs_store_internal.h. */
int zs__store_open_db(zs_store_t *st, zs_err_t *err)
{
    int rc = zs__store_check_space(st, 0, "open", err);
    if (rc)
        return rc;
    const char *names[2] = {"default", "chunks"};
    const rocksdb_options_t *cfo[2] = {st->opts, st->data_opts};
    char *e = NULL;
    st->db = rocksdb_open_column_families(st->opts, st->path, 2, names, cfo, st->cf, &e);
    rc = ZS_ROCKS_CHECK(e, err, "open",
                        "does the parent directory exist and is it writable? is another "
                        "process using this store (LOCK)?");
    if (rc == ZS_OK)
        rc = cleanup_incomplete(st, err);
    if (rc)
        zs__store_close_db(st);
    return rc;
}

/* See zs_store_internal.h. Column family handles go before the DB (the
 * package's RocksDB has assertions compiled in). */
void zs__store_close_db(zs_store_t *st)
{
    for (int i = 0; i < 2; i++)
        if (st->cf[i]) {
            rocksdb_column_family_handle_destroy(st->cf[i]);
            st->cf[i] = NULL;
        }
    if (st->db)
        rocksdb_close(st->db);
    st->db = NULL;
}

/* See zs_store.h. */
int zs_store_open(const char *dir, zs_store_t **out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_open: empty directory name");
    zs_store_t *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(dir))) {
        free(st);
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_store_open: out of memory");
    }
    snprintf(st->dir, sizeof st->dir, "%s", dir);
    set_options(st);
    int rc = zs__store_open_db(st, err);
    if (rc) {
        zs_store_close(st);
        return rc;
    }
    *out = st;
    return ZS_OK;
}

/* See zs_store.h. Options go after the DB. */
void zs_store_close(zs_store_t *st)
{
    if (!st)
        return;
    zs__store_close_db(st);
    rocksdb_writeoptions_destroy(st->wo_nowal);
    rocksdb_writeoptions_destroy(st->wo_sync);
    rocksdb_readoptions_destroy(st->ro);
    rocksdb_readoptions_destroy(st->ro_chunk);
    rocksdb_flushoptions_destroy(st->fo);
    rocksdb_options_destroy(st->opts);
    rocksdb_options_destroy(st->data_opts);
    rocksdb_block_based_options_destroy(st->bbo);
    free(st->path);
    free(st);
}

/* ---- list / delete ------------------------------------------------------ */

/* See zs_store.h. */
int zs_store_list(zs_store_t *st, uint64_t *steps, size_t max, size_t *count, zs_err_t *err)
{
    if (!st || !count || (max > 0 && !steps))
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_list: NULL argument");
    *count = 0;
    if (!st->db)
        return zs__store_closed(st, err);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_iterate_upper_bound(ro, "m0", 2);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, ro, st->cf[CF_META]);
    size_t k = 0;
    for (rocksdb_iter_seek(it, "m/", 2); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const char *key = rocksdb_iter_key(it, &klen);
        uint64_t step;
        if (parse_step(key, klen, 'm', &step)) {
            ZS_WARN("store %s: unexpected marker key '%.*s' ignored", st->dir,
                    (int)(klen < ZS__KEY_MAX ? klen : ZS__KEY_MAX), key);
            continue;
        }
        if (k < max)
            steps[k] = step;
        k++;
    }
    char *e = NULL;
    rocksdb_iter_get_error(it, &e);
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    int rc = ZS_ROCKS_CHECK(e, err, "list markers", "is the store directory readable?");
    *count = rc ? 0 : k;
    return rc;
}

/* See zs_store.h. */
int zs_store_delete(zs_store_t *st, uint64_t step, zs_err_t *err)
{
    if (!st)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_delete: store is NULL");
    int rc = zs__store_recover(st, 0, err);
    if (rc)
        return rc;
    zs__marker_t m;
    rc = zs__load_marker(st, step, &m, NULL, NULL, err);
    if (rc != ZS_OK && rc != ZS_ERR_CORRUPT) /* a corrupt checkpoint may still be deleted */
        return rc;
    zs_err_clear(err);
    if ((rc = zs__delete_steps(st, &step, 1, err)))
        return zs__store_failed(st, rc, err);
    zs__reclaim(st, step, step);
    ZS_INFO("store %s: deleted checkpoint of step %llu", st->dir, (unsigned long long)step);
    return ZS_OK;
}

/* See zs_store.h. */
int zs_store_prune(zs_store_t *st, int keep, zs_err_t *err)
{
    if (!st)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_prune: store is NULL");
    if (keep < 1)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_prune: keep=%d must be >= 1", keep);
    int rc = zs__store_recover(st, 0, err);
    if (rc)
        return rc;
    size_t count = 0;
    rc = zs_store_list(st, NULL, 0, &count, err);
    if (rc || count <= (size_t)keep)
        return rc;
    uint64_t *steps = malloc(count * sizeof *steps);
    if (!steps)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_store_prune: out of memory");
    size_t again = 0;
    rc = zs_store_list(st, steps, count, &again, err);
    if (rc == ZS_OK && again != count)
        rc = zs_err_set(err, ZS_ERR_INTERNAL, "zs_store_prune: list changed under us");
    size_t drop = count - (size_t)keep;
    if (rc == ZS_OK && (rc = zs__delete_steps(st, steps, drop, err)))
        zs__store_failed(st, rc, err);
    if (rc == ZS_OK) {
        /* Steps are ascending and the kept ones are newer: one range covers the dropped. */
        zs__reclaim(st, steps[0], steps[drop - 1]);
        ZS_INFO("store %s: pruned %zu checkpoint(s), steps %llu..%llu; kept %d", st->dir, drop,
                (unsigned long long)steps[0], (unsigned long long)steps[drop - 1], keep);
    }
    free(steps);
    return rc;
}

/* See zs_store.h. The damaged value is written with the WAL off and flushed,
 * like any chunk, so it survives a reopen. */
int zs__store_corrupt_chunk(zs_store_t *st, uint64_t step, int tensor, uint64_t chunk,
                            zs_err_t *err)
{
    if (!st || tensor < 0 || tensor > 2)
        return zs_err_set(err, ZS_ERR_INVALID, "zs__store_corrupt_chunk: bad store or tensor");
    if (!st->db)
        return zs__store_closed(st, err);
    char key[ZS__KEY_MAX], *e = NULL;
    size_t klen = zs__chunk_key(key, step, tensor, chunk), vlen = 0;
    rocksdb_pinnableslice_t *p =
        rocksdb_get_pinned_cf(st->db, st->ro_chunk, st->cf[CF_DATA], key, klen, &e);
    int rc = ZS_ROCKS_CHECK(e, err, "get chunk", "is the store directory readable?");
    if (rc)
        return rc;
    if (!p)
        return zs_err_set(err, ZS_ERR_NOTFOUND, "store %s: no chunk %s", st->dir, key);
    const char *v = rocksdb_pinnableslice_value(p, &vlen);
    char *copy = vlen > SUM_BYTES ? malloc(vlen) : NULL;
    if (!copy) {
        rocksdb_pinnableslice_destroy(p);
        return zs_err_set(err, vlen > SUM_BYTES ? ZS_ERR_NOMEM : ZS_ERR_CORRUPT,
                          "zs__store_corrupt_chunk: %s",
                          vlen > SUM_BYTES ? "out of memory" : "chunk too short");
    }
    memcpy(copy, v, vlen);
    rocksdb_pinnableslice_destroy(p);
    copy[(vlen - SUM_BYTES) / 2] ^= 0x5a;
    rocksdb_put_cf(st->db, st->wo_nowal, st->cf[CF_DATA], key, klen, copy, vlen, &e);
    free(copy);
    if ((rc = ZS_ROCKS_CHECK(e, err, "put corrupted chunk", "disk full?")))
        return rc;
    rocksdb_flush_cf(st->db, st->fo, st->cf[CF_DATA], &e);
    return ZS_ROCKS_CHECK(e, err, "flush corrupted chunk", "disk full?");
}
