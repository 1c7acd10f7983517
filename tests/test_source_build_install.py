"""A real source build of a tiny sdist with the site toolchain's compilers: the ``setup.py`` of the
sdist records the compiler variables it sees, and the installed package shows the toolchain's
``cc``/``cxx`` (also as ``MPICC``/``MPICXX``). Real uv, real base python module, the tiny recipe's
lock (six, setuptools, wheel from PyPI)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import REPO, hpcstack, write_tiny_recipe

pytestmark = pytest.mark.integration


def recording_sdist(dest: Path) -> Path:
    """``tinypkg-1.0.tar.gz`` whose build writes ``tinypkg/built_with.py`` with CC, CXX, MPICC, MPICXX."""
    src = dest / "tinypkg-1.0"
    (src / "tinypkg").mkdir(parents=True)
    (src / "tinypkg" / "__init__.py").write_text("GREETING = 'hello'\n")
    (src / "setup.py").write_text(textwrap.dedent("""\
        import os
        from setuptools import setup
        seen = {n: os.environ.get(n) for n in ("CC", "CXX", "MPICC", "MPICXX")}
        with open(os.path.join("tinypkg", "built_with.py"), "w") as f:
            f.write("SEEN = %r\\n" % (seen,))
        setup(name="tinypkg", version="1.0", packages=["tinypkg"])
        """))
    archive = dest / "tinypkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    shutil.rmtree(src)
    return archive


def wrapper(path: Path, real: str) -> str:
    """A compiler of the site's own: a script that runs the machine's ``real`` compiler."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {shutil.which(real)} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_the_toolchain_compilers_reach_a_real_build(tmp_path, localhost_ready):
    recipe = write_tiny_recipe(tmp_path / "recipes", recording_sdist(tmp_path))
    cc = wrapper(tmp_path / "site-bin" / "site-mpicc", "mpicc")
    cxx = wrapper(tmp_path / "site-bin" / "site-mpicxx", "mpicxx")
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["toolchain"].update(cc=cc, cxx=cxx)
    data["cache_dir"] = str(tmp_path / "cache")
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = hpcstack("install", str(recipe), "--site", str(site), "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 0, proc.stderr
    python = tmp_path / "sw" / "tiny" / "1.0" / "venv" / "bin" / "python"
    seen = subprocess.run([str(python), "-c", "from tinypkg.built_with import SEEN; print(SEEN)"],
                          capture_output=True, text=True, check=True).stdout
    assert seen.strip() == repr({"CC": cc, "CXX": cxx, "MPICC": cc, "MPICXX": cxx})
    # the key the build stored names the site's wrappers and the MPI behind them
    key_text = next((tmp_path / "cache" / "builds" / "tinypkg-1.0").glob("*/key.txt")).read_text()
    assert f"CC={cc}\n" in key_text and f"MPICXX={cxx}\n" in key_text and "Open MPI" in key_text
