/*
 * test_status.c - status codes (common/zs_status.c): every code has a name,
 * maps to a gRPC code and back to itself (where the mapping is one to one),
 * and zs_err_set / zs_err_prefix format and truncate safely.
 */
#include <stdio.h>
#include <string.h>

#include "zs_status.h"
#include "zs_test.h"

int main(void)
{
    for (int c = ZS_OK; c >= ZS_ERR_UNIMPLEMENTED; c--) {
        TEST_CHECK(strcmp(zs_status_name(c), "ZS_ERR_UNKNOWN") != 0);
        int g = zs_status_to_grpc(c), back = zs_status_from_grpc(g);
        /* Two codes share a gRPC code: NOMEM/BUSY (RESOURCE_EXHAUSTED) and
         * IO/INTERNAL (INTERNAL); the others come back unchanged. */
        if (c != ZS_ERR_NOMEM && c != ZS_ERR_IO)
            TEST_CHECKF(back == c, "%s -> grpc %d -> %s", zs_status_name(c), g,
                        zs_status_name(back));
    }
    TEST_CHECK(zs_status_to_grpc(ZS_ERR_RANGE) == 11);   /* OUT_OF_RANGE */
    TEST_CHECK(zs_status_to_grpc(ZS_ERR_STATE) == 9);    /* FAILED_PRECONDITION */
    TEST_CHECK(zs_status_to_grpc(ZS_ERR_CORRUPT) == 15); /* DATA_LOSS */
    zs_err_t e;
    TEST_CHECK(zs_err_set(&e, ZS_ERR_RANGE, "x=%d", 42) == ZS_ERR_RANGE);
    TEST_CHECK(e.code == ZS_ERR_RANGE && strcmp(e.msg, "x=42") == 0);
    zs_err_prefix(&e, "server %d: ", 1);
    TEST_CHECK(strcmp(e.msg, "server 1: x=42") == 0);
    char big[1000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    zs_err_set(&e, ZS_ERR_INVALID, "%s", big);
    TEST_CHECK(strlen(e.msg) == ZS_ERR_MSG_MAX - 1);
    zs_err_prefix(&e, "%s", "prefix: ");
    TEST_CHECK(strlen(e.msg) == ZS_ERR_MSG_MAX - 1 && strncmp(e.msg, "prefix: a", 9) == 0);
    TEST_CHECK(zs_err_set(NULL, ZS_ERR_IO, "ignored") == ZS_ERR_IO);
    /* wrapping the message in itself (zs__eng_alloc does) */
    zs_err_set(&e, ZS_ERR_NOMEM, "cpu: out of device memory, limit %d", 8);
    zs_err_set(&e, e.code, "out of device memory for grads: %s", e.msg);
    TEST_CHECKF(
        strcmp(e.msg, "out of device memory for grads: cpu: out of device memory, limit 8") == 0,
        "self-wrapped message: \"%s\"", e.msg);
    zs_err_clear(&e);
    TEST_CHECK(e.code == ZS_OK && e.msg[0] == '\0');
    printf("PASS test_status\n");
    return 0;
}
