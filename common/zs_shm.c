/*
 * zs_shm.c - the shared segment of a co-located worker and server (see
 * zs_shm.h for the layout, the roles and the memory ordering).
 *
 * Linux only: memfd_create with seals, futex, pidfd_open. What this file
 * does not do: pass the fd (zs_shm_sock.c), know what step is expected.
 */
#define _GNU_SOURCE /* memfd_create, fallocate, accept4, struct ucred */
#include "zs_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "zs_dtype.h"
#include "zs_hash.h"

_Static_assert(sizeof(zs_shm_header_t) == 128, "zs_shm_header_t is 128 bytes on the wire");
_Static_assert(sizeof(zs_shm_slot_t) == ZS_SHM_SLOT_BYTES, "a slot is one 64-byte line");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "slot atomics must be lock-free to be shared between processes");

#define PAGE 4096u

/* The whole segment at most 2^46 bytes (64 TiB): far above any host, low
 * enough that no offset computation can overflow. */
#define SEG_MAX (1ull << 46)

struct zs_shm {
    int fd;              /* the memfd (ours: created, or a dup of the received one) */
    int writes;          /* the direction this side writes: GRAD (creator) or PARAM */
    unsigned char *base; /* mapping of hdr.total_bytes bytes */
    zs_shm_header_t hdr; /* private, validated copy: every offset comes from here */
    uint64_t *last_pub;  /* per chunk: 1 + last step this handle published, 0 = none */
    int pidfd;           /* watched peer, -1 = none */
    pid_t peer_pid;      /* 0 = none */
};

static uint64_t round_page(uint64_t n)
{
    return (n + PAGE - 1) / PAGE * PAGE;
}

/* Fill h's geometry (everything but magic, version, identity) from the
 * range and chunk size, with every product checked. */
static int layout(uint64_t begin, uint64_t count, uint32_t chunk_elems, zs_shm_header_t *h,
                  zs_err_t *err)
{
    uint64_t end, table, area, grad_off, param_off, total;
    if (count == 0 || chunk_elems == 0 || chunk_elems > ZS_SHM_MAX_CHUNK_ELEMS)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "segment geometry: %" PRIu64 " elements in chunks of %u (need >= 1 "
                          "element and 1..%u per chunk)",
                          count, chunk_elems, ZS_SHM_MAX_CHUNK_ELEMS);
    if (__builtin_add_overflow(begin, count, &end) || end > (1ull << 62))
        return zs_err_set(err, ZS_ERR_RANGE,
                          "segment geometry: range [%" PRIu64 ", +%" PRIu64 ") ends beyond 2^62",
                          begin, count);
    uint64_t nchunks = (count - 1) / chunk_elems + 1;
    if (nchunks > ZS_SHM_MAX_CHUNKS)
        return zs_err_set(err, ZS_ERR_RANGE, "segment geometry: %" PRIu64 " chunks, at most %u",
                          nchunks, ZS_SHM_MAX_CHUNKS);
    uint64_t stride = round_page((uint64_t)chunk_elems * 4);
    table = nchunks * 2 * ZS_SHM_SLOT_BYTES; /* <= 2^24 * 128: no overflow */
    grad_off = round_page(ZS_SHM_HEADER_BYTES + table);
    if (__builtin_mul_overflow(nchunks, stride, &area) ||
        __builtin_add_overflow(grad_off, area, &param_off) ||
        __builtin_add_overflow(param_off, area, &total) || total > SEG_MAX)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "segment geometry: %" PRIu64 " chunks of %" PRIu64
                          " bytes exceed 2^46 bytes",
                          nchunks, stride);
    h->header_bytes = ZS_SHM_HEADER_BYTES;
    h->range_begin = begin;
    h->range_count = count;
    h->chunk_elems = chunk_elems;
    h->nchunks = (uint32_t)nchunks;
    h->chunk_stride = stride;
    h->table_off = ZS_SHM_HEADER_BYTES;
    h->grad_off = grad_off;
    h->param_off = param_off;
    h->total_bytes = total;
    return ZS_OK;
}

static zs_shm_slot_t *slot_of(const zs_shm_t *shm, int dir, uint32_t k)
{
    return (zs_shm_slot_t *)(shm->base + shm->hdr.table_off +
                             ((uint64_t)k * 2 + (uint64_t)dir) * ZS_SHM_SLOT_BYTES);
}

static uint32_t state_ready(uint64_t step)
{
    return ((uint32_t)(step & 0x7fffffffu) << 1) | 1u;
}

static const char *dir_name(int dir)
{
    return dir == ZS_SHM_GRAD ? "gradient" : "parameter";
}

/* Common argument checks: dir is GRAD or PARAM, k < nchunks. */
static int check_dir_k(const zs_shm_t *shm, int dir, uint32_t k, zs_err_t *err)
{
    if (dir != ZS_SHM_GRAD && dir != ZS_SHM_PARAM)
        return zs_err_set(err, ZS_ERR_INVALID, "shm: direction %d is neither GRAD nor PARAM", dir);
    if (k >= shm->hdr.nchunks)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "shm: chunk %u out of range (the segment has %u chunks)", k,
                          shm->hdr.nchunks);
    return ZS_OK;
}

static void window_of(const zs_shm_t *shm, uint32_t k, uint64_t *begin, uint64_t *count)
{
    uint64_t off = (uint64_t)k * shm->hdr.chunk_elems;
    uint64_t left = shm->hdr.range_count - off;
    *begin = shm->hdr.range_begin + off;
    *count = left < shm->hdr.chunk_elems ? left : shm->hdr.chunk_elems;
}

/* [elem_begin, +elem_count) inside chunk k's window, without overflow. */
static int check_elems(const zs_shm_t *shm, uint32_t k, uint64_t elem_begin, uint64_t elem_count,
                       zs_err_t *err)
{
    uint64_t wb, wc;
    window_of(shm, k, &wb, &wc);
    if (elem_count == 0 || elem_begin < wb || elem_begin - wb > wc ||
        elem_count > wc - (elem_begin - wb))
        return zs_err_set(err, ZS_ERR_RANGE,
                          "shm: elements [%" PRIu64 ", +%" PRIu64 ") out of range for chunk %u "
                          "(its window is [%" PRIu64 ", %" PRIu64 "))",
                          elem_begin, elem_count, k, wb, wb + wc);
    return ZS_OK;
}

/* XXH3-64 of the payload, seeded with a hash of everything that says what
 * the payload is, so a payload left from another chunk, step, dtype or
 * session does not verify. */
static uint64_t chunk_hash(uint64_t generation, int dir, uint32_t k, uint64_t step, int dtype,
                           uint64_t elem_begin, uint64_t elem_count, const void *p, size_t bytes)
{
    uint64_t meta[7] = {generation,      (uint64_t)dir, k,         step,
                        (uint64_t)dtype, elem_begin,    elem_count};
    return zs_hash64(p, bytes, XXH3_64bits(meta, sizeof meta));
}

static void *payload_at(const zs_shm_t *shm, int dir, uint32_t k, uint64_t elem_begin, int dtype)
{
    uint64_t wb, wc;
    window_of(shm, k, &wb, &wc);
    uint64_t area = dir == ZS_SHM_GRAD ? shm->hdr.grad_off : shm->hdr.param_off;
    return shm->base + area + (uint64_t)k * shm->hdr.chunk_stride +
           (elem_begin - wb) * zs_dtype_size(dtype);
}

static int futex_wait(_Atomic uint32_t *word, uint32_t val, const struct timespec *rel)
{
    /* Shared futex (not FUTEX_PRIVATE_FLAG): the peer is another process. */
    return (int)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, rel, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Map the handle's fd (bytes, shared, read-write) at shm->base. */
static int map_shared(zs_shm_t *shm, uint64_t bytes, zs_err_t *err)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm->fd, 0);
    if (p == MAP_FAILED)
        return zs_err_set(err, ZS_ERR_NOMEM, "shm: mmap of %" PRIu64 " bytes: %s", bytes,
                          strerror(errno));
    shm->base = p;
    return ZS_OK;
}

/* Allocate the private part of a handle for a validated header. */
static zs_shm_t *handle_new(const zs_shm_header_t *h, zs_err_t *err)
{
    zs_shm_t *shm = calloc(1, sizeof *shm);
    uint64_t *last = calloc(h->nchunks, sizeof *last); /* nchunks validated <= 2^24 */
    if (!shm || !last) {
        free(shm);
        free(last);
        zs_err_set(err, ZS_ERR_NOMEM, "shm: out of memory for a %u-chunk handle", h->nchunks);
        return NULL;
    }
    shm->hdr = *h;
    shm->last_pub = last;
    shm->fd = -1;
    shm->pidfd = -1;
    return shm;
}

int zs_shm_create(uint64_t range_begin, uint64_t range_count, uint32_t chunk_elems, zs_shm_t **out,
                  zs_err_t *err)
{
    *out = NULL;
    zs_shm_header_t h;
    memset(&h, 0, sizeof h);
    int rc = layout(range_begin, range_count, chunk_elems, &h, err);
    if (rc)
        return rc;
    h.magic = ZS_SHM_MAGIC;
    h.version = ZS_SHM_VERSION;
    h.owner_pid = (uint32_t)getpid();
    h.owner_uid = (uint32_t)geteuid();
    while (h.generation == 0)
        if (getrandom(&h.generation, sizeof h.generation, 0) != (ssize_t)sizeof h.generation)
            return zs_err_set(err, ZS_ERR_IO, "shm: getrandom: %s", strerror(errno));
    zs_shm_t *shm = handle_new(&h, err);
    if (!shm)
        return err ? err->code : ZS_ERR_NOMEM;
    shm->writes = ZS_SHM_GRAD;
    shm->fd = memfd_create("zs-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (shm->fd < 0) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm: memfd_create: %s", strerror(errno));
        goto fail;
    }
    /* fallocate: a shortage of memory is an error now, not a SIGBUS on
     * first touch in the middle of a step. */
    if (ftruncate(shm->fd, (off_t)h.total_bytes) != 0 ||
        fallocate(shm->fd, 0, 0, (off_t)h.total_bytes) != 0) {
        rc = zs_err_set(err, errno == ENOSPC || errno == ENOMEM ? ZS_ERR_NOMEM : ZS_ERR_IO,
                        "shm: reserving %" PRIu64 " bytes of shared memory: %s", h.total_bytes,
                        strerror(errno));
        goto fail;
    }
    if (fcntl(shm->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm: sealing the memfd: %s", strerror(errno));
        goto fail;
    }
    if ((rc = map_shared(shm, h.total_bytes, err)) != ZS_OK)
        goto fail;
    /* The memfd is zero-filled: every slot's state is 0 (not ready). */
    memcpy(shm->base, &h, sizeof h);
    *out = shm;
    return ZS_OK;
fail:
    zs_shm_destroy(shm);
    return rc;
}

/* The checks zs_shm_map makes on the fd, before any mapping (see zs_shm.h). */
static int validate_fd(int fd, uint64_t max_bytes, zs_shm_header_t *h, zs_err_t *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return zs_err_set(err, ZS_ERR_IO, "shm: fstat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return zs_err_set(err, ZS_ERR_INVALID, "shm: the fd is not a memfd (file mode 0%o)",
                          (unsigned)st.st_mode);
    uint64_t size = (uint64_t)st.st_size;
    if (size < ZS_SHM_HEADER_BYTES)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "shm: segment is %" PRIu64 " bytes, smaller than its %u-byte header",
                          size, ZS_SHM_HEADER_BYTES);
    if (size > max_bytes)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "shm: segment is %" PRIu64 " bytes, more than the %" PRIu64 " allowed",
                          size, max_bytes);
    ssize_t n = pread(fd, h, sizeof *h, 0);
    if (n != (ssize_t)sizeof *h)
        return zs_err_set(err, ZS_ERR_IO, "shm: reading the header: %s",
                          n < 0 ? strerror(errno) : "short read");
    if (h->magic != ZS_SHM_MAGIC)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "shm: bad magic 0x%016" PRIx64 ": not a zeroshard segment", h->magic);
    if (h->version != ZS_SHM_VERSION)
        return zs_err_set(err, ZS_ERR_CORRUPT, "shm: segment version %u, this build speaks %u",
                          h->version, ZS_SHM_VERSION);
    zs_shm_header_t want = *h;
    zs_err_t lerr;
    if (layout(h->range_begin, h->range_count, h->chunk_elems, &want, &lerr) != ZS_OK)
        return zs_err_set(err, ZS_ERR_CORRUPT, "shm: header: %s", lerr.msg);
    if (memcmp(&want, h, sizeof want) != 0)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "shm: header geometry is inconsistent (nchunks %u, stride %" PRIu64
                          ", offsets %" PRIu64 "/%" PRIu64 "/%" PRIu64 ", total %" PRIu64
                          "; expected %u, %" PRIu64 ", %" PRIu64 "/%" PRIu64 "/%" PRIu64
                          ", %" PRIu64 ")",
                          h->nchunks, h->chunk_stride, h->table_off, h->grad_off, h->param_off,
                          h->total_bytes, want.nchunks, want.chunk_stride, want.table_off,
                          want.grad_off, want.param_off, want.total_bytes);
    if (h->total_bytes != size)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "shm: segment is %" PRIu64 " bytes, its header says %" PRIu64, size,
                          h->total_bytes);
    if (h->generation == 0)
        return zs_err_set(err, ZS_ERR_CORRUPT, "shm: header generation is 0");
    for (size_t i = 0; i < sizeof h->reserved; i++)
        if (h->reserved[i])
            return zs_err_set(err, ZS_ERR_CORRUPT, "shm: header reserved byte %zu is not zero", i);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return zs_err_set(err, ZS_ERR_INVALID, "shm: the fd is not a memfd (F_GET_SEALS: %s)",
                          strerror(errno));
    int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if ((seals & need) != need || (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "shm: the fd is not a properly sealed memfd (seals 0x%x): it must "
                          "be sealed against shrinking, growing and new seals (0x%x) and stay "
                          "writable",
                          (unsigned)seals, (unsigned)need);
    return ZS_OK;
}

int zs_shm_map(int fd, uint64_t max_bytes, zs_shm_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_shm_header_t h;
    int rc = validate_fd(fd, max_bytes, &h, err);
    if (rc)
        return rc;
    zs_shm_t *shm = handle_new(&h, err);
    if (!shm)
        return err ? err->code : ZS_ERR_NOMEM;
    shm->writes = ZS_SHM_PARAM;
    shm->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (shm->fd < 0) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm: dup of the segment fd: %s", strerror(errno));
        goto fail;
    }
    if ((rc = map_shared(shm, h.total_bytes, err)) != ZS_OK)
        goto fail;
    /* last_pub stays 0: a server starting on a worker's segment publishes
     * whatever step its bookkeeping says, and may not go back from there. */
    *out = shm;
    return ZS_OK;
fail:
    zs_shm_destroy(shm);
    return rc;
}

void zs_shm_destroy(zs_shm_t *shm)
{
    if (!shm)
        return;
    if (shm->base)
        munmap(shm->base, shm->hdr.total_bytes);
    if (shm->fd >= 0)
        close(shm->fd);
    if (shm->pidfd >= 0)
        close(shm->pidfd);
    free(shm->last_pub);
    free(shm);
}

int zs_shm_fd(const zs_shm_t *shm)
{
    return shm->fd;
}

void *zs_shm_base(const zs_shm_t *shm)
{
    return shm->base;
}

size_t zs_shm_size(const zs_shm_t *shm)
{
    return (size_t)shm->hdr.total_bytes;
}

const zs_shm_header_t *zs_shm_header(const zs_shm_t *shm)
{
    return &shm->hdr;
}

int zs_shm_window(const zs_shm_t *shm, uint32_t k, uint64_t *begin, uint64_t *count, zs_err_t *err)
{
    int rc = check_dir_k(shm, ZS_SHM_GRAD, k, err);
    if (rc)
        return rc;
    window_of(shm, k, begin, count);
    return ZS_OK;
}

void *zs_shm_payload(const zs_shm_t *shm, int dir, uint32_t k)
{
    if (check_dir_k(shm, dir, k, NULL) != ZS_OK)
        return NULL;
    uint64_t area = dir == ZS_SHM_GRAD ? shm->hdr.grad_off : shm->hdr.param_off;
    return shm->base + area + (uint64_t)k * shm->hdr.chunk_stride;
}

static int check_writer(const zs_shm_t *shm, int dir, uint32_t k, zs_err_t *err)
{
    int rc = check_dir_k(shm, dir, k, err);
    if (rc)
        return rc;
    if (dir != shm->writes)
        return zs_err_set(err, ZS_ERR_INVALID, "shm: the %s side does not write %s chunks",
                          shm->writes == ZS_SHM_GRAD ? "worker" : "server", dir_name(dir));
    return ZS_OK;
}

int zs_shm_claim(zs_shm_t *shm, int dir, uint32_t k, zs_err_t *err)
{
    int rc = check_writer(shm, dir, k, err);
    if (rc)
        return rc;
    atomic_store_explicit(&slot_of(shm, dir, k)->state, 0, memory_order_relaxed);
    /* Orders the store above before the payload writes that follow (see
     * zs_shm.h): relaxed + seq_cst fence = a full barrier on x86-64/ARMv8. */
    atomic_thread_fence(memory_order_seq_cst);
    return ZS_OK;
}

int zs_shm_publish(zs_shm_t *shm, int dir, uint32_t k, uint64_t step, int dtype,
                   uint64_t elem_begin, uint64_t elem_count, zs_err_t *err)
{
    int rc = check_writer(shm, dir, k, err);
    if (rc)
        return rc;
    if (dtype != ZS_DTYPE_F32 && dtype != ZS_DTYPE_BF16 && dtype != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "shm: chunk %u: dtype %d is not fp32/bf16/fp16", k,
                          dtype);
    rc = check_elems(shm, k, elem_begin, elem_count, err);
    if (rc)
        return rc;
    if (step > ZS_SHM_STEP_MAX)
        return zs_err_set(err, ZS_ERR_STATE, "shm: step %" PRIu64 " is above the largest step",
                          step);
    if (shm->last_pub[k] && step < shm->last_pub[k] - 1)
        return zs_err_set(err, ZS_ERR_STATE,
                          "shm: %s chunk %u: step %" PRIu64 " out of sequence (step %" PRIu64
                          " was published)",
                          dir_name(dir), k, step, shm->last_pub[k] - 1);
    size_t bytes = (size_t)elem_count * zs_dtype_size(dtype);
    const void *p = payload_at(shm, dir, k, elem_begin, dtype);
    uint64_t h =
        chunk_hash(shm->hdr.generation, dir, k, step, dtype, elem_begin, elem_count, p, bytes);
    zs_shm_slot_t *s = slot_of(shm, dir, k);
    atomic_store_explicit(&s->dtype, (uint32_t)dtype, memory_order_relaxed);
    atomic_store_explicit(&s->step, step, memory_order_relaxed);
    atomic_store_explicit(&s->generation, shm->hdr.generation, memory_order_relaxed);
    atomic_store_explicit(&s->elem_begin, elem_begin, memory_order_relaxed);
    atomic_store_explicit(&s->elem_count, elem_count, memory_order_relaxed);
    atomic_store_explicit(&s->xxh3, h, memory_order_relaxed);
    /* RELEASE: the payload and the fields above happen-before any ACQUIRE
     * load that reads this value. */
    atomic_store_explicit(&s->state, state_ready(step), memory_order_release);
    futex_wake_all(&s->state);
    shm->last_pub[k] = step + 1;
    return ZS_OK;
}

int zs_shm_wait(zs_shm_t *shm, int dir, uint32_t k, uint64_t step, int timeout_ms, zs_err_t *err)
{
    int rc = check_dir_k(shm, dir, k, err);
    if (rc)
        return rc;
    zs_shm_slot_t *s = slot_of(shm, dir, k);
    uint32_t want = state_ready(step);
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
    for (;;) {
        uint32_t v = atomic_load_explicit(&s->state, memory_order_acquire);
        if (v & 1u) {
            uint64_t got = atomic_load_explicit(&s->step, memory_order_relaxed);
            if (v == want && got == step)
                return ZS_OK;
            if (got > step)
                return zs_err_set(err, ZS_ERR_STATE,
                                  "shm: %s chunk %u holds step %" PRIu64
                                  ", past the awaited step %" PRIu64 " (out of sequence)",
                                  dir_name(dir), k, got, step);
        }
        /* One sleep to the deadline, or slices when there is a peer to
         * check between them (none watched: only a publish wakes us). */
        int64_t slice = shm->peer_pid > 0 ? ZS_SHM_WAIT_SLICE_MS : 3600 * 1000;
        int64_t left = deadline == INT64_MAX ? slice : deadline - now_ms();
        if (left <= 0)
            return zs_err_set(err, ZS_ERR_TIMEOUT,
                              "shm: %s chunk %u of step %" PRIu64 " not ready after %d ms",
                              dir_name(dir), k, step, timeout_ms);
        if (left > slice)
            left = slice;
        struct timespec rel = {.tv_sec = left / 1000, .tv_nsec = (left % 1000) * 1000000};
        /* Returns at once (EAGAIN) if the state is no longer v: no lost
         * wake-up between the load above and the sleep. */
        if (futex_wait(&s->state, v, &rel) != 0 && errno == ETIMEDOUT && !zs_shm_peer_alive(shm))
            return zs_err_set(err, ZS_ERR_UNAVAILABLE,
                              "shm: the peer (pid %d) exited while %s chunk %u of step %" PRIu64
                              " was awaited",
                              (int)shm->peer_pid, dir_name(dir), k, step);
    }
}

int zs_shm_verify(zs_shm_t *shm, int dir, uint32_t k, uint64_t step, zs_shm_chunk_t *out,
                  zs_err_t *err)
{
    int rc = check_dir_k(shm, dir, k, err);
    if (rc)
        return rc;
    zs_shm_slot_t *s = slot_of(shm, dir, k);
    uint32_t v = atomic_load_explicit(&s->state, memory_order_acquire);
    if (!(v & 1u))
        return zs_err_set(err, ZS_ERR_STATE, "shm: %s chunk %u is not staged", dir_name(dir), k);
    /* Each field read once into a local; only the locals are used. */
    uint32_t dtype = atomic_load_explicit(&s->dtype, memory_order_relaxed);
    uint64_t got = atomic_load_explicit(&s->step, memory_order_relaxed);
    uint64_t gen = atomic_load_explicit(&s->generation, memory_order_relaxed);
    uint64_t eb = atomic_load_explicit(&s->elem_begin, memory_order_relaxed);
    uint64_t ec = atomic_load_explicit(&s->elem_count, memory_order_relaxed);
    uint64_t sum = atomic_load_explicit(&s->xxh3, memory_order_relaxed);
    if (gen != shm->hdr.generation)
        return zs_err_set(err, ZS_ERR_STATE,
                          "shm: %s chunk %u was published in another session (generation "
                          "%016" PRIx64 ", segment %016" PRIx64 ")",
                          dir_name(dir), k, gen, shm->hdr.generation);
    if (got != step)
        return zs_err_set(err, ZS_ERR_STATE,
                          "shm: %s chunk %u holds step %" PRIu64 ", expected step %" PRIu64 " (%s)",
                          dir_name(dir), k, got, step, got < step ? "stale" : "out of sequence");
    if (v != state_ready(got))
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "shm: %s chunk %u: state word 0x%08x does not match step %" PRIu64,
                          dir_name(dir), k, v, got);
    if (dtype != ZS_DTYPE_F32 && dtype != ZS_DTYPE_BF16 && dtype != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "shm: %s chunk %u: dtype %u is not fp32/bf16/fp16",
                          dir_name(dir), k, dtype);
    rc = check_elems(shm, k, eb, ec, err);
    if (rc)
        return rc;
    size_t bytes = (size_t)ec * zs_dtype_size((int)dtype);
    void *p = payload_at(shm, dir, k, eb, (int)dtype);
    uint64_t h = chunk_hash(shm->hdr.generation, dir, k, got, (int)dtype, eb, ec, p, bytes);
    if (h != sum)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "shm: %s chunk %u of step %" PRIu64 ": checksum mismatch (payload "
                          "%016" PRIx64 ", published %016" PRIx64 ")",
                          dir_name(dir), k, got, h, sum);
    /* The payload reads above happen before this load (acquire fence): a
     * claim or republish that overlapped the hash shows up as a change. */
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->state, memory_order_acquire) != v)
        return zs_err_set(err, ZS_ERR_STATE,
                          "shm: %s chunk %u was rewritten while it was being verified",
                          dir_name(dir), k);
    if (out) {
        out->data = p;
        out->step = got;
        out->dtype = (int)dtype;
        out->elem_begin = eb;
        out->elem_count = ec;
        out->bytes = bytes;
    }
    return ZS_OK;
}

int zs_shm_watch_peer(zs_shm_t *shm, pid_t pid, zs_err_t *err)
{
    if (pid <= 0)
        return zs_err_set(err, ZS_ERR_INVALID, "shm: peer pid %d is not a process", (int)pid);
    int fd = (int)syscall(SYS_pidfd_open, pid, 0); /* always close-on-exec */
    if (fd < 0 && errno != ENOSYS)
        return zs_err_set(err, errno == ESRCH ? ZS_ERR_UNAVAILABLE : ZS_ERR_IO,
                          "shm: watching peer pid %d: %s", (int)pid, strerror(errno));
    if (shm->pidfd >= 0)
        close(shm->pidfd);
    shm->pidfd = fd; /* -1 on a kernel before 5.3: zs_shm_peer_alive falls back to kill(0) */
    shm->peer_pid = pid;
    return ZS_OK;
}

int zs_shm_peer_alive(const zs_shm_t *shm)
{
    if (shm->peer_pid <= 0)
        return 1;
    if (shm->pidfd >= 0) {
        /* A pidfd polls readable once the process has exited (zombie or
         * reaped); the pid cannot be reused under it. */
        struct pollfd pfd = {.fd = shm->pidfd, .events = POLLIN};
        return poll(&pfd, 1, 0) == 0;
    }
    return kill(shm->peer_pid, 0) == 0 || errno == EPERM;
}
