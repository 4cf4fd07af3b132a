/*
 * zs_engine_nvme.c - offload_param.device "nvme" (ZeRO-Infinity's
 * parameter offload, docs/nvme.md): at stage 3 this worker's partition of
 * the 16-bit (or fp32) parameters lives in one file per worker rank under
 * offload_param.nvme_path instead of pinned host memory.
 *
 * Layout: segment k's part (s->part elements of dt) is at a 4 KiB-aligned
 * offset of the file, padded to a multiple of 4 KiB with zeros (O_DIRECT
 * needs aligned offsets, sizes and buffers). The first segments, up to
 * offload_param.max_in_cpu elements in all (whole segments: a layer's part
 * is never split), stay in one host region instead and do no I/O.
 *
 * Host memory (category params, pinned space, counted by the allocator):
 * that region and buffer_count buffers of min(buffer_size, the largest
 * file-resident part) elements, rounded up to 4 KiB. A buffer holds one
 * segment's part; buffer_size below the largest part is refused (as in
 * DeepSpeed, a buffer holds a whole parameter).
 *
 * I/O is synchronous, on the calling thread: a gather (zs__eng_gather_seg,
 * when a layer needs its segment or the stage-3 prefetch asks for it) reads
 * the part into the next free buffer and hands it to the comm stream; the
 * buffers rotate, and a buffer is reused only once the stream that read it
 * has passed (its event). Pulled parameters (offload_optimizer), the
 * in-process optimizer, init and resume write a part back with one pwrite
 * before the call returns. The file is opened O_DIRECT where the file
 * system allows it, else buffered (logged once: tmpfs has no O_DIRECT).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_engine_internal.h"
#include "zs_log.h"

#define ALIGN 4096u

struct zs__pnvme {
    int fd, direct;
    char path[600];
    uint64_t *foff;  /* [ns] file offset of segment k's part; UINT64_MAX: in host memory */
    uint64_t *hoff;  /* [ns] byte offset in incpu (valid when foff is UINT64_MAX) */
    void *incpu;     /* the segments kept in host memory (max_in_cpu) */
    void *pool;      /* allocation holding the buffers (aligned inside) */
    char **buf;      /* [nbuf] aligned buffers of bufb bytes */
    zs_event_t **ev; /* [nbuf] last consumer of each buffer */
    int *pending;    /* [nbuf] ev recorded and not yet waited for */
    int nbuf, next;
    uint64_t bufb; /* bytes of one buffer */
    uint64_t file_bytes, incpu_bytes;
    int registered; /* pool is ours (posix_memalign), registered; else the device's */
};

static uint64_t up(uint64_t n, uint64_t m)
{
    return (n + m - 1) / m * m;
}

int zs__pnv_enabled(const zs_engine_t *e)
{
    return e->pnv != NULL;
}

/* Open DIR/zs-params-rank<R>-<pid>.bin for reading and writing, O_DIRECT
 * when the file system takes it (probed with an aligned write). */
static int open_file(zs_engine_t *e, zs__pnvme_t *n, zs_err_t *err)
{
    const char *dir = e->cfg.offload_param_nvme_path;
    struct stat st;
    if (stat(dir, &st) != 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.offload_param.nvme_path \"%s\": %s (it must be an "
                          "existing directory the workers can write)",
                          dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.offload_param.nvme_path \"%s\": not a directory", dir);
    snprintf(n->path, sizeof n->path, "%s/zs-params-rank%d-%ld.bin", dir, e->wrank, (long)getpid());
    n->fd = open(n->path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    n->direct = n->fd >= 0;
    if (n->fd < 0 && errno == EINVAL) /* tmpfs and others: no O_DIRECT */
        n->fd = open(n->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (n->fd < 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.offload_param.nvme_path \"%s\": cannot create the "
                          "parameter file %s: %s",
                          dir, n->path, strerror(errno));
    if (n->direct) { /* some file systems open O_DIRECT and refuse the I/O */
        void *probe = NULL;
        if (posix_memalign(&probe, ALIGN, ALIGN) != 0)
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        memset(probe, 0, ALIGN);
        ssize_t w = pwrite(n->fd, probe, ALIGN, 0);
        int werr = errno;
        free(probe);
        if (w != (ssize_t)ALIGN && werr == EINVAL) {
            close(n->fd);
            n->direct = 0;
            n->fd = open(n->path, O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
            if (n->fd < 0)
                return zs_err_set(err, ZS_ERR_IO, "offload_param: reopening %s: %s", n->path,
                                  strerror(errno));
        } else if (w != (ssize_t)ALIGN) {
            return zs_err_set(err, ZS_ERR_IO, "offload_param: writing %s: %s", n->path,
                              w < 0 ? strerror(werr) : "short write");
        }
    }
    if (!n->direct)
        ZS_INFO("rank %d: offload_param nvme: %s does not take O_DIRECT here (tmpfs?); the "
                "parameter file goes through the page cache",
                e->wrank, dir);
    return ZS_OK;
}

int zs__pnv_create(zs_engine_t *e, zs_err_t *err)
{
    zs__pnvme_t *n = calloc(1, sizeof *n);
    if (!n)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    n->fd = -1;
    e->pnv = n;
    n->foff = calloc((size_t)e->ns, sizeof *n->foff);
    n->hoff = calloc((size_t)e->ns, sizeof *n->hoff);
    if (!n->foff || !n->hoff)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    /* whole segments in host memory while they fit max_in_cpu; the rest
     * in the file, each part at an aligned offset */
    uint64_t incpu_elems = 0, maxpart = 0, maxk = 0;
    uint64_t budget = (uint64_t)e->cfg.offload_param_max_in_cpu;
    int in_cpu = 1;
    for (int k = 0; k < e->ns; k++) {
        zs__seg_t *s = &e->s[k];
        if (in_cpu && incpu_elems + s->part <= budget) {
            n->foff[k] = UINT64_MAX;
            n->hoff[k] = incpu_elems * e->esz;
            incpu_elems += s->part;
            continue;
        }
        in_cpu = 0; /* the rest goes to the file, in order */
        n->foff[k] = n->file_bytes;
        n->file_bytes += up(s->part * e->esz, ALIGN);
        if (s->part > maxpart) {
            maxpart = s->part;
            maxk = (uint64_t)k;
        }
    }
    n->incpu_bytes = incpu_elems * e->esz;
    uint64_t bsz = (uint64_t)e->cfg.offload_param_buffer_size;
    if (maxpart > bsz)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_optimization.offload_param.buffer_size: %llu elements is less than "
                          "this worker's part of layer %d (%llu elements): a buffer holds a whole "
                          "part (raise buffer_size, or keep such layers in max_in_cpu)",
                          (unsigned long long)bsz, e->s[maxk].first, (unsigned long long)maxpart);
    ZS_ENG_TRY(open_file(e, n, err));
    if (n->file_bytes && ftruncate(n->fd, (off_t)n->file_bytes) != 0)
        return zs_err_set(err, ZS_ERR_IO, "offload_param: sizing %s to %llu bytes: %s", n->path,
                          (unsigned long long)n->file_bytes, strerror(errno));
    if (n->incpu_bytes) {
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_PINNED, ZS_MEM_PARAMS, n->incpu_bytes, &n->incpu,
                                 "parameters kept in host memory (offload_param.max_in_cpu)", err));
        ZS_ENG_TRY(zs_dev_memset(e->compute, n->incpu, 0, n->incpu_bytes, err));
        ZS_ENG_TRY(zs_dev_stream_sync(e->compute, err));
    }
    if (n->file_bytes) {
        n->nbuf = (int)e->cfg.offload_param_buffer_count;
        n->bufb = up((bsz < maxpart ? bsz : maxpart) * e->esz, ALIGN);
        n->buf = calloc((size_t)n->nbuf, sizeof *n->buf);
        n->ev = calloc((size_t)n->nbuf, sizeof *n->ev);
        n->pending = calloc((size_t)n->nbuf, sizeof *n->pending);
        if (!n->buf || !n->ev || !n->pending)
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        /* pinned memory of category params, aligned for O_DIRECT: the
         * device's pinned allocation when it is page-aligned (CUDA's
         * cudaHostAlloc, which kernels may write: init and the in-process
         * AdamW cast into a buffer), else our own aligned block registered
         * with the device (counted the same) */
        size_t pb = (size_t)(n->bufb * (uint64_t)n->nbuf);
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_PINNED, ZS_MEM_PARAMS, pb, &n->pool,
                                 "offload_param buffers", err));
        if ((uintptr_t)n->pool % ALIGN != 0) {
            zs_dev_free(e->dev, n->pool);
            n->pool = NULL;
            if (posix_memalign(&n->pool, ALIGN, pb) != 0) {
                n->pool = NULL;
                return zs_err_set(err, ZS_ERR_NOMEM,
                                  "out of host memory for offload_param's %d buffers (%zu bytes)",
                                  n->nbuf, pb);
            }
            int rc = zs_dev_host_register(e->dev, n->pool, pb, ZS_MEM_PARAMS, err);
            if (rc) {
                free(n->pool);
                n->pool = NULL;
                return zs_err_set(err, rc, "offload_param buffers (%zu bytes): %s", pb, err->msg);
            }
            n->registered = 1;
        }
        char *a = n->pool;
        for (int i = 0; i < n->nbuf; i++) {
            n->buf[i] = a + (uint64_t)i * n->bufb;
            ZS_ENG_TRY(zs_dev_event_create(e->dev, &n->ev[i], err));
        }
    }
    if (e->wrank == 0)
        ZS_INFO("offload_param nvme: a parameter file of %llu bytes per worker in %s%s, %llu bytes "
                "in host "
                "memory, %d buffers of %llu bytes",
                (unsigned long long)n->file_bytes, e->cfg.offload_param_nvme_path,
                n->direct ? " (O_DIRECT)" : " (buffered)", (unsigned long long)n->incpu_bytes,
                n->nbuf, (unsigned long long)n->bufb);
    return ZS_OK;
}

void zs__pnv_destroy(zs_engine_t *e)
{
    zs__pnvme_t *n = e->pnv;
    if (!n)
        return;
    for (int i = 0; n->ev && n->pending && i < n->nbuf; i++)
        if (n->ev[i]) {
            if (n->pending[i])
                zs_dev_event_sync(n->ev[i], NULL);
            zs_dev_event_destroy(n->ev[i]);
        }
    if (n->registered) {
        if (e->dev)
            zs_dev_host_unregister(e->dev, n->pool);
        free(n->pool);
    } else if (e->dev) {
        zs_dev_free(e->dev, n->pool);
    }
    if (e->dev)
        zs_dev_free(e->dev, n->incpu);
    if (n->fd >= 0) {
        close(n->fd);
        unlink(n->path);
    }
    free(n->buf);
    free(n->ev);
    free(n->pending);
    free(n->foff);
    free(n->hoff);
    free(n);
    e->pnv = NULL;
}

uint64_t zs__pnv_host_bytes(const zs_engine_t *e)
{
    const zs__pnvme_t *n = e->pnv;
    return n ? n->incpu_bytes + (n->pool ? n->bufb * (uint64_t)n->nbuf : 0) : 0;
}

/* The next buffer, once its last consumer has passed. */
static int take_buf(zs__pnvme_t *n, int *idx, zs_err_t *err)
{
    int i = n->next;
    n->next = (n->next + 1) % n->nbuf;
    if (n->pending[i]) {
        ZS_ENG_TRY(zs_dev_event_sync(n->ev[i], err));
        n->pending[i] = 0;
    }
    *idx = i;
    return ZS_OK;
}

static int buf_index(const zs__pnvme_t *n, const void *p)
{
    for (int i = 0; i < n->nbuf; i++)
        if (p == n->buf[i])
            return i;
    return -1;
}

int zs__pnv_begin(zs_engine_t *e, const zs__seg_t *s, int load, void **out, zs_err_t *err)
{
    zs__pnvme_t *n = e->pnv;
    int k = (int)(s - e->s);
    if (n->foff[k] == UINT64_MAX) {
        *out = (char *)n->incpu + n->hoff[k];
        return ZS_OK;
    }
    int i;
    ZS_ENG_TRY(take_buf(n, &i, err));
    uint64_t bytes = up(s->part * e->esz, ALIGN);
    if (!load) {
        memset(n->buf[i], 0, bytes); /* padding stays zero, as in memory */
    } else {
        for (uint64_t d = 0; d < bytes;) {
            ssize_t r = pread(n->fd, n->buf[i] + d, bytes - d, (off_t)(n->foff[k] + d));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return zs_err_set(err, ZS_ERR_IO,
                                  "offload_param: reading layer %d's parameters (%llu bytes at "
                                  "%llu) from %s: %s",
                                  s->first, (unsigned long long)bytes,
                                  (unsigned long long)n->foff[k], n->path,
                                  r < 0 ? strerror(errno) : "end of file");
            d += (uint64_t)r;
        }
    }
    *out = n->buf[i];
    return ZS_OK;
}

int zs__pnv_end(zs_engine_t *e, const zs__seg_t *s, void *p, int dirty, zs_stream_t *consumer,
                zs_err_t *err)
{
    zs__pnvme_t *n = e->pnv;
    int k = (int)(s - e->s), i = buf_index(n, p);
    if (n->foff[k] == UINT64_MAX || i < 0)
        return ZS_OK; /* host memory: the caller wrote it in place */
    if (dirty) {
        uint64_t bytes = up(s->part * e->esz, ALIGN);
        for (uint64_t d = 0; d < bytes;) {
            ssize_t w = pwrite(n->fd, n->buf[i] + d, bytes - d, (off_t)(n->foff[k] + d));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return zs_err_set(err, ZS_ERR_IO,
                                  "offload_param: writing layer %d's parameters (%llu bytes at "
                                  "%llu) to %s: %s",
                                  s->first, (unsigned long long)bytes,
                                  (unsigned long long)n->foff[k], n->path,
                                  w < 0 ? strerror(errno) : "no space written");
            d += (uint64_t)w;
        }
    }
    if (consumer) {
        ZS_ENG_TRY(zs_dev_event_record(n->ev[i], consumer, err));
        n->pending[i] = 1;
    }
    return ZS_OK;
}

int zs__eng_param_set(zs_engine_t *e, zs__seg_t *s, const void *src, zs_err_t *err)
{
    size_t bytes = (size_t)(s->ve - s->vb) * e->esz;
    if (!e->pnv)
        return zs_dev_memcpy(e->copy, zs__eng_param_part(e, s), src, bytes, err);
    zs__pnvme_t *n = e->pnv;
    int k = (int)(s - e->s);
    if (n->foff[k] == UINT64_MAX) {
        /* host memory: in stream order, after the gathers that read it (comm)
         * and before the next ones (they wait for the copy stream) */
        ZS_ENG_TRY(zs_dev_event_record(e->ev_reduced, e->comm, err));
        ZS_ENG_TRY(zs_dev_stream_wait(e->copy, e->ev_reduced, err));
        return zs_dev_memcpy(e->copy, (char *)n->incpu + n->hoff[k], src, bytes, err);
    }
    void *p;
    ZS_ENG_TRY(zs__pnv_begin(e, s, 0, &p, err));
    memcpy(p, src, bytes); /* src is host memory (staging), complete */
    return zs__pnv_end(e, s, p, 1, NULL, err);
}
