/*
 * zs_shm_sessions.h - the server's shared-memory sessions: a listener thread
 * on the shm socket (common/zs_shm_sock.h) that maps each co-located
 * worker's staging segment, and the table of those segments the Push and
 * Pull handlers look up by session id (the segment header's generation).
 * docs/protocol.md, "Shared-memory data plane".
 *
 * A session lives from its hand-over until its worker process exits (the
 * pidfd zs_shm_server_accept watches; reaped by the listener every
 * ZS_SHM_SESSIONS_SLICE_MS and by any lookup), until the same generation is
 * handed over again (the newer segment replaces it), or until the sessions
 * are stopped. A lookup takes a reference: a session's segment stays mapped
 * while a handler uses it, even after it left the table. At most
 * ZS_SHM_SESSIONS_MAX sessions at once; the next hand-over is refused (the
 * worker reads the sentence). Each start and end is logged (worker pid,
 * segment size, bytes moved).
 *
 * The staging area of a session is the segment's GRAD payload area,
 * [grad_off, param_off): one contiguous range of bytes that ShmRef offsets
 * count from. The segment's chunk table and PARAM area are not used here,
 * and its range fields are not checked against the server's range (a
 * worker may hand over before Initialize): every reference is checked
 * against the staging area's size instead.
 *
 * What it does not do: parse gRPC messages (zs_service_shm.c), or make the
 * bytes in the segment trustworthy: the worker writes them at any time, so
 * a handler copies before it checks (see docs/protocol.md, the ownership
 * rule).
 */
#ifndef ZS_SHM_SESSIONS_H
#define ZS_SHM_SESSIONS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "zs_status.h"

#define ZS_SHM_SESSIONS_MAX      64
#define ZS_SHM_SESSIONS_SLICE_MS 100          /* the listener's accept wait, between reaps */
#define ZS_SHM_SESSIONS_MAX_MAP  (1ull << 40) /* bytes: the largest segment mapped by default */

typedef struct zs_shm_sessions zs_shm_sessions_t;
typedef struct zs_shm_session zs_shm_session_t;

/* Start listening per zs-server's --shm-socket flag: "off" (*out NULL), "auto"
 * (NULL means auto: DATA_DIR/shm.sock made absolute) or a path (made
 * absolute against the working directory). token (NUL-terminated, may be
 * NULL) is the bearer token the handshake requires; segments above
 * max_bytes (0: ZS_SHM_SESSIONS_MAX_MAP) are refused. With auto, a path too
 * long for a Unix socket or a socket that cannot be made is logged in one
 * line ("shm off: ...") and *out is NULL with ZS_OK: the server goes on
 * over TCP only. With an explicit path the same failures are returned
 * (the caller refuses to start). On ZS_OK with *out set, the listener
 * thread runs; stop it with zs_shm_sessions_stop. Call with SIGTERM/SIGINT
 * blocked: the thread inherits the mask. */
int zs_shm_sessions_open(const char *flag, const char *data_dir, const char *token,
                         uint64_t max_bytes, zs_shm_sessions_t **out, zs_err_t *err);

/* Stop the listener, end every session (each mapping goes when its last
 * reference does), close and remove the socket file. NULL is a no-op. Call
 * when no handler uses the sessions any more. */
void zs_shm_sessions_stop(zs_shm_sessions_t *s);

/* The socket's absolute path (Hello's shm_socket). */
const char *zs_shm_sessions_path(const zs_shm_sessions_t *s);

/* The live session `generation` with a reference taken (release with
 * zs_shm_session_put), or NULL: 0, unknown, or its worker has exited (then
 * it is ended here). s may be NULL (no sessions: NULL). */
zs_shm_session_t *zs_shm_sessions_get(zs_shm_sessions_t *s, uint64_t generation);

/* Drop a reference from zs_shm_sessions_get; the last one unmaps. NULL is a
 * no-op. */
void zs_shm_session_put(zs_shm_session_t *ss);

/* The session's staging area (inside the mapping) and its size in bytes. */
unsigned char *zs_shm_session_staging(const zs_shm_session_t *ss, uint64_t *bytes);

/* 1 while the session's worker process runs, 0 once it has exited. */
int zs_shm_session_alive(const zs_shm_session_t *ss);

/* The worker's pid (in the server's pid namespace) and the session id. */
pid_t zs_shm_session_pid(const zs_shm_session_t *ss);
uint64_t zs_shm_session_id(const zs_shm_session_t *ss);

/* Add payload bytes moved through the session (pushed in, pulled out) to
 * the totals its end logs. Thread-safe. */
void zs_shm_session_count(zs_shm_session_t *ss, uint64_t in, uint64_t out);

#endif
