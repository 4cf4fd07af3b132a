/*
 * zs_shm.h - the shared-memory data plane of a co-located worker and server:
 * one segment (a sealed memfd) holding, for one server's range, a header, a
 * chunk table and two payload areas (gradients worker -> server, parameters
 * server -> worker), and the operations on one chunk: stage, publish, wait,
 * verify.
 *
 * What it does not do: discover the peer or pass the fd (zs_shm_sock.h),
 * decide which step is expected (the server's step bookkeeping; the gRPC
 * control plane stays what it is), convert dtypes, pin memory for a GPU
 * (cudaHostRegister of zs_shm_base is the worker's business).
 *
 * Roles. The worker creates the segment (zs_shm_create) and is the only
 * writer of the GRAD slots; the server maps it from the received fd
 * (zs_shm_map) and is the only writer of the PARAM slots. Publishing the
 * other side's direction is refused (ZS_ERR_INVALID).
 *
 * Segment layout (little-endian, offsets in bytes, all page aligned):
 *
 *   [0, 4096)                 zs_shm_header_t, rest zero
 *   [table_off, grad_off)     nchunks x 2 zs_shm_slot_t (64 B each):
 *                             slot 2k = GRAD of chunk k, 2k+1 = PARAM of chunk k
 *   [grad_off, param_off)     nchunks x chunk_stride bytes: gradient payloads
 *   [param_off, total_bytes)  nchunks x chunk_stride bytes: parameter payloads
 *
 * chunk_stride = chunk_elems x 4 rounded up to 4096: any dtype fits. Chunk k
 * covers the flat elements [range_begin + k*chunk_elems, + chunk_elems),
 * clipped to the range's end; element e of a published sub-range lies at
 * payload(k) + (e - window_begin(k)) x sizeof(dtype).
 *
 * Memory ordering (C11 atomics; identical in every process mapping it):
 *   - The header is written once by the creator before the fd is sent and
 *     never read back from the mapping by the server: zs_shm_map reads it
 *     with pread, validates it, and keeps a private copy.
 *   - A slot's fields are _Atomic. The writer stores the payload (plain
 *     stores) and the metadata (relaxed), then the state word with RELEASE.
 *     The reader loads the state with ACQUIRE; if it shows "ready at step
 *     s", the payload and metadata of that publication are visible.
 *   - zs_shm_claim stores state 0 (relaxed) followed by a seq_cst fence, so
 *     that a reader cannot see the old "ready" after seeing new payload
 *     bytes (the fence is a full barrier on x86-64 and ARMv8).
 *   - zs_shm_verify loads the state again (ACQUIRE, after an acquire fence)
 *     once it has hashed the payload; a different value means the writer
 *     claimed or republished meanwhile, and the chunk is refused.
 *   - Ownership, which the integration must keep: a slot's payload belongs
 *     to its writer until publish and to its reader from publish until the
 *     reader is done (for GRAD: the server's PARAM publication of the same
 *     chunk and step; for PARAM: the worker's next GRAD staging). Payload
 *     bytes are plain memory: a peer breaking the rule races with us (a C11
 *     data race across processes); the consequence is bounded to wrong
 *     numbers in that peer's own range, and is refused by the checksum or
 *     the state re-check with high probability. It never causes an access
 *     outside the segment: every offset is computed from the private header
 *     copy and validated slot metadata read once.
 *
 * Waking. The state word is a futex (shared, not FUTEX_PRIVATE: the
 * processes differ). Publish wakes all waiters; a waiter sleeps in
 * FUTEX_WAIT, no busy polling. Peer death: with a peer registered by
 * zs_shm_watch_peer, the wait sleeps in slices of at most
 * ZS_SHM_WAIT_SLICE_MS and after each slice that timed out checks the peer
 * through a pidfd (pidfd_open at registration; a poll on it reports the
 * exit, immune to pid reuse), so a dead peer is reported within one slice
 * (ZS_ERR_UNAVAILABLE) instead of at the timeout. Without a peer, one sleep
 * to the deadline: only a publish wakes it.
 *
 * Checksums. XXH3-64 of the payload, seeded with a hash of the slot's
 * metadata (generation, direction, chunk, step, dtype, begin, count): a
 * payload moved to another chunk, step or session does not verify.
 *
 * Threads. Calls on different chunks may run concurrently on one handle
 * (the optimizer's pool); calls on the same chunk and side must not
 * overlap. zs_shm_watch_peer and zs_shm_destroy run alone.
 *
 * Cleanup. The segment is a memfd: no name in any filesystem. It lives as
 * long as an fd or a mapping of it does, and both end with their process,
 * whatever way it exits.
 */
#ifndef ZS_SHM_H
#define ZS_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "zs_status.h"

#define ZS_SHM_MAGIC           0x31304d48532d535aull /* the bytes "ZS-SHM01" read little-endian */
#define ZS_SHM_VERSION         1u
#define ZS_SHM_HEADER_BYTES    4096u
#define ZS_SHM_SLOT_BYTES      64u
#define ZS_SHM_MAX_CHUNKS      (1u << 24)
#define ZS_SHM_MAX_CHUNK_ELEMS (1u << 22)         /* 16 MiB of fp32 per chunk */
#define ZS_SHM_STEP_MAX        ((1ull << 53) - 1) /* = ZS_STEP_MAX (proto/zs_rpc.h) */
#define ZS_SHM_WAIT_SLICE_MS   100

/* Directions; also the slot index parity in the chunk table. */
typedef enum {
    ZS_SHM_GRAD = 0,  /* gradients, written by the worker, read by the server */
    ZS_SHM_PARAM = 1, /* parameters, written by the server, read by the worker */
} zs_shm_dir_t;

/* The segment's first bytes, as written by the creator. 128 bytes used of
 * ZS_SHM_HEADER_BYTES; the rest is zero. */
typedef struct zs_shm_header {
    uint64_t magic;        /* ZS_SHM_MAGIC */
    uint32_t version;      /* ZS_SHM_VERSION */
    uint32_t header_bytes; /* ZS_SHM_HEADER_BYTES */
    uint64_t total_bytes;  /* the whole segment; must equal the fd's size */
    uint64_t generation;   /* random per segment, never 0: a session id */
    uint32_t owner_pid;    /* creator's pid in its own namespace: diagnostics only */
    uint32_t owner_uid;    /* creator's uid: diagnostics only (proof: SO_PEERCRED) */
    uint64_t range_begin;  /* first flat element of the server's range */
    uint64_t range_count;  /* elements in the range, > 0 */
    uint32_t chunk_elems;  /* elements per chunk (the last may be shorter) */
    uint32_t nchunks;      /* ceil(range_count / chunk_elems) */
    uint64_t chunk_stride; /* bytes per chunk's payload, chunk_elems*4 page-rounded */
    uint64_t table_off;    /* = ZS_SHM_HEADER_BYTES */
    uint64_t grad_off;     /* after the chunk table, page-rounded */
    uint64_t param_off;    /* grad_off + nchunks * chunk_stride */
    uint8_t reserved[32];  /* zero */
} zs_shm_header_t;

/* One direction of one chunk: 64 bytes, one cache line. Written only by the
 * direction's writer. state: 0 = not ready (never published, or claimed for
 * rewriting); ((step & 0x7fffffff) << 1) | 1 = ready at step. */
typedef struct zs_shm_slot {
    _Atomic uint32_t state;      /* futex word; RELEASE by the writer, ACQUIRE by readers */
    _Atomic uint32_t dtype;      /* zs_dtype_t of the payload */
    _Atomic uint64_t step;       /* the full step the state's low bits abbreviate */
    _Atomic uint64_t generation; /* the header's generation at publish */
    _Atomic uint64_t elem_begin; /* first flat element, within the chunk's window */
    _Atomic uint64_t elem_count; /* elements, >= 1 */
    _Atomic uint64_t xxh3;       /* XXH3-64 of the payload, seeded with the metadata */
    uint64_t reserved[2];
} zs_shm_slot_t;

/* A verified chunk, as zs_shm_verify reports it. */
typedef struct zs_shm_chunk {
    void *data; /* first element, inside the segment */
    uint64_t step;
    int dtype;           /* zs_dtype_t */
    uint64_t elem_begin; /* flat index of data[0] */
    uint64_t elem_count;
    size_t bytes; /* elem_count * sizeof(dtype) */
} zs_shm_chunk_t;

typedef struct zs_shm zs_shm_t;

/* Worker side: create a sealed memfd segment for the server range
 * [range_begin, range_begin + range_count) in chunks of chunk_elems
 * (1..ZS_SHM_MAX_CHUNK_ELEMS) elements, map it (MAP_SHARED) and write its
 * header. The fd is close-on-exec and sealed against shrinking, growing and
 * further seals, so the server can map it without fear of SIGBUS. Every slot
 * starts not ready. ZS_ERR_RANGE for sizes outside the limits or that
 * overflow, ZS_ERR_IO / ZS_ERR_NOMEM for the OS. */
int zs_shm_create(uint64_t range_begin, uint64_t range_count, uint32_t chunk_elems, zs_shm_t **out,
                  zs_err_t *err);

/* Server side: validate and map the segment behind fd (the caller keeps its
 * fd; the handle holds a dup). Checks, before mapping: fd is a regular file
 * of at least one header and at most max_bytes; header magic, version, and
 * geometry (recomputed from range and chunk_elems; every offset must match);
 * header total_bytes == the fd's size; seals include SHRINK, GROW and SEAL
 * but neither WRITE nor FUTURE_WRITE (a memfd the peer cannot resize nor
 * make read-only). ZS_ERR_CORRUPT (magic, version, geometry), ZS_ERR_RANGE
 * (sizes), ZS_ERR_INVALID (not a sealed memfd), ZS_ERR_IO. */
int zs_shm_map(int fd, uint64_t max_bytes, zs_shm_t **out, zs_err_t *err);

/* Unmap, close the handle's fds (segment, pidfd) and free. NULL is a no-op. */
void zs_shm_destroy(zs_shm_t *shm);

/* The segment's fd (the worker sends it), mapping, size and validated header
 * (a private copy; never the mapping). */
int zs_shm_fd(const zs_shm_t *shm);
void *zs_shm_base(const zs_shm_t *shm);
size_t zs_shm_size(const zs_shm_t *shm);
const zs_shm_header_t *zs_shm_header(const zs_shm_t *shm);

/* Chunk k's window in the flat space: [*begin, *begin + *count). ZS_ERR_RANGE
 * if k >= nchunks. */
int zs_shm_window(const zs_shm_t *shm, uint32_t k, uint64_t *begin, uint64_t *count, zs_err_t *err);

/* Start of chunk k's payload area for dir (chunk_stride bytes); NULL when k
 * or dir is out of range. The writer fills it between claim and publish. */
void *zs_shm_payload(const zs_shm_t *shm, int dir, uint32_t k);

/* Writer: mark slot (dir, k) not ready before rewriting its payload (state 0,
 * then a full fence). Wakes nobody. ZS_ERR_INVALID for the other side's
 * direction, ZS_ERR_RANGE for k. */
int zs_shm_claim(zs_shm_t *shm, int dir, uint32_t k, zs_err_t *err);

/* Writer: publish "chunk k of step `step` is staged": elem_count elements of
 * dtype starting at flat element elem_begin (inside chunk k's window) lie at
 * their place in the payload area. Hashes the payload, stores the metadata,
 * RELEASE-stores the state, FUTEX_WAKEs every waiter. Refused with nothing
 * written: the other side's direction or a bad dtype (ZS_ERR_INVALID), k or
 * the elements outside the chunk (ZS_ERR_RANGE), step above
 * ZS_SHM_STEP_MAX or below the step this handle last published on the slot
 * (ZS_ERR_STATE: steps only move forward; the same step may be republished,
 * as a re-push overwrites). */
int zs_shm_publish(zs_shm_t *shm, int dir, uint32_t k, uint64_t step, int dtype,
                   uint64_t elem_begin, uint64_t elem_count, zs_err_t *err);

/* Reader: wait until slot (dir, k) is ready at `step`, at most timeout_ms
 * (< 0: forever, in slices). Sleeps in FUTEX_WAIT. ZS_OK when ready (then
 * call zs_shm_verify); ZS_ERR_TIMEOUT; ZS_ERR_STATE when the slot already
 * holds a later step (the wanted one was overwritten: out of sequence);
 * ZS_ERR_UNAVAILABLE when the watched peer has exited; ZS_ERR_RANGE for k. */
int zs_shm_wait(zs_shm_t *shm, int dir, uint32_t k, uint64_t step, int timeout_ms, zs_err_t *err);

/* Reader: check slot (dir, k) before using it in place: ready, of this
 * segment's generation, at exactly `step` (else ZS_ERR_STATE, saying which
 * step it holds), a known dtype (ZS_ERR_INVALID), elements inside chunk k's
 * window (ZS_ERR_RANGE, checked before the payload is touched), the
 * checksum (ZS_ERR_CORRUPT), and unchanged state after hashing (ZS_ERR_STATE:
 * rewritten meanwhile). Reads each metadata field once. On ZS_OK *out
 * describes the payload in place. */
int zs_shm_verify(zs_shm_t *shm, int dir, uint32_t k, uint64_t step, zs_shm_chunk_t *out,
                  zs_err_t *err);

/* Register the peer process (its pid as SO_PEERCRED reports it, in our pid
 * namespace) so that waits end when it exits. Opens a pidfd; a pid that no
 * longer exists is ZS_ERR_UNAVAILABLE. Replaces an earlier peer. */
int zs_shm_watch_peer(zs_shm_t *shm, pid_t pid, zs_err_t *err);

/* 1 while the watched peer runs (or none is watched), 0 once it has exited. */
int zs_shm_peer_alive(const zs_shm_t *shm);

#endif
