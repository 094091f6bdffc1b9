"""The package as pip builds it: `pip wheel ./bindings/python` bundles the library (here the
one FASTLLM_LIBRARY names, so no cargo build runs), the wheel is tagged for this platform, and
the installed package loads its own copy from any directory without FASTLLM_LIBRARY."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
LIB = os.environ.get("FASTLLM_LIBRARY")


@pytest.mark.skipif(not LIB, reason="FASTLLM_LIBRARY not set")
def test_wheel_bundles_the_library(tmp_path):
    pytest.importorskip("setuptools")
    try:
        import setuptools.command.bdist_wheel  # noqa: F401
    except ImportError:
        pytest.importorskip("wheel")
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "-w", str(out), str(PKG)],
        check=True,
    )
    (whl,) = list(out.glob("*.whl"))
    assert "none-any" not in whl.name, whl.name
    name = Path(LIB).name
    with zipfile.ZipFile(whl) as z:
        inside = [i for i in z.infolist() if i.filename.endswith("fastllm/" + name)]
        assert len(inside) == 1, z.namelist()
        assert inside[0].file_size == Path(LIB).stat().st_size
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(whl)],
        check=True,
    )
    env = {k: v for k, v in os.environ.items() if k != "FASTLLM_LIBRARY"}
    env["PYTHONPATH"] = str(site)
    code = (
        "import fastllm, fastllm._lib as l; "
        "print(fastllm.__file__); print(fastllm.version())"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    file, version = r.stdout.split()
    assert file.startswith(str(site)), file
    assert version.count(".") == 2
