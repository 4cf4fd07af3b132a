/*
 * zs_status.c - names, formatting and gRPC mapping of zeroshard status codes.
 * Pure functions; no allocation.
 */
#include "zs_status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *zs_status_name(int code)
{
    switch (code) {
    case ZS_OK:
        return "ZS_OK";
    case ZS_ERR_INVALID:
        return "ZS_ERR_INVALID";
    case ZS_ERR_RANGE:
        return "ZS_ERR_RANGE";
    case ZS_ERR_STATE:
        return "ZS_ERR_STATE";
    case ZS_ERR_NOMEM:
        return "ZS_ERR_NOMEM";
    case ZS_ERR_IO:
        return "ZS_ERR_IO";
    case ZS_ERR_CORRUPT:
        return "ZS_ERR_CORRUPT";
    case ZS_ERR_NOTFOUND:
        return "ZS_ERR_NOTFOUND";
    case ZS_ERR_UNAVAILABLE:
        return "ZS_ERR_UNAVAILABLE";
    case ZS_ERR_TIMEOUT:
        return "ZS_ERR_TIMEOUT";
    case ZS_ERR_INTERNAL:
        return "ZS_ERR_INTERNAL";
    case ZS_ERR_EXISTS:
        return "ZS_ERR_EXISTS";
    case ZS_ERR_UNAUTH:
        return "ZS_ERR_UNAUTH";
    case ZS_ERR_BUSY:
        return "ZS_ERR_BUSY";
    case ZS_ERR_CANCELLED:
        return "ZS_ERR_CANCELLED";
    case ZS_ERR_UNIMPLEMENTED:
        return "ZS_ERR_UNIMPLEMENTED";
    default:
        return "ZS_ERR_UNKNOWN";
    }
}

int zs_err_set(zs_err_t *err, int code, const char *fmt, ...)
{
    if (err) {
        /* Formatted aside first: a caller may pass err->msg itself as an
         * argument (wrapping the message it got), which vsnprintf into
         * err->msg would read while overwriting it. */
        char msg[ZS_ERR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        err->code = code;
        memcpy(err->msg, msg, sizeof msg);
    }
    return code;
}

int zs_err_prefix(zs_err_t *err, const char *fmt, ...)
{
    if (!err)
        return ZS_OK;
    char head[ZS_ERR_MSG_MAX], old[ZS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t hl = strnlen(head, sizeof head - 1);
    memcpy(err->msg, head, hl);
    size_t ol = strnlen(old, sizeof old - 1);
    if (ol > sizeof err->msg - 1 - hl)
        ol = sizeof err->msg - 1 - hl;
    memcpy(err->msg + hl, old, ol);
    err->msg[hl + ol] = '\0';
    return err->code;
}

void zs_err_clear(zs_err_t *err)
{
    if (err) {
        err->code = ZS_OK;
        err->msg[0] = '\0';
    }
}

/* Values of grpc_status_code, spelled out so this file needs no gRPC header. */
enum {
    G_OK = 0,
    G_CANCELLED = 1,
    G_UNKNOWN = 2,
    G_INVALID_ARGUMENT = 3,
    G_DEADLINE_EXCEEDED = 4,
    G_NOT_FOUND = 5,
    G_ALREADY_EXISTS = 6,
    G_PERMISSION_DENIED = 7,
    G_RESOURCE_EXHAUSTED = 8,
    G_FAILED_PRECONDITION = 9,
    G_ABORTED = 10,
    G_OUT_OF_RANGE = 11,
    G_UNIMPLEMENTED = 12,
    G_INTERNAL = 13,
    G_UNAVAILABLE = 14,
    G_DATA_LOSS = 15,
    G_UNAUTHENTICATED = 16,
};

int zs_status_to_grpc(int code)
{
    switch (code) {
    case ZS_OK:
        return G_OK;
    case ZS_ERR_INVALID:
        return G_INVALID_ARGUMENT;
    case ZS_ERR_RANGE:
        return G_OUT_OF_RANGE;
    case ZS_ERR_STATE:
        return G_FAILED_PRECONDITION;
    case ZS_ERR_NOMEM:
        return G_RESOURCE_EXHAUSTED;
    case ZS_ERR_BUSY:
        return G_RESOURCE_EXHAUSTED;
    case ZS_ERR_IO:
        return G_INTERNAL;
    case ZS_ERR_CORRUPT:
        return G_DATA_LOSS;
    case ZS_ERR_NOTFOUND:
        return G_NOT_FOUND;
    case ZS_ERR_UNAVAILABLE:
        return G_UNAVAILABLE;
    case ZS_ERR_TIMEOUT:
        return G_DEADLINE_EXCEEDED;
    case ZS_ERR_EXISTS:
        return G_ALREADY_EXISTS;
    case ZS_ERR_UNAUTH:
        return G_UNAUTHENTICATED;
    case ZS_ERR_CANCELLED:
        return G_CANCELLED;
    case ZS_ERR_UNIMPLEMENTED:
        return G_UNIMPLEMENTED;
    default:
        return G_INTERNAL;
    }
}

int zs_status_from_grpc(int g)
{
    switch (g) {
    case G_OK:
        return ZS_OK;
    case G_INVALID_ARGUMENT:
        return ZS_ERR_INVALID;
    case G_OUT_OF_RANGE:
        return ZS_ERR_RANGE;
    case G_FAILED_PRECONDITION:
        return ZS_ERR_STATE;
    case G_RESOURCE_EXHAUSTED:
        return ZS_ERR_BUSY;
    case G_DATA_LOSS:
        return ZS_ERR_CORRUPT;
    case G_NOT_FOUND:
        return ZS_ERR_NOTFOUND;
    case G_UNAVAILABLE:
        return ZS_ERR_UNAVAILABLE;
    case G_DEADLINE_EXCEEDED:
        return ZS_ERR_TIMEOUT;
    case G_ALREADY_EXISTS:
        return ZS_ERR_EXISTS;
    case G_UNAUTHENTICATED:
        return ZS_ERR_UNAUTH;
    case G_PERMISSION_DENIED:
        return ZS_ERR_UNAUTH;
    case G_CANCELLED:
        return ZS_ERR_CANCELLED;
    case G_UNIMPLEMENTED:
        return ZS_ERR_UNIMPLEMENTED;
    default:
        return ZS_ERR_INTERNAL;
    }
}
