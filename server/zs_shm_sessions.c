/*
 * zs_shm_sessions.c - the shm socket's listener thread and the session
 * table (see zs_shm_sessions.h).
 *
 * One mutex guards the table; mapping and unmapping happen outside it. A
 * session holds one reference for the table and one per handler using it;
 * whoever drops the last unmaps it and logs its end.
 *
 * zs_shm_server_accept answers the worker's hello before it returns the
 * segment to the listener, so a worker's first Hello can arrive before the
 * listener has entered the session. The generation being handed over is
 * therefore marked pending from the last check before the answer (the
 * `check` callback) until the listener has entered or dropped it, and a
 * lookup of it waits for that (microseconds; at most the handshake's
 * deadline).
 */
#define _GNU_SOURCE /* realpath */
#include "zs_shm_sessions.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "zs_log.h"
#include "zs_shm.h"
#include "zs_shm_sock.h"

#define MIB (1024.0 * 1024.0)

struct zs_shm_session {
    _Atomic int refs; /* the table's (while in it) + one per zs_shm_sessions_get */
    zs_shm_t *shm;
    uint64_t id; /* the header's generation */
    pid_t pid;
    uid_t uid;
    unsigned char *stg; /* the staging area: the GRAD payload area */
    uint64_t stg_bytes;
    _Atomic uint64_t in, out; /* payload bytes pushed / pulled through it */
    struct timespec t0;
    const char *why_end; /* set when it leaves the table, read by the last put */
};

struct zs_shm_sessions {
    zs_shm_server_t *srv;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    pthread_t thread;
    _Atomic int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;                          /* pending cleared */
    zs_shm_session_t *tab[ZS_SHM_SESSIONS_MAX]; /* guarded by mu */
    int n;
    uint64_t pending; /* generation in a hand-over past its checks; 0: none (mu) */
};

/* bytes for a log line: "12 KiB" below 1 MiB, else "3.4 MiB" (into buf). */
static const char *size_str(uint64_t bytes, char *buf, size_t cap)
{
    if (bytes < (1u << 20))
        snprintf(buf, cap, "%llu KiB", (unsigned long long)(bytes + 1023) / 1024);
    else
        snprintf(buf, cap, "%.1f MiB", (double)bytes / MIB);
    return buf;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

void zs_shm_session_put(zs_shm_session_t *ss)
{
    if (!ss || atomic_fetch_sub_explicit(&ss->refs, 1, memory_order_acq_rel) != 1)
        return;
    char a[32], b[32];
    ZS_INFO("shm session %016llx ended (%s): worker pid %d, %s pushed, %s pulled in %.1f s",
            (unsigned long long)ss->id, ss->why_end ? ss->why_end : "?", (int)ss->pid,
            size_str(atomic_load(&ss->in), a, sizeof a),
            size_str(atomic_load(&ss->out), b, sizeof b), seconds_since(&ss->t0));
    zs_shm_destroy(ss->shm);
    free(ss);
}

/* Take tab[i] out of the table (mu held); the caller puts it after
 * unlocking. */
static zs_shm_session_t *remove_locked(zs_shm_sessions_t *s, int i, const char *why)
{
    zs_shm_session_t *ss = s->tab[i];
    ss->why_end = why;
    s->tab[i] = s->tab[--s->n];
    s->tab[s->n] = NULL;
    return ss;
}

/* End the sessions whose worker has exited. */
static void reap(zs_shm_sessions_t *s)
{
    zs_shm_session_t *gone[ZS_SHM_SESSIONS_MAX];
    int ng = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n;)
        if (!zs_shm_peer_alive(s->tab[i]->shm))
            gone[ng++] = remove_locked(s, i, "its worker exited");
        else
            i++;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < ng; i++)
        zs_shm_session_put(gone[i]);
}

/* zs_shm_server_opts_t.check, run by the listener before the worker is
 * answered: refuse a segment beyond the table's capacity (one replacing
 * the same generation takes its place) or without a staging area. */
static int check_room(void *arg, const zs_shm_t *shm, zs_err_t *err)
{
    zs_shm_sessions_t *s = arg;
    const zs_shm_header_t *h = zs_shm_header(shm);
    if (h->param_off <= h->grad_off)
        return zs_err_set(err, ZS_ERR_INVALID, "the segment has no staging area");
    reap(s);
    pthread_mutex_lock(&s->mu);
    int full = s->n >= ZS_SHM_SESSIONS_MAX;
    for (int i = 0; i < s->n && full; i++)
        full = s->tab[i]->id != h->generation;
    if (!full) /* the answer goes out before accept returns: lookups wait for add */
        s->pending = h->generation;
    pthread_mutex_unlock(&s->mu);
    if (full)
        return zs_err_set(err, ZS_ERR_BUSY,
                          "this server holds %d shared-memory sessions, the most it keeps: one "
                          "must end (its worker exit) first; use TCP meanwhile",
                          ZS_SHM_SESSIONS_MAX);
    return ZS_OK;
}

/* Enter an accepted segment into the table, replacing a session of the same
 * generation. check_room made room, and only this thread adds. */
static void add(zs_shm_sessions_t *s, zs_shm_t *shm, const zs_shm_peer_t *peer)
{
    zs_shm_session_t *ss = calloc(1, sizeof *ss);
    if (!ss) {
        ZS_WARN("shm session of worker pid %d dropped: out of memory", (int)peer->pid);
        zs_shm_destroy(shm);
        return;
    }
    const zs_shm_header_t *h = zs_shm_header(shm);
    atomic_init(&ss->refs, 1);
    ss->shm = shm;
    ss->id = h->generation;
    ss->pid = peer->pid;
    ss->uid = peer->uid;
    ss->stg = (unsigned char *)zs_shm_base(shm) + h->grad_off;
    ss->stg_bytes = h->param_off - h->grad_off;
    clock_gettime(CLOCK_MONOTONIC, &ss->t0);
    zs_shm_session_t *old = NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n && !old; i++)
        if (s->tab[i]->id == ss->id)
            old = remove_locked(s, i, "replaced: the same session was handed over again");
    if (s->n < ZS_SHM_SESSIONS_MAX) /* always, after check_room */
        s->tab[s->n++] = ss;
    else
        ss->why_end = "no room in the table";
    int n = s->n;
    pthread_mutex_unlock(&s->mu);
    zs_shm_session_put(old);
    char a[32], b[32];
    ZS_INFO("shm session %016llx started: worker pid %d uid %u, segment %s (staging %s); %d "
            "session(s)",
            (unsigned long long)ss->id, (int)ss->pid, (unsigned)ss->uid,
            size_str(zs_shm_size(shm), a, sizeof a), size_str(ss->stg_bytes, b, sizeof b), n);
    if (ss->why_end)
        zs_shm_session_put(ss);
}

/* The hand-over ended (entered or dropped): lookups of it go on. */
static void end_pending(zs_shm_sessions_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->pending = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* The listener: accept in slices until stopped, reaping between them. */
static void *listener(void *arg)
{
    zs_shm_sessions_t *s = arg;
    while (!atomic_load(&s->stop)) {
        zs_shm_t *shm = NULL;
        zs_shm_peer_t peer;
        zs_err_t e;
        zs_err_clear(&e);
        int rc = zs_shm_server_accept(s->srv, ZS_SHM_SESSIONS_SLICE_MS, &shm, &peer, &e);
        if (rc == ZS_OK)
            add(s, shm, &peer);
        end_pending(s);
        if (rc != ZS_OK && rc != ZS_ERR_TIMEOUT) {
            ZS_WARN("shm socket: hand-over refused: %s", e.msg);
            if (rc == ZS_ERR_IO) /* accept or poll itself failed (e.g. out of fds): no spin */
                nanosleep(&(struct timespec){0, ZS_SHM_SESSIONS_SLICE_MS * 1000000L}, NULL);
        }
        reap(s);
    }
    return NULL;
}

/* The socket path the flag names, absolute, into s->path. */
static int resolve_path(const char *flag, const char *data_dir, char *out, size_t cap,
                        zs_err_t *err)
{
    char base[PATH_MAX];
    const char *rel;
    if (!flag || strcmp(flag, "auto") == 0) {
        if (!realpath(data_dir, base))
            return zs_err_set(err, ZS_ERR_IO, "cannot resolve the data dir %s: %s", data_dir,
                              strerror(errno));
        rel = "shm.sock";
    } else if (flag[0] == '/') {
        base[0] = '\0';
        rel = flag;
    } else {
        if (!getcwd(base, sizeof base))
            return zs_err_set(err, ZS_ERR_IO, "getcwd: %s", strerror(errno));
        rel = flag;
    }
    int n = snprintf(out, cap, "%s%s%s", base, base[0] ? "/" : "", rel);
    if (n < 0 || (size_t)n >= cap)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "the socket path %s%s%s is %d bytes; a Unix socket's path holds at "
                          "most %zu",
                          base, base[0] ? "/" : "", rel, n, cap - 1);
    return ZS_OK;
}

int zs_shm_sessions_open(const char *flag, const char *data_dir, const char *token,
                         uint64_t max_bytes, zs_shm_sessions_t **out, zs_err_t *err)
{
    *out = NULL;
    if (flag && strcmp(flag, "off") == 0) {
        ZS_INFO("shm off (--shm-socket off): TCP only");
        return ZS_OK;
    }
    int auto_mode = !flag || strcmp(flag, "auto") == 0;
    zs_shm_sessions_t *s = calloc(1, sizeof *s);
    if (!s)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    zs_err_t e;
    zs_err_clear(&e);
    int rc = resolve_path(flag, data_dir, s->path, sizeof s->path, &e);
    if (!rc) {
        zs_shm_server_opts_t o;
        memset(&o, 0, sizeof o);
        o.path = s->path;
        o.token = token;
        o.token_len = token ? strlen(token) : 0;
        o.max_bytes = max_bytes ? max_bytes : ZS_SHM_SESSIONS_MAX_MAP;
        o.check = check_room;
        o.check_arg = s;
        rc = zs_shm_server_create(&o, &s->srv, &e);
    }
    if (!rc) {
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->cv, NULL);
        atomic_init(&s->stop, 0);
        if (pthread_create(&s->thread, NULL, listener, s) != 0) {
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv);
            zs_shm_server_destroy(s->srv);
            rc = zs_err_set(&e, ZS_ERR_IO, "cannot start the shm listener thread");
        }
    }
    if (rc) {
        free(s);
        if (auto_mode) { /* a convenience, not a requirement: go on over TCP */
            ZS_INFO("shm off: %s (--shm-socket PATH chooses another place)", e.msg);
            return ZS_OK;
        }
        if (err)
            *err = e;
        return zs_err_prefix(err, "--shm-socket: ");
    }
    ZS_INFO("shm socket %s (max segment %.1f GiB, %d sessions)", s->path,
            (double)(max_bytes ? max_bytes : ZS_SHM_SESSIONS_MAX_MAP) / (MIB * 1024),
            ZS_SHM_SESSIONS_MAX);
    *out = s;
    return ZS_OK;
}

void zs_shm_sessions_stop(zs_shm_sessions_t *s)
{
    if (!s)
        return;
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL); /* within a slice, or one handshake's deadline */
    zs_shm_session_t *gone[ZS_SHM_SESSIONS_MAX];
    pthread_mutex_lock(&s->mu);
    int ng = 0;
    while (s->n > 0)
        gone[ng++] = remove_locked(s, s->n - 1, "the server is stopping");
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < ng; i++)
        zs_shm_session_put(gone[i]);
    zs_shm_server_destroy(s->srv);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

const char *zs_shm_sessions_path(const zs_shm_sessions_t *s)
{
    return s->path;
}

zs_shm_session_t *zs_shm_sessions_get(zs_shm_sessions_t *s, uint64_t generation)
{
    if (!s || generation == 0)
        return NULL;
    zs_shm_session_t *ss = NULL, *dead = NULL;
    pthread_mutex_lock(&s->mu);
    while (s->pending == generation) /* answered, not yet entered: see the top */
        pthread_cond_wait(&s->cv, &s->mu);
    for (int i = 0; i < s->n; i++) {
        if (s->tab[i]->id != generation)
            continue;
        if (zs_shm_peer_alive(s->tab[i]->shm)) {
            ss = s->tab[i];
            atomic_fetch_add_explicit(&ss->refs, 1, memory_order_relaxed);
        } else {
            dead = remove_locked(s, i, "its worker exited");
        }
        break;
    }
    pthread_mutex_unlock(&s->mu);
    zs_shm_session_put(dead);
    return ss;
}

unsigned char *zs_shm_session_staging(const zs_shm_session_t *ss, uint64_t *bytes)
{
    *bytes = ss->stg_bytes;
    return ss->stg;
}

int zs_shm_session_alive(const zs_shm_session_t *ss)
{
    return zs_shm_peer_alive(ss->shm);
}

pid_t zs_shm_session_pid(const zs_shm_session_t *ss)
{
    return ss->pid;
}

uint64_t zs_shm_session_id(const zs_shm_session_t *ss)
{
    return ss->id;
}

void zs_shm_session_count(zs_shm_session_t *ss, uint64_t in, uint64_t out)
{
    atomic_fetch_add_explicit(&ss->in, in, memory_order_relaxed);
    atomic_fetch_add_explicit(&ss->out, out, memory_order_relaxed);
}
