"""The version of these Python sources. It must equal the C library's
(worker/client/zs_version.h), which CMake checks when it configures and
zeroshard/__init__.py checks at import against the extension it loads."""
VERSION = "0.1.0"
