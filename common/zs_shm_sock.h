/*
 * zs_shm_sock.h - the same-host proof of the shared-memory data plane: a
 * worker hands its segment's memfd to the server over a Unix-domain socket
 * the server exposes beside its TCP address (SCM_RIGHTS). Receiving the fd
 * is the proof that both run on one host (and one kernel): nothing is
 * guessed from addresses or host names.
 *
 * What the server checks, in this order, before it answers OK:
 *   1. the peer's uid (SO_PEERCRED, from the kernel) is the server's euid or
 *      one of the allowed uids - before reading a byte;
 *   2. the hello: magic, version, token length (at most ZS_SHM_TOKEN_MAX,
 *      read into a fixed buffer: nothing is allocated from peer data);
 *   3. the bearer token, compared in constant time (time depends on the
 *      configured token's length only); no token configured: not checked;
 *   4. exactly one fd came with the hello;
 *   5. the segment (zs_shm_map: header, size vs fstat, seals), owned by the
 *      connecting uid (the memfd inode's uid), then the caller's check
 *      (e.g. its range is the server's range).
 * Every refusal is answered to the worker with a status code and a
 * sentence, and returned to the server's caller; the listener goes on.
 *
 * The client checks the server's uid (SO_PEERCRED) before sending the fd: a
 * process of another user squatting on the path gets nothing.
 *
 * Wire (SOCK_SEQPACKET: one message each way, boundaries kept):
 *   hello  worker -> server: u64 ZS_SHM_HELLO_MAGIC, u32 version (1),
 *          u32 token_len, token bytes; the memfd as SCM_RIGHTS.
 *   reply  server -> worker: u64 ZS_SHM_REPLY_MAGIC, i32 zs_status code,
 *          u32 msg_len (< ZS_ERR_MSG_MAX), message bytes.
 *
 * The socket file is created mode 0600 (the socket's inode mode is set
 * before bind, so there is no window with the umask's mode) and checked; it
 * should live in a directory of mode 0700. File permissions are the first
 * gate, the uid check the one that counts. The file is removed by
 * zs_shm_server_destroy; after a crash it stays, and the next server on the
 * same path finds no listener behind it (ECONNREFUSED) and replaces it.
 *
 * The peer's pid (for zs_shm_watch_peer) is SO_PEERCRED's, in the server's
 * pid namespace. The server opens its pidfd while the worker still waits
 * for the reply and sends the reply after: a worker that died before (its
 * pid free for reuse) makes that send fail, and the handshake with it. The
 * worker opens the server's pidfd after the OK: a server dying and its pid
 * being reused within those microseconds is not guarded against.
 *
 * Every blocking step has a deadline: accept (the caller's timeout), the
 * handshake (handshake_ms on the server, timeout_ms on the client). One
 * handshake runs at a time per zs_shm_server_accept call.
 *
 * What this does not do: run a thread (the caller calls accept in its
 * loop), keep the connection (liveness comes from the pidfd zs_shm_watch_peer
 * opens on both sides), or touch the gRPC control plane.
 */
#ifndef ZS_SHM_SOCK_H
#define ZS_SHM_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "zs_shm.h"
#include "zs_status.h"

#define ZS_SHM_TOKEN_MAX    4096
#define ZS_SHM_HELLO_MAGIC  0x4f4c4c45482d535aull /* the bytes "ZS-HELLO" little-endian */
#define ZS_SHM_REPLY_MAGIC  0x594c5045522d535aull /* the bytes "ZS-REPLY" little-endian */
#define ZS_SHM_SOCK_VERSION 1u

/* The other process, as the kernel reports it (SO_PEERCRED at connect). */
typedef struct zs_shm_peer {
    pid_t pid; /* in our pid namespace */
    uid_t uid;
    gid_t gid;
} zs_shm_peer_t;

typedef struct zs_shm_server_opts {
    const char *path;        /* socket path, shorter than 108 bytes */
    const char *token;       /* bearer token (token_len bytes); token_len 0: none configured */
    size_t token_len;        /* at most ZS_SHM_TOKEN_MAX */
    const uid_t *allow_uids; /* uids admitted besides the server's euid (may be NULL) */
    size_t n_allow_uids;
    uint64_t max_bytes; /* largest segment accepted; 0: 2^46 bytes */
    int handshake_ms;   /* deadline of one handshake after accept; 0: 5000 */
    /* Optional: called with the mapped segment before OK is answered; a
     * non-zero return refuses it with err's message (e.g. another range). */
    int (*check)(void *arg, const zs_shm_t *shm, zs_err_t *err);
    void *check_arg;
} zs_shm_server_opts_t;

typedef struct zs_shm_client_opts {
    const char *path;  /* the server's socket path */
    const char *token; /* bearer token (token_len bytes), 0..ZS_SHM_TOKEN_MAX */
    size_t token_len;
    int check_server_uid; /* 0: the server must run as our euid; 1: as server_uid */
    uid_t server_uid;
    int timeout_ms; /* deadline of the whole handshake; 0: 5000 */
} zs_shm_client_opts_t;

typedef struct zs_shm_server zs_shm_server_t;

/* Listen on o->path (mode 0600). An existing socket file nobody listens on
 * (left by a crash) is replaced; a live one, or anything that is not a
 * socket, is ZS_ERR_EXISTS. The token is copied. ZS_ERR_INVALID for bad
 * options, ZS_ERR_IO for the OS. */
int zs_shm_server_create(const zs_shm_server_opts_t *o, zs_shm_server_t **out, zs_err_t *err);

/* Close the socket and remove its file if it is still the one we bound (same
 * device and inode). NULL is a no-op. */
void zs_shm_server_destroy(zs_shm_server_t *srv);

/* The listening fd (for the caller's poll: readable = a worker is waiting). */
int zs_shm_server_fd(const zs_shm_server_t *srv);

/* Accept one worker within timeout_ms (< 0: no limit) and run its
 * handshake. ZS_OK: *out is the worker's mapped segment, watching the worker
 * (zs_shm_watch_peer), and *peer (may be NULL) who it is; the caller owns
 * *out. ZS_ERR_TIMEOUT: nobody connected. Any other code: this worker was
 * refused (it got the same code and sentence) or vanished; the listener
 * stays usable. Received fds are closed on every path. */
int zs_shm_server_accept(zs_shm_server_t *srv, int timeout_ms, zs_shm_t **out, zs_shm_peer_t *peer,
                         zs_err_t *err);

/* Worker: connect to o->path, check the server's uid, send the hello with
 * shm's fd, and read the verdict. ZS_OK: the server maps shm, and shm now
 * watches the server process (*server, may be NULL, says who it is). A
 * refusal returns the server's code with its sentence; ZS_ERR_UNAVAILABLE
 * when nobody listens, ZS_ERR_UNAUTH for a permission or uid problem,
 * ZS_ERR_TIMEOUT at the deadline. */
int zs_shm_connect(const zs_shm_client_opts_t *o, zs_shm_t *shm, zs_shm_peer_t *server,
                   zs_err_t *err);

#endif
