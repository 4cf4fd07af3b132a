/*
 * zs_store_internal.h - what the parts of the checkpoint store share:
 * the handle, the key and marker layout, and the one RocksDB error check.
 * zs_store.c: open/close, cleanup, list, delete, prune, test hook.
 * zs_store_io.c: write and read of checkpoints.
 * zs_store_recover.c: the degraded mark and the reopen after a failed write.
 * Not part of the contract (zs_store.h); nothing outside server/zs_store*.c
 * includes it.
 */
#ifndef ZS_STORE_INTERNAL_H
#define ZS_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <rocksdb/c.h>

#include "zs_store.h"

#define ZS__KEY_MAX   48
#define MARKER_KEYLEN 22 /* "m/" + 20 digits */
#define HDR_BYTES     48
#define HDR_MAGIC     0x315a5343u /* "CSZ1" little-endian: zeroshard checkpoint v1 */
#define HDR_VERSION   1u
#define META_MAX      (1u << 20)
#define N_MAX         (1ull << 40) /* elements per tensor: 4 TiB, well inside %010llu chunks */
#define SUM_BYTES     8

enum { CF_META = 0, CF_DATA = 1 }; /* column families: markers, chunks */

struct zs_store {
    rocksdb_t *db;
    rocksdb_options_t *opts;      /* DB and marker family */
    rocksdb_options_t *data_opts; /* chunk family: big memtables, no auto compaction */
    rocksdb_block_based_table_options_t *bbo;
    rocksdb_column_family_handle_t *cf[2];
    rocksdb_writeoptions_t *wo_nowal; /* chunks: WAL off, made durable by flush */
    rocksdb_writeoptions_t *wo_sync;  /* markers and deletes: WAL on, fsync */
    rocksdb_readoptions_t *ro;        /* marker reads: block checksums on */
    rocksdb_readoptions_t *ro_chunk;  /* chunk reads: own XXH3 instead, no cache fill */
    rocksdb_flushoptions_t *fo;       /* wait=1 */
    char dir[256];                    /* for log lines only (may be truncated) */
    char *path;                       /* the directory, in full (for reopening) */
    int degraded;                     /* a write failed; the next one reopens first */
    char why[ZS_ERR_MSG_MAX];         /* what failed (when degraded) */
};

/* Parsed marker header. */
typedef struct {
    uint64_t n, meta_len, meta_sum;
    uint32_t chunk_bytes;
} zs__marker_t;

/* "master", "exp_avg", "exp_avg_sq". */
extern const char *const zs__tensor_name[3];

/* Behind ZS_ROCKS_CHECK: fills err, frees *errstr (sets it NULL), returns the code. */
int zs__rocks_fail(char **errstr, zs_err_t *err, const char *op, const char *file, int line,
                   const char *hint);

/* The one RocksDB check: if the char* errptr `e` is set, fill err (ZS_ERR_IO,
 * or ZS_ERR_CORRUPT for RocksDB "Corruption" statuses) with the operation,
 * file:line, RocksDB's message and a hint, free the string, and yield the
 * code; else yield ZS_OK. */
#define ZS_ROCKS_CHECK(e, err, op, hint)                                                           \
    ((e) == NULL ? ZS_OK : zs__rocks_fail(&(e), (err), (op), __FILE__, __LINE__, (hint)))

static inline void zs__put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void zs__put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t zs__get_le32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t zs__get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- open, close and recovery (zs_store.c, zs_store_recover.c) ---- */

#define ZS__STORE_MIN_FREE (16ull << 20) /* bytes free below which RocksDB is not opened */

/* Open st->db (and its column families) in st->path and remove incomplete
 * checkpoints; refuses (ZS_ERR_NOMEM) when the disk has less than
 * ZS__STORE_MIN_FREE free. On error st->db stays NULL. */
int zs__store_open_db(zs_store_t *st, zs_err_t *err);

/* Close st->db and its column families (the options stay). Idempotent. */
void zs__store_close_db(zs_store_t *st);

/* ZS_ERR_NOMEM when the file system of st->path has less than need +
 * ZS__STORE_MIN_FREE bytes available (`what` names the operation in the
 * message); ZS_OK if it has them or cannot tell. */
int zs__store_check_space(const zs_store_t *st, uint64_t need, const char *what, zs_err_t *err);

/* Before a write, delete or prune: ZS_OK at once if the store is healthy;
 * if it is degraded and the disk has need + ZS__STORE_MIN_FREE bytes free,
 * close and reopen the DB (RocksDB stays stopped after a failed flush until
 * then) and clear the mark; else the refusal. */
int zs__store_recover(zs_store_t *st, uint64_t need, zs_err_t *err);

/* After a write, delete or prune failed with rc: mark the store degraded when
 * rc is an I/O or no-space error (remembering err's message). Returns rc. */
int zs__store_failed(zs_store_t *st, int rc, const zs_err_t *err);

/* The error of a call on a store whose reopen failed (st->db NULL). */
int zs__store_closed(const zs_store_t *st, zs_err_t *err);

/* Keys into buf[ZS__KEY_MAX]; each returns the key length. */
size_t zs__marker_key(char *buf, uint64_t step);
size_t zs__chunk_key(char *buf, uint64_t step, int t, uint64_t c);

/* lo, hi (ZS__KEY_MAX each) := [c/<step>/, c/<step>0), every chunk key of
 * `step`; returns the common length. */
size_t zs__step_range(uint64_t step, char *lo, char *hi);

/* Marker of `step`, header verified: ZS_OK with *m filled (and, when pin and
 * meta are given, *meta pointing at the blob inside *pin, which the caller
 * destroys with rocksdb_pinnableslice_destroy), or ZS_ERR_NOTFOUND,
 * ZS_ERR_CORRUPT, ZS_ERR_IO with err filled. */
int zs__load_marker(zs_store_t *st, uint64_t step, zs__marker_t *m, rocksdb_pinnableslice_t **pin,
                    const unsigned char **meta, zs_err_t *err);

/* One synced batch: for each step its marker delete, then its chunk range
 * delete. Does not reclaim space (zs__reclaim does). */
int zs__delete_steps(zs_store_t *st, const uint64_t *steps, size_t k, zs_err_t *err);

/* Give back the disk space of the (already deleted) steps first..last. Never
 * fails: problems are logged, the deletion itself is already durable. */
void zs__reclaim(zs_store_t *st, uint64_t first, uint64_t last);

/* Move the chunk-family L0 files overlapping [lo, hi) down to L1, where
 * rocksdb_delete_file_in_range can later drop them whole. With all L0 files
 * disjoint (one step each) this is a metadata-only trivial move. */
void zs__settle(zs_store_t *st, const char *lo, size_t lolen, const char *hi, size_t hilen);

#endif
