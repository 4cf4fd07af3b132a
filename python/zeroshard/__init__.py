"""zeroshard: train any model with its optimizer on zeroshard's shard servers.

The package is a CPython extension over zeroshard's C shard client
(``zeroshard._zeroshard``) and, in ``zeroshard.torch``, a PyTorch optimizer
(``ShardOptimizer``) that runs AdamW on the servers. ``__version__`` is the C
library's version; importing refuses an extension built from another version
than these Python sources (a stale build or install).

Exports: ``Client`` (the C client's calls one for one), ``Error`` (a failed
call: the C library's message, ``.status`` and ``.code``), ``version()``,
``protocol_version()``. See docs/python.md.
"""
from ._version import VERSION as _SOURCES_VERSION

try:
    from . import _zeroshard
except ImportError as e:  # not built, or refused (a mismatched library)
    raise ImportError(
        "zeroshard: cannot load the extension zeroshard._zeroshard (%s); build it with "
        "cmake --build (python3-dev needed) and put build/python on PYTHONPATH, or "
        "pip install ./python" % e) from e

if _zeroshard.version() != _SOURCES_VERSION:
    raise ImportError(
        "zeroshard: the extension %s is libzeroshard %s but these Python sources are %s; "
        "rebuild (cmake --build) or reinstall (pip install ./python) so that they match"
        % (_zeroshard.__file__, _zeroshard.version(), _SOURCES_VERSION))

Client = _zeroshard.Client
Error = _zeroshard.Error
version = _zeroshard.version
protocol_version = _zeroshard.protocol_version
__version__ = _zeroshard.version()

__all__ = ["Client", "Error", "version", "protocol_version", "__version__"]
