"""setup.py - `pip install ./python`: the zeroshard package with its
extension, built by the project's CMake (offline: nothing is downloaded).

The extension zeroshard._zeroshard is the CMake target _zeroshard
(python/CMakeLists.txt): it compiles the C client's sources into itself, so
the installed package needs no libzeroshard at run time, only the system's
gRPC, protobuf-c and xxHash libraries. By default this configures the
repository (this folder's parent) in a fresh directory under python/build/
for the running interpreter and builds that one target; with
ZEROSHARD_BUILD_DIR set it builds the target in that existing build tree
instead (configured for the same interpreter: CMake's Python3_EXECUTABLE).

Needs the repository beside it (pip builds local folders in place), CMake,
the build dependencies of deploy/install-deps.sh and python3-dev. Without a
pyproject.toml pip uses the installed setuptools and wheel, so an offline
install works: `pip install --no-index ./python` (in a venv, or with
--break-system-packages where the system's Python is externally managed).
setuptools' own scratch (build/, zeroshard.egg-info) goes under python/
unless ZEROSHARD_SETUP_BUILD names another directory (the tests do, so that
two builds testing at once do not share it).
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    env = {}
    with open(os.path.join(HERE, "zeroshard", "_version.py")) as f:
        exec(f.read(), env)
    return env["VERSION"]


class CMakeBuild(build_ext):
    """Builds the CMake target _zeroshard and copies the module where
    setuptools expects the extension."""

    def build_extension(self, ext):
        if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
            raise RuntimeError("zeroshard: setup.py needs the repository around python/ (%s)"
                               % ROOT)
        bdir = os.environ.get("ZEROSHARD_BUILD_DIR")
        if not bdir:
            bdir = os.path.join(HERE, "build", "cmake-%d.%d" % sys.version_info[:2])
            subprocess.check_call(["cmake", "-S", ROOT, "-B", bdir, "-DZS_WITH_PYTHON=ON",
                                   "-DZS_EMU_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release",
                                   "-DPython3_EXECUTABLE=" + sys.executable])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        subprocess.check_call(["cmake", "--build", bdir, "--target", "_zeroshard", "-j", jobs])
        built = os.path.join(bdir, "python", "zeroshard")
        so = [f for f in os.listdir(built) if f.startswith("_zeroshard") and f.endswith(".so")]
        if len(so) != 1:
            raise RuntimeError("zeroshard: expected one _zeroshard*.so in %s, found %s"
                               % (built, so))
        dst = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(built, so[0]), dst)


SCRATCH = os.environ.get("ZEROSHARD_SETUP_BUILD")
if SCRATCH:
    os.makedirs(SCRATCH, exist_ok=True)

setup(
    name="zeroshard",
    options={"build": {"build_base": os.path.join(SCRATCH, "build")},
             "egg_info": {"egg_base": SCRATCH}} if SCRATCH else {},
    version=version(),
    description="ZeRO training with the optimizer on shard servers: the C client and "
                "a PyTorch optimizer (ShardOptimizer)",
    packages=["zeroshard"],
    ext_modules=[Extension("zeroshard._zeroshard", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
    zip_safe=False,
)
