/*
 * zs_dtype.h - element types that travel on the wire and live in buffers.
 *
 * The numeric values equal the DType enum in proto/zeroshard.proto. All
 * multi-byte values are little-endian (the only byte order we build for).
 */
#ifndef ZS_DTYPE_H
#define ZS_DTYPE_H

#include <stddef.h>

typedef enum {
    ZS_DTYPE_F32 = 0,  /* IEEE binary32 */
    ZS_DTYPE_BF16 = 1, /* bfloat16: top half of binary32 */
    ZS_DTYPE_F16 = 2,  /* IEEE binary16 */
    ZS_DTYPE_NONE = 3, /* "no output" where an output dtype is optional */
} zs_dtype_t;

/* Bytes per element: 4, 2, 2; 0 for ZS_DTYPE_NONE or an unknown value. */
static inline size_t zs_dtype_size(int dt)
{
    return dt == ZS_DTYPE_F32 ? 4 : (dt == ZS_DTYPE_BF16 || dt == ZS_DTYPE_F16) ? 2 : 0;
}

/* "fp32", "bf16", "fp16", "none" or "?" */
static inline const char *zs_dtype_name(int dt)
{
    switch (dt) {
    case ZS_DTYPE_F32:
        return "fp32";
    case ZS_DTYPE_BF16:
        return "bf16";
    case ZS_DTYPE_F16:
        return "fp16";
    case ZS_DTYPE_NONE:
        return "none";
    default:
        return "?";
    }
}

#endif
