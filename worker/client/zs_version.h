/*
 * zs_version.h - the version of libzeroshard (the C client and the rest of
 * the worker library), for programs that link it as a library: the Python
 * extension (python/zs_pyext.c) compares the version it was compiled
 * against with the one it runs with and refuses a mismatch.
 *
 * ZS_VERSION must equal the top CMakeLists.txt's project VERSION (checked
 * when CMake configures python/). Does not: version the wire protocol
 * (ZS_PROTOCOL_VERSION in proto/zs_rpc.h, negotiated at Hello).
 */
#ifndef ZS_VERSION_H
#define ZS_VERSION_H

#define ZS_VERSION "0.1.0"

/* The version this library was compiled as ("MAJOR.MINOR.PATCH"): ZS_VERSION
 * of its own build, which a caller's ZS_VERSION (compiled into the caller)
 * may differ from when the library was rebuilt or replaced on its own. */
const char *zs_version(void);

#endif
