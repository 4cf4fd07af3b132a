/*
 * zs_status.h - status codes and the error record every zeroshard library
 * function reports through.
 *
 * Convention (libuv style): functions return an int, ZS_OK (0) on success or
 * a negative zs_status_t. Functions that can say more take a zs_err_t *err
 * (may be NULL) and fill it with the code and a sentence a person can act on.
 * Nothing here allocates; zs_err_t is embedded by the caller.
 *
 * The codes map one to one onto gRPC status codes (zs_status_to_grpc), so a
 * refusal computed deep in the server reaches the client unchanged.
 */
#ifndef ZS_STATUS_H
#define ZS_STATUS_H

#include <stddef.h>

typedef enum {
    ZS_OK = 0,
    ZS_ERR_INVALID = -1,        /* malformed request or argument (INVALID_ARGUMENT) */
    ZS_ERR_RANGE = -2,          /* range or size outside what is allowed (OUT_OF_RANGE) */
    ZS_ERR_STATE = -3,          /* wrong moment: step out of sequence... (FAILED_PRECONDITION) */
    ZS_ERR_NOMEM = -4,          /* allocation failed (RESOURCE_EXHAUSTED) */
    ZS_ERR_IO = -5,             /* disk or OS error (INTERNAL) */
    ZS_ERR_CORRUPT = -6,        /* checksum or format mismatch (DATA_LOSS) */
    ZS_ERR_NOTFOUND = -7,       /* no such checkpoint / key (NOT_FOUND) */
    ZS_ERR_UNAVAILABLE = -8,    /* peer unreachable (UNAVAILABLE) */
    ZS_ERR_TIMEOUT = -9,        /* deadline passed (DEADLINE_EXCEEDED) */
    ZS_ERR_INTERNAL = -10,      /* a bug (INTERNAL) */
    ZS_ERR_EXISTS = -11,        /* already initialised differently (ALREADY_EXISTS) */
    ZS_ERR_UNAUTH = -12,        /* missing or wrong token (UNAUTHENTICATED) */
    ZS_ERR_BUSY = -13,          /* too many concurrent calls (RESOURCE_EXHAUSTED) */
    ZS_ERR_CANCELLED = -14,     /* shutting down or cancelled (CANCELLED) */
    ZS_ERR_UNIMPLEMENTED = -15, /* no such method (UNIMPLEMENTED) */
} zs_status_t;

#define ZS_ERR_MSG_MAX 320

/* An error record: code plus a human sentence. Embedded by the caller. */
typedef struct zs_err {
    int code;
    char msg[ZS_ERR_MSG_MAX];
} zs_err_t;

/* Short constant name of a status, e.g. "ZS_ERR_RANGE". Never NULL. */
const char *zs_status_name(int code);

/* Fill err (if not NULL) with code and a printf-style message; returns code so
 * callers can write `return zs_err_set(err, ZS_ERR_RANGE, "...", ...)`. */
int zs_err_set(zs_err_t *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefix err->msg with printf-style context ("server 1: " + old message). */
int zs_err_prefix(zs_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset to ZS_OK with an empty message. */
void zs_err_clear(zs_err_t *err);

/* gRPC status code (grpc_status_code values) for a zs status, and back. */
int zs_status_to_grpc(int code);
int zs_status_from_grpc(int grpc_code);

#endif
