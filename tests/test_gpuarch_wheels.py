"""Reading a real torch wheel's GPU architectures with the real cuobjdump: torch 2.3.1 as the
localhost stack's install unpacked it into its uv cache (read only; nothing of it is written)."""

from __future__ import annotations

import glob
import os
import zipfile
from pathlib import Path

import pytest

from hpcstack import data_root
from hpcstack.install import gpuarch
from hpcstack.site import load_site

pytestmark = pytest.mark.integration

#: Where the localhost stack's install (scripts/quickstart-localhost) keeps its uv cache: the
#: machine's cache, which the localhost sites share.
UV_CACHE = os.path.join(load_site("localhost").cache_dir, "uv")
#: NVIDIA's cuobjdump of scripts/localhost-cuda-tools (13.5.37) and that of the CUDA 12.4
#: toolkit of scripts/localhost-cuda-toolkit; localhost-setup --with-test-tools installs both.
CUOBJDUMP_13 = "/opt/hpcstack/cuda-tools/bin/cuobjdump"
CUOBJDUMP_12 = "/opt/hpcstack/cuda-12.4/bin/cuobjdump"
LIBS = ("torch/lib/libtorch_cuda*.so",)
#: The record of the installed package (the one ``hpcstack lock`` writes and installs read; under
#: scripts/run-tests the wheel's copy, not the checkout's).
RECORD_231 = data_root() / "recipes" / "pytorch" / "2.3.1-gpu.pypi.gpu-archs.json"


@pytest.fixture(scope="module")
def torch231() -> Path:
    found = [Path(p).parent for p in glob.glob(f"{UV_CACHE}/archive-v0/*/torch-2.3.1.dist-info")]
    if not found:
        pytest.skip(f"no unpacked torch 2.3.1 wheel in {UV_CACHE}: install the localhost stack first "
                    "(scripts/quickstart-localhost)")
    return found[0]


def _tool(path: str) -> str:
    if not os.access(path, os.X_OK):
        pytest.skip(f"no {path}: run scripts/localhost-setup --with-test-tools")
    return path


def _recorded_231(python: str):
    records = gpuarch.load_records(str(RECORD_231))
    return next(r for r in records.values() if f"-cp{python}-" in r.file)


@pytest.mark.parametrize("cuobjdump", [CUOBJDUMP_12, CUOBJDUMP_13])
def test_the_unpacked_2_3_1_wheel_reads_as_recorded(torch231, cuobjdump):
    rec = gpuarch.read_wheel(str(torch231), LIBS, _tool(cuobjdump))
    assert rec.cuda == "12.1"
    assert rec.sass == (50, 60, 70, 75, 80, 86, 90) and rec.ptx == ()
    assert rec.libraries == _recorded_231("311").libraries
    assert rec.unsupported((70, 80)) == [] and rec.unsupported((37, 100)) == [37, 100]
    if cuobjdump == CUOBJDUMP_13:
        # cuobjdump 13.x stops with "Invalid ELF" at the sm_90 cubins CUDA 12.1 wrote
        assert rec.reader.startswith("fat binary headers (cuobjdump 13.")
    else:
        assert rec.reader == "cuobjdump 12.4.127"


def test_the_fat_binary_headers_agree_with_cuobjdump(torch231):
    lib = str(torch231 / "torch" / "lib" / "libtorch_cuda_linalg.so")
    assert gpuarch.fatbin_entries(lib) == gpuarch.cuobjdump_entries(lib, _tool(CUOBJDUMP_12))


def test_a_library_without_device_code_counts_for_nothing(torch231):
    lib = str(torch231 / "torch" / "lib" / "libc10_cuda.so")
    assert not gpuarch.cuobjdump_entries(lib, _tool(CUOBJDUMP_13))


def test_a_wheel_file_is_read_without_installing_it(torch231, tmp_path):
    # a wheel of two members copied from the real one: its METADATA and its linear algebra library
    wheel = tmp_path / "torch-2.3.1-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.write(torch231 / "torch-2.3.1.dist-info" / "METADATA", "torch-2.3.1.dist-info/METADATA")
        z.write(torch231 / "torch" / "lib" / "libtorch_cuda_linalg.so", "torch/lib/libtorch_cuda_linalg.so")
    rec = gpuarch.read_wheel(str(wheel), LIBS, _tool(CUOBJDUMP_13))
    assert (rec.file, rec.cuda, rec.sass) == (wheel.name, "12.1", (50, 60, 70, 80, 86, 90))
    assert len(rec.sha256) == 64
    assert rec.libraries == (("torch/lib/libtorch_cuda_linalg.so", (50, 60, 70, 80, 86, 90), ()),)


def test_hpcstack_lock_records_only_wheels_the_lock_pins(torch231, tmp_path):
    from conftest import hpcstack

    wheel = tmp_path / "torch-2.3.1-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.write(torch231 / "torch" / "lib" / "libtorch_cuda_linalg.so", "torch/lib/libtorch_cuda_linalg.so")
    record = RECORD_231
    before = record.read_text()
    proc = hpcstack("lock", "pytorch/2.3.1-gpu", "--site", "perlmutter", "--gpu-archs-from", str(wheel),
                    env={"PATH": f"{os.path.dirname(_tool(CUOBJDUMP_13))}:{os.environ['PATH']}"})
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{wheel}: sha256 " in line and "is not pinned for torch in " in line and line.endswith("2.3.1-gpu.pypi.lock")
    assert record.read_text() == before
