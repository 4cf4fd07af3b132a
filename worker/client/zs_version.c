/*
 * zs_version.c - zs_version(): the library's own ZS_VERSION, compiled in
 * (see zs_version.h). Nothing else.
 */
#include "zs_version.h"

const char *zs_version(void)
{
    return ZS_VERSION;
}
