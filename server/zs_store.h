/*
 * zs_store.h - durable checkpoints of one shard in an embedded RocksDB.
 *
 * A checkpoint of step S holds three fp32 tensors of the same length n
 * (master weights, exp_avg, exp_avg_sq) plus an opaque metadata blob supplied
 * by the caller (the server stores its serialized layout, identity,
 * hyperparameters and optimizer scalars there). The store knows nothing about
 * what the blob means.
 *
 * Crash safety: tensors are written in chunks of ZS_STORE_CHUNK_BYTES, each
 * with an XXH3-64 checksum; the data is made durable (flush of memtables with
 * the WAL off) *before* a completeness marker for S is written with sync=1.
 * A checkpoint without its marker does not exist for list/read and is removed
 * by zs_store_open's cleanup. Writing S never touches another step's keys.
 *
 * Degraded. A write, delete or prune that fails with an I/O error or a full
 * disk (ZS_ERR_NOMEM: RESOURCE_EXHAUSTED, "No space") marks the store
 * degraded (zs_store_health). The next write, delete or prune first checks
 * the free space: with less than it needs (a write: its 12 bytes per element,
 * plus 16 MiB) it is refused at once with ZS_ERR_NOMEM; with enough, the DB is
 * closed and reopened (which is what brings RocksDB back after a failed
 * flush) and the mark is cleared. Reads and lists work while degraded.
 *
 * Not thread-safe: one caller at a time (the server serialises checkpoint,
 * restore and prune).
 */
#ifndef ZS_STORE_H
#define ZS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "zs_status.h"

#define ZS_STORE_CHUNK_BYTES (1u << 20) /* 1 MiB values: measured sweet spot */
#define ZS_STORE_MAX_CKPTS   4096       /* most checkpoints list() reports */

typedef struct zs_store zs_store_t;

/* What to write for one checkpoint. Caller keeps ownership of everything. */
typedef struct zs_store_ckpt {
    uint64_t step;
    uint64_t n;              /* elements per tensor */
    const float *tensors[3]; /* master, exp_avg, exp_avg_sq: n floats each */
    const void *meta;        /* opaque blob, <= 1 MiB */
    size_t meta_len;
    /* Instead of tensors (all three NULL): called once per chunk, in order,
     * to put `len` bytes of tensor t from byte `off` into dst (a state that
     * is not in RAM: the NVMe tier). Nonzero fails the write. */
    int (*fill)(void *ud, int t, uint64_t off, void *dst, size_t len, zs_err_t *err);
    void *fill_ud;
} zs_store_ckpt_t;

/* Open (creating if needed) the store in directory `dir`. Removes the keys of
 * any incomplete checkpoint left by a crash (logged). Refuses (ZS_ERR_NOMEM)
 * when the disk has less than 16 MiB free: RocksDB cannot open on a full
 * disk. On success *out owns the DB; close with zs_store_close. */
int zs_store_open(const char *dir, zs_store_t **out, zs_err_t *err);

/* Close the DB and free the handle. NULL is a no-op. */
void zs_store_close(zs_store_t *st);

/* Write checkpoint ck->step durably; returns when the marker is synced.
 * Refuses (ZS_ERR_EXISTS) if a complete checkpoint of that step exists.
 * On any error the checkpoint is left without a marker (i.e. absent). */
int zs_store_write(zs_store_t *st, const zs_store_ckpt_t *ck, zs_err_t *err);

/* Steps of complete checkpoints, ascending, into steps[0..max); *count gets
 * how many exist (may exceed max). */
int zs_store_list(zs_store_t *st, uint64_t *steps, size_t max, size_t *count, zs_err_t *err);

/* Metadata of complete checkpoint `step`: *meta is malloc'd (caller frees),
 * *meta_len its size, *n the tensor length. ZS_ERR_NOTFOUND if absent. */
int zs_store_read_meta(zs_store_t *st, uint64_t step, void **meta, size_t *meta_len, uint64_t *n,
                       zs_err_t *err);

/* Read the three tensors of complete checkpoint `step` into caller arrays
 * dst[0..2] of n floats each (n must equal the stored n). Every chunk's
 * checksum and size is verified: a mismatch gives ZS_ERR_CORRUPT naming the
 * tensor and chunk, and the caller's arrays may be partly overwritten. */
int zs_store_read(zs_store_t *st, uint64_t step, float *const dst[3], uint64_t n, zs_err_t *err);

/* Read chunk c (ZS_STORE_CHUNK_BYTES of tensor t from byte c *
 * ZS_STORE_CHUNK_BYTES; the last one shorter) of complete checkpoint
 * `step` of n elements per tensor into dst, verified as zs_store_read
 * does; *len gets its bytes. For states read piece by piece (the NVMe
 * tier's restore). */
int zs_store_read_chunk(zs_store_t *st, uint64_t step, uint64_t n, int t, uint64_t c, void *dst,
                        size_t *len, zs_err_t *err);

/* Delete checkpoint `step` (marker first, in one synced batch with the data
 * range delete). ZS_ERR_NOTFOUND if it is not there. */
int zs_store_delete(zs_store_t *st, uint64_t step, zs_err_t *err);

/* Keep the newest `keep` (>= 1) complete checkpoints, delete the older. */
int zs_store_prune(zs_store_t *st, int keep, zs_err_t *err);

/* 1 if the store is degraded (a write failed; see above), with the failure's
 * message copied into why[0..cap) (may be NULL); 0 and "" if healthy. */
int zs_store_health(const zs_store_t *st, char *why, size_t cap);

/* Test hook: corrupt one byte of chunk `chunk` of tensor `tensor` (0..2) of
 * checkpoint `step` so a later read fails its checksum. */
int zs__store_corrupt_chunk(zs_store_t *st, uint64_t step, int tensor, uint64_t chunk,
                            zs_err_t *err);

#endif
