"""The GPU build of pytorch/2.3.1-gpu on a machine without a GPU.

The site ``localhost-gpu-build`` builds the real recipe as the cirrus site does on a Cirrus
login node: NCCL GPU operations, MPI CPU operations, compute capability 7.0, CUDA 12.4 and NCCL
2.20.5 (``scripts/localhost-cuda-toolkit``), ``libcuda.so.1`` from the toolkit's stubs at build
and sanity check only. The stack goes to roots of this test's own (/var/tmp/hpcstack-tests) and
shares the download, wheel and Horovod build caches of the localhost stack that the README's main
command installed, so a warm run compiles nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, bash_modules, hpcstack
from hpcstack.site import load_site

pytestmark = pytest.mark.e2e

#: This test's own install and module roots; the caches are the machine's, those of the localhost
#: stack (used on purpose: its downloads and wheel cache serve this install too).
ROOT = Path("/var/tmp/hpcstack-tests/gpu-build")
CACHE = Path(load_site("localhost").cache_dir)
TOOLKIT = Path("/opt/hpcstack/cuda-12.4")
NCCL = Path("/opt/hpcstack/nccl-2.20.5")
PREFIX = ROOT / "software" / "pytorch" / "2.3.1-gpu"
MODULES = ROOT / "modulefiles"
USE = f"module use /opt/hpcstack/base-modulefiles {MODULES}"


@pytest.fixture(scope="module")
def site_file(tmp_path_factory) -> Path:
    """The shipped site, with its roots moved next to the e2e stack and the e2e stack's caches."""
    if not (TOOLKIT / "bin" / "nvcc").is_file() or not (NCCL / "include" / "nccl.h").is_file():
        pytest.skip(f"no CUDA 12.4 toolkit in {TOOLKIT} or NCCL in {NCCL}: run scripts/localhost-cuda-toolkit "
                    "(scripts/localhost-setup --with-test-tools does)")
    data = yaml.safe_load((REPO / "site-configs" / "localhost-gpu-build.yaml").read_text())
    data.update(install_root=str(ROOT / "software"), module_root=str(MODULES), cache_dir=str(CACHE))
    path = tmp_path_factory.mktemp("site") / "localhost-gpu-build.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def installed(site_file, installed_stack):
    start = time.monotonic()
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", str(site_file), timeout=3600)
    print(proc.stdout[-4000:], proc.stderr[-4000:], f"install took {time.monotonic() - start:.0f} s", sep="\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_sanity_check_shows_nccl(installed):
    from hpcstack.install.components.checkbuild import missing_flags, parse_check_build

    flags = parse_check_build((PREFIX / ".hpcstack" / "check-build.txt").read_text())
    assert missing_flags(flags, ["PyTorch", "MPI", "Gloo", "NCCL"]) == []


def test_horovod_was_built_with_cuda_12_4_and_nccl_2_20_5(installed):
    # the key of this stack's own build, as its build log names it (built or reused), not whichever
    # NCCL build the shared cache holds last
    cache = CACHE / "builds" / "horovod-0.28.1"
    log = (PREFIX / ".hpcstack" / "logs" / "build.log").read_text()
    keys = {k for k in re.findall(r"\b([0-9a-f]{24})\b", log) if (cache / k / "key.txt").is_file()}
    assert len(keys) == 1, (keys, log[-2000:])
    text = (cache / keys.pop() / "key.txt").read_text()
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in text
    assert "release 12.4" in text and "#define NCCL_MINOR 20" in text
    assert "HOROVOD_BUILD_CUDA_CC_LIST=70" in text and "HOROVOD_CUDA_RUNTIME_LIBRARY=Shared" in text


def test_horovod_imports_without_a_driver_under_the_module(installed):
    # no GPU and no driver here: torch and horovod.torch load (torch opens libcuda lazily and
    # Horovod does not link it), and the module's environment holds no stubs directory
    proc = bash_modules(f"""
    {USE}
    module load pytorch/2.3.1-gpu || exit 1
    echo "LD_LIBRARY_PATH=${{LD_LIBRARY_PATH:-}}"
    python -c 'import torch, horovod.torch as hvd
print("NCCL_BUILT", hvd.nccl_built(), "CUDA_BUILT", hvd.cuda_built(), "MPI_BUILT", hvd.mpi_built())
print("CUDA_AVAILABLE", torch.cuda.is_available())'
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NCCL_BUILT 22005 CUDA_BUILT True MPI_BUILT True" in proc.stdout, proc.stdout
    assert "CUDA_AVAILABLE False" in proc.stdout
    ld_path = re.search(r"^LD_LIBRARY_PATH=(.*)$", proc.stdout, re.M).group(1)
    assert "stubs" not in ld_path


def test_stubs_never_reach_the_modulefile(installed):
    text = (MODULES / "pytorch" / "2.3.1-gpu").read_text()
    assert "stubs" not in text and "cuda-12.4" not in text


def test_horovod_links_the_shared_cuda_runtime_and_nccl_not_libcuda(installed):
    libs = list((PREFIX / "venv").glob("lib/python3*/site-packages/horovod/torch/mpi_lib_v2*.so"))
    assert libs, "no horovod/torch/mpi_lib_v2*.so in the stack"
    dynamic = subprocess.run(["readelf", "-d", str(libs[0])], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert "libcudart.so.12" in needed and "libnccl.so.2" in needed, needed
    assert "libcuda.so.1" not in needed, needed


def test_the_gpu_build_trains_on_the_cpu_of_the_build_host(installed, site_file):
    # the recipe's workload for localhost-gpu-build is the CPU one: Horovod's MPI operations for
    # CPU tensors, in the build with NCCL GPU operations, on 2 ranks, with the collectives check
    proc = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", str(site_file), "--local", "--json", timeout=900)
    print(proc.stdout[-2000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
    assert result["ok"] is True
    records = result["records"]
    assert next(r for r in records if r["record"] == "config")["device"] == "cpu"
    conv = next(r for r in records if r["record"] == "convergence")
    assert conv["loss_fell"] and conv["params_identical"]
