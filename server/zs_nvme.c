/*
 * zs_nvme.c - the NVMe tier's directory, tile files and synchronous tile
 * I/O (see zs_nvme.h for the layout and the rules). The asynchronous pass
 * is zs_nvme_pass.c.
 *
 * Why io_uring (liburing) and not libaio: libaio is asynchronous only for
 * O_DIRECT files (a buffered file, --nvme-buffered, silently blocks in
 * io_submit), needs a syscall per submit and per reap, and is in
 * maintenance; io_uring is asynchronous for both, batches submissions and
 * completions through shared rings, and liburing is packaged everywhere we
 * build (Debian: liburing-dev). DeepNVMe's libaio choice predates it.
 *
 * Also here: the staged-gradient region of a state's file (zs_nvme.h,
 * "Staged gradients").
 *
 * Not here: the pass's pipeline, what the tensors mean, checkpoints.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>
#include <xxhash.h>

#include "zs_hash.h"
#include "zs_log.h"
#include "zs_nvme.h"

#define MAGIC        0x31454C4954535A7Aull /* "zZSTILE1" little-endian */
#define TMPFS_MAGIC_ 0x01021994L
#define RAMFS_MAGIC_ 0x858458f6L
#define LOCK_NAME    "zs-nvme.lock"
#define GLOCKS       64 /* striped locks of the gradient spans (tile c: c % GLOCKS) */

/* The header at the start of every slot: 8 little-endian u64. */
typedef struct {
    uint64_t magic, tile, seq, k, sum[3], hsum;
} hdr_t;

struct zs_nvme {
    char *dir;
    int buffered, depth, lock_fd;
    struct io_uring ring;
    int ring_ok;
    zs_nvme_buf_t *bufs;   /* depth of them, for the pass */
    unsigned char **gbufs; /* depth gradient spans (ZS_NVME_GSPAN), for the pass */
    _Atomic unsigned serial;
    long test_delay_ms; /* ZS_NVME_TEST_TILE_DELAY_MS: test hook, see zs_nvme.h */
    /* Totals since open (zs_nvme_totals): bytes, passes, nanoseconds. */
    _Atomic uint64_t rd_bytes, wr_bytes, grad_wr_bytes, passes, pass_ns, wait_ns;
};

struct zs_nvme_state {
    zs_nvme_t *nv;
    char *path;
    int fd;
    uint64_t n;
    size_t ntiles;
    unsigned char *cur; /* current slot of each tile */
    uint64_t *seq;      /* sequence of each tile's current contents; 0: never written */
    /* The gradient region (zs_nvme.h, "Staged gradients"): per parity and
     * tile, the step staged (0: none), its dtype and the span's XXH3; under
     * gmu[c % GLOCKS]. */
    uint64_t gbase;
    uint64_t *gstep[2], *gsum[2];
    unsigned char *gdt[2];
    pthread_mutex_t gmu[GLOCKS];
    int gmu_ok;
};

static int full_io(int fd, int wr, void *buf, size_t len, uint64_t off, const char *path,
                   zs_err_t *err);
static int sio(zs_nvme_state_t *s, int wr, void *buf, size_t len, uint64_t off, zs_err_t *err);

/* ---- buffers and headers -------------------------------------------------- */

void *zs_nvme_mem_alloc(size_t bytes)
{
    void *p =
        mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void zs_nvme_mem_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes ? bytes : 1);
}

int zs_nvme_buf_alloc(zs_nvme_buf_t *b, zs_err_t *err)
{
    b->mem = zs_nvme_mem_alloc(ZS_NVME_SLOT);
    if (!b->mem)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for a %u KiB tile buffer",
                          (unsigned)(ZS_NVME_SLOT >> 10));
    memset(b->mem, 0, ZS_NVME_HDR);
    for (int t = 0; t < 3; t++)
        b->t[t] = (float *)(b->mem + ZS_NVME_HDR + (size_t)t * ZS_NVME_SPAN);
    return ZS_OK;
}

void zs_nvme_buf_free(zs_nvme_buf_t *b)
{
    zs_nvme_mem_free(b->mem, ZS_NVME_SLOT);
    memset(b, 0, sizeof *b);
}

uint64_t zs__nvme_slot_off(size_t c, int slot)
{
    return ((uint64_t)c * 2 + (uint64_t)slot) * ZS_NVME_SLOT;
}

/* Seed of a tensor's checksum: where it belongs, so a tile written for
 * another place or time does not pass. */
static uint64_t seed(size_t c, uint64_t seq, int t)
{
    return ((uint64_t)c * 3 + (uint64_t)t) ^ (seq * 0x9E3779B97F4A7C15ull);
}

void zs__nvme_seal(zs_nvme_buf_t *b, size_t c, uint64_t seq, uint32_t k)
{
    hdr_t h = {MAGIC, c, seq, k, {0, 0, 0}, 0};
    for (int t = 0; t < 3; t++)
        h.sum[t] = zs_hash64(b->t[t], (size_t)k * 4, seed(c, seq, t));
    h.hsum = XXH3_64bits(&h, offsetof(hdr_t, hsum));
    memcpy(b->mem, &h, sizeof h);
}

static const char *const tname[3] = {"master", "exp_avg", "exp_avg_sq"};

int zs__nvme_check(const zs_nvme_state_t *s, const zs_nvme_buf_t *b, size_t c, unsigned mask,
                   zs_err_t *err)
{
    hdr_t h;
    memcpy(&h, b->mem, sizeof h);
    uint64_t k = zs_nvme_tile_len(s, c), a = (uint64_t)c * ZS_NVME_TILE;
    if (h.magic != MAGIC || h.hsum != XXH3_64bits(&h, offsetof(hdr_t, hsum)) || h.tile != c ||
        h.seq != s->seq[c] || h.k != k)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "nvme %s: tile %zu (elements [%llu, %llu) of the range) has a bad or "
                          "stale header (slot %d, want sequence %llu): torn or corrupted; not used",
                          s->path, c, (unsigned long long)a, (unsigned long long)(a + k), s->cur[c],
                          (unsigned long long)s->seq[c]);
    for (int t = 0; t < 3; t++)
        if ((mask >> t & 1) &&
            zs_hash64(b->t[t], (size_t)k * 4, seed(c, h.seq, t)) != h.sum[t])
            return zs_err_set(err, ZS_ERR_CORRUPT,
                              "nvme %s: tile %zu (elements [%llu, %llu) of the range): %s fails "
                              "its XXH3 checksum: torn or corrupted; not used",
                              s->path, c, (unsigned long long)a, (unsigned long long)(a + k),
                              tname[t]);
    return ZS_OK;
}

/* ---- the tier ------------------------------------------------------------- */

static int mkdir_p(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *q = p + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            if (mkdir(p, 0755) && errno != EEXIST)
                return -1;
            *q = '/';
        }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

/* Lock DIR for this process: another server's lock is ZS_ERR_EXISTS. */
static int lock_dir(zs_nvme_t *nv, zs_err_t *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, nv->dir);
    nv->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (nv->lock_fd < 0)
        return zs_err_set(err, ZS_ERR_IO, "nvme %s: cannot open %s: %s", nv->dir, path,
                          strerror(errno));
    if (flock(nv->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t r = pread(nv->lock_fd, pid, sizeof pid - 1, 0);
        pid[r > 0 ? r : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(nv->lock_fd);
        nv->lock_fd = -1;
        return zs_err_set(err, ZS_ERR_EXISTS,
                          "nvme %s is in use by another zs-server (pid %s): a tier's files are "
                          "never shared; give each server its own --nvme-path",
                          nv->dir, pid[0] ? pid : "unknown");
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(nv->lock_fd, 0) != 0 || pwrite(nv->lock_fd, pid, (size_t)len, 0) != len)
        ZS_WARN("nvme %s: cannot write the pid into %s", nv->dir, path);
    return ZS_OK;
}

/* Refuse a DIR whose "direct" I/O is RAM (tmpfs, ramfs) or that refuses
 * O_DIRECT, unless buffered. */
static int check_direct(zs_nvme_t *nv, zs_err_t *err)
{
    struct statfs fs;
    if (statfs(nv->dir, &fs) != 0)
        return zs_err_set(err, ZS_ERR_IO, "nvme %s: statfs: %s", nv->dir, strerror(errno));
    int ram = fs.f_type == TMPFS_MAGIC_ || fs.f_type == RAMFS_MAGIC_;
    if (ram && !nv->buffered)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "nvme %s is on %s: its files live in RAM, outside --mem-budget, and "
                          "it has no real direct I/O; use a directory on an NVMe drive, or "
                          "--nvme-buffered to use it anyway",
                          nv->dir, fs.f_type == TMPFS_MAGIC_ ? "tmpfs" : "ramfs");
    if (nv->buffered)
        return ZS_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/zs-nvme.probe", nv->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    int e = errno, ok = fd >= 0;
    if (ok) {
        void *b = aligned_alloc(ZS_NVME_ALIGN, ZS_NVME_ALIGN);
        if (b) {
            memset(b, 0, ZS_NVME_ALIGN);
            ok = pwrite(fd, b, ZS_NVME_ALIGN, 0) == (ssize_t)ZS_NVME_ALIGN;
            e = errno;
        }
        free(b);
        close(fd);
    }
    unlink(path);
    if (!ok)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "nvme %s does not support O_DIRECT (%s); use a directory on an NVMe "
                          "drive, or --nvme-buffered to go through the page cache",
                          nv->dir, strerror(e));
    return ZS_OK;
}

/* Tile files of a server that died: its state is in its checkpoints. */
static void remove_stale(zs_nvme_t *nv)
{
    DIR *d = opendir(nv->dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (strncmp(de->d_name, "state-", 6) || l < 12 || strcmp(de->d_name + l - 6, ".tiles"))
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", nv->dir, de->d_name);
        if (unlink(path) == 0)
            ZS_INFO("nvme %s: removed %s, left by a server that stopped (its state is in its "
                    "checkpoints)",
                    nv->dir, de->d_name);
    }
    closedir(d);
}

int zs_nvme_open(const zs_nvme_opts_t *o, zs_nvme_t **out, zs_err_t *err)
{
    *out = NULL;
    if (!o->dir || !o->dir[0])
        return zs_err_set(err, ZS_ERR_INVALID, "nvme: empty path");
    zs_nvme_t *nv = calloc(1, sizeof *nv);
    if (!nv)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    nv->dir = strdup(o->dir);
    nv->buffered = o->buffered;
    nv->depth = o->depth > 0 ? o->depth : ZS_NVME_DEPTH_DEFAULT;
    if (nv->depth < 3)
        nv->depth = 3; /* one read ahead, one updated, one written behind */
    nv->lock_fd = -1;
    int rc = ZS_OK;
    if (!nv->dir)
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    else if (mkdir_p(nv->dir) != 0)
        rc = zs_err_set(err, ZS_ERR_IO, "nvme: cannot create %s: %s", nv->dir, strerror(errno));
    if (!rc)
        rc = lock_dir(nv, err);
    if (!rc)
        rc = check_direct(nv, err);
    if (!rc) {
        /* A container's seccomp profile may refuse io_uring: the pass then
         * reads and writes synchronously (zs_nvme_pass.c), slower but the
         * same bits. ZS_NVME_TEST_NO_URING=1 makes tests take that path. */
        const char *no = getenv("ZS_NVME_TEST_NO_URING");
        int r = no && no[0] == '1' ? -ENOSYS
                                   : io_uring_queue_init((unsigned)(2 * nv->depth), &nv->ring, 0);
        nv->ring_ok = r == 0;
        if (r == -EPERM || r == -ENOSYS || r == -EACCES)
            ZS_WARN("nvme %s: no io_uring (%s%s): tiles are read and written synchronously, "
                    "without overlapping the update",
                    nv->dir, strerror(-r), no && no[0] == '1' ? ", ZS_NVME_TEST_NO_URING" : "");
        else if (r < 0)
            rc = zs_err_set(err, ZS_ERR_IO, "nvme %s: io_uring_queue_init: %s", nv->dir,
                            strerror(-r));
    }
    if (!rc && !(nv->bufs = calloc((size_t)nv->depth, sizeof *nv->bufs)))
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    for (int i = 0; !rc && i < nv->depth; i++)
        rc = zs_nvme_buf_alloc(&nv->bufs[i], err);
    if (!rc && !(nv->gbufs = calloc((size_t)nv->depth, sizeof *nv->gbufs)))
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    for (int i = 0; !rc && i < nv->depth; i++)
        if (!(nv->gbufs[i] = aligned_alloc(ZS_NVME_ALIGN, ZS_NVME_GSPAN)))
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory for the pass's gradient buffers");
    if (rc) {
        zs_nvme_close(nv);
        return rc;
    }
    remove_stale(nv);
    const char *d = getenv("ZS_NVME_TEST_TILE_DELAY_MS");
    nv->test_delay_ms = d ? strtol(d, NULL, 10) : 0;
    if (nv->test_delay_ms > 0)
        ZS_WARN("nvme %s: test hook: each tile's update waits %ld ms (ZS_NVME_TEST_TILE_DELAY_MS)",
                nv->dir, nv->test_delay_ms);
    ZS_INFO("nvme: state on %s (%s, %s, %d tiles of %u KiB in flight)", nv->dir, zs_nvme_mode(nv),
            nv->ring_ok ? "io_uring" : "synchronous I/O", nv->depth,
            (unsigned)(ZS_NVME_SLOT >> 10));
    *out = nv;
    return ZS_OK;
}

void zs_nvme_close(zs_nvme_t *nv)
{
    if (!nv)
        return;
    if (nv->ring_ok)
        io_uring_queue_exit(&nv->ring);
    for (int i = 0; nv->bufs && i < nv->depth; i++)
        zs_nvme_buf_free(&nv->bufs[i]);
    free(nv->bufs);
    for (int i = 0; nv->gbufs && i < nv->depth; i++)
        free(nv->gbufs[i]);
    free(nv->gbufs);
    if (nv->lock_fd >= 0)
        close(nv->lock_fd); /* releases the flock */
    free(nv->dir);
    free(nv);
}

uint64_t zs_nvme_ram_bytes(const zs_nvme_t *nv)
{
    /* buffers (a slot and a gradient span each), and the ring's SQ/CQ
     * entries (64 + 16 B each, rounded up) */
    return (uint64_t)nv->depth * (ZS_NVME_SLOT + ZS_NVME_GSPAN) + (uint64_t)nv->depth * 2 * 128 +
           4096;
}

int zs_nvme_depth(const zs_nvme_t *nv)
{
    return nv->depth;
}

const char *zs_nvme_dir(const zs_nvme_t *nv)
{
    return nv->dir;
}

const char *zs_nvme_mode(const zs_nvme_t *nv)
{
    return nv->buffered ? "buffered" : "O_DIRECT";
}

void *zs__nvme_ring(zs_nvme_t *nv)
{
    return nv->ring_ok ? &nv->ring : NULL;
}

int zs__nvme_io(zs_nvme_state_t *s, int wr, void *buf, size_t len, uint64_t off, zs_err_t *err)
{
    return sio(s, wr, buf, len, off, err);
}

zs_nvme_buf_t *zs__nvme_bufs(zs_nvme_t *nv)
{
    return nv->bufs;
}

unsigned char **zs__nvme_gbufs(zs_nvme_t *nv)
{
    return nv->gbufs;
}

void zs__nvme_count(zs_nvme_t *nv, int wr, uint64_t bytes)
{
    atomic_fetch_add_explicit(wr ? &nv->wr_bytes : &nv->rd_bytes, bytes, memory_order_relaxed);
}

void zs__nvme_count_pass(zs_nvme_t *nv, double seconds, double io_wait)
{
    atomic_fetch_add_explicit(&nv->passes, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&nv->pass_ns, (uint64_t)(seconds * 1e9), memory_order_relaxed);
    atomic_fetch_add_explicit(&nv->wait_ns, (uint64_t)(io_wait * 1e9), memory_order_relaxed);
}

void zs_nvme_totals(zs_nvme_t *nv, zs_nvme_totals_t *t)
{
    t->read_bytes = atomic_load_explicit(&nv->rd_bytes, memory_order_relaxed);
    t->written_bytes = atomic_load_explicit(&nv->wr_bytes, memory_order_relaxed);
    t->grad_written_bytes = atomic_load_explicit(&nv->grad_wr_bytes, memory_order_relaxed);
    t->passes = atomic_load_explicit(&nv->passes, memory_order_relaxed);
    t->pass_seconds = 1e-9 * (double)atomic_load_explicit(&nv->pass_ns, memory_order_relaxed);
    t->io_wait_seconds = 1e-9 * (double)atomic_load_explicit(&nv->wait_ns, memory_order_relaxed);
}

long zs__nvme_test_delay_ms(const zs_nvme_t *nv)
{
    return nv->test_delay_ms;
}

/* ---- states ---------------------------------------------------------------- */

uint64_t zs_nvme_state_ram_bytes(uint64_t n)
{
    uint64_t nt = (n + ZS_NVME_TILE - 1) / ZS_NVME_TILE;
    /* slot table 9 B, gradient records 2 x 17 B per tile; the struct and its locks */
    return nt * (9 + 34) + 256 + GLOCKS * sizeof(pthread_mutex_t) + 6 * 64;
}

int zs_nvme_state_create(zs_nvme_t *nv, uint64_t n, zs_nvme_state_t **out, zs_err_t *err)
{
    *out = NULL;
    if (n == 0 || n > ZS_MAX_PARAMS)
        return zs_err_set(err, ZS_ERR_INVALID, "nvme: a state of %llu elements",
                          (unsigned long long)n);
    zs_nvme_state_t *s = calloc(1, sizeof *s);
    if (!s)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    s->nv = nv;
    s->n = n;
    s->fd = -1;
    s->ntiles = (size_t)((n + ZS_NVME_TILE - 1) / ZS_NVME_TILE);
    s->cur = calloc(s->ntiles, 1);
    s->seq = calloc(s->ntiles, sizeof *s->seq);
    for (int p = 0; p < 2; p++) {
        s->gstep[p] = calloc(s->ntiles, sizeof *s->gstep[p]);
        s->gsum[p] = calloc(s->ntiles, sizeof *s->gsum[p]);
        s->gdt[p] = calloc(s->ntiles, 1);
    }
    s->gbase = zs__nvme_slot_off(s->ntiles, 0);
    for (int i = 0; i < GLOCKS; i++)
        pthread_mutex_init(&s->gmu[i], NULL);
    s->gmu_ok = 1;
    char path[4400];
    snprintf(path, sizeof path, "%s/state-%ld-%u.tiles", nv->dir, (long)getpid(),
             atomic_fetch_add(&nv->serial, 1));
    s->path = strdup(path);
    if (!s->cur || !s->seq || !s->path || !s->gstep[0] || !s->gstep[1] || !s->gsum[0] ||
        !s->gsum[1] || !s->gdt[0] || !s->gdt[1]) {
        zs_nvme_state_free(s);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu tile records", s->ntiles);
    }
    s->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (nv->buffered ? 0 : O_DIRECT), 0600);
    if (s->fd < 0) {
        int e = errno;
        zs_nvme_state_free(s);
        return zs_err_set(err, ZS_ERR_IO, "nvme: cannot create %s: %s", path, strerror(e));
    }
    off_t bytes = (off_t)(s->gbase + 2 * (uint64_t)s->ntiles * ZS_NVME_GSPAN);
    if (fallocate(s->fd, 0, 0, bytes) != 0) {
        int e = errno;
        if (e == ENOSPC || e == EDQUOT) {
            zs_nvme_state_free(s);
            return zs_err_set(err, ZS_ERR_NOMEM,
                              "nvme %s: no room for a state of %llu elements (%.2f GB: two "
                              "slots of 12 B and two gradient spans of 4 B per element): %s",
                              nv->dir, (unsigned long long)n, (double)bytes / 1e9, strerror(e));
        }
        /* A file system without fallocate: sized, but a full disk then
         * fails the step that writes (the committed tiles stay). */
        if (ftruncate(s->fd, bytes) != 0) {
            e = errno;
            zs_nvme_state_free(s);
            return zs_err_set(err, ZS_ERR_IO, "nvme: cannot size %s: %s", path, strerror(e));
        }
        ZS_WARN("nvme %s: fallocate unsupported (%s): the state file is sparse", nv->dir,
                strerror(e));
    }
    *out = s;
    return ZS_OK;
}

void zs_nvme_state_free(zs_nvme_state_t *s)
{
    if (!s)
        return;
    if (s->fd >= 0) {
        close(s->fd);
        unlink(s->path);
    }
    free(s->path);
    free(s->cur);
    free(s->seq);
    for (int p = 0; p < 2; p++) {
        free(s->gstep[p]);
        free(s->gsum[p]);
        free(s->gdt[p]);
    }
    if (s->gmu_ok)
        for (int i = 0; i < GLOCKS; i++)
            pthread_mutex_destroy(&s->gmu[i]);
    free(s);
}

size_t zs_nvme_ntiles(const zs_nvme_state_t *s)
{
    return s->ntiles;
}

uint32_t zs_nvme_tile_len(const zs_nvme_state_t *s, size_t c)
{
    uint64_t a = (uint64_t)c * ZS_NVME_TILE;
    return (uint32_t)(s->n - a < ZS_NVME_TILE ? s->n - a : ZS_NVME_TILE);
}

const char *zs_nvme_state_path(const zs_nvme_state_t *s)
{
    return s->path;
}

int zs__nvme_fd(const zs_nvme_state_t *s)
{
    return s->fd;
}

int zs__nvme_cur(const zs_nvme_state_t *s, size_t c)
{
    return s->cur[c];
}

uint64_t zs__nvme_seq(const zs_nvme_state_t *s, size_t c)
{
    return s->seq[c];
}

void zs__nvme_flip(zs_nvme_state_t *s, size_t c)
{
    s->cur[c] ^= 1;
    s->seq[c]++;
}

/* ---- synchronous tile I/O ---------------------------------------------------- */

/* full_io on s's file, counted in the tier's totals when it succeeds. */
static int sio(zs_nvme_state_t *s, int wr, void *buf, size_t len, uint64_t off, zs_err_t *err)
{
    int rc = full_io(s->fd, wr, buf, len, off, s->path, err);
    if (!rc)
        zs__nvme_count(s->nv, wr, len);
    return rc;
}

/* pread/pwrite all of len bytes at off (retrying short transfers). */
static int full_io(int fd, int wr, void *buf, size_t len, uint64_t off, const char *path,
                   zs_err_t *err)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = wr ? pwrite(fd, (char *)buf + done, len - done, (off_t)(off + done))
                       : pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            return zs_err_set(err, e == ENOSPC ? ZS_ERR_NOMEM : ZS_ERR_IO,
                              "nvme %s: %s at %llu: %s", path, wr ? "write" : "read",
                              (unsigned long long)(off + done),
                              r < 0 ? strerror(e) : "end of file");
        }
        done += (size_t)r;
    }
    return ZS_OK;
}

int zs_nvme_read(zs_nvme_state_t *s, size_t c, unsigned mask, zs_nvme_buf_t *b, zs_err_t *err)
{
    if (c >= s->ntiles)
        return zs_err_set(err, ZS_ERR_RANGE, "nvme: tile %zu of %zu", c, s->ntiles);
    uint64_t off = zs__nvme_slot_off(c, s->cur[c]);
    int rc;
    if (mask == 1 || mask == 2 || mask == 4) { /* one tensor: its span and the header */
        int t = mask == 1 ? 0 : mask == 2 ? 1 : 2;
        rc = sio(s, 0, b->mem, ZS_NVME_HDR, off, err);
        if (!rc)
            rc = sio(s, 0, b->t[t], ZS_NVME_SPAN, off + ZS_NVME_HDR + t * ZS_NVME_SPAN, err);
    } else {
        rc = sio(s, 0, b->mem, ZS_NVME_SLOT, off, err);
    }
    return rc ? rc : zs__nvme_check(s, b, c, mask, err);
}

int zs_nvme_write_aside(zs_nvme_state_t *s, size_t c, zs_nvme_buf_t *b, zs_err_t *err)
{
    if (c >= s->ntiles)
        return zs_err_set(err, ZS_ERR_RANGE, "nvme: tile %zu of %zu", c, s->ntiles);
    zs__nvme_seal(b, c, s->seq[c] + 1, zs_nvme_tile_len(s, c));
    return sio(s, 1, b->mem, ZS_NVME_SLOT, zs__nvme_slot_off(c, s->cur[c] ^ 1), err);
}

int zs_nvme_write(zs_nvme_state_t *s, size_t c, zs_nvme_buf_t *b, zs_err_t *err)
{
    int rc = zs_nvme_write_aside(s, c, b, err);
    if (rc)
        return rc;
    zs__nvme_flip(s, c);
    return ZS_OK;
}

int zs__nvme_corrupt(zs_nvme_state_t *s, size_t c, int t, zs_err_t *err)
{
    if (c >= s->ntiles || t < 0 || t > 2)
        return zs_err_set(err, ZS_ERR_RANGE, "nvme: no tile %zu tensor %d", c, t);
    zs_nvme_buf_t b;
    int rc = zs_nvme_buf_alloc(&b, err);
    for (int slot = 0; !rc && slot < 2; slot++) {
        uint64_t off = zs__nvme_slot_off(c, slot) + ZS_NVME_HDR + (uint64_t)t * ZS_NVME_SPAN;
        rc = sio(s, 0, b.t[0], ZS_NVME_ALIGN, off, err);
        if (!rc) {
            ((unsigned char *)b.t[0])[5] ^= 0x20;
            rc = sio(s, 1, b.t[0], ZS_NVME_ALIGN, off, err);
        }
    }
    zs_nvme_buf_free(&b);
    return rc;
}

/* ---- staged gradients ---------------------------------------------------------- */

uint64_t zs__nvme_grad_off(const zs_nvme_state_t *s, size_t c, int p)
{
    return s->gbase + ((uint64_t)p * s->ntiles + c) * ZS_NVME_GSPAN;
}

size_t zs__nvme_grad_len(const zs_nvme_state_t *s, size_t c, zs_dtype_t dt)
{
    size_t b = (size_t)zs_nvme_tile_len(s, c) * zs_dtype_size(dt);
    return (b + ZS_NVME_ALIGN - 1) & ~(size_t)(ZS_NVME_ALIGN - 1);
}

/* Seed of a span's checksum: its tile, parity and step. */
static uint64_t gseed(size_t c, int p, uint64_t step)
{
    return ((uint64_t)c * 2 + (uint64_t)p + 0x5A5Aull) ^ (step * 0xC2B2AE3D27D4EB4Full);
}

/* The check, with gmu of c held. */
static int grad_check_locked(zs_nvme_state_t *s, size_t c, uint64_t step, zs_dtype_t dt,
                             const void *buf, zs_err_t *err)
{
    int p = (int)(step & 1);
    uint64_t a = (uint64_t)c * ZS_NVME_TILE, k = zs_nvme_tile_len(s, c);
    if (s->gstep[p][c] != step || s->gdt[p][c] != (unsigned char)dt)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "nvme %s: tile %zu (elements [%llu, %llu) of the range) holds no "
                          "staged %s gradient of step %llu; not used",
                          s->path, c, (unsigned long long)a, (unsigned long long)(a + k),
                          zs_dtype_name(dt), (unsigned long long)step);
    if (zs_hash64(buf, (size_t)k * zs_dtype_size(dt), gseed(c, p, step)) !=
        s->gsum[p][c])
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "nvme %s: tile %zu (elements [%llu, %llu) of the range): its staged "
                          "gradient of step %llu fails its XXH3 checksum: torn or corrupted; "
                          "not used",
                          s->path, c, (unsigned long long)a, (unsigned long long)(a + k),
                          (unsigned long long)step);
    return ZS_OK;
}

int zs__nvme_grad_check(zs_nvme_state_t *s, size_t c, uint64_t step, zs_dtype_t dt, const void *buf,
                        zs_err_t *err)
{
    pthread_mutex_lock(&s->gmu[c % GLOCKS]);
    int rc = grad_check_locked(s, c, step, dt, buf, err);
    pthread_mutex_unlock(&s->gmu[c % GLOCKS]);
    return rc;
}

int zs_nvme_grad_put(zs_nvme_state_t *s, uint64_t step, zs_dtype_t dt, uint64_t a, uint64_t count,
                     const void *src, zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    if (esz == 0 || esz > 4 || step == 0 || a > s->n || count > s->n - a)
        return zs_err_set(err, ZS_ERR_RANGE, "nvme: staging %llu elements at %llu of %llu",
                          (unsigned long long)count, (unsigned long long)a,
                          (unsigned long long)s->n);
    unsigned char *buf = zs_nvme_mem_alloc(ZS_NVME_GSPAN);
    if (!buf)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for a gradient span");
    int p = (int)(step & 1), rc = ZS_OK;
    for (uint64_t c = a / ZS_NVME_TILE; !rc && c * ZS_NVME_TILE < a + count; c++) {
        uint64_t t0 = c * ZS_NVME_TILE, k = zs_nvme_tile_len(s, (size_t)c);
        uint64_t s0 = t0 > a ? t0 : a, e = t0 + k < a + count ? t0 + k : a + count;
        size_t len = zs__nvme_grad_len(s, (size_t)c, dt);
        uint64_t off = zs__nvme_grad_off(s, (size_t)c, p);
        pthread_mutex_t *mu = &s->gmu[c % GLOCKS];
        pthread_mutex_lock(mu);
        if (s0 > t0 || e < t0 + k) { /* partly covered: merge with what is staged */
            if (s->gstep[p][c] == step && s->gdt[p][c] == (unsigned char)dt) {
                rc = sio(s, 0, buf, len, off, err);
                if (!rc)
                    rc = grad_check_locked(s, (size_t)c, step, dt, buf, err);
            } else {
                memset(buf, 0, len);
            }
        } else {
            memset(buf + k * esz, 0, len - k * esz);
        }
        if (!rc) {
            memcpy(buf + (s0 - t0) * esz, (const unsigned char *)src + (s0 - a) * esz,
                   (size_t)(e - s0) * esz);
            rc = sio(s, 1, buf, len, off, err);
        }
        if (!rc) {
            atomic_fetch_add_explicit(&s->nv->grad_wr_bytes, len, memory_order_relaxed);
            s->gstep[p][c] = step;
            s->gdt[p][c] = (unsigned char)dt;
            s->gsum[p][c] = zs_hash64(buf, (size_t)k * esz, gseed((size_t)c, p, step));
        } else {
            s->gstep[p][c] = 0; /* unknown now: staged again or refused */
        }
        pthread_mutex_unlock(mu);
    }
    zs_nvme_mem_free(buf, ZS_NVME_GSPAN);
    return rc;
}

int zs_nvme_grad_read(zs_nvme_state_t *s, size_t c, uint64_t step, zs_dtype_t dt, void *buf,
                      zs_err_t *err)
{
    if (c >= s->ntiles || zs_dtype_size(dt) == 0 || zs_dtype_size(dt) > 4)
        return zs_err_set(err, ZS_ERR_RANGE, "nvme: gradient of tile %zu of %zu", c, s->ntiles);
    int rc =
        sio(s, 0, buf, zs__nvme_grad_len(s, c, dt), zs__nvme_grad_off(s, c, (int)(step & 1)), err);
    return rc ? rc : zs__nvme_grad_check(s, c, step, dt, buf, err);
}

int zs__nvme_grad_corrupt(zs_nvme_state_t *s, size_t c, int p, zs_err_t *err)
{
    if (c >= s->ntiles || p < 0 || p > 1)
        return zs_err_set(err, ZS_ERR_RANGE, "nvme: no gradient of tile %zu parity %d", c, p);
    unsigned char *b = aligned_alloc(ZS_NVME_ALIGN, ZS_NVME_ALIGN);
    if (!b)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    uint64_t off = zs__nvme_grad_off(s, c, p);
    int rc = sio(s, 0, b, ZS_NVME_ALIGN, off, err);
    if (!rc) {
        b[5] ^= 0x20;
        rc = sio(s, 1, b, ZS_NVME_ALIGN, off, err);
    }
    free(b);
    return rc;
}
