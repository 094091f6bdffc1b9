"""Builds libfastllm with cargo and puts it inside the package, so that
`pip install ./bindings/python` works from any directory and `pip wheel ./bindings/python`
gives an installable wheel for this platform. With FASTLLM_LIBRARY set, that library is
bundled instead of building one. The package metadata is in pyproject.toml."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent.parent.parent
NAMES = {"linux": "libfastllm.so", "darwin": "libfastllm.dylib", "win32": "fastllm.dll"}


def library() -> Path:
    """The library to bundle: $FASTLLM_LIBRARY, or a release build of this checkout."""
    given = os.environ.get("FASTLLM_LIBRARY")
    if given:
        lib = Path(given)
        if not lib.is_file():
            sys.exit(f"FASTLLM_LIBRARY={given} is not a file")
        return lib
    if not (ROOT / "Cargo.toml").is_file():
        sys.exit(
            f"cannot build libfastllm: no fastllm-rs checkout at {ROOT} "
            "(build from the repository, or set FASTLLM_LIBRARY to a built library)"
        )
    print("building libfastllm: cargo build --release -p fastllm", flush=True)
    subprocess.run(["cargo", "build", "--release", "-p", "fastllm"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / "release" / NAMES.get(sys.platform, "libfastllm.so")


class BuildWithLibrary(build_py):
    """build_py that also copies the library into the built package."""

    def run(self):
        super().run()
        lib = library()
        dest = Path(self.build_lib) / "fastllm" / NAMES.get(sys.platform, "libfastllm.so")
        shutil.copy2(lib, dest)


class PlatformWheel(bdist_wheel):
    """A wheel for this platform (it holds a native library) and any Python 3."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel})
