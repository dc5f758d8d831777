"""Builds libzero.so with the repository's CMake tree and bundles it into the package.

`pip install ./python` (from the repository root) runs this: it configures the build directory
($ZERO_BUILD_DIR, default <repo>/build) when it has not been configured yet, builds the target
zero_shared (libzero.so) in it, and copies the library next to zero/__init__.py, where the
bindings look first. A build directory that scripts/build.sh already built is reused as it is.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _run(cmd):
    print("zero: " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def build_library():
    if not (ROOT / "CMakeLists.txt").exists():
        raise SystemExit(f"zero: {ROOT} is not the zero repository (no CMakeLists.txt); install "
                         "from a clone with `pip install ./python`")
    build = Path(os.environ.get("ZERO_BUILD_DIR", ROOT / "build"))
    if not (build / "CMakeCache.txt").exists():
        cmake = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"]
        if shutil.which("ninja"):
            cmake += ["-G", "Ninja"]
        _run(cmake)
    _run(["cmake", "--build", build, "--target", "zero_shared", "-j", str(os.cpu_count() or 2)])
    found = sorted(build.rglob("libzero.so.[0-9]*"))
    real = [p for p in found if not p.is_symlink()]
    if not real:
        raise SystemExit(f"zero: the build in {build} produced no libzero.so")
    return real[0]


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        library = build_library()
        target = Path(self.build_lib) / "zero" / "libzero.so.0"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, target)
        print(f"zero: bundled {library} as {target}", file=sys.stderr)


setup(cmdclass={"build_py": BuildWithLibrary})
