/*
 * zs_nvme.h - the NVMe tier of a shard server (zs-server --nvme-path DIR):
 * the fp32 master weights and Adam moments (p, m, v) of the shard's range
 * live in a file of tiles under DIR instead of RAM.
 *
 * Layout. A state of n elements is one file DIR/state-<pid>-<k>.tiles of
 * ceil(n / ZS_NVME_TILE) tiles; tile c holds elements [c T, c T + k) of the
 * range (T = ZS_NVME_TILE = ZS_OPT_CHUNK, so tile c is exactly optimizer
 * chunk c and the update calls the same kernel on the same spans as the RAM
 * path: bitwise the same results). Each tile has two slots of ZS_NVME_SLOT
 * bytes at offset (2 c + s) ZS_NVME_SLOT:
 *   [0, 4096)             header: magic, tile, seq, k, XXH3 of p, m, v,
 *                         XXH3 of the header itself
 *   [4096, +T*4)          p (fp32[k], rest of the span unused)
 *   then m, then v        likewise
 * Writes go out of place, to the slot that is not current; the tile's
 * current slot and sequence number flip only once the write has landed.
 * The old slot is therefore the committed pre-image until then, and a
 * failed or torn write never replaces a good tile. Every read checks the
 * header (tile, seq) and the XXH3 of each tensor it uses: a stale, torn or
 * corrupted tile is refused (ZS_ERR_CORRUPT), never handed to AdamW.
 * Slot choice and sequence numbers are kept in RAM (9 B per tile): the
 * tile file is the live state, not a checkpoint. Durability is the
 * RocksDB checkpoint's job (zs_shard_ckpt.c copies tiles into it), so a
 * server starting on DIR deletes the tile files a dead server left there
 * and rebuilds its state from the newest checkpoint.
 *
 * I/O. O_DIRECT (the page cache would hold the state in RAM, outside the
 * budget) with 4 KiB-aligned buffers and offsets, through an io_uring; where
 * io_uring is refused (a container's seccomp profile), synchronously. DIR on a file system
 * without real direct I/O (tmpfs, ramfs: their "direct" I/O is RAM) or
 * refusing O_DIRECT is refused unless `buffered` (--nvme-buffered). The
 * file is preallocated at creation (fallocate), so a full disk fails
 * Initialize or Restore, not a step. One server per DIR: an flock on
 * DIR/zs-nvme.lock, held while the tier is open.
 *
 * Threads. The synchronous tile calls (zs_nvme_read, zs_nvme_write) may be
 * called from any thread; each uses its own caller-supplied buffer (a
 * zs_nvme_buf_t) and pread/pwrite. The caller keeps a tile from being read
 * while its slot flips (the shard's per-chunk lock). The asynchronous pass
 * (zs_nvme_pass.c) uses one io_uring of the tier: one pass at a time.
 *
 * Staged gradients. The same file holds, after the tiles, a gradient
 * region: per step parity (step & 1) and tile c one span of ZS_NVME_GSPAN
 * bytes at gbase + (parity * ntiles + c) ZS_NVME_GSPAN, holding tile c's
 * pushed gradient in its wire dtype (k * dtype size bytes, padded to 4 KiB).
 * Pushes land there (zs_nvme_grad_put: whole tiles written, partly covered
 * ones read, merged and rewritten under a per-tile lock) instead of RAM, and
 * the pass reads each tile's span with its slot. Per tile and parity RAM
 * keeps the step and dtype staged and the XXH3 of the span: a span of
 * another step, dtype, or with a bad checksum is refused (ZS_ERR_CORRUPT),
 * never handed to AdamW. Preallocated with the tiles: a push never needs
 * new space.
 *
 * Not here: what the tensors mean (the shard), checkpoints (the store),
 * which pushed elements count as staged (the shard's ranges), the pipeline
 * of a pass (zs_nvme_pass.c).
 */
#ifndef ZS_NVME_H
#define ZS_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "zs_shard.h"
#include "zs_status.h"

#define ZS_NVME_TILE  ZS_OPT_CHUNK /* elements per tile: one optimizer chunk */
#define ZS_NVME_ALIGN 4096u        /* O_DIRECT alignment of buffers, offsets, lengths */
#define ZS_NVME_HDR   4096u        /* bytes of a slot's header block */
#define ZS_NVME_SPAN  ((size_t)ZS_NVME_TILE * 4)       /* bytes of one tensor in a slot */
#define ZS_NVME_SLOT  (ZS_NVME_HDR + 3 * ZS_NVME_SPAN) /* 772 KiB */
#define ZS_NVME_GSPAN ZS_NVME_SPAN /* bytes of one tile's staged gradient (up to 4 B/element) */
/* Tiles in flight in a pass by default (DeepSpeed's buffer_count is 4..8 of
 * 1 MiB blocks; a pass needs read-ahead, the tiles being updated and the
 * writes behind them). */
#define ZS_NVME_DEPTH_DEFAULT 16

typedef struct zs_nvme zs_nvme_t;
typedef struct zs_nvme_state zs_nvme_state_t;

typedef struct zs_nvme_opts {
    const char *dir; /* created if missing */
    int buffered;    /* 1: no O_DIRECT (and tmpfs allowed): --nvme-buffered */
    int depth;       /* tiles in flight in a pass; <= 0: ZS_NVME_DEPTH_DEFAULT */
} zs_nvme_opts_t;

/* One aligned slot-sized I/O buffer: hdr then p, m, v spans. */
typedef struct zs_nvme_buf {
    unsigned char *mem; /* ZS_NVME_SLOT bytes, ZS_NVME_ALIGN-aligned */
    float *t[3];        /* p, m, v inside mem */
} zs_nvme_buf_t;

/* Open the tier on o->dir: lock it (ZS_ERR_EXISTS when another server holds
 * it), check direct I/O (ZS_ERR_INVALID for tmpfs / no O_DIRECT unless
 * buffered), remove tile files left by a dead server, set up the ring. */
int zs_nvme_open(const zs_nvme_opts_t *o, zs_nvme_t **out, zs_err_t *err);

/* Close the ring, release the lock, free. NULL is a no-op. States must be
 * freed first. */
void zs_nvme_close(zs_nvme_t *nv);

/* Bytes of RAM the tier holds while open: the pass's depth buffers and the
 * ring (the shard reserves them against its budget). */
uint64_t zs_nvme_ram_bytes(const zs_nvme_t *nv);

/* What the tier moved since it opened (zs-server --metrics): bytes read
 * and written on its files (tiles, gradient spans, headers; the pass's,
 * pushes', pulls', checkpoints' and restores'), of them the gradient bytes
 * pushes wrote, and its passes: count, seconds, and seconds the pass
 * waited for I/O. Relaxed atomics: any thread. */
typedef struct zs_nvme_totals {
    uint64_t read_bytes, written_bytes, grad_written_bytes, passes;
    double pass_seconds, io_wait_seconds;
} zs_nvme_totals_t;
void zs_nvme_totals(zs_nvme_t *nv, zs_nvme_totals_t *t);

/* Tiles in flight in a pass. */
int zs_nvme_depth(const zs_nvme_t *nv);

/* The directory, and "O_DIRECT" or "buffered", for logs. */
const char *zs_nvme_dir(const zs_nvme_t *nv);
const char *zs_nvme_mode(const zs_nvme_t *nv);

/* A new, preallocated tile file for n elements (n >= 1). Its tiles hold
 * nothing until written: reading one before is ZS_ERR_CORRUPT. ZS_ERR_NOMEM
 * when the disk has no room (the file is removed). */
int zs_nvme_state_create(zs_nvme_t *nv, uint64_t n, zs_nvme_state_t **out, zs_err_t *err);

/* Close and remove the file, free. NULL is a no-op. */
void zs_nvme_state_free(zs_nvme_state_t *s);

/* Tiles of s, and elements of tile c (the last may be short). */
size_t zs_nvme_ntiles(const zs_nvme_state_t *s);
uint32_t zs_nvme_tile_len(const zs_nvme_state_t *s, size_t c);

/* Bytes of RAM a state of n elements holds (slot table, gradient records
 * and their locks). */
uint64_t zs_nvme_state_ram_bytes(uint64_t n);

/* The path of s's file (for tests and logs). */
const char *zs_nvme_state_path(const zs_nvme_state_t *s);

/* The tier's transient buffers (tile slots, gradient spans, pushed
 * chunks): `bytes` of zeroed, page-aligned memory mapped for this call and
 * unmapped at free (NULL: out of memory), so memory a step used goes back
 * to the system instead of staying in the allocator's arenas, and the
 * process's resident memory follows what the budget counts. */
void *zs_nvme_mem_alloc(size_t bytes);
void zs_nvme_mem_free(void *p, size_t bytes);

/* Allocate / free one aligned slot buffer (ZS_NVME_SLOT bytes; through
 * zs_nvme_mem_alloc). */
int zs_nvme_buf_alloc(zs_nvme_buf_t *b, zs_err_t *err);
void zs_nvme_buf_free(zs_nvme_buf_t *b);

/* Read the current slot of tile c into b and verify the tensors of `mask`
 * (bit t for tensor t; the header always): ZS_ERR_CORRUPT naming the tile
 * and tensor when a checksum, the tile number or the sequence disagree,
 * ZS_ERR_IO on a failed read. */
int zs_nvme_read(zs_nvme_state_t *s, size_t c, unsigned mask, zs_nvme_buf_t *b, zs_err_t *err);

/* Write b's p, m, v (tile_len(c) elements each) as tile c: to the other
 * slot, then flip (the caller keeps readers of c out meanwhile). On error
 * the tile keeps its old slot and contents. */
int zs_nvme_write(zs_nvme_state_t *s, size_t c, zs_nvme_buf_t *b, zs_err_t *err);

/* The first half of zs_nvme_write: b as tile c's next contents in the slot
 * that is not current, without flipping. The current slot stays the tile
 * (a speculative update's pre-image); zs__nvme_flip makes the written one
 * current, and any later write to the tile replaces it. */
int zs_nvme_write_aside(zs_nvme_state_t *s, size_t c, zs_nvme_buf_t *b, zs_err_t *err);

/* ---- staged gradients ------------------------------------------------- */

/* Stage count elements of step's gradient in dtype dt (src: count * size
 * bytes) at shard-relative elements [a, a + count) into parity step & 1.
 * Whole tiles are written; a tile partly covered is read (when it holds
 * this step's gradient in dt, verified), merged and rewritten, under the
 * tile's lock, so concurrent puts of disjoint elements of one tile are
 * safe. Uses one ZS_NVME_GSPAN scratch buffer of its own (the caller
 * budgets it). ZS_ERR_IO / ZS_ERR_CORRUPT: the tiles touched count as
 * holding nothing of this step. */
int zs_nvme_grad_put(zs_nvme_state_t *s, uint64_t step, zs_dtype_t dt, uint64_t a, uint64_t count,
                     const void *src, zs_err_t *err);

/* Read tile c's staged gradient of `step` in dt into buf (ZS_NVME_GSPAN
 * bytes, ZS_NVME_ALIGN-aligned) and verify it: ZS_ERR_CORRUPT naming the
 * tile when it holds another step or dtype or fails its checksum. */
int zs_nvme_grad_read(zs_nvme_state_t *s, size_t c, uint64_t step, zs_dtype_t dt, void *buf,
                      zs_err_t *err);

/* For the pass: byte offset and I/O length (k * size rounded up to 4 KiB)
 * of tile c's span of parity p; the check zs_nvme_grad_read makes on a
 * span read into buf. */
uint64_t zs__nvme_grad_off(const zs_nvme_state_t *s, size_t c, int p);
size_t zs__nvme_grad_len(const zs_nvme_state_t *s, size_t c, zs_dtype_t dt);
int zs__nvme_grad_check(zs_nvme_state_t *s, size_t c, uint64_t step, zs_dtype_t dt, const void *buf,
                        zs_err_t *err);

/* Test hook: flip one byte of tile c's staged gradient of parity p. */
int zs__nvme_grad_corrupt(zs_nvme_state_t *s, size_t c, int p, zs_err_t *err);

/* ---- the pass (zs_nvme_pass.c) ---------------------------------------- */

/* Update tile c in place in its buffers (p, m, v of k elements each) with
 * its staged gradient g (k elements of the pass's dtype); called on the
 * pass's pool, once per tile, with the tiles of a batch in parallel.
 * Returns nonzero to fail the pass. */
typedef int (*zs_nvme_update_fn)(void *ud, size_t c, float *p, float *m, float *v, const void *g,
                                 uint32_t k);

/* Called after tile c's new contents landed and its slot flipped (from the
 * pass's thread); `flip` performs the flip and must be called by it, under
 * whatever lock keeps readers of c out. */
typedef void (*zs_nvme_landed_fn)(void *ud, size_t c, void (*flip)(zs_nvme_state_t *, size_t),
                                  zs_nvme_state_t *s);

/* Called once per tile, in order, before the pass reads it: 1 if the tile
 * needs no update (its new contents were written aside already: a kept
 * speculative update), and it is then only handed to `landed`. */
typedef int (*zs_nvme_skip_fn)(void *ud, size_t c);

/* Walk every tile of s: read ahead (the slot and the tile's gradient of
 * `step` in gdt, both verified), update in batches on `pool` (one
 * update call per tile), write behind, all within the tier's depth. Reads
 * of later tiles and writes of earlier ones overlap the updates. Tiles
 * `skip` (may be NULL) names are not read, updated or written, only
 * landed. On the first error (I/O, checksum, update) no further tile is
 * updated; tiles already landed keep their new contents, the others their
 * old. */
struct zs_pool;
int zs_nvme_pass(zs_nvme_t *nv, zs_nvme_state_t *s, uint64_t step, zs_dtype_t gdt,
                 struct zs_pool *pool, zs_nvme_update_fn fn, zs_nvme_skip_fn skip,
                 zs_nvme_landed_fn landed, void *ud, double *io_seconds, zs_err_t *err);

/* Test hook: flip one byte of tensor t of both slots of tile c in the file,
 * behind the tier's back (a torn or corrupted tile). */
int zs__nvme_corrupt(zs_nvme_state_t *s, size_t c, int t, zs_err_t *err);

/* Shared by zs_nvme.c and zs_nvme_pass.c: byte offset of slot s of tile c;
 * fill b's header for a write of tile c as sequence seq; verify a read
 * header and tensors. */
uint64_t zs__nvme_slot_off(size_t c, int slot);
void zs__nvme_seal(zs_nvme_buf_t *b, size_t c, uint64_t seq, uint32_t k);
int zs__nvme_check(const zs_nvme_state_t *s, const zs_nvme_buf_t *b, size_t c, unsigned mask,
                   zs_err_t *err);
/* The fd, the current slot and sequence of tile c, for the pass. */
int zs__nvme_fd(const zs_nvme_state_t *s);
int zs__nvme_cur(const zs_nvme_state_t *s, size_t c);
uint64_t zs__nvme_seq(const zs_nvme_state_t *s, size_t c);
void zs__nvme_flip(zs_nvme_state_t *s, size_t c);
/* The ring (NULL when io_uring is refused: the pass is then synchronous),
 * depth and buffers of the tier, for the pass; a synchronous read or write
 * of len bytes of s's file at off. */
void *zs__nvme_ring(zs_nvme_t *nv);
int zs__nvme_io(zs_nvme_state_t *s, int wr, void *buf, size_t len, uint64_t off, zs_err_t *err);
zs_nvme_buf_t *zs__nvme_bufs(zs_nvme_t *nv);
/* The pass's gradient buffers: depth of them, ZS_NVME_GSPAN bytes each. */
unsigned char **zs__nvme_gbufs(zs_nvme_t *nv);
/* Count bytes read or written by the pass's ring, and a pass's seconds
 * and I/O wait, into the totals. */
void zs__nvme_count(zs_nvme_t *nv, int wr, uint64_t bytes);
void zs__nvme_count_pass(zs_nvme_t *nv, double seconds, double io_wait);
/* Test hook: milliseconds each tile's update waits after it ran (the
 * environment's ZS_NVME_TEST_TILE_DELAY_MS when the tier opened; 0: none),
 * so a test can kill a server in the middle of a pass. */
long zs__nvme_test_delay_ms(const zs_nvme_t *nv);

#endif
