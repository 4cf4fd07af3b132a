/*
 * test_shm.c - the shared-memory data plane (common/zs_shm.c, zs_shm_sock.c):
 * one check per behaviour, each a function below; `test_shm NAME` runs one.
 *
 *   roundtrip  worker stages fp32 gradients, the server maps the fd and reads
 *              them bitwise, writes bf16/fp16/fp32 parameters, the worker
 *              reads them bitwise; a sub-range chunk; roles enforced
 *   wake       a waiting thread is woken by publish (futex), without burning
 *              CPU; a wait with nothing published times out
 *   stale      a chunk of an older step is refused, a newer one is out of
 *              sequence, publishing backwards is refused with nothing written
 *   session    a slot left from another segment (a dead worker's session)
 *              is refused even at the right step
 *   checksum   a flipped payload byte, or a slot relabelled to another step,
 *              is refused
 *   range      chunk index and elements outside the chunk are refused
 *              (publish: nothing written; verify: before the payload is read)
 *   small      a segment smaller than its header says is refused (sealed, so
 *              only the size check guards it), also one below a header
 *   magic      bad magic, version and geometry are refused; an unsealed
 *              memfd is refused; a faithful sealed copy maps (control)
 *   hello      a malformed hello, a lying token length, a missing token, no
 *              fd, two fds; no token configured: not checked
 *   token      wrong and missing tokens refused on both sides; right: OK
 *   timeouts   a worker that says nothing, a server that never answers, and
 *              an accept nobody calls end at their deadlines
 *   uid        a foreign uid (a child setuid to 65534) is refused by the
 *              socket's mode, then by SO_PEERCRED; admitted when allowed;
 *              the client refuses a server of another uid (root only)
 *   twoproc    a forked worker passes its memfd over the socket and runs
 *              three steps with the server (the parent)
 *   peerdeath  a wait on a worker that exits ends with ZS_ERR_UNAVAILABLE
 *              well before its timeout
 *   fdleak     /proc/self/fd counts the same before and after every path
 *   sockfile   the socket file is 0600 whatever the umask, refused while
 *              live, replaced when stale, removed on destroy
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zs_dtype.h"
#include "zs_shm.h"
#include "zs_shm_sock.h"
#include "zs_test.h"

#define CHUNK  1024u /* elements per chunk in these tests */
#define NOBODY 65534u

static char g_dir[64];   /* mkdtemp'd socket directory */
static char g_path[128]; /* g_dir/s.sock */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    TEST_CHECK(d != NULL);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own fd */
}

static zs_shm_slot_t *slot(zs_shm_t *shm, int dir, uint32_t k)
{
    const zs_shm_header_t *h = zs_shm_header(shm);
    return (zs_shm_slot_t *)((char *)zs_shm_base(shm) + h->table_off +
                             ((uint64_t)k * 2 + (uint64_t)dir) * ZS_SHM_SLOT_BYTES);
}

static int has(const zs_err_t *e, const char *s)
{
    return strstr(e->msg, s) != NULL;
}

/* Gradient value bits for element e of step s: every bit pattern kind
 * (negative zero, NaN payloads, denormals) appears, to test bitwise. */
static uint32_t grad_bits(uint64_t e, uint64_t s)
{
    uint64_t x = (e + 1) * 0x9e3779b97f4a7c15ull ^ (s * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 29;
    return (uint32_t)x;
}

/* Stage and publish fp32 gradients of step s for chunk k (whole window). */
static void stage_grads(zs_shm_t *w, uint32_t k, uint64_t s)
{
    zs_err_t e;
    uint64_t b, n;
    TEST_OK(zs_shm_window(w, k, &b, &n, &e), e);
    TEST_OK(zs_shm_claim(w, ZS_SHM_GRAD, k, &e), e);
    uint32_t *g = zs_shm_payload(w, ZS_SHM_GRAD, k);
    for (uint64_t i = 0; i < n; i++)
        g[i] = grad_bits(b + i, s);
    TEST_OK(zs_shm_publish(w, ZS_SHM_GRAD, k, s, ZS_DTYPE_F32, b, n, &e), e);
}

/* The server's "optimizer": parameter bits from gradient bits, per dtype. */
static uint32_t param_bits(uint32_t g, uint64_t s)
{
    return g ^ (uint32_t)(s * 0x01000193u);
}

/* Server side of one chunk: wait, verify, check the gradient bitwise, write
 * parameters of dtype dt in place and publish them. */
static void serve_chunk(zs_shm_t *srv, uint32_t k, uint64_t s, int dt)
{
    zs_err_t e;
    zs_shm_chunk_t c;
    TEST_OK(zs_shm_wait(srv, ZS_SHM_GRAD, k, s, 5000, &e), e);
    TEST_OK(zs_shm_verify(srv, ZS_SHM_GRAD, k, s, &c, &e), e);
    TEST_CHECK(c.dtype == ZS_DTYPE_F32 && c.step == s && c.bytes == c.elem_count * 4);
    const uint32_t *g = c.data;
    for (uint64_t i = 0; i < c.elem_count; i++)
        TEST_CHECKF(g[i] == grad_bits(c.elem_begin + i, s), "chunk %u elem %llu", k,
                    (unsigned long long)i);
    TEST_OK(zs_shm_claim(srv, ZS_SHM_PARAM, k, &e), e);
    void *p = zs_shm_payload(srv, ZS_SHM_PARAM, k);
    for (uint64_t i = 0; i < c.elem_count; i++) {
        uint32_t v = param_bits(g[i], s);
        if (dt == ZS_DTYPE_F32)
            ((uint32_t *)p)[i] = v;
        else
            ((uint16_t *)p)[i] = (uint16_t)(v >> 16);
    }
    TEST_OK(zs_shm_publish(srv, ZS_SHM_PARAM, k, s, dt, c.elem_begin, c.elem_count, &e), e);
}

/* Worker side of one chunk: wait for its parameters and check them bitwise. */
static void check_params(zs_shm_t *w, uint32_t k, uint64_t s, int dt)
{
    zs_err_t e;
    zs_shm_chunk_t c;
    uint64_t b, n;
    TEST_OK(zs_shm_window(w, k, &b, &n, &e), e);
    TEST_OK(zs_shm_wait(w, ZS_SHM_PARAM, k, s, 5000, &e), e);
    TEST_OK(zs_shm_verify(w, ZS_SHM_PARAM, k, s, &c, &e), e);
    TEST_CHECK(c.dtype == dt && c.elem_begin == b && c.elem_count == n);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t v = param_bits(grad_bits(b + i, s), s);
        if (dt == ZS_DTYPE_F32)
            TEST_CHECK(((uint32_t *)c.data)[i] == v);
        else
            TEST_CHECK(((uint16_t *)c.data)[i] == (uint16_t)(v >> 16));
    }
}

static void check_roundtrip(void)
{
    zs_err_t e;
    zs_shm_t *w, *s;
    /* 2.5 chunks starting at element 1000 of the flat space: 3 chunks, the
     * last one 512 elements. */
    TEST_OK(zs_shm_create(1000, CHUNK * 5 / 2, CHUNK, &w, &e), e);
    TEST_OK(zs_shm_map(zs_shm_fd(w), 1 << 30, &s, &e), e);
    const zs_shm_header_t *h = zs_shm_header(s);
    TEST_CHECK(h->nchunks == 3 && h->range_begin == 1000 && h->chunk_stride == 4096);
    TEST_CHECK(h->total_bytes == zs_shm_size(w) && h->generation == zs_shm_header(w)->generation);
    const int dts[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};
    for (uint64_t step = 1; step <= 2; step++) {
        for (uint32_t k = 0; k < 3; k++)
            stage_grads(w, k, step);
        for (uint32_t k = 0; k < 3; k++)
            serve_chunk(s, k, step, dts[(k + step) % 3]);
        for (uint32_t k = 0; k < 3; k++)
            check_params(w, k, step, dts[(k + step) % 3]);
    }
    /* A sub-range of chunk 1 in bf16, at its place in the payload. */
    uint64_t b, n;
    TEST_OK(zs_shm_window(w, 1, &b, &n, &e), e);
    TEST_CHECK(b == 1000 + CHUNK && n == CHUNK);
    TEST_OK(zs_shm_claim(w, ZS_SHM_GRAD, 1, &e), e);
    uint16_t *g16 = zs_shm_payload(w, ZS_SHM_GRAD, 1);
    for (int i = 0; i < 10; i++)
        g16[100 + i] = (uint16_t)(0xbeef + i);
    TEST_OK(zs_shm_publish(w, ZS_SHM_GRAD, 1, 3, ZS_DTYPE_BF16, b + 100, 10, &e), e);
    zs_shm_chunk_t c;
    TEST_OK(zs_shm_verify(s, ZS_SHM_GRAD, 1, 3, &c, &e), e);
    TEST_CHECK(c.elem_begin == b + 100 && c.elem_count == 10 && c.bytes == 20);
    TEST_CHECK(memcmp(c.data, g16 + 100, 20) == 0 && ((uint16_t *)c.data)[9] == 0xbeef + 9);
    /* Roles: each side writes its own direction only. */
    TEST_CHECK(zs_shm_publish(s, ZS_SHM_GRAD, 0, 9, ZS_DTYPE_F32, 1000, 1, &e) == ZS_ERR_INVALID);
    TEST_CHECKF(has(&e, "server side does not write gradient"), "%s", e.msg);
    TEST_CHECK(zs_shm_claim(w, ZS_SHM_PARAM, 0, &e) == ZS_ERR_INVALID);
    zs_shm_destroy(s);
    zs_shm_destroy(w);
}

typedef struct {
    zs_shm_t *shm;
    uint64_t step;
    int timeout_ms;
    int rc;
    double woke_at, cpu;
    zs_err_t err;
} waiter_t;

static void *waiter_main(void *arg)
{
    waiter_t *a = arg;
    double c0 = thread_cpu_s();
    a->rc = zs_shm_wait(a->shm, ZS_SHM_GRAD, 0, a->step, a->timeout_ms, &a->err);
    a->woke_at = now_s();
    a->cpu = thread_cpu_s() - c0;
    return NULL;
}

static void check_wake(void)
{
    zs_err_t e;
    zs_shm_t *w, *s;
    TEST_OK(zs_shm_create(0, CHUNK, CHUNK, &w, &e), e);
    TEST_OK(zs_shm_map(zs_shm_fd(w), 1 << 30, &s, &e), e);
    /* Woken by publish: the waiter would otherwise sleep to its 5 s. */
    waiter_t a = {.shm = s, .step = 1, .timeout_ms = 5000};
    pthread_t t;
    double t0 = now_s();
    TEST_CHECK(pthread_create(&t, NULL, waiter_main, &a) == 0);
    usleep(300 * 1000);
    double pub = now_s();
    stage_grads(w, 0, 1);
    pthread_join(t, NULL);
    TEST_OK(a.rc, a.err);
    TEST_CHECKF(a.woke_at - pub < 1.0, "woke %.3f s after publish", a.woke_at - pub);
    TEST_CHECKF(a.woke_at - t0 >= 0.25, "returned after %.3f s, before the publish",
                a.woke_at - t0);
    /* Slept, did not spin: well under the 0.3 s it waited. */
    TEST_CHECKF(a.cpu < 0.03, "waiter used %.3f s of CPU", a.cpu);
    /* Nothing published for step 2: a timeout after 300 ms, also asleep. */
    waiter_t b = {.shm = s, .step = 2, .timeout_ms = 300};
    t0 = now_s();
    TEST_CHECK(pthread_create(&t, NULL, waiter_main, &b) == 0);
    pthread_join(t, NULL);
    TEST_CHECKF(b.rc == ZS_ERR_TIMEOUT, "rc %d: %s", b.rc, b.err.msg);
    TEST_CHECKF(has(&b.err, "not ready after 300 ms"), "%s", b.err.msg);
    TEST_CHECKF(b.woke_at - t0 >= 0.29 && b.woke_at - t0 < 2.0, "timed out after %.3f s",
                b.woke_at - t0);
    TEST_CHECKF(b.cpu < 0.03, "waiter used %.3f s of CPU", b.cpu);
    zs_shm_destroy(s);
    zs_shm_destroy(w);
}

static void check_stale(void)
{
    zs_err_t e;
    zs_shm_t *w, *s;
    TEST_OK(zs_shm_create(0, CHUNK, CHUNK, &w, &e), e);
    TEST_OK(zs_shm_map(zs_shm_fd(w), 1 << 30, &s, &e), e);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 1, NULL, &e) == ZS_ERR_STATE);
    TEST_CHECKF(has(&e, "not staged"), "%s", e.msg);
    stage_grads(w, 0, 5);
    TEST_OK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 5, NULL, &e), e);
    /* The server expects step 6: step 5's gradient is stale. */
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 6, NULL, &e) == ZS_ERR_STATE);
    TEST_CHECKF(has(&e, "holds step 5, expected step 6 (stale)"), "%s", e.msg);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 4, NULL, &e) == ZS_ERR_STATE);
    TEST_CHECKF(has(&e, "holds step 5, expected step 4 (out of sequence)"), "%s", e.msg);
    /* A wait for an overwritten step ends at once. */
    double t0 = now_s();
    TEST_CHECK(zs_shm_wait(s, ZS_SHM_GRAD, 0, 4, 5000, &e) == ZS_ERR_STATE);
    TEST_CHECKF(now_s() - t0 < 1.0 && has(&e, "past the awaited step 4"), "%s", e.msg);
    /* Publishing backwards is refused with nothing written. */
    zs_shm_slot_t before = *slot(w, ZS_SHM_GRAD, 0);
    TEST_CHECK(zs_shm_publish(w, ZS_SHM_GRAD, 0, 4, ZS_DTYPE_F32, 0, CHUNK, &e) == ZS_ERR_STATE);
    TEST_CHECKF(has(&e, "step 4 out of sequence (step 5 was published)"), "%s", e.msg);
    TEST_CHECK(memcmp(&before, slot(w, ZS_SHM_GRAD, 0), sizeof before) == 0);
    TEST_OK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 5, NULL, &e), e);
    /* The same step again (a re-push) and the next one are fine. */
    stage_grads(w, 0, 5);
    stage_grads(w, 0, 6);
    TEST_OK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 6, NULL, &e), e);
    TEST_CHECK(zs_shm_publish(w, ZS_SHM_GRAD, 0, ZS_SHM_STEP_MAX + 1, ZS_DTYPE_F32, 0, 1, &e) ==
               ZS_ERR_STATE);
    zs_shm_destroy(s);
    zs_shm_destroy(w);
}

static void check_session(void)
{
    zs_err_t e;
    zs_shm_t *old, *w, *s;
    /* A dead worker's segment published step 1; its contents (table and
     * payloads) end up in a new worker's segment, as if reused. */
    TEST_OK(zs_shm_create(0, CHUNK, CHUNK, &old, &e), e);
    stage_grads(old, 0, 1);
    TEST_OK(zs_shm_create(0, CHUNK, CHUNK, &w, &e), e);
    TEST_CHECK(zs_shm_header(w)->generation != zs_shm_header(old)->generation);
    size_t off = zs_shm_header(w)->table_off;
    memcpy((char *)zs_shm_base(w) + off, (char *)zs_shm_base(old) + off, zs_shm_size(w) - off);
    TEST_OK(zs_shm_map(zs_shm_fd(w), 1 << 30, &s, &e), e);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 1, NULL, &e) == ZS_ERR_STATE);
    TEST_CHECKF(has(&e, "published in another session"), "%s", e.msg);
    zs_shm_destroy(s);
    zs_shm_destroy(w);
    zs_shm_destroy(old);
}

static void check_checksum(void)
{
    zs_err_t e;
    zs_shm_t *w, *s;
    TEST_OK(zs_shm_create(0, 2 * CHUNK, CHUNK, &w, &e), e);
    TEST_OK(zs_shm_map(zs_shm_fd(w), 1 << 30, &s, &e), e);
    stage_grads(w, 0, 1);
    TEST_OK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 1, NULL, &e), e);
    unsigned char *p = zs_shm_payload(s, ZS_SHM_GRAD, 0);
    p[777] ^= 0x10;
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 1, NULL, &e) == ZS_ERR_CORRUPT);
    TEST_CHECKF(has(&e, "gradient chunk 0 of step 1: checksum mismatch"), "%s", e.msg);
    p[777] ^= 0x10;
    TEST_OK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 1, NULL, &e), e);
    /* Relabelled (step and state) as step 2 without a new payload: the
     * checksum covers the metadata too. */
    zs_shm_slot_t *sl = slot(w, ZS_SHM_GRAD, 0);
    atomic_store(&sl->step, 2);
    atomic_store(&sl->state, (2u << 1) | 1u);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 2, NULL, &e) == ZS_ERR_CORRUPT);
    TEST_CHECKF(has(&e, "checksum mismatch"), "%s", e.msg);
    /* A state word that does not abbreviate the step. */
    atomic_store(&sl->state, (3u << 1) | 1u);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 0, 2, NULL, &e) == ZS_ERR_CORRUPT);
    TEST_CHECKF(has(&e, "does not match step 2"), "%s", e.msg);
    zs_shm_destroy(s);
    zs_shm_destroy(w);
}

static void check_range(void)
{
    zs_err_t e;
    zs_shm_t *w, *s;
    TEST_OK(zs_shm_create(5000, CHUNK + 10, CHUNK, &w, &e), e);
    TEST_OK(zs_shm_map(zs_shm_fd(w), 1 << 30, &s, &e), e);
    TEST_CHECK(zs_shm_header(s)->nchunks == 2);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 2, 1, NULL, &e) == ZS_ERR_RANGE);
    TEST_CHECKF(has(&e, "chunk 2 out of range (the segment has 2 chunks)"), "%s", e.msg);
    TEST_CHECK(zs_shm_wait(s, ZS_SHM_GRAD, 2, 1, 10, &e) == ZS_ERR_RANGE);
    TEST_CHECK(zs_shm_payload(s, ZS_SHM_GRAD, 2) == NULL);
    TEST_CHECK(zs_shm_payload(s, 2, 0) == NULL);
    TEST_CHECK(zs_shm_publish(w, ZS_SHM_GRAD, 2, 1, ZS_DTYPE_F32, 5000, 1, &e) == ZS_ERR_RANGE);
    /* Elements outside the (short, 10-element) last chunk: nothing written. */
    zs_shm_slot_t before = *slot(w, ZS_SHM_GRAD, 1);
    TEST_CHECK(zs_shm_publish(w, ZS_SHM_GRAD, 1, 1, ZS_DTYPE_F32, 5000 + CHUNK + 5, 6, &e) ==
               ZS_ERR_RANGE);
    TEST_CHECKF(has(&e, "out of range for chunk 1 (its window is [6024, 6034))"), "%s", e.msg);
    TEST_CHECK(zs_shm_publish(w, ZS_SHM_GRAD, 1, 1, ZS_DTYPE_F32, 4999, 1, &e) == ZS_ERR_RANGE);
    TEST_CHECK(zs_shm_publish(w, ZS_SHM_GRAD, 1, 1, ZS_DTYPE_F32, 6030, 0, &e) == ZS_ERR_RANGE);
    TEST_CHECK(memcmp(&before, slot(w, ZS_SHM_GRAD, 1), sizeof before) == 0);
    TEST_CHECK(zs_shm_publish(w, ZS_SHM_GRAD, 1, 1, 3, 6024, 1, &e) == ZS_ERR_INVALID);
    /* A peer that writes a huge count into a ready slot: refused before the
     * payload is touched (it would read past the segment). */
    stage_grads(w, 1, 1);
    atomic_store(&slot(w, ZS_SHM_GRAD, 1)->elem_count, UINT64_C(1) << 40);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 1, 1, NULL, &e) == ZS_ERR_RANGE);
    TEST_CHECKF(has(&e, "out of range for chunk 1"), "%s", e.msg);
    atomic_store(&slot(w, ZS_SHM_GRAD, 1)->elem_count, 10);
    atomic_store(&slot(w, ZS_SHM_GRAD, 1)->elem_begin, UINT64_MAX - 3);
    TEST_CHECK(zs_shm_verify(s, ZS_SHM_GRAD, 1, 1, NULL, &e) == ZS_ERR_RANGE);
    /* Geometry refused at creation. */
    zs_shm_t *x;
    TEST_CHECK(zs_shm_create(0, 100, 0, &x, &e) == ZS_ERR_RANGE && x == NULL);
    TEST_CHECK(zs_shm_create(0, 0, CHUNK, &x, &e) == ZS_ERR_RANGE);
    TEST_CHECK(zs_shm_create(UINT64_MAX - 5, 100, CHUNK, &x, &e) == ZS_ERR_RANGE);
    TEST_CHECK(zs_shm_create(0, UINT64_C(1) << 50, CHUNK, &x, &e) == ZS_ERR_RANGE);
    zs_shm_destroy(s);
    zs_shm_destroy(w);
}

/* A memfd holding the first `copy` bytes of w's segment, `size` bytes long,
 * sealed like a real one when `seal`; hdr_edit (may be NULL) edits the
 * copied header first. */
static int forge(zs_shm_t *w, size_t copy, size_t size, int seal,
                 void (*hdr_edit)(zs_shm_header_t *))
{
    int fd = memfd_create("zs-shm-forged", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    TEST_CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0);
    unsigned char *buf = malloc(copy);
    TEST_CHECK(buf != NULL);
    memcpy(buf, zs_shm_base(w), copy);
    if (hdr_edit)
        hdr_edit((zs_shm_header_t *)buf);
    TEST_CHECK(pwrite(fd, buf, copy, 0) == (ssize_t)copy);
    free(buf);
    if (seal)
        TEST_CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0);
    return fd;
}

static void check_small(void)
{
    zs_err_t e;
    zs_shm_t *w, *s = NULL;
    TEST_OK(zs_shm_create(0, 4 * CHUNK, CHUNK, &w, &e), e);
    size_t total = zs_shm_size(w);
    /* Header intact, segment sealed, but 8 KiB instead of `total`. */
    int fd = forge(w, ZS_SHM_HEADER_BYTES, 8192, 1, NULL);
    TEST_CHECK(zs_shm_map(fd, 1 << 30, &s, &e) == ZS_ERR_RANGE && s == NULL);
    char want[128];
    snprintf(want, sizeof want, "segment is 8192 bytes, its header says %zu", total);
    TEST_CHECKF(has(&e, want), "%s", e.msg);
    close(fd);
    fd = forge(w, 100, 100, 1, NULL);
    TEST_CHECK(zs_shm_map(fd, 1 << 30, &s, &e) == ZS_ERR_RANGE);
    TEST_CHECKF(has(&e, "segment is 100 bytes, smaller than its 4096-byte header"), "%s", e.msg);
    close(fd);
    /* Larger than the server accepts. */
    TEST_CHECK(zs_shm_map(zs_shm_fd(w), total - 1, &s, &e) == ZS_ERR_RANGE);
    TEST_CHECKF(has(&e, "allowed"), "%s", e.msg);
    zs_shm_destroy(w);
}

static void bad_magic(zs_shm_header_t *h)
{
    h->magic ^= 1;
}

static void bad_version(zs_shm_header_t *h)
{
    h->version = 2;
}

static void bad_geometry(zs_shm_header_t *h)
{
    h->param_off += 4096;
}

static void check_magic(void)
{
    zs_err_t e;
    zs_shm_t *w, *s;
    TEST_OK(zs_shm_create(0, 4 * CHUNK, CHUNK, &w, &e), e);
    size_t total = zs_shm_size(w);
    int fd = forge(w, total, total, 1, bad_magic);
    TEST_CHECK(zs_shm_map(fd, 1 << 30, &s, &e) == ZS_ERR_CORRUPT);
    TEST_CHECKF(has(&e, "bad magic") && has(&e, "not a zeroshard segment"), "%s", e.msg);
    close(fd);
    fd = forge(w, total, total, 1, bad_version);
    TEST_CHECK(zs_shm_map(fd, 1 << 30, &s, &e) == ZS_ERR_CORRUPT);
    TEST_CHECKF(has(&e, "segment version 2, this build speaks 1"), "%s", e.msg);
    close(fd);
    fd = forge(w, total, total, 1, bad_geometry);
    TEST_CHECK(zs_shm_map(fd, 1 << 30, &s, &e) == ZS_ERR_CORRUPT);
    TEST_CHECKF(has(&e, "geometry is inconsistent"), "%s", e.msg);
    close(fd);
    /* Unsealed: the worker could shrink it under the server (SIGBUS). */
    fd = forge(w, total, total, 0, NULL);
    TEST_CHECK(zs_shm_map(fd, 1 << 30, &s, &e) == ZS_ERR_INVALID);
    TEST_CHECKF(has(&e, "must be sealed"), "%s", e.msg);
    close(fd);
    /* Not a memfd at all. */
    char tmp[] = "/tmp/zs-shm-file-XXXXXX";
    fd = mkstemp(tmp);
    TEST_CHECK(fd >= 0 && unlink(tmp) == 0);
    TEST_CHECK(pwrite(fd, zs_shm_base(w), total, 0) == (ssize_t)total);
    TEST_CHECK(zs_shm_map(fd, 1 << 30, &s, &e) == ZS_ERR_INVALID);
    TEST_CHECKF(has(&e, "memfd"), "%s", e.msg);
    close(fd);
    /* Control: a faithful sealed copy maps. */
    fd = forge(w, total, total, 1, NULL);
    TEST_OK(zs_shm_map(fd, 1 << 30, &s, &e), e);
    zs_shm_destroy(s);
    close(fd);
    zs_shm_destroy(w);
}

/* ---- processes ---------------------------------------------------------- */

typedef struct {
    int rc;
    char msg[ZS_ERR_MSG_MAX];
} child_res_t;

typedef struct {
    const char *token;
    int setuid_nobody;
    int check_server_uid;
    uid_t server_uid;
    int steps;         /* after OK: run this many steps as the worker */
    int exit_after_ms; /* after OK: sleep, then exit without publishing */
    int raw;           /* instead of zs_shm_connect: raw hello kind (see raw_hello) */
} client_args_t;

/* A hand-made hello: 1 garbage, 2 no fd, 3 two fds (2 and 3 with the token
 * "tok"), 4 a lying token length, 5 no token but one (empty) memfd. */
static int raw_hello(int kind, child_res_t *r)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, g_path);
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0 || connect(sock, (struct sockaddr *)&a, sizeof a) != 0)
        return ZS_ERR_IO;
    if (kind == 6) { /* a worker that connects and says nothing */
        usleep(1000 * 1000);
        return ZS_OK;
    }
    unsigned char m[16 + 3];
    uint64_t magic = kind == 1 ? 0x1234 : ZS_SHM_HELLO_MAGIC;
    uint32_t ver = 1, tl = kind == 4 ? 1u << 31 : kind == 2 || kind == 3 ? 3 : 0;
    memcpy(m, &magic, 8);
    memcpy(m + 8, &ver, 4);
    memcpy(m + 12, &tl, 4);
    memcpy(m + 16, "tok", 3);
    size_t len = kind == 2 || kind == 3 ? 19 : 16;
    int fds[2] = {memfd_create("a", MFD_CLOEXEC), memfd_create("b", MFD_CLOEXEC)};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(2 * sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = m, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (kind == 3 || kind == 5) {
        int nfd = kind == 3 ? 2 : 1;
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.b;
        mh.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfd * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfd * sizeof(int));
    }
    if (sendmsg(sock, &mh, 0) != (ssize_t)len)
        return ZS_ERR_IO;
    unsigned char rep[16 + ZS_ERR_MSG_MAX];
    ssize_t n = recv(sock, rep, sizeof rep, 0);
    if (n < 16)
        return ZS_ERR_IO;
    int32_t code;
    uint32_t ml;
    memcpy(&code, rep + 8, 4);
    memcpy(&ml, rep + 12, 4);
    snprintf(r->msg, sizeof r->msg, "%.*s", (int)ml, (const char *)rep + 16);
    return code;
}

static void client_body(const client_args_t *a, child_res_t *r)
{
    zs_err_t e;
    zs_err_clear(&e);
    if (a->setuid_nobody &&
        (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)) {
        r->rc = ZS_ERR_IO;
        snprintf(r->msg, sizeof r->msg, "setuid: %s", strerror(errno));
        return;
    }
    if (a->raw) {
        r->rc = raw_hello(a->raw, r);
        return;
    }
    zs_shm_t *w;
    r->rc = zs_shm_create(1 << 20, 3 * CHUNK - 7, CHUNK, &w, &e);
    if (r->rc == ZS_OK) {
        zs_shm_client_opts_t o = {.path = g_path,
                                  .token = a->token,
                                  .token_len = a->token ? strlen(a->token) : 0,
                                  .check_server_uid = a->check_server_uid,
                                  .server_uid = a->server_uid,
                                  .timeout_ms = 5000};
        zs_shm_peer_t srv;
        r->rc = zs_shm_connect(&o, w, &srv, &e);
        if (r->rc == ZS_OK && srv.pid != getppid()) {
            r->rc = ZS_ERR_INTERNAL;
            snprintf(e.msg, sizeof e.msg, "server pid %d, parent %d", (int)srv.pid, (int)getppid());
        }
        if (r->rc == ZS_OK && a->exit_after_ms) {
            usleep((useconds_t)a->exit_after_ms * 1000);
            _exit(0);
        }
        for (int s = 1; r->rc == ZS_OK && s <= a->steps; s++) {
            for (uint32_t k = 0; k < 3; k++)
                stage_grads(w, k, (uint64_t)s);
            for (uint32_t k = 0; k < 3; k++)
                check_params(w, k, (uint64_t)s, s % 2 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32);
        }
        zs_shm_destroy(w);
    }
    snprintf(r->msg, sizeof r->msg, "%s", e.msg);
}

/* Fork a worker running client_body; its verdict comes back through *rd. */
static pid_t spawn(const client_args_t *a, int *rd)
{
    int p[2];
    TEST_CHECK(pipe2(p, O_CLOEXEC) == 0);
    fflush(NULL);
    pid_t pid = fork();
    TEST_CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        child_res_t r;
        memset(&r, 0, sizeof r);
        client_body(a, &r);
        ssize_t n = write(p[1], &r, sizeof r);
        _exit(n == (ssize_t)sizeof r ? 0 : 3);
    }
    close(p[1]);
    *rd = p[0];
    return pid;
}

static child_res_t reap(pid_t pid, int rd)
{
    child_res_t r;
    memset(&r, 0, sizeof r);
    ssize_t n = read(rd, &r, sizeof r);
    close(rd);
    int st;
    TEST_CHECK(waitpid(pid, &st, 0) == pid);
    TEST_CHECKF(n == (ssize_t)sizeof r && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                "worker child failed (read %zd, status 0x%x)", n, st);
    return r;
}

static zs_shm_server_t *server(const char *token, const uid_t *allow, size_t nallow)
{
    zs_err_t e;
    zs_shm_server_t *srv;
    zs_shm_server_opts_t o = {.path = g_path,
                              .token = token,
                              .token_len = token ? strlen(token) : 0,
                              .allow_uids = allow,
                              .n_allow_uids = nallow,
                              .max_bytes = 1 << 30,
                              .handshake_ms = 5000};
    TEST_OK(zs_shm_server_create(&o, &srv, &e), e);
    return srv;
}

/* Run one worker against srv: the server's accept result (its segment, if
 * any, destroyed) and, in *cr, the worker's. */
static int one(zs_shm_server_t *srv, const client_args_t *a, zs_err_t *se, child_res_t *cr)
{
    int rd;
    pid_t pid = spawn(a, &rd);
    zs_shm_t *shm = NULL;
    zs_shm_peer_t peer = {0};
    zs_err_clear(se);
    int rc = zs_shm_server_accept(srv, 5000, &shm, &peer, se);
    TEST_CHECK(peer.pid == pid);
    TEST_CHECK((rc == ZS_OK) == (shm != NULL));
    zs_shm_destroy(shm);
    *cr = reap(pid, rd);
    return rc;
}

static void check_hello(void)
{
    zs_shm_server_t *srv = server("tok", NULL, 0);
    const struct {
        int kind;
        int code;
        const char *msg;
    } cases[] = {
        {1, ZS_ERR_INVALID, "not a zeroshard hello"},
        {4, ZS_ERR_INVALID, "hello says 2147483648 token bytes but carries 0"},
        {5, ZS_ERR_UNAUTH, "wrong or missing bearer token"},
        {2, ZS_ERR_INVALID, "the hello carried no segment fd"},
        {3, ZS_ERR_INVALID, "carried more than one file descriptor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        client_args_t a = {.raw = cases[i].kind};
        zs_err_t se;
        child_res_t cr;
        int rc = one(srv, &a, &se, &cr);
        TEST_CHECKF(rc == cases[i].code && has(&se, cases[i].msg), "kind %d: %d %s", cases[i].kind,
                    rc, se.msg);
        TEST_CHECKF(cr.rc == cases[i].code && strstr(cr.msg, cases[i].msg), "worker: %d %s", cr.rc,
                    cr.msg);
    }
    zs_shm_server_destroy(srv);
    /* No token configured: a hello without one gets past the token check
     * (to the segment, an empty memfd here). */
    srv = server(NULL, NULL, 0);
    client_args_t a = {.raw = 5};
    zs_err_t se;
    child_res_t cr;
    TEST_CHECK(one(srv, &a, &se, &cr) == ZS_ERR_RANGE);
    TEST_CHECKF(has(&se, "smaller than its 4096-byte header"), "%s", se.msg);
    zs_shm_server_destroy(srv);
}

static void check_token(void)
{
    zs_shm_server_t *srv = server("s3cret-token", NULL, 0);
    zs_err_t se;
    child_res_t cr;
    const char *bad[] = {"s3cret-tokeN", "s3cret-toke", "s3cret-token!", NULL};
    for (int i = 0; i < 4; i++) {
        client_args_t a = {.token = bad[i]};
        int rc = one(srv, &a, &se, &cr);
        TEST_CHECKF(rc == ZS_ERR_UNAUTH && has(&se, "wrong or missing bearer token"), "%d %s", rc,
                    se.msg);
        TEST_CHECKF(cr.rc == ZS_ERR_UNAUTH && strstr(cr.msg, "the server refused the segment") &&
                        strstr(cr.msg, "wrong or missing bearer token"),
                    "worker: %d %s", cr.rc, cr.msg);
    }
    client_args_t good = {.token = "s3cret-token"};
    int rc = one(srv, &good, &se, &cr);
    TEST_CHECKF(rc == ZS_OK, "%s", se.msg);
    TEST_CHECKF(cr.rc == ZS_OK, "worker: %s", cr.msg);
    zs_shm_server_destroy(srv);
}

static void check_uid(void)
{
    if (geteuid() != 0) {
        printf("skip uid: not root, cannot setuid a child to %u\n", NOBODY);
        return;
    }
    zs_err_t se;
    child_res_t cr;
    zs_shm_server_t *srv = server("tok", NULL, 0);
    /* Gate 1, the file mode: nobody cannot even connect to a 0600 socket in
     * a 0700 directory (opened to 0711 so only the socket's mode counts). */
    TEST_CHECK(chmod(g_dir, 0711) == 0);
    client_args_t a = {.token = "tok", .setuid_nobody = 1, .check_server_uid = 1};
    int rd;
    pid_t pid = spawn(&a, &rd);
    cr = reap(pid, rd);
    TEST_CHECKF(cr.rc == ZS_ERR_UNAUTH && strstr(cr.msg, "admits its owner only"), "%d %s", cr.rc,
                cr.msg);
    /* Gate 2, SO_PEERCRED: with the mode widened, the uid is refused. */
    TEST_CHECK(chmod(g_path, 0666) == 0);
    int rc = one(srv, &a, &se, &cr);
    TEST_CHECKF(rc == ZS_ERR_UNAUTH && has(&se, "peer uid 65534 is not allowed"), "%d %s", rc,
                se.msg);
    TEST_CHECKF(cr.rc == ZS_ERR_UNAUTH && strstr(cr.msg, "peer uid 65534 is not allowed"),
                "worker: %d %s", cr.rc, cr.msg);
    zs_shm_server_destroy(srv);
    /* Admitted when allowed (its memfd belongs to 65534 too). */
    uid_t allow = NOBODY;
    srv = server("tok", &allow, 1);
    TEST_CHECK(chmod(g_path, 0666) == 0);
    rc = one(srv, &a, &se, &cr);
    TEST_CHECKF(rc == ZS_OK && cr.rc == ZS_OK, "%d %s / %d %s", rc, se.msg, cr.rc, cr.msg);
    /* The worker refuses a server of another uid than its own: nothing sent
     * (the server sees the connection close before a hello). */
    client_args_t b = {.token = "tok", .setuid_nobody = 1};
    rc = one(srv, &b, &se, &cr);
    TEST_CHECKF(cr.rc == ZS_ERR_UNAUTH && strstr(cr.msg, "is served by uid 0, not uid 65534"),
                "worker: %d %s", cr.rc, cr.msg);
    TEST_CHECKF(rc == ZS_ERR_UNAVAILABLE && has(&se, "closed the connection before the hello"),
                "%d %s", rc, se.msg);
    zs_shm_server_destroy(srv);
    TEST_CHECK(chmod(g_dir, 0700) == 0);
}

static void check_timeouts(void)
{
    /* Server: a worker that connects and sends nothing is dropped at the
     * handshake deadline (200 ms), not when it goes away (1 s). */
    zs_err_t e;
    zs_shm_server_t *srv;
    zs_shm_server_opts_t o = {.path = g_path, .handshake_ms = 200};
    TEST_OK(zs_shm_server_create(&o, &srv, &e), e);
    client_args_t a = {.raw = 6};
    int rd;
    pid_t pid = spawn(&a, &rd);
    zs_shm_t *s = NULL;
    TEST_CHECK(zs_shm_server_accept(srv, 5000, &s, NULL, &e) == ZS_ERR_TIMEOUT && s == NULL);
    TEST_CHECKF(has(&e, "timed out waiting for the hello"), "%s", e.msg);
    child_res_t cr = reap(pid, rd);
    TEST_CHECK(cr.rc == ZS_OK);
    TEST_CHECK(zs_shm_server_accept(srv, 100, &s, NULL, &e) == ZS_ERR_TIMEOUT);
    TEST_CHECKF(has(&e, "no worker connected within 100 ms"), "%s", e.msg);
    zs_shm_server_destroy(srv);
    /* Worker: a listener that never answers (the connection waits in its
     * backlog) ends at the client's deadline. */
    int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, g_path);
    TEST_CHECK(l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(l, 4) == 0);
    zs_shm_t *w;
    TEST_OK(zs_shm_create(0, CHUNK, CHUNK, &w, &e), e);
    zs_shm_client_opts_t co = {.path = g_path, .timeout_ms = 300};
    double t0 = now_s();
    TEST_CHECK(zs_shm_connect(&co, w, NULL, &e) == ZS_ERR_TIMEOUT);
    TEST_CHECKF(has(&e, "timed out waiting for the server's reply"), "%s", e.msg);
    TEST_CHECKF(now_s() - t0 < 2.0, "gave up after %.2f s", now_s() - t0);
    zs_shm_destroy(w);
    close(l);
    TEST_CHECK(unlink(g_path) == 0);
}

static void check_twoproc(void)
{
    zs_shm_server_t *srv = server("tok", NULL, 0);
    client_args_t a = {.token = "tok", .steps = 3};
    int rd;
    pid_t pid = spawn(&a, &rd);
    zs_err_t e;
    zs_shm_t *s;
    zs_shm_peer_t peer;
    TEST_OK(zs_shm_server_accept(srv, 5000, &s, &peer, &e), e);
    TEST_CHECK(peer.pid == pid && peer.uid == geteuid());
    const zs_shm_header_t *h = zs_shm_header(s);
    TEST_CHECK(h->range_begin == 1 << 20 && h->range_count == 3 * CHUNK - 7 && h->nchunks == 3);
    TEST_CHECK(h->owner_pid == (uint32_t)pid); /* same pid namespace here */
    for (int st = 1; st <= 3; st++)
        for (uint32_t k = 0; k < 3; k++)
            serve_chunk(s, k, (uint64_t)st, st % 2 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32);
    child_res_t cr = reap(pid, rd);
    TEST_CHECKF(cr.rc == ZS_OK, "worker: %d %s", cr.rc, cr.msg);
    zs_shm_destroy(s);
    zs_shm_server_destroy(srv);
}

static void check_peerdeath(void)
{
    zs_shm_server_t *srv = server(NULL, NULL, 0);
    client_args_t a = {.exit_after_ms = 200};
    int rd;
    pid_t pid = spawn(&a, &rd);
    zs_err_t e;
    zs_shm_t *s;
    TEST_OK(zs_shm_server_accept(srv, 5000, &s, NULL, &e), e);
    TEST_CHECK(zs_shm_peer_alive(s));
    double t0 = now_s();
    int rc = zs_shm_wait(s, ZS_SHM_GRAD, 0, 1, 10000, &e);
    double dt = now_s() - t0;
    TEST_CHECKF(rc == ZS_ERR_UNAVAILABLE && has(&e, "exited while gradient chunk 0"), "%d %s", rc,
                e.msg);
    TEST_CHECKF(dt < 3.0, "noticed the exit after %.2f s", dt);
    TEST_CHECK(!zs_shm_peer_alive(s));
    int st;
    close(rd);
    TEST_CHECK(waitpid(pid, &st, 0) == pid);
    zs_shm_destroy(s);
    zs_shm_server_destroy(srv);
}

static void check_fdleak(void)
{
    int before = count_fds();
    zs_err_t e;
    zs_shm_t *w, *s;
    TEST_OK(zs_shm_create(0, 2 * CHUNK, CHUNK, &w, &e), e);
    TEST_OK(zs_shm_map(zs_shm_fd(w), 1 << 30, &s, &e), e);
    TEST_OK(zs_shm_watch_peer(s, getpid(), &e), e);
    TEST_OK(zs_shm_watch_peer(s, getpid(), &e), e); /* replaces the first pidfd */
    zs_shm_destroy(s);
    TEST_CHECK(zs_shm_map(zs_shm_fd(w), 10, &s, &e) == ZS_ERR_RANGE);
    zs_shm_destroy(w);
    /* Accepted, refused with an fd received (token, two fds), refused early. */
    zs_shm_server_t *srv = server("tok", NULL, 0);
    const client_args_t cases[] = {{.token = "tok"}, {.token = "bad"}, {.raw = 3}, {.raw = 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        child_res_t cr;
        int rc = one(srv, &cases[i], &e, &cr);
        TEST_CHECKF((rc == ZS_OK) == (i == 0), "case %zu: %d %s", i, rc, e.msg);
    }
    TEST_CHECK(zs_shm_server_accept(srv, 50, &s, NULL, &e) == ZS_ERR_TIMEOUT);
    zs_shm_server_destroy(srv);
    int after = count_fds();
    TEST_CHECKF(after == before, "%d fds before, %d after", before, after);
}

static void check_sockfile(void)
{
    mode_t old = umask(0);
    zs_shm_server_t *srv = server(NULL, NULL, 0);
    umask(old);
    struct stat st;
    TEST_CHECK(lstat(g_path, &st) == 0 && S_ISSOCK(st.st_mode));
    TEST_CHECKF((st.st_mode & 0777) == 0600, "mode 0%o", (unsigned)(st.st_mode & 0777));
    /* A second server on a live path is refused. */
    zs_err_t e;
    zs_shm_server_t *two;
    zs_shm_server_opts_t o = {.path = g_path};
    TEST_CHECK(zs_shm_server_create(&o, &two, &e) == ZS_ERR_EXISTS);
    TEST_CHECKF(has(&e, "has a server listening on it"), "%s", e.msg);
    zs_shm_server_destroy(srv);
    TEST_CHECK(lstat(g_path, &st) != 0 && errno == ENOENT);
    /* A crashed server's file (its process gone, the file left) is replaced. */
    fflush(NULL);
    pid_t pid = fork();
    TEST_CHECK(pid >= 0);
    if (pid == 0) {
        zs_shm_server_t *x;
        _exit(zs_shm_server_create(&o, &x, NULL) == ZS_OK ? 0 : 1);
    }
    int ws;
    TEST_CHECK(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    TEST_CHECK(lstat(g_path, &st) == 0 && S_ISSOCK(st.st_mode));
    TEST_OK(zs_shm_server_create(&o, &srv, &e), e);
    zs_shm_server_destroy(srv);
    TEST_CHECK(lstat(g_path, &st) != 0 && errno == ENOENT);
    /* Not a socket: left alone. */
    int fd = open(g_path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    TEST_CHECK(fd >= 0);
    close(fd);
    TEST_CHECK(zs_shm_server_create(&o, &srv, &e) == ZS_ERR_EXISTS);
    TEST_CHECKF(has(&e, "exists and is not a socket"), "%s", e.msg);
    TEST_CHECK(unlink(g_path) == 0);
    /* Nobody listening: the worker says so. */
    zs_shm_t *w;
    TEST_OK(zs_shm_create(0, CHUNK, CHUNK, &w, &e), e);
    zs_shm_client_opts_t co = {.path = g_path, .timeout_ms = 500};
    TEST_CHECK(zs_shm_connect(&co, w, NULL, &e) == ZS_ERR_UNAVAILABLE);
    TEST_CHECKF(has(&e, "no server listening"), "%s", e.msg);
    zs_shm_destroy(w);
}

static const struct {
    const char *name;
    void (*fn)(void);
} checks[] = {
    {"roundtrip", check_roundtrip}, {"wake", check_wake},           {"stale", check_stale},
    {"session", check_session},     {"checksum", check_checksum},   {"range", check_range},
    {"small", check_small},         {"magic", check_magic},         {"hello", check_hello},
    {"token", check_token},         {"timeouts", check_timeouts},   {"uid", check_uid},
    {"twoproc", check_twoproc},     {"peerdeath", check_peerdeath}, {"fdleak", check_fdleak},
    {"sockfile", check_sockfile},
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(g_dir, sizeof g_dir, "/tmp/zs-shm-XXXXXX");
    TEST_CHECK(mkdtemp(g_dir) != NULL);
    snprintf(g_path, sizeof g_path, "%s/s.sock", g_dir);
    int ran = 0;
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        if (argc > 1 && strcmp(argv[1], checks[i].name) != 0)
            continue;
        checks[i].fn();
        printf("ok %s\n", checks[i].name);
        fflush(stdout);
        ran++;
    }
    unlink(g_path);
    rmdir(g_dir);
    TEST_CHECKF(ran > 0, "no check named %s", argc > 1 ? argv[1] : "?");
    printf("test_shm: %d checks passed\n", ran);
    return 0;
}
