/*
 * zs_shm_sock.c - the Unix-socket handshake that passes a worker's memfd to
 * a co-located server (see zs_shm_sock.h for the checks and the wire).
 *
 * Sockets are SOCK_SEQPACKET, non-blocking, close-on-exec; every wait is a
 * poll with the time left to a deadline. Buffers are fixed-size: the hello
 * is at most 16 + ZS_SHM_TOKEN_MAX bytes, the reply 16 + ZS_ERR_MSG_MAX.
 */
#define _GNU_SOURCE /* memfd_create, fallocate, accept4, struct ucred */
#include "zs_shm_sock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HELLO_HEAD           16 /* u64 magic, u32 version, u32 token_len */
#define REPLY_HEAD           16 /* u64 magic, i32 code, u32 msg_len */
#define DEFAULT_HANDSHAKE_MS 5000
#define DEFAULT_MAX_BYTES    (1ull << 46)

struct zs_shm_server {
    int fd;
    struct sockaddr_un addr;
    dev_t dev; /* the socket file we bound: removed on destroy only if unchanged */
    ino_t ino;
    unsigned char *token; /* token_len bytes, NULL when none configured */
    size_t token_len;
    uid_t *allow; /* n_allow uids besides geteuid() */
    size_t n_allow;
    uint64_t max_bytes;
    int handshake_ms;
    int (*check)(void *arg, const zs_shm_t *shm, zs_err_t *err);
    void *check_arg;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for events on fd until deadline (INT64_MAX: none). 1 ready, 0 timed
 * out, -1 error (errno). */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline == INT64_MAX ? -1 : deadline - now_ms();
        if (deadline != INT64_MAX && left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

static int64_t deadline_of(int timeout_ms)
{
    return timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
}

/* Every byte of `want` is compared whatever `got` holds: the time depends on
 * want_len only (as zs__ct_equal in proto/, which common/ cannot use). */
static int ct_equal(const void *want, size_t want_len, const void *got, size_t got_len)
{
    const volatile unsigned char *w = want, *g = got;
    unsigned diff = want_len != got_len;
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned)(w[i] ^ (i < got_len ? g[i] : (unsigned char)~w[i]));
    return diff == 0;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4); /* little-endian hosts only, as everywhere in zeroshard */
}

static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int set_addr(struct sockaddr_un *a, const char *path, zs_err_t *err)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = path ? strlen(path) : 0;
    if (n == 0 || n >= sizeof a->sun_path)
        return zs_err_set(err, ZS_ERR_INVALID, "shm socket: path must be 1..%zu bytes (got %zu)",
                          sizeof a->sun_path - 1, n);
    memcpy(a->sun_path, path, n);
    return ZS_OK;
}

/* Send one message (with an fd when fd >= 0) before the deadline. */
static int send_msg(int sock, const void *buf, size_t len, int fd, int64_t deadline,
                    const char *what, zs_err_t *err)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        m.msg_control = ctl.b;
        m.msg_controllen = sizeof ctl.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    for (;;) {
        ssize_t n = sendmsg(sock, &m, MSG_NOSIGNAL);
        if (n == (ssize_t)len)
            return ZS_OK;
        if (n >= 0) /* SEQPACKET sends whole messages; anything else is a bug */
            return zs_err_set(err, ZS_ERR_INTERNAL, "shm socket: short send of the %s", what);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return zs_err_set(err, ZS_ERR_UNAVAILABLE, "shm socket: sending the %s: %s", what,
                              strerror(errno));
        int r = wait_fd(sock, POLLOUT, deadline);
        if (r == 0)
            return zs_err_set(err, ZS_ERR_TIMEOUT, "shm socket: timed out sending the %s", what);
        if (r < 0)
            return zs_err_set(err, ZS_ERR_IO, "shm socket: poll: %s", strerror(errno));
    }
}

/* Receive one message of at most cap bytes (MSG_TRUNC: longer is refused)
 * before the deadline. With fds != NULL, up to 1 passed fd is stored in
 * *fds (-1 if none); any fd beyond that is closed and the message refused. */
static int recv_msg(int sock, void *buf, size_t cap, size_t *len, int *fds, int64_t deadline,
                    const char *what, zs_err_t *err)
{
    if (fds)
        *fds = -1;
    int reset_seen = 0;
    for (;;) {
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        m.msg_control = ctl.b;
        m.msg_controllen = sizeof ctl.b;
        ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        /* A peer that closes with our message unread in its queue (a server
         * refusing before it reads the hello) leaves ECONNRESET pending;
         * the kernel reports it before queued data and clears it, so the
         * next call returns the reply it sent before closing (or EOF). */
        if (n < 0 && errno == ECONNRESET && !reset_seen) {
            reset_seen = 1;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = wait_fd(sock, POLLIN, deadline);
            if (r == 0)
                return zs_err_set(err, ZS_ERR_TIMEOUT, "shm socket: timed out waiting for the %s",
                                  what);
            if (r < 0)
                return zs_err_set(err, ZS_ERR_IO, "shm socket: poll: %s", strerror(errno));
            continue;
        }
        if (n < 0)
            return zs_err_set(err, ZS_ERR_UNAVAILABLE, "shm socket: receiving the %s: %s", what,
                              strerror(errno));
        /* Collect every passed fd: the one we expect, or ones to close. */
        int extra = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int f;
                memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
                if (fds && *fds < 0) {
                    *fds = f;
                } else {
                    close(f);
                    extra++;
                }
            }
        }
        if (extra || (m.msg_flags & MSG_CTRUNC)) {
            if (fds && *fds >= 0) {
                close(*fds);
                *fds = -1;
            }
            return zs_err_set(err, ZS_ERR_INVALID,
                              "shm socket: the %s carried more than one file descriptor", what);
        }
        if (n == 0)
            return zs_err_set(err, ZS_ERR_UNAVAILABLE,
                              "shm socket: the peer closed the connection before the %s", what);
        if (m.msg_flags & MSG_TRUNC)
            return zs_err_set(err, ZS_ERR_INVALID, "shm socket: the %s is longer than %zu bytes",
                              what, cap);
        *len = (size_t)n;
        return ZS_OK;
    }
}

static int uid_allowed(const zs_shm_server_t *srv, uid_t uid)
{
    if (uid == geteuid())
        return 1;
    for (size_t i = 0; i < srv->n_allow; i++)
        if (srv->allow[i] == uid)
            return 1;
    return 0;
}

/* Tell the worker the verdict (best effort on a refusal: the peer may be
 * gone). msg is cut to ZS_ERR_MSG_MAX - 1 bytes. */
static int send_reply(int sock, int code, const char *msg, int64_t deadline, zs_err_t *err)
{
    unsigned char buf[REPLY_HEAD + ZS_ERR_MSG_MAX];
    size_t n = strlen(msg);
    if (n > ZS_ERR_MSG_MAX - 1)
        n = ZS_ERR_MSG_MAX - 1;
    put_u64(buf, ZS_SHM_REPLY_MAGIC);
    put_u32(buf + 8, (uint32_t)(int32_t)code);
    put_u32(buf + 12, (uint32_t)n);
    memcpy(buf + REPLY_HEAD, msg, n);
    return send_msg(sock, buf, REPLY_HEAD + n, -1, deadline, "reply", err);
}

/* The checks 2..5 of zs_shm_sock.h on one accepted connection. On ZS_OK *out
 * is the mapped segment. */
static int handshake(zs_shm_server_t *srv, int sock, const struct ucred *cred, int64_t deadline,
                     zs_shm_t **out, zs_err_t *err)
{
    unsigned char buf[HELLO_HEAD + ZS_SHM_TOKEN_MAX];
    size_t len = 0;
    int fd = -1;
    int rc = recv_msg(sock, buf, sizeof buf, &len, &fd, deadline, "hello", err);
    if (rc)
        return rc;
    if (len < HELLO_HEAD || get_u64(buf) != ZS_SHM_HELLO_MAGIC) {
        rc = zs_err_set(err, ZS_ERR_INVALID, "shm socket: not a zeroshard hello (%zu bytes)", len);
        goto out;
    }
    if (get_u32(buf + 8) != ZS_SHM_SOCK_VERSION) {
        rc = zs_err_set(err, ZS_ERR_STATE, "shm socket: hello version %u, this server speaks %u",
                        get_u32(buf + 8), ZS_SHM_SOCK_VERSION);
        goto out;
    }
    uint32_t tlen = get_u32(buf + 12);
    if (tlen != len - HELLO_HEAD) {
        rc =
            zs_err_set(err, ZS_ERR_INVALID, "shm socket: hello says %u token bytes but carries %zu",
                       tlen, len - HELLO_HEAD);
        goto out;
    }
    if (srv->token && !ct_equal(srv->token, srv->token_len, buf + HELLO_HEAD, tlen)) {
        rc = zs_err_set(err, ZS_ERR_UNAUTH, "shm socket: wrong or missing bearer token");
        goto out;
    }
    if (fd < 0) {
        rc = zs_err_set(err, ZS_ERR_INVALID, "shm socket: the hello carried no segment fd");
        goto out;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm socket: fstat of the segment: %s", strerror(errno));
        goto out;
    }
    if (st.st_uid != cred->uid) {
        rc = zs_err_set(err, ZS_ERR_UNAUTH,
                        "shm socket: the segment belongs to uid %u, not to the connecting uid %u",
                        (unsigned)st.st_uid, (unsigned)cred->uid);
        goto out;
    }
    zs_shm_t *shm = NULL;
    rc = zs_shm_map(fd, srv->max_bytes, &shm, err);
    if (rc == ZS_OK && srv->check)
        rc = srv->check(srv->check_arg, shm, err);
    if (rc == ZS_OK)
        rc = zs_shm_watch_peer(shm, cred->pid, err);
    if (rc)
        zs_shm_destroy(shm);
    else
        *out = shm;
out:
    if (fd >= 0)
        close(fd); /* the handle holds its own dup */
    return rc;
}

int zs_shm_server_accept(zs_shm_server_t *srv, int timeout_ms, zs_shm_t **out, zs_shm_peer_t *peer,
                         zs_err_t *err)
{
    *out = NULL;
    int64_t deadline = deadline_of(timeout_ms);
    int sock;
    for (;;) {
        sock = accept4(srv->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (sock >= 0)
            break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return zs_err_set(err, ZS_ERR_IO, "shm socket: accept: %s", strerror(errno));
        int r = wait_fd(srv->fd, POLLIN, deadline);
        if (r == 0)
            return zs_err_set(err, ZS_ERR_TIMEOUT, "shm socket: no worker connected within %d ms",
                              timeout_ms);
        if (r < 0)
            return zs_err_set(err, ZS_ERR_IO, "shm socket: poll: %s", strerror(errno));
    }
    int64_t hs_deadline = now_ms() + srv->handshake_ms;
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cl != sizeof cred) {
        int rc = zs_err_set(err, ZS_ERR_IO, "shm socket: SO_PEERCRED: %s", strerror(errno));
        close(sock);
        return rc;
    }
    if (peer) {
        peer->pid = cred.pid;
        peer->uid = cred.uid;
        peer->gid = cred.gid;
    }
    /* A local record: the refusal's sentence goes to the worker even when
     * the caller passed no err. */
    zs_err_t e;
    zs_err_clear(&e);
    int rc;
    if (!uid_allowed(srv, cred.uid)) /* before reading a byte; a queued fd dies with sock */
        rc = zs_err_set(&e, ZS_ERR_UNAUTH,
                        "shm socket: peer uid %u is not allowed (the server runs as uid %u)",
                        (unsigned)cred.uid, (unsigned)geteuid());
    else
        rc = handshake(srv, sock, &cred, hs_deadline, out, &e);
    zs_err_t serr;
    if (rc == ZS_OK) {
        if (send_reply(sock, ZS_OK, "", hs_deadline, &serr) != ZS_OK) {
            zs_shm_destroy(*out);
            *out = NULL;
            rc = zs_err_set(&e, serr.code, "%s", serr.msg);
        }
    } else if (rc != ZS_ERR_UNAVAILABLE && rc != ZS_ERR_TIMEOUT) {
        send_reply(sock, rc, e.msg, hs_deadline, &serr); /* best effort */
    }
    close(sock);
    if (rc) {
        zs_err_prefix(&e, "worker pid %d uid %u: ", (int)cred.pid, (unsigned)cred.uid);
        if (err)
            *err = e;
    }
    return rc;
}

/* Is something listening on a's path? 1 yes, 0 no (ECONNREFUSED: a stale
 * file), -1 cannot tell (errno). */
static int path_live(const struct sockaddr_un *a)
{
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    int r = connect(s, (const struct sockaddr *)a, sizeof *a);
    int e = errno;
    close(s);
    if (r == 0 || e == EAGAIN)
        return 1;
    if (e == ECONNREFUSED)
        return 0;
    errno = e;
    return -1;
}

int zs_shm_server_create(const zs_shm_server_opts_t *o, zs_shm_server_t **out, zs_err_t *err)
{
    *out = NULL;
    if (o->token_len > ZS_SHM_TOKEN_MAX || (o->token_len && !o->token))
        return zs_err_set(err, ZS_ERR_INVALID, "shm socket: token of %zu bytes (at most %d)",
                          o->token_len, ZS_SHM_TOKEN_MAX);
    if (o->n_allow_uids && !o->allow_uids)
        return zs_err_set(err, ZS_ERR_INVALID, "shm socket: %zu allowed uids but no list",
                          o->n_allow_uids);
    zs_shm_server_t *srv = calloc(1, sizeof *srv);
    if (!srv)
        return zs_err_set(err, ZS_ERR_NOMEM, "shm socket: out of memory");
    srv->fd = -1;
    int rc = set_addr(&srv->addr, o->path, err);
    if (rc)
        goto fail;
    srv->max_bytes = o->max_bytes ? o->max_bytes : DEFAULT_MAX_BYTES;
    srv->handshake_ms = o->handshake_ms > 0 ? o->handshake_ms : DEFAULT_HANDSHAKE_MS;
    srv->check = o->check;
    srv->check_arg = o->check_arg;
    if (o->token_len) {
        srv->token = malloc(o->token_len);
        if (!srv->token) {
            rc = zs_err_set(err, ZS_ERR_NOMEM, "shm socket: out of memory");
            goto fail;
        }
        memcpy(srv->token, o->token, o->token_len);
        srv->token_len = o->token_len;
    }
    if (o->n_allow_uids) {
        srv->allow = calloc(o->n_allow_uids, sizeof *srv->allow);
        if (!srv->allow) {
            rc = zs_err_set(err, ZS_ERR_NOMEM, "shm socket: out of memory");
            goto fail;
        }
        memcpy(srv->allow, o->allow_uids, o->n_allow_uids * sizeof *srv->allow);
        srv->n_allow = o->n_allow_uids;
    }
    struct stat st;
    if (lstat(o->path, &st) == 0) {
        int live = S_ISSOCK(st.st_mode) ? path_live(&srv->addr) : -1;
        if (!S_ISSOCK(st.st_mode) || live != 0) {
            rc = zs_err_set(err, ZS_ERR_EXISTS, "shm socket: %s %s", o->path,
                            !S_ISSOCK(st.st_mode) ? "exists and is not a socket"
                            : live == 1           ? "has a server listening on it"
                                                  : "exists and cannot be probed");
            goto fail;
        }
        unlink(o->path); /* stale: nobody listens behind it (a crashed server's) */
    }
    srv->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (srv->fd < 0) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm socket: socket: %s", strerror(errno));
        goto fail;
    }
    /* bind takes the file's mode from the socket's inode (masked by the
     * umask): 0600 from the start, no window with a wider mode. */
    if (fchmod(srv->fd, 0600) != 0 ||
        bind(srv->fd, (const struct sockaddr *)&srv->addr, sizeof srv->addr) != 0) {
        rc = zs_err_set(err, errno == EADDRINUSE ? ZS_ERR_EXISTS : ZS_ERR_IO,
                        "shm socket: bind %s: %s", o->path, strerror(errno));
        goto fail;
    }
    if (lstat(o->path, &st) != 0 || !S_ISSOCK(st.st_mode) || (st.st_mode & 0077) ||
        st.st_uid != geteuid()) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm socket: %s is not a 0600 socket of ours after bind",
                        o->path);
        unlink(o->path);
        goto fail;
    }
    srv->dev = st.st_dev;
    srv->ino = st.st_ino;
    if (listen(srv->fd, 16) != 0) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm socket: listen: %s", strerror(errno));
        unlink(o->path);
        goto fail;
    }
    *out = srv;
    return ZS_OK;
fail:
    if (srv->fd >= 0)
        close(srv->fd);
    free(srv->token);
    free(srv->allow);
    free(srv);
    return rc;
}

void zs_shm_server_destroy(zs_shm_server_t *srv)
{
    if (!srv)
        return;
    struct stat st;
    if (lstat(srv->addr.sun_path, &st) == 0 && st.st_dev == srv->dev && st.st_ino == srv->ino)
        unlink(srv->addr.sun_path);
    close(srv->fd);
    free(srv->token);
    free(srv->allow);
    free(srv);
}

int zs_shm_server_fd(const zs_shm_server_t *srv)
{
    return srv->fd;
}

/* Printable copy of a peer's message (control bytes become '?'). */
static void printable(char *dst, const unsigned char *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? (char)src[i] : '?';
    dst[n] = '\0';
}

int zs_shm_connect(const zs_shm_client_opts_t *o, zs_shm_t *shm, zs_shm_peer_t *server,
                   zs_err_t *err)
{
    struct sockaddr_un a;
    int rc = set_addr(&a, o->path, err);
    if (rc)
        return rc;
    if (o->token_len > ZS_SHM_TOKEN_MAX || (o->token_len && !o->token))
        return zs_err_set(err, ZS_ERR_INVALID, "shm socket: token of %zu bytes (at most %d)",
                          o->token_len, ZS_SHM_TOKEN_MAX);
    int64_t deadline = now_ms() + (o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_HANDSHAKE_MS);
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0)
        return zs_err_set(err, ZS_ERR_IO, "shm socket: socket: %s", strerror(errno));
    /* A non-blocking Unix connect completes at once or says EAGAIN (the
     * server's backlog is full): retry every 10 ms until the deadline. */
    while (connect(sock, (const struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        if (e == EAGAIN && now_ms() < deadline) {
            nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
            continue;
        }
        rc = zs_err_set(err,
                        e == EACCES || e == EPERM ? ZS_ERR_UNAUTH
                        : e == EAGAIN             ? ZS_ERR_TIMEOUT
                                                  : ZS_ERR_UNAVAILABLE,
                        "shm socket: connect %s: %s%s", o->path, strerror(e),
                        e == EACCES                        ? " (the socket admits its owner only)"
                        : e == ECONNREFUSED || e == ENOENT ? " (no server listening)"
                                                           : "");
        goto out;
    }
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cl != sizeof cred) {
        rc = zs_err_set(err, ZS_ERR_IO, "shm socket: SO_PEERCRED: %s", strerror(errno));
        goto out;
    }
    uid_t want = o->check_server_uid ? o->server_uid : geteuid();
    if (cred.uid != want) {
        rc = zs_err_set(err, ZS_ERR_UNAUTH,
                        "shm socket: %s is served by uid %u, not uid %u: segment not sent", o->path,
                        (unsigned)cred.uid, (unsigned)want);
        goto out;
    }
    unsigned char hello[HELLO_HEAD + ZS_SHM_TOKEN_MAX];
    put_u64(hello, ZS_SHM_HELLO_MAGIC);
    put_u32(hello + 8, ZS_SHM_SOCK_VERSION);
    put_u32(hello + 12, (uint32_t)o->token_len);
    if (o->token_len)
        memcpy(hello + HELLO_HEAD, o->token, o->token_len);
    zs_err_t serr;
    int src =
        send_msg(sock, hello, HELLO_HEAD + o->token_len, zs_shm_fd(shm), deadline, "hello", &serr);
    if (src != ZS_OK && src != ZS_ERR_UNAVAILABLE) {
        rc = zs_err_set(err, src, "%s", serr.msg);
        goto out;
    }
    /* Even when the send failed (EPIPE): a server that refuses our uid
     * answers and closes before reading the hello, and its reply is
     * waiting in our queue. */
    unsigned char reply[REPLY_HEAD + ZS_ERR_MSG_MAX];
    size_t len = 0;
    rc = recv_msg(sock, reply, sizeof reply, &len, NULL, deadline, "server's reply", err);
    if (rc && src != ZS_OK)
        rc = zs_err_set(err, src, "%s", serr.msg);
    if (rc)
        goto out;
    uint32_t mlen = len >= REPLY_HEAD ? get_u32(reply + 12) : 0;
    if (len < REPLY_HEAD || get_u64(reply) != ZS_SHM_REPLY_MAGIC || mlen != len - REPLY_HEAD ||
        mlen >= ZS_ERR_MSG_MAX) {
        rc = zs_err_set(err, ZS_ERR_INVALID, "shm socket: malformed reply (%zu bytes)", len);
        goto out;
    }
    int code = (int)(int32_t)get_u32(reply + 8);
    if (code != ZS_OK) {
        char msg[ZS_ERR_MSG_MAX];
        printable(msg, reply + REPLY_HEAD, mlen);
        if (code > 0 || code < ZS_ERR_UNIMPLEMENTED)
            code = ZS_ERR_INTERNAL;
        rc = zs_err_set(err, code, "shm socket: the server refused the segment: %s", msg);
        goto out;
    }
    rc = zs_shm_watch_peer(shm, cred.pid, err);
    if (rc == ZS_OK && server) {
        server->pid = cred.pid;
        server->uid = cred.uid;
        server->gid = cred.gid;
    }
out:
    close(sock);
    return rc;
}
